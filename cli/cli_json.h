/*  cli_json.h - the CLI's JSON shapes of broker replies, and the names of enum values.

    One function per message: a new cJSON object (the caller owns it; NULL when out of memory)
    holding only the fields the broker set. Names are the lower-case forms users type and read
    (`--status correct`, "finish_reason": "length").

    A results line (cli_json_sample_result):
      {"custom_id", "task_index", "sample", "text", "prompt_tokens", "completion_tokens",
       "finish_reason", "weight_version", "seed", "error", "worker_id", "timings": {...},
       "token_ids" and "logprobs" (only when asked for), "score": {"status", "speedup",
       "reward", "ref_ms", "cand_ms", "max_abs_err", "max_rel_err", "launches", "error",
       "traceback_tail", "flags"}}
*/
#ifndef CLI_JSON_H
#define CLI_JSON_H

#include "anvil.pb-c.h"

#include <cjson/cJSON.h>
#include <stdbool.h>

const char *cli_job_state_name(Anvil__JobState s);
const char *cli_exec_status_name(Anvil__ExecStatus s);
const char *cli_finish_reason_name(Anvil__FinishReason r);
const char *cli_worker_kind_name(Anvil__WorkerKind k);
/* True when the state is final (done, cancelled, failed). */
bool cli_job_state_final(Anvil__JobState s);

cJSON *cli_json_job_status(const Anvil__JobStatus *s);
cJSON *cli_json_worker(const Anvil__WorkerInfo *w);
cJSON *cli_json_event(const Anvil__Event *e);
cJSON *cli_json_sample_result(const Anvil__SampleResult *r, bool with_tokens);
/* True when a result belongs in the errors file: generation failed or the unit was dead-
   lettered (an exec error without a status), as opposed to a scored sample. */
bool cli_result_is_error(const Anvil__SampleResult *r);

#endif

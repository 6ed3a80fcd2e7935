/*  cli_json.c - the CLI's JSON shapes of broker replies, and the names of enum values.

    Only fields with presence (proto2 has_x, non-NULL strings and messages) are written, so a
    consumer can tell "0" from "not reported". Numbers go through cJSON's double, which is exact
    for every counter below 2^53.
*/
#include "cli_json.h"

#include <stdio.h>
#include <string.h>

const char *cli_job_state_name(Anvil__JobState s)
{
    static const char *const names[] = {"none", "submitting", "queued", "running",
                                        "done", "cancelled",  "failed"};
    return (unsigned)s < sizeof names / sizeof names[0] ? names[s] : "unknown";
}

const char *cli_exec_status_name(Anvil__ExecStatus s)
{
    static const char *const names[] = {"none",          "format_error", "rejected_static",
                                        "compile_error", "runtime_error", "timeout",
                                        "crashed",       "incorrect",     "correct"};
    return (unsigned)s < sizeof names / sizeof names[0] ? names[s] : "unknown";
}

const char *cli_finish_reason_name(Anvil__FinishReason r)
{
    static const char *const names[] = {"none",      "eos",     "stop",  "length",
                                        "context",   "cancelled", "aborted", "error"};
    return (unsigned)r < sizeof names / sizeof names[0] ? names[r] : "unknown";
}

const char *cli_worker_kind_name(Anvil__WorkerKind k)
{
    return k == ANVIL__WORKER_KIND__WORKER_GEN ? "gen" : k == ANVIL__WORKER_KIND__WORKER_EXEC ? "exec"
                                                                                              : "none";
}

bool cli_job_state_final(Anvil__JobState s)
{
    return s == ANVIL__JOB_STATE__JOB_DONE || s == ANVIL__JOB_STATE__JOB_CANCELLED ||
           s == ANVIL__JOB_STATE__JOB_FAILED;
}

#define S_NUM(o, key, has, v)                                                                      \
    do {                                                                                           \
        if (has)                                                                                   \
            cJSON_AddNumberToObject((o), (key), (double)(v));                                      \
    } while (0)
#define S_STR(o, key, v)                                                                           \
    do {                                                                                           \
        if (v)                                                                                     \
            cJSON_AddStringToObject((o), (key), (v));                                              \
    } while (0)

cJSON *cli_json_job_status(const Anvil__JobStatus *s)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    S_STR(o, "job_id", s->job_id);
    S_STR(o, "name", s->name);
    if (s->has_state)
        cJSON_AddStringToObject(o, "state", cli_job_state_name(s->state));
    S_NUM(o, "tasks", s->has_tasks, s->tasks);
    S_NUM(o, "samples_total", s->has_samples_total, s->samples_total);
    S_NUM(o, "generated", s->has_generated, s->generated);
    S_NUM(o, "scored", s->has_scored, s->scored);
    S_NUM(o, "failed", s->has_failed, s->failed);
    S_NUM(o, "dead", s->has_dead, s->dead);
    S_NUM(o, "correct", s->has_correct, s->correct);
    S_NUM(o, "in_flight", s->has_in_flight, s->in_flight);
    S_NUM(o, "tokens", s->has_tokens, s->tokens);
    S_NUM(o, "tokens_per_s", s->has_tokens_per_s, s->tokens_per_s);
    S_NUM(o, "evals_per_min", s->has_evals_per_min, s->evals_per_min);
    S_NUM(o, "pass_rate", s->has_pass_rate, s->pass_rate);
    S_NUM(o, "mean_speedup", s->has_mean_speedup, s->mean_speedup);
    S_NUM(o, "eta_s", s->has_eta_s, s->eta_s);
    S_NUM(o, "priority", s->has_priority, s->priority);
    if (s->has_score)
        cJSON_AddBoolToObject(o, "score", s->score);
    S_NUM(o, "created_ms", s->has_created_ms, s->created_ms);
    S_NUM(o, "finished_ms", s->has_finished_ms, s->finished_ms);
    return o;
}

cJSON *cli_json_worker(const Anvil__WorkerInfo *w)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    S_STR(o, "worker_id", w->worker_id);
    if (w->has_kind)
        cJSON_AddStringToObject(o, "kind", cli_worker_kind_name(w->kind));
    S_STR(o, "state", w->state);
    S_STR(o, "hostname", w->hostname);
    S_NUM(o, "gpu_index", w->has_gpu_index, w->gpu_index);
    S_STR(o, "gpu_name", w->gpu_name);
    S_STR(o, "model", w->model);
    S_NUM(o, "weight_version", w->has_weight_version, w->weight_version);
    S_NUM(o, "slots", w->has_slots, w->slots);
    S_NUM(o, "in_flight", w->has_in_flight, w->in_flight);
    S_NUM(o, "outstanding_tokens", w->has_outstanding_tokens, w->outstanding_tokens);
    S_NUM(o, "free_kv_tokens", w->has_free_kv_tokens, w->free_kv_tokens);
    S_NUM(o, "queued_samples", w->has_queued_samples, w->queued_samples);
    S_NUM(o, "credit", w->has_credit, w->credit);
    S_NUM(o, "last_seen_s", w->has_last_seen_s, w->last_seen_s);
    return o;
}

cJSON *cli_json_event(const Anvil__Event *e)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    S_STR(o, "id", e->id);
    S_STR(o, "type", e->type);
    S_NUM(o, "task_index", e->has_task_index, e->task_index);
    S_NUM(o, "sample_index", e->has_sample_index, e->sample_index);
    S_STR(o, "detail", e->detail);
    return o;
}

static cJSON *s_score(const Anvil__ExecResult *x)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    if (x->has_status)
        cJSON_AddStringToObject(o, "status", cli_exec_status_name(x->status));
    S_NUM(o, "speedup", x->has_speedup, x->speedup);
    S_NUM(o, "reward", x->has_reward, x->reward);
    S_NUM(o, "ref_ms", x->has_ref_ms, x->ref_ms);
    S_NUM(o, "cand_ms", x->has_cand_ms, x->cand_ms);
    S_NUM(o, "compile_ms", x->has_compile_ms, x->compile_ms);
    S_NUM(o, "max_abs_err", x->has_max_abs_err, x->max_abs_err);
    S_NUM(o, "max_rel_err", x->has_max_rel_err, x->max_rel_err);
    S_NUM(o, "launches", x->has_launches, x->launches);
    S_NUM(o, "gpu_share", x->has_gpu_share, x->gpu_share);
    S_STR(o, "error", x->error);
    S_STR(o, "traceback_tail", x->traceback_tail);
    if (x->n_flags) {
        cJSON *f = cJSON_AddArrayToObject(o, "flags");
        for (size_t i = 0; f && i < x->n_flags; i++)
            cJSON_AddItemToArray(f, cJSON_CreateString(x->flags[i]));
    }
    S_STR(o, "worker_id", x->worker_id);
    return o;
}

cJSON *cli_json_sample_result(const Anvil__SampleResult *r, bool with_tokens)
{
    const Anvil__Sample *s = r->sample;
    cJSON *o = cJSON_CreateObject();
    if (!o || !s)
        return o;
    S_STR(o, "custom_id", s->custom_id);
    S_NUM(o, "task_index", s->has_task_index, s->task_index);
    S_NUM(o, "sample", s->has_sample_index, s->sample_index);
    S_STR(o, "text", s->text);
    /* counts are sent without the ids unless the ids were asked for */
    if (s->has_n_prompt_tokens || s->n_prompt_token_ids)
        cJSON_AddNumberToObject(o, "prompt_tokens", s->has_n_prompt_tokens
                                                        ? (double)s->n_prompt_tokens
                                                        : (double)s->n_prompt_token_ids);
    if (s->has_n_tokens || s->n_token_ids)
        cJSON_AddNumberToObject(o, "completion_tokens",
                                s->has_n_tokens ? (double)s->n_tokens : (double)s->n_token_ids);
    if (s->has_finish_reason)
        cJSON_AddStringToObject(o, "finish_reason", cli_finish_reason_name(s->finish_reason));
    S_NUM(o, "weight_version", s->has_weight_version, s->weight_version);
    if (s->has_seed) {
        /* a u64 seed as an exact JSON integer: a double would round it (2^53) and the sample
           could no longer be reproduced from its record */
        char seed[32];
        snprintf(seed, sizeof seed, "%llu", (unsigned long long)s->seed);
        cJSON_AddRawToObject(o, "seed", seed);
    }
    S_STR(o, "error", s->error);
    S_STR(o, "worker_id", s->worker_id);
    S_NUM(o, "attempt", s->has_attempt, s->attempt);
    if (s->timings) {
        cJSON *t = cJSON_AddObjectToObject(o, "timings");
        if (t) {
            S_NUM(t, "queue_ms", s->timings->has_queue_ms, s->timings->queue_ms);
            S_NUM(t, "prefill_ms", s->timings->has_prefill_ms, s->timings->prefill_ms);
            S_NUM(t, "decode_ms", s->timings->has_decode_ms, s->timings->decode_ms);
            S_NUM(t, "total_ms", s->timings->has_total_ms, s->timings->total_ms);
        }
    }
    if (with_tokens) {
        cJSON *ids = cJSON_AddArrayToObject(o, "token_ids");
        for (size_t i = 0; ids && i < s->n_token_ids; i++)
            cJSON_AddItemToArray(ids, cJSON_CreateNumber(s->token_ids[i]));
        cJSON *lp = cJSON_AddArrayToObject(o, "logprobs");
        for (size_t i = 0; lp && i < s->n_logprobs; i++)
            cJSON_AddItemToArray(lp, cJSON_CreateNumber(s->logprobs[i]));
    }
    if (r->exec)
        cJSON_AddItemToObject(o, "score", s_score(r->exec));
    return o;
}

bool cli_result_is_error(const Anvil__SampleResult *r)
{
    const Anvil__Sample *s = r->sample;
    if (!s)
        return true;
    if ((s->error && *s->error) ||
        (s->has_finish_reason && s->finish_reason == ANVIL__FINISH_REASON__FINISH_ERROR))
        return true;
    return r->exec && (!r->exec->has_status || r->exec->status == ANVIL__EXEC_STATUS__EXEC_NONE) &&
           r->exec->error && *r->exec->error;
}

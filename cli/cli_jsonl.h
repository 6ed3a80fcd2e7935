/*  cli_jsonl.h - streaming reader of prompt files (Anvil JSONL and OpenAI Batch JSONL).

    A prompt file is read one line at a time and never held in memory as a whole: each line is
    parsed with cJSON, validated and turned into an anvil.Task, which the caller owns. The
    format is detected per file from the first line that parses as a JSON object: a line with a
    `body` object is OpenAI Batch API format, anything else Anvil JSONL; a later line of the
    other shape is an error. The reader is meant to be used twice over the same file: a first
    pass validates everything (so a malformed line N stops a submit before anything is
    queued), cli_jsonl_rewind() starts again and the second pass yields the same tasks in the
    same order. The file must not change in between: rewind checks its size and mtime. A path
    of "-" reads standard input, spooled to an unlinked temporary file so it can be re-read.

    Anvil line: {"custom_id", "prompt" | "messages", "task": {kind, name, reference_code,
    test_code, extra}, "n", "temperature", "top_p", "top_k", "min_p", "max_tokens", "stop",
    "stop_token_ids", "seed", "logprobs", "top_logprobs", "metadata", "completion" |
    "completions"}. custom_id defaults to "line-<N>". A line with "completion" (a string) or
    "completions" (1 to 4096 strings) carries existing completions to re-score (Task.completions,
    for `anvil submit --score-only`); it needs no prompt, and "n", if given, must be their
    count. OpenAI line: {"custom_id", "method", "url", "body": {"messages" | "prompt",
    "max_tokens" | "max_completion_tokens", "temperature", "top_p", "n", "stop", "seed",
    "logprobs", "top_logprobs", ...}, "task"}. Unknown keys are errors (a typo in a sampling
    key must not be silently ignored); custom_ids must be unique within the file.
    One reader belongs to one thread.
*/
#ifndef CLI_JSONL_H
#define CLI_JSONL_H

#include "anvil.pb-c.h"

#include <stddef.h>
#include <stdint.h>

typedef enum {
    CLI_FMT_UNKNOWN = 0, /* no JSON object seen yet */
    CLI_FMT_ANVIL = 1,
    CLI_FMT_OPENAI = 2,
} cli_fmt_t;

#define CLI_JSONL_MAX_LINE (16u << 20) /* one task must fit easily in one 64 MiB chunk */

typedef struct cli_jsonl_t cli_jsonl_t;

/* Opens `path` ("-" = standard input). Returns NULL with the reason in err. */
cli_jsonl_t *cli_jsonl_open(const char *path, char *err, size_t errlen);
void cli_jsonl_destroy(cli_jsonl_t **self_p);

/* Reads the next non-blank line. Returns 1 with a new task in *task (the caller frees it with
   cli_task_free), 0 at the end of the file, ANV_EFORMAT for a malformed line (the reason,
   naming the line, is in cli_jsonl_errstr; reading may go on with the next line), or another
   negative code for an I/O error (fatal; reason in errstr). */
int cli_jsonl_next(cli_jsonl_t *self, Anvil__Task **task);
/* Starts again at the first line with a fresh duplicate check. Returns 0, or ANV_ESTATE when
   the file changed since it was opened. */
int cli_jsonl_rewind(cli_jsonl_t *self);

cli_fmt_t cli_jsonl_format(const cli_jsonl_t *self);
const char *cli_jsonl_format_name(cli_fmt_t fmt);
/* Line number (1-based) of the line last returned. */
uint64_t cli_jsonl_line(const cli_jsonl_t *self);
/* The last error, e.g. "line 7: 'temperature' must be a number in [0, 10]". */
const char *cli_jsonl_errstr(const cli_jsonl_t *self);

/* Parses one line on its own (no duplicate check, format given or detected). For tests and
   for callers holding a single line. Returns 0 with *task, or ANV_EFORMAT with the reason in
   err (without the "line N: " prefix). */
int cli_jsonl_parse_line(const char *line,
                         size_t len,
                         cli_fmt_t *fmt,
                         Anvil__Task **task,
                         char *err,
                         size_t errlen);

/* Frees a task built by this module (or any heap-built Task); accepts NULL. */
void cli_task_free(Anvil__Task **task_p);

#endif

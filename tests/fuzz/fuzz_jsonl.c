/*  fuzz_jsonl.c - fuzz target: prompt files (Anvil and OpenAI Batch JSONL) through the CLI's
    reader, as `anvil submit` and `anvil import` read them.

    Input: a mode byte, then the payload.
      even: the payload is one line for cli_jsonl_parse_line (format detected);
      odd:  the payload is a whole file: cli_jsonl_open, read to the end (a malformed line is
            reported and reading goes on, an I/O error stops), rewind, read again. Both passes
            must give the same tasks in the same order (byte-equal when packed), as submit's
            validate-then-send relies on, and every task must pack and unpack.
*/
#include "anv_error.h"
#include "cli_jsonl.h"
#include "fuzz_util.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define S_MAX_TASKS 256

static uint8_t *s_pack(const Anvil__Task *t, size_t *len)
{
    *len = anvil__task__get_packed_size(t);
    uint8_t *p = malloc(*len ? *len : 1);
    if (!p)
        abort();
    anvil__task__pack(t, p);
    Anvil__Task *back = anvil__task__unpack(NULL, *len, p);
    if (!back)
        abort(); /* what the reader builds must go on the wire */
    anvil__task__free_unpacked(back, NULL);
    return p;
}

/* one pass over the file; returns the number of tasks, packed into out */
static int s_pass(cli_jsonl_t *r, uint8_t **out, size_t *lens)
{
    int n = 0;
    for (int lines = 0; lines < 100000; lines++) {
        Anvil__Task *t = NULL;
        int rc = cli_jsonl_next(r, &t);
        if (rc == 1) {
            if (!t || !t->custom_id || !t->custom_id[0])
                abort();
            if (n < S_MAX_TASKS) {
                out[n] = s_pack(t, &lens[n]);
                n++;
            }
            cli_task_free(&t);
            continue;
        }
        if (t)
            abort();
        if (rc == ANV_EFORMAT) {
            if (!cli_jsonl_errstr(r)[0])
                abort();
            continue;
        }
        break; /* end of file or I/O error */
    }
    return n;
}

static void s_file(const uint8_t *data, size_t size)
{
    fuzz_write("prompts.jsonl", data, size);
    char err[256] = "";
    cli_jsonl_t *r = cli_jsonl_open(fuzz_path("prompts.jsonl"), err, sizeof err);
    if (!r)
        abort();
    uint8_t *a[S_MAX_TASKS], *b[S_MAX_TASKS];
    size_t la[S_MAX_TASKS], lb[S_MAX_TASKS];
    int na = s_pass(r, a, la);
    if (cli_jsonl_rewind(r) != 0)
        abort();
    int nb = s_pass(r, b, lb);
    if (na != nb)
        abort();
    for (int i = 0; i < na; i++) {
        if (la[i] != lb[i] || memcmp(a[i], b[i], la[i]) != 0)
            abort();
        free(a[i]);
        free(b[i]);
    }
    (void)cli_jsonl_format_name(cli_jsonl_format(r));
    cli_jsonl_destroy(&r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_quiet();
    if (size == 0)
        return 0;
    if (data[0] & 1) {
        s_file(data + 1, size - 1);
        return 0;
    }
    char *line = fuzz_strndup(data + 1, size - 1);
    cli_fmt_t fmt = data[0] & 2 ? CLI_FMT_OPENAI : CLI_FMT_UNKNOWN;
    Anvil__Task *t = NULL;
    char err[512] = "";
    int rc = cli_jsonl_parse_line(line, size - 1, &fmt, &t, err, sizeof err);
    if (rc == 0) {
        size_t len;
        free(s_pack(t, &len));
        cli_task_free(&t);
    } else if (rc != ANV_EFORMAT || t || !err[0]) {
        abort();
    }
    free(line);
    return 0;
}

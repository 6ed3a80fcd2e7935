/*  fuzz_score_batch.c - fuzz target: a line of an `anvil-exec-worker --score-batch` file
    through exec_batch_parse, as the worker reads each line before scoring it.

    Whatever the bytes, the result is an item, a blank line or an error with a reason; an
    item's paths end with the path the line gave (relative ones under the batch directory).
*/
#include "anv_error.h"
#include "exec_batch.h"
#include "fuzz_util.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_quiet();
    /* the line as getline hands it over: not NUL-terminated within size */
    char *line = malloc(size ? size : 1);
    if (!line)
        abort();
    memcpy(line, data, size);
    exec_batch_item_t it;
    char err[256] = "";
    int rc = exec_batch_parse(line, size, "/batch/dir", &it, err, sizeof err);
    if (rc == 1) {
        if (!it.task_path || !it.cand_path || (it.static_checks < -1 || it.static_checks > 1))
            abort();
        if (it.task_path[0] != '/' || it.cand_path[0] != '/')
            abort();
        exec_batch_item_release(&it);
        exec_batch_item_release(&it); /* idempotent */
    } else if (rc == ANV_EFORMAT) {
        if (!err[0] || it.task_path || it.kind)
            abort();
    } else if (rc != 0 && rc != -ENOMEM) {
        abort();
    }
    free(line);
    return 0;
}

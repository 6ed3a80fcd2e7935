/*  fuzz_extract.c - fuzz target: a model completion through exec_extract_code, the first
    thing the exec worker does with a generated sample.

    Whatever the text, the result is code that occurs in the completion, or NULL with a reason.
*/
#include "exec_extract.h"
#include "fuzz_util.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_quiet();
    char *text = fuzz_strndup(data, size);
    char err[256] = "";
    char *code = exec_extract_code(text, err, sizeof err);
    if (!code && !err[0])
        abort();
    if (code && !strstr(text, code))
        abort(); /* the code is a piece of the completion, never invented */
    free(code);
    free(text);
    return 0;
}

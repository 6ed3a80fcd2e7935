/*  fuzz_safetensors.c - fuzz target: bytes as a whole safetensors file (eng_st_parse, which
    eng_st_open runs over the mapping).

    Whatever the bytes, the parser returns a file object or NULL with a reason. Every tensor it
    hands out must lie inside the buffer, have nbytes == product(shape) * dtype size, and be
    found again by its name.
*/
#include "eng_safetensors.h"
#include "fuzz_util.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_quiet();
    char err[256] = "";
    eng_st_file_t *f = eng_st_parse(data, size, err, sizeof err);
    if (!f) {
        if (!err[0])
            abort(); /* a refusal must say why */
        return 0;
    }
    for (int i = 0; i < eng_st_count(f); i++) {
        const eng_st_tensor_t *t = eng_st_at(f, i);
        if (!t || !t->name || t->ndim < 0 || t->ndim > ENG_ST_MAX_DIMS)
            abort();
        const uint8_t *p = t->data;
        if (t->nbytes && (p < data || p + t->nbytes > data + size || p + t->nbytes < p))
            abort();
        uint64_t n = eng_dtype_size(t->dtype);
        for (int d = 0; d < t->ndim; d++) {
            if (t->shape[d] < 0)
                abort();
            n *= (uint64_t)t->shape[d];
        }
        if (n != t->nbytes)
            abort();
        if (t->nbytes) {
            volatile uint8_t sink = p[0] ^ p[t->nbytes - 1]; /* in bounds (ASan checks) */
            (void)sink;
        }
        if (eng_st_find(f, t->name) != t)
            abort();
    }
    eng_st_destroy(&f);
    if (f)
        abort();
    return 0;
}

/*  fuzz_exec_tensors.c - fuzz target: a tensor record file (harness/tensorio.py format) as the
    exec worker reads it back from a sandboxed process, which may be a hostile candidate.

    The bytes are written to a file and opened with exec_tensors_open. A file that opens must
    have every leaf inside the mapping, and comparing it with itself must match (the verdict
    channel must not reject or crash on what it accepted).
*/
#include "exec_compare.h"
#include "exec_tensor.h"
#include "fuzz_util.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_quiet();
    fuzz_write("out.bin", data, size);
    char err[256] = "";
    exec_tensors_t *t = exec_tensors_open(fuzz_path("out.bin"), err, sizeof err);
    if (!t) {
        if (!err[0])
            abort();
        return 0;
    }
    size_t n = exec_tensors_count(t);
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < n; i++) {
        const exec_leaf_t *l = exec_tensors_leaf(t, i);
        if (!l || l->ndim > EXEC_TENSOR_MAX_NDIM)
            abort();
        if (l->keylen)
            sink ^= (uint8_t)l->key[l->keylen - 1];
        if (l->nbytes)
            sink ^= l->data[0] ^ l->data[l->nbytes - 1];
    }
    (void)sink;
    if (exec_tensors_leaf(t, n) != NULL)
        abort();
    exec_tol_t tol;
    exec_tol_default(&tol);
    exec_cmp_t cmp;
    if (exec_compare(t, t, &tol, &cmp) == 0 && !cmp.match)
        abort();
    exec_tensors_destroy(&t);
    return 0;
}

/*  exec_tensor.h - read the tensor record files the harness writes (harness/tensorio.py).

    A file is a sequence of records, each: u32 magic 'ANVT', u32 dtype, u32 ndim, u32 keylen,
    u64 nbytes, i64 shape[ndim], key, pad to 8, data, pad to 8. The file is mapped read-only and
    every field is validated against the file size before use: the file may come from a
    candidate's process, so a malformed one is an error with a reason, never a crash.
    Leaves borrow from the mapping and live as long as the exec_tensors_t.
*/
#ifndef EXEC_TENSOR_H
#define EXEC_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    EXEC_DT_F32 = 1,
    EXEC_DT_F64,
    EXEC_DT_F16,
    EXEC_DT_BF16,
    EXEC_DT_I8,
    EXEC_DT_I16,
    EXEC_DT_I32,
    EXEC_DT_I64,
    EXEC_DT_U8,
    EXEC_DT_BOOL,
    EXEC_DT_STR,
    EXEC_DT_NONE,
    EXEC_DT_C64,  /* stored as f32 pairs (trailing dimension 2) */
    EXEC_DT_C128, /* stored as f64 pairs */
    EXEC_DT_F8E4M3, /* stored widened to f32 */
    EXEC_DT_F8E5M2, /* stored widened to f32 */
    EXEC_DT_COUNT
} exec_dtype_t;

#define EXEC_TENSOR_MAX_NDIM 16

typedef struct {
    const char *key; /* not NUL-terminated: keylen bytes */
    uint32_t keylen;
    uint32_t dtype;  /* exec_dtype_t */
    uint32_t ndim;
    int64_t shape[EXEC_TENSOR_MAX_NDIM];
    uint64_t numel;  /* logical elements (complex: pairs count as one) */
    const uint8_t *data;
    uint64_t nbytes;
} exec_leaf_t;

typedef struct exec_tensors_t exec_tensors_t;

/* Maps and validates `path`. Returns NULL with the reason in err when the file is missing or
   malformed. */
exec_tensors_t *exec_tensors_open(const char *path, char *err, size_t errlen);
void exec_tensors_destroy(exec_tensors_t **self_p);
size_t exec_tensors_count(const exec_tensors_t *self);
/* Borrowed; NULL when i is out of range. */
const exec_leaf_t *exec_tensors_leaf(const exec_tensors_t *self, size_t i);

/* Number of stored scalars per logical element (2 for complex, else 1). */
int exec_dtype_lanes(uint32_t dtype);
bool exec_dtype_is_float(uint32_t dtype);
const char *exec_dtype_name(uint32_t dtype);
/* Stored scalar j (0 <= j < numel * lanes) of a numeric leaf as a double. */
double exec_leaf_get(const exec_leaf_t *leaf, uint64_t j);
/* Stored scalars j0 .. j0 + n - 1 as doubles into dst: exec_leaf_get over a block, with the
   dtype dispatched once (the comparison of large outputs runs through this). */
void exec_leaf_read(const exec_leaf_t *leaf, uint64_t j0, uint64_t n, double *dst);

#endif

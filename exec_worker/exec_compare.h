/*  exec_compare.h - the worker's own comparison of reference and candidate outputs.

    This is the verdict channel: both files were written by separate sandboxed processes and
    are compared here, in the C worker, which no candidate code runs in. Leaves must match in
    count, key, dtype and shape; integer, bool and string leaves must be equal byte for byte;
    floating leaves element-wise |c - r| <= atol + rtol * |r| with per-dtype tolerances, NaN
    where and only where the reference has NaN, infinities equal. The comparison also says
    whether an all-zero or a constant output would have passed against this reference (tasks
    with that weakness are flagged) and whether the candidate's output is itself constant.
*/
#ifndef EXEC_COMPARE_H
#define EXEC_COMPARE_H

#include "exec_tensor.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    double atol[EXEC_DT_COUNT];
    double rtol[EXEC_DT_COUNT];
} exec_tol_t;

/* Defaults: f64 1e-6, f32 1e-2 (KernelBench's), f16 1e-2, bf16 2e-2, float8 1e-1. */
void exec_tol_default(exec_tol_t *tol);
/* Overrides every floating dtype (a value < 0 leaves that one unchanged). */
void exec_tol_override(exec_tol_t *tol, double atol, double rtol);

typedef struct {
    bool match;
    char reason[640];       /* why not, first problem found */
    double max_abs;         /* over compared floating elements */
    double max_rel;         /* |c - r| / max(|r|, tiny) */
    uint64_t compared;      /* floating elements compared */
    uint64_t bad;           /* elements out of tolerance */
    bool zero_would_pass;   /* all-zero floating output would have matched */
    bool const_would_pass;  /* a per-leaf constant (the reference mean) would have matched */
    bool ref_constant;      /* every floating leaf of the reference is constant */
    bool cand_constant;     /* every floating leaf of the candidate is constant */
    bool has_float;
} exec_cmp_t;

/* Compares ref with cand. Returns 0 with the verdict in out (a candidate file that is missing
   or malformed is a mismatch with its reason), or a negative code when the reference file
   cannot be read (then nothing can be scored). */
int exec_compare_files(const char *ref_path,
                       const char *cand_path,
                       const exec_tol_t *tol,
                       exec_cmp_t *out);
int exec_compare(const exec_tensors_t *ref,
                 const exec_tensors_t *cand,
                 const exec_tol_t *tol,
                 exec_cmp_t *out);

#endif

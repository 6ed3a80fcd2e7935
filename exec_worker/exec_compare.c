/*  exec_compare.c - leaf-by-leaf comparison with per-dtype tolerances.

    Design: one pass per floating leaf computes, besides the verdict, the statistics the
    degenerate-output checks need (would zero pass, would the reference mean pass, is each
    side constant), so each element is read once. The mean is computed in a first, cheap pass
    over the reference only.
*/
#include "exec_compare.h"

#include "anv_error.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

void exec_tol_default(exec_tol_t *tol)
{
    for (int i = 0; i < EXEC_DT_COUNT; i++)
        tol->atol[i] = tol->rtol[i] = 0;
    tol->atol[EXEC_DT_F64] = tol->rtol[EXEC_DT_F64] = 1e-6;
    tol->atol[EXEC_DT_C128] = tol->rtol[EXEC_DT_C128] = 1e-6;
    tol->atol[EXEC_DT_F32] = tol->rtol[EXEC_DT_F32] = 1e-2;
    tol->atol[EXEC_DT_C64] = tol->rtol[EXEC_DT_C64] = 1e-2;
    tol->atol[EXEC_DT_F16] = tol->rtol[EXEC_DT_F16] = 1e-2;
    tol->atol[EXEC_DT_BF16] = tol->rtol[EXEC_DT_BF16] = 2e-2;
    tol->atol[EXEC_DT_F8E4M3] = tol->rtol[EXEC_DT_F8E4M3] = 1e-1;
    tol->atol[EXEC_DT_F8E5M2] = tol->rtol[EXEC_DT_F8E5M2] = 1e-1;
}

void exec_tol_override(exec_tol_t *tol, double atol, double rtol)
{
    for (int i = 1; i < EXEC_DT_COUNT; i++) {
        if (!exec_dtype_is_float((uint32_t)i))
            continue;
        if (atol >= 0)
            tol->atol[i] = atol;
        if (rtol >= 0)
            tol->rtol[i] = rtol;
    }
}

static void s_fail(exec_cmp_t *out, const char *fmt, const exec_leaf_t *l, const char *detail)
{
    if (!out->match)
        return;
    out->match = false;
    snprintf(out->reason, sizeof out->reason, fmt, (int)l->keylen, l->key, detail);
}

static void s_shape(const exec_leaf_t *l, char *buf, size_t len)
{
    size_t o = (size_t)snprintf(buf, len, "(");
    for (uint32_t d = 0; d < l->ndim && o < len; d++)
        o += (size_t)snprintf(buf + o, len - o, d ? ", %lld" : "%lld", (long long)l->shape[d]);
    if (o < len)
        snprintf(buf + o, len - o, ")");
}

static bool s_close(double c, double r, double atol, double rtol)
{
    if (isnan(r))
        return isnan(c);
    if (isinf(r))
        return c == r;
    if (!isfinite(c))
        return false;
    return fabs(c - r) <= atol + rtol * fabs(r);
}

enum { S_BLOCK = 4096 }; /* scalars converted to double per block */

static void s_float_leaf(const exec_leaf_t *r, const exec_leaf_t *c, const exec_tol_t *tol,
                         exec_cmp_t *out, bool *ref_const, bool *cand_const)
{
    uint64_t n = r->numel * (uint64_t)exec_dtype_lanes(r->dtype);
    double atol = tol->atol[r->dtype], rtol = tol->rtol[r->dtype], sum = 0;
    double rb[S_BLOCK], cb[S_BLOCK];
    uint64_t finite = 0;
    for (uint64_t j0 = 0; j0 < n; j0 += S_BLOCK) {
        uint64_t k = n - j0 < S_BLOCK ? n - j0 : S_BLOCK;
        exec_leaf_read(r, j0, k, rb);
        for (uint64_t i = 0; i < k; i++)
            if (isfinite(rb[i])) {
                sum += rb[i];
                finite++;
            }
    }
    double mean = finite ? sum / (double)finite : 0;
    double r0 = n ? exec_leaf_get(r, 0) : 0, c0 = n ? exec_leaf_get(c, 0) : 0;
    bool rc = true, cc = true, zero = true, cst = true;
    double max_abs = out->max_abs, max_rel = out->max_rel;
    uint64_t first_bad = UINT64_MAX;
    for (uint64_t j0 = 0; j0 < n; j0 += S_BLOCK) {
        uint64_t k = n - j0 < S_BLOCK ? n - j0 : S_BLOCK;
        exec_leaf_read(r, j0, k, rb);
        exec_leaf_read(c, j0, k, cb);
        for (uint64_t i = 0; i < k; i++) {
            double rv = rb[i], cv = cb[i];
            if (rc && rv != r0 && !(isnan(rv) && isnan(r0)))
                rc = false;
            if (cc && cv != c0 && !(isnan(cv) && isnan(c0)))
                cc = false;
            bool close;
            if (isfinite(rv) && isfinite(cv)) { /* the common case, without calls */
                double ar = fabs(rv), d = fabs(cv - rv), lim = atol + rtol * ar;
                double den = ar > 1e-12 ? ar : 1e-12;
                max_abs = d > max_abs ? d : max_abs;
                if (d > max_rel * den) /* divide only when the relative error grows */
                    max_rel = d / den;
                close = d <= lim;
                zero = zero && ar <= lim;
                cst = cst && fabs(mean - rv) <= lim;
            } else {
                if (!isnan(rv) && isnan(cv))
                    max_abs = max_rel = INFINITY;
                close = s_close(cv, rv, atol, rtol);
                zero = zero && s_close(0.0, rv, atol, rtol);
                cst = cst && s_close(mean, rv, atol, rtol);
            }
            if (!close) {
                if (first_bad == UINT64_MAX)
                    first_bad = j0 + i;
                out->bad++;
            }
        }
    }
    if (max_abs > out->max_abs)
        out->max_abs = max_abs;
    if (max_rel > out->max_rel)
        out->max_rel = max_rel;
    out->compared += n;
    if (n > 1) {
        *ref_const = *ref_const && rc;
        *cand_const = *cand_const && cc;
    }
    out->zero_would_pass = out->zero_would_pass && zero;
    out->const_would_pass = out->const_would_pass && cst;
    if (first_bad != UINT64_MAX && out->match) {
        out->match = false;
        snprintf(out->reason, sizeof out->reason,
                 "output '%.*s' differs at element %llu: %.6g vs reference %.6g "
                 "(atol %g rtol %g, %llu of %llu out of tolerance)",
                 (int)r->keylen, r->key, (unsigned long long)first_bad,
                 exec_leaf_get(c, first_bad), exec_leaf_get(r, first_bad), atol, rtol,
                 (unsigned long long)out->bad, (unsigned long long)n);
    }
}

int exec_compare(const exec_tensors_t *ref,
                 const exec_tensors_t *cand,
                 const exec_tol_t *tol,
                 exec_cmp_t *out)
{
    memset(out, 0, sizeof *out);
    out->match = true;
    out->zero_would_pass = out->const_would_pass = true;
    bool ref_const = true, cand_const = true;
    size_t nr = exec_tensors_count(ref), nc = exec_tensors_count(cand);
    if (nr != nc) {
        out->match = false;
        snprintf(out->reason, sizeof out->reason, "output has %zu leaves, the reference %zu",
                 nc, nr);
    }
    for (size_t i = 0; i < nr && i < nc; i++) {
        const exec_leaf_t *r = exec_tensors_leaf(ref, i), *c = exec_tensors_leaf(cand, i);
        char a[160], b[160];
        if (r->keylen != c->keylen || memcmp(r->key, c->key, r->keylen) != 0) {
            s_fail(out, "output leaf '%.*s' missing or out of order%s", r, "");
            continue;
        }
        if (r->dtype != c->dtype) {
            snprintf(a, sizeof a, ": %s instead of %s", exec_dtype_name(c->dtype),
                     exec_dtype_name(r->dtype));
            s_fail(out, "output '%.*s' has the wrong dtype%s", r, a);
            continue;
        }
        if (r->ndim != c->ndim || memcmp(r->shape, c->shape, sizeof(int64_t) * r->ndim) != 0) {
            s_shape(c, a, sizeof a);
            s_shape(r, b, sizeof b);
            char d[400];
            snprintf(d, sizeof d, ": %s instead of %s", a, b);
            s_fail(out, "output '%.*s' has the wrong shape%s", r, d);
            continue;
        }
        if (exec_dtype_is_float(r->dtype)) {
            out->has_float = true;
            s_float_leaf(r, c, tol, out, &ref_const, &cand_const);
        } else if (r->nbytes != c->nbytes || memcmp(r->data, c->data, r->nbytes) != 0) {
            s_fail(out, "output '%.*s' differs (%s values must be equal)", r,
                   exec_dtype_name(r->dtype));
        }
    }
    if (!out->has_float)
        out->zero_would_pass = out->const_would_pass = false;
    out->ref_constant = out->has_float && ref_const;
    out->cand_constant = out->has_float && cand_const;
    return 0;
}

int exec_compare_files(const char *ref_path,
                       const char *cand_path,
                       const exec_tol_t *tol,
                       exec_cmp_t *out)
{
    char err[256];
    exec_tensors_t *ref = exec_tensors_open(ref_path, err, sizeof err);
    if (!ref) {
        memset(out, 0, sizeof *out);
        snprintf(out->reason, sizeof out->reason, "reference output: %s", err);
        return ANV_EINTERNAL;
    }
    exec_tensors_t *cand = exec_tensors_open(cand_path, err, sizeof err);
    if (!cand) {
        memset(out, 0, sizeof *out);
        snprintf(out->reason, sizeof out->reason, "candidate output: %s", err);
        exec_tensors_destroy(&ref);
        return 0;
    }
    int rc = exec_compare(ref, cand, tol, out);
    exec_tensors_destroy(&ref);
    exec_tensors_destroy(&cand);
    return rc;
}

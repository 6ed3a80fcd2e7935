/*  exec_compare.c - leaf-by-leaf comparison with per-dtype tolerances.

    Design: one pass per floating leaf computes, besides the verdict, the statistics the
    degenerate-output checks need (would zero pass, would the reference mean pass, is each
    side constant), so each element is read once. Blocks of finite values (nearly all) go
    through a branch-free two-lane loop in GCC vector extensions; a block with a NaN or an
    infinity goes element by element. A leaf of 4M elements or more is split over threads
    (whole blocks, an accumulator each, merged in order). tests/exec_worker/bench_compare
    prints the rate against memcpy.
*/
#include "exec_compare.h"

#include "anv_error.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

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

/* What the one pass over a leaf gathers, block by block. The constant-output check needs
   the reference's mean, known only at the end: |mean - r| <= lim for every element is
   mean in [max(r - lim), min(r + lim)], so the pass keeps that interval (lo, hi) and the
   sum, and the check is made once the mean is known. The relative error's maximum is kept
   as a fraction (rel_num / rel_den) and compared by cross-multiplication: no division per
   element. */
typedef struct {
    double atol, rtol, r0, c0, max_abs, rel_num, rel_den, sum, lo, hi;
    uint64_t bad, finite, first_bad;
    bool rc, cc, zero, ref_nonfinite;
} s_acc_t;

/* Two doubles and their comparison masks as GCC vector extensions: plain C that lowers to
   one register of the target's vector unit (SSE2 on baseline x86-64, NEON on arm64). */
typedef double s_v2d __attribute__((vector_size(16)));
typedef int64_t s_v2l __attribute__((vector_size(16)));
enum { S_LANES = 2 }; /* S_BLOCK is a multiple */

static inline s_v2d s_load2(const double *p)
{
    s_v2d v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline s_v2d s_sel(s_v2l m, s_v2d a, s_v2d b) /* m ? a : b, lane by lane */
{
    return (s_v2d)((m & (s_v2l)a) | (~m & (s_v2l)b));
}

static inline s_v2d s_abs2(s_v2d v)
{
    return (s_v2d)((s_v2l)v & (s_v2l){INT64_MAX, INT64_MAX});
}

/* One element's relative error num / den (den >= 1e-12) against the running maximum. */
static inline void s_rel(s_acc_t *a, double num, double den)
{
    if (num * a->rel_den > a->rel_num * den) {
        a->rel_num = num;
        a->rel_den = den;
    }
}

/* A block where every value on both sides is finite, two lanes at a time: each lane keeps
   its own maxima, counts and flags (selects and adds, no branch, no call), merged at the
   end. The non-finite test rides along (x - x is 0 exactly when x is finite); a block that
   holds a NaN or an infinity, or whose length is not a multiple of the lanes (the tail),
   returns false with nothing changed and goes the general way. */
static bool s_block_finite(const double *rb, const double *cb, uint64_t k, s_acc_t *a)
{
    if (k % S_LANES)
        return false;
    const s_v2d zero = {0, 0}, tiny = zero + 1e-12, atol = zero + a->atol,
                rtol = zero + a->rtol, r0 = zero + a->r0, c0 = zero + a->c0;
    s_v2d mabs = zero, rnum = zero, rden = zero + 1, sum = zero, lo = zero - INFINITY,
          hi = zero + INFINITY;
    s_v2l bad = {0}, nonfin = {0}, zf = {0}, rd = {0}, cd = {0};
    for (uint64_t i = 0; i < k; i += S_LANES) {
        s_v2d rv = s_load2(rb + i), cv = s_load2(cb + i);
        nonfin |= (rv - rv != zero) | (cv - cv != zero);
        s_v2d ar = s_abs2(rv), d = s_abs2(cv - rv), lim = atol + rtol * ar;
        s_v2d den = s_sel(ar > tiny, ar, tiny);
        s_v2l up = d * rden > rnum * den;
        rnum = s_sel(up, d, rnum);
        rden = s_sel(up, den, rden);
        mabs = s_sel(d > mabs, d, mabs);
        bad -= d > lim; /* a true lane is -1 */
        zf |= ar > lim;
        lo = s_sel(rv - lim > lo, rv - lim, lo);
        hi = s_sel(rv + lim < hi, rv + lim, hi);
        sum += rv;
        rd |= rv != r0;
        cd |= cv != c0;
    }
    if (nonfin[0] | nonfin[1])
        return false;
    for (int l = 0; l < S_LANES; l++) {
        a->max_abs = mabs[l] > a->max_abs ? mabs[l] : a->max_abs;
        s_rel(a, rnum[l], rden[l]);
        a->lo = lo[l] > a->lo ? lo[l] : a->lo;
        a->hi = hi[l] < a->hi ? hi[l] : a->hi;
        a->bad += (uint64_t)bad[l];
        a->zero = a->zero && !zf[l];
        a->rc = a->rc && !rd[l];
        a->cc = a->cc && !cd[l];
    }
    a->sum += sum[0] + sum[1];
    a->finite += k;
    return true;
}

/* The general block, one element at a time: NaN where the reference has NaN, infinities. */
static void s_block_any(const double *rb, const double *cb, uint64_t k, s_acc_t *a)
{
    for (uint64_t i = 0; i < k; i++) {
        double rv = rb[i], cv = cb[i];
        if (a->rc && rv != a->r0 && !(isnan(rv) && isnan(a->r0)))
            a->rc = false;
        if (a->cc && cv != a->c0 && !(isnan(cv) && isnan(a->c0)))
            a->cc = false;
        if (isfinite(rv)) {
            double lim = a->atol + a->rtol * fabs(rv);
            a->sum += rv;
            a->finite++;
            a->lo = rv - lim > a->lo ? rv - lim : a->lo;
            a->hi = rv + lim < a->hi ? rv + lim : a->hi;
            a->zero = a->zero && fabs(rv) <= lim;
        } else {
            a->ref_nonfinite = true; /* no finite constant equals a NaN or an infinity */
            a->zero = false;
        }
        bool close;
        if (isfinite(rv) && isfinite(cv)) {
            double ar = fabs(rv), d = fabs(cv - rv);
            a->max_abs = d > a->max_abs ? d : a->max_abs;
            s_rel(a, d, ar > 1e-12 ? ar : 1e-12);
            close = d <= a->atol + a->rtol * ar;
        } else {
            if (!isnan(rv) && isnan(cv))
                a->max_abs = a->rel_num = INFINITY, a->rel_den = 1;
            close = s_close(cv, rv, a->atol, a->rtol);
        }
        if (!close)
            a->bad++;
    }
}

/* Elements [j0, j1) of a leaf into a (j0 a multiple of S_BLOCK). */
static void s_range(const exec_leaf_t *r, const exec_leaf_t *c, uint64_t j0, uint64_t j1,
                    s_acc_t *a)
{
    double rb[S_BLOCK], cb[S_BLOCK];
    for (; j0 < j1; j0 += S_BLOCK) {
        uint64_t k = j1 - j0 < S_BLOCK ? j1 - j0 : S_BLOCK;
        exec_leaf_read(r, j0, k, rb);
        exec_leaf_read(c, j0, k, cb);
        uint64_t bad = a->bad;
        if (!s_block_finite(rb, cb, k, a))
            s_block_any(rb, cb, k, a);
        if (a->bad > bad && a->first_bad == UINT64_MAX) /* the first bad block: find where */
            for (uint64_t i = 0; i < k && a->first_bad == UINT64_MAX; i++)
                if (!s_close(cb[i], rb[i], a->atol, a->rtol))
                    a->first_bad = j0 + i;
    }
}

/* Large leaves are split over threads, in whole blocks, each with its own accumulator, merged
   in order (so the first bad element is the first part's that has one). */
enum { S_PAR_MIN = 1 << 21, S_PAR_MAX = 8 }; /* elements per thread at least; threads at most */

typedef struct {
    const exec_leaf_t *r, *c;
    uint64_t j0, j1;
    s_acc_t a;
} s_part_t;

static void *s_part_main(void *arg)
{
    s_part_t *p = arg;
    s_range(p->r, p->c, p->j0, p->j1, &p->a);
    return NULL;
}

static void s_merge(s_acc_t *into, const s_acc_t *a)
{
    into->max_abs = a->max_abs > into->max_abs ? a->max_abs : into->max_abs;
    s_rel(into, a->rel_num, a->rel_den);
    into->lo = a->lo > into->lo ? a->lo : into->lo;
    into->hi = a->hi < into->hi ? a->hi : into->hi;
    into->sum += a->sum;
    into->finite += a->finite;
    into->bad += a->bad;
    if (into->first_bad == UINT64_MAX)
        into->first_bad = a->first_bad;
    into->rc = into->rc && a->rc;
    into->cc = into->cc && a->cc;
    into->zero = into->zero && a->zero;
    into->ref_nonfinite = into->ref_nonfinite || a->ref_nonfinite;
}

static int s_threads(uint64_t n)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    uint64_t t = n / S_PAR_MIN;
    if (cores > 0 && t > (uint64_t)cores)
        t = (uint64_t)cores;
    return t > S_PAR_MAX ? S_PAR_MAX : t < 1 ? 1 : (int)t;
}

static void s_float_leaf(const exec_leaf_t *r, const exec_leaf_t *c, const exec_tol_t *tol,
                         exec_cmp_t *out, bool *ref_const, bool *cand_const)
{
    uint64_t n = r->numel * (uint64_t)exec_dtype_lanes(r->dtype);
    s_acc_t a = {.atol = tol->atol[r->dtype], .rtol = tol->rtol[r->dtype],
                 .r0 = n ? exec_leaf_get(r, 0) : 0, .c0 = n ? exec_leaf_get(c, 0) : 0,
                 .max_abs = out->max_abs, .rel_num = out->max_rel, .rel_den = 1,
                 .lo = -INFINITY, .hi = INFINITY, .first_bad = UINT64_MAX, .rc = true,
                 .cc = true, .zero = true};
    int nt = s_threads(n);
    if (nt < 2) {
        s_range(r, c, 0, n, &a);
    } else {
        s_part_t parts[S_PAR_MAX];
        pthread_t th[S_PAR_MAX];
        bool started[S_PAR_MAX] = {false};
        uint64_t blocks = (n + S_BLOCK - 1) / S_BLOCK, per = (blocks + (uint64_t)nt - 1) / (uint64_t)nt;
        for (int t = 0; t < nt; t++) {
            uint64_t j0 = (uint64_t)t * per * S_BLOCK, j1 = j0 + per * S_BLOCK;
            parts[t] = (s_part_t){r, c, j0 < n ? j0 : n, j1 < n ? j1 : n, a};
            parts[t].a.max_abs = parts[t].a.rel_num = 0;
            if (t > 0) /* part 0 runs on this thread */
                started[t] = pthread_create(&th[t], NULL, s_part_main, &parts[t]) == 0;
        }
        s_part_main(&parts[0]);
        for (int t = 1; t < nt; t++) {
            if (started[t])
                pthread_join(th[t], NULL);
            else
                s_part_main(&parts[t]); /* no thread to be had: here, in order */
        }
        for (int t = 0; t < nt; t++)
            s_merge(&a, &parts[t].a);
    }
    double mean = a.finite ? a.sum / (double)a.finite : 0;
    out->bad += a.bad;
    if (a.max_abs > out->max_abs)
        out->max_abs = a.max_abs;
    double max_rel = a.rel_num / a.rel_den;
    if (max_rel > out->max_rel)
        out->max_rel = max_rel;
    out->compared += n;
    if (n > 1) {
        *ref_const = *ref_const && a.rc;
        *cand_const = *cand_const && a.cc;
    }
    out->zero_would_pass = out->zero_would_pass && a.zero;
    out->const_would_pass = out->const_would_pass && !a.ref_nonfinite &&
                            (n == 0 || (a.lo <= mean && mean <= a.hi));
    if (a.first_bad != UINT64_MAX && out->match) {
        out->match = false;
        snprintf(out->reason, sizeof out->reason,
                 "output '%.*s' differs at element %llu: %.6g vs reference %.6g "
                 "(atol %g rtol %g, %llu of %llu out of tolerance)",
                 (int)r->keylen, r->key, (unsigned long long)a.first_bad,
                 exec_leaf_get(c, a.first_bad), exec_leaf_get(r, a.first_bad), a.atol, a.rtol,
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

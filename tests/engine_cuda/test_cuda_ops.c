/*  test_cuda_ops.c - every op of the CUDA backend against the CPU reference backend.

    Each op runs on both backends with the same random inputs (weights in bf16, fp16 and
    fp32); outputs are compared by relative norm error with a tolerance per path: fp32 math
    (GEMV, norms, RoPE, attention over identical cache values) ~1e-5, cuBLASLt paths where
    activations are rounded to the weight dtype ~1e-2 (bf16) / 2e-3 (fp16). KV pools: the CPU
    keeps fp32, the CUDA default bf16, so cache contents are compared after rounding and the
    attention tests put identical (bf16-representable) values in both. The fused linear op (norm
    folded in; plain, residual-add, SwiGLU and rope + KV store epilogues) is held to the CPU's
    composition of the separate ops, also with the GEMV taking up to 8 rows (1 by default) and
    its column segments fixed at 1, 2, 4 and 8. 64 decodes at once (more decode items than the
    GPU holds blocks) run on the default decode grid, with the KV heads inner and with V loaded
    with K, each against the CPU and the last two bit for bit against the first; decodes of 32
    to 71 splits test the combine's rounds of 32 splits. The
    rounded twins (SwiGLU's and the combine's output rounded for the next cuBLASLt product)
    are held to the same bits as the product's own rounding (test_twins). Sampling is
    checked for greedy exactness, logprobs, truncation sets, seed determinism, batch invariance
    and the empirical distribution over many seeds, for the default sampler (blocks a row by
    batch), each fixed one (one block a row, a cluster of 8 blocks a row:
    ANVIL_CUDA_SAMPLE_BLOCKS=1 / 8) and the default without its candidate list
    (ANVIL_CUDA_SAMPLE_LIST=0), with the time of a sample call printed for each; rows that
    overflow the candidate list are drawn against the host too. Exit 77 without a GPU.
*/
#include "ecu_test.h"

#include <errno.h>
#include <stdbool.h>
#include <time.h>

#include "anv_error.h"
#include "anv_log.h"
#include "cpu/eng_cpu.h"
#include "eng_cuda.h"

static eng_backend_t *cpu, *gpu, *gpu32, *gpu8;

static void *s_weights(const float *w, size_t n, eng_dtype_t dt, float *rounded)
{
    size_t es = eng_dtype_size(dt);
    void *out = malloc(n * es);
    for (size_t i = 0; i < n; i++) {
        if (dt == ENG_DTYPE_F32) {
            ((float *)out)[i] = w[i];
        } else if (dt == ENG_DTYPE_BF16) {
            ((uint16_t *)out)[i] = ecu_t_bf16(w[i]);
        } else {
            _Float16 h = (_Float16)w[i];
            memcpy((uint16_t *)out + i, &h, 2);
        }
    }
    eng_cpu_widen(rounded, out, dt, 0, n);
    return out;
}

static float *s_rand(size_t n, float scale)
{
    float *p = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        p[i] = ecu_t_randf(scale);
    return p;
}

/* Runs op on both backends with x uploaded, returns downloaded outputs. */
static void test_embedding(eng_dtype_t dt)
{
    char name[96];
    int vocab = 1000, dim = 1000, n = 6;
    float *tab = s_rand((size_t)vocab * dim, 1.0f), *r = malloc((size_t)vocab * dim * 4);
    void *tw = s_weights(tab, (size_t)vocab * dim, dt, r);
    int32_t ids[6] = {0, 999, 17, 17, 500, 3};
    size_t es = eng_dtype_size(dt);
    void *gt = ecu_t_put(gpu, tw, (size_t)vocab * dim * es);
    float *out = gpu->alloc(gpu, (size_t)n * dim * 4), *ref = malloc((size_t)n * dim * 4);
    float *got = malloc((size_t)n * dim * 4);
    cpu->embedding(cpu, ref, tw, dt, ids, n, dim);
    gpu->embedding(gpu, out, gt, dt, ids, n, dim);
    ecu_t_get(gpu, got, out, (size_t)n * dim * 4);
    snprintf(name, sizeof(name), "embedding %s", eng_dtype_name(dt));
    ecu_t_close(name, got, ref, (size_t)n * dim, 0.0);

    gpu->free(gpu, gt), gpu->free(gpu, out);
    free(tab), free(r), free(tw), free(ref), free(got);
}

/* rmsnorm, add_rmsnorm (in place on the residual), n rows of dim: a multiple of 4 takes the
   16-byte kernel (norm.cu, the default), 1002 the scalar one */
static void test_norm(eng_dtype_t dt, int dim)
{
    char name[96];
    const int n = 6;
    size_t es = eng_dtype_size(dt);
    float *out = gpu->alloc(gpu, (size_t)n * dim * 4), *ref = malloc((size_t)n * dim * 4);
    float *got = malloc((size_t)n * dim * 4);
    float *wv = s_rand(dim, 0.5f), *wr = malloc(dim * 4);
    for (int i = 0; i < dim; i++)
        wv[i] += 1.0f;
    void *ww = s_weights(wv, dim, dt, wr);
    void *gw = ecu_t_put(gpu, ww, dim * es);
    float *x = s_rand((size_t)n * dim, 3.0f), *d = s_rand((size_t)n * dim, 1.0f);
    float *gx = ecu_t_put(gpu, x, (size_t)n * dim * 4), *gd = ecu_t_put(gpu, d, (size_t)n * dim * 4);
    cpu->rmsnorm(cpu, ref, x, ww, dt, n, dim, 1e-6f);
    gpu->rmsnorm(gpu, out, gx, gw, dt, n, dim, 1e-6f);
    ecu_t_get(gpu, got, out, (size_t)n * dim * 4);
    snprintf(name, sizeof(name), "rmsnorm %s dim %d", eng_dtype_name(dt), dim);
    ecu_t_close(name, got, ref, (size_t)n * dim, 1e-6);
    cpu->add_rmsnorm(cpu, ref, x, d, ww, dt, n, dim, 1e-6f);
    gpu->add_rmsnorm(gpu, out, gx, gd, gw, dt, n, dim, 1e-6f);
    ecu_t_get(gpu, got, out, (size_t)n * dim * 4);
    snprintf(name, sizeof(name), "add_rmsnorm out %s dim %d", eng_dtype_name(dt), dim);
    ecu_t_close(name, got, ref, (size_t)n * dim, 1e-6);
    ecu_t_get(gpu, got, gx, (size_t)n * dim * 4);
    snprintf(name, sizeof(name), "add_rmsnorm residual %s dim %d", eng_dtype_name(dt), dim);
    ecu_t_close(name, got, x, (size_t)n * dim, 0.0);
    gpu->free(gpu, out), gpu->free(gpu, gw), gpu->free(gpu, gx), gpu->free(gpu, gd);
    free(ref), free(got), free(wv), free(wr), free(ww), free(x), free(d);
}

/* names the path under test in the matmul and linear checks (test_linear_segs, the GEMV and
   skinny A/Bs) */
static const char *s_lin_tag = "";

static void test_matmul(eng_dtype_t dt, int n, int in, int outd, int bias)
{
    char name[96];
    size_t es = eng_dtype_size(dt);
    float *w = s_rand((size_t)outd * in, 0.05f), *wr = malloc((size_t)outd * in * 4);
    void *wh = s_weights(w, (size_t)outd * in, dt, wr);
    float *b = s_rand(outd, 0.5f), *br = malloc(outd * 4);
    void *bh = s_weights(b, outd, dt, br);
    float *x = s_rand((size_t)n * in, 1.0f);
    float *ref = malloc((size_t)n * outd * 4), *got = malloc((size_t)n * outd * 4);
    void *gw = ecu_t_put(gpu, wh, (size_t)outd * in * es), *gb = ecu_t_put(gpu, bh, outd * es);
    float *gx = ecu_t_put(gpu, x, (size_t)n * in * 4), *go = gpu->alloc(gpu, (size_t)n * outd * 4);
    cpu->matmul(cpu, ref, x, wh, bias ? bh : NULL, dt, n, in, outd);
    int rc = gpu->matmul(gpu, go, gx, gw, bias ? gb : NULL, dt, n, in, outd);
    ecu_t_check(rc == 0, "matmul returns 0");
    ecu_t_get(gpu, got, go, (size_t)n * outd * 4);
    /* up to the backend's GEMV rows (eng_cuda_gemv_rows): fp32 GEMV; above: activations
       rounded to the weight dtype for the tensor cores */
    const int gemv = n <= eng_cuda_gemv_rows(gpu, -1);
    double tol = gemv || dt == ENG_DTYPE_F32 ? 2e-5 : dt == ENG_DTYPE_BF16 ? 1e-2 : 2e-3;
    snprintf(name, sizeof(name), "matmul %s n=%d %dx%d%s%s%s", eng_dtype_name(dt), n, in, outd,
             bias ? " +bias" : "", gemv ? " (gemv)" : "", s_lin_tag);
    ecu_t_close(name, got, ref, (size_t)n * outd, tol);
    gpu->free(gpu, gw), gpu->free(gpu, gb), gpu->free(gpu, gx), gpu->free(gpu, go);
    free(w), free(wr), free(wh), free(b), free(br), free(bh), free(x), free(ref), free(got);
}

/* Sets environment variable name to v (NULL: unset) and returns its old value (malloc'd, or
   NULL when it was unset), for a backend built with a switch on or off. */
static char *s_env_swap(const char *name, const char *v)
{
    const char *old = getenv(name);
    char *was = old ? strdup(old) : NULL;
    if (v)
        setenv(name, v, 1);
    else
        unsetenv(name);
    return was;
}

/* A backend of KV dtype kv with environment switch name set to v */
static eng_backend_t *s_backend_with(eng_dtype_t kv, const char *name, const char *v)
{
    char *was = s_env_swap(name, v);
    eng_backend_t *be = eng_cuda_backend_new_kv(kv);
    free(s_env_swap(name, was));
    free(was);
    return be;
}

static void test_rope_kv(int hd)
{
    char name[96];
    int n = 7, nh = 8, nkv = 2, nb = 8, bs = 16;
    int32_t pos[7] = {0, 1, 2, 100, 1000, 4095, 33};
    int32_t slots[7] = {5, 6, 7, 127, 64, 0, 31};
    size_t qn = (size_t)n * nh * hd, kn = (size_t)n * nkv * hd, row = (size_t)(nh + 2 * nkv) * hd;
    float *q = s_rand(qn, 1.0f), *k = s_rand(kn, 1.0f), *v = s_rand(kn, 1.0f);
    float *got = malloc(qn * 4), *gotk = malloc(kn * 4);
    float *gq = ecu_t_put(gpu, q, qn * 4), *gk = ecu_t_put(gpu, k, kn * 4);
    /* stacked qkv rows for the fused op, built before the CPU rotates q and k */
    float *qkv = malloc((size_t)n * row * 4);
    for (int t = 0; t < n; t++) {
        memcpy(qkv + t * row, q + (size_t)t * nh * hd, (size_t)nh * hd * 4);
        memcpy(qkv + t * row + nh * hd, k + (size_t)t * nkv * hd, (size_t)nkv * hd * 4);
        memcpy(qkv + t * row + (nh + nkv) * hd, v + (size_t)t * nkv * hd, (size_t)nkv * hd * 4);
    }
    cpu->rope(cpu, q, k, pos, n, nh, nkv, hd, 500000.0f);
    gpu->rope(gpu, gq, gk, pos, n, nh, nkv, hd, 500000.0f);
    ecu_t_get(gpu, got, gq, qn * 4);
    ecu_t_get(gpu, gotk, gk, kn * 4);
    snprintf(name, sizeof(name), "rope q hd=%d", hd);
    ecu_t_close(name, got, q, qn, 1e-5);
    snprintf(name, sizeof(name), "rope k hd=%d", hd);
    ecu_t_close(name, gotk, k, kn, 1e-5);

    /* kv_store into bf16 (default), fp32 and fp8 pools vs the CPU's fp32 pool (for fp8: the
       CPU's values rounded by eng_f32_to_f8e4m3, which the device must match exactly) */
    size_t pool = (size_t)nb * bs * nkv * hd;
    float *ck0 = calloc(pool, 4), *cv0 = calloc(pool, 4), *gotp = malloc(pool * 4);
    float *ck8 = malloc(pool * 4), *cv8 = malloc(pool * 4);
    cpu->kv_store(cpu, ck0, cv0, k, v, slots, n, nkv, hd);
    for (size_t i = 0; i < pool; i++) {
        ck8[i] = eng_f8e4m3_to_f32(eng_f32_to_f8e4m3(ck0[i]));
        cv8[i] = eng_f8e4m3_to_f32(eng_f32_to_f8e4m3(cv0[i]));
    }
    eng_backend_t *bes[3] = {gpu, gpu32, gpu8};
    for (int bi = 0; bi < 3; bi++) {
        eng_backend_t *be = bes[bi];
        size_t es = eng_dtype_size(be->kv_dtype);
        int f8 = be->kv_dtype == ENG_DTYPE_F8E4M3;
        float *ck = f8 ? ck8 : ck0, *cv = f8 ? cv8 : cv0;
        void *pk = be->alloc(be, pool * es), *pv = be->alloc(be, pool * es);
        float *bk = ecu_t_put(be, k, kn * 4), *bv = ecu_t_put(be, v, kn * 4);
        be->kv_store(be, pk, pv, bk, bv, slots, n, nkv, hd);
        void *raw = malloc(pool * es);
        double tol = be->kv_dtype == ENG_DTYPE_BF16 ? 5e-3 : 0.0;
        ecu_t_get(be, raw, pk, pool * es);
        eng_cpu_widen(gotp, raw, be->kv_dtype, 0, pool);
        snprintf(name, sizeof(name), "kv_store k hd=%d kv=%s", hd, eng_dtype_name(be->kv_dtype));
        ecu_t_close(name, gotp, ck, pool, tol);
        ecu_t_get(be, raw, pv, pool * es);
        eng_cpu_widen(gotp, raw, be->kv_dtype, 0, pool);
        snprintf(name, sizeof(name), "kv_store v hd=%d kv=%s", hd, eng_dtype_name(be->kv_dtype));
        ecu_t_close(name, gotp, cv, pool, tol);

        /* fused rope + store from the stacked rows */
        float *gqkv = ecu_t_put(be, qkv, (size_t)n * row * 4), *gqo = be->alloc(be, qn * 4);
        void *fk = be->alloc(be, pool * es), *fv = be->alloc(be, pool * es);
        be->rope_kv_store(be, gqo, gqkv, fk, fv, pos, slots, n, nh, nkv, hd, 500000.0f);
        ecu_t_get(be, got, gqo, qn * 4);
        snprintf(name, sizeof(name), "rope_kv_store q hd=%d kv=%s", hd,
                 eng_dtype_name(be->kv_dtype));
        ecu_t_close(name, got, q, qn, 1e-5);
        ecu_t_get(be, raw, fk, pool * es);
        eng_cpu_widen(gotp, raw, be->kv_dtype, 0, pool);
        snprintf(name, sizeof(name), "rope_kv_store k hd=%d kv=%s", hd,
                 eng_dtype_name(be->kv_dtype));
        /* fp8: rope's ulps between device and host may move a value across a rounding
           boundary, one e4m3 step (1/16 relative) now and then */
        ecu_t_close(name, gotp, ck, pool, f8 ? 1e-2 : tol > 0 ? tol : 1e-5);
        ecu_t_get(be, raw, fv, pool * es);
        eng_cpu_widen(gotp, raw, be->kv_dtype, 0, pool);
        snprintf(name, sizeof(name), "rope_kv_store v hd=%d kv=%s", hd,
                 eng_dtype_name(be->kv_dtype));
        ecu_t_close(name, gotp, cv, pool, tol);
        /* the scalar kernel (ANVIL_CUDA_ROPE_VEC=0) writes the same bits as the default
           (two pairs a thread where head_dim % 4 == 0) */
        eng_backend_t *sc = s_backend_with(be->kv_dtype, "ANVIL_CUDA_ROPE_VEC", "0");
        ecu_t_check(sc != NULL, "a backend with ANVIL_CUDA_ROPE_VEC=0");
        if (sc) {
            float *sqkv = ecu_t_put(sc, qkv, (size_t)n * row * 4), *sqo = sc->alloc(sc, qn * 4);
            void *sk = sc->alloc(sc, pool * es), *sv = sc->alloc(sc, pool * es);
            sc->rope_kv_store(sc, sqo, sqkv, sk, sv, pos, slots, n, nh, nkv, hd, 500000.0f);
            char *a = malloc(pool * es > qn * 4 ? pool * es : qn * 4);
            char *b = malloc(pool * es > qn * 4 ? pool * es : qn * 4);
            const void *dv[3][2] = {{gqo, sqo}, {fk, sk}, {fv, sv}};
            const size_t nbytes[3] = {qn * 4, pool * es, pool * es};
            for (int w = 0; w < 3; w++) {
                ecu_t_get(be, a, dv[w][0], nbytes[w]);
                ecu_t_get(sc, b, dv[w][1], nbytes[w]);
                snprintf(name, sizeof(name),
                         "rope_kv_store %c hd=%d kv=%s: the scalar kernel's bits", "qkv"[w], hd,
                         eng_dtype_name(be->kv_dtype));
                ecu_t_check(memcmp(a, b, nbytes[w]) == 0, name);
            }
            free(a), free(b);
            sc->free(sc, sqkv), sc->free(sc, sqo), sc->free(sc, sk), sc->free(sc, sv);
            sc->destroy(&sc);
        }

        /* copy_block: block 0 <- block 7 */
        be->copy_block(be, pk, pv, 7, 0, bs, nkv, hd);
        ecu_t_get(be, raw, pk, pool * es);
        eng_cpu_widen(gotp, raw, be->kv_dtype, 0, pool);
        float *ck2 = malloc(pool * 4), *cv2 = malloc(pool * 4);
        memcpy(ck2, ck, pool * 4), memcpy(cv2, cv, pool * 4);
        cpu->copy_block(cpu, ck2, cv2, 7, 0, bs, nkv, hd);
        snprintf(name, sizeof(name), "copy_block hd=%d kv=%s", hd, eng_dtype_name(be->kv_dtype));
        ecu_t_close(name, gotp, ck2, pool, tol);
        free(ck2), free(cv2), free(raw);
        be->free(be, pk), be->free(be, pv), be->free(be, bk), be->free(be, bv);
        be->free(be, gqkv), be->free(be, gqo), be->free(be, fk), be->free(be, fv);
    }
    gpu->free(gpu, gq), gpu->free(gpu, gk);
    free(q), free(k), free(v), free(got), free(gotk), free(qkv), free(ck0), free(cv0), free(gotp);
    free(ck8), free(cv8);
}

/* A random K / V pool of n elements in dtype dt (hk, hv) and the same values widened to fp32
   for the CPU (ck, cv): values representable in dt, so both backends attend over the same
   numbers. */
static void s_kv_fill(eng_dtype_t dt, size_t n, void **hk, void **hv, float **ck, float **cv)
{
    size_t es = eng_dtype_size(dt);
    *ck = malloc(n * 4), *cv = malloc(n * 4), *hk = malloc(n * es), *hv = malloc(n * es);
    for (size_t i = 0; i < n; i++) {
        float a = ecu_t_randf(2.0f), b = ecu_t_randf(1.0f);
        if (dt == ENG_DTYPE_BF16) {
            ((uint16_t *)*hk)[i] = ecu_t_bf16(a), ((uint16_t *)*hv)[i] = ecu_t_bf16(b);
            a = ecu_t_bf16_f(ecu_t_bf16(a)), b = ecu_t_bf16_f(ecu_t_bf16(b));
        } else if (dt == ENG_DTYPE_F8E4M3) {
            ((uint8_t *)*hk)[i] = eng_f32_to_f8e4m3(a), ((uint8_t *)*hv)[i] = eng_f32_to_f8e4m3(b);
            a = eng_f8e4m3_to_f32(((uint8_t *)*hk)[i]);
            b = eng_f8e4m3_to_f32(((uint8_t *)*hv)[i]);
        } else {
            ((float *)*hk)[i] = a, ((float *)*hv)[i] = b;
        }
        (*ck)[i] = a, (*cv)[i] = b;
    }
}

static const char *s_attn_tag = ""; /* names the decode kernel under test */
static float *s_attn_keep;          /* set: s_attn_batch with `what` leaves its GPU result there */

/* The attention's tolerance against the CPU (relative RMS) for backend be: fp32 partials keep
   fp32 arithmetic (2e-5); 16-bit decode partials (eng_cuda_attn_part) add one rounding of
   each split's o / sum, which a host simulation of these tests' batches (their V in [-1, 1];
   attn_part_sim.py) puts at 1.0e-4 to 2.1e-4 (fp16) and 8e-4 to 1.7e-3 (bf16).
   test_attention_parts holds each kind to the fp32 one element by element. */
static double s_attn_tol(eng_backend_t *be)
{
    const char *k = eng_cuda_attn_part(be);
    return !k || strcmp(k, "f32") == 0 ? 2e-5 : strcmp(k, "f16") == 0 ? 1e-3 : 6e-3;
}

/* attention over the batch (nq[s] query tokens of sequence s, ctx[s] its context) against the
   CPU; without `what` (test_attention's batch, NS = 4) also through prepare() and the
   batch invariance of sequence 1's decode */
static void s_attn_batch(eng_backend_t *be,
                         int hd,
                         int nh,
                         int nkv,
                         int NS,
                         const int32_t *nq,
                         const int32_t *ctx,
                         const char *what)
{
    char name[160];
    int bs = 16, mb = 48, nb = NS * mb;
    int32_t q_start[8] = {0};
    for (int s = 0; s < NS; s++)
        q_start[s + 1] = q_start[s] + nq[s];
    int n_tok = q_start[NS];
    int32_t *tables = malloc((size_t)NS * mb * 4), *perm = malloc((size_t)nb * 4);
    for (int i = 0; i < nb; i++)
        perm[i] = i;
    for (int i = nb - 1; i > 0; i--) {
        int j = (int)(ecu_t_uniform() * (i + 1)), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    memcpy(tables, perm, (size_t)NS * mb * 4);
    size_t pool = (size_t)nb * bs * nkv * hd, es = eng_dtype_size(be->kv_dtype);
    float *ck, *cv;
    void *hk, *hv;
    s_kv_fill(be->kv_dtype, pool, &hk, &hv, &ck, &cv);
    size_t qn = (size_t)n_tok * nh * hd;
    float *q = s_rand(qn, 1.0f), *ref = malloc(qn * 4), *got = malloc(qn * 4);
    void *gk = ecu_t_put(be, hk, pool * es), *gv = ecu_t_put(be, hv, pool * es);
    float *gq = ecu_t_put(be, q, qn * 4), *go = be->alloc(be, qn * 4);
    eng_attn_batch_t b = {NS, q_start, ctx, tables, mb};
    cpu->attention(cpu, ref, q, ck, cv, &b, nh, nkv, hd, bs);
    int rc = be->attention(be, go, gq, gk, gv, &b, nh, nkv, hd, bs);
    ecu_t_check(rc == 0, "attention returns 0");
    ecu_t_get(be, got, go, qn * 4);
    snprintf(name, sizeof(name), "attention%s%s hd=%d heads=%d/%d kv=%s", s_attn_tag,
             what ? what : "", hd, nh, nkv, eng_dtype_name(be->kv_dtype));
    ecu_t_close(name, got, ref, qn, s_attn_tol(be));
    if (what) {
        if (s_attn_keep)
            memcpy(s_attn_keep, got, qn * 4);
        be->free(be, gk), be->free(be, gv), be->free(be, gq), be->free(be, go);
        free(tables), free(perm), free(ck), free(cv), free(hk), free(hv), free(q), free(ref);
        free(got);
        return;
    }

    /* the same through prepare() (plan reused) */
    int32_t ids[64] = {0};
    eng_step_t step = {n_tok, ids, NULL, NULL, &b, 0, NULL};
    be->prepare(be, &step);
    be->attention(be, go, gq, gk, gv, &b, nh, nkv, hd, bs);
    float *got2 = malloc(qn * 4);
    ecu_t_get(be, got2, go, qn * 4);
    ecu_t_check(memcmp(got, got2, qn * 4) == 0, "attention with prepare is bit-identical");
    be->prepare(be, NULL);

    /* batch invariance: sequence 1 (a decode over 3 splits) alone gives the same bits */
    int32_t q1[2] = {0, 1}, c1[1] = {600};
    eng_attn_batch_t b1 = {1, q1, c1, tables + mb, mb};
    float *go1 = be->alloc(be, (size_t)nh * hd * 4), *alone = malloc((size_t)nh * hd * 4);
    be->attention(be, go1, gq + (size_t)q_start[1] * nh * hd, gk, gv, &b1, nh, nkv, hd, bs);
    ecu_t_get(be, alone, go1, (size_t)nh * hd * 4);
    snprintf(name, sizeof(name), "attention%s batch-invariant decode hd=%d heads=%d/%d kv=%s",
             s_attn_tag, hd, nh, nkv, eng_dtype_name(be->kv_dtype));
    ecu_t_check(memcmp(alone, got + (size_t)q_start[1] * nh * hd, (size_t)nh * hd * 4) == 0,
                name);
    be->free(be, gk), be->free(be, gv), be->free(be, gq), be->free(be, go), be->free(be, go1);
    free(tables), free(perm), free(ck), free(cv), free(hk), free(hv), free(q), free(ref);
    free(got), free(got2), free(alone);
}

/* Mixed batch: a fresh prefill chunk, a long decode (several splits), a continued prefill
   chunk, a decode of context 1; shuffled block tables. */
static void test_attention(eng_backend_t *be, int hd, int nh, int nkv)
{
    const int32_t nq[4] = {37, 1, 20, 1}, ctx[4] = {37, 600, 300, 1};
    s_attn_batch(be, hd, nh, nkv, 4, nq, ctx, NULL);
}

/* Longer prefills (the tensor-core prefill kernel's chunks, passes and causal edges): a fresh
   prompt of 300 tokens (19 tiles), a chunk of 200 after 500 cached positions (key ranges up to
   700, not a multiple of the 32-position chunk) and a decode beside them. */
static void test_attention_prefill(eng_backend_t *be, int hd, int nh, int nkv)
{
    const int32_t nq[3] = {300, 200, 1}, ctx[3] = {300, 700, 45};
    s_attn_batch(be, hd, nh, nkv, 3, nq, ctx, " prefill 300 / 200 after 500");
}

/* The tensor-core prefill's A/B switches, each off beside the default on
   test_attention_prefill's batch (the same inputs: the generator replayed): the plan's
   longest-first order (ANVIL_CUDA_ATTN_PF_LPT), the cp.async stages (ANVIL_CUDA_ATTN_PF_ASYNC)
   and the early loads (ANVIL_CUDA_ATTN_PF_EARLY) change no arithmetic, so each is held to the
   CPU and to the default's bits. */
static void test_attention_prefill_switches(eng_dtype_t kv, int hd, int nh, int nkv)
{
    static const char *const env[3] = {"ANVIL_CUDA_ATTN_PF_LPT", "ANVIL_CUDA_ATTN_PF_ASYNC",
                                       "ANVIL_CUDA_ATTN_PF_EARLY"};
    const int32_t nq[3] = {300, 200, 1}, ctx[3] = {300, 700, 45};
    const size_t qn = (size_t)(nq[0] + nq[1] + nq[2]) * nh * hd;
    char what[96], name[160];
    float *ref = malloc(qn * 4), *got = malloc(qn * 4);
    eng_backend_t *be = eng_cuda_backend_new_kv(kv);
    ecu_t_check(be && ref && got, "a backend for the prefill switches");
    if (!be || !ref || !got) {
        free(ref), free(got);
        return;
    }
    const uint64_t seed = ecu_t_rng;
    s_attn_keep = ref;
    s_attn_batch(be, hd, nh, nkv, 3, nq, ctx, " prefill 300 / 200 after 500, default");
    for (int i = 0; i < 3; i++) {
        eng_backend_t *o = s_backend_with(kv, env[i], "0");
        snprintf(what, sizeof(what), " prefill 300 / 200 after 500, %s=0", env[i] + 11);
        ecu_t_check(o != NULL, what);
        if (!o)
            continue;
        ecu_t_rng = seed;
        s_attn_keep = got;
        s_attn_batch(o, hd, nh, nkv, 3, nq, ctx, what);
        snprintf(name, sizeof(name), "attention%s hd=%d heads=%d/%d kv=%s: the default's bits",
                 what, hd, nh, nkv, eng_dtype_name(kv));
        ecu_t_check(memcmp(got, ref, qn * 4) == 0, name);
        o->destroy(&o);
    }
    s_attn_keep = NULL;
    be->destroy(&be);
    free(ref), free(got);
}

/* The decode partials' kinds (ANVIL_CUDA_ATTN_PART): the same inputs (the generator replayed)
   through backends storing fp32, fp16 and bf16 partials, on a batch of two prefill chunks
   (fp32 partials whatever the kind) and decodes of 1 to 6 splits (768 positions). Each is
   held to the CPU (s_attn_tol); the prefill tokens' rows to the fp32 kind's bits; every decode
   element to the fp32 kind within u * max|v| (u = 2^-11 for fp16, 2^-8 for bf16; V in [-1, 1]):
   the output is a convex combination of the splits' rounded o / sum, each off by at most u of
   its size, which is at most max|v|; and at least one decode element must differ, so the kind
   is in effect. */
static void test_attention_parts(eng_dtype_t kv, int hd, int nh, int nkv)
{
    static const char *const kinds[3] = {"f32", "f16", "bf16"};
    const double u[3] = {0.0, 1.0 / 2048, 1.0 / 256};
    const int32_t nq[5] = {37, 1, 20, 1, 1}, ctx[5] = {37, 600, 300, 1, 768};
    int32_t q_start[6] = {0};
    for (int s = 0; s < 5; s++)
        q_start[s + 1] = q_start[s] + nq[s];
    const size_t row = (size_t)nh * hd, qn = (size_t)q_start[5] * row;
    char what[96], name[200];
    float *got[3];
    const uint64_t seed = ecu_t_rng;
    for (int k = 0; k < 3; k++) {
        got[k] = calloc(qn, 4);
        eng_backend_t *be = s_backend_with(kv, "ANVIL_CUDA_ATTN_PART", kinds[k]);
        const char *has = be ? eng_cuda_attn_part(be) : NULL;
        snprintf(name, sizeof(name), "a backend with %s partials, kv=%s", kinds[k],
                 eng_dtype_name(kv));
        ecu_t_check(has && strcmp(has, kinds[k]) == 0, name);
        if (!be || !got[k])
            continue;
        snprintf(what, sizeof(what), " decodes of 1 to 6 splits, %s partials", kinds[k]);
        ecu_t_rng = seed;
        s_attn_keep = got[k];
        s_attn_batch(be, hd, nh, nkv, 5, nq, ctx, what);
        s_attn_keep = NULL;
        be->destroy(&be);
    }
    for (int k = 1; k < 3; k++) {
        if (!got[0] || !got[k])
            continue;
        int pre_same = 1, n_diff = 0;
        double worst = 0.0;
        for (int s = 0; s < 5; s++) {
            const size_t a = (size_t)q_start[s] * row, n = (size_t)nq[s] * row;
            if (nq[s] > 1) {
                pre_same &= memcmp(got[k] + a, got[0] + a, n * 4) == 0;
                continue;
            }
            for (size_t i = a; i < a + n; i++) {
                const double d = fabs((double)got[k][i] - got[0][i]);
                worst = d > worst ? d : worst;
                n_diff += got[k][i] != got[0][i];
            }
        }
        snprintf(name, sizeof(name),
                 "attention%s %s partials hd=%d heads=%d/%d kv=%s: prefill "
                 "rows the fp32 kind's bits",
                 s_attn_tag, kinds[k], hd, nh, nkv, eng_dtype_name(kv));
        ecu_t_check(pre_same, name);
        snprintf(name, sizeof(name),
                 "attention%s %s partials hd=%d heads=%d/%d kv=%s: decodes "
                 "within %.1e of fp32 (worst %.2e), %d elements differ",
                 s_attn_tag, kinds[k], hd, nh, nkv, eng_dtype_name(kv), u[k] + 1e-6, worst, n_diff);
        ecu_t_check(worst <= u[k] + 1e-6 && n_diff > 0, name);
    }
    for (int k = 0; k < 3; k++)
        free(got[k]);
}

/* Many decodes at once, on the Seed-Coder shape (32 / 8 heads, head_dim 128), in KV dtype
   kv: 64 sequences with contexts spread over 1..700 (split edges included), about 1400
   (tile, KV head) items, more than a GPU holds blocks at once. The default grid, the grid
   with the KV heads inner (ANVIL_CUDA_ATTN_KV_INNER=1) and the tensor-core kernel loading V
   with K (ANVIL_CUDA_ATTN_VLATE=0) are each held to the CPU, and the last two to the first
   bit for bit (the same arithmetic an item). */
static void test_attention_decodes(eng_dtype_t kv)
{
    enum { NS = 64, NB = 3 };
    const int hd = 128, nh = 32, nkv = 8, bs = 16, mb = 44, nb = NS * mb;
    static const char *const label[NB] = {"default grid", "KV heads inner", "V with K"};
    static const char *const sw[NB][2] = {{"0", "1"}, {"1", "1"}, {"0", "0"}};
    char *was_kvi = s_env_swap("ANVIL_CUDA_ATTN_KV_INNER", NULL);
    char *was_vl = s_env_swap("ANVIL_CUDA_ATTN_VLATE", NULL);
    eng_backend_t *be[NB];
    for (int i = 0; i < NB; i++) {
        setenv("ANVIL_CUDA_ATTN_KV_INNER", sw[i][0], 1);
        setenv("ANVIL_CUDA_ATTN_VLATE", sw[i][1], 1);
        be[i] = eng_cuda_backend_new_kv(kv);
    }
    free(s_env_swap("ANVIL_CUDA_ATTN_KV_INNER", was_kvi));
    free(s_env_swap("ANVIL_CUDA_ATTN_VLATE", was_vl));
    free(was_kvi), free(was_vl);
    ecu_t_check(be[0] && be[1] && be[2], "backends with each decode grid");
    int32_t q_start[NS + 1], ctx[NS];
    for (int s = 0; s < NS; s++) {
        q_start[s] = s;
        ctx[s] = 1 + (s * 347) % 700; /* 1 .. 700 */
    }
    q_start[NS] = NS;
    ctx[1] = 128, ctx[2] = 129, ctx[3] = 700, ctx[4] = 256; /* split edges */
    int32_t *tables = malloc((size_t)nb * 4);
    for (int i = 0; i < nb; i++)
        tables[i] = i;
    for (int i = nb - 1; i > 0; i--) {
        int j = (int)(ecu_t_uniform() * (i + 1)), t = tables[i];
        tables[i] = tables[j], tables[j] = t;
    }
    size_t pool = (size_t)nb * bs * nkv * hd, es = eng_dtype_size(kv), qn = (size_t)NS * nh * hd;
    float *ck, *cv;
    void *hk, *hv;
    s_kv_fill(kv, pool, &hk, &hv, &ck, &cv);
    float *q = s_rand(qn, 1.0f), *ref = malloc(qn * 4), *got[NB];
    eng_attn_batch_t b = {NS, q_start, ctx, tables, mb};
    cpu->attention(cpu, ref, q, ck, cv, &b, nh, nkv, hd, bs);
    for (int i = 0; i < NB; i++) {
        got[i] = calloc(qn, 4);
        if (!be[i])
            continue;
        void *gk = ecu_t_put(be[i], hk, pool * es), *gv = ecu_t_put(be[i], hv, pool * es);
        float *gq = ecu_t_put(be[i], q, qn * 4), *go = be[i]->alloc(be[i], qn * 4);
        int rc = be[i]->attention(be[i], go, gq, gk, gv, &b, nh, nkv, hd, bs);
        ecu_t_check(rc == 0, "attention over 64 decodes returns 0");
        ecu_t_get(be[i], got[i], go, qn * 4);
        char name[128];
        snprintf(name, sizeof(name), "attention, 64 decodes, %s, kv=%s", label[i],
                 eng_dtype_name(kv));
        ecu_t_close(name, got[i], ref, qn, s_attn_tol(be[i]));
        if (i > 0) {
            snprintf(name, sizeof(name), "attention, 64 decodes, %s = default, kv=%s",
                     label[i], eng_dtype_name(kv));
            ecu_t_check(memcmp(got[i], got[0], qn * 4) == 0, name);
        }
        be[i]->free(be[i], gk), be[i]->free(be[i], gv), be[i]->free(be[i], gq);
        be[i]->free(be[i], go);
    }
    for (int i = 0; i < NB; i++) {
        if (be[i])
            be[i]->destroy(&be[i]);
        free(got[i]);
    }
    free(tables), free(ck), free(cv), free(hk), free(hv), free(q), free(ref);
}

/* Decode splits several sequences hold in the same cache blocks (a group's shared prompt):
   the group tiles of attention.cu. Sequences, block size 16: 11 sharing 40 blocks (5 full
   splits; 8 + 3 members a split), 5 sharing 20 (splits 0 and 1; split 2 only partly shared,
   so their own), 3 sharing split 0's blocks and split 1's first block but not its others (a
   copied partial block: their own), a prefill chunk of 37 tokens among them, and decodes of
   context 1, 128 and 129. The plan must hold 13 group tiles; the result must match the CPU
   and, bit for bit, a backend without group tiles (ANVIL_CUDA_ATTN_GROUP=0, each sequence's
   own tiles), directly and through prepare(). */
static void test_attention_groups(eng_dtype_t kv, int hd, int nh, int nkv)
{
    enum { NS = 23, MB = 64 };
    const int bs = 16, nb = NS * MB;
    char name[160];
    eng_backend_t *solo = s_backend_with(kv, "ANVIL_CUDA_ATTN_GROUP", "0");
    eng_backend_t *grp = eng_cuda_backend_new_kv(kv);
    ecu_t_check(solo && grp, "backends with and without group tiles");
    if (!solo || !grp) {
        if (solo)
            solo->destroy(&solo);
        if (grp)
            grp->destroy(&grp);
        return;
    }
    int32_t nq[NS], ctx[NS], q_start[NS + 1], *tables = malloc((size_t)NS * MB * 4);
    int32_t *perm = malloc((size_t)nb * 4);
    for (int i = 0; i < nb; i++)
        perm[i] = i;
    for (int i = nb - 1; i > 0; i--) {
        int j = (int)(ecu_t_uniform() * (i + 1)), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    memcpy(tables, perm, (size_t)NS * MB * 4); /* every sequence its own blocks, then: */
    static const int extra_a[11] = {0, 1, 5, 127, 128, 129, 200, 255, 300, 383, 64};
    for (int s = 0; s < NS; s++)
        nq[s] = 1;
    for (int s = 0; s < 11; s++) { /* 0..10: 40 blocks of sequence 0 */
        ctx[s] = 640 + extra_a[s];
        memcpy(tables + s * MB, tables, 40 * 4);
    }
    for (int s = 11; s < 16; s++) { /* 11..15: 20 blocks of sequence 11 */
        ctx[s] = 321 + (s - 11) * 97;
        memcpy(tables + s * MB, tables + 11 * MB, 20 * 4);
    }
    for (int s = 16; s < 19; s++) { /* 16..18: blocks 0..8 of sequence 16, 9.. their own */
        ctx[s] = 300;
        memcpy(tables + s * MB, tables + 16 * MB, 9 * 4);
    }
    nq[19] = 37, ctx[19] = 37;
    ctx[20] = 1, ctx[21] = 128, ctx[22] = 129;
    q_start[0] = 0;
    for (int s = 0; s < NS; s++)
        q_start[s + 1] = q_start[s] + nq[s];
    const int n_tok = q_start[NS];
    size_t pool = (size_t)nb * bs * nkv * hd, es = eng_dtype_size(kv), qn = (size_t)n_tok * nh * hd;
    float *ck, *cv;
    void *hk, *hv;
    s_kv_fill(kv, pool, &hk, &hv, &ck, &cv);
    float *q = s_rand(qn, 1.0f), *ref = malloc(qn * 4), *got[3];
    eng_attn_batch_t b = {NS, q_start, ctx, tables, MB};
    cpu->attention(cpu, ref, q, ck, cv, &b, nh, nkv, hd, bs);
    eng_backend_t *bes[3] = {solo, grp, grp};
    for (int i = 0; i < 3; i++) {
        eng_backend_t *be = bes[i];
        got[i] = calloc(qn, 4);
        void *gk = ecu_t_put(be, hk, pool * es), *gv = ecu_t_put(be, hv, pool * es);
        float *gq = ecu_t_put(be, q, qn * 4), *go = be->alloc(be, qn * 4);
        int32_t ids[64] = {0};
        eng_step_t step = {n_tok, ids, NULL, NULL, &b, 0, NULL};
        if (i == 2) /* the plan from prepare(), with the block size the last attention had */
            be->prepare(be, &step);
        int rc = be->attention(be, go, gq, gk, gv, &b, nh, nkv, hd, bs);
        ecu_t_get(be, got[i], go, qn * 4);
        const int n_gt = eng_cuda_attn_group_tiles(be);
        if (i == 2)
            be->prepare(be, NULL);
        const char *pk = eng_cuda_attn_part(be);
        snprintf(name, sizeof(name),
                 "attention groups%s hd=%d heads=%d/%d kv=%s, %s partials: rc 0, %d group tiles",
                 i == 0   ? " off"
                 : i == 1 ? ""
                          : " (prepare)",
                 hd, nh, nkv, eng_dtype_name(kv), pk ? pk : "?", i == 0 ? 0 : 13);
        ecu_t_check(rc == 0 && n_gt == (i == 0 ? 0 : 13), name);
        if (n_gt != (i == 0 ? 0 : 13))
            fprintf(stderr, "  %d group tiles\n", n_gt);
        snprintf(name, sizeof(name), "attention groups%s hd=%d heads=%d/%d kv=%s, %s partials",
                 i == 0   ? " off"
                 : i == 1 ? ""
                          : " (prepare)",
                 hd, nh, nkv, eng_dtype_name(kv), pk ? pk : "?");
        ecu_t_close(name, got[i], ref, qn, s_attn_tol(be));
        if (i > 0) {
            snprintf(name, sizeof(name),
                     "attention groups%s hd=%d heads=%d/%d kv=%s, %s partials: the bits of each "
                     "sequence's own tiles",
                     i == 1 ? "" : " (prepare)", hd, nh, nkv, eng_dtype_name(kv), pk ? pk : "?");
            ecu_t_check(memcmp(got[i], got[0], qn * 4) == 0, name);
        }
        be->free(be, gk), be->free(be, gv), be->free(be, gq), be->free(be, go);
    }
    for (int i = 0; i < 3; i++)
        free(got[i]);
    solo->destroy(&solo);
    grp->destroy(&grp);
    free(tables), free(perm), free(ck), free(cv), free(hk), free(hv), free(q), free(ref);
}

/* Decodes over more than 32 splits (4096 positions): the combine's warp takes its splits in
   rounds of 32. Contexts 4096, 4097 and 9000 (32, 33 and 71 splits) against the CPU. */
static void test_attention_long(void)
{
    enum { NS = 3 };
    const int hd = 128, nh = 32, nkv = 8, bs = 16, mb = 563, nb = NS * mb;
    int32_t q_start[NS + 1] = {0, 1, 2, 3}, ctx[NS] = {4096, 4097, 9000};
    int32_t *tables = malloc((size_t)nb * 4);
    for (int i = 0; i < nb; i++)
        tables[i] = (i * 11 + 5) % nb;
    size_t pool = (size_t)nb * bs * nkv * hd, qn = (size_t)NS * nh * hd;
    float *ck, *cv;
    void *hk, *hv;
    s_kv_fill(ENG_DTYPE_BF16, pool, &hk, &hv, &ck, &cv);
    float *q = s_rand(qn, 1.0f), *ref = malloc(qn * 4), *got = malloc(qn * 4);
    eng_attn_batch_t b = {NS, q_start, ctx, tables, mb};
    cpu->attention(cpu, ref, q, ck, cv, &b, nh, nkv, hd, bs);
    void *gk = ecu_t_put(gpu, hk, pool * 2), *gv = ecu_t_put(gpu, hv, pool * 2);
    float *gq = ecu_t_put(gpu, q, qn * 4), *go = gpu->alloc(gpu, qn * 4);
    int rc = gpu->attention(gpu, go, gq, gk, gv, &b, nh, nkv, hd, bs);
    ecu_t_check(rc == 0, "attention over 32 to 71 splits returns 0");
    ecu_t_get(gpu, got, go, qn * 4);
    ecu_t_close("attention, contexts 4096 / 4097 / 9000", got, ref, qn, s_attn_tol(gpu));
    gpu->free(gpu, gk), gpu->free(gpu, gv), gpu->free(gpu, gq), gpu->free(gpu, go);
    free(tables), free(ck), free(cv), free(hk), free(hv), free(q), free(ref), free(got);
}

/* linear (the fused matmul) on backend be against the CPU's composition: epilogue epi, the
   norm folded in or not, a bias or not. n up to the backend's GEMV rows (eng_cuda_gemv_rows:
   1 by default, 8 in test_linears' second pass) runs the fused GEMV (fp32 math: tolerance
   2e-5), above it the composed path (cuBLASLt on rounded activations). For ROPE_KV the rotated
   q and both caches (in be's KV dtype, the CPU's fp32 pool rounded the same way) are compared;
   in_dim 2048 / 4096 / 8192 make the GEMV split rows into 1 / 2 / 4 column segments, so the
   pair epilogues see 8, 4 and 2 rows a block. */
static void test_linear(eng_backend_t *be, eng_dtype_t dt, eng_lin_epi_t epi, int n, int in,
                        int outd, int norm, int bias)
{
    static const char *const epis[] = {"plain", "add", "swiglu", "rope_kv"};
    char name[160];
    if (epi == ENG_LIN_ROPE_KV && n > 64) { /* pos and slots below */
        ecu_t_check(0, "test_linear: rope rows <= 64");
        return;
    }
    const int nh = outd == 1536 ? 8 : 4, nkv = 2, hd = outd == 1536 ? 128 : 64, nb = 8, bs = 16;
    size_t es = eng_dtype_size(dt), kvs = eng_dtype_size(be->kv_dtype);
    size_t yd = epi == ENG_LIN_SWIGLU ? (size_t)outd / 2 : epi == ENG_LIN_ROPE_KV ? (size_t)nh * hd
                                                                                   : (size_t)outd;
    float *w = s_rand((size_t)outd * in, 0.05f), *wr = malloc((size_t)outd * in * 4);
    void *wh = s_weights(w, (size_t)outd * in, dt, wr);
    float *b = s_rand(outd, 0.5f), *br = malloc(outd * 4);
    void *bh = s_weights(b, outd, dt, br);
    float *g = s_rand(in, 0.5f), *gr = malloc(in * 4);
    for (int i = 0; i < in; i++)
        g[i] += 1.0f;
    void *gh = s_weights(g, in, dt, gr);
    float *x = s_rand((size_t)n * in, 2.0f), *o0 = s_rand((size_t)n * yd, 1.0f);
    float *ref = malloc((size_t)n * yd * 4), *got = malloc((size_t)n * yd * 4);
    memcpy(ref, o0, (size_t)n * yd * 4);
    void *gw = ecu_t_put(be, wh, (size_t)outd * in * es), *gb = ecu_t_put(be, bh, outd * es);
    void *gg = ecu_t_put(be, gh, in * es);
    float *gx = ecu_t_put(be, x, (size_t)n * in * 4), *go = ecu_t_put(be, o0, (size_t)n * yd * 4);
    size_t pool = (size_t)nb * bs * nkv * hd;
    float *ck = calloc(pool, 4), *cv = calloc(pool, 4), *gotp = malloc(pool * 4);
    void *pk = be->alloc(be, pool * kvs), *pv = be->alloc(be, pool * kvs), *raw = malloc(pool * kvs);
    /* a position and a distinct cache slot a row (37 is prime to nb * bs = 128) */
    int32_t pos[64], slots[64];
    for (int t = 0; t < n && t < 64; t++)
        pos[t] = t * 397 % 3000, slots[t] = (t * 37 + 5) % (nb * bs);
    eng_linear_t fc = {0}, fg;
    fc.norm_w = norm ? gh : NULL, fc.norm_dtype = dt, fc.eps = 1e-6f, fc.epi = epi;
    fc.k_cache = ck, fc.v_cache = cv, fc.pos = pos, fc.slots = slots, fc.n_head = nh;
    fc.n_kv_head = nkv, fc.head_dim = hd, fc.theta = 10000.0f;
    fg = fc;
    fg.norm_w = norm ? gg : NULL, fg.k_cache = pk, fg.v_cache = pv;
    int rc_c = cpu->linear(cpu, ref, x, wh, bias ? bh : NULL, dt, n, in, outd, &fc);
    int rc_g = be->linear(be, go, gx, gw, bias ? gb : NULL, dt, n, in, outd, &fg);
    snprintf(name, sizeof(name), "linear %s %s%s n=%d %dx%d%s kv=%s%s", epis[epi],
             eng_dtype_name(dt), norm ? " +norm" : "", n, in, outd, bias ? " +bias" : "",
             eng_dtype_name(be->kv_dtype), s_lin_tag);
    ecu_t_check(rc_c == 0 && rc_g == 0, name);
    ecu_t_get(be, got, go, (size_t)n * yd * 4);
    double tol = n <= eng_cuda_gemv_rows(be, -1) || dt == ENG_DTYPE_F32 ? 2e-5
                 : dt == ENG_DTYPE_BF16                                 ? 1e-2
                                                                        : 2e-3;
    ecu_t_close(name, got, ref, (size_t)n * yd, tol);
    if (epi == ENG_LIN_ROPE_KV) {
        const int f8 = be->kv_dtype == ENG_DTYPE_F8E4M3, b16 = be->kv_dtype == ENG_DTYPE_BF16;
        /* fp8: a product's last-bit difference may move a value across a rounding boundary,
           one e4m3 step (1/16 relative) now and then */
        double ktol = f8 ? 2e-2 : b16 ? (tol > 5e-3 ? tol : 5e-3) : tol;
        float *caches[2] = {ck, cv};
        void *dev[2] = {pk, pv};
        for (int c = 0; c < 2; c++) {
            if (f8)
                for (size_t i = 0; i < pool; i++)
                    caches[c][i] = eng_f8e4m3_to_f32(eng_f32_to_f8e4m3(caches[c][i]));
            ecu_t_get(be, raw, dev[c], pool * kvs);
            eng_cpu_widen(gotp, raw, be->kv_dtype, 0, pool);
            char cn[200];
            snprintf(cn, sizeof(cn), "%s %s cache", name, c ? "v" : "k");
            ecu_t_close(cn, gotp, caches[c], pool, ktol);
        }
    }
    be->free(be, gw), be->free(be, gb), be->free(be, gg), be->free(be, gx), be->free(be, go);
    be->free(be, pk), be->free(be, pv);
    free(w), free(wr), free(wh), free(b), free(br), free(bh), free(g), free(gr), free(gh);
    free(x), free(o0), free(ref), free(got), free(ck), free(cv), free(gotp), free(raw);
}

static void test_linears(void)
{
    test_linear(gpu, ENG_DTYPE_BF16, ENG_LIN_PLAIN, 1, 4096, 600, 1, 0);
    test_linear(gpu, ENG_DTYPE_BF16, ENG_LIN_PLAIN, 3, 1024, 600, 1, 1);
    test_linear(gpu, ENG_DTYPE_F16, ENG_LIN_PLAIN, 8, 8192, 264, 1, 0);
    test_linear(gpu, ENG_DTYPE_F32, ENG_LIN_PLAIN, 2, 2048, 1000, 1, 0);
    test_linear(gpu, ENG_DTYPE_BF16, ENG_LIN_PLAIN, 9, 1024, 600, 1, 0);
    test_linear(gpu, ENG_DTYPE_BF16, ENG_LIN_PLAIN, 64, 1024, 600, 0, 1);
    test_linear(gpu, ENG_DTYPE_BF16, ENG_LIN_ADD, 1, 4096, 1000, 0, 0);
    test_linear(gpu, ENG_DTYPE_BF16, ENG_LIN_ADD, 5, 8192, 600, 0, 1);
    test_linear(gpu, ENG_DTYPE_F32, ENG_LIN_ADD, 7, 1024, 600, 1, 0);
    test_linear(gpu, ENG_DTYPE_BF16, ENG_LIN_ADD, 9, 1024, 600, 0, 0);
    test_linear(gpu, ENG_DTYPE_F16, ENG_LIN_ADD, 33, 2048, 1000, 0, 1);
    test_linear(gpu, ENG_DTYPE_BF16, ENG_LIN_SWIGLU, 1, 4096, 1400, 1, 0);
    test_linear(gpu, ENG_DTYPE_BF16, ENG_LIN_SWIGLU, 2, 8192, 600, 1, 1);
    test_linear(gpu, ENG_DTYPE_F16, ENG_LIN_SWIGLU, 8, 1024, 1040, 1, 0);
    test_linear(gpu, ENG_DTYPE_F32, ENG_LIN_SWIGLU, 4, 2048, 202, 0, 0);
    test_linear(gpu, ENG_DTYPE_BF16, ENG_LIN_SWIGLU, 16, 1024, 1024, 1, 0);
    eng_backend_t *bes[3] = {gpu, gpu32, gpu8};
    for (int i = 0; i < 3; i++) {
        test_linear(bes[i], ENG_DTYPE_BF16, ENG_LIN_ROPE_KV, 1, 4096, 1536, 1, 0);
        test_linear(bes[i], ENG_DTYPE_BF16, ENG_LIN_ROPE_KV, 3, 1024, 1536, 1, 1);
        test_linear(bes[i], ENG_DTYPE_F16, ENG_LIN_ROPE_KV, 7, 8192, 1536, 1, 0);
        test_linear(bes[i], ENG_DTYPE_F32, ENG_LIN_ROPE_KV, 2, 2048, 512, 0, 1);
        test_linear(bes[i], ENG_DTYPE_BF16, ENG_LIN_ROPE_KV, 12, 1024, 1536, 1, 0);
    }
}

/* The GEMV's fixed column segments (eng_cuda_gemv_segs, ANVIL_CUDA_GEMV_SEGS, the A/B of
   anvil-bench-engine --linear-sweep): every count on every epilogue at batch 1 and 4 against
   the CPU, with a 14336-column add (down's shape: segments of 1792 to 14336 columns, partial
   chunks); the counts a shape does not take fall back (pair epilogues: at most 4). */
static void test_linear_segs(void)
{
    static const int segss[] = {1, 2, 4, 8};
    static const struct {
        eng_lin_epi_t epi;
        int in, out, norm;
    } cs[] = {{ENG_LIN_PLAIN, 4096, 600, 1},
              {ENG_LIN_ADD, 14336, 512, 0},
              {ENG_LIN_SWIGLU, 4096, 1400, 1},
              {ENG_LIN_ROPE_KV, 4096, 1536, 1}};
    char tag[32];
    const int rows0 = eng_cuda_gemv_rows(gpu, -1);
    eng_cuda_gemv_rows(gpu, 8); /* batch 4 on the GEMV too */
    for (size_t si = 0; si < sizeof(segss) / sizeof(segss[0]); si++) {
        snprintf(tag, sizeof(tag), " segs=%d", segss[si]);
        s_lin_tag = tag;
        ecu_t_check(eng_cuda_gemv_segs(gpu, segss[si]) == 0, "eng_cuda_gemv_segs");
        for (size_t c = 0; c < sizeof(cs) / sizeof(cs[0]); c++)
            for (int n = 1; n <= 4; n += 3)
                test_linear(gpu, ENG_DTYPE_BF16, cs[c].epi, n, cs[c].in, cs[c].out, cs[c].norm, 0);
    }
    ecu_t_check(eng_cuda_gemv_segs(gpu, 3) != 0 && eng_cuda_gemv_segs(gpu, 16) != 0 &&
                    eng_cuda_gemv_segs(cpu, 0) != 0,
                "eng_cuda_gemv_segs refuses other counts and the CPU backend");
    eng_cuda_gemv_segs(gpu, 0);
    eng_cuda_gemv_rows(gpu, rows0);
    s_lin_tag = "";
}

/* test_linears (and the plain matmuls up to 8 rows) again with the GEMV taking up to 8 rows
   (ANVIL_CUDA_GEMV_MAX=8, the A/B of the default 1); the setting's bounds */
static void test_linears_gemv8(void)
{
    eng_backend_t *bes[3] = {gpu, gpu32, gpu8};
    const int def = eng_cuda_gemv_rows(gpu, -1);
    ecu_t_check(def == 1, "eng_cuda_gemv_rows: 1 by default");
    for (int i = 0; i < 3; i++)
        ecu_t_check(eng_cuda_gemv_rows(bes[i], 8) == 8, "eng_cuda_gemv_rows sets 8");
    s_lin_tag = " gemv<=8";
    eng_dtype_t dts[3] = {ENG_DTYPE_BF16, ENG_DTYPE_F16, ENG_DTYPE_F32};
    for (int i = 0; i < 3; i++) {
        test_matmul(dts[i], 3, 1024, 600, 0);
        test_matmul(dts[i], 8, 1024, 600, 1);
    }
    test_linears();
    s_lin_tag = "";
    for (int i = 0; i < 3; i++)
        eng_cuda_gemv_rows(bes[i], def);
    ecu_t_check(eng_cuda_gemv_rows(gpu, 9) == -EINVAL && eng_cuda_gemv_rows(cpu, 1) == -EINVAL &&
                    eng_cuda_gemv_rows(gpu, -1) == def,
                "eng_cuda_gemv_rows refuses 9 and the CPU backend, and keeps its value");
}

/* The tensor-core skinny product (skinny.cu; up to 16 rows above the GEMV's, 8 by default)
   against the CPU: down's 14336 columns (8 K segments a tile), gate|up's 28672 features,
   features past a 16-row tile (600, 1032), 9 to 16 rows (two n-tiles, rows past n clamped),
   in_dim 1000 (no whole 64-column chunks: cuBLASLt takes it), the residual add (acc) with a
   bias, the pair epilogues (SwiGLU with ffn 518 and 1500: a tile past the end; RoPE + KV
   store with bf16 and fp8 pools); then the same with cuBLASLt (eng_cuda_skinny_rows 0, the
   A/B); the setting's bounds. */
static void test_skinny(void)
{
    static const struct {
        int n, in, out, bias;
    } cs[] = {{2, 4096, 1032, 1},   {7, 14336, 4096, 0}, {8, 2048, 6144, 1},  {9, 4096, 600, 0},
              {16, 14336, 4096, 1}, {16, 1000, 96, 0},   {13, 4096, 28672, 0}};
    const eng_dtype_t dts[2] = {ENG_DTYPE_BF16, ENG_DTYPE_F16};
    const int def = eng_cuda_skinny_rows(gpu, -1);
    ecu_t_check(def == 8, "eng_cuda_skinny_rows: 8 by default");
    for (int pass = 0; pass < 2; pass++) {
        s_lin_tag = pass ? " (cublaslt)" : " (skinny)";
        ecu_t_check(eng_cuda_skinny_rows(gpu, pass ? 0 : 16) == (pass ? 0 : 16) &&
                        eng_cuda_skinny_rows(gpu8, pass ? 0 : 16) == (pass ? 0 : 16),
                    "eng_cuda_skinny_rows sets its rows");
        for (int d = 0; d < 2; d++)
            for (size_t c = 0; c < sizeof(cs) / sizeof(cs[0]); c++)
                test_matmul(dts[d], cs[c].n, cs[c].in, cs[c].out, cs[c].bias);
        test_linear(gpu, ENG_DTYPE_BF16, ENG_LIN_ADD, 16, 14336, 4096, 0, 1);
        test_linear(gpu, ENG_DTYPE_F16, ENG_LIN_ADD, 5, 4096, 1000, 1, 0);
        test_linear(gpu, ENG_DTYPE_BF16, ENG_LIN_SWIGLU, 12, 4096, 2816, 1, 1);
        test_linear(gpu, ENG_DTYPE_BF16, ENG_LIN_SWIGLU, 9, 1024, 1036, 1, 1);
        test_linear(gpu, ENG_DTYPE_F16, ENG_LIN_SWIGLU, 3, 2048, 3000, 1, 0);
        test_linear(gpu, ENG_DTYPE_BF16, ENG_LIN_ROPE_KV, 12, 1024, 1536, 1, 1);
        test_linear(gpu8, ENG_DTYPE_BF16, ENG_LIN_ROPE_KV, 16, 4096, 1536, 1, 0);
        test_linear(gpu8, ENG_DTYPE_F16, ENG_LIN_ROPE_KV, 5, 2048, 1536, 1, 0);
    }
    s_lin_tag = "";
    eng_cuda_skinny_rows(gpu, def);
    eng_cuda_skinny_rows(gpu8, def);
    ecu_t_check(eng_cuda_skinny_rows(gpu, 17) == -EINVAL &&
                    eng_cuda_skinny_rows(cpu, 1) == -EINVAL && eng_cuda_skinny_rows(gpu, -1) == def,
                "eng_cuda_skinny_rows refuses 17 and the CPU backend, and keeps its value");
}

/* One layer's two consumer pairs on backend be (weights dt, c->n rows), result in res (n, H)
   downloaded: x -> gate|up linear (norm, SwiGLU) -> down linear (residual add)
   and q -> attention -> O linear (residual add), the consumers told x_from_prev = prev.
   mode 1 breaks the promise between producer and consumer (the producer's out is zeroed
   behind the backend's back), mode 2 gives the consumer another buffer of zeros. */
typedef struct {
    int n, H, F, nh, nkv, hd, bs, mb;
    void *wgu, *wd, *wo, *g, *kc, *vc;
    float *x, *res0, *q;
    int32_t *q_start, *ctx, *tables;
} s_twin_case_t;

static void s_twin_run(eng_backend_t *be,
                       const s_twin_case_t *c,
                       eng_dtype_t dt,
                       int prev,
                       int mode,
                       float *res_mlp,
                       float *res_att)
{
    const int n = c->n, H = c->H, F = c->F, Q = c->nh * c->hd;
    float *gres = ecu_t_put(be, c->res0, (size_t)n * H * 4),
          *gx = ecu_t_put(be, c->x, (size_t)n * H * 4);
    float *gate = be->alloc(be, (size_t)n * F * 4), *att = be->alloc(be, (size_t)n * Q * 4);
    float *zeros = calloc((size_t)n * (F > Q ? F : Q), 4);
    float *other = ecu_t_put(be, zeros, (size_t)n * (F > Q ? F : Q) * 4);
    float *gq = ecu_t_put(be, c->q, (size_t)n * Q * 4);
    eng_linear_t gu = {0}, add = {0};
    gu.norm_w = c->g, gu.norm_dtype = dt, gu.eps = 1e-6f, gu.epi = ENG_LIN_SWIGLU;
    add.epi = ENG_LIN_ADD, add.x_from_prev = prev;
    int rc = be->linear(be, gate, gx, c->wgu, NULL, dt, n, H, 2 * F, &gu);
    if (mode == 1)
        rc |= be->upload(be, gate, zeros, (size_t)n * F * 4);
    rc |= be->linear(be, gres, mode == 2 ? other : gate, c->wd, NULL, dt, n, F, H, &add);
    ecu_t_get(be, res_mlp, gres, (size_t)n * H * 4);
    rc |= be->upload(be, gres, c->res0, (size_t)n * H * 4);
    eng_attn_batch_t b = {n, c->q_start, c->ctx, c->tables, c->mb};
    rc |= be->attention(be, att, gq, c->kc, c->vc, &b, c->nh, c->nkv, c->hd, c->bs);
    if (mode == 1)
        rc |= be->upload(be, att, zeros, (size_t)n * Q * 4);
    rc |= be->linear(be, gres, mode == 2 ? other : att, c->wo, NULL, dt, n, Q, H, &add);
    ecu_t_get(be, res_att, gres, (size_t)n * H * 4);
    ecu_t_check(rc == 0, "twin pair ops return 0");
    be->free(be, gres), be->free(be, gx), be->free(be, gate), be->free(be, att);
    be->free(be, other), be->free(be, gq);
    free(zeros);
}

/* Rounded twins (ecu_twin_begin): in a linear composed on cuBLASLt, SwiGLU also writes its
   output rounded for the down projection, and the attention's combine for the O projection,
   which read it when told x_from_prev. Checked for bf16 and f16 weights on N decodes (16:
   cuBLASLt; 8: the skinny product, whose SwiGLU epilogue writes the twin):
   - x_from_prev 1 and 0 give the same bits (the twin is the rounding the product would do),
     and both stay within the CPU composition's bound;
   - with the producer's output zeroed between the two ops (a broken promise, only to observe
     which copy the product read), x_from_prev 1 still gives those bits (it read the twin),
     x_from_prev 0 gives the residual untouched, and so does a backend with
     ANVIL_CUDA_TWIN=0 even with x_from_prev 1;
   - a consumer given another buffer (zeros) with x_from_prev 1 ignores the twin. */
/* SwiGLU's twin alone (eng_linear_t.out_for_next; st->twin_only): on N rows that run on
   cuBLASLt, a gate|up linear told out_for_next leaves its out as it was (a 0xff pattern: NaN
   as floats) and the down projection after it (x_from_prev 1) gives the bits of the run
   with out written; with ANVIL_CUDA_TWIN_ONLY=0 or ANVIL_CUDA_TWIN=0 out is written and the
   bits are the same; a linear that reads the unwritten out without the twin (x_from_prev 0)
   fails instead of reading it, and the next pair runs as before. */
static void test_twin_only(eng_dtype_t dt, int N)
{
    const int H = 512, F = 768;
    const size_t es = eng_dtype_size(dt), gn = (size_t)N * F, rn = (size_t)N * H;
    float *wgu = s_rand((size_t)2 * F * H, 0.05f), *wd = s_rand((size_t)H * F, 0.05f);
    float *g = s_rand(H, 0.5f), *x = s_rand(rn, 2.0f), *res0 = s_rand(rn, 1.0f);
    for (int i = 0; i < H; i++)
        g[i] += 1.0f;
    float *r_gu = malloc((size_t)2 * F * H * 4), *r_d = malloc((size_t)H * F * 4);
    float *r_g = malloc(H * 4);
    void *h_gu = s_weights(wgu, (size_t)2 * F * H, dt, r_gu);
    void *h_d = s_weights(wd, (size_t)H * F, dt, r_d), *h_g = s_weights(g, H, dt, r_g);
    unsigned char *pat = malloc(gn * 4);
    float *gate_h = malloc(gn * 4), *res[3][2];
    memset(pat, 0xff, gn * 4);
    eng_backend_t *bes[3] = {gpu, s_backend_with(ENG_DTYPE_BF16, "ANVIL_CUDA_TWIN_ONLY", "0"),
                             s_backend_with(ENG_DTYPE_BF16, "ANVIL_CUDA_TWIN", "0")};
    const char *tag[3] = {"", " (ANVIL_CUDA_TWIN_ONLY=0)", " (ANVIL_CUDA_TWIN=0)"};
    char name[160];
    for (int k = 0; k < 3; k++) {
        res[k][0] = calloc(rn, 4), res[k][1] = calloc(rn, 4);
        eng_backend_t *be = bes[k];
        snprintf(name, sizeof(name), "twin alone %s n=%d: a backend%s", eng_dtype_name(dt), N,
                 tag[k]);
        ecu_t_check(be != NULL, name);
        if (!be)
            continue;
        void *dgu = ecu_t_put(be, h_gu, (size_t)2 * F * H * es);
        void *dd = ecu_t_put(be, h_d, (size_t)H * F * es), *dg = ecu_t_put(be, h_g, H * es);
        float *gx = ecu_t_put(be, x, rn * 4), *gres = be->alloc(be, rn * 4);
        float *gate = be->alloc(be, gn * 4);
        eng_linear_t gu = {0}, add = {0};
        gu.norm_w = dg, gu.norm_dtype = dt, gu.eps = 1e-6f, gu.epi = ENG_LIN_SWIGLU;
        add.epi = ENG_LIN_ADD;
        for (int ofn = 0; ofn < 2; ofn++) {
            int rc = be->upload(be, gres, res0, rn * 4) | be->upload(be, gate, pat, gn * 4);
            gu.out_for_next = ofn, add.x_from_prev = 1;
            rc |= be->linear(be, gate, gx, dgu, NULL, dt, N, H, 2 * F, &gu);
            rc |= be->linear(be, gres, gate, dd, NULL, dt, N, F, H, &add);
            ecu_t_get(be, res[k][ofn], gres, rn * 4);
            ecu_t_get(be, gate_h, gate, gn * 4);
            const bool untouched = memcmp(gate_h, pat, gn * 4) == 0;
            snprintf(name, sizeof(name), "twin alone %s n=%d%s out_for_next %d: rc 0, out %s",
                     eng_dtype_name(dt), N, tag[k], ofn,
                     k == 0 && ofn ? "left unwritten" : "written");
            ecu_t_check(rc == 0 && untouched == (k == 0 && ofn == 1), name);
        }
        if (k == 0) {
            /* the promise broken: the down projection told x_from_prev 0 */
            int rc = be->upload(be, gres, res0, rn * 4);
            gu.out_for_next = 1, add.x_from_prev = 0;
            rc |= be->linear(be, gate, gx, dgu, NULL, dt, N, H, 2 * F, &gu);
            const int bad = be->linear(be, gres, gate, dd, NULL, dt, N, F, H, &add);
            ecu_t_get(be, gate_h, gres, rn * 4);
            snprintf(name, sizeof(name),
                     "twin alone %s n=%d: x_from_prev 0 on the unwritten out fails (rc %d), "
                     "the residual untouched",
                     eng_dtype_name(dt), N, bad);
            ecu_t_check(rc == 0 && bad == ANV_ESTATE && memcmp(gate_h, res0, rn * 4) == 0, name);
            /* and the pair after it runs as before */
            float *again = malloc(rn * 4);
            rc = be->upload(be, gres, res0, rn * 4);
            add.x_from_prev = 1;
            rc |= be->linear(be, gate, gx, dgu, NULL, dt, N, H, 2 * F, &gu);
            rc |= be->linear(be, gres, gate, dd, NULL, dt, N, F, H, &add);
            ecu_t_get(be, again, gres, rn * 4);
            snprintf(name, sizeof(name), "twin alone %s n=%d: the next pair the same bits",
                     eng_dtype_name(dt), N);
            ecu_t_check(rc == 0 && memcmp(again, res[0][1], rn * 4) == 0, name);
            free(again);
        }
        be->free(be, dgu), be->free(be, dd), be->free(be, dg), be->free(be, gx);
        be->free(be, gres), be->free(be, gate);
    }
    for (int k = 0; k < 3; k++)
        for (int ofn = 0; ofn < 2; ofn++) {
            snprintf(name, sizeof(name), "twin alone %s n=%d%s out_for_next %d: the same bits",
                     eng_dtype_name(dt), N, tag[k], ofn);
            ecu_t_check(memcmp(res[k][ofn], res[0][0], rn * 4) == 0, name);
        }
    for (int k = 0; k < 3; k++) {
        free(res[k][0]), free(res[k][1]);
        if (k > 0 && bes[k])
            bes[k]->destroy(&bes[k]);
    }
    free(wgu), free(wd), free(g), free(x), free(res0), free(r_gu), free(r_d), free(r_g);
    free(h_gu), free(h_d), free(h_g), free(pat), free(gate_h);
}

/* The gate|up product in the weights' dtype (st->gu_low, ANVIL_CUDA_GU_LOW): a SwiGLU linear
   on N rows that run on cuBLASLt (with the norm: its rounded input from the norm; without:
   x rounded apart) gives silu(g) u of the product rounded to dt. Against the host's SwiGLU
   of the same backend's f32 product (a plain linear over gate|up), rounded to dt: within a
   few values whose fp32 sums straddle a rounding boundary (bf16: 3e-4, a tenth of the
   rounding's own error, so the check tells the two apart); with ANVIL_CUDA_GU_LOW=0 the f32
   product's SwiGLU itself (1e-6); both within the CPU composition's tolerance (test_linear
   with both backends); and the two backends' outputs differ. */
static float s_round_to(float v, eng_dtype_t dt)
{
    float r;
    uint16_t h;
    if (dt == ENG_DTYPE_BF16) {
        h = ecu_t_bf16(v);
    } else {
        _Float16 f = (_Float16)v;
        memcpy(&h, &f, 2);
    }
    eng_cpu_widen(&r, &h, dt, 0, 1);
    return r;
}

static void test_gu_low(eng_dtype_t dt, int N, int norm)
{
    const int H = 1024, F = 1536;
    const size_t es = eng_dtype_size(dt), yn = (size_t)N * F;
    float *w = s_rand((size_t)2 * F * H, 0.05f), *g = s_rand(H, 0.5f);
    float *x = s_rand((size_t)N * H, 2.0f);
    for (int i = 0; i < H; i++)
        g[i] += 1.0f;
    float *wr = malloc((size_t)2 * F * H * 4), *gr = malloc(H * 4);
    void *wh = s_weights(w, (size_t)2 * F * H, dt, wr), *gh = s_weights(g, H, dt, gr);
    float *prod = malloc((size_t)N * 2 * F * 4), *r16 = malloc(yn * 4), *r32 = malloc(yn * 4);
    float *got[2] = {malloc(yn * 4), malloc(yn * 4)};
    eng_backend_t *bes[2] = {gpu, s_backend_with(ENG_DTYPE_BF16, "ANVIL_CUDA_GU_LOW", "0")};
    const char *tag[2] = {"", " (ANVIL_CUDA_GU_LOW=0)"};
    char name[200];
    int ok = bes[1] != NULL;
    for (int k = 0; k < 2 && ok; k++) {
        eng_backend_t *be = bes[k];
        void *dw = ecu_t_put(be, wh, (size_t)2 * F * H * es), *dg = ecu_t_put(be, gh, H * es);
        float *dx = ecu_t_put(be, x, (size_t)N * H * 4), *dy = be->alloc(be, yn * 4);
        float *dp = be->alloc(be, (size_t)N * 2 * F * 4);
        eng_linear_t gu = {0}, pl = {0};
        gu.norm_w = norm ? dg : NULL, gu.norm_dtype = dt, gu.eps = 1e-6f, gu.epi = ENG_LIN_SWIGLU;
        pl = gu, pl.epi = ENG_LIN_PLAIN;
        int rc = be->linear(be, dy, dx, dw, NULL, dt, N, H, 2 * F, &gu);
        rc |= be->linear(be, dp, dx, dw, NULL, dt, N, H, 2 * F, &pl);
        ecu_t_get(be, got[k], dy, yn * 4);
        ecu_t_get(be, prod, dp, (size_t)N * 2 * F * 4);
        for (int r = 0; r < N; r++)
            for (int c = 0; c < F; c++) {
                const float *p = prod + (size_t)r * 2 * F;
                float a = p[c], b = p[F + c];
                r32[(size_t)r * F + c] = a / (1.0f + expf(-a)) * b;
                a = s_round_to(a, dt), b = s_round_to(b, dt);
                r16[(size_t)r * F + c] = a / (1.0f + expf(-a)) * b;
            }
        snprintf(name, sizeof(name), "gate|up %s n=%d%s%s: rc 0", eng_dtype_name(dt), N,
                 norm ? " +norm" : "", tag[k]);
        ecu_t_check(rc == 0, name);
        snprintf(name, sizeof(name), "gate|up %s n=%d%s%s: SwiGLU of the %s product",
                 eng_dtype_name(dt), N, norm ? " +norm" : "", tag[k], k ? "f32" : "rounded");
        ecu_t_close(name, got[k], k ? r32 : r16, yn, k ? 1e-6 : dt == ENG_DTYPE_BF16 ? 3e-4 : 1e-4);
        be->free(be, dw), be->free(be, dg), be->free(be, dx), be->free(be, dy), be->free(be, dp);
    }
    snprintf(name, sizeof(name),
             "gate|up %s n=%d%s: a backend with ANVIL_CUDA_GU_LOW=0, and the "
             "two outputs differ",
             eng_dtype_name(dt), N, norm ? " +norm" : "");
    ecu_t_check(ok && memcmp(got[0], got[1], yn * 4) != 0, name);
    if (ok) {
        s_lin_tag = tag[1];
        test_linear(bes[1], dt, ENG_LIN_SWIGLU, N, H, 2 * F, norm, 0);
        s_lin_tag = "";
        test_linear(gpu, dt, ENG_LIN_SWIGLU, N, H, 2 * F, norm, 0);
        bes[1]->destroy(&bes[1]);
    }
    free(w), free(g), free(x), free(wr), free(gr), free(wh), free(gh), free(prod), free(r16);
    free(r32), free(got[0]), free(got[1]);
}

static void test_twins(eng_dtype_t dt, int N)
{
    s_twin_case_t c = {.n = N, .H = 512, .F = 768, .nh = 8, .nkv = 2, .hd = 64, .bs = 16, .mb = 8};
    const int H = c.H, F = c.F, Q = c.nh * c.hd;
    size_t es = eng_dtype_size(dt), pool = (size_t)N * c.mb * c.bs * c.nkv * c.hd;
    eng_backend_t *off = s_backend_with(ENG_DTYPE_BF16, "ANVIL_CUDA_TWIN", "0");
    ecu_t_check(off != NULL, "a backend with ANVIL_CUDA_TWIN=0");
    if (!off)
        return;
    eng_backend_t *bes[2] = {gpu, off};
    float *wgu = s_rand((size_t)2 * F * H, 0.05f), *wd = s_rand((size_t)H * F, 0.05f);
    float *wo = s_rand((size_t)H * Q, 0.05f), *g = s_rand(H, 0.5f);
    for (int i = 0; i < H; i++)
        g[i] += 1.0f;
    float *r_gu = malloc((size_t)2 * F * H * 4), *r_d = malloc((size_t)H * F * 4);
    float *r_o = malloc((size_t)H * Q * 4), *r_g = malloc(H * 4);
    void *h_gu = s_weights(wgu, (size_t)2 * F * H, dt, r_gu),
         *h_d = s_weights(wd, (size_t)H * F, dt, r_d);
    void *h_o = s_weights(wo, (size_t)H * Q, dt, r_o), *h_g = s_weights(g, H, dt, r_g);
    int32_t q_start[17], ctx[16], *tables = malloc((size_t)N * c.mb * 4); /* N <= 16 */
    for (int s = 0; s <= N; s++)
        q_start[s] = s;
    for (int s = 0; s < N; s++)
        ctx[s] = 1 + s * 37 % (c.mb * c.bs);
    for (int i = 0; i < N * c.mb; i++)
        tables[i] = (i * 7 + 3) % (N * c.mb);
    float *ck, *cv;
    void *hk, *hv;
    s_kv_fill(ENG_DTYPE_BF16, pool, &hk, &hv, &ck, &cv);
    c.x = s_rand((size_t)N * H, 2.0f), c.res0 = s_rand((size_t)N * H, 1.0f);
    c.q = s_rand((size_t)N * Q, 1.0f), c.q_start = q_start, c.ctx = ctx, c.tables = tables;
    /* the CPU's composition */
    float *gate = malloc((size_t)N * F * 4), *att = malloc((size_t)N * Q * 4);
    float *ref_mlp = malloc((size_t)N * H * 4), *ref_att = malloc((size_t)N * H * 4);
    memcpy(ref_mlp, c.res0, (size_t)N * H * 4), memcpy(ref_att, c.res0, (size_t)N * H * 4);
    eng_linear_t gu = {0}, add = {0};
    gu.norm_w = h_g, gu.norm_dtype = dt, gu.eps = 1e-6f, gu.epi = ENG_LIN_SWIGLU;
    add.epi = ENG_LIN_ADD;
    eng_attn_batch_t b = {N, q_start, ctx, tables, c.mb};
    int rc = cpu->linear(cpu, gate, c.x, h_gu, NULL, dt, N, H, 2 * F, &gu);
    rc |= cpu->linear(cpu, ref_mlp, gate, h_d, NULL, dt, N, F, H, &add);
    rc |= cpu->attention(cpu, att, c.q, ck, cv, &b, c.nh, c.nkv, c.hd, c.bs);
    rc |= cpu->linear(cpu, ref_att, att, h_o, NULL, dt, N, Q, H, &add);
    ecu_t_check(rc == 0, "twin pairs on the CPU");
    size_t rn = (size_t)N * H * 4;
    float *out[2][3][2]; /* backend, run (prev 1, prev 0, broken prev 1), pair */
    for (int k = 0; k < 2; k++) {
        eng_backend_t *be = bes[k];
        c.wgu = ecu_t_put(be, h_gu, (size_t)2 * F * H * es),
        c.wd = ecu_t_put(be, h_d, (size_t)H * F * es);
        c.wo = ecu_t_put(be, h_o, (size_t)H * Q * es), c.g = ecu_t_put(be, h_g, H * es);
        c.kc = ecu_t_put(be, hk, pool * 2), c.vc = ecu_t_put(be, hv, pool * 2);
        for (int r = 0; r < 3; r++) {
            out[k][r][0] = malloc(rn), out[k][r][1] = malloc(rn);
            s_twin_run(be, &c, dt, r != 1, r == 2, out[k][r][0], out[k][r][1]);
        }
        float *oth[2] = {malloc(rn), malloc(rn)};
        s_twin_run(be, &c, dt, 1, 2, oth[0], oth[1]);
        char name[160];
        for (int pr = 0; pr < 2; pr++) {
            const char *pn = pr ? "attention -> O" : "swiglu -> down";
            snprintf(name, sizeof(name), "twin %s %s n=%d%s: against the CPU", pn,
                     eng_dtype_name(dt), N, k ? " (twins off)" : "");
            ecu_t_close(name, out[k][0][pr], pr ? ref_att : ref_mlp, (size_t)N * H,
                        dt == ENG_DTYPE_BF16 ? 1e-2 : 2e-3);
            snprintf(name, sizeof(name), "twin %s %s n=%d%s: x_from_prev 1 and 0 the same bits", pn,
                     eng_dtype_name(dt), N, k ? " (twins off)" : "");
            ecu_t_check(memcmp(out[k][0][pr], out[k][1][pr], rn) == 0, name);
            snprintf(name, sizeof(name), "twin %s %s n=%d%s: out zeroed behind its back -> %s", pn,
                     eng_dtype_name(dt), N, k ? " (twins off)" : "",
                     k ? "the residual untouched" : "the twin's product");
            ecu_t_check(memcmp(out[k][2][pr], k ? c.res0 : out[k][0][pr], rn) == 0, name);
            snprintf(name, sizeof(name), "twin %s %s n=%d%s: another buffer ignores the twin", pn,
                     eng_dtype_name(dt), N, k ? " (twins off)" : "");
            ecu_t_check(memcmp(oth[pr], c.res0, rn) == 0, name);
        }
        free(oth[0]), free(oth[1]);
        be->free(be, c.wgu), be->free(be, c.wd), be->free(be, c.wo), be->free(be, c.g);
        be->free(be, c.kc), be->free(be, c.vc);
    }
    /* the broken promise without the twin: x_from_prev 0 reads the zeros */
    float *z[2] = {malloc(rn), malloc(rn)};
    c.wgu = ecu_t_put(gpu, h_gu, (size_t)2 * F * H * es),
    c.wd = ecu_t_put(gpu, h_d, (size_t)H * F * es);
    c.wo = ecu_t_put(gpu, h_o, (size_t)H * Q * es), c.g = ecu_t_put(gpu, h_g, H * es);
    c.kc = ecu_t_put(gpu, hk, pool * 2), c.vc = ecu_t_put(gpu, hv, pool * 2);
    s_twin_run(gpu, &c, dt, 0, 1, z[0], z[1]);
    ecu_t_check(memcmp(z[0], c.res0, rn) == 0 && memcmp(z[1], c.res0, rn) == 0,
                "twin: out zeroed, x_from_prev 0 -> the residual untouched");
    ecu_t_check(memcmp(out[0][0][0], out[1][0][0], rn) == 0 &&
                    memcmp(out[0][0][1], out[1][0][1], rn) == 0,
                "twin: twins on and off give the same bits");
    gpu->free(gpu, c.wgu), gpu->free(gpu, c.wd), gpu->free(gpu, c.wo), gpu->free(gpu, c.g);
    gpu->free(gpu, c.kc), gpu->free(gpu, c.vc);
    free(z[0]), free(z[1]);
    for (int k = 0; k < 2; k++)
        for (int r = 0; r < 3; r++)
            free(out[k][r][0]), free(out[k][r][1]);
    off->destroy(&off);
    free(wgu), free(wd), free(wo), free(g), free(r_gu), free(r_d), free(r_o), free(r_g);
    free(h_gu), free(h_d), free(h_o), free(h_g), free(tables), free(ck), free(cv), free(hk);
    free(hv), free(c.x), free(c.res0), free(c.q), free(gate), free(att), free(ref_mlp);
    free(ref_att);
}

/* swiglu and the stacked swiglu_fused: ffn 1000 takes the 4-a-thread kernel, 1002 the
   scalar one */
static void test_swiglu(int ffn)
{
    char name[64];
    int n = 5;
    size_t t = (size_t)n * ffn;
    float *g = s_rand(t, 4.0f), *u = s_rand(t, 2.0f), *ref = malloc(t * 4), *got = malloc(t * 4);
    float *gg = ecu_t_put(gpu, g, t * 4), *gu = ecu_t_put(gpu, u, t * 4);
    float *go = gpu->alloc(gpu, t * 4);
    cpu->swiglu(cpu, ref, g, u, n, ffn);
    gpu->swiglu(gpu, go, gg, gu, n, ffn);
    ecu_t_get(gpu, got, go, t * 4);
    snprintf(name, sizeof(name), "swiglu ffn=%d", ffn);
    ecu_t_close(name, got, ref, t, 1e-6);
    float *st = malloc(2 * t * 4);
    for (int r = 0; r < n; r++) {
        memcpy(st + (size_t)r * 2 * ffn, g + (size_t)r * ffn, (size_t)ffn * 4);
        memcpy(st + (size_t)r * 2 * ffn + ffn, u + (size_t)r * ffn, (size_t)ffn * 4);
    }
    float *gst = ecu_t_put(gpu, st, 2 * t * 4);
    gpu->swiglu_fused(gpu, go, gst, n, ffn);
    ecu_t_get(gpu, got, go, t * 4);
    snprintf(name, sizeof(name), "swiglu_fused ffn=%d", ffn);
    ecu_t_close(name, got, ref, t, 1e-6);
    gpu->free(gpu, gg), gpu->free(gpu, gu), gpu->free(gpu, go), gpu->free(gpu, gst);
    free(g), free(u), free(ref), free(got), free(st);
}

static void test_elementwise(void)
{
    int n = 5, dim = 300;
    test_swiglu(1000);
    test_swiglu(1002);

    /* gather_rows, also in place; first an allocation past the device's memory, which must
       fail alone: its error is not sticky, and the next op's launch check must not see it */
    void *huge = gpu->alloc(gpu, (size_t)1 << 50);
    ecu_t_check(huge == NULL, "an allocation of 1 PiB returns NULL");
    if (huge)
        gpu->free(gpu, huge);
    float *x = s_rand((size_t)n * dim, 1.0f), *gx = ecu_t_put(gpu, x, (size_t)n * dim * 4);
    int32_t rows[3] = {4, 1, 4};
    float *gr = gpu->alloc(gpu, 3 * (size_t)dim * 4), *rr = malloc(3 * (size_t)dim * 4);
    float *gt = malloc(3 * (size_t)dim * 4);
    cpu->gather_rows(cpu, rr, x, rows, 3, dim);
    ecu_t_check(gpu->gather_rows(gpu, gr, gx, rows, 3, dim) == 0,
                "gather_rows after a failed allocation returns 0");
    ecu_t_get(gpu, gt, gr, 3 * (size_t)dim * 4);
    ecu_t_close("gather_rows", gt, rr, 3 * (size_t)dim, 0.0);
    gpu->gather_rows(gpu, gx, gx, rows, 3, dim);
    ecu_t_get(gpu, gt, gx, 3 * (size_t)dim * 4);
    ecu_t_close("gather_rows in place", gt, rr, 3 * (size_t)dim, 0.0);
    gpu->free(gpu, gx), gpu->free(gpu, gr);
    free(x), free(rr), free(gt);
}

/* log_softmax and sampling on backend gb (label: its sampler) against the host */
static void test_softmax_sample(eng_backend_t *gb, const char *label)
{
    char name[128];
    int vocab = 155136, n = 4;
    printf("sampler: %s\n", label);
    size_t t = (size_t)n * vocab;
    float *l = s_rand(t, 8.0f);
    l[vocab + 77] = l[vocab + 78] = 30.0f; /* a tie in row 1: the lower id wins */
    float *gl = ecu_t_put(gb, l, t * 4), *go = gb->alloc(gb, t * 4);
    float *ref = malloc(t * 4), *got = malloc(t * 4);
    cpu->log_softmax(cpu, ref, l, n, vocab);
    gb->log_softmax(gb, go, gl, n, vocab);
    ecu_t_get(gb, got, go, t * 4);
    ecu_t_close("log_softmax vocab=155136", got, ref, t, 1e-6);

    eng_sample_params_t sp[4];
    int32_t tok[4];
    float lp[4];
    for (int r = 0; r < n; r++)
        sp[r] = (eng_sample_params_t){0.0f, 0, 1.0f, 0.0f, (uint64_t)r, 0};
    gb->sample(gb, tok, lp, gl, n, vocab, sp);
    for (int r = 0; r < n; r++) {
        int am = 0;
        for (int i = 1; i < vocab; i++)
            if (l[(size_t)r * vocab + i] > l[(size_t)r * vocab + am])
                am = i;
        snprintf(name, sizeof(name), "greedy row %d: token %d (cpu %d) logprob %.6f (cpu %.6f)", r,
                 tok[r], am, lp[r], ref[(size_t)r * vocab + am]);
        ecu_t_check(tok[r] == am && fabsf(lp[r] - ref[(size_t)r * vocab + am]) < 1e-4f, name);
    }
    /* top_k = 1 at temperature 1 is greedy too */
    for (int r = 0; r < n; r++)
        sp[r] = (eng_sample_params_t){1.0f, 1, 1.0f, 0.0f, (uint64_t)r * 7 + 1, 3};
    int32_t tok1[4];
    gb->sample(gb, tok1, lp, gl, n, vocab, sp);
    /* ties at the top-k threshold all survive: row 1 may draw either tied token */
    ecu_t_check(tok1[0] == tok[0] && tok1[2] == tok[2] && tok1[3] == tok[3],
                "top_k=1 equals greedy on rows without ties");
    ecu_t_check(tok1[1] == 77 || tok1[1] == 78, "top_k=1 keeps both tied tokens");

    /* distribution over many seeds: R rows of the same small-vocabulary logits */
    enum { V = 50, R = 20000 };
    float base[V], p[V];
    double z = 0;
    for (int i = 0; i < V; i++)
        base[i] = ecu_t_randf(2.0f), z += exp(base[i]);
    for (int i = 0; i < V; i++)
        p[i] = (float)(exp(base[i]) / z);
    float *rl = malloc((size_t)R * V * 4);
    for (int r = 0; r < R; r++)
        memcpy(rl + (size_t)r * V, base, sizeof(base));
    float *grl = ecu_t_put(gb, rl, (size_t)R * V * 4);
    eng_sample_params_t *rp = malloc((size_t)R * sizeof(*rp));
    int32_t *rt = malloc((size_t)R * 4), *rt2 = malloc((size_t)R * 4);
    float *rlp = malloc((size_t)R * 4);
    struct {
        float temp, top_p, min_p;
        int top_k;
        const char *what;
    } cases[] = {{1.0f, 1.0f, 0.0f, 0, "plain"},
                 {0.7f, 1.0f, 0.0f, 5, "top_k=5 T=0.7"},
                 {1.0f, 0.5f, 0.0f, 0, "top_p=0.5"},
                 {1.0f, 1.0f, 0.2f, 0, "min_p=0.2"},
                 {1.3f, 0.9f, 0.05f, 20, "top_k=20 top_p=0.9 min_p=0.05 T=1.3"}};
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
        for (int r = 0; r < R; r++)
            rp[r] = (eng_sample_params_t){cases[ci].temp, cases[ci].top_k, cases[ci].top_p,
                                          cases[ci].min_p, 0xabcdef00ull + (uint64_t)r, 5};
        gb->sample(gb, rt, rlp, grl, R, V, rp);
        /* expected distribution: temperature, then top-k, top-p (over the survivors), min-p */
        double q[V], qs = 0, mx = -1e30;
        int order[V];
        for (int i = 0; i < V; i++) {
            q[i] = base[i] / cases[ci].temp, order[i] = i;
            mx = q[i] > mx ? q[i] : mx;
        }
        for (int i = 0; i < V; i++)
            for (int j = i + 1; j < V; j++)
                if (base[order[j]] > base[order[i]]) {
                    int tt = order[i];
                    order[i] = order[j], order[j] = tt;
                }
        int keep = cases[ci].top_k > 0 ? cases[ci].top_k : V;
        double mass = 0, tot = 0;
        for (int i = 0; i < keep; i++)
            tot += exp(q[order[i]] - mx);
        int kp = 0;
        for (; kp < keep; kp++) {
            mass += exp(q[order[kp]] - mx);
            if (mass >= cases[ci].top_p * tot - 1e-12)
                break;
        }
        if (cases[ci].top_p < 1.0f)
            keep = kp + 1;
        int alive[V] = {0};
        for (int i = 0; i < keep; i++) {
            int id = order[i];
            if (cases[ci].min_p > 0 && exp(q[id] - mx) < cases[ci].min_p)
                continue;
            alive[id] = 1, qs += exp(q[id] - mx);
        }
        int cnt[V] = {0}, outside = 0;
        for (int r = 0; r < R; r++) {
            if (rt[r] < 0 || rt[r] >= V || !alive[rt[r]])
                outside++;
            else
                cnt[rt[r]]++;
        }
        double maxdev = 0;
        for (int i = 0; i < V; i++) {
            double e = alive[i] ? exp(q[i] - mx) / qs : 0.0;
            double dv = fabs((double)cnt[i] / R - e);
            maxdev = dv > maxdev ? dv : maxdev;
        }
        int lp_ok = 1;
        for (int r = 0; r < R && lp_ok; r++)
            if (rt[r] >= 0 && rt[r] < V && fabs(rlp[r] - log(p[rt[r]])) > 1e-4)
                lp_ok = 0;
        snprintf(name, sizeof(name), "sample %s: %d outside the set, max freq dev %.4f",
                 cases[ci].what, outside, maxdev);
        if (outside == 0 && maxdev < 0.02)
            printf("ok   %s\n", name);
        ecu_t_check(outside == 0 && maxdev < 0.02, name);
        ecu_t_check(lp_ok, "sampled logprobs are the model's log_softmax");
        /* same seeds, same tokens; a row alone draws what it drew in the batch */
        gb->sample(gb, rt2, rlp, grl, R, V, rp);
        ecu_t_check(memcmp(rt, rt2, (size_t)R * 4) == 0, "same seeds give the same tokens");
        int32_t one;
        float onelp;
        gb->sample(gb, &one, &onelp, grl + (size_t)1234 * V, 1, V, rp + 1234);
        ecu_t_check(one == rt[1234], "a row alone samples what it sampled in the batch");
        /* the host sampler (the CPU backend's `sample`) is the definition: the same draws
           from the same logits, short of an expf/logf rounding at a Gumbel near-tie */
        cpu->sample(cpu, rt2, rlp, rl, R, V, rp);
        int agree = 0;
        for (int r = 0; r < R; r++)
            agree += rt[r] == rt2[r];
        snprintf(name, sizeof(name), "sample %s: GPU and host draw the same token in %d of %d rows",
                 cases[ci].what, agree, R);
        printf("%s   %s\n", agree >= R - R / 1000 ? "ok" : "FAIL", name);
        ecu_t_check(agree >= R - R / 1000, name);
    }
    /* the same on the full vocabulary: row r of l with top-p and top-k on */
    for (int r = 0; r < n; r++)
        sp[r] = (eng_sample_params_t){0.9f, 40, 0.95f, 0.0f, (uint64_t)r * 11 + 3, 9};
    int32_t tg[4], th[4];
    float lg[4], lh[4];
    gb->sample(gb, tg, lg, gl, n, vocab, sp);
    cpu->sample(cpu, th, lh, l, n, vocab, sp);
    for (int r = 0; r < n; r++) {
        snprintf(name, sizeof(name), "vocab=155136 row %d: GPU token %d, host token %d", r, tg[r],
                 th[r]);
        ecu_t_check(tg[r] == th[r] && fabsf(lg[r] - lh[r]) < 1e-4f, name);
    }
    /* rows the sampler's candidate list (2048 a block, softmax.cu) cannot hold, and the
       truncations that build it from top-p: a row of equal logits (every block reads its
       part of the row again), a row whose first 2500 ids tie at the top (all in the first
       block's part: with a cluster, one block falls back and the others read their lists),
       top-p alone (its own two bytes make the list), top-p alone with min-p */
    float *xl = s_rand(t, 8.0f);
    for (int i = 0; i < vocab; i++)
        xl[i] = 1.5f;
    for (int i = 0; i < 2500; i++)
        xl[vocab + i] = 12.0f;
    sp[0] = (eng_sample_params_t){1.0f, 40, 0.95f, 0.0f, 101, 2};
    sp[1] = (eng_sample_params_t){0.8f, 40, 0.9f, 0.0f, 202, 4};
    sp[2] = (eng_sample_params_t){1.0f, 0, 0.9f, 0.0f, 303, 6};
    sp[3] = (eng_sample_params_t){0.7f, 0, 0.8f, 0.05f, 404, 8};
    float *gxl = ecu_t_put(gb, xl, t * 4);
    gb->sample(gb, tg, lg, gxl, n, vocab, sp);
    cpu->sample(cpu, th, lh, xl, n, vocab, sp);
    static const char *const what[4] = {"equal logits", "2500 tied at the top", "top-p alone",
                                        "top-p and min-p"};
    for (int r = 0; r < n; r++) {
        snprintf(name, sizeof(name), "vocab=155136 %s: GPU token %d, host token %d", what[r],
                 tg[r], th[r]);
        ecu_t_check(tg[r] == th[r] && fabsf(lg[r] - lh[r]) < 1e-4f, name);
    }
    ecu_t_check(tg[1] >= 0 && tg[1] < 2500, "a row with 2500 tied at the top draws one of them");
    gb->free(gb, gxl);
    free(xl);
    gb->free(gb, gl), gb->free(gb, go), gb->free(gb, grl);
    free(l), free(ref), free(got), free(rl), free(rp), free(rt), free(rt2), free(rlp);
}

/* Prints what one sample call (parameters up, kernel, tokens down) costs on gb for n rows of
   the full vocabulary with top-k and top-p on: a figure, not a check. */
static void s_sample_timing(eng_backend_t *gb, const char *label)
{
    int vocab = 155136, ns[3] = {1, 16, 256}, reps = 50;
    float *l = s_rand((size_t)256 * vocab, 8.0f);
    float *gl = ecu_t_put(gb, l, (size_t)256 * vocab * 4);
    eng_sample_params_t sp[256];
    int32_t tok[256];
    float lp[256];
    for (int r = 0; r < 256; r++)
        sp[r] = (eng_sample_params_t){0.9f, 40, 0.95f, 0.0f, (uint64_t)r + 1, 1};
    for (int k = 0; k < 3; k++) {
        gb->sample(gb, tok, lp, gl, ns[k], vocab, sp); /* warm */
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (int i = 0; i < reps; i++)
            gb->sample(gb, tok, lp, gl, ns[k], vocab, sp);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double us = ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / 1e3 / reps;
        printf("info sample timing (%s): %d row(s) x %d, top-k 40 top-p 0.95: %.1f us a call\n",
               label, ns[k], vocab, us);
    }
    gb->free(gb, gl);
    free(l);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0); /* a log up to the last line even if a kernel faults */
    /* --only decodes: just the 64-decode test (its three decode variants); --only prefill:
       just the longer prefills on the tensor-core kernel (bf16 and fp8 KV, 4 and 8 query heads
       a KV head); --only groups: just the group tiles (test_attention_groups); for a run under
       compute-sanitizer (gpu_session's memcheck_dec / racecheck_dec, memcheck_pf /
       racecheck_pf, memcheck_grp / racecheck_grp) */
    const bool only = argc == 3 && !strcmp(argv[1], "--only");
    const bool only_decodes = only && !strcmp(argv[2], "decodes");
    const bool only_prefill = only && !strcmp(argv[2], "prefill");
    const bool only_groups = only && !strcmp(argv[2], "groups");
    if (argc > 1 && !only_decodes && !only_prefill && !only_groups) {
        fprintf(stderr, "usage: %s [--only decodes|prefill|groups]\n", argv[0]);
        return 2;
    }
    anv_log_init("test_cuda_ops");
    if (!eng_cuda_available()) {
        printf("SKIP: no CUDA device visible\n");
        return 77;
    }
    cpu = eng_backend_new("cpu", 2);
    gpu = eng_backend_new("cuda", 0);
    gpu32 = eng_cuda_backend_new_kv(ENG_DTYPE_F32);
    gpu8 = eng_cuda_backend_new_kv(ENG_DTYPE_F8E4M3);
    if (!cpu || !gpu || !gpu32 || !gpu8) {
        printf("FAIL: cannot create the backends\n");
        return 1;
    }
    if (only_decodes || only_prefill || only_groups) {
        if (only_decodes) {
            test_attention_decodes(ENG_DTYPE_BF16);
            test_attention_decodes(ENG_DTYPE_F8E4M3);
        } else if (only_groups) {
            test_attention_groups(ENG_DTYPE_BF16, 128, 32, 8);
            test_attention_groups(ENG_DTYPE_F8E4M3, 64, 16, 2);
        } else {
            test_attention_prefill(gpu, 128, 32, 8);
            test_attention_prefill(gpu8, 128, 32, 8);
            test_attention_prefill(gpu, 64, 16, 2);
            test_attention_prefill_switches(ENG_DTYPE_BF16, 128, 32, 8);
        }
        gpu32->destroy(&gpu32);
        gpu8->destroy(&gpu8);
        gpu->destroy(&gpu);
        cpu->destroy(&cpu);
        return ecu_t_done(only_decodes  ? "test_cuda_ops --only decodes"
                          : only_groups ? "test_cuda_ops --only groups"
                                        : "test_cuda_ops --only prefill");
    }
    eng_dtype_t dts[3] = {ENG_DTYPE_BF16, ENG_DTYPE_F16, ENG_DTYPE_F32};
    for (int i = 0; i < 3; i++) {
        test_embedding(dts[i]);
        test_norm(dts[i], 1000);
        test_norm(dts[i], 1002);
        test_norm(dts[i], 4096);
        int ns[6] = {1, 3, 8, 9, 64, 200};
        for (int j = 0; j < 6; j++)
            test_matmul(dts[i], ns[j], 1024, 600, j == 3);
        test_matmul(dts[i], 2, 4096, 1032, 1);
    }
    test_rope_kv(6); /* head_dim % 4 != 0: the scalar kernel */
    test_rope_kv(64);
    test_rope_kv(128);
    test_attention(gpu, 128, 32, 8);
    test_attention(gpu32, 128, 32, 8);
    test_attention(gpu, 64, 8, 8);
    test_attention(gpu32, 64, 28, 4);
    test_attention(gpu8, 128, 32, 8);
    test_attention(gpu8, 64, 28, 4);
    test_attention_prefill(gpu, 128, 32, 8);
    test_attention_prefill(gpu32, 128, 32, 8);
    test_attention_prefill(gpu8, 128, 32, 8);
    test_attention_prefill(gpu, 64, 16, 2);
    test_attention_prefill(gpu8, 64, 28, 4);
    test_attention_prefill_switches(ENG_DTYPE_BF16, 128, 32, 8);
    test_attention_prefill_switches(ENG_DTYPE_BF16, 64, 16, 2);
    test_attention_prefill_switches(ENG_DTYPE_F8E4M3, 128, 32, 8);
    test_attention_parts(ENG_DTYPE_BF16, 128, 32, 8);
    test_attention_parts(ENG_DTYPE_F8E4M3, 128, 32, 8);
    test_attention_parts(ENG_DTYPE_BF16, 64, 16, 2);
    test_attention_parts(ENG_DTYPE_BF16, 128, 28, 4); /* 7 a KV head: the FMA decode */
    test_attention_long();
    test_attention_groups(ENG_DTYPE_BF16, 128, 32, 8);
    test_attention_groups(ENG_DTYPE_F8E4M3, 128, 32, 8);
    test_attention_groups(ENG_DTYPE_BF16, 128, 64, 8);
    test_attention_groups(ENG_DTYPE_F8E4M3, 64, 16, 4);
    test_attention_groups(ENG_DTYPE_BF16, 64, 16, 2);
    test_attention_groups(ENG_DTYPE_BF16, 64, 28,
                          4); /* 7 a KV head: FMA, the plan's groups unread */
    /* the group tiles with fp32 and bf16 decode partials (ANVIL_CUDA_ATTN_PART, both backends
       of each test; fp16 is the default): a sequence still gets its own tiles' bits */
    setenv("ANVIL_CUDA_ATTN_PART", "f32", 1);
    test_attention_groups(ENG_DTYPE_BF16, 128, 32, 8);
    test_attention_groups(ENG_DTYPE_F8E4M3, 64, 16, 4);
    setenv("ANVIL_CUDA_ATTN_PART", "bf16", 1);
    test_attention_groups(ENG_DTYPE_BF16, 64, 16, 2);
    unsetenv("ANVIL_CUDA_ATTN_PART");
    /* the FMA decode and prefill kernels (ANVIL_CUDA_ATTN_MMA=0; the backends above run the
       tensor-core ones where they apply): bf16 and fp8 KV, 4 and 8 query heads a KV head,
       head_dim 128 and 64, and 7 a KV head (the FMA decode either way) */
    setenv("ANVIL_CUDA_ATTN_MMA", "0", 1);
    setenv("ANVIL_CUDA_ATTN_PREFILL_MMA", "0", 1);
    eng_backend_t *mma16 = eng_cuda_backend_new_kv(ENG_DTYPE_BF16);
    eng_backend_t *mma8 = eng_cuda_backend_new_kv(ENG_DTYPE_F8E4M3);
    unsetenv("ANVIL_CUDA_ATTN_MMA");
    unsetenv("ANVIL_CUDA_ATTN_PREFILL_MMA");
    ecu_t_check(mma16 && mma8, "backends with the FMA decode attention");
    if (mma16 && mma8) {
        static const int cases[7][4] = {/* fp8, head_dim, heads, KV heads */
                                        {0, 128, 32, 8}, {0, 128, 64, 8}, {0, 64, 32, 4},
                                        {1, 128, 32, 8}, {1, 128, 64, 8}, {1, 64, 16, 2},
                                        {1, 128, 28, 4}};
        s_attn_tag = " (fma)";
        for (int c = 0; c < 7; c++)
            test_attention(cases[c][0] ? mma8 : mma16, cases[c][1], cases[c][2], cases[c][3]);
        test_attention_prefill(mma16, 128, 32, 8);
        test_attention_prefill(mma8, 64, 16, 2);
        s_attn_tag = "";
    }
    if (mma16)
        mma16->destroy(&mma16);
    if (mma8)
        mma8->destroy(&mma8);
    /* the FMA decode kernel's partials of each kind */
    setenv("ANVIL_CUDA_ATTN_MMA", "0", 1);
    s_attn_tag = " (fma)";
    test_attention_parts(ENG_DTYPE_BF16, 128, 32, 8);
    test_attention_parts(ENG_DTYPE_F8E4M3, 64, 16, 2);
    s_attn_tag = "";
    unsetenv("ANVIL_CUDA_ATTN_MMA");
    test_elementwise();
    test_linears();
    test_linears_gemv8();
    test_linear_segs();
    test_skinny();
    test_twins(ENG_DTYPE_BF16, 16);
    test_twins(ENG_DTYPE_F16, 16);
    test_twins(ENG_DTYPE_BF16, 8);
    test_twin_only(ENG_DTYPE_BF16, 16);
    test_twin_only(ENG_DTYPE_F16, 16);
    test_gu_low(ENG_DTYPE_BF16, 16, 1);
    test_gu_low(ENG_DTYPE_BF16, 64, 0);
    test_gu_low(ENG_DTYPE_F16, 33, 1);
    test_softmax_sample(gpu, "blocks a row by batch (the default)");
    s_sample_timing(gpu, "blocks a row by batch (the default)");
    /* each sampler fixed (ANVIL_CUDA_SAMPLE_BLOCKS=1 / 8), and the default without its
       candidate list (ANVIL_CUDA_SAMPLE_LIST=0, every pass over the row), must draw exactly
       what the host does; their timings are the A/B */
    static const char *const fixed[3][3] = {
        {"ANVIL_CUDA_SAMPLE_BLOCKS", "1", "one block a row"},
        {"ANVIL_CUDA_SAMPLE_BLOCKS", "8", "a cluster of 8 blocks a row"},
        {"ANVIL_CUDA_SAMPLE_LIST", "0", "blocks a row by batch, no candidate list"}};
    for (int f = 0; f < 3; f++) {
        setenv(fixed[f][0], fixed[f][1], 1);
        eng_backend_t *gpuc = eng_backend_new("cuda", 0);
        unsetenv(fixed[f][0]);
        ecu_t_check(gpuc != NULL, "a backend with a fixed sampler");
        if (gpuc) {
            test_softmax_sample(gpuc, fixed[f][2]);
            s_sample_timing(gpuc, fixed[f][2]);
            gpuc->destroy(&gpuc);
        }
    }
    /* last: it builds backends with the A/B decode variants (KV heads inner, V with K), so a
       fault there cannot hide the default path's results above */
    test_attention_decodes(ENG_DTYPE_BF16);
    test_attention_decodes(ENG_DTYPE_F8E4M3);
    size_t fr = 0, tot = 0;
    ecu_t_check(gpu->mem_info(gpu, &fr, &tot) == 0 && fr > 0 && fr <= tot, "mem_info");
    gpu32->destroy(&gpu32);
    gpu8->destroy(&gpu8);
    gpu->destroy(&gpu);
    cpu->destroy(&cpu);
    return ecu_t_done("test_cuda_ops");
}

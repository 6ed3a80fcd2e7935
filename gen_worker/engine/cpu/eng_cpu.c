/*  eng_cpu.c - the CPU reference backend: every op of eng_ops.h as plain loops in fp32.

    This is the oracle the CUDA backend is tested against, so it favours clarity over speed:
    weights are widened to fp32 one row at a time, dot products use eight independent fp32
    partial sums (which the compiler vectorises, and which keep the rounding close to a BLAS
    sgemm), softmax maxima are subtracted before exp and normalisers summed in double.
    Parallel loops (matmul output rows, attention (token, head) pairs) run on eng_cpu_pool;
    each worker has its own scratch row, so no op takes a lock. KV pools are fp32.
*/
#include "eng_cpu.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "anv_error.h"
#include "anv_log.h"
#include "eng_cpu_pool.h"
#include "eng_sampler.h"

typedef struct {
    eng_cpu_pool_t *pool;
    float **scratch;  /* per thread */
    size_t scratch_n; /* floats per scratch row */
    eng_sampler_t *sampler; /* `sample`: made on first use for the vocabulary it sees */
    int sampler_vocab;
} s_cpu_t;

static s_cpu_t *s_state(eng_backend_t *be)
{
    return be->state;
}

/* Makes sure every thread has a scratch row of at least n floats. */
static int s_scratch(s_cpu_t *st, size_t n)
{
    if (n <= st->scratch_n)
        return 0;
    int nt = eng_cpu_pool_size(st->pool);
    for (int i = 0; i < nt; i++) {
        float *p = realloc(st->scratch[i], n * sizeof(float));
        if (!p)
            return -ENOMEM;
        st->scratch[i] = p;
    }
    st->scratch_n = n;
    return 0;
}

float eng_cpu_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(mant & 0x400)) {
                mant <<= 1;
                exp--;
            }
            mant &= 0x3ff;
            bits = sign | (exp << 23) | (mant << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline float s_bf16(uint16_t v)
{
    uint32_t bits = (uint32_t)v << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

void eng_cpu_widen(float *dst, const void *src, eng_dtype_t dtype, size_t offset, size_t n)
{
    switch (dtype) {
    case ENG_DTYPE_F32:
        memcpy(dst, (const float *)src + offset, n * sizeof(float));
        break;
    case ENG_DTYPE_BF16: {
        const uint16_t *s = (const uint16_t *)src + offset;
        for (size_t i = 0; i < n; i++)
            dst[i] = s_bf16(s[i]);
        break;
    }
    case ENG_DTYPE_F16: {
        const uint16_t *s = (const uint16_t *)src + offset;
        for (size_t i = 0; i < n; i++)
            dst[i] = eng_cpu_f16_to_f32(s[i]);
        break;
    }
    case ENG_DTYPE_F8E4M3: {
        const uint8_t *s = (const uint8_t *)src + offset;
        for (size_t i = 0; i < n; i++)
            dst[i] = eng_f8e4m3_to_f32(s[i]);
        break;
    }
    }
}

static inline float s_dot(const float *a, const float *b, int n)
{
    float acc[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            acc[j] += a[i + j] * b[i + j];
    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* dot(a, widen(w)) for a bf16 row, without a widened copy (decode steps, few rows) */
static inline float s_dot_bf16(const float *a, const uint16_t *w, int n)
{
    float acc[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            acc[j] += a[i + j] * s_bf16(w[i + j]);
    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < n; i++)
        s += a[i] * s_bf16(w[i]);
    return s;
}

/* --- memory ------------------------------------------------------------------------------ */

static void *s_alloc(eng_backend_t *be, size_t bytes)
{
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p)
        ANV_ERROR("cpu backend: cannot allocate %zu bytes", bytes);
    return p;
}

static void s_free(eng_backend_t *be, void *ptr)
{
    free(ptr);
}

static void *s_weight(eng_backend_t *be, const void *host, size_t bytes)
{
    return (void *)host;
}

static void s_weight_release(eng_backend_t *be, void *ptr)
{
}

static int s_weight_into(eng_backend_t *be, void *dst, const void *host, size_t bytes)
{
    if (!dst || !host)
        return -EINVAL;
    memcpy(dst, host, bytes);
    return 0;
}

static int s_copy(eng_backend_t *be, void *dst, const void *src, size_t bytes)
{
    if (!dst || !src)
        return -EINVAL;
    memcpy(dst, src, bytes);
    return 0;
}

static int s_sync(eng_backend_t *be)
{
    return 0;
}

/* --- ops --------------------------------------------------------------------------------- */

static int s_embedding(eng_backend_t *be,
                       float *out,
                       const void *table,
                       eng_dtype_t dtype,
                       const int32_t *ids,
                       int n_tok,
                       int dim)
{
    for (int t = 0; t < n_tok; t++)
        eng_cpu_widen(out + (size_t)t * dim, table, dtype, (size_t)ids[t] * dim, (size_t)dim);
    return 0;
}

static void s_norm_row(float *out, const float *x, const float *w, int dim, float eps)
{
    double ss = 0;
    for (int i = 0; i < dim; i++)
        ss += (double)x[i] * x[i];
    /* HF: hidden * torch.rsqrt(variance + eps) with variance the fp32 mean */
    float inv = 1.0f / sqrtf((float)(ss / dim) + eps);
    for (int i = 0; i < dim; i++)
        out[i] = w[i] * (x[i] * inv);
}

static int s_rmsnorm(eng_backend_t *be,
                     float *out,
                     const float *x,
                     const void *w,
                     eng_dtype_t dtype,
                     int n,
                     int dim,
                     float eps)
{
    s_cpu_t *st = s_state(be);
    if (s_scratch(st, (size_t)dim))
        return -ENOMEM;
    float *wf = st->scratch[0];
    eng_cpu_widen(wf, w, dtype, 0, (size_t)dim);
    for (int r = 0; r < n; r++)
        s_norm_row(out + (size_t)r * dim, x + (size_t)r * dim, wf, dim, eps);
    return 0;
}

static int s_add_rmsnorm(eng_backend_t *be,
                         float *out,
                         float *residual,
                         const float *delta,
                         const void *w,
                         eng_dtype_t dtype,
                         int n,
                         int dim,
                         float eps)
{
    for (size_t i = 0; i < (size_t)n * dim; i++)
        residual[i] += delta[i];
    return s_rmsnorm(be, out, residual, w, dtype, n, dim, eps);
}

typedef struct {
    s_cpu_t *st;
    float *out;
    const float *x;
    const void *w, *bias;
    eng_dtype_t dtype;
    int n, in_dim, out_dim;
} s_matmul_job_t;

/* The hot loops are also compiled for AVX2 (picked at load time by the CPU's features). No
   FMA: the eight explicit partial sums give bit-identical results at any vector width. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__SANITIZE_ADDRESS__)
#define S_HOT __attribute__((target_clones("avx2", "default")))
#else
#define S_HOT
#endif

S_HOT static void s_matmul_rows(void *varg, int begin, int end, int ti)
{
    s_matmul_job_t *j = varg;
    float *wrow = j->st->scratch[ti];
    if (j->dtype == ENG_DTYPE_BF16 && j->n <= 2) { /* same sums as s_dot on the widened row */
        const uint16_t *w = j->w;
        for (int o = begin; o < end; o++) {
            float b = 0;
            if (j->bias)
                eng_cpu_widen(&b, j->bias, j->dtype, (size_t)o, 1);
            for (int r = 0; r < j->n; r++)
                j->out[(size_t)r * j->out_dim + o] =
                    s_dot_bf16(j->x + (size_t)r * j->in_dim, w + (size_t)o * j->in_dim, j->in_dim) +
                    b;
        }
        return;
    }
    for (int o = begin; o < end; o++) {
        eng_cpu_widen(wrow, j->w, j->dtype, (size_t)o * j->in_dim, (size_t)j->in_dim);
        float b = 0;
        if (j->bias)
            eng_cpu_widen(&b, j->bias, j->dtype, (size_t)o, 1);
        for (int r = 0; r < j->n; r++)
            j->out[(size_t)r * j->out_dim + o] =
                s_dot(j->x + (size_t)r * j->in_dim, wrow, j->in_dim) + b;
    }
}

static int s_matmul(eng_backend_t *be,
                    float *out,
                    const float *x,
                    const void *w,
                    const void *bias,
                    eng_dtype_t dtype,
                    int n,
                    int in_dim,
                    int out_dim)
{
    s_cpu_t *st = s_state(be);
    if (!out || !x || !w || n <= 0 || in_dim <= 0 || out_dim <= 0)
        return -EINVAL;
    if (s_scratch(st, (size_t)in_dim))
        return -ENOMEM;
    s_matmul_job_t j = {st, out, x, w, bias, dtype, n, in_dim, out_dim};
    eng_cpu_pool_run(st->pool, out_dim, s_matmul_rows, &j);
    return 0;
}

static void s_rope_head(float *x, int head_dim, const float *cs, const float *sn)
{
    int half = head_dim / 2;
    for (int i = 0; i < half; i++) {
        float a = x[i], b = x[i + half];
        x[i] = a * cs[i] - b * sn[i];
        x[i + half] = b * cs[i] + a * sn[i];
    }
}

static int s_rope(eng_backend_t *be,
                  float *q,
                  float *k,
                  const int32_t *pos,
                  int n_tok,
                  int n_head,
                  int n_kv_head,
                  int head_dim,
                  float theta)
{
    s_cpu_t *st = s_state(be);
    int half = head_dim / 2;
    if (half <= 0 || s_scratch(st, (size_t)half * 3))
        return -EINVAL;
    float *cs = st->scratch[0], *sn = cs + half, *inv_freq = sn + half;
    for (int i = 0; i < half; i++)
        inv_freq[i] = 1.0f / powf(theta, (float)(2 * i) / (float)head_dim);
    for (int t = 0; t < n_tok; t++) {
        for (int i = 0; i < half; i++) {
            float f = (float)pos[t] * inv_freq[i];
            cs[i] = cosf(f);
            sn[i] = sinf(f);
        }
        for (int h = 0; h < n_head; h++)
            s_rope_head(q + ((size_t)t * n_head + h) * head_dim, head_dim, cs, sn);
        for (int h = 0; h < n_kv_head; h++)
            s_rope_head(k + ((size_t)t * n_kv_head + h) * head_dim, head_dim, cs, sn);
    }
    return 0;
}

static int s_kv_store(eng_backend_t *be,
                      void *k_cache,
                      void *v_cache,
                      const float *k,
                      const float *v,
                      const int32_t *slots,
                      int n_tok,
                      int n_kv_head,
                      int head_dim)
{
    size_t row = (size_t)n_kv_head * head_dim;
    for (int t = 0; t < n_tok; t++) {
        memcpy((float *)k_cache + (size_t)slots[t] * row, k + t * row, row * sizeof(float));
        memcpy((float *)v_cache + (size_t)slots[t] * row, v + t * row, row * sizeof(float));
    }
    return 0;
}

typedef struct {
    s_cpu_t *st;
    float *out;
    const float *q;
    const float *kc, *vc;
    const eng_attn_batch_t *b;
    const int32_t *tok_seq; /* (n_tok) sequence of each query token */
    int n_head, n_kv_head, head_dim, block_size;
} s_attn_job_t;

S_HOT static void s_attn_items(void *varg, int begin, int end, int ti)
{
    s_attn_job_t *j = varg;
    const eng_attn_batch_t *b = j->b;
    float *scores = j->st->scratch[ti];
    int group = j->n_head / j->n_kv_head, hd = j->head_dim;
    size_t kv_row = (size_t)j->n_kv_head * hd;
    float scale = 1.0f / sqrtf((float)hd);
    for (int item = begin; item < end; item++) {
        int t = item / j->n_head, h = item % j->n_head, kvh = h / group;
        int s = j->tok_seq[t];
        int n_q = b->q_start[s + 1] - b->q_start[s];
        int p = b->ctx_len[s] - n_q + (t - b->q_start[s]); /* position of this query */
        const int32_t *table = b->block_tables + (size_t)s * b->max_blocks;
        const float *qv = j->q + ((size_t)t * j->n_head + h) * hd;
        float mx = -INFINITY;
        for (int c = 0; c <= p; c++) {
            size_t slot = (size_t)table[c / j->block_size] * j->block_size + c % j->block_size;
            scores[c] = s_dot(qv, j->kc + slot * kv_row + (size_t)kvh * hd, hd) * scale;
            if (scores[c] > mx)
                mx = scores[c];
        }
        double sum = 0;
        for (int c = 0; c <= p; c++) {
            scores[c] = expf(scores[c] - mx);
            sum += scores[c];
        }
        float inv = (float)(1.0 / sum);
        float *o = j->out + ((size_t)t * j->n_head + h) * hd;
        memset(o, 0, (size_t)hd * sizeof(float));
        for (int c = 0; c <= p; c++) {
            size_t slot = (size_t)table[c / j->block_size] * j->block_size + c % j->block_size;
            const float *vv = j->vc + slot * kv_row + (size_t)kvh * hd;
            float wgt = scores[c] * inv;
            for (int i = 0; i < hd; i++)
                o[i] += wgt * vv[i];
        }
    }
}

static int s_attention(eng_backend_t *be,
                       float *out,
                       const float *q,
                       const void *k_cache,
                       const void *v_cache,
                       const eng_attn_batch_t *batch,
                       int n_head,
                       int n_kv_head,
                       int head_dim,
                       int block_size)
{
    s_cpu_t *st = s_state(be);
    int n_tok = batch->q_start[batch->n_seq];
    int max_ctx = 0;
    for (int s = 0; s < batch->n_seq; s++)
        if (batch->ctx_len[s] > max_ctx)
            max_ctx = batch->ctx_len[s];
    if (n_tok <= 0 || n_head % n_kv_head)
        return -EINVAL;
    if (s_scratch(st, (size_t)max_ctx + 1))
        return -ENOMEM;
    int32_t *tok_seq = malloc((size_t)n_tok * sizeof(int32_t));
    if (!tok_seq)
        return -ENOMEM;
    for (int s = 0; s < batch->n_seq; s++)
        for (int t = batch->q_start[s]; t < batch->q_start[s + 1]; t++)
            tok_seq[t] = s;
    s_attn_job_t j = {st,      out,    q,         k_cache,  v_cache,   batch,
                      tok_seq, n_head, n_kv_head, head_dim, block_size};
    eng_cpu_pool_run(st->pool, n_tok * n_head, s_attn_items, &j);
    free(tok_seq);
    return 0;
}

static int s_copy_block(eng_backend_t *be,
                        void *k_cache,
                        void *v_cache,
                        int src,
                        int dst,
                        int block_size,
                        int n_kv_head,
                        int head_dim)
{
    size_t blk = (size_t)block_size * n_kv_head * head_dim;
    memcpy((float *)k_cache + (size_t)dst * blk, (float *)k_cache + (size_t)src * blk,
           blk * sizeof(float));
    memcpy((float *)v_cache + (size_t)dst * blk, (float *)v_cache + (size_t)src * blk,
           blk * sizeof(float));
    return 0;
}

static int
s_swiglu(eng_backend_t *be, float *out, const float *gate, const float *up, int n, int ffn)
{
    for (size_t i = 0; i < (size_t)n * ffn; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
    return 0;
}

/* rope_kv_store as the composition of the ops above on contiguous copies: q to q_out, k and
   v to scratch, rope, kv_store (the reference the CUDA fused kernel is held to). */
static int s_rope_kv_store(eng_backend_t *be, float *q_out, const float *qkv, void *k_cache,
                           void *v_cache, const int32_t *pos, const int32_t *slots, int n_tok,
                           int n_head, int n_kv_head, int head_dim, float theta)
{
    size_t Q = (size_t)n_head * head_dim, KV = (size_t)n_kv_head * head_dim, row = Q + 2 * KV;
    float *k = malloc((size_t)n_tok * KV * sizeof(float) * 2);
    if (!k)
        return -ENOMEM;
    float *v = k + (size_t)n_tok * KV;
    for (int t = 0; t < n_tok; t++) {
        const float *r = qkv + (size_t)t * row;
        memcpy(q_out + (size_t)t * Q, r, Q * sizeof(float));
        memcpy(k + (size_t)t * KV, r + Q, KV * sizeof(float));
        memcpy(v + (size_t)t * KV, r + Q + KV, KV * sizeof(float));
    }
    int rc = s_rope(be, q_out, k, pos, n_tok, n_head, n_kv_head, head_dim, theta);
    if (!rc)
        rc = s_kv_store(be, k_cache, v_cache, k, v, slots, n_tok, n_kv_head, head_dim);
    free(k);
    return rc;
}

static int s_swiglu_fused(eng_backend_t *be, float *out, const float *gu, int n, int ffn)
{
    for (int r = 0; r < n; r++) {
        const float *g = gu + (size_t)r * 2 * ffn, *u = g + ffn;
        float *o = out + (size_t)r * ffn;
        for (int i = 0; i < ffn; i++)
            o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
    return 0;
}

/* linear as the composition of the ops above (the reference the CUDA fused kernels are held
   to): rmsnorm into scratch, matmul into scratch, then the epilogue's own op. */
static int s_linear(eng_backend_t *be, float *out, const float *x, const void *w,
                    const void *bias, eng_dtype_t dtype, int n, int in_dim, int out_dim,
                    const eng_linear_t *f)
{
    if (!out || !x || !w || !f || out == x || n <= 0 || in_dim <= 0 || out_dim <= 0)
        return -EINVAL;
    if (f->epi == ENG_LIN_SWIGLU && out_dim % 2)
        return -EINVAL;
    /* PLAIN: the product goes straight to out */
    float *xn = NULL,
          *y = f->epi == ENG_LIN_PLAIN ? out : malloc((size_t)n * out_dim * sizeof(float));
    int rc = y ? 0 : -ENOMEM;
    const float *xin = x;
    if (rc == 0 && f->norm_w) {
        xn = malloc((size_t)n * in_dim * sizeof(float));
        rc = xn ? s_rmsnorm(be, xn, x, f->norm_w, f->norm_dtype, n, in_dim, f->eps) : -ENOMEM;
        xin = xn;
    }
    if (rc == 0)
        rc = s_matmul(be, y, xin, w, bias, dtype, n, in_dim, out_dim);
    if (rc == 0) {
        switch (f->epi) {
        case ENG_LIN_PLAIN:
            break;
        case ENG_LIN_ADD:
            for (size_t i = 0; i < (size_t)n * out_dim; i++)
                out[i] += y[i];
            break;
        case ENG_LIN_SWIGLU:
            rc = s_swiglu_fused(be, out, y, n, out_dim / 2);
            break;
        case ENG_LIN_ROPE_KV:
            if (out_dim != (f->n_head + 2 * f->n_kv_head) * f->head_dim)
                rc = -EINVAL;
            else
                rc = s_rope_kv_store(be, out, y, f->k_cache, f->v_cache, f->pos, f->slots, n,
                                     f->n_head, f->n_kv_head, f->head_dim, f->theta);
            break;
        default:
            rc = -EINVAL;
        }
    }
    free(xn);
    if (y != out)
        free(y);
    return rc;
}

static int s_gather_rows(
    eng_backend_t *be, float *out, const float *x, const int32_t *rows, int n_rows, int dim)
{
    for (int r = 0; r < n_rows; r++)
        memmove(out + (size_t)r * dim, x + (size_t)rows[r] * dim, (size_t)dim * sizeof(float));
    return 0;
}

static int s_log_softmax(eng_backend_t *be, float *out, const float *logits, int n, int vocab)
{
    for (int r = 0; r < n; r++) {
        const float *l = logits + (size_t)r * vocab;
        float *o = out + (size_t)r * vocab;
        float mx = -INFINITY;
        for (int i = 0; i < vocab; i++)
            if (l[i] > mx)
                mx = l[i];
        double sum = 0;
        for (int i = 0; i < vocab; i++)
            sum += exp((double)(l[i] - mx));
        float lse = mx + (float)log(sum);
        for (int i = 0; i < vocab; i++)
            o[i] = l[i] - lse;
    }
    return 0;
}

/* The host sampler is the definition of `sample` (eng_sampler.h): the CUDA kernel draws the
   same tokens from the same logits. */
static int s_sample(eng_backend_t *be, int32_t *tokens, float *logprobs, const float *logits,
                    int n, int vocab, const eng_sample_params_t *params)
{
    s_cpu_t *st = s_state(be);
    if (!tokens || !logprobs || !logits || !params || n < 0 || vocab <= 0)
        return -EINVAL;
    if (st->sampler && st->sampler_vocab != vocab)
        eng_sampler_destroy(&st->sampler);
    if (!st->sampler) {
        if (!(st->sampler = eng_sampler_new(vocab)))
            return -ENOMEM;
        st->sampler_vocab = vocab;
    }
    for (int r = 0; r < n; r++) {
        const eng_sample_params_t *q = &params[r];
        eng_sampling_t sp = {q->temperature, q->top_k, q->top_p, q->min_p, 0};
        int rc = eng_sampler_sample(st->sampler, logits + (size_t)r * vocab, &sp, q->seed, q->step,
                                    &tokens[r], &logprobs[r], NULL);
        if (rc)
            return rc;
    }
    return 0;
}

static void s_destroy(eng_backend_t **be_p)
{
    if (!be_p || !*be_p)
        return;
    eng_backend_t *be = *be_p;
    s_cpu_t *st = be->state;
    if (st) {
        if (st->scratch) {
            for (int i = 0; i < eng_cpu_pool_size(st->pool); i++)
                free(st->scratch[i]);
            free(st->scratch);
        }
        eng_cpu_pool_destroy(&st->pool);
        eng_sampler_destroy(&st->sampler);
        free(st);
    }
    free(be);
    *be_p = NULL;
}

eng_backend_t *eng_cpu_backend_new(int n_threads)
{
    eng_backend_t *be = calloc(1, sizeof(*be));
    s_cpu_t *st = calloc(1, sizeof(*st));
    if (!be || !st) {
        free(be);
        free(st);
        return NULL;
    }
    be->state = st;
    be->destroy = s_destroy;
    st->pool = eng_cpu_pool_new(n_threads);
    if (!st->pool)
        goto fail;
    st->scratch = calloc((size_t)eng_cpu_pool_size(st->pool), sizeof(float *));
    if (!st->scratch)
        goto fail;
    be->name = "cpu";
    be->kv_dtype = ENG_DTYPE_F32;
    be->alloc = s_alloc;
    be->free = s_free;
    be->weight = s_weight;
    be->weight_release = s_weight_release;
    be->weight_into = s_weight_into;
    be->upload = s_copy;
    be->download = s_copy;
    be->sync = s_sync;
    be->embedding = s_embedding;
    be->rmsnorm = s_rmsnorm;
    be->add_rmsnorm = s_add_rmsnorm;
    be->matmul = s_matmul;
    be->rope = s_rope;
    be->kv_store = s_kv_store;
    be->attention = s_attention;
    be->copy_block = s_copy_block;
    be->swiglu = s_swiglu;
    be->gather_rows = s_gather_rows;
    be->log_softmax = s_log_softmax;
    be->sample = s_sample;
    be->rope_kv_store = s_rope_kv_store;
    be->swiglu_fused = s_swiglu_fused;
    be->linear = s_linear;
    return be;
fail:
    s_destroy(&be);
    return NULL;
}

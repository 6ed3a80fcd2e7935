/*  eng_ops.c - dtype helpers and the backend factory of eng_ops.h.

    The factory is the only place that knows the list of backends; "cuda" exists only when the
    engine is built with ANVIL_CUDA (ENG_HAVE_CUDA), otherwise it is refused by name. The graph
    helpers pad a decode step to a bucket so that a backend's graph_step sees few shapes.
*/
#include "eng_ops.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "anv_log.h"
#include "cpu/eng_cpu.h"
#ifdef ENG_HAVE_CUDA
#include "cuda/eng_cuda.h"
#endif

size_t eng_dtype_size(eng_dtype_t dtype)
{
    switch (dtype) {
    case ENG_DTYPE_F32:
        return 4;
    case ENG_DTYPE_F16:
    case ENG_DTYPE_BF16:
        return 2;
    case ENG_DTYPE_F8E4M3:
        return 1;
    }
    return 0;
}

const char *eng_dtype_name(eng_dtype_t dtype)
{
    switch (dtype) {
    case ENG_DTYPE_F32:
        return "F32";
    case ENG_DTYPE_F16:
        return "F16";
    case ENG_DTYPE_BF16:
        return "BF16";
    case ENG_DTYPE_F8E4M3:
        return "F8E4M3";
    }
    return "?";
}

/* E4M3: 1 sign, 4 exponent (bias 7), 3 mantissa bits; exponent 0 is subnormal (m / 8 * 2^-6);
   S.1111.111 is NaN, so the largest finite value is 1.75 * 2^8 = 448. */
float eng_f8e4m3_to_f32(uint8_t b)
{
    int sign = b >> 7, e = (b >> 3) & 15, m = b & 7;
    float v;
    if (e == 15 && m == 7)
        return NAN;
    if (e == 0)
        v = ldexpf((float)m, -9); /* m / 8 * 2^-6 */
    else
        v = ldexpf(1.0f + (float)m / 8.0f, e - 7);
    return sign ? -v : v;
}

uint8_t eng_f32_to_f8e4m3(float v)
{
    if (isnan(v))
        return 0x7f;
    uint8_t sign = signbit(v) ? 0x80 : 0;
    float a = fabsf(v);
    if (a >= 448.0f) /* saturating (the largest finite value; infinities too) */
        return sign | 0x7e;
    /* the quantum of a's binade [2^k, 2^(k+1)) is 2^(k-3), and 2^-9 below 2^-6 (subnormals);
       rintf rounds to nearest even, exactly: a / quantum has few significant bits */
    int k = a >= 0x1p-6f ? ilogbf(a) : -6;
    float q = ldexpf(rintf(ldexpf(a, 3 - k)), k - 3);
    if (q < 0x1p-6f)
        return sign | (uint8_t)(int)ldexpf(q, 9);
    int e = ilogbf(q); /* k + 1 when rounding carried into the next binade */
    int m = (int)ldexpf(q, 3 - e) - 8;
    return sign | (uint8_t)((e + 7) << 3) | (uint8_t)m;
}

int eng_kv_dtype_parse(const char *name, eng_dtype_t *out)
{
    if (!name || !out)
        return -1;
    if (strcasecmp(name, "bf16") == 0)
        *out = ENG_DTYPE_BF16;
    else if (strcasecmp(name, "f32") == 0 || strcasecmp(name, "fp32") == 0)
        *out = ENG_DTYPE_F32;
    else if (strcasecmp(name, "fp8") == 0 || strcasecmp(name, "f8e4m3") == 0 ||
             strcasecmp(name, "fp8_e4m3") == 0)
        *out = ENG_DTYPE_F8E4M3;
    else
        return -1;
    return 0;
}

eng_backend_t *eng_backend_new_kv(const char *name, int n_threads, const char *kv_dtype)
{
    if (!kv_dtype || !*kv_dtype)
        return eng_backend_new(name, n_threads);
    eng_dtype_t dt;
    if (eng_kv_dtype_parse(kv_dtype, &dt)) {
        ANV_ERROR("'%s' is not a KV dtype (bf16, f32, fp8)", kv_dtype);
        return NULL;
    }
    if (!name || strcmp(name, "cpu") == 0) {
        if (dt != ENG_DTYPE_F32) {
            ANV_ERROR("the cpu backend keeps its KV cache in f32 (asked for %s)", kv_dtype);
            return NULL;
        }
        return eng_cpu_backend_new(n_threads);
    }
#ifdef ENG_HAVE_CUDA
    if (strcmp(name, "cuda") == 0)
        return eng_cuda_backend_new_kv(dt);
#endif
    return eng_backend_new(name, n_threads); /* the same refusal */
}

eng_backend_t *eng_backend_new(const char *name, int n_threads)
{
    if (!name || strcmp(name, "cpu") == 0)
        return eng_cpu_backend_new(n_threads);
#ifdef ENG_HAVE_CUDA
    if (strcmp(name, "cuda") == 0) {
        /* the KV dtype from the environment, bf16 by default */
        const char *kv = getenv("ANVIL_CUDA_KV");
        eng_dtype_t dt = ENG_DTYPE_BF16;
        if (kv && *kv && eng_kv_dtype_parse(kv, &dt)) {
            ANV_ERROR("ANVIL_CUDA_KV='%s' is not a kv dtype (bf16, f32, fp8)", kv);
            return NULL;
        }
        return eng_cuda_backend_new_kv(dt);
    }
#endif
    if (strcmp(name, "cuda") == 0)
        ANV_ERROR("backend 'cuda' is not built into this binary (configure with -DANVIL_CUDA=ON)");
    else
        ANV_ERROR("unknown backend '%s' (known: cpu, cuda)", name);
    return NULL;
}

int eng_linear_enabled(const eng_backend_t *be)
{
    const char *e = getenv("ANVIL_ENGINE_LINEAR");
    return be && be->linear && !(e && strcmp(e, "0") == 0);
}

int eng_graph_bucket(int n)
{
    if (n <= 1)
        return 1;
    if (n <= 8) {
        int b = 2;
        while (b < n)
            b *= 2;
        return b;
    }
    if (n <= 256)
        return (n + 15) / 16 * 16;
    return (n + 63) / 64 * 64;
}

int eng_graph_is_decode(const eng_attn_batch_t *b, const int32_t *rows, int n_rows)
{
    if (!b || b->n_seq <= 0 || n_rows != b->n_seq || b->q_start[b->n_seq] != b->n_seq)
        return 0;
    for (int s = 0; s < b->n_seq; s++)
        if (b->q_start[s] != s || rows[s] != s)
            return 0;
    return 1;
}

int eng_graph_pad(eng_graph_pad_t *p, const eng_attn_batch_t *b, const int32_t *ids,
                  const int32_t *pos, const int32_t *slots, int block_size, int32_t pad_block)
{
    const int n = b->n_seq, nb = eng_graph_bucket(n), bs = block_size;
    int need = 1;
    for (int s = 0; s < n; s++) {
        int k = (b->ctx_len[s] + bs - 1) / bs;
        need = k > need ? k : need;
    }
    /* multiples of 8 blocks: a graph per 8 * block_size positions of context, so that the
       fixed-size attention plan launches few empty split tiles */
    int stride = (need + 7) / 8 * 8;
    /* ids | pos | slots | rows | q_start | ctx | tables */
    size_t words = (size_t)4 * nb + (nb + 1) + nb + (size_t)nb * stride;
    if (words > p->cap) {
        int32_t *v = realloc(p->buf, words * sizeof(int32_t));
        if (!v)
            return -ENOMEM;
        p->buf = v;
        p->cap = words;
    }
    int32_t *g_ids = p->buf, *g_pos = g_ids + nb, *g_slots = g_pos + nb, *g_rows = g_slots + nb;
    int32_t *g_qs = g_rows + nb, *g_ctx = g_qs + nb + 1, *g_tab = g_ctx + nb;
    for (int s = 0; s < nb; s++) {
        int real = s < n;
        g_ids[s] = real ? ids[s] : 0;
        g_pos[s] = real ? pos[s] : 0;
        g_slots[s] = real ? slots[s] : pad_block * bs;
        g_rows[s] = s;
        g_qs[s] = s;
        g_ctx[s] = real ? b->ctx_len[s] : 1;
        int32_t *row = g_tab + (size_t)s * stride;
        int copy = real ? (b->max_blocks < stride ? b->max_blocks : stride) : 0;
        if (copy)
            memcpy(row, b->block_tables + (size_t)s * b->max_blocks,
                   (size_t)copy * sizeof(int32_t));
        for (int k = copy; k < stride; k++)
            row[k] = pad_block;
    }
    g_qs[nb] = nb;
    p->batch = (eng_attn_batch_t){nb, g_qs, g_ctx, g_tab, stride};
    p->step = (eng_step_t){nb, g_ids, g_pos, g_slots, &p->batch, nb, g_rows};
    p->ids = g_ids, p->pos = g_pos, p->slots = g_slots, p->rows = g_rows;
    return 0;
}

void eng_graph_pad_release(eng_graph_pad_t *p)
{
    free(p->buf);
    memset(p, 0, sizeof(*p));
}

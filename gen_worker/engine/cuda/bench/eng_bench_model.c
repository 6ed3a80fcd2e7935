/*  eng_bench_model.c - a Llama forward pass over any eng_backend_t (see eng_bench_model.h).

    Layout: per layer one stacked wqkv ((n_head + 2 n_kv_head) * head_dim, hidden), wo,
    one stacked w_gu (2 ffn, hidden) and w_down; KV pools per layer from be->alloc. The
    residual stream x is fp32; h is the normalised input of the next matmul; the fused
    residual add + norm closes each half-layer. The unfused path multiplies by row slices of
    the stacked weights, so both paths read the same numbers. A fused model on a backend
    with `linear` (eng_linear_enabled) runs four fused matmuls a layer instead (s_ops_linear).

    Graph decode (eng_bm_set_graphs): an all-decode step is padded to a batch bucket
    (eng_bm_bucket) with dummy sequences that read and write only the pad block (one block
    past the caller's n_blocks, never handed out), its block tables are copied into a fixed
    stride (the blocks the longest sequence needs, rounded up to a multiple of 8), and the op
    sequence runs through the backend's graph_step; activations are sized for the largest
    bucket at creation, so every pointer the captured ops use is fixed for the model's life.
*/
#include "eng_bench_model.h"
#include "eng_sample_hash.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "anv_error.h"
#include "anv_log.h"

typedef struct {
    void *attn_norm, *wqkv, *wo, *mlp_norm, *w_gu, *w_down; /* backend memory */
    void *k_cache, *v_cache;
} s_layer_t;

struct eng_bm {
    eng_backend_t *be;
    eng_bm_config_t c;
    int fused, linear, max_tok, max_rows, n_blocks; /* linear: s_ops_linear */
    int graphs;                 /* decode steps through be->graph_step */
    long long graph_steps;      /* steps that went through graph_step */
    eng_graph_pad_t pad;        /* padded host arrays of a graph step */
    void *embed, *final_norm, *lm_head;
    s_layer_t *layers;
    float *x, *h, *qkv, *q, *k, *v, *att, *delta, *gu, *up, *act, *hl, *logits;
    size_t weight_bytes, embed_bytes; /* embed_bytes: the table, of which a step reads rows */
};

#define s_mix eng_sample_mix /* splitmix64 finaliser */

static uint16_t s_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fff + ((u >> 16) & 1); /* round to nearest even (finite values) */
    return (uint16_t)(u >> 16);
}

static uint16_t s_to_f16(float f)
{
    /* values here are small and normal: plain rounding of the mantissa is enough */
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000;
    int exp = (int)((u >> 23) & 0xff) - 127 + 15;
    uint32_t mant = u & 0x7fffff;
    if (exp <= 0)
        return (uint16_t)sign;
    uint32_t h = sign | ((uint32_t)exp << 10) | (mant >> 13);
    if ((mant & 0x1fff) > 0x1000 || ((mant & 0x1fff) == 0x1000 && (h & 1)))
        h++;
    return (uint16_t)h;
}

int eng_bm_fill_host(eng_backend_t *be, void *dst, eng_dtype_t dtype, size_t n, uint64_t seed,
                     float center, float scale)
{
    size_t es = eng_dtype_size(dtype);
    if (!es || !dst)
        return -EINVAL;
    void *buf = malloc(n * es);
    if (!buf)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        uint64_t hsh = s_mix(seed * 0x9e3779b97f4a7c15ull + i);
        float u = (float)(hsh >> 40) * (1.0f / 16777216.0f);
        float v = center + scale * (2.0f * u - 1.0f);
        if (dtype == ENG_DTYPE_F32)
            ((float *)buf)[i] = v;
        else if (dtype == ENG_DTYPE_BF16)
            ((uint16_t *)buf)[i] = s_to_bf16(v);
        else if (dtype == ENG_DTYPE_F8E4M3)
            ((uint8_t *)buf)[i] = eng_f32_to_f8e4m3(v);
        else
            ((uint16_t *)buf)[i] = s_to_f16(v);
    }
    int rc = be->upload(be, dst, buf, n * es);
    if (rc == 0)
        rc = be->sync(be);
    free(buf);
    return rc;
}

static void *s_walloc(eng_bm_t *m, size_t n, eng_bm_fill_fn fill, uint64_t seed, float center,
                      float scale, int *rc)
{
    size_t bytes = n * eng_dtype_size(m->c.wdtype);
    void *p = m->be->alloc(m->be, bytes);
    if (!p) {
        *rc = -ENOMEM;
        return NULL;
    }
    m->weight_bytes += bytes;
    if (fill) {
        int r = fill(m->be, p, m->c.wdtype, n, seed, center, scale);
        if (r)
            *rc = r;
    }
    return p;
}

static float *s_falloc(eng_bm_t *m, size_t n, int *rc)
{
    float *p = m->be->alloc(m->be, n * sizeof(float));
    if (!p)
        *rc = -ENOMEM;
    return p;
}

eng_bm_t *eng_bm_new(eng_backend_t *be, const eng_bm_config_t *cfg, int n_blocks, int max_tok,
                     int max_rows, eng_bm_fill_fn fill, uint64_t seed, int fused)
{
    eng_bm_t *m = calloc(1, sizeof(*m));
    if (!m)
        return NULL;
    int rc = 0;
    m->be = be;
    m->c = *cfg;
    m->fused = fused;
    m->linear = fused && eng_linear_enabled(be);
    /* room for a padded graph step of the largest batch */
    if (eng_bm_bucket(max_tok) > max_tok)
        max_tok = eng_bm_bucket(max_tok);
    if (eng_bm_bucket(max_rows) > max_rows)
        max_rows = eng_bm_bucket(max_rows);
    m->max_tok = max_tok;
    m->max_rows = max_rows;
    m->n_blocks = n_blocks;
    const eng_bm_config_t *c = cfg;
    size_t H = c->hidden, qd = (size_t)c->n_head * c->head_dim, kd = (size_t)c->n_kv_head * c->head_dim;
    size_t qkv = qd + 2 * kd;
    float s_in = 1.7320508f / sqrtf((float)H); /* uniform with variance 1 / fan_in */
    m->layers = calloc((size_t)c->n_layer, sizeof(s_layer_t));
    if (!m->layers)
        goto fail;
    uint64_t sd = seed * 1000;
    m->embed = s_walloc(m, (size_t)c->vocab * H, fill, sd++, 0.0f, 1.0f, &rc);
    m->embed_bytes = m->weight_bytes;
    for (int l = 0; l < c->n_layer && rc == 0; l++) {
        s_layer_t *L = &m->layers[l];
        L->attn_norm = s_walloc(m, H, fill, sd++, 1.0f, 0.1f, &rc);
        L->wqkv = s_walloc(m, qkv * H, fill, sd++, 0.0f, s_in, &rc);
        L->wo = s_walloc(m, H * qd, fill, sd++, 0.0f, 1.7320508f / sqrtf((float)qd), &rc);
        L->mlp_norm = s_walloc(m, H, fill, sd++, 1.0f, 0.1f, &rc);
        L->w_gu = s_walloc(m, 2 * (size_t)c->ffn * H, fill, sd++, 0.0f, s_in, &rc);
        L->w_down = s_walloc(m, H * c->ffn, fill, sd++, 0.0f, 1.7320508f / sqrtf((float)c->ffn),
                             &rc);
        /* + 1: the pad block of graph steps */
        size_t pool =
            ((size_t)n_blocks + 1) * c->block_size * kd * eng_dtype_size(be->kv_dtype);
        L->k_cache = be->alloc(be, pool);
        L->v_cache = be->alloc(be, pool);
        if (!L->k_cache || !L->v_cache)
            rc = -ENOMEM;
    }
    if (rc)
        goto fail;
    m->final_norm = s_walloc(m, H, fill, sd++, 1.0f, 0.1f, &rc);
    /* a wider lm_head spreads the logits of a random model (clear argmax margins) */
    m->lm_head = s_walloc(m, (size_t)c->vocab * H, fill, sd++, 0.0f, 4.0f * s_in, &rc);
    m->x = s_falloc(m, max_tok * H, &rc);
    m->h = s_falloc(m, max_tok * H, &rc);
    m->qkv = s_falloc(m, max_tok * qkv, &rc);
    m->q = s_falloc(m, max_tok * qd, &rc);
    m->k = s_falloc(m, max_tok * kd, &rc);
    m->v = s_falloc(m, max_tok * kd, &rc);
    m->att = s_falloc(m, max_tok * qd, &rc);
    m->delta = s_falloc(m, max_tok * H, &rc);
    m->gu = s_falloc(m, max_tok * 2 * (size_t)c->ffn, &rc);
    m->up = s_falloc(m, max_tok * (size_t)c->ffn, &rc);
    m->act = s_falloc(m, max_tok * (size_t)c->ffn, &rc);
    m->hl = s_falloc(m, (size_t)max_rows * H, &rc);
    m->logits = s_falloc(m, (size_t)max_rows * c->vocab, &rc);
    if (rc)
        goto fail;
    if (be->sync(be))
        goto fail;
    return m;
fail:
    ANV_ERROR("bench model: cannot build (%s)", anv_strerror(rc ? rc : ANV_EINTERNAL));
    eng_bm_destroy(&m);
    errno = rc == -ENOMEM ? ENOMEM : EIO; /* the caller tells "does not fit" from a failure */
    return NULL;
}

void eng_bm_destroy(eng_bm_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    eng_bm_t *m = *self_p;
    eng_backend_t *be = m->be;
    be->sync(be);
    if (be->graph_reset)
        be->graph_reset(be); /* the graphs hold this model's pointers */
    eng_graph_pad_release(&m->pad);
    if (m->layers) {
        for (int l = 0; l < m->c.n_layer; l++) {
            s_layer_t *L = &m->layers[l];
            void *ps[] = {L->attn_norm, L->wqkv, L->wo, L->mlp_norm, L->w_gu, L->w_down,
                          L->k_cache, L->v_cache};
            for (size_t i = 0; i < sizeof(ps) / sizeof(ps[0]); i++)
                be->free(be, ps[i]);
        }
        free(m->layers);
    }
    void *ps[] = {m->embed, m->final_norm, m->lm_head, m->x, m->h, m->qkv, m->q, m->k, m->v,
                  m->att, m->delta, m->gu, m->up, m->act, m->hl, m->logits};
    for (size_t i = 0; i < sizeof(ps) / sizeof(ps[0]); i++)
        be->free(be, ps[i]);
    free(m);
    *self_p = NULL;
}

size_t eng_bm_weight_bytes(const eng_bm_t *self)
{
    return self->weight_bytes;
}

size_t eng_bm_step_weight_bytes(const eng_bm_t *self, int n_tok)
{
    return self->weight_bytes - self->embed_bytes +
           (size_t)n_tok * self->c.hidden * eng_dtype_size(self->c.wdtype);
}

size_t eng_bm_kv_bytes_per_token(const eng_bm_t *self)
{
    return (size_t)self->c.n_layer * 2 * self->c.n_kv_head * self->c.head_dim *
           eng_dtype_size(self->be->kv_dtype);
}

int eng_bm_load(eng_bm_t *m, const char *name, const void *host, size_t bytes)
{
    const eng_bm_config_t *c = &m->c;
    size_t es = eng_dtype_size(c->wdtype), H = c->hidden;
    size_t qd = (size_t)c->n_head * c->head_dim, kd = (size_t)c->n_kv_head * c->head_dim;
    void *dst = NULL;
    size_t off = 0, want = 0;
    int l = -1;
    char part[96] = "";
    if (strcmp(name, "model.embed_tokens.weight") == 0)
        dst = m->embed, want = (size_t)c->vocab * H;
    else if (strcmp(name, "model.norm.weight") == 0)
        dst = m->final_norm, want = H;
    else if (strcmp(name, "lm_head.weight") == 0)
        dst = m->lm_head, want = (size_t)c->vocab * H;
    else if (sscanf(name, "model.layers.%d.%95s", &l, part) == 2 && l >= 0 && l < c->n_layer) {
        s_layer_t *L = &m->layers[l];
        if (strcmp(part, "input_layernorm.weight") == 0)
            dst = L->attn_norm, want = H;
        else if (strcmp(part, "post_attention_layernorm.weight") == 0)
            dst = L->mlp_norm, want = H;
        else if (strcmp(part, "self_attn.q_proj.weight") == 0)
            dst = L->wqkv, want = qd * H;
        else if (strcmp(part, "self_attn.k_proj.weight") == 0)
            dst = L->wqkv, off = qd * H, want = kd * H;
        else if (strcmp(part, "self_attn.v_proj.weight") == 0)
            dst = L->wqkv, off = (qd + kd) * H, want = kd * H;
        else if (strcmp(part, "self_attn.o_proj.weight") == 0)
            dst = L->wo, want = H * qd;
        else if (strcmp(part, "mlp.gate_proj.weight") == 0)
            dst = L->w_gu, want = (size_t)c->ffn * H;
        else if (strcmp(part, "mlp.up_proj.weight") == 0)
            dst = L->w_gu, off = (size_t)c->ffn * H, want = (size_t)c->ffn * H;
        else if (strcmp(part, "mlp.down_proj.weight") == 0)
            dst = L->w_down, want = H * c->ffn;
    }
    if (!dst)
        return ANV_ENOTFOUND;
    if (bytes != want * es)
        return ANV_EFORMAT;
    return m->be->upload(m->be, (char *)dst + off * es, host, bytes);
}

int eng_bm_bucket(int n)
{
    return eng_graph_bucket(n);
}

void eng_bm_set_graphs(eng_bm_t *self, int on)
{
    self->graphs = on && self->fused && self->be->graph_step && self->be->prepare;
}

int eng_bm_graphs(const eng_bm_t *self)
{
    return self->graphs;
}

long long eng_bm_graph_steps(const eng_bm_t *self)
{
    return self->graph_steps;
}

int eng_bm_kv_copy(eng_bm_t *m, int src, int dst)
{
    if (src < 0 || dst < 0 || src >= m->n_blocks || dst >= m->n_blocks)
        return -EINVAL;
    for (int l = 0; l < m->c.n_layer; l++) {
        int rc = m->be->copy_block(m->be, m->layers[l].k_cache, m->layers[l].v_cache, src, dst,
                                   m->c.block_size, m->c.n_kv_head, m->c.head_dim);
        if (rc)
            return rc;
    }
    return 0;
}

int eng_bm_kv_fill(eng_bm_t *m, eng_bm_fill_fn fill, uint64_t seed)
{
    size_t n = ((size_t)m->n_blocks + 1) * m->c.block_size * m->c.n_kv_head * m->c.head_dim;
    for (int l = 0; l < m->c.n_layer; l++) {
        int rc = fill(m->be, m->layers[l].k_cache, m->be->kv_dtype, n, seed + 2 * l, 0.0f, 1.0f);
        if (!rc)
            rc = fill(m->be, m->layers[l].v_cache, m->be->kv_dtype, n, seed + 2 * l + 1, 0.0f,
                      1.0f);
        if (rc)
            return rc;
    }
    return 0;
}

#define S_TRY(expr)                                                                                \
    do {                                                                                           \
        rc = (expr);                                                                               \
        if (rc)                                                                                    \
            goto out;                                                                              \
    } while (0)

/* The step through be->linear (fused models, eng_linear_enabled): norms folded into the
   matmuls that read them, rope + KV store into QKV, SwiGLU into gate|up, the residual adds
   into O and down (x updated in place). */
static int s_ops_linear(eng_bm_t *m, const eng_attn_batch_t *batch, const int32_t *ids,
                        const int32_t *pos, const int32_t *slots, const int32_t *rows,
                        int n_rows)
{
    eng_backend_t *be = m->be;
    const eng_bm_config_t *c = &m->c;
    int n = batch->q_start[batch->n_seq], rc = 0;
    int H = c->hidden, qd = c->n_head * c->head_dim, kd = c->n_kv_head * c->head_dim;
    eng_dtype_t wt = c->wdtype;
    eng_linear_t f = {0};
    f.eps = c->eps, f.norm_dtype = wt;
    S_TRY(be->embedding(be, m->x, m->embed, wt, ids, n, H));
    for (int l = 0; l < c->n_layer; l++) {
        s_layer_t *L = &m->layers[l];
        eng_linear_t qkv = f, add = f, gu = f;
        qkv.norm_w = L->attn_norm, qkv.epi = ENG_LIN_ROPE_KV, qkv.k_cache = L->k_cache;
        qkv.v_cache = L->v_cache, qkv.pos = pos, qkv.slots = slots, qkv.n_head = c->n_head;
        qkv.n_kv_head = c->n_kv_head, qkv.head_dim = c->head_dim, qkv.theta = c->rope_theta;
        S_TRY(be->linear(be, m->q, m->x, L->wqkv, NULL, wt, n, H, qd + 2 * kd, &qkv));
        if (be->prefetch) /* as eng_model.c: O's weights into the cache during the attention */
            S_TRY(be->prefetch(be, L->wo, (size_t)qd * H * eng_dtype_size(wt), n));
        S_TRY(be->attention(be, m->att, m->q, L->k_cache, L->v_cache, batch, c->n_head,
                            c->n_kv_head, c->head_dim, c->block_size));
        add.epi = ENG_LIN_ADD;
        add.x_from_prev = 1; /* O reads the attention's out, down the gate|up linear's */
        S_TRY(be->linear(be, m->x, m->att, L->wo, NULL, wt, n, qd, H, &add));
        gu.norm_w = L->mlp_norm, gu.epi = ENG_LIN_SWIGLU;
        gu.out_for_next = 1; /* only down reads act, next, in the same dtype */
        S_TRY(be->linear(be, m->act, m->x, L->w_gu, NULL, wt, n, H, 2 * c->ffn, &gu));
        S_TRY(be->linear(be, m->x, m->act, L->w_down, NULL, wt, n, c->ffn, H, &add));
    }
    eng_linear_t head = f;
    head.norm_w = m->final_norm, head.epi = ENG_LIN_PLAIN;
    S_TRY(be->gather_rows(be, m->hl, m->x, rows, n_rows, H));
    S_TRY(be->linear(be, m->logits, m->hl, m->lm_head, NULL, wt, n_rows, H, c->vocab, &head));
out:
    return rc;
}

/* The op sequence of one step (prepare, when wanted, is the caller's). */
static int s_ops(eng_bm_t *m, const eng_attn_batch_t *batch, const int32_t *ids,
                 const int32_t *pos, const int32_t *slots, const int32_t *rows, int n_rows)
{
    eng_backend_t *be = m->be;
    const eng_bm_config_t *c = &m->c;
    int n = batch->q_start[batch->n_seq], rc = 0;
    size_t H = c->hidden, qd = (size_t)c->n_head * c->head_dim;
    size_t kd = (size_t)c->n_kv_head * c->head_dim, es = eng_dtype_size(c->wdtype);
    int fused = m->fused && be->rope_kv_store && be->swiglu_fused;
    eng_dtype_t wt = c->wdtype;
    S_TRY(be->embedding(be, m->x, m->embed, wt, ids, n, (int)H));
    S_TRY(be->rmsnorm(be, m->h, m->x, m->layers[0].attn_norm, wt, n, (int)H, c->eps));
    for (int l = 0; l < c->n_layer; l++) {
        s_layer_t *L = &m->layers[l];
        if (fused) {
            S_TRY(be->matmul(be, m->qkv, m->h, L->wqkv, NULL, wt, n, (int)H, (int)(qd + 2 * kd)));
            S_TRY(be->rope_kv_store(be, m->q, m->qkv, L->k_cache, L->v_cache, pos, slots, n,
                                    c->n_head, c->n_kv_head, c->head_dim, c->rope_theta));
        } else {
            const char *w = L->wqkv;
            S_TRY(be->matmul(be, m->q, m->h, w, NULL, wt, n, (int)H, (int)qd));
            S_TRY(be->matmul(be, m->k, m->h, w + qd * H * es, NULL, wt, n, (int)H, (int)kd));
            S_TRY(be->matmul(be, m->v, m->h, w + (qd + kd) * H * es, NULL, wt, n, (int)H,
                             (int)kd));
            S_TRY(be->rope(be, m->q, m->k, pos, n, c->n_head, c->n_kv_head, c->head_dim,
                           c->rope_theta));
            S_TRY(be->kv_store(be, L->k_cache, L->v_cache, m->k, m->v, slots, n, c->n_kv_head,
                               c->head_dim));
        }
        S_TRY(be->attention(be, m->att, m->q, L->k_cache, L->v_cache, batch, c->n_head,
                            c->n_kv_head, c->head_dim, c->block_size));
        S_TRY(be->matmul(be, m->delta, m->att, L->wo, NULL, wt, n, (int)qd, (int)H));
        S_TRY(be->add_rmsnorm(be, m->h, m->x, m->delta, L->mlp_norm, wt, n, (int)H, c->eps));
        if (fused) {
            S_TRY(be->matmul(be, m->gu, m->h, L->w_gu, NULL, wt, n, (int)H, 2 * c->ffn));
            S_TRY(be->swiglu_fused(be, m->act, m->gu, n, c->ffn));
        } else {
            const char *w = L->w_gu;
            S_TRY(be->matmul(be, m->gu, m->h, w, NULL, wt, n, (int)H, c->ffn));
            S_TRY(be->matmul(be, m->up, m->h, w + (size_t)c->ffn * H * es, NULL, wt, n, (int)H,
                             c->ffn));
            S_TRY(be->swiglu(be, m->act, m->gu, m->up, n, c->ffn));
        }
        S_TRY(be->matmul(be, m->delta, m->act, L->w_down, NULL, wt, n, c->ffn, (int)H));
        const void *next = l + 1 < c->n_layer ? m->layers[l + 1].attn_norm : m->final_norm;
        S_TRY(be->add_rmsnorm(be, m->h, m->x, m->delta, next, wt, n, (int)H, c->eps));
    }
    S_TRY(be->gather_rows(be, m->hl, m->h, rows, n_rows, (int)H));
    S_TRY(be->matmul(be, m->logits, m->hl, m->lm_head, NULL, wt, n_rows, (int)H, c->vocab));
out:
    return rc;
}

typedef struct {
    eng_bm_t *m;
    const eng_attn_batch_t *batch;
    const int32_t *ids, *pos, *slots, *rows;
    int n_rows;
} s_rec_t;

static int s_record(void *ctx)
{
    s_rec_t *r = ctx;
    if (r->m->linear)
        return s_ops_linear(r->m, r->batch, r->ids, r->pos, r->slots, r->rows, r->n_rows);
    return s_ops(r->m, r->batch, r->ids, r->pos, r->slots, r->rows, r->n_rows);
}

/* A graph step: the decode batch padded to its bucket, the pad block past the pools. */
static int s_forward_graph(eng_bm_t *m, const eng_attn_batch_t *batch, const int32_t *ids,
                           const int32_t *pos, const int32_t *slots)
{
    eng_graph_pad_t *p = &m->pad;
    int rc = eng_graph_pad(p, batch, ids, pos, slots, m->c.block_size, m->n_blocks);
    if (rc)
        return rc;
    s_rec_t rec = {m, &p->batch, p->ids, p->pos, p->slots, p->rows, p->step.n_rows};
    m->graph_steps++;
    return m->be->graph_step(m->be, &p->step, m->c.block_size, 0, s_record, &rec);
}

int eng_bm_forward(eng_bm_t *m, const eng_attn_batch_t *batch, const int32_t *ids,
                   const int32_t *pos, const int32_t *slots, const int32_t *rows, int n_rows,
                   float **logits)
{
    eng_backend_t *be = m->be;
    int n = batch->q_start[batch->n_seq], rc = 0;
    if (n <= 0 || n > m->max_tok || n_rows <= 0 || n_rows > m->max_rows)
        return -EINVAL;
    if (m->graphs && eng_graph_is_decode(batch, rows, n_rows) &&
        eng_graph_bucket(n) <= m->max_tok) {
        S_TRY(s_forward_graph(m, batch, ids, pos, slots));
    } else {
        if (m->fused && be->prepare) {
            eng_step_t st = {n, ids, pos, slots, batch, n_rows, rows};
            S_TRY(be->prepare(be, &st));
        }
        if (m->linear)
            S_TRY(s_ops_linear(m, batch, ids, pos, slots, rows, n_rows));
        else
            S_TRY(s_ops(m, batch, ids, pos, slots, rows, n_rows));
    }
    *logits = m->logits;
out:
    if (rc)
        ANV_ERROR("bench model: step of %d tokens failed: %s", n, anv_strerror(rc));
    return rc;
}

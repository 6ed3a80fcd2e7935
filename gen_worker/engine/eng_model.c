/*  eng_model.c - loading Llama/Qwen2 weights and the decoder forward pass.

    Per layer (HF LlamaDecoderLayer / Qwen2DecoderLayer):
        xn = rmsnorm(x)                         (first layer; later layers get it fused below)
        qkv = xn Wqkv^T (+bqkv)                  (q|k|v weights stacked: one matmul)
        q = rope(q); store rope(k), v in the cache (rope_kv_store); a = attention(q, cache)
        o = a Wo^T;  x += o; xn = rmsnorm(x) w_post        (fused add_rmsnorm)
        m = swiglu(xn Wgu^T) Wd^T                 (gate|up stacked: one matmul, swiglu_fused)
        x += m; xn = rmsnorm(x) w_next_input              (fused, or the final norm)
    then logits = xn[rows] lm_head^T and logprobs = log_softmax(logits).
    A backend with `linear` (eng_linear_enabled) runs the same math as four fused matmuls a
    layer (s_ops_linear): each norm folded into the matmul that reads it, rope + KV store into
    the QKV product, SwiGLU into gate|up, the residual adds into the O and down products.
    The stacked weights are filled tensor by tensor into one backend buffer each (weight_into:
    the staging ring on a GPU, so they load as fast as the others). The weight set is a
    separate struct so that a reload can build a complete new one and swap it in only when
    every tensor checked out. Activation buffers grow to the largest step seen.
    With graphs on (eng_model_set_graphs) and a backend that has graph_step, a decode-only step
    is padded to its bucket (eng_graph_pad; the pad tokens use one private KV block past the
    caller's) and its ops up to the logits run as one replayed graph; the graph key changes
    whenever activations or pools are reallocated. On a backend whose weights are its own
    copies (be->copy set: CUDA), a reload whose checkpoint matches the loaded set buffer for
    buffer (the usual RL update: same shapes and dtypes, new values) is first checked tensor by
    tensor with nothing written, then written straight into the loaded buffers: the weights
    keep their addresses, so the captured graphs stay valid, and no second set is allocated,
    so the KV pool need not leave room for one. Any other reload builds a new set, swaps it in
    and drops every graph (a key's graph costs an eager run, a capture and an instantiation to
    rebuild). A write that fails halfway leaves the weights mixed: the model then refuses to
    run (the gen worker restarts).
*/
#include "eng_model.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "anv_error.h"
#include "anv_log.h"
#include "anv_time.h"
#include "eng_safetensors.h"

#define S_MAX_SHARDS 256
#define S_DIFFERENT  1 /* a reload's tensor does not fit the loaded buffer: not an error */

typedef struct {
    const void *p; /* backend pointer */
    eng_dtype_t dt;
} s_w_t;

typedef struct {
    s_w_t in_norm, post_norm, wqkv, bqkv, wo, wgu, wd; /* qkv, gu: stacked rows */
} s_layer_t;

typedef struct {
    void *p; /* backend memory */
    size_t bytes;
} s_buf_t;

typedef struct s_weights {
    eng_st_file_t *files[S_MAX_SHARDS];
    int n_files;
    s_w_t embed, final_norm, lm_head;
    s_layer_t *layers;
    s_buf_t *handed; /* every pointer the backend's weight() returned, for weight_release */
    int n_handed, cap_handed;
    s_buf_t *stacked; /* the stacked weights' buffers (alloc), for free */
    int n_stacked, cap_stacked, n_tensors;
    size_t bytes;   /* handed to the backend */
    double seconds; /* open + parse + upload, synced */
    /* a reload in place (s_weights_load with `into`): this set's tensors go into the buffers
       of `into`, the k-th handed / stacked one into its k-th; nothing is allocated or kept */
    const struct s_weights *into;
    bool write; /* false: only check that every tensor fits its buffer */
    int k_handed, k_stacked;
} s_weights_t;

struct eng_model {
    eng_model_config_t cfg;
    eng_backend_t *be;
    s_weights_t *w;
    /* KV pools: per layer (n_blocks, block_size, n_kv_heads, head_dim) */
    void **k_pool, **v_pool;
    int n_blocks, block_size;
    /* activations, sized for cap_tok tokens / cap_rows rows */
    int cap_tok, cap_rows;
    int linear; /* matmuls through be->linear (eng_linear_enabled) */
    bool broken; /* a reload in place failed halfway: the weights are mixed, nothing runs */
    /* graph decode */
    int graphs;
    uint64_t graph_key; /* bumped when a buffer the ops use moves */
    eng_graph_pad_t pad;
    float *x, *xn, *qkv, *q, *att, *o, *gu, *gate, *out_rows, *logits;
};

/* --- weights ----------------------------------------------------------------------------- */

static void s_weights_free(eng_backend_t *be, s_weights_t **wp)
{
    s_weights_t *w = *wp;
    if (!w)
        return;
    for (int i = 0; i < w->n_handed; i++)
        be->weight_release(be, w->handed[i].p);
    free(w->handed);
    for (int i = 0; i < w->n_stacked; i++)
        be->free(be, w->stacked[i].p);
    free(w->stacked);
    for (int i = 0; i < w->n_files; i++)
        eng_st_destroy(&w->files[i]);
    free(w->layers);
    free(w);
    *wp = NULL;
}

static const eng_st_tensor_t *s_lookup(s_weights_t *w, const char *name)
{
    for (int i = 0; i < w->n_files; i++) {
        const eng_st_tensor_t *t = eng_st_find(w->files[i], name);
        if (t)
            return t;
    }
    return NULL;
}

/* Finds name and checks its shape (d1 == 0 for a vector). */
static int s_find(s_weights_t *w, const eng_st_tensor_t **out, const char *name, int64_t d0,
                  int64_t d1, char *err, size_t errlen)
{
    const eng_st_tensor_t *t = s_lookup(w, name);
    if (!t) {
        snprintf(err, errlen, "weight '%s' is missing from the checkpoint", name);
        return ANV_EFORMAT;
    }
    int nd = d1 ? 2 : 1;
    if (t->ndim != nd || t->shape[0] != d0 || (nd == 2 && t->shape[1] != d1)) {
        char got[96] = "", *g = got;
        for (int i = 0; i < t->ndim && g < got + sizeof(got) - 24; i++)
            g += sprintf(g, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
        if (nd == 2)
            snprintf(err, errlen, "weight '%s' has shape [%s], config.json implies [%lld, %lld]",
                     name, got, (long long)d0, (long long)d1);
        else
            snprintf(err, errlen, "weight '%s' has shape [%s], config.json implies [%lld]", name,
                     got, (long long)d0);
        return ANV_EFORMAT;
    }
    *out = t;
    return 0;
}

/* Appends a buffer of `bytes` to a list (grown). */
static int s_keep(s_buf_t **list, int *n, int *cap, void *p, size_t bytes)
{
    if (*n == *cap) {
        int c = *cap ? *cap * 2 : 64;
        s_buf_t *l = realloc(*list, (size_t)c * sizeof(s_buf_t));
        if (!l)
            return -ENOMEM;
        *list = l;
        *cap = c;
    }
    (*list)[(*n)++] = (s_buf_t){p, bytes};
    return 0;
}

/* Finds name, checks its shape and hands it to the backend. */
static int s_get(eng_model_t *self,
                 s_weights_t *w,
                 s_w_t *out,
                 const char *name,
                 int64_t d0,
                 int64_t d1,
                 char *err,
                 size_t errlen)
{
    const eng_st_tensor_t *t;
    int rc = s_find(w, &t, name, d0, d1, err, errlen);
    if (rc)
        return rc;
    if (w->into) {
        int k = w->k_handed++;
        if (k >= w->into->n_handed || w->into->handed[k].bytes != t->nbytes) {
            snprintf(err, errlen, "weight '%s' differs in size from the loaded one", name);
            return S_DIFFERENT;
        }
        void *dst = w->into->handed[k].p;
        if (w->write && self->be->weight_into(self->be, dst, t->data, t->nbytes)) {
            snprintf(err, errlen, "backend cannot take weight '%s'", name);
            return -EIO;
        }
        w->bytes += t->nbytes;
        w->n_tensors++;
        out->p = dst;
        out->dt = t->dtype;
        return 0;
    }
    void *p = self->be->weight(self->be, t->data, t->nbytes);
    if (!p || s_keep(&w->handed, &w->n_handed, &w->cap_handed, p, t->nbytes)) {
        if (p)
            self->be->weight_release(self->be, p);
        snprintf(err, errlen, "backend cannot take weight '%s'", name);
        return -ENOMEM;
    }
    w->bytes += t->nbytes;
    w->n_tensors++;
    out->p = p;
    out->dt = t->dtype;
    return 0;
}

/* The n tensors names[i] (shape (d0[i], d1), or vectors when d1 == 0), one dtype, stacked
   along their first dimension in one backend buffer. */
static int s_get_stacked(eng_model_t *self, s_weights_t *w, s_w_t *out, char names[][160],
                         const int64_t *d0, int64_t d1, int n, char *err, size_t errlen)
{
    const eng_st_tensor_t *t[3];
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        int rc = s_find(w, &t[i], names[i], d0[i], d1, err, errlen);
        if (rc)
            return rc;
        if (t[i]->dtype != t[0]->dtype) {
            snprintf(err, errlen, "weights '%s' and '%s' differ in dtype (they are stacked)",
                     names[0], names[i]);
            return ANV_EFORMAT;
        }
        total += t[i]->nbytes;
    }
    eng_backend_t *be = self->be;
    char *p;
    if (w->into) {
        int k = w->k_stacked++;
        if (k >= w->into->n_stacked || w->into->stacked[k].bytes != total) {
            snprintf(err, errlen, "weight '%s' (stacked) differs in size from the loaded one",
                     names[0]);
            return S_DIFFERENT;
        }
        p = w->into->stacked[k].p;
    } else if (!(p = be->alloc(be, total)) ||
               s_keep(&w->stacked, &w->n_stacked, &w->cap_stacked, p, total)) {
        be->free(be, p);
        snprintf(err, errlen, "backend cannot take weight '%s' (%zu bytes stacked)", names[0],
                 total);
        return -ENOMEM;
    }
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        int rc = w->into && !w->write ? 0 : be->weight_into(be, p + off, t[i]->data, t[i]->nbytes);
        if (rc) {
            snprintf(err, errlen, "backend cannot take weight '%s'", names[i]);
            return rc;
        }
        off += t[i]->nbytes;
        w->n_tensors++;
    }
    w->bytes += total;
    out->p = p;
    out->dt = t[0]->dtype;
    return 0;
}

static int s_open_files(s_weights_t *w, const char *dir, char *err, size_t errlen)
{
    char path[4096];
    struct stat st;
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    if (stat(path, &st) == 0) {
        w->files[0] = eng_st_open(path, err, errlen);
        if (!w->files[0])
            return ANV_EFORMAT;
        w->n_files = 1;
        return 0;
    }
    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir);
    size_t len;
    char *text = eng_read_file(path, &len);
    if (!text) {
        snprintf(err, errlen,
                 "'%s' has neither model.safetensors nor "
                 "model.safetensors.index.json",
                 dir);
        return -ENOENT;
    }
    cJSON *idx = cJSON_ParseWithLength(text, len);
    free(text);
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(idx, "weight_map");
    int rc = 0;
    if (!cJSON_IsObject(map)) {
        snprintf(err, errlen, "'%s': no weight_map object", path);
        rc = ANV_EFORMAT;
        goto out;
    }
    /* open each distinct shard once, in order of first appearance */
    const char *names[S_MAX_SHARDS];
    const cJSON *e;
    cJSON_ArrayForEach(e, map)
    {
        if (!cJSON_IsString(e) || strchr(e->valuestring, '/') || e->valuestring[0] == '.') {
            snprintf(err, errlen, "'%s': bad shard name for '%s'", path, e->string);
            rc = ANV_EFORMAT;
            goto out;
        }
        int seen = 0;
        for (int i = 0; i < w->n_files && !seen; i++)
            seen = strcmp(names[i], e->valuestring) == 0;
        if (seen)
            continue;
        if (w->n_files == S_MAX_SHARDS) {
            snprintf(err, errlen, "'%s': more than %d shards", path, S_MAX_SHARDS);
            rc = ANV_ETOOBIG;
            goto out;
        }
        char shard[4096];
        snprintf(shard, sizeof(shard), "%s/%s", dir, e->valuestring);
        w->files[w->n_files] = eng_st_open(shard, err, errlen);
        if (!w->files[w->n_files]) {
            rc = ANV_EFORMAT;
            goto out;
        }
        names[w->n_files++] = e->valuestring;
    }
out:
    cJSON_Delete(idx);
    return rc;
}

/* Opens the checkpoint in dir and hands every tensor to the backend (a new set), or, with
   `into`, checks (write false) or writes (write true) each into the buffer of the loaded set
   `into` that holds it. NULL on failure with the reason in err and the code in *rc_out
   (S_DIFFERENT: a tensor's size differs from its buffer in `into`). */
static s_weights_t *s_weights_load(eng_model_t *self,
                                   const char *dir,
                                   const s_weights_t *into,
                                   bool write,
                                   int *rc_out,
                                   char *err,
                                   size_t errlen)
{
    const eng_model_config_t *c = &self->cfg;
    uint64_t t0 = anv_now_ns();
    s_weights_t *w = calloc(1, sizeof(*w));
    *rc_out = -ENOMEM;
    if (!w || !(w->layers = calloc((size_t)c->n_layers, sizeof(s_layer_t)))) {
        snprintf(err, errlen, "out of memory");
        free(w);
        return NULL;
    }
    w->into = into;
    w->write = write;
    int rc = s_open_files(w, dir, err, errlen);
    if (rc)
        goto fail;
    int64_t H = c->hidden, Q = (int64_t)c->n_heads * c->head_dim,
            KV = (int64_t)c->n_kv_heads * c->head_dim, F = c->ffn, V = c->vocab;
    char n[160];
    if ((rc = s_get(self, w, &w->embed, "model.embed_tokens.weight", V, H, err, errlen)) ||
        (rc = s_get(self, w, &w->final_norm, "model.norm.weight", H, 0, err, errlen)))
        goto fail;
    if (c->tied_embeddings)
        w->lm_head = w->embed;
    else if ((rc = s_get(self, w, &w->lm_head, "lm_head.weight", V, H, err, errlen)))
        goto fail;
    for (int l = 0; l < c->n_layers; l++) {
        s_layer_t *L = &w->layers[l];
        struct {
            s_w_t *dst;
            const char *suffix;
            int64_t d0, d1;
        } list[] = {
            {&L->in_norm, "input_layernorm.weight", H, 0},
            {&L->post_norm, "post_attention_layernorm.weight", H, 0},
        };
        for (size_t i = 0; i < sizeof(list) / sizeof(list[0]); i++) {
            snprintf(n, sizeof(n), "model.layers.%d.%s", l, list[i].suffix);
            if ((rc = s_get(self, w, list[i].dst, n, list[i].d0, list[i].d1, err, errlen)))
                goto fail;
        }
        char sn[3][160];
        const int64_t qkv_d0[3] = {Q, KV, KV}, gu_d0[2] = {F, F};
        const char *qkv[3] = {"q_proj", "k_proj", "v_proj"};
        for (int i = 0; i < 3; i++)
            snprintf(sn[i], sizeof(sn[i]), "model.layers.%d.self_attn.%s.weight", l, qkv[i]);
        if ((rc = s_get_stacked(self, w, &L->wqkv, sn, qkv_d0, H, 3, err, errlen)))
            goto fail;
        snprintf(n, sizeof(n), "model.layers.%d.self_attn.o_proj.weight", l);
        if ((rc = s_get(self, w, &L->wo, n, H, Q, err, errlen)))
            goto fail;
        if (c->qkv_bias) {
            for (int i = 0; i < 3; i++)
                snprintf(sn[i], sizeof(sn[i]), "model.layers.%d.self_attn.%s.bias", l, qkv[i]);
            if ((rc = s_get_stacked(self, w, &L->bqkv, sn, qkv_d0, 0, 3, err, errlen)))
                goto fail;
            if (L->bqkv.dt != L->wqkv.dt) {
                snprintf(err, errlen, "layer %d: q/k/v bias dtype differs from the weight's", l);
                rc = ANV_EFORMAT;
                goto fail;
            }
        }
        snprintf(sn[0], sizeof(sn[0]), "model.layers.%d.mlp.gate_proj.weight", l);
        snprintf(sn[1], sizeof(sn[1]), "model.layers.%d.mlp.up_proj.weight", l);
        if ((rc = s_get_stacked(self, w, &L->wgu, sn, gu_d0, H, 2, err, errlen)))
            goto fail;
        snprintf(n, sizeof(n), "model.layers.%d.mlp.down_proj.weight", l);
        if ((rc = s_get(self, w, &L->wd, n, H, F, err, errlen)))
            goto fail;
    }
    if (into && (w->k_handed != into->n_handed || w->k_stacked != into->n_stacked)) {
        snprintf(err, errlen, "the checkpoint has %d + %d buffers, the loaded set %d + %d",
                 w->k_handed, w->k_stacked, into->n_handed, into->n_stacked);
        rc = S_DIFFERENT;
        goto fail;
    }
    if (self->be->sync(self->be)) { /* the uploads are asynchronous on a device */
        snprintf(err, errlen, "backend failed while uploading the weights");
        rc = -EIO;
        goto fail;
    }
    w->seconds = (anv_now_ns() - t0) * 1e-9;
    if (!into || write)
        ANV_INFO("weights: %d tensors from %d file(s), %.2f GB in %.3f s (%.2f GB/s) on %s%s",
                 w->n_tensors, w->n_files, w->bytes / 1e9, w->seconds,
                 w->seconds > 0 ? w->bytes / 1e9 / w->seconds : 0.0, self->be->name,
                 into ? ", into the loaded buffers" : "");
    *rc_out = 0;
    return w;
fail:
    *rc_out = rc ? rc : ANV_EFORMAT;
    s_weights_free(self->be, &w);
    return NULL;
}

/* True when tensors a and b are alike: both absent or both present in one dtype. */
static bool s_w_alike(const s_w_t *a, const s_w_t *b)
{
    return !a->p == !b->p && (!a->p || a->dt == b->dt);
}

/* True when sets a and b hold the same tensors in the same dtypes (tied or not alike). */
static bool s_weights_alike(const eng_model_t *self, const s_weights_t *a, const s_weights_t *b)
{
    if (!s_w_alike(&a->embed, &b->embed) || !s_w_alike(&a->final_norm, &b->final_norm) ||
        !s_w_alike(&a->lm_head, &b->lm_head) ||
        (a->lm_head.p == a->embed.p) != (b->lm_head.p == b->embed.p))
        return false;
    for (int l = 0; l < self->cfg.n_layers; l++) {
        const s_layer_t *x = &a->layers[l], *y = &b->layers[l];
        if (!s_w_alike(&x->in_norm, &y->in_norm) || !s_w_alike(&x->post_norm, &y->post_norm) ||
            !s_w_alike(&x->wqkv, &y->wqkv) || !s_w_alike(&x->bqkv, &y->bqkv) ||
            !s_w_alike(&x->wo, &y->wo) || !s_w_alike(&x->wgu, &y->wgu) ||
            !s_w_alike(&x->wd, &y->wd))
            return false;
    }
    return true;
}

/* Writes the checkpoint in dir into the loaded weights' own buffers, on a backend whose weights
   are its own copies (be->copy set: CUDA), so the weights keep their addresses (captured
   decode graphs stay valid) and a reload needs no second set's memory. First every tensor is
   found and checked against its buffer (size, dtype; shapes by s_find) with nothing written,
   then all are written. Returns 0 when done, S_DIFFERENT when the sets differ (nothing
   written), or a negative code: before any write (nothing changed), or when a write failed,
   in which case the weights are part old, part new and self->broken is set. */
static int s_weights_reload_in_place(eng_model_t *self, const char *dir, char *err, size_t errlen)
{
    int rc;
    s_weights_t *chk = s_weights_load(self, dir, self->w, false, &rc, err, errlen);
    if (!chk)
        return rc;
    bool alike = s_weights_alike(self, self->w, chk);
    s_weights_free(self->be, &chk);
    if (!alike) {
        snprintf(err, errlen, "a tensor's dtype differs from the loaded one's");
        return S_DIFFERENT;
    }
    s_weights_t *w = s_weights_load(self, dir, self->w, true, &rc, err, errlen);
    if (!w) {
        self->broken = true;
        ANV_ERROR("weights: writing '%s' over the loaded set failed (%s): the weights are "
                  "mixed, the model refuses to run",
                  dir, err);
        return rc < 0 ? rc : ANV_EINTERNAL;
    }
    s_weights_t *old = self->w;
    for (int i = 0; i < S_MAX_SHARDS; i++) { /* old keeps the new checkpoint's mappings */
        eng_st_file_t *f = old->files[i];
        old->files[i] = w->files[i], w->files[i] = f;
    }
    const int nf = old->n_files;
    old->n_files = w->n_files, w->n_files = nf;
    old->bytes = w->bytes, old->seconds = w->seconds, old->n_tensors = w->n_tensors;
    s_weights_free(self->be, &w); /* closes the old checkpoint's files; frees no buffer */
    return 0;
}

/* --- lifecycle ----------------------------------------------------------------------------- */

static void s_free_acts(eng_model_t *self)
{
    eng_backend_t *be = self->be;
    float **bufs[] = {&self->x,  &self->xn, &self->qkv,  &self->q,        &self->att,
                      &self->o,  &self->gu, &self->gate, &self->out_rows, &self->logits};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) {
        be->free(be, *bufs[i]);
        *bufs[i] = NULL;
    }
    self->cap_tok = self->cap_rows = 0;
}

static void s_free_pools(eng_model_t *self)
{
    if (self->k_pool)
        for (int l = 0; l < self->cfg.n_layers; l++) {
            self->be->free(self->be, self->k_pool[l]);
            self->be->free(self->be, self->v_pool[l]);
        }
    free(self->k_pool);
    free(self->v_pool);
    self->k_pool = self->v_pool = NULL;
    self->n_blocks = 0;
}

eng_model_t *eng_model_new(const char *dir, eng_backend_t *be, char *err, size_t errlen)
{
    eng_model_t *self = calloc(1, sizeof(*self));
    if (!self) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    self->be = be;
    if (!be->weight_into || !be->rope_kv_store || !be->swiglu_fused) {
        snprintf(err, errlen, "backend '%s' lacks the fused ops the model runs on", be->name);
        goto fail;
    }
    self->linear = eng_linear_enabled(be);
    if (eng_config_load(dir, &self->cfg, err, errlen))
        goto fail;
    int rc;
    self->w = s_weights_load(self, dir, NULL, false, &rc, err, errlen);
    if (!self->w)
        goto fail;
    return self;
fail:
    eng_model_destroy(&self);
    return NULL;
}

void eng_model_destroy(eng_model_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    eng_model_t *self = *self_p;
    if (self->be->graph_reset)
        self->be->graph_reset(self->be);
    eng_graph_pad_release(&self->pad);
    s_free_acts(self);
    s_free_pools(self);
    s_weights_free(self->be, &self->w);
    free(self);
    *self_p = NULL;
}

const eng_model_config_t *eng_model_config(const eng_model_t *self)
{
    return &self->cfg;
}

int eng_model_reload(eng_model_t *self, const char *dir, char *err, size_t errlen)
{
    eng_model_config_t cfg;
    int rc = eng_config_load(dir, &cfg, err, errlen);
    if (rc)
        return rc;
    if (cfg.arch != self->cfg.arch || cfg.hidden != self->cfg.hidden ||
        cfg.n_layers != self->cfg.n_layers || cfg.n_heads != self->cfg.n_heads ||
        cfg.n_kv_heads != self->cfg.n_kv_heads || cfg.head_dim != self->cfg.head_dim ||
        cfg.ffn != self->cfg.ffn || cfg.vocab != self->cfg.vocab ||
        cfg.tied_embeddings != self->cfg.tied_embeddings) {
        snprintf(err, errlen, "'%s' has a different architecture or shape than the loaded model",
                 dir);
        return ANV_EFORMAT;
    }
    /* in place only where the scalars the graphs hold as kernel arguments are the same too */
    const bool same_scalars = cfg.rope_theta == self->cfg.rope_theta &&
                              cfg.rms_eps == self->cfg.rms_eps &&
                              cfg.qkv_bias == self->cfg.qkv_bias;
    if (same_scalars && self->be->copy) {
        rc = s_weights_reload_in_place(self, dir, err, errlen);
        if (rc == 0) {
            ANV_INFO("weights reloaded in place: the decode graphs stay");
            self->cfg = cfg;
            return 0;
        }
        if (rc != S_DIFFERENT)
            return self->broken ? ANV_EINTERNAL : ANV_EFORMAT;
        ANV_INFO("weights: %s; loading a new set", err);
    }
    s_weights_t *w = s_weights_load(self, dir, NULL, false, &rc, err, errlen);
    if (!w) {
        if (rc == -ENOMEM && self->be->copy) { /* the engine's pool left no room for it */
            size_t n = strlen(err);
            snprintf(err + n, errlen - n,
                     " (a reload that differs from the loaded set in a tensor's size or dtype "
                     "needs room for a second set: give the KV pool less, --kv-mb)");
        }
        return ANV_EFORMAT;
    }
    if (self->be->graph_reset)
        self->be->graph_reset(self->be); /* the graphs hold the old weights' pointers */
    s_weights_free(self->be, &self->w);
    self->w = w;
    self->cfg = cfg;
    return 0;
}

size_t eng_model_reload_bytes(const eng_model_t *self)
{
    return self->be->copy || !self->w ? 0 : self->w->bytes;
}

void eng_model_load_stats(const eng_model_t *self, size_t *bytes, double *seconds)
{
    if (bytes)
        *bytes = self->w ? self->w->bytes : 0;
    if (seconds)
        *seconds = self->w ? self->w->seconds : 0;
}

size_t eng_model_kv_bytes_per_token(const eng_model_t *self)
{
    return 2 * (size_t)self->cfg.n_layers * self->cfg.n_kv_heads * self->cfg.head_dim *
           eng_dtype_size(self->be->kv_dtype);
}

int eng_model_kv_reserve(eng_model_t *self, int n_blocks, int block_size)
{
    if (n_blocks <= 0 || block_size <= 0)
        return -EINVAL;
    s_free_pools(self);
    int L = self->cfg.n_layers;
    /* + 1: the pad block of graph steps, never handed out */
    size_t bytes = ((size_t)n_blocks + 1) * block_size * self->cfg.n_kv_heads *
                   self->cfg.head_dim * eng_dtype_size(self->be->kv_dtype);
    self->graph_key++;
    self->k_pool = calloc((size_t)L, sizeof(void *));
    self->v_pool = calloc((size_t)L, sizeof(void *));
    if (!self->k_pool || !self->v_pool)
        goto fail;
    for (int l = 0; l < L; l++) {
        self->k_pool[l] = self->be->alloc(self->be, bytes);
        self->v_pool[l] = self->be->alloc(self->be, bytes);
        if (!self->k_pool[l] || !self->v_pool[l])
            goto fail;
    }
    self->n_blocks = n_blocks;
    self->block_size = block_size;
    return 0;
fail:
    s_free_pools(self);
    return -ENOMEM;
}

int eng_model_kv_copy(eng_model_t *self, int src, int dst)
{
    if (src < 0 || dst < 0 || src >= self->n_blocks || dst >= self->n_blocks)
        return -EINVAL;
    for (int l = 0; l < self->cfg.n_layers; l++) {
        int rc = self->be->copy_block(self->be, self->k_pool[l], self->v_pool[l], src, dst,
                                      self->block_size, self->cfg.n_kv_heads, self->cfg.head_dim);
        if (rc)
            return rc;
    }
    return 0;
}

/* --- forward ----------------------------------------------------------------------------- */

static int s_reserve_acts(eng_model_t *self, int n_tok, int n_rows)
{
    if (n_tok <= self->cap_tok && n_rows <= self->cap_rows)
        return 0;
    int nt = n_tok > self->cap_tok ? n_tok : self->cap_tok;
    int nr = n_rows > self->cap_rows ? n_rows : self->cap_rows;
    s_free_acts(self);
    self->graph_key++;
    const eng_model_config_t *c = &self->cfg;
    eng_backend_t *be = self->be;
    size_t t = (size_t)nt, H = c->hidden, Q = (size_t)c->n_heads * c->head_dim,
           KV = (size_t)c->n_kv_heads * c->head_dim, F = c->ffn;
    self->x = be->alloc(be, t * H * 4);
    self->xn = be->alloc(be, t * H * 4);
    self->qkv = be->alloc(be, t * (Q + 2 * KV) * 4);
    self->q = be->alloc(be, t * Q * 4);
    self->att = be->alloc(be, t * Q * 4);
    self->o = be->alloc(be, t * H * 4);
    self->gu = be->alloc(be, t * 2 * F * 4);
    self->gate = be->alloc(be, t * F * 4);
    self->out_rows = be->alloc(be, (size_t)nr * H * 4);
    self->logits = be->alloc(be, (size_t)nr * c->vocab * 4);
    if (!self->x || !self->xn || !self->qkv || !self->q || !self->att || !self->o || !self->gu ||
        !self->gate || !self->out_rows || !self->logits) {
        s_free_acts(self);
        return -ENOMEM;
    }
    self->cap_tok = nt;
    self->cap_rows = nr;
    return 0;
}

static int s_check_batch(const eng_model_t *self, const eng_forward_t *b)
{
    const eng_attn_batch_t *a = &b->attn;
    int slots = self->n_blocks * self->block_size;
    if (!self->k_pool || b->n_tok <= 0 || a->n_seq <= 0 || a->q_start[0] != 0 ||
        a->q_start[a->n_seq] != b->n_tok)
        return -EINVAL;
    for (int t = 0; t < b->n_tok; t++)
        if (b->tokens[t] < 0 || b->tokens[t] >= self->cfg.vocab || b->slots[t] < 0 ||
            b->slots[t] >= slots || b->pos[t] < 0)
            return -EINVAL;
    for (int s = 0; s < a->n_seq; s++) {
        int nq = a->q_start[s + 1] - a->q_start[s];
        if (nq <= 0 || a->ctx_len[s] < nq ||
            (a->ctx_len[s] + self->block_size - 1) / self->block_size > a->max_blocks)
            return -EINVAL;
        int nb = (a->ctx_len[s] + self->block_size - 1) / self->block_size;
        for (int i = 0; i < nb; i++) {
            int32_t blk = a->block_tables[(size_t)s * a->max_blocks + i];
            if (blk < 0 || blk >= self->n_blocks)
                return -EINVAL;
        }
    }
    for (int r = 0; r < b->n_rows; r++)
        if (b->rows[r] < 0 || b->rows[r] >= b->n_tok)
            return -EINVAL;
    return 0;
}

void eng_model_set_graphs(eng_model_t *self, int on)
{
    self->graphs = on && self->be->graph_step && self->be->prepare;
}

#define S_TRY(call)                                                                                \
    do {                                                                                           \
        if ((rc = (call))) {                                                                       \
            ANV_ERROR("forward pass: '%s' failed: %s", #call, anv_strerror(rc));                   \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

/* The step through be->linear: the residual stream x is updated in place by the O and
   down projections (ENG_LIN_ADD) and each norm is folded into the matmul that reads it, so a
   layer is six kernels at small batch (QKV + rope + KV store, attention and its combine,
   O + add, gate|up + SwiGLU, down + add), and a backend with the prefetch hint may move O's
   weights into its cache while the attention runs. */
static int s_ops_linear(eng_model_t *self, const eng_forward_t *b)
{
    const eng_model_config_t *c = &self->cfg;
    eng_backend_t *be = self->be;
    const s_weights_t *w = self->w;
    int n = b->n_tok, H = c->hidden, Q = c->n_heads * c->head_dim, KV = c->n_kv_heads * c->head_dim,
        F = c->ffn, rc = 0;
    eng_linear_t f = {0};
    f.eps = c->rms_eps;
    S_TRY(be->embedding(be, self->x, w->embed.p, w->embed.dt, b->tokens, n, H));
    for (int l = 0; l < c->n_layers; l++) {
        const s_layer_t *L = &w->layers[l];
        eng_linear_t qkv = f;
        qkv.norm_w = L->in_norm.p, qkv.norm_dtype = L->in_norm.dt, qkv.epi = ENG_LIN_ROPE_KV;
        qkv.k_cache = self->k_pool[l], qkv.v_cache = self->v_pool[l], qkv.pos = b->pos;
        qkv.slots = b->slots, qkv.n_head = c->n_heads, qkv.n_kv_head = c->n_kv_heads;
        qkv.head_dim = c->head_dim, qkv.theta = c->rope_theta;
        S_TRY(be->linear(be, self->q, self->x, L->wqkv.p, L->bqkv.p, L->wqkv.dt, n, H,
                         Q + 2 * KV, &qkv));
        if (be->prefetch) /* O's weights into the cache while the attention reads little */
            S_TRY(be->prefetch(be, L->wo.p, (size_t)Q * H * eng_dtype_size(L->wo.dt), n));
        S_TRY(be->attention(be, self->att, self->q, self->k_pool[l], self->v_pool[l], &b->attn,
                            c->n_heads, c->n_kv_heads, c->head_dim, self->block_size));
        eng_linear_t add = f;
        add.epi = ENG_LIN_ADD;
        add.x_from_prev = 1; /* O reads the attention's out, down the gate|up linear's */
        S_TRY(be->linear(be, self->x, self->att, L->wo.p, NULL, L->wo.dt, n, Q, H, &add));
        eng_linear_t gu = f;
        gu.norm_w = L->post_norm.p, gu.norm_dtype = L->post_norm.dt, gu.epi = ENG_LIN_SWIGLU;
        gu.out_for_next = L->wd.dt == L->wgu.dt; /* only down reads gate, next */
        S_TRY(be->linear(be, self->gate, self->x, L->wgu.p, NULL, L->wgu.dt, n, H, 2 * F, &gu));
        S_TRY(be->linear(be, self->x, self->gate, L->wd.p, NULL, L->wd.dt, n, F, H, &add));
    }
    if (b->n_rows > 0) {
        eng_linear_t head = f;
        head.norm_w = w->final_norm.p, head.norm_dtype = w->final_norm.dt, head.epi = ENG_LIN_PLAIN;
        S_TRY(be->gather_rows(be, self->out_rows, self->x, b->rows, b->n_rows, H));
        S_TRY(be->linear(be, self->logits, self->out_rows, w->lm_head.p, NULL, w->lm_head.dt,
                         b->n_rows, H, c->vocab, &head));
    }
out:
    return rc;
}

/* The ops of a step up to the logits of its rows (in self->logits). */
static int s_ops(eng_model_t *self, const eng_forward_t *b)
{
    const eng_model_config_t *c = &self->cfg;
    eng_backend_t *be = self->be;
    const s_weights_t *w = self->w;
    int n = b->n_tok, H = c->hidden, Q = c->n_heads * c->head_dim, KV = c->n_kv_heads * c->head_dim,
        F = c->ffn, rc = 0;
    float eps = c->rms_eps;

    S_TRY(be->embedding(be, self->x, w->embed.p, w->embed.dt, b->tokens, n, H));
    for (int l = 0; l < c->n_layers; l++) {
        const s_layer_t *L = &w->layers[l];
        if (l == 0)
            S_TRY(be->rmsnorm(be, self->xn, self->x, L->in_norm.p, L->in_norm.dt, n, H, eps));
        else
            S_TRY(be->add_rmsnorm(be, self->xn, self->x, self->o, L->in_norm.p, L->in_norm.dt, n, H,
                                  eps));
        S_TRY(be->matmul(be, self->qkv, self->xn, L->wqkv.p, L->bqkv.p, L->wqkv.dt, n, H,
                         Q + 2 * KV));
        S_TRY(be->rope_kv_store(be, self->q, self->qkv, self->k_pool[l], self->v_pool[l], b->pos,
                                b->slots, n, c->n_heads, c->n_kv_heads, c->head_dim,
                                c->rope_theta));
        S_TRY(be->attention(be, self->att, self->q, self->k_pool[l], self->v_pool[l], &b->attn,
                            c->n_heads, c->n_kv_heads, c->head_dim, self->block_size));
        S_TRY(be->matmul(be, self->o, self->att, L->wo.p, NULL, L->wo.dt, n, Q, H));
        S_TRY(be->add_rmsnorm(be, self->xn, self->x, self->o, L->post_norm.p, L->post_norm.dt, n, H,
                              eps));
        S_TRY(be->matmul(be, self->gu, self->xn, L->wgu.p, NULL, L->wgu.dt, n, H, 2 * F));
        S_TRY(be->swiglu_fused(be, self->gate, self->gu, n, F));
        /* the MLP output goes to o; the next layer's (or the final) add_rmsnorm adds it */
        S_TRY(be->matmul(be, self->o, self->gate, L->wd.p, NULL, L->wd.dt, n, F, H));
    }
    S_TRY(be->add_rmsnorm(be, self->xn, self->x, self->o, w->final_norm.p, w->final_norm.dt, n, H,
                          eps));
    if (b->n_rows > 0) {
        S_TRY(be->gather_rows(be, self->out_rows, self->xn, b->rows, b->n_rows, H));
        S_TRY(be->matmul(be, self->logits, self->out_rows, w->lm_head.p, NULL, w->lm_head.dt,
                         b->n_rows, H, c->vocab));
    }
out:
    return rc;
}

typedef struct {
    eng_model_t *self;
    const eng_forward_t *fw;
} s_rec_t;

static int s_record(void *ctx)
{
    s_rec_t *r = ctx;
    return r->self->linear ? s_ops_linear(r->self, r->fw) : s_ops(r->self, r->fw);
}

/* The step's ops up to the logits of its rows (self->logits, backend memory), graphed or not. */
static int s_run(eng_model_t *self, const eng_forward_t *b)
{
    if (self->broken)
        return ANV_EINTERNAL;
    int rc = s_check_batch(self, b);
    if (rc)
        return rc;
    eng_backend_t *be = self->be;
    int graph = self->graphs && eng_graph_is_decode(&b->attn, b->rows, b->n_rows);
    int n_tok = graph ? eng_graph_bucket(b->n_tok) : b->n_tok;
    if ((rc = s_reserve_acts(self, n_tok, graph ? n_tok : b->n_rows)))
        return rc;
    if (graph) {
        eng_graph_pad_t *p = &self->pad;
        if ((rc = eng_graph_pad(p, &b->attn, b->tokens, b->pos, b->slots, self->block_size,
                                self->n_blocks)))
            return rc;
        eng_forward_t fw = {p->step.n_tok, p->ids, p->pos, p->slots, p->batch, p->step.n_rows,
                            p->rows};
        s_rec_t rec = {self, &fw};
        S_TRY(be->graph_step(be, &p->step, self->block_size, self->graph_key, s_record, &rec));
    } else {
        if (be->prepare) {
            eng_step_t st = {b->n_tok, b->tokens, b->pos, b->slots, &b->attn, b->n_rows, b->rows};
            S_TRY(be->prepare(be, &st));
        }
        S_TRY(self->linear ? s_ops_linear(self, b) : s_ops(self, b));
    }
out:
    return rc;
}

int eng_model_forward(eng_model_t *self, const eng_forward_t *b, float *logits, float *logprobs)
{
    int rc = s_run(self, b);
    if (rc)
        return rc;
    eng_backend_t *be = self->be;
    const eng_model_config_t *c = &self->cfg;
    if (b->n_rows > 0) {
        size_t bytes = (size_t)b->n_rows * c->vocab * sizeof(float);
        if (logits)
            S_TRY(be->download(be, logits, self->logits, bytes));
        if (logprobs) {
            S_TRY(be->log_softmax(be, self->logits, self->logits, b->n_rows, c->vocab));
            S_TRY(be->download(be, logprobs, self->logits, bytes));
        }
    }
    rc = be->sync(be);
out:
    return rc;
}

int eng_model_forward_sample(eng_model_t *self, const eng_forward_t *b, const eng_model_sample_t *q)
{
    eng_backend_t *be = self->be;
    const eng_model_config_t *c = &self->cfg;
    if (!be->sample || (b->n_rows > 0 && (!q->params || !q->tokens || !q->logprobs)))
        return -EINVAL;
    for (int i = 0; i < q->n_lp_rows; i++)
        if (q->lp_rows[i] < 0 || q->lp_rows[i] >= b->n_rows || !q->lp_out)
            return -EINVAL;
    int rc = s_run(self, b);
    if (rc || b->n_rows == 0)
        return rc ? rc : be->sync(be);
    S_TRY(be->sample(be, q->tokens, q->logprobs, self->logits, b->n_rows, c->vocab, q->params));
    if (q->n_lp_rows > 0) {
        size_t row = (size_t)c->vocab;
        S_TRY(be->log_softmax(be, self->logits, self->logits, b->n_rows, c->vocab));
        for (int i = 0; i < q->n_lp_rows; i++)
            S_TRY(be->download(be, q->lp_out + i * row, self->logits + (size_t)q->lp_rows[i] * row,
                               row * sizeof(float)));
    }
    rc = be->sync(be);
out:
    return rc;
}
#undef S_TRY

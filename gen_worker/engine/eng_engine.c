/*  eng_engine.c - requests, sequences and the continuous-batching scheduler.

    A sequence's tokens are prompt + generated ("full"); its KV holds the first kv.n_tokens of
    them. A running sequence has kv.n_tokens < len(full): a decoding one has exactly one token
    pending, a prefilling (or recomputing) one more. Each step feeds every running sequence its
    pending tokens (decodes first, then prefill chunks within the token budget), then admits
    waiting sequences (no KV yet) in FIFO order while blocks and budget allow. When a sequence
    reaches len(full) in a step, its last row of log-probabilities is sampled. That single rule
    covers prefill, decode and recompute after preemption.

    Groups: with prefix sharing a request's sample 0 (the leader) prefills the prompt; the other
    samples wait, and when the leader's prompt is complete they fork its block table and all n
    samples draw their first token from the same row, each with its own RNG. Without sharing
    every sample is a leader of its own.

    Preemption: when a running sequence cannot get a block, the youngest running sequence
    (last admitted) gives up its KV and goes back to the front of the waiting queue; its tokens,
    RNG state and text are kept, so recompute continues it exactly. A sample of a forked group
    recomputes only what follows its prompt's full blocks, which it shares again with a running
    sibling (s_prompt_donor); the same after a weight update, once one sibling has prefilled the
    prompt anew. A sequence that cannot fit even alone is finished with ENG_FINISH_CONTEXT.
*/
#define _GNU_SOURCE /* memmem */
#include "eng_engine.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "anv_error.h"
#include "anv_log.h"
#include "eng_chat.h"
#include "eng_kv.h"
#include "eng_model.h"

typedef enum {
    S_WAITING = 0, /* no KV, in the waiting queue */
    S_RUNNING,     /* KV, pending tokens */
    S_FORK_WAIT,   /* waits for its group leader's prefill */
    S_DONE,
} s_state_t;

typedef struct s_group s_group_t;

typedef struct {
    s_group_t *g;
    int index;
    s_state_t state;
    uint64_t admit_no; /* admission order, for preemption */
    eng_kv_seq_t kv;
    int kv_done;    /* tokens of kv whose K/V a finished forward pass has written */
    eng_ids_t full; /* prompt + generated (generated = full[n_prompt ..]) */
    uint64_t seed; /* draw k of this sample is keyed by (seed, k) */
    float *logprobs;
    eng_top_t *top;
    int cap_gen;
    eng_detok_t detok;
    eng_buf_t text;
    uint64_t version_first;
    bool has_first;
    int n_preempted;
    eng_finish_t finish;
} s_seq_t;

struct s_group {
    char id[ENG_REQUEST_ID_MAX];
    int n, n_prompt, n_live;
    eng_sampling_t sampling;
    int max_tokens;
    char **stop;
    int n_stop;
    size_t max_stop_len;
    int32_t *stop_ids;
    int n_stop_ids;
    bool ignore_eos;
    bool forked; /* the leader's prompt is done and its samples forked */
    s_seq_t **seqs;
};

typedef struct {
    s_seq_t **v;
    int n, cap;
} s_list_t;

typedef struct {
    eng_sample_t **v;
    int head, n, cap;
} s_fifo_t;

struct eng_engine {
    eng_engine_opts_t opts;
    eng_backend_t *be;
    eng_model_t *model;
    eng_tokenizer_t *tok;
    eng_chat_t chat;
    eng_kv_t *kv;
    eng_sampler_t *sampler;
    int max_context;
    uint64_t version;
    uint64_t admit_counter;
    s_list_t waiting, running;
    s_group_t **groups;
    int n_groups, cap_groups;
    s_fifo_t done;
    long long preemptions, processed_tokens, generated_tokens;
    long long reshared_tokens; /* prompt tokens recomputes took from a sibling */
    int peak_batch_seqs; /* sequences in one step at most */
    /* step scratch */
    eng_ids_t b_tok, b_pos, b_slot, b_qstart, b_ctx, b_tables, b_rows;
    s_list_t b_seqs, b_sample; /* sequences of the step; those sampled (per row) */
    eng_ids_t b_lp_rows;       /* rows whose whole log-softmax is wanted (top logprobs) */
    eng_sample_params_t *b_params;
    int32_t *b_tokens;
    float *b_logprobs, *rows_lp;
    int cap_rows, cap_lp;
};

const char *eng_finish_name(eng_finish_t f)
{
    switch (f) {
    case ENG_FINISH_NONE:
        return "none";
    case ENG_FINISH_EOS:
        return "eos";
    case ENG_FINISH_STOP:
        return "stop";
    case ENG_FINISH_LENGTH:
        return "length";
    case ENG_FINISH_CONTEXT:
        return "context";
    case ENG_FINISH_CANCELLED:
        return "cancelled";
    }
    return "?";
}

void eng_sample_destroy(eng_sample_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    eng_sample_t *s = *self_p;
    free(s->tokens);
    free(s->logprobs);
    free(s->top);
    free(s->text);
    free(s);
    *self_p = NULL;
}

/* --- small containers ---------------------------------------------------------------------- */

static int s_list_push(s_list_t *l, s_seq_t *s)
{
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 16;
        s_seq_t **v = realloc(l->v, (size_t)cap * sizeof(*v));
        if (!v)
            return -ENOMEM;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = s;
    return 0;
}

static void s_list_remove(s_list_t *l, s_seq_t *s)
{
    for (int i = 0; i < l->n; i++)
        if (l->v[i] == s) {
            memmove(l->v + i, l->v + i + 1, (size_t)(l->n - i - 1) * sizeof(*l->v));
            l->n--;
            return;
        }
}

/* Inserts s keeping the list ordered by (admit_no, index); used for the waiting queue, where
   preempted sequences (old admit_no) go before new ones (admit_no 0 is "not yet admitted" and
   is ordered by arrival, after every preempted one). */
static int s_list_insert_ordered(s_list_t *l, s_seq_t *s)
{
    int rc = s_list_push(l, s);
    if (rc)
        return rc;
    if (s->admit_no == 0)
        return 0;
    int i = l->n - 1;
    while (i > 0 && (l->v[i - 1]->admit_no == 0 || l->v[i - 1]->admit_no > s->admit_no ||
                     (l->v[i - 1]->admit_no == s->admit_no && l->v[i - 1]->index > s->index))) {
        l->v[i] = l->v[i - 1];
        i--;
    }
    l->v[i] = s;
    return 0;
}

static int s_fifo_push(s_fifo_t *f, eng_sample_t *s)
{
    if (f->head + f->n == f->cap) {
        if (f->head > 0) {
            memmove(f->v, f->v + f->head, (size_t)f->n * sizeof(*f->v));
            f->head = 0;
        } else {
            int cap = f->cap ? f->cap * 2 : 16;
            eng_sample_t **v = realloc(f->v, (size_t)cap * sizeof(*v));
            if (!v)
                return -ENOMEM;
            f->v = v;
            f->cap = cap;
        }
    }
    f->v[f->head + f->n++] = s;
    return 0;
}

/* --- lifecycle ----------------------------------------------------------------------------- */

static void s_seq_free(s_seq_t *s)
{
    if (!s)
        return;
    eng_kv_seq_free(&s->kv);
    eng_ids_release(&s->full);
    free(s->logprobs);
    free(s->top);
    eng_buf_release(&s->text);
    free(s);
}

static void s_group_free(s_group_t *g)
{
    if (!g)
        return;
    for (int i = 0; i < g->n_stop; i++)
        free(g->stop[i]);
    free(g->stop);
    free(g->stop_ids);
    if (g->seqs)
        for (int i = 0; i < g->n; i++)
            s_seq_free(g->seqs[i]);
    free(g->seqs);
    free(g);
}

eng_engine_t *eng_engine_new(const eng_engine_opts_t *opts, char *err, size_t errlen)
{
    eng_engine_t *self = calloc(1, sizeof(*self));
    if (!self) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    self->opts = *opts;
    eng_engine_opts_t *o = &self->opts;
    if (!o->block_size)
        o->block_size = 16;
    bool kv_auto = !o->kv_bytes && o->n_blocks <= 0;
    if (!o->kv_bytes)
        o->kv_bytes = (size_t)256 << 20;
    if (!o->max_batch_tokens)
        o->max_batch_tokens = 2048;
    if (o->block_size < 1 || o->block_size > 1024 || o->max_batch_tokens < 1 || o->max_seqs < 0) {
        snprintf(err, errlen, "engine options out of range");
        goto fail;
    }
    self->version = o->weight_version;
    self->be = eng_backend_new_kv(o->backend ? o->backend : "cpu", o->n_threads, o->kv_dtype);
    if (!self->be) {
        snprintf(err, errlen, "cannot start backend '%s'%s%s", o->backend ? o->backend : "cpu",
                 o->kv_dtype && *o->kv_dtype ? " with KV dtype " : "",
                 o->kv_dtype && *o->kv_dtype ? o->kv_dtype : "");
        goto fail;
    }
    /* a device backend (the one with mem_info) gets the larger default: see eng_engine.h */
    if (!o->max_seqs)
        o->max_seqs = self->be->mem_info ? ENG_MAX_SEQS_DEVICE : ENG_MAX_SEQS_HOST;
    if (!self->be->sample) {
        snprintf(err, errlen, "backend '%s' cannot sample", self->be->name);
        goto fail;
    }
    self->model = eng_model_new(o->model_dir, self->be, err, errlen);
    if (!self->model)
        goto fail;
    if (o->cuda_graphs && !self->be->graph_step)
        ANV_WARN("backend %s has no graphs: --cuda-graphs is ignored", self->be->name);
    eng_model_set_graphs(self->model, o->cuda_graphs);
    self->tok = eng_tokenizer_new(o->model_dir, err, errlen);
    if (!self->tok)
        goto fail;
    eng_chat_init(&self->chat, self->tok);
    const eng_model_config_t *c = eng_model_config(self->model);
    if (eng_tokenizer_size(self->tok) > c->vocab) {
        snprintf(err, errlen, "tokenizer has %d ids but the model's vocab_size is %d",
                 eng_tokenizer_size(self->tok), c->vocab);
        goto fail;
    }
    /* on a device the pool takes what the weights left, less what a weight update allocates
       beside them (none where it is written in place: CUDA) -- a GPU worker's pool, not a CPU
       tool's 256 MiB: with 2048 tokens an 8B worker ran one sequence at a time */
    size_t free_b = 0;
    if (kv_auto && self->be->mem_info && self->be->mem_info(self->be, &free_b, NULL) == 0)
        o->kv_bytes = eng_kv_auto_bytes(free_b, eng_model_reload_bytes(self->model), o->kv_bytes);
    size_t per_block = eng_model_kv_bytes_per_token(self->model) * (size_t)o->block_size;
    int n_blocks = o->n_blocks > 0 ? o->n_blocks : (int)(o->kv_bytes / per_block);
    if (n_blocks < 1) {
        snprintf(err, errlen, "KV budget of %zu bytes holds no block of %zu bytes", o->kv_bytes,
                 per_block);
        goto fail;
    }
    if (eng_model_kv_reserve(self->model, n_blocks, o->block_size)) {
        snprintf(err, errlen, "cannot allocate %d KV blocks of %zu bytes", n_blocks, per_block);
        goto fail;
    }
    self->kv = eng_kv_new(n_blocks, o->block_size);
    self->sampler = eng_sampler_new(c->vocab);
    if (!self->kv || !self->sampler) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    self->max_context =
        o->max_context > 0 && o->max_context < c->max_pos ? o->max_context : c->max_pos;
    ANV_INFO("engine ready: %s %d layers hidden %d vocab %d, backend %s, kv %d blocks x %d "
             "tokens (%zu bytes each), chat template %s",
             c->arch_name, c->n_layers, c->hidden, c->vocab, self->be->name, n_blocks,
             o->block_size, per_block, eng_chat_kind_name(self->chat.kind));
    return self;
fail:
    eng_engine_destroy(&self);
    return NULL;
}

void eng_engine_destroy(eng_engine_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    eng_engine_t *self = *self_p;
    for (int i = 0; i < self->n_groups; i++)
        s_group_free(self->groups[i]);
    free(self->groups);
    free(self->waiting.v);
    free(self->running.v);
    for (int i = 0; i < self->done.n; i++)
        eng_sample_destroy(&self->done.v[self->done.head + i]);
    free(self->done.v);
    eng_ids_t *ids[] = {&self->b_tok, &self->b_pos,    &self->b_slot, &self->b_qstart,
                        &self->b_ctx, &self->b_tables, &self->b_rows, &self->b_lp_rows};
    for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++)
        eng_ids_release(ids[i]);
    free(self->b_seqs.v);
    free(self->b_sample.v);
    free(self->b_params);
    free(self->b_tokens);
    free(self->b_logprobs);
    free(self->rows_lp);
    eng_sampler_destroy(&self->sampler);
    eng_kv_destroy(&self->kv);
    eng_tokenizer_destroy(&self->tok);
    eng_model_destroy(&self->model);
    if (self->be)
        self->be->destroy(&self->be);
    free(self);
    *self_p = NULL;
}

/* --- submit -------------------------------------------------------------------------------- */

int eng_engine_encode_prompt(const eng_engine_t *self, const char *text, bool chat, eng_ids_t *out)
{
    if (chat && self->chat.kind != ENG_CHAT_RAW) {
        eng_chat_msg_t msg = {"user", text};
        return eng_chat_render(&self->chat, self->tok, &msg, 1, true, out);
    }
    return eng_chat_raw(self->tok, text, strlen(text), out);
}

static s_group_t *s_find_group(const eng_engine_t *self, const char *id, int *pos)
{
    for (int i = 0; i < self->n_groups; i++)
        if (strcmp(self->groups[i]->id, id) == 0) {
            if (pos)
                *pos = i;
            return self->groups[i];
        }
    return NULL;
}

static int
s_check_request(const eng_engine_t *self, const eng_request_t *r, char *err, size_t errlen)
{
    if (!r->request_id || !r->request_id[0] || strlen(r->request_id) >= ENG_REQUEST_ID_MAX) {
        snprintf(err, errlen, "request id missing or longer than %d bytes", ENG_REQUEST_ID_MAX - 1);
        return ANV_ECONFIG;
    }
    if (s_find_group(self, r->request_id, NULL)) {
        snprintf(err, errlen, "request '%s' is already in flight", r->request_id);
        return ANV_ECONFIG;
    }
    if (r->n < 1 || r->n > 4096 || r->max_tokens < 1) {
        snprintf(err, errlen, "n must be in [1, 4096] and max_tokens >= 1");
        return ANV_ECONFIG;
    }
    if (eng_sampling_check(&r->sampling)) {
        snprintf(err, errlen, "sampling parameters out of range");
        return ANV_ECONFIG;
    }
    if (r->seeds)
        for (int i = 0; i < r->n; i++)
            for (int j = 0; j < i; j++)
                if (r->seeds[i] == r->seeds[j]) {
                    snprintf(err, errlen, "samples %d and %d share the seed %llu", j, i,
                             (unsigned long long)r->seeds[i]);
                    return ANV_ECONFIG;
                }
    if (r->n_stop < 0 || r->n_stop > 64 || r->n_stop_ids < 0 || r->n_stop_ids > 64) {
        snprintf(err, errlen, "at most 64 stop strings and 64 stop ids");
        return ANV_ECONFIG;
    }
    for (int i = 0; i < r->n_stop; i++)
        if (!r->stop[i] || !r->stop[i][0] || strlen(r->stop[i]) > 1024) {
            snprintf(err, errlen, "stop string %d is empty or too long", i);
            return ANV_ECONFIG;
        }
    return 0;
}

static s_group_t *
s_group_new(eng_engine_t *self, const eng_request_t *r, const eng_ids_t *p, uint64_t base)
{
    s_group_t *g = calloc(1, sizeof(*g));
    if (!g)
        return NULL;
    snprintf(g->id, sizeof(g->id), "%s", r->request_id);
    g->n = g->n_live = r->n;
    g->n_prompt = p->n;
    g->sampling = r->sampling;
    g->max_tokens = r->max_tokens;
    g->ignore_eos = r->ignore_eos;
    g->seqs = calloc((size_t)r->n, sizeof(s_seq_t *));
    g->stop = calloc((size_t)r->n_stop + 1, sizeof(char *));
    g->stop_ids = malloc(((size_t)r->n_stop_ids + 1) * sizeof(int32_t));
    if (!g->seqs || !g->stop || !g->stop_ids)
        goto fail;
    for (int i = 0; i < r->n_stop; i++) {
        if (!(g->stop[i] = strdup(r->stop[i])))
            goto fail;
        g->n_stop++;
        size_t l = strlen(r->stop[i]);
        if (l > g->max_stop_len)
            g->max_stop_len = l;
    }
    if (r->n_stop_ids)
        memcpy(g->stop_ids, r->stop_ids, (size_t)r->n_stop_ids * sizeof(int32_t));
    g->n_stop_ids = r->n_stop_ids;
    for (int i = 0; i < r->n; i++) {
        s_seq_t *s = calloc(1, sizeof(*s));
        if (!s)
            goto fail;
        g->seqs[i] = s;
        s->g = g;
        s->index = i;
        s->seed = r->seeds ? r->seeds[i] : eng_seed_for_sample(base, (uint32_t)i);
        eng_detok_init(&s->detok, self->tok);
        if (eng_ids_append(&s->full, p->v, p->n) || eng_buf_append(&s->text, "", 0))
            goto fail;
    }
    return g;
fail:
    s_group_free(g);
    return NULL;
}

int eng_engine_submit(eng_engine_t *self, const eng_request_t *r, char *err, size_t errlen)
{
    int rc = s_check_request(self, r, err, errlen);
    if (rc)
        return rc;
    eng_ids_t p = {0};
    if (r->prompt_ids) {
        rc = eng_ids_append(&p, r->prompt_ids, r->n_prompt_ids);
    } else if (r->prompt_text && r->prompt_len && !r->chat) {
        rc = eng_chat_raw(self->tok, r->prompt_text, r->prompt_len, &p);
    } else if (r->prompt_text) {
        rc = eng_engine_encode_prompt(self, r->prompt_text, r->chat, &p);
        if (rc == ANV_EFORMAT)
            snprintf(err, errlen, "prompt text is not valid UTF-8");
    } else {
        rc = ANV_ECONFIG;
        snprintf(err, errlen, "request has neither prompt ids nor text");
    }
    if (rc)
        goto out;
    const eng_model_config_t *c = eng_model_config(self->model);
    for (int i = 0; i < p.n; i++)
        if (p.v[i] < 0 || p.v[i] >= c->vocab) {
            snprintf(err, errlen, "prompt token %d is outside the vocabulary", p.v[i]);
            rc = ANV_ECONFIG;
            goto out;
        }
    if (p.n < 1 || p.n >= self->max_context) {
        snprintf(err, errlen, "prompt of %d tokens does not fit the context of %d", p.n,
                 self->max_context);
        rc = ANV_ETOOBIG;
        goto out;
    }
    uint64_t base = r->seed;
    if (!r->has_seed && !r->seeds && getrandom(&base, sizeof(base), 0) != sizeof(base)) {
        snprintf(err, errlen, "getrandom failed");
        rc = -errno;
        goto out;
    }
    s_group_t *g = s_group_new(self, r, &p, base);
    if (!g || self->n_groups == self->cap_groups) {
        int cap = self->cap_groups ? self->cap_groups * 2 : 16;
        s_group_t **v = g ? realloc(self->groups, (size_t)cap * sizeof(*v)) : NULL;
        if (!v) {
            s_group_free(g);
            snprintf(err, errlen, "out of memory");
            rc = -ENOMEM;
            goto out;
        }
        self->groups = v;
        self->cap_groups = cap;
    }
    self->groups[self->n_groups++] = g;
    bool share = !self->opts.no_prefix_sharing && g->n > 1;
    for (int i = 0; i < g->n; i++) {
        s_seq_t *s = g->seqs[i];
        s->state = share && i > 0 ? S_FORK_WAIT : S_WAITING;
        if (s->state == S_WAITING && (rc = s_list_push(&self->waiting, s)))
            goto out; /* the group stays registered; its other samples still run */
    }
    g->forked = !share;
out:
    eng_ids_release(&p);
    return rc;
}

/* --- finishing ----------------------------------------------------------------------------- */

static int s_n_gen(const s_seq_t *s)
{
    return s->full.n - s->g->n_prompt;
}

static void s_group_maybe_free(eng_engine_t *self, s_group_t *g)
{
    if (g->n_live > 0)
        return;
    int pos;
    if (s_find_group(self, g->id, &pos) == g) {
        memmove(self->groups + pos, self->groups + pos + 1,
                (size_t)(self->n_groups - pos - 1) * sizeof(*self->groups));
        self->n_groups--;
    }
    s_group_free(g);
}

/* Moves s to the finished queue as an eng_sample_t. */
static void s_finish(eng_engine_t *self, s_seq_t *s, eng_finish_t why)
{
    if (s->state == S_WAITING)
        s_list_remove(&self->waiting, s);
    else if (s->state == S_RUNNING)
        s_list_remove(&self->running, s);
    eng_kv_release(self->kv, &s->kv);
    s->state = S_DONE;
    s->finish = why;
    s_group_t *g = s->g;
    eng_sample_t *out = calloc(1, sizeof(*out));
    int n = s_n_gen(s);
    if (out) {
        snprintf(out->request_id, sizeof(out->request_id), "%s", g->id);
        out->index = s->index;
        out->seed = s->seed;
        out->n_prompt = g->n_prompt;
        out->n_tokens = n;
        out->n_top = g->sampling.n_top_logprobs;
        out->tokens = malloc(((size_t)n + 1) * sizeof(int32_t));
        out->logprobs = malloc(((size_t)n + 1) * sizeof(float));
        if (out->tokens && n)
            memcpy(out->tokens, s->full.v + g->n_prompt, (size_t)n * sizeof(int32_t));
        if (out->logprobs && n)
            memcpy(out->logprobs, s->logprobs, (size_t)n * sizeof(float));
        if (out->n_top && n) {
            out->top = s->top;
            s->top = NULL;
        }
        if (why != ENG_FINISH_STOP)
            eng_detok_flush(&s->detok, &s->text);
        out->text = s->text.p;
        out->text_len = s->text.n;
        s->text.p = NULL;
        s->text.n = s->text.cap = 0;
        out->finish = why;
        out->weight_version_first = s->has_first ? s->version_first : self->version;
        out->weight_version = self->version;
        out->n_preempted = s->n_preempted;
        if (!out->tokens || !out->logprobs || !out->text || s_fifo_push(&self->done, out)) {
            ANV_ERROR("out of memory: sample %d of request '%s' is lost", s->index, g->id);
            eng_sample_destroy(&out);
        }
    } else {
        ANV_ERROR("out of memory: sample %d of request '%s' is lost", s->index, g->id);
    }
    g->n_live--;
    s_group_maybe_free(self, g);
}

eng_sample_t *eng_engine_pop_finished(eng_engine_t *self)
{
    if (self->done.n == 0)
        return NULL;
    eng_sample_t *s = self->done.v[self->done.head++];
    if (--self->done.n == 0)
        self->done.head = 0;
    return s;
}

int eng_engine_cancel(eng_engine_t *self, const char *request_id)
{
    s_group_t *g = s_find_group(self, request_id, NULL);
    if (!g)
        return ANV_ENOTFOUND;
    /* The group is freed when its last LIVE sample finishes, which need not be seqs[0] (some
       samples may have finished already): take the live ones first, then finish them, never
       reading g after the last one (a use-after-free ASan found in the gen worker's cancel). */
    int n = g->n, k = 0;
    s_seq_t **live = malloc(sizeof *live * (size_t)(n > 0 ? n : 1));
    if (!live)
        return -ENOMEM;
    for (int i = 0; i < n; i++)
        if (g->seqs[i]->state != S_DONE)
            live[k++] = g->seqs[i];
    for (int i = 0; i < k; i++)
        s_finish(self, live[i], ENG_FINISH_CANCELLED);
    free(live);
    return 0;
}

/* --- sampling and stop conditions ---------------------------------------------------------- */

static bool s_is_stop_id(const eng_engine_t *self, const s_group_t *g, int32_t id)
{
    if (!g->ignore_eos) {
        const eng_model_config_t *c = eng_model_config(self->model);
        for (int i = 0; i < c->n_eos; i++)
            if (c->eos_ids[i] == id)
                return true;
        if (id == eng_tokenizer_eos(self->tok))
            return true;
    }
    for (int i = 0; i < g->n_stop_ids; i++)
        if (g->stop_ids[i] == id)
            return true;
    return false;
}

/* Appends token to s and finishes it when a stop condition holds. */
static int s_accept(eng_engine_t *self, s_seq_t *s, int32_t tok, float lp, const eng_top_t *top)
{
    s_group_t *g = s->g;
    int n = s_n_gen(s);
    if (n + 1 > s->cap_gen) {
        int cap = s->cap_gen ? s->cap_gen * 2 : 64;
        float *l = realloc(s->logprobs, (size_t)cap * sizeof(float));
        if (!l)
            return -ENOMEM;
        s->logprobs = l;
        if (g->sampling.n_top_logprobs) {
            eng_top_t *t =
                realloc(s->top, (size_t)cap * g->sampling.n_top_logprobs * sizeof(eng_top_t));
            if (!t)
                return -ENOMEM;
            s->top = t;
        }
        s->cap_gen = cap;
    }
    if (eng_ids_push(&s->full, tok))
        return -ENOMEM;
    s->logprobs[n] = lp;
    if (g->sampling.n_top_logprobs)
        memcpy(s->top + (size_t)n * g->sampling.n_top_logprobs, top,
               (size_t)g->sampling.n_top_logprobs * sizeof(eng_top_t));
    self->generated_tokens++;
    if (!s->has_first) {
        s->has_first = true;
        s->version_first = self->version;
    }
    if (s_is_stop_id(self, g, tok)) {
        s_finish(self, s, ENG_FINISH_EOS);
        return 0;
    }
    size_t before = s->text.n;
    if (!eng_tokenizer_is_special(self->tok, tok) && eng_detok_push(&s->detok, tok, &s->text))
        return -ENOMEM;
    if (g->n_stop && s->text.n > before) {
        size_t from = before > g->max_stop_len ? before - g->max_stop_len + 1 : 0;
        size_t cut = (size_t)-1;
        for (int i = 0; i < g->n_stop; i++) {
            char *hit = memmem(s->text.p + from, s->text.n - from, g->stop[i], strlen(g->stop[i]));
            if (hit && (size_t)(hit - s->text.p) < cut)
                cut = (size_t)(hit - s->text.p);
        }
        if (cut != (size_t)-1) {
            s->text.n = cut;
            s->text.p[cut] = 0;
            s_finish(self, s, ENG_FINISH_STOP);
            return 0;
        }
    }
    if (n + 1 >= g->max_tokens)
        s_finish(self, s, ENG_FINISH_LENGTH);
    else if (s->full.n >= self->max_context)
        s_finish(self, s, ENG_FINISH_CONTEXT);
    return 0;
}

/* The leader's prompt is complete: the samples waiting for it share its KV from here on
   (they draw their first tokens from its last row, in this same step). */
static int s_fork(eng_engine_t *self, s_seq_t *leader)
{
    s_group_t *g = leader->g;
    g->forked = true;
    for (int i = 0; i < g->n; i++) {
        s_seq_t *s = g->seqs[i];
        if (s == leader || s->state != S_FORK_WAIT)
            continue;
        int rc = eng_kv_fork(self->kv, &leader->kv, &s->kv);
        if (rc)
            return rc;
        s->admit_no = leader->admit_no;
        s->kv_done = s->kv.n_tokens; /* called after the leader's forward pass */
        s->state = S_RUNNING;
        if ((rc = s_list_push(&self->running, s)))
            return rc;
    }
    return 0;
}

/* --- scheduling ------------------------------------------------------------------------------ */

static void s_preempt(eng_engine_t *self, s_seq_t *s)
{
    eng_kv_release(self->kv, &s->kv);
    s->kv_done = 0;
    s_list_remove(&self->running, s);
    s->state = S_WAITING;
    s->n_preempted++;
    self->preemptions++;
    if (s_list_insert_ordered(&self->waiting, s)) {
        ANV_ERROR("out of memory while preempting: request '%s' sample %d is cancelled", s->g->id,
                  s->index);
        s->state = S_DONE; /* not in any list now */
        s_finish(self, s, ENG_FINISH_CANCELLED);
    }
}

/* Youngest running sequence (largest admit_no, then index). */
static s_seq_t *s_youngest(const eng_engine_t *self)
{
    s_seq_t *y = NULL;
    for (int i = 0; i < self->running.n; i++) {
        s_seq_t *s = self->running.v[i];
        if (!y || s->admit_no > y->admit_no || (s->admit_no == y->admit_no && s->index > y->index))
            y = s;
    }
    return y;
}

static int s_cmp_admit(const void *pa, const void *pb)
{
    const s_seq_t *a = *(s_seq_t *const *)pa, *b = *(s_seq_t *const *)pb;
    if (a->admit_no != b->admit_no)
        return a->admit_no < b->admit_no ? -1 : 1;
    return a->index - b->index;
}

/* Adds n tokens of s (its next pending ones) to the step batch, reserving their slots. */
static int s_batch_add(eng_engine_t *self, s_seq_t *s, int n)
{
    int start = s->kv.n_tokens;
    int32_t slots[n];
    eng_kv_copy_t copy;
    int rc = eng_kv_append(self->kv, &s->kv, n, slots, &copy);
    if (rc)
        return rc;
    if ((rc = eng_ids_push(&self->b_qstart, self->b_tok.n)) ||
        (rc = eng_ids_push(&self->b_ctx, s->kv.n_tokens)))
        return rc;
    if (copy.src >= 0 && (rc = eng_model_kv_copy(self->model, copy.src, copy.dst)))
        return rc;
    for (int i = 0; i < n; i++)
        if ((rc = eng_ids_push(&self->b_tok, s->full.v[start + i])) ||
            (rc = eng_ids_push(&self->b_pos, start + i)) ||
            (rc = eng_ids_push(&self->b_slot, slots[i])))
            return rc;
    if ((rc = s_list_push(&self->b_seqs, s)))
        return rc;
    if (s->kv.n_tokens == s->full.n) { /* all pending tokens in: this row gets sampled */
        if ((rc = eng_ids_push(&self->b_rows, self->b_tok.n - 1)) ||
            (rc = s_list_push(&self->b_sample, s)))
            return rc;
        /* a leader whose prompt completes: the samples waiting for it draw their first
           tokens from the same row (forked after the forward pass, before their draws) */
        for (int i = 0; !s->g->forked && s->index == 0 && i < s->g->n; i++) {
            s_seq_t *f = s->g->seqs[i];
            if (f != s && f->state == S_FORK_WAIT &&
                ((rc = eng_ids_push(&self->b_rows, self->b_tok.n - 1)) ||
                 (rc = s_list_push(&self->b_sample, f))))
                return rc;
        }
    }
    return 0;
}

/* Reserves the step's work for running sequences, preempting when blocks run out. Returns
   the token budget left. */
static int s_schedule_running(eng_engine_t *self, int budget)
{
    if (self->running.n > 1)
        qsort(self->running.v, (size_t)self->running.n, sizeof(s_seq_t *), s_cmp_admit);
    /* decodes (one pending token) first, then prefill chunks, both oldest first */
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < self->running.n && budget > 0; i++) {
            s_seq_t *s = self->running.v[i];
            int pending = s->full.n - s->kv.n_tokens;
            if (pending <= 0 || (pass == 0) != (pending == 1))
                continue; /* pending 0: already in this step's batch */
            int n = pending < budget ? pending : budget;
            for (;;) {
                int rc = s_batch_add(self, s, n);
                if (rc == 0) {
                    budget -= n;
                    break;
                }
                if (rc != -ENOSPC)
                    return rc;
                s_seq_t *victim = s_youngest(self);
                bool self_victim = victim == s;
                /* a victim already in this step's batch cannot be dropped: stop here */
                for (int k = 0; k < self->b_seqs.n && !self_victim; k++)
                    if (self->b_seqs.v[k] == victim)
                        return budget;
                s_preempt(self, victim);
                if (self_victim) {
                    i--; /* the list shifted under us */
                    break;
                }
                if (i >= self->running.n)
                    break;
            }
        }
    }
    return budget;
}

/* A waiting sample of a forked group (one preempted, or after a weight update) takes its
   prompt's full blocks from a running sibling whose forward passes wrote them, rather than
   prefilling the prompt again: returns that sibling (NULL: none) and the blocks in *n. At
   least one token stays to feed, for the row its next draw comes from. */
static s_seq_t *s_prompt_donor(const eng_engine_t *self, const s_seq_t *s, int *n)
{
    const s_group_t *g = s->g;
    int bs = self->opts.block_size, blocks = g->n_prompt / bs;
    if (blocks > (s->full.n - 1) / bs)
        blocks = (s->full.n - 1) / bs;
    *n = 0;
    if (self->opts.no_prefix_sharing || !g->forked || blocks <= 0)
        return NULL;
    for (int i = 0; i < g->n; i++) {
        s_seq_t *d = g->seqs[i];
        if (d != s && d->state == S_RUNNING && d->kv_done >= blocks * bs) {
            *n = blocks;
            return d;
        }
    }
    return NULL;
}

static int s_admit(eng_engine_t *self, int budget)
{
    int watermark = eng_kv_total_blocks(self->kv) / 100;
    while (budget > 0 && self->waiting.n > 0 && self->running.n < self->opts.max_seqs) {
        s_seq_t *s = self->waiting.v[0];
        int shared = 0;
        s_seq_t *donor = s_prompt_donor(self, s, &shared);
        int pending = s->full.n - shared * self->opts.block_size;
        int n = pending < budget ? pending : budget;
        /* the shared prefix ends on a block boundary: n more tokens take new blocks only */
        int need = eng_kv_blocks_needed(self->kv, &s->kv, n);
        int total_need = (s->full.n + self->opts.block_size - 1) / self->opts.block_size;
        if (total_need > eng_kv_total_blocks(self->kv)) {
            ANV_WARN("request '%s' sample %d needs %d KV blocks, more than the cache holds",
                     s->g->id, s->index, total_need);
            s_finish(self, s, ENG_FINISH_CONTEXT);
            continue;
        }
        bool alone = self->running.n == 0 && self->b_seqs.n == 0;
        if (need + (alone ? 0 : watermark) > eng_kv_free_blocks(self->kv))
            break;
        int rc = donor ? eng_kv_fork_prefix(self->kv, &donor->kv, &s->kv, shared) : 0;
        if (rc)
            return rc;
        if (donor)
            self->reshared_tokens += shared * self->opts.block_size;
        s_list_remove(&self->waiting, s);
        if (s->admit_no == 0)
            s->admit_no = ++self->admit_counter;
        s->state = S_RUNNING;
        rc = s_list_push(&self->running, s);
        if (!rc)
            rc = s_batch_add(self, s, n);
        if (rc)
            return rc;
        budget -= n;
    }
    return 0;
}

static int s_run_batch(eng_engine_t *self)
{
    int n_seq = self->b_seqs.n, rc;
    int max_blocks = 1;
    for (int i = 0; i < n_seq; i++)
        if (self->b_seqs.v[i]->kv.n_blocks > max_blocks)
            max_blocks = self->b_seqs.v[i]->kv.n_blocks;
    self->b_tables.n = 0;
    for (int i = 0; i < n_seq; i++) {
        const s_seq_t *sq = self->b_seqs.v[i];
        if ((rc = eng_ids_append(&self->b_tables, sq->kv.blocks, sq->kv.n_blocks)))
            return rc;
        for (int k = sq->kv.n_blocks; k < max_blocks; k++)
            if ((rc = eng_ids_push(&self->b_tables, 0)))
                return rc;
    }
    if ((rc = eng_ids_push(&self->b_qstart, self->b_tok.n)))
        return rc;
    int n_rows = self->b_rows.n, vocab = eng_model_config(self->model)->vocab;
    if (n_rows > self->cap_rows) {
        eng_sample_params_t *pp = realloc(self->b_params, (size_t)n_rows * sizeof(*pp));
        if (pp)
            self->b_params = pp;
        int32_t *tt = realloc(self->b_tokens, (size_t)n_rows * sizeof(*tt));
        if (tt)
            self->b_tokens = tt;
        float *ll = realloc(self->b_logprobs, (size_t)n_rows * sizeof(*ll));
        if (ll)
            self->b_logprobs = ll;
        if (!pp || !tt || !ll)
            return -ENOMEM;
        self->cap_rows = n_rows;
    }
    self->b_lp_rows.n = 0;
    for (int r = 0; r < n_rows; r++) {
        const s_seq_t *s = self->b_sample.v[r];
        const eng_sampling_t *sp = &s->g->sampling;
        /* a fork waiting for its leader has generated nothing yet: step 0 like the leader */
        int step = s->state == S_FORK_WAIT ? 0 : s_n_gen(s);
        self->b_params[r] = (eng_sample_params_t){sp->temperature, sp->top_k, sp->top_p,
                                                  sp->min_p, s->seed, (uint64_t)step};
        if (sp->n_top_logprobs > 0 && (rc = eng_ids_push(&self->b_lp_rows, r)))
            return rc;
    }
    int n_lp = self->b_lp_rows.n;
    if (n_lp > self->cap_lp) {
        float *p = realloc(self->rows_lp, (size_t)n_lp * vocab * sizeof(float));
        if (!p)
            return -ENOMEM;
        self->rows_lp = p;
        self->cap_lp = n_lp;
    }
    eng_forward_t fw = {
        .n_tok = self->b_tok.n,
        .tokens = self->b_tok.v,
        .pos = self->b_pos.v,
        .slots = self->b_slot.v,
        .attn = {n_seq, self->b_qstart.v, self->b_ctx.v, self->b_tables.v, max_blocks},
        .n_rows = n_rows,
        .rows = self->b_rows.v,
    };
    eng_model_sample_t q = {self->b_params, self->b_tokens, self->b_logprobs, self->b_lp_rows.v,
                            n_lp, self->rows_lp};
    if ((rc = eng_model_forward_sample(self->model, &fw, &q)))
        return rc;
    for (int i = 0; i < n_seq; i++)
        self->b_seqs.v[i]->kv_done = self->b_seqs.v[i]->kv.n_tokens;
    for (int r = 0, k = 0; r < n_rows && !rc; r++) {
        s_seq_t *s = self->b_sample.v[r];
        eng_top_t top[ENG_MAX_TOP_LOGPROBS];
        int n_top = s->g->sampling.n_top_logprobs;
        if (n_top > 0)
            eng_sampler_top(self->sampler, self->rows_lp + (size_t)k++ * vocab, n_top, top);
        if (s->state == S_RUNNING && !s->g->forked && s->index == 0)
            rc = s_fork(self, s); /* the group's waiting samples come next in b_sample */
        if (!rc && s->state == S_RUNNING)
            rc = s_accept(self, s, self->b_tokens[r], self->b_logprobs[r], top);
    }
    return rc;
}

int eng_engine_step(eng_engine_t *self)
{
    self->b_tok.n = self->b_pos.n = self->b_slot.n = self->b_rows.n = 0;
    self->b_qstart.n = self->b_ctx.n = 0;
    self->b_seqs.n = self->b_sample.n = 0;
    int budget = s_schedule_running(self, self->opts.max_batch_tokens);
    if (budget < 0)
        return budget;
    int rc = s_admit(self, budget);
    if (rc)
        return rc;
    if (self->b_tok.n == 0)
        return 0;
    int n_tok = self->b_tok.n;
    if (self->b_seqs.n > self->peak_batch_seqs)
        self->peak_batch_seqs = self->b_seqs.n;
    if ((rc = s_run_batch(self)))
        return rc;
    self->processed_tokens += n_tok;
    return n_tok;
}

bool eng_engine_idle(const eng_engine_t *self)
{
    return self->running.n == 0 && self->waiting.n == 0;
}

/* --- weights and state ----------------------------------------------------------------------- */

void eng_engine_drop_prefix_state(eng_engine_t *self)
{
    while (self->running.n > 0)
        s_preempt(self, self->running.v[self->running.n - 1]);
    /* samples waiting for a fork now prefill on their own: the leader's KV is gone */
    for (int i = 0; i < self->n_groups; i++) {
        s_group_t *g = self->groups[i];
        if (g->forked)
            continue;
        g->forked = true;
        for (int k = 0; k < g->n; k++)
            if (g->seqs[k]->state == S_FORK_WAIT) {
                g->seqs[k]->state = S_WAITING;
                if (s_list_insert_ordered(&self->waiting, g->seqs[k]))
                    ANV_ERROR("out of memory re-queueing request '%s'", g->id);
            }
    }
}

int eng_engine_load_weights(
    eng_engine_t *self, const char *dir, uint64_t version, char *err, size_t errlen)
{
    int rc = eng_model_reload(self->model, dir, err, errlen);
    if (rc)
        return rc;
    eng_engine_drop_prefix_state(self);
    self->version = version;
    ANV_INFO("loaded weights version %llu from '%s'", (unsigned long long)version, dir);
    return 0;
}

uint64_t eng_engine_weight_version(const eng_engine_t *self)
{
    return self->version;
}

void eng_engine_stats(const eng_engine_t *self, eng_engine_stats_t *st)
{
    memset(st, 0, sizeof(*st));
    st->block_size = eng_kv_block_size(self->kv);
    st->total_blocks = eng_kv_total_blocks(self->kv);
    st->free_blocks = eng_kv_free_blocks(self->kv);
    st->peak_blocks = eng_kv_peak_blocks(self->kv);
    st->bytes_per_block = eng_model_kv_bytes_per_token(self->model) * (size_t)st->block_size;
    st->running = self->running.n;
    st->waiting = self->waiting.n;
    st->queued = self->waiting.n;
    for (int i = 0; i < self->n_groups; i++) { /* a group's samples waiting for its prompt */
        const s_group_t *g = self->groups[i];
        for (int k = 0; !g->forked && k < g->n; k++)
            st->queued += g->seqs[k]->state == S_FORK_WAIT;
    }
    st->max_seqs = self->opts.max_seqs;
    st->peak_batch_seqs = self->peak_batch_seqs;
    st->preemptions = self->preemptions;
    st->reshared_tokens = self->reshared_tokens;
    st->processed_tokens = self->processed_tokens;
    st->generated_tokens = self->generated_tokens;
}

const eng_tokenizer_t *eng_engine_tokenizer(const eng_engine_t *self)
{
    return self->tok;
}

const eng_model_config_t *eng_engine_model_config(const eng_engine_t *self)
{
    return eng_model_config(self->model);
}

int eng_engine_max_context(const eng_engine_t *self)
{
    return self->max_context;
}

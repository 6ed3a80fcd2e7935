/*  anvil_bench_engine.c - throughput of the engine's backends on a Seed-Coder-8B shape.

    Builds a random model of the chosen shape directly in backend memory (no checkpoint) and
    runs three workloads, each printing one line per configuration, then a summary line
    (--json prints the same as one JSON object per line):

    decode      for each batch size: prefill `prompt` random tokens per sequence (whole
                prompts, as many per step as fit in a chunk), then decode `new` tokens with
                sampling (temperature 0.8, top-k 50, top-p 0.95, one seed per sequence), the
                decode steps timed with the host clock (every step ends with the sampled
                tokens on the host, as in the engine);
    decode_ctx  the same decode at a long context without its prefill (--ctx-batch sequences
                whose KV already holds --ctx-len random positions): the "batch 256 at 2k"
                line of issue 7; where that KV does not fit on the device (bf16 KV at 256 x
                2k on an 80 GB card) its line says "skipped: out of memory", the summary
                leaves it out and the other workloads still run;
    grpo        a GRPO-shaped job: --grpo-prompts prompts of --grpo-prompt tokens, each with
                --grpo-samples samples whose lengths are drawn from a seeded uniform
                distribution over [--grpo-min-new, --grpo-max-new] (varied stopping). The
                scheduler is continuous batching over the engine's own block manager
                (eng_kv): a group is admitted when the KV its samples will hold fits,
                its prompt is prefilled once in chunks next to the running decodes, its n
                samples then fork the prompt's blocks (copy-on-write of a shared partial
                block) and draw their first tokens from the same logits row; a finished
                sample frees its blocks at once. Reports total generated tok/s over the
                wall time (prefill included), the number of prefills (= prompts when prefix
                sharing works), the peak KV tokens held and a hash of every sample's tokens:
                --grpo-no-sharing prefills each sample on its own, and on a backend whose
                rows do not depend on the batch (the CPU) gives the same hash. Where a
                decode step's time goes besides the GPU: ms a decode-only step of host work
                while the GPU idles (decode_host_ms: from the step's tokens read back to the
                next launch; decode_fwd_ms of it inside the engine's forward: padding, plan,
                uploads, launch) and of the sampler's call (decode_wait_ms: the wait for the
                step's kernels); ms a graph step (CUDA) in the backend's preparation of the
                step (graph_prep_ms), of which its attention plan (graph_plan_ms), and in
                cudaGraphLaunch (graph_launch_ms) and in first uses and captures
                (graph_build_ms: a key's eager run, its capture and instantiation, spread
                over the graph steps); the graphs captured and steps run without one.
    linear      (--linear B1,B2..., off by default) each product of a layer through the
                backend's fused linear op at batch B, with the model's epilogues (QKV + norm
                + rope + KV store, O + residual add, gate|up + norm + SwiGLU, down + residual
                add, lm_head + final norm): --linear-reps passes over the layers' own weight
                copies (so a product reads DRAM, not L2), one host sync at the end; prints
                us a call and the weights' GB/s against the copy. --linear-sweep repeats it
                with the CUDA GEMV's column segments a row fixed at 1, 2, 4 and 8
                (eng_cuda_gemv_segs), then by the default rule again (the drift).

    Achieved bandwidth counts the bytes a decode step must read at least: all weights but the
    embedding table (of which a step gathers one row a token), plus the K/V of every cached
    position (until 2026-12-05 the whole table was counted, 8 % of the bytes of a batch-1
    step); it is reported as a fraction of a device-to-device copy measured at start (a host
    memcpy on the CPU backend). With --cuda-graphs every decode line is measured with graphs
    off and on (side by side in one line) and the grpo run uses graphs for its decode-only
    steps. --backend cpu with --shape tiny runs the same logic on
    the CPU reference (whose `sample` is eng_sampler, the definition the CUDA kernel follows),
    which is how the workload logic is tested without a GPU.
*/
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "anv_error.h"
#include "anv_log.h"
#include "eng_bench_model.h"
#include "eng_cuda.h"
#include "eng_kv.h"

#define S_MAX_BATCHES 16

typedef struct {
    int json, prompt, n_new, layers, chunk, n_batches, threads, graphs;
    int batches[S_MAX_BATCHES];
    const char *backend, *shape, *kv_dtype;
    int ctx_batch, ctx_len, ctx_new;
    int grpo_prompts, grpo_samples, grpo_prompt, grpo_min_new, grpo_max_new, grpo_chunk;
    int grpo_max_batch, kv_blocks, grpo_no_sharing;
    uint64_t grpo_seed;
    int lin_batches[S_MAX_BATCHES], n_lin, lin_reps, lin_sweep;
} s_opts_t;

static double s_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t s_mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static void s_usage(void)
{
    fprintf(stderr,
            "usage: anvil-bench-engine [--json] [--backend cuda|cpu] [--shape 8b|small|tiny]\n"
            "  [--layers N] [--threads N] [--cuda-graphs] [--kv-dtype bf16|f32|fp8]\n"
            "  decode:     [--batches 1,16,64,256|none] [--prompt 512] [--new 256] [--chunk 8192]\n"
            "  decode_ctx: [--ctx-batch 256 (0 = off)] [--ctx-len 2048] [--ctx-new 256]\n"
            "  grpo:       [--grpo-prompts 64 (0 = off)] [--grpo-samples 8] [--grpo-prompt 1024]\n"
            "              [--grpo-min-new 256] [--grpo-max-new 4096] [--grpo-chunk 2048]\n"
            "              [--grpo-max-batch 512] [--grpo-seed 1] [--kv-blocks N]\n"
            "              [--grpo-no-sharing]\n"
            "  linear:     [--linear 1,8 (off)] [--linear-reps 10] [--linear-sweep]\n"
            "  (--small = --shape small)\n");
}

static int s_int(const char *v, int *out)
{
    char *e;
    long x = v ? strtol(v, &e, 10) : 0;
    if (!v || *e || x < 0 || x > 1 << 30)
        return -1;
    *out = (int)x;
    return 0;
}

/* "1,16,64" into out (at most S_MAX_BATCHES values, each > 0); "none": no values. */
static int s_int_list(const char *v, int *out, int *n)
{
    *n = 0;
    if (strcmp(v, "none") == 0)
        return 0;
    for (const char *s = v; *s;) {
        char *e;
        long x = strtol(s, &e, 10);
        if (e == s || x <= 0 || x > 1 << 20 || *n == S_MAX_BATCHES)
            return -1;
        out[(*n)++] = (int)x;
        s = e;
        if (*s == ',')
            s++;
        else if (*s)
            return -1;
    }
    return *n > 0 ? 0 : -1;
}

static int s_parse(int argc, char **argv, s_opts_t *o)
{
    memset(o, 0, sizeof(*o));
    o->prompt = 512, o->n_new = 256, o->layers = 0, o->chunk = 8192;
    o->n_batches = 4, o->backend = "cuda", o->shape = "8b";
    o->batches[0] = 1, o->batches[1] = 16, o->batches[2] = 64, o->batches[3] = 256;
    o->ctx_batch = 256, o->ctx_len = 2048, o->ctx_new = 256;
    o->grpo_prompts = 64, o->grpo_samples = 8, o->grpo_prompt = 1024;
    o->grpo_min_new = 256, o->grpo_max_new = 4096, o->grpo_chunk = 2048;
    o->grpo_max_batch = 512, o->grpo_seed = 1, o->lin_reps = 10;
    struct {
        const char *name;
        int *dst;
    } ints[] = {
        {"--prompt", &o->prompt},
        {"--new", &o->n_new},
        {"--layers", &o->layers},
        {"--chunk", &o->chunk},
        {"--threads", &o->threads},
        {"--ctx-batch", &o->ctx_batch},
        {"--ctx-len", &o->ctx_len},
        {"--ctx-new", &o->ctx_new},
        {"--grpo-prompts", &o->grpo_prompts},
        {"--grpo-samples", &o->grpo_samples},
        {"--grpo-prompt", &o->grpo_prompt},
        {"--grpo-min-new", &o->grpo_min_new},
        {"--grpo-max-new", &o->grpo_max_new},
        {"--grpo-chunk", &o->grpo_chunk},
        {"--grpo-max-batch", &o->grpo_max_batch},
        {"--kv-blocks", &o->kv_blocks},
        {"--linear-reps", &o->lin_reps},
    };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int done = 0;
        for (size_t k = 0; k < sizeof(ints) / sizeof(ints[0]) && !done; k++)
            if (strcmp(a, ints[k].name) == 0) {
                if (s_int(v, ints[k].dst))
                    goto bad;
                i++, done = 1;
            }
        if (done)
            continue;
        if (strcmp(a, "--json") == 0) {
            o->json = 1;
        } else if (strcmp(a, "--grpo-no-sharing") == 0) {
            o->grpo_no_sharing = 1;
        } else if (strcmp(a, "--cuda-graphs") == 0) {
            o->graphs = 1;
        } else if (strcmp(a, "--small") == 0) {
            o->shape = "small";
        } else if (strcmp(a, "--shape") == 0 && v) {
            o->shape = v, i++;
        } else if (strcmp(a, "--backend") == 0 && v) {
            o->backend = v, i++;
        } else if (strcmp(a, "--kv-dtype") == 0 && v) {
            o->kv_dtype = v, i++;
        } else if (strcmp(a, "--grpo-seed") == 0 && v) {
            o->grpo_seed = strtoull(v, NULL, 10), i++;
        } else if (strcmp(a, "--batches") == 0 && v) {
            if (s_int_list(v, o->batches, &o->n_batches))
                goto bad;
            i++;
        } else if (strcmp(a, "--linear") == 0 && v) {
            if (s_int_list(v, o->lin_batches, &o->n_lin))
                goto bad;
            i++;
        } else if (strcmp(a, "--linear-sweep") == 0) {
            o->lin_sweep = 1;
        } else {
            goto bad;
        }
    }
    if (strcmp(o->backend, "cuda") && strcmp(o->backend, "cpu"))
        goto bad;
    if (strcmp(o->shape, "8b") && strcmp(o->shape, "small") && strcmp(o->shape, "tiny"))
        goto bad;
    if (o->lin_reps < 1)
        goto bad;
    if (o->prompt < 1 || o->n_new < 1 || o->chunk < o->prompt || o->ctx_len < 1 ||
        o->ctx_new < 1 || o->grpo_samples < 1 || o->grpo_prompt < 1 || o->grpo_min_new < 1 ||
        o->grpo_max_new < o->grpo_min_new || o->grpo_chunk < 1 ||
        o->grpo_max_batch < o->grpo_samples)
        goto bad;
    return 0;
bad:
    s_usage();
    return -1;
}

/* --- backend glue: fill, sampling, reference bandwidth --------------------------------- */

typedef struct {
    eng_backend_t *be;
    int cuda;
    eng_bm_fill_fn fill;
    int vocab;
} s_env_t;

/* Samples n rows of logits with the backend's `sample` (on the CPU backend that is
   eng_sampler, the definition the CUDA kernel follows). */
static int s_sample(s_env_t *x, const float *logits, int n, const eng_sample_params_t *sp,
                    int32_t *tok, float *lp)
{
    return x->be->sample(x->be, tok, lp, logits, n, x->vocab, sp);
}

static int s_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* (read + written) bytes / s of a host memcpy, median of 7. */
static double s_host_copy_gbps(size_t bytes)
{
    char *a = malloc(bytes), *b = malloc(bytes);
    double t[7], g = 0;
    if (a && b) {
        memset(a, 1, bytes), memset(b, 2, bytes);
        for (int i = 0; i < 7; i++) {
            double t0 = s_now();
            memcpy(b, a, bytes);
            t[i] = s_now() - t0;
        }
        qsort(t, 7, sizeof(double), s_cmp_double);
        g = 2.0 * bytes / t[3] / 1e9;
    }
    free(a), free(b);
    return g;
}

/* --- decode ------------------------------------------------------------------------------ */

typedef struct {
    int batch, ctx;
    double decode_s, prefill_s, tok_s, ms_step, gbps, frac, prefill_tok_s;
    long long graph_steps;
} s_result_t;

/* Runs one batch of B sequences: prompt P (prefilled, or with `synthetic` already in the
   KV), then N decode steps. Sequences s own blocks [s * bps, (s + 1) * bps). */
static int s_run(s_env_t *x, eng_bm_t *m, const eng_bm_config_t *c, int B, int P, int N,
                 int chunk, int synthetic, double copy_gbps, s_result_t *r)
{
    int bs = c->block_size;
    int bps = (P + N + bs - 1) / bs;
    int max_tok = chunk > B ? chunk : B;
    int32_t *q_start = calloc((size_t)B + 1, 4), *ctx = calloc((size_t)B, 4);
    int32_t *tables = calloc((size_t)B * bps, 4), *ids = calloc((size_t)max_tok, 4);
    int32_t *pos = calloc((size_t)max_tok, 4), *slots = calloc((size_t)max_tok, 4);
    int32_t *rows = calloc((size_t)B, 4), *last = calloc((size_t)B, 4);
    float *lp = calloc((size_t)B, 4);
    eng_sample_params_t *sp = calloc((size_t)B, sizeof(*sp));
    int rc = -ENOMEM;
    uint64_t lcg = 0x1234567ull + (uint64_t)B;
    float *logits;
    long long g0 = eng_bm_graph_steps(m);
    if (!q_start || !ctx || !tables || !ids || !pos || !slots || !rows || !last || !lp || !sp)
        goto out;
    for (int s = 0; s < B; s++) {
        for (int b = 0; b < bps; b++)
            tables[(size_t)s * bps + b] = s * bps + b;
        sp[s] = (eng_sample_params_t){0.8f, 50, 0.95f, 0.0f, 1000003ull * (uint64_t)s + 17, 0};
    }
    double t0 = s_now();
    if (synthetic) {
        /* the KV already holds P (random) positions: draw the first tokens at random */
        for (int s = 0; s < B; s++) {
            lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
            last[s] = (int32_t)((lcg >> 33) % (uint64_t)c->vocab);
            ctx[s] = P;
        }
    }
    /* prefill, whole prompts, as many sequences per step as fit in a chunk */
    for (int s0 = 0; s0 < B && !synthetic;) {
        int ns = chunk / P;
        if (ns > B - s0)
            ns = B - s0;
        q_start[0] = 0;
        for (int i = 0; i < ns; i++) {
            int s = s0 + i;
            q_start[i + 1] = q_start[i] + P;
            ctx[i] = P;
            for (int t = 0; t < P; t++) {
                int k = q_start[i] + t;
                lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
                ids[k] = (int32_t)((lcg >> 33) % (uint64_t)c->vocab);
                pos[k] = t;
                slots[k] = tables[(size_t)s * bps + t / bs] * bs + t % bs;
            }
            rows[i] = q_start[i + 1] - 1;
        }
        eng_attn_batch_t batch = {ns, q_start, ctx, tables + (size_t)s0 * bps, bps};
        if ((rc = eng_bm_forward(m, &batch, ids, pos, slots, rows, ns, &logits)))
            goto out;
        if ((rc = s_sample(x, logits, ns, sp + s0, last + s0, lp + s0)))
            goto out;
        s0 += ns;
    }
    double t1 = s_now();
    for (int s = 0; s <= B; s++)
        q_start[s] = s;
    for (int s = 0; s < B; s++)
        rows[s] = s;
    eng_attn_batch_t batch = {B, q_start, ctx, tables, bps};
    double kv_pos = 0;
    for (int step = 0; step < N; step++) {
        for (int s = 0; s < B; s++) {
            int p = P + step;
            ctx[s] = p + 1;
            ids[s] = last[s];
            pos[s] = p;
            slots[s] = tables[(size_t)s * bps + p / bs] * bs + p % bs;
            sp[s].step = (uint64_t)step + 1;
            kv_pos += p + 1;
        }
        if ((rc = eng_bm_forward(m, &batch, ids, pos, slots, rows, B, &logits)))
            goto out;
        if ((rc = s_sample(x, logits, B, sp, last, lp)))
            goto out;
    }
    double t2 = s_now();
    r->batch = B;
    r->ctx = P;
    r->prefill_s = t1 - t0;
    r->decode_s = t2 - t1;
    r->tok_s = (double)B * N / r->decode_s;
    r->ms_step = r->decode_s * 1e3 / N;
    double bytes =
        (double)eng_bm_step_weight_bytes(m, B) * N + kv_pos * eng_bm_kv_bytes_per_token(m);
    r->gbps = bytes / r->decode_s / 1e9;
    r->frac = copy_gbps > 0 ? r->gbps / copy_gbps : 0;
    r->prefill_tok_s = synthetic ? 0 : (double)B * P / r->prefill_s;
    r->graph_steps = eng_bm_graph_steps(m) - g0;
    rc = 0;
out:
    free(q_start), free(ctx), free(tables), free(ids), free(pos), free(slots), free(rows);
    free(last), free(lp), free(sp);
    return rc;
}

/* --- grpo -------------------------------------------------------------------------------- */

typedef struct s_grp s_grp_t;

typedef struct {
    s_grp_t *g;
    eng_kv_seq_t kv;
    int len, gen; /* target and generated tokens */
    int32_t last;
    int owned;    /* blocks committed to this sample besides the group's shared ones */
    int done;
    uint64_t hash; /* FNV-1a of the sample's tokens */
    eng_sample_params_t sp;
} s_smp_t;

struct s_grp {
    int state; /* 0 waiting, 1 prefilling, 2 decoding, 3 done */
    eng_kv_seq_t lead;
    int prefilled, n_live, need, shared;
    int32_t *prompt;
    s_smp_t *smp;
};

typedef struct {
    double wall_s, prefill_s, tok_s, mean_batch;
    /* decode-only steps, while the GPU idles: host_s the whole of the host's work between a
       step's tokens and the next step's launch, fwd_s its part in eng_bm_forward (the graph's
       padding, the backend's plan and uploads, the launch); wait_s the sampler's call (its
       launch and the wait for the step's tokens). On the CPU backend fwd_s is the forward. */
    double host_s, fwd_s, wait_s;
    /* of fwd_s in graph steps (CUDA, eng_cuda_graph_times): preparing the step (of which the
       attention plan) and cudaGraphLaunch */
    double prep_s, plan_s, launch_s, build_s; /* build_s: first uses and captures */
    long long generated, expected, steps, decode_steps, graph_steps, prefill_tokens;
    long long captures, eager; /* graphs captured and steps run without one (CUDA) */
    uint64_t tokens_hash; /* of every sample's tokens, in (prompt, sample) order */
    int prefills, finished, kv_capacity_tokens, kv_peak_tokens, peak_running;
} s_grpo_t;

/* Blocks a group will hold at most: its prompt's full blocks once, and per sample every
   block from the prompt's partial one to the last token fed (the last sampled token never
   enters the KV). */
static void s_grp_need(s_grp_t *g, int n, int P, int bs)
{
    g->shared = P / bs;
    g->need = g->shared;
    for (int i = 0; i < n; i++) {
        g->smp[i].owned = (P + g->smp[i].len - 1 + bs - 1) / bs - g->shared;
        g->need += g->smp[i].owned;
    }
}

static int s_grpo(s_env_t *x, const eng_bm_config_t *c, const s_opts_t *o, double copy_gbps,
                  s_grpo_t *res)
{
    eng_backend_t *be = x->be;
    /* without sharing every sample is a group of its own (same prompt, seed and length) */
    const int sh = !o->grpo_no_sharing;
    const int G = sh ? o->grpo_prompts : o->grpo_prompts * o->grpo_samples;
    const int n = sh ? o->grpo_samples : 1, P = o->grpo_prompt;
    const int bs = c->block_size, budget = o->grpo_chunk;
    const int max_tok = o->grpo_max_batch + budget, max_rows = o->grpo_max_batch + n;
    int rc = -ENOMEM;
    eng_bm_t *m = NULL;
    eng_kv_t *kv = NULL;
    s_grp_t *grp = calloc((size_t)G, sizeof(*grp));
    int32_t *ids = malloc((size_t)max_tok * 4), *pos = malloc((size_t)max_tok * 4);
    int32_t *slots = malloc((size_t)max_tok * 4), *qs = malloc(((size_t)max_tok + 1) * 4);
    int32_t *ctxl = malloc((size_t)max_tok * 4), *rows = malloc((size_t)max_rows * 4);
    int32_t *tok = malloc((size_t)max_rows * 4), *tables = NULL;
    float *lp = malloc((size_t)max_rows * 4);
    eng_sample_params_t *sp = malloc((size_t)max_rows * sizeof(*sp));
    s_smp_t **row_smp = malloc((size_t)max_rows * sizeof(*row_smp));
    const eng_kv_seq_t **bseq = malloc((size_t)max_tok * sizeof(*bseq));
    size_t cap_tables = 0;
    memset(res, 0, sizeof(*res));
    if (!grp || !ids || !pos || !slots || !qs || !ctxl || !rows || !tok || !lp || !sp ||
        !row_smp || !bseq)
        goto out;
    /* the workload: prompts and per-sample lengths from the seed */
    long long need_all = 0;
    uint64_t h = s_mix(o->grpo_seed);
    for (int gi = 0; gi < G; gi++) {
        s_grp_t *g = &grp[gi];
        g->prompt = malloc((size_t)P * 4);
        g->smp = calloc((size_t)n, sizeof(s_smp_t));
        if (!g->prompt || !g->smp)
            goto out;
    }
    /* draw in (prompt, sample) order whatever the grouping */
    for (int pi = 0; pi < o->grpo_prompts; pi++) {
        int32_t *prompt = grp[sh ? pi : pi * o->grpo_samples].prompt;
        for (int t = 0; t < P; t++)
            prompt[t] = (int32_t)((h = s_mix(h)) % (uint64_t)c->vocab);
        for (int i = 0; i < o->grpo_samples; i++) {
            s_grp_t *g = &grp[sh ? pi : pi * o->grpo_samples + i];
            s_smp_t *s = &g->smp[sh ? i : 0];
            if (!sh && i > 0)
                memcpy(g->prompt, prompt, (size_t)P * 4);
            s->g = g;
            s->hash = 1469598103934665603ull;
            h = s_mix(h);
            s->len = o->grpo_min_new + (int)(h % (uint64_t)(o->grpo_max_new - o->grpo_min_new + 1));
            s->sp = (eng_sample_params_t){0.8f, 50, 0.95f, 0.0f, s_mix(h ^ 0xabcdefull), 0};
            res->expected += s->len;
        }
    }
    for (int gi = 0; gi < G; gi++) {
        grp[gi].n_live = n;
        s_grp_need(&grp[gi], n, P, bs);
        need_all += grp[gi].need;
    }
    /* KV capacity: what fits next to the weights (device), else all groups at once */
    long long cap = need_all;
    if (x->cuda && be->mem_info) {
        size_t free1 = 0;
        eng_bm_t *probe = eng_bm_new(be, c, 1, max_tok, max_rows, NULL, 0, 1);
        if (!probe)
            goto out;
        be->mem_info(be, &free1, NULL);
        size_t per_block = eng_bm_kv_bytes_per_token(probe) * bs;
        eng_bm_destroy(&probe);
        size_t margin = (size_t)3 << 30;
        long long fit = free1 > margin ? (long long)((free1 - margin) / per_block) : 0;
        if (fit < cap)
            cap = fit;
    }
    if (o->kv_blocks > 0 && o->kv_blocks < cap)
        cap = o->kv_blocks;
    long long biggest = 0;
    for (int gi = 0; gi < G; gi++)
        biggest = grp[gi].need > biggest ? grp[gi].need : biggest;
    if (cap < biggest) {
        ANV_ERROR("grpo: a group needs %lld KV blocks, the cache holds %lld", biggest, cap);
        rc = ANV_ETOOBIG;
        goto out;
    }
    m = eng_bm_new(be, c, (int)cap, max_tok, max_rows, x->fill, 42, x->cuda);
    kv = eng_kv_new((int)cap, bs);
    if (!m || !kv)
        goto out;
    eng_bm_set_graphs(m, o->graphs);
    res->kv_capacity_tokens = (int)(cap * bs);

    long long committed = 0, dec_tok = 0, cap0 = 0, eager0 = 0;
    int next = 0, running = 0, live_groups = 0;
    double prep0 = 0, plan0 = 0, launch0 = 0, build0 = 0;
    if (x->cuda) {
        eng_cuda_graph_stats(be, &cap0, NULL, &eager0);
        eng_cuda_graph_times(be, &prep0, &plan0, &launch0, &build0);
    }
    double t0 = s_now(), prefill_t = 0;
    while (next < G || live_groups > 0) {
        const double t_it = s_now();
        /* admission: a whole group when the KV it will hold fits */
        while (next < G && committed + grp[next].need <= cap && running + n <= o->grpo_max_batch) {
            grp[next].state = 1;
            committed += grp[next].need;
            running += n;
            live_groups++;
            res->prefills++;
            next++;
        }
        int nt = 0, ns = 0, nr = 0, max_blocks = 1;
        eng_kv_copy_t cp;
        /* decodes: every running sample feeds its last token */
        for (int gi = 0; gi < next; gi++) {
            s_grp_t *g = &grp[gi];
            if (g->state != 2)
                continue;
            for (int i = 0; i < n; i++) {
                s_smp_t *s = &g->smp[i];
                if (s->done)
                    continue;
                if ((rc = eng_kv_append(kv, &s->kv, 1, &slots[nt], &cp)))
                    goto out; /* cannot happen: admission committed the blocks */
                if (cp.src >= 0 && (rc = eng_bm_kv_copy(m, cp.src, cp.dst)))
                    goto out;
                ids[nt] = s->last;
                pos[nt] = P + s->gen - 1;
                qs[ns] = nt;
                ctxl[ns] = s->kv.n_tokens;
                bseq[ns++] = &s->kv;
                s->sp.step = (uint64_t)s->gen;
                sp[nr] = s->sp;
                row_smp[nr] = s;
                rows[nr++] = nt++;
            }
        }
        int n_dec = nt;
        /* prefill chunks of admitted groups, oldest first, within the step budget */
        int left = budget - n_dec > bs ? budget - n_dec : bs;
        int completing[64], n_comp = 0;
        for (int gi = 0; gi < next && left > 0 && n_comp < 64; gi++) {
            s_grp_t *g = &grp[gi];
            if (g->state != 1)
                continue;
            int k = P - g->prefilled < left ? P - g->prefilled : left;
            if ((rc = eng_kv_append(kv, &g->lead, k, &slots[nt], &cp)))
                goto out;
            if (cp.src >= 0 && (rc = eng_bm_kv_copy(m, cp.src, cp.dst)))
                goto out;
            qs[ns] = nt;
            for (int t = 0; t < k; t++) {
                ids[nt + t] = g->prompt[g->prefilled + t];
                pos[nt + t] = g->prefilled + t;
            }
            nt += k;
            g->prefilled += k;
            left -= k;
            res->prefill_tokens += k;
            ctxl[ns] = g->lead.n_tokens;
            bseq[ns++] = &g->lead;
            if (g->prefilled == P) {
                /* n rows of the same last token: one first draw per sample */
                for (int i = 0; i < n; i++) {
                    s_smp_t *s = &g->smp[i];
                    s->sp.step = 0;
                    sp[nr] = s->sp;
                    row_smp[nr] = s;
                    rows[nr++] = nt - 1;
                }
                completing[n_comp++] = gi;
            }
        }
        if (nt == 0) {
            ANV_ERROR("grpo: no work in a step with %d live groups", live_groups);
            rc = ANV_EINTERNAL;
            goto out;
        }
        qs[ns] = nt;
        for (int s = 0; s < ns; s++)
            max_blocks = bseq[s]->n_blocks > max_blocks ? bseq[s]->n_blocks : max_blocks;
        size_t tw = (size_t)ns * max_blocks;
        if (tw > cap_tables) {
            int32_t *t = realloc(tables, tw * 4);
            if (!t) {
                rc = -ENOMEM;
                goto out;
            }
            tables = t, cap_tables = tw;
        }
        for (int s = 0; s < ns; s++) {
            memcpy(tables + (size_t)s * max_blocks, bseq[s]->blocks,
                   (size_t)bseq[s]->n_blocks * 4);
            for (int b = bseq[s]->n_blocks; b < max_blocks; b++)
                tables[(size_t)s * max_blocks + b] = 0;
        }
        eng_attn_batch_t batch = {ns, qs, ctxl, tables, max_blocks};
        float *logits;
        double ts = s_now();
        if ((rc = eng_bm_forward(m, &batch, ids, pos, slots, rows, nr, &logits)))
            goto out;
        const double tf = s_now();
        if ((rc = s_sample(x, logits, nr, sp, tok, lp)))
            goto out;
        const double t_tok = s_now();
        if (nt > n_dec)
            prefill_t += t_tok - ts;
        res->steps++;
        res->decode_steps += nt == n_dec;
        dec_tok += n_dec;
        res->peak_running = running > res->peak_running ? running : res->peak_running;
        /* forks: sample 0 keeps the leader's table, the others share its blocks */
        for (int k = 0; k < n_comp; k++) {
            s_grp_t *g = &grp[completing[k]];
            for (int i = 0; i < n; i++) {
                s_smp_t *s = &g->smp[i];
                if (i == 0) {
                    s->kv = g->lead;
                    memset(&g->lead, 0, sizeof(g->lead));
                } else if ((rc = eng_kv_fork(kv, &g->smp[0].kv, &s->kv))) {
                    goto out;
                }
            }
            g->state = 2;
        }
        /* accept the drawn tokens; a sample at its length finishes and frees its blocks */
        for (int r = 0; r < nr; r++) {
            s_smp_t *s = row_smp[r];
            s_grp_t *g = s->g;
            s->last = tok[r];
            s->gen++;
            for (int b = 0; b < 4; b++)
                s->hash = (s->hash ^ (((uint32_t)tok[r] >> (8 * b)) & 255)) * 1099511628211ull;
            res->generated++;
            if (s->gen < s->len)
                continue;
            s->done = 1;
            eng_kv_release(kv, &s->kv);
            committed -= s->owned;
            running--;
            res->finished++;
            if (--g->n_live == 0) {
                committed -= g->shared;
                g->state = 3;
                live_groups--;
            }
        }
        if (nt == n_dec) /* the step's tokens were read back: the GPU idles until tf */
            res->host_s += (tf - t_it) + (s_now() - t_tok), res->fwd_s += tf - ts,
                res->wait_s += t_tok - tf;
    }
    res->wall_s = s_now() - t0;
    if (x->cuda && eng_cuda_graph_stats(be, &res->captures, NULL, &res->eager) == 0)
        res->captures -= cap0, res->eager -= eager0;
    if (x->cuda &&
        eng_cuda_graph_times(be, &res->prep_s, &res->plan_s, &res->launch_s, &res->build_s) == 0)
        res->prep_s -= prep0, res->plan_s -= plan0, res->launch_s -= launch0,
            res->build_s -= build0;
    res->prefill_s = prefill_t;
    res->tok_s = res->generated / res->wall_s;
    res->mean_batch = res->steps ? (double)dec_tok / res->steps : 0;
    res->kv_peak_tokens = eng_kv_peak_blocks(kv) * bs;
    res->graph_steps = eng_bm_graph_steps(m);
    res->tokens_hash = 1469598103934665603ull;
    for (int gi = 0; gi < G; gi++)
        for (int i = 0; i < n; i++)
            res->tokens_hash = (res->tokens_hash ^ grp[gi].smp[i].hash) * 1099511628211ull;
    if (eng_kv_free_blocks(kv) != eng_kv_total_blocks(kv)) {
        ANV_ERROR("grpo: %d KV blocks still held after every sample finished",
                  eng_kv_total_blocks(kv) - eng_kv_free_blocks(kv));
        rc = ANV_EINTERNAL;
        goto out;
    }
    (void)copy_gbps;
    rc = 0;
out:
    if (grp)
        for (int gi = 0; gi < G; gi++) {
            if (grp[gi].smp)
                for (int i = 0; i < n; i++)
                    eng_kv_seq_free(&grp[gi].smp[i].kv);
            eng_kv_seq_free(&grp[gi].lead);
            free(grp[gi].prompt);
            free(grp[gi].smp);
        }
    free(grp), free(ids), free(pos), free(slots), free(qs), free(ctxl), free(rows), free(tok);
    free(tables), free(lp), free(sp), free(row_smp), free(bseq);
    eng_kv_destroy(&kv);
    eng_bm_destroy(&m);
    return rc;
}

/* --- main -------------------------------------------------------------------------------- */

/* --- linear: the products one by one ------------------------------------------------------ */

typedef struct {
    const char *name;
    int in_dim, out_dim, norm, copies; /* copies: weight matrices cycled through (layers) */
    eng_lin_epi_t epi;
    void *w; /* copies x (out_dim, in_dim) bf16 */
} s_prod_t;

/* One pass of the timed loop: `reps` passes over the product's copies, one sync; seconds
   a call. */
static int s_linear_time(eng_backend_t *be,
                         const s_prod_t *p,
                         const eng_bm_config_t *c,
                         int B,
                         int reps,
                         float *out,
                         const float *x,
                         const void *norm_w,
                         const eng_linear_t *rope,
                         double *s_call)
{
    eng_linear_t f = {0};
    if (p->epi == ENG_LIN_ROPE_KV)
        f = *rope;
    f.norm_w = p->norm ? norm_w : NULL, f.norm_dtype = c->wdtype, f.eps = c->eps;
    f.epi = p->epi;
    size_t wb = (size_t)p->out_dim * p->in_dim * eng_dtype_size(c->wdtype);
    double t0 = 0;
    for (int r = -1; r < reps; r++) { /* r = -1: the warm-up pass, untimed */
        if (r == 0) {
            int rc = be->sync(be);
            if (rc)
                return rc;
            t0 = s_now();
        }
        for (int l = 0; l < p->copies; l++) {
            int rc = be->linear(be, out, x, (const char *)p->w + l * wb, NULL, c->wdtype, B,
                                p->in_dim, p->out_dim, &f);
            if (rc)
                return rc;
        }
    }
    int rc = be->sync(be);
    *s_call = (s_now() - t0) / ((double)reps * p->copies);
    return rc;
}

/* The products of one layer and lm_head at batch B (and each fixed segment count of the CUDA
   GEMV with --linear-sweep): us a call, the weights' GB/s and its fraction of the copy. */
static int
s_linear(s_env_t *x, const eng_bm_config_t *c, const s_opts_t *o, const char *dev, double copy_gbps)
{
    eng_backend_t *be = x->be;
    const int H = c->hidden, qd = c->n_head * c->head_dim, kd = c->n_kv_head * c->head_dim;
    const int L = c->n_layer;
    s_prod_t P[] = {
        {"qkv", H, qd + 2 * kd, 1, L, ENG_LIN_ROPE_KV, NULL},
        {"o", qd, H, 0, L, ENG_LIN_ADD, NULL},
        {"gate_up", H, 2 * c->ffn, 1, L, ENG_LIN_SWIGLU, NULL},
        {"down", c->ffn, H, 0, L, ENG_LIN_ADD, NULL},
        {"lm_head", H, c->vocab, 1, 1, ENG_LIN_PLAIN, NULL},
    };
    const int n_p = (int)(sizeof(P) / sizeof(P[0]));
    int max_b = 0, max_dim = 0, rc = 0;
    for (int i = 0; i < o->n_lin; i++)
        max_b = o->lin_batches[i] > max_b ? o->lin_batches[i] : max_b;
    for (int i = 0; i < n_p; i++) {
        max_dim = P[i].in_dim > max_dim ? P[i].in_dim : max_dim;
        max_dim = P[i].out_dim > max_dim ? P[i].out_dim : max_dim;
    }
    const size_t ws = eng_dtype_size(c->wdtype), kvs = eng_dtype_size(be->kv_dtype);
    const int bs = c->block_size, kv_blocks = (max_b + bs - 1) / bs;
    float *xin = be->alloc(be, (size_t)max_b * max_dim * 4);
    float *out = be->alloc(be, (size_t)max_b * max_dim * 4);
    void *norm_w = be->alloc(be, (size_t)max_dim * ws);
    void *kc = be->alloc(be, (size_t)kv_blocks * bs * kd * kvs);
    void *vc = be->alloc(be, (size_t)kv_blocks * bs * kd * kvs);
    int32_t *pos = calloc((size_t)max_b, 4), *slots = calloc((size_t)max_b, 4);
    if (!xin || !out || !norm_w || !kc || !vc || !pos || !slots) {
        rc = -ENOMEM;
        goto out;
    }
    for (int r = 0; r < max_b; r++)
        pos[r] = 100 + r, slots[r] = r;
    if ((rc = x->fill(be, xin, ENG_DTYPE_F32, (size_t)max_b * max_dim, 7, 0.0f, 1.0f)) ||
        (rc = x->fill(be, out, ENG_DTYPE_F32, (size_t)max_b * max_dim, 8, 0.0f, 1.0f)) ||
        (rc = x->fill(be, norm_w, c->wdtype, (size_t)max_dim, 9, 1.0f, 0.1f)))
        goto out;
    for (int i = 0; i < n_p; i++) {
        size_t n = (size_t)P[i].copies * P[i].out_dim * P[i].in_dim;
        if (!(P[i].w = be->alloc(be, n * ws))) {
            rc = -ENOMEM;
            goto out;
        }
        if ((rc = x->fill(be, P[i].w, c->wdtype, n, 100 + (uint64_t)i, 0.0f, 0.02f)))
            goto out;
    }
    /* segments a row (0: the default rule); the default alone unless --linear-sweep on CUDA */
    static const int knobs[] = {0, 1, 2, 4, 8, 0};
    const int n_knobs = o->lin_sweep && x->cuda ? (int)(sizeof(knobs) / sizeof(knobs[0])) : 1;
    if (o->lin_sweep && !x->cuda)
        fprintf(stderr, "anvil-bench-engine: --linear-sweep needs the CUDA backend; the "
                        "default only\n");
    if (!o->json)
        printf("linear device=%s copy_gbps=%.0f layers=%d reps=%d weights=%s\n", dev, copy_gbps, L,
               o->lin_reps, eng_dtype_name(c->wdtype));
    eng_step_t step = {0};
    for (int bi = 0; bi < o->n_lin; bi++) {
        const int B = o->lin_batches[bi];
        step.n_tok = B, step.pos = pos, step.slots = slots;
        eng_linear_t rope = {0};
        rope.k_cache = kc, rope.v_cache = vc, rope.pos = pos, rope.slots = slots;
        rope.n_head = c->n_head, rope.n_kv_head = c->n_kv_head, rope.head_dim = c->head_dim;
        rope.theta = c->rope_theta;
        /* the step's positions once (the rope table is built a step, not a call) */
        if (be->prepare && (rc = be->prepare(be, &step)))
            goto out;
        for (int k = 0; k < n_knobs; k++) {
            if (x->cuda && (rc = eng_cuda_gemv_segs(be, knobs[k])))
                goto out;
            double layer_us = 0, layer_bytes = 0;
            for (int i = 0; i < n_p; i++) {
                double sc = 0;
                if ((rc =
                         s_linear_time(be, &P[i], c, B, o->lin_reps, out, xin, norm_w, &rope, &sc)))
                    goto out;
                const double bytes = (double)P[i].out_dim * P[i].in_dim * ws;
                const double gbps = bytes / sc / 1e9;
                if (i < n_p - 1)
                    layer_us += sc * 1e6, layer_bytes += bytes;
                if (o->json)
                    printf("{\"bench\":\"linear\",\"device\":\"%s\",\"batch\":%d,"
                           "\"segs\":%d,\"product\":\"%s\",\"in\":%d,\"out\":%d,\"us\":%.2f,"
                           "\"gbps\":%.0f,\"frac_copy\":%.3f}\n",
                           dev, B, knobs[k], P[i].name, P[i].in_dim, P[i].out_dim, sc * 1e6, gbps,
                           copy_gbps > 0 ? gbps / copy_gbps : 0);
                else
                    printf("linear batch=%d segs=%d product=%-7s in=%d out=%d us=%.2f "
                           "gbps=%.0f frac_copy=%.3f\n",
                           B, knobs[k], P[i].name, P[i].in_dim, P[i].out_dim, sc * 1e6, gbps,
                           copy_gbps > 0 ? gbps / copy_gbps : 0);
            }
            const double lg = layer_bytes / (layer_us * 1e-6) / 1e9;
            if (o->json)
                printf("{\"bench\":\"linear\",\"device\":\"%s\",\"batch\":%d,"
                       "\"segs\":%d,\"product\":\"layer\",\"us\":%.2f,\"gbps\":%.0f,"
                       "\"frac_copy\":%.3f}\n",
                       dev, B, knobs[k], layer_us, lg, copy_gbps > 0 ? lg / copy_gbps : 0);
            else
                printf("linear batch=%d segs=%d product=layer   us=%.2f gbps=%.0f "
                       "frac_copy=%.3f\n",
                       B, knobs[k], layer_us, lg, copy_gbps > 0 ? lg / copy_gbps : 0);
            fflush(stdout);
        }
    }
    if (x->cuda)
        rc = eng_cuda_gemv_segs(be, 0);
out:
    if (rc)
        fprintf(stderr, "anvil-bench-engine: linear failed: %s\n", anv_strerror(rc));
    for (int i = 0; i < n_p; i++)
        be->free(be, P[i].w);
    be->free(be, xin), be->free(be, out), be->free(be, norm_w);
    be->free(be, kc), be->free(be, vc);
    free(pos), free(slots);
    return rc;
}

static void s_print_decode(const s_opts_t *o, const char *dev, const char *kind,
                           const s_result_t *r, const s_result_t *g, int n_new)
{
    if (o->json) {
        printf("{\"bench\":\"%s\",\"device\":\"%s\",\"batch\":%d,\"%s\":%d,\"new\":%d,"
               "\"tok_s\":%.1f,\"ms_step\":%.3f,\"gbps\":%.0f,\"frac_copy\":%.3f,"
               "\"prefill_tok_s\":%.0f",
               kind, dev, r->batch, strcmp(kind, "decode") ? "ctx" : "prompt", r->ctx, n_new,
               r->tok_s, r->ms_step, r->gbps, r->frac, r->prefill_tok_s);
        if (g)
            printf(",\"graphs_tok_s\":%.1f,\"graphs_ms_step\":%.3f,\"graphs_frac_copy\":%.3f,"
                   "\"graphs_speedup\":%.3f,\"graph_steps\":%lld",
                   g->tok_s, g->ms_step, g->frac, g->tok_s / r->tok_s, g->graph_steps);
        printf("}\n");
    } else {
        printf("%s batch=%-4d %s=%d new=%d tok_s=%.1f ms_step=%.3f gbps=%.0f frac_copy=%.3f "
               "prefill_tok_s=%.0f",
               kind, r->batch, strcmp(kind, "decode") ? "ctx" : "prompt", r->ctx, n_new,
               r->tok_s, r->ms_step, r->gbps, r->frac, r->prefill_tok_s);
        if (g)
            printf(" graphs_tok_s=%.1f graphs_ms_step=%.3f graphs_frac_copy=%.3f "
                   "graphs_speedup=%.3f graph_steps=%lld",
                   g->tok_s, g->ms_step, g->frac, g->tok_s / r->tok_s, g->graph_steps);
        printf("\n");
    }
    fflush(stdout);
}

/* One decode configuration, with graphs off and (when asked) on. */
static int s_decode_config(s_env_t *x, eng_bm_t *m, const eng_bm_config_t *c,
                           const s_opts_t *o, const char *dev, const char *kind, int B, int P,
                           int N, int synthetic, double copy_gbps, s_result_t *r,
                           s_result_t *g)
{
    eng_bm_set_graphs(m, 0);
    int rc = s_run(x, m, c, B, P, N, o->chunk, synthetic, copy_gbps, r);
    if (rc == 0 && o->graphs) {
        eng_bm_set_graphs(m, 1);
        rc = s_run(x, m, c, B, P, N, o->chunk, synthetic, copy_gbps, g);
        eng_bm_set_graphs(m, 0);
    }
    if (rc == 0)
        s_print_decode(o, dev, kind, r, o->graphs ? g : NULL, N);
    return rc;
}

int main(int argc, char **argv)
{
    s_opts_t o;
    anv_log_init("anvil-bench-engine");
    if (s_parse(argc, argv, &o))
        return 2;
    s_env_t x = {0};
    x.cuda = strcmp(o.backend, "cuda") == 0;
    if (x.cuda && !eng_cuda_available()) {
        fprintf(stderr, "anvil-bench-engine: no CUDA device visible; nothing to measure "
                        "(--backend cpu --shape tiny runs the workload logic on the CPU)\n");
        return 77;
    }
    eng_backend_t *be = eng_backend_new_kv(o.backend, o.threads, o.kv_dtype);
    if (!be)
        return 1;
    x.be = be;
    x.fill = x.cuda ? eng_cuda_fill_random : eng_bm_fill_host;
    int rc = 1;
    eng_bm_t *m = NULL;
    s_result_t res[S_MAX_BATCHES], gres[S_MAX_BATCHES], cres = {0}, cgres = {0};
    s_grpo_t gr = {0};
    char dev[128] = "cpu";
    double copy_gbps = 0;
    if (x.cuda) {
        eng_cuda_device_name(be, dev, sizeof(dev));
        if (eng_cuda_copy_bandwidth(be, (size_t)2 << 30, 21, &copy_gbps))
            goto out;
    } else {
        copy_gbps = s_host_copy_gbps((size_t)64 << 20);
    }
    eng_bm_config_t c = {155136, 4096, 32, 32, 8, 128, 14336, 500000.0f, 1e-6f,
                         ENG_DTYPE_BF16, 16};
    if (strcmp(o.shape, "small") == 0)
        c = (eng_bm_config_t){32000, 1024, 4, 16, 4, 64, 2816, 10000.0f, 1e-6f,
                              ENG_DTYPE_BF16, 16};
    else if (strcmp(o.shape, "tiny") == 0)
        c = (eng_bm_config_t){512, 256, 2, 4, 1, 64, 688, 10000.0f, 1e-6f, ENG_DTYPE_BF16, 16};
    if (o.layers > 0)
        c.n_layer = o.layers;
    x.vocab = c.vocab;
    int max_b = 0;
    for (int i = 0; i < o.n_batches; i++)
        max_b = o.batches[i] > max_b ? o.batches[i] : max_b;
    int bps = (o.prompt + o.n_new + c.block_size - 1) / c.block_size;
    size_t kv_tok = 0, free1 = 0;
    double cap_tokens = 0, weights_gb = 0, step_gb = 0;

    /* decode: one model with pools for the largest batch */
    if (o.n_batches > 0) {
        m = eng_bm_new(be, &c, max_b * bps, o.chunk > max_b ? o.chunk : max_b, max_b, x.fill,
                       42, x.cuda);
        if (!m)
            goto out;
        if (be->mem_info)
            be->mem_info(be, &free1, NULL);
        kv_tok = eng_bm_kv_bytes_per_token(m);
        weights_gb = eng_bm_weight_bytes(m) / 1e9;
        step_gb = eng_bm_step_weight_bytes(m, 1) / 1e9;
        size_t pools = (size_t)max_b * bps * c.block_size * kv_tok;
        /* what the engine could hold: free memory after weights and activations, 90 % */
        cap_tokens = be->mem_info ? ((double)free1 + pools) * 0.9 / kv_tok : 0;
        if (!o.json)
            printf("device=%s backend=%s shape=%s copy_gbps=%.0f weights_gb=%.6g "
                   "step_weights_gb=%.6g kv_dtype=%s kv_bytes_per_token=%zu "
                   "kv_capacity_tokens=%.0f layers=%d "
                   "graphs=%s linear=%s attention=%s\n",
                   dev, o.backend, o.shape, copy_gbps, weights_gb, step_gb,
                   eng_dtype_name(be->kv_dtype), kv_tok, cap_tokens, c.n_layer,
                   o.graphs ? "off,on" : "off", eng_linear_enabled(be) ? "fused" : "op-by-op",
                   x.cuda ? eng_cuda_decode_attention(be, c.n_head, c.n_kv_head) : "cpu");
        for (int i = 0; i < o.n_batches; i++)
            if (s_decode_config(&x, m, &c, &o, dev, "decode", o.batches[i], o.prompt, o.n_new,
                                0, copy_gbps, &res[i], &gres[i]))
                goto out;
        eng_bm_destroy(&m);
    }
    /* decode at a long context (its KV filled at random, no prefill) */
    int ctx_fits = 1;
    if (o.ctx_batch > 0) {
        int bpc = (o.ctx_len + o.ctx_new + c.block_size - 1) / c.block_size;
        m = eng_bm_new(be, &c, o.ctx_batch * bpc, o.ctx_batch, o.ctx_batch, x.fill, 43, x.cuda);
        if (!m && errno == ENOMEM && x.cuda) {
            /* its KV does not fit beside the weights (bf16 KV at 256 x 2k on an 80 GB card):
               the line says so and the other workloads still run */
            ctx_fits = 0;
            const long need = (long)o.ctx_batch * bpc * c.block_size;
            if (o.json)
                printf("{\"bench\":\"decode_ctx\",\"device\":\"%s\",\"batch\":%d,\"ctx\":%d,"
                       "\"new\":%d,\"skipped\":\"out of memory\",\"kv_tokens\":%ld,"
                       "\"kv_capacity_tokens\":%.0f}\n",
                       dev, o.ctx_batch, o.ctx_len, o.ctx_new, need, cap_tokens);
            else
                printf("decode_ctx batch=%-4d ctx=%d new=%d skipped: out of memory (its KV is "
                       "%ld tokens; kv_capacity_tokens=%.0f, 0 = not measured)\n",
                       o.ctx_batch, o.ctx_len, o.ctx_new, need, cap_tokens);
            fflush(stdout);
        } else {
            if (!m || eng_bm_kv_fill(m, x.fill, 4242))
                goto out;
            if (s_decode_config(&x, m, &c, &o, dev, "decode_ctx", o.ctx_batch, o.ctx_len, o.ctx_new,
                                1, copy_gbps, &cres, &cgres))
                goto out;
            eng_bm_destroy(&m);
        }
    }
    if (o.n_lin > 0 && s_linear(&x, &c, &o, dev, copy_gbps))
        goto out;
    if (o.grpo_prompts > 0) {
        if (s_grpo(&x, &c, &o, copy_gbps, &gr))
            goto out;
        /* ms a decode-only step: the host's work between steps, the sampler's call */
        const double nd = gr.decode_steps > 0 ? (double)gr.decode_steps : 1.0;
        const double dhost = 1e3 * gr.host_s / nd, dwait = 1e3 * gr.wait_s / nd;
        const double dfwd = 1e3 * gr.fwd_s / nd;
        const double ng = gr.graph_steps > 0 ? (double)gr.graph_steps : 1.0;
        const double gprep = 1e3 * gr.prep_s / ng, gplan = 1e3 * gr.plan_s / ng;
        const double glaunch = 1e3 * gr.launch_s / ng, gbuild = 1e3 * gr.build_s / ng;
        if (o.json)
            printf("{\"bench\":\"grpo\",\"device\":\"%s\",\"prompts\":%d,\"samples\":%d,"
                   "\"prompt\":%d,\"min_new\":%d,\"max_new\":%d,\"graphs\":%s,\"tok_s\":%.1f,"
                   "\"generated\":%lld,\"expected\":%lld,\"finished\":%d,\"wall_s\":%.3f,"
                   "\"prefill_s\":%.3f,\"prefills\":%d,\"prefill_tokens\":%lld,\"steps\":%lld,"
                   "\"decode_steps\":%lld,\"graph_steps\":%lld,\"mean_batch\":%.1f,"
                   "\"peak_running\":%d,\"kv_peak_tokens\":%d,\"kv_capacity_tokens\":%d,"
                   "\"decode_host_ms\":%.3f,\"decode_fwd_ms\":%.3f,\"decode_wait_ms\":%.3f,"
                   "\"graph_prep_ms\":%.3f,\"graph_plan_ms\":%.3f,\"graph_launch_ms\":%.3f,"
                   "\"graph_build_ms\":%.3f,"
                   "\"graph_captures\":%lld,"
                   "\"graph_eager\":%lld,\"sharing\":%s,\"tokens_hash\":\"%016llx\"}\n",
                   dev, o.grpo_prompts, o.grpo_samples, o.grpo_prompt, o.grpo_min_new,
                   o.grpo_max_new, o.graphs ? "true" : "false", gr.tok_s, gr.generated, gr.expected,
                   gr.finished, gr.wall_s, gr.prefill_s, gr.prefills, gr.prefill_tokens, gr.steps,
                   gr.decode_steps, gr.graph_steps, gr.mean_batch, gr.peak_running,
                   gr.kv_peak_tokens, gr.kv_capacity_tokens, dhost, dfwd, dwait, gprep, gplan,
                   glaunch, gbuild, gr.captures, gr.eager, o.grpo_no_sharing ? "false" : "true",
                   (unsigned long long)gr.tokens_hash);
        else
            printf(
                "grpo prompts=%d samples=%d prompt=%d new=%d..%d graphs=%s tok_s=%.1f "
                "generated=%lld expected=%lld finished=%d wall_s=%.3f prefill_s=%.3f "
                "prefills=%d prefill_tokens=%lld steps=%lld decode_steps=%lld "
                "graph_steps=%lld mean_batch=%.1f peak_running=%d kv_peak_tokens=%d "
                "kv_capacity_tokens=%d decode_host_ms=%.3f decode_fwd_ms=%.3f decode_wait_ms=%.3f "
                "graph_prep_ms=%.3f graph_plan_ms=%.3f graph_launch_ms=%.3f graph_build_ms=%.3f "
                "graph_captures=%lld graph_eager=%lld sharing=%s tokens_hash=%016llx\n",
                o.grpo_prompts, o.grpo_samples, o.grpo_prompt, o.grpo_min_new, o.grpo_max_new,
                o.graphs ? "on" : "off", gr.tok_s, gr.generated, gr.expected, gr.finished,
                gr.wall_s, gr.prefill_s, gr.prefills, gr.prefill_tokens, gr.steps, gr.decode_steps,
                gr.graph_steps, gr.mean_batch, gr.peak_running, gr.kv_peak_tokens,
                gr.kv_capacity_tokens, dhost, dfwd, dwait, gprep, gplan, glaunch, gbuild,
                gr.captures, gr.eager, o.grpo_no_sharing ? "off" : "on",
                (unsigned long long)gr.tokens_hash);
        fflush(stdout);
    }
    if (o.json) {
        printf("{\"bench\":\"summary\",\"device\":\"%s\",\"backend\":\"%s\",\"copy_gbps\":%.0f,"
               "\"kv_capacity_tokens\":%.0f,\"weights_gb\":%.6g,\"step_weights_gb\":%.6g,"
               "\"kv_dtype\":\"%s\",\"linear\":\"%s\",\"attention\":\"%s\"",
               dev, o.backend, copy_gbps, cap_tokens, weights_gb, step_gb,
               eng_dtype_name(be->kv_dtype), eng_linear_enabled(be) ? "fused" : "op-by-op",
               x.cuda ? eng_cuda_decode_attention(be, c.n_head, c.n_kv_head) : "cpu");
        for (int i = 0; i < o.n_batches; i++) {
            printf(",\"b%d_tok_s\":%.1f", res[i].batch, res[i].tok_s);
            if (o.graphs)
                printf(",\"b%d_graphs_tok_s\":%.1f", res[i].batch, gres[i].tok_s);
        }
        if (o.ctx_batch > 0 && ctx_fits)
            printf(",\"ctx_b%d_tok_s\":%.1f", o.ctx_batch, o.graphs ? cgres.tok_s : cres.tok_s);
        if (o.grpo_prompts > 0)
            printf(",\"grpo_tok_s\":%.1f,\"grpo_prefills\":%d", gr.tok_s, gr.prefills);
        printf("}\n");
    } else {
        printf("summary copy_gbps=%.0f kv_capacity_tokens=%.0f", copy_gbps, cap_tokens);
        for (int i = 0; i < o.n_batches; i++) {
            printf(" b%d_tok_s=%.1f b%d_frac_copy=%.3f", res[i].batch, res[i].tok_s,
                   res[i].batch, res[i].frac);
            if (o.graphs)
                printf(" b%d_graphs_tok_s=%.1f", res[i].batch, gres[i].tok_s);
        }
        if (o.ctx_batch > 0 && ctx_fits)
            printf(" ctx%d_b%d_tok_s=%.1f", o.ctx_len, o.ctx_batch,
                   o.graphs ? cgres.tok_s : cres.tok_s);
        if (o.grpo_prompts > 0)
            printf(" grpo_tok_s=%.1f grpo_prefills=%d", gr.tok_s, gr.prefills);
        printf("\n");
    }
    rc = 0;
out:
    eng_bm_destroy(&m);
    be->destroy(&be);
    return rc;
}

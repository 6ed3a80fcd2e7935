/*  anvil_bench_engine.c - decode throughput of the CUDA engine backend on a Seed-Coder-8B shape.

    Builds a random bf16 model of the given shape directly on the GPU (no checkpoint), then
    for each batch size prefills `prompt` random tokens per sequence (in chunks) and decodes
    `new` tokens with on-GPU sampling (temperature 0.8, top-k 50, top-p 0.95, one seed per
    sequence), timing the decode steps with the host clock (every step ends with the sampled
    tokens on the host, as in the engine). Achieved bandwidth counts the bytes a step must
    read at least: all weights plus the K/V of every cached position; it is reported as a
    fraction of a device-to-device copy measured at start. One line per batch size, then a
    summary line; --json prints the same as JSON objects.
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

#define S_MAX_BATCHES 16

typedef struct {
    int json, prompt, n_new, layers, chunk, n_batches;
    int batches[S_MAX_BATCHES];
    int small;
} s_opts_t;

static double s_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int s_parse(int argc, char **argv, s_opts_t *o)
{
    o->json = 0, o->prompt = 512, o->n_new = 256, o->layers = 32, o->chunk = 8192;
    o->n_batches = 4, o->small = 0;
    o->batches[0] = 1, o->batches[1] = 16, o->batches[2] = 64, o->batches[3] = 256;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--json") == 0) {
            o->json = 1;
        } else if (strcmp(a, "--small") == 0) {
            o->small = 1;
        } else if (strcmp(a, "--prompt") == 0 && v) {
            o->prompt = atoi(v), i++;
        } else if (strcmp(a, "--new") == 0 && v) {
            o->n_new = atoi(v), i++;
        } else if (strcmp(a, "--layers") == 0 && v) {
            o->layers = atoi(v), i++;
        } else if (strcmp(a, "--chunk") == 0 && v) {
            o->chunk = atoi(v), i++;
        } else if (strcmp(a, "--batches") == 0 && v) {
            o->n_batches = 0;
            for (char *s = argv[++i]; *s && o->n_batches < S_MAX_BATCHES;) {
                o->batches[o->n_batches++] = (int)strtol(s, &s, 10);
                if (*s == ',')
                    s++;
                else if (*s)
                    return -1;
            }
        } else {
            fprintf(stderr,
                    "usage: anvil-bench-engine [--json] [--batches 1,16,64,256] [--prompt 512]"
                    " [--new 256] [--layers 32] [--chunk 8192] [--small]\n");
            return -1;
        }
    }
    for (int i = 0; i < o->n_batches; i++)
        if (o->batches[i] <= 0)
            return -1;
    if (o->prompt < 1 || o->n_new < 1 || o->layers < 1 || o->chunk < o->prompt)
        return -1;
    return 0;
}

typedef struct {
    int batch;
    double decode_s, prefill_s, tok_s, ms_step, gbps, frac, prefill_tok_s;
} s_result_t;

/* Runs one batch size; sequences s own blocks [s * bps, (s + 1) * bps). */
static int s_run(eng_backend_t *be, eng_bm_t *m, const eng_bm_config_t *c, const s_opts_t *o,
                 int B, double copy_gbps, s_result_t *r)
{
    int P = o->prompt, N = o->n_new, bs = c->block_size;
    int bps = (P + N + bs - 1) / bs;
    int max_tok = o->chunk > B ? o->chunk : B;
    int32_t *q_start = calloc((size_t)B + 1, 4), *ctx = calloc((size_t)B, 4);
    int32_t *tables = calloc((size_t)B * bps, 4), *ids = calloc((size_t)max_tok, 4);
    int32_t *pos = calloc((size_t)max_tok, 4), *slots = calloc((size_t)max_tok, 4);
    int32_t *rows = calloc((size_t)B, 4), *last = calloc((size_t)B, 4);
    float *lp = calloc((size_t)B, 4);
    eng_sample_params_t *sp = calloc((size_t)B, sizeof(*sp));
    int rc = -ENOMEM;
    uint64_t rng = 0x1234567ull + (uint64_t)B;
    float *logits;
    if (!q_start || !ctx || !tables || !ids || !pos || !slots || !rows || !last || !lp || !sp)
        goto out;
    for (int s = 0; s < B; s++) {
        for (int b = 0; b < bps; b++)
            tables[(size_t)s * bps + b] = s * bps + b;
        sp[s] = (eng_sample_params_t){0.8f, 50, 0.95f, 0.0f, 1000003ull * (uint64_t)s + 17, 0};
    }
    /* prefill, whole prompts, as many sequences per step as fit in a chunk */
    double t0 = s_now();
    for (int s0 = 0; s0 < B;) {
        int ns = o->chunk / P;
        if (ns > B - s0)
            ns = B - s0;
        q_start[0] = 0;
        for (int i = 0; i < ns; i++) {
            int s = s0 + i;
            q_start[i + 1] = q_start[i] + P;
            ctx[i] = P;
            for (int t = 0; t < P; t++) {
                int k = q_start[i] + t;
                rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                ids[k] = (int32_t)((rng >> 33) % (uint64_t)c->vocab);
                pos[k] = t;
                slots[k] = tables[(size_t)s * bps + t / bs] * bs + t % bs;
            }
            rows[i] = q_start[i + 1] - 1;
        }
        eng_attn_batch_t batch = {ns, q_start, ctx, tables + (size_t)s0 * bps, bps};
        if ((rc = eng_bm_forward(m, &batch, ids, pos, slots, rows, ns, &logits)))
            goto out;
        if ((rc = be->sample(be, last + s0, lp + s0, logits, ns, c->vocab, sp + s0)))
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
        if ((rc = be->sample(be, last, lp, logits, B, c->vocab, sp)))
            goto out;
    }
    double t2 = s_now();
    r->batch = B;
    r->prefill_s = t1 - t0;
    r->decode_s = t2 - t1;
    r->tok_s = (double)B * N / r->decode_s;
    r->ms_step = r->decode_s * 1e3 / N;
    double bytes = (double)eng_bm_weight_bytes(m) * N + kv_pos * eng_bm_kv_bytes_per_token(m);
    r->gbps = bytes / r->decode_s / 1e9;
    r->frac = r->gbps / copy_gbps;
    r->prefill_tok_s = (double)B * P / r->prefill_s;
    rc = 0;
out:
    free(q_start), free(ctx), free(tables), free(ids), free(pos), free(slots), free(rows);
    free(last), free(lp), free(sp);
    return rc;
}

int main(int argc, char **argv)
{
    s_opts_t o;
    anv_log_init("anvil-bench-engine");
    if (s_parse(argc, argv, &o))
        return 2;
    if (!eng_cuda_available()) {
        fprintf(stderr, "anvil-bench-engine: no CUDA device visible; nothing to measure\n");
        return 77;
    }
    eng_backend_t *be = eng_cuda_backend_new();
    if (!be)
        return 1;
    int rc = 1;
    eng_bm_t *m = NULL;
    s_result_t res[S_MAX_BATCHES];
    char dev[128] = "?";
    eng_cuda_device_name(be, dev, sizeof(dev));
    double copy_gbps = 0;
    if (eng_cuda_copy_bandwidth(be, (size_t)2 << 30, 21, &copy_gbps))
        goto out;
    eng_bm_config_t c = {155136, 4096, o.layers, 32, 8, 128, 14336, 500000.0f, 1e-6f,
                         ENG_DTYPE_BF16, 16};
    if (o.small)
        c = (eng_bm_config_t){32000, 1024, 4, 16, 4, 64, 2816, 10000.0f, 1e-6f,
                              ENG_DTYPE_BF16, 16};
    int max_b = 0;
    for (int i = 0; i < o.n_batches; i++)
        max_b = o.batches[i] > max_b ? o.batches[i] : max_b;
    int bps = (o.prompt + o.n_new + c.block_size - 1) / c.block_size;
    size_t free0 = 0, total = 0, free1 = 0;
    be->mem_info(be, &free0, &total);
    m = eng_bm_new(be, &c, max_b * bps, o.chunk > max_b ? o.chunk : max_b, max_b,
                   eng_cuda_fill_random, 42, 1);
    if (!m)
        goto out;
    be->mem_info(be, &free1, NULL);
    size_t kv_tok = eng_bm_kv_bytes_per_token(m);
    size_t pools = (size_t)max_b * bps * c.block_size * kv_tok;
    /* what the engine could hold: free memory after weights and activations, 90 % of it */
    double cap_tokens = ((double)free1 + pools) * 0.9 / kv_tok;
    if (!o.json)
        printf("device=%s copy_gbps=%.0f weights_gb=%.2f kv_bytes_per_token=%zu "
               "kv_capacity_tokens=%.0f layers=%d\n",
               dev, copy_gbps, eng_bm_weight_bytes(m) / 1e9, kv_tok, cap_tokens, c.n_layer);
    for (int i = 0; i < o.n_batches; i++) {
        if (s_run(be, m, &c, &o, o.batches[i], copy_gbps, &res[i]))
            goto out;
        s_result_t *r = &res[i];
        if (o.json)
            printf("{\"bench\":\"decode\",\"device\":\"%s\",\"batch\":%d,\"prompt\":%d,\"new\":%d,"
                   "\"tok_s\":%.1f,\"ms_step\":%.3f,\"gbps\":%.0f,\"frac_copy\":%.3f,"
                   "\"prefill_tok_s\":%.0f}\n",
                   dev, r->batch, o.prompt, o.n_new, r->tok_s, r->ms_step, r->gbps, r->frac,
                   r->prefill_tok_s);
        else
            printf("decode batch=%-4d prompt=%d new=%d tok_s=%.1f ms_step=%.3f gbps=%.0f "
                   "frac_copy=%.3f prefill_tok_s=%.0f\n",
                   r->batch, o.prompt, o.n_new, r->tok_s, r->ms_step, r->gbps, r->frac,
                   r->prefill_tok_s);
        fflush(stdout);
    }
    if (o.json) {
        printf("{\"bench\":\"summary\",\"device\":\"%s\",\"copy_gbps\":%.0f,"
               "\"kv_capacity_tokens\":%.0f,\"weights_gb\":%.2f",
               dev, copy_gbps, cap_tokens, eng_bm_weight_bytes(m) / 1e9);
        for (int i = 0; i < o.n_batches; i++)
            printf(",\"b%d_tok_s\":%.1f", res[i].batch, res[i].tok_s);
        printf("}\n");
    } else {
        printf("summary copy_gbps=%.0f kv_capacity_tokens=%.0f", copy_gbps, cap_tokens);
        for (int i = 0; i < o.n_batches; i++)
            printf(" b%d_tok_s=%.1f b%d_frac_copy=%.3f", res[i].batch, res[i].tok_s,
                   res[i].batch, res[i].frac);
        printf("\n");
    }
    rc = 0;
out:
    eng_bm_destroy(&m);
    be->destroy(&be);
    return rc;
}

/*  test_cuda_graphs.c - decode through CUDA graphs gives the tokens of decode without them.

    A small random Llama (GQA 8/2 heads, head_dim 64, bf16 weights and KV) on one CUDA
    backend. For batch sizes 1, 3 and 16: prefill prompts of different lengths (one mixed
    step), then 64 greedy decode steps with on-GPU sampling, once op by op and once with
    eng_bm_set_graphs (bucket padding: 3 runs as 4; at batch 1 and 3 the block-table stride
    grows from 8 to 16 blocks during the run, so a second graph key is captured). The greedy tokens must be
    identical, the logprobs within 1e-4, and the graph run must really have replayed graphs
    (captures > 0, launches >= steps - 2 per key). A third run interleaves the two models
    step by step on the same backend, which moves scratch buffers between graph steps and
    forces re-captures (the epoch logic); its tokens must match too.
    --steps N changes the number of decode steps.
*/
#include "ecu_test.h"

#include "anv_log.h"
#include "eng_bench_model.h"
#include "eng_cuda.h"

static const eng_bm_config_t s_cfg = {1024, 512, 3, 8, 2, 64, 1376, 10000.0f, 1e-6f,
                                      ENG_DTYPE_BF16, 16};

typedef struct {
    eng_bm_t *m;
    int B, P0, steps, mb;
    int32_t *tables, *q_start, *ctx, *ids, *pos, *slots, *rows, *tok;
    float *lp;
    eng_sample_params_t *sp;
    int32_t *out_tok; /* (steps + 1, B) */
    float *out_lp;
    int step;
} s_run_t;

static int s_run_init(s_run_t *r, eng_backend_t *be, int B, int steps, int graphs)
{
    memset(r, 0, sizeof(*r));
    r->B = B, r->steps = steps, r->P0 = 100;
    int maxlen = r->P0 + 3 * (B - 1) + steps + 1;
    r->mb = (maxlen + s_cfg.block_size - 1) / s_cfg.block_size;
    int max_tok = B * (r->P0 + 3 * B);
    r->m = eng_bm_new(be, &s_cfg, B * r->mb, max_tok, B, eng_bm_fill_host, 11, 1);
    if (!r->m)
        return -1;
    eng_bm_set_graphs(r->m, graphs);
    r->tables = calloc((size_t)B * r->mb, 4);
    r->q_start = calloc((size_t)B + 1, 4);
    r->ctx = calloc((size_t)B, 4);
    r->ids = calloc((size_t)max_tok, 4);
    r->pos = calloc((size_t)max_tok, 4);
    r->slots = calloc((size_t)max_tok, 4);
    r->rows = calloc((size_t)B, 4);
    r->tok = calloc((size_t)B, 4);
    r->lp = calloc((size_t)B, 4);
    r->sp = calloc((size_t)B, sizeof(*r->sp));
    r->out_tok = calloc((size_t)(steps + 1) * B, 4);
    r->out_lp = calloc((size_t)(steps + 1) * B, 4);
    /* blocks of sequence s scattered over the pool: block k of s is k * B + s */
    for (int s = 0; s < B; s++)
        for (int k = 0; k < r->mb; k++)
            r->tables[s * r->mb + k] = k * B + s;
    /* prefill: sequence s has P0 + 3 s prompt tokens */
    uint64_t h = 12345;
    for (int s = 0; s < B; s++) {
        int P = r->P0 + 3 * s;
        r->q_start[s + 1] = r->q_start[s] + P;
        r->ctx[s] = P;
        for (int t = 0; t < P; t++) {
            int k = r->q_start[s] + t;
            h = h * 6364136223846793005ull + 1442695040888963407ull;
            r->ids[k] = (int32_t)((h >> 33) % (uint64_t)s_cfg.vocab);
            r->pos[k] = t;
            r->slots[k] = r->tables[s * r->mb + t / s_cfg.block_size] * s_cfg.block_size +
                          t % s_cfg.block_size;
        }
        r->rows[s] = r->q_start[s + 1] - 1;
        r->sp[s] = (eng_sample_params_t){0.0f, 0, 1.0f, 0.0f, (uint64_t)s + 1, 0};
    }
    return 0;
}

static void s_run_free(s_run_t *r)
{
    eng_bm_destroy(&r->m);
    free(r->tables), free(r->q_start), free(r->ctx), free(r->ids), free(r->pos);
    free(r->slots), free(r->rows), free(r->tok), free(r->lp), free(r->sp);
    free(r->out_tok), free(r->out_lp);
}

/* One step: the prefill (step 0) or a decode step. */
static int s_run_step(s_run_t *r, eng_backend_t *be)
{
    int B = r->B, bs = s_cfg.block_size;
    if (r->step > 0) {
        for (int s = 0; s < B; s++) {
            int p = r->ctx[s];
            r->q_start[s + 1] = s + 1;
            r->ids[s] = r->tok[s];
            r->pos[s] = p;
            r->slots[s] = r->tables[s * r->mb + p / bs] * bs + p % bs;
            r->ctx[s] = p + 1;
            r->rows[s] = s;
            r->sp[s].step = (uint64_t)r->step;
        }
    }
    eng_attn_batch_t b = {B, r->q_start, r->ctx, r->tables, r->mb};
    float *logits;
    if (eng_bm_forward(r->m, &b, r->ids, r->pos, r->slots, r->rows, B, &logits) ||
        be->sample(be, r->tok, r->lp, logits, B, s_cfg.vocab, r->sp))
        return -1;
    memcpy(r->out_tok + (size_t)r->step * B, r->tok, (size_t)B * 4);
    memcpy(r->out_lp + (size_t)r->step * B, r->lp, (size_t)B * 4);
    r->step++;
    return 0;
}

static void s_compare(const char *what, int B, const s_run_t *a, const s_run_t *g)
{
    int n = (a->steps + 1) * B, diff = -1;
    double worst = 0;
    for (int i = 0; i < n; i++) {
        if (a->out_tok[i] != g->out_tok[i] && diff < 0)
            diff = i / B;
        worst = fmax(worst, fabs((double)a->out_lp[i] - g->out_lp[i]));
    }
    char name[160];
    snprintf(name, sizeof(name), "%s: batch %d, %d greedy tokens identical (first difference "
             "at step %d)", what, B, a->steps, diff);
    ecu_t_check(diff < 0, name);
    printf("%-4s %s, max |dlogprob| %.2e\n", diff < 0 ? "ok" : "FAIL", name, worst);
    snprintf(name, sizeof(name), "%s: batch %d logprobs within 1e-4 (max %.2e)", what, B, worst);
    ecu_t_check(worst <= 1e-4, name);
}

static void test_batch(eng_backend_t *be, int B, int steps)
{
    s_run_t a, g;
    long long c0, l0, e0, c1, l1, e1;
    if (s_run_init(&a, be, B, steps, 0) || s_run_init(&g, be, B, steps, 1)) {
        ecu_t_check(0, "models built");
        return;
    }
    ecu_t_check(eng_bm_graphs(g.m), "graphs enabled on the cuda backend");
    int ok = 1;
    for (int i = 0; i <= steps && ok; i++)
        ok = s_run_step(&a, be) == 0;
    eng_cuda_graph_stats(be, &c0, &l0, &e0);
    for (int i = 0; i <= steps && ok; i++)
        ok = s_run_step(&g, be) == 0;
    eng_cuda_graph_stats(be, &c1, &l1, &e1);
    ecu_t_check(ok, "every step runs");
    if (ok)
        s_compare("sequential", B, &a, &g);
    printf("     batch %d: %lld graph steps, %lld captures, %lld launches, %lld eager\n", B,
           eng_bm_graph_steps(g.m), c1 - c0, l1 - l0, e1 - e0);
    char name[128];
    snprintf(name, sizeof(name), "batch %d: graphs captured (%lld) and replayed (%lld of %d)",
             B, c1 - c0, l1 - l0, steps);
    /* per key: one eager step, then capture + launch, then launches */
    ecu_t_check(c1 - c0 >= 1 && l1 - l0 >= steps - 2 * (c1 - c0), name);
    s_run_free(&a);
    s_run_free(&g);

    /* interleaved: the eager model's steps move scratch buffers under the graphs */
    if (s_run_init(&a, be, B, steps, 0) || s_run_init(&g, be, B, steps, 1)) {
        ecu_t_check(0, "models built");
        return;
    }
    ok = 1;
    for (int i = 0; i <= steps && ok; i++)
        ok = s_run_step(&a, be) == 0 && s_run_step(&g, be) == 0;
    ecu_t_check(ok, "every interleaved step runs");
    if (ok)
        s_compare("interleaved", B, &a, &g);
    s_run_free(&a);
    s_run_free(&g);
}

int main(int argc, char **argv)
{
    int steps = 64;
    anv_log_init("test_cuda_graphs");
    if (argc == 3 && strcmp(argv[1], "--steps") == 0)
        steps = atoi(argv[2]);
    if (!eng_cuda_available()) {
        printf("SKIP: no CUDA device visible\n");
        return 77;
    }
    eng_backend_t *be = eng_cuda_backend_new_kv(ENG_DTYPE_BF16);
    if (!be) {
        printf("FAIL: cannot create the backend\n");
        return 1;
    }
    int batches[] = {1, 3, 16};
    for (int i = 0; i < 3; i++)
        test_batch(be, batches[i], steps);
    be->destroy(&be);
    return ecu_t_done("test_cuda_graphs");
}

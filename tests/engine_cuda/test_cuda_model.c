/*  test_cuda_model.c - a whole random Llama on the CUDA backend against the CPU backend.

    Same weights (host generator, uploaded to both), the CPU running the base ops only, the
    CUDA backend its fused path (prepare, rope_kv_store, swiglu_fused, on-GPU sampling).
    A: one sequence, fp32 KV: prompt of 7 tokens, then 64 greedy tokens on each backend
       independently; the tokens must be identical and the log-softmax of every step within
       tolerance. The GPU runs its fp32 paths: the GEMV takes the 7-token prompt too
       (eng_cuda_gemv_rows 8; by default it takes one row and the prompt goes through
       cuBLASLt on bf16 activations, which B holds to a bf16 tolerance).
    B: four sequences of different prompt lengths prefilled in one step (the cuBLASLt path,
       bf16 activations into the tensor cores) and bf16 KV, then 64 decode steps
       teacher-forced with the CPU's greedy tokens; log-softmax within a bf16 tolerance and
       the greedy choices compared. The same with fp8 (e4m3) KV: its accuracy cost.
    --steps N changes the number of decode steps (compute-sanitizer runs use fewer).
*/
#include "ecu_test.h"

#include "anv_log.h"
#include "eng_bench_model.h"
#include "eng_cuda.h"

static const eng_bm_config_t s_cfg = {512, 256, 2, 4, 1, 64, 688, 10000.0f, 1e-6f,
                                      ENG_DTYPE_BF16, 16};

typedef struct {
    eng_backend_t *be;
    eng_bm_t *m;
} s_side_t;

/* Runs one step on a side; returns the log-softmax rows (n_rows, vocab) on the host and,
   where the backend samples on the device, its greedy tokens (else tok is left alone). */
static int s_step(s_side_t *sd, const eng_attn_batch_t *b, const int32_t *ids,
                  const int32_t *pos, const int32_t *slots, const int32_t *rows, int n_rows,
                  float *lsm_host, int32_t *tok)
{
    float *logits;
    int V = s_cfg.vocab;
    if (eng_bm_forward(sd->m, b, ids, pos, slots, rows, n_rows, &logits))
        return -1;
    float *tmp = sd->be->alloc(sd->be, (size_t)n_rows * V * 4);
    if (!tmp)
        return -1;
    sd->be->log_softmax(sd->be, tmp, logits, n_rows, V);
    ecu_t_get(sd->be, lsm_host, tmp, (size_t)n_rows * V * 4);
    sd->be->free(sd->be, tmp);
    if (sd->be->sample && tok) {
        eng_sample_params_t sp[8];
        float lp[8];
        for (int r = 0; r < n_rows && r < 8; r++)
            sp[r] = (eng_sample_params_t){0.0f, 0, 1.0f, 0.0f, (uint64_t)r, 0};
        if (sd->be->sample(sd->be, tok, lp, logits, n_rows, V, sp))
            return -1;
        for (int r = 0; r < n_rows; r++)
            if (fabsf(lp[r] - lsm_host[(size_t)r * V + tok[r]]) > 1e-4f)
                return -2;
    }
    return 0;
}

static int s_argmax(const float *x, int n)
{
    int a = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[a])
            a = i;
    return a;
}

static void test_greedy(eng_backend_t *cpu, eng_backend_t *gpu, int steps)
{
    int V = s_cfg.vocab, bs = s_cfg.block_size, mb = 8, P = 7;
    const int rows0 = eng_cuda_gemv_rows(gpu, -1);
    ecu_t_check(eng_cuda_gemv_rows(gpu, 8) == 8, "the GEMV takes the prompt's 7 rows");
    s_side_t c = {cpu, eng_bm_new(cpu, &s_cfg, mb, 64, 4, eng_bm_fill_host, 7, 0)};
    s_side_t g = {gpu, eng_bm_new(gpu, &s_cfg, mb, 64, 4, eng_bm_fill_host, 7, 1)};
    ecu_t_check(c.m && g.m, "models built");
    if (!c.m || !g.m) {
        eng_cuda_gemv_rows(gpu, rows0);
        return;
    }
    int32_t table[8] = {3, 0, 7, 1, 6, 2, 5, 4};
    int32_t ids[8] = {1, 77, 300, 4, 4, 511, 12}, pos[8], slots[8], row;
    int32_t q_start[2] = {0, P}, ctx[1] = {P};
    for (int t = 0; t < P; t++)
        pos[t] = t, slots[t] = table[t / bs] * bs + t % bs;
    row = P - 1;
    eng_attn_batch_t b = {1, q_start, ctx, table, mb};
    float *lc = malloc((size_t)V * 4), *lg = malloc((size_t)V * 4);
    int32_t gt = 0;
    int ct = 0, same = 1, first_diff = -1;
    double worst = 0;
    int32_t gids[8];
    memcpy(gids, ids, sizeof(gids));
    for (int step = 0; step <= steps; step++) {
        /* each side feeds its own choice back: independent generations */
        if (s_step(&c, &b, ids, pos, slots, &row, 1, lc, NULL) ||
            s_step(&g, &b, gids, pos, slots, &row, 1, lg, &gt)) {
            ecu_t_check(0, "greedy step runs (and the device logprob matches)");
            same = 0;
            break;
        }
        for (int i = 0; i < V; i++)
            worst = fmax(worst, fabs((double)lc[i] - lg[i]));
        ct = s_argmax(lc, V);
        if (ct != gt) {
            same = 0;
            first_diff = step;
            break;
        }
        int p = P + step;
        if (p >= mb * bs)
            break;
        ids[0] = ct;
        gids[0] = gt;
        q_start[1] = 1;
        ctx[0] = p + 1;
        pos[0] = p;
        slots[0] = table[p / bs] * bs + p % bs;
        row = 0;
    }
    char name[128];
    snprintf(name, sizeof(name), "greedy %d tokens identical (first difference at %d)", steps,
             first_diff);
    ecu_t_check(same, name);
    printf("%-4s %s, max |dlogprob| %.2e\n", same ? "ok" : "FAIL", name, worst);
    snprintf(name, sizeof(name), "greedy logprobs within 2e-3 (max %.2e)", worst);
    ecu_t_check(worst < 2e-3, name);
    eng_bm_destroy(&c.m);
    eng_bm_destroy(&g.m);
    free(lc), free(lg);
    eng_cuda_gemv_rows(gpu, rows0);
}

/* max_d: bound on |dlogprob| against the CPU (fp32 KV); min_agree: % of greedy choices that
   must agree. The printed figures are the accuracy cost of the GPU's KV dtype. */
static void test_batch_teacher_forced(eng_backend_t *cpu, eng_backend_t *gpu, int steps,
                                      double max_d, int min_agree)
{
    const char *kvn = eng_dtype_name(gpu->kv_dtype);
    enum { NS = 4 };
    int V = s_cfg.vocab, bs = s_cfg.block_size, mb = 12;
    int32_t plen[NS] = {40, 13, 100, 3};
    s_side_t c = {cpu, eng_bm_new(cpu, &s_cfg, NS * mb, 256, NS, eng_bm_fill_host, 9, 0)};
    s_side_t g = {gpu, eng_bm_new(gpu, &s_cfg, NS * mb, 256, NS, eng_bm_fill_host, 9, 1)};
    ecu_t_check(c.m && g.m, "models built");
    if (!c.m || !g.m)
        return;
    int32_t tables[NS * 12], q_start[NS + 1] = {0}, ctx[NS], rows[NS];
    int32_t ids[256], pos[256], slots[256];
    for (int i = 0; i < NS * mb; i++)
        tables[i] = (i * 7) % (NS * mb); /* 7 is prime to 48: a permutation */
    for (int s = 0; s < NS; s++) {
        q_start[s + 1] = q_start[s] + plen[s];
        ctx[s] = plen[s];
        for (int t = 0; t < plen[s]; t++) {
            int k = q_start[s] + t;
            ids[k] = (int32_t)(ecu_t_uniform() * V);
            pos[k] = t;
            slots[k] = tables[s * mb + t / bs] * bs + t % bs;
        }
        rows[s] = q_start[s + 1] - 1;
    }
    eng_attn_batch_t b = {NS, q_start, ctx, tables, mb};
    float *lc = malloc((size_t)NS * V * 4), *lg = malloc((size_t)NS * V * 4);
    double worst = 0;
    int agree = 0, total = 0;
    for (int step = 0; step <= steps; step++) {
        if (s_step(&c, &b, ids, pos, slots, rows, NS, lc, NULL) ||
            s_step(&g, &b, ids, pos, slots, rows, NS, lg, NULL)) {
            ecu_t_check(0, "batch step runs");
            break;
        }
        for (size_t i = 0; i < (size_t)NS * V; i++)
            worst = fmax(worst, fabs((double)lc[i] - lg[i]));
        for (int s = 0; s < NS; s++) {
            int ct = s_argmax(lc + (size_t)s * V, V), gt = s_argmax(lg + (size_t)s * V, V);
            agree += ct == gt, total++;
            int p = ctx[s];
            q_start[s + 1] = s + 1;
            ids[s] = ct; /* teacher forcing with the CPU's choice */
            pos[s] = p;
            slots[s] = tables[s * mb + p / bs] * bs + p % bs;
            ctx[s] = p + 1;
            rows[s] = s;
        }
        q_start[0] = 0;
    }
    char name[128];
    snprintf(name, sizeof(name), "batch of 4, %s kv: max |dlogprob| %.3f < %g", kvn, worst,
             max_d);
    ecu_t_check(worst < max_d, name);
    printf("%-4s %s; greedy agreement %d/%d\n", worst < max_d ? "ok" : "FAIL", name, agree,
           total);
    snprintf(name, sizeof(name), "%s kv: greedy agreement %d/%d >= %d%%", kvn, agree, total,
             min_agree);
    ecu_t_check(agree * 100 >= total * min_agree, name);
    eng_bm_destroy(&c.m);
    eng_bm_destroy(&g.m);
    free(lc), free(lg);
}

int main(int argc, char **argv)
{
    int steps = 64;
    anv_log_init("test_cuda_model");
    if (argc == 3 && strcmp(argv[1], "--steps") == 0)
        steps = atoi(argv[2]);
    if (!eng_cuda_available()) {
        printf("SKIP: no CUDA device visible\n");
        return 77;
    }
    eng_backend_t *cpu = eng_backend_new("cpu", 2);
    eng_backend_t *g32 = eng_cuda_backend_new_kv(ENG_DTYPE_F32);
    eng_backend_t *gbf = eng_cuda_backend_new_kv(ENG_DTYPE_BF16);
    eng_backend_t *gf8 = eng_cuda_backend_new_kv(ENG_DTYPE_F8E4M3);
    if (!cpu || !g32 || !gbf || !gf8) {
        printf("FAIL: cannot create the backends\n");
        return 1;
    }
    test_greedy(cpu, g32, steps);
    /* bf16 KV: 0.077 measured with the fp32 gate|up product, 0.087 with it in bf16 (the
       default since 2026-12-06, ANVIL_CUDA_GU_LOW), H100 */
    test_batch_teacher_forced(cpu, gbf, steps, 0.1, 95);
    /* fp8 KV (--kv-dtype fp8): e4m3 keeps 3 mantissa bits to bf16's 7, a rounding step 16x
       bf16's, so the bound is 16x the bf16 case's measured 0.077 (~1.2), rounded down to 1.0;
       the first bound (0.5, set before any GPU run) failed on the H200 at 0.669 (64 steps)
       and 0.634 (4 steps) with 95 % greedy agreement. Broken fp8 KV (wrong scale, wrong
       slots) shows as |dlogprob| of several units and agreement far below 85 %. */
    test_batch_teacher_forced(cpu, gf8, steps, 1.0, 85);
    gf8->destroy(&gf8);
    gbf->destroy(&gbf);
    g32->destroy(&g32);
    cpu->destroy(&cpu);
    return ecu_t_done("test_cuda_model");
}

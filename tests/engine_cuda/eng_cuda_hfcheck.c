/*  eng_cuda_hfcheck.c - runs an HF Llama checkpoint dumped by hf_compare.py on the CUDA backend.

    Usage: eng_cuda_hfcheck DIR N_NEW. DIR holds config.txt ("key value" lines: vocab hidden
    layers heads kv_heads head_dim ffn rope_theta eps), tensors.txt (one HF parameter name per
    line, each stored raw as bf16 in DIR/<name>.bin) and prompt.txt (token ids). Prefills the
    prompt, decodes N_NEW tokens greedily with on-GPU sampling, and writes DIR/c_tokens.txt
    and DIR/c_logprobs.bin (N_NEW rows of the fp32 log-softmax that chose each token).
    Exit 77 without a GPU.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "anv_log.h"
#include "eng_bench_model.h"
#include "eng_cuda.h"

static void *s_slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = n > 0 ? malloc((size_t)n) : NULL;
    if (p && fread(p, 1, (size_t)n, f) != (size_t)n) {
        free(p);
        p = NULL;
    }
    fclose(f);
    *len = p ? (size_t)n : 0;
    return p;
}

int main(int argc, char **argv)
{
    anv_log_init("eng_cuda_hfcheck");
    if (argc != 3) {
        fprintf(stderr, "usage: eng_cuda_hfcheck DIR N_NEW\n");
        return 2;
    }
    if (!getenv("ECU_BACKEND") && !eng_cuda_available()) {
        printf("SKIP: no CUDA device visible\n");
        return 77;
    }
    const char *dir = argv[1];
    int n_new = atoi(argv[2]), rc = 1;
    char path[4096], key[64], name[256];
    eng_bm_config_t c = {0, 0, 0, 0, 0, 0, 0, 10000.0f, 1e-6f, ENG_DTYPE_BF16, 16};
    double val;
    snprintf(path, sizeof(path), "%s/config.txt", dir);
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "cannot open '%s'\n", path);
        return 1;
    }
    while (fscanf(f, "%63s %lf", key, &val) == 2) {
        if (!strcmp(key, "vocab")) c.vocab = (int)val;
        else if (!strcmp(key, "hidden")) c.hidden = (int)val;
        else if (!strcmp(key, "layers")) c.n_layer = (int)val;
        else if (!strcmp(key, "heads")) c.n_head = (int)val;
        else if (!strcmp(key, "kv_heads")) c.n_kv_head = (int)val;
        else if (!strcmp(key, "head_dim")) c.head_dim = (int)val;
        else if (!strcmp(key, "ffn")) c.ffn = (int)val;
        else if (!strcmp(key, "rope_theta")) c.rope_theta = (float)val;
        else if (!strcmp(key, "eps")) c.eps = (float)val;
    }
    fclose(f);
    int32_t prompt[4096];
    int P = 0;
    snprintf(path, sizeof(path), "%s/prompt.txt", dir);
    f = fopen(path, "r");
    while (f && P < 4096 && fscanf(f, "%d", &prompt[P]) == 1)
        P++;
    if (f)
        fclose(f);
    if (P == 0 || n_new <= 0 || c.vocab <= 0 || c.n_layer <= 0) {
        fprintf(stderr, "bad config or prompt in '%s'\n", dir);
        return 1;
    }
    /* $ECU_BACKEND=cpu runs the same check on the CPU reference (no GPU needed) */
    const char *bname = getenv("ECU_BACKEND") ? getenv("ECU_BACKEND") : "cuda";
    eng_backend_t *be = eng_backend_new(bname, 0);
    if (!be)
        return 1;
    int bs = c.block_size, mb = (P + n_new + bs - 1) / bs;
    eng_bm_t *m = eng_bm_new(be, &c, mb, P, 1, NULL, 0, 1);
    float *lsm = be->alloc(be, (size_t)c.vocab * 4);
    float *host = malloc((size_t)c.vocab * 4);
    FILE *out_t = NULL, *out_l = NULL;
    int32_t *table = malloc((size_t)mb * 4), *pos = malloc((size_t)P * 4);
    int32_t *slots = malloc((size_t)P * 4);
    if (!m || !lsm || !host)
        goto out;
    snprintf(path, sizeof(path), "%s/tensors.txt", dir);
    f = fopen(path, "r");
    int loaded = 0;
    while (f && fscanf(f, "%255s", name) == 1) {
        char tp[4096];
        size_t len;
        snprintf(tp, sizeof(tp), "%s/%s.bin", dir, name);
        void *data = s_slurp(tp, &len);
        int lr = data ? eng_bm_load(m, name, data, len) : -1;
        free(data);
        if (lr) {
            fprintf(stderr, "cannot load tensor '%s' (%d)\n", name, lr);
            fclose(f);
            goto out;
        }
        loaded++;
    }
    if (f)
        fclose(f);
    be->sync(be);
    printf("loaded %d tensors, prompt %d tokens, %d new\n", loaded, P, n_new);
    for (int i = 0; i < mb; i++)
        table[i] = mb - 1 - i; /* reversed: exercises the block table */
    snprintf(path, sizeof(path), "%s/c_tokens.txt", dir);
    out_t = fopen(path, "w");
    snprintf(path, sizeof(path), "%s/c_logprobs.bin", dir);
    out_l = fopen(path, "wb");
    if (!out_t || !out_l)
        goto out;
    int32_t q_start[2] = {0, P}, ctx[1] = {P}, row = P - 1, tok = 0;
    int32_t *ids = prompt;
    for (int t = 0; t < P; t++)
        pos[t] = t, slots[t] = table[t / bs] * bs + t % bs;
    eng_attn_batch_t b = {1, q_start, ctx, table, mb};
    for (int step = 0; step < n_new; step++) {
        float *logits, lp;
        eng_sample_params_t sp = {0.0f, 0, 1.0f, 0.0f, 1, (uint64_t)step};
        if (eng_bm_forward(m, &b, ids, pos, slots, &row, 1, &logits) ||
            be->log_softmax(be, lsm, logits, 1, c.vocab) ||
            (be->sample && be->sample(be, &tok, &lp, logits, 1, c.vocab, &sp)) ||
            be->download(be, host, lsm, (size_t)c.vocab * 4))
            goto out;
        if (!be->sample) {
            tok = 0;
            for (int i = 1; i < c.vocab; i++)
                if (host[i] > host[tok])
                    tok = i;
        }
        fprintf(out_t, "%d\n", tok);
        fwrite(host, 4, (size_t)c.vocab, out_l);
        int p = P + step;
        ids = &tok;
        q_start[1] = 1, ctx[0] = p + 1, pos[0] = p, row = 0;
        slots[0] = table[p / bs] * bs + p % bs;
    }
    rc = 0;
out:
    if (out_t)
        fclose(out_t);
    if (out_l)
        fclose(out_l);
    if (lsm)
        be->free(be, lsm);
    eng_bm_destroy(&m);
    be->destroy(&be);
    free(host), free(table), free(pos), free(slots);
    return rc;
}

/*  eng_logits_dump.c - test tool: raw logits of every prompt position from the model alone.

      eng_logits_dump MODEL_DIR OUT.bin BLOCK_SIZE CHUNK ID...

    Runs the prompt through eng_model_forward in chunks of CHUNK tokens (0 = all at once) over
    a paged KV cache of BLOCK_SIZE-token blocks, and writes (n_ids, vocab) fp32 logits to
    OUT.bin. A second, dummy sequence takes a block between every two blocks of the prompt, so
    the prompt's block table is not contiguous and paging is really exercised. The Python
    tests compare the file against HF transformers. Exit 0, 1 on a load error, 2 on bad usage.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "anv_log.h"
#include "eng_kv.h"
#include "eng_model.h"
#include "eng_ops.h"

int main(int argc, char **argv)
{
    anv_log_init("eng_logits_dump");
    if (argc < 6) {
        fprintf(stderr, "usage: eng_logits_dump MODEL_DIR OUT.bin BLOCK_SIZE CHUNK ID...\n");
        return 2;
    }
    int bs = atoi(argv[3]), chunk = atoi(argv[4]), n = argc - 5, rc = 1;
    if (bs < 1 || chunk < 0)
        return 2;
    if (chunk == 0)
        chunk = n;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n), *pos = malloc(sizeof(int32_t) * (size_t)n),
            *slots = malloc(sizeof(int32_t) * (size_t)n),
            *rows = malloc(sizeof(int32_t) * (size_t)n);
    for (int i = 0; i < n; i++)
        ids[i] = atoi(argv[5 + i]);
    char err[256];
    eng_backend_t *be = eng_backend_new("cpu", 0);
    eng_model_t *m = be ? eng_model_new(argv[1], be, err, sizeof(err)) : NULL;
    int n_blocks = 2 * (n / bs + 2);
    eng_kv_t *kv = eng_kv_new(n_blocks, bs);
    eng_kv_seq_t seq = {0}, dummy = {0};
    float *logits = NULL;
    FILE *out = NULL;
    if (!m) {
        fprintf(stderr, "error: %s\n", be ? err : "no backend");
        goto done;
    }
    int vocab = eng_model_config(m)->vocab;
    logits = malloc(sizeof(float) * (size_t)n * (size_t)vocab);
    if (!kv || !logits || eng_model_kv_reserve(m, n_blocks, bs))
        goto done;
    for (int start = 0; start < n; start += chunk) {
        int c = n - start < chunk ? n - start : chunk;
        for (int i = 0; i < c; i++) {
            int32_t slot, dslot[1024];
            eng_kv_copy_t copy;
            if ((seq.n_tokens % bs) == 0 &&
                eng_kv_append(kv, &dummy, bs <= 1024 ? bs : 1024, dslot, &copy))
                goto done; /* interleave a dummy block before each new prompt block */
            if (eng_kv_append(kv, &seq, 1, &slot, &copy))
                goto done;
            slots[i] = slot;
            pos[i] = start + i;
            rows[i] = i;
        }
        int32_t q_start[2] = {0, c}, ctx = seq.n_tokens;
        eng_forward_t fw = {
            .n_tok = c,
            .tokens = ids + start,
            .pos = pos,
            .slots = slots,
            .attn = {1, q_start, &ctx, seq.blocks, seq.n_blocks},
            .n_rows = c,
            .rows = rows,
        };
        if (eng_model_forward(m, &fw, logits + (size_t)start * vocab, NULL))
            goto done;
    }
    out = fopen(argv[2], "wb");
    if (!out || fwrite(logits, sizeof(float), (size_t)n * vocab, out) != (size_t)n * vocab)
        goto done;
    rc = 0;
done:
    if (out)
        fclose(out);
    eng_kv_seq_free(&seq);
    eng_kv_seq_free(&dummy);
    eng_kv_destroy(&kv);
    eng_model_destroy(&m);
    if (be)
        be->destroy(&be);
    free(ids);
    free(pos);
    free(slots);
    free(rows);
    free(logits);
    return rc;
}

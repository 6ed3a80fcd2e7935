/*  eng_bench_model.h - a Llama forward pass over any eng_backend_t, for benchmarks and tests.

    The smallest complete user of the ops table: embedding, per layer RMSNorm, stacked QKV
    matmul, RoPE + paged K/V store, paged attention, output projection, fused residual-add +
    RMSNorm, stacked gate|up matmul, SwiGLU, down projection, final norm, lm_head over the
    requested rows. With `fused` it uses the optional extensions (prepare, rope_kv_store,
    swiglu_fused) where the backend has them; without, only the base ops (the CPU path), so the
    two can be compared on identical weights. Weights are stored stacked as the CUDA path
    wants them (q|k|v rows, gate|up rows); eng_bm_load copies an HF tensor into its place.
    Sequences, block tables and sampling are the caller's (see the benchmark and the tests).
*/
#ifndef ENG_BENCH_MODEL_H
#define ENG_BENCH_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "eng_ops.h"

typedef struct {
    int vocab, hidden, n_layer, n_head, n_kv_head, head_dim, ffn;
    float rope_theta, eps;
    eng_dtype_t wdtype; /* weight dtype */
    int block_size;     /* KV positions per block */
} eng_bm_config_t;

typedef struct eng_bm eng_bm_t;

/* Fills n elements of backend memory dst (dtype) with uniform values in
   [center - scale, center + scale] determined by seed. */
typedef int (*eng_bm_fill_fn)(eng_backend_t *be, void *dst, eng_dtype_t dtype, size_t n,
                              uint64_t seed, float center, float scale);

/* Host generator + upload: the same weights on every backend for a given seed. */
int eng_bm_fill_host(eng_backend_t *be, void *dst, eng_dtype_t dtype, size_t n, uint64_t seed,
                     float center, float scale);

/* Builds the model on `be` (borrowed; must outlive the model) with KV pools of n_blocks
   blocks per layer (block ids 0 .. n_blocks - 1; one more, the pad block, is private) and
   activations for up to max_tok tokens and max_rows logits rows. fill == NULL leaves the weights
   zeroed (to be loaded with eng_bm_load). NULL on failure, with errno ENOMEM where the device
   memory ran out (the model does not fit), else EIO. */
eng_bm_t *eng_bm_new(eng_backend_t *be, const eng_bm_config_t *cfg, int n_blocks, int max_tok,
                     int max_rows, eng_bm_fill_fn fill, uint64_t seed, int fused);
void eng_bm_destroy(eng_bm_t **self_p);

/* Copies host tensor `name` (an HF LlamaForCausalLM parameter name, in cfg->wdtype) into the
   model. ANV_ENOTFOUND for an unknown name, ANV_EFORMAT for a wrong size. */
int eng_bm_load(eng_bm_t *self, const char *name, const void *host, size_t bytes);

/* Decode steps (every sequence one token, rows = 0 .. n-1) through the backend's graph_step
   (CUDA graphs, one per batch bucket and block-table stride) when on and the backend has it;
   other steps run op by op. Off by default. */
void eng_bm_set_graphs(eng_bm_t *self, int on);
int eng_bm_graphs(const eng_bm_t *self);
/* Steps that went through graph_step so far. */
long long eng_bm_graph_steps(const eng_bm_t *self);
/* The batch bucket of n sequences: 1, 2, 4, 8, then multiples of 16 up to 256, then of 64. */
int eng_bm_bucket(int n);

/* Copies KV block src to dst in every layer (copy-on-write of a shared partial block). */
int eng_bm_kv_copy(eng_bm_t *self, int src, int dst);
/* Fills every KV pool with random values (a synthetic context for decode-only runs). */
int eng_bm_kv_fill(eng_bm_t *self, eng_bm_fill_fn fill, uint64_t seed);

/* Bytes of all weights (what the model holds). */
size_t eng_bm_weight_bytes(const eng_bm_t *self);
/* Bytes of weights a step of n_tok tokens must read at least: every weight but the embedding
   table, of which it gathers n_tok rows. */
size_t eng_bm_step_weight_bytes(const eng_bm_t *self, int n_tok);
/* Bytes of K and V of one cached position over all layers. */
size_t eng_bm_kv_bytes_per_token(const eng_bm_t *self);

/* One step: n_tok = batch->q_start[n_seq] tokens with ids, pos, slots (host) as in eng_ops.h;
   computes logits (n_rows, vocab) f32 (backend memory owned by the model, valid until the
   next step) of the hidden rows `rows` (host). */
int eng_bm_forward(eng_bm_t *self, const eng_attn_batch_t *batch, const int32_t *ids,
                   const int32_t *pos, const int32_t *slots, const int32_t *rows, int n_rows,
                   float **logits);

#endif

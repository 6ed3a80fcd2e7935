/*  eng_ops.h - the backend ops interface of the generation engine.

    Everything above this line (loader, tokenizer, chat template, KV block manager, scheduler,
    sampler) is backend-independent; everything that touches activations, weights or the KV
    cache goes through one `eng_backend_t`, a table of function pointers plus an opaque state.
    cpu/ is the readable reference (plain loops, fp32 math) and the oracle of the tests; cuda/
    implements the same table and is tested op by op against it.

    Memory: every pointer an op receives is a backend pointer ("device memory"; host memory for
    the CPU backend) obtained from `alloc` or `weight`, except the small int32 index arrays
    marked "host" below, which stay in host memory so that the scheduler can build them freely
    (a device backend copies them itself). Activations are always fp32 row-major. Weights keep
    their checkpoint dtype (bf16, fp16 or fp32) and HF nn.Linear layout (out_features,
    in_features); the ops widen them to fp32 as they read.

    KV cache: per layer one K and one V pool, each (n_blocks, block_size, n_kv_head, head_dim) in
    the backend's `kv_dtype` (fp32 on the CPU). A token's cache slot is
    block_id * block_size + offset. A sequence's block table lists its blocks in order; token t
    of the sequence lives in block_table[t / block_size] at offset t % block_size.

    Errors: ops validate what they can cheaply (NULL pointers, zero sizes) and return 0 or a
    negative ANV_E* code; shapes are the caller's responsibility (the model checks them once at
    load time). A backend object belongs to one thread (the engine's); it may use worker threads
    internally.
*/
#ifndef ENG_OPS_H
#define ENG_OPS_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    ENG_DTYPE_F32 = 0,
    ENG_DTYPE_F16 = 1,
    ENG_DTYPE_BF16 = 2,
    ENG_DTYPE_F8E4M3 = 3, /* KV pools only (CUDA, --kv-dtype fp8), never weights */
} eng_dtype_t;

/* Size in bytes of one element, 0 for an unknown value. */
size_t eng_dtype_size(eng_dtype_t dtype);
const char *eng_dtype_name(eng_dtype_t dtype);

/* OCP FP8 E4M3 (the "fn" variant: no infinities, max 448): round to nearest even, saturating
   to +-448, NaN to NaN; the same conversion as CUDA's __nv_cvt_float_to_fp8(..., __NV_SATFINITE,
   __NV_E4M3). The host side of an fp8 KV cache (tests build their references with it). */
uint8_t eng_f32_to_f8e4m3(float v);
float eng_f8e4m3_to_f32(uint8_t b);

/* A KV dtype by name: "bf16", "f32" (or "fp32"), "fp8" (or "f8e4m3", "fp8_e4m3"); any case.
   0, or -1 for an unknown name. */
int eng_kv_dtype_parse(const char *name, eng_dtype_t *out);

/* One step's attention batch: n_seq sequences, sequence s contributes the query tokens
   [q_start[s], q_start[s+1]) of the step (prefill chunks and single decode tokens mixed), and
   after this step's K/V are stored it holds ctx_len[s] tokens. Query token i of sequence s
   (0-based within the sequence's chunk) is at position ctx_len[s] - n_q(s) + i and attends
   causally to cache positions 0 .. that position. All arrays are host memory. */
typedef struct {
    int n_seq;
    const int32_t *q_start;      /* (n_seq + 1) host */
    const int32_t *ctx_len;      /* (n_seq) host */
    const int32_t *block_tables; /* (n_seq, max_blocks) host, row-major */
    int max_blocks;              /* row stride of block_tables */
} eng_attn_batch_t;

/* One step's host index arrays, for the optional `prepare` below. */
typedef struct {
    int n_tok;
    const int32_t *ids;           /* (n_tok) host: token ids for embedding */
    const int32_t *pos;           /* (n_tok) host: positions for rope */
    const int32_t *slots;         /* (n_tok) host: cache slots for kv_store */
    const eng_attn_batch_t *batch; /* the step's attention batch */
    int n_rows;
    const int32_t *rows;          /* (n_rows) host: rows for gather_rows (the logits rows) */
} eng_step_t;

/* Per-row sampling parameters for `sample` below. */
typedef struct {
    float temperature; /* 0 = greedy */
    int top_k;         /* 0 = off */
    float top_p;       /* 1 = off */
    float min_p;       /* 0 = off */
    uint64_t seed;     /* per sample, never one shared default */
    uint64_t step;     /* index of the token being drawn (0, 1, ...) */
} eng_sample_params_t;

/* What a fused linear (eng_backend_t.linear) does with its product y (n, out_dim). */
typedef enum {
    ENG_LIN_PLAIN = 0, /* out (n, out_dim) f32 = y */
    ENG_LIN_ADD,       /* out (n, out_dim) f32 += y: out is the residual stream */
    ENG_LIN_SWIGLU,    /* W stacks gate|up (out_dim = 2 ffn): out (n, ffn) = silu(gate) * up */
    ENG_LIN_ROPE_KV,   /* W stacks q|k|v: out (n, n_head, head_dim) = rope(q), and rope(k), v
                          stored at slots in the caches: rope_kv_store of y */
} eng_lin_epi_t;

/* The parts of a fused linear besides the product (eng_backend_t.linear). */
typedef struct {
    const void *norm_w;     /* (in_dim) norm_dtype, or NULL: with it x is normalised first,
                               y = rmsnorm(x) * norm_w @ W^T (+ bias), the rmsnorm op's math */
    eng_dtype_t norm_dtype;
    float eps;
    eng_lin_epi_t epi;
    /* ENG_LIN_ROPE_KV only, as rope_kv_store: */
    void *k_cache, *v_cache;       /* (n_blocks, block_size, n_kv_head, head_dim) kv_dtype */
    const int32_t *pos, *slots;    /* (n) host */
    int n_head, n_kv_head, head_dim;
    float theta;
    /* 1 when x is the output of the op called just before this one on the same backend (a
       linear's out or attention's out), untouched since: a backend that kept that output
       already rounded for its product (the CUDA backend's rounded twin) may read the
       rounded copy instead of rounding x again; the result is the same. 0 otherwise. */
    int x_from_prev;
    /* ENG_LIN_SWIGLU: 1 when out is read only by the next op on this backend, a linear with
       x_from_prev 1 whose weights have this one's dtype: a backend that hands that linear a
       rounded copy of out (the CUDA backend's twin) may then leave out itself unwritten, and
       fails that linear (rather than read stale values) if it cannot take the copy. 0
       otherwise (out written, as always). */
    int out_for_next;
} eng_linear_t;

typedef struct eng_backend eng_backend_t;

struct eng_backend {
    const char *name;     /* "cpu", "cuda" */
    eng_dtype_t kv_dtype; /* dtype of the KV pools */
    void *state;          /* backend private */

    /* --- memory ------------------------------------------------------------------------- */
    /* Allocates `bytes` of zeroed backend memory; NULL on failure (logged). */
    void *(*alloc)(eng_backend_t *be, size_t bytes);
    /* Frees memory from alloc; NULL is accepted. */
    void (*free)(eng_backend_t *be, void *ptr);
    /* Makes a checkpoint tensor usable by the ops: returns a backend pointer to `bytes` bytes
       equal to `host` (which is mmap'd and outlives the backend object). The CPU backend
       returns `host` itself; a device backend copies. Release with weight_release. */
    void *(*weight)(eng_backend_t *be, const void *host, size_t bytes);
    void (*weight_release)(eng_backend_t *be, void *ptr);
    /* Copies a checkpoint tensor (host, mmap'd) into backend memory dst from alloc, the way
       weight() fills its own (staged on a device; complete once sync() returns). For weights
       the model stores stacked (q|k|v, gate|up rows). */
    int (*weight_into)(eng_backend_t *be, void *dst, const void *host, size_t bytes);
    /* Copies between host and backend memory. */
    int (*upload)(eng_backend_t *be, void *dst, const void *host_src, size_t bytes);
    int (*download)(eng_backend_t *be, void *host_dst, const void *src, size_t bytes);
    /* Copies `bytes` of backend memory src over dst (both from weight() or alloc; queued in
       order with the ops). NULL on backends whose weights are the checkpoint's own mapping
       (the CPU): there a weight cannot be overwritten in place. A weight reload uses it to
       keep the weights' addresses, so captured decode graphs stay valid (eng_model_reload). */
    int (*copy)(eng_backend_t *be, void *dst, const void *src, size_t bytes);
    /* Waits for queued work (a no-op on the CPU). */
    int (*sync)(eng_backend_t *be);

    /* --- ops ---------------------------------------------------------------------------- */
    /* out (n_tok, dim) f32 = table[ids[t]] widened to fp32.
       table (vocab, dim) `dtype`; ids (n_tok) host, each in [0, vocab) (checked by caller). */
    int (*embedding)(eng_backend_t *be,
                     float *out,
                     const void *table,
                     eng_dtype_t dtype,
                     const int32_t *ids,
                     int n_tok,
                     int dim);

    /* out (n, dim) f32 = x / sqrt(mean(x^2) + eps) * w, the HF LlamaRMSNorm (fp32 math).
       x (n, dim) f32; w (dim) `dtype`. out may equal x. */
    int (*rmsnorm)(eng_backend_t *be,
                   float *out,
                   const float *x,
                   const void *w,
                   eng_dtype_t dtype,
                   int n,
                   int dim,
                   float eps);

    /* Fused residual add + RMSNorm: residual (n, dim) f32 += delta (n, dim) f32, then
       out (n, dim) f32 = rmsnorm(residual) * w. */
    int (*add_rmsnorm)(eng_backend_t *be,
                       float *out,
                       float *residual,
                       const float *delta,
                       const void *w,
                       eng_dtype_t dtype,
                       int n,
                       int dim,
                       float eps);

    /* out (n, out_dim) f32 = x (n, in_dim) f32 @ W^T + bias.
       W (out_dim, in_dim) `dtype` (nn.Linear layout); bias (out_dim) `dtype` or NULL. */
    int (*matmul)(eng_backend_t *be,
                  float *out,
                  const float *x,
                  const void *w,
                  const void *bias,
                  eng_dtype_t dtype,
                  int n,
                  int in_dim,
                  int out_dim);

    /* Rotary embedding in place, HF rotate_half convention (the two halves of each head are
       the pair, not interleaved): for i < head_dim/2, with f = pos * theta^(-2i/head_dim)
       (fp32, as HF computes inv_freq), x[i] <- x[i] cos f - x[i + d/2] sin f and
       x[i + d/2] <- x[i + d/2] cos f + x[i] sin f.
       q (n_tok, n_head, head_dim) f32; k (n_tok, n_kv_head, head_dim) f32;
       pos (n_tok) host. */
    int (*rope)(eng_backend_t *be,
                float *q,
                float *k,
                const int32_t *pos,
                int n_tok,
                int n_head,
                int n_kv_head,
                int head_dim,
                float theta);

    /* Stores this step's keys and values into the paged pools of one layer.
       k, v (n_tok, n_kv_head, head_dim) f32; k_cache, v_cache (n_blocks, block_size,
       n_kv_head, head_dim) kv_dtype; slots (n_tok) host: cache slot of each token. */
    int (*kv_store)(eng_backend_t *be,
                    void *k_cache,
                    void *v_cache,
                    const float *k,
                    const float *v,
                    const int32_t *slots,
                    int n_tok,
                    int n_kv_head,
                    int head_dim);

    /* Causal GQA attention over the paged cache of one layer (K/V of this step already
       stored): out (n_tok, n_head, head_dim) f32 = softmax(q k^T / sqrt(head_dim)) v, query
       head h reading KV head h / (n_head / n_kv_head). q (n_tok, n_head, head_dim) f32;
       k_cache, v_cache (n_blocks, block_size, n_kv_head, head_dim) kv_dtype; n_tok equals
       batch->q_start[batch->n_seq]. */
    int (*attention)(eng_backend_t *be,
                     float *out,
                     const float *q,
                     const void *k_cache,
                     const void *v_cache,
                     const eng_attn_batch_t *batch,
                     int n_head,
                     int n_kv_head,
                     int head_dim,
                     int block_size);

    /* Copies one KV block (all layers' pools are separate calls): pools (n_blocks,
       block_size, n_kv_head, head_dim) kv_dtype; block dst <- block src. Copy-on-write. */
    int (*copy_block)(eng_backend_t *be,
                      void *k_cache,
                      void *v_cache,
                      int src,
                      int dst,
                      int block_size,
                      int n_kv_head,
                      int head_dim);

    /* out (n, ffn) f32 = silu(gate) * up; gate, up (n, ffn) f32. out may equal gate. */
    int (*swiglu)(
        eng_backend_t *be, float *out, const float *gate, const float *up, int n, int ffn);

    /* out (n_rows, dim) f32 = x[rows[r]]; x (n_tok, dim) f32; rows (n_rows) host. */
    int (*gather_rows)(
        eng_backend_t *be, float *out, const float *x, const int32_t *rows, int n_rows, int dim);

    /* out (n, vocab) f32 = log_softmax(logits) per row (max-subtracted, fp32 sums in double
       on the CPU). out may equal logits. */
    int (*log_softmax)(eng_backend_t *be, float *out, const float *logits, int n, int vocab);

    /* Frees the backend's state and the struct itself (memory from alloc must be freed
       first). Accepts NULL; sets *be_p to NULL. */
    void (*destroy)(eng_backend_t **be_p);

    /* --- extensions (NULL when a backend lacks them). Both backends have sample,
       rope_kv_store and swiglu_fused, which the engine's model requires, and linear, which
       it uses when present; graphs, prepare, mem_info and prefetch are the CUDA backend's,
       used when present. ---------------------------------------------------------------- */

    /* Free and total bytes of backend memory now, to size the KV pools after the weights. */
    int (*mem_info)(eng_backend_t *be, size_t *free_bytes, size_t *total_bytes);

    /* Announces one step's host index arrays before its ops run, so that a device backend
       uploads them once per step instead of once per layer. Later ops of the step that receive
       these same host pointers (ids to embedding, pos and slots to rope/kv_store/rope_kv_store,
       the batch's arrays to attention, rows to gather_rows) use the uploaded copies; the arrays
       must not change until the next prepare. Any pointer may be NULL (n_rows 0). */
    int (*prepare)(eng_backend_t *be, const eng_step_t *step);

    /* Fused rope + kv_store: qkv (n_tok, (n_head + 2 n_kv_head) * head_dim) f32 holds each
       token's q, k and v side by side (one matmul with the three weights stacked); writes
       q_out (n_tok, n_head, head_dim) f32 = rope(q), stores rope(k) and v at slots in the
       caches (layout as kv_store). pos, slots (n_tok) host. qkv is not modified. */
    int (*rope_kv_store)(eng_backend_t *be, float *q_out, const float *qkv, void *k_cache,
                         void *v_cache, const int32_t *pos, const int32_t *slots, int n_tok,
                         int n_head, int n_kv_head, int head_dim, float theta);

    /* SwiGLU over one stacked gate|up matmul output: gu (n, 2 ffn) f32, row r = [gate | up];
       out (n, ffn) f32 = silu(gate) * up. */
    int (*swiglu_fused)(eng_backend_t *be, float *out, const float *gu, int n, int ffn);

    /* Samples one token per row on the device from logits (n, vocab) f32 (backend memory) and
       returns them with their logprobs in host memory: tokens (n) host, logprobs (n) host =
       log_softmax(logits)[token] in fp32 (the model's own distribution: temperature 1, no
       truncation). Per row, in this order: temperature (0 = greedy argmax, lowest id on ties),
       top_k (0 = off), top_p (1 = off, mass over the top-k survivors), min_p (0 = off,
       relative to the most likely token); then a draw from the survivors' softmax with a
       counter-based generator keyed by (seed, step), so a row's draw depends on its own
       logits and parameters only. params (n) host. This is the one host synchronisation of
       a step. The CPU backend's is eng_sampler_sample (eng_sampler.h), the definition. */
    int (*sample)(eng_backend_t *be, int32_t *tokens, float *logprobs, const float *logits,
                  int n, int vocab, const eng_sample_params_t *params);

    /* A matmul with its neighbours fused (NULL when the backend lacks it; the model then
       calls the ops one by one): y = (f->norm_w ? rmsnorm(x) * norm_w : x) @ W^T + bias,
       then f->epi (see eng_lin_epi_t). x (n, in_dim) f32; W (out_dim, in_dim) `dtype`; bias
       (out_dim) `dtype` or NULL; out as the epilogue says, never x. The same values as the
       composition rmsnorm -> matmul -> add / swiglu_fused / rope_kv_store up to fp32
       rounding: a device backend may fold the norm's scale into the product's sum. */
    int (*linear)(eng_backend_t *be, float *out, const float *x, const void *w,
                  const void *bias, eng_dtype_t dtype, int n, int in_dim, int out_dim,
                  const eng_linear_t *f);

    /* A hint that the `bytes` at ptr (backend memory, usually the next product's weights)
       will be read by the op after the next one, in a step of n_tok rows: a device backend may
       start moving them into its cache while the next op (the attention, which at small batch
       reads little memory) runs. Changes no value; NULL or a no-op where it does not pay. */
    int (*prefetch)(eng_backend_t *be, const void *ptr, size_t bytes, int n_tok);

    /* Runs one all-decode step as a replayed device graph (CUDA graphs). `step` holds the
       step's host arrays as for prepare (every sequence exactly one query token, n_tok ==
       n_seq == n_rows; the caller pads the batch to a bucket size itself); record(ctx)
       queues the step's ops with those same host pointers and must make the same calls, on
       the same backend pointers, every time it is called for a given (n_tok,
       batch->max_blocks, key): the caller changes `key` (or calls graph_reset) whenever a
       buffer, weight or pool the ops use moves. The backend prepares the step (one upload
       into fixed device buffers, the attention plan in a fixed-size layout for a context of
       up to max_blocks * block_size positions), then replays the graph of that key, or runs
       record eagerly (first use of a key, or after the backend's own scratch buffers grew)
       or captures it (second use). Nothing in the step waits for the host. Returns 0 or the
       first error (a failed capture falls back to an eager run and is logged once). */
    int (*graph_step)(eng_backend_t *be, const eng_step_t *step, int block_size, uint64_t key,
                      int (*record)(void *ctx), void *ctx);
    /* Drops every captured graph (weights reloaded, pools or activations reallocated). */
    void (*graph_reset)(eng_backend_t *be);
};

/* True when a model should run its matmuls through be->linear: the backend has it and
   $ANVIL_ENGINE_LINEAR is not "0" (the op-by-op path, kept for comparison). */
int eng_linear_enabled(const eng_backend_t *be);

/* --- decode graph helpers (shared by the model and the benchmark's model) ------------------ */

/* The batch bucket graph steps are padded to: 1, 2, 4, 8, then multiples of 16 up to 256,
   then of 64. */
int eng_graph_bucket(int n);

/* A decode step padded for graph_step: the padded host arrays (owned, reused across steps)
   and the eng_step_t / batch that describe them. */
typedef struct {
    int32_t *buf;
    size_t cap;
    eng_attn_batch_t batch;
    eng_step_t step;
    const int32_t *ids, *pos, *slots, *rows;
} eng_graph_pad_t;

/* True when a step can run as a graph step: every sequence one query token and the logits
   rows are the tokens in order. */
int eng_graph_is_decode(const eng_attn_batch_t *b, const int32_t *rows, int n_rows);
/* Pads the decode step (b, ids, pos, slots) to eng_graph_bucket(n_seq) sequences: the extra
   ones have token 0 at position 0 in slot pad_block * block_size, context 1 and a block table
   of pad_block only; the block tables get the stride of the blocks the longest context
   needs rounded up to a multiple of 8, so that one graph serves many steps. 0 or -ENOMEM. */
int eng_graph_pad(eng_graph_pad_t *p, const eng_attn_batch_t *b, const int32_t *ids,
                  const int32_t *pos, const int32_t *slots, int block_size, int32_t pad_block);
void eng_graph_pad_release(eng_graph_pad_t *p);

/* Creates a backend by name ("cpu"; "cuda" when built with ANVIL_CUDA). n_threads applies to
   the CPU backend (0 = one per core). Returns NULL with the reason logged when the name is
   unknown or the backend cannot start. */
eng_backend_t *eng_backend_new(const char *name, int n_threads);
/* Same with the KV pools in the named dtype (eng_kv_dtype_parse); NULL or "" = the backend's
   default (cpu: f32, the only one it keeps; cuda: $ANVIL_CUDA_KV, else bf16). */
eng_backend_t *eng_backend_new_kv(const char *name, int n_threads, const char *kv_dtype);

#endif

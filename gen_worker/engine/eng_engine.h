/*  eng_engine.h - the generation engine's public API: requests in, finished samples out.

    A request is one prompt (token ids, or text rendered raw or through the chat template) and
    n samples. The engine prefills the prompt once and forks the n sequences, which share the
    prompt's KV blocks (copy-on-write of the shared partial block). eng_engine_step() runs one
    scheduler step: every running sequence advances by one token (decode) or one prefill chunk,
    new sequences are admitted while KV blocks and the step's token budget allow, and when the
    cache runs out the youngest sequences are preempted (their KV dropped, recomputed later:
    a sample of a group takes the prompt's full blocks from a running sibling and feeds only
    the rest) instead of anything failing. Finished samples (EOS, stop string, max tokens, context
    length, cancel) are collected with eng_engine_pop_finished().

    Seeds: each sample has its own RNG. Its seed is request.seeds[i] when given (they must be
    distinct), else eng_seed_for_sample(request.seed, i), else (no seed) a random base from
    getrandom(2): the n samples of a group never share a seed. On the CPU backend a seeded
    request gives the same tokens on every run, whatever else is in the batch; on CUDA the
    draws are the same but the products run other kernels by the step's row count (the GEMV at
    one row, the skinny kernel at 2 to 8, cuBLASLt above, whose choice follows the shape), so
    the logits' rounding and with it a request batched differently can draw other tokens.

    Weights: eng_engine_load_weights() swaps in a new checkpoint (same shapes) and stamps
    later tokens with its version; every sequence in flight is preempted so that its KV is
    recomputed under the new weights (and no prefix state of the old weights survives).

    One thread owns the engine (the gen worker's loop, or anvil-generate).
*/
#ifndef ENG_ENGINE_H
#define ENG_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "eng_config.h"
#include "eng_sampler.h"
#include "eng_tokenizer.h"
#include "eng_util.h"

#define ENG_REQUEST_ID_MAX 64

typedef struct eng_engine eng_engine_t;

#define ENG_MAX_SEQS_HOST   256
#define ENG_MAX_SEQS_DEVICE 512

typedef struct {
    const char *model_dir;
    const char *backend;     /* "cpu" (default) or "cuda" */
    const char *kv_dtype;    /* KV pools: NULL = the backend's (cpu f32; cuda $ANVIL_CUDA_KV
                                or bf16), "bf16", "f32" or "fp8" (e4m3, CUDA only) */
    int n_threads;           /* CPU backend threads; 0 = one per core */
    int block_size;          /* tokens per KV block; 0 = 16 */
    size_t kv_bytes;         /* KV pool budget; 0 = a device's free memory after the
                                weights less 10 % and 4 GiB, else 256 MiB */
    int n_blocks;            /* > 0 overrides kv_bytes */
    int max_batch_tokens;    /* tokens per step (prefill chunks + decodes); 0 = 2048 */
    int max_seqs;            /* running sequences at most; 0 = ENG_MAX_SEQS_DEVICE on a
                                device backend, ENG_MAX_SEQS_HOST on the CPU */
    int max_context;         /* 0 = max_position_embeddings */
    bool no_prefix_sharing;  /* prefill every sample separately (for comparisons) */
    bool cuda_graphs;        /* decode-only steps as CUDA graphs (backends with graph_step) */
    uint64_t weight_version; /* version of the weights in model_dir */
} eng_engine_opts_t;

typedef struct {
    const char *request_id;    /* copied; at most ENG_REQUEST_ID_MAX - 1 bytes */
    const int32_t *prompt_ids; /* the prompt as ids, or NULL and prompt_text */
    int n_prompt_ids;
    const char *prompt_text;
    size_t prompt_len; /* bytes of prompt_text; 0 = strlen (raw mode only: chat
                          content is a C string) */
    bool chat;         /* prompt_text is a user message for the chat template */
    int n;             /* samples, >= 1 */
    eng_sampling_t sampling;
    int max_tokens; /* >= 1 */
    bool has_seed;
    uint64_t seed;
    const uint64_t *seeds;   /* optional: n distinct per-sample seeds */
    const char *const *stop; /* stop strings (copied) */
    int n_stop;
    const int32_t *stop_ids; /* stop token ids besides the model's EOS ids */
    int n_stop_ids;
    bool ignore_eos;
} eng_request_t;

typedef enum {
    ENG_FINISH_NONE = 0,
    ENG_FINISH_EOS,     /* an EOS / stop id was sampled (it is the last token) */
    ENG_FINISH_STOP,    /* a stop string appeared (text cut before it) */
    ENG_FINISH_LENGTH,  /* max_tokens */
    ENG_FINISH_CONTEXT, /* the context length or the KV capacity was reached */
    ENG_FINISH_CANCELLED,
} eng_finish_t;

const char *eng_finish_name(eng_finish_t f);

typedef struct {
    char request_id[ENG_REQUEST_ID_MAX];
    int index; /* sample index within the request */
    uint64_t seed;
    int n_prompt;    /* prompt tokens */
    int32_t *tokens; /* (n_tokens) generated ids */
    float *logprobs; /* (n_tokens) fp32 logprob of each (see eng_sampler.h) */
    eng_top_t *top;  /* (n_tokens, n_top) or NULL */
    int n_tokens, n_top;
    char *text; /* decoded completion, NUL-terminated (raw bytes) */
    size_t text_len;
    eng_finish_t finish;
    uint64_t weight_version_first, weight_version; /* at the first and the last token */
    int n_preempted;
} eng_sample_t;

void eng_sample_destroy(eng_sample_t **self_p);

typedef struct {
    int block_size;
    int total_blocks, free_blocks, peak_blocks;
    size_t bytes_per_block;
    int running, waiting; /* sequences */
    int queued;           /* samples without KV: waiting (new or preempted) and those of a
                             group whose prompt is still to be prefilled */
    int max_seqs;         /* running sequences at most */
    int peak_batch_seqs;  /* sequences in one step at most */
    long long preemptions;
    long long reshared_tokens;  /* prompt tokens samples fed again took from a sibling's KV */
    long long processed_tokens; /* tokens run through the model (prefill, recompute, decode) */
    long long generated_tokens; /* tokens sampled */
} eng_engine_stats_t;

/* Loads model, tokenizer and backend. NULL with the reason in err. */
eng_engine_t *eng_engine_new(const eng_engine_opts_t *opts, char *err, size_t errlen);
void eng_engine_destroy(eng_engine_t **self_p);

/* Queues a request. Returns 0, or ANV_ECONFIG (bad parameters, duplicate seeds or request id),
   ANV_ETOOBIG (prompt does not fit the context), ANV_EFORMAT (text not UTF-8), with err. */
int eng_engine_submit(eng_engine_t *self, const eng_request_t *req, char *err, size_t errlen);
/* Runs one step. Returns the number of tokens run through the model (0 when idle), or a
   negative code on a backend failure. */
int eng_engine_step(eng_engine_t *self);
bool eng_engine_idle(const eng_engine_t *self);
/* Next finished sample (caller owns it), or NULL. */
eng_sample_t *eng_engine_pop_finished(eng_engine_t *self);
/* Finishes every unfinished sample of the request as cancelled. 0 or ANV_ENOTFOUND. */
int eng_engine_cancel(eng_engine_t *self, const char *request_id);

/* Replaces the weights (see above). 0, or an error with err (the old weights stay). */
int eng_engine_load_weights(
    eng_engine_t *self, const char *dir, uint64_t version, char *err, size_t errlen);
/* Drops every KV block held by in-flight sequences (they are recomputed). */
void eng_engine_drop_prefix_state(eng_engine_t *self);
uint64_t eng_engine_weight_version(const eng_engine_t *self);

void eng_engine_stats(const eng_engine_t *self, eng_engine_stats_t *st);
const eng_tokenizer_t *eng_engine_tokenizer(const eng_engine_t *self);
const eng_model_config_t *eng_engine_model_config(const eng_engine_t *self);
int eng_engine_max_context(const eng_engine_t *self);
/* Encodes a prompt the way submit does (chat template or raw). */
int eng_engine_encode_prompt(const eng_engine_t *self, const char *text, bool chat, eng_ids_t *out);

#endif

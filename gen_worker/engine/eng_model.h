/*  eng_model.h - a Llama/Qwen2 decoder: weights, KV pools and the forward pass.

    The model reads config.json and the safetensors weights (model.safetensors, or the shards
    listed by model.safetensors.index.json), checks every tensor's shape against the config,
    hands the weights to the backend (no copy on the CPU: they stay in the mmap) and allocates
    the paged KV pools. The forward pass runs one step's batch (prefill chunks and decode tokens
    of any number of sequences together) through the backend's ops and returns fp32 logits and
    log-probabilities of the requested rows. The model does no scheduling: which slot each token
    goes to is decided by the caller (eng_kv). One thread.
*/
#ifndef ENG_MODEL_H
#define ENG_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "eng_config.h"
#include "eng_ops.h"

typedef struct eng_model eng_model_t;

/* One forward step. All arrays are host memory. */
typedef struct {
    int n_tok;
    const int32_t *tokens; /* (n_tok) token ids */
    const int32_t *pos;    /* (n_tok) positions */
    const int32_t *slots;  /* (n_tok) KV slot of each token (block * block_size + offset) */
    eng_attn_batch_t attn; /* the sequences of the step, see eng_ops.h */
    int n_rows;            /* rows of output wanted */
    const int32_t *rows;   /* (n_rows) indices into the step's tokens */
} eng_forward_t;

/* Loads dir with the given backend (borrowed; must outlive the model). Returns NULL with the
   reason in err. */
eng_model_t *eng_model_new(const char *dir, eng_backend_t *be, char *err, size_t errlen);
void eng_model_destroy(eng_model_t **self_p);

const eng_model_config_t *eng_model_config(const eng_model_t *self);

/* Replaces the weights with those of dir (same architecture and shapes, else an error and the
   old weights stay). KV contents become stale: the caller drops them. On a backend whose
   weights are its own copies, a checkpoint of the loaded set's sizes and dtypes is checked
   whole, then written into the loaded buffers (no second set in memory); ANV_EINTERNAL when
   that write failed halfway, after which every forward fails. */
int eng_model_reload(eng_model_t *self, const char *dir, char *err, size_t errlen);

/* Memory a reload of the loaded set's sizes and dtypes allocates while the old set is still
   loaded: 0 where it is written in place, else the weights' bytes. */
size_t eng_model_reload_bytes(const eng_model_t *self);

/* Bytes and seconds (files opened, headers checked, every tensor on the backend, synced) of
   the last weight load. */
void eng_model_load_stats(const eng_model_t *self, size_t *bytes, double *seconds);

/* Decode-only steps through the backend's graph_step (CUDA graphs) when on and the backend
   has it; off by default. */
void eng_model_set_graphs(eng_model_t *self, int on);

/* Bytes of KV pool one token needs across all layers (K and V). */
size_t eng_model_kv_bytes_per_token(const eng_model_t *self);
/* (Re)allocates the KV pools: n_blocks blocks of block_size tokens. */
int eng_model_kv_reserve(eng_model_t *self, int n_blocks, int block_size);
/* Copies KV block src to dst in every layer (copy-on-write). */
int eng_model_kv_copy(eng_model_t *self, int src, int dst);

/* Runs the step. logits and logprobs are host buffers of (n_rows, vocab) floats; either may be
   NULL. Returns 0 or a negative code (bad token ids / slots are refused before any op). */
int eng_model_forward(eng_model_t *self,
                      const eng_forward_t *batch,
                      float *logits,
                      float *logprobs);

/* What eng_model_forward_sample draws and returns, all host memory. */
typedef struct {
    const eng_sample_params_t *params; /* (n_rows): row r's draw */
    int32_t *tokens;                   /* (n_rows) out */
    float *logprobs;                   /* (n_rows) out: log_softmax of the drawn token */
    const int32_t *lp_rows;            /* rows whose whole log-softmax is wanted (top logprobs) */
    int n_lp_rows;
    float *lp_out; /* (n_lp_rows, vocab) out */
} eng_model_sample_t;

/* Runs the step and draws one token per row on the backend (its `sample`: the one host
   synchronisation of the step, and no logits leave the device), plus the full log-softmax of
   the few rows that asked for it. A row may appear several times in batch->rows (the n
   samples of a prompt each draw their first token from the same position). Returns 0 or a
   negative code. */
int eng_model_forward_sample(eng_model_t *self, const eng_forward_t *batch,
                             const eng_model_sample_t *sample);

#endif

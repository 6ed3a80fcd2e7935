/*  eng_config.h - the model's config.json and generation_config.json as plain data.

    Only the decoder families the engine implements are accepted: LlamaForCausalLM and
    Qwen2ForCausalLM (QKV bias). Everything the forward pass depends on is read from the file;
    features the engine does not implement (rope scaling, MLP bias, sliding windows, activations
    other than SiLU) are refused by name instead of being silently ignored.
*/
#ifndef ENG_CONFIG_H
#define ENG_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ENG_MAX_EOS 8

typedef enum {
    ENG_ARCH_LLAMA = 1,
    ENG_ARCH_QWEN2 = 2,
} eng_arch_t;

typedef struct {
    eng_arch_t arch;
    char arch_name[64];
    int hidden;     /* hidden_size */
    int n_layers;   /* num_hidden_layers */
    int n_heads;    /* num_attention_heads */
    int n_kv_heads; /* num_key_value_heads (defaults to n_heads) */
    int head_dim;   /* head_dim (defaults to hidden / n_heads) */
    int ffn;        /* intermediate_size */
    int vocab;      /* vocab_size */
    int max_pos;    /* max_position_embeddings */
    float rope_theta;
    float rms_eps;
    bool qkv_bias; /* Qwen2, or Llama's attention_bias */
    bool tied_embeddings;
    int bos_id; /* -1 when unknown */
    int n_eos;
    int eos_ids[ENG_MAX_EOS];
    /* generation_config.json defaults (-1 / NAN-free: has_* say whether present) */
    bool has_temperature, has_top_p, has_top_k;
    float temperature, top_p;
    int top_k;
} eng_model_config_t;

/* Parses <dir>/config.json and, when present, <dir>/generation_config.json (its eos ids are
   added to the config's). Returns 0 or ANV_EFORMAT / ANV_EUNSUPPORTED / -errno with the
   reason in err. */
int eng_config_load(const char *dir, eng_model_config_t *cfg, char *err, size_t errlen);

/* Reads a whole file into a NUL-terminated buffer (caller frees). NULL with errno set. */
char *eng_read_file(const char *path, size_t *len_out);

#endif

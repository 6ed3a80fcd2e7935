/*  eng_sampler.h - next-token sampling on the host: the definition the CUDA kernel follows.

    Order (the one HF generate applies): temperature, top-k, top-p, min-p, then one draw from
    the renormalised remainder. temperature <= 0 is greedy (argmax, lowest id on ties). The
    draw is a Gumbel-max with one counter-based uniform per (seed, step, token)
    (eng_sample_hash.h), and truncation thresholds come from integer keys and fixed-point
    masses: the CUDA backend's `sample` (cuda/softmax.cu) computes the same thing, so a seed
    draws the same tokens on either backend wherever their logits agree, on every run and
    machine, and a draw depends on nothing but (seed, step) and its own logits. The reported
    logprob is the model's own log_softmax of the sampled token (temperature 1, before
    truncation): what an RL trainer recomputes from the same weights. Top logprobs come from
    the same distribution. A sampler object holds scratch space; one thread.
*/
#ifndef ENG_SAMPLER_H
#define ENG_SAMPLER_H

#include <stdint.h>

#define ENG_MAX_TOP_LOGPROBS 20

typedef struct {
    float temperature;  /* <= 0: greedy */
    int top_k;          /* 0: off */
    float top_p;        /* 1: off */
    float min_p;        /* 0: off */
    int n_top_logprobs; /* 0 .. ENG_MAX_TOP_LOGPROBS */
} eng_sampling_t;

typedef struct {
    int32_t id;
    float logprob;
} eng_top_t;

/* The seed of sample `index` of a group seeded with base: a bijective mix of
   base + index * golden ratio, so the n samples of a group never share a seed. */
uint64_t eng_seed_for_sample(uint64_t base, uint32_t index);

/* Validates p: 0 or ANV_ECONFIG. */
int eng_sampling_check(const eng_sampling_t *p);

typedef struct eng_sampler eng_sampler_t;

eng_sampler_t *eng_sampler_new(int vocab);
void eng_sampler_destroy(eng_sampler_t **self_p);
/* top[0 .. k) = the k most likely tokens of logprobs (vocab), descending, lower id first on
   ties (k <= vocab and <= ENG_MAX_TOP_LOGPROBS). */
void eng_sampler_top(eng_sampler_t *self, const float *logprobs, int k, eng_top_t *top);
/* Samples draw `step` (0 for a sample's first token) of a sample seeded with seed from
   logits (vocab) fp32 (any shift: logprobs are logits too). Sets *token and *logprob (the
   log_softmax of the token); fills top[0 .. p->n_top_logprobs) in descending order when top
   is not NULL. Returns 0 or -EINVAL. */
int eng_sampler_sample(eng_sampler_t *self,
                       const float *logits,
                       const eng_sampling_t *p,
                       uint64_t seed,
                       uint64_t step,
                       int32_t *token,
                       float *logprob,
                       eng_top_t *top);

#endif

/*  eng_sampler.h - next-token sampling from fp32 log-probabilities, with per-sample RNGs.

    Order (the one HF generate applies): temperature, top-k, top-p, min-p, then one draw from
    the renormalised remainder. temperature <= 0 is greedy (argmax, lowest id on ties; no
    random number is drawn). The draw walks the kept candidates in a fixed order (id order, or
    descending probability when top-p needed the sort) with one uniform double from the
    sample's xoshiro256** generator, so a seed gives the same tokens on every run and machine.
    The reported logprob is the model's own log_softmax of the sampled token (temperature 1,
    before truncation): what an RL trainer recomputes from the same weights. Top logprobs come
    from the same distribution. A sampler object holds scratch space; one thread.
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
    uint64_t s[4];
} eng_rng_t;

typedef struct {
    int32_t id;
    float logprob;
} eng_top_t;

/* Seeds via splitmix64 (any seed, 0 included, gives a good state). */
void eng_rng_seed(eng_rng_t *r, uint64_t seed);
uint64_t eng_rng_next(eng_rng_t *r);
/* Uniform in [0, 1) with 53 random bits. */
double eng_rng_uniform(eng_rng_t *r);
/* The seed of sample `index` of a group seeded with base: a bijective mix of
   base + index * golden ratio, so the n samples of a group never share a seed. */
uint64_t eng_seed_for_sample(uint64_t base, uint32_t index);

/* Validates p: 0 or ANV_ECONFIG. */
int eng_sampling_check(const eng_sampling_t *p);

typedef struct eng_sampler eng_sampler_t;

eng_sampler_t *eng_sampler_new(int vocab);
void eng_sampler_destroy(eng_sampler_t **self_p);
/* Samples from logprobs (vocab) fp32. Sets *token and *logprob; fills top[0 ..
   p->n_top_logprobs) in descending order when top is not NULL. Returns 0 or -EINVAL. */
int eng_sampler_sample(eng_sampler_t *self,
                       const float *logprobs,
                       const eng_sampling_t *p,
                       eng_rng_t *rng,
                       int32_t *token,
                       float *logprob,
                       eng_top_t *top);

#endif

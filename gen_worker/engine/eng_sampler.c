/*  eng_sampler.c - temperature / top-k / top-p / min-p sampling.

    Candidates are (id, z = logprob / T) pairs in the scratch array. top-k keeps the k best
    with a partial selection (ties to the lower id), top-p sorts what is left by z, min-p drops
    z below z_max + ln(min_p). Masses are exp(z - z_max) in double, so no normaliser is needed
    before the draw. Only the steps that are on do any work; plain temperature sampling is one
    pass over the vocabulary.
*/
#include "eng_sampler.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "anv_error.h"
#include "eng_sample_hash.h"

typedef struct {
    int32_t id;
    float z;
} s_cand_t;

struct eng_sampler {
    int vocab;
    s_cand_t *c;             /* top logprobs */
    uint32_t *key;           /* order-preserving keys of the logits */
    unsigned long long *mass; /* top-p masses */
};

uint64_t eng_seed_for_sample(uint64_t base, uint32_t index)
{
    /* splitmix64's finaliser is a bijection and base + index * golden differs for every
       index below 2^64, so distinct indices give distinct seeds */
    return eng_sample_mix(base + (uint64_t)index * 0x9e3779b97f4a7c15ull);
}

int eng_sampling_check(const eng_sampling_t *p)
{
    if (!(p->temperature >= 0 && p->temperature <= 100) || p->top_k < 0 ||
        !(p->top_p > 0 && p->top_p <= 1) || !(p->min_p >= 0 && p->min_p <= 1) ||
        p->n_top_logprobs < 0 || p->n_top_logprobs > ENG_MAX_TOP_LOGPROBS)
        return ANV_ECONFIG;
    return 0;
}

eng_sampler_t *eng_sampler_new(int vocab)
{
    eng_sampler_t *self = calloc(1, sizeof(*self));
    if (!self)
        return NULL;
    self->vocab = vocab;
    self->c = malloc((size_t)vocab * sizeof(s_cand_t));
    self->key = malloc((size_t)vocab * sizeof(uint32_t));
    self->mass = malloc((size_t)vocab * sizeof(unsigned long long));
    if (!self->c || !self->key || !self->mass) {
        eng_sampler_destroy(&self);
        return NULL;
    }
    return self;
}

void eng_sampler_destroy(eng_sampler_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    free((*self_p)->c);
    free((*self_p)->key);
    free((*self_p)->mass);
    free(*self_p);
    *self_p = NULL;
}

/* a ranks before b: higher z, then lower id */
static inline int s_better(const s_cand_t *a, const s_cand_t *b)
{
    return a->z > b->z || (a->z == b->z && a->id < b->id);
}

static int s_cmp_desc(const void *pa, const void *pb)
{
    const s_cand_t *a = pa, *b = pb;
    return s_better(a, b) ? -1 : s_better(b, a) ? 1 : 0;
}

/* Moves the k best of c[0, n) to the front, sorted (binary min-heap of size k). */
static void s_top_k(s_cand_t *c, int n, int k)
{
    for (int i = 1; i < k; i++) { /* heapify the first k: worst at the root */
        for (int j = i; j > 0;) {
            int p = (j - 1) / 2;
            if (!s_better(&c[p], &c[j]))
                break;
            s_cand_t t = c[p];
            c[p] = c[j];
            c[j] = t;
            j = p;
        }
    }
    for (int i = k; i < n; i++) {
        if (!s_better(&c[i], &c[0]))
            continue;
        c[0] = c[i];
        for (int j = 0;;) { /* sift down */
            int l = 2 * j + 1, r = l + 1, w = j;
            if (l < k && s_better(&c[w], &c[l]))
                w = l;
            if (r < k && s_better(&c[w], &c[r]))
                w = r;
            if (w == j)
                break;
            s_cand_t t = c[w];
            c[w] = c[j];
            c[j] = t;
            j = w;
        }
    }
    qsort(c, (size_t)k, sizeof(s_cand_t), s_cmp_desc);
}

static void s_top_k_out(s_cand_t *c, int V, int k, eng_top_t *top)
{
    k = k < V ? k : V;
    s_top_k(c, V, k);
    for (int i = 0; i < k; i++)
        top[i] = (eng_top_t){c[i].id, c[i].z};
}

void eng_sampler_top(eng_sampler_t *self, const float *lp, int k, eng_top_t *top)
{
    s_cand_t *c = self->c;
    for (int i = 0; i < self->vocab; i++)
        c[i] = (s_cand_t){i, lp[i]};
    s_top_k_out(c, self->vocab, k, top);
}

/* The largest key t among c's survivors (key >= floor) such that the survivors with key >= t
   hold at least `want` of the weight w(i) (1 per token for top-k, the fixed-point mass for
   top-p): a most-significant-digit-first radix select, 8 bits a pass, exactly as the CUDA
   kernel runs it, so both find the same threshold from the same keys and weights. */
static uint32_t s_select(const uint32_t *key, const unsigned long long *w, int n, uint32_t floor,
                         unsigned long long want)
{
    uint32_t prefix = 0, mask = 0;
    unsigned long long hist[256];
    for (int shift = 24; shift >= 0; shift -= 8) {
        memset(hist, 0, sizeof hist);
        for (int i = 0; i < n; i++)
            if (key[i] >= floor && (key[i] & mask) == prefix)
                hist[(key[i] >> shift) & 255] += w ? w[i] : 1;
        unsigned long long cum = 0;
        int d = 255;
        for (; d > 0; d--) {
            if (cum + hist[d] >= want)
                break;
            cum += hist[d];
        }
        want = want > cum ? want - cum : 0;
        prefix |= (uint32_t)d << shift;
        mask |= 255u << shift;
    }
    return prefix;
}

int eng_sampler_sample(eng_sampler_t *self,
                       const float *l,
                       const eng_sampling_t *p,
                       uint64_t seed,
                       uint64_t step,
                       int32_t *token,
                       float *logprob,
                       eng_top_t *top)
{
    int V = self->vocab;
    if (!l || !token || eng_sampling_check(p))
        return -EINVAL;
    int am = -1;
    float mx = -INFINITY;
    for (int i = 0; i < V; i++)
        if (l[i] > mx)
            mx = l[i], am = i;
    if (am < 0)
        am = 0; /* no finite maximum (all NaN / -inf) */
    mx = l[am];
    double sum = 0;
    for (int i = 0; i < V; i++)
        sum += exp((double)(l[i] - mx));
    const float lse = mx + (float)log(sum);
    if (top && p->n_top_logprobs > 0) {
        s_cand_t *c = self->c;
        for (int i = 0; i < V; i++)
            c[i] = (s_cand_t){i, l[i] - lse};
        s_top_k_out(c, V, p->n_top_logprobs, top);
    }
    int tok = am;
    if (p->temperature > 0 && isfinite(mx)) {
        const float inv_t = 1.0f / p->temperature;
        uint32_t *key = self->key;
        for (int i = 0; i < V; i++)
            key[i] = eng_sample_key(l[i]);
        uint32_t thr = 0;
        if (p->top_k > 0 && p->top_k < V)
            thr = s_select(key, NULL, V, 0, (unsigned long long)p->top_k);
        if (p->top_p > 0 && p->top_p < 1) {
            unsigned long long *w = self->mass, tot = 0;
            for (int i = 0; i < V; i++) {
                w[i] = key[i] >= thr ? eng_sample_mass((l[i] - mx) * inv_t) : 0;
                tot += w[i];
            }
            unsigned long long want = (unsigned long long)ceil((double)p->top_p * (double)tot);
            uint32_t t = s_select(key, w, V, thr, want);
            if (t > thr)
                thr = t;
        }
        if (p->min_p > 0 && p->min_p <= 1) {
            uint32_t k = eng_sample_key(mx + p->temperature * logf(p->min_p));
            if (k > thr)
                thr = k;
        }
        if (eng_sample_key(mx) < thr)
            thr = eng_sample_key(mx); /* the most likely token always survives */
        const uint64_t base = eng_sample_base(seed, step);
        float best = -INFINITY;
        for (int i = 0; i < V; i++) {
            if (key[i] < thr)
                continue;
            float g = (l[i] - mx) * inv_t + eng_sample_gumbel(base, i);
            if (g > best)
                best = g, tok = i;
        }
    }
    *token = tok;
    *logprob = l[tok] - lse;
    return 0;
}

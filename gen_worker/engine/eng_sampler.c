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

typedef struct {
    int32_t id;
    float z;
} s_cand_t;

struct eng_sampler {
    int vocab;
    s_cand_t *c;
};

static uint64_t s_splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void eng_rng_seed(eng_rng_t *r, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        r->s[i] = s_splitmix(&x);
}

static inline uint64_t s_rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t eng_rng_next(eng_rng_t *r)
{
    uint64_t *s = r->s;
    uint64_t out = s_rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = s_rotl(s[3], 45);
    return out;
}

double eng_rng_uniform(eng_rng_t *r)
{
    return (double)(eng_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

uint64_t eng_seed_for_sample(uint64_t base, uint32_t index)
{
    /* splitmix64's finaliser is a bijection and base + index * golden differs for every
       index below 2^64, so distinct indices give distinct seeds */
    uint64_t x = base + (uint64_t)index * 0x9e3779b97f4a7c15ull - 0x9e3779b97f4a7c15ull;
    return s_splitmix(&x);
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
    if (!self->c) {
        free(self);
        return NULL;
    }
    return self;
}

void eng_sampler_destroy(eng_sampler_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    free((*self_p)->c);
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

int eng_sampler_sample(eng_sampler_t *self,
                       const float *lp,
                       const eng_sampling_t *p,
                       eng_rng_t *rng,
                       int32_t *token,
                       float *logprob,
                       eng_top_t *top)
{
    int V = self->vocab, n = V;
    s_cand_t *c = self->c;
    if (!lp || !token || eng_sampling_check(p))
        return -EINVAL;
    if (top && p->n_top_logprobs > 0) {
        for (int i = 0; i < V; i++)
            c[i] = (s_cand_t){i, lp[i]};
        int k = p->n_top_logprobs < V ? p->n_top_logprobs : V;
        s_top_k(c, V, k);
        for (int i = 0; i < k; i++)
            top[i] = (eng_top_t){c[i].id, c[i].z};
    }
    if (p->temperature <= 0 || p->top_k == 1) {
        int best = 0;
        for (int i = 1; i < V; i++)
            if (lp[i] > lp[best])
                best = i;
        *token = best;
        *logprob = lp[best];
        return 0;
    }
    float inv_t = 1.0f / p->temperature, zmax = -INFINITY;
    for (int i = 0; i < V; i++) {
        c[i] = (s_cand_t){i, lp[i] * inv_t};
        if (c[i].z > zmax)
            zmax = c[i].z;
    }
    if (p->top_k > 0 && p->top_k < n) {
        s_top_k(c, n, p->top_k);
        n = p->top_k;
    } else if (p->top_p < 1.0f) {
        qsort(c, (size_t)n, sizeof(s_cand_t), s_cmp_desc);
    }
    if (p->top_p < 1.0f) { /* c[0, n) is sorted here */
        double total = 0, cum = 0;
        for (int i = 0; i < n; i++)
            total += exp((double)(c[i].z - zmax));
        int keep = 0;
        while (keep < n) {
            cum += exp((double)(c[keep].z - zmax));
            keep++;
            if (cum >= p->top_p * total)
                break;
        }
        n = keep;
    }
    if (p->min_p > 0) {
        float floor_z = zmax + logf(p->min_p);
        int m = 0;
        for (int i = 0; i < n; i++)
            if (c[i].z >= floor_z)
                c[m++] = c[i];
        n = m; /* the argmax always survives */
    }
    double total = 0;
    for (int i = 0; i < n; i++)
        total += exp((double)(c[i].z - zmax));
    double u = eng_rng_uniform(rng) * total, cum = 0;
    int pick = n - 1;
    for (int i = 0; i < n; i++) {
        cum += exp((double)(c[i].z - zmax));
        if (u < cum) {
            pick = i;
            break;
        }
    }
    *token = c[pick].id;
    *logprob = lp[c[pick].id];
    return 0;
}

/*  eng_sample_hash.h - the pieces of token sampling that the host sampler (eng_sampler.c) and
    the CUDA kernel (cuda/softmax.cu) must compute identically, written once for both.

    A draw is a Gumbel-max: token = argmax over survivors of (l - max) / T + G, where G is a
    Gumbel variate made from one counter-based uniform per (seed, step, token id). Nothing is
    carried from one draw to the next, so a sample's tokens depend only on its seed and its
    logits, and a preempted sequence that recomputes draws what it drew before. Truncation
    compares an order-preserving integer key of each logit (ties keep every equal logit).
*/
#ifndef ENG_SAMPLE_HASH_H
#define ENG_SAMPLE_HASH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define ENG_HD __host__ __device__ __forceinline__
#else
#define ENG_HD static inline
#endif

/* Order-preserving key of a float: a < b (as floats, no NaN) iff key(a) < key(b). */
ENG_HD uint32_t eng_sample_key(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* splitmix64's finaliser. */
ENG_HD uint64_t eng_sample_mix(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

/* The hash base of draw `step` (0, 1, ...) of a sample seeded with seed. */
ENG_HD uint64_t eng_sample_base(uint64_t seed, uint64_t step)
{
    return eng_sample_mix(seed * 0x9e3779b97f4a7c15ull ^ eng_sample_mix(step + 1));
}

/* The Gumbel variate of token id in the draw with hash base: -log(-log(u)), u in (0, 1)
   from 24 bits of the hash (never 0 or 1). */
ENG_HD float eng_sample_gumbel(uint64_t base, int id)
{
    uint64_t h = eng_sample_mix(base + (uint64_t)id * 0xd1b54a32d192ed03ull);
    float u = ((float)(h >> 40) + 0.5f) * (1.0f / 16777216.0f);
    return -logf(-logf(u));
}

/* Fixed-point mass exp(z) * 2^32 (z <= 0) of a survivor for top-p: integer sums make the
   threshold independent of summation order. */
ENG_HD unsigned long long eng_sample_mass(float z)
{
    return (unsigned long long)rintf(expf(z) * 4294967296.0f);
}

#endif

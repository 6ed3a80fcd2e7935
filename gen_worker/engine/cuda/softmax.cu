/*  softmax.cu - fp32 log-softmax over the vocabulary and on-GPU sampling.

    log_softmax: one block of 1024 threads a row: block max, block sum of exp, write
    l - lse. sample: a cluster of 8 blocks a row while the batch's clusters fit in two blocks
    an SM (sm_90; each block scans its part of the row and every pass's partials are
    exchanged through distributed shared memory, s_row_group), one block a row above that
    (ANVIL_CUDA_SAMPLE_BLOCKS=1 or 8 fixes either). The row's max / argmax and log-sum-exp give
    the greedy token and every logprob (of the model's own distribution); truncation works
    on an order-preserving integer key of each logit, so top-k and top-p thresholds are
    found by a 4-pass radix select (8 bits a pass, counts for top-k, fixed-point masses for
    top-p: integer sums, so the threshold is the same whatever the thread schedule; a
    warp's lanes that fall in one bin, most of them since similar logits share their high
    bytes, add with one shared atomic, found by __match_any_sync), min-p is a plain logit
    threshold, and the draw is a Gumbel-max over the survivors with one counter-based
    uniform per (seed, step, token). A row's result depends only on its logits, its own
    parameters and the backend's blocks a row (the logprob's float sum only; the token not
    even on that), and its token is the host sampler's (eng_sampler.c) draw: the two share
    eng_sample_hash.h.
*/
#include <cooperative_groups.h>
#include <string.h>

#include "eng_cuda_internal.h"
#include "eng_sample_hash.h"

#define ECU_SM_THREADS 1024

namespace cg = cooperative_groups;

static __global__ void __launch_bounds__(ECU_SM_THREADS)
    s_log_softmax_kernel(float *out /* (n, vocab) f32 */, const float *logits /* (n, vocab) */,
                         int vocab)
{
    __shared__ float red[32];
    const float *l = logits + (size_t)blockIdx.x * vocab;
    float *o = out + (size_t)blockIdx.x * vocab;
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x)
        mx = fmaxf(mx, l[i]);
    mx = ecu_block_max(mx, red);
    float sum = 0.0f;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x)
        sum += expf(l[i] - mx);
    sum = ecu_block_sum(sum, red);
    float lse = mx + logf(sum);
    for (int i = threadIdx.x; i < vocab; i += blockDim.x)
        o[i] = l[i] - lse;
}

extern "C" int ecu_log_softmax(eng_backend_t *be, float *out, const float *logits, int n,
                               int vocab)
{
    ecu_state_t *st = ecu_st(be);
    if (!out || !logits || n <= 0 || vocab <= 0)
        return -EINVAL;
    s_log_softmax_kernel<<<n, ECU_SM_THREADS, 0, st->stream>>>(out, logits, vocab);
    ECU_LAUNCHED();
    return 0;
}

/* --- sampling ---------------------------------------------------------------------------- */

/* the key, hash, Gumbel variate and fixed-point mass are eng_sample_hash.h's, shared with
   the host sampler (eng_sampler.c), which computes the same draw */
#define s_key eng_sample_key

/* Block argmax: the largest value, lowest index on ties; every thread gets the winner's
   index (returned) and value (in v). */
static __device__ int s_block_argmax(float &v, int idx, float *redv, int *redi)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, v, o);
        int oi = __shfl_xor_sync(0xffffffffu, idx, o);
        if (ov > v || (ov == v && oi < idx))
            v = ov, idx = oi;
    }
    __syncthreads();
    if (lane == 0)
        redv[warp] = v, redi[warp] = idx;
    __syncthreads();
    v = lane < nw ? redv[lane] : -INFINITY;
    idx = lane < nw ? redi[lane] : 0x7fffffff;
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, v, o);
        int oi = __shfl_xor_sync(0xffffffffu, idx, o);
        if (ov > v || (ov == v && oi < idx))
            v = ov, idx = oi;
    }
    return idx;
}

/* Calls f(i, l[i], valid) over l[lo, hi) in block-uniform steps of ECU_SM_UNROLL * blockDim.x:
   a thread issues all ECU_SM_UNROLL loads of a step before it uses the first (one block reads
   its part of the row a dozen times, so the passes are bound by load latency, not
   bandwidth), and visits its indices in increasing order (a strict > keeps the lowest index
   on ties). Every lane of a warp runs the same iterations, valid false past the end, so f may
   use warp intrinsics. */
#define ECU_SM_UNROLL 8
template <typename F>
static __device__ __forceinline__ void s_scan(const float *l, int lo, int hi, F f)
{
    for (int b = lo; b < hi; b += ECU_SM_UNROLL * blockDim.x) {
        float v[ECU_SM_UNROLL];
#pragma unroll
        for (int u = 0; u < ECU_SM_UNROLL; u++) {
            int i = b + u * blockDim.x + threadIdx.x;
            v[u] = i < hi ? __ldg(l + i) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < ECU_SM_UNROLL; u++) {
            int i = b + u * blockDim.x + threadIdx.x;
            f(i, v[u], i < hi);
        }
    }
}

/* The C blocks that share a row: one thread-block cluster (Hopper), C = 1 the block alone.
   A value is exchanged by writing it to the block's shared memory, sync(), then reading
   every rank's copy through at() in rank order, so every block of the row derives the same
   result from the same partials. */
template <int C>
struct s_row_group {
    __device__ unsigned rank() const
    {
        if constexpr (C > 1)
            return cg::this_cluster().block_rank();
        else
            return 0;
    }
    __device__ void sync() const
    {
        if constexpr (C > 1)
            cg::this_cluster().sync();
        else
            __syncthreads();
    }
    template <typename T>
    __device__ T *at(T *p, unsigned r) const
    {
        if constexpr (C > 1)
            return cg::this_cluster().map_shared_rank(p, r);
        else
            return p;
    }
};

/* The row's argmax (largest value, lowest index on ties) from each thread's (v, idx): the
   block's winner goes to *xv / *xi (shared, one pair per call site: it is read by the other
   blocks), then every block picks the same winner of the C pairs. v gets its value. */
template <int C>
static __device__ int s_row_argmax(const s_row_group<C> &g, float &v, int idx, float *redv,
                                   int *redi, float *xv, int *xi)
{
    idx = s_block_argmax(v, idx, redv, redi);
    if (threadIdx.x == 0)
        *xv = v, *xi = idx;
    g.sync();
    v = -INFINITY, idx = 0x7fffffff;
    for (int r = 0; r < C; r++) {
        float rv = *g.at(xv, r);
        int ri = *g.at(xi, r);
        if (rv > v || (rv == v && ri < idx))
            v = rv, idx = ri;
    }
    return idx;
}

/* One 8-bit radix pass of a threshold select: hist holds this block's counts or masses of
   the pass; after the group's sync, the 256 bins are summed over the row's blocks and thread
   0 walks them from the top until *rem (the count or mass still wanted) is reached: the bin
   found is the threshold's next byte, *rem what is still wanted below it. Integer sums, so
   the result does not depend on the split or the schedule. */
template <int C, typename T>
static __device__ uint32_t s_radix_step(const s_row_group<C> &g, T *hist /* (256) shared */,
                                        unsigned long long *tot /* (256) shared */,
                                        unsigned long long *rem /* shared */, uint32_t *key)
{
    g.sync();
    for (int b = threadIdx.x; b < 256; b += blockDim.x) {
        unsigned long long t = 0;
        for (int r = 0; r < C; r++)
            t += *g.at(hist + b, r);
        tot[b] = t;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned long long cum = 0, want = *rem;
        int d = 255;
        for (; d > 0; d--) {
            if (cum + tot[d] >= want)
                break;
            cum += tot[d];
        }
        *rem = want > cum ? want - cum : 0;
        *key = (uint32_t)d;
    }
    __syncthreads();
    return *key;
}

/* Sampling of one row by C blocks (C = 1: one block, the whole row; C > 1: a cluster, each
   block a contiguous part of the row). Every pass (argmax, sum of exp, the radix passes of
   top-k and top-p, the Gumbel draw) scans the block's part and exchanges partials through
   s_row_group; float sums are added in rank order, so a row's logprob depends on C but not on
   the batch, and its token (integer thresholds, argmax with the lowest index on ties) not
   even on C. */
template <int C>
static __global__ void __launch_bounds__(ECU_SM_THREADS)
    s_sample_kernel(const float *logits /* (n, vocab) f32 */, int vocab,
                    const eng_sample_params_t *params /* (n) device */,
                    float2 *result /* (n) {token bits, logprob} device */)
{
    __shared__ float redv[32];
    __shared__ int redi[32];
    __shared__ uint32_t hist[4][256];           /* this block's top-k counts, one set a pass */
    __shared__ unsigned long long hmass[4][256]; /* its top-p masses, one set a pass */
    __shared__ unsigned long long tot[256], wsum[32];
    __shared__ float x_max, x_sum, x_best;      /* partials read by the other blocks */
    __shared__ int x_am, x_bi;
    __shared__ unsigned long long x_mass;
    __shared__ uint32_t sh_key;
    __shared__ unsigned long long sh_rem;
    const s_row_group<C> g;
    const int row = C > 1 ? (int)(blockIdx.x / C) : (int)blockIdx.x;
    const int span = ((vocab + C - 1) / C + 31) & ~31;
    const int lo = min(vocab, (int)g.rank() * span), hi = min(vocab, lo + span);
    const float *l = logits + (size_t)row * vocab;
    const eng_sample_params_t p = params[row];
    for (int i = threadIdx.x; i < 4 * 256; i += blockDim.x) {
        hist[i >> 8][i & 255] = 0;
        hmass[i >> 8][i & 255] = 0;
    }

    float mx = -INFINITY;
    int am = 0x7fffffff;
    s_scan(l, lo, hi, [&](int i, float v, bool ok) {
        if (ok && v > mx)
            mx = v, am = i;
    });
    am = s_row_argmax(g, mx, am, redv, redi, &x_max, &x_am);
    if (am < 0 || am >= vocab)
        am = 0; /* a row without a finite maximum (all NaN / -inf) */
    mx = l[am];
    float sum = 0.0f;
    s_scan(l, lo, hi, [&](int, float v, bool ok) {
        if (ok)
            sum += expf(v - mx);
    });
    sum = ecu_block_sum(sum, redv);
    if (threadIdx.x == 0)
        x_sum = sum;
    g.sync();
    sum = *g.at(&x_sum, 0);
    for (int r = 1; r < C; r++)
        sum += *g.at(&x_sum, r);
    const float lse = mx + logf(sum);
    int tok = am;

    if (p.temperature > 0.0f) {
        const float inv_t = 1.0f / p.temperature;
        uint32_t thr = 0;
        if (p.top_k > 0 && p.top_k < vocab) {
            uint32_t prefix = 0, mask = 0;
            if (threadIdx.x == 0)
                sh_rem = (unsigned long long)p.top_k;
            for (int q = 0; q < 4; q++) {
                const int shift = 24 - 8 * q;
                /* whole warps per step, so that the lanes that fall in one bin (most of
                   them: similar logits share their high bytes) add their count with one
                   atomic instead of contending for the bin */
                s_scan(l, lo, hi, [&](int, float v, bool ok) {
                    uint32_t bin = 256; /* no bin */
                    if (ok) {
                        uint32_t k = s_key(v);
                        if ((k & mask) == prefix)
                            bin = (k >> shift) & 255;
                    }
                    unsigned peers = __match_any_sync(0xffffffffu, bin);
                    if (bin < 256 && (threadIdx.x & 31) == __ffs(peers) - 1)
                        atomicAdd(&hist[q][bin], (uint32_t)__popc(peers));
                });
                prefix |= s_radix_step(g, hist[q], tot, &sh_rem, &sh_key) << shift;
                mask |= 255u << shift;
            }
            thr = prefix;
        }
        if (p.top_p > 0.0f && p.top_p < 1.0f) {
            /* fixed-point masses exp((l - max) / T) * 2^32 of the top-k survivors */
            unsigned long long mass = 0;
            s_scan(l, lo, hi, [&](int, float v, bool ok) {
                if (ok && s_key(v) >= thr)
                    mass += eng_sample_mass((v - mx) * inv_t);
            });
            /* block sum of integers via two float-free warp passes */
            for (int o = 16; o > 0; o >>= 1)
                mass += __shfl_xor_sync(0xffffffffu, mass, o);
            if ((threadIdx.x & 31) == 0)
                wsum[threadIdx.x >> 5] = mass;
            __syncthreads();
            if (threadIdx.x == 0) {
                unsigned long long t = 0;
                for (int w = 0; w < (int)(blockDim.x >> 5); w++)
                    t += wsum[w];
                x_mass = t;
            }
            g.sync();
            if (threadIdx.x == 0) {
                unsigned long long t = 0;
                for (int r = 0; r < C; r++)
                    t += *g.at(&x_mass, r);
                /* target mass: ceil(top_p * total) */
                sh_rem = (unsigned long long)ceil((double)p.top_p * (double)t);
            }
            uint32_t prefix = 0, mask = 0;
            for (int q = 0; q < 4; q++) {
                const int shift = 24 - 8 * q;
                /* as the top-k count: one atomic per bin and warp (integer sums: exact in
                   any order) */
                s_scan(l, lo, hi, [&](int, float v, bool ok) {
                    uint32_t bin = 256;
                    unsigned long long m = 0;
                    if (ok) {
                        uint32_t k = s_key(v);
                        if (k >= thr && (k & mask) == prefix) {
                            bin = (k >> shift) & 255;
                            m = eng_sample_mass((v - mx) * inv_t);
                        }
                    }
                    unsigned peers = __match_any_sync(0xffffffffu, bin);
                    if (bin < 256) {
                        unsigned long long ps = 0;
                        for (unsigned mk = peers; mk; mk &= mk - 1)
                            ps += __shfl_sync(peers, m, __ffs(mk) - 1);
                        if ((threadIdx.x & 31) == __ffs(peers) - 1)
                            atomicAdd(&hmass[q][bin], ps);
                    }
                });
                prefix |= s_radix_step(g, hmass[q], tot, &sh_rem, &sh_key) << shift;
                mask |= 255u << shift;
            }
            if (prefix > thr)
                thr = prefix;
        }
        if (p.min_p > 0.0f && p.min_p <= 1.0f) {
            uint32_t k = s_key(mx + p.temperature * logf(p.min_p));
            if (k > thr)
                thr = k;
        }
        if (s_key(mx) < thr)
            thr = s_key(mx); /* the most likely token always survives */
        const uint64_t base = eng_sample_base(p.seed, p.step);
        float best = -INFINITY;
        int bi = 0x7fffffff;
        s_scan(l, lo, hi, [&](int i, float v, bool ok) {
            if (!ok || s_key(v) < thr)
                return;
            float gv = (v - mx) * inv_t + eng_sample_gumbel(base, i);
            if (gv > best)
                best = gv, bi = i;
        });
        tok = s_row_argmax(g, best, bi, redv, redi, &x_best, &x_bi);
        if (tok < 0 || tok >= vocab)
            tok = am; /* no finite draw (NaN logits): never an index past the row */
    }
    if (g.rank() == 0 && threadIdx.x == 0)
        result[row] = make_float2(__int_as_float(tok), l[tok] - lse);
    if constexpr (C > 1)
        g.sync(); /* a block's shared memory must outlive the other blocks' reads of it */
}

extern "C" int ecu_sample(eng_backend_t *be, int32_t *tokens, float *logprobs, const float *logits,
                          int n, int vocab, const eng_sample_params_t *params)
{
    ecu_state_t *st = ecu_st(be);
    if (!tokens || !logprobs || !logits || !params || n <= 0 || vocab <= 0)
        return -EINVAL;
    size_t pbytes = (size_t)n * sizeof(eng_sample_params_t), rbytes = (size_t)n * sizeof(float2);
    ECU_TRY(ecu_buf_reserve(&st->samp_params, pbytes));
    ECU_TRY(ecu_buf_reserve(&st->samp_out, rbytes));
    ECU_TRY(ecu_buf_reserve_host(&st->samp_host, pbytes + rbytes));
    char *h = (char *)st->samp_host.ptr;
    memcpy(h, params, pbytes);
    ECU_CHECK(cudaMemcpyAsync(st->samp_params.ptr, h, pbytes, cudaMemcpyHostToDevice,
                              st->stream));
    const eng_sample_params_t *dp = (const eng_sample_params_t *)st->samp_params.ptr;
    float2 *dr = (float2 *)st->samp_out.ptr;
    /* by batch: the clusters while they fit two blocks an SM (on the H200: 1 row 109 us with
       a cluster against 424 us with one block, 16 rows 160 against 423, 256 rows 1165
       against 1099) */
    int c = st->sample_blocks ? st->sample_blocks
                              : ((long)n * ECU_SM_CLUSTER <= 2L * st->n_sm ? ECU_SM_CLUSTER : 1);
    if (c == ECU_SM_CLUSTER) {
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute attr[1];
        cfg.gridDim = dim3((unsigned)n * ECU_SM_CLUSTER);
        cfg.blockDim = dim3(ECU_SM_THREADS);
        cfg.stream = st->stream;
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = ECU_SM_CLUSTER;
        attr[0].val.clusterDim.y = 1;
        attr[0].val.clusterDim.z = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        ECU_CHECK(cudaLaunchKernelEx(&cfg, s_sample_kernel<ECU_SM_CLUSTER>, logits, vocab, dp, dr));
    } else {
        s_sample_kernel<1><<<n, ECU_SM_THREADS, 0, st->stream>>>(logits, vocab, dp, dr);
        ECU_LAUNCHED();
    }
    ECU_CHECK(cudaMemcpyAsync(h + pbytes, st->samp_out.ptr, rbytes, cudaMemcpyDeviceToHost,
                              st->stream));
    ECU_CHECK(cudaStreamSynchronize(st->stream));
    const float2 *r = (const float2 *)(h + pbytes);
    for (int i = 0; i < n; i++) {
        int32_t t;
        memcpy(&t, &r[i].x, 4);
        tokens[i] = t;
        logprobs[i] = r[i].y;
    }
    return 0;
}

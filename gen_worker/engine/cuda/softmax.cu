/*  softmax.cu - fp32 log-softmax over the vocabulary and on-GPU sampling.

    log_softmax: one block of 1024 threads a row: block max, block sum of exp, write
    l - lse. sample: a cluster of 8 blocks a row while the batch's clusters are resident at
    once (sm_90; each block scans its part of the row and every pass's partials are
    exchanged through distributed shared memory, s_row_group), one block a row above that
    (ANVIL_CUDA_SAMPLE_BLOCKS=1 or 8 fixes either). The row's max / argmax and log-sum-exp give
    the greedy token and every logprob (of the model's own distribution); truncation works
    on an order-preserving integer key of each logit, so top-k and top-p thresholds are
    found by a 4-pass radix select (8 bits a pass, counts for top-k, fixed-point masses for
    top-p: integer sums, so the threshold is the same whatever the thread schedule; a
    warp's lanes that fall in one bin, most of them since similar logits share their high
    bytes, add with one shared atomic, found by __match_any_sync; a pass's byte is found by
    a block-wide suffix scan of the bins). The passes that need no earlier result share a
    read of the row, and once a threshold's first two bytes are known the keys at or above
    them (typically a few dozen) are compacted into shared memory, which the remaining passes
    read instead of the row: three reads of the row with top-k where there were twelve
    (ANVIL_CUDA_SAMPLE_LIST=0 keeps reading the row: the A/B). min-p is a plain logit
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
   the pass; after the group's sync, the 256 bins are summed over the row's blocks, and the
   bin where the running sum from the top reaches *rem (the count or mass still wanted) is the
   threshold's next byte: the largest d >= 1 whose suffix sum S(d) = sum of bins d..255 is >=
   *rem, else 0. Threads 0..255 take a bin each, S comes from a warp suffix scan, and d is the
   number of bins 1..255 with S >= *rem (S does not grow with d): one block count, where a
   thread walking 256 bins took microseconds a pass. *rem becomes what is still wanted below
   the byte. Integer sums, so the result does not depend on the split or the schedule. Needs
   blockDim.x >= 256. */
template <int C, typename T>
static __device__ uint32_t s_radix_step(const s_row_group<C> &g, T *hist /* (256) shared */,
                                        unsigned long long *rem /* shared */)
{
    __shared__ unsigned long long wtot[8];
    g.sync();
    const int b = threadIdx.x, lane = b & 31;
    unsigned long long t = 0;
    if (b < 256) {
#pragma unroll
        for (int r = 0; r < C; r++)
            t += *g.at(hist + b, r);
    }
    unsigned long long s = t; /* warp suffix sum: bins b .. the warp's last */
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned long long y = __shfl_down_sync(0xffffffffu, s, o);
        if (lane + o < 32)
            s += y;
    }
    if (b < 256 && lane == 0)
        wtot[b >> 5] = s;
    __syncthreads();
    if (b < 256)
        for (int w = (b >> 5) + 1; w < 8; w++)
            s += wtot[w];
    const unsigned long long want = *rem;
    const int d = __syncthreads_count(b >= 1 && b < 256 && s >= want);
    if (b == d) {
        const unsigned long long cum = s - t; /* S(d + 1) */
        *rem = want > cum ? want - cum : 0;
    }
    __syncthreads();
    return (uint32_t)d;
}

/* A radix pass's bin of key k: its byte at shift when its higher bytes (mask) equal prefix,
   else 256 (none). */
static __device__ __forceinline__ uint32_t s_bin(uint32_t k, uint32_t mask, uint32_t prefix,
                                                 int shift)
{
    return (k & mask) == prefix ? (k >> shift) & 255 : 256;
}

/* Adds a warp's keys to a count histogram: the lanes that fall in one bin (most of them:
   similar logits share their high bytes) add with one atomic, found by __match_any_sync.
   Every lane of the warp calls it (bin 256: none). */
static __device__ __forceinline__ void s_hist_count(uint32_t *hist, uint32_t bin)
{
    const unsigned peers = __match_any_sync(0xffffffffu, bin);
    if (bin < 256 && (threadIdx.x & 31) == __ffs(peers) - 1)
        atomicAdd(&hist[bin], (uint32_t)__popc(peers));
}

/* The same for fixed-point masses m: a bin's lanes sum theirs (integers: exact in any
   order), its first lane adds the sum. */
static __device__ __forceinline__ void s_hist_mass(unsigned long long *hist, uint32_t bin,
                                                   unsigned long long m)
{
    const unsigned peers = __match_any_sync(0xffffffffu, bin);
    if (bin < 256) {
        unsigned long long ps = 0;
        for (unsigned mk = peers; mk; mk &= mk - 1)
            ps += __shfl_sync(peers, m, __ffs(mk) - 1);
        if ((threadIdx.x & 31) == __ffs(peers) - 1)
            atomicAdd(&hist[bin], ps);
    }
}

/* candidates a block keeps once two radix bytes are known (index and logit: 16 KB) */
#define ECU_SM_LIST 2048

/* Sampling of one row by C blocks (C = 1: one block, the whole row; C > 1: a cluster, each
   block a contiguous part of the row). The passes exchange partials through s_row_group;
   float sums are added in rank order, so a row's logprob depends on C but not on the batch,
   and its token (integer thresholds, argmax with the lowest index on ties) not even on C.
   Passes over the block's part of the row (the row is read from L2 or DRAM each time: at
   batch 256 the logits, 159 MB, do not stay in L2):
     1. the argmax, and top-k's first radix byte (its counts need no earlier result);
     2. the sum of exp, and top-k's second byte; without top-k, top-p's total mass and its
        first byte (top-p alone: a third pass for its second byte);
     3. compaction (list_on, top-k or top-p on): every logit whose key is >= the threshold's
        first two bytes goes into a list in shared memory, in any order. Every later pass
        looks only at keys >= that floor (the final threshold is at least the top-k or top-p
        one, and the clamp to the max's key keeps it there when the max is above the floor,
        which is checked), so the remaining radix passes, top-p's mass and the Gumbel draw
        read the list: typically a few dozen entries where the row has 155k. A list that
        overflows ECU_SM_LIST (e.g. a row of equal logits) leaves this block on full passes.
   The list's order does not matter: histograms and masses are integer sums and the draw's
   argmax breaks ties by the lower index explicitly. This is twelve passes over the row
   before (two per radix byte set, plus the mass and the draw) and three with top-k now. */
template <int C>
static __global__ void __launch_bounds__(ECU_SM_THREADS)
    s_sample_kernel(const float *logits /* (n, vocab) f32 */, int vocab,
                    const eng_sample_params_t *params /* (n) device */,
                    float2 *result /* (n) {token bits, logprob} device */, int list_on)
{
    __shared__ float redv[32];
    __shared__ int redi[32];
    __shared__ uint32_t hist[4][256];           /* this block's top-k counts, one set a pass */
    __shared__ unsigned long long hmass[4][256]; /* its top-p masses, one set a pass */
    __shared__ unsigned long long wsum[32];
    __shared__ float x_max, x_sum, x_best; /* partials read by the other blocks */
    __shared__ int x_am, x_bi;
    __shared__ unsigned long long x_mass;
    __shared__ unsigned long long sh_rem;
    __shared__ int li[ECU_SM_LIST];
    __shared__ float lv[ECU_SM_LIST];
    __shared__ unsigned list_n;
    const s_row_group<C> g;
    const int row = C > 1 ? (int)(blockIdx.x / C) : (int)blockIdx.x;
    const int span = ((vocab + C - 1) / C + 31) & ~31;
    const int lo = min(vocab, (int)g.rank() * span), hi = min(vocab, lo + span);
    const int lane = threadIdx.x & 31;
    const float *l = logits + (size_t)row * vocab;
    const eng_sample_params_t p = params[row];
    for (int i = threadIdx.x; i < 4 * 256; i += blockDim.x) {
        hist[i >> 8][i & 255] = 0;
        hmass[i >> 8][i & 255] = 0;
    }
    if (threadIdx.x == 0)
        list_n = 0;
    __syncthreads();
    /* block-uniform (one row a block), so the warp intrinsics below see whole warps */
    const bool samp = p.temperature > 0.0f;
    const bool use_k = samp && p.top_k > 0 && p.top_k < vocab;
    const bool use_p = samp && p.top_p > 0.0f && p.top_p < 1.0f;
    const bool p_full = use_p && !use_k; /* top-p over every key */
    const float inv_t = samp ? 1.0f / p.temperature : 0.0f;
    /* the top-p target, ceil(top_p * total mass), from each thread's share of the mass */
    auto top_p_want = [&](unsigned long long mass) {
        for (int o = 16; o > 0; o >>= 1)
            mass += __shfl_xor_sync(0xffffffffu, mass, o);
        if (lane == 0)
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
            sh_rem = (unsigned long long)ceil((double)p.top_p * (double)t);
        }
    };

    /* 1: the argmax (+ top-k's first byte) */
    float mx = -INFINITY;
    int am = 0x7fffffff;
    s_scan(l, lo, hi, [&](int i, float v, bool ok) {
        if (ok && v > mx)
            mx = v, am = i;
        if (use_k)
            s_hist_count(hist[0], ok ? s_key(v) >> 24 : 256);
    });
    am = s_row_argmax(g, mx, am, redv, redi, &x_max, &x_am);
    if (am < 0 || am >= vocab)
        am = 0; /* a row without a finite maximum (all NaN / -inf) */
    mx = l[am];
    uint32_t kp = 0, km = 0; /* top-k's threshold bytes so far */
    if (use_k) {
        if (threadIdx.x == 0)
            sh_rem = (unsigned long long)p.top_k;
        kp = s_radix_step(g, hist[0], &sh_rem) << 24, km = 0xff000000u;
    }

    /* 2: the sum of exp (+ top-k's second byte, or top-p's total mass and first byte) */
    float sum = 0.0f;
    unsigned long long pmass = 0;
    s_scan(l, lo, hi, [&](int, float v, bool ok) {
        if (ok)
            sum += expf(v - mx);
        if (use_k) {
            s_hist_count(hist[1], ok ? s_bin(s_key(v), km, kp, 16) : 256);
        } else if (p_full) {
            const unsigned long long m = ok ? eng_sample_mass((v - mx) * inv_t) : 0;
            pmass += m;
            s_hist_mass(hmass[0], ok ? s_key(v) >> 24 : 256, m);
        }
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
    if (samp) {
        uint32_t pp = 0, pm = 0; /* top-p's threshold bytes so far */
        if (use_k) {
            kp |= s_radix_step(g, hist[1], &sh_rem) << 16, km |= 0x00ff0000u;
        } else if (p_full) {
            top_p_want(pmass);
            pp = s_radix_step(g, hmass[0], &sh_rem) << 24, pm = 0xff000000u;
            s_scan(l, lo, hi, [&](int, float v, bool ok) {
                const uint32_t bin = ok ? s_bin(s_key(v), pm, pp, 16) : 256;
                s_hist_mass(hmass[1], bin,
                            bin < 256 ? eng_sample_mass((v - mx) * inv_t) : 0ull);
            });
            pp |= s_radix_step(g, hmass[1], &sh_rem) << 16, pm |= 0x00ff0000u;
        }

        /* 3: the candidates (keys >= the first two bytes) into the list */
        const uint32_t cut = use_k ? kp : pp;
        bool from_list = false;
        int m = 0;
        if (list_on && (use_k || use_p) && s_key(mx) >= cut) {
            s_scan(l, lo, hi, [&](int i, float v, bool ok) {
                const bool keep = ok && s_key(v) >= cut;
                const unsigned bal = __ballot_sync(0xffffffffu, keep);
                unsigned at = 0;
                if (lane == 0 && bal)
                    at = atomicAdd(&list_n, (unsigned)__popc(bal));
                at = __shfl_sync(0xffffffffu, at, 0) + __popc(bal & ((1u << lane) - 1));
                if (keep && at < ECU_SM_LIST)
                    li[at] = i, lv[at] = v;
            });
            __syncthreads();
            m = (int)list_n;
            from_list = m <= ECU_SM_LIST;
        }
        /* f(i, l[i], ok) over the candidates: the list, or the block's part of the row */
        auto cands = [&](auto f) {
            if (from_list) {
                for (int b = 0; b < m; b += blockDim.x) {
                    const int j = b + threadIdx.x;
                    const bool ok = j < m;
                    f(ok ? li[j] : 0, ok ? lv[j] : 0.0f, ok);
                }
            } else {
                s_scan(l, lo, hi, f);
            }
        };

        uint32_t thr = 0;
        if (use_k) {
            for (int q = 2; q < 4; q++) {
                const int shift = 24 - 8 * q;
                cands([&](int, float v, bool ok) {
                    s_hist_count(hist[q], ok ? s_bin(s_key(v), km, kp, shift) : 256);
                });
                kp |= s_radix_step(g, hist[q], &sh_rem) << shift;
                km |= 255u << shift;
            }
            thr = kp;
        }
        if (use_p) {
            int q0 = 2;
            if (use_k) {
                /* top-p over the top-k survivors: their total mass and the first byte */
                unsigned long long mass = 0;
                cands([&](int, float v, bool ok) {
                    const uint32_t k = s_key(v);
                    const bool in = ok && k >= thr;
                    const unsigned long long mm = in ? eng_sample_mass((v - mx) * inv_t) : 0;
                    mass += mm;
                    s_hist_mass(hmass[0], in ? k >> 24 : 256, mm);
                });
                top_p_want(mass);
                pp = s_radix_step(g, hmass[0], &sh_rem) << 24, pm = 0xff000000u;
                q0 = 1;
            }
            for (int q = q0; q < 4; q++) {
                const int shift = 24 - 8 * q;
                cands([&](int, float v, bool ok) {
                    const uint32_t k = s_key(v);
                    const uint32_t bin = ok && k >= thr ? s_bin(k, pm, pp, shift) : 256;
                    s_hist_mass(hmass[q], bin,
                                bin < 256 ? eng_sample_mass((v - mx) * inv_t) : 0ull);
                });
                pp |= s_radix_step(g, hmass[q], &sh_rem) << shift;
                pm |= 255u << shift;
            }
            if (pp > thr)
                thr = pp;
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
        cands([&](int i, float v, bool ok) {
            if (!ok || s_key(v) < thr)
                return;
            float gv = (v - mx) * inv_t + eng_sample_gumbel(base, i);
            if (gv > best || (gv == best && i < bi))
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
    /* by batch: a cluster a row while the rows' clusters are all resident at once (on the
       H200, with the kernel before compaction: 1 row 109 us with a cluster against 424 us
       with one block, 16 rows 160 against 423, 256 rows 1165 against 1099). How many fit
       is asked once (cudaOccupancyMaxActiveClusters): the kernel holds 64 registers a
       thread, one block an SM, where the one before fitted two. */
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    cfg.blockDim = dim3(ECU_SM_THREADS);
    cfg.stream = st->stream;
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = ECU_SM_CLUSTER;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    if (st->sample_blocks == 0 && st->sample_clusters == 0) {
        int nc = 0;
        cfg.gridDim = dim3(ECU_SM_CLUSTER);
        if (cudaOccupancyMaxActiveClusters(&nc, s_sample_kernel<ECU_SM_CLUSTER>, &cfg) !=
                cudaSuccess ||
            nc <= 0) {
            cudaGetLastError();
            nc = st->n_sm / ECU_SM_CLUSTER;
        }
        st->sample_clusters = nc > 0 ? nc : 1;
        ANV_INFO("cuda sampler: a cluster of %d blocks a row up to %d rows, then a block a row",
                 ECU_SM_CLUSTER, st->sample_clusters);
    }
    int c = st->sample_blocks ? st->sample_blocks
                              : (n <= st->sample_clusters ? ECU_SM_CLUSTER : 1);
    if (c == ECU_SM_CLUSTER) {
        cfg.gridDim = dim3((unsigned)n * ECU_SM_CLUSTER);
        ECU_CHECK(cudaLaunchKernelEx(&cfg, s_sample_kernel<ECU_SM_CLUSTER>, logits, vocab, dp, dr,
                                     st->sample_list));
    } else {
        s_sample_kernel<1><<<n, ECU_SM_THREADS, 0, st->stream>>>(logits, vocab, dp, dr,
                                                                 st->sample_list);
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

/*  softmax.cu - fp32 log-softmax over the vocabulary and on-GPU sampling.

    One block of 1024 threads per row. log_softmax: block max, block sum of exp, write
    l - lse. sample: the row's max / argmax and log-sum-exp give the greedy token and every
    logprob (of the model's own distribution); truncation works on an order-preserving integer
    key of each logit, so top-k and top-p thresholds are found by a 4-pass radix select (8
    bits a pass, counts for top-k, fixed-point masses for top-p: integer sums, so the
    threshold is the same whatever the thread schedule; a warp's lanes that fall in one bin,
    most of them since similar logits share their high bytes, add with one shared atomic,
    found by __match_any_sync), min-p is a plain logit threshold, and
    the draw is a Gumbel-max over the survivors with one counter-based uniform per (seed,
    step, token). A row's result depends only on its logits and its own parameters, and it
    is the host sampler's (eng_sampler.c) draw: the two share eng_sample_hash.h.
*/
#include <string.h>

#include "eng_cuda_internal.h"
#include "eng_sample_hash.h"

#define ECU_SM_THREADS 1024

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

/* Block argmax: the largest value, lowest index on ties; every thread gets the index. */
static __device__ int s_block_argmax(float v, int idx, float *redv, int *redi)
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

/* Calls f(i, l[i], valid) over the row in block-uniform steps of ECU_SM_UNROLL * blockDim.x:
   a thread issues all ECU_SM_UNROLL loads of a step before it uses the first (one block reads
   the whole row a dozen times, so the passes are bound by load latency, not bandwidth), and
   visits its indices in increasing order (a strict > keeps the lowest index on ties). Every
   lane of a warp runs the same iterations, valid false past the end, so f may use warp
   intrinsics. */
#define ECU_SM_UNROLL 8
template <typename F>
static __device__ __forceinline__ void s_scan(const float *l, int vocab, F f)
{
    for (int b = 0; b < vocab; b += ECU_SM_UNROLL * blockDim.x) {
        float v[ECU_SM_UNROLL];
#pragma unroll
        for (int u = 0; u < ECU_SM_UNROLL; u++) {
            int i = b + u * blockDim.x + threadIdx.x;
            v[u] = i < vocab ? __ldg(l + i) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < ECU_SM_UNROLL; u++) {
            int i = b + u * blockDim.x + threadIdx.x;
            f(i, v[u], i < vocab);
        }
    }
}

static __global__ void __launch_bounds__(ECU_SM_THREADS)
    s_sample_kernel(const float *logits /* (n, vocab) f32 */, int vocab,
                    const eng_sample_params_t *params /* (n) device */,
                    float2 *result /* (n) {token bits, logprob} device */)
{
    __shared__ float redv[32];
    __shared__ int redi[32];
    __shared__ uint32_t hist[256];
    __shared__ unsigned long long hmass[256];
    __shared__ uint32_t sh_key;
    __shared__ unsigned long long sh_rem;
    const float *l = logits + (size_t)blockIdx.x * vocab;
    const eng_sample_params_t p = params[blockIdx.x];

    float mx = -INFINITY;
    int am = 0x7fffffff;
    s_scan(l, vocab, [&](int i, float v, bool ok) {
        if (ok && v > mx)
            mx = v, am = i;
    });
    am = s_block_argmax(mx, am, redv, redi);
    if (am < 0 || am >= vocab)
        am = 0; /* a row without a finite maximum (all NaN / -inf) */
    mx = l[am];
    float sum = 0.0f;
    s_scan(l, vocab, [&](int, float v, bool ok) {
        if (ok)
            sum += expf(v - mx);
    });
    sum = ecu_block_sum(sum, redv);
    const float lse = mx + logf(sum);
    int tok = am;

    if (p.temperature > 0.0f) {
        const float inv_t = 1.0f / p.temperature;
        uint32_t thr = 0;
        if (p.top_k > 0 && p.top_k < vocab) {
            uint32_t prefix = 0, mask = 0;
            if (threadIdx.x == 0)
                sh_rem = (unsigned long long)p.top_k;
            for (int shift = 24; shift >= 0; shift -= 8) {
                for (int i = threadIdx.x; i < 256; i += blockDim.x)
                    hist[i] = 0;
                __syncthreads();
                /* whole warps per step, so that the lanes that fall in one bin (most of
                   them: similar logits share their high bytes) add their count with one
                   atomic instead of contending for the bin */
                s_scan(l, vocab, [&](int, float v, bool ok) {
                    uint32_t bin = 256; /* no bin */
                    if (ok) {
                        uint32_t k = s_key(v);
                        if ((k & mask) == prefix)
                            bin = (k >> shift) & 255;
                    }
                    unsigned peers = __match_any_sync(0xffffffffu, bin);
                    if (bin < 256 && (threadIdx.x & 31) == __ffs(peers) - 1)
                        atomicAdd(&hist[bin], (uint32_t)__popc(peers));
                });
                __syncthreads();
                if (threadIdx.x == 0) {
                    unsigned long long cum = 0, rem = sh_rem;
                    int d = 255;
                    for (; d > 0; d--) {
                        if (cum + hist[d] >= rem)
                            break;
                        cum += hist[d];
                    }
                    sh_rem = rem - cum;
                    sh_key = (uint32_t)d;
                }
                __syncthreads();
                prefix |= sh_key << shift;
                mask |= 255u << shift;
            }
            thr = prefix;
        }
        if (p.top_p > 0.0f && p.top_p < 1.0f) {
            /* fixed-point masses exp((l - max) / T) * 2^32 of the top-k survivors */
            unsigned long long tot = 0;
            s_scan(l, vocab, [&](int, float v, bool ok) {
                if (ok && s_key(v) >= thr)
                    tot += eng_sample_mass((v - mx) * inv_t);
            });
            /* block sum of integers via two float-free warp passes */
            for (int o = 16; o > 0; o >>= 1)
                tot += __shfl_xor_sync(0xffffffffu, tot, o);
            __syncthreads();
            if ((threadIdx.x & 31) == 0)
                hmass[threadIdx.x >> 5] = tot;
            __syncthreads();
            if (threadIdx.x == 0) {
                unsigned long long t = 0;
                for (int w = 0; w < (int)(blockDim.x >> 5); w++)
                    t += hmass[w];
                /* target mass: ceil(top_p * total) */
                sh_rem = (unsigned long long)ceil((double)p.top_p * (double)t);
            }
            __syncthreads();
            uint32_t prefix = 0, mask = 0;
            for (int shift = 24; shift >= 0; shift -= 8) {
                for (int i = threadIdx.x; i < 256; i += blockDim.x)
                    hmass[i] = 0;
                __syncthreads();
                /* as the top-k count: one atomic per bin and warp (integer sums: exact in
                   any order) */
                s_scan(l, vocab, [&](int, float v, bool ok) {
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
                        unsigned long long sum = 0;
                        for (unsigned mk = peers; mk; mk &= mk - 1)
                            sum += __shfl_sync(peers, m, __ffs(mk) - 1);
                        if ((threadIdx.x & 31) == __ffs(peers) - 1)
                            atomicAdd(&hmass[bin], sum);
                    }
                });
                __syncthreads();
                if (threadIdx.x == 0) {
                    unsigned long long cum = 0, rem = sh_rem;
                    int d = 255;
                    for (; d > 0; d--) {
                        if (cum + hmass[d] >= rem)
                            break;
                        cum += hmass[d];
                    }
                    sh_rem = rem > cum ? rem - cum : 0;
                    sh_key = (uint32_t)d;
                }
                __syncthreads();
                prefix |= sh_key << shift;
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
        s_scan(l, vocab, [&](int i, float v, bool ok) {
            if (!ok || s_key(v) < thr)
                return;
            float g = (v - mx) * inv_t + eng_sample_gumbel(base, i);
            if (g > best)
                best = g, bi = i;
        });
        tok = s_block_argmax(best, bi, redv, redi);
    }
    if (threadIdx.x == 0)
        result[blockIdx.x] = make_float2(__int_as_float(tok), l[tok] - lse);
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
    s_sample_kernel<<<n, ECU_SM_THREADS, 0, st->stream>>>(
        logits, vocab, (const eng_sample_params_t *)st->samp_params.ptr,
        (float2 *)st->samp_out.ptr);
    ECU_LAUNCHED();
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

/*  matmul.cu - out = x @ W^T (+ bias) with fp32 activations and bf16/fp16/fp32 weights, and
    the fused linear op (eng_ops.h) built on it.

    Two paths. For one row (batch-1 decode; up to ECU_GEMV_MAX rows with ANVIL_CUDA_GEMV_MAX,
    st->gemv_max: on the H100 the GEMV ran batches 2 to 8 at 0.90 to 0.27x the speed of
    cuBLASLt, whose batch-8 step takes as long as its batch 2, 2026-12-05) a GEMV kernel streams W
    once with 16-byte loads, each warp owning one output feature (or one column segment of it,
    for short matrices that would leave the GPU a partial wave: see s_gemv_segs) and keeping
    one fp32 sum per row; x (fp32, a few KB) stays in L1/L2, so the kernel runs at the weights'
    memory rate and computes in fp32 like the CPU. It is launched with PDL (ecu_launch): its
    first weight loads are issued before it waits for the kernel before it. Above that,
    cuBLASLt: x is rounded to the weight dtype into a scratch buffer and the product runs on
    the tensor cores with fp32 accumulation and an fp32 output (fp32 weights: a plain fp32
    product); algorithms come from the heuristic once per shape and are cached. Up to
    st->skinny_max rows (8) skinny.cu's tensor-core stream takes cuBLASLt's place, with the
    linear's pair epilogues (SwiGLU, RoPE + KV store) in its own. A bias, when
    given, is added by a small kernel.
    linear (ecu_linear) makes the GEMV do its neighbours' work, so that a decode layer at small
    batch is six kernels instead of ten: the RMSNorm of its input is folded into the sum (at
    small batch each block of a persistent grid stages x * g in shared memory once with the
    rows' sums of squares; above that g scales W's columns as they are read and the sums of
    squares are gathered in the same pass; either way the finished sum is scaled by
    rsqrt(mean + eps): no norm kernel and no normalised copy), and an epilogue adds the result
    into the residual stream, or pairs rows inside a block (gate j with up j for SwiGLU; dims
    i and i + head_dim/2 of a head for RoPE, then q written out and k, v stored in the paged
    caches; their angles come from a table computed once a step, ecu_rope_table in rope.cu). Larger
    batches compose the same ops from the other kernels (the norm writes the product's rounded
    input itself, the residual add is cuBLASLt's beta; SwiGLU and the attention's combine write
    their output rounded too, a rounded twin in twinb that the next product reads when the
    caller says x_from_prev: ecu_twin_begin; on the H100, 2026-12-05, graphs: +1.1 % at batch
    4, 16 and 64, +0.8 % at 256, +0.5 % at 256 x 2k fp8; ANVIL_CUDA_TWIN=0 is the A/B). A
    composed gate|up product is written in the weights' dtype (cuBLASLt rounds its fp32 sums
    once; st->gu_low, ANVIL_CUDA_GU_LOW=0 for fp32), half the bytes written and read back by
    SwiGLU: gate and up as a bf16 model has them, within the CPU's bf16 tolerance.
    Measured on the H200 and removed (graphs tok/s at batch 1 against the default): a cp.async
    ring GEMV on a persistent grid (x0.875), the norm folded into W at batch 1 too (x0.916), a
    successor prefetch (the last resident wave bulk-prefetching the next product's first 16
    MB into L2, x0.979), timing cuBLASLt's first 8 candidates per decode shape (x0.987 at
    batch 256); and (2026-12-05,
    `anvil-bench-engine --linear 1 --linear-sweep` for each product on its own, then whole
    steps) stream variants that issue 4, 8 or 16 predicated loads a chunk (x0.947, x0.863,
    x0.804) and a bulk-copy GEMV (a block an SM streaming its rows through 32 shared-memory
    stages of 4 KB filled by cp.async.bulk on mbarriers: 1.8 to 2.0 TB/s a product, x0.519);
    and on the H100 (later that day, the same tools): each warp of a persistent grid asking L2
    for its row segment a group ahead (cp.async.bulk.prefetch.L2; x0.870, gate|up 0.96 -> 0.80
    of copy) and the batch-1 rope GEMV held to 3 blocks an SM by its launch bounds (28 bytes
    spilled; x0.981); and cuBLASLt's split-K reductions restricted by the preference's
    reduction-scheme mask (none: x0.417 at batch 4, x0.444 at 16, x1.005 / x1.013 at 64, x1.001
    at 256; in place: x0.998 at 4, x1.000 at 16).
*/
#include "eng_cuda_internal.h"

#define ECU_GEMV_WARPS 8

/* 8 consecutive weights as loaded: one 16-byte load (bf16/f16) or two (f32), widened to fp32
   only when used, so a load can be issued long before its use (before the PDL wait). */
template <typename T> struct s_raw8 {
    uint4 a;
};
template <> struct s_raw8<float> {
    float4 a, b;
};
template <typename T>
static __device__ __forceinline__ void s_load8(s_raw8<T> &r, const T *p)
{
    r.a = __ldg((const uint4 *)p);
}
template <> __device__ __forceinline__ void s_load8<float>(s_raw8<float> &r, const float *p)
{
    r.a = __ldg((const float4 *)p), r.b = __ldg((const float4 *)p + 1);
}
static __device__ __forceinline__ void s_widen8(const s_raw8<__nv_bfloat16> &r, float *o)
{
    const __nv_bfloat162 *h = (const __nv_bfloat162 *)&r.a;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 f = __bfloat1622float2(h[i]);
        o[2 * i] = f.x, o[2 * i + 1] = f.y;
    }
}
static __device__ __forceinline__ void s_widen8(const s_raw8<__half> &r, float *o)
{
    const __half2 *h = (const __half2 *)&r.a;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 f = __half22float2(h[i]);
        o[2 * i] = f.x, o[2 * i + 1] = f.y;
    }
}
static __device__ __forceinline__ void s_widen8(const s_raw8<float> &r, float *o)
{
    o[0] = r.a.x, o[1] = r.a.y, o[2] = r.a.z, o[3] = r.a.w, o[4] = r.b.x, o[5] = r.b.y,
    o[6] = r.b.z, o[7] = r.b.w;
}

/* The parts of a GEMV besides W (a kernel parameter, by value): its input, the optional
   norm folded into it, and the epilogue (eng_lin_epi_t) with what the rope one needs. */
typedef struct {
    float *out;          /* PLAIN/ADD (n, out_dim); SWIGLU (n, out_dim / 2); ROPE_KV q
                            (n, n_head, head_dim) f32 */
    const float *x;      /* (n, in_dim) f32 */
    const void *bias;    /* (out_dim) T or NULL */
    const void *norm_w;  /* (in_dim) T, read when the kernel's NORM is on */
    float eps;
    int n, in_dim, out_dim, segs, epi, n_blocks; /* n_blocks: row groups (s_gemv_blocks) */
    ecu_rope_kv_t rope;                          /* ROPE_KV (s_rope_kv_args) */
} s_gemv_args_t;

/* acc[r] += the 8 weights at column k times row r of x, for the n <= N live rows. FOLD (the
   norm folded into W): the weights are first scaled by the norm's weights g (once for all
   rows) and ss[r] gathers row r's sum of squares: sum_k W[o,k] g[k] x[k] * rsqrt(mean(x^2) +
   eps) is the product of the normalised row, the norm's scale applied once to the finished
   sum. SMEM: x is the block's staged copy in shared memory (already scaled by g). */
template <int N, typename T, bool FOLD, bool SMEM>
static __device__ __forceinline__ void s_fma8(float *acc, float *ss, const s_raw8<T> &raw,
                                              const float *x, const T *nw, int n, int in_dim,
                                              int k)
{
    float wf[8];
    s_widen8(raw, wf);
    if constexpr (FOLD) {
        s_raw8<T> g;
        float gf[8];
        s_load8(g, nw + k);
        s_widen8(g, gf);
#pragma unroll
        for (int e = 0; e < 8; e++)
            wf[e] *= gf[e];
    }
#pragma unroll
    for (int r = 0; r < N; r++) {
        if (r < n) {
            const float4 *xp = (const float4 *)(x + (size_t)r * in_dim + k);
            float4 a, b;
            if constexpr (SMEM)
                a = xp[0], b = xp[1];
            else
                a = __ldg(xp), b = __ldg(xp + 1);
            acc[r] += wf[0] * a.x + wf[1] * a.y + wf[2] * a.z + wf[3] * a.w + wf[4] * b.x +
                      wf[5] * b.y + wf[6] * b.z + wf[7] * b.w;
            if constexpr (FOLD)
                ss[r] += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w + b.x * b.x + b.y * b.y +
                         b.z * b.z + b.w * b.w;
        }
    }
}

/* 4 norm weights at k, widened */
template <typename T> static __device__ __forceinline__ float4 s_ld4(const T *p, int k)
{
    return make_float4(ecu_ld<T>(p, k), ecu_ld<T>(p, k + 1), ecu_ld<T>(p, k + 2),
                       ecu_ld<T>(p, k + 3));
}

/* Output row (feature) of local row lr (0 .. R - 1) of block b, or -1 past the end. PLAIN /
   ADD: R consecutive rows. SWIGLU and ROPE_KV pair rows, local rows p and p + R/2 being the
   two halves of a pair (gate j and up j; dims i and i + head_dim/2 of one head), so that the
   block combines them in shared memory. */
static __device__ __forceinline__ int s_gemv_row(int epi, int out_dim, int head_dim, int b, int lr,
                                                  int R)
{
    const int half = R / 2;
    if (epi == ENG_LIN_SWIGLU) {
        const int f = out_dim / 2, j = b * half + lr % half;
        return j < f ? (lr < half ? j : f + j) : -1;
    }
    if (epi == ENG_LIN_ROPE_KV) {
        const int hh = head_dim / 2, bph = hh / half, h = b / bph;
        return h * head_dim + (b % bph) * half + lr % half + (lr < half ? 0 : hh);
    }
    const int o = b * R + lr;
    return o < out_dim ? o : -1;
}

/* The rope epilogue's inputs of row group b for the thread that will rotate pair
   (threadIdx.x % (R/2)) of row threadIdx.x / (R/2): the angle's cosine and sine (q and k
   heads), read from the step's table, and the token's cache row offset. */
static __device__ __forceinline__ void s_rope_prep(const s_gemv_args_t &a, int b, int R,
                                                   float *rc, float *rs, size_t *kvo)
{
    const int half = R / 2, hd = a.rope.head_dim;
    if (threadIdx.x >= half * a.n)
        return;
    const int p = threadIdx.x % half, r = threadIdx.x / half;
    const int o0 = s_gemv_row(a.epi, a.out_dim, hd, b, p, R), h = o0 / hd;
    *kvo = (size_t)a.rope.slots[r] * a.rope.n_kv_head * hd;
    if (o0 >= 0 && h < a.rope.n_head + a.rope.n_kv_head) {
        const float2 cs = a.rope.angles[(size_t)r * (hd / 2) + o0 % hd];
        *rc = cs.x, *rs = cs.y;
    }
}

/* Norm modes of the GEMV: none; folded into W as it is read (any batch); x * g staged in
   shared memory by each block with the rows' sums of squares (small batches: n * in_dim <=
   ECU_GEMV_STAGE floats), which keeps the inner loop the plain one. */
enum { S_NORM_NONE = 0, S_NORM_FOLD = 1, S_NORM_STAGE = 2 };
#define ECU_GEMV_STAGE 8192

/* The staged norm input of a block (S_NORM_STAGE): xs4 = x * g, (n, in_dim) f32, and row_ss
   the rows' sums of squares of x. */
template <int N, typename T>
static __device__ __forceinline__ void s_gemv_stage(const s_gemv_args_t &a, float4 *xs4,
                                                    float (*part_ss)[N], float *row_ss)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n = a.n, in_dim = a.in_dim;
    const T *nw = (const T *)a.norm_w;
    float ssl[N];
#pragma unroll
    for (int r = 0; r < N; r++)
        ssl[r] = 0.0f;
    for (int i4 = threadIdx.x; i4 < n * in_dim / 4; i4 += blockDim.x) {
        const int e = i4 * 4, r = e / in_dim, kk = e % in_dim;
        const float4 v = __ldg((const float4 *)a.x + i4), g = s_ld4(nw, kk);
        const float q = v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
#pragma unroll
        for (int rr = 0; rr < N; rr++)
            if (rr == r)
                ssl[rr] += q;
        xs4[i4] = make_float4(v.x * g.x, v.y * g.y, v.z * g.z, v.w * g.w);
    }
#pragma unroll
    for (int r = 0; r < N; r++) {
        const float v = ecu_warp_sum(ssl[r]);
        if (lane == 0)
            part_ss[warp][r] = v;
    }
    __syncthreads();
    if (threadIdx.x < N) {
        float t = 0.0f;
        for (int w8 = 0; w8 < ECU_GEMV_WARPS; w8++)
            t += part_ss[w8][threadIdx.x];
        row_ss[threadIdx.x] = t;
    }
    __syncthreads();
}

/* The end of row group b (this warp's row o, -1 when past the end): each warp's sums reduced
   (lane r < n takes row r's), a row's segments added in segment order by its segment-0 warp,
   then the norm's scale, the bias and the epilogue. Every thread of the block calls it (it
   synchronises the block when segs > 1 or for a pair epilogue). */
template <int N, typename T, int NORM, bool ROPE>
static __device__ __forceinline__ void
s_gemv_finish(const s_gemv_args_t &a, int b, int o, float resid, const float *acc,
              const float *ss, float rc, float rs, size_t kvo, float (*part)[N],
              float (*part_ss)[N], float (*fin)[N], const float *row_ss)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int segs = a.segs, R = ECU_GEMV_WARPS / segs, lr = warp / segs, seg = warp % segs;
    const int n = a.n, in_dim = a.in_dim, half = R / 2, hd = a.rope.head_dim;
    const bool pair = a.epi == ENG_LIN_SWIGLU || a.epi == ENG_LIN_ROPE_KV;
    const bool owner = seg == 0 && o >= 0 && lane < n;
    /* lane r (< n) takes row r's sums */
    float mine = 0.0f, mine_ss = 0.0f;
#pragma unroll
    for (int r = 0; r < N; r++) {
        const float s = ecu_warp_sum(acc[r]);
        const float q = NORM == S_NORM_FOLD ? ecu_warp_sum(ss[r]) : 0.0f;
        if (lane == r)
            mine = s, mine_ss = q;
    }
    if (segs > 1) {
        if (lane < N)
            part[warp][lane] = mine, part_ss[warp][lane] = mine_ss;
        __syncthreads(); /* b and segs are the same for the whole block */
        if (seg == 0 && lane < N) {
            mine = 0.0f, mine_ss = 0.0f;
            for (int s = 0; s < segs; s++)
                mine += part[warp + s][lane], mine_ss += part_ss[warp + s][lane];
        }
    }
    float y = mine;
    if (owner) {
        if constexpr (NORM == S_NORM_STAGE)
            mine_ss = row_ss[lane];
        if constexpr (NORM != S_NORM_NONE)
            y *= 1.0f / sqrtf(mine_ss / (float)in_dim + a.eps);
        if (a.bias)
            y += ecu_ld<T>((const T *)a.bias, o);
    }
    if (!pair) {
        if (owner)
            a.out[(size_t)lane * a.out_dim + o] = a.epi == ENG_LIN_ADD ? resid + y : y;
    } else {
        if (owner)
            fin[lr][lane] = y;
        __syncthreads();
        const int p = threadIdx.x % half, r = threadIdx.x / half;
        const int o0 = s_gemv_row(a.epi, a.out_dim, hd, b, p, R);
        if (threadIdx.x < half * n && o0 >= 0) {
            const float va = fin[p][r], vb = fin[p + half][r];
            if constexpr (!ROPE) { /* ENG_LIN_SWIGLU */
                a.out[(size_t)r * (a.out_dim / 2) + o0] = va / (1.0f + expf(-va)) * vb;
            } else {
                ecu_rope_pair_put(a.out, a.rope.k_cache, a.rope.v_cache, a.rope.kv_dtype, kvo, r,
                                  o0 / hd, o0 % hd, a.rope.n_head, a.rope.n_kv_head, hd, va, vb, rc,
                                  rs);
            }
        }
    }
}

/* One warp per (output feature, column segment) of a row group of R = ECU_GEMV_WARPS / segs
   rows; in_dim % (8 * segs) == 0 (the launcher checks). The grid is persistent: as many blocks
   as fit on the GPU at once, each taking row groups blockIdx.x, + gridDim.x, ... (a block of
   one group lived a few microseconds, and its start-up, the staged norm input, and its end,
   the epilogue, were paid per group; the launcher uses it where that pays, see
   s_gemv_launch_n). Each lane streams its segment in chunks of U 16-byte loads, the next
   chunk's loads issued before the current one is used. The first group's first chunk is
   loaded before the PDL wait, a later group's while the group before it is reduced and
   stored: weights do not depend on the kernel before, so their fetch overlaps that kernel's
   tail; x is read only after the wait. With segs > 1 a
   row's segments are consecutive warps, and the segment-0 warp adds the others' sums in
   segment order, so a row's result does not depend on the schedule. Then the epilogue: the
   norm's scale and the bias, and a plain store, an add into the residual (its value fetched
   before the group's stream, so the group does not end on a round trip), or (pair epilogues)
   SwiGLU of a gate/up pair or RoPE of a dims pair with q written out and k, v stored in the
   paged caches (the fused rope_kv_store; its angles and cache rows are computed as the
   group's weights start to arrive, the first group's before the wait, from the step's
   prepared positions and slots, uploaded before its first kernel). */
template <int N, typename T, int NORM, bool ROPE>
static __global__ void __launch_bounds__(ECU_GEMV_WARPS * 32)
    s_gemv_kernel(const T *w /* (out_dim, in_dim) T */, const s_gemv_args_t a)
{
    /* loads per chunk per lane (a chunk spans U * 256 columns); from 4 rows, 2 keep the
       kernel within its registers (4 spilled) */
    constexpr int U = N >= 4 ? 2 : 4;
    /* only the staged-norm kernels loop over row groups (a persistent grid); in the others
       the loop's state cost registers (4 blocks an SM at batch 1 -> 3) */
    constexpr bool LOOP = NORM == S_NORM_STAGE;
    extern __shared__ float4 xs4[]; /* S_NORM_STAGE: (n, in_dim) f32 = g * x */
    __shared__ float part[ECU_GEMV_WARPS][N], part_ss[ECU_GEMV_WARPS][N];
    __shared__ float fin[ECU_GEMV_WARPS][N], row_ss[N];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int segs = a.segs, R = ECU_GEMV_WARPS / segs, lr = warp / segs, seg = warp % segs;
    const int n = a.n, in_dim = a.in_dim, hd = a.rope.head_dim;
    const int seg_len = in_dim / segs, k0 = seg * seg_len + lane * 8, kend = (seg + 1) * seg_len;
    const bool pair = a.epi == ENG_LIN_SWIGLU || a.epi == ENG_LIN_ROPE_KV;
    const T *nw = (const T *)a.norm_w;
    const float *x = a.x;
    int b = blockIdx.x, o = s_gemv_row(a.epi, a.out_dim, hd, b, lr, R), k = k0;
    bool full = o >= 0 && k + (U - 1) * 256 < kend;
    s_raw8<T> cur[U];
    if (full) {
#pragma unroll
        for (int u = 0; u < U; u++)
            s_load8(cur[u], w + (size_t)o * in_dim + k + u * 256);
    }
    float rc = 0.0f, rs = 0.0f;
    size_t kvo = 0;
    ecu_pdl_wait();
    ecu_pdl_trigger();
    if constexpr (ROPE) /* the angles were written by a kernel of this step */
        s_rope_prep(a, b, R, &rc, &rs, &kvo);
    if constexpr (NORM == S_NORM_STAGE)
        s_gemv_stage<N, T>(a, xs4, part_ss, row_ss);
    for (;;) {
        const bool live = o >= 0, owner = seg == 0 && live && lane < n;
        const T *wr = w + (size_t)(live ? o : 0) * in_dim;
        float resid = 0.0f;
        if (a.epi == ENG_LIN_ADD && owner)
            resid = a.out[(size_t)lane * a.out_dim + o];
        float acc[N], ss[N];
#pragma unroll
        for (int r = 0; r < N; r++)
            acc[r] = 0.0f, ss[r] = 0.0f;
        while (full) {
            const int kn = k + U * 256;
            const bool more = kn + (U - 1) * 256 < kend;
            s_raw8<T> nxt[U];
            if (more) {
#pragma unroll
                for (int u = 0; u < U; u++)
                    s_load8(nxt[u], wr + kn + u * 256);
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                if constexpr (NORM == S_NORM_STAGE)
                    s_fma8<N, T, false, true>(acc, ss, cur[u], (const float *)xs4, nw, n, in_dim,
                                              k + u * 256);
                else
                    s_fma8<N, T, NORM == S_NORM_FOLD, false>(acc, ss, cur[u], x, nw, n, in_dim,
                                                             k + u * 256);
            }
            k = kn;
            full = more;
            if (more) {
#pragma unroll
                for (int u = 0; u < U; u++)
                    cur[u] = nxt[u];
            }
        }
        if (live && k < kend) {
            /* the tail, fewer than U pieces: all its loads issued before the first is used
               (one round trip, not one a piece; same sums in the same order) */
            s_raw8<T> tail[U - 1];
#pragma unroll
            for (int u = 0; u < U - 1; u++)
                if (k + u * 256 < kend)
                    s_load8(tail[u], wr + k + u * 256);
#pragma unroll
            for (int u = 0; u < U - 1; u++) {
                if (k + u * 256 >= kend)
                    break;
                if constexpr (NORM == S_NORM_STAGE)
                    s_fma8<N, T, false, true>(acc, ss, tail[u], (const float *)xs4, nw, n,
                                              in_dim, k + u * 256);
                else
                    s_fma8<N, T, NORM == S_NORM_FOLD, false>(acc, ss, tail[u], x, nw, n,
                                                             in_dim, k + u * 256);
            }
        }
        /* the next group's first chunk is fetched while this one's sums are reduced and
           stored */
        const int bn = LOOP ? b + (int)gridDim.x : a.n_blocks;
        const int on = bn < a.n_blocks ? s_gemv_row(a.epi, a.out_dim, hd, bn, lr, R) : -1;
        full = on >= 0 && k0 + (U - 1) * 256 < kend;
        if (LOOP && full) {
#pragma unroll
            for (int u = 0; u < U; u++)
                s_load8(cur[u], w + (size_t)on * in_dim + k0 + u * 256);
        }
        s_gemv_finish<N, T, NORM, ROPE>(a, b, o, resid, acc, ss, rc, rs, kvo, part, part_ss, fin,
                                        row_ss);
        b = bn;
        if (!LOOP || b >= a.n_blocks)
            break;
        if (segs > 1 || pair)
            __syncthreads(); /* part and fin are reused by the next group */
        o = on, k = k0;
        if constexpr (ROPE)
            s_rope_prep(a, b, R, &rc, &rs, &kvo);
    }
}

/* Column segments a row for the GEMV: short weight matrices (QKV, O, down at batch 1) fill
   the GPU with too few warps of one row each, and the kernel ends with a partial wave (on the
   H200, ncu: QKV 20.3 us at 54 % of DRAM bandwidth, 768 blocks for 528 resident slots; O 13.7
   us at 52 %; gate/up, 3584 blocks, 80 %). Segments are doubled until the grid holds 2.5
   waves of resident blocks (ANVIL_CUDA_GEMV_WAVES, st->gemv_waves2 / 2), while a segment
   keeps >= 1024 columns and divides evenly. Pair epilogues need two rows a block (segs <= 4)
   and, for RoPE, head_dim / 2 a multiple of the pairs a block holds; 0 when no segment count
   fits (the caller composes the ops). ANVIL_CUDA_GEMV_SEGS (st->gemv_segs, the A/B) fixes
   the count where it fits. */
template <int N, typename T, int NORM, bool ROPE>
static int s_gemv_segs(const ecu_state_t *st, int in_dim, int out_dim, int epi, int head_dim,
                       long *slots_out)
{
    static int per_sm = 0; /* resident blocks an SM, per instantiation */
    if (per_sm == 0) {
        const size_t msmem = NORM == S_NORM_STAGE ? ECU_GEMV_STAGE * sizeof(float) : 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm,
                                                          s_gemv_kernel<N, T, NORM, ROPE>,
                                                          ECU_GEMV_WARPS * 32,
                                                          msmem) != cudaSuccess ||
            per_sm <= 0)
            per_sm = 1;
    }
    const long slots = (long)st->n_sm * per_sm;
    *slots_out = slots;
    const bool pair = epi == ENG_LIN_SWIGLU || epi == ENG_LIN_ROPE_KV;
    const int max_segs = pair ? ECU_GEMV_WARPS / 2 : ECU_GEMV_WARPS;
    int segs = 1;
    if (st->gemv_segs > 0) {
        segs = st->gemv_segs < max_segs ? st->gemv_segs : max_segs;
        while (segs > 1 && in_dim % (8 * segs) != 0)
            segs /= 2;
    }
    while (st->gemv_segs == 0 && segs < max_segs &&
           ((long)out_dim * segs + ECU_GEMV_WARPS - 1) / ECU_GEMV_WARPS <
               slots * st->gemv_waves2 / 2 &&
           in_dim % (16 * segs) == 0 && in_dim / (2 * segs) >= 1024)
        segs *= 2;
    if (epi == ENG_LIN_ROPE_KV) {
        while (segs < max_segs && (head_dim / 2) % (ECU_GEMV_WARPS / segs / 2) != 0)
            segs *= 2;
        if ((head_dim / 2) % (ECU_GEMV_WARPS / segs / 2) != 0 || in_dim % (8 * segs) != 0)
            return 0;
    }
    return segs;
}

/* Blocks of the GEMV grid for `segs`. */
static unsigned s_gemv_blocks(const s_gemv_args_t *a)
{
    const int R = ECU_GEMV_WARPS / a->segs, half = R / 2;
    if (a->epi == ENG_LIN_SWIGLU)
        return (unsigned)((a->out_dim / 2 + half - 1) / half);
    if (a->epi == ENG_LIN_ROPE_KV)
        return (unsigned)(a->out_dim / a->rope.head_dim * (a->rope.head_dim / 2 / half));
    return (unsigned)((a->out_dim + R - 1) / R);
}

/* 1 when launched, 0 when the shape does not fit the GEMV (the caller composes), < 0 on error.
   The rope epilogue (double pow, full-precision sincos with its slow path) is its own
   instantiation: in the others it cost registers and a stack frame. */
template <int N, typename T, int NORM>
static int s_gemv_launch_n(const ecu_state_t *st, const T *w, s_gemv_args_t a)
{
    const bool rope = a.epi == ENG_LIN_ROPE_KV;
    const size_t smem = NORM == S_NORM_STAGE ? (size_t)a.n * a.in_dim * sizeof(float) : 0;
    long slots = 0;
    a.segs = rope ? s_gemv_segs<N, T, NORM, true>(st, a.in_dim, a.out_dim, a.epi, a.rope.head_dim,
                                                  &slots)
                  : s_gemv_segs<N, T, NORM, false>(st, a.in_dim, a.out_dim, a.epi, a.rope.head_dim,
                                                   &slots);
    if (a.segs == 0)
        return 0;
    a.n_blocks = (int)s_gemv_blocks(&a);
    /* A persistent grid for the staged-norm GEMVs, whose blocks start by staging the input
       (on the H200 at batch 1, with the next group's prefetch: gate|up 2198 -> ~1930 us a
       step, QKV + rope 900 -> 696 us); the others keep a block per row group (O and down:
       1650 us a step, 1893 persistent without that prefetch; staging their x in shared
       memory on a persistent grid as well left them at 1641 us against 1638).
       ANVIL_CUDA_GEMV_PERSIST=0 (st->gemv_persist, read at start): a block per row group for
       all (the A/B). */
    const bool pgrid = st->gemv_persist && NORM == S_NORM_STAGE;
    long g = a.n_blocks;
    if (pgrid && a.n_blocks > slots) {
        g = slots;
        if (st->gemv_balance) {
            /* as many rounds of groups on fewer blocks, so that no round is a partial one
               (gate|up at batch 1: 3584 groups on 396 slots are 9 rounds and 20 blocks' tenth;
               balanced, 359 blocks of 10 or 9). On the H100 each product on its own is level
               (--linear 1) but whole batch-1 steps gain 0.9 to 1.3 % (4 pairs of runs, graphs),
               presumably as the slots left free let the next kernel's blocks start sooner.
               ANVIL_CUDA_GEMV_BALANCE=0 (st->gemv_balance): every slot (the A/B) */
            const long rounds = (a.n_blocks + slots - 1) / slots;
            g = (a.n_blocks + rounds - 1) / rounds;
        }
    }
    const dim3 grid((unsigned)g);
    if (rope)
        ECU_CHECK(ecu_launch(st, s_gemv_kernel<N, T, NORM, true>, grid, dim3(ECU_GEMV_WARPS * 32),
                             smem, w, a));
    else
        ECU_CHECK(ecu_launch(st, s_gemv_kernel<N, T, NORM, false>, grid,
                             dim3(ECU_GEMV_WARPS * 32), smem, w, a));
    return 1;
}

template <typename T, int NORM>
static int s_gemv_launch_t(const ecu_state_t *st, const void *w, const s_gemv_args_t &a)
{
    const T *wt = (const T *)w;
    if (a.n == 1)
        return s_gemv_launch_n<1, T, NORM>(st, wt, a);
    if (a.n <= 2)
        return s_gemv_launch_n<2, T, NORM>(st, wt, a);
    if (a.n <= 4)
        return s_gemv_launch_n<4, T, NORM>(st, wt, a);
    return s_gemv_launch_n<8, T, NORM>(st, wt, a);
}

template <typename T>
static int s_gemv_launch_norm(const ecu_state_t *st, const void *w, const s_gemv_args_t &a)
{
    if (!a.norm_w)
        return s_gemv_launch_t<T, S_NORM_NONE>(st, w, a);
    /* small batches stage x * g in shared memory (each block of the persistent grid, before
       its first group); folding the norm into W there too ran at x0.916 at batch 1 on the
       H200 (2026-12-05) */
    if ((long)a.n * a.in_dim <= ECU_GEMV_STAGE)
        return s_gemv_launch_t<T, S_NORM_STAGE>(st, w, a);
    return s_gemv_launch_t<T, S_NORM_FOLD>(st, w, a);
}

/* The GEMV for n <= st->gemv_max rows: 1 launched, 0 not applicable, < 0 error. */
static int s_gemv_launch(const ecu_state_t *st, const void *w, eng_dtype_t dtype,
                         const s_gemv_args_t &a)
{
    if (dtype == ENG_DTYPE_BF16)
        return s_gemv_launch_norm<__nv_bfloat16>(st, w, a);
    if (dtype == ENG_DTYPE_F16)
        return s_gemv_launch_norm<__half>(st, w, a);
    return s_gemv_launch_norm<float>(st, w, a);
}

template <typename T>
static __global__ void s_round_kernel(T *dst /* (total) T */, const float *src /* (total) f32 */,
                                      size_t total)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = ecu_from_f32<T>(src[i]);
}

/* the same, 4 elements a thread (16-byte loads, 8-byte stores): total4 = total / 4 */
template <typename T>
static __global__ void s_round4_kernel(T *dst /* (total) T */, const float4 *src, size_t total4)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total4;
         i += (size_t)gridDim.x * blockDim.x)
        ecu_store4(dst, i, src[i]);
}

template <typename T>
static __global__ void s_bias_kernel(float *out /* (n, out_dim) f32 */, const T *bias /* (out) */,
                                     int out_dim, size_t total)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] += ecu_ld<T>(bias, i % out_dim);
}

static int s_grid(ecu_state_t *st, size_t total)
{
    size_t blocks = (total + 255) / 256, cap = (size_t)st->n_sm * 16;
    return (int)(blocks < cap ? blocks : cap);
}

/* cuBLASLt, column-major view: D (out_dim x n) = W^T-as-stored (in x out)^T @ x^T (in x n),
   plus D itself when acc (beta 1: the residual add in the product's epilogue). D is f32, or
   with low (bf16 / f16 weights, no acc) in the weights' dtype: the fp32 sums rounded once. */
static int s_lt(ecu_state_t *st,
                void *out,
                const void *xw,
                const void *w,
                eng_dtype_t dtype,
                int n,
                int in_dim,
                int out_dim,
                bool acc,
                bool low = false)
{
    if (low && (acc || dtype == ENG_DTYPE_F32))
        return -EINVAL;
    cudaDataType_t ab = dtype == ENG_DTYPE_BF16  ? CUDA_R_16BF
                        : dtype == ENG_DTYPE_F16 ? CUDA_R_16F
                                                 : CUDA_R_32F;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    int rc = ANV_EINTERNAL;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    float alpha = 1.0f, beta = acc ? 1.0f : 0.0f;
    size_t ws = st->lt_ws.bytes;
    ecu_lt_algo_t *hit = NULL;
    if (cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) ||
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)) ||
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)) ||
        cublasLtMatrixLayoutCreate(&la, ab, in_dim, out_dim, in_dim) ||
        cublasLtMatrixLayoutCreate(&lb, ab, in_dim, n, in_dim) ||
        cublasLtMatrixLayoutCreate(&lc, low ? ab : CUDA_R_32F, out_dim, n, out_dim)) {
        ANV_ERROR("cublasLt: cannot describe a %dx%dx%d product", out_dim, n, in_dim);
        goto out;
    }
    for (int i = 0; i < ECU_LT_CACHE; i++) {
        ecu_lt_algo_t *c = &st->lt_cache[i];
        if (c->valid && c->m == out_dim && c->n == n && c->k == in_dim && c->dtype == dtype &&
            c->acc == (int)acc && c->low == (int)low) {
            hit = c;
            break;
        }
    }
    if (!hit) {
        cublasLtMatmulHeuristicResult_t res;
        int found = 0;
        if (cublasLtMatmulPreferenceCreate(&pref) ||
            cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &ws, sizeof(ws)) ||
            cublasLtMatmulAlgoGetHeuristic(st->lt, op, la, lb, lc, lc, pref, 1, &res, &found) ||
            found == 0) {
            ANV_ERROR("cublasLt: no algorithm for a %dx%dx%d %s product", out_dim, n, in_dim,
                      ecu_dtype_name(dtype));
            goto out;
        }
        hit = &st->lt_cache[st->lt_next];
        st->lt_next = (st->lt_next + 1) % ECU_LT_CACHE;
        hit->m = out_dim, hit->n = n, hit->k = in_dim, hit->dtype = dtype, hit->acc = acc;
        hit->low = low;
        hit->valid = 1;
        hit->algo = res.algo;
    }
    {
        cublasStatus_t s = cublasLtMatmul(st->lt, op, &alpha, w, la, xw, lb, &beta, out, lc, out,
                                          lc, &hit->algo, st->lt_ws.ptr, ws, st->stream);
        if (s != CUBLAS_STATUS_SUCCESS) {
            ANV_ERROR("cublasLt: matmul %dx%dx%d failed: status %d", out_dim, n, in_dim, (int)s);
            hit->valid = 0;
            goto out;
        }
    }
    rc = 0;
out:
    if (pref)
        cublasLtMatmulPreferenceDestroy(pref);
    if (la)
        cublasLtMatrixLayoutDestroy(la);
    if (lb)
        cublasLtMatrixLayoutDestroy(lb);
    if (lc)
        cublasLtMatrixLayoutDestroy(lc);
    if (op)
        cublasLtMatmulDescDestroy(op);
    return rc;
}

/* cuBLASLt on an input already in the weights' dtype (xw), then the bias; up to
   st->skinny_max rows skinny.cu's product instead. low: out in the weights' dtype (s_lt; no
   bias, and never the skinny product, whose output is f32). */
static int s_lt_bias(ecu_state_t *st,
                     void *out,
                     const void *xw,
                     const void *w,
                     const void *bias,
                     eng_dtype_t dtype,
                     int n,
                     int in_dim,
                     int out_dim,
                     bool acc,
                     bool low = false)
{
    if (low)
        return bias ? -EINVAL : s_lt(st, out, xw, w, dtype, n, in_dim, out_dim, acc, true);
    float *const fo = (float *)out; /* f32 from here on */
    /* a few rows: the tensor-core stream of skinny.cu, bias included */
    const int sk = ecu_skinny_matmul(st, fo, xw, w, bias, dtype, n, in_dim, out_dim, acc,
                                     acc ? ENG_LIN_ADD : ENG_LIN_PLAIN, NULL, ECU_TWIN_NONE, NULL);
    if (sk != 0)
        return sk < 0 ? sk : 0;
    ECU_TRY(s_lt(st, fo, xw, w, dtype, n, in_dim, out_dim, acc));
    if (bias) {
        size_t total = (size_t)n * out_dim;
        int g = s_grid(st, total);
        if (dtype == ENG_DTYPE_BF16)
            s_bias_kernel<<<g, 256, 0, st->stream>>>(fo, (const __nv_bfloat16 *)bias, out_dim,
                                                     total);
        else if (dtype == ENG_DTYPE_F16)
            s_bias_kernel<<<g, 256, 0, st->stream>>>(fo, (const __half *)bias, out_dim, total);
        else
            s_bias_kernel<<<g, 256, 0, st->stream>>>(fo, (const float *)bias, out_dim, total);
        ECU_LAUNCHED();
    }
    return 0;
}

/* out (=, or += when acc) x @ W^T + bias, n rows: the plain GEMV for n <= st->gemv_max
   (16-byte aligned rows), cuBLASLt above; twin: st->twinb already holds x rounded to dtype
   (the op that wrote x wrote it, see ecu_twin_begin). */
static int s_matmul(ecu_state_t *st,
                    void *out,
                    const float *x,
                    const void *w,
                    const void *bias,
                    eng_dtype_t dtype,
                    int n,
                    int in_dim,
                    int out_dim,
                    bool acc,
                    bool twin,
                    bool low = false)
{
    if (in_dim % 8) {
        ANV_ERROR("cuda matmul: in_dim %d is not a multiple of 8", in_dim);
        return ANV_EUNSUPPORTED;
    }
    /* the GEMV's vector loads need 16-byte aligned rows; cuBLASLt copes with the rest */
    bool aligned = ((uintptr_t)x % 16 == 0) && ((uintptr_t)w % 16 == 0);
    if (n <= st->gemv_max && aligned && !low) {
        s_gemv_args_t a = {};
        a.out = (float *)out, a.x = x, a.bias = bias, a.n = n, a.in_dim = in_dim;
        a.out_dim = out_dim;
        a.epi = acc ? ENG_LIN_ADD : ENG_LIN_PLAIN;
        int rc = s_gemv_launch(st, w, dtype, a);
        return rc < 0 ? rc : rc == 1 ? 0 : ANV_EINTERNAL; /* plain rows always fit */
    }
    const void *xw = x;
    size_t total = (size_t)n * in_dim;
    if (twin && dtype != ENG_DTYPE_F32) {
        xw = st->twinb.ptr;
    } else if (dtype != ENG_DTYPE_F32) {
        ECU_TRY(ecu_buf_reserve(&st->xconv, total * 2));
        /* total is a multiple of 8 (in_dim is); a 16-byte aligned x takes 4 a thread (the
           scalar kernel ran at 1.4 TB/s on the H200 at batch 256) */
        const bool v4 = (uintptr_t)x % 16 == 0;
        if (dtype == ENG_DTYPE_BF16 && v4)
            s_round4_kernel<<<s_grid(st, total / 4), 256, 0, st->stream>>>(
                (__nv_bfloat16 *)st->xconv.ptr, (const float4 *)x, total / 4);
        else if (dtype == ENG_DTYPE_BF16)
            s_round_kernel<<<s_grid(st, total), 256, 0, st->stream>>>(
                (__nv_bfloat16 *)st->xconv.ptr, x, total);
        else if (v4)
            s_round4_kernel<<<s_grid(st, total / 4), 256, 0, st->stream>>>(
                (__half *)st->xconv.ptr, (const float4 *)x, total / 4);
        else
            s_round_kernel<<<s_grid(st, total), 256, 0, st->stream>>>((__half *)st->xconv.ptr, x,
                                                                      total);
        ECU_LAUNCHED();
        xw = st->xconv.ptr;
    }
    return s_lt_bias(st, out, xw, w, bias, dtype, n, in_dim, out_dim, acc, low);
}

extern "C" int ecu_matmul(eng_backend_t *be, float *out, const float *x, const void *w,
                          const void *bias, eng_dtype_t dtype, int n, int in_dim, int out_dim)
{
    if (!out || !x || !w || n <= 0 || in_dim <= 0 || out_dim <= 0 || ecu_dtype_size(dtype) == 0 ||
        out == x)
        return -EINVAL;
    ecu_twin_drop(ecu_st(be));
    return s_matmul(ecu_st(be), out, x, w, bias, dtype, n, in_dim, out_dim, false, false);
}

int ecu_twin_begin(ecu_state_t *st, const float *of, int n, int dim, eng_dtype_t dtype,
                   void **low, int *kind)
{
    ecu_twin_drop(st);
    *low = NULL, *kind = ECU_TWIN_NONE;
    if (!st->twin_on || n <= st->gemv_max || (dtype != ENG_DTYPE_BF16 && dtype != ENG_DTYPE_F16))
        return 0;
    ECU_TRY(ecu_buf_reserve(&st->twinb, (size_t)n * dim * 2));
    st->twin.of = of, st->twin.n = n, st->twin.dim = dim, st->twin.dtype = dtype;
    *low = st->twinb.ptr;
    *kind = ecu_twin_kind(dtype);
    return 0;
}

/* The rope epilogue's inputs of QKV linear f over n rows: the step's angle table and the
   tokens' cache slots on the device, the pools and the heads. */
static int s_rope_kv_args(eng_backend_t *be, const eng_linear_t *f, int n, ecu_rope_kv_t *r)
{
    ecu_state_t *st = ecu_st(be);
    *r = {};
    ECU_TRY(ecu_rope_table(st, f->pos, n, f->head_dim, f->theta, &r->angles));
    ECU_TRY(ecu_idx(st, ECU_IDX_SLOTS, f->slots, n, &r->slots));
    r->k_cache = f->k_cache, r->v_cache = f->v_cache, r->n_head = f->n_head;
    r->n_kv_head = f->n_kv_head, r->head_dim = f->head_dim, r->kv_dtype = be->kv_dtype;
    return 0;
}

/* The pair epilogue of linear f in skinny.cu's product, its input rounded in st->xconv: 1
   launched, 0 when the shape does not fit, < 0 on error. */
static int s_skinny_pair(eng_backend_t *be,
                         float *out,
                         const void *w,
                         const void *bias,
                         eng_dtype_t dtype,
                         int n,
                         int in_dim,
                         int out_dim,
                         const eng_linear_t *f)
{
    ecu_state_t *st = ecu_st(be);
    if (f->epi == ENG_LIN_SWIGLU) {
        void *low;
        int kind;
        ECU_TRY(ecu_twin_begin(st, out, n, out_dim / 2, dtype, &low, &kind));
        const int rc = ecu_skinny_matmul(st, out, st->xconv.ptr, w, bias, dtype, n, in_dim, out_dim,
                                         false, ENG_LIN_SWIGLU, low, kind, NULL);
        if (rc != 1)
            ecu_twin_drop(st);
        return rc;
    }
    ecu_rope_kv_t r;
    ECU_TRY(s_rope_kv_args(be, f, n, &r));
    return ecu_skinny_matmul(st, out, st->xconv.ptr, w, bias, dtype, n, in_dim, out_dim, false,
                             ENG_LIN_ROPE_KV, NULL, ECU_TWIN_NONE, &r);
}

/* linear op by op, for shapes the fused GEMV does not take (more than st->gemv_max rows,
   unaligned rows, a norm in another dtype than W): the norm (written straight in the
   weights' dtype when cuBLASLt takes it), the product (the residual add as cuBLASLt's beta),
   then the epilogue's own kernel. */
static int s_linear_composed(eng_backend_t *be, float *out, const float *x, const void *w,
                             const void *bias, eng_dtype_t dtype, int n, int in_dim, int out_dim,
                             const eng_linear_t *f, bool twin)
{
    ecu_state_t *st = ecu_st(be);
    st->twin_dtype = dtype;
    const bool acc = f->epi == ENG_LIN_ADD, direct = f->epi == ENG_LIN_PLAIN || acc;
    /* a gate|up product on cuBLASLt written in the weights' dtype for SwiGLU (st->gu_low):
       half the bytes written and read back; the skinny and GEMV rows keep their epilogues */
    const bool gu_low = f->epi == ENG_LIN_SWIGLU && st->gu_low && !bias &&
                        (dtype == ENG_DTYPE_BF16 || dtype == ENG_DTYPE_F16) && n > st->skinny_max &&
                        n > st->gemv_max;
    void *y = out; /* (n, out_dim): the product, before a pair epilogue (f32, or dtype) */
    if (!direct) {
        ECU_TRY(ecu_buf_reserve(&st->lin_y, (size_t)n * out_dim * (gu_low ? 2 : sizeof(float))));
        y = st->lin_y.ptr;
    }
    if (f->norm_w && n > st->gemv_max && dtype != ENG_DTYPE_F32 && f->norm_dtype == dtype &&
        in_dim % 8 == 0) {
        /* the norm writes the product's rounded input itself */
        ECU_TRY(ecu_buf_reserve(&st->xconv, (size_t)n * in_dim * 2));
        ECU_TRY(ecu_rmsnorm_round(st, st->xconv.ptr, x, f->norm_w, dtype, n, in_dim, f->eps));
        if (!direct && n <= st->skinny_max) {
            /* a few rows: the pair epilogue in the skinny product (SwiGLU with the down
               projection's twin; RoPE with the KV stores) */
            const int rc = s_skinny_pair(be, out, w, bias, dtype, n, in_dim, out_dim, f);
            if (rc != 0)
                return rc < 0 ? rc : 0;
        }
        ECU_TRY(s_lt_bias(st, y, st->xconv.ptr, w, bias, dtype, n, in_dim, out_dim, acc, gu_low));
    } else {
        const float *xin = x;
        if (f->norm_w) {
            ECU_TRY(ecu_buf_reserve(&st->lin_x, (size_t)n * in_dim * sizeof(float)));
            ECU_TRY(ecu_rmsnorm(be, (float *)st->lin_x.ptr, x, f->norm_w, f->norm_dtype, n,
                                in_dim, f->eps));
            xin = (const float *)st->lin_x.ptr;
        }
        ECU_TRY(s_matmul(st, y, xin, w, bias, dtype, n, in_dim, out_dim, acc, twin && !f->norm_w,
                         gu_low));
    }
    if (direct)
        return 0;
    if (f->epi == ENG_LIN_SWIGLU) {
        /* the down projection's input: its rounded twin too (same dtype guessed) */
        void *low;
        int kind;
        ECU_TRY(ecu_twin_begin(st, out, n, out_dim / 2, dtype, &low, &kind));
        /* the caller's down projection reads the twin alone: out is not written */
        const bool only = low && f->out_for_next && st->twin_only;
        const int gk = gu_low ? ecu_twin_kind(dtype) : ECU_TWIN_NONE;
        const int rc =
            ecu_swiglu_fused_twin(st, only ? NULL : out, y, gk, n, out_dim / 2, low, kind);
        if (rc)
            ecu_twin_drop(st);
        else if (only)
            st->twin_unwritten = out;
        return rc;
    }
    return ecu_rope_kv_store(be, out, (const float *)y, f->k_cache, f->v_cache, f->pos, f->slots, n,
                             f->n_head, f->n_kv_head, f->head_dim, f->theta);
}

extern "C" int ecu_linear(eng_backend_t *be, float *out, const float *x, const void *w,
                          const void *bias, eng_dtype_t dtype, int n, int in_dim, int out_dim,
                          const eng_linear_t *f)
{
    ecu_state_t *st = ecu_st(be);
    /* x's rounded twin, left by the op before (x_from_prev) in st->twinb */
    const bool twin = f && f->x_from_prev && x && st->twin.of == x && st->twin.n == n &&
                      st->twin.dim == in_dim && st->twin.dtype == dtype;
    const bool unwritten = x && x == st->twin_unwritten;
    ecu_twin_drop(st);
    st->twin_unwritten = NULL;
    if (unwritten && !twin) {
        ANV_ERROR("cuda linear: its input was left unwritten for a rounded twin this linear "
                  "cannot read (out_for_next broken: not the next op, x_from_prev 0 or "
                  "another shape or dtype)");
        return ANV_ESTATE;
    }
    if (!out || !x || !w || !f || n <= 0 || in_dim <= 0 || out_dim <= 0 ||
        ecu_dtype_size(dtype) == 0 || out == x || f->epi < ENG_LIN_PLAIN ||
        f->epi > ENG_LIN_ROPE_KV || (f->epi == ENG_LIN_SWIGLU && out_dim % 2))
        return -EINVAL;
    if (f->epi == ENG_LIN_ROPE_KV &&
        (!f->k_cache || !f->v_cache || !f->pos || !f->slots || f->n_head <= 0 ||
         f->n_kv_head <= 0 || f->head_dim < 2 || f->head_dim % 2 ||
         out_dim != (f->n_head + 2 * f->n_kv_head) * f->head_dim))
        return -EINVAL;
    if (in_dim % 8) {
        ANV_ERROR("cuda linear: in_dim %d is not a multiple of 8", in_dim);
        return ANV_EUNSUPPORTED;
    }
    const bool aligned = (uintptr_t)x % 16 == 0 && (uintptr_t)w % 16 == 0 &&
                         (uintptr_t)f->norm_w % 16 == 0;
    if (n <= st->gemv_max && aligned && (!f->norm_w || f->norm_dtype == dtype)) {
        s_gemv_args_t a = {};
        a.out = out, a.x = x, a.bias = bias, a.norm_w = f->norm_w, a.eps = f->eps, a.n = n;
        a.in_dim = in_dim, a.out_dim = out_dim, a.epi = f->epi;
        if (f->epi == ENG_LIN_ROPE_KV && !st->gemv_rope) {
            /* ANVIL_CUDA_GEMV_ROPE=0 (the A/B): the GEMV writes q|k|v with the norm folded in
               and the plain epilogue (the kernel of gate|up and lm_head, 80 registers, 3
               blocks an SM, against the rope instantiation's 99 and 2), then rope_kv_store
               rotates and stores them: a kernel more a layer */
            ECU_TRY(ecu_buf_reserve(&st->lin_y, (size_t)n * out_dim * sizeof(float)));
            a.out = (float *)st->lin_y.ptr, a.epi = ENG_LIN_PLAIN;
            const int rc = s_gemv_launch(st, w, dtype, a);
            if (rc < 0)
                return rc;
            if (rc == 1)
                return ecu_rope_kv_store(be, out, (const float *)st->lin_y.ptr, f->k_cache,
                                         f->v_cache, f->pos, f->slots, n, f->n_head,
                                         f->n_kv_head, f->head_dim, f->theta);
            return s_linear_composed(be, out, x, w, bias, dtype, n, in_dim, out_dim, f, twin);
        }
        if (f->epi == ENG_LIN_ROPE_KV)
            ECU_TRY(s_rope_kv_args(be, f, n, &a.rope));
        int rc = s_gemv_launch(st, w, dtype, a);
        if (rc != 0)
            return rc < 0 ? rc : 0;
    }
    return s_linear_composed(be, out, x, w, bias, dtype, n, in_dim, out_dim, f, twin);
}

/* The prefetch hint (eng_ops.h): at small batch the attention between the QKV and O products
   reads a few MB of K / V and leaves the memory idle for its and its combine's ~12 us a layer
   (H200, batch 1), while O (4096 x 4096 bf16, 33.5 MB) then streams at 0.66 of the copy
   (0.79 on the H100). A grid of one warp a block waits for the kernel before it (the QKV
   product, whose stream would evict the lines), lets the attention launch, and asks L2 for O's
   weights in 16-byte-aligned slices, one bulk prefetch (cp.async.bulk.prefetch.L2, sm_90) a
   lane; nothing waits for them: O's GEMV then finds the lines in L2 or on their way.
   Off by default (st->prefetch_rows 0): not yet measured. The one GPU A/B tried (H100,
   2026-12-07) ran anvil-bench-engine before its model made the call, so it compared the
   default with itself (batch 1 172.4 / 172.2 against 171.9 / 172.4 tok/s); gpu_session's
   bench_prefetch step is the A/B to run (ANVIL_CUDA_PREFETCH_ROWS=8 against 0). */
__global__ void s_l2_prefetch(const char *p, size_t bytes, size_t slice)
{
    ecu_pdl_trigger();
    ecu_pdl_wait();
    const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * slice;
    if (i >= bytes)
        return;
    const size_t n = bytes - i < slice ? bytes - i : slice;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + i), "r"((unsigned)n)
                 : "memory");
#else
    for (size_t o = 0; o < n; o += 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p + i + o));
#endif
}

extern "C" int ecu_prefetch(eng_backend_t *be, const void *ptr, size_t bytes, int n_tok)
{
    ecu_state_t *st = ecu_st(be);
    if (n_tok > st->prefetch_rows || !ptr)
        return 0;
    /* 16-byte-aligned whole slices, at most 3/4 of L2 (the rest for K / V and activations) */
    const uintptr_t a = ((uintptr_t)ptr + 15) & ~(uintptr_t)15;
    bytes = bytes > a - (uintptr_t)ptr ? bytes - (a - (uintptr_t)ptr) : 0;
    if (bytes > st->l2_bytes / 4 * 3)
        bytes = st->l2_bytes / 4 * 3;
    bytes &= ~(size_t)15;
    if (bytes < 4096)
        return 0;
    const size_t want = (bytes + (256 << 10) - 1) >> 18; /* a block for each 256 KB */
    const int blocks = want < (size_t)st->n_sm ? (int)want : st->n_sm;
    size_t slice = (bytes + (size_t)blocks * 32 - 1) / ((size_t)blocks * 32);
    slice = (slice + 15) & ~(size_t)15;
    ECU_CHECK(ecu_launch(st, s_l2_prefetch, dim3(blocks), dim3(32), 0, (const char *)a, bytes,
                         slice));
    return 0;
}

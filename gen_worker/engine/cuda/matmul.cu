/*  matmul.cu - out = x @ W^T (+ bias) with fp32 activations and bf16/fp16/fp32 weights, and
    the fused linear op (eng_ops.h) built on it.

    Two paths. For n <= ECU_GEMV_MAX rows (decode at small batch) a GEMV kernel streams W
    once with 16-byte loads, each warp owning one output feature (or one column segment of it,
    for short matrices that would leave the GPU a partial wave: see s_gemv_segs) and keeping
    one fp32 sum per row; x (fp32, a few KB) stays in L1/L2, so the kernel runs at the weights'
    memory rate and computes in fp32 like the CPU. It is launched with PDL (ecu_launch): its
    first weight loads are issued before it waits for the kernel before it. Above that,
    cuBLASLt: x is rounded to the weight dtype into a scratch buffer and the product runs on
    the tensor cores with fp32 accumulation and an fp32 output (fp32 weights: a plain fp32
    product); algorithms come from the heuristic once per shape and are cached. A bias, when
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
    input itself, the residual add is cuBLASLt's beta). Measured on the H200 and removed
    (2026-12-05, graphs tok/s at batch 1 against the default): a cp.async ring GEMV on a
    persistent grid (x0.875), the norm folded into W at batch 1 too (x0.916), a successor
    prefetch (the last resident wave bulk-prefetching the next product's first 16 MB into
    L2, x0.979); and timing cuBLASLt's first 8 candidates per decode shape (x0.987 at batch
    256).
*/
#include <cuda/ptx>
#include <type_traits>

#include "eng_cuda_internal.h"

#define ECU_GEMV_MAX 8
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
    void *k_cache, *v_cache; /* ROPE_KV: (n_blocks, block_size, n_kv_head, head_dim) kv_dtype */
    const int32_t *slots;    /* ROPE_KV: (n) device */
    const float2 *angles;    /* ROPE_KV: (n, head_dim / 2) {cos, sin} (ecu_rope_table) */
    int n_head, n_kv_head, head_dim, kv_dtype;
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

static __device__ __forceinline__ void s_kv_put(void *cache, int dtype, size_t i, float v)
{
    if (dtype == ENG_DTYPE_BF16)
        ((__nv_bfloat16 *)cache)[i] = ecu_from_f32<__nv_bfloat16>(v);
    else if (dtype == ENG_DTYPE_F8E4M3)
        ((__nv_fp8_e4m3 *)cache)[i] = ecu_from_f32<__nv_fp8_e4m3>(v);
    else
        ((float *)cache)[i] = v;
}

/* The rope epilogue's inputs of row group b for the thread that will rotate pair
   (threadIdx.x % (R/2)) of row threadIdx.x / (R/2): the angle's cosine and sine (q and k
   heads), read from the step's table, and the token's cache row offset. */
static __device__ __forceinline__ void s_rope_prep(const s_gemv_args_t &a, int b, int R,
                                                   float *rc, float *rs, size_t *kvo)
{
    const int half = R / 2, hd = a.head_dim;
    if (threadIdx.x >= half * a.n)
        return;
    const int p = threadIdx.x % half, r = threadIdx.x / half;
    const int o0 = s_gemv_row(a.epi, a.out_dim, hd, b, p, R), h = o0 / hd;
    *kvo = (size_t)a.slots[r] * a.n_kv_head * hd;
    if (o0 >= 0 && h < a.n_head + a.n_kv_head) {
        const float2 cs = a.angles[(size_t)r * (hd / 2) + o0 % hd];
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

/* A pair epilogue's output for row r: va, vb the finished products of rows o0 and its pair
   (gate j and up j: SwiGLU into out; dims i and i + head_dim/2 of a head: RoPE by the angle
   (rc, rs), q written out, k and v stored in the caches at row offset kvo). */
template <bool ROPE>
static __device__ __forceinline__ void s_pair_store(const s_gemv_args_t &a, int r, int o0,
                                                    float va, float vb, float rc, float rs,
                                                    size_t kvo)
{
    if constexpr (!ROPE) { /* ENG_LIN_SWIGLU */
        a.out[(size_t)r * (a.out_dim / 2) + o0] = va / (1.0f + expf(-va)) * vb;
    } else {
        const int hd = a.head_dim, hh = hd / 2, h = o0 / hd, i = o0 % hd;
        if (h < a.n_head + a.n_kv_head) {
            const float ra = va * rc - vb * rs, rb = vb * rc + va * rs;
            if (h < a.n_head) {
                float *q = a.out + ((size_t)r * a.n_head + h) * hd;
                q[i] = ra, q[i + hh] = rb;
            } else {
                const size_t at = kvo + (size_t)(h - a.n_head) * hd + i;
                s_kv_put(a.k_cache, a.kv_dtype, at, ra);
                s_kv_put(a.k_cache, a.kv_dtype, at + hh, rb);
            }
        } else {
            const size_t at = kvo + (size_t)(h - a.n_head - a.n_kv_head) * hd + i;
            s_kv_put(a.v_cache, a.kv_dtype, at, va);
            s_kv_put(a.v_cache, a.kv_dtype, at + hh, vb);
        }
    }
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
    const int n = a.n, in_dim = a.in_dim, half = R / 2, hd = a.head_dim;
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
        if (threadIdx.x < half * n && o0 >= 0)
            s_pair_store<ROPE>(a, r, o0, fin[p][r], fin[p + half][r], rc, rs, kvo);
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
template <int N, typename T, int NORM, bool ROPE, int VAR = 0>
static __global__ void __launch_bounds__(ECU_GEMV_WARPS * 32)
    s_gemv_kernel(const T *w /* (out_dim, in_dim) T */, const s_gemv_args_t a)
{
    /* loads per chunk per lane (a chunk spans U * 256 columns); from 4 rows, 2 keep the
       kernel within its registers (4 spilled). VAR > 0 (the stream variants, st->gemv_var):
       VAR loads a chunk, issued predicated lane by lane, so that a short segment's last
       partial chunk is in flight with the one before it (and the first group's before the
       PDL wait); VAR 16: no double buffer, a warp's whole segment of up to 4096 columns
       issued at once. The same sums in the same order as VAR 0. */
    constexpr int U = VAR > 0 ? VAR : N >= 4 ? 2 : 4;
    constexpr bool DB = VAR < 16;
    /* only the staged-norm kernels loop over row groups (a persistent grid); in the others
       the loop's state cost registers (4 blocks an SM at batch 1 -> 3) */
    constexpr bool LOOP = NORM == S_NORM_STAGE;
    extern __shared__ float4 xs4[]; /* S_NORM_STAGE: (n, in_dim) f32 = g * x */
    __shared__ float part[ECU_GEMV_WARPS][N], part_ss[ECU_GEMV_WARPS][N];
    __shared__ float fin[ECU_GEMV_WARPS][N], row_ss[N];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int segs = a.segs, R = ECU_GEMV_WARPS / segs, lr = warp / segs, seg = warp % segs;
    const int n = a.n, in_dim = a.in_dim, hd = a.head_dim;
    const int seg_len = in_dim / segs, k0 = seg * seg_len + lane * 8, kend = (seg + 1) * seg_len;
    const bool pair = a.epi == ENG_LIN_SWIGLU || a.epi == ENG_LIN_ROPE_KV;
    const T *nw = (const T *)a.norm_w;
    const float *x = a.x;
    int b = blockIdx.x, o = s_gemv_row(a.epi, a.out_dim, hd, b, lr, R), k = k0;
    bool full = o >= 0 && k + (U - 1) * 256 < kend;
    s_raw8<T> cur[U];
    /* VAR > 0: chunk loads of the lane's columns from kk, predicated */
    auto issue = [&](s_raw8<T> *buf, const T *wr, int kk) {
#pragma unroll
        for (int u = 0; u < U; u++)
            if (kk + u * 256 < kend)
                s_load8(buf[u], wr + kk + u * 256);
    };
    if constexpr (VAR > 0) {
        if (o >= 0)
            issue(cur, w + (size_t)o * in_dim, k0);
    } else if (full) {
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
        auto fma_chunk = [&](const s_raw8<T> *buf, int kk) {
#pragma unroll
            for (int u = 0; u < U; u++) {
                if (kk + u * 256 >= kend)
                    break;
                if constexpr (NORM == S_NORM_STAGE)
                    s_fma8<N, T, false, true>(acc, ss, buf[u], (const float *)xs4, nw, n, in_dim,
                                              kk + u * 256);
                else
                    s_fma8<N, T, NORM == S_NORM_FOLD, false>(acc, ss, buf[u], x, nw, n, in_dim,
                                                             kk + u * 256);
            }
        };
        if constexpr (VAR > 0) {
            for (int kk = k0; live;) {
                const int kn = kk + U * 256;
                if constexpr (DB) {
                    s_raw8<T> nxt[U];
                    if (kn < kend)
                        issue(nxt, wr, kn);
                    fma_chunk(cur, kk);
                    if (kn >= kend)
                        break;
#pragma unroll
                    for (int u = 0; u < U; u++)
                        cur[u] = nxt[u];
                } else {
                    fma_chunk(cur, kk);
                    if (kn >= kend)
                        break;
                    issue(cur, wr, kn);
                }
                kk = kn;
            }
            full = false, k = kend;
        }
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
        if (VAR == 0 && live && k < kend) {
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
        if constexpr (VAR > 0) {
            if (LOOP && on >= 0)
                issue(cur, w + (size_t)on * in_dim, k0);
        } else if (LOOP && full) {
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
template <int N, typename T, int NORM, bool ROPE, int VAR>
static int s_gemv_segs(const ecu_state_t *st, int in_dim, int out_dim, int epi, int head_dim,
                       long *slots_out)
{
    static int per_sm = 0; /* resident blocks an SM, per instantiation */
    if (per_sm == 0) {
        const size_t msmem = NORM == S_NORM_STAGE ? ECU_GEMV_STAGE * sizeof(float) : 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm,
                                                          s_gemv_kernel<N, T, NORM, ROPE, VAR>,
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
        return (unsigned)(a->out_dim / a->head_dim * (a->head_dim / 2 / half));
    return (unsigned)((a->out_dim + R - 1) / R);
}

/* 1 when launched, 0 when the shape does not fit the GEMV (the caller composes), < 0 on error.
   The rope epilogue (double pow, full-precision sincos with its slow path) is its own
   instantiation: in the others it cost registers and a stack frame. VAR: the stream variant
   (s_gemv_kernel; s_gemv_launch_n picks it). */
template <int N, typename T, int NORM, int VAR = 0>
static int s_gemv_launch_v(const ecu_state_t *st, const T *w, s_gemv_args_t a)
{
    const bool rope = a.epi == ENG_LIN_ROPE_KV;
    const size_t smem = NORM == S_NORM_STAGE ? (size_t)a.n * a.in_dim * sizeof(float) : 0;
    long slots = 0;
    a.segs = rope ? s_gemv_segs<N, T, NORM, true, VAR>(st, a.in_dim, a.out_dim, a.epi,
                                                       a.head_dim, &slots)
                  : s_gemv_segs<N, T, NORM, false, VAR>(st, a.in_dim, a.out_dim, a.epi,
                                                        a.head_dim, &slots);
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
    const dim3 grid((unsigned)(pgrid && a.n_blocks > slots ? slots : a.n_blocks));
    if (rope)
        ECU_CHECK(ecu_launch(st, s_gemv_kernel<N, T, NORM, true, VAR>, grid,
                             dim3(ECU_GEMV_WARPS * 32), smem, w, a));
    else
        ECU_CHECK(ecu_launch(st, s_gemv_kernel<N, T, NORM, false, VAR>, grid,
                             dim3(ECU_GEMV_WARPS * 32), smem, w, a));
    return 1;
}

/* ---- The bulk-copy GEMV (ANVIL_CUDA_GEMV_VAR=32, st->gemv_var; the A/B): one row, bf16
   weights, every norm mode and epilogue (the batch-1 decode). A block an SM takes a run of
   output rows and streams their weights in chunks of `pc` columns through ECU_BULK_STAGES
   shared-memory stages: a producer lane issues each chunk as one bulk copy (cp.async.bulk,
   the TMA engine) completing on the stage's mbarrier, so up to ECU_BULK_STAGES x 4 KB are in
   flight an SM whatever the registers, and the first stages are issued before the PDL wait.
   Eight consumer warps take the chunks in turn (chunk i: warp i % 8), each lane 8 columns a
   256-column piece against x (read through L1, or the block's staged x * g with the norm),
   reduce the chunk in the warp and release the stage; a row's chunk sums are added in
   column order at the end (fixed order: a row's result does not depend on the schedule,
   though it is not the default stream's bits). Rows are taken in logical order: the
   identity for the plain and add epilogues, pairs next to each other for SwiGLU (gate j, up
   j) and RoPE (dims i and i + head_dim/2 of a head), so a block owns whole pairs. */
#define ECU_BULK_STAGES 32
#define ECU_BULK_WARPS 8 /* consumer warps; one more warp holds the producer lane */

/* Columns a chunk: the largest of 2048 / 1024 / 512 / 256 dividing in_dim, 0 if none. */
static int s_bulk_piece(int in_dim)
{
    for (int pc = 2048; pc >= 256; pc /= 2)
        if (in_dim % pc == 0)
            return pc;
    return 0;
}

static __device__ __forceinline__ void s_bulk_wait(uint64_t *bar, uint32_t parity)
{
    while (!cuda::ptx::mbarrier_try_wait_parity(bar, parity)) {
    }
}

/* The weight row of logical row l (see above). */
static __device__ __forceinline__ int s_bulk_row(const s_gemv_args_t &a, int l)
{
    if (a.epi == ENG_LIN_SWIGLU)
        return (l & 1 ? a.out_dim / 2 : 0) + l / 2;
    if (a.epi == ENG_LIN_ROPE_KV) {
        const int hh = a.head_dim / 2, q = l / 2;
        return q / hh * a.head_dim + q % hh + (l & 1 ? hh : 0);
    }
    return l;
}

template <bool STAGE, bool ROPE>
static __global__ void __launch_bounds__((ECU_BULK_WARPS + 1) * 32)
    s_gemv_bulk_kernel(const __nv_bfloat16 *w /* (out_dim, in_dim) */, const s_gemv_args_t a,
                       int pc /* columns a chunk (s_bulk_piece) */)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) unsigned char bulk_smem[];
    __shared__ uint64_t full[ECU_BULK_STAGES], empty[ECU_BULK_STAGES];
    __shared__ float wss[ECU_BULK_WARPS + 1], row_ss;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, in_dim = a.in_dim;
    const bool pair = a.epi == ENG_LIN_SWIGLU || a.epi == ENG_LIN_ROPE_KV;
    /* this block's logical rows [l0, l1): whole pairs for the pair epilogues */
    const int units = pair ? a.out_dim / 2 : a.out_dim, per = pair ? 2 : 1;
    const int l0 = per * (int)((long)units * blockIdx.x / gridDim.x);
    const int l1 = per * (int)((long)units * (blockIdx.x + 1) / gridDim.x);
    const int np = in_dim / pc, nc = (l1 - l0) * np;
    const uint32_t bytes = (uint32_t)pc * 2;
    __nv_bfloat16 *stage = (__nv_bfloat16 *)bulk_smem;
    float *xs = (float *)(bulk_smem + (size_t)ECU_BULK_STAGES * bytes); /* STAGE: x * g */
    float *part = xs + (STAGE ? in_dim : 0);                           /* (rows, np) */
    const bool producer = warp == ECU_BULK_WARPS && lane == 0;
    auto issue = [&](int i) {
        const int s = i % ECU_BULK_STAGES;
        if (i >= ECU_BULK_STAGES)
            s_bulk_wait(&empty[s], (uint32_t)((i / ECU_BULK_STAGES - 1) & 1));
        const __nv_bfloat16 *src = w + (size_t)s_bulk_row(a, l0 + i / np) * in_dim +
                                   (size_t)(i % np) * pc;
        cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta,
                                             cuda::ptx::space_shared, &full[s], bytes);
        cuda::ptx::cp_async_bulk(cuda::ptx::space_cluster, cuda::ptx::space_global,
                                 stage + (size_t)s * pc, src, bytes, &full[s]);
    };
    if (threadIdx.x == 0) {
        for (int s = 0; s < ECU_BULK_STAGES; s++) {
            cuda::ptx::mbarrier_init(&full[s], 1);
            cuda::ptx::mbarrier_init(&empty[s], 1);
        }
        cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
    }
    __syncthreads();
    ecu_pdl_trigger();
    /* the first stages: weights only, issued before the wait */
    const int first = nc < ECU_BULK_STAGES ? nc : ECU_BULK_STAGES;
    if (producer)
        for (int i = 0; i < first; i++)
            issue(i);
    ecu_pdl_wait(); /* x, the residual, the rope angles come from earlier kernels */
    if constexpr (STAGE) { /* x * g and x's sum of squares, once a block */
        const __nv_bfloat16 *nw = (const __nv_bfloat16 *)a.norm_w;
        float q = 0.0f;
        for (int k = threadIdx.x; k < in_dim; k += blockDim.x) {
            const float v = a.x[k];
            q += v * v;
            xs[k] = v * ecu_ld<__nv_bfloat16>(nw, k);
        }
        q = ecu_warp_sum(q);
        if (lane == 0)
            wss[warp] = q;
        __syncthreads();
        if (threadIdx.x == 0) {
            float t = 0.0f;
            for (int w9 = 0; w9 <= ECU_BULK_WARPS; w9++)
                t += wss[w9];
            row_ss = t;
        }
    }
    const float *xv = STAGE ? xs : a.x;
    if (producer) {
        for (int i = first; i < nc; i++)
            issue(i);
    } else if (warp < ECU_BULK_WARPS) {
        for (int i = warp; i < nc; i += ECU_BULK_WARPS) {
            const int s = i % ECU_BULK_STAGES, p = i % np;
            s_bulk_wait(&full[s], (uint32_t)((i / ECU_BULK_STAGES) & 1));
            const __nv_bfloat16 *cw = stage + (size_t)s * pc;
            float acc = 0.0f;
            for (int u = 0; u < pc / 256; u++) {
                s_raw8<__nv_bfloat16> raw;
                raw.a = *(const uint4 *)(cw + u * 256 + lane * 8);
                float wf[8];
                s_widen8(raw, wf);
                const float4 *xp = (const float4 *)(xv + (size_t)p * pc + u * 256 + lane * 8);
                float4 xa, xb;
                if constexpr (STAGE)
                    xa = xp[0], xb = xp[1];
                else
                    xa = __ldg(xp), xb = __ldg(xp + 1);
                acc += wf[0] * xa.x + wf[1] * xa.y + wf[2] * xa.z + wf[3] * xa.w +
                       wf[4] * xb.x + wf[5] * xb.y + wf[6] * xb.z + wf[7] * xb.w;
            }
            __syncwarp();
            if (lane == 0)
                cuda::ptx::mbarrier_arrive(&empty[s]);
            acc = ecu_warp_sum(acc);
            if (lane == 0)
                part[i] = acc; /* logical row i / np, piece p */
        }
    }
    __syncthreads();
    const float scale = STAGE ? 1.0f / sqrtf(row_ss / (float)in_dim + a.eps) : 1.0f;
    /* logical row l0 + rl's finished product: its pieces in column order, the norm's scale,
       the bias */
    auto fin = [&](int rl) {
        float y = 0.0f;
        for (int p = 0; p < np; p++)
            y += part[rl * np + p];
        y *= scale;
        if (a.bias)
            y += ecu_ld<__nv_bfloat16>((const __nv_bfloat16 *)a.bias, s_bulk_row(a, l0 + rl));
        return y;
    };
    for (int u = threadIdx.x; u < (l1 - l0) / per; u += blockDim.x) {
        if (!pair) {
            const int o = l0 + u;
            const float y = fin(u);
            a.out[o] = a.epi == ENG_LIN_ADD ? a.out[o] + y : y;
            continue;
        }
        const int o0 = s_bulk_row(a, l0 + 2 * u);
        float rc = 0.0f, rs = 0.0f;
        size_t kvo = 0;
        if constexpr (ROPE) {
            const int hd = a.head_dim;
            kvo = (size_t)a.slots[0] * a.n_kv_head * hd;
            if (o0 / hd < a.n_head + a.n_kv_head) {
                const float2 cs = a.angles[o0 % hd];
                rc = cs.x, rs = cs.y;
            }
        }
        s_pair_store<ROPE>(a, 0, o0, fin(2 * u), fin(2 * u + 1), rc, rs, kvo);
    }
#endif
}

/* 1 when the bulk GEMV took the product, 0 when its shape does not fit (the caller runs the
   default), < 0 on error. */
template <int NORM>
static int s_gemv_bulk_launch(const ecu_state_t *st, const __nv_bfloat16 *w,
                              const s_gemv_args_t &a)
{
    const int pc = s_bulk_piece(a.in_dim);
    const bool pair = a.epi == ENG_LIN_SWIGLU || a.epi == ENG_LIN_ROPE_KV;
    const int units = pair ? a.out_dim / 2 : a.out_dim;
    if (pc == 0 || a.n != 1 || NORM == S_NORM_FOLD || (uintptr_t)w % 16 != 0 ||
        units < st->n_sm || (a.epi == ENG_LIN_ROPE_KV && a.head_dim % 2))
        return 0;
    const int g = st->n_sm, rows = (pair ? 2 : 1) * ((units + g - 1) / g);
    const size_t smem = (size_t)ECU_BULK_STAGES * pc * 2 +
                        (NORM == S_NORM_STAGE ? (size_t)a.in_dim * 4 : 0) +
                        (size_t)rows * (a.in_dim / pc) * 4;
    const size_t cap = 200 * 1024;
    if (smem > cap)
        return 0;
    constexpr bool STG = NORM == S_NORM_STAGE;
    auto kernel = a.epi == ENG_LIN_ROPE_KV ? s_gemv_bulk_kernel<STG, true>
                                           : s_gemv_bulk_kernel<STG, false>;
    static bool attr_set[2] = {false, false}; /* the dynamic shared memory each may use */
    bool &set = attr_set[a.epi == ENG_LIN_ROPE_KV];
    if (!set) {
        ECU_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)cap));
        set = true;
    }
    ECU_CHECK(ecu_launch(st, kernel, dim3((unsigned)g), dim3((ECU_BULK_WARPS + 1) * 32), smem,
                         w, a, pc));
    return 1;
}

/* The stream variants (ANVIL_CUDA_GEMV_VAR = 4, 8, 16 or 32, st->gemv_var; the A/B) exist
   for one row of bf16 weights, the batch-1 decode whose bandwidth they are measured for; 32
   is the bulk-copy GEMV. */
template <int N, typename T, int NORM>
static int s_gemv_launch_n(const ecu_state_t *st, const T *w, const s_gemv_args_t &a)
{
    if constexpr (N == 1 && std::is_same<T, __nv_bfloat16>::value) {
        if (st->gemv_var == 32) {
            const int rc = s_gemv_bulk_launch<NORM>(st, w, a);
            if (rc != 0)
                return rc;
        }
        if (st->gemv_var == 4)
            return s_gemv_launch_v<N, T, NORM, 4>(st, w, a);
        if (st->gemv_var == 8)
            return s_gemv_launch_v<N, T, NORM, 8>(st, w, a);
        if (st->gemv_var == 16)
            return s_gemv_launch_v<N, T, NORM, 16>(st, w, a);
    }
    return s_gemv_launch_v<N, T, NORM>(st, w, a);
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

/* The GEMV for n <= ECU_GEMV_MAX rows: 1 launched, 0 not applicable, < 0 error. */
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
         i += (size_t)gridDim.x * blockDim.x) {
        const float4 v = src[i];
        union {
            T h[4];
            uint2 u;
        } o;
        o.h[0] = ecu_from_f32<T>(v.x), o.h[1] = ecu_from_f32<T>(v.y);
        o.h[2] = ecu_from_f32<T>(v.z), o.h[3] = ecu_from_f32<T>(v.w);
        ((uint2 *)dst)[i] = o.u;
    }
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
   plus D itself when acc (beta 1: the residual add in the product's epilogue). */
static int s_lt(ecu_state_t *st, float *out, const void *xw, const void *w, eng_dtype_t dtype,
                int n, int in_dim, int out_dim, bool acc)
{
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
        cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, out_dim, n, out_dim)) {
        ANV_ERROR("cublasLt: cannot describe a %dx%dx%d product", out_dim, n, in_dim);
        goto out;
    }
    for (int i = 0; i < ECU_LT_CACHE; i++) {
        ecu_lt_algo_t *c = &st->lt_cache[i];
        if (c->valid && c->m == out_dim && c->n == n && c->k == in_dim && c->dtype == dtype &&
            c->acc == (int)acc) {
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

/* cuBLASLt on an input already in the weights' dtype (xw), then the bias. */
static int s_lt_bias(ecu_state_t *st, float *out, const void *xw, const void *w, const void *bias,
                     eng_dtype_t dtype, int n, int in_dim, int out_dim, bool acc)
{
    ECU_TRY(s_lt(st, out, xw, w, dtype, n, in_dim, out_dim, acc));
    if (bias) {
        size_t total = (size_t)n * out_dim;
        int g = s_grid(st, total);
        if (dtype == ENG_DTYPE_BF16)
            s_bias_kernel<<<g, 256, 0, st->stream>>>(out, (const __nv_bfloat16 *)bias, out_dim,
                                                     total);
        else if (dtype == ENG_DTYPE_F16)
            s_bias_kernel<<<g, 256, 0, st->stream>>>(out, (const __half *)bias, out_dim, total);
        else
            s_bias_kernel<<<g, 256, 0, st->stream>>>(out, (const float *)bias, out_dim, total);
        ECU_LAUNCHED();
    }
    return 0;
}

/* out (=, or += when acc) x @ W^T + bias, n rows: the plain GEMV for n <= ECU_GEMV_MAX
   (16-byte aligned rows), cuBLASLt above. */
static int s_matmul(ecu_state_t *st, float *out, const float *x, const void *w, const void *bias,
                    eng_dtype_t dtype, int n, int in_dim, int out_dim, bool acc)
{
    if (in_dim % 8) {
        ANV_ERROR("cuda matmul: in_dim %d is not a multiple of 8", in_dim);
        return ANV_EUNSUPPORTED;
    }
    /* the GEMV's vector loads need 16-byte aligned rows; cuBLASLt copes with the rest */
    bool aligned = ((uintptr_t)x % 16 == 0) && ((uintptr_t)w % 16 == 0);
    if (n <= ECU_GEMV_MAX && aligned) {
        s_gemv_args_t a = {};
        a.out = out, a.x = x, a.bias = bias, a.n = n, a.in_dim = in_dim, a.out_dim = out_dim;
        a.epi = acc ? ENG_LIN_ADD : ENG_LIN_PLAIN;
        int rc = s_gemv_launch(st, w, dtype, a);
        return rc < 0 ? rc : rc == 1 ? 0 : ANV_EINTERNAL; /* plain rows always fit */
    }
    const void *xw = x;
    size_t total = (size_t)n * in_dim;
    if (dtype != ENG_DTYPE_F32) {
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
    return s_lt_bias(st, out, xw, w, bias, dtype, n, in_dim, out_dim, acc);
}

extern "C" int ecu_matmul(eng_backend_t *be, float *out, const float *x, const void *w,
                          const void *bias, eng_dtype_t dtype, int n, int in_dim, int out_dim)
{
    if (!out || !x || !w || n <= 0 || in_dim <= 0 || out_dim <= 0 || ecu_dtype_size(dtype) == 0 ||
        out == x)
        return -EINVAL;
    return s_matmul(ecu_st(be), out, x, w, bias, dtype, n, in_dim, out_dim, false);
}

/* linear op by op, for shapes the fused GEMV does not take (more than ECU_GEMV_MAX rows,
   unaligned rows, a norm in another dtype than W): the norm (written straight in the
   weights' dtype when cuBLASLt takes it), the product (the residual add as cuBLASLt's beta),
   then the epilogue's own kernel. */
static int s_linear_composed(eng_backend_t *be, float *out, const float *x, const void *w,
                             const void *bias, eng_dtype_t dtype, int n, int in_dim, int out_dim,
                             const eng_linear_t *f)
{
    ecu_state_t *st = ecu_st(be);
    const bool acc = f->epi == ENG_LIN_ADD, direct = f->epi == ENG_LIN_PLAIN || acc;
    float *y = out; /* (n, out_dim) f32: the product, before a pair epilogue */
    if (!direct) {
        ECU_TRY(ecu_buf_reserve(&st->lin_y, (size_t)n * out_dim * sizeof(float)));
        y = (float *)st->lin_y.ptr;
    }
    if (f->norm_w && n > ECU_GEMV_MAX && dtype != ENG_DTYPE_F32 && f->norm_dtype == dtype &&
        in_dim % 8 == 0) {
        /* the norm writes the product's rounded input itself */
        ECU_TRY(ecu_buf_reserve(&st->xconv, (size_t)n * in_dim * 2));
        ECU_TRY(ecu_rmsnorm_round(st, st->xconv.ptr, x, f->norm_w, dtype, n, in_dim, f->eps));
        ECU_TRY(s_lt_bias(st, y, st->xconv.ptr, w, bias, dtype, n, in_dim, out_dim, acc));
    } else {
        const float *xin = x;
        if (f->norm_w) {
            ECU_TRY(ecu_buf_reserve(&st->lin_x, (size_t)n * in_dim * sizeof(float)));
            ECU_TRY(ecu_rmsnorm(be, (float *)st->lin_x.ptr, x, f->norm_w, f->norm_dtype, n,
                                in_dim, f->eps));
            xin = (const float *)st->lin_x.ptr;
        }
        ECU_TRY(s_matmul(st, y, xin, w, bias, dtype, n, in_dim, out_dim, acc));
    }
    if (direct)
        return 0;
    if (f->epi == ENG_LIN_SWIGLU)
        return ecu_swiglu_fused(be, out, y, n, out_dim / 2);
    return ecu_rope_kv_store(be, out, y, f->k_cache, f->v_cache, f->pos, f->slots, n, f->n_head,
                             f->n_kv_head, f->head_dim, f->theta);
}

extern "C" int ecu_linear(eng_backend_t *be, float *out, const float *x, const void *w,
                          const void *bias, eng_dtype_t dtype, int n, int in_dim, int out_dim,
                          const eng_linear_t *f)
{
    ecu_state_t *st = ecu_st(be);
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
    if (n <= ECU_GEMV_MAX && aligned && (!f->norm_w || f->norm_dtype == dtype)) {
        s_gemv_args_t a = {};
        a.out = out, a.x = x, a.bias = bias, a.norm_w = f->norm_w, a.eps = f->eps, a.n = n;
        a.in_dim = in_dim, a.out_dim = out_dim, a.epi = f->epi;
        if (f->epi == ENG_LIN_ROPE_KV) {
            ECU_TRY(ecu_rope_table(st, f->pos, n, f->head_dim, f->theta, &a.angles));
            ECU_TRY(ecu_idx(st, ECU_IDX_SLOTS, f->slots, n, &a.slots));
            a.k_cache = f->k_cache, a.v_cache = f->v_cache, a.n_head = f->n_head;
            a.n_kv_head = f->n_kv_head, a.head_dim = f->head_dim, a.kv_dtype = be->kv_dtype;
        }
        int rc = s_gemv_launch(st, w, dtype, a);
        if (rc != 0)
            return rc < 0 ? rc : 0;
    }
    return s_linear_composed(be, out, x, w, bias, dtype, n, in_dim, out_dim, f);
}

/*  matmul.cu - out = x @ W^T (+ bias) with fp32 activations and bf16/fp16/fp32 weights.

    Two paths. For n <= ECU_GEMV_MAX rows (decode at small batch) a GEMV kernel streams W
    once with 16-byte loads, each warp owning one output feature (or one column segment of it,
    for short matrices that would leave the GPU a partial wave: see s_gemv_segs) and keeping
    one fp32 sum per row; x (fp32, a few KB) stays in L1/L2, so the kernel runs at the weights' memory rate and
    computes in fp32 like the CPU. It is launched with PDL (ecu_launch): its first weight loads
    are issued before it waits for the kernel before it. Above that, cuBLASLt: x is rounded to the weight dtype into
    a scratch buffer and the product runs on the tensor cores with fp32 accumulation and an
    fp32 output (fp32 weights: a plain fp32 product); algorithms come from the heuristic once
    per shape and are cached. A bias, when given, is added by a small kernel.
*/
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

/* acc[r] += the 8 weights at column k times row r of x, for the n <= N live rows */
template <int N, typename T>
static __device__ __forceinline__ void s_fma8(float *acc, const s_raw8<T> &raw, const float *x,
                                              int n, int in_dim, int k)
{
    float wf[8];
    s_widen8(raw, wf);
#pragma unroll
    for (int r = 0; r < N; r++) {
        if (r < n) {
            const float4 *xp = (const float4 *)(x + (size_t)r * in_dim + k);
            float4 a = __ldg(xp), b = __ldg(xp + 1);
            acc[r] += wf[0] * a.x + wf[1] * a.y + wf[2] * a.z + wf[3] * a.w + wf[4] * b.x +
                      wf[5] * b.y + wf[6] * b.z + wf[7] * b.w;
        }
    }
}

/* One warp per (output feature, column segment); in_dim % (8 * segs) == 0 (the launcher
   checks). Each lane streams its segment in chunks of U 16-byte loads, the next chunk's loads
   issued before the current one is used. The first chunk is loaded before the PDL wait:
   weights do not depend on the kernel before, so their fetch overlaps that kernel's tail; x
   is read only after the wait. With segs > 1 a row's segments are consecutive warps of one
   block (segs divides ECU_GEMV_WARPS), and the segment-0 warp adds the others' sums in
   segment order, so a row's result does not depend on the schedule. */
template <int N, typename T>
static __global__ void __launch_bounds__(ECU_GEMV_WARPS * 32)
    s_gemv_kernel(float *out /* (n, out_dim) f32 */, const float *x /* (n, in_dim) f32 */,
                  const T *w /* (out_dim, in_dim) T */, int n, int in_dim, int out_dim, int segs)
{
    constexpr int U = 4; /* loads per chunk per lane; a chunk spans U * 256 columns */
    __shared__ float part[ECU_GEMV_WARPS][N];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int unit = blockIdx.x * ECU_GEMV_WARPS + warp, o = unit / segs, seg = unit % segs;
    const int seg_len = in_dim / segs, kend = (seg + 1) * seg_len;
    const bool live = o < out_dim;
    const T *wr = w + (size_t)(live ? o : 0) * in_dim;
    int k = seg * seg_len + lane * 8;
    bool full = live && k + (U - 1) * 256 < kend;
    s_raw8<T> cur[U];
    if (full) {
#pragma unroll
        for (int u = 0; u < U; u++)
            s_load8(cur[u], wr + k + u * 256);
    }
    ecu_pdl_wait();
    ecu_pdl_trigger();
    float acc[N];
#pragma unroll
    for (int r = 0; r < N; r++)
        acc[r] = 0.0f;
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
        for (int u = 0; u < U; u++)
            s_fma8<N, T>(acc, cur[u], x, n, in_dim, k + u * 256);
        k = kn;
        full = more;
        if (more) {
#pragma unroll
            for (int u = 0; u < U; u++)
                cur[u] = nxt[u];
        }
    }
    for (; live && k < kend; k += 256) {
        s_raw8<T> raw;
        s_load8(raw, wr + k);
        s_fma8<N, T>(acc, raw, x, n, in_dim, k);
    }
#pragma unroll
    for (int r = 0; r < N; r++)
        acc[r] = ecu_warp_sum(acc[r]);
    if (segs == 1) {
#pragma unroll
        for (int r = 0; r < N; r++)
            if (lane == 0 && live && r < n)
                out[(size_t)r * out_dim + o] = acc[r];
        return;
    }
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < N; r++)
            part[warp][r] = acc[r];
    }
    __syncthreads(); /* segs is the same for the whole block: every warp gets here */
    if (seg == 0 && live && lane < n) {
        float v = 0.0f;
        for (int s = 0; s < segs; s++)
            v += part[warp + s][lane];
        out[(size_t)lane * out_dim + o] = v;
    }
}

/* Column segments a row for the GEMV: short weight matrices (QKV, O, down at batch 1) fill
   the GPU with too few warps of one row each, and the kernel ends with a partial wave (on the
   H200, ncu: QKV 20.3 us at 54 % of DRAM bandwidth, 768 blocks for 528 resident slots; O 13.7
   us at 52 %; gate/up, 3584 blocks, 80 %). Segments are doubled until the grid holds 2.5
   waves of resident blocks, while a segment keeps >= 1024 columns and divides evenly. */
template <int N, typename T> static int s_gemv_segs(const ecu_state_t *st, int in_dim, int out_dim)
{
    static int per_sm = 0; /* resident blocks an SM, per instantiation */
    if (per_sm == 0 && (cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                            &per_sm, s_gemv_kernel<N, T>, ECU_GEMV_WARPS * 32, 0) != cudaSuccess ||
                        per_sm <= 0))
        per_sm = 1;
    const long slots = (long)st->n_sm * per_sm;
    int segs = 1;
    while (segs < ECU_GEMV_WARPS && ((long)out_dim * segs + ECU_GEMV_WARPS - 1) / ECU_GEMV_WARPS
                                        < slots * 5 / 2 &&
           in_dim % (16 * segs) == 0 && in_dim / (2 * segs) >= 1024)
        segs *= 2;
    return segs;
}

template <int N, typename T>
static int s_gemv_launch_n(const ecu_state_t *st, float *out, const float *x, const T *w, int n,
                           int in_dim, int out_dim)
{
    const int segs = s_gemv_segs<N, T>(st, in_dim, out_dim);
    dim3 blocks((unsigned)(((long)out_dim * segs + ECU_GEMV_WARPS - 1) / ECU_GEMV_WARPS));
    ECU_CHECK(ecu_launch(st, s_gemv_kernel<N, T>, blocks, dim3(ECU_GEMV_WARPS * 32), 0, out, x, w,
                         n, in_dim, out_dim, segs));
    return 0;
}

template <typename T>
static int s_gemv_launch(const ecu_state_t *st, float *out, const float *x, const void *w, int n,
                         int in_dim, int out_dim)
{
    const T *wt = (const T *)w;
    if (n == 1)
        return s_gemv_launch_n<1, T>(st, out, x, wt, n, in_dim, out_dim);
    if (n <= 2)
        return s_gemv_launch_n<2, T>(st, out, x, wt, n, in_dim, out_dim);
    if (n <= 4)
        return s_gemv_launch_n<4, T>(st, out, x, wt, n, in_dim, out_dim);
    return s_gemv_launch_n<8, T>(st, out, x, wt, n, in_dim, out_dim);
}

template <typename T>
static __global__ void s_round_kernel(T *dst /* (total) T */, const float *src /* (total) f32 */,
                                      size_t total)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = ecu_from_f32<T>(src[i]);
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

/* cuBLASLt, column-major view: D (out_dim x n) = W^T-as-stored (in x out)^T @ x^T (in x n). */
static int s_lt(ecu_state_t *st, float *out, const void *xw, const void *w, eng_dtype_t dtype,
                int n, int in_dim, int out_dim)
{
    cudaDataType_t ab = dtype == ENG_DTYPE_BF16  ? CUDA_R_16BF
                        : dtype == ENG_DTYPE_F16 ? CUDA_R_16F
                                                 : CUDA_R_32F;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    int rc = ANV_EINTERNAL;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    float alpha = 1.0f, beta = 0.0f;
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
        if (c->valid && c->m == out_dim && c->n == n && c->k == in_dim && c->dtype == dtype) {
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
        hit->m = out_dim, hit->n = n, hit->k = in_dim, hit->dtype = dtype, hit->valid = 1;
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

extern "C" int ecu_matmul(eng_backend_t *be, float *out, const float *x, const void *w,
                          const void *bias, eng_dtype_t dtype, int n, int in_dim, int out_dim)
{
    ecu_state_t *st = ecu_st(be);
    if (!out || !x || !w || n <= 0 || in_dim <= 0 || out_dim <= 0 || ecu_dtype_size(dtype) == 0 ||
        out == x)
        return -EINVAL;
    if (in_dim % 8) {
        ANV_ERROR("cuda matmul: in_dim %d is not a multiple of 8", in_dim);
        return ANV_EUNSUPPORTED;
    }
    /* the GEMV's vector loads need 16-byte aligned rows; cuBLASLt copes with the rest */
    bool aligned = ((uintptr_t)x % 16 == 0) && ((uintptr_t)w % 16 == 0);
    if (n <= ECU_GEMV_MAX && aligned) {
        if (dtype == ENG_DTYPE_BF16)
            ECU_TRY(s_gemv_launch<__nv_bfloat16>(st, out, x, w, n, in_dim, out_dim));
        else if (dtype == ENG_DTYPE_F16)
            ECU_TRY(s_gemv_launch<__half>(st, out, x, w, n, in_dim, out_dim));
        else
            ECU_TRY(s_gemv_launch<float>(st, out, x, w, n, in_dim, out_dim));
    } else {
        const void *xw = x;
        size_t total = (size_t)n * in_dim;
        if (dtype != ENG_DTYPE_F32) {
            ECU_TRY(ecu_buf_reserve(&st->xconv, total * 2));
            if (dtype == ENG_DTYPE_BF16)
                s_round_kernel<<<s_grid(st, total), 256, 0, st->stream>>>(
                    (__nv_bfloat16 *)st->xconv.ptr, x, total);
            else
                s_round_kernel<<<s_grid(st, total), 256, 0, st->stream>>>((__half *)st->xconv.ptr,
                                                                          x, total);
            ECU_LAUNCHED();
            xw = st->xconv.ptr;
        }
        ECU_TRY(s_lt(st, out, xw, w, dtype, n, in_dim, out_dim));
    }
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

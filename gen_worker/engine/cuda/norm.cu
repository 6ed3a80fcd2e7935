/*  norm.cu - RMSNorm and the fused residual add + RMSNorm (HF LlamaRMSNorm, fp32 math).

    One block per row, held in registers (up to ECU_NORM_REGS elements a thread): the sum of
    squares is a block reduction in fp32 (the CPU sums in double; the difference is far below
    the tolerances), then each element is
    w * (x * rsqrt(mean + eps)) in the CPU's order of operations; w is read before the PDL
    wait (it does not depend on the kernel before). The fused form writes the
    updated residual and the normalised row in the same pass, so the residual stream is read
    once and written once per layer half. ecu_rmsnorm_round writes the normalised row
    rounded to bf16 / f16, the input a cuBLASLt product wants (linear's composed path).
    Rows whose width is a multiple of 4 (and 16-byte aligned) run s_norm4_kernel instead:
    16-byte loads and stores, a quarter of the threads (256 at 4096), the same math with the
    squares summed 4 at a time (other bits than the scalar kernel's, the same for any batch).
    ANVIL_CUDA_NORM_VEC=0 is the A/B. On the H100 (graphs, alternating runs on one machine,
    2026-12-06; fp8 KV): batch 16 2362 / 2354 -> 2380 / 2374 tok/s (x1.008), 64 8093 / 8078
    -> 8113 / 8108 (x1.003), 256 18741 / 18763 -> 18940 / 18914 (x1.009), 256 x 2k 10824 /
    10803 -> 10877 / 10861 (x1.005); the GRPO workload (bf16 KV) 12826 / 12801 -> 13004 /
    12946 (x1.013). Batch 1 folds its norms into the GEMV (matmul.cu) and is unchanged.
*/
#include "eng_cuda_internal.h"

#define ECU_NORM_REGS 8 /* elements a thread keeps in registers (rows up to 8 x the block) */

template <typename T, bool ADD, typename OT = float>
static __global__ void __launch_bounds__(1024)
    s_norm_kernel(OT *out /* (n, dim) OT */, float *x /* (n, dim) f32: residual when ADD */,
                  const float *delta /* (n, dim) f32 or NULL */, const T *w /* (dim) T */,
                  int dim, float eps)
{
    __shared__ float red[32];
    ecu_pdl_trigger(); /* one small pass: let the next kernel (a GEMV) start fetching */
    const bool regs = dim <= ECU_NORM_REGS * (int)blockDim.x; /* block-uniform */
    /* the norm's weights do not depend on the kernel before: in the register path they are
       loaded before the PDL wait, so no round trip follows the reduction (on the H100,
       2026-12-05, graphs: +0.5 % at batch 4, +0.6 % at 16, level at 256) */
    float wv[ECU_NORM_REGS];
    if (regs) {
#pragma unroll
        for (int k = 0; k < ECU_NORM_REGS; k++) {
            const int i = threadIdx.x + k * blockDim.x;
            wv[k] = i < dim ? ecu_ld<T>(w, i) : 0.0f;
        }
    }
    ecu_pdl_wait();
    size_t base = (size_t)blockIdx.x * dim;
    float ss = 0.0f;
    if (regs) {
        /* the row in registers: all of a thread's loads in flight at once and no second read
           (at batch 256 on the H200 the loop below took 5.9 us for a 4096-wide norm, 0.7
           TB/s); the same elements a thread, summed in the same order: the same bits */
        float v[ECU_NORM_REGS];
#pragma unroll
        for (int k = 0; k < ECU_NORM_REGS; k++) {
            const int i = threadIdx.x + k * blockDim.x;
            v[k] = 0.0f;
            if (i < dim) {
                v[k] = x[base + i];
                if (ADD) {
                    v[k] += delta[base + i];
                    x[base + i] = v[k];
                }
            }
        }
#pragma unroll
        for (int k = 0; k < ECU_NORM_REGS; k++)
            if (threadIdx.x + k * blockDim.x < dim)
                ss += v[k] * v[k];
        ss = ecu_block_sum(ss, red);
        const float inv = 1.0f / sqrtf(ss / (float)dim + eps);
#pragma unroll
        for (int k = 0; k < ECU_NORM_REGS; k++) {
            const int i = threadIdx.x + k * blockDim.x;
            if (i < dim)
                out[base + i] = ecu_from_f32<OT>(wv[k] * (v[k] * inv));
        }
        return;
    }
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float v = x[base + i];
        if (ADD) {
            v += delta[base + i];
            x[base + i] = v;
        }
        ss += v * v;
    }
    ss = ecu_block_sum(ss, red);
    float inv = 1.0f / sqrtf(ss / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        out[base + i] = ecu_from_f32<OT>(ecu_ld<T>(w, i) * (x[base + i] * inv));
}

/* 4 consecutive weights widened (16-byte aligned fp32, 8-byte aligned bf16 / f16) */
template <typename T> static __device__ __forceinline__ float4 s_w4(const T *w, int i4)
{
    if constexpr (sizeof(T) == 4) {
        return ((const float4 *)w)[i4];
    } else {
        const uint2 u = ((const uint2 *)w)[i4];
        const T *h = (const T *)&u;
        return make_float4(ecu_ld<T>(h, 0), ecu_ld<T>(h, 1), ecu_ld<T>(h, 2), ecu_ld<T>(h, 3));
    }
}
template <typename OT> static __device__ __forceinline__ void s_out4(OT *out, size_t i4, float4 v)
{
    if constexpr (sizeof(OT) == 4)
        ((float4 *)out)[i4] = v;
    else
        ecu_store4(out, i4, v);
}

/* The same norm with 16-byte accesses (st->norm_vec, the default; ANVIL_CUDA_NORM_VEC=0 for
   the A/B): a thread owns up to ECU_NORM4 groups of 4 consecutive elements (dim a multiple of
   4, rows 16-byte aligned), a quarter of the threads of s_norm_kernel at the same row; its
   sum of squares adds a group's 4 squares in order, so the bits differ from s_norm_kernel's
   (both within the CPU's tolerance) but not with the batch. */
#define ECU_NORM4 4
template <typename T, bool ADD, typename OT = float>
static __global__ void __launch_bounds__(1024)
    s_norm4_kernel(OT *out /* (n, dim) OT */,
                   float *x /* (n, dim) f32: residual when ADD */,
                   const float *delta /* (n, dim) f32 or NULL */,
                   const T *w /* (dim) T */,
                   int dim,
                   float eps)
{
    __shared__ float red[32];
    ecu_pdl_trigger();
    const int n4 = dim >> 2;
    float4 wv[ECU_NORM4], v[ECU_NORM4];
#pragma unroll
    for (int k = 0; k < ECU_NORM4; k++) {
        const int i = threadIdx.x + k * blockDim.x;
        wv[k] = i < n4 ? s_w4(w, i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    ecu_pdl_wait();
    const size_t base4 = (size_t)blockIdx.x * n4;
    float4 *xr = (float4 *)x + base4;
#pragma unroll
    for (int k = 0; k < ECU_NORM4; k++) {
        const int i = threadIdx.x + k * blockDim.x;
        v[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (i < n4) {
            v[k] = xr[i];
            if (ADD) {
                const float4 d = ((const float4 *)delta)[base4 + i];
                v[k].x += d.x, v[k].y += d.y, v[k].z += d.z, v[k].w += d.w;
                xr[i] = v[k];
            }
        }
    }
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < ECU_NORM4; k++) {
        ss += v[k].x * v[k].x;
        ss += v[k].y * v[k].y;
        ss += v[k].z * v[k].z;
        ss += v[k].w * v[k].w;
    }
    ss = ecu_block_sum(ss, red);
    const float inv = 1.0f / sqrtf(ss / (float)dim + eps);
#pragma unroll
    for (int k = 0; k < ECU_NORM4; k++) {
        const int i = threadIdx.x + k * blockDim.x;
        if (i < n4)
            s_out4(out, base4 + i,
                   make_float4(wv[k].x * (v[k].x * inv), wv[k].y * (v[k].y * inv),
                               wv[k].z * (v[k].z * inv), wv[k].w * (v[k].w * inv)));
    }
}

/* s_norm4_kernel's threads for a row of dim, or 0 where it does not apply (the switch off,
   dim not a multiple of 4, over ECU_NORM4 groups a thread at 1024 threads, or a row pointer
   not 16-byte aligned) */
static int s_norm4_threads(const ecu_state_t *st,
                           int dim,
                           const void *out,
                           const void *x,
                           const void *delta,
                           const void *w)
{
    const int n4 = dim / 4;
    if (!st->norm_vec || dim % 4 || n4 > ECU_NORM4 * 1024 || (uintptr_t)out % 16 ||
        (uintptr_t)x % 16 || (uintptr_t)delta % 16 || (uintptr_t)w % 16)
        return 0;
    const int t = (n4 + ECU_NORM4 - 1) / ECU_NORM4;
    return (t + 31) / 32 * 32;
}

/* threads a row's block: enough to cover the row in a few passes */
static dim3 s_norm_threads(int dim)
{
    return dim3(dim >= 2048 ? 1024 : dim >= 512 ? 256 : 64);
}

/* one launch of the norm for rows of dim: s_norm4_kernel where it applies (s_norm4_threads),
   else s_norm_kernel (the two share a signature) */
template <typename T, bool ADD, typename OT = float>
static int s_norm_go(const ecu_state_t *st,
                     OT *out,
                     float *x,
                     const float *delta,
                     const void *w,
                     int n,
                     int dim,
                     float eps)
{
    const int t4 = s_norm4_threads(st, dim, out, x, delta, w);
    ECU_CHECK(ecu_launch(st, t4 > 0 ? s_norm4_kernel<T, ADD, OT> : s_norm_kernel<T, ADD, OT>,
                         dim3(n), t4 > 0 ? dim3(t4) : s_norm_threads(dim), 0, out, x, delta,
                         (const T *)w, dim, eps));
    return 0;
}

template <bool ADD>
static int s_norm_launch(const ecu_state_t *st, float *out, float *x, const float *delta,
                         const void *w, eng_dtype_t dtype, int n, int dim, float eps)
{
    switch (dtype) {
    case ENG_DTYPE_F32:
        return s_norm_go<float, ADD>(st, out, x, delta, w, n, dim, eps);
    case ENG_DTYPE_BF16:
        return s_norm_go<__nv_bfloat16, ADD>(st, out, x, delta, w, n, dim, eps);
    case ENG_DTYPE_F16:
        return s_norm_go<__half, ADD>(st, out, x, delta, w, n, dim, eps);
    default:
        return -EINVAL;
    }
}

extern "C" int ecu_rmsnorm(eng_backend_t *be, float *out, const float *x, const void *w,
                           eng_dtype_t dtype, int n, int dim, float eps)
{
    if (!out || !x || !w || n <= 0 || dim <= 0)
        return -EINVAL;
    return s_norm_launch<false>(ecu_st(be), out, (float *)x, NULL, w, dtype, n, dim, eps);
}

extern "C" int ecu_add_rmsnorm(eng_backend_t *be, float *out, float *residual, const float *delta,
                               const void *w, eng_dtype_t dtype, int n, int dim, float eps)
{
    if (!out || !residual || !delta || !w || n <= 0 || dim <= 0)
        return -EINVAL;
    return s_norm_launch<true>(ecu_st(be), out, residual, delta, w, dtype, n, dim, eps);
}

/* rmsnorm rounded to the weights' dtype on the way out: the input of a cuBLASLt product
   (matmul.cu), without the fp32 row block and the rounding pass between. out (n, dim) `dtype`
   (bf16 or f16), w (dim) `dtype`. */
int ecu_rmsnorm_round(ecu_state_t *st, void *out, const float *x, const void *w,
                      eng_dtype_t dtype, int n, int dim, float eps)
{
    if (dtype == ENG_DTYPE_BF16)
        return s_norm_go<__nv_bfloat16, false>(st, (__nv_bfloat16 *)out, (float *)x, NULL, w, n,
                                               dim, eps);
    if (dtype == ENG_DTYPE_F16)
        return s_norm_go<__half, false>(st, (__half *)out, (float *)x, NULL, w, n, dim, eps);
    return -EINVAL;
}

/*  norm.cu - RMSNorm and the fused residual add + RMSNorm (HF LlamaRMSNorm, fp32 math).

    One block per row, held in registers (up to ECU_NORM_REGS elements a thread): the sum of
    squares is a block reduction in fp32 (the CPU sums in double; the difference is far below
    the tolerances), then each element is
    w * (x * rsqrt(mean + eps)) in the CPU's order of operations; w is read before the PDL
    wait (it does not depend on the kernel before). The fused form writes the
    updated residual and the normalised row in the same pass, so the residual stream is read
    once and written once per layer half. ecu_rmsnorm_round writes the normalised row
    rounded to bf16 / f16, the input a cuBLASLt product wants (linear's composed path).
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

/* threads a row's block: enough to cover the row in a few passes */
static dim3 s_norm_threads(int dim)
{
    return dim3(dim >= 2048 ? 1024 : dim >= 512 ? 256 : 64);
}

template <bool ADD>
static int s_norm_launch(const ecu_state_t *st, float *out, float *x, const float *delta,
                         const void *w, eng_dtype_t dtype, int n, int dim, float eps)
{
    dim3 grid(n), threads = s_norm_threads(dim);
    switch (dtype) {
    case ENG_DTYPE_F32:
        ECU_CHECK(ecu_launch(st, s_norm_kernel<float, ADD>, grid, threads, 0, out, x, delta,
                             (const float *)w, dim, eps));
        break;
    case ENG_DTYPE_BF16:
        ECU_CHECK(ecu_launch(st, s_norm_kernel<__nv_bfloat16, ADD>, grid, threads, 0, out, x,
                             delta, (const __nv_bfloat16 *)w, dim, eps));
        break;
    case ENG_DTYPE_F16:
        ECU_CHECK(ecu_launch(st, s_norm_kernel<__half, ADD>, grid, threads, 0, out, x, delta,
                             (const __half *)w, dim, eps));
        break;
    default:
        return -EINVAL;
    }
    return 0;
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
    dim3 grid(n), threads = s_norm_threads(dim);
    if (dtype == ENG_DTYPE_BF16)
        ECU_CHECK(ecu_launch(st, s_norm_kernel<__nv_bfloat16, false, __nv_bfloat16>, grid,
                             threads, 0, (__nv_bfloat16 *)out, (float *)x, (const float *)NULL,
                             (const __nv_bfloat16 *)w, dim, eps));
    else if (dtype == ENG_DTYPE_F16)
        ECU_CHECK(ecu_launch(st, s_norm_kernel<__half, false, __half>, grid, threads, 0,
                             (__half *)out, (float *)x, (const float *)NULL, (const __half *)w,
                             dim, eps));
    else
        return -EINVAL;
    return 0;
}

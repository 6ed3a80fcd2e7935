/*  act.cu - the SwiGLU activation, on separate gate/up arrays or one stacked gate|up row.

    Elementwise and memory-bound: a grid-stride loop, the CPU's formula g / (1 + exp(-g)) * u
    in fp32. Launched with PDL (see eng_cuda_internal.h). The stacked form reads the output of
    one matmul with the gate and up weights stacked, saving a GEMM launch and a pass; where
    ffn % 4 == 0 and the rows are 16-byte aligned (the engine's case) a thread takes 4
    elements with 16-byte loads and one 32-bit division for the row (was a 64-bit division
    and 4-byte accesses an element: 17.9 us a layer for 44 MB at batch 256 on the H200, 1.7
    TB/s). The same arithmetic an element either way. Inside a linear composed on cuBLASLt the
    stacked form also writes each value rounded to the weights' dtype (the down projection's
    input, its rounded twin: ecu_twin_begin in matmul.cu), which spares the down projection
    a rounding kernel that read the output again; when the linear's caller says the down
    projection alone reads the output (eng_linear_t.out_for_next) it writes the twin alone,
    10 bytes an element moved instead of 14 (st->twin_only; ANVIL_CUDA_TWIN_ONLY=0 is the A/B).
    The product it reads is itself written in the weights' dtype there (st->gu_low, matmul.cu;
    ANVIL_CUDA_GU_LOW=0 for fp32): gate and up each rounded once, as a bf16 model computes
    them, so SwiGLU reads 2 bytes an element of gu instead of 4 (s_gu4: one 8-byte load).
*/
#include "eng_cuda_internal.h"

static __global__ void s_swiglu_kernel(float *out /* (n, ffn) f32 */,
                                       const float *gate /* (n, ffn) f32 */,
                                       const float *up /* (n, ffn) f32 */, size_t total)
{
    ecu_pdl_trigger();
    ecu_pdl_wait();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

template <typename GT>
static __global__ void s_swiglu_fused_kernel(float *out /* (n, ffn) f32, or NULL */,
                                             const GT *gu /* (n, 2 ffn) f32 or 16-bit */,
                                             int ffn,
                                             size_t total,
                                             void *low /* (n, ffn) or NULL */,
                                             int kind /* ECU_TWIN_* */)
{
    ecu_pdl_trigger(); /* elementwise: the down projection may start fetching its weights */
    ecu_pdl_wait();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / ffn, c = i % ffn;
        float g = ecu_ld(gu, r * 2 * ffn + c), u = ecu_ld(gu, r * 2 * ffn + ffn + c);
        const float v = g / (1.0f + expf(-g)) * u;
        if (out)
            out[i] = v;
        ecu_twin_store(low, kind, i, v);
    }
}

/* four consecutive values of gu from element 4 i4: one 16-byte load (f32) or 8-byte load
   (bf16 / f16) */
static __device__ __forceinline__ float4 s_gu4(const float *gu, size_t i4)
{
    return ((const float4 *)gu)[i4];
}
template <typename T> static __device__ __forceinline__ float4 s_gu4(const T *gu, size_t i4)
{
    union {
        uint2 u;
        T h[4];
    } v;
    v.u = ((const uint2 *)gu)[i4];
    return make_float4(ecu_ld(v.h, 0), ecu_ld(v.h, 1), ecu_ld(v.h, 2), ecu_ld(v.h, 3));
}

/* the stacked form, 4 elements a thread: ffn4 = ffn / 4, total4 = n * ffn4 < 2^31 */
template <typename GT>
static __global__ void s_swiglu_fused4_kernel(float4 *out /* (n, ffn4), or NULL */,
                                              const GT *gu /* (n, 2 ffn) f32 or 16-bit */,
                                              unsigned ffn4,
                                              unsigned total4,
                                              void *low /* (n, 4 ffn4) */,
                                              int kind /* ECU_TWIN_* */)
{
    ecu_pdl_trigger();
    ecu_pdl_wait();
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < total4;
         i += gridDim.x * blockDim.x) {
        const unsigned r = i / ffn4, c = i - r * ffn4;
        const float4 g = s_gu4(gu, (size_t)r * 2 * ffn4 + c),
                     u = s_gu4(gu, (size_t)r * 2 * ffn4 + ffn4 + c);
        const float4 v =
            make_float4(g.x / (1.0f + expf(-g.x)) * u.x, g.y / (1.0f + expf(-g.y)) * u.y,
                        g.z / (1.0f + expf(-g.z)) * u.z, g.w / (1.0f + expf(-g.w)) * u.w);
        if (out)
            out[i] = v;
        ecu_twin_store4(low, kind, i, v);
    }
}

static int s_grid(ecu_state_t *st, size_t total)
{
    size_t blocks = (total + 255) / 256, cap = (size_t)st->n_sm * 16;
    return (int)(blocks < cap ? blocks : cap);
}

extern "C" int ecu_swiglu(eng_backend_t *be, float *out, const float *gate, const float *up, int n,
                          int ffn)
{
    ecu_state_t *st = ecu_st(be);
    if (!out || !gate || !up || n <= 0 || ffn <= 0)
        return -EINVAL;
    size_t total = (size_t)n * ffn;
    ECU_CHECK(ecu_launch(st, s_swiglu_kernel, dim3(s_grid(st, total)), dim3(256), 0, out, gate,
                         up, total));
    return 0;
}

template <typename GT>
static int
s_swiglu_go(ecu_state_t *st, float *out, const GT *gu, int ffn, size_t total, void *low, int kind)
{
    if (ffn % 4 == 0 && (uintptr_t)out % 16 == 0 && (uintptr_t)gu % 16 == 0 &&
        total / 4 < 0x7fffffffu) { /* the unsigned grid stride cannot wrap */
        ECU_CHECK(ecu_launch(st, s_swiglu_fused4_kernel<GT>, dim3(s_grid(st, total / 4)), dim3(256),
                             0, (float4 *)out, gu, (unsigned)(ffn / 4), (unsigned)(total / 4), low,
                             kind));
        return 0;
    }
    ECU_CHECK(ecu_launch(st, s_swiglu_fused_kernel<GT>, dim3(s_grid(st, total)), dim3(256), 0, out,
                         gu, ffn, total, low, kind));
    return 0;
}

int ecu_swiglu_fused_twin(
    ecu_state_t *st, float *out, const void *gu, int gu_kind, int n, int ffn, void *low, int kind)
{
    if ((!out && !low) || !gu || n <= 0 || ffn <= 0 || (const void *)out == gu)
        return -EINVAL;
    const size_t total = (size_t)n * ffn;
    if (gu_kind == ECU_TWIN_BF16)
        return s_swiglu_go(st, out, (const __nv_bfloat16 *)gu, ffn, total, low, kind);
    if (gu_kind == ECU_TWIN_F16)
        return s_swiglu_go(st, out, (const __half *)gu, ffn, total, low, kind);
    return s_swiglu_go(st, out, (const float *)gu, ffn, total, low, kind);
}

extern "C" int ecu_swiglu_fused(eng_backend_t *be, float *out, const float *gu, int n, int ffn)
{
    ecu_state_t *st = ecu_st(be);
    ecu_twin_drop(st);
    return ecu_swiglu_fused_twin(st, out, gu, ECU_TWIN_NONE, n, ffn, NULL, ECU_TWIN_NONE);
}

/*  skinny.cu - the tensor-core product for a few rows: out (=, or += when acc) x @ W^T + bias
    for 2 to ECU_SKINNY_MAX rows of bf16 / f16 activations (x already rounded to W's dtype, as
    cuBLASLt takes it; matmul.cu calls it in cuBLASLt's place for n <= st->skinny_max).

    At a batch of a few rows a decode product is a stream of W: 16 rows of x against a 4096 x
    14336 matrix is 117 MB of weights and 0.5 MB of activations. cuBLASLt's kernels for these
    shapes stream W at 0.74 to 0.90 of the copy rate on the H100 (ncu, batch 16) and split K
    with a reduction kernel after (64 of them a step); the GEMV (matmul.cu) streams at the copy
    rate but does one FMA a weight a row on the CUDA cores, which at 4 rows and more is the
    bound. This kernel keeps the GEMV's stream and moves the products onto the tensor cores:
    W is the mma's A operand (m16n8k16: 16 output features a warp), x its B (8 rows an n-tile,
    NT tiles). A lane loads 16 bytes of each of its two feature rows (features g and g + 8 of
    the tile, g = lane / 4), at column 8 t of a 32-column block (t = lane % 4), and 16 bytes of
    x at the same columns for each n-tile: the order of k inside a dot product is free, so the
    fragments' k positions are relabelled to match the loads (the mma's k pairs {2t, 2t+1} and
    {2t+8, 2t+9} are columns 8t..8t+3 of the block in the first mma, 8t+4..8t+7 in the second)
    and every fragment is a whole 16-byte load, with no shuffles and no shared memory. x (a few
    hundred KB) is read through L1, W streamed once with U blocks of loads in flight and the
    next chunk's issued before the current one is used; the first chunk's W before the PDL
    wait. Short matrices split K over the block's warps (segs, chosen like the GEMV's column
    segments: enough blocks for 2.5 resident waves), reduced in shared memory in segment
    order, so a result does not depend on the schedule. Accumulation is fp32 on the tensor
    cores, as cuBLASLt's. ANVIL_CUDA_SKINNY_MAX=0 (st->skinny_max) keeps cuBLASLt (the A/B).
*/
#include "eng_cuda_internal.h"

#define ECU_SKINNY_WARPS 8

/* One warp per (16-feature tile, K segment); a block holds R = ECU_SKINNY_WARPS / segs tiles.
   in_dim % (32 * U * segs) == 0 (the launcher checks); features past out_dim load the last
   row and are not stored, rows of x past n load row n - 1 and are not stored. */
template <int NT, int U, typename T, bool SW>
static __global__ void __launch_bounds__(ECU_SKINNY_WARPS * 32)
    s_skinny_kernel(const T *w /* (out_dim, in_dim) */,
                    const T *x /* (n, in_dim) */,
                    float *out /* (n, out_dim) f32; SW (n, out_dim / 2) */,
                    const T *bias /* (out_dim) or NULL */,
                    int n,
                    int in_dim,
                    int out_dim,
                    int segs,
                    int acc,
                    void *low /* SW: the twin (n, out_dim / 2) or NULL */,
                    int kind /* ECU_TWIN_* */)
{
    __shared__ float4 red[ECU_SKINNY_WARPS][NT][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int R = ECU_SKINNY_WARPS / segs, lr = warp / segs, seg = warp % segs;
    const int tile = blockIdx.x * R + lr, len = in_dim / segs, ffn = out_dim / 2;
    const int kbeg = seg * len + 8 * t, kend = (seg + 1) * len;
    /* the tile's rows g and g + 8: features 16 tile + g and + 8, or (SW) gate and up of
       feature 8 tile + g of the ffn */
    const int o0 = SW ? 8 * tile : 16 * tile;
    const int ra = SW ? min(o0 + g, ffn - 1) : min(o0 + g, out_dim - 1);
    const int rb = SW ? ffn + ra : min(o0 + g + 8, out_dim - 1);
    const T *wa = w + (size_t)ra * in_dim, *wb = w + (size_t)rb * in_dim;
    const T *xr[NT];
#pragma unroll
    for (int j = 0; j < NT; j++)
        xr[j] = x + (size_t)min(8 * j + g, n - 1) * in_dim;
    uint4 cw[U][2], cx[U][NT];
#pragma unroll
    for (int u = 0; u < U; u++) {
        cw[u][0] = __ldg((const uint4 *)(wa + kbeg + 32 * u));
        cw[u][1] = __ldg((const uint4 *)(wb + kbeg + 32 * u));
    }
    ecu_pdl_wait();
    ecu_pdl_trigger();
#pragma unroll
    for (int u = 0; u < U; u++)
#pragma unroll
        for (int j = 0; j < NT; j++)
            cx[u][j] = __ldg((const uint4 *)(xr[j] + kbeg + 32 * u));
    float acc4[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++)
        acc4[j][0] = acc4[j][1] = acc4[j][2] = acc4[j][3] = 0.0f;
    for (int k = kbeg;;) {
        const int kn = k + 32 * U;
        const bool more = kn < kend;
        uint4 nw[U][2], nx[U][NT];
        if (more) {
#pragma unroll
            for (int u = 0; u < U; u++) {
                nw[u][0] = __ldg((const uint4 *)(wa + kn + 32 * u));
                nw[u][1] = __ldg((const uint4 *)(wb + kn + 32 * u));
#pragma unroll
                for (int j = 0; j < NT; j++)
                    nx[u][j] = __ldg((const uint4 *)(xr[j] + kn + 32 * u));
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int j = 0; j < NT; j++) {
                ecu_mma16816<T>(acc4[j], cw[u][0].x, cw[u][1].x, cw[u][0].y, cw[u][1].y, cx[u][j].x,
                                cx[u][j].y);
                ecu_mma16816<T>(acc4[j], cw[u][0].z, cw[u][1].z, cw[u][0].w, cw[u][1].w, cx[u][j].z,
                                cx[u][j].w);
            }
        if (!more)
            break;
        k = kn;
#pragma unroll
        for (int u = 0; u < U; u++) {
            cw[u][0] = nw[u][0], cw[u][1] = nw[u][1];
#pragma unroll
            for (int j = 0; j < NT; j++)
                cx[u][j] = nx[u][j];
        }
    }
    if (segs > 1) {
        /* the tile's segments, added in segment order by its segment-0 warp */
#pragma unroll
        for (int j = 0; j < NT; j++)
            red[warp][j][lane] = make_float4(acc4[j][0], acc4[j][1], acc4[j][2], acc4[j][3]);
        __syncthreads();
        if (seg != 0)
            return;
#pragma unroll
        for (int j = 0; j < NT; j++)
            for (int s = 1; s < segs; s++) {
                const float4 p = red[warp + s][j][lane];
                acc4[j][0] += p.x, acc4[j][1] += p.y, acc4[j][2] += p.z, acc4[j][3] += p.w;
            }
    }
    /* the fragment: acc4[j][e] is tile row g (+ 8 for e >= 2) of x's row 8 j + 2 t (+ 1 for
       odd e) */
    if constexpr (SW) {
        const int f = o0 + g;
        if (f >= ffn)
            return;
        const float bg = bias ? ecu_ld<T>(bias, f) : 0.0f;
        const float bu = bias ? ecu_ld<T>(bias, ffn + f) : 0.0f;
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int r = 8 * j + 2 * t + e;
                if (r < n) {
                    const float gv = acc4[j][e] + bg, uv = acc4[j][e + 2] + bu;
                    const float v = gv / (1.0f + expf(-gv)) * uv;
                    out[(size_t)r * ffn + f] = v;
                    ecu_twin_store(low, kind, (size_t)r * ffn + f, v);
                }
            }
        return;
    }
#pragma unroll
    for (int e = 0; e < 4; e++) {
        const int f = o0 + g + (e >= 2 ? 8 : 0);
        if (f >= out_dim)
            continue;
        const float bv = bias ? ecu_ld<T>(bias, f) : 0.0f;
#pragma unroll
        for (int j = 0; j < NT; j++) {
            const int r = 8 * j + 2 * t + (e & 1);
            if (r < n) {
                float *p = out + (size_t)r * out_dim + f;
                const float v = acc4[j][e] + bv;
                *p = acc ? *p + v : v;
            }
        }
    }
}

/* K segments a tile: doubled from 1 while the grid holds fewer than st->gemv_waves2 / 2
   resident waves and a segment keeps >= 512 columns in whole chunks. */
template <int NT, int U, typename T, bool SW>
static int s_skinny_segs(const ecu_state_t *st, int in_dim, long tiles)
{
    static int per_sm = 0; /* resident blocks an SM, per instantiation */
    if (per_sm == 0 && (cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                            &per_sm, s_skinny_kernel<NT, U, T, SW>, ECU_SKINNY_WARPS * 32, 0) !=
                            cudaSuccess ||
                        per_sm <= 0))
        per_sm = 1;
    const long slots = (long)st->n_sm * per_sm;
    int segs = 1;
    while (segs < ECU_SKINNY_WARPS &&
           (tiles * segs + ECU_SKINNY_WARPS - 1) / ECU_SKINNY_WARPS < slots * st->gemv_waves2 / 2 &&
           in_dim % (32 * U * segs * 2) == 0 && in_dim / (segs * 2) >= 512)
        segs *= 2;
    return segs;
}

template <int NT, int U, typename T, bool SW>
static int s_skinny_launch_n(const ecu_state_t *st, float *out, const T *x, const T *w,
                             const T *bias, int n, int in_dim, int out_dim, bool acc, void *low,
                             int kind)
{
    if (in_dim % (32 * U) != 0)
        return 0;
    const long tiles = SW ? (out_dim / 2 + 7) / 8 : (out_dim + 15) / 16;
    const int segs = s_skinny_segs<NT, U, T, SW>(st, in_dim, tiles);
    const int R = ECU_SKINNY_WARPS / segs;
    const unsigned blocks = (unsigned)((tiles + R - 1) / R);
    ECU_CHECK(ecu_launch(st, s_skinny_kernel<NT, U, T, SW>, dim3(blocks),
                         dim3(ECU_SKINNY_WARPS * 32), 0, w, x, out, bias, n, in_dim, out_dim,
                         segs, (int)acc, low, kind));
    return 1;
}

template <typename T, bool SW>
static int s_skinny_launch_t(const ecu_state_t *st, float *out, const void *x, const void *w,
                             const void *bias, int n, int in_dim, int out_dim, bool acc,
                             void *low, int kind)
{
    const T *xt = (const T *)x, *wt = (const T *)w, *bt = (const T *)bias;
    if (n <= 8)
        return s_skinny_launch_n<1, 4, T, SW>(st, out, xt, wt, bt, n, in_dim, out_dim, acc, low,
                                              kind);
    return s_skinny_launch_n<2, 2, T, SW>(st, out, xt, wt, bt, n, in_dim, out_dim, acc, low,
                                          kind);
}

template <typename T>
static int s_skinny_launch_e(const ecu_state_t *st, float *out, const void *x, const void *w,
                             const void *bias, int n, int in_dim, int out_dim, bool acc, int epi,
                             void *low, int kind)
{
    if (epi == ENG_LIN_SWIGLU)
        return s_skinny_launch_t<T, true>(st, out, x, w, bias, n, in_dim, out_dim, false, low,
                                          kind);
    return s_skinny_launch_t<T, false>(st, out, x, w, bias, n, in_dim, out_dim, acc, NULL,
                                       ECU_TWIN_NONE);
}

int ecu_skinny_matmul(const ecu_state_t *st, float *out, const void *xw, const void *w,
                      const void *bias, eng_dtype_t dtype, int n, int in_dim, int out_dim,
                      bool acc, int epi, void *low, int kind)
{
    if (n < 1 || n > st->skinny_max || n > ECU_SKINNY_MAX || (uintptr_t)xw % 16 ||
        (uintptr_t)w % 16 || in_dim % 8 || (epi == ENG_LIN_SWIGLU && (out_dim % 2 || acc)) ||
        (epi != ENG_LIN_SWIGLU && epi != ENG_LIN_PLAIN && epi != ENG_LIN_ADD))
        return 0;
    if (dtype == ENG_DTYPE_BF16)
        return s_skinny_launch_e<__nv_bfloat16>(st, out, xw, w, bias, n, in_dim, out_dim, acc,
                                                epi, low, kind);
    if (dtype == ENG_DTYPE_F16)
        return s_skinny_launch_e<__half>(st, out, xw, w, bias, n, in_dim, out_dim, acc, epi, low,
                                         kind);
    return 0;
}

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
    cores, as cuBLASLt's. The epilogue is the linear's (eng_ops.h): a plain store or the
    residual add, and for the pair epilogues the tile's two rows are a pair, so the pair's two
    sums meet in one thread: SwiGLU (rows g and g + 8 are gate j and up j; out gets silu(gate)
    * up and the down projection's rounded twin) and RoPE (dims i and i + head_dim / 2 of one
    head: q rotated out, k rotated into the paged pool, v stored; ecu_rope_pair_put), which
    takes the SwiGLU and rope_kv_store kernels and their fp32 products' round trip out of a
    layer. ANVIL_CUDA_SKINNY_MAX (st->skinny_max): the most rows it takes, 8 by default; 0
    keeps cuBLASLt (the A/B).
    On the H100 (2026-12-06, one warm machine, graphs, prompt 512, 256 new): batch 2 / 4 / 8
    decode at 333.5 / 654.7 / 1281.5 tok/s against 312.6 / 608.9 / 1197.0 on cuBLASLt (x1.067 /
    x1.075 / x1.070, two runs each); a product on its own (anvil-bench-engine --linear 8,
    epilogues included): QKV 23.2 us against 26.9, O 17.7 / 19.9, gate|up 83.6 / 89.1, down
    46.9 / 48.6, lm_head 435 / 465; a layer 171.4 / 184.5 us (0.843 / 0.783 of the copy). At
    9 to 16 rows (two n-tiles, U = 2 to keep two blocks an SM) it loses: batch 16 2164.0 /
    2156.6 against 2242.3 / 2241.0 (x0.964; a layer 192.4 us against 186.9), so those stay on
    cuBLASLt unless ANVIL_CUDA_SKINNY_MAX says otherwise.
    Measured and removed (2026-12-06, H100, graphs, each against this kernel in one run): W
    loaded with L1::no_allocate (batch 8 1281.3 -> 1266.7 tok/s; batch 16 on skinny 2163.9 ->
    2213.0, still below cuBLASLt's 2239.7); x loaded as it is used with U = 4 at two n-tiles
    (batch 16 2061.1); the linear's norm folded into the product (x read as f32 and scaled by
    the norm's weights as it is used, the row's sum of squares gathered on the way, no norm
    kernel before QKV, gate|up and lm_head): batch 2 / 4 / 8 279.5 / 539.9 / 1024.7 against
    343.1 / 672.4 / 1312.8 with the norm kernel, and the model test's batch-4 |dlogprob| at
    0.100, its bound.
*/
#include "eng_cuda_internal.h"

#define ECU_SKINNY_WARPS 8

/* The product's tile rows and its epilogue: S_OUT stores (or adds into) out (n, out_dim);
   S_SWIGLU and S_ROPE pair a tile's rows (see the top of this file). */
enum { S_OUT = 0, S_SWIGLU = 1, S_ROPE = 2 };

typedef struct {
    float *out;       /* S_OUT (n, out_dim); S_SWIGLU (n, out_dim / 2); S_ROPE q (n, n_head,
                         head_dim) f32 */
    const void *x;    /* (n, in_dim) T */
    const void *bias; /* (out_dim) T or NULL */
    int n, in_dim, out_dim, segs, acc;
    void *low; /* S_SWIGLU: the twin (n, out_dim / 2) or NULL */
    int kind;  /* ECU_TWIN_* */
    ecu_rope_kv_t rope;
} s_skinny_args_t;

/* tiles of the product: 16 features, 8 gate/up pairs, or 8 dims pairs of a head */
static long s_skinny_tiles(int epi, int out_dim, int head_dim)
{
    return epi == S_SWIGLU ? (out_dim / 2 + 7) / 8
           : epi == S_ROPE ? (long)out_dim / head_dim * (head_dim / 16)
                           : (out_dim + 15) / 16;
}

/* One warp per (tile, K segment); a block holds R = ECU_SKINNY_WARPS / segs tiles. in_dim %
   (32 * U * segs) == 0 (the launcher checks); tile rows past the end load the last row and
   are not stored, rows of x past n load row n - 1 and are not stored. */
template <int NT, int U, typename T, int EPI>
static __global__ void __launch_bounds__(ECU_SKINNY_WARPS * 32)
    s_skinny_kernel(const T *w /* (out_dim, in_dim) */, const s_skinny_args_t a)
{
    __shared__ float4 red[ECU_SKINNY_WARPS][NT][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int segs = a.segs, R = ECU_SKINNY_WARPS / segs, lr = warp / segs, seg = warp % segs;
    const int n = a.n, in_dim = a.in_dim, out_dim = a.out_dim, ffn = out_dim / 2;
    const int hd = a.rope.head_dim, hh = hd / 2;
    const int tile = blockIdx.x * R + lr, len = in_dim / segs;
    const int kbeg = seg * len + 8 * t, kend = (seg + 1) * len;
    /* the tile's rows g and g + 8 (ra, rb): features 16 tile + g and + 8; gate and up of
       feature f = 8 tile + g; dims i and i + hh of head h */
    const int h = EPI == S_ROPE ? tile / (hh / 8) : 0,
              i = EPI == S_ROPE ? tile % (hh / 8) * 8 + g : 0;
    const int f = EPI == S_OUT ? 16 * tile + g : 8 * tile + g;
    const int ra = EPI == S_SWIGLU ? min(f, ffn - 1)
                   : EPI == S_ROPE ? h * hd + i
                                   : min(f, out_dim - 1);
    const int rb = EPI == S_SWIGLU ? ffn + ra : EPI == S_ROPE ? ra + hh : min(f + 8, out_dim - 1);
    const T *wa = w + (size_t)ra * in_dim, *wb = w + (size_t)rb * in_dim;
    const T *xr[NT];
#pragma unroll
    for (int j = 0; j < NT; j++)
        xr[j] = (const T *)a.x + (size_t)min(8 * j + g, n - 1) * in_dim;
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
    /* the fragment: acc4[j][e] is tile row g (ra; rb for e >= 2) of x's row 8 j + 2 t (+ 1 for
       odd e) */
    const T *bias = (const T *)a.bias;
    if constexpr (EPI != S_OUT) {
        if (EPI == S_SWIGLU && f >= ffn)
            return;
        const float ba = bias ? ecu_ld<T>(bias, ra) : 0.0f;
        const float bb = bias ? ecu_ld<T>(bias, rb) : 0.0f;
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int r = 8 * j + 2 * t + e;
                if (r >= n)
                    continue;
                const float va = acc4[j][e] + ba, vb = acc4[j][e + 2] + bb;
                if constexpr (EPI == S_SWIGLU) {
                    const float v = va / (1.0f + expf(-va)) * vb;
                    a.out[(size_t)r * ffn + f] = v;
                    ecu_twin_store(a.low, a.kind, (size_t)r * ffn + f, v);
                } else {
                    const ecu_rope_kv_t &q = a.rope;
                    const float2 cs = q.angles[(size_t)r * hh + i];
                    const size_t kvo = (size_t)q.slots[r] * q.n_kv_head * hd;
                    ecu_rope_pair_put(a.out, q.k_cache, q.v_cache, q.kv_dtype, kvo, r, h, i,
                                      q.n_head, q.n_kv_head, hd, va, vb, cs.x, cs.y);
                }
            }
    } else {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int o = e >= 2 ? f + 8 : f;
            if (o >= out_dim)
                continue;
            const float bv = bias ? ecu_ld<T>(bias, o) : 0.0f;
#pragma unroll
            for (int j = 0; j < NT; j++) {
                const int r = 8 * j + 2 * t + (e & 1);
                if (r < n) {
                    float *p = a.out + (size_t)r * out_dim + o;
                    const float v = acc4[j][e] + bv;
                    *p = a.acc ? *p + v : v;
                }
            }
        }
    }
}

/* K segments a tile: doubled from 1 while the grid holds fewer than st->gemv_waves2 / 2
   resident waves and a segment keeps >= 512 columns in whole chunks. */
template <int NT, int U, typename T, int EPI>
static int s_skinny_segs(const ecu_state_t *st, int in_dim, long tiles)
{
    static int per_sm = 0; /* resident blocks an SM, per instantiation */
    if (per_sm == 0 &&
        (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, s_skinny_kernel<NT, U, T, EPI>,
                                                       ECU_SKINNY_WARPS * 32, 0) != cudaSuccess ||
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

template <int NT, int U, typename T, int EPI>
static int s_skinny_launch_n(const ecu_state_t *st, const T *w, s_skinny_args_t a)
{
    if (a.in_dim % (32 * U) != 0)
        return 0;
    const long tiles = s_skinny_tiles(EPI, a.out_dim, a.rope.head_dim);
    a.segs = s_skinny_segs<NT, U, T, EPI>(st, a.in_dim, tiles);
    const int R = ECU_SKINNY_WARPS / a.segs;
    const unsigned blocks = (unsigned)((tiles + R - 1) / R);
    ECU_CHECK(ecu_launch(st, s_skinny_kernel<NT, U, T, EPI>, dim3(blocks),
                         dim3(ECU_SKINNY_WARPS * 32), 0, w, a));
    return 1;
}

template <typename T, int EPI>
static int s_skinny_launch_t(const ecu_state_t *st, const void *w, const s_skinny_args_t &a)
{
    if (a.n <= 8)
        return s_skinny_launch_n<1, 4, T, EPI>(st, (const T *)w, a);
    return s_skinny_launch_n<2, 2, T, EPI>(st, (const T *)w, a);
}

template <typename T>
static int
s_skinny_launch_e(const ecu_state_t *st, const void *w, int epi, const s_skinny_args_t &a)
{
    if (epi == ENG_LIN_SWIGLU)
        return s_skinny_launch_t<T, S_SWIGLU>(st, w, a);
    if (epi == ENG_LIN_ROPE_KV)
        return s_skinny_launch_t<T, S_ROPE>(st, w, a);
    return s_skinny_launch_t<T, S_OUT>(st, w, a);
}

int ecu_skinny_matmul(const ecu_state_t *st,
                      float *out,
                      const void *xw,
                      const void *w,
                      const void *bias,
                      eng_dtype_t dtype,
                      int n,
                      int in_dim,
                      int out_dim,
                      bool acc,
                      int epi,
                      void *low,
                      int kind,
                      const ecu_rope_kv_t *rope)
{
    if (n < 1 || n > st->skinny_max || n > ECU_SKINNY_MAX || (uintptr_t)xw % 16 ||
        (uintptr_t)w % 16 || (dtype != ENG_DTYPE_BF16 && dtype != ENG_DTYPE_F16))
        return 0;
    s_skinny_args_t a = {};
    a.out = out, a.x = xw, a.bias = bias, a.n = n, a.in_dim = in_dim, a.out_dim = out_dim;
    a.acc = acc;
    if (epi == ENG_LIN_SWIGLU) {
        if (out_dim % 2 || acc)
            return 0;
        a.low = low, a.kind = kind;
    } else if (epi == ENG_LIN_ROPE_KV) {
        /* whole tiles of 8 dims pairs a head */
        if (!rope || acc || rope->head_dim % 16 ||
            out_dim != (rope->n_head + 2 * rope->n_kv_head) * rope->head_dim)
            return 0;
        a.rope = *rope;
    } else if (epi != ENG_LIN_PLAIN && epi != ENG_LIN_ADD) {
        return 0;
    }
    if (dtype == ENG_DTYPE_BF16)
        return s_skinny_launch_e<__nv_bfloat16>(st, w, epi, a);
    return s_skinny_launch_e<__half>(st, w, epi, a);
}

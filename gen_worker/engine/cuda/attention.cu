/*  attention.cu - causal GQA attention over the paged KV cache: flash-decoding + prefill.

    Work is cut into tiles, planned on the host once per step (ecu_attn_plan, reused by every
    layer after prepare()): a decode sequence (one query token) gets one tile per fixed split
    of ECU_ATTN_SPLIT cache positions, so how a sequence's context is cut never depends on the
    rest of the batch; a prefill chunk gets tiles of up to ECU_ATTN_QT query tokens over their
    whole causal range. Decode tiles come first in the plan and always run in their own launch
    of the decode kernel, so a decode result is the same bits whatever else is in the batch
    (batch-invariant). Decode kernel: one block per (split, KV head), each warp 32 positions,
    each lane one position for q.k of all G = n_head / n_kv_head heads (q in shared memory),
    then lanes own head dimensions for p.V (coalesced rows of V); the four warps' softmax
    states merge in shared memory. K and V are read straight from the pool, or (the staged
    variant, bf16 and fp8 only) first copied per warp into padded shared-memory rows with
    coalesced cp.async, K and V as two groups so q.k starts while V is in flight; both
    variants do the same arithmetic in the same order and give identical bits, so the
    launcher picks by grid size (ANVIL_CUDA_ATTN_STAGE=0/1 forces one). A decode token's
    splits are merged by the decode kernel itself ("last block finishes"): each block writes
    its unnormalised partial (o, max, sum), fences, and counts itself in on a per-(token, KV
    head) counter (st->attn_count, zeroed when it grows); the block that completes the count
    resets it to 0 for the next launch or graph replay and merges the splits in split order,
    whichever block came last, so a decode-only step is one attention kernel a layer and the
    sum order stays fixed. A token of one split writes its output directly. Prefill kernel:
    K/V chunks of 32 positions widened into shared memory and reused by all rows of the tile
    (tokens x heads), one online softmax per row and warp, one partial per token, normalised
    by the combine kernel, launched over the plan's list of prefill tokens only (over every
    token when G is not 1, 2, 4 or 8 and decode tiles also take the general kernel). A graph
    step (graph.cu) asks for a fixed-size layout instead: every sequence gets the same number
    of split tiles (those past its context are empty, return at once and are never counted),
    so grid sizes and buffer sizes depend only on the batch and context buckets; the tiles
    that do run compute exactly what the ordinary plan computes. The decode and combine
    kernels are launched with PDL (see eng_cuda_internal.h); the decode kernel reads its tile,
    context and block-table entry before the PDL wait (the plan is uploaded before a step's
    first kernel), issues its whole K row (fp8, unstaged) before staging q, and a full warp's
    V rows in batches of 16 (bf16) or 32 (fp8) before the first is used; it triggers its
    dependants at once, which is safe with the merge inside it because a dependant's PDL wait
    returns only when this whole grid has completed.
*/
#include <stdlib.h>
#include <string.h>

#include "eng_cuda_internal.h"

#define ECU_ATTN_SPLIT 128 /* cache positions per decode split (4 warps x 32) */
#define ECU_ATTN_QT 16     /* query tokens per prefill tile */
#define ECU_ATTN_KC 32     /* cache positions per shared-memory chunk */
#define ECU_ATTN_WARPS 4

int ecu_attn_plan(ecu_state_t *st, const eng_attn_batch_t *b, int n_head, int head_dim,
                  const ecu_attn_plan_t **plan_out)
{
    if (!b || b->n_seq <= 0 || !b->q_start || !b->ctx_len || !b->block_tables ||
        b->max_blocks <= 0)
        return -EINVAL;
    if (st->plan_prepared && b->q_start == st->p_qstart && b->ctx_len == st->p_ctx &&
        b->block_tables == st->p_tables && b->n_seq == st->p_nseq &&
        b->max_blocks == st->p_maxblocks) {
        *plan_out = &st->plan;
        return 0;
    }
    st->plan_prepared = 0;
    int n_seq = b->n_seq, n_tok = b->q_start[n_seq], n_tiles = 0, n_parts = 0, q_tile = 1;
    int n_pre = 0; /* tokens of prefill sequences (nq > 1) */
    const int gs = st->graph_splits; /* > 0: the fixed layout of a graph step */
    if (b->q_start[0] != 0 || n_tok <= 0)
        return -EINVAL;
    if (gs > 0) {
        if (n_tok != n_seq)
            return -EINVAL;
        for (int s = 0; s < n_seq; s++)
            if (b->q_start[s] != s || b->ctx_len[s] < 1 ||
                (b->ctx_len[s] + ECU_ATTN_SPLIT - 1) / ECU_ATTN_SPLIT > gs)
                return -EINVAL;
        n_tiles = n_parts = n_seq * gs;
    }
    for (int s = 0; s < n_seq && gs == 0; s++) {
        int nq = b->q_start[s + 1] - b->q_start[s];
        if (nq < 0 || b->ctx_len[s] < nq || (nq > 0 && b->ctx_len[s] <= 0))
            return -EINVAL;
        if (nq == 1) {
            int ns = (b->ctx_len[s] + ECU_ATTN_SPLIT - 1) / ECU_ATTN_SPLIT;
            n_tiles += ns;
            n_parts += ns;
        } else if (nq > 1) {
            n_tiles += (nq + ECU_ATTN_QT - 1) / ECU_ATTN_QT;
            n_parts += nq;
            n_pre += nq;
            q_tile = nq < ECU_ATTN_QT ? (nq > q_tile ? nq : q_tile) : ECU_ATTN_QT;
        }
    }
    size_t words = (size_t)4 * n_tiles + 2 * (size_t)n_tok + (n_seq + 1) + n_seq +
                   (size_t)n_seq * b->max_blocks + n_pre;
    int32_t *h = (int32_t *)malloc(words * sizeof(int32_t));
    if (!h)
        return -ENOMEM;
    int32_t *tiles = h, *tok_part = h + 4 * (size_t)n_tiles, *tok_nsplit = tok_part + n_tok;
    int32_t *qs = tok_nsplit + n_tok, *ctx = qs + n_seq + 1, *tables = ctx + n_seq;
    int32_t *pre = tables + (size_t)n_seq * b->max_blocks;
    int ti = 0, part = 0, pi = 0;
    /* graph layout: gs tiles per sequence, those past its context empty (n_q 0) */
    for (int s = 0; s < n_seq && gs > 0; s++) {
        int ns = (b->ctx_len[s] + ECU_ATTN_SPLIT - 1) / ECU_ATTN_SPLIT;
        for (int k = 0; k < gs; k++, ti++) {
            tiles[4 * ti] = s, tiles[4 * ti + 1] = s, tiles[4 * ti + 2] = k < ns ? 1 : 0;
            tiles[4 * ti + 3] = k;
        }
        tok_part[s] = s * gs, tok_nsplit[s] = ns;
    }
    /* decode tiles first (their own launch), then prefill tiles */
    for (int s = 0; s < n_seq && gs == 0; s++) {
        int q0 = b->q_start[s], nq = b->q_start[s + 1] - q0;
        if (nq == 1) {
            int ns = (b->ctx_len[s] + ECU_ATTN_SPLIT - 1) / ECU_ATTN_SPLIT;
            for (int k = 0; k < ns; k++, ti++) {
                tiles[4 * ti] = s, tiles[4 * ti + 1] = q0, tiles[4 * ti + 2] = 1;
                tiles[4 * ti + 3] = k;
            }
            tok_part[q0] = part, tok_nsplit[q0] = ns;
            part += ns;
        }
    }
    int n_dec = ti;
    for (int s = 0; s < n_seq && gs == 0; s++) {
        int q0 = b->q_start[s], nq = b->q_start[s + 1] - q0;
        if (nq > 1) {
            for (int t0 = 0; t0 < nq; t0 += ECU_ATTN_QT, ti++) {
                tiles[4 * ti] = s, tiles[4 * ti + 1] = q0 + t0;
                tiles[4 * ti + 2] = nq - t0 < ECU_ATTN_QT ? nq - t0 : ECU_ATTN_QT;
                tiles[4 * ti + 3] = 0;
            }
            for (int t = 0; t < nq; t++)
                tok_part[q0 + t] = part++, tok_nsplit[q0 + t] = 1, pre[pi++] = q0 + t;
        }
    }
    memcpy(qs, b->q_start, (size_t)(n_seq + 1) * 4);
    memcpy(ctx, b->ctx_len, (size_t)n_seq * 4);
    memcpy(tables, b->block_tables, (size_t)n_seq * b->max_blocks * 4);
    int rc = ecu_buf_reserve(&st->plan_dev, words * sizeof(int32_t));
    if (rc == 0 && cudaMemcpyAsync(st->plan_dev.ptr, h, words * sizeof(int32_t),
                                   cudaMemcpyHostToDevice, st->stream) != cudaSuccess) {
        ANV_ERROR("cuda: cannot upload the attention plan");
        rc = ANV_EINTERNAL;
    }
    free(h);
    if (rc)
        return rc;
    int32_t *d = (int32_t *)st->plan_dev.ptr;
    ecu_attn_plan_t *p = &st->plan;
    p->n_tiles = n_tiles, p->n_dec_tiles = n_dec, p->n_tok = n_tok, p->n_parts = n_parts, p->n_seq = n_seq;
    p->max_blocks = b->max_blocks, p->q_tile = q_tile, p->n_pre_tok = n_pre;
    p->tiles = (int4 *)d;
    p->tok_part = d + 4 * (size_t)n_tiles;
    p->tok_nsplit = p->tok_part + n_tok;
    p->seq_qstart = p->tok_nsplit + n_tok;
    p->seq_ctx = p->seq_qstart + n_seq + 1;
    p->block_tables = p->seq_ctx + n_seq;
    p->pre_tok = p->block_tables + (size_t)n_seq * b->max_blocks;
    *plan_out = p;
    return 0;
}

/* K/V elements 8 at a time: the raw bits as loaded (16 bytes of bf16, 32 of fp32, 8 of fp8),
   widened to fp32 only when used, so the loads can be issued long before (s_k8_load /
   s_k8_widen); s_ld8 does both at once. */
template <typename T> struct s_k8;
template <> struct s_k8<__nv_bfloat16> {
    uint4 u;
};
template <> struct s_k8<__nv_fp8_e4m3> {
    uint2 u;
};
template <> struct s_k8<float> {
    float4 a, b;
};
static __device__ __forceinline__ void s_k8_load(s_k8<__nv_bfloat16> &r, const __nv_bfloat16 *p)
{
    r.u = *(const uint4 *)p;
}
static __device__ __forceinline__ void s_k8_load(s_k8<__nv_fp8_e4m3> &r, const __nv_fp8_e4m3 *p)
{
    r.u = *(const uint2 *)p;
}
static __device__ __forceinline__ void s_k8_load(s_k8<float> &r, const float *p)
{
    r.a = *(const float4 *)p, r.b = *(const float4 *)(p + 4);
}
static __device__ __forceinline__ void s_k8_widen(const s_k8<__nv_bfloat16> &r, float *o)
{
    const __nv_bfloat162 *h = (const __nv_bfloat162 *)&r.u;
    for (int i = 0; i < 4; i++) {
        float2 f = __bfloat1622float2(h[i]);
        o[2 * i] = f.x, o[2 * i + 1] = f.y;
    }
}
static __device__ __forceinline__ void s_k8_widen(const s_k8<float> &r, float *o)
{
    o[0] = r.a.x, o[1] = r.a.y, o[2] = r.a.z, o[3] = r.a.w, o[4] = r.b.x, o[5] = r.b.y,
    o[6] = r.b.z, o[7] = r.b.w;
}
/* fp8 e4m3 widened two at a time (exact: every e4m3 value is a float) */
static __device__ __forceinline__ float2 s_f8x2(unsigned short u)
{
    __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)u, __NV_E4M3);
    return __half22float2(*(const __half2 *)&h);
}
static __device__ __forceinline__ void s_k8_widen(const s_k8<__nv_fp8_e4m3> &r, float *o)
{
    float2 a = s_f8x2((unsigned short)(r.u.x & 0xffff)), b = s_f8x2((unsigned short)(r.u.x >> 16));
    float2 c = s_f8x2((unsigned short)(r.u.y & 0xffff)), d = s_f8x2((unsigned short)(r.u.y >> 16));
    o[0] = a.x, o[1] = a.y, o[2] = b.x, o[3] = b.y, o[4] = c.x, o[5] = c.y, o[6] = d.x,
    o[7] = d.y;
}
/* Two 8-element groups of an fp8 K row with one 16-byte load: each load instruction of a
   decode warp touches 32 rows, so half as many loads is half the L1 requests (ncu, batch 256
   at 2k context: L1 "Mem Busy" 75 % with DRAM at 31 % when fp8 rows took 8 bytes a load). */
static __device__ __forceinline__ void s_k16_load(s_k8<__nv_fp8_e4m3> *r, const __nv_fp8_e4m3 *p)
{
    const uint4 u = *(const uint4 *)p;
    r[0].u = make_uint2(u.x, u.y);
    r[1].u = make_uint2(u.z, u.w);
}
template <typename T> static __device__ __forceinline__ void s_ld8(const T *p, float *o)
{
    s_k8<T> r;
    s_k8_load(r, p);
    s_k8_widen(r, o);
}

template <int HD, int RPW, typename T>
static __global__ void __launch_bounds__(ECU_ATTN_WARPS * 32)
    s_attn_kernel(const float *q /* (n_tok, n_head, HD) f32 */,
                  const T *k_cache, const T *v_cache /* (n_blocks, bs, n_kv, HD) T */,
                  const int4 *tiles /* (n_tiles) {seq, tok0, n_q, split} */,
                  const int *tok_part /* (n_tok) */, const int *seq_qstart /* (n_seq + 1) */,
                  const int *seq_ctx /* (n_seq) */, const int *block_tables /* (n_seq, mb) */,
                  int max_blocks, int block_size, int n_head, int n_kv_head, float scale,
                  float *part_o /* (n_parts, n_head, HD) f32 */,
                  float2 *part_ml /* (n_parts, n_head) {max, sum} */)
{
    extern __shared__ float smem[];
    float *ks = smem;                                /* (KC, HD + 1) */
    float *vs = ks + ECU_ATTN_KC * (HD + 1);         /* (KC, HD) */
    float *qs = vs + ECU_ATTN_KC * HD;               /* (WARPS * RPW, HD) */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int4 tl = tiles[blockIdx.x];
    const int kvh = blockIdx.y, G = n_head / n_kv_head;
    const int seq = tl.x, tok0 = tl.y, nq = tl.z, split = tl.w;
    const int q0 = seq_qstart[seq], nq_seq = seq_qstart[seq + 1] - q0;
    const int pos0 = seq_ctx[seq] - nq_seq + (tok0 - q0);
    const int last = pos0 + nq - 1;
    const bool decode = nq_seq == 1;
    const int key_begin = decode ? split * ECU_ATTN_SPLIT : 0;
    const int key_end = decode ? min(key_begin + ECU_ATTN_SPLIT, last + 1) : last + 1;
    const int *table = block_tables + (size_t)seq * max_blocks;
    const size_t kv_row = (size_t)n_kv_head * HD;
    const int rows = nq * G;
    constexpr int PER = HD / 32;

    for (int row0 = 0; row0 < rows; row0 += ECU_ATTN_WARPS * RPW) {
        __syncthreads();
        for (int idx = threadIdx.x; idx < ECU_ATTN_WARPS * RPW * HD; idx += blockDim.x) {
            int r = row0 + idx / HD, d = idx % HD;
            float v = 0.0f;
            if (r < rows) {
                int t = tok0 + r / G, h = kvh * G + r % G;
                v = q[((size_t)t * n_head + h) * HD + d] * scale;
            }
            qs[idx] = v;
        }
        float o[RPW][PER], m[RPW], l[RPW];
#pragma unroll
        for (int i = 0; i < RPW; i++) {
            m[i] = -INFINITY, l[i] = 0.0f;
#pragma unroll
            for (int d = 0; d < PER; d++)
                o[i][d] = 0.0f;
        }
        for (int c0 = key_begin; c0 < key_end; c0 += ECU_ATTN_KC) {
            __syncthreads();
            for (int idx = threadIdx.x; idx < ECU_ATTN_KC * HD / 8; idx += blockDim.x) {
                int j = idx / (HD / 8), d = (idx % (HD / 8)) * 8, c = c0 + j;
                float kf[8], vf[8];
                if (c < key_end) {
                    size_t slot = (size_t)table[c / block_size] * block_size + c % block_size;
                    size_t off = slot * kv_row + (size_t)kvh * HD + d;
                    s_ld8(k_cache + off, kf);
                    s_ld8(v_cache + off, vf);
                } else {
                    for (int e = 0; e < 8; e++)
                        kf[e] = 0.0f, vf[e] = 0.0f;
                }
                for (int e = 0; e < 8; e++) {
                    ks[j * (HD + 1) + d + e] = kf[e];
                    vs[j * HD + d + e] = vf[e];
                }
            }
            __syncthreads();
            const int key = c0 + lane;
#pragma unroll
            for (int i = 0; i < RPW; i++) {
                const int rl = warp + ECU_ATTN_WARPS * i, r = row0 + rl;
                if (r >= rows)
                    continue; /* warp-uniform */
                const int pos = pos0 + r / G;
                const float *qr = qs + rl * HD;
                float s = 0.0f;
#pragma unroll 16
                for (int d = 0; d < HD; d++)
                    s += qr[d] * ks[lane * (HD + 1) + d];
                bool valid = key < key_end && key <= pos;
                s = valid ? s : -INFINITY;
                float m_new = fmaxf(m[i], ecu_warp_max(s));
                if (m_new == -INFINITY)
                    continue;
                float p = valid ? __expf(s - m_new) : 0.0f;
                float alpha = __expf(m[i] - m_new); /* 0 when m was -inf */
                l[i] = l[i] * alpha + ecu_warp_sum(p);
#pragma unroll
                for (int d = 0; d < PER; d++)
                    o[i][d] *= alpha;
#pragma unroll 8
                for (int j = 0; j < ECU_ATTN_KC; j++) {
                    float pj = __shfl_sync(0xffffffffu, p, j);
#pragma unroll
                    for (int d = 0; d < PER; d++)
                        o[i][d] += pj * vs[j * HD + lane + 32 * d];
                }
                m[i] = m_new;
            }
        }
#pragma unroll
        for (int i = 0; i < RPW; i++) {
            const int r = row0 + warp + ECU_ATTN_WARPS * i;
            if (r >= rows)
                continue;
            int t = tok0 + r / G, h = kvh * G + r % G;
            size_t pi = (size_t)(tok_part[t] + (decode ? split : 0)) * n_head + h;
#pragma unroll
            for (int d = 0; d < PER; d++)
                part_o[pi * HD + lane + 32 * d] = o[i][d];
            if (lane == 0)
                part_ml[pi] = make_float2(m[i], l[i]);
        }
    }
}

/* PER elements of a V row (PER = HD / 32: 2 or 4), raw as loaded and widened to fp32 when
   used (s_vp_load / s_vp_widen), as s_k8 for K. */
template <int PER, typename T> struct s_vp;
template <> struct s_vp<4, __nv_bfloat16> {
    uint2 u;
};
template <> struct s_vp<2, __nv_bfloat16> {
    unsigned int u;
};
template <> struct s_vp<4, __nv_fp8_e4m3> {
    unsigned int u;
};
template <> struct s_vp<2, __nv_fp8_e4m3> {
    unsigned short u;
};
template <> struct s_vp<4, float> {
    float4 u;
};
template <> struct s_vp<2, float> {
    float2 u;
};
template <int PER, typename T>
static __device__ __forceinline__ void s_vp_load(s_vp<PER, T> &r, const T *p)
{
    r.u = *(const decltype(r.u) *)p;
}
static __device__ __forceinline__ void s_vp_widen(const s_vp<4, __nv_bfloat16> &r, float *o)
{
    float2 a = __bfloat1622float2(*(const __nv_bfloat162 *)&r.u.x);
    float2 b = __bfloat1622float2(*(const __nv_bfloat162 *)&r.u.y);
    o[0] = a.x, o[1] = a.y, o[2] = b.x, o[3] = b.y;
}
static __device__ __forceinline__ void s_vp_widen(const s_vp<2, __nv_bfloat16> &r, float *o)
{
    float2 a = __bfloat1622float2(*(const __nv_bfloat162 *)&r.u);
    o[0] = a.x, o[1] = a.y;
}
static __device__ __forceinline__ void s_vp_widen(const s_vp<4, __nv_fp8_e4m3> &r, float *o)
{
    float2 a = s_f8x2((unsigned short)(r.u & 0xffff)), b = s_f8x2((unsigned short)(r.u >> 16));
    o[0] = a.x, o[1] = a.y, o[2] = b.x, o[3] = b.y;
}
static __device__ __forceinline__ void s_vp_widen(const s_vp<2, __nv_fp8_e4m3> &r, float *o)
{
    float2 a = s_f8x2(r.u);
    o[0] = a.x, o[1] = a.y;
}
static __device__ __forceinline__ void s_vp_widen(const s_vp<4, float> &r, float *o)
{
    o[0] = r.u.x, o[1] = r.u.y, o[2] = r.u.z, o[3] = r.u.w;
}
static __device__ __forceinline__ void s_vp_widen(const s_vp<2, float> &r, float *o)
{
    o[0] = r.u.x, o[1] = r.u.y;
}

/* o[g][.] += p(key j, head g) * V row j, for the lane's PER dimensions */
template <int G, int PER, typename T>
static __device__ __forceinline__ void s_pv_acc(float (&o)[G][PER], const s_vp<PER, T> &raw,
                                                const float (&pr)[G], int j)
{
    float vf[PER];
    s_vp_widen(raw, vf);
#pragma unroll
    for (int g = 0; g < G; g++) {
        float pj = __shfl_sync(0xffffffffu, pr[g], j);
#pragma unroll
        for (int e = 0; e < PER; e++)
            o[g][e] += pj * vf[e];
    }
}

/* q.k of one 8-element group of K for the G heads: sc[g] += q[g][d, d + 8) . k. Both decode
   variants call this one helper, so their scores round identically. */
template <int HD, int G>
static __device__ __forceinline__ void s_qk8(float (&sc)[G], const float (&qs)[G][HD], int d,
                                             const float *kf)
{
#pragma unroll
    for (int g = 0; g < G; g++) {
        const float4 a = *(const float4 *)&qs[g][d], b = *(const float4 *)&qs[g][d + 4];
        sc[g] += a.x * kf[0] + a.y * kf[1] + a.z * kf[2] + a.w * kf[3] + b.x * kf[4] +
                 b.y * kf[5] + b.z * kf[6] + b.w * kf[7];
    }
}

/* cp.async (sm_80+): 16 bytes global -> shared without passing through registers (nor L1:
   .cg), then commit / wait by groups. Each thread waits for its own copies; a barrier
   (__syncwarp / __syncthreads) makes them visible to the other threads. */
static __device__ __forceinline__ void s_cp_async16(void *smem, const void *gmem)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
static __device__ __forceinline__ void s_cp_commit()
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N> static __device__ __forceinline__ void s_cp_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* Bytes from one staged K or V row to the next in shared memory: the raw row plus 16, so
   that eight lanes reading 16 bytes each of eight consecutive rows (one wavefront of an
   LDS.128) hit eight different 16-byte bank groups (row strides 272, 144 or 80 bytes). */
template <int HD, typename T> __host__ __device__ constexpr int s_stage_stride()
{
    return HD * (int)sizeof(T) + 16;
}
/* Dynamic shared memory of the staged decode kernel: K then V, ECU_ATTN_SPLIT rows each. */
template <int HD, typename T> __host__ __device__ constexpr size_t s_stage_smem()
{
    return (size_t)2 * ECU_ATTN_SPLIT * s_stage_stride<HD, T>();
}

/* A warp's 32 cache rows (its positions key_begin + 32 warp + j, j < nvalid) of one KV head
   into shared memory with cp.async: consecutive lanes copy consecutive 16-byte pieces of a
   row, so each instruction moves 32 x 16 contiguous-per-row bytes (coalesced); the slot of
   row j is lane j's `slot`. Rows j >= nvalid are not copied (and never read). */
template <int HD, typename T>
static __device__ __forceinline__ void s_stage_rows(unsigned char *dst /* (32, stride) shared */,
                                                    const T *src /* cache + kvh * HD */,
                                                    int slot, int nvalid, size_t kv_row,
                                                    int lane)
{
    constexpr int PIECES = HD * (int)sizeof(T) / 16, RPI = 32 / PIECES;
    constexpr int SRB = s_stage_stride<HD, T>();
    const int c = lane % PIECES;
#pragma unroll
    for (int j0 = 0; j0 < 32; j0 += RPI) {
        const int j = j0 + lane / PIECES;
        const int sj = __shfl_sync(0xffffffffu, slot, j);
        if (j < nvalid)
            s_cp_async16(dst + j * SRB + c * 16,
                         (const unsigned char *)(src + (size_t)sj * kv_row) + c * 16);
    }
}

/* The end of a decode block whose token has several splits, after its partial is written:
   the "last block finishes" pattern. Every thread fences its partial writes at device scope,
   the block meets at a barrier and thread 0 (fencing again: a cumulative release of what the
   barrier ordered before it) counts the block in on count[tok, kvh]. The block that brings
   the count to ns is the last of the token's splits: it sets the count back to 0 (every
   other block of the token has already counted, and the next launch or graph replay touches
   it only after this grid has completed), fences (acquire), and merges the ns partials of the
   G heads exactly in split order, whichever block arrived last: max of the m_i, weights
   w_i = exp(m_i - max) (0 for an empty partial), out = sum_i o_i w_i / sum_i l_i w_i (0 when
   the sum is 0). The partials of other blocks are read with ld.global.cg (L2, the point of
   coherence), never through the non-coherent path. No block waits for another, so the
   pattern cannot deadlock whatever the residency. The weights of 32 splits at a time sit in
   shared memory (wt, G x 32); sum_i l_i w_i is a warp sum over lanes striding the splits, a
   fixed order for a given ns. */
template <int HD, int G>
static __device__ __forceinline__ void
s_attn_decode_finish(float *out /* (n_tok, n_head, HD) f32 */,
                     const float *part_o /* (n_parts, n_head, HD) f32 */,
                     const float2 *part_ml /* (n_parts, n_head) {max, sum} */,
                     int *count /* (n_tok, n_kv_head) int32 */, int tok, int kvh, int part0,
                     int ns, int n_head, int n_kv_head, float *wt /* (G, 32) shared */,
                     float *mrg_m, float *mrg_s /* (G) shared */, int *is_last /* shared */)
{
    constexpr int NT = ECU_ATTN_WARPS * 32, NA = (G * HD + NT - 1) / NT;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __threadfence(); /* this thread's partial, visible device-wide before the count */
    __syncthreads();
    if (threadIdx.x == 0) {
        int *c = count + (size_t)tok * n_kv_head + kvh;
        __threadfence();
        const bool last = atomicAdd(c, 1) == ns - 1;
        if (last) {
            atomicExch(c, 0);
            __threadfence();
        }
        *is_last = last;
    }
    __syncthreads();
    if (!*is_last)
        return; /* block-uniform */

    /* per head (one warp each): max and sum over the splits; the first 32 weights kept */
    for (int g = warp; g < G; g += ECU_ATTN_WARPS) {
        const float2 *ml = part_ml + (size_t)part0 * n_head + kvh * G + g; /* split i: i * n_head */
        const float2 f = lane < ns ? __ldcg(ml + (size_t)lane * n_head)
                                   : make_float2(-INFINITY, 0.0f);
        float mx = f.x;
        for (int i = lane + 32; i < ns; i += 32)
            mx = fmaxf(mx, __ldcg(ml + (size_t)i * n_head).x);
        mx = ecu_warp_max(mx);
        const float w = f.x == -INFINITY ? 0.0f : __expf(f.x - mx);
        float sum = f.y * w;
        for (int i = lane + 32; i < ns; i += 32) {
            const float2 v = __ldcg(ml + (size_t)i * n_head);
            sum += v.y * (v.x == -INFINITY ? 0.0f : __expf(v.x - mx));
        }
        wt[g * 32 + lane] = w;
        sum = ecu_warp_sum(sum);
        if (lane == 0)
            mrg_m[g] = mx, mrg_s[g] = sum;
    }
    /* o: thread = (head, dimension) pairs, the splits summed in order */
    float acc[NA];
#pragma unroll
    for (int a = 0; a < NA; a++)
        acc[a] = 0.0f;
    const size_t stride = (size_t)n_head * HD; /* from one split's partial to the next */
    for (int c0 = 0; c0 < ns; c0 += 32) {
        const int nc = min(32, ns - c0);
        if (c0 > 0) {
            __syncthreads(); /* the previous 32 weights are used up */
            for (int i = threadIdx.x; i < G * 32; i += NT) {
                const int g = i / 32, k = i % 32;
                if (k < nc) {
                    const float2 v =
                        __ldcg(part_ml + (size_t)(part0 + c0 + k) * n_head + kvh * G + g);
                    wt[i] = v.x == -INFINITY ? 0.0f : __expf(v.x - mrg_m[g]);
                }
            }
        }
        __syncthreads();
        /* element idx = g * HD + d of split c0 + k at po + idx + k * stride */
        const float *po = part_o + ((size_t)(part0 + c0) * n_head + kvh * G) * HD + threadIdx.x;
#pragma unroll 2
        for (int k = 0; k < nc; k++, po += stride) {
#pragma unroll
            for (int a = 0; a < NA; a++) {
                const int idx = threadIdx.x + a * NT;
                if (idx >= G * HD)
                    break; /* HD 64, G 1 only */
                acc[a] += __ldcg(po + a * NT) * wt[idx / HD * 32 + k];
            }
        }
    }
#pragma unroll
    for (int a = 0; a < NA; a++) {
        const int idx = threadIdx.x + a * NT, g = idx / HD, d = idx % HD;
        if (idx >= G * HD)
            break;
        const float s = mrg_s[g];
        out[((size_t)tok * n_head + kvh * G + g) * HD + d] = s > 0.0f ? acc[a] / s : 0.0f;
    }
}

/* Decode: one block per (split of ECU_ATTN_SPLIT positions, KV head) of one decode token,
   the token's splits merged by whichever of its blocks finishes last (s_attn_decode_finish),
   so a decode-only step runs one attention kernel a layer. STAGE = false reads K and V
   straight from the pool (lane = one row for q.k, uncoalesced); STAGE = true first copies
   each warp's 32 K rows, then its 32 V rows, into shared memory with coalesced cp.async
   (two commit groups: q.k starts once K has landed while V is still in flight) and reads
   them from there. The arithmetic is the same in both, in the same order (q.k: lane = one
   position, dimensions in order, s_qk8; p.v: lane = PER dimensions, rows in order,
   s_pv_acc; the warps merged in a fixed order), so both variants give identical bits and
   the launcher may pick either by batch size without breaking batch invariance. Only bf16
   and fp8 are staged (an f32 split would need 2 x 64 KB). */
template <int HD, int G, typename T, bool STAGE>
static __global__ void __launch_bounds__(ECU_ATTN_WARPS * 32)
    s_attn_decode_kernel(float *out /* (n_tok, n_head, HD) f32 */,
                         const float *q /* (n_tok, n_head, HD) f32 */,
                         const T *k_cache, const T *v_cache /* (n_blocks, bs, n_kv, HD) T */,
                         const int4 *tiles /* (n_dec_tiles) {seq, tok, n_q 1 or 0, split} */,
                         const int *tok_part /* (n_tok) */, const int *tok_nsplit /* (n_tok) */,
                         const int *seq_ctx /* (n_seq) */,
                         const int *block_tables /* (n_seq, mb) */, int max_blocks,
                         int block_size, int n_head, int n_kv_head, float scale,
                         float *part_o /* (n_parts, n_head, HD) f32 */,
                         float2 *part_ml /* (n_parts, n_head) {max, sum} */,
                         int *count /* (n_tok, n_kv_head) int32, all 0 between launches */)
{
    static_assert(!STAGE || sizeof(T) <= 2, "f32 K/V is not staged");
    static_assert(G <= 8, "the merge weights (G x 32) and wo must fit the staged rows");
    constexpr int PER = HD / 32, SRB = s_stage_stride<HD, T>();
    /* STAGE: K rows (ECU_ATTN_SPLIT, SRB) then V rows (same), raw T; warp w owns rows
       [32 w, 32 w + 32) of each, and wo lives here once they are used up */
    extern __shared__ __align__(16) unsigned char s_kv_stage[];
    __shared__ __align__(16) float qs[G][HD];
    __shared__ float wm[ECU_ATTN_WARPS][G], wl[ECU_ATTN_WARPS][G];
    __shared__ __align__(16) float wo_own[STAGE ? 1 : ECU_ATTN_WARPS][G][HD];
    __shared__ int tok_info[4], is_last; /* {ns, part0, tok, split}: see below */
    float(*wo)[G][HD] = STAGE ? (float(*)[G][HD])s_kv_stage : wo_own; /* (WARPS, G, HD) */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    /* The next kernel (the O projection) may be launched now: it calls ecu_pdl_wait()
       before it reads `out`, and griddepcontrol.wait returns only once this whole grid has
       completed and its writes are visible, the last blocks' merges included; an early
       trigger only lets its blocks be scheduled while this grid drains. */
    ecu_pdl_trigger();
    /* The plan (tiles, splits, contexts, block tables) was uploaded before the step's first
       kernel, so it is read before the PDL wait: the chain tile -> context -> table -> cache
       row overlaps the kernel before, and after the wait only the cache and q remain (at
       batch 1 a block's time is its chain of dependent round trips, not bandwidth). */
    const int4 tl = tiles[blockIdx.x];
    if (tl.z == 0)
        return; /* an empty tile of a graph step's fixed layout (block-uniform): not counted */
    const int kvh = blockIdx.y, seq = tl.x, tok = tl.y, split = tl.w;
    int ns_early = 0, part0_early = 0; /* tok_nsplit[tok], tok_part[tok] */
    if constexpr (G < 8)
        ns_early = tok_nsplit[tok], part0_early = tok_part[tok];
    const int key_begin = split * ECU_ATTN_SPLIT;
    const int key_end = min(key_begin + ECU_ATTN_SPLIT, seq_ctx[seq]);
    const int *table = block_tables + (size_t)seq * max_blocks;
    const size_t kv_row = (size_t)n_kv_head * HD;
    const int wbase = key_begin + warp * 32, key = wbase + lane;
    const bool valid = key < key_end;
    const int nvalid = max(0, min(32, key_end - wbase)); /* the warp's rows */
    const int pos = valid ? table[key / block_size] * block_size + key % block_size : 0;
    const T *kr = k_cache + (size_t)pos * kv_row + (size_t)kvh * HD;
    ecu_pdl_wait(); /* the cache rows of this step and q are written by the kernels before */

    if constexpr (STAGE) {
        unsigned char *kst = s_kv_stage + warp * 32 * SRB;
        s_stage_rows<HD, T>(kst, k_cache + (size_t)kvh * HD, pos, nvalid, kv_row, lane);
        s_cp_commit();
        s_stage_rows<HD, T>(kst + ECU_ATTN_SPLIT * SRB, v_cache + (size_t)kvh * HD, pos, nvalid,
                            kv_row, lane);
        s_cp_commit();
    }
    /* q.k: lane = one cache position. Unstaged, an fp8 K row (32 registers) is loaded whole
       before q is staged, so the two round trips overlap; wider rows are loaded as they are
       used (a preloaded bf16 row took the kernel to 168 registers, 3 blocks an SM: batch 256
       at 2k slowed from 28.5 to 31.0 ms of attention a step on the H200) */
    constexpr bool PRE = !STAGE && sizeof(T) == 1;
    s_k8<T> kraw[PRE ? HD / 8 : 1];
    if constexpr (PRE) {
        if (valid) {
#pragma unroll
            for (int i = 0; i < HD / 16; i++)
                s_k16_load(kraw + 2 * i, kr + 16 * i);
        }
    }
    for (int idx = threadIdx.x; idx < G * HD; idx += blockDim.x)
        qs[idx / HD][idx % HD] =
            q[((size_t)tok * n_head + kvh * G + idx / HD) * HD + idx % HD] * scale;
    /* What the end needs of the token (G < 8) waits in shared memory, not in registers
       across the peak of the kernel: bf16 hd128 G 4 at 76 registers, not 92. For G = 8 ptxas
       did better (no spills at hd128) with the two reads at the end instead (measured with
       ptxas -v only: register allocation here is sensitive to small changes). */
    if (G < 8 && threadIdx.x == 0)
        tok_info[0] = ns_early, tok_info[1] = part0_early, tok_info[2] = tok,
        tok_info[3] = split;
    __syncthreads();
    float sc[G];
#pragma unroll
    for (int g = 0; g < G; g++)
        sc[g] = 0.0f;
    if constexpr (STAGE) {
        s_cp_wait<1>(); /* this thread's K pieces (the V group may still be in flight) */
        __syncwarp();   /* ... and the rest of the warp's: row `lane` came from other lanes */
        if (valid) {
            const T *ks = (const T *)(s_kv_stage + (warp * 32 + lane) * SRB);
#pragma unroll
            for (int d = 0; d < HD; d += 16) {
                s_k8<T> r[2];
                float kf[8];
                if constexpr (sizeof(T) == 1) {
                    s_k16_load(r, ks + d);
                } else {
                    s_k8_load(r[0], ks + d);
                    s_k8_load(r[1], ks + d + 8);
                }
                s_k8_widen(r[0], kf);
                s_qk8<HD, G>(sc, qs, d, kf);
                s_k8_widen(r[1], kf);
                s_qk8<HD, G>(sc, qs, d + 8, kf);
            }
        }
    } else if (valid) {
#pragma unroll
        for (int d = 0; d < HD; d += 8) {
            float kf[8];
            if constexpr (PRE)
                s_k8_widen(kraw[d / 8], kf);
            else
                s_ld8(kr + d, kf);
            s_qk8<HD, G>(sc, qs, d, kf);
        }
    }
    float m[G], l[G], pr[G];
#pragma unroll
    for (int g = 0; g < G; g++) {
        float sv = valid ? sc[g] : -INFINITY;
        m[g] = ecu_warp_max(sv);
        pr[g] = valid ? __expf(sv - m[g]) : 0.0f;
        l[g] = ecu_warp_sum(pr[g]);
    }

    /* p.v: lane = PER head dimensions, rows in order. Unstaged, rows of V are read whole by
       the warp; a full warp of 1- or 2-byte rows issues its rows' loads in batches of VB
       before the first is used (one or two round trips, not four); the same sums in the
       same order as the row-by-row loop of the rest. */
    float o[G][PER];
#pragma unroll
    for (int g = 0; g < G; g++)
#pragma unroll
        for (int e = 0; e < PER; e++)
            o[g][e] = 0.0f;
    if constexpr (STAGE) {
        s_cp_wait<0>();
        __syncwarp();
        const unsigned char *vs =
            s_kv_stage + (ECU_ATTN_SPLIT + warp * 32) * SRB + lane * PER * sizeof(T);
#pragma unroll 8
        for (int j = 0; j < nvalid; j++) {
            s_vp<PER, T> raw;
            raw.u = *(const decltype(raw.u) *)(vs + j * SRB);
            s_pv_acc<G, PER, T>(o, raw, pr, j);
        }
        __syncthreads(); /* wo overlays the staged rows, which other warps may still read */
    } else {
        const T *vc = v_cache + (size_t)kvh * HD + lane * PER;
        int j0 = 0;
        if constexpr (sizeof(T) <= 2) {
            /* VB rows in flight at once: 32 rows of fp8 or 16 of bf16, 32 registers either
               way */
            constexpr int VB = sizeof(T) == 1 ? 32 : 16;
            if (nvalid == 32) {
#pragma unroll
                for (int jb = 0; jb < 32; jb += VB) {
                    s_vp<PER, T> vraw[VB];
#pragma unroll
                    for (int j = 0; j < VB; j++)
                        s_vp_load(vraw[j],
                                  vc + (size_t)__shfl_sync(0xffffffffu, pos, jb + j) * kv_row);
#pragma unroll
                    for (int j = 0; j < VB; j++)
                        s_pv_acc<G, PER, T>(o, vraw[j], pr, jb + j);
                }
                j0 = 32;
            }
        }
#pragma unroll 8
        for (int j = j0; j < nvalid; j++) {
            s_vp<PER, T> raw;
            s_vp_load(raw, vc + (size_t)__shfl_sync(0xffffffffu, pos, j) * kv_row);
            s_pv_acc<G, PER, T>(o, raw, pr, j);
        }
    }
#pragma unroll
    for (int g = 0; g < G; g++) {
        if (lane == 0)
            wm[warp][g] = nvalid > 0 ? m[g] : -INFINITY, wl[warp][g] = l[g];
#pragma unroll
        for (int e = 0; e < PER; e++)
            wo[warp][g][lane * PER + e] = o[g][e];
    }
    __syncthreads();
    const int ns = G < 8 ? tok_info[0] : tok_nsplit[tok], part0 = G < 8 ? tok_info[1] : tok_part[tok];
    const int tok_e = G < 8 ? tok_info[2] : tok, split_e = G < 8 ? tok_info[3] : split;
    /* merge the warps in a fixed order; a token of one split is done here (normalised,
       straight into out: the same bits the merge of one partial would give, w = 1) */
    for (int idx = threadIdx.x; idx < G * HD; idx += blockDim.x) {
        int g = idx / HD, d = idx % HD;
        float mx = -INFINITY;
#pragma unroll
        for (int w = 0; w < ECU_ATTN_WARPS; w++)
            mx = fmaxf(mx, wm[w][g]);
        float acc = 0.0f, sum = 0.0f;
#pragma unroll
        for (int w = 0; w < ECU_ATTN_WARPS; w++) {
            if (wm[w][g] == -INFINITY)
                continue;
            float f = __expf(wm[w][g] - mx);
            acc += wo[w][g][d] * f;
            sum += wl[w][g] * f;
        }
        const int h = kvh * G + g;
        if (ns == 1) {
            out[((size_t)tok_e * n_head + h) * HD + d] = sum > 0.0f ? acc / sum : 0.0f;
        } else {
            size_t pi = (size_t)(part0 + split_e) * n_head + h;
            part_o[pi * HD + d] = acc;
            if (d == 0)
                part_ml[pi] = make_float2(mx, sum);
        }
    }
    if (ns == 1)
        return; /* block-uniform; such a token's only tile never touches the count */
    /* wt and mrg_m / mrg_s overlay wo and the warps' states, used up past the finish's
       first barrier */
    s_attn_decode_finish<HD, G>(out, part_o, part_ml, count, tok_e, kvh, part0, ns, n_head,
                                n_kv_head, &wo[0][0][0], wm[0], wl[0], &is_last);
}

#define ECU_ATTN_CHUNK 128 /* splits whose weights the combine holds in shared memory at once */

/* The partials of the tokens the decode kernel does not merge itself (prefill tokens, one
   partial each; every token when decode tiles ran in the general kernel): one block
   (blockDim.x = head_dim, a multiple of 32) per (listed token, head): the max over the
   token's splits, then each chunk of splits' weights exp(m_i - max) once into shared memory
   (not once per dimension), the weighted partials summed in split order and normalised by
   the sum of l_i * weight_i (a block sum: fixed order for a given number of splits). Only
   the listed tokens' rows of out are written. */
static __global__ void s_attn_combine_kernel(float *out /* (n_tok, n_head, hd) f32 */,
                                             const float *part_o /* (n_parts, n_head, hd) */,
                                             const float2 *part_ml /* (n_parts, n_head) */,
                                             const int *tok_list /* (grid.x) or NULL: all */,
                                             const int *tok_part, const int *tok_nsplit,
                                             int n_head, int head_dim)
{
    __shared__ float wt[ECU_ATTN_CHUNK], red[32];
    ecu_pdl_trigger();
    const int t = tok_list ? tok_list[blockIdx.x] : (int)blockIdx.x, h = blockIdx.y;
    const int d = threadIdx.x;
    const int base = tok_part[t], ns = tok_nsplit[t];
    ecu_pdl_wait();
    float mx = -INFINITY;
    for (int i = d; i < ns; i += blockDim.x)
        mx = fmaxf(mx, part_ml[(size_t)(base + i) * n_head + h].x);
    mx = ecu_block_max(mx, red);
    float sum = 0.0f, acc = 0.0f;
    for (int c0 = 0; c0 < ns; c0 += ECU_ATTN_CHUNK) {
        const int nc = min(ECU_ATTN_CHUNK, ns - c0);
        __syncthreads(); /* the previous chunk's weights are used up */
        for (int i = d; i < nc; i += blockDim.x) {
            const float2 ml = part_ml[(size_t)(base + c0 + i) * n_head + h];
            const float w = ml.x == -INFINITY ? 0.0f : __expf(ml.x - mx);
            wt[i] = w;
            sum += ml.y * w;
        }
        __syncthreads();
        const float *po = part_o + ((size_t)(base + c0) * n_head + h) * head_dim + d;
        const size_t stride = (size_t)n_head * head_dim;
#pragma unroll 4
        for (int i = 0; i < nc; i++)
            acc += po[i * stride] * wt[i];
    }
    sum = ecu_block_sum(sum, red);
    out[((size_t)t * n_head + h) * head_dim + d] = sum > 0.0f ? acc / sum : 0.0f;
}

template <int HD, int RPW, typename T>
static int s_attn_launch_one(ecu_state_t *st, const ecu_attn_plan_t *p, int t0, int nt,
                             const float *q, const void *kc, const void *vc, int n_head,
                             int n_kv_head, int block_size)
{
    size_t smem = (size_t)(ECU_ATTN_KC * (HD + 1) + ECU_ATTN_KC * HD +
                           ECU_ATTN_WARPS * RPW * HD) * sizeof(float);
    static bool attr_set = false; /* per instantiation */
    if (!attr_set) {
        ECU_CHECK(cudaFuncSetAttribute(s_attn_kernel<HD, RPW, T>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        attr_set = true;
    }
    dim3 grid(nt, n_kv_head);
    s_attn_kernel<HD, RPW, T><<<grid, ECU_ATTN_WARPS * 32, smem, st->stream>>>(
        q, (const T *)kc, (const T *)vc, p->tiles + t0, p->tok_part, p->seq_qstart, p->seq_ctx,
        p->block_tables, p->max_blocks, block_size, n_head, n_kv_head,
        1.0f / sqrtf((float)HD), (float *)st->part_o.ptr, (float2 *)st->part_ml.ptr);
    ECU_LAUNCHED();
    return 0;
}

/* The general kernel over tiles [t0, t0 + nt) whose tiles hold at most `rows` rows. */
template <int HD, typename T>
static int s_attn_launch_rows(ecu_state_t *st, const ecu_attn_plan_t *p, int t0, int nt,
                              int rows, const float *q, const void *kc, const void *vc,
                              int n_head, int n_kv_head, int block_size)
{
    int rpw = (rows + ECU_ATTN_WARPS - 1) / ECU_ATTN_WARPS;
    if (rpw <= 1)
        return s_attn_launch_one<HD, 1, T>(st, p, t0, nt, q, kc, vc, n_head, n_kv_head,
                                           block_size);
    if (rpw <= 4)
        return s_attn_launch_one<HD, 4, T>(st, p, t0, nt, q, kc, vc, n_head, n_kv_head,
                                           block_size);
    return s_attn_launch_one<HD, 16, T>(st, p, t0, nt, q, kc, vc, n_head, n_kv_head, block_size);
}

/* ANVIL_CUDA_ATTN_STAGE: 0 = unstaged decode kernel, 1 = staged (bf16 and fp8 KV), unset =
   by the rule of s_attn_launch_decode. Read once. */
static int s_attn_stage_env_read(void)
{
    const char *e = getenv("ANVIL_CUDA_ATTN_STAGE");
    if (!e || !*e)
        return -1;
    if ((e[0] == '0' || e[0] == '1') && !e[1]) {
        ANV_INFO("cuda attention: ANVIL_CUDA_ATTN_STAGE=%s (staged decode kernel %s)", e,
                 e[0] == '1' ? "on for bf16 and fp8 KV" : "off");
        return e[0] - '0';
    }
    ANV_WARN("cuda attention: ANVIL_CUDA_ATTN_STAGE '%s' is neither 0 nor 1: chosen by batch",
             e);
    return -1;
}
static int s_attn_stage_env(void)
{
    static const int v = s_attn_stage_env_read();
    return v;
}

/* Once per instantiation of the staged decode kernel: lifts its dynamic shared memory limit
   past the default 48 KB where it needs more (bf16 at head_dim 128: 68 KB), and returns how
   many of its blocks an SM holds (0: not usable, logged). */
template <int HD, int G, typename T>
static int s_attn_stage_setup(void)
{
    const int smem = (int)s_stage_smem<HD, T>();
    void (*kern)(float *, const float *, const T *, const T *, const int4 *, const int *,
                 const int *, const int *, const int *, int, int, int, int, float, float *,
                 float2 *, int *) = s_attn_decode_kernel<HD, G, T, true>;
    cudaError_t e = cudaSuccess;
    if (smem > 48 * 1024)
        e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    int occ = 0;
    if (e == cudaSuccess)
        e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kern, ECU_ATTN_WARPS * 32, smem);
    if (e != cudaSuccess || occ <= 0) {
        ANV_WARN("cuda attention: staged decode kernel (head_dim %d, %d heads a KV head, %zu-byte "
                 "KV) not usable: %s",
                 HD, G, sizeof(T), e != cudaSuccess ? cudaGetErrorString(e) : "no residency");
        cudaGetLastError();
        return 0;
    }
    return occ;
}

/* The decode tiles (fused combine). Staged or not (identical bits): ANVIL_CUDA_ATTN_STAGE
   when set; otherwise staged when the grid (decode tiles x KV heads, empty graph tiles
   included, so the choice is a function of the plan's layout) is at least two full waves of
   the staged kernel (2 x resident blocks an SM x SMs): at small batch a block's time is its
   chain of dependent round trips, which staging only lengthens; at large batch the kernel is
   bound by the uncoalesced lane-per-row K loads that staging replaces. */
template <int HD, int G, typename T>
static int s_attn_launch_decode(ecu_state_t *st, const ecu_attn_plan_t *p, float *out,
                                const float *q, const void *kc, const void *vc, int n_head,
                                int n_kv_head, int block_size)
{
    dim3 grid(p->n_dec_tiles, n_kv_head);
    bool stage = false;
    if constexpr (sizeof(T) <= 2) {
        static const int occ = s_attn_stage_setup<HD, G, T>();
        const int env = s_attn_stage_env();
        const long long blocks = (long long)p->n_dec_tiles * n_kv_head;
        stage = occ > 0 && (env == 1 || (env < 0 && blocks >= 2LL * occ * st->n_sm));
    }
#define ECU_ATTN_DEC_ARGS                                                                      \
    out, q, (const T *)kc, (const T *)vc, (const int4 *)p->tiles, (const int *)p->tok_part,    \
        (const int *)p->tok_nsplit, (const int *)p->seq_ctx, (const int *)p->block_tables,     \
        p->max_blocks, block_size, n_head, n_kv_head, 1.0f / sqrtf((float)HD),                 \
        (float *)st->part_o.ptr, (float2 *)st->part_ml.ptr, (int *)st->attn_count.ptr
    if constexpr (sizeof(T) <= 2) {
        if (stage) {
            ECU_CHECK(ecu_launch(st, s_attn_decode_kernel<HD, G, T, true>, grid,
                                 dim3(ECU_ATTN_WARPS * 32), s_stage_smem<HD, T>(),
                                 ECU_ATTN_DEC_ARGS));
            return 0;
        }
    }
    ECU_CHECK(ecu_launch(st, s_attn_decode_kernel<HD, G, T, false>, grid,
                         dim3(ECU_ATTN_WARPS * 32), 0, ECU_ATTN_DEC_ARGS));
#undef ECU_ATTN_DEC_ARGS
    return 0;
}

/* The decode kernel handles (and merges) decode tiles for these ratios; others take the
   general kernel and the combine. */
static bool s_attn_fused(int G)
{
    return G == 1 || G == 2 || G == 4 || G == 8;
}

template <int HD, typename T>
static int s_attn_launch_hd(ecu_state_t *st, const ecu_attn_plan_t *p, float *out,
                            const float *q, const void *kc, const void *vc, int n_head,
                            int n_kv_head, int block_size)
{
    int G = n_head / n_kv_head, nd = p->n_dec_tiles, np = p->n_tiles - nd;
    if (nd > 0) {
        /* decode tiles: always this launch, whatever else the batch holds */
        if (G == 1)
            ECU_TRY((s_attn_launch_decode<HD, 1, T>(st, p, out, q, kc, vc, n_head, n_kv_head,
                                                    block_size)));
        else if (G == 2)
            ECU_TRY((s_attn_launch_decode<HD, 2, T>(st, p, out, q, kc, vc, n_head, n_kv_head,
                                                    block_size)));
        else if (G == 4)
            ECU_TRY((s_attn_launch_decode<HD, 4, T>(st, p, out, q, kc, vc, n_head, n_kv_head,
                                                    block_size)));
        else if (G == 8)
            ECU_TRY((s_attn_launch_decode<HD, 8, T>(st, p, out, q, kc, vc, n_head, n_kv_head,
                                                    block_size)));
        else
            ECU_TRY((s_attn_launch_rows<HD, T>(st, p, 0, nd, G, q, kc, vc, n_head, n_kv_head,
                                               block_size)));
    }
    if (np > 0)
        ECU_TRY((s_attn_launch_rows<HD, T>(st, p, nd, np, p->q_tile * G, q, kc, vc, n_head,
                                           n_kv_head, block_size)));
    return 0;
}

/* The decode kernel's per-(token, KV head) arrival counts: zeroed when the buffer grows (on
   the stream, before any kernel that uses it); from then on every launch leaves them 0. */
static int s_attn_count_reserve(ecu_state_t *st, size_t n)
{
    const size_t had = st->attn_count.bytes;
    ECU_TRY(ecu_buf_reserve(&st->attn_count, n * sizeof(int)));
    if (st->attn_count.bytes != had)
        ECU_CHECK(cudaMemsetAsync(st->attn_count.ptr, 0, st->attn_count.bytes, st->stream));
    return 0;
}

extern "C" int ecu_attention(eng_backend_t *be, float *out, const float *q, const void *k_cache,
                             const void *v_cache, const eng_attn_batch_t *batch, int n_head,
                             int n_kv_head, int head_dim, int block_size)
{
    ecu_state_t *st = ecu_st(be);
    const ecu_attn_plan_t *p;
    if (!out || !q || !k_cache || !v_cache || !batch || n_head <= 0 || n_kv_head <= 0 ||
        n_head % n_kv_head || block_size <= 0)
        return -EINVAL;
    if (head_dim != 64 && head_dim != 128) {
        ANV_ERROR("cuda attention: head_dim %d is not supported (64, 128)", head_dim);
        return ANV_EUNSUPPORTED;
    }
    const bool fused = s_attn_fused(n_head / n_kv_head);
    ECU_TRY(ecu_attn_plan(st, batch, n_head, head_dim, &p));
    ECU_TRY(ecu_buf_reserve(&st->part_o, (size_t)p->n_parts * n_head * head_dim * 4));
    ECU_TRY(ecu_buf_reserve(&st->part_ml, (size_t)p->n_parts * n_head * sizeof(float2)));
    if (fused && p->n_dec_tiles > 0)
        ECU_TRY(s_attn_count_reserve(st, (size_t)p->n_tok * n_kv_head));
    int rc;
#define ECU_ATTN_KV(HD)                                                                        \
    (be->kv_dtype == ENG_DTYPE_BF16                                                            \
         ? s_attn_launch_hd<HD, __nv_bfloat16>(st, p, out, q, k_cache, v_cache, n_head,        \
                                               n_kv_head, block_size)                          \
     : be->kv_dtype == ENG_DTYPE_F8E4M3                                                        \
         ? s_attn_launch_hd<HD, __nv_fp8_e4m3>(st, p, out, q, k_cache, v_cache, n_head,        \
                                               n_kv_head, block_size)                          \
         : s_attn_launch_hd<HD, float>(st, p, out, q, k_cache, v_cache, n_head, n_kv_head,     \
                                       block_size))
    rc = head_dim == 64 ? ECU_ATTN_KV(64) : ECU_ATTN_KV(128);
#undef ECU_ATTN_KV
    if (rc)
        return rc;
    /* The decode kernel has written its tokens' rows of out; the combine writes the rest. */
    const int n_comb = fused ? p->n_pre_tok : p->n_tok;
    if (n_comb > 0) {
        dim3 grid(n_comb, n_head);
        ECU_CHECK(ecu_launch(st, s_attn_combine_kernel, grid, dim3(head_dim), 0, out,
                             (const float *)st->part_o.ptr, (const float2 *)st->part_ml.ptr,
                             fused ? (const int *)p->pre_tok : (const int *)NULL,
                             (const int *)p->tok_part, (const int *)p->tok_nsplit, n_head,
                             head_dim));
    }
    return 0;
}

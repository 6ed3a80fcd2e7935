/*  attention.cu - causal GQA attention over the paged KV cache: flash-decoding + prefill.

    Work is cut into tiles, planned on the host once per step (ecu_attn_plan, reused by every
    layer after prepare()): a decode sequence (one query token) gets one tile per fixed split
    of ECU_ATTN_SPLIT cache positions, so how a sequence's context is cut never depends on the
    rest of the batch; a prefill chunk gets tiles of up to ECU_ATTN_QT query tokens over their
    whole causal range. Decode tiles come first in the plan and always run in their own launch
    of the decode kernel, so a decode result is the same bits whatever else is in the batch
    (batch-invariant). Decode kernel: one block per (split, KV head), each warp 32 positions,
    each lane one position for q.k of all G = n_head / n_kv_head heads (q in shared memory,
    K read straight from the pool), then lanes own head dimensions for p.V (coalesced rows of
    V); the four warps' softmax states merge in shared memory. Prefill kernel: K/V chunks of
    32 positions widened into shared memory and reused by all rows of the tile (tokens x
    heads), one online softmax per row and warp. Every tile writes a partial (o, max, sum); a
    second kernel merges each token's partials in split order and normalises, so the sum
    order is fixed too. A prefill tile's o is unnormalised fp32; a decode tile's (bf16 or fp8
    KV) is o / sum in fp16 (st->attn_part; ANVIL_CUDA_ATTN_PART=f32 keeps fp32, =bf16 bf16):
    half the bytes they write and the combine reads, at one rounding of at most 2^-11 (fp16)
    or 2^-8 (bf16) of the split's largest |v| an element (s_part_put). A graph step asks
    for a fixed-size layout instead: every sequence gets the same number of split tiles (those
    past its context are empty and return at once), so grid sizes and buffer sizes depend only
    on the batch and context buckets; the tiles that do run compute exactly what the ordinary
    plan computes.
    The decode and combine kernels are launched with PDL (see eng_cuda_internal.h); the decode
    kernel reads its tile, context and block-table entry before the PDL wait (the plan is
    uploaded before a step's first kernel), issues its whole K row (fp8) before staging q, and
    a full warp's V rows in batches of 16 (bf16) or 32 (fp8) before the first is used; the
    combine runs a warp per (token, head), each split's weight computed once by one lane, and
    also writes its output rounded for the O projection (its rounded twin, matmul.cu). Decode
    tiles of bf16 / fp8 KV with 4 or 8 query heads a KV head run a tensor-core kernel instead
    (st->attn_mma, off with ANVIL_CUDA_ATTN_MMA=0; s_attn_decode_mma_kernel, below): the same
    tiles and partials; it loads V after q.k (VL) unless ANVIL_CUDA_ATTN_VLATE=0. Prefill
    tiles of bf16 / fp8 KV run on the tensor cores too (st->attn_pf_mma, off with
    ANVIL_CUDA_ATTN_PREFILL_MMA=0; s_attn_prefill_mma_kernel: K and V chunks staged in shared
    memory and read by ldmatrix, q and p as hi + lo pairs), where the FMA kernel issues about
    one shared-memory load an FMA.
    Decode splits that several sequences hold in the same cache blocks (n samples of a prompt)
    are found by the plan (s_plan_groups, from the block tables and the block size) and run
    as group tiles (st->attn_group, off with ANVIL_CUDA_ATTN_GROUP=0;
    s_attn_group_mma_kernel): one block reads the split's K and V rows once for up to 8
    sequences, with the same bits per sequence as its own tile; their decode tiles return at
    once (tile_grp). The combine is unchanged: a group tile writes each member's partial.
    A/B switches, measured on the H200 (gpu_session bench_ab, graphs tok/s against the
    default): the decode grid with the KV heads inner (s_dec_block) x1.014 / x1.015 at batch
    256 x 2k bf16 / fp8 KV. Measured and removed (2026-12-05): the last decode block of a token
    merging its partials instead of the combine kernel (x0.91 to x0.97); each lane asking L2
    for its K and V rows before the PDL wait (x1.000 at batch 1 on the H100); the combine a
    block per (token, head) (x0.998 at batch 16, x0.993 at 256, x0.995 at 256 x 2k fp8 on the
    H100, against the warp combine).
*/
#include <stdlib.h>
#include <string.h>

#include "eng_cuda_internal.h"

#define ECU_ATTN_SPLIT 128 /* cache positions per decode split (4 warps x 32) */
#define ECU_ATTN_QT 16     /* query tokens per prefill tile */
#define ECU_ATTN_KC 32     /* cache positions per shared-memory chunk */
#define ECU_ATTN_WARPS 4

#define ECU_ATTN_GMAX 8 /* sequences a group tile at most */

/* The group tiles of a batch's decodes (st->attn_group): a full split (ECU_ATTN_SPLIT
   positions, all in the context) of a decode sequence joins the group of the first sequence
   seen with the same cache blocks for that split (a hash on (split, first block), then the
   whole block range compared), up to ECU_ATTN_GMAX members a group; groups of two or more
   become group tiles {seq, split, n, first member} (gt) with their members' {token, first
   partial} pairs (gmem; tok_part is filled before), and their members' decode tiles are
   flagged (tile_grp). dec_tile[s] is sequence s's first decode
   tile (-1: not a decode). Returns the number of group tiles (at most max_gt), or -ENOMEM. */
static int s_plan_groups(const eng_attn_batch_t *b,
                         int bs,
                         const int32_t *dec_tile,
                         const int32_t *tok_part,
                         int32_t *tile_grp,
                         int32_t *gt,
                         int32_t *gmem,
                         int max_gt)
{
    typedef struct {
        int seq, split, n, mem[ECU_ATTN_GMAX]; /* the leader, its split, the members */
    } grp_t;
    const int n_seq = b->n_seq, mb = b->max_blocks;
    long n_full = 0;
    for (int s = 0; s < n_seq; s++)
        if (dec_tile[s] >= 0)
            n_full += b->ctx_len[s] / ECU_ATTN_SPLIT;
    if (n_full < 2 || max_gt <= 0)
        return 0;
    long hn = 4;
    while (hn < 2 * n_full)
        hn *= 2;
    int *hash = (int *)malloc((size_t)hn * sizeof(int)); /* group index + 1, 0: free */
    grp_t *grp = (grp_t *)malloc((size_t)n_full * sizeof(grp_t));
    if (!hash || !grp) {
        free(hash), free(grp);
        return -ENOMEM;
    }
    memset(hash, 0, (size_t)hn * sizeof(int));
    int n_grp = 0;
    for (int s = 0; s < n_seq; s++) {
        if (dec_tile[s] < 0)
            continue;
        const int32_t *ts = b->block_tables + (size_t)s * mb;
        for (int k = 0; k < b->ctx_len[s] / ECU_ATTN_SPLIT; k++) {
            const int b0 = k * ECU_ATTN_SPLIT / bs,
                      b1 = (k * ECU_ATTN_SPLIT + ECU_ATTN_SPLIT - 1) / bs;
            if (b1 >= mb)
                break; /* a context past its block table (the kernels' contract): no groups */
            uint64_t h = ((uint64_t)(uint32_t)ts[b0] << 20 ^ (uint64_t)k) * 0x9E3779B97F4A7C15ull;
            long at = (long)(h >> 40) & (hn - 1);
            int gi = -1;
            for (; hash[at]; at = (at + 1) & (hn - 1)) {
                const grp_t *c = &grp[hash[at] - 1];
                if (c->split == k && b->block_tables[(size_t)c->seq * mb + b0] == ts[b0]) {
                    gi = hash[at] - 1;
                    break;
                }
            }
            if (gi >= 0) {
                const int32_t *tl = b->block_tables + (size_t)grp[gi].seq * mb;
                if (memcmp(tl + b0, ts + b0, (size_t)(b1 - b0 + 1) * sizeof(int32_t)) != 0)
                    continue; /* the same first block, then others: stays alone */
                if (grp[gi].n < ECU_ATTN_GMAX) {
                    grp[gi].mem[grp[gi].n++] = s;
                    continue;
                }
            }
            grp_t *c = &grp[n_grp]; /* a new group; a full one's successor takes its slot */
            c->seq = s, c->split = k, c->n = 1, c->mem[0] = s;
            hash[at] = ++n_grp;
        }
    }
    int n_gt = 0, nm = 0;
    for (int i = 0; i < n_grp && n_gt < max_gt; i++) {
        const grp_t *c = &grp[i];
        if (c->n < 2)
            continue;
        int32_t *o = gt + 4 * (size_t)n_gt++;
        o[0] = c->seq, o[1] = c->split, o[2] = c->n, o[3] = nm;
        for (int m = 0; m < c->n; m++) {
            const int s = c->mem[m];
            gmem[2 * nm] = b->q_start[s], gmem[2 * nm + 1] = tok_part[b->q_start[s]];
            nm++;
            tile_grp[dec_tile[s] + c->split] = 1;
        }
    }
    free(hash), free(grp);
    return n_gt;
}

/* The prefill tiles (n of them, {seq, tok0, n_q, 0}) sorted by the positions they span
   (their last position + 1), shortest first, ties in plan order: the prefill kernel runs them
   last first, so the longest start first and the shortest fill the tail of the grid (on the
   H100 a 2048-token step of two prompts kept the SMs busy 75 % of its time in the plan's
   sequence order). Returns 0 or -ENOMEM. */
typedef struct {
    int len, at;
} s_pf_key_t;
static int s_pf_key_cmp(const void *a, const void *b)
{
    const s_pf_key_t *x = (const s_pf_key_t *)a, *y = (const s_pf_key_t *)b;
    return x->len != y->len ? (x->len < y->len ? -1 : 1) : (x->at < y->at ? -1 : x->at > y->at);
}
static int s_plan_sort_prefill(int32_t *tiles, int n, const eng_attn_batch_t *b)
{
    s_pf_key_t *k = (s_pf_key_t *)malloc((size_t)n * sizeof(*k));
    int32_t *copy = (int32_t *)malloc((size_t)n * 4 * sizeof(int32_t));
    if (!k || !copy) {
        free(k), free(copy);
        return -ENOMEM;
    }
    for (int i = 0; i < n; i++) {
        const int s = tiles[4 * i], q0 = b->q_start[s], nq_seq = b->q_start[s + 1] - q0;
        k[i].len = b->ctx_len[s] - nq_seq + (tiles[4 * i + 1] - q0) + tiles[4 * i + 2];
        k[i].at = i;
    }
    qsort(k, (size_t)n, sizeof(*k), s_pf_key_cmp);
    memcpy(copy, tiles, (size_t)n * 4 * sizeof(int32_t));
    for (int i = 0; i < n; i++)
        memcpy(tiles + 4 * i, copy + 4 * k[i].at, 4 * sizeof(int32_t));
    free(k), free(copy);
    return 0;
}

int ecu_attn_plan(ecu_state_t *st,
                  const eng_attn_batch_t *b,
                  int block_size,
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
    int n_dec = 0;
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
        n_tiles = n_parts = n_dec = n_seq * gs;
    }
    for (int s = 0; s < n_seq && gs == 0; s++) {
        int nq = b->q_start[s + 1] - b->q_start[s];
        if (nq < 0 || b->ctx_len[s] < nq || (nq > 0 && b->ctx_len[s] <= 0))
            return -EINVAL;
        if (nq == 1) {
            int ns = (b->ctx_len[s] + ECU_ATTN_SPLIT - 1) / ECU_ATTN_SPLIT;
            n_tiles += ns;
            n_parts += ns;
            n_dec += ns;
        } else if (nq > 1) {
            n_tiles += (nq + ECU_ATTN_QT - 1) / ECU_ATTN_QT;
            n_parts += nq;
            q_tile = nq < ECU_ATTN_QT ? (nq > q_tile ? nq : q_tile) : ECU_ATTN_QT;
        }
    }
    const int max_gt = st->attn_group && block_size > 0 ? n_dec / 2 : 0;
    size_t words = (size_t)4 * n_tiles + (size_t)4 * max_gt + 2 * (size_t)n_tok + (n_seq + 1) +
                   n_seq + (size_t)n_seq * b->max_blocks + 3 * (size_t)n_dec + 1;
    int32_t *h = (int32_t *)malloc(words * sizeof(int32_t));
    int32_t *dec_tile = (int32_t *)malloc((size_t)n_seq * sizeof(int32_t));
    if (!h || !dec_tile) {
        free(h), free(dec_tile);
        return -ENOMEM;
    }
    /* gmem's int2 pairs 8-byte aligned: they follow the int4 arrays */
    int32_t *tiles = h, *gt = h + 4 * (size_t)n_tiles, *gmem = gt + 4 * (size_t)max_gt;
    int32_t *tok_part = gmem + 2 * (size_t)n_dec;
    int32_t *tok_nsplit = tok_part + n_tok, *qs = tok_nsplit + n_tok, *ctx = qs + n_seq + 1;
    int32_t *tables = ctx + n_seq, *tile_grp = tables + (size_t)n_seq * b->max_blocks;
    int32_t *gcount = tile_grp + n_dec;
    int ti = 0, part = 0;
    /* graph layout: gs tiles per sequence, those past its context empty (n_q 0) */
    for (int s = 0; s < n_seq && gs > 0; s++) {
        int ns = (b->ctx_len[s] + ECU_ATTN_SPLIT - 1) / ECU_ATTN_SPLIT;
        dec_tile[s] = ti;
        for (int k = 0; k < gs; k++, ti++) {
            tiles[4 * ti] = s, tiles[4 * ti + 1] = s, tiles[4 * ti + 2] = k < ns ? 1 : 0;
            tiles[4 * ti + 3] = k;
        }
        tok_part[s] = s * gs, tok_nsplit[s] = ns;
    }
    /* decode tiles first (their own launch), then prefill tiles */
    for (int s = 0; s < n_seq && gs == 0; s++) {
        int q0 = b->q_start[s], nq = b->q_start[s + 1] - q0;
        dec_tile[s] = nq == 1 ? ti : -1;
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
    for (int s = 0; s < n_seq && gs == 0; s++) {
        int q0 = b->q_start[s], nq = b->q_start[s + 1] - q0;
        if (nq > 1) {
            for (int t0 = 0; t0 < nq; t0 += ECU_ATTN_QT, ti++) {
                tiles[4 * ti] = s, tiles[4 * ti + 1] = q0 + t0;
                tiles[4 * ti + 2] = nq - t0 < ECU_ATTN_QT ? nq - t0 : ECU_ATTN_QT;
                tiles[4 * ti + 3] = 0;
            }
            for (int t = 0; t < nq; t++)
                tok_part[q0 + t] = part++, tok_nsplit[q0 + t] = 1;
        }
    }
    if (st->attn_pf_lpt && gs == 0 && ti - n_dec > 1 &&
        s_plan_sort_prefill(tiles + 4 * (size_t)n_dec, ti - n_dec, b)) {
        free(h), free(dec_tile);
        return -ENOMEM;
    }
    memcpy(qs, b->q_start, (size_t)(n_seq + 1) * 4);
    memcpy(ctx, b->ctx_len, (size_t)n_seq * 4);
    memcpy(tables, b->block_tables, (size_t)n_seq * b->max_blocks * 4);
    memset(tile_grp, 0, (size_t)n_dec * 4);
    int n_gt = max_gt > 0
                   ? s_plan_groups(b, block_size, dec_tile, tok_part, tile_grp, gt, gmem, max_gt)
                   : 0;
    free(dec_tile);
    if (n_gt < 0) {
        free(h);
        return n_gt;
    }
    *gcount = n_gt;
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
    p->max_blocks = b->max_blocks, p->q_tile = q_tile;
    p->n_gt = n_gt, p->max_gt = max_gt, p->group_bs = max_gt > 0 ? block_size : 0;
    st->group_plans += n_gt > 0, st->group_tiles += n_gt;
    p->tiles = (int4 *)d;
    p->gtiles = (int4 *)(d + 4 * (size_t)n_tiles);
    p->gmembers = (int2 *)(d + 4 * (size_t)n_tiles + 4 * (size_t)max_gt);
    p->tok_part = (int *)(p->gmembers + n_dec);
    p->tok_nsplit = p->tok_part + n_tok;
    p->seq_qstart = p->tok_nsplit + n_tok;
    p->seq_ctx = p->seq_qstart + n_seq + 1;
    p->block_tables = p->seq_ctx + n_seq;
    p->tile_grp = p->block_tables + (size_t)n_seq * b->max_blocks;
    p->gcount = p->tile_grp + n_dec;
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

/* Element `at` (row * HD + dim) of a partial's o, kind pk (st->attn_part): ECU_PART_F32 the
   unnormalised o in fp32 (part_o as floats); ECU_PART_F16 / _BF16 o / sum, the row's
   normalised output, in 16 bits (part_o as halves: a decode partial's row lies in the first
   half of its fp32 row's bytes, and the decode partials come first, so the prefill partials
   after them keep their fp32 rows). fp16 saturates at +-65504 (|o / sum| is at most the
   split's largest |v|); a NaN stays NaN. inv is s_part_inv(sum, pk), taken once a row: o
   times the correctly rounded 1 / sum (an IEEE division an element made the writers 3 to 7 %
   slower, ncu on the H100), the same bits in every kernel that writes a partial. */
static __device__ __forceinline__ float s_part_inv(float sum, int pk)
{
    return pk != ECU_PART_F32 && sum > 0.0f ? __frcp_rn(sum) : 0.0f;
}

static __device__ __forceinline__ void
s_part_put(float *part_o, size_t at, float o, float inv, int pk)
{
    if (pk == ECU_PART_F32) {
        part_o[at] = o;
        return;
    }
    const float v = o * inv;
    if (pk == ECU_PART_BF16)
        ((__nv_bfloat16 *)part_o)[at] = __float2bfloat16_rn(v);
    else
        ((__half *)part_o)[at] =
            __float2half_rn(fabsf(v) > 65504.0f ? copysignf(65504.0f, v) : v); /* NaN stays */
}

template <int HD, int RPW, typename T>
static __global__ void __launch_bounds__(ECU_ATTN_WARPS * 32)
    s_attn_kernel(const float *q /* (n_tok, n_head, HD) f32 */,
                  const T *k_cache,
                  const T *v_cache /* (n_blocks, bs, n_kv, HD) T */,
                  const int4 *tiles /* (n_tiles) {seq, tok0, n_q, split} */,
                  const int *tok_part /* (n_tok) */,
                  const int *seq_qstart /* (n_seq + 1) */,
                  const int *seq_ctx /* (n_seq) */,
                  const int *block_tables /* (n_seq, mb) */,
                  int max_blocks,
                  int block_size,
                  int n_head,
                  int n_kv_head,
                  float scale,
                  float *part_o /* (n_parts, n_head, HD) f32; decode rows of kind pk */,
                  float2 *part_ml /* (n_parts, n_head) {max, sum} */,
                  int pk)
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
            const int pki = decode ? pk : ECU_PART_F32;
            const float inv = s_part_inv(l[i], pki);
#pragma unroll
            for (int d = 0; d < PER; d++)
                s_part_put(part_o, pi * HD + lane + 32 * d, o[i][d], inv, pki);
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

/* A decode block's partial of head g (row pi of the partials, kind pk), dim d: its warps'
   (o, max, sum) merged in a fixed order; o_of(w) is warp w's unnormalised o of (g, d) */
template <int G, typename F>
static __device__ __forceinline__ void s_warps_merge(const float (&wm)[ECU_ATTN_WARPS][G],
                                                     const float (&wl)[ECU_ATTN_WARPS][G],
                                                     int g,
                                                     F o_of,
                                                     float *part_o,
                                                     float2 *part_ml,
                                                     size_t pi,
                                                     int hd,
                                                     int d,
                                                     int pk)
{
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < ECU_ATTN_WARPS; w++)
        mx = fmaxf(mx, wm[w][g]);
    float acc = 0.0f, sum = 0.0f;
#pragma unroll
    for (int w = 0; w < ECU_ATTN_WARPS; w++) {
        if (wm[w][g] == -INFINITY)
            continue;
        const float f = __expf(wm[w][g] - mx);
        acc += o_of(w) * f;
        sum += wl[w][g] * f;
    }
    s_part_put(part_o, pi * hd + d, acc, s_part_inv(sum, pk), pk);
    if (d == 0)
        part_ml[pi] = make_float2(mx, sum);
}

/* s_warps_merge's weights of one row, computed once: f[w] = exp(m(w) - max) (0 for a warp
   without keys) in its order, so the same bits; returns the row's {max, sum}. m(w) and l(w)
   are warp w's max and sum. */
template <typename M, typename L>
static __device__ __forceinline__ float2 s_merge_weights(M m, L l, float *f)
{
    float mx = -INFINITY, sum = 0.0f;
#pragma unroll
    for (int w = 0; w < ECU_ATTN_WARPS; w++)
        mx = fmaxf(mx, m(w));
#pragma unroll
    for (int w = 0; w < ECU_ATTN_WARPS; w++) {
        const float fw = m(w) == -INFINITY ? 0.0f : __expf(m(w) - mx);
        f[w] = fw;
        if (m(w) != -INFINITY)
            sum += l(w) * fw;
    }
    return make_float2(mx, sum);
}

/* A decode item (a tile and a KV head) as a lane sees it: the token, split, keys of its warp
   in the context, and its own key's cache position */
typedef struct {
    int kvh, tok, split, nvalid, pos;
} s_dec_item_t;

/* The decode block's tile and KV head. Grid (n_dec_tiles, n_kv_head): a KV head's tiles run
   one after another, so each 2 KB (bf16) or 1 KB (fp8) cache row of a position is read in
   n_kv_head pieces of 256 / 128 bytes far apart in time. With the KV heads inner
   (ANVIL_CUDA_ATTN_KV_INNER=1, st->attn_kv_inner; the A/B) the grid is (n_kv_head *
   n_dec_tiles): blocks next to each other, running at the same time, read the pieces of the
   same rows (DRAM pages opened once) and the same tile and block-table entries. The work of
   a block, and so its result, is the same either way. */
static __device__ __forceinline__ void s_dec_block(int n_kv_head, int *tile, int *kvh)
{
    if (gridDim.y == 1)
        *tile = (int)(blockIdx.x / (unsigned)n_kv_head), *kvh = (int)(blockIdx.x % n_kv_head);
    else
        *tile = (int)blockIdx.x, *kvh = (int)blockIdx.y;
}

template <int HD, int G, typename T>
static __global__ void __launch_bounds__(ECU_ATTN_WARPS * 32)
    s_attn_decode_kernel(const float *q /* (n_tok, n_head, HD) f32 */,
                         const T *k_cache,
                         const T *v_cache /* (n_blocks, bs, n_kv, HD) T */,
                         const int4 *tiles /* (n_dec_tiles) {seq, tok, 1, split} */,
                         const int * /* tile_grp: not read, this kernel computes every tile */,
                         const int *tok_part /* (n_tok) */,
                         const int *seq_ctx /* (n_seq) */,
                         const int *block_tables /* (n_seq, mb) */,
                         int max_blocks,
                         int block_size,
                         int n_head,
                         int n_kv_head,
                         float scale,
                         float *part_o /* (n_parts, n_head, HD), kind pk (s_part_put) */,
                         float2 *part_ml /* (n_parts, n_head) {max, sum} */,
                         int pk)
{
    constexpr int PER = HD / 32;
    __shared__ float qs[G][HD];
    __shared__ float wm[ECU_ATTN_WARPS][G], wl[ECU_ATTN_WARPS][G];
    __shared__ float wo[ECU_ATTN_WARPS][G][HD];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    ecu_pdl_trigger(); /* the combine and the O projection may be launched */
    /* The plan (tiles, contexts, block tables) was uploaded before the step's first kernel, so
       it is read before the PDL wait: the chain tile -> context -> table -> cache row overlaps
       the kernel before, and after the wait only the cache and q remain (at batch 1 a block's
       time is its chain of dependent round trips, not bandwidth). */
    int ti, kvh;
    s_dec_block(n_kv_head, &ti, &kvh);
    const int4 tl = tiles[ti];
    if (tl.z == 0)
        return; /* an empty tile of a graph step's fixed layout (block-uniform) */
    const int seq = tl.x, tok = tl.y, split = tl.w;
    const int key_begin = split * ECU_ATTN_SPLIT;
    const int key_end = min(key_begin + ECU_ATTN_SPLIT, seq_ctx[seq]);
    const int *table = block_tables + (size_t)seq * max_blocks;
    const size_t kv_row = (size_t)n_kv_head * HD;
    const int wbase = key_begin + warp * 32, key = wbase + lane;
    const bool valid = key < key_end;
    const int pos = valid ? table[key / block_size] * block_size + key % block_size : 0;
    const T *kr = k_cache + (size_t)pos * kv_row + (size_t)kvh * HD;
    ecu_pdl_wait(); /* the cache rows of this step and q are written by the kernels before */

    /* q.k: lane = one cache position. An fp8 K row (32 registers) is loaded whole before q
       is staged, so the two round trips overlap; wider rows are loaded as they are used (a
       preloaded bf16 row took the kernel to 168 registers, 3 blocks an SM: batch 256 at 2k
       slowed from 28.5 to 31.0 ms of attention a step on the H200) */
    constexpr bool PRE = sizeof(T) == 1;
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
    __syncthreads();
    float sc[G];
#pragma unroll
    for (int g = 0; g < G; g++)
        sc[g] = 0.0f;
    if (valid) {
#pragma unroll
        for (int d = 0; d < HD; d += 8) {
            float kf[8];
            if constexpr (PRE)
                s_k8_widen(kraw[d / 8], kf);
            else
                s_ld8(kr + d, kf);
#pragma unroll
            for (int g = 0; g < G; g++) {
                const float4 a = *(const float4 *)&qs[g][d], b = *(const float4 *)&qs[g][d + 4];
                sc[g] += a.x * kf[0] + a.y * kf[1] + a.z * kf[2] + a.w * kf[3] + b.x * kf[4] +
                         b.y * kf[5] + b.z * kf[6] + b.w * kf[7];
            }
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

    /* p.v: lane = PER head dimensions; rows of V read whole by the warp. A full warp of 1-
       or 2-byte rows issues its rows' loads in batches of VB before the first is used (one or
       two round trips, not four); the same sums in the same order as the row-by-row loop of
       the rest. */
    float o[G][PER];
#pragma unroll
    for (int g = 0; g < G; g++)
#pragma unroll
        for (int e = 0; e < PER; e++)
            o[g][e] = 0.0f;
    const int nvalid = max(0, min(32, key_end - wbase));
    const T *vc = v_cache + (size_t)kvh * HD + lane * PER;
    int j0 = 0;
    if constexpr (sizeof(T) <= 2) {
        /* VB rows in flight at once: 32 rows of fp8 or 16 of bf16, 32 registers either way */
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
#pragma unroll
    for (int g = 0; g < G; g++) {
        if (lane == 0)
            wm[warp][g] = nvalid > 0 ? m[g] : -INFINITY, wl[warp][g] = l[g];
#pragma unroll
        for (int e = 0; e < PER; e++)
            wo[warp][g][lane * PER + e] = o[g][e];
    }
    __syncthreads();
    const size_t pi0 = (size_t)(tok_part[tok] + split) * n_head + kvh * G;
    for (int idx = threadIdx.x; idx < G * HD; idx += blockDim.x) {
        const int g = idx / HD, d = idx % HD;
        s_warps_merge<G>(
            wm, wl, g, [&](int w) { return wo[w][g][d]; }, part_o, part_ml, pi0 + g, HD, d, pk);
    }
}

/* ---- Tensor-core decode (st->attn_mma, the default): bf16 or fp8 KV, G = 4 or 8 ----
   The same tiles and partials as s_attn_decode_kernel (one block per split and KV head, a warp
   per 32 positions, the warps merged in a fixed order); a warp's q.k and p.v are mma.sync
   m16n8k16 with fp32 accumulation instead of one FMA a product: 48 mma a warp for G = 4, where
   the FMA kernel issues ~1000 FMAs and ~130 shuffles a lane. Inputs are f16 for fp8 KV (every
   e4m3 value is exact in f16) and bf16 for bf16 KV. q and p enter as hi + lo pairs (x = hi +
   lo, the residual rounded again: ~22 bits with f16, ~16 with bf16), not one 16-bit rounding,
   so results stay within the FMA path's tolerance. q beyond the f16 range (|q| / sqrt(hd) >
   65504) is not representable on the fp8 path.
   q.k, S = Q K^T: A = Q, rows g = q_hi of head g, rows 8 + g = its q_lo; B = K, a column a
   key. The sum over dimensions may take them in any order, so a lane (group g = lane / 4,
   tig = lane % 4) loads one contiguous quarter of a K row (key 8 t + g, dims tig HD/4 ..) and
   the k slots are defined to match: k-step s, slot 2 tig + c <-> dim tig HD/4 + 4 s + c, slot
   8 + 2 tig + c <-> dim tig HD/4 + 4 s + 2 + c; q's fragments are built once a block in that
   order. A score is C[g][key] + C[8 + g][key].
   p.v, O^T = V^T P^T: B = P^T straight from the q.k accumulators (C's row g, columns 2 tig + c
   is B's column g, rows 2 tig + c: no shuffle); A = V^T, whose m-tile rows g and 8 + g a lane
   maps to HD / 8 contiguous dims of a V row, the two keys of a register pair interleaved from
   two rows with prmt. For G <= 4, B's columns 4..7 carry p_lo (taken from lane ^ 16), so one
   mma covers hi and lo; for G = 8 a second mma takes p_lo. K and V rows are all loaded before
   q is staged (one round trip a warp). */

/* (x, y) as a pair of the mma's 16-bit type (x in the low half) and the pair of residuals */
template <typename T>
static __device__ __forceinline__ void s_hilo(float x, float y, unsigned &hi, unsigned &lo)
{
    if constexpr (sizeof(T) == 1) {
        const __half2 h = __floats2half2_rn(x, y);
        const float2 f = __half22float2(h);
        const __half2 l = __floats2half2_rn(x - f.x, y - f.y);
        hi = *(const unsigned *)&h, lo = *(const unsigned *)&l;
    } else {
        const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
        const float2 f = __bfloat1622float2(h);
        const __nv_bfloat162 l = __floats2bfloat162_rn(x - f.x, y - f.y);
        hi = *(const unsigned *)&h, lo = *(const unsigned *)&l;
    }
}

/* two e4m3 (the low byte first) as an f16 pair, exactly */
static __device__ __forceinline__ unsigned s_e4m3x2_h2(unsigned u)
{
    const __half2_raw h =
        __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(u & 0xffffu), __NV_E4M3);
    return (unsigned)h.x | ((unsigned)h.y << 16);
}

/* NW 32-bit words from p (16-byte aligned for NW % 4 == 0, 8-byte for NW == 2), or zeros */
template <int NW>
static __device__ __forceinline__ void s_ldw(unsigned (&w)[NW], const void *p, bool ok)
{
    static_assert(NW % 4 == 0 || NW == 2, "row pieces are 8 bytes or whole 16-byte units");
    if constexpr (NW % 4 == 0) {
#pragma unroll
        for (int i = 0; i < NW / 4; i++) {
            const uint4 u = ok ? ((const uint4 *)p)[i] : make_uint4(0, 0, 0, 0);
            w[4 * i] = u.x, w[4 * i + 1] = u.y, w[4 * i + 2] = u.z, w[4 * i + 3] = u.w;
        }
    } else {
        const uint2 u = ok ? *(const uint2 *)p : make_uint2(0, 0);
        w[0] = u.x, w[1] = u.y;
    }
}

/* The A pairs of p.v from the same dims of two V rows (keys 2 tig and 2 tig + 1 of a k-step
   half): pr[d] = {r0[d], r1[d]} for the lane's DV dims, r0 in the low half. */
template <typename T, int VW>
static __device__ __forceinline__ void s_vpairs(const unsigned (&r0)[VW],
                                                const unsigned (&r1)[VW], unsigned *pr)
{
#pragma unroll
    for (int w = 0; w < VW; w++) {
        if constexpr (sizeof(T) == 1) {
            const unsigned x = __byte_perm(r0[w], r1[w], 0x5140); /* r0.b0 r1.b0 r0.b1 r1.b1 */
            const unsigned y = __byte_perm(r0[w], r1[w], 0x7362); /* r0.b2 r1.b2 r0.b3 r1.b3 */
            pr[4 * w] = s_e4m3x2_h2(x), pr[4 * w + 1] = s_e4m3x2_h2(x >> 16);
            pr[4 * w + 2] = s_e4m3x2_h2(y), pr[4 * w + 3] = s_e4m3x2_h2(y >> 16);
        } else {
            pr[2 * w] = __byte_perm(r0[w], r1[w], 0x5410);     /* the low halves */
            pr[2 * w + 1] = __byte_perm(r0[w], r1[w], 0x7632); /* the high halves */
        }
    }
}

/* A tensor-core decode warp's shapes and steps (s_attn_decode_mma_kernel and the group
   kernel below compute a query row with the same instructions in the same order) */
template <int HD, typename T> struct s_dm {
    static constexpr int KS = HD / 16;                 /* k-steps of q.k */
    static constexpr int DQ = HD / 4;                  /* dims of a K row a lane loads */
    static constexpr int KW = DQ * (int)sizeof(T) / 4; /* ... in 32-bit words */
    static constexpr int DV = HD / 8;                  /* dims of a V row a lane loads */
    static constexpr int VW = DV * (int)sizeof(T) / 4; /* ... in 32-bit words */
    static constexpr int MT = HD / 16;    /* m-tiles of p.v (dims g DV + i, + MT + i) */
    static constexpr int WS = DV * 8 + 8; /* wo words of a lane group: padded so the
                                             8 groups start 8 banks apart */
};

/* K rows of the warp's keys 8 t + g (the lane's quarter tig); pos is the cache position of the
   lane's own key (warp key `lane`), rows from nvalid on are zeros (no NaN reaches the mma) */
template <int HD, typename T>
static __device__ __forceinline__ void s_dm_load_k(unsigned (&kw)[4][s_dm<HD, T>::KW],
                                                   const T *k_cache,
                                                   int kvh,
                                                   size_t kv_row,
                                                   int pos,
                                                   int nvalid)
{
    const int lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
    const T *kb = k_cache + (size_t)kvh * HD + tig * s_dm<HD, T>::DQ;
#pragma unroll
    for (int t = 0; t < 4; t++) {
        const int kk = 8 * t + g, p = __shfl_sync(0xffffffffu, pos, kk);
        s_ldw<s_dm<HD, T>::KW>(kw[t], kb + (size_t)p * kv_row, kk < nvalid);
    }
}

/* V rows of the warp's keys 16 s + 8 h + 2 tig + c (the lane's eighth g) */
template <int HD, typename T>
static __device__ __forceinline__ void s_dm_load_v(unsigned (&vw)[2][2][2][s_dm<HD, T>::VW],
                                                   const T *v_cache,
                                                   int kvh,
                                                   size_t kv_row,
                                                   int pos,
                                                   int nvalid)
{
    const int lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
    const T *vb = v_cache + (size_t)kvh * HD + g * s_dm<HD, T>::DV;
#pragma unroll
    for (int s = 0; s < 2; s++)
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const int kk = 16 * s + 8 * h + 2 * tig + c;
                const int p = __shfl_sync(0xffffffffu, pos, kk);
                s_ldw<s_dm<HD, T>::VW>(vw[s][h][c], vb + (size_t)p * kv_row, kk < nvalid);
            }
}

/* q.k's A fragment of k-step s for lane quarter tt of query row x (NULL: a zero row): {hi, lo}
   of dims (4 s, 4 s + 1) then of (4 s + 2, 4 s + 3) of the quarter */
template <typename T> static __device__ __forceinline__ uint4 s_dm_qfrag_v(float4 v, float scale)
{
    uint4 f;
    s_hilo<T>(v.x * scale, v.y * scale, f.x, f.y);
    s_hilo<T>(v.z * scale, v.w * scale, f.z, f.w);
    return f;
}

template <int HD, typename T>
static __device__ __forceinline__ uint4 s_dm_qfrag(const float *x, int s, int tt, float scale)
{
    return x ? s_dm_qfrag_v<T>(*(const float4 *)(x + tt * s_dm<HD, T>::DQ + 4 * s), scale)
             : make_uint4(0, 0, 0, 0);
}

/* q.k: four n-tiles of 8 keys against the fragments qf[KS][32] */
template <int HD, typename T>
static __device__ __forceinline__ void
s_dm_qk(float (&sacc)[4][4], const uint4 (*qf)[32], const unsigned (&kw)[4][s_dm<HD, T>::KW])
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int t = 0; t < 4; t++)
        sacc[t][0] = sacc[t][1] = sacc[t][2] = sacc[t][3] = 0.0f;
#pragma unroll
    for (int s = 0; s < s_dm<HD, T>::KS; s++) {
        const uint4 a = qf[s][lane];
#pragma unroll
        for (int t = 0; t < 4; t++) {
            unsigned b0, b1;
            if constexpr (sizeof(T) == 1)
                b0 = s_e4m3x2_h2(kw[t][s]), b1 = s_e4m3x2_h2(kw[t][s] >> 16);
            else
                b0 = kw[t][2 * s], b1 = kw[t][2 * s + 1];
            ecu_mma16816<T>(sacc[t], a.x, a.y, a.z, a.w, b0, b1);
        }
    }
}

/* softmax of query row g over the warp's keys below nvalid: the lane holds keys 8 t + 2 tig +
   c, the other three of its group the rest; mx and l are the row's max and sum */
static __device__ __forceinline__ void
s_dm_softmax(const float (&sacc)[4][4], int nvalid, float (&pr)[4][2], float &mx, float &l)
{
    const unsigned full = 0xffffffffu;
    const int tig = threadIdx.x & 3;
    mx = -INFINITY, l = 0.0f;
#pragma unroll
    for (int t = 0; t < 4; t++)
#pragma unroll
        for (int c = 0; c < 2; c++) {
            const bool ok = 8 * t + 2 * tig + c < nvalid;
            pr[t][c] = ok ? sacc[t][c] + sacc[t][2 + c] : -INFINITY;
            mx = fmaxf(mx, pr[t][c]);
        }
    mx = fmaxf(mx, __shfl_xor_sync(full, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(full, mx, 2));
#pragma unroll
    for (int t = 0; t < 4; t++)
#pragma unroll
        for (int c = 0; c < 2; c++) {
            pr[t][c] = pr[t][c] == -INFINITY ? 0.0f : __expf(pr[t][c] - mx);
            l += pr[t][c];
        }
    l += __shfl_xor_sync(full, l, 1);
    l += __shfl_xor_sync(full, l, 2);
}

/* p.v, O^T = V^T P^T: m-tile i holds dims g DV + i (rows g) and g DV + MT + i (rows g + 8);
   B = ph (and, with LO, pl into oacc2) */
template <int HD, typename T, bool LO>
static __device__ __forceinline__ void s_dm_pv(float (&oacc)[s_dm<HD, T>::MT][4],
                                               float (&oacc2)[LO ? s_dm<HD, T>::MT : 1][4],
                                               const unsigned (&vw)[2][2][2][s_dm<HD, T>::VW],
                                               const unsigned (&ph)[2][2],
                                               const unsigned (&pl)[2][2])
{
    constexpr int DV = s_dm<HD, T>::DV, MT = s_dm<HD, T>::MT, VW = s_dm<HD, T>::VW;
#pragma unroll
    for (int i = 0; i < MT; i++) {
        oacc[i][0] = oacc[i][1] = oacc[i][2] = oacc[i][3] = 0.0f;
        if constexpr (LO)
            oacc2[i][0] = oacc2[i][1] = oacc2[i][2] = oacc2[i][3] = 0.0f;
    }
#pragma unroll
    for (int s = 0; s < 2; s++) {
        unsigned a0[DV], a1[DV];
        s_vpairs<T, VW>(vw[s][0][0], vw[s][0][1], a0);
        s_vpairs<T, VW>(vw[s][1][0], vw[s][1][1], a1);
#pragma unroll
        for (int i = 0; i < MT; i++) {
            ecu_mma16816<T>(oacc[i], a0[i], a0[MT + i], a1[i], a1[MT + i], ph[s][0], ph[s][1]);
            if constexpr (LO)
                ecu_mma16816<T>(oacc2[i], a0[i], a0[MT + i], a1[i], a1[MT + i], pl[s][0], pl[s][1]);
        }
    }
}

/* The warp's (dim, column) results into its shared rows wo (8 WS words), with LO hi + lo summed */
template <int HD, typename T, bool LO>
static __device__ __forceinline__ void s_dm_wo(float *wo,
                                               const float (&oacc)[s_dm<HD, T>::MT][4],
                                               const float (&oacc2)[LO ? s_dm<HD, T>::MT : 1][4])
{
    constexpr int MT = s_dm<HD, T>::MT;
    const int lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
    float *wow = wo + g * s_dm<HD, T>::WS + 2 * tig;
#pragma unroll
    for (int i = 0; i < MT; i++) {
        float2 r0 = make_float2(oacc[i][0], oacc[i][1]);
        float2 r8 = make_float2(oacc[i][2], oacc[i][3]);
        if constexpr (LO) {
            r0.x += oacc2[i][0], r0.y += oacc2[i][1];
            r8.x += oacc2[i][2], r8.y += oacc2[i][3];
        }
        *(float2 *)(wow + i * 8) = r0;        /* dim g DV + i */
        *(float2 *)(wow + (MT + i) * 8) = r8; /* dim g DV + MT + i */
    }
}

/* VL (st->attn_vlate, the default; ANVIL_CUDA_ATTN_VLATE=0 for the A/B): V rows are loaded
   after q.k (their round trip overlapping the softmax) instead of with K, so K's and V's
   registers are not live at once (bf16 at head_dim 128 held 164 registers, 3 blocks an SM);
   two round trips a warp, at 4 blocks an SM. The same values reach the same arithmetic. On the
   H200 (bench_ab, graphs): batch 256 x 2k bf16 KV 8243 -> 8463 tok/s, fp8 10574 -> 11104.
   A persistent grid of this kernel (a block fetching its next (tile, KV head)'s plan and rows
   while it merged the current one; 3 / 4 blocks an SM) ran at x0.93 to x0.97 on the H200 and
   was removed (2026-12-05).
   The warps' merge is the group kernel's (below): each (head, warp) weight computed once,
   a thread's outputs one head's, so a warp reads wo nearly without bank conflicts (before:
   s_warps_merge an element, its weights recomputed for each and 8-way conflicts on wo); the
   same sums in the same order, so the same bits. On the H100 (graphs, fp8 KV, alternating
   runs on one machine): batch 256 at a 512 prompt 18222 / 18223 -> 18936 / 18934 tok/s
   (x1.04), batch 256 at 2k context 10344 / 10351 -> 10882 / 10870 (x1.05).
   Where it stands (H100, ncu --set full on one launch at 2k context, 2026-12-06): fp8 KV at
   batch 256 414 us, 2.78 TB/s, 83 % of the DRAM's peak (76 registers, 6 blocks an SM);
   bf16 at batch 192 572 us, 2.92 TB/s, 87 % (108 registers, 4 blocks). Its warps wait on
   memory (long scoreboard 63 / 74 % of the samples, most of them before the first barrier,
   on K and q): little is left to win inside the kernel at long context. */
template <int HD, int G, typename T, bool VL = false>
static __global__ void __launch_bounds__(ECU_ATTN_WARPS * 32, VL ? 4 : 1)
    s_attn_decode_mma_kernel(const float *q /* (n_tok, n_head, HD) f32 */,
                             const T *k_cache,
                             const T *v_cache /* (n_blocks, bs, n_kv, HD) */,
                             const int4 *tiles /* (n_dec_tiles) {seq, tok, 1, split} */,
                             const int *tile_grp /* (n_dec_tiles) 1: a group tile's, or NULL */,
                             const int *tok_part /* (n_tok) */,
                             const int *seq_ctx /* (n_seq) */,
                             const int *block_tables /* (n_seq, mb) */,
                             int max_blocks,
                             int block_size,
                             int n_head,
                             int n_kv_head,
                             float scale,
                             float *part_o /* (n_parts, n_head, HD), kind pk (s_part_put) */,
                             float2 *part_ml /* (n_parts, n_head) {max, sum} */,
                             int pk)
{
    static_assert(G == 4 || G == 8, "the mma decode takes 4 or 8 query heads a KV head");
    static_assert(sizeof(T) <= 2, "the mma decode takes bf16 or fp8 KV");
    using D = s_dm<HD, T>;
    constexpr int KS = D::KS, DV = D::DV, MT = D::MT, WS = D::WS;
    __shared__ uint4 qf[KS][32]; /* q.k A fragments, in lane order */
    __shared__ float wm[ECU_ATTN_WARPS][G], wl[ECU_ATTN_WARPS][G];
    __shared__ float fw[G][ECU_ATTN_WARPS];                    /* the merge's weights */
    __shared__ float fs[G];                                    /* ... and sums */
    __shared__ __align__(16) float wo[ECU_ATTN_WARPS][8 * WS]; /* (dim, 8 columns) */
    const unsigned full = 0xffffffffu;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2;
    const size_t kv_row = (size_t)n_kv_head * HD;
    ecu_pdl_trigger();

    /* An item's tile and the lane's cache position (key wbase + lane, 0 past the context),
       from the plan alone: false for an empty tile of a graph step's layout or one a group
       tile computes (block-uniform) */
    auto resolve = [&](int ti, int h, s_dec_item_t &it) -> bool {
        const int4 tl = tiles[ti];
        if (tl.z == 0 || (tile_grp && tile_grp[ti]))
            return false;
        const int key_begin = tl.w * ECU_ATTN_SPLIT;
        const int key_end = min(key_begin + ECU_ATTN_SPLIT, seq_ctx[tl.x]);
        const int wbase = key_begin + warp * 32, key = wbase + lane;
        const int *table = block_tables + (size_t)tl.x * max_blocks;
        it.kvh = h, it.tok = tl.y, it.split = tl.w;
        it.nvalid = max(0, min(32, key_end - wbase));
        it.pos = lane < it.nvalid ? table[key / block_size] * block_size + key % block_size : 0;
        return true;
    };
    unsigned kw[4][D::KW], vw[2][2][2][D::VW];

    /* the plan is read before the PDL wait, see the FMA kernel */
    s_dec_item_t cur;
    int ti, h;
    s_dec_block(n_kv_head, &ti, &h);
    if (!resolve(ti, h, cur))
        return;
    ecu_pdl_wait();
    s_dm_load_k<HD, T>(kw, k_cache, cur.kvh, kv_row, cur.pos, cur.nvalid);
    if constexpr (!VL)
        s_dm_load_v<HD, T>(vw, v_cache, cur.kvh, kv_row, cur.pos, cur.nvalid);
    /* q's A fragments, heads g < G (rows past G are zeros) */
    for (int idx = threadIdx.x; idx < KS * 32; idx += blockDim.x) {
        const int s = idx >> 5, ln = idx & 31, gg = ln >> 2;
        const float *x = q + ((size_t)cur.tok * n_head + cur.kvh * G + gg) * HD;
        qf[s][ln] = s_dm_qfrag<HD, T>(gg < G ? x : nullptr, s, ln & 3, scale);
    }
    __syncthreads();

    float sacc[4][4];
    s_dm_qk<HD, T>(sacc, qf, kw);
    if constexpr (VL) /* K is used up: V's round trip overlaps the softmax */
        s_dm_load_v<HD, T>(vw, v_cache, cur.kvh, kv_row, cur.pos, cur.nvalid);
    float pr[4][2], mx, l;
    s_dm_softmax(sacc, cur.nvalid, pr, mx, l);
    /* B of p.v, k-step s: rows 2 tig + c from n-tile 2 s, rows 8 + 2 tig + c from 2 s + 1 */
    unsigned ph[2][2], pl[2][2];
#pragma unroll
    for (int s = 0; s < 2; s++)
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            s_hilo<T>(pr[2 * s + hh][0], pr[2 * s + hh][1], ph[s][hh], pl[s][hh]);
            if constexpr (G <= 4) { /* columns 4..7: p_lo of query g - 4, from lane ^ 16 */
                const unsigned o = __shfl_xor_sync(full, pl[s][hh], 16);
                ph[s][hh] = g < 4 ? ph[s][hh] : o;
            }
        }
    float oacc[MT][4], oacc2[G > 4 ? MT : 1][4];
    s_dm_pv<HD, T, (G > 4)>(oacc, oacc2, vw, ph, pl);
    /* columns: query n (G = 8: hi + lo summed here), or for G <= 4 hi of query n < 4 and lo of
       query n - 4 */
    s_dm_wo<HD, T, (G > 4)>(wo[warp], oacc, oacc2);
    if ((lane & 3) == 0 && g < G)
        wm[warp][g] = cur.nvalid > 0 ? mx : -INFINITY, wl[warp][g] = l;
    __syncthreads();
    /* s_warps_merge's sums in its order, each (head, warp) weight computed once (threads <
       G: the weights and the head's {max, sum}), a thread's outputs one head's (NT is a
       multiple of G), a warp's G heads of 32 / G dims (wo's words nearly conflict-free) */
    const size_t pi0 = (size_t)(tok_part[cur.tok] + cur.split) * n_head + cur.kvh * G;
    if (threadIdx.x < G) {
        const int qg = threadIdx.x;
        const float2 ml = s_merge_weights([&](int w) { return wm[w][qg]; },
                                          [&](int w) { return wl[w][qg]; }, fw[qg]);
        part_ml[pi0 + qg] = ml;
        fs[qg] = ml.y;
    }
    __syncthreads();
    constexpr int NT = ECU_ATTN_WARPS * 32;
    static_assert(NT % G == 0 && G * HD % NT == 0, "a thread's outputs are one head's");
    const int qg = threadIdx.x % G;
    float f[ECU_ATTN_WARPS];
    bool ok[ECU_ATTN_WARPS];
    const float inv = s_part_inv(fs[qg], pk);
#pragma unroll
    for (int w = 0; w < ECU_ATTN_WARPS; w++)
        f[w] = fw[qg][w], ok[w] = wm[w][qg] != -INFINITY;
#pragma unroll
    for (int i = 0; i < G * HD / NT; i++) {
        const int d = ((int)threadIdx.x + i * NT) / G, at2 = (d / DV) * WS + (d % DV) * 8 + qg;
        float acc = 0.0f;
#pragma unroll
        for (int w = 0; w < ECU_ATTN_WARPS; w++)
            if (ok[w])
                acc += (G <= 4 ? wo[w][at2] + wo[w][at2 + 4] : wo[w][at2]) * f[w];
        s_part_put(part_o, (pi0 + qg) * HD + d, acc, inv, pk);
    }
}

/* Group tiles (st->attn_group, the default; ANVIL_CUDA_ATTN_GROUP=0 for the A/B): a split
   that several decode sequences hold in the same cache blocks (the prompt a group of n
   samples shares) is computed by one block for all of them, so its K and V rows are read once
   instead of once a sequence. Before, a GRPO step's decodes read their prompt's rows n times:
   on the H100 (ncu, 16 prompts x 8 samples at a 1k prompt, a layer) L2 kept DRAM at 73 of 549
   MB, but the kernel still moved 631 MB out of L2 and took 156 us, against 200 for as many
   unshared sequences. A block's item is (group tile, KV head): its warps' K rows (as the
   decode kernel's), then for each m-tile of 8 query rows (two members' 4 heads, or one
   member's 8) q.k and the softmax, the p fragments to shared memory; then V, and for each
   m-tile p.v and the warps' merge into the members' partials (each (row, warp) weight
   computed once, a thread's outputs one row's, a warp's 4 dims of the 8 rows: no bank
   conflicts). Every row is computed with the decode kernel's instructions in its order
   (rows of an mma are independent; G = 4's hi and lo columns become the G = 8 layout's two
   accumulators, summed the same way; the merge sums the same products in the same order),
   so a sequence gets the same bits in a group tile as in its own (test_cuda_ops and
   generate_groups.sh hold the two to that): grouping never changes a result. Only full
   splits are grouped (the last, partial split of a sequence is its own). A persistent grid:
   blocks take items in turn, the count read from the plan (a graph step's grid does not
   depend on it). So that an item's loads are not waited on in turn, the K and V rows go
   through a stage in shared memory (cp.async, a warp's own rows): an item's K rows are
   copied while the item before runs p.v and its merge, its V rows while it runs q.k; the
   next item's tile, cache blocks and members (the plan holds a member's {token, first
   partial}) are looked up while an item computes, and an item's first q rows' loads go out
   before it waits for its K rows.
   On the H100: the first version (ncu, 16 prompts x 8 samples at a 1k prompt, a layer) took
   17.5 us (the decode kernel, the sequences' own splits) + 45 us (this kernel) against 156
   us; the GRPO workload (64 prompts x 8 samples, graphs) 10370 -> 12262 / 12193 tok/s with
   the same tokens. ncu's warp-state samples by instruction (--set full, --page source
   --print-source sass; batch 512 of 64 x 8 samples, 1k prompts) then put 34 % of the stalls
   in building q's fragments (each thread's 8 a load of the member's token, then of its q
   row, one after another), 30 % in the merge (a row's weights read back for every output),
   most of the rest in the waits for K, then V. Each change measured (ncu, the mean of a
   step's 32 launches at batch 512; GRPO, bf16 KV, against the first version in the same
   session): q rows 4 loads at a time, the next item's lookups during an item, a row's
   weights read once: 79.4 -> 60.1 us, GRPO 12277 / 12170 -> 12702 / 12704 tok/s; the stage:
   58.9 us, 12770 / 12719; the first q loads before the K wait: 58.1 us, 12858 / 12892
   against 12382 / 12371 (x1.04); with fp8 KV 13557 / 13545 against 12386 / 12368 (x1.09).
   A first stage of each lane's own fragment pieces (16-byte cp.async.cg at a 64-byte
   stride: each 32-byte sector fetched twice from L2) lost: one launch 82.6 -> 87.4 us, GRPO
   x0.99. Measured and left before: V loaded with K (162 registers; GRPO x0.99), 4 blocks an
   SM (level), L2 prefetches of the item's V and the next item's K and V rows
   (prefetch.global.L2: DRAM 277 -> 415 MB a layer at batch 512, GRPO x0.94). */
/* The group kernel's dynamic shared memory: the p fragments (pf), then q's fragments (qf,
   the q.k phase) and the warps' results (wo, the merge) in the same bytes, then the stage */
template <int HD, int G> static __host__ __device__ constexpr size_t s_gm_qfwo()
{
    constexpr size_t qf = (size_t)G * (HD / 16) * 32 * 16;
    constexpr size_t wo = (size_t)ECU_ATTN_WARPS * 8 * (HD / 8 * 8 + 8) * 4;
    return qf > wo ? qf : wo;
}
template <int HD, int G, typename T> static constexpr size_t s_gm_smem()
{
    return (size_t)G * ECU_ATTN_WARPS * 8 * 32 * 4 + s_gm_qfwo<HD, G>() +
           (size_t)ECU_ATTN_WARPS * 32 * HD * sizeof(T);
}

/* The group kernel's stage: a warp's 32 K (or V) rows of one KV head (R = HD sizeof(T)
   bytes each) in shared memory, copied by the warp with cp.async in 16-byte pieces (lanes
   on consecutive pieces of a row), piece c of row r at r R + 16 s_stage_swz(r, c): the
   swizzle puts the 8 lanes of a quarter warp on different banks when they read their
   fragments back (s_dm_load_k / s_dm_load_v's rows: K pieces tig R / 4 of rows 8 t + g, V
   pieces g R / 8 of rows 16 s + 8 h + 2 tig + c). After cp.async.wait_group a __syncwarp
   shows a lane the others' pieces; a __syncthreads lies between the reads of one item's
   rows and the copies of the next ones into the same bytes. */
template <int NC> static __device__ __forceinline__ int s_stage_swz(int r, int c)
{
    if constexpr (NC >= 16)
        return c ^ (((r ^ (r >> 1)) & 1) | ((r >> 2 & 1) << 2) | ((c >> 3 & 1) << 1));
    else if constexpr (NC == 8)
        return c ^ (r & 7);
    else
        return c ^ (r >> 1 & 3);
}
/* piece c of row r: its byte offset in a warp's stage */
template <int HD, typename T> static __device__ __forceinline__ int s_stage_at(int r, int c)
{
    constexpr int R = HD * (int)sizeof(T), NC = R / 16;
    return r * R + s_stage_swz<NC>(r, c) * 16;
}

template <int HD, typename T>
static __device__ __forceinline__ void
s_gm_stage(unsigned char *wst, const T *cache, int kvh, size_t kv_row, int pos)
{
    constexpr int R = HD * (int)sizeof(T), NC = R / 16;
    const int lane = threadIdx.x & 31;
    const char *base = (const char *)(cache + (size_t)kvh * HD);
#pragma unroll
    for (int k = 0; k < NC; k++) {
        const int idx = lane + 32 * k, r = idx / NC, c = idx % NC;
        const int p = __shfl_sync(0xffffffffu, pos, r);
        const unsigned dst = (unsigned)__cvta_generic_to_shared(wst + s_stage_at<HD, T>(r, c));
        const char *src = base + (size_t)p * kv_row * sizeof(T) + c * 16;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

static __device__ __forceinline__ void s_gm_stage_wait()
{
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    __syncwarp();
}

template <int HD, typename T>
static __device__ __forceinline__ void s_gm_get_k(unsigned (&kw)[4][s_dm<HD, T>::KW],
                                                  const unsigned char *wst)
{
    constexpr int R = HD * (int)sizeof(T), NC = R / 16;
    const int lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
#pragma unroll
    for (int t = 0; t < 4; t++)
#pragma unroll
        for (int i = 0; i < NC / 4; i++) {
            const int r = 8 * t + g, c = tig * (NC / 4) + i;
            const uint4 u = *(const uint4 *)(wst + s_stage_at<HD, T>(r, c));
            kw[t][4 * i] = u.x, kw[t][4 * i + 1] = u.y, kw[t][4 * i + 2] = u.z,
                      kw[t][4 * i + 3] = u.w;
        }
}

template <int HD, typename T>
static __device__ __forceinline__ void s_gm_get_v(unsigned (&vw)[2][2][2][s_dm<HD, T>::VW],
                                                  const unsigned char *wst)
{
    constexpr int R = HD * (int)sizeof(T), NC = R / 16;
    const int lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
#pragma unroll
    for (int s = 0; s < 2; s++)
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const int r = 16 * s + 8 * h + 2 * tig + c;
                unsigned *w = vw[s][h][c];
                if constexpr (R / 8 >= 16) {
#pragma unroll
                    for (int i = 0; i < R / 128; i++) {
                        const int cc = g * (NC / 8) + i;
                        const uint4 u = *(const uint4 *)(wst + s_stage_at<HD, T>(r, cc));
                        w[4 * i] = u.x, w[4 * i + 1] = u.y, w[4 * i + 2] = u.z, w[4 * i + 3] = u.w;
                    }
                } else { /* 8 bytes: half a piece */
                    const uint2 u =
                        *(const uint2 *)(wst + s_stage_at<HD, T>(r, g >> 1) + (g & 1) * 8);
                    w[0] = u.x, w[1] = u.y;
                }
            }
}

template <int HD, int G, typename T>
static __global__ void __launch_bounds__(ECU_ATTN_WARPS * 32, 3)
    s_attn_group_mma_kernel(const float *q /* (n_tok, n_head, HD) f32 */,
                            const T *k_cache,
                            const T *v_cache /* (n_blocks, bs, n_kv, HD) */,
                            const int4 *gtiles /* (n_gt) {seq, split, n, first member} */,
                            const int *gcount /* (1) n_gt */,
                            const int2 *gmembers /* the members' {token, first partial} */,
                            const int *block_tables /* (n_seq, mb) */,
                            int max_blocks,
                            int block_size,
                            int n_head,
                            int n_kv_head,
                            float scale,
                            float *part_o /* (n_parts, n_head, HD), kind pk (s_part_put) */,
                            float2 *part_ml /* (n_parts, n_head) {max, sum} */,
                            int pk)
{
    static_assert(G == 4 || G == 8, "the mma decode takes 4 or 8 query heads a KV head");
    using D = s_dm<HD, T>;
    constexpr int KS = D::KS, DV = D::DV, MT = D::MT, WS = D::WS, NT = ECU_ATTN_WARPS * 32;
    constexpr int MQ = 8 / G, NP = ECU_ATTN_GMAX / MQ; /* members an m-tile; m-tiles */
    constexpr int QI = NP * KS * 32 / NT, QB = QI < 4 ? QI : 4; /* q fragments a thread */
    static_assert(NP * KS * 32 % NT == 0 && QI % QB == 0, "q fragments split evenly");
    extern __shared__ __align__(16) unsigned char gm_smem[];
    unsigned(*pf)[ECU_ATTN_WARPS][8][32] = (unsigned(*)[ECU_ATTN_WARPS][8][32])gm_smem; /* [NP] */
    uint4(*qf)[KS][32] = (uint4(*)[KS][32])(pf + NP); /* [NP], the q.k phase */
    float(*wo)[8 * WS] = (float(*)[8 * WS])(pf + NP); /* [warps], the merge: qf's bytes */
    __shared__ float wm[NP][ECU_ATTN_WARPS][8], wl[NP][ECU_ATTN_WARPS][8];
    __shared__ float fw[NP][8][ECU_ATTN_WARPS]; /* the merge's weights */
    __shared__ long long rpi[NP][8];            /* the rows' partials (-1: no member) */
    __shared__ float rsum[NP][8];               /* ... and their sums */
    __shared__ int2 mem[2][ECU_ATTN_GMAX];      /* the item's members, the next's */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2;
    const size_t kv_row = (size_t)n_kv_head * HD;
    unsigned char *wst = (unsigned char *)(pf + NP) + s_gm_qfwo<HD, G>() +
                         (size_t)warp * 32 * HD * sizeof(T); /* the warp's stage */
    ecu_pdl_trigger();
    /* The plan (uploaded before the step, so read before the PDL wait) of the block's first
       item; each item then looks up the next one's while it computes, so no item waits on
       three lookups in turn (tile, block table, members) before its rows can be copied: a
       lane's cache block of its key (of a full split), threads < GMAX their member */
    const int n_items = *gcount * n_kv_head;
    auto blk_of = [&](int4 t) {
        const int key = t.y * ECU_ATTN_SPLIT + warp * 32 + lane;
        return block_tables[(size_t)t.x * max_blocks + key / block_size];
    };
    auto mem_of = [&](int4 t) {
        return (int)threadIdx.x < t.z ? gmembers[t.w + threadIdx.x] : make_int2(-1, -1);
    };
    int4 gt = make_int4(0, 0, 0, 0);
    int blk = 0;
    int2 mine = make_int2(-1, -1);
    if ((int)blockIdx.x < n_items) {
        gt = gtiles[blockIdx.x / n_kv_head];
        blk = blk_of(gt), mine = mem_of(gt);
    }
    auto pos_of = [&](int4 t, int b) {
        return b * block_size + (t.y * ECU_ATTN_SPLIT + warp * 32 + lane) % block_size;
    };
    ecu_pdl_wait(); /* every block waits: this kernel's end implies the one before's */
    int pos = pos_of(gt, blk);
    if ((int)blockIdx.x < n_items)
        s_gm_stage<HD, T>(wst, k_cache, blockIdx.x % n_kv_head, kv_row, pos);
    if (threadIdx.x < ECU_ATTN_GMAX)
        mem[0][threadIdx.x] = mine;
    __syncthreads();
    /* An item's K rows are copied into the stage while the item before runs p.v and its
       merge, its V rows while it builds q's fragments and runs q.k. Its members are in
       shared memory before it starts (written during the item before), so its first q rows'
       loads go out first, over the wait for its K rows. */
    for (int item = blockIdx.x, it = 0; item < n_items; item += gridDim.x, it ^= 1) {
        const int kvh = item % n_kv_head, nm = gt.z, np = (nm + MQ - 1) / MQ;
        const int2 *im = mem[it];
        /* m-tile j, row gg: member j MQ + gg / G, head gg % G (rows of absent members
           zero); QB rows' loads in flight at once */
        float4 v[QB];
        auto q_load = [&](int r0) {
#pragma unroll
            for (int r = 0; r < QB; r++) {
                const int idx = (int)threadIdx.x + (r0 + r) * NT;
                const int j = idx / (KS * 32), s = (idx >> 5) % KS, ln = idx & 31, gg = ln >> 2;
                const int m = j * MQ + gg / G;
                v[r] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (m < nm)
                    v[r] =
                        *(const float4 *)(q + ((size_t)im[m].x * n_head + kvh * G + gg % G) * HD +
                                          (ln & 3) * D::DQ + 4 * s);
            }
        };
        q_load(0);
        unsigned kw[4][D::KW];
        s_gm_stage_wait();
        s_gm_get_k<HD, T>(kw, wst);
        const int next = item + gridDim.x;
        const int4 gtn = next < n_items ? gtiles[next / n_kv_head] : make_int4(0, 0, 0, 0);
        __syncthreads(); /* the item before is done with shared memory; K is read */
        s_gm_stage<HD, T>(wst, v_cache, kvh, kv_row, pos);
#pragma unroll
        for (int r0 = 0; r0 < QI; r0 += QB) {
            if (r0 > 0)
                q_load(r0);
#pragma unroll
            for (int r = 0; r < QB; r++) {
                const int idx = (int)threadIdx.x + (r0 + r) * NT;
                const int j = idx / (KS * 32), s = (idx >> 5) % KS, ln = idx & 31, gg = ln >> 2;
                qf[j][s][ln] =
                    j * MQ + gg / G < nm ? s_dm_qfrag_v<T>(v[r], scale) : make_uint4(0, 0, 0, 0);
            }
        }
        __syncthreads();
        for (int j = 0; j < np; j++) {
            float sacc[4][4], pr[4][2], mx, l;
            s_dm_qk<HD, T>(sacc, qf[j], kw);
            s_dm_softmax(sacc, 32, pr, mx, l);
#pragma unroll
            for (int s = 0; s < 2; s++)
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    unsigned hi, lo;
                    s_hilo<T>(pr[2 * s + hh][0], pr[2 * s + hh][1], hi, lo);
                    pf[j][warp][2 * s + hh][lane] = hi, pf[j][warp][4 + 2 * s + hh][lane] = lo;
                }
            if ((lane & 3) == 0)
                wm[j][warp][g] = mx, wl[j][warp][g] = l;
        }
        /* the next item's cache blocks and members (its tile has arrived by now) */
        if (next < n_items)
            blk = blk_of(gtn), mine = mem_of(gtn);
        unsigned vw[2][2][2][D::VW];
        s_gm_stage_wait();
        s_gm_get_v<HD, T>(vw, wst);
        /* s_warps_merge's weights, once a (row, warp): exp(max_w - max) as it computes them
           (so the same bits), the row's {max, sum}, and where its partial goes */
        __syncthreads(); /* every warp's (max, sum) of every m-tile; V is read */
        if (next < n_items) {
            pos = pos_of(gtn, blk);
            s_gm_stage<HD, T>(wst, k_cache, next % n_kv_head, kv_row, pos);
        }
        if (threadIdx.x < np * 8) {
            const int j = threadIdx.x >> 3, qg = threadIdx.x & 7, m = j * MQ + qg / G;
            const float2 ml = s_merge_weights([&](int w) { return wm[j][w][qg]; },
                                              [&](int w) { return wl[j][w][qg]; }, fw[j][qg]);
            const long long pi =
                m < nm ? (long long)(im[m].y + gt.y) * n_head + kvh * G + qg % G : -1;
            rpi[j][qg] = pi, rsum[j][qg] = ml.y;
            if (pi >= 0)
                part_ml[pi] = ml;
        }
        /* the next item's members (read after the item's last q rows: the __syncthreads in
           the merge below publish them) */
        if (threadIdx.x < ECU_ATTN_GMAX)
            mem[it ^ 1][threadIdx.x] = mine;
        for (int j = 0; j < np; j++) {
            unsigned ph[2][2], pl[2][2];
#pragma unroll
            for (int s = 0; s < 2; s++)
#pragma unroll
                for (int hh = 0; hh < 2; hh++)
                    ph[s][hh] = pf[j][warp][2 * s + hh][lane],
                    pl[s][hh] = pf[j][warp][4 + 2 * s + hh][lane];
            float oacc[MT][4], oacc2[MT][4];
            s_dm_pv<HD, T, true>(oacc, oacc2, vw, ph, pl);
            __syncthreads(); /* the weights are in; m-tile j - 1's merge is done with wo */
            s_dm_wo<HD, T, true>(wo[warp], oacc, oacc2);
            __syncthreads();
            /* a thread's outputs: row qg (fixed: NT is a multiple of 8), dims threadIdx.x / 8
               + NT / 8 i; a warp's 32 are 4 dims of the 8 rows (wo's words in a row, no bank
               conflicts). The sum of s_warps_merge in its order. */
            const int qg = threadIdx.x & 7;
            const long long pi = rpi[j][qg];
            if (pi < 0)
                continue;
            float f[ECU_ATTN_WARPS];
            bool ok[ECU_ATTN_WARPS];
            const float inv = s_part_inv(rsum[j][qg], pk);
#pragma unroll
            for (int w = 0; w < ECU_ATTN_WARPS; w++)
                f[w] = fw[j][qg][w], ok[w] = wm[j][w][qg] != -INFINITY;
#pragma unroll
            for (int i = 0; i < HD * 8 / NT; i++) {
                const int d = (threadIdx.x >> 3) + i * (NT / 8);
                const int at2 = (d / DV) * WS + (d % DV) * 8 + qg;
                float acc = 0.0f;
#pragma unroll
                for (int w = 0; w < ECU_ATTN_WARPS; w++)
                    if (ok[w])
                        acc += wo[w][at2] * f[w];
                s_part_put(part_o, (size_t)pi * HD + d, acc, inv, pk);
            }
        }
        gt = gtn;
    }
}

/* Prefill tiles on the tensor cores (st->attn_pf_mma; ANVIL_CUDA_ATTN_PREFILL_MMA=0 keeps
   s_attn_kernel): bf16 KV as bf16, fp8 KV widened to f16 (exact), any number
   of query heads a KV head. The same tiles, partials and combine as s_attn_kernel: a block per
   (tile, KV head), its rows (token-major: row r is token r / G, head r % G) in passes of 64,
   a warp an m-tile of 16 rows. Per chunk of 32 positions the block stages K and V in shared
   memory as 16-bit rows (padded by 16 bytes, so ldmatrix reads them without bank conflicts);
   a warp computes S = Q K^T (A = q from shared memory, B = K rows by ldmatrix), masks the
   causal range, runs the online softmax on S's accumulators and adds P V (A = P straight
   from S's accumulators, B = V by ldmatrix.trans). q and p enter as hi + lo pairs, as in the
   decode kernel, so results stay within the FMA kernel's tolerance; the softmax is fp32.
   A warp stops at its last row's position, the block at the tile's. A chunk's K and V rows are
   loaded while the chunk before is computed: bf16 by cp.async into the other of two stages
   (AS), fp8 into registers (widened to f16 on the way to shared memory); the block table's
   entries for a chunk are read a chunk ahead and a pass's q in 16-byte loads, eight in flight
   (EARLY; bf16 only, fp8 lost with it). At head_dim 64 the kernel is held to 128 registers (4
   blocks an SM; 140 without). The plan sorts the prefill tiles by length (s_plan_sort_prefill) and
   the grid runs them longest first with a tile's KV heads next to each other, so the short ones
   fill the tail (in the plan's sequence order the longest tiles of the last sequence started late).
   Each is an A/B (ANVIL_CUDA_ATTN_PF_LPT, _ASYNC, _EARLY) with the
   same tiles, partials and bits. Before them, on the
   H100 (ncu, a layer over two 1024-token prompts): 320 us without the register prefetch and
   the order, 298 with them at 174 registers (2 blocks an SM), 278 held to 168 by the launch
   bounds (3 blocks an SM, 20 / 60 bytes of spills for bf16 / fp8); the FMA kernel took 2.8 to
   3.0 ms. */
#define ECU_ATTN_PF_KC 32 /* positions a chunk of the prefill mma kernel */

/* four 8 x 8 matrices of 16-bit values from shared memory (lane l gives the address of row
   l % 8 of matrix l / 8): r[i] holds matrix i's row g, columns 2 tig and 2 tig + 1, or with TR
   its column g, rows 2 tig and 2 tig + 1 */
template <bool TR> static __device__ __forceinline__ void s_ldsm4(unsigned (&r)[4], const void *p)
{
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    if constexpr (TR)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a)
                     : "memory");
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a)
                     : "memory");
}

/* 8 KV values as loaded (s_kv8_t: 16 bytes of bf16, 8 of fp8) and as the mma's 16-bit pairs
   (fp8 widened to f16) */
template <typename T> using s_kv8_t = typename std::conditional<sizeof(T) == 1, uint2, uint4>::type;
static __device__ __forceinline__ uint4 s_kv8_pairs(uint4 u)
{
    return u;
}
static __device__ __forceinline__ uint4 s_kv8_pairs(uint2 u)
{
    return make_uint4(s_e4m3x2_h2(u.x), s_e4m3x2_h2(u.x >> 16), s_e4m3x2_h2(u.y),
                      s_e4m3x2_h2(u.y >> 16));
}

/* d0 += (hi + lo) B0 and d1 += (hi + lo) B1: A as a hi + lo pair of fragments against two
   n-tiles of B (b[0..1], b[2..3], as one ldmatrix.x4 gives them) */
template <typename T>
static __device__ __forceinline__ void s_mma_hilo2(float (&d0)[4],
                                                   float (&d1)[4],
                                                   const unsigned (&hi)[4],
                                                   const unsigned (&lo)[4],
                                                   const unsigned (&b)[4])
{
    ecu_mma16816<T>(d0, hi[0], hi[1], hi[2], hi[3], b[0], b[1]);
    ecu_mma16816<T>(d0, lo[0], lo[1], lo[2], lo[3], b[0], b[1]);
    ecu_mma16816<T>(d1, hi[0], hi[1], hi[2], hi[3], b[2], b[3]);
    ecu_mma16816<T>(d1, lo[0], lo[1], lo[2], lo[3], b[2], b[3]);
}

/* the prefill kernel's dynamic shared memory: q hi / lo, then one (AS: two) chunks of K and V */
template <int HD, bool AS> static constexpr size_t s_pf_smem()
{
    return (size_t)(2 * ECU_ATTN_WARPS * 16 + (AS ? 4 : 2) * ECU_ATTN_PF_KC) * (HD + 8) * 2;
}

/* 16 bytes global -> shared, asynchronous; n = 0 writes zeros (nothing read) */
static __device__ __forceinline__ void s_cp16(void *dst, const void *src, int n)
{
    const unsigned a = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(a), "l"(src), "r"(n)
                 : "memory");
}

template <int HD, typename T, bool ASYNC, bool EARLY>
static __global__ void __launch_bounds__(ECU_ATTN_WARPS * 32, HD > 64 ? 3 : 4)
    s_attn_prefill_mma_kernel(const float *q /* (n_tok, n_head, HD) f32 */,
                              const T *k_cache,
                              const T *v_cache /* (n_blocks, bs, n_kv, HD) */,
                              const int4 *tiles /* (n_tiles) {seq, tok0, n_q, 0} */,
                              const int *tok_part /* (n_tok) */,
                              const int *seq_qstart /* (n_seq + 1) */,
                              const int *seq_ctx /* (n_seq) */,
                              const int *block_tables /* (n_seq, mb) */,
                              int max_blocks,
                              int block_size,
                              int n_head,
                              int n_kv_head,
                              float scale,
                              float *part_o /* (n_parts, n_head, HD) f32 */,
                              float2 *part_ml /* (n_parts, n_head) {max, sum} */)
{
    static_assert(sizeof(T) <= 2, "the mma prefill takes bf16 or fp8 KV");
    /* AS: K / V chunks copied by cp.async into two stages (bf16 only: fp8 is widened on the
       way, through registers) */
    constexpr bool AS = ASYNC && sizeof(T) == 2;
    constexpr int LD = HD + 8;              /* a shared row, in 16-bit values */
    constexpr int RP = ECU_ATTN_WARPS * 16; /* rows a pass */
    constexpr int KC = ECU_ATTN_PF_KC, NT = KC / 8, KS = HD / 16, ND = HD / 8;
    extern __shared__ __align__(16) unsigned short pf_smem[];
    unsigned short *qh = pf_smem, *ql = qh + RP * LD; /* q hi / lo (RP, LD) */
    unsigned short *ks = ql + RP * LD; /* stage b: K at ks + 2 b KC LD, V KC LD after it */
    const unsigned full = 0xffffffffu;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, tig = lane & 3;
    /* the plan's last tiles first: with the plan's longest-first order (attn_pf_lpt, a grid
       of tiles x KV heads, the heads inner) its tiles are sorted by length; without it, a
       sequence's later tiles span more positions */
    const bool flat = gridDim.y == 1 && n_kv_head > 1;
    const int n_tl = flat ? (int)gridDim.x / n_kv_head : (int)gridDim.x;
    const int4 tl = tiles[n_tl - 1 - (flat ? (int)blockIdx.x / n_kv_head : (int)blockIdx.x)];
    const int kvh = flat ? (int)blockIdx.x % n_kv_head : (int)blockIdx.y, G = n_head / n_kv_head;
    const int seq = tl.x, tok0 = tl.y, nq = tl.z;
    const int q0 = seq_qstart[seq], nq_seq = seq_qstart[seq + 1] - q0;
    const int pos0 = seq_ctx[seq] - nq_seq + (tok0 - q0);
    const int key_end = pos0 + nq; /* the tile's last position + 1 */
    const int *table = block_tables + (size_t)seq * max_blocks;
    const size_t kv_row = (size_t)n_kv_head * HD;
    const int rows = nq * G;
    /* ldmatrix rows and columns of the lane: A (q), B of q.k (K), B of p.v (V, transposed) */
    const int ar = (lane & 7) + ((lane >> 3) & 1) * 8, ac = (lane >> 4) * 8;
    const int bk = (lane & 7) + (lane >> 4) * 8, bd = ((lane >> 3) & 1) * 8;
    const int vk = ar, vd = ac;

    /* a chunk's K and V rows, NI pieces of 8 values a thread: loaded while the chunk before
       is computed, stored to shared memory after it (AS: copied by cp.async) */
    constexpr int NI = KC * HD / 8 / (ECU_ATTN_WARPS * 32);
    s_kv8_t<T> rk[AS ? 1 : NI], rv[AS ? 1 : NI];
    /* EARLY: the cache blocks of the next chunk's pieces, read from the block table a chunk
       ahead (else where the piece's address is formed, a dependent load in the way) */
    int eb[EARLY ? NI : 1];
    auto lookup = [&](int c0) {
        if constexpr (EARLY) {
#pragma unroll
            for (int i = 0; i < NI; i++) {
                const int c = c0 + (threadIdx.x + i * ECU_ATTN_WARPS * 32) / (HD / 8);
                eb[i] = c < key_end ? __ldg(table + c / block_size) : 0;
            }
        }
    };
    /* piece i (of chunk c0) at position c < key_end: its offset in the cache */
    auto piece = [&](int i, int c) -> size_t {
        int blk;
        if constexpr (EARLY)
            blk = eb[i];
        else
            blk = table[c / block_size];
        const int idx = threadIdx.x + i * ECU_ATTN_WARPS * 32;
        return ((size_t)blk * block_size + c % block_size) * kv_row + (size_t)kvh * HD +
               (idx % (HD / 8)) * 8;
    };
    /* AS: chunk c0's rows copied into stage b (positions past the tile's range as zeros) */
    auto issue = [&](int c0, int b) {
        unsigned short *kd = ks + 2 * b * KC * LD, *vd = kd + KC * LD;
#pragma unroll
        for (int i = 0; i < NI; i++) {
            const int idx = threadIdx.x + i * ECU_ATTN_WARPS * 32, c = c0 + idx / (HD / 8);
            const int at = idx / (HD / 8) * LD + (idx % (HD / 8)) * 8;
            const size_t off = c < key_end ? piece(i, c) : 0;
            s_cp16(kd + at, k_cache + off, c < key_end ? 16 : 0);
            s_cp16(vd + at, v_cache + off, c < key_end ? 16 : 0);
        }
        asm volatile("cp.async.commit_group;\n" ::: "memory");
    };
    auto fetch = [&](int c0) {
#pragma unroll
        for (int i = 0; i < NI; i++) {
            const int c = c0 + (threadIdx.x + i * ECU_ATTN_WARPS * 32) / (HD / 8);
            rk[i] = rv[i] = {};
            if (c < key_end) {
                const size_t off = piece(i, c);
                rk[i] = *(const s_kv8_t<T> *)(k_cache + off);
                rv[i] = *(const s_kv8_t<T> *)(v_cache + off);
            }
        }
    };
    /* q's rows of the pass into shared memory as hi / lo pairs, scaled; EARLY (and q 16-byte
       aligned): 16-byte loads, QB of them issued before the first is used */
    const bool q16 = ((uintptr_t)q & 15) == 0;
    auto stage_q = [&](int row0) {
        if constexpr (EARLY) {
            if (q16) {
                constexpr int QV = RP * HD / 4 / (ECU_ATTN_WARPS * 32), QB = HD > 64 ? 8 : 4;
#pragma unroll
                for (int j0 = 0; j0 < QV; j0 += QB) {
                    float4 x[QB];
#pragma unroll
                    for (int j = 0; j < QB; j++) {
                        const int idx = threadIdx.x + (j0 + j) * ECU_ATTN_WARPS * 32;
                        const int r = idx / (HD / 4), d = 4 * (idx % (HD / 4)), rr = row0 + r;
                        x[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                        if (rr < rows)
                            x[j] = __ldg((const float4 *)(q +
                                                          ((size_t)(tok0 + rr / G) * n_head +
                                                           kvh * G + rr % G) *
                                                              HD +
                                                          d));
                    }
#pragma unroll
                    for (int j = 0; j < QB; j++) {
                        const int idx = threadIdx.x + (j0 + j) * ECU_ATTN_WARPS * 32;
                        const int r = idx / (HD / 4), d = 4 * (idx % (HD / 4));
                        uint2 hi, lo;
                        s_hilo<T>(x[j].x * scale, x[j].y * scale, hi.x, lo.x);
                        s_hilo<T>(x[j].z * scale, x[j].w * scale, hi.y, lo.y);
                        *(uint2 *)(qh + r * LD + d) = hi;
                        *(uint2 *)(ql + r * LD + d) = lo;
                    }
                }
                return;
            }
        }
        for (int idx = threadIdx.x; idx < RP * HD / 2; idx += blockDim.x) {
            const int r = idx / (HD / 2), d = 2 * (idx % (HD / 2)), rr = row0 + r;
            float2 x = make_float2(0.0f, 0.0f);
            if (rr < rows)
                x = *(const float2 *)(q +
                                      ((size_t)(tok0 + rr / G) * n_head + kvh * G + rr % G) * HD +
                                      d);
            unsigned hi, lo;
            s_hilo<T>(x.x * scale, x.y * scale, hi, lo);
            *(unsigned *)(qh + r * LD + d) = hi;
            *(unsigned *)(ql + r * LD + d) = lo;
        }
    };

    for (int row0 = 0; row0 < rows; row0 += RP) {
        __syncthreads(); /* the pass before is done with q and the stages */
        lookup(0);
        if constexpr (AS)
            issue(0, 0);
        else
            fetch(0);
        lookup(KC);
        stage_q(row0);
        /* the warp's rows wr0 + g (a) and wr0 + g + 8 (b); rows past the tile take its last
           row's position and are not stored */
        const int wr0 = row0 + 16 * warp;
        const bool active = wr0 < rows; /* warp-uniform */
        const int pa = pos0 + min(wr0 + g, rows - 1) / G,
                  pb = pos0 + min(wr0 + g + 8, rows - 1) / G;
        const int wend = pos0 + min(wr0 + 15, rows - 1) / G + 1; /* the warp's positions */
        float o[ND][4], ma = -INFINITY, mb = -INFINITY, la = 0.0f, lb = 0.0f;
#pragma unroll
        for (int n = 0; n < ND; n++)
            o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
        for (int c0 = 0, it = 0; c0 < key_end; c0 += KC, it++) {
            __syncthreads(); /* q staged; the chunk before used up */
            const int sb = AS ? it & 1 : 0;
            if constexpr (AS) {
                if (c0 + KC < key_end) { /* the next chunk into the other stage */
                    issue(c0 + KC, sb ^ 1);
                    lookup(c0 + 2 * KC);
                    asm volatile("cp.async.wait_group 1;\n" ::: "memory");
                } else {
                    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
                }
            } else {
#pragma unroll
                for (int i = 0; i < NI; i++) {
                    const int idx = threadIdx.x + i * ECU_ATTN_WARPS * 32;
                    const int at = idx / (HD / 8) * LD + (idx % (HD / 8)) * 8;
                    *(uint4 *)(ks + at) = s_kv8_pairs(rk[i]);
                    *(uint4 *)(ks + KC * LD + at) = s_kv8_pairs(rv[i]);
                }
            }
            __syncthreads();
            if constexpr (!AS)
                if (c0 + KC < key_end) {
                    fetch(c0 + KC);
                    lookup(c0 + 2 * KC);
                }
            if (!active || c0 >= wend)
                continue;
            const unsigned short *kb = ks + 2 * sb * KC * LD, *vs = kb + KC * LD;
            /* S = Q K^T: NT n-tiles of 8 positions */
            float s[NT][4];
#pragma unroll
            for (int n = 0; n < NT; n++)
                s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < KS; kk++) {
                unsigned ah[4], al[4];
                s_ldsm4<false>(ah, qh + (16 * warp + ar) * LD + 16 * kk + ac);
                s_ldsm4<false>(al, ql + (16 * warp + ar) * LD + 16 * kk + ac);
#pragma unroll
                for (int n = 0; n < NT; n += 2) {
                    unsigned b[4];
                    s_ldsm4<false>(b, kb + (8 * n + bk) * LD + 16 * kk + bd);
                    s_mma_hilo2<T>(s[n], s[n + 1], ah, al, b);
                }
            }
            /* the causal mask and the online softmax: the lane holds positions c0 + 8 n +
               2 tig + c of rows a (s[n][c]) and b (s[n][2 + c]); position 0 is in every
               row's range, so the maxima are finite from the first chunk on */
            float xa = ma, xb = mb;
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    const int key = c0 + 8 * n + 2 * tig + c;
                    s[n][c] = key <= pa ? s[n][c] : -INFINITY;
                    s[n][2 + c] = key <= pb ? s[n][2 + c] : -INFINITY;
                    xa = fmaxf(xa, s[n][c]), xb = fmaxf(xb, s[n][2 + c]);
                }
            xa = fmaxf(xa, __shfl_xor_sync(full, xa, 1));
            xa = fmaxf(xa, __shfl_xor_sync(full, xa, 2));
            xb = fmaxf(xb, __shfl_xor_sync(full, xb, 1));
            xb = fmaxf(xb, __shfl_xor_sync(full, xb, 2));
            const float fa = __expf(ma - xa), fb = __expf(mb - xb); /* 0 on the first chunk */
            ma = xa, mb = xb, la *= fa, lb *= fb;
#pragma unroll
            for (int n = 0; n < ND; n++)
                o[n][0] *= fa, o[n][1] *= fa, o[n][2] *= fb, o[n][3] *= fb;
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    s[n][c] = __expf(s[n][c] - ma), s[n][2 + c] = __expf(s[n][2 + c] - mb);
                    la += s[n][c], lb += s[n][2 + c];
                }
#pragma unroll
            for (int j = 0; j < KC / 16; j++) {
                /* O += P V, k-step j = positions 16 j ..: A from n-tiles 2 j and 2 j + 1 */
                unsigned ph[4], pl[4];
                s_hilo<T>(s[2 * j][0], s[2 * j][1], ph[0], pl[0]);
                s_hilo<T>(s[2 * j][2], s[2 * j][3], ph[1], pl[1]);
                s_hilo<T>(s[2 * j + 1][0], s[2 * j + 1][1], ph[2], pl[2]);
                s_hilo<T>(s[2 * j + 1][2], s[2 * j + 1][3], ph[3], pl[3]);
#pragma unroll
                for (int n = 0; n < ND; n += 2) {
                    unsigned b[4];
                    s_ldsm4<true>(b, vs + (16 * j + vk) * LD + 8 * n + vd);
                    s_mma_hilo2<T>(o[n], o[n + 1], ph, pl, b);
                }
            }
        }
        if (!active)
            continue;
        la += __shfl_xor_sync(full, la, 1);
        la += __shfl_xor_sync(full, la, 2);
        lb += __shfl_xor_sync(full, lb, 1);
        lb += __shfl_xor_sync(full, lb, 2);
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int r = wr0 + g + 8 * hf;
            if (r >= rows)
                continue;
            const size_t pi = (size_t)tok_part[tok0 + r / G] * n_head + kvh * G + r % G;
#pragma unroll
            for (int n = 0; n < ND; n++)
                *(float2 *)(part_o + pi * HD + 8 * n + 2 * tig) =
                    make_float2(o[n][2 * hf], o[n][2 * hf + 1]);
            if (tig == 0)
                part_ml[pi] = hf ? make_float2(mb, lb) : make_float2(ma, la);
        }
    }
}

/* The prefill tiles [t0, t0 + nt) on the tensor cores: with the plan's longest-first order
   (st->attn_pf_lpt) a grid of tiles x KV heads (the heads inner), else (nt, KV heads); K / V
   through cp.async stages for bf16 unless st->attn_pf_async is off; q and the block table
   read early for bf16 unless st->attn_pf_early is off */
template <int HD, typename T>
static int s_attn_launch_prefill_mma(ecu_state_t *st,
                                     const ecu_attn_plan_t *p,
                                     int t0,
                                     int nt,
                                     const float *q,
                                     const void *kc,
                                     const void *vc,
                                     int n_head,
                                     int n_kv_head,
                                     int block_size)
{
    /* the stages and the early loads for bf16 only: with fp8 KV the early loads took 2353
       us a layer against 1981 without (H100 ncu, two 4096-token prompts) */
    const int as = st->attn_pf_async && sizeof(T) == 2, ea = st->attn_pf_early && sizeof(T) == 2;
    auto kernel = as ? (ea ? s_attn_prefill_mma_kernel<HD, T, true, true>
                           : s_attn_prefill_mma_kernel<HD, T, true, false>)
                     : (ea ? s_attn_prefill_mma_kernel<HD, T, false, true>
                           : s_attn_prefill_mma_kernel<HD, T, false, false>);
    const size_t smem = as ? s_pf_smem<HD, true>() : s_pf_smem<HD, false>();
    static bool attr_set[2][2]; /* per instantiation of this launcher: [as][ea] */
    if (!attr_set[as][ea]) {
        ECU_CHECK(
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        attr_set[as][ea] = true;
    }
    const dim3 grid = st->attn_pf_lpt && n_kv_head > 1 ? dim3((unsigned)nt * n_kv_head)
                                                       : dim3(nt, n_kv_head);
    kernel<<<grid, ECU_ATTN_WARPS * 32, smem, st->stream>>>(
        q, (const T *)kc, (const T *)vc, p->tiles + t0, p->tok_part, p->seq_qstart, p->seq_ctx,
        p->block_tables, p->max_blocks, block_size, n_head, n_kv_head, 1.0f / sqrtf((float)HD),
        (float *)st->part_o.ptr, (float2 *)st->part_ml.ptr);
    ECU_LAUNCHED();
    return 0;
}

/* PER values (2 or 4) of a partial's row as fp32: fp32 partials in one 8- or 16-byte load, 16-bit
   ones (s_part_put) in one 4- or 8-byte load; through L2 (__ldcg). */
template <int PER, typename P>
static __device__ __forceinline__ void s_part_get(const P *at, float (&v)[PER])
{
    if constexpr (sizeof(P) == 4) {
        if constexpr (PER == 4) {
            const float4 x = __ldcg((const float4 *)at);
            v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
        } else {
            const float2 x = __ldcg((const float2 *)at);
            v[0] = x.x, v[1] = x.y;
        }
    } else {
        unsigned u[PER / 2];
        if constexpr (PER == 4) {
            const uint2 x = __ldcg((const uint2 *)at);
            u[0] = x.x, u[1] = x.y;
        } else {
            u[0] = __ldcg((const unsigned *)at);
        }
#pragma unroll
        for (int e = 0; e < PER / 2; e++) {
            float2 f;
            if constexpr (std::is_same<P, __half>::value)
                f = __half22float2(*(const __half2 *)&u[e]);
            else
                f = __bfloat1622float2(*(const __nv_bfloat162 *)&u[e]);
            v[2 * e] = f.x, v[2 * e + 1] = f.y;
        }
    }
}

/* One warp's merge of a (token, head)'s ns partials (rows part + row, stride n_head * HD
   elements; {max, sum} at ml, stride n_head), this lane's PER dimensions, into r. fp32 ones
   are unnormalised o: the weights exp(m_i - max); 16-bit ones are o / sum, weighted by sum_i *
   exp(m_i - max). Either way normalised by the sum of l_i * exp(m_i - max). */
template <int PER, typename P>
static __device__ __forceinline__ void s_combine_row(
    const P *part, size_t row, const float2 *ml, int ns, int n_head, int lane, float (&r)[PER])
{
    constexpr bool norm = sizeof(P) < 4;      /* 16-bit partials hold o / sum */
    float2 m0 = make_float2(-INFINITY, 0.0f); /* this lane's split of the first round */
    if (lane < ns)
        m0 = __ldcg(ml + (size_t)lane * n_head);
    float mx = m0.x;
    for (int i = lane + 32; i < ns; i += 32)
        mx = fmaxf(mx, __ldcg(ml + (size_t)i * n_head).x);
    mx = ecu_warp_max(mx);
    const size_t stride = (size_t)n_head * PER * 32;
    const P *po = part + row;
    float sum = 0.0f, acc[PER] = {};
    for (int c0 = 0; c0 < ns; c0 += 32) {
        const int nc = min(32, ns - c0);
        float2 m = c0 == 0 ? m0 : make_float2(-INFINITY, 0.0f);
        if (c0 > 0 && lane < nc)
            m = __ldcg(ml + (size_t)(c0 + lane) * n_head);
        const float w = lane < nc && m.x != -INFINITY ? __expf(m.x - mx) : 0.0f;
        if (lane < nc)
            sum += m.y * w;
        const float wo = norm ? m.y * w : w; /* the weight of this lane's split's row */
        const P *pc = po + (size_t)c0 * stride;
#pragma unroll 8
        for (int i = 0; i < nc; i++) {
            const float wi = __shfl_sync(0xffffffffu, wo, i);
            float v[PER];
            s_part_get<PER>(pc + i * stride, v);
#pragma unroll
            for (int e = 0; e < PER; e++)
                acc[e] += v[e] * wi;
        }
    }
    sum = ecu_warp_sum(sum);
#pragma unroll
    for (int e = 0; e < PER; e++)
        r[e] = sum > 0.0f ? acc[e] / sum : 0.0f;
}

/* The merge of token t's partials for head h, a warp per (token, head), four heads a block:
   the max over the token's splits, each split's weight exp(m_i - max) computed once by one
   lane (lane i holds split i of a round of 32, 4096 positions), the weighted partials summed
   in split order (a lane owns HD / 32 dimensions and reads them in one load a split, every
   load of a round issued before the first is used), normalised by the sum of l_i * weight_i
   (a warp sum: a fixed order for a given number of splits). No shared memory, no block
   barrier. Partials are read through L2 (__ldcg). With PK, the decode partials' kind
   (s_part_put), 16-bit, a decode token's (its first partial below n_dec) are read as such and
   a prefill token's as fp32; with PK = ECU_PART_F32 every token's are fp32. It replaced a
   block per (token, head) holding the weights in shared memory (the same bits up to 32
   splits): on the H100 (2026-12-05, graphs) +0.2 % at batch 16, +0.7 % at batch 256, +0.5 % at
   256 x 2k fp8. */
template <int HD, int PK>
static __global__ void __launch_bounds__(128)
    s_attn_combine_warp_kernel(float *out /* (n_tok, n_head, HD) f32 */,
                               const float *part_o /* (n_parts, n_head, HD) */,
                               const float2 *part_ml /* (n_parts, n_head) */,
                               const int *tok_part,
                               const int *tok_nsplit,
                               int n_head,
                               void *low /* out's rounded twin or NULL */,
                               int kind,
                               int n_dec)
{
    constexpr int PER = HD / 32;
    static_assert(PER == 2 || PER == 4, "head_dim 64 or 128");
    ecu_pdl_trigger();
    const int lane = threadIdx.x & 31, t = blockIdx.x, h = blockIdx.y * 4 + (threadIdx.x >> 5);
    const int base = tok_part[t], ns = tok_nsplit[t];
    ecu_pdl_wait();
    if (h >= n_head)
        return; /* a whole warp: no barrier below */
    const float2 *ml = part_ml + (size_t)base * n_head + h;
    const size_t row = ((size_t)base * n_head + h) * HD + lane * PER;
    float r[PER];
    if constexpr (PK != ECU_PART_F32) {
        using P = typename std::conditional<PK == ECU_PART_F16, __half, __nv_bfloat16>::type;
        if (base < n_dec)
            s_combine_row<PER>((const P *)part_o, row, ml, ns, n_head, lane, r);
        else
            s_combine_row<PER>(part_o, row, ml, ns, n_head, lane, r);
    } else {
        s_combine_row<PER>(part_o, row, ml, ns, n_head, lane, r);
    }
    const size_t o = ((size_t)t * n_head + h) * HD + lane * PER;
    if constexpr (PER == 4) {
        const float4 v = make_float4(r[0], r[1], r[2], r[3]);
        *(float4 *)(out + o) = v;
        ecu_twin_store4(low, kind, o / 4, v);
    } else {
        *(float2 *)(out + o) = make_float2(r[0], r[1]);
        ecu_twin_store(low, kind, o, r[0]);
        ecu_twin_store(low, kind, o + 1, r[1]);
    }
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
        p->block_tables, p->max_blocks, block_size, n_head, n_kv_head, 1.0f / sqrtf((float)HD),
        (float *)st->part_o.ptr, (float2 *)st->part_ml.ptr, st->attn_part);
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

template <int HD, int G, typename T>
static int s_attn_launch_decode(ecu_state_t *st, const ecu_attn_plan_t *p, const float *q,
                                const void *kc, const void *vc, int n_head, int n_kv_head,
                                int block_size)
{
    dim3 grid = st->attn_kv_inner ? dim3((unsigned)(p->n_dec_tiles * n_kv_head))
                                  : dim3(p->n_dec_tiles, n_kv_head);
    auto kernel = s_attn_decode_kernel<HD, G, T>; /* the decode kernels share a signature */
    bool group = false; /* the plan's group tiles run (their decode tiles return at once) */
    if constexpr ((G == 4 || G == 8) && sizeof(T) <= 2)
        if (st->attn_mma) {
            kernel = st->attn_vlate ? s_attn_decode_mma_kernel<HD, G, T, true>
                                    : s_attn_decode_mma_kernel<HD, G, T>;
            group = p->n_gt > 0 && p->group_bs == block_size;
        }
    const float scale = 1.0f / sqrtf((float)HD);
    ECU_CHECK(ecu_launch(st, kernel, grid, dim3(ECU_ATTN_WARPS * 32), 0, q, (const T *)kc,
                         (const T *)vc, (const int4 *)p->tiles,
                         (const int *)(group ? p->tile_grp : NULL), p->tok_part, p->seq_ctx,
                         p->block_tables, p->max_blocks, block_size, n_head, n_kv_head, scale,
                         (float *)st->part_o.ptr, (float2 *)st->part_ml.ptr, st->attn_part));
    if constexpr ((G == 4 || G == 8) && sizeof(T) <= 2)
        if (group) {
            /* a persistent grid of the resident blocks, or as many as the layout can have
               items (the items are counted on the device: any grid computes them all) */
            constexpr size_t smem = s_gm_smem<HD, G, T>();
            static int per_sm = 0; /* per instantiation */
            auto gk = s_attn_group_mma_kernel<HD, G, T>;
            if (per_sm == 0) {
                ECU_CHECK(cudaFuncSetAttribute(gk, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)smem));
                ECU_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gk,
                                                                        ECU_ATTN_WARPS * 32, smem));
                per_sm = per_sm > 0 ? per_sm : 1;
            }
            const long items = (long)p->max_gt * n_kv_head;
            const long most = (long)st->n_sm * per_sm;
            ECU_CHECK(ecu_launch(
                st, gk, dim3((unsigned)(items < most ? items : most)), dim3(ECU_ATTN_WARPS * 32),
                smem, q, (const T *)kc, (const T *)vc, (const int4 *)p->gtiles,
                (const int *)p->gcount, (const int2 *)p->gmembers, (const int *)p->block_tables,
                p->max_blocks, block_size, n_head, n_kv_head, scale, (float *)st->part_o.ptr,
                (float2 *)st->part_ml.ptr, st->attn_part));
        }
    return 0;
}

template <int HD, typename T>
static int s_attn_launch_hd(ecu_state_t *st, const ecu_attn_plan_t *p, const float *q,
                            const void *kc, const void *vc, int n_head, int n_kv_head,
                            int block_size)
{
    int G = n_head / n_kv_head, nd = p->n_dec_tiles, np = p->n_tiles - nd;
    if (nd > 0) {
        /* decode tiles: always this launch, whatever else the batch holds */
        if (G == 1)
            ECU_TRY((s_attn_launch_decode<HD, 1, T>(st, p, q, kc, vc, n_head, n_kv_head,
                                                    block_size)));
        else if (G == 2)
            ECU_TRY((s_attn_launch_decode<HD, 2, T>(st, p, q, kc, vc, n_head, n_kv_head,
                                                    block_size)));
        else if (G == 4)
            ECU_TRY((s_attn_launch_decode<HD, 4, T>(st, p, q, kc, vc, n_head, n_kv_head,
                                                    block_size)));
        else if (G == 8)
            ECU_TRY((s_attn_launch_decode<HD, 8, T>(st, p, q, kc, vc, n_head, n_kv_head,
                                                    block_size)));
        else
            ECU_TRY((s_attn_launch_rows<HD, T>(st, p, 0, nd, G, q, kc, vc, n_head, n_kv_head,
                                               block_size)));
    }
    if (np > 0) {
        if constexpr (sizeof(T) <= 2)
            if (st->attn_pf_mma)
                return s_attn_launch_prefill_mma<HD, T>(st, p, nd, np, q, kc, vc, n_head, n_kv_head,
                                                        block_size);
        ECU_TRY((s_attn_launch_rows<HD, T>(st, p, nd, np, p->q_tile * G, q, kc, vc, n_head,
                                           n_kv_head, block_size)));
    }
    return 0;
}

extern "C" const char *eng_cuda_decode_attention(eng_backend_t *be, int n_head, int n_kv_head)
{
    if (!be || !be->name || strcmp(be->name, "cuda") != 0 || n_head <= 0 || n_kv_head <= 0)
        return NULL;
    const int g = n_head % n_kv_head ? 0 : n_head / n_kv_head;
    const bool mma = ecu_st(be)->attn_mma && be->kv_dtype != ENG_DTYPE_F32 && (g == 4 || g == 8);
    return mma ? "mma" : "fma";
}

extern "C" int eng_cuda_attn_group_tiles(eng_backend_t *be)
{
    if (!be || !be->name || strcmp(be->name, "cuda") != 0)
        return -EINVAL;
    return ecu_st(be)->plan.n_gt;
}

extern "C" const char *eng_cuda_attn_part(eng_backend_t *be)
{
    if (!be || !be->name || strcmp(be->name, "cuda") != 0)
        return NULL;
    return ecu_part_name(ecu_st(be)->attn_part);
}

extern "C" int ecu_attention(eng_backend_t *be, float *out, const float *q, const void *k_cache,
                             const void *v_cache, const eng_attn_batch_t *batch, int n_head,
                             int n_kv_head, int head_dim, int block_size)
{
    ecu_state_t *st = ecu_st(be);
    const ecu_attn_plan_t *p;
    ecu_twin_drop(st);
    if (!out || !q || !k_cache || !v_cache || !batch || n_head <= 0 || n_kv_head <= 0 ||
        n_head % n_kv_head || block_size <= 0)
        return -EINVAL;
    if (head_dim != 64 && head_dim != 128) {
        ANV_ERROR("cuda attention: head_dim %d is not supported (64, 128)", head_dim);
        return ANV_EUNSUPPORTED;
    }
    st->kv_block_size = block_size; /* for the plans prepare() builds from now on */
    ECU_TRY(ecu_attn_plan(st, batch, block_size, &p));
    ECU_TRY(ecu_buf_reserve(&st->part_o, (size_t)p->n_parts * n_head * head_dim * 4));
    ECU_TRY(ecu_buf_reserve(&st->part_ml, (size_t)p->n_parts * n_head * sizeof(float2)));
    int rc;
#define ECU_ATTN_KV(HD)                                                                        \
    (be->kv_dtype == ENG_DTYPE_BF16                                                            \
         ? s_attn_launch_hd<HD, __nv_bfloat16>(st, p, q, k_cache, v_cache, n_head, n_kv_head,  \
                                               block_size)                                     \
     : be->kv_dtype == ENG_DTYPE_F8E4M3                                                        \
         ? s_attn_launch_hd<HD, __nv_fp8_e4m3>(st, p, q, k_cache, v_cache, n_head, n_kv_head,  \
                                               block_size)                                     \
         : s_attn_launch_hd<HD, float>(st, p, q, k_cache, v_cache, n_head, n_kv_head,          \
                                       block_size))
    rc = head_dim == 64 ? ECU_ATTN_KV(64) : ECU_ATTN_KV(128);
#undef ECU_ATTN_KV
    if (rc)
        return rc;
    /* the combine also writes the O projection's rounded input (its twin, ecu_twin_begin;
       the dtype of the linear before, QKV's, taken for O's) */
    void *low;
    int kind;
    ECU_TRY(ecu_twin_begin(st, out, p->n_tok, n_head * head_dim, st->twin_dtype, &low, &kind));
    const float *po = (const float *)st->part_o.ptr;
    const float2 *pm = (const float2 *)st->part_ml.ptr;
    const dim3 gw(p->n_tok, (n_head + 3) / 4);
    const int *tp = (const int *)p->tok_part, *tn = (const int *)p->tok_nsplit, nd = p->n_dec_tiles;
#define ECU_COMBINE(HD, PK)                                                                        \
    ecu_launch(st, s_attn_combine_warp_kernel<HD, PK>, gw, dim3(128), 0, out, po, pm, tp, tn,      \
               n_head, low, kind, nd)
#define ECU_COMBINE_HD(HD)                                                                         \
    (st->attn_part == ECU_PART_F16    ? ECU_COMBINE(HD, ECU_PART_F16)                              \
     : st->attn_part == ECU_PART_BF16 ? ECU_COMBINE(HD, ECU_PART_BF16)                             \
                                      : ECU_COMBINE(HD, ECU_PART_F32))
    const cudaError_t e = head_dim == 64 ? ECU_COMBINE_HD(64) : ECU_COMBINE_HD(128);
#undef ECU_COMBINE_HD
#undef ECU_COMBINE
    if (e != cudaSuccess)
        ecu_twin_drop(st);
    ECU_CHECK(e);
    return 0;
}

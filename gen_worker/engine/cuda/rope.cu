/*  rope.cu - rotary embedding (HF rotate_half), the paged K/V write, and both fused.

    One block per token (the fused rope_kv_store: several, each with a share of the token's
    heads, so one decode token is not one SM's serial loop). The angles come from a table of
    the step's positions built once (ecu_rope_table; shared with the QKV GEMV's rope epilogue
    and reused by every layer of a prepared step) and follow the CPU exactly: inv_freq =
    1 / powf(theta, 2i / d) (the power taken in double and rounded, as a correctly rounded
    powf would) and f = pos * inv_freq in fp32, then cosf / sinf (full-precision, not the fast
    intrinsics: positions reach thousands of radians). The fused rope_kv_store reads one
    stacked q|k|v row per token, writes the rotated q for attention and stores rotated k and
    v straight into the paged pools in the KV dtype (bf16, f32 or fp8 e4m3), so k never makes
    a round trip; it is launched with PDL (see eng_cuda_internal.h).
*/
#include "eng_cuda_internal.h"

/* The rope angles of a step's rows, (n, head_dim / 2) {cos, sin}: computed once a step
   (ecu_rope_angle: a double pow and full-precision sincos, whose slow path held registers and
   a stack frame in every QKV GEMV, 113 registers at batch 1 against 80 without the epilogue,
   and made the batch-256 rope + KV store 15.6 us a layer for 6 MB on the H200) instead of by
   every row group or pair of every layer. The angles are computed before the PDL wait and
   stored after it (the kernel before may still read the table of an earlier call). */
static __global__ void s_rope_angles_kernel(float2 *tab /* (n, head_dim / 2) */,
                                            const int32_t *pos /* (n) device */, int n,
                                            int head_dim, float theta)
{
    const int hh = head_dim / 2, t = blockIdx.x * blockDim.x + threadIdx.x;
    float c = 0.0f, s = 0.0f;
    if (t < n * hh)
        ecu_rope_angle(pos[t / hh], t % hh, head_dim, theta, &c, &s);
    ecu_pdl_trigger();
    ecu_pdl_wait();
    if (t < n * hh)
        tab[t] = make_float2(c, s);
}

int ecu_rope_table(ecu_state_t *st, const int32_t *pos, int n, int head_dim, float theta,
                   const float2 **tab)
{
    const int32_t *d_pos;
    ECU_TRY(ecu_idx(st, ECU_IDX_POS, pos, n, &d_pos));
    const bool prepared = d_pos == st->d_pos && st->step_valid;
    *tab = (const float2 *)st->rope_tab.ptr;
    if (prepared && st->rope_tab_ok && st->rope_tab_n == n && st->rope_tab_hd == head_dim &&
        st->rope_tab_theta == theta)
        return 0;
    const int hh = head_dim / 2;
    st->rope_tab_ok = 0; /* until the new table is launched: a grow loses the old one */
    ECU_TRY(ecu_buf_reserve(&st->rope_tab, (size_t)n * hh * sizeof(float2)));
    *tab = (const float2 *)st->rope_tab.ptr;
    ECU_CHECK(ecu_launch(st, s_rope_angles_kernel, dim3((unsigned)((n * hh + 255) / 256)),
                         dim3(256), 0, (float2 *)st->rope_tab.ptr, d_pos, n, head_dim, theta));
    st->rope_tab_ok = prepared;
    st->rope_tab_n = n, st->rope_tab_hd = head_dim, st->rope_tab_theta = theta;
    return 0;
}

static __global__ void s_rope_kernel(float *q /* (n_tok, n_head, hd) f32 */,
                                     float *k /* (n_tok, n_kv_head, hd) f32 */,
                                     const float2 *angles /* (n_tok, hd / 2) ecu_rope_table */,
                                     int n_head, int n_kv_head, int head_dim)
{
    int t = blockIdx.x, half = head_dim / 2;
    int n_pairs = (n_head + n_kv_head) * half;
    for (int idx = threadIdx.x; idx < n_pairs; idx += blockDim.x) {
        int h = idx / half, i = idx % half;
        float *x = h < n_head ? q + ((size_t)t * n_head + h) * head_dim
                              : k + ((size_t)t * n_kv_head + (h - n_head)) * head_dim;
        const float2 cs = angles[(size_t)t * half + i];
        const float c = cs.x, s = cs.y;
        float a = x[i], b = x[i + half];
        x[i] = a * c - b * s;
        x[i + half] = b * c + a * s;
    }
}

extern "C" int ecu_rope(eng_backend_t *be, float *q, float *k, const int32_t *pos, int n_tok,
                        int n_head, int n_kv_head, int head_dim, float theta)
{
    ecu_state_t *st = ecu_st(be);
    const float2 *tab;
    if (!q || !k || !pos || n_tok <= 0 || n_head <= 0 || n_kv_head <= 0 || head_dim < 2 ||
        head_dim % 2)
        return -EINVAL;
    ECU_TRY(ecu_rope_table(st, pos, n_tok, head_dim, theta, &tab));
    s_rope_kernel<<<n_tok, 256, 0, st->stream>>>(q, k, tab, n_head, n_kv_head, head_dim);
    ECU_LAUNCHED();
    return 0;
}

template <typename T>
static __global__ void s_kv_store_kernel(T *k_cache, T *v_cache /* (n_blocks, bs, n_kv, hd) T */,
                                         const float *k, const float *v /* (n_tok, n_kv, hd) */,
                                         const int32_t *slots /* (n_tok) device */, int row)
{
    int t = blockIdx.x;
    size_t dst = (size_t)slots[t] * row, src = (size_t)t * row;
    for (int i = threadIdx.x; i < row; i += blockDim.x) {
        k_cache[dst + i] = ecu_from_f32<T>(k[src + i]);
        v_cache[dst + i] = ecu_from_f32<T>(v[src + i]);
    }
}

extern "C" int ecu_kv_store(eng_backend_t *be, void *k_cache, void *v_cache, const float *k,
                            const float *v, const int32_t *slots, int n_tok, int n_kv_head,
                            int head_dim)
{
    ecu_state_t *st = ecu_st(be);
    const int32_t *d_slots;
    if (!k_cache || !v_cache || !k || !v || !slots || n_tok <= 0 || n_kv_head <= 0 ||
        head_dim <= 0)
        return -EINVAL;
    ECU_TRY(ecu_idx(st, ECU_IDX_SLOTS, slots, n_tok, &d_slots));
    int row = n_kv_head * head_dim;
    if (be->kv_dtype == ENG_DTYPE_BF16)
        s_kv_store_kernel<<<n_tok, 256, 0, st->stream>>>(
            (__nv_bfloat16 *)k_cache, (__nv_bfloat16 *)v_cache, k, v, d_slots, row);
    else if (be->kv_dtype == ENG_DTYPE_F8E4M3)
        s_kv_store_kernel<<<n_tok, 256, 0, st->stream>>>(
            (__nv_fp8_e4m3 *)k_cache, (__nv_fp8_e4m3 *)v_cache, k, v, d_slots, row);
    else
        s_kv_store_kernel<<<n_tok, 256, 0, st->stream>>>((float *)k_cache, (float *)v_cache, k, v,
                                                         d_slots, row);
    ECU_LAUNCHED();
    return 0;
}

/* grid (n_tok, parts): part y rotates its share of the token's (q and k head, pair) items
   and copies its share of v, one item per thread, the angles from the step's table */
template <typename T>
static __global__ void s_rope_store_kernel(float *q_out /* (n_tok, n_head, hd) f32 */,
                                           const float *qkv /* (n_tok, (nh + 2 nkv) hd) f32 */,
                                           T *k_cache, T *v_cache /* (n_blocks, bs, nkv, hd) */,
                                           const float2 *angles /* (n_tok, hd / 2) */,
                                           const int32_t *slots /* device */, int n_head,
                                           int n_kv_head, int head_dim)
{
    ecu_pdl_trigger();
    ecu_pdl_wait();
    int t = blockIdx.x, half = head_dim / 2;
    int kv_row = n_kv_head * head_dim;
    const float *src = qkv + (size_t)t * (n_head + 2 * n_kv_head) * head_dim;
    size_t slot = (size_t)slots[t] * kv_row;
    int n_pairs = (n_head + n_kv_head) * half;
    int per = (n_pairs + gridDim.y - 1) / gridDim.y, lo = blockIdx.y * per;
    int hi = lo + per < n_pairs ? lo + per : n_pairs;
    for (int idx = lo + threadIdx.x; idx < hi; idx += blockDim.x) {
        int h = idx / half, i = idx % half;
        const float *x = src + (size_t)h * head_dim; /* q heads then k heads */
        const float2 cs = angles[(size_t)t * half + i];
        const float c = cs.x, s = cs.y;
        float a = x[i], b = x[i + half];
        float ra = a * c - b * s, rb = b * c + a * s;
        if (h < n_head) {
            float *o = q_out + ((size_t)t * n_head + h) * head_dim;
            o[i] = ra;
            o[i + half] = rb;
        } else {
            size_t o = slot + (size_t)(h - n_head) * head_dim;
            k_cache[o + i] = ecu_from_f32<T>(ra);
            k_cache[o + i + half] = ecu_from_f32<T>(rb);
        }
    }
    const float *v = src + (size_t)(n_head + n_kv_head) * head_dim;
    int vper = (kv_row + gridDim.y - 1) / gridDim.y, vlo = blockIdx.y * vper;
    int vhi = vlo + vper < kv_row ? vlo + vper : kv_row;
    for (int i = vlo + threadIdx.x; i < vhi; i += blockDim.x)
        v_cache[slot + i] = ecu_from_f32<T>(v[i]);
}

/* N consecutive values rounded to T (ecu_from_f32) with one store at p (N sizeof(T)-byte
   aligned) */
template <typename T, int N> struct alignas(N * sizeof(T)) s_vals {
    T h[N];
};
template <typename T, int N>
static __device__ __forceinline__ void s_store_n(T *p, const float (&v)[N])
{
    s_vals<T, N> o;
#pragma unroll
    for (int j = 0; j < N; j++)
        o.h[j] = ecu_from_f32<T>(v[j]);
    *(s_vals<T, N> *)p = o;
}

/* s_rope_store_kernel with wider accesses (st->rope_vec, head_dim a multiple of 4, the rows
   16-byte aligned): an item is two neighbouring pairs (i, i + 1) of a head, so x, its
   partner half, the angles and q are read and written 8 or 16 bytes at a time and k stored
   2 values at a time; v 4 values an item. Each value is computed as there (the same
   expression), so the results are the same bits. */
template <typename T>
static __global__ void s_rope_store2_kernel(float *q_out /* (n_tok, n_head, hd) f32 */,
                                            const float *qkv /* (n_tok, (nh + 2 nkv) hd) f32 */,
                                            T *k_cache,
                                            T *v_cache /* (n_blocks, bs, nkv, hd) */,
                                            const float2 *angles /* (n_tok, hd / 2) */,
                                            const int32_t *slots /* device */,
                                            int n_head,
                                            int n_kv_head,
                                            int head_dim)
{
    ecu_pdl_trigger();
    ecu_pdl_wait();
    const int t = blockIdx.x, half = head_dim / 2, hq = half / 2; /* items a head */
    const int kv_row = n_kv_head * head_dim;
    const float *src = qkv + (size_t)t * (n_head + 2 * n_kv_head) * head_dim;
    const size_t slot = (size_t)slots[t] * kv_row;
    const int n_items = (n_head + n_kv_head) * hq;
    const int per = (n_items + gridDim.y - 1) / gridDim.y, lo = blockIdx.y * per;
    const int hi = lo + per < n_items ? lo + per : n_items;
    for (int idx = lo + threadIdx.x; idx < hi; idx += blockDim.x) {
        const int h = idx / hq, i = 2 * (idx % hq);
        const float *x = src + (size_t)h * head_dim; /* q heads then k heads */
        const float4 cs = *(const float4 *)(angles + (size_t)t * half + i);
        const float2 a = *(const float2 *)(x + i), b = *(const float2 *)(x + i + half);
        const float ra0 = a.x * cs.x - b.x * cs.y, rb0 = b.x * cs.x + a.x * cs.y;
        const float ra1 = a.y * cs.z - b.y * cs.w, rb1 = b.y * cs.z + a.y * cs.w;
        if (h < n_head) {
            float *o = q_out + ((size_t)t * n_head + h) * head_dim;
            *(float2 *)(o + i) = make_float2(ra0, ra1);
            *(float2 *)(o + i + half) = make_float2(rb0, rb1);
        } else {
            T *o = k_cache + slot + (size_t)(h - n_head) * head_dim;
            s_store_n<T, 2>(o + i, {ra0, ra1});
            s_store_n<T, 2>(o + i + half, {rb0, rb1});
        }
    }
    const float *v = src + (size_t)(n_head + n_kv_head) * head_dim;
    const int n4 = kv_row / 4, vper = (n4 + gridDim.y - 1) / gridDim.y, vlo = blockIdx.y * vper;
    const int vhi = vlo + vper < n4 ? vlo + vper : n4;
    for (int i = vlo + threadIdx.x; i < vhi; i += blockDim.x) {
        const float4 u = *(const float4 *)(v + 4 * (size_t)i);
        s_store_n<T, 4>(v_cache + slot + 4 * (size_t)i, {u.x, u.y, u.z, u.w});
    }
}

#define ECU_ROPE_THREADS 128

/* one launch of the fused rope + store in KV type T: s_rope_store2_kernel (two pairs an item)
   when vec, else s_rope_store_kernel (the two share a signature) */
template <typename T>
static int s_rope_store_go(ecu_state_t *st,
                           bool vec,
                           float *q_out,
                           const float *qkv,
                           void *k_cache,
                           void *v_cache,
                           const float2 *tab,
                           const int32_t *d_slots,
                           int n_tok,
                           int n_head,
                           int n_kv_head,
                           int head_dim)
{
    const int items = (n_head + n_kv_head) * (head_dim / 2) / (vec ? 2 : 1);
    const dim3 grid(n_tok, (items + ECU_ROPE_THREADS - 1) / ECU_ROPE_THREADS);
    ECU_CHECK(ecu_launch(st, vec ? s_rope_store2_kernel<T> : s_rope_store_kernel<T>, grid,
                         dim3(ECU_ROPE_THREADS), 0, q_out, qkv, (T *)k_cache, (T *)v_cache, tab,
                         d_slots, n_head, n_kv_head, head_dim));
    return 0;
}

extern "C" int ecu_rope_kv_store(eng_backend_t *be, float *q_out, const float *qkv, void *k_cache,
                                 void *v_cache, const int32_t *pos, const int32_t *slots,
                                 int n_tok, int n_head, int n_kv_head, int head_dim, float theta)
{
    ecu_state_t *st = ecu_st(be);
    const int32_t *d_slots;
    const float2 *tab;
    if (!q_out || !qkv || !k_cache || !v_cache || !pos || !slots || n_tok <= 0 || n_head <= 0 ||
        n_kv_head <= 0 || head_dim < 2 || head_dim % 2)
        return -EINVAL;
    ECU_TRY(ecu_rope_table(st, pos, n_tok, head_dim, theta, &tab));
    ECU_TRY(ecu_idx(st, ECU_IDX_SLOTS, slots, n_tok, &d_slots));
    /* two pairs an item: the rows (and so every 8- and 16-byte access) aligned */
    const bool vec =
        st->rope_vec && head_dim % 4 == 0 && ((uintptr_t)q_out | (uintptr_t)qkv) % 16 == 0;
    if (be->kv_dtype == ENG_DTYPE_BF16)
        return s_rope_store_go<__nv_bfloat16>(st, vec, q_out, qkv, k_cache, v_cache, tab, d_slots,
                                              n_tok, n_head, n_kv_head, head_dim);
    if (be->kv_dtype == ENG_DTYPE_F8E4M3)
        return s_rope_store_go<__nv_fp8_e4m3>(st, vec, q_out, qkv, k_cache, v_cache, tab, d_slots,
                                              n_tok, n_head, n_kv_head, head_dim);
    return s_rope_store_go<float>(st, vec, q_out, qkv, k_cache, v_cache, tab, d_slots, n_tok,
                                  n_head, n_kv_head, head_dim);
}

extern "C" int ecu_copy_block(eng_backend_t *be, void *k_cache, void *v_cache, int src, int dst,
                              int block_size, int n_kv_head, int head_dim)
{
    ecu_state_t *st = ecu_st(be);
    if (!k_cache || !v_cache || src < 0 || dst < 0 || block_size <= 0 || n_kv_head <= 0 ||
        head_dim <= 0)
        return -EINVAL;
    if (src == dst)
        return 0;
    size_t blk = (size_t)block_size * n_kv_head * head_dim * ecu_dtype_size(be->kv_dtype);
    ECU_CHECK(cudaMemcpyAsync((char *)k_cache + (size_t)dst * blk,
                              (char *)k_cache + (size_t)src * blk, blk, cudaMemcpyDeviceToDevice,
                              st->stream));
    ECU_CHECK(cudaMemcpyAsync((char *)v_cache + (size_t)dst * blk,
                              (char *)v_cache + (size_t)src * blk, blk, cudaMemcpyDeviceToDevice,
                              st->stream));
    return 0;
}

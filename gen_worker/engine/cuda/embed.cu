/*  embed.cu - row gathers: the token embedding and gather_rows.

    One block per output row, threads striding over the row; the embedding widens the table's
    dtype to fp32 as it reads. gather_rows may be asked to gather in place (out == x), which
    the CPU does row by row with memmove; rows are gathered through a scratch copy then.
    gather_rows is launched with PDL (see eng_cuda_internal.h).
*/
#include "eng_cuda_internal.h"

template <typename T>
static __global__ void s_embed_kernel(float *out /* (n_tok, dim) f32 */,
                                      const T *table /* (vocab, dim) T */,
                                      const int32_t *ids /* (n_tok) device */, int dim)
{
    size_t src = (size_t)ids[blockIdx.x] * dim, dst = (size_t)blockIdx.x * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        out[dst + i] = ecu_ld<T>(table, src + i);
}

static int s_embed_launch(cudaStream_t stream, float *out, const void *table, eng_dtype_t dtype,
                          const int32_t *ids, int n_tok, int dim)
{
    int threads = dim >= 1024 ? 512 : 128;
    switch (dtype) {
    case ENG_DTYPE_F32:
        s_embed_kernel<<<n_tok, threads, 0, stream>>>(out, (const float *)table, ids, dim);
        break;
    case ENG_DTYPE_BF16:
        s_embed_kernel<<<n_tok, threads, 0, stream>>>(out, (const __nv_bfloat16 *)table, ids,
                                                       dim);
        break;
    case ENG_DTYPE_F16:
        s_embed_kernel<<<n_tok, threads, 0, stream>>>(out, (const __half *)table, ids, dim);
        break;
    default:
        return -EINVAL;
    }
    ECU_LAUNCHED();
    return 0;
}

extern "C" int ecu_embedding(eng_backend_t *be, float *out, const void *table, eng_dtype_t dtype,
                             const int32_t *ids, int n_tok, int dim)
{
    ecu_state_t *st = ecu_st(be);
    const int32_t *d_ids;
    if (!out || !table || !ids || n_tok <= 0 || dim <= 0 || ecu_dtype_size(dtype) == 0)
        return -EINVAL;
    ECU_TRY(ecu_idx(st, ECU_IDX_IDS, ids, n_tok, &d_ids));
    return s_embed_launch(st->stream, out, table, dtype, d_ids, n_tok, dim);
}

static __global__ void s_gather_kernel(float *out /* (n_rows, dim) f32 */,
                                       const float *x /* (n_tok, dim) f32 */,
                                       const int32_t *rows /* (n_rows) device */, int dim)
{
    ecu_pdl_trigger(); /* the lm_head GEMV after it may start fetching */
    ecu_pdl_wait();
    size_t src = (size_t)rows[blockIdx.x] * dim, dst = (size_t)blockIdx.x * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        out[dst + i] = x[src + i];
}

extern "C" int ecu_gather_rows(eng_backend_t *be, float *out, const float *x, const int32_t *rows,
                               int n_rows, int dim)
{
    ecu_state_t *st = ecu_st(be);
    const int32_t *d_rows;
    if (!out || !x || !rows || n_rows <= 0 || dim <= 0)
        return -EINVAL;
    ECU_TRY(ecu_idx(st, ECU_IDX_ROWS, rows, n_rows, &d_rows));
    size_t bytes = (size_t)n_rows * dim * sizeof(float);
    int threads = dim >= 1024 ? 512 : 128;
    if (out == x) {
        ECU_TRY(ecu_buf_reserve(&st->xconv, bytes));
        ECU_CHECK(ecu_launch(st, s_gather_kernel, dim3(n_rows), dim3(threads), 0,
                             (float *)st->xconv.ptr, x, d_rows, dim));
        ECU_CHECK(cudaMemcpyAsync(out, st->xconv.ptr, bytes, cudaMemcpyDeviceToDevice,
                                  st->stream));
        return 0;
    }
    ECU_CHECK(ecu_launch(st, s_gather_kernel, dim3(n_rows), dim3(threads), 0, out, x, d_rows, dim));
    return 0;
}

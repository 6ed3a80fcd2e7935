/*  eng_cuda.h - the CUDA backend of eng_ops.h (one GPU, one stream).

    All ops of eng_backend_t plus the optional extensions (mem_info, prepare, rope_kv_store,
    swiglu_fused, sample). Weights and KV pools live in device memory; activations are fp32;
    GEMMs run through cuBLASLt (activations rounded to the weight dtype, fp32 accumulation)
    except for n <= 8 rows, where a GEMV kernel reads fp32 activations directly. The KV pools
    are bf16 by default (ENG_DTYPE_F32 on request, for bit-close comparisons with the CPU).
    Everything is queued on one stream; only download, sync and sample wait for it.
*/
#ifndef ENG_CUDA_H
#define ENG_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "eng_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The CUDA backend with its KV pools in kv_dtype (ENG_DTYPE_BF16, ENG_DTYPE_F32 or
   ENG_DTYPE_F8E4M3: e4m3, half the bytes of bf16, for long contexts; its accuracy cost is
   measured by tests/engine_cuda). eng_backend_new("cuda") picks it from $ANVIL_CUDA_KV.
   Returns NULL with the reason logged when no GPU is usable. */
eng_backend_t *eng_cuda_backend_new_kv(eng_dtype_t kv_dtype);

/* True when a CUDA device is visible (for tests that skip without one). */
int eng_cuda_available(void);

/* Fills n elements of device memory `dst` of `dtype` with uniform values in
   [center - scale, center + scale] from a counter-based generator keyed by seed (no host
   copy: used to build benchmark-sized random models on the GPU). */
int eng_cuda_fill_random(eng_backend_t *be, void *dst, eng_dtype_t dtype, size_t n,
                         uint64_t seed, float center, float scale);

/* Measures a device-to-device copy of `bytes` (median of iters): *gbps = (read + written)
   bytes / s. The reference bandwidth of the benchmarks. */
int eng_cuda_copy_bandwidth(eng_backend_t *be, size_t bytes, int iters, double *gbps);

/* Counters of graph_step since the backend was created: graphs captured, graph launches
   (replays), steps run eagerly (first use of a key, buffers moved, or capture failed). */
int eng_cuda_graph_stats(eng_backend_t *be, long long *captures, long long *launches,
                         long long *eager);

/* Host seconds graph_step has spent since the backend was created: preparing its steps (the
   step arrays' upload and the attention plan), of which building and uploading the plan; in
   cudaGraphLaunch of captured graphs; and in the steps that ran eagerly or were captured (a
   key's first two uses: record(), the capture, its instantiation and first launch). */
int eng_cuda_graph_times(
    eng_backend_t *be, double *prepare_s, double *plan_s, double *launch_s, double *build_s);

/* Fixes the column segments a row of the small-batch GEMV (matmul.cu) for later products:
   1, 2, 4 or 8 where the shape allows, 0 to choose them by the grid's waves (the default);
   also read at start from $ANVIL_CUDA_GEMV_SEGS. For benchmarks (anvil-bench-engine
   --linear-sweep). -EINVAL (nothing changed) for other values or a backend that is not
   CUDA. */
int eng_cuda_gemv_segs(eng_backend_t *be, int segs);

/* The most rows a product takes the GEMV with (matmul.cu; above, cuBLASLt): rows 0 to 8 sets
   it for later products, rows < 0 leaves it. Returns the value in effect, or -EINVAL for
   other rows or a backend that is not CUDA. The default is 1 (on the H100 the GEMV ran
   batches 2 to 8 at 0.90 to 0.27x cuBLASLt's speed); also read at start from
   $ANVIL_CUDA_GEMV_MAX. For tests and the A/B. */
int eng_cuda_gemv_rows(eng_backend_t *be, int rows);

/* The most rows a product above the GEMV's takes the tensor-core skinny product with
   (skinny.cu; above, cuBLASLt): rows 0 to 16 sets it for later products, rows < 0 leaves it.
   Returns the value in effect, or -EINVAL for other rows or a backend that is not CUDA. The
   default is 8 (on the H100 batches 2 to 8 decode 6.7 to 7.5 % faster on it than on cuBLASLt,
   batch 16 3.6 % slower); also read at start from $ANVIL_CUDA_SKINNY_MAX. For tests and the
   A/B. */
int eng_cuda_skinny_rows(eng_backend_t *be, int rows);

/* Device name into buf (for reports). */
int eng_cuda_device_name(eng_backend_t *be, char *buf, size_t len);

/* The decode attention kernel that CUDA backend be runs for a model with n_head query and
   n_kv_head KV heads, for reports: "mma" (bf16 or fp8 KV and 4 or 8 query heads a KV head,
   unless ANVIL_CUDA_ATTN_MMA=0) or "fma"; NULL when be is not a CUDA backend. */
const char *eng_cuda_decode_attention(eng_backend_t *be, int n_head, int n_kv_head);

/* The group tiles of CUDA backend be's latest attention plan (decode splits several sequences
   hold in the same cache blocks, computed once for all of them; attention.cu), or -EINVAL
   when be is not a CUDA backend. For tests and reports. */
int eng_cuda_attn_group_tiles(eng_backend_t *be);

/* How CUDA backend be stores its decode tiles' attention partials (ANVIL_CUDA_ATTN_PART):
   "f16" (o / sum, the default with bf16 or fp8 KV), "bf16" (o / sum) or "f32" (unnormalised,
   the only kind with fp32 KV);
   NULL when be is not a CUDA backend. For tests and reports. */
const char *eng_cuda_attn_part(eng_backend_t *be);

#ifdef __cplusplus
}
#endif

#endif

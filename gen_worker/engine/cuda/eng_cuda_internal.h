/*  eng_cuda_internal.h - state and helpers shared by the CUDA backend's .cu files.

    Included by .cu files only (never by C). The backend state owns the stream, the cuBLASLt
    handle and every scratch buffer; buffers grow on demand (stream-ordered use on the one
    stream makes reuse across ops safe). Host index arrays reach the device through
    ecu_idx(): the copies made by prepare() when the pointer is the prepared one, otherwise an
    asynchronous upload into a per-role scratch buffer.

    Programmatic dependent launch (Hopper): the decode path's kernels are launched with
    ecu_launch(), which on sm_90+ (unless ANVIL_CUDA_PDL=0) lets a kernel start while the one
    before it drains. Every kernel launched that way calls ecu_pdl_wait() before it reads or
    writes anything an earlier kernel touches (only reads of weights, which no kernel writes,
    may come before it), so its completion implies its predecessor's and the stream's order
    holds transitively; ecu_pdl_trigger() says when the next kernel may be launched.
*/
#ifndef ENG_CUDA_INTERNAL_H
#define ENG_CUDA_INTERNAL_H

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <errno.h>
#include <stdint.h>
#include <time.h>
#include <type_traits>

extern "C" {
#include "anv_error.h"
#include "anv_log.h"
#include "eng_ops.h"
#include "eng_stage.h"
}
#include "eng_cuda.h"

/* Logs the failing statement with file and line, then returns ANV_EINTERNAL. */
#define ECU_CHECK(stmt)                                                                            \
    do {                                                                                           \
        cudaError_t ecu_e_ = (stmt);                                                               \
        if (ecu_e_ != cudaSuccess) {                                                               \
            ANV_ERROR("cuda: '%s' failed at %s:%d: %s", #stmt, __FILE__, __LINE__,                 \
                      cudaGetErrorString(ecu_e_));                                                 \
            (void)cudaGetLastError(); /* reported: a non-sticky error (out of memory) is reset */  \
            return ANV_EINTERNAL;                                                                  \
        }                                                                                          \
    } while (0)

#define ECU_BLAS(stmt)                                                                             \
    do {                                                                                           \
        cublasStatus_t ecu_s_ = (stmt);                                                            \
        if (ecu_s_ != CUBLAS_STATUS_SUCCESS) {                                                     \
            ANV_ERROR("cublas: '%s' failed at %s:%d: status %d", #stmt, __FILE__, __LINE__,        \
                      (int)ecu_s_);                                                                \
            return ANV_EINTERNAL;                                                                  \
        }                                                                                          \
    } while (0)

/* After a kernel launch: checks the launch itself (not its completion). */
#define ECU_LAUNCHED() ECU_CHECK(cudaGetLastError())

/* Propagates a negative return code. */
#define ECU_TRY(expr)                                                                              \
    do {                                                                                           \
        int ecu_rc_ = (expr);                                                                      \
        if (ecu_rc_ < 0)                                                                           \
            return ecu_rc_;                                                                        \
    } while (0)

/* Inside a kernel: wait for the kernels before it (a no-op when launched without PDL). */
__device__ __forceinline__ void ecu_pdl_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
/* Inside a kernel: the next kernel may be launched once every block has got here. */
__device__ __forceinline__ void ecu_pdl_trigger()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

typedef struct {
    void *ptr;
    size_t bytes;
} ecu_buf_t;

/* Roles of uploaded index arrays (one scratch buffer each). */
enum {
    ECU_IDX_IDS,
    ECU_IDX_POS,
    ECU_IDX_SLOTS,
    ECU_IDX_ROWS,
    ECU_IDX_N
};

/* The most rows the GEMV takes (matmul.cu; st->gemv_max picks up to this many). */
#define ECU_GEMV_MAX 8
/* The most rows the tensor-core skinny product takes (skinny.cu; st->skinny_max picks up to
   this many, ECU_SKINNY_DEFAULT by default). */
#define ECU_SKINNY_MAX     16
#define ECU_SKINNY_DEFAULT 8

/* Attention plan of one batch (see attention.cu): device arrays plus sizes. */
typedef struct {
    int n_tiles, n_dec_tiles, n_tok, n_parts, n_seq, max_blocks, q_tile;
    int n_gt, max_gt;   /* group tiles (host count) and the room for them */
    int group_bs;       /* the block size the groups were found with (0: none looked for) */
    int4 *tiles;        /* (n_tiles) {seq, tok_begin, n_q, split} device: decode tiles first */
    int4 *gtiles;       /* (max_gt) {seq, split, n_members, first member} device */
    int *gcount;        /* (1) n_gt device */
    int2 *gmembers;     /* (n_dec_tiles) the group tiles' members {token, first partial} device */
    int *tile_grp;      /* (n_dec_tiles) 1: the decode tile's split is in a group tile device */
    int *tok_part;      /* (n_tok) first partial of each token device */
    int *tok_nsplit;    /* (n_tok) device */
    int *seq_qstart;    /* (n_seq + 1) device */
    int *seq_ctx;       /* (n_seq) device */
    int *block_tables;  /* (n_seq, max_blocks) device */
} ecu_attn_plan_t;

/* Blocks (one thread-block cluster) that sample one row at small batch, or always with
   ANVIL_CUDA_SAMPLE_BLOCKS=8 (softmax.cu). */
#define ECU_SM_CLUSTER 8

/* How the attention's decode tiles store their partials' o (st->attn_part, attention.cu):
   fp32 and unnormalised, or o / sum in fp16 (saturated at +-65504) or bf16. Prefill
   partials stay fp32. */
enum { ECU_PART_F32 = 0, ECU_PART_F16 = 1, ECU_PART_BF16 = 2, ECU_PART_KINDS };

/* A partials' kind by name ("f32", "f16", "bf16": ANVIL_CUDA_ATTN_PART's values) */
static inline const char *ecu_part_name(int pk)
{
    static const char *const name[ECU_PART_KINDS] = {"f32", "f16", "bf16"};
    return pk >= 0 && pk < ECU_PART_KINDS ? name[pk] : "?";
}

#define ECU_LT_CACHE 64
#define ECU_STAGE_BUFS 3
#define ECU_STAGE_BYTES ((size_t)64 << 20)

typedef struct {
    int m, n, k, dtype, acc, low, valid; /* acc: beta 1 (D = C + A B); low: D in dtype */
    cublasLtMatmulAlgo_t algo;
} ecu_lt_algo_t;

typedef struct {
    int device;
    int n_sm;
    int pdl;                    /* launch decode kernels with programmatic dependent launch */
    int gemv_persist;           /* persistent grid for the staged-norm GEMVs (matmul.cu) */
    int gemv_waves2;            /* resident waves x 2 the GEMV's segments aim for (matmul.cu) */
    int gemv_segs;              /* column segments a row, fixed (0: by gemv_waves2; A/B) */
    int gemv_rope;              /* rope + KV store in the QKV GEMV's epilogue (default; A/B) */
    int gemv_max;               /* rows up to which matmuls take the GEMV (matmul.cu; <= 8) */
    int gemv_balance;           /* persistent GEMV grids sized for whole rounds (default; A/B) */
    int skinny_max;             /* rows up to which skinny.cu replaces cuBLASLt (8; <= 16) */
    int prefetch_rows;          /* steps of up to this many rows take prefetch hints (matmul.cu) */
    size_t l2_bytes;            /* the device's L2, which a prefetch hint fills at most 3/4 of */
    int attn_mma;               /* tensor-core decode attention (attention.cu) */
    int attn_pf_mma;            /* tensor-core prefill attention (attention.cu) */
    int attn_pf_lpt;            /* ... its tiles longest first, KV heads inner (default; A/B) */
    int attn_pf_async;          /* ... bf16 K / V staged by cp.async (default; A/B) */
    int attn_pf_early;          /* ... q and block-table entries read early (default; A/B) */
    int attn_vlate;             /* ... loading V after q.k (attention.cu; default) */
    int attn_kv_inner;          /* decode grid with the KV heads inner (attention.cu; A/B) */
    int attn_group;             /* decode splits in shared blocks as group tiles (attention.cu) */
    int attn_part;              /* decode partials' o: ECU_PART_* (attention.cu; A/B) */
    int kv_block_size;          /* the KV cache's block size, as last given (0: not yet) */
    long long group_plans, group_tiles; /* plans with group tiles, and their tiles (a log line) */
    int twin_on;                /* producers write rounded twins (ecu_twin_begin; default; A/B) */
    int twin_only;              /* a SwiGLU linear told out_for_next writes the twin alone (A/B) */
    int gu_low;                 /* a composed gate|up product written in the weights' dtype (A/B) */
    int norm_vec;               /* norms with 16-byte accesses (norm.cu; default; A/B) */
    int rope_vec;               /* rope + KV store two pairs a thread (rope.cu; default; A/B) */
    cudaStream_t stream;
    cublasLtHandle_t lt;
    ecu_buf_t lt_ws;
    ecu_lt_algo_t lt_cache[ECU_LT_CACHE];
    int lt_next;

    ecu_buf_t xconv;            /* activations rounded for cuBLASLt */
    ecu_buf_t twinb;            /* a rounded twin (ecu_twin_begin): apart from xconv, so that
                                   a product reading xconv may write the next one's twin */
    /* What twinb holds when the op that wrote `of` (n, dim) f32 also wrote its rounding to
       `dtype` there (a rounded twin: ecu_twin_begin, matmul.cu); of == NULL: nothing known.
       A linear told x_from_prev (eng_linear_t) whose x, shape and dtype match reads it
       instead of rounding x again. twin_dtype: the weights' dtype of the last linear that
       ran on cuBLASLt, the attention's guess for the O projection's. */
    struct {
        const float *of;
        int n, dim;
        eng_dtype_t dtype;
    } twin;
    eng_dtype_t twin_dtype;
    /* a SwiGLU linear's out left unwritten for its twin (eng_linear_t.out_for_next,
       st->twin_only): the next linear must read x = this through the twin, or fails */
    const float *twin_unwritten;
    ecu_buf_t lin_x, lin_y;     /* linear() composed op by op: normalised input, product */
    ecu_buf_t idx[ECU_IDX_N];   /* per-op uploads of host index arrays */

    /* prepare(): the host pointers of the step and their device copies */
    eng_step_t step;
    int step_valid;
    ecu_buf_t step_dev;         /* ids | pos | slots | rows (int32) */
    const int32_t *d_ids, *d_pos, *d_slots, *d_rows;
    const int32_t *p_qstart, *p_ctx, *p_tables; /* host pointers of the prepared batch */
    int p_nseq, p_maxblocks;

    /* attention plan (device copy); valid for the prepared batch while plan_prepared */
    ecu_buf_t plan_dev;
    ecu_attn_plan_t plan;
    int plan_prepared;          /* plan belongs to the prepared batch */
    /* the QKV GEMV's rope angles (matmul.cu): (n, head_dim / 2) {cos, sin}; rope_tab_ok
       while it holds the prepared step's first rope_tab_n positions for rope_tab_hd and
       rope_tab_theta */
    ecu_buf_t rope_tab;
    int rope_tab_ok, rope_tab_n, rope_tab_hd;
    float rope_tab_theta;
    ecu_buf_t part_o, part_ml;  /* attention partials */

    /* sampling */
    int sample_blocks;          /* blocks a row: 1, ECU_SM_CLUSTER (sm_90), 0 = by batch */
    int sample_list;            /* the sampler compacts a row's candidates (softmax.cu) */
    int sample_clusters;        /* rows whose sampler clusters are resident at once (0: ask) */
    ecu_buf_t samp_params;      /* device copy of params */
    ecu_buf_t samp_out;         /* (n) {token, logprob} device */
    ecu_buf_t samp_host;        /* pinned staging for params and results */

    /* weight uploads: a ring of pinned staging buffers (eng_stage), one event each */
    ecu_buf_t stage_buf[ECU_STAGE_BUFS];
    cudaEvent_t stage_ev[ECU_STAGE_BUFS];
    eng_stage_t stage;
    int stage_ready;

    /* decode graphs (graph.cu) */
    int graph_splits;           /* > 0 while prepare builds the fixed-size decode plan */
    struct ecu_graph *graphs;   /* (n_graphs) one per (n_tok, max_blocks, key) */
    int n_graphs, cap_graphs;
    long long graph_captures, graph_launches, graph_eager;
    /* host seconds in graph_step: preparing steps (of which the attention plan), launching
       the captured graphs, the eager runs and captures (eng_cuda_graph_times) */
    double graph_prep_s, graph_plan_s, graph_launch_s, graph_build_s;
} ecu_state_t;

/* CLOCK_MONOTONIC in seconds (host timings) */
static inline double ecu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Bumped whenever ecu_buf_reserve moves a device buffer: a graph captured at another epoch
   may hold a freed pointer and is re-recorded (process-wide: several backends only cause
   spurious re-captures). */
extern unsigned long long ecu_buf_epoch;
/* Set on the capturing thread: a reserve that would move a buffer fails (ANV_ESTATE). */
extern __thread int ecu_buf_frozen;

/* Launches kernel<<<grid, block, smem, st->stream>>>(args...), with programmatic stream
   serialisation when st->pdl (the kernel must call ecu_pdl_wait(); see the top of this file).
   Returns the launch's error (as cudaGetLastError would). */
template <typename... KArgs, typename... Args>
static inline cudaError_t ecu_launch(const ecu_state_t *st, void (*kernel)(KArgs...), dim3 grid,
                                     dim3 block, size_t smem, Args... args)
{
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st->stream;
    if (st->pdl) {
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
    }
    return cudaLaunchKernelEx(&cfg, kernel, ((KArgs)args)...);
}

/* Local copies of eng_dtype_size / eng_dtype_name, so this library needs only the headers
   of the engine (which links it). */
static inline size_t ecu_dtype_size(eng_dtype_t d)
{
    return d == ENG_DTYPE_F32                              ? 4
           : (d == ENG_DTYPE_F16 || d == ENG_DTYPE_BF16) ? 2
           : d == ENG_DTYPE_F8E4M3                       ? 1
                                                         : 0;
}
static inline const char *ecu_dtype_name(eng_dtype_t d)
{
    return d == ENG_DTYPE_F32      ? "F32"
           : d == ENG_DTYPE_F16    ? "F16"
           : d == ENG_DTYPE_BF16   ? "BF16"
           : d == ENG_DTYPE_F8E4M3 ? "F8E4M3"
                                   : "?";
}

static inline ecu_state_t *ecu_st(eng_backend_t *be)
{
    return (ecu_state_t *)be->state;
}

/* Makes buf at least `bytes` long (device memory; contents not kept). */
int ecu_buf_reserve(ecu_buf_t *buf, size_t bytes);
/* Same for pinned host memory. */
int ecu_buf_reserve_host(ecu_buf_t *buf, size_t bytes);
void ecu_buf_release(ecu_buf_t *buf);
void ecu_buf_release_host(ecu_buf_t *buf);

/* Device copy of a host index array of n int32: the prepared copy when `host` is the
   pointer given to prepare() for that role, else an async upload into the role's scratch. */
int ecu_idx(ecu_state_t *st, int role, const int32_t *host, int n, const int32_t **dev);
/* The rope angles {cos, sin} of positions pos (host; the prepared step's are built once a
   step and reused), (n, head_dim / 2) in st->rope_tab (rope.cu) */
int ecu_rope_table(ecu_state_t *st, const int32_t *pos, int n, int head_dim, float theta,
                   const float2 **tab);

/* The rope epilogue's inputs of a QKV product (matmul.cu's GEMV, skinny.cu): the step's
   angle table (ecu_rope_table), the tokens' cache slots (device), the paged pools
   (n_blocks, block_size, n_kv_head, head_dim) kv_dtype and the heads. */
typedef struct {
    const float2 *angles; /* (n, head_dim / 2) {cos, sin} */
    const int32_t *slots; /* (n) device */
    void *k_cache, *v_cache;
    int n_head, n_kv_head, head_dim, kv_dtype;
} ecu_rope_kv_t;

/* out (=, or += when acc) xw @ W^T + bias on the tensor cores for n <= st->skinny_max rows
   (skinny.cu), xw and W in dtype (bf16 / f16), 16-byte aligned: 1 launched, 0 when the shape
   or dtype does not fit (the caller runs cuBLASLt), < 0 on error. epi (eng_lin_epi_t) the
   linear's epilogue: ENG_LIN_SWIGLU: W is gate|up (out_dim = 2 ffn) and out (n, ffn) gets
   silu(gate) * up, also stored through ecu_twin_store(low, kind); ENG_LIN_ROPE_KV: out is q
   (n, n_head, head_dim) and k, v go to rope's pools (head_dim a multiple of 16). Both
   without acc. */
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
                      const ecu_rope_kv_t *rope);

/* Rounded twins (matmul.cu). An op about to write `of` (n, dim) f32 calls ecu_twin_begin
   with the dtype its consumer's weights are likely in: it returns st->twinb, reserved and
   tagged, when that consumer will run on cuBLASLt (n above st->gemv_max, bf16 / f16) and
   twins are on, setting *kind (ECU_TWIN_BF16 / _F16); else NULL and ECU_TWIN_NONE. Either
   way the previous tag is dropped. The kernel then stores each value of `of` also through
   ecu_twin_store / ecu_twin_store4 (below ecu_from_f32: bit-identical to the consumer's own
   rounding); if the launch fails the caller calls ecu_twin_drop. Every op entry point that
   may write xconv or consume a twin drops the tag first. */
enum { ECU_TWIN_NONE = 0, ECU_TWIN_BF16, ECU_TWIN_F16 };
/* the 16-bit kind of dtype's values (ECU_TWIN_NONE for another dtype) */
static inline int ecu_twin_kind(eng_dtype_t dtype)
{
    return dtype == ENG_DTYPE_BF16  ? ECU_TWIN_BF16
           : dtype == ENG_DTYPE_F16 ? ECU_TWIN_F16
                                    : ECU_TWIN_NONE;
}
int ecu_twin_begin(
    ecu_state_t *st, const float *of, int n, int dim, eng_dtype_t dtype, void **low, int *kind);
static inline void ecu_twin_drop(ecu_state_t *st)
{
    st->twin.of = NULL;
}
/* swiglu_fused that also stores each value through ecu_twin_store(low, kind) (act.cu); out
   NULL: the twin alone (low not NULL). gu (n, 2 ffn) is f32 (gu_kind ECU_TWIN_NONE) or the
   product written in bf16 / f16 (ECU_TWIN_BF16 / _F16: st->gu_low, matmul.cu). */
int ecu_swiglu_fused_twin(
    ecu_state_t *st, float *out, const void *gu, int gu_kind, int n, int ffn, void *low, int kind);

/* prepare() of the op table (eng_cuda.cu). */
int ecu_prepare(eng_backend_t *be, const eng_step_t *step);
/* rmsnorm of x (n, dim) f32 rounded to `dtype` (bf16 / f16, also w's dtype) into out (n, dim)
   (norm.cu); -EINVAL for another dtype. */
int ecu_rmsnorm_round(ecu_state_t *st, void *out, const float *x, const void *w,
                      eng_dtype_t dtype, int n, int dim, float eps);
/* Frees every graph (graph.cu). */
void ecu_graph_free_all(ecu_state_t *st);

/* Builds (or reuses, for the prepared batch) the attention plan of `batch`. With
   st->graph_splits > 0 the batch must be all decode and the plan has the fixed layout of
   graph_splits tiles per sequence (tiles past a sequence's context are empty). block_size
   (0: not known) is the KV cache's, with which decode splits stored in the same blocks are
   found and grouped (st->attn_group). */
int ecu_attn_plan(ecu_state_t *st,
                  const eng_attn_batch_t *batch,
                  int block_size,
                  const ecu_attn_plan_t **plan);

/* The exported ops (one .cu per family), with the signatures of eng_backend_t. */
extern "C" {
int ecu_embedding(eng_backend_t *be, float *out, const void *table, eng_dtype_t dtype,
                  const int32_t *ids, int n_tok, int dim);
int ecu_rmsnorm(eng_backend_t *be, float *out, const float *x, const void *w, eng_dtype_t dtype,
                int n, int dim, float eps);
int ecu_add_rmsnorm(eng_backend_t *be, float *out, float *residual, const float *delta,
                    const void *w, eng_dtype_t dtype, int n, int dim, float eps);
int ecu_matmul(eng_backend_t *be, float *out, const float *x, const void *w, const void *bias,
               eng_dtype_t dtype, int n, int in_dim, int out_dim);
int ecu_linear(eng_backend_t *be, float *out, const float *x, const void *w, const void *bias,
               eng_dtype_t dtype, int n, int in_dim, int out_dim, const eng_linear_t *f);
int ecu_prefetch(eng_backend_t *be, const void *ptr, size_t bytes, int n_tok);
int ecu_rope(eng_backend_t *be, float *q, float *k, const int32_t *pos, int n_tok, int n_head,
             int n_kv_head, int head_dim, float theta);
int ecu_kv_store(eng_backend_t *be, void *k_cache, void *v_cache, const float *k, const float *v,
                 const int32_t *slots, int n_tok, int n_kv_head, int head_dim);
int ecu_rope_kv_store(eng_backend_t *be, float *q_out, const float *qkv, void *k_cache,
                      void *v_cache, const int32_t *pos, const int32_t *slots, int n_tok,
                      int n_head, int n_kv_head, int head_dim, float theta);
int ecu_copy_block(eng_backend_t *be, void *k_cache, void *v_cache, int src, int dst,
                   int block_size, int n_kv_head, int head_dim);
int ecu_attention(eng_backend_t *be, float *out, const float *q, const void *k_cache,
                  const void *v_cache, const eng_attn_batch_t *batch, int n_head, int n_kv_head,
                  int head_dim, int block_size);
int ecu_swiglu(eng_backend_t *be, float *out, const float *gate, const float *up, int n, int ffn);
int ecu_swiglu_fused(eng_backend_t *be, float *out, const float *gu, int n, int ffn);
int ecu_gather_rows(eng_backend_t *be, float *out, const float *x, const int32_t *rows,
                    int n_rows, int dim);
int ecu_log_softmax(eng_backend_t *be, float *out, const float *logits, int n, int vocab);
int ecu_sample(eng_backend_t *be, int32_t *tokens, float *logprobs, const float *logits, int n,
               int vocab, const eng_sample_params_t *params);
int ecu_graph_step(eng_backend_t *be, const eng_step_t *step, int block_size, uint64_t key,
                   int (*record)(void *ctx), void *ctx);
void ecu_graph_reset(eng_backend_t *be);
}

/* Widening loads of weights (bf16 / f16 / f32 element i). */
template <typename T> __device__ __forceinline__ float ecu_ld(const T *p, size_t i);
template <> __device__ __forceinline__ float ecu_ld<float>(const float *p, size_t i)
{
    return p[i];
}
template <> __device__ __forceinline__ float ecu_ld<__nv_bfloat16>(const __nv_bfloat16 *p,
                                                                   size_t i)
{
    return __bfloat162float(p[i]);
}
template <> __device__ __forceinline__ float ecu_ld<__half>(const __half *p, size_t i)
{
    return __half2float(p[i]);
}
template <> __device__ __forceinline__ float ecu_ld<__nv_fp8_e4m3>(const __nv_fp8_e4m3 *p, size_t i)
{
    return (float)p[i];
}

template <typename T> __device__ __forceinline__ T ecu_from_f32(float v);
template <> __device__ __forceinline__ float ecu_from_f32<float>(float v)
{
    return v;
}
template <> __device__ __forceinline__ __nv_bfloat16 ecu_from_f32<__nv_bfloat16>(float v)
{
    return __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ __half ecu_from_f32<__half>(float v)
{
    return __float2half_rn(v);
}
/* fp8 KV: round to nearest even, saturating to +-448 (eng_f32_to_f8e4m3 on the host) */
template <> __device__ __forceinline__ __nv_fp8_e4m3 ecu_from_f32<__nv_fp8_e4m3>(float v)
{
    __nv_fp8_e4m3 r;
    r.__x = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
    return r;
}

/* four consecutive values rounded to T from dst[i4 * 4] (one 8-byte store; T 16-bit) */
template <typename T> __device__ __forceinline__ void ecu_store4(T *dst, size_t i4, float4 v)
{
    union {
        T h[4];
        uint2 u;
    } o;
    o.h[0] = ecu_from_f32<T>(v.x), o.h[1] = ecu_from_f32<T>(v.y);
    o.h[2] = ecu_from_f32<T>(v.z), o.h[3] = ecu_from_f32<T>(v.w);
    ((uint2 *)dst)[i4] = o.u;
}

/* A rounded twin's stores (ecu_twin_begin): v at low[i], or four values from low[i4 * 4], in
   kind's dtype; ECU_TWIN_NONE stores nothing. */
__device__ __forceinline__ void ecu_twin_store(void *low, int kind, size_t i, float v)
{
    if (kind == ECU_TWIN_BF16)
        ((__nv_bfloat16 *)low)[i] = ecu_from_f32<__nv_bfloat16>(v);
    else if (kind == ECU_TWIN_F16)
        ((__half *)low)[i] = ecu_from_f32<__half>(v);
}
__device__ __forceinline__ void ecu_twin_store4(void *low, int kind, size_t i4, float4 v)
{
    if (kind == ECU_TWIN_BF16)
        ecu_store4((__nv_bfloat16 *)low, i4, v);
    else if (kind == ECU_TWIN_F16)
        ecu_store4((__half *)low, i4, v);
}

/* The rotary angle of pair i at position pos, as the CPU computes it: inv_freq =
   1 / powf(theta, 2i / d) with the power taken in double and rounded (the device powf may
   differ from the CPU's correctly rounded one by an ulp, which positions in the thousands turn
   into 1e-4 of angle), f = pos * inv_freq in fp32, then full-precision cosf / sinf. Computed
   once a step into a table (ecu_rope_table, rope.cu) that the rope kernels and the QKV GEMV's
   rope epilogue read. */
__device__ __forceinline__ void ecu_rope_angle(int pos, int i, int head_dim, float theta,
                                               float *c, float *s)
{
    float pw = (float)pow((double)theta, (double)((float)(2 * i) / (float)head_dim));
    float inv_freq = 1.0f / pw;
    float f = (float)pos * inv_freq;
    *c = cosf(f);
    *s = sinf(f);
}

/* D += A B (mma.sync m16n8k16, row.col, fp32 accumulate): bf16 inputs for T = bf16, f16
   for the others (f16 weights; fp8 KV widened to f16 by the attention) */
template <typename T>
__device__ __forceinline__ void ecu_mma16816(
    float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1)
{
    if constexpr (std::is_same<T, __nv_bfloat16>::value)
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
            "{%8,%9}, {%0,%1,%2,%3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    else
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
            "{%8,%9}, {%0,%1,%2,%3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* One KV value stored in the pool's dtype (bf16, fp8 e4m3 or f32). */
__device__ __forceinline__ void ecu_kv_put(void *cache, int dtype, size_t i, float v)
{
    if (dtype == ENG_DTYPE_BF16)
        ((__nv_bfloat16 *)cache)[i] = ecu_from_f32<__nv_bfloat16>(v);
    else if (dtype == ENG_DTYPE_F8E4M3)
        ((__nv_fp8_e4m3 *)cache)[i] = ecu_from_f32<__nv_fp8_e4m3>(v);
    else
        ((float *)cache)[i] = v;
}

/* The rope epilogue of a QKV product for one dims pair (i, i + head_dim / 2) of stacked head
   h (q heads, then k, then v) of token row r, its values (va, vb) and angle (c, s): a q head
   rotated into q (n, n_head, head_dim) f32, a k head rotated into the paged K pool and a v
   head stored as it is in the V pool, at the token's cache row offset kvo. */
__device__ __forceinline__ void ecu_rope_pair_put(float *q,
                                                  void *k_cache,
                                                  void *v_cache,
                                                  int kv_dtype,
                                                  size_t kvo,
                                                  int r,
                                                  int h,
                                                  int i,
                                                  int n_head,
                                                  int n_kv_head,
                                                  int head_dim,
                                                  float va,
                                                  float vb,
                                                  float c,
                                                  float s)
{
    const int hh = head_dim / 2;
    if (h < n_head + n_kv_head) {
        const float ra = va * c - vb * s, rb = vb * c + va * s;
        if (h < n_head) {
            float *qh = q + ((size_t)r * n_head + h) * head_dim;
            qh[i] = ra, qh[i + hh] = rb;
        } else {
            const size_t at = kvo + (size_t)(h - n_head) * head_dim + i;
            ecu_kv_put(k_cache, kv_dtype, at, ra);
            ecu_kv_put(k_cache, kv_dtype, at + hh, rb);
        }
    } else {
        const size_t at = kvo + (size_t)(h - n_head - n_kv_head) * head_dim + i;
        ecu_kv_put(v_cache, kv_dtype, at, va);
        ecu_kv_put(v_cache, kv_dtype, at + hh, vb);
    }
}

/* Block-wide sum / max for blockDim.x a multiple of 32 (<= 1024); every thread gets it. */
__device__ __forceinline__ float ecu_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float ecu_warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float ecu_block_sum(float v, float *red /* (32) shared */)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = ecu_warp_sum(v);
    __syncthreads();
    if (lane == 0)
        red[warp] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : 0.0f;
    return ecu_warp_sum(v);
}
__device__ __forceinline__ float ecu_block_max(float v, float *red /* (32) shared */)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = ecu_warp_max(v);
    __syncthreads();
    if (lane == 0)
        red[warp] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : -INFINITY;
    return ecu_warp_max(v);
}

#endif

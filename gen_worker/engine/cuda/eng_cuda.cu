/*  eng_cuda.cu - the CUDA backend object: device, stream, memory, prepare, the op table.

    One backend = one device and one non-blocking stream; every op queues work on that stream
    and returns, so a decode step runs without host synchronisation until `sample` (or a
    download) reads its result. Scratch buffers belong to the state and grow on demand: a grow
    frees and reallocates, which is safe because all users are ordered on the one stream
    (cudaFree waits for the device). prepare() copies a step's host index arrays into one
    device buffer with a single upload and builds the attention plan once for all layers.
    Weights reach the device through a ring of three 64 MiB pinned staging buffers
    (eng_stage): reading the next chunk out of the mmap'd checkpoint overlaps the DMA of the
    previous one, and no weight waits for the stream (the model syncs once at the end).
*/
#include <stdlib.h>
#include <string.h>

#include "eng_cuda_internal.h"
#include "eng_sample_hash.h"

/* --- buffers ----------------------------------------------------------------------------- */

unsigned long long ecu_buf_epoch = 1;
__thread int ecu_buf_frozen = 0;

int ecu_buf_reserve(ecu_buf_t *buf, size_t bytes)
{
    if (bytes <= buf->bytes)
        return 0;
    if (ecu_buf_frozen) {
        ANV_ERROR("cuda: a scratch buffer must grow to %zu bytes during a graph capture", bytes);
        return ANV_ESTATE;
    }
    ecu_buf_epoch++;
    size_t want = bytes + bytes / 4;
    if (buf->ptr)
        ECU_CHECK(cudaFree(buf->ptr));
    buf->ptr = NULL;
    buf->bytes = 0;
    ECU_CHECK(cudaMalloc(&buf->ptr, want));
    buf->bytes = want;
    return 0;
}

int ecu_buf_reserve_host(ecu_buf_t *buf, size_t bytes)
{
    if (bytes <= buf->bytes)
        return 0;
    size_t want = bytes + bytes / 4;
    if (buf->ptr)
        ECU_CHECK(cudaFreeHost(buf->ptr));
    buf->ptr = NULL;
    buf->bytes = 0;
    ECU_CHECK(cudaMallocHost(&buf->ptr, want));
    buf->bytes = want;
    return 0;
}

void ecu_buf_release(ecu_buf_t *buf)
{
    if (buf->ptr)
        cudaFree(buf->ptr);
    buf->ptr = NULL;
    buf->bytes = 0;
}

void ecu_buf_release_host(ecu_buf_t *buf)
{
    if (buf->ptr)
        cudaFreeHost(buf->ptr);
    buf->ptr = NULL;
    buf->bytes = 0;
}

int ecu_idx(ecu_state_t *st, int role, const int32_t *host, int n, const int32_t **dev)
{
    if (!host || n <= 0)
        return -EINVAL;
    if (st->step_valid) {
        const int32_t *hp = NULL, *dp = NULL;
        int hn = st->step.n_tok;
        switch (role) {
        case ECU_IDX_IDS:
            hp = st->step.ids, dp = st->d_ids;
            break;
        case ECU_IDX_POS:
            hp = st->step.pos, dp = st->d_pos;
            break;
        case ECU_IDX_SLOTS:
            hp = st->step.slots, dp = st->d_slots;
            break;
        case ECU_IDX_ROWS:
            hp = st->step.rows, dp = st->d_rows, hn = st->step.n_rows;
            break;
        }
        if (hp == host && n <= hn) {
            *dev = dp;
            return 0;
        }
    }
    ECU_TRY(ecu_buf_reserve(&st->idx[role], (size_t)n * sizeof(int32_t)));
    /* pageable source: the call returns once the source is staged, so the caller may reuse
       its array at once; the device copy is ordered before the op's kernel */
    ECU_CHECK(cudaMemcpyAsync(st->idx[role].ptr, host, (size_t)n * sizeof(int32_t),
                              cudaMemcpyHostToDevice, st->stream));
    *dev = (const int32_t *)st->idx[role].ptr;
    return 0;
}

/* --- memory ops -------------------------------------------------------------------------- */

static void *s_alloc(eng_backend_t *be, size_t bytes)
{
    ecu_state_t *st = ecu_st(be);
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        ANV_ERROR("cuda: cannot allocate %zu bytes: %s", bytes, cudaGetErrorString(e));
        (void)cudaGetLastError(); /* not sticky: the next launch's check must not see it */
        return NULL;
    }
    e = cudaMemsetAsync(p, 0, bytes, st->stream);
    if (e != cudaSuccess) {
        ANV_ERROR("cuda: cannot clear %zu bytes: %s", bytes, cudaGetErrorString(e));
        cudaFree(p);
        return NULL;
    }
    return p;
}

static void s_free(eng_backend_t *be, void *ptr)
{
    (void)be;
    if (ptr)
        cudaFree(ptr);
}

static int s_stage_submit(void *ctx, int b, void *dst, size_t n)
{
    ecu_state_t *st = (ecu_state_t *)ctx;
    ECU_CHECK(cudaMemcpyAsync(dst, st->stage_buf[b].ptr, n, cudaMemcpyHostToDevice,
                              st->stream));
    ECU_CHECK(cudaEventRecord(st->stage_ev[b], st->stream));
    return 0;
}

static int s_stage_wait(void *ctx, int b)
{
    ecu_state_t *st = (ecu_state_t *)ctx;
    ECU_CHECK(cudaEventSynchronize(st->stage_ev[b]));
    return 0;
}

/* The staging ring, made on the first weight (3 x 64 MiB pinned, kept for reloads). */
static int s_stage_setup(ecu_state_t *st)
{
    if (st->stage_ready)
        return 0;
    for (int i = 0; i < ECU_STAGE_BUFS; i++) {
        ECU_TRY(ecu_buf_reserve_host(&st->stage_buf[i], ECU_STAGE_BYTES));
        if (!st->stage_ev[i])
            ECU_CHECK(cudaEventCreateWithFlags(&st->stage_ev[i], cudaEventDisableTiming));
        st->stage.bufs[i] = st->stage_buf[i].ptr;
    }
    st->stage.n_bufs = ECU_STAGE_BUFS;
    st->stage.buf_bytes = ECU_STAGE_BYTES;
    st->stage.submit = s_stage_submit;
    st->stage.wait = s_stage_wait;
    st->stage.ctx = st;
    ECU_TRY(eng_stage_init(&st->stage));
    st->stage_ready = 1;
    return 0;
}

/* Device memory for a checkpoint tensor, filled through the staging ring: the memcpy of the
   next chunk out of the mmap overlaps the DMA of the previous one. Returns before the last
   chunks landed; every later use is on the same stream (sync() completes the upload). */
static void *s_weight(eng_backend_t *be, const void *host, size_t bytes)
{
    ecu_state_t *st = ecu_st(be);
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        ANV_ERROR("cuda: cannot allocate %zu bytes for a weight: %s", bytes,
                  cudaGetErrorString(e));
        (void)cudaGetLastError(); /* as in s_alloc */
        return NULL;
    }
    if (s_stage_setup(st) || eng_stage_copy(&st->stage, p, host, bytes)) {
        ANV_ERROR("cuda: cannot upload a weight of %zu bytes", bytes);
        eng_stage_finish(&st->stage);
        cudaFree(p);
        return NULL;
    }
    return p;
}

static void s_weight_release(eng_backend_t *be, void *ptr)
{
    (void)be;
    if (ptr)
        cudaFree(ptr);
}

/* A checkpoint tensor into device memory the caller allocated (stacked weights), through the
   same staging ring as s_weight. */
static int s_weight_into(eng_backend_t *be, void *dst, const void *host, size_t bytes)
{
    ecu_state_t *st = ecu_st(be);
    if (!dst || !host)
        return -EINVAL;
    if (s_stage_setup(st) || eng_stage_copy(&st->stage, dst, host, bytes)) {
        ANV_ERROR("cuda: cannot upload a weight of %zu bytes", bytes);
        eng_stage_finish(&st->stage);
        return -EIO;
    }
    return 0;
}

static int s_upload(eng_backend_t *be, void *dst, const void *host_src, size_t bytes)
{
    ecu_state_t *st = ecu_st(be);
    if (!dst || !host_src)
        return -EINVAL;
    ECU_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, st->stream));
    return 0;
}

static int s_download(eng_backend_t *be, void *host_dst, const void *src, size_t bytes)
{
    ecu_state_t *st = ecu_st(be);
    if (!host_dst || !src)
        return -EINVAL;
    ECU_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, st->stream));
    ECU_CHECK(cudaStreamSynchronize(st->stream));
    return 0;
}

static int s_copy(eng_backend_t *be, void *dst, const void *src, size_t bytes)
{
    ecu_state_t *st = ecu_st(be);
    if (!dst || !src)
        return -EINVAL;
    ECU_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st->stream));
    return 0;
}

static int s_sync(eng_backend_t *be)
{
    ECU_CHECK(cudaStreamSynchronize(ecu_st(be)->stream));
    return 0;
}

static int s_mem_info(eng_backend_t *be, size_t *free_bytes, size_t *total_bytes)
{
    size_t f = 0, t = 0;
    ECU_CHECK(cudaMemGetInfo(&f, &t));
    if (free_bytes)
        *free_bytes = f;
    if (total_bytes)
        *total_bytes = t;
    return 0;
}

int ecu_prepare(eng_backend_t *be, const eng_step_t *step)
{
    ecu_state_t *st = ecu_st(be);
    st->step_valid = 0;
    st->plan_prepared = 0;
    st->rope_tab_ok = 0;
    if (!step)
        return 0;
    int n = step->n_tok > 0 ? step->n_tok : 0, nr = step->n_rows > 0 ? step->n_rows : 0;
    size_t words = (size_t)3 * n + nr;
    if (words) {
        /* one pinned staging copy + one upload for the four arrays */
        ECU_TRY(ecu_buf_reserve(&st->step_dev, words * sizeof(int32_t)));
        int32_t *tmp = (int32_t *)malloc(words * sizeof(int32_t));
        if (!tmp)
            return -ENOMEM;
        memset(tmp, 0, words * sizeof(int32_t));
        if (step->ids)
            memcpy(tmp, step->ids, (size_t)n * 4);
        if (step->pos)
            memcpy(tmp + n, step->pos, (size_t)n * 4);
        if (step->slots)
            memcpy(tmp + 2 * n, step->slots, (size_t)n * 4);
        if (step->rows && nr)
            memcpy(tmp + 3 * n, step->rows, (size_t)nr * 4);
        cudaError_t e = cudaMemcpyAsync(st->step_dev.ptr, tmp, words * sizeof(int32_t),
                                        cudaMemcpyHostToDevice, st->stream);
        free(tmp);
        ECU_CHECK(e);
    }
    int32_t *d = (int32_t *)st->step_dev.ptr;
    st->step = *step;
    st->d_ids = d;
    st->d_pos = d + n;
    st->d_slots = d + 2 * n;
    st->d_rows = d + 3 * n;
    st->step_valid = 1;
    if (step->batch) {
        const ecu_attn_plan_t *plan;
        st->p_qstart = NULL;
        /* the block size is the one the last attention (or graph step) was given */
        const double t0 = st->graph_splits > 0 ? ecu_now() : 0.0;
        ECU_TRY(ecu_attn_plan(st, step->batch, st->kv_block_size, &plan));
        if (st->graph_splits > 0) /* a graph step's (eng_cuda_graph_times) */
            st->graph_plan_s += ecu_now() - t0;
        st->p_qstart = step->batch->q_start;
        st->p_ctx = step->batch->ctx_len;
        st->p_tables = step->batch->block_tables;
        st->p_nseq = step->batch->n_seq;
        st->p_maxblocks = step->batch->max_blocks;
        st->plan_prepared = 1;
    }
    return 0;
}

/* --- helpers for benchmarks and tests ---------------------------------------------------- */

#define s_mix eng_sample_mix /* splitmix64 finaliser (eng_sample_hash.h) */

template <typename T>
static __global__ void s_fill_kernel(T *dst /* (n) T */, size_t n, uint64_t seed, float center,
                                     float scale)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint64_t h = s_mix(seed * 0x9e3779b97f4a7c15ull + i);
        float u = (float)(h >> 40) * (1.0f / 16777216.0f); /* [0, 1) */
        dst[i] = ecu_from_f32<T>(center + scale * (2.0f * u - 1.0f));
    }
}

extern "C" int eng_cuda_fill_random(eng_backend_t *be, void *dst, eng_dtype_t dtype, size_t n,
                                    uint64_t seed, float center, float scale)
{
    ecu_state_t *st = ecu_st(be);
    if (!dst || !n)
        return -EINVAL;
    int grid = st->n_sm * 8;
    switch (dtype) {
    case ENG_DTYPE_F32:
        s_fill_kernel<<<grid, 256, 0, st->stream>>>((float *)dst, n, seed, center, scale);
        break;
    case ENG_DTYPE_BF16:
        s_fill_kernel<<<grid, 256, 0, st->stream>>>((__nv_bfloat16 *)dst, n, seed, center,
                                                     scale);
        break;
    case ENG_DTYPE_F16:
        s_fill_kernel<<<grid, 256, 0, st->stream>>>((__half *)dst, n, seed, center, scale);
        break;
    case ENG_DTYPE_F8E4M3:
        s_fill_kernel<<<grid, 256, 0, st->stream>>>((__nv_fp8_e4m3 *)dst, n, seed, center,
                                                     scale);
        break;
    default:
        return -EINVAL;
    }
    ECU_LAUNCHED();
    return 0;
}

static int s_cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

extern "C" int eng_cuda_copy_bandwidth(eng_backend_t *be, size_t bytes, int iters, double *gbps)
{
    ecu_state_t *st = ecu_st(be);
    void *a = NULL, *b = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    float *ms = NULL;
    int rc = ANV_EINTERNAL;
    if (iters < 1 || !gbps)
        return -EINVAL;
    ms = (float *)calloc((size_t)iters, sizeof(float));
    if (!ms)
        return -ENOMEM;
    if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess ||
        cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess) {
        ANV_ERROR("cuda: cannot set up a copy of %zu bytes", bytes);
        (void)cudaGetLastError(); /* as in s_alloc */
        goto out;
    }
    cudaMemsetAsync(a, 1, bytes, st->stream);
    cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, st->stream); /* warm-up */
    for (int i = 0; i < iters; i++) {
        cudaEventRecord(e0, st->stream);
        cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, st->stream);
        cudaEventRecord(e1, st->stream);
        if (cudaEventSynchronize(e1) != cudaSuccess)
            goto out;
        cudaEventElapsedTime(&ms[i], e0, e1);
    }
    qsort(ms, (size_t)iters, sizeof(float), s_cmp_float);
    *gbps = 2.0 * (double)bytes / (ms[iters / 2] * 1e-3) / 1e9;
    rc = 0;
out:
    if (cudaGetLastError() != cudaSuccess)
        rc = ANV_EINTERNAL;
    cudaFree(a);
    cudaFree(b);
    if (e0)
        cudaEventDestroy(e0);
    if (e1)
        cudaEventDestroy(e1);
    free(ms);
    return rc;
}

extern "C" int eng_cuda_device_name(eng_backend_t *be, char *buf, size_t len)
{
    cudaDeviceProp prop;
    ECU_CHECK(cudaGetDeviceProperties(&prop, ecu_st(be)->device));
    snprintf(buf, len, "%s", prop.name);
    return 0;
}

/* The GEMV's column segments a row, fixed (matmul.cu; 0: by the grid's waves). */
static int s_gemv_segs_set(ecu_state_t *st, int segs)
{
    if (segs != 0 && segs != 1 && segs != 2 && segs != 4 && segs != 8)
        return -EINVAL;
    st->gemv_segs = segs;
    return 0;
}

extern "C" int eng_cuda_gemv_segs(eng_backend_t *be, int segs)
{
    if (!be || !be->name || strcmp(be->name, "cuda") != 0)
        return -EINVAL;
    return s_gemv_segs_set(ecu_st(be), segs);
}

/* A row limit (the GEMV's, the skinny product's): rows 0 to max sets *lim, rows < 0 leaves
   it. The value in effect, or -EINVAL. */
static int s_rows_limit(int *lim, int rows, int max)
{
    if (rows > max)
        return -EINVAL;
    if (rows >= 0)
        *lim = rows;
    return *lim;
}

/* ... at start: def, or $name when it holds 0 to max (else a warning) */
static void s_rows_env(int *lim, const char *name, int def, int max)
{
    const char *v = getenv(name);
    *lim = def;
    if (v && (atoi(v) < 0 || s_rows_limit(lim, atoi(v), max) < 0))
        ANV_WARN("cuda backend: %s=%s ignored (0 to %d)", name, v, max);
}

/* A default-on switch: 0 when environment variable name is "0", else 1 */
static int s_env_on(const char *name)
{
    const char *v = getenv(name);
    return !(v && strcmp(v, "0") == 0);
}

extern "C" int eng_cuda_gemv_rows(eng_backend_t *be, int rows)
{
    if (!be || !be->name || strcmp(be->name, "cuda") != 0)
        return -EINVAL;
    return s_rows_limit(&ecu_st(be)->gemv_max, rows, ECU_GEMV_MAX);
}

extern "C" int eng_cuda_skinny_rows(eng_backend_t *be, int rows)
{
    if (!be || !be->name || strcmp(be->name, "cuda") != 0)
        return -EINVAL;
    return s_rows_limit(&ecu_st(be)->skinny_max, rows, ECU_SKINNY_MAX);
}

extern "C" int eng_cuda_available(void)
{
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

/* --- object ------------------------------------------------------------------------------ */

static void s_destroy(eng_backend_t **be_p)
{
    if (!be_p || !*be_p)
        return;
    eng_backend_t *be = *be_p;
    ecu_state_t *st = ecu_st(be);
    if (st) {
        if (st->group_plans > 0)
            ANV_INFO("cuda backend: %lld attention plans had group tiles, %lld in all",
                     st->group_plans, st->group_tiles);
        if (st->stream)
            cudaStreamSynchronize(st->stream);
        ecu_graph_free_all(st);
        if (st->stage_ready)
            eng_stage_finish(&st->stage);
        for (int i = 0; i < ECU_STAGE_BUFS; i++) {
            ecu_buf_release_host(&st->stage_buf[i]);
            if (st->stage_ev[i])
                cudaEventDestroy(st->stage_ev[i]);
        }
        ecu_buf_release(&st->lt_ws);
        ecu_buf_release(&st->xconv);
        ecu_buf_release(&st->twinb);
        ecu_buf_release(&st->lin_x);
        ecu_buf_release(&st->lin_y);
        for (int i = 0; i < ECU_IDX_N; i++)
            ecu_buf_release(&st->idx[i]);
        ecu_buf_release(&st->step_dev);
        ecu_buf_release(&st->plan_dev);
        ecu_buf_release(&st->rope_tab);
        ecu_buf_release(&st->part_o);
        ecu_buf_release(&st->part_ml);
        ecu_buf_release(&st->samp_params);
        ecu_buf_release(&st->samp_out);
        ecu_buf_release_host(&st->samp_host);
        if (st->lt)
            cublasLtDestroy(st->lt);
        if (st->stream)
            cudaStreamDestroy(st->stream);
        free(st);
    }
    free(be);
    *be_p = NULL;
}

extern "C" eng_backend_t *eng_cuda_backend_new_kv(eng_dtype_t kv_dtype)
{
    eng_backend_t *be = (eng_backend_t *)calloc(1, sizeof(*be));
    ecu_state_t *st = (ecu_state_t *)calloc(1, sizeof(*st));
    int n_dev = 0;
    cudaDeviceProp prop;
    cudaError_t e;
    if (!be || !st) {
        free(be);
        free(st);
        return NULL;
    }
    be->state = st;
    be->destroy = s_destroy;
    if (kv_dtype != ENG_DTYPE_BF16 && kv_dtype != ENG_DTYPE_F32 &&
        kv_dtype != ENG_DTYPE_F8E4M3) {
        ANV_ERROR("cuda backend: kv dtype %s is not supported (bf16, f32, fp8)",
                  ecu_dtype_name(kv_dtype));
        goto fail;
    }
    e = cudaGetDeviceCount(&n_dev);
    if (e != cudaSuccess || n_dev == 0) {
        ANV_ERROR("cuda backend: no usable GPU (%s)",
                  e != cudaSuccess ? cudaGetErrorString(e) : "no device");
        goto fail;
    }
    st->device = 0;
    if (cudaSetDevice(0) != cudaSuccess || cudaGetDeviceProperties(&prop, 0) != cudaSuccess ||
        cudaStreamCreateWithFlags(&st->stream, cudaStreamNonBlocking) != cudaSuccess) {
        ANV_ERROR("cuda backend: cannot start device 0: %s",
                  cudaGetErrorString(cudaGetLastError()));
        goto fail;
    }
    st->n_sm = prop.multiProcessorCount;
    {
        /* programmatic dependent launch needs sm_90; ANVIL_CUDA_PDL=0 turns it off (A/B) */
        st->pdl = prop.major >= 9 && s_env_on("ANVIL_CUDA_PDL");
        /* ANVIL_CUDA_GEMV_PERSIST=0: a block per row group for every GEMV (A/B, matmul.cu) */
        st->gemv_persist = s_env_on("ANVIL_CUDA_GEMV_PERSIST");
        /* ANVIL_CUDA_GEMV_WAVES: resident waves the GEMV's column segments aim for (2.5) */
        const char *gw = getenv("ANVIL_CUDA_GEMV_WAVES");
        st->gemv_waves2 = gw && atof(gw) >= 0.5 && atof(gw) <= 64 ? (int)(atof(gw) * 2) : 5;
        /* ANVIL_CUDA_GEMV_ROPE=0: the QKV GEMV leaves rope + KV store to rope_kv_store (A/B) */
        st->gemv_rope = s_env_on("ANVIL_CUDA_GEMV_ROPE");
        /* ANVIL_CUDA_GEMV_MAX=R: matmuls of up to R rows (0 to 8) take the GEMV, larger ones
           cuBLASLt; 1 by default (eng_cuda_gemv_rows; A/B) */
        s_rows_env(&st->gemv_max, "ANVIL_CUDA_GEMV_MAX", 1, ECU_GEMV_MAX);
        /* ANVIL_CUDA_SKINNY_MAX=R: products of up to R rows (0 to 16) above the GEMV's take
           skinny.cu's tensor-core stream instead of cuBLASLt; 8 by default (on the H100 batch
           2 to 8 gain 6.7 to 7.5 %, batch 16 on it loses 3.6 %; eng_cuda_skinny_rows; A/B) */
        s_rows_env(&st->skinny_max, "ANVIL_CUDA_SKINNY_MAX", ECU_SKINNY_DEFAULT, ECU_SKINNY_MAX);
        /* ANVIL_CUDA_PREFETCH_ROWS=R: steps of up to R rows (0 to 256) prefetch the O
           product's weights into L2 during the attention (ecu_prefetch, matmul.cu); 0 (off)
           by default until its A/B (gpu_session's bench_prefetch) has run on a GPU */
        s_rows_env(&st->prefetch_rows, "ANVIL_CUDA_PREFETCH_ROWS", 0, 256);
        st->l2_bytes = prop.l2CacheSize > 0 ? (size_t)prop.l2CacheSize : 0;
        /* a persistent GEMV grid of as many blocks as make its rounds of row groups whole
           (matmul.cu; on the H100 +0.9 to +1.3 % at batch 1); ANVIL_CUDA_GEMV_BALANCE=0 fills
           every resident slot instead (A/B) */
        st->gemv_balance = s_env_on("ANVIL_CUDA_GEMV_BALANCE");
        /* ANVIL_CUDA_GEMV_SEGS=1|2|4|8 fixes the GEMV's column segments a row (matmul.cu;
           A/B, eng_cuda_gemv_segs) */
        const char *gs = getenv("ANVIL_CUDA_GEMV_SEGS");
        if (gs && s_gemv_segs_set(st, atoi(gs)))
            ANV_WARN("cuda backend: ANVIL_CUDA_GEMV_SEGS=%s ignored (0, 1, 2, 4, 8)", gs);
        /* attention on tensor cores for bf16 / fp8 KV: decode with 4 or 8 query heads a KV
           head (ANVIL_CUDA_ATTN_MMA=0 keeps the FMA kernel), prefill with any
           (ANVIL_CUDA_ATTN_PREFILL_MMA=0 keeps the FMA kernel); attention.cu, A/Bs */
        st->attn_mma = s_env_on("ANVIL_CUDA_ATTN_MMA");
        st->attn_pf_mma = s_env_on("ANVIL_CUDA_ATTN_PREFILL_MMA");
        /* the tensor-core prefill: its tiles longest first over one grid of tiles x KV heads
           (ANVIL_CUDA_ATTN_PF_LPT=0: the plan's sequence order, a grid of (tiles, KV heads)),
           bf16 K / V chunks staged by cp.async in two stages (ANVIL_CUDA_ATTN_PF_ASYNC=0:
           through registers, one stage), for bf16 q staged in 16-byte loads and the block
           table read a chunk ahead (ANVIL_CUDA_ATTN_PF_EARLY=0: as the addresses are
           formed); attention.cu, A/Bs */
        st->attn_pf_lpt = st->attn_pf_mma && kv_dtype != ENG_DTYPE_F32 &&
                          s_env_on("ANVIL_CUDA_ATTN_PF_LPT"); /* the plan's order for it */
        st->attn_pf_async = s_env_on("ANVIL_CUDA_ATTN_PF_ASYNC");
        st->attn_pf_early = s_env_on("ANVIL_CUDA_ATTN_PF_EARLY");
        /* the tensor-core decode loads V after q.k (fewer registers, more blocks an SM;
           attention.cu): on the H200 +2.7 % (bf16 KV) and +4.9 % (fp8) at batch 256 x 2k, +2.2 %
           at batch 256, level at batch 1. ANVIL_CUDA_ATTN_VLATE=0 loads V with K (A/B) */
        st->attn_vlate = s_env_on("ANVIL_CUDA_ATTN_VLATE");
        /* ANVIL_CUDA_ATTN_KV_INNER=1: the decode kernels' blocks run the KV heads of a tile
           next to each other (a position's cache row read at once; attention.cu; A/B) */
        const char *ak = getenv("ANVIL_CUDA_ATTN_KV_INNER");
        st->attn_kv_inner = ak && strcmp(ak, "1") == 0;
        /* decode splits that several sequences hold in the same cache blocks (a group's
           shared prompt) read once for all of them: the group tiles of attention.cu;
           ANVIL_CUDA_ATTN_GROUP=0 gives every sequence its own (A/B; the same bits) */
        st->attn_group = s_env_on("ANVIL_CUDA_ATTN_GROUP");
        /* the decode tiles' partials as o / sum in fp16 (the default), half the bytes the
           tiles write and the combine reads (attention.cu; GRPO, batch 256 and batch 256 at
           2k x1.008 to x1.013 on an H100); ANVIL_CUDA_ATTN_PART=f32 keeps the unnormalised
           o in fp32 (A/B), =bf16 o / sum in bf16. fp32 KV keeps fp32. */
        const char *ap = getenv("ANVIL_CUDA_ATTN_PART");
        int pk = 0;
        while (ap && pk < ECU_PART_KINDS && strcmp(ap, ecu_part_name(pk)) != 0)
            pk++;
        if (ap && pk == ECU_PART_KINDS)
            ANV_WARN("cuda backend: ANVIL_CUDA_ATTN_PART=%s ignored (f32, f16, bf16)", ap);
        st->attn_part = !ap || pk == ECU_PART_KINDS ? ECU_PART_F16 : pk;
        if (kv_dtype == ENG_DTYPE_F32)
            st->attn_part = ECU_PART_F32;
        /* the ops that write a cuBLASLt product's input (SwiGLU in a composed gate|up linear,
           the attention's combine) also write it rounded, so the product does not round it
           again (ecu_twin_begin, matmul.cu); ANVIL_CUDA_TWIN=0 leaves the rounding to the
           product (A/B) */
        st->twin_on = s_env_on("ANVIL_CUDA_TWIN");
        /* a composed SwiGLU linear whose caller says the down projection alone reads its out
           (eng_linear_t.out_for_next) writes only the twin (act.cu); ANVIL_CUDA_TWIN_ONLY=0
           writes out too (A/B) */
        st->twin_only = s_env_on("ANVIL_CUDA_TWIN_ONLY");
        /* a composed gate|up product (cuBLASLt rows) written in the weights' dtype, which
           SwiGLU reads (matmul.cu, act.cu); ANVIL_CUDA_GU_LOW=0 writes it in fp32 (A/B) */
        st->gu_low = s_env_on("ANVIL_CUDA_GU_LOW");
        /* the norms with 16-byte loads and stores, a quarter of the threads a row
           (s_norm4_kernel, norm.cu); ANVIL_CUDA_NORM_VEC=0 for the scalar kernel (A/B) */
        st->norm_vec = s_env_on("ANVIL_CUDA_NORM_VEC");
        /* rope + KV store with 8- and 16-byte accesses, two pairs a thread
           (s_rope_store2_kernel, rope.cu); ANVIL_CUDA_ROPE_VEC=0 for the scalar kernel (A/B) */
        st->rope_vec = s_env_on("ANVIL_CUDA_ROPE_VEC");
        /* ANVIL_CUDA_SAMPLE_LIST=0: the sampler's later passes read the whole row instead of
           the candidates compacted after two radix bytes (softmax.cu; A/B) */
        st->sample_list = s_env_on("ANVIL_CUDA_SAMPLE_LIST");
        /* blocks a row of the sampler: 0 = by batch (a cluster of 8 on sm_90 while the
           rows' clusters are resident at once, see ecu_sample); ANVIL_CUDA_SAMPLE_BLOCKS=1
           or 8 fixes it (A/B) */
        const char *sb = getenv("ANVIL_CUDA_SAMPLE_BLOCKS");
        st->sample_blocks = prop.major >= 9 ? 0 : 1;
        if (sb && atoi(sb) == ECU_SM_CLUSTER && prop.major >= 9)
            st->sample_blocks = ECU_SM_CLUSTER;
        else if (sb && atoi(sb) == 1)
            st->sample_blocks = 1;
        else if (sb)
            ANV_WARN("cuda backend: ANVIL_CUDA_SAMPLE_BLOCKS=%s ignored (1, or %d on sm_90+)", sb,
                     ECU_SM_CLUSTER);
    }
    if (cublasLtCreate(&st->lt) != CUBLAS_STATUS_SUCCESS) {
        ANV_ERROR("cuda backend: cannot create a cuBLASLt handle");
        goto fail;
    }
    if (ecu_buf_reserve(&st->lt_ws, (size_t)32 << 20) < 0)
        goto fail;
    be->name = "cuda";
    be->kv_dtype = kv_dtype;
    be->alloc = s_alloc;
    be->free = s_free;
    be->weight = s_weight;
    be->weight_release = s_weight_release;
    be->weight_into = s_weight_into;
    be->upload = s_upload;
    be->download = s_download;
    be->copy = s_copy;
    be->sync = s_sync;
    be->embedding = ecu_embedding;
    be->rmsnorm = ecu_rmsnorm;
    be->add_rmsnorm = ecu_add_rmsnorm;
    be->matmul = ecu_matmul;
    be->rope = ecu_rope;
    be->kv_store = ecu_kv_store;
    be->attention = ecu_attention;
    be->copy_block = ecu_copy_block;
    be->swiglu = ecu_swiglu;
    be->gather_rows = ecu_gather_rows;
    be->log_softmax = ecu_log_softmax;
    be->mem_info = s_mem_info;
    be->prepare = ecu_prepare;
    be->graph_step = ecu_graph_step;
    be->graph_reset = ecu_graph_reset;
    be->rope_kv_store = ecu_rope_kv_store;
    be->swiglu_fused = ecu_swiglu_fused;
    be->linear = ecu_linear;
    be->prefetch = ecu_prefetch;
    be->sample = ecu_sample;
    ANV_INFO(
        "cuda backend: %s, %d SMs, %.1f GiB, kv %s, pdl %s, gemv up to %d rows, grid "
        "%s%s%s, tensor-core skinny products up to %d rows, L2 prefetch of O up to %d rows, "
        "rounded twins %s%s, gate|up product in %s, %s norms, %s rope store, decode attention "
        "%s%s%s%s, %s partials%s%s%s%s, sampler %s%s",
        prop.name, st->n_sm, prop.totalGlobalMem / 1073741824.0, ecu_dtype_name(kv_dtype),
        st->pdl ? "on" : "off", st->gemv_max,
        st->gemv_persist ? "persistent (staged norm)" : "a block a group",
        st->gemv_rope ? "" : ", rope apart", st->gemv_balance ? ", whole rounds" : ", every slot",
        st->skinny_max, st->prefetch_rows, st->twin_on ? "on" : "off",
        st->twin_on && st->twin_only ? " (SwiGLU's alone)" : "",
        st->gu_low ? "the weights' dtype" : "fp32", st->norm_vec ? "16-byte" : "scalar",
        st->rope_vec ? "vector" : "scalar",
        st->attn_mma ? "mma (bf16/fp8 KV, 4 or 8 heads a KV head)" : "fma",
        st->attn_mma && st->attn_vlate ? ", V after q.k" : "",
        st->attn_kv_inner ? ", KV heads inner" : "",
        st->attn_mma && st->attn_group ? ", shared splits as group tiles" : "",
        ecu_part_name(st->attn_part),
        st->attn_pf_mma ? ", prefill attention mma (bf16/fp8 KV)" : ", prefill fma",
        st->attn_pf_lpt ? ", longest tiles first" : "",
        st->attn_pf_mma && st->attn_pf_async ? ", cp.async stages" : "",
        st->attn_pf_mma && st->attn_pf_early ? ", early loads (bf16)" : "",
        st->sample_blocks == 0   ? "8 blocks a row while the clusters are resident, then 1"
        : st->sample_blocks == 1 ? "1 block a row"
                                 : "8 blocks a row",
        st->sample_list ? ", candidate list" : ", whole-row passes");
    return be;
fail:
    s_destroy(&be);
    return NULL;
}

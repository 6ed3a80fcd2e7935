/*  graph.cu - decode steps replayed as CUDA graphs, one graph per (batch bucket, block-table
    stride, caller key).

    A decode step of an 8B model is ~450 kernel launches; at batch 1 their launch cost is a
    visible part of the ~6 ms step. graph_step() keeps one cudaGraphExec per key. Each call
    first prepares the step (ids, positions, slots and rows in one upload into the fixed
    step buffer; the attention plan in its fixed-size layout: graph_splits tiles per sequence,
    see attention.cu), so the only thing that changes between replays is the contents of
    those device buffers. Life of a key: the first call runs the caller's record() eagerly,
    which grows every scratch buffer the step needs to its size; the second call captures
    record() into a graph (scratch buffers frozen: a grow during the capture fails it) and
    launches it; later calls launch it. When any scratch buffer moved since (ecu_buf_epoch),
    the graph may hold a freed pointer: the key goes back to an eager run, then a capture. A
    capture that fails (an op that synchronises, a frozen buffer that had to grow) leaves the
    key eager for good, logged once. Everything stays on the backend's one stream; nothing
    waits for the host.
*/
#include <stdlib.h>
#include <string.h>

#include "eng_cuda_internal.h"

#define ECU_ATTN_SPLIT_POS 128 /* = ECU_ATTN_SPLIT of attention.cu */

typedef enum { G_EAGER = 0, G_CAPTURED = 1, G_NEVER = -1 } s_gstate_t;

struct ecu_graph {
    int n_tok, max_blocks;
    uint64_t key;
    unsigned long long epoch; /* buffer epoch of the last eager run or of the capture */
    s_gstate_t state;
    cudaGraphExec_t exec;
    unsigned long long launches;
};

void ecu_graph_free_all(ecu_state_t *st)
{
    for (int i = 0; i < st->n_graphs; i++)
        if (st->graphs[i].exec)
            cudaGraphExecDestroy(st->graphs[i].exec);
    free(st->graphs);
    st->graphs = NULL;
    st->n_graphs = st->cap_graphs = 0;
}

extern "C" void ecu_graph_reset(eng_backend_t *be)
{
    ecu_state_t *st = ecu_st(be);
    if (st->stream)
        cudaStreamSynchronize(st->stream); /* a launched graph may still run */
    ecu_graph_free_all(st);
}

static struct ecu_graph *s_find(ecu_state_t *st, int n_tok, int max_blocks, uint64_t key)
{
    for (int i = 0; i < st->n_graphs; i++) {
        struct ecu_graph *g = &st->graphs[i];
        if (g->n_tok == n_tok && g->max_blocks == max_blocks && g->key == key)
            return g;
    }
    if (st->n_graphs == st->cap_graphs) {
        int cap = st->cap_graphs ? 2 * st->cap_graphs : 16;
        struct ecu_graph *v = (struct ecu_graph *)realloc(st->graphs, cap * sizeof(*v));
        if (!v)
            return NULL;
        st->graphs = v;
        st->cap_graphs = cap;
    }
    struct ecu_graph *g = &st->graphs[st->n_graphs++];
    memset(g, 0, sizeof(*g));
    g->n_tok = n_tok, g->max_blocks = max_blocks, g->key = key, g->state = G_EAGER;
    g->epoch = 0; /* never run: the first call is eager */
    return g;
}

/* Captures record() into g->exec; 0 or a negative code (the stream is left usable). */
static int s_capture(ecu_state_t *st, struct ecu_graph *g, int (*record)(void *), void *ctx)
{
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamBeginCapture(st->stream, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) {
        ANV_ERROR("cuda graph: cannot begin a capture: %s", cudaGetErrorString(e));
        cudaGetLastError();
        return ANV_EINTERNAL;
    }
    ecu_buf_frozen = 1;
    int rc = record(ctx);
    ecu_buf_frozen = 0;
    e = cudaStreamEndCapture(st->stream, &graph);
    if (rc == 0 && e != cudaSuccess) {
        ANV_ERROR("cuda graph: capture of a %d-token step failed: %s", g->n_tok,
                  cudaGetErrorString(e));
        rc = ANV_EINTERNAL;
    }
    if (rc == 0) {
        e = cudaGraphInstantiate(&g->exec, graph, 0);
        if (e != cudaSuccess) {
            ANV_ERROR("cuda graph: cannot instantiate a %d-token step: %s", g->n_tok,
                      cudaGetErrorString(e));
            g->exec = NULL;
            rc = ANV_EINTERNAL;
        }
    }
    if (graph)
        cudaGraphDestroy(graph);
    cudaGetLastError(); /* a failed capture leaves a sticky-free error behind */
    return rc;
}

extern "C" int ecu_graph_step(eng_backend_t *be, const eng_step_t *step, int block_size,
                              uint64_t key, int (*record)(void *ctx), void *ctx)
{
    ecu_state_t *st = ecu_st(be);
    if (!step || !step->batch || !record || block_size <= 0 || step->n_tok <= 0 ||
        step->batch->n_seq != step->n_tok || step->n_rows != step->n_tok ||
        step->batch->max_blocks <= 0)
        return -EINVAL;
    const int mb = step->batch->max_blocks;
    long long positions = (long long)mb * block_size;
    st->graph_splits = (int)((positions + ECU_ATTN_SPLIT_POS - 1) / ECU_ATTN_SPLIT_POS);
    st->kv_block_size = block_size;
    const double t0 = ecu_now();
    int rc = ecu_prepare(be, step);
    st->graph_splits = 0;
    st->graph_prep_s += ecu_now() - t0;
    if (rc)
        return rc;
    /* a step with group tiles records one more launch a layer: its own graph */
    if (st->plan.n_gt > 0)
        key ^= 1ull << 63;
    struct ecu_graph *g = s_find(st, step->n_tok, mb, key);
    if (!g)
        return -ENOMEM;
    if (g->state == G_CAPTURED && g->epoch != ecu_buf_epoch) {
        cudaGraphExecDestroy(g->exec); /* stream-ordered: an earlier launch completes first */
        g->exec = NULL;
        g->state = G_EAGER;
        g->epoch = 0;
    }
    if (g->state == G_CAPTURED) {
        const double t1 = ecu_now();
        ECU_CHECK(cudaGraphLaunch(g->exec, st->stream));
        st->graph_launch_s += ecu_now() - t1;
        g->launches++;
        st->graph_launches++;
        return 0;
    }
    const double t1 = ecu_now(); /* a first use or a capture: graph_build_s */
    if (g->state == G_EAGER && g->epoch == ecu_buf_epoch) {
        rc = s_capture(st, g, record, ctx);
        if (rc == 0) {
            g->state = G_CAPTURED;
            g->epoch = ecu_buf_epoch;
            st->graph_captures++;
            ECU_CHECK(cudaGraphLaunch(g->exec, st->stream));
            g->launches++;
            st->graph_launches++;
            st->graph_build_s += ecu_now() - t1;
            return 0;
        }
        ANV_WARN("cuda graph: %d-token steps (stride %d blocks) run without a graph", g->n_tok,
                 mb);
        g->state = G_NEVER;
        /* the plan and step buffers were prepared before the capture: still valid */
    }
    st->graph_eager++;
    rc = record(ctx);
    st->graph_build_s += ecu_now() - t1;
    if (rc == 0 && g->state == G_EAGER)
        g->epoch = ecu_buf_epoch; /* buffers now at this step's sizes: capture next time */
    return rc;
}

extern "C" int eng_cuda_graph_times(
    eng_backend_t *be, double *prepare_s, double *plan_s, double *launch_s, double *build_s)
{
    ecu_state_t *st = ecu_st(be);
    if (!st)
        return -EINVAL;
    if (build_s)
        *build_s = st->graph_build_s;
    if (prepare_s)
        *prepare_s = st->graph_prep_s;
    if (plan_s)
        *plan_s = st->graph_plan_s;
    if (launch_s)
        *launch_s = st->graph_launch_s;
    return 0;
}

extern "C" int eng_cuda_graph_stats(eng_backend_t *be, long long *captures, long long *launches,
                                    long long *eager)
{
    ecu_state_t *st = ecu_st(be);
    if (!st)
        return -EINVAL;
    if (captures)
        *captures = st->graph_captures;
    if (launches)
        *launches = st->graph_launches;
    if (eager)
        *eager = st->graph_eager;
    return 0;
}

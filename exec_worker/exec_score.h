/*  exec_score.h - score one candidate: the module the worker loop calls.

    exec_scorer_t owns the sandbox, the warm pool of candidate interpreters and one reference
    interpreter (which only ever runs task code and the static checks, so it is reused across
    evaluations and restarted when it dies). exec_scorer_score() runs one evaluation end to
    end and always fills a result; it returns non-zero only when the task itself could not be
    scored (reference broken, no interpreter could be started), never for a bad candidate; a
    broken reference makes the result say so even where the candidate failed too.

    One evaluation: extract the code; static checks in the reference interpreter; the
    reference's Model is built with a secret init seed and, while it runs on trials + 1 secret
    input seeds (outputs written to its /io), a warm interpreter loads the candidate (compile
    budget) and runs the same seeds (first call = compile/autotune time, then the run budget);
    once both are done, the worker compares every output file itself (exec_compare). Launches of
    the candidate's own kernels are counted in every trial (odd trials in train mode); mutated
    inputs, tampered timers, constant outputs where a constant would pass are caught here. Then
    timing: batches of fresh-input iterations, reference and candidate alternating (order
    swapped every round), L2 flushed, device synchronised, on CUDA a short spin kernel queued
    before the start event (so the events time the GPU work, not the host's launch latency),
    events and host clock both recorded, the worker's own clock around every batch, the output
    of one secretly chosen iteration per batch kept and written by a separate dump command
    (outside that clock) and checked, adaptive stop on the relative standard error of both
    means; then one more secret trial checked after timing, and on CUDA the profiler's share of
    GPU time in the candidate's kernels. The scorer is single-threaded: one timed evaluation per
    GPU at a time.
*/
#ifndef EXEC_SCORE_H
#define EXEC_SCORE_H

#include "anvil.pb-c.h"
#include "exec_result.h"
#include "exec_sandbox.h"

#include <stdbool.h>

typedef struct {
    const char *kind;    /* kernelbench | tritonbench-g | tritonbench-t */
    const char *name;    /* for logs */
    const char *source;  /* the task file's text */
    const char *globals; /* JSON object of module constants to override, or NULL */
} exec_task_t;

typedef struct {
    int trials;             /* >= 5 correctness trials (one more is run after timing) */
    int warmup;             /* warm-up calls per side before timing */
    int min_iters, max_iters, batch;
    double target_rel_err;  /* adaptive stop: relative standard error of both means */
    bool flush_l2;
    int spin_us;            /* CUDA: GPU spin before each timed call's start event, longer
                               than the host's launch latency; 0 off (default 300) */
    int check_sample;       /* timing rounds compare this many secretly chosen elements of
                               each larger output leaf (0: whole outputs; default 65536) */
    const char *reward_formula;
    double speedup_cap;
    int compile_timeout_s;  /* candidate load + first call */
    int run_timeout_s;      /* trials, timing, re-check */
    double atol, rtol;      /* < 0: per-dtype defaults */
    bool static_checks;     /* false: violations are only flagged (for testing the sandbox) */
    const char *allow_ops;  /* extra torch ops allowed on the forward path, comma-separated */
    double min_gpu_share;   /* below it (CUDA) the result is flagged low_gpu_share */
    bool require_launches;  /* false only to calibrate with a pure-torch candidate (benchmarks) */
} exec_spec_t;

void exec_spec_default(exec_spec_t *spec);
/* Applies the fields present in a ScoringSpec (strings stay borrowed from it). */
void exec_spec_from_proto(exec_spec_t *spec, const Anvil__ScoringSpec *pb);
/* Kind name of a TaskKind, NULL for TASK_KIND_NONE. */
const char *exec_task_kind_name(Anvil__TaskKind kind);

typedef struct {
    exec_sandbox_cfg_t sandbox;
    int pool_size;          /* warm candidate interpreters kept started */
    int ready_timeout_s;    /* waiting for a warm interpreter */
} exec_scorer_cfg_t;

typedef struct exec_scorer_t exec_scorer_t;

/* Probes the sandbox, starts the reference interpreter and the pool. NULL (logged) when no
   sandbox works or the interpreter cannot start. */
exec_scorer_t *exec_scorer_new(const exec_scorer_cfg_t *cfg);
void exec_scorer_destroy(exec_scorer_t **self_p);
const char *exec_scorer_sandbox_mode(const exec_scorer_t *self);

/* Scores completion against task with spec into out (initialised here; release with
   exec_result_release). Returns 0 whenever out holds a verdict, or a negative code (out's
   error says why) when the task could not be scored. */
int exec_scorer_score(exec_scorer_t *self,
                      const exec_task_t *task,
                      const char *completion,
                      const exec_spec_t *spec,
                      exec_result_t *out);

#endif

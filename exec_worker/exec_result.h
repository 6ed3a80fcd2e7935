/*  exec_result.h - the outcome of scoring one candidate, as JSON and as an ExecResult.

    Plain data (the struct is public): exec_score fills it, main.c prints it with
    exec_result_to_json(), the worker loop sends it with exec_result_to_proto(). Figures that
    were not measured are NAN (JSON null, proto field absent). Status values are the proto's
    ExecStatus numbers.
*/
#ifndef EXEC_RESULT_H
#define EXEC_RESULT_H

#include "anvil.pb-c.h"

#include <stdbool.h>
#include <stddef.h>

#define EXEC_MAX_FLAGS 32

typedef enum {
    EXEC_ST_NONE = ANVIL__EXEC_STATUS__EXEC_NONE,
    EXEC_ST_FORMAT_ERROR = ANVIL__EXEC_STATUS__EXEC_FORMAT_ERROR,
    EXEC_ST_REJECTED_STATIC = ANVIL__EXEC_STATUS__EXEC_REJECTED_STATIC,
    EXEC_ST_COMPILE_ERROR = ANVIL__EXEC_STATUS__EXEC_COMPILE_ERROR,
    EXEC_ST_RUNTIME_ERROR = ANVIL__EXEC_STATUS__EXEC_RUNTIME_ERROR,
    EXEC_ST_TIMEOUT = ANVIL__EXEC_STATUS__EXEC_TIMEOUT,
    EXEC_ST_CRASHED = ANVIL__EXEC_STATUS__EXEC_CRASHED,
    EXEC_ST_INCORRECT = ANVIL__EXEC_STATUS__EXEC_INCORRECT,
    EXEC_ST_CORRECT = ANVIL__EXEC_STATUS__EXEC_CORRECT,
} exec_status_t;

/* Where an evaluation's wall time went (exec_result_json writes them as timing.phases): the
   per-candidate overhead beyond the timed work is read from these. The phases follow each
   other in order, except the two timing_* entries, which are parts of timing (set only when
   timing completed). The reference's trials run in its own process from the end of ref to
   the end of ref_wait, beside cand_load and cand_trials: none of these phases is theirs alone.
   A phase the evaluation failed in is not set, except ref_wait, which is set whenever the
   reference's trials were sent. */
typedef enum {
    EXEC_PH_REF_START,      /* starting the reference interpreter (0 when it is warm) */
    EXEC_PH_STATIC,         /* static checks in the reference interpreter */
    EXEC_PH_REF,            /* reference load, and sending its trials + 1 outputs */
    EXEC_PH_CAND_LOAD,      /* waiting for a warm interpreter and loading the candidate */
    EXEC_PH_CAND_TRIALS,    /* the candidate's correctness trials (first call compiles) */
    EXEC_PH_REF_WAIT,       /* then waiting for the reference's trials (or after a failure) */
    EXEC_PH_COMPARE,        /* comparing the trial outputs */
    EXEC_PH_TIMING,         /* interleaved timing rounds, their output checks included */
    EXEC_PH_TIMING_DUMP,    /* of timing: the rounds' dump commands, both sides */
    EXEC_PH_TIMING_COMPARE, /* of timing: comparing the rounds' two dumps */
    EXEC_PH_CHECK,          /* the check after timing */
    EXEC_PH_PROFILE,        /* GPU-time share from the profiler */
    EXEC_PH_N
} exec_phase_t;

extern const char *const exec_phase_names[EXEC_PH_N];

typedef struct {
    exec_status_t status;
    char error[512];          /* one line */
    char *traceback;          /* tail, owned; NULL when none */
    char *static_errors;      /* newline-separated rule violations, owned; NULL when none */
    double max_abs_err, max_rel_err;
    double ref_ms, cand_ms;   /* mean per call of the timed iterations */
    double ref_host_ms, cand_host_ms;
    double ref_rel_err, cand_rel_err; /* relative standard error of the means */
    int ref_iters, cand_iters;
    int timing_rounds; /* timing rounds, each with one compared output per side */
    double ref_q[3], cand_q[3]; /* 10th, 50th, 90th percentile per call (diagnostics) */
    /* CUDA: 90th percentile of the host time from the spin's launch to a call's return; above
       the spin (spin_us) the GPU waited for the host inside the measured interval */
    double ref_launch_p90, cand_launch_p90;
    int spin_us;
    double speedup;
    double compile_ms;        /* candidate's first call: JIT compile and autotune */
    double load_ms;
    unsigned launches;        /* candidate's own Triton launches, smallest over trials */
    double gpu_share;
    double reward;
    int trials;
    double eval_ms;           /* wall time of the whole evaluation */
    double wait_ms;           /* of which waiting for a warm interpreter */
    double phase_ms[EXEC_PH_N]; /* NAN for phases the evaluation did not reach */
    char gpu[128], driver[64], torch[64], triton[64], clocks[128], device[16];
    char sandbox[32];         /* bwrap | bwrap-root | rlimit: the isolation that was used */
    char *flags[EXEC_MAX_FLAGS];
    size_t n_flags;
} exec_result_t;

void exec_result_init(exec_result_t *r);
void exec_result_release(exec_result_t *r);
/* Adds a flag (copied; duplicates ignored). */
void exec_result_flag(exec_result_t *r, const char *flag);
bool exec_result_has_flag(const exec_result_t *r, const char *flag);
/* Sets status and the one-line error (printf format; newlines become spaces). */
void exec_result_set(exec_result_t *r, exec_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Takes ownership of tb (may be NULL), keeping its last 4000 bytes. */
void exec_result_set_traceback(exec_result_t *r, char *tb);
const char *exec_status_name(exec_status_t st);
/* Returns NUL-terminated JSON (caller frees) or NULL on allocation failure. */
char *exec_result_to_json(const exec_result_t *r, bool pretty);
/* Fills out (initialised by the callee) with copies; free with exec_result_proto_free(). */
int exec_result_to_proto(const exec_result_t *r, Anvil__ExecResult *out);
void exec_result_proto_free(Anvil__ExecResult *out);

#endif

/*  exec_serve.h - the exec worker as a broker worker.

    Takes ExecUnits from the broker (through broker/client), scores each with the scorer
    (exec_score.h) and sends an ExecDone with the verdict. One unit at a time per worker (one
    timed evaluation per GPU): the worker advertises one slot; the client library's own thread
    keeps heartbeats and lease renewals flowing during an evaluation, which can take minutes.
    A unit whose task cannot be scored at all (no reference code, unknown kind, reference
    broken) goes back as UnitFailed, not retryable; an infrastructure failure (no interpreter
    could start) as retryable. Cancels drop queued units of the job; the evaluation in progress
    runs to its end and its result is discarded by the client library (the lease is gone).
    Draining (SIGTERM): units that arrive are handed back, the current evaluation finishes,
    then DISCONNECT.
*/
#ifndef EXEC_SERVE_H
#define EXEC_SERVE_H

#include "exec_score.h"

#include <signal.h>

typedef struct {
    const char *broker;       /* worker endpoint */
    const char *worker_id;    /* NULL = <host>-exec-<pid> */
    int gpu_index;            /* -1 = CPU */
    const char *device;       /* cpu | cuda */
    const char *ready_file;   /* written once the broker answers; NULL or "" = none */
    const char *curve_secret; /* own zcert secret file; NULL or "" = no CURVE */
    const char *curve_server; /* the broker's public key file */
} exec_serve_cfg_t;

/* Serves until *stop becomes non-zero. `base` is the worker's default spec; a unit's
   ScoringSpec overrides it field by field. Returns 0, or non-zero when the broker client could
   not start. */
int exec_serve_run(exec_scorer_t *sc, const exec_serve_cfg_t *cfg, const exec_spec_t *base,
                   volatile sig_atomic_t *stop);

#endif

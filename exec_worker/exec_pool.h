/*  exec_pool.h - warm sandboxed interpreters, started ahead of need.

    Importing torch and triton takes seconds, so the pool keeps `size` harness processes
    started (each in a fresh sandbox, CUDA untouched) while the current candidate runs; a
    taken process is never returned, the pool starts its replacement at once. A process that
    dies before it is ready is replaced; three such deaths in a row make take() fail with the
    last one's output logged (a broken interpreter must not loop). While a timed phase runs,
    exec_pool_pause stops (SIGSTOP) the processes still importing, so that their imports take
    no CPU from the timed calls' host side; exec_pool_resume continues them.
*/
#ifndef EXEC_POOL_H
#define EXEC_POOL_H

#include "exec_proc.h"
#include "exec_sandbox.h"

typedef struct exec_pool_t exec_pool_t;

/* Borrows sandbox; starts size (>= 1) processes. NULL when the first spawn fails. */
exec_pool_t *exec_pool_new(exec_sandbox_t *sandbox, int size);
void exec_pool_destroy(exec_pool_t **self_p);
/* Returns a ready process (caller owns it) within timeout_ms, or NULL. *wait_ms (may be NULL)
   gets how long the caller waited. */
exec_proc_t *exec_pool_take(exec_pool_t *self, int timeout_ms, double *wait_ms);
/* Stops the processes not yet ready (their whole process group) until exec_pool_resume;
   ready ones are idle on their command pipe and are left alone. Idempotent. */
void exec_pool_pause(exec_pool_t *self);
/* Continues what exec_pool_pause stopped. Idempotent; a no-op when nothing is paused. */
void exec_pool_resume(exec_pool_t *self);
/* Number of processes started and ready now. */
int exec_pool_ready(exec_pool_t *self);

#endif

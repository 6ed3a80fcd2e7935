/*  exec_pool.c - a small array of starting or ready harness processes.

    Design: single-threaded; readiness is polled (non-blocking) on every call, and take()
    blocks on the oldest process only when none is ready, which is also the one that will be
    ready first.
*/
#include "exec_pool.h"

#include <signal.h>

#include "anv_error.h"
#include "anv_log.h"
#include "anv_time.h"

#include <stdlib.h>
#include <string.h>

#define S_MAX_POOL 16

struct exec_pool_t {
    exec_sandbox_t *sandbox;
    exec_proc_t *procs[S_MAX_POOL];
    bool stopped[S_MAX_POOL]; /* procs[i] was sent SIGSTOP by exec_pool_pause */
    int size;
    int failures;
};

static void s_fill(exec_pool_t *self)
{
    for (int i = 0; i < self->size; i++) {
        if (!self->procs[i])
            self->procs[i] = exec_sandbox_spawn(self->sandbox);
    }
}

exec_pool_t *exec_pool_new(exec_sandbox_t *sandbox, int size)
{
    exec_pool_t *self = calloc(1, sizeof *self);
    if (!self)
        return NULL;
    self->sandbox = sandbox;
    self->size = size < 1 ? 1 : size > S_MAX_POOL ? S_MAX_POOL : size;
    s_fill(self);
    if (!self->procs[0]) {
        exec_pool_destroy(&self);
        return NULL;
    }
    return self;
}

void exec_pool_destroy(exec_pool_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    for (int i = 0; i < S_MAX_POOL; i++)
        exec_proc_destroy(&(*self_p)->procs[i]);
    free(*self_p);
    *self_p = NULL;
}

/* Replaces processes that died before becoming ready. Returns false after 3 in a row. */
static bool s_reap_dead(exec_pool_t *self)
{
    for (int i = 0; i < self->size; i++) {
        exec_proc_t *p = self->procs[i];
        if (p && !exec_proc_is_ready(p) && !exec_proc_poll_ready(p) && !exec_proc_alive(p)) {
            ANV_WARN("warm interpreter died before it was ready (%s): %.300s",
                     exec_proc_exit_desc(p), exec_proc_log_tail(p));
            exec_proc_destroy(&self->procs[i]);
            if (++self->failures >= 3)
                return false;
        }
    }
    s_fill(self);
    return true;
}

void exec_pool_pause(exec_pool_t *self)
{
    for (int i = 0; self && i < self->size; i++) {
        exec_proc_t *p = self->procs[i];
        if (p && !self->stopped[i] && !exec_proc_poll_ready(p) && exec_proc_alive(p)) {
            exec_proc_signal(p, SIGSTOP);
            self->stopped[i] = true;
        }
    }
}

void exec_pool_resume(exec_pool_t *self)
{
    for (int i = 0; self && i < self->size; i++) {
        if (self->stopped[i] && self->procs[i])
            exec_proc_signal(self->procs[i], SIGCONT);
        self->stopped[i] = false;
    }
}

int exec_pool_ready(exec_pool_t *self)
{
    int n = 0;
    for (int i = 0; i < self->size; i++)
        if (self->procs[i] && exec_proc_poll_ready(self->procs[i]))
            n++;
    return n;
}

exec_proc_t *exec_pool_take(exec_pool_t *self, int timeout_ms, double *wait_ms)
{
    uint64_t t0 = anv_now_ms(), deadline = t0 + (uint64_t)timeout_ms;
    exec_proc_t *got = NULL;
    while (!got) {
        if (!s_reap_dead(self)) {
            ANV_ERROR("warm interpreters keep dying before they are ready: giving up");
            self->failures = 0;
            break;
        }
        int oldest = -1;
        for (int i = 0; i < self->size; i++) {
            exec_proc_t *p = self->procs[i];
            if (!p)
                continue;
            if (exec_proc_poll_ready(p)) {
                got = p;
                self->procs[i] = NULL;
                break;
            }
            if (oldest < 0 ||
                exec_proc_started_ms(p) < exec_proc_started_ms(self->procs[oldest]))
                oldest = i;
        }
        if (got)
            break;
        uint64_t now = anv_now_ms();
        if (now >= deadline || oldest < 0)
            break;
        exec_proc_wait_ready(self->procs[oldest], (int)(deadline - now < 500 ? deadline - now
                                                                                : 500),
                             NULL);
    }
    if (got)
        self->failures = 0;
    s_fill(self);
    if (wait_ms)
        *wait_ms = (double)(anv_now_ms() - t0);
    return got;
}

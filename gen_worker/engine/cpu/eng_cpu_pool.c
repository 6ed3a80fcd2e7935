/*  eng_cpu_pool.c - worker threads for the CPU backend.

    Workers sleep on one condition variable and wake when the job generation counter moves;
    each computes its chunk of the current job and decrements `pending`; the caller runs
    chunk 0 itself and then waits for pending == 0. Jobs never overlap, so one set of job
    fields suffices.
*/
#include "eng_cpu_pool.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

#include "anv_log.h"

struct eng_cpu_pool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    unsigned long generation;
    int pending;
    bool quit;
    /* current job */
    int n;
    eng_cpu_pool_fn fn;
    void *arg;
};

typedef struct {
    eng_cpu_pool_t *pool;
    int index;
} s_worker_arg_t;

static void s_chunk(int n, int n_threads, int index, int *begin, int *end)
{
    int per = n / n_threads, extra = n % n_threads;
    *begin = index * per + (index < extra ? index : extra);
    *end = *begin + per + (index < extra ? 1 : 0);
}

static void *s_worker(void *varg)
{
    s_worker_arg_t *wa = varg;
    eng_cpu_pool_t *self = wa->pool;
    int index = wa->index;
    free(wa);
    unsigned long seen = 0;
    pthread_mutex_lock(&self->mu);
    for (;;) {
        while (!self->quit && self->generation == seen)
            pthread_cond_wait(&self->wake, &self->mu);
        if (self->quit)
            break;
        seen = self->generation;
        int n = self->n;
        eng_cpu_pool_fn fn = self->fn;
        void *arg = self->arg;
        pthread_mutex_unlock(&self->mu);
        int begin, end;
        s_chunk(n, self->n_threads, index, &begin, &end);
        if (begin < end)
            fn(arg, begin, end, index);
        pthread_mutex_lock(&self->mu);
        if (--self->pending == 0)
            pthread_cond_signal(&self->done);
    }
    pthread_mutex_unlock(&self->mu);
    return NULL;
}

eng_cpu_pool_t *eng_cpu_pool_new(int n_threads)
{
    if (n_threads <= 0) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = cores > 0 ? (int)cores : 1;
    }
    eng_cpu_pool_t *self = calloc(1, sizeof(*self));
    if (!self)
        return NULL;
    self->n_threads = n_threads;
    pthread_mutex_init(&self->mu, NULL);
    pthread_cond_init(&self->wake, NULL);
    pthread_cond_init(&self->done, NULL);
    self->threads = calloc((size_t)n_threads, sizeof(pthread_t));
    if (!self->threads)
        goto fail;
    for (int i = 1; i < n_threads; i++) {
        s_worker_arg_t *wa = malloc(sizeof(*wa));
        if (wa) {
            wa->pool = self;
            wa->index = i;
        }
        if (!wa || pthread_create(&self->threads[i], NULL, s_worker, wa) != 0) {
            free(wa);
            ANV_ERROR("cannot start cpu worker thread %d", i);
            self->n_threads = i; /* threads 1 .. i-1 exist and are joined */
            eng_cpu_pool_destroy(&self);
            return NULL;
        }
    }
    return self;
fail:
    free(self);
    return NULL;
}

void eng_cpu_pool_destroy(eng_cpu_pool_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    eng_cpu_pool_t *self = *self_p;
    pthread_mutex_lock(&self->mu);
    self->quit = true;
    pthread_cond_broadcast(&self->wake);
    pthread_mutex_unlock(&self->mu);
    for (int i = 1; i < self->n_threads; i++)
        pthread_join(self->threads[i], NULL);
    pthread_mutex_destroy(&self->mu);
    pthread_cond_destroy(&self->wake);
    pthread_cond_destroy(&self->done);
    free(self->threads);
    free(self);
    *self_p = NULL;
}

int eng_cpu_pool_size(const eng_cpu_pool_t *self)
{
    return self->n_threads;
}

void eng_cpu_pool_run(eng_cpu_pool_t *self, int n, eng_cpu_pool_fn fn, void *arg)
{
    if (n <= 0)
        return;
    if (self->n_threads == 1 || n == 1) {
        fn(arg, 0, n, 0);
        return;
    }
    pthread_mutex_lock(&self->mu);
    self->n = n;
    self->fn = fn;
    self->arg = arg;
    self->pending = self->n_threads - 1;
    self->generation++;
    pthread_cond_broadcast(&self->wake);
    pthread_mutex_unlock(&self->mu);
    int begin, end;
    s_chunk(n, self->n_threads, 0, &begin, &end);
    if (begin < end)
        fn(arg, begin, end, 0);
    pthread_mutex_lock(&self->mu);
    while (self->pending > 0)
        pthread_cond_wait(&self->done, &self->mu);
    pthread_mutex_unlock(&self->mu);
}

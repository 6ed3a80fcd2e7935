/*  eng_cpu_pool.h - a fixed pool of worker threads for the CPU backend's parallel loops.

    eng_cpu_pool_run(pool, n, fn, arg) splits the index range [0, n) into contiguous chunks,
    one per thread (the calling thread takes the first), and returns when every chunk is
    done. There is no work stealing: the ops it runs are regular (rows of a matmul, heads of an
    attention). With one thread everything runs inline. The pool belongs to one thread (the
    caller of run); its workers only ever run the chunk they are handed.
*/
#ifndef ENG_CPU_POOL_H
#define ENG_CPU_POOL_H

typedef struct eng_cpu_pool eng_cpu_pool_t;

/* fn(arg, begin, end, thread_index) processes indices [begin, end). */
typedef void (*eng_cpu_pool_fn)(void *arg, int begin, int end, int thread_index);

/* n_threads <= 0 means one per online core. Returns NULL on failure (logged). */
eng_cpu_pool_t *eng_cpu_pool_new(int n_threads);
void eng_cpu_pool_destroy(eng_cpu_pool_t **self_p);
int eng_cpu_pool_size(const eng_cpu_pool_t *self);
/* Runs fn over [0, n) on all threads and waits. */
void eng_cpu_pool_run(eng_cpu_pool_t *self, int n, eng_cpu_pool_fn fn, void *arg);

#endif

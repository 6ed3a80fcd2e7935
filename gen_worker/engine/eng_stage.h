/*  eng_stage.h - copying large host data (an mmap'd checkpoint) to a device through a ring of
    staging buffers, reading the next chunk while the previous one is in flight.

    The ring is n_bufs buffers of buf_bytes each (pinned host memory on a GPU backend). For
    every chunk the copier takes the next buffer, waits until that buffer's previous transfer
    completed (wait), memcpy's the chunk from the source into it (this is where the mmap'd
    file is actually read: page faults, disk) and hands it to submit, which starts the
    transfer to dst and returns at once. With 2+ buffers, reading chunk i+1 overlaps the
    transfer of chunk i. The copier is backend-independent (the CUDA backend's submit is a
    cudaMemcpyAsync plus an event record, its wait an event synchronize); tests drive it with
    plain memcpy callbacks. It also counts bytes and the seconds spent in eng_stage_copy and
    eng_stage_finish, for the GB/s a loader reports. One thread.
*/
#ifndef ENG_STAGE_H
#define ENG_STAGE_H

#include <stddef.h>
#include <stdint.h>

#define ENG_STAGE_MAX_BUFS 8

typedef struct {
    /* starts copying n bytes of staging buffer `buf` to dst (asynchronously); 0 or < 0 */
    int (*submit)(void *ctx, int buf, void *dst, size_t n);
    /* returns once the last submit of buffer `buf` has completed; 0 or < 0 */
    int (*wait)(void *ctx, int buf);
    void *ctx;
    void *bufs[ENG_STAGE_MAX_BUFS];
    int n_bufs;
    size_t buf_bytes;
    /* state */
    int next;
    unsigned pending; /* bit b: buffer b has a transfer in flight */
    size_t bytes;     /* copied since init */
    int chunks;
    double seconds;   /* spent inside copy and finish */
} eng_stage_t;

/* Checks the ring (1 .. ENG_STAGE_MAX_BUFS buffers, buf_bytes > 0, callbacks set) and resets
   the counters; the caller fills bufs, n_bufs, buf_bytes, submit, wait and ctx first.
   0 or -EINVAL. */
int eng_stage_init(eng_stage_t *s);
/* Copies n bytes from src (host) to dst (device) through the ring. May return before the
   last chunks landed: call eng_stage_finish before using dst from another stream, or rely on
   the submit callback's ordering. 0 or the first error of a callback. */
int eng_stage_copy(eng_stage_t *s, void *dst, const void *src, size_t n);
/* Waits for every transfer in flight. */
int eng_stage_finish(eng_stage_t *s);

#endif

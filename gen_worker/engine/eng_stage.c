/*  eng_stage.c - the staging ring of eng_stage.h.

    Buffers are used round robin; a buffer is reused only after wait() said its previous
    transfer completed, so the memcpy into it never races the device reading it.
*/
#include "eng_stage.h"

#include <errno.h>
#include <string.h>
#include <time.h>

static double s_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int eng_stage_init(eng_stage_t *s)
{
    if (!s || s->n_bufs < 1 || s->n_bufs > ENG_STAGE_MAX_BUFS || s->buf_bytes == 0 ||
        !s->submit || !s->wait)
        return -EINVAL;
    for (int i = 0; i < s->n_bufs; i++)
        if (!s->bufs[i])
            return -EINVAL;
    s->next = 0;
    s->pending = 0;
    s->bytes = 0;
    s->chunks = 0;
    s->seconds = 0;
    return 0;
}

int eng_stage_copy(eng_stage_t *s, void *dst, const void *src, size_t n)
{
    double t0 = s_now();
    int rc = 0;
    for (size_t off = 0; off < n && rc == 0;) {
        int b = s->next;
        s->next = (b + 1) % s->n_bufs;
        if (s->pending & (1u << b)) {
            if ((rc = s->wait(s->ctx, b)))
                break;
            s->pending &= ~(1u << b);
        }
        size_t k = n - off < s->buf_bytes ? n - off : s->buf_bytes;
        memcpy(s->bufs[b], (const char *)src + off, k);
        if ((rc = s->submit(s->ctx, b, (char *)dst + off, k)))
            break;
        s->pending |= 1u << b;
        s->chunks++;
        s->bytes += k;
        off += k;
    }
    s->seconds += s_now() - t0;
    return rc;
}

int eng_stage_finish(eng_stage_t *s)
{
    double t0 = s_now();
    int rc = 0;
    for (int b = 0; b < s->n_bufs; b++)
        if (s->pending & (1u << b)) {
            int r = s->wait(s->ctx, b);
            if (r && !rc)
                rc = r;
            s->pending &= ~(1u << b);
        }
    s->seconds += s_now() - t0;
    return rc;
}

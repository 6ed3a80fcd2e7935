/*  eng_kv.c - refcounted KV blocks with a LIFO free list.

    refcount[b] == 0 exactly when b is on the free list; the free list is a stack so that
    recently freed (cache-warm) blocks are reused first.
*/
#include "eng_kv.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "anv_log.h"

struct eng_kv {
    int n_blocks, block_size;
    int32_t *refcount; /* (n_blocks) */
    int32_t *free;     /* stack of free blocks */
    int n_free;
    int peak_used;
};

size_t eng_kv_auto_bytes(size_t device_free, size_t reload_bytes, size_t fallback)
{
    size_t keep = ((size_t)4 << 30) + device_free / 10 + reload_bytes;
    return device_free > keep && device_free - keep > fallback ? device_free - keep : fallback;
}

eng_kv_t *eng_kv_new(int n_blocks, int block_size)
{
    if (n_blocks <= 0 || block_size <= 0)
        return NULL;
    eng_kv_t *self = calloc(1, sizeof(*self));
    if (!self)
        return NULL;
    self->refcount = calloc((size_t)n_blocks, sizeof(int32_t));
    self->free = malloc((size_t)n_blocks * sizeof(int32_t));
    if (!self->refcount || !self->free) {
        eng_kv_destroy(&self);
        return NULL;
    }
    self->n_blocks = n_blocks;
    self->block_size = block_size;
    for (int i = 0; i < n_blocks; i++)
        self->free[i] = n_blocks - 1 - i; /* block 0 is handed out first */
    self->n_free = n_blocks;
    return self;
}

void eng_kv_destroy(eng_kv_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    free((*self_p)->refcount);
    free((*self_p)->free);
    free(*self_p);
    *self_p = NULL;
}

int eng_kv_block_size(const eng_kv_t *self)
{
    return self->block_size;
}

int eng_kv_total_blocks(const eng_kv_t *self)
{
    return self->n_blocks;
}

int eng_kv_free_blocks(const eng_kv_t *self)
{
    return self->n_free;
}

int eng_kv_peak_blocks(const eng_kv_t *self)
{
    return self->peak_used;
}

void eng_kv_reset_peak(eng_kv_t *self)
{
    self->peak_used = self->n_blocks - self->n_free;
}

int eng_kv_refcount(const eng_kv_t *self, int32_t block)
{
    return block >= 0 && block < self->n_blocks ? self->refcount[block] : -1;
}

static int32_t s_take(eng_kv_t *self)
{
    int32_t b = self->free[--self->n_free];
    self->refcount[b] = 1;
    int used = self->n_blocks - self->n_free;
    if (used > self->peak_used)
        self->peak_used = used;
    return b;
}

static void s_unref(eng_kv_t *self, int32_t b)
{
    if (--self->refcount[b] == 0)
        self->free[self->n_free++] = b;
}

static int s_reserve_table(eng_kv_seq_t *seq, int n)
{
    if (n <= seq->cap)
        return 0;
    int cap = seq->cap ? seq->cap : 8;
    while (cap < n)
        cap *= 2;
    int32_t *b = realloc(seq->blocks, (size_t)cap * sizeof(int32_t));
    if (!b)
        return -ENOMEM;
    seq->blocks = b;
    seq->cap = cap;
    return 0;
}

static bool s_needs_cow(const eng_kv_t *self, const eng_kv_seq_t *seq)
{
    return seq->n_tokens % self->block_size != 0 && seq->n_blocks > 0 &&
           self->refcount[seq->blocks[seq->n_blocks - 1]] > 1;
}

int eng_kv_blocks_needed(const eng_kv_t *self, const eng_kv_seq_t *seq, int n_new)
{
    int have = seq->n_blocks;
    int want = (seq->n_tokens + n_new + self->block_size - 1) / self->block_size;
    int cow = n_new > 0 && s_needs_cow(self, seq) ? 1 : 0;
    return (want > have ? want - have : 0) + cow;
}

int eng_kv_append(eng_kv_t *self, eng_kv_seq_t *seq, int n_new, int32_t *slots, eng_kv_copy_t *copy)
{
    copy->src = copy->dst = -1;
    if (n_new <= 0)
        return 0;
    int need = eng_kv_blocks_needed(self, seq, n_new);
    if (need > self->n_free)
        return -ENOSPC;
    int want = (seq->n_tokens + n_new + self->block_size - 1) / self->block_size;
    if (s_reserve_table(seq, want))
        return -ENOMEM;
    if (s_needs_cow(self, seq)) {
        int32_t old = seq->blocks[seq->n_blocks - 1], fresh = s_take(self);
        s_unref(self, old);
        seq->blocks[seq->n_blocks - 1] = fresh;
        copy->src = old;
        copy->dst = fresh;
    }
    while (seq->n_blocks < want)
        seq->blocks[seq->n_blocks++] = s_take(self);
    for (int i = 0; i < n_new; i++) {
        int t = seq->n_tokens + i;
        slots[i] = seq->blocks[t / self->block_size] * self->block_size + t % self->block_size;
    }
    seq->n_tokens += n_new;
    return 0;
}

int eng_kv_fork_prefix(eng_kv_t *self, const eng_kv_seq_t *src, eng_kv_seq_t *dst, int n_blocks)
{
    if (n_blocks < 0 || n_blocks > src->n_blocks || dst->n_blocks != 0)
        return -EINVAL;
    if (s_reserve_table(dst, n_blocks))
        return -ENOMEM;
    for (int i = 0; i < n_blocks; i++) {
        dst->blocks[i] = src->blocks[i];
        self->refcount[src->blocks[i]]++;
    }
    dst->n_blocks = n_blocks;
    dst->n_tokens = n_blocks * self->block_size;
    return 0;
}

int eng_kv_fork(eng_kv_t *self, const eng_kv_seq_t *src, eng_kv_seq_t *dst)
{
    int rc = eng_kv_fork_prefix(self, src, dst, src->n_blocks);
    if (rc == 0)
        dst->n_tokens = src->n_tokens;
    return rc;
}

void eng_kv_release(eng_kv_t *self, eng_kv_seq_t *seq)
{
    for (int i = 0; i < seq->n_blocks; i++)
        s_unref(self, seq->blocks[i]);
    seq->n_blocks = 0;
    seq->n_tokens = 0;
}

void eng_kv_seq_free(eng_kv_seq_t *seq)
{
    free(seq->blocks);
    memset(seq, 0, sizeof(*seq));
}

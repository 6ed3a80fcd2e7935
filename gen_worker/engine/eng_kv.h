/*  eng_kv.h - the paged KV cache's block manager (bookkeeping only; the pools live in the
    model, on the backend).

    The cache is n_blocks fixed-size blocks of block_size token slots. A sequence owns a block
    table (its blocks in order) and a token count; token t sits in blocks[t / block_size] at
    offset t % block_size. Blocks are refcounted: eng_kv_fork() makes a second sequence share
    every block of the first (a group of n samples prefills its prompt once and forks n - 1
    times). Shared full blocks are only ever read. A shared, partially filled last block is
    copied before a sequence appends to it (copy-on-write): eng_kv_append() allocates the copy,
    reports (src, dst) for the caller to execute on the backend, and drops one reference to
    the original. Appends are all-or-nothing: -ENOSPC leaves everything unchanged, which is
    what lets the scheduler preempt and retry. One thread.
*/
#ifndef ENG_KV_H
#define ENG_KV_H

#include <stddef.h>
#include <stdint.h>

typedef struct eng_kv eng_kv_t;

/* A sequence's block table: plain data, owned by the sequence, managed by eng_kv. */
typedef struct {
    int32_t *blocks;
    int n_blocks, cap;
    int n_tokens;
} eng_kv_seq_t;

/* A block copy the caller must perform before the step's KV writes. */
typedef struct {
    int32_t src, dst;
} eng_kv_copy_t;

/* The pool's byte budget when none was asked for: on a device with device_free bytes free
   after the weights, all of it less 10 %, 4 GiB (activations, logits, graphs) and
   reload_bytes (what a weight update allocates while the old weights are loaded:
   eng_model_reload_bytes, 0 on CUDA, which writes an update into the loaded buffers); with no
   device (device_free 0) or when that is smaller, fallback. */
size_t eng_kv_auto_bytes(size_t device_free, size_t reload_bytes, size_t fallback);

eng_kv_t *eng_kv_new(int n_blocks, int block_size);
void eng_kv_destroy(eng_kv_t **self_p);

int eng_kv_block_size(const eng_kv_t *self);
int eng_kv_total_blocks(const eng_kv_t *self);
int eng_kv_free_blocks(const eng_kv_t *self);
/* Largest number of blocks in use at once since creation (or the last reset_peak). */
int eng_kv_peak_blocks(const eng_kv_t *self);
void eng_kv_reset_peak(eng_kv_t *self);
int eng_kv_refcount(const eng_kv_t *self, int32_t block);

/* Blocks that appending n_new tokens to seq would take from the free list (new blocks plus
   a copy-on-write of a shared partial last block). */
int eng_kv_blocks_needed(const eng_kv_t *self, const eng_kv_seq_t *seq, int n_new);
/* Reserves slots for n_new tokens: slots[i] (block * block_size + offset) for token
   seq->n_tokens + i, and seq->n_tokens grows by n_new. When the last block was shared and
   partial it is replaced by a private copy, reported in *copy (copy->src = -1 otherwise).
   Returns 0, -ENOSPC (nothing changed) or -ENOMEM. */
int eng_kv_append(
    eng_kv_t *self, eng_kv_seq_t *seq, int n_new, int32_t *slots, eng_kv_copy_t *copy);
/* dst (empty) shares every block of src. Returns 0 or -ENOMEM. */
int eng_kv_fork(eng_kv_t *self, const eng_kv_seq_t *src, eng_kv_seq_t *dst);
/* dst (empty) shares the first n_blocks blocks of src, all full, and holds their
   n_blocks * block_size tokens (a recomputed sample takes its group's prompt so). Returns 0,
   -EINVAL (n_blocks beyond src, dst not empty) or -ENOMEM. */
int eng_kv_fork_prefix(eng_kv_t *self, const eng_kv_seq_t *src, eng_kv_seq_t *dst, int n_blocks);
/* Drops the sequence's references (blocks reaching zero go back to the free list) and empties
   it; its table memory is kept for reuse. */
void eng_kv_release(eng_kv_t *self, eng_kv_seq_t *seq);
/* Frees the table memory of an already released sequence. */
void eng_kv_seq_free(eng_kv_seq_t *seq);

#endif

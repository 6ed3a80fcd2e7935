/*  eng_cpu.h - the CPU reference backend (see eng_ops.h for the ops it implements).

    Also exports the dtype widening helpers, which the loader and the tests use to read
    checkpoint tensors the same way the ops do.
*/
#ifndef ENG_CPU_H
#define ENG_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "eng_ops.h"

/* n_threads <= 0: one per online core. Returns NULL on failure (logged). */
eng_backend_t *eng_cpu_backend_new(int n_threads);

/* dst[i] = (float)src[offset + i] for i < n, src of the given dtype. */
void eng_cpu_widen(float *dst, const void *src, eng_dtype_t dtype, size_t offset, size_t n);
float eng_cpu_f16_to_f32(uint16_t h);

#endif

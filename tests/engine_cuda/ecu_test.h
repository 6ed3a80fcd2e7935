/*  ecu_test.h - small helpers shared by the CUDA backend tests (header-only, static).

    Comparison by relative norm ||a - b|| / ||b|| plus the largest absolute difference, a
    check counter, random fills, and host <-> backend copies. A test exits 77 when no GPU is
    visible, 1 when a check failed.
*/
#ifndef ECU_TEST_H
#define ECU_TEST_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eng_ops.h"

static int ecu_t_checks, ecu_t_failed;

static uint64_t ecu_t_rng = 88172645463325252ull;
static inline double ecu_t_uniform(void) /* [0, 1) */
{
    ecu_t_rng ^= ecu_t_rng << 13;
    ecu_t_rng ^= ecu_t_rng >> 7;
    ecu_t_rng ^= ecu_t_rng << 17;
    return (double)(ecu_t_rng >> 11) * (1.0 / 9007199254740992.0);
}
static inline float ecu_t_randf(float scale)
{
    return (float)((ecu_t_uniform() * 2.0 - 1.0) * scale);
}

static inline void ecu_t_check(int ok, const char *what)
{
    ecu_t_checks++;
    if (!ok) {
        ecu_t_failed++;
        printf("FAIL %s\n", what);
    }
}

/* Compares a (tested) with b (reference), n floats; passes when the relative norm error is
   at most rtol and no element is NaN. Prints one line. */
static inline int ecu_t_close(const char *what, const float *a, const float *b, size_t n,
                              double rtol)
{
    double num = 0, den = 0, maxd = 0;
    int nan = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(b[i]))
            nan = 1;
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
        if (fabs(d) > maxd)
            maxd = fabs(d);
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    int ok = !nan && rel <= rtol;
    printf("%-4s %-48s rel=%.2e max_abs=%.2e (tol %.0e)\n", ok ? "ok" : "FAIL", what, rel, maxd,
           rtol);
    ecu_t_checks++;
    if (!ok)
        ecu_t_failed++;
    return ok;
}

static inline void *ecu_t_put(eng_backend_t *be, const void *host, size_t bytes)
{
    void *p = be->alloc(be, bytes);
    if (!p || be->upload(be, p, host, bytes) || be->sync(be)) {
        fprintf(stderr, "cannot place %zu bytes on backend %s\n", bytes, be->name);
        exit(1);
    }
    return p;
}

static inline void ecu_t_get(eng_backend_t *be, void *host, const void *src, size_t bytes)
{
    if (be->download(be, host, src, bytes)) {
        fprintf(stderr, "cannot read %zu bytes from backend %s\n", bytes, be->name);
        exit(1);
    }
}

static inline uint16_t ecu_t_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}
static inline float ecu_t_bf16_f(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline int ecu_t_done(const char *name)
{
    printf("%s: %d checks, %d failed\n", name, ecu_t_checks, ecu_t_failed);
    return ecu_t_failed ? 1 : 0;
}

#endif

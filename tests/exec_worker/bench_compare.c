/*  bench_compare.c - how fast the exec worker compares a candidate's output with the
    reference's, against the machine's memory bandwidth measured in the same run.

    The worker compares every trial's outputs itself (the verdict never comes from the sandbox),
    so on large KernelBench outputs (88_MinGPTNewGelu: 8192 x 8192 fp32, 256 MiB per output)
    the comparison is part of the per-candidate overhead. This writes two such record files
    (the format of harness/tensorio.py), times exec_compare_files over them and a memcpy of the
    same bytes, and prints both rates and their ratio.

      bench_compare [MIB_PER_OUTPUT] [DTYPE f32|bf16]     (default 256 f32)
*/
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "anv_time.h"
#include "exec_compare.h"
#include "exec_tensor.h"

static int s_write(const char *path, uint32_t dtype, uint64_t n, size_t esize, unsigned seed)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    uint32_t head[4] = {0x54564E41u, dtype, 1, 3};
    uint64_t nbytes = n * esize;
    int64_t shape = (int64_t)n;
    fwrite(head, sizeof head, 1, f);
    fwrite(&nbytes, 8, 1, f);
    fwrite(&shape, 8, 1, f);
    fwrite("out\0\0\0\0\0", 8, 1, f); /* key + pad to 8 */
    uint8_t *buf = malloc(nbytes);
    if (!buf) {
        fclose(f);
        return -1;
    }
    srand(seed);
    for (uint64_t i = 0; i < n; i++) {
        float v = (float)(i % 977) / 977.0f + (float)(rand() % 3) * 1e-7f;
        if (esize == 4) {
            memcpy(buf + 4 * i, &v, 4);
        } else {
            uint32_t u;
            memcpy(&u, &v, 4);
            uint16_t h = (uint16_t)(u >> 16);
            memcpy(buf + 2 * i, &h, 2);
        }
    }
    size_t w = fwrite(buf, 1, nbytes, f);
    free(buf);
    return fclose(f) == 0 && w == nbytes ? 0 : -1;
}

int main(int argc, char **argv)
{
    uint64_t mib = argc > 1 ? strtoull(argv[1], NULL, 10) : 256;
    int bf16 = argc > 2 && strcmp(argv[2], "bf16") == 0;
    size_t esize = bf16 ? 2 : 4;
    uint64_t n = (mib << 20) / esize;
    char dir[] = "/tmp/anvil-bench-compare-XXXXXX", a[64], b[64];
    if (!mkdtemp(dir))
        return 1;
    snprintf(a, sizeof a, "%s/ref.anvt", dir);
    snprintf(b, sizeof b, "%s/cand.anvt", dir);
    int rc = 1;
    if (s_write(a, bf16 ? EXEC_DT_BF16 : EXEC_DT_F32, n, esize, 1) ||
        s_write(b, bf16 ? EXEC_DT_BF16 : EXEC_DT_F32, n, esize, 2)) {
        fprintf(stderr, "bench_compare: cannot write %s\n", dir);
        goto out;
    }
    exec_tol_t tol;
    exec_tol_default(&tol);
    exec_cmp_t cmp;
    double best_cmp = 1e30, best_cpy = 1e30;
    size_t bytes = (size_t)(n * esize);
    uint8_t *src = malloc(bytes), *dst = malloc(bytes);
    if (!src || !dst)
        goto out;
    memset(src, 1, bytes);
    memset(dst, 2, bytes);
    for (int rep = 0; rep < 3; rep++) {
        uint64_t t0 = anv_now_ns();
        if (exec_compare_files(a, b, &tol, &cmp) != 0 || !cmp.match) {
            fprintf(stderr, "bench_compare: unexpected result: %s\n", cmp.reason);
            goto out;
        }
        uint64_t t1 = anv_now_ns();
        memcpy(dst, src, bytes);
        uint64_t t2 = anv_now_ns();
        if ((t1 - t0) / 1e9 < best_cmp)
            best_cmp = (t1 - t0) / 1e9;
        if ((t2 - t1) / 1e9 < best_cpy)
            best_cpy = (t2 - t1) / 1e9;
        src[rep] ^= dst[bytes - 1]; /* keep the copy observable */
    }
    /* the comparison reads two outputs; the copy reads one and writes one: same traffic */
    double gbs_cmp = 2.0 * bytes / best_cmp / 1e9, gbs_cpy = 2.0 * bytes / best_cpy / 1e9;
    printf("compare %s, 2 x %llu MiB: %.1f ms = %.2f GB/s read; memcpy of the same bytes "
           "%.1f ms = %.2f GB/s; compare/memcpy %.2f; %.2f ns per element\n",
           bf16 ? "bf16" : "f32", (unsigned long long)mib, best_cmp * 1e3, gbs_cmp,
           best_cpy * 1e3, gbs_cpy, gbs_cmp / gbs_cpy, best_cmp * 1e9 / (double)n);
    rc = 0;
    free(src);
    free(dst);
out:
    unlink(a);
    unlink(b);
    rmdir(dir);
    return rc;
}

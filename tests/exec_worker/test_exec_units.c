/*  test_exec_units.c - unit tests of the worker-side pure modules: extraction, the reward
    formula, the tensor record reader (including malformed files), the comparison with its
    degenerate-output checks and the result's JSON and proto forms.
*/
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "exec_compare.h"
#include "exec_extract.h"
#include "exec_result.h"
#include "exec_reward.h"
#include "exec_tensor.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void t_extract(void **st)
{
    char err[128];
    char *c = exec_extract_code("<think>```python\nbad()\n```</think>\ntext\n```python\nx = 1\n```\n"
                                "more\n```py\ny = 2\n```\n",
                                err, sizeof err);
    assert_non_null(c);
    assert_string_equal(c, "y = 2\n");
    free(c);
    assert_null(exec_extract_code("<think> never ends ```python\nx\n```", err, sizeof err));
    assert_non_null(strstr(err, "think"));
    assert_null(exec_extract_code("plain text", err, sizeof err));
    assert_null(exec_extract_code("```python\n   \n```\n", err, sizeof err));
    assert_null(exec_extract_code("```python\nx = 1\n", err, sizeof err));
    assert_non_null(strstr(err, "not closed"));
    c = exec_extract_code("```cpp\nint x;\n```\n~~~~python\nz = 3\n~~~~\n", err, sizeof err);
    assert_non_null(c);
    assert_string_equal(c, "z = 3\n");
    free(c);
}

static void t_reward(void **st)
{
    exec_reward_vars_t v = {.correct = 1, .speedup = 5, .cap = 3};
    double r;
    char err[128];
    assert_int_equal(exec_reward_eval(EXEC_REWARD_DEFAULT, &v, &r, err, sizeof err), 0);
    assert_true(fabs(r - 4.0) < 1e-12);
    v.speedup = 0.5;
    exec_reward_eval(EXEC_REWARD_DEFAULT, &v, &r, err, sizeof err);
    assert_true(fabs(r - 1.5) < 1e-12);
    v.correct = 0;
    exec_reward_eval(EXEC_REWARD_DEFAULT, &v, &r, err, sizeof err);
    assert_true(r == 0);
    v.correct = 1;
    assert_int_equal(exec_reward_eval("(speedup > 1) * log(speedup + 1) - -2", &v, &r, err,
                                      sizeof err), 0);
    assert_true(fabs(r - 2.0) < 1e-12);
    assert_int_equal(exec_reward_eval("clamp(speedup, 1, 2) / 0", &v, &r, err, sizeof err), 0);
    assert_true(r == 0); /* inf -> 0 */
    assert_int_not_equal(exec_reward_eval("correct *", &v, &r, err, sizeof err), 0);
    assert_int_not_equal(exec_reward_eval("nope + 1", &v, &r, err, sizeof err), 0);
    assert_int_not_equal(exec_reward_eval("min(1)", &v, &r, err, sizeof err), 0);
    char deep[400];
    memset(deep, '(', 300);
    deep[300] = '\0';
    assert_int_not_equal(exec_reward_eval(deep, &v, &r, err, sizeof err), 0);
}

/* writes one record in the harness format */
static void s_rec(FILE *f, uint32_t dt, const int64_t *shape, uint32_t ndim, const char *key,
                  const void *data, uint64_t nbytes)
{
    uint32_t h[4] = {0x54564E41u, dt, ndim, (uint32_t)strlen(key)};
    fwrite(h, 4, 4, f);
    fwrite(&nbytes, 8, 1, f);
    if (ndim) /* fwrite(NULL, ..) is undefined even for 0 items (UBSan) */
        fwrite(shape, 8, ndim, f);
    fwrite(key, 1, strlen(key), f);
    size_t head = 24 + 8 * ndim + strlen(key);
    static const char zero[8];
    fwrite(zero, 1, (8 - head % 8) % 8, f);
    fwrite(data, 1, nbytes, f);
    fwrite(zero, 1, (8 - nbytes % 8) % 8, f);
}

static char *s_file(const float *v, int n, const char *key)
{
    char *path = strdup("/tmp/anvil-test-tensor-XXXXXX");
    int fd = mkstemp(path);
    FILE *f = fdopen(fd, "wb");
    int64_t shape[1] = {n};
    s_rec(f, EXEC_DT_F32, shape, 1, key, v, sizeof(float) * (size_t)n);
    int64_t i = 7;
    s_rec(f, EXEC_DT_I64, NULL, 0, "meta", &i, 8);
    fclose(f);
    return path;
}

static void t_compare(void **st)
{
    exec_tol_t tol;
    exec_tol_default(&tol);
    exec_cmp_t cmp;
    float ref[4] = {0.001f, 0.002f, 0.003f, 0.004f}, same[4] = {0.001f, 0.002f, 0.003f, 0.00401f};
    float zero[4] = {0, 0, 0, 0}, off[4] = {0.001f, 0.5f, 0.003f, 0.004f};
    float nan4[4] = {0.001f, NAN, 0.003f, 0.004f};
    char *r = s_file(ref, 4, "0"), *s = s_file(same, 4, "0"), *z = s_file(zero, 4, "0");
    char *o = s_file(off, 4, "0"), *k = s_file(ref, 4, "other"), *n = s_file(nan4, 4, "0");
    assert_int_equal(exec_compare_files(r, s, &tol, &cmp), 0);
    assert_true(cmp.match);
    assert_true(cmp.zero_would_pass && cmp.const_would_pass);
    assert_false(cmp.ref_constant);
    assert_int_equal(exec_compare_files(r, z, &tol, &cmp), 0);
    assert_true(cmp.match && cmp.cand_constant); /* zeros pass atol 1e-2: the scorer flags it */
    assert_int_equal(exec_compare_files(r, o, &tol, &cmp), 0);
    assert_false(cmp.match);
    assert_non_null(strstr(cmp.reason, "element 1"));
    assert_int_equal(exec_compare_files(r, k, &tol, &cmp), 0);
    assert_false(cmp.match);
    assert_int_equal(exec_compare_files(r, n, &tol, &cmp), 0);
    assert_false(cmp.match);
    assert_true(isinf(cmp.max_abs));
    /* a truncated candidate file is a mismatch with a reason, not a crash */
    truncate(o, 30);
    assert_int_equal(exec_compare_files(r, o, &tol, &cmp), 0);
    assert_false(cmp.match);
    assert_non_null(strstr(cmp.reason, "candidate output"));
    /* a missing reference file means nothing can be scored */
    assert_int_not_equal(exec_compare_files("/nonexistent/anvil", s, &tol, &cmp), 0);
    char *all[] = {r, s, z, o, k, n};
    for (int i = 0; i < 6; i++) {
        unlink(all[i]);
        free(all[i]);
    }
}

/* The element-by-element rule, written plainly: what the vectorized blocks must agree with. */
typedef struct {
    uint64_t bad, first_bad;
    double max_abs, max_rel;
    bool zero, cst;
} s_naive_t;

static s_naive_t s_naive(const float *r, const float *c, int n, double atol, double rtol)
{
    s_naive_t o = {0, UINT64_MAX, 0, 0, true, true};
    double sum = 0;
    int fin = 0;
    for (int i = 0; i < n; i++)
        if (isfinite(r[i]))
            sum += r[i], fin++;
    double mean = fin ? sum / fin : 0;
    for (int i = 0; i < n; i++) {
        double rv = r[i], cv = c[i], lim = atol + rtol * fabs(rv);
        bool close = isnan(rv) ? isnan(cv) : isinf(rv) ? cv == rv
                                                       : isfinite(cv) && fabs(cv - rv) <= lim;
        if (!close) {
            o.bad++;
            if (o.first_bad == UINT64_MAX)
                o.first_bad = (uint64_t)i;
        }
        if (isfinite(rv) && isfinite(cv)) {
            double d = fabs(cv - rv), den = fabs(rv) > 1e-12 ? fabs(rv) : 1e-12;
            o.max_abs = d > o.max_abs ? d : o.max_abs;
            o.max_rel = d / den > o.max_rel ? d / den : o.max_rel;
        }
        o.zero = o.zero && isfinite(rv) && fabs(rv) <= lim;
        o.cst = o.cst && isfinite(rv) && fabs(mean - rv) <= lim;
    }
    return o;
}

/* One comparison of n elements with out-of-tolerance elements at bad_at (5 of them) and a
   NaN on both sides at nan_at (< 0: none), checked against the plain rule: count, first
   element, max abs and rel errors, the zero and constant checks. narrow: values within
   0.001 of 1, where a constant passes. */
static void s_compare_case(int n, const int *bad_at, int nan_at, bool narrow)
{
    float *ref = malloc(sizeof(float) * (size_t)n), *cand = malloc(sizeof(float) * (size_t)n);
    assert_non_null(ref);
    assert_non_null(cand);
    exec_tol_t tol;
    exec_tol_default(&tol);
    for (int i = 0; i < n; i++) {
        ref[i] = narrow ? 1.0f + 0.001f * (float)sin(i) : (float)(sin(i * 0.37) * (1 + i % 7));
        cand[i] = ref[i] + 1e-4f * (float)cos(i * 1.3);
    }
    for (int j = 0; j < 5; j++)
        cand[bad_at[j]] += narrow ? 0.5f : 3.0f;
    if (nan_at >= 0)
        ref[nan_at] = cand[nan_at] = NAN;
    char *r = s_file(ref, n, "0"), *c = s_file(cand, n, "0");
    exec_cmp_t cmp;
    assert_int_equal(exec_compare_files(r, c, &tol, &cmp), 0);
    s_naive_t want = s_naive(ref, cand, n, 1e-2, 1e-2);
    assert_int_equal(want.bad, 5);
    assert_int_equal(cmp.bad, want.bad);
    assert_false(cmp.match);
    char at[64];
    snprintf(at, sizeof at, "element %llu:", (unsigned long long)want.first_bad);
    assert_non_null(strstr(cmp.reason, at));
    assert_true(cmp.max_abs == want.max_abs);
    assert_true(fabs(cmp.max_rel - want.max_rel) <= 1e-12 * want.max_rel);
    assert_int_equal(cmp.zero_would_pass, want.zero);
    assert_int_equal(cmp.const_would_pass, want.cst);
    assert_int_equal(cmp.const_would_pass, narrow);
    assert_int_equal(cmp.compared, n);
    unlink(r);
    unlink(c);
    free(r);
    free(c);
    free(ref);
    free(cand);
}

/* Three blocks of 4096 and an odd tail: the fast path (finite blocks), the general path (a
   block with a NaN on both sides) and the tail, with out-of-tolerance elements in each. Then
   a leaf of 3 x 2^21 + 3 elements, which is split over threads on a machine with more than
   one core: bad elements on both sides of the parts' boundaries (of 1537 blocks, two threads
   take 769 each, three 513) and in the tail, the first one in a later part than the NaN. */
static void t_compare_blocks(void **st)
{
    const int small_bad[] = {5000, 4099, 9000, 12289, 12290};
    s_compare_case(3 * 4096 + 3, small_bad, 6000, false);
    s_compare_case(3 * 4096 + 3, small_bad, -1, true);
    const int big = 3 * (1 << 21) + 3;
    const int big_bad[] = {769 * 4096 - 1, 769 * 4096, 513 * 4096 - 1, 513 * 4096, big - 1};
    s_compare_case(big, big_bad, 100, false);
    s_compare_case(big, big_bad, -1, true);
}

static void t_tensor_malformed(void **st)
{
    char path[] = "/tmp/anvil-test-bad-XXXXXX", err[256];
    int fd = mkstemp(path);
    FILE *f = fdopen(fd, "wb");
    int64_t shape[1] = {1000000}; /* claims 4 MB, holds 16 bytes */
    float v[4] = {1, 2, 3, 4};
    uint32_t h[4] = {0x54564E41u, EXEC_DT_F32, 1, 1};
    uint64_t nbytes = 4000000;
    fwrite(h, 4, 4, f);
    fwrite(&nbytes, 8, 1, f);
    fwrite(shape, 8, 1, f);
    fwrite("k\0\0\0\0\0\0\0", 1, 7, f);
    fwrite(v, 4, 4, f);
    fclose(f);
    assert_null(exec_tensors_open(path, err, sizeof err));
    assert_non_null(strstr(err, "past the end"));
    f = fopen(path, "wb");
    fwrite("garbage!garbage!garbage!garbage!", 1, 32, f);
    fclose(f);
    assert_null(exec_tensors_open(path, err, sizeof err));
    unlink(path);
}

static void t_result_json_proto(void **st)
{
    exec_result_t r;
    exec_result_init(&r);
    exec_result_set(&r, EXEC_ST_INCORRECT, "bad\nline %d", 3);
    exec_result_flag(&r, "x");
    exec_result_flag(&r, "x");
    assert_int_equal(r.n_flags, 1);
    assert_string_equal(r.error, "bad line 3");
    char *j = exec_result_to_json(&r, false);
    assert_non_null(strstr(j, "\"status\":\"incorrect\""));
    assert_non_null(strstr(j, "\"speedup\":null"));
    assert_non_null(strstr(j, "\"timing_dump\":null")); /* not reached: null */
    free(j);
    /* timing's parts sit in timing.phases beside it, under their own names; the wait for the
       reference's trials (which ran beside the candidate's load and trials) follows those */
    r.phase_ms[EXEC_PH_REF] = 3;
    r.phase_ms[EXEC_PH_CAND_TRIALS] = 12;
    r.phase_ms[EXEC_PH_REF_WAIT] = 0.5;
    r.phase_ms[EXEC_PH_TIMING] = 40;
    r.phase_ms[EXEC_PH_TIMING_DUMP] = 7.5;
    r.phase_ms[EXEC_PH_TIMING_COMPARE] = 2.25;
    j = exec_result_to_json(&r, false);
    assert_non_null(strstr(j, "\"ref\":3,\"cand_load\":null,\"cand_trials\":12,"
                              "\"ref_wait\":0.5,\"compare\":null"));
    assert_non_null(strstr(j, "\"timing\":40,\"timing_dump\":7.5,\"timing_compare\":2.25"));
    assert_non_null(strstr(j, "\"cand_launch_p90_ms\":null")); /* no CUDA timing: null */
    assert_null(strstr(j, "\"spin_us\""));
    free(j);
    /* CUDA: the launch percentile beside the spin it is compared with */
    r.cand_launch_p90 = 0.125;
    r.spin_us = 100;
    j = exec_result_to_json(&r, false);
    assert_non_null(strstr(j, "\"cand_launch_p90_ms\":0.125,\"spin_us\":100"));
    free(j);
    Anvil__ExecResult pb;
    assert_int_equal(exec_result_to_proto(&r, &pb), 0);
    assert_int_equal(pb.status, ANVIL__EXEC_STATUS__EXEC_INCORRECT);
    assert_false(pb.has_speedup);
    assert_int_equal(pb.n_flags, 1);
    assert_non_null(pb.result_json);
    size_t len = anvil__exec_result__get_packed_size(&pb);
    uint8_t *buf = malloc(len);
    anvil__exec_result__pack(&pb, buf);
    Anvil__ExecResult *back = anvil__exec_result__unpack(NULL, len, buf);
    assert_non_null(back);
    assert_string_equal(back->error, "bad line 3");
    anvil__exec_result__free_unpacked(back, NULL);
    free(buf);
    exec_result_proto_free(&pb);
    exec_result_release(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(t_extract),          cmocka_unit_test(t_reward),
        cmocka_unit_test(t_compare),          cmocka_unit_test(t_compare_blocks),
        cmocka_unit_test(t_tensor_malformed),
        cmocka_unit_test(t_result_json_proto),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*  test_eng_sampler.c - the sampler: greedy, seeded reproducibility, distinct sample seeds,
    top-k / top-p / min-p supports, empirical frequencies against the softmax, top logprobs. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* cmocka needs the headers above first */
#include <cmocka.h>

#include "eng_sampler.h"

#define V 6

/* log_softmax of logits {2, 1, 0.5, 0, -1, 3} computed here */
static void s_logprobs(float *lp)
{
    const double l[V] = {2, 1, 0.5, 0, -1, 3};
    double m = 3, sum = 0;
    for (int i = 0; i < V; i++)
        sum += exp(l[i] - m);
    for (int i = 0; i < V; i++)
        lp[i] = (float)(l[i] - m - log(sum));
}

static void test_greedy(void **state)
{
    float lp[V];
    s_logprobs(lp);
    eng_sampler_t *s = eng_sampler_new(V);
    eng_sampling_t p = {0, 0, 1, 0, 0};
    eng_rng_t r;
    eng_rng_seed(&r, 1);
    int32_t tok;
    float l;
    assert_int_equal(eng_sampler_sample(s, lp, &p, &r, &tok, &l, NULL), 0);
    assert_int_equal(tok, 5);
    assert_true(l == lp[5]);
    p.temperature = 1;
    p.top_k = 1;
    assert_int_equal(eng_sampler_sample(s, lp, &p, &r, &tok, &l, NULL), 0);
    assert_int_equal(tok, 5);
    eng_sampler_destroy(&s);
    assert_null(s);
}

static void test_seeded_reproducible(void **state)
{
    float lp[V];
    s_logprobs(lp);
    eng_sampler_t *s = eng_sampler_new(V);
    eng_sampling_t p = {1.0f, 0, 1, 0, 0};
    int32_t a[64], b[64];
    float l;
    for (int run = 0; run < 2; run++) {
        eng_rng_t r;
        eng_rng_seed(&r, 42);
        for (int i = 0; i < 64; i++)
            assert_int_equal(eng_sampler_sample(s, lp, &p, &r, run ? &b[i] : &a[i], &l, NULL), 0);
    }
    assert_memory_equal(a, b, sizeof(a));
    eng_rng_t r;
    eng_rng_seed(&r, 43);
    int same = 0;
    for (int i = 0; i < 64; i++) {
        assert_int_equal(eng_sampler_sample(s, lp, &p, &r, &b[i], &l, NULL), 0);
        same += a[i] == b[i];
    }
    assert_true(same < 64);
    eng_sampler_destroy(&s);
}

static void test_sample_seeds_distinct(void **state)
{
    uint64_t seen[1000];
    for (uint64_t base = 0; base < 3; base++)
        for (uint32_t i = 0; i < 1000; i++) {
            seen[i] = eng_seed_for_sample(base, i);
            for (uint32_t j = 0; j < i; j++)
                assert_true(seen[j] != seen[i]);
        }
}

static void test_frequencies(void **state)
{
    float lp[V];
    s_logprobs(lp);
    eng_sampler_t *s = eng_sampler_new(V);
    eng_sampling_t p = {1.0f, 0, 1, 0, 0};
    eng_rng_t r;
    eng_rng_seed(&r, 7);
    int count[V] = {0}, N = 200000;
    int32_t tok;
    float l;
    for (int i = 0; i < N; i++) {
        eng_sampler_sample(s, lp, &p, &r, &tok, &l, NULL);
        count[tok]++;
        assert_true(l == lp[tok]);
    }
    for (int i = 0; i < V; i++) /* 5 sigma of a binomial */
        assert_true(fabs(count[i] / (double)N - exp(lp[i])) <
                    5 * sqrt(exp(lp[i]) * (1 - exp(lp[i])) / N) + 1e-4);
    eng_sampler_destroy(&s);
}

/* Runs many draws and returns the set of tokens seen as a bitmask. */
static unsigned s_support(eng_sampler_t *s, const float *lp, eng_sampling_t p)
{
    eng_rng_t r;
    eng_rng_seed(&r, 9);
    unsigned mask = 0;
    int32_t tok;
    float l;
    for (int i = 0; i < 5000; i++) {
        assert_int_equal(eng_sampler_sample(s, lp, &p, &r, &tok, &l, NULL), 0);
        mask |= 1u << tok;
    }
    return mask;
}

static void test_truncation(void **state)
{
    float lp[V];
    s_logprobs(lp); /* probabilities: 5: .56, 0: .21, 1: .08, 2: .05, 3: .03, 4: .01 */
    eng_sampler_t *s = eng_sampler_new(V);
    assert_int_equal(s_support(s, lp, (eng_sampling_t){1, 2, 1, 0, 0}), (1u << 5) | 1u);
    assert_int_equal(s_support(s, lp, (eng_sampling_t){1, 0, 0.7f, 0, 0}), (1u << 5) | 1u);
    assert_int_equal(s_support(s, lp, (eng_sampling_t){1, 0, 0.5f, 0, 0}), 1u << 5);
    assert_int_equal(s_support(s, lp, (eng_sampling_t){1, 0, 1, 0.3f, 0}), (1u << 5) | 1u);
    assert_int_equal(s_support(s, lp, (eng_sampling_t){1, 0, 1, 0.1f, 0}), 0x23u); /* 0, 1, 5 */
    assert_int_equal(s_support(s, lp, (eng_sampling_t){1, 0, 1, 0, 0}), 0x3fu);
    eng_sampler_destroy(&s);
}

static void test_top_logprobs_and_checks(void **state)
{
    float lp[V];
    s_logprobs(lp);
    eng_sampler_t *s = eng_sampler_new(V);
    eng_sampling_t p = {0, 0, 1, 0, 3};
    eng_rng_t r;
    eng_rng_seed(&r, 1);
    eng_top_t top[3];
    int32_t tok;
    float l;
    assert_int_equal(eng_sampler_sample(s, lp, &p, &r, &tok, &l, top), 0);
    assert_int_equal(top[0].id, 5);
    assert_int_equal(top[1].id, 0);
    assert_int_equal(top[2].id, 1);
    assert_true(top[1].logprob == lp[0]);
    eng_sampling_t bad[] = {{-1, 0, 1, 0, 0},   {1, -1, 1, 0, 0}, {1, 0, 0, 0, 0},
                            {1, 0, 1.5f, 0, 0}, {1, 0, 1, 2, 0},  {1, 0, 1, 0, 99},
                            {NAN, 0, 1, 0, 0}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_not_equal(eng_sampling_check(&bad[i]), 0);
        assert_int_not_equal(eng_sampler_sample(s, lp, &bad[i], &r, &tok, &l, NULL), 0);
    }
    eng_sampler_destroy(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy),
        cmocka_unit_test(test_seeded_reproducible),
        cmocka_unit_test(test_sample_seeds_distinct),
        cmocka_unit_test(test_frequencies),
        cmocka_unit_test(test_truncation),
        cmocka_unit_test(test_top_logprobs_and_checks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

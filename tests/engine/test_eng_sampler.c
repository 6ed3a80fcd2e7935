/*  test_eng_sampler.c - the sampler: greedy, draws keyed by (seed, step), distinct sample
    seeds, top-k / top-p / min-p supports (and the radix-select thresholds against a sort on a
    large vocabulary), empirical frequencies against the softmax, temperature, top logprobs. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
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
    int32_t tok;
    float l;
    assert_int_equal(eng_sampler_sample(s, lp, &p, 1, 0, &tok, &l, NULL), 0);
    assert_int_equal(tok, 5);
    assert_true(fabsf(l - lp[5]) < 1e-6f);
    p.temperature = 1;
    p.top_k = 1;
    for (uint64_t step = 0; step < 50; step++) {
        assert_int_equal(eng_sampler_sample(s, lp, &p, 1, step, &tok, &l, NULL), 0);
        assert_int_equal(tok, 5);
    }
    /* logits with any shift are the same distribution: same draw, same logprob */
    float shifted[V];
    for (int i = 0; i < V; i++)
        shifted[i] = lp[i] + 7.5f;
    p.top_k = 0;
    for (uint64_t step = 0; step < 50; step++) {
        int32_t a, b;
        float la, lb;
        eng_sampler_sample(s, lp, &p, 3, step, &a, &la, NULL);
        eng_sampler_sample(s, shifted, &p, 3, step, &b, &lb, NULL);
        assert_int_equal(a, b);
        assert_true(fabsf(la - lb) < 1e-5f);
    }
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
    /* a draw depends on (seed, step) only: any order, any interleaving gives the same tokens */
    for (int i = 0; i < 64; i++)
        assert_int_equal(eng_sampler_sample(s, lp, &p, 42, (uint64_t)i, &a[i], &l, NULL), 0);
    for (int i = 63; i >= 0; i--) {
        int32_t other;
        eng_sampler_sample(s, lp, &p, 43, (uint64_t)i, &other, &l, NULL);
        assert_int_equal(eng_sampler_sample(s, lp, &p, 42, (uint64_t)i, &b[i], &l, NULL), 0);
    }
    assert_memory_equal(a, b, sizeof(a));
    int same = 0;
    for (int i = 0; i < 64; i++) {
        assert_int_equal(eng_sampler_sample(s, lp, &p, 43, (uint64_t)i, &b[i], &l, NULL), 0);
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

/* Frequencies of N draws (steps 0 .. N-1 of one seed) against probabilities prob (5 sigma of
   a binomial). */
static void s_check_freq(eng_sampler_t *s, const float *lp, eng_sampling_t p, const double *prob)
{
    int count[V] = {0}, N = 200000;
    int32_t tok;
    float l;
    for (int i = 0; i < N; i++) {
        assert_int_equal(eng_sampler_sample(s, lp, &p, 7, (uint64_t)i, &tok, &l, NULL), 0);
        count[tok]++;
        assert_true(fabsf(l - lp[tok]) < 1e-6f); /* the model's own logprob, whatever T */
    }
    for (int i = 0; i < V; i++)
        assert_true(fabs(count[i] / (double)N - prob[i]) <
                    5 * sqrt(prob[i] * (1 - prob[i]) / N) + 1e-4);
}

static void test_frequencies(void **state)
{
    float lp[V];
    s_logprobs(lp);
    eng_sampler_t *s = eng_sampler_new(V);
    double prob[V], sharp[V], tot = 0;
    for (int i = 0; i < V; i++) {
        prob[i] = exp(lp[i]);
        sharp[i] = exp(2.0 * lp[i]); /* temperature 0.5 */
        tot += sharp[i];
    }
    for (int i = 0; i < V; i++)
        sharp[i] /= tot;
    s_check_freq(s, lp, (eng_sampling_t){1.0f, 0, 1, 0, 0}, prob);
    s_check_freq(s, lp, (eng_sampling_t){0.5f, 0, 1, 0, 0}, sharp);
    eng_sampler_destroy(&s);
}

/* Runs many draws and returns the set of tokens seen as a bitmask. */
static unsigned s_support(eng_sampler_t *s, const float *lp, eng_sampling_t p)
{
    unsigned mask = 0;
    int32_t tok;
    float l;
    for (int i = 0; i < 5000; i++) {
        assert_int_equal(eng_sampler_sample(s, lp, &p, 9, (uint64_t)i, &tok, &l, NULL), 0);
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

static int s_cmp_float_desc(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x > y ? -1 : x < y ? 1 : 0;
}

/* On a vocabulary of 4096 random logits (a few tied), the top-k and top-p survivor sets that
   the radix selects give are the ones a sort gives: every token drawn is inside the set, and
   at a high temperature every token of a small set is drawn. */
static void test_thresholds_match_a_sort(void **state)
{
    enum { N = 4096 };
    static float l[N], sorted[N];
    uint64_t x = 12345;
    for (int i = 0; i < N; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        l[i] = (float)((x >> 40) % 20000) / 1000.0f - 10.0f; /* steps of 0.001: ties */
    }
    memcpy(sorted, l, sizeof l);
    qsort(sorted, N, sizeof(float), s_cmp_float_desc);
    eng_sampler_t *s = eng_sampler_new(N);
    int32_t tok;
    float lp;
    const int ks[] = {1, 2, 37, 500};
    for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
        int k = ks[ki];
        float kth = sorted[k - 1]; /* every logit >= the k-th largest survives (ties too) */
        static unsigned char seen[N];
        memset(seen, 0, sizeof seen);
        eng_sampling_t p = {100.0f, k, 1, 0, 0};
        for (int i = 0; i < 40 * k + 200; i++) {
            assert_int_equal(eng_sampler_sample(s, l, &p, 5, (uint64_t)i, &tok, &lp, NULL), 0);
            assert_true(l[tok] >= kth);
            seen[tok] = 1;
        }
        if (k <= 37)
            for (int i = 0; i < N; i++)
                assert_true(!(l[i] >= kth) || seen[i]);
    }
    /* top-p at temperature 1: the survivors are the shortest prefix of the sorted logits
       whose mass reaches top_p of the total (all ties of the last one included) */
    double tot = 0, cum = 0;
    for (int i = 0; i < N; i++)
        tot += exp((double)(sorted[i] - sorted[0]));
    float cut = sorted[0];
    for (int i = 0; i < N; i++) {
        cum += exp((double)(sorted[i] - sorted[0]));
        cut = sorted[i];
        if (cum >= 0.3 * tot)
            break;
    }
    eng_sampling_t p = {1.0f, 0, 0.3f, 0, 0};
    float lowest = INFINITY;
    for (int i = 0; i < 20000; i++) {
        assert_int_equal(eng_sampler_sample(s, l, &p, 6, (uint64_t)i, &tok, &lp, NULL), 0);
        if (l[tok] < lowest)
            lowest = l[tok];
    }
    /* the fixed-point masses may move the cut by a rounding step, never more */
    assert_true(lowest >= cut - 0.0015f);
    assert_true(lowest <= cut + 0.0015f);
    eng_sampler_destroy(&s);
}

static void test_top_logprobs_and_checks(void **state)
{
    float lp[V];
    s_logprobs(lp);
    eng_sampler_t *s = eng_sampler_new(V);
    eng_sampling_t p = {0, 0, 1, 0, 3};
    eng_top_t top[3], top2[3];
    int32_t tok;
    float l;
    assert_int_equal(eng_sampler_sample(s, lp, &p, 1, 0, &tok, &l, top), 0);
    assert_int_equal(top[0].id, 5);
    assert_int_equal(top[1].id, 0);
    assert_int_equal(top[2].id, 1);
    assert_true(fabsf(top[1].logprob - lp[0]) < 1e-6f);
    eng_sampler_top(s, lp, 3, top2);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(top2[i].id, top[i].id);
        assert_true(top2[i].logprob == lp[top2[i].id]);
    }
    eng_sampling_t bad[] = {{-1, 0, 1, 0, 0},   {1, -1, 1, 0, 0}, {1, 0, 0, 0, 0},
                            {1, 0, 1.5f, 0, 0}, {1, 0, 1, 2, 0},  {1, 0, 1, 0, 99},
                            {NAN, 0, 1, 0, 0}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_not_equal(eng_sampling_check(&bad[i]), 0);
        assert_int_not_equal(eng_sampler_sample(s, lp, &bad[i], 1, 0, &tok, &l, NULL), 0);
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
        cmocka_unit_test(test_thresholds_match_a_sort),
        cmocka_unit_test(test_top_logprobs_and_checks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*  test_broker_units.c - cmocka tests of the broker's pure modules: weighted fair share
    (broker_sched.c), lease ids, the latency histogram, worker/job matching.

    The scheduler tests drive broker_sched_pick/charge the way a dispatch round does (pick,
    charge, take one ready unit) on a broker_t that holds only a job table, and check the
    shares that come out: weights 2^priority, a small job interleaved with a big one, no
    burst after idleness, blocked and finished jobs skipped.
*/
#include "broker_internal.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static broker_t *s_broker(void)
{
    broker_t *b = calloc(1, sizeof *b);
    b->jobs = zhashx_new();
    return b;
}

static void s_broker_free(broker_t *b)
{
    for (broker_job_t *j = zhashx_first(b->jobs); j; j = zhashx_next(b->jobs))
        broker_job_destroy(&j);
    zhashx_destroy(&b->jobs);
    free(b);
}

/* ids sort like their creation order; the scheduler breaks ties by id */
static broker_job_t *s_job(broker_t *b, const char *id, int priority, int64_t ready)
{
    broker_job_t *j = broker_job_new(id, NULL, priority);
    assert_non_null(j);
    j->live = true;
    j->ready_fresh = ready;
    zhashx_insert(b->jobs, j->id, j);
    return j;
}

/* one dispatch step for gen units; returns the job served or NULL */
static broker_job_t *s_step(broker_t *b)
{
    broker_job_t *j = broker_sched_pick(b, 0);
    if (!j)
        return NULL;
    broker_sched_charge(b, j, 0);
    if (j->ready_retry > 0)
        j->ready_retry--;
    else
        j->ready_fresh--;
    return j;
}

static void test_weights_follow_priority(void **state)
{
    (void)state;
    broker_t *b = s_broker();
    broker_job_t *lo = s_job(b, "01A0000000000000000000000A", 0, 100000);
    broker_job_t *hi = s_job(b, "01A0000000000000000000000B", 1, 100000);
    broker_job_t *top = s_job(b, "01A0000000000000000000000C", 3, 100000);
    int n_lo = 0, n_hi = 0, n_top = 0;
    for (int i = 0; i < 11000; i++) {
        broker_job_t *j = s_step(b);
        n_lo += j == lo;
        n_hi += j == hi;
        n_top += j == top;
    }
    /* weights 1 : 2 : 8 of 11 */
    assert_in_range(n_lo, 999, 1001);
    assert_in_range(n_hi, 1999, 2001);
    assert_in_range(n_top, 7999, 8001);
    s_broker_free(b);
}

static void test_small_job_interleaves(void **state)
{
    (void)state;
    broker_t *b = s_broker();
    broker_job_t *big = s_job(b, "01A0000000000000000000000A", 0, 1000000);
    for (int i = 0; i < 500; i++)
        assert_ptr_equal(s_step(b), big);
    broker_job_t *small = s_job(b, "01A0000000000000000000000B", 0, 10);
    /* the newcomer enters at the current virtual time: it alternates with the big job and
       is done within 20 steps, neither starved nor given a burst for the time it was away */
    int seen = 0, run = 0, longest = 0;
    for (int i = 0; i < 20; i++) {
        broker_job_t *j = s_step(b);
        seen += j == small;
        run = j == small ? run + 1 : 0;
        longest = run > longest ? run : longest;
    }
    assert_int_equal(seen, 10);
    assert_true(longest <= 1);
    assert_int_equal(small->ready_fresh, 0);
    /* nothing ready: never picked again */
    for (int i = 0; i < 50; i++)
        assert_ptr_equal(s_step(b), big);
    s_broker_free(b);
}

static void test_idle_earns_no_burst(void **state)
{
    (void)state;
    broker_t *b = s_broker();
    broker_job_t *a = s_job(b, "01A0000000000000000000000A", 0, 100000);
    broker_job_t *c = s_job(b, "01A0000000000000000000000B", 0, 0); /* nothing ready yet */
    for (int i = 0; i < 1000; i++)
        assert_ptr_equal(s_step(b), a);
    c->ready_fresh = 1000;
    int n_c = 0;
    for (int i = 0; i < 100; i++)
        n_c += s_step(b) == c;
    assert_in_range(n_c, 49, 51);
    s_broker_free(b);
}

static void test_skips_blocked_finished_and_other_kind(void **state)
{
    (void)state;
    broker_t *b = s_broker();
    broker_job_t *a = s_job(b, "01A0000000000000000000000A", 5, 10);
    broker_job_t *c = s_job(b, "01A0000000000000000000000B", 0, 10);
    a->blocked = true;
    assert_ptr_equal(broker_sched_pick(b, 0), c);
    a->blocked = false;
    a->live = false;
    assert_ptr_equal(broker_sched_pick(b, 0), c);
    assert_int_equal(broker_job_ready(a, 0), 0);
    /* exec units are a separate share */
    assert_null(broker_sched_pick(b, 1));
    c->ready_exec = 3;
    assert_int_equal(broker_job_ready(c, 1), 3);
    assert_ptr_equal(broker_sched_pick(b, 1), c);
    /* retries count as ready gen units */
    c->ready_fresh = 0;
    c->ready_retry = 2;
    assert_int_equal(broker_job_ready(c, 0), 2);
    s_broker_free(b);
}

static void test_priority_clamped(void **state)
{
    (void)state;
    broker_job_t *j = broker_job_new("01A0000000000000000000000A", NULL, 99);
    assert_int_equal(j->priority, 10);
    assert_true(j->weight == 1024.0);
    broker_job_set_priority(j, -50);
    assert_int_equal(j->priority, -10);
    assert_true(j->weight == 1.0 / 1024.0);
    broker_job_destroy(&j);
    assert_null(j);
    broker_job_destroy(&j); /* idempotent */
}

static void test_lease_parse(void **state)
{
    (void)state;
    char kind, job[ANV_ID_SIZE];
    uint64_t t;
    uint32_t s, a;
    assert_true(broker_lease_parse("g.01ARZ3NDEKTSV4RRFFQ69G5FAV.12.2.100005", &kind, job, &t, &s,
                                   &a));
    assert_int_equal(kind, 'g');
    assert_string_equal(job, "01ARZ3NDEKTSV4RRFFQ69G5FAV");
    assert_int_equal(t, 12);
    assert_int_equal(s, 0);
    assert_int_equal(a, 2);
    assert_true(broker_lease_parse("e.01ARZ3NDEKTSV4RRFFQ69G5FAV.7.3.1.9", &kind, job, &t, &s,
                                   &a));
    assert_int_equal(kind, 'e');
    assert_int_equal(t, 7);
    assert_int_equal(s, 3);
    assert_int_equal(a, 1);
    const char *bad[] = {
        "", "g", "x.01ARZ3NDEKTSV4RRFFQ69G5FAV.1.1.1", "g.01ARZ3NDEKTSV4RRFFQ69G5FA.1.1.1",
        "g.01ARZ3NDEKTSV4RRFFQ69G5FAV.1.1", "g.01ARZ3NDEKTSV4RRFFQ69G5FAV.1.1.1.1",
        "g.01ARZ3NDEKTSV4RRFFQ69G5FAV.a.1.1", "g.01ARZ3NDEKTSV4RRFFQ69G5FAV.1.1.1x",
        "e.01ARZ3NDEKTSV4RRFFQ69G5FAV.1.1.1", "g.01ARZ3NDEKTSV4RRFFQ69G5FAV..1.1",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_false(broker_lease_parse(bad[i], &kind, job, &t, &s, &a));
    assert_false(broker_lease_parse(NULL, &kind, job, &t, &s, &a));
}

static void test_hist_quantiles(void **state)
{
    (void)state;
    broker_hist_t h = {0};
    assert_true(broker_hist_quantile(&h, 0.5) == 0);
    for (int i = 0; i < 99; i++)
        broker_hist_add(&h, 100); /* bucket [64, 128) */
    broker_hist_add(&h, 5000);    /* bucket [4096, 8192) */
    assert_int_equal(h.count, 100);
    assert_true(broker_hist_quantile(&h, 0.5) == 128);
    assert_true(broker_hist_quantile(&h, 0.98) == 128);
    assert_true(broker_hist_quantile(&h, 0.999) == 8192);
    broker_hist_add(&h, -5); /* clock skew lands in the first bucket, not out of range */
    broker_hist_add(&h, INT64_MAX);
    assert_int_equal(h.count, 102);
}

static void test_worker_fits(void **state)
{
    (void)state;
    Anvil__JobSpec spec = ANVIL__JOB_SPEC__INIT;
    broker_job_t j = {0};
    j.spec = &spec;
    broker_worker_t w = {0};
    w.kind = ANVIL__WORKER_KIND__WORKER_GEN;
    snprintf(w.model, sizeof w.model, "/models/AutoTriton-8B/");
    assert_true(broker_worker_fits(&w, &j)); /* the job names no model */
    assert_true(broker_worker_fits(&w, NULL));
    spec.model = "AutoTriton-8B";
    assert_true(broker_worker_fits(&w, &j));
    spec.model = "/other/place/AutoTriton-8B";
    assert_true(broker_worker_fits(&w, &j));
    spec.model = "AutoTriton";
    assert_false(broker_worker_fits(&w, &j));
    spec.model = "/";
    assert_false(broker_worker_fits(&w, &j));
    snprintf(w.model, sizeof w.model, "%s", "");
    spec.model = "x";
    assert_false(broker_worker_fits(&w, &j));
    /* exec: every task kind of the job must be listed, unless the worker lists none */
    w.kind = ANVIL__WORKER_KIND__WORKER_EXEC;
    j.xkinds = 1u << ANVIL__TASK_KIND__TASK_KIND_KERNELBENCH;
    w.kinds = 0;
    assert_true(broker_worker_fits(&w, &j));
    w.kinds = 1u << ANVIL__TASK_KIND__TASK_KIND_TRITONBENCH_G;
    assert_false(broker_worker_fits(&w, &j));
    w.kinds |= 1u << ANVIL__TASK_KIND__TASK_KIND_KERNELBENCH;
    assert_true(broker_worker_fits(&w, &j));
    j.xkinds |= 1u << ANVIL__TASK_KIND__TASK_KIND_TRITONBENCH_T;
    assert_false(broker_worker_fits(&w, &j));
    j.xkinds = 1u << ANVIL__TASK_KIND__TASK_KIND_NONE; /* plain tasks need nothing */
    assert_true(broker_worker_fits(&w, &j));
    assert_string_equal(broker_kind_capability(ANVIL__TASK_KIND__TASK_KIND_KERNELBENCH),
                        "kernelbench");
    assert_string_equal(broker_kind_capability(ANVIL__TASK_KIND__TASK_KIND_TRITONBENCH_G),
                        "tritonbench-g");
    assert_null(broker_kind_capability(0));
    assert_null(broker_kind_capability(99));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_weights_follow_priority),
        cmocka_unit_test(test_small_job_interleaves),
        cmocka_unit_test(test_idle_earns_no_burst),
        cmocka_unit_test(test_skips_blocked_finished_and_other_kind),
        cmocka_unit_test(test_priority_clamped),
        cmocka_unit_test(test_lease_parse),
        cmocka_unit_test(test_hist_quantiles),
        cmocka_unit_test(test_worker_fits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*  test_broker_units.c - cmocka tests of the broker's pure modules: weighted fair share
    (broker_sched.c), lease ids, the latency histogram, worker/job matching, a gen worker's
    credit (broker_worker_credit: the engine's queue, units in transit, the free-KV estimate).

    The scheduler tests drive broker_sched_pick/charge the way a dispatch round does (pick,
    charge, take one ready unit) on a broker_t that holds only a job table, and check the
    shares that come out: weights 2^priority, a small job interleaved with a big one, no
    burst after idleness, blocked and finished jobs skipped.
*/
#include "broker_internal.h"
#include "broker_wire.h"

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
    static broker_t b; /* only the weight version is read */
    memset(&b, 0, sizeof b);
    w.kind = ANVIL__WORKER_KIND__WORKER_GEN;
    snprintf(w.model, sizeof w.model, "/models/AutoTriton-8B/");
    assert_true(broker_worker_fits(&b, &w, &j)); /* the job names no model */
    assert_true(broker_worker_fits(&b, &w, NULL));
    spec.model = "AutoTriton-8B";
    assert_true(broker_worker_fits(&b, &w, &j));
    spec.model = "/other/place/AutoTriton-8B";
    assert_true(broker_worker_fits(&b, &w, &j));
    spec.model = "AutoTriton";
    assert_false(broker_worker_fits(&b, &w, &j));
    spec.model = "/";
    assert_false(broker_worker_fits(&b, &w, &j));
    snprintf(w.model, sizeof w.model, "%s", "");
    spec.model = "x";
    assert_false(broker_worker_fits(&b, &w, &j));
    /* staleness: a gen worker behind the job's bound gets none of its units */
    spec.model = NULL;
    spec.has_max_weight_lag = 1;
    spec.max_weight_lag = 1;
    w.weight_version = 3;
    assert_true(broker_worker_fits(&b, &w, &j)); /* no current version known yet */
    broker_weights_seen(&b, 5);
    broker_weights_seen(&b, 4); /* never goes back */
    assert_true(b.has_weight_version && b.weight_version == 5);
    assert_false(broker_worker_fits(&b, &w, &j));
    assert_true(broker_job_stale(&b, &j, 3) && !broker_job_stale(&b, &j, 4));
    w.weight_version = 4;
    assert_true(broker_worker_fits(&b, &w, &j));
    spec.max_weight_lag = 0;
    assert_false(broker_worker_fits(&b, &w, &j));
    spec.has_max_weight_lag = 0; /* no bound: any version */
    assert_true(broker_worker_fits(&b, &w, &j) && !broker_job_stale(&b, &j, 0));
    /* exec: every task kind of the job must be listed, unless the worker lists none */
    w.kind = ANVIL__WORKER_KIND__WORKER_EXEC;
    j.xkinds = 1u << ANVIL__TASK_KIND__TASK_KIND_KERNELBENCH;
    w.kinds = 0;
    assert_true(broker_worker_fits(&b, &w, &j));
    w.kinds = 1u << ANVIL__TASK_KIND__TASK_KIND_TRITONBENCH_G;
    assert_false(broker_worker_fits(&b, &w, &j));
    w.kinds |= 1u << ANVIL__TASK_KIND__TASK_KIND_KERNELBENCH;
    assert_true(broker_worker_fits(&b, &w, &j));
    j.xkinds |= 1u << ANVIL__TASK_KIND__TASK_KIND_TRITONBENCH_T;
    assert_false(broker_worker_fits(&b, &w, &j));
    j.xkinds = 1u << ANVIL__TASK_KIND__TASK_KIND_NONE; /* plain tasks need nothing */
    assert_true(broker_worker_fits(&b, &w, &j));
    assert_string_equal(broker_kind_capability(ANVIL__TASK_KIND__TASK_KIND_KERNELBENCH),
                        "kernelbench");
    assert_string_equal(broker_kind_capability(ANVIL__TASK_KIND__TASK_KIND_TRITONBENCH_G),
                        "tritonbench-g");
    assert_null(broker_kind_capability(0));
    assert_null(broker_kind_capability(99));
}

/* a task and sampling like a client's, packed as the broker stores them */
static uint8_t *s_pack_task(size_t *len, bool with_sampling)
{
    Anvil__Task t = ANVIL__TASK__INIT;
    Anvil__TaskRef ref = ANVIL__TASK_REF__INIT;
    Anvil__SamplingParams sp = ANVIL__SAMPLING_PARAMS__INIT;
    t.custom_id = "cid-7";
    t.prompt = "write a kernel\nthat adds";
    t.has_n = 1;
    t.n = 6;
    ref.has_kind = 1;
    ref.kind = ANVIL__TASK_KIND__TASK_KIND_KERNELBENCH;
    ref.name = "level1/19_ReLU.py";
    t.ref = &ref;
    if (with_sampling) {
        sp.has_temperature = 1;
        sp.temperature = 0.25f;
        t.sampling = &sp;
    }
    *len = anvil__task__get_packed_size(&t);
    uint8_t *b = malloc(*len);
    anvil__task__pack(&t, b);
    return b;
}

/* broker_worker_credit for gen workers: one unit before any heartbeat says how full the KV
   is; with the engine's queue reported, units while queued + in-transit samples are below
   the backlog (rounded up to whole units of the last size sent); a listed lease leaves the
   transit count; without the queue, the free-KV estimate */
static void test_gen_credit(void **state)
{
    (void)state;
    broker_worker_t w = {0};
    w.kind = ANVIL__WORKER_KIND__WORKER_GEN;
    w.slots = 64;
    w.kv_tokens = 100000;
    w.last_seen_ms = 1;
    w.backlog = 16;
    assert_int_equal(broker_worker_credit(&w), 1); /* no heartbeat yet: one unit */
    broker_lease_t l1 = {.kind = 'g', .remaining = 8, .tokens_per_sample = 1000};
    broker_lease_attach(&l1, &w);
    assert_int_equal(broker_worker_credit(&w), 0); /* ... and no more */
    w.hb_has_queued = true;
    w.hb_queued = 0;
    assert_int_equal(w.transit_samples, 8);
    assert_int_equal(w.unit_samples, 8);
    assert_int_equal(broker_worker_credit(&w), 1); /* (16 - 8) / 8 */
    broker_lease_listed(&l1);                      /* its heartbeat listed it */
    assert_int_equal(w.transit_samples, 0);
    assert_int_equal(broker_worker_credit(&w), 2); /* queue empty: 16 / 8 */
    w.hb_queued = 5;
    assert_int_equal(broker_worker_credit(&w), 2); /* ceil(11 / 8) */
    w.hb_queued = 16;
    assert_int_equal(broker_worker_credit(&w), 0); /* the engine has its backlog */
    w.hb_queued = 0;
    w.slots = 2;
    assert_int_equal(broker_worker_credit(&w), 1); /* slots still bound it */
    w.slots = 64;
    broker_lease_t l2 = {.kind = 'g', .remaining = 3, .tokens_per_sample = 1000};
    broker_lease_attach(&l2, &w);
    assert_int_equal(w.transit_samples, 3);
    broker_lease_detach(&l2); /* ended before any heartbeat listed it */
    assert_int_equal(w.transit_samples, 0);
    w.draining = true;
    assert_int_equal(broker_worker_credit(&w), 0);
    w.draining = false;
    /* a worker that reports free KV but not its queue: the upper-bound estimate */
    w.hb_has_queued = false;
    w.hb_has_free_kv = true;
    w.hb_free_kv = 8000 + 2 * 8000; /* what l1 may still take, plus two more such units */
    assert_int_equal(broker_worker_credit(&w), 2);
    w.hb_free_kv = 7000;
    assert_int_equal(broker_worker_credit(&w), 0);
    broker_lease_detach(&l1);
    assert_int_equal(w.in_flight, 0);
    assert_int_equal(w.outstanding_tokens, 0);
}

static void test_wire_gen_unit_matches_protobuf_c(void **state)
{
    (void)state;
    size_t tl, sl;
    uint8_t *tb = s_pack_task(&tl, false);
    Anvil__SamplingParams sp = ANVIL__SAMPLING_PARAMS__INIT;
    char *stop[] = {"</s>", "```"};
    sp.has_temperature = sp.has_max_tokens = sp.has_top_p = 1;
    sp.temperature = 0.7f;
    sp.max_tokens = 4096;
    sp.top_p = 0.95f;
    sp.n_stop = 2;
    sp.stop = stop;
    sl = anvil__sampling_params__get_packed_size(&sp);
    uint8_t *sb = malloc(sl);
    anvil__sampling_params__pack(&sp, sb);
    uint32_t idx[] = {0, 2, 5, 300};
    broker_wire_gen_t u = {
        .lease_id = "g.01ARZ3NDEKTSV4RRFFQ69G5FAV.123456.2.700001",
        .job_id = "01ARZ3NDEKTSV4RRFFQ69G5FAV",
        .task = tb, .task_len = tl, .task_index = 123456,
        .sampling = sb, .sampling_len = sl,
        .samples = idx, .n_samples = 4,
        .base_seed = 0xFFFFFFFFFFFFFFF1ull, .lease_ms = 30000, .attempt = 2, .chat = true,
        .has_max_weight_lag = true, .max_weight_lag = 3,
    };
    size_t len;
    uint8_t *fast = broker_wire_gen_unit(&u, &len);
    assert_non_null(fast);
    int err = 0;
    Anvil__Envelope *env = anv_msg_decode(fast, len, 0, &err);
    assert_non_null(env);
    assert_int_equal(env->version, ANVIL_PROTOCOL_VERSION);
    assert_int_equal(env->body_case, ANVIL__ENVELOPE__BODY_GEN_UNIT);
    Anvil__GenUnit *g = env->gen_unit;
    assert_string_equal(g->lease_id, u.lease_id);
    assert_string_equal(g->job_id, u.job_id);
    assert_true(g->task->has_index);
    assert_int_equal(g->task->index, 123456);
    assert_string_equal(g->task->prompt, "write a kernel\nthat adds");
    assert_string_equal(g->task->custom_id, "cid-7");
    assert_string_equal(g->task->ref->name, "level1/19_ReLU.py");
    assert_int_equal(g->task->n, 6);
    assert_int_equal(g->sampling->max_tokens, 4096);
    assert_true(g->sampling->temperature == 0.7f);
    assert_string_equal(g->sampling->stop[1], "```");
    assert_int_equal(g->n_sample_indices, 4);
    assert_int_equal(g->sample_indices[3], 300);
    assert_true(g->base_seed == 0xFFFFFFFFFFFFFFF1ull);
    assert_int_equal(g->attempt, 2);
    assert_int_equal(g->lease_ms, 30000);
    assert_true(g->has_chat && g->chat);
    assert_true(g->has_max_weight_lag && g->max_weight_lag == 3);
    /* the same unit built with protobuf-c (the slow path) packs to the same bytes */
    Anvil__Task *t = anvil__task__unpack(NULL, tl, tb);
    t->has_index = 1;
    t->index = 123456;
    Anvil__GenUnit ref = ANVIL__GEN_UNIT__INIT;
    ref.lease_id = (char *)u.lease_id;
    ref.job_id = (char *)u.job_id;
    ref.task = t;
    ref.sampling = &sp;
    ref.n_sample_indices = 4;
    ref.sample_indices = idx;
    ref.has_base_seed = ref.has_attempt = ref.has_lease_ms = ref.has_chat = 1;
    ref.has_max_weight_lag = 1;
    ref.base_seed = u.base_seed;
    ref.attempt = 2;
    ref.lease_ms = 30000;
    ref.chat = 1;
    ref.max_weight_lag = 3;
    Anvil__Envelope re;
    anv_msg_init(&re);
    re.version = ANVIL_PROTOCOL_VERSION;
    re.body_case = ANVIL__ENVELOPE__BODY_GEN_UNIT;
    re.gen_unit = &ref;
    size_t rl;
    uint8_t *slow = anv_msg_encode(&re, &rl);
    size_t rl2 = anvil__envelope__get_packed_size(env);
    uint8_t *again = malloc(rl2);
    anvil__envelope__pack(env, again);
    assert_int_equal(rl, rl2);
    assert_memory_equal(slow, again, rl);
    free(again);
    free(slow);
    anvil__task__free_unpacked(t, NULL);
    anv_msg_free(&env);
    free(fast);
    /* no sampling and no samples listed: still a valid unit */
    u.sampling = (const uint8_t *)"";
    u.sampling_len = 0;
    u.n_samples = 0;
    u.has_max_weight_lag = false;
    u.chat = false;
    fast = broker_wire_gen_unit(&u, &len);
    env = anv_msg_decode(fast, len, 0, &err);
    assert_non_null(env);
    assert_non_null(env->gen_unit->sampling);
    assert_false(env->gen_unit->sampling->has_temperature);
    assert_int_equal(env->gen_unit->n_sample_indices, 0);
    assert_false(env->gen_unit->chat);
    assert_false(env->gen_unit->has_max_weight_lag);
    anv_msg_free(&env);
    free(fast);
    free(tb);
    free(sb);
}

static void test_wire_has_field(void **state)
{
    (void)state;
    size_t l1, l2;
    uint8_t *plain = s_pack_task(&l1, false), *with = s_pack_task(&l2, true);
    assert_int_equal(broker_wire_has_field(plain, l1, 6), 0);
    assert_int_equal(broker_wire_has_field(with, l2, 6), 1);
    assert_int_equal(broker_wire_has_field(plain, l1, 3), 1); /* prompt */
    assert_int_equal(broker_wire_has_field(plain, 0, 6), 0);
    /* damaged: cut anywhere inside the last field, lengths past the end, bad wire types */
    assert_int_equal(broker_wire_has_field(with, l2 - 1, 6), -1);
    const uint8_t past[] = {0x1a, 0x05, 'a', 'b'};            /* field 3, len 5, 2 bytes */
    const uint8_t zero[] = {0x00, 0x01};                      /* field number 0 */
    const uint8_t group[] = {0x1b, 0x1c};                     /* start/end group */
    const uint8_t longv[] = {0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
    const uint8_t i64[] = {0x09, 1, 2, 3};                    /* fixed64 cut short */
    assert_int_equal(broker_wire_has_field(past, sizeof past, 6), -1);
    assert_int_equal(broker_wire_has_field(zero, sizeof zero, 6), -1);
    assert_int_equal(broker_wire_has_field(group, sizeof group, 6), -1);
    assert_int_equal(broker_wire_has_field(longv, sizeof longv, 6), -1);
    assert_int_equal(broker_wire_has_field(i64, sizeof i64, 6), -1);
    free(plain);
    free(with);
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
        cmocka_unit_test(test_gen_credit),
        cmocka_unit_test(test_wire_gen_unit_matches_protobuf_c),
        cmocka_unit_test(test_wire_has_field),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

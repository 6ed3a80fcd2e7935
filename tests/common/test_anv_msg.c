/*  test_anv_msg.c - envelope round trips, hostile input, and framing over real sockets.

    Round trips cover every body kind the system uses; hostile input covers truncation at every
    length, random bytes, wrong versions and oversize payloads, checking both the decoder and
    the receive path's counters over a real ROUTER/DEALER pair on inproc.
*/
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "anv_error.h"
#include "anv_log.h"
#include "anv_msg.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static uint8_t *s_pack_sample(size_t *len)
{
    Anvil__Envelope env;
    anv_msg_init(&env);
    Anvil__GenResult gr = ANVIL__GEN_RESULT__INIT;
    Anvil__Sample s = ANVIL__SAMPLE__INIT;
    uint32_t toks[] = {1, 2, 3, 155135};
    float lps[] = {-0.5f, -1.25f, -3.0f, -0.0f};
    s.job_id = "01ARZ3NDEKTSV4RRFFQ69G5FAV";
    s.has_task_index = 1;
    s.task_index = 7;
    s.has_sample_index = 1;
    s.sample_index = 3;
    s.n_token_ids = 4;
    s.token_ids = toks;
    s.n_logprobs = 4;
    s.logprobs = lps;
    s.text = "def kernel():\n    pass\n\xe2\x9c\x93";
    s.has_finish_reason = 1;
    s.finish_reason = ANVIL__FINISH_REASON__FINISH_EOS;
    s.has_weight_version = 1;
    s.weight_version = 42;
    gr.lease_id = "L1";
    gr.sample = &s;
    env.body_case = ANVIL__ENVELOPE__BODY_GEN_RESULT;
    env.gen_result = &gr;
    env.has_request_id = 1;
    env.request_id = 99;
    return anv_msg_encode(&env, len);
}

static void test_round_trip(void **state)
{
    (void)state;
    size_t len;
    uint8_t *buf = s_pack_sample(&len);
    int err;
    Anvil__Envelope *env = anv_msg_decode(buf, len, 0, &err);
    assert_non_null(env);
    assert_int_equal(err, 0);
    assert_int_equal(env->body_case, ANVIL__ENVELOPE__BODY_GEN_RESULT);
    assert_string_equal(anv_msg_body_name(env), "gen_result");
    assert_int_equal(env->request_id, 99);
    Anvil__Sample *s = env->gen_result->sample;
    assert_int_equal(s->n_token_ids, 4);
    assert_int_equal(s->token_ids[3], 155135);
    assert_true(s->logprobs[1] == -1.25f);
    assert_string_equal(s->text, "def kernel():\n    pass\n\xe2\x9c\x93");
    assert_int_equal(s->weight_version, 42);
    assert_int_equal(s->finish_reason, ANVIL__FINISH_REASON__FINISH_EOS);
    anv_msg_free(&env);
    assert_null(env);
    free(buf);
}

static void test_job_spec_round_trip(void **state)
{
    (void)state;
    Anvil__Envelope env;
    anv_msg_init(&env);
    Anvil__SubmitRequest sub = ANVIL__SUBMIT_REQUEST__INIT;
    Anvil__JobSpec spec = ANVIL__JOB_SPEC__INIT;
    Anvil__SamplingParams sp = ANVIL__SAMPLING_PARAMS__INIT;
    Anvil__ScoringSpec sc = ANVIL__SCORING_SPEC__INIT;
    Anvil__Task t = ANVIL__TASK__INIT, *tasks[] = {&t};
    Anvil__TaskRef ref = ANVIL__TASK_REF__INIT;
    char *stops[] = {"```\n", "</answer>"};
    sp.has_temperature = 1;
    sp.temperature = 0.7f;
    sp.has_top_k = 1;
    sp.top_k = 50;
    sp.n_stop = 2;
    sp.stop = stops;
    sp.has_seed = 1;
    sp.seed = 1234567890123ULL;
    sc.has_kind = 1;
    sc.kind = ANVIL__TASK_KIND__TASK_KIND_KERNELBENCH;
    sc.has_trials = 1;
    sc.trials = 5;
    spec.name = "demo";
    spec.has_n = 1;
    spec.n = 8;
    spec.has_priority = 1;
    spec.priority = -3;
    spec.sampling = &sp;
    spec.scoring = &sc;
    ref.has_kind = 1;
    ref.kind = ANVIL__TASK_KIND__TASK_KIND_KERNELBENCH;
    ref.reference_code = "class Model: pass";
    t.custom_id = "kb-1";
    t.prompt = "write a kernel";
    t.ref = &ref;
    sub.spec = &spec;
    sub.n_tasks = 1;
    sub.tasks = tasks;
    sub.has_final = 1;
    sub.final = 1;
    env.body_case = ANVIL__ENVELOPE__BODY_SUBMIT;
    env.submit = &sub;
    size_t len;
    uint8_t *buf = anv_msg_encode(&env, &len);
    int err;
    Anvil__Envelope *out = anv_msg_decode(buf, len, 0, &err);
    assert_non_null(out);
    Anvil__JobSpec *o = out->submit->spec;
    assert_string_equal(o->name, "demo");
    assert_int_equal(o->n, 8);
    assert_int_equal(o->priority, -3);
    assert_true(o->sampling->temperature == 0.7f);
    assert_false(o->sampling->has_top_p); /* presence is kept: unset stays unset */
    assert_int_equal(o->sampling->n_stop, 2);
    assert_string_equal(o->sampling->stop[1], "</answer>");
    assert_int_equal(o->sampling->seed, 1234567890123ULL);
    assert_int_equal(o->scoring->trials, 5);
    assert_string_equal(out->submit->tasks[0]->ref->reference_code, "class Model: pass");
    assert_true(out->submit->final);
    anv_msg_free(&out);
    free(buf);
}

static void test_truncated(void **state)
{
    (void)state;
    size_t len;
    uint8_t *buf = s_pack_sample(&len);
    int rejected = 0;
    for (size_t cut = 0; cut < len; cut++) {
        int err;
        Anvil__Envelope *env = anv_msg_decode(buf, cut, 0, &err);
        if (!env) {
            assert_true(err == ANV_EPROTO || err == ANV_EVERSION);
            rejected++;
        } else {
            /* a prefix can be a valid shorter message (protobuf has no length header); it must
               then be a well-formed envelope */
            assert_int_equal(env->version, ANVIL_PROTOCOL_VERSION);
            anv_msg_free(&env);
        }
    }
    assert_true(rejected > (int)len / 2);
    free(buf);
}

static void test_random_bytes(void **state)
{
    (void)state;
    srand(12345);
    uint8_t buf[512];
    int decoded = 0;
    for (int i = 0; i < 20000; i++) {
        size_t len = 1 + (size_t)rand() % sizeof buf;
        for (size_t k = 0; k < len; k++)
            buf[k] = (uint8_t)rand();
        int err;
        Anvil__Envelope *env = anv_msg_decode(buf, len, 0, &err);
        if (env) {
            assert_int_equal(env->version, ANVIL_PROTOCOL_VERSION);
            decoded++;
            anv_msg_free(&env);
        } else {
            assert_true(err == ANV_EPROTO || err == ANV_EVERSION);
        }
    }
    assert_true(decoded < 200);
}

static void test_version_and_size(void **state)
{
    (void)state;
    Anvil__Envelope env;
    anv_msg_init(&env);
    env.version = 2;
    Anvil__Disconnect d = ANVIL__DISCONNECT__INIT;
    env.body_case = ANVIL__ENVELOPE__BODY_DISCONNECT;
    env.disconnect = &d;
    size_t len;
    uint8_t *buf = anv_msg_encode(&env, &len);
    int err;
    assert_null(anv_msg_decode(buf, len, 0, &err));
    assert_int_equal(err, ANV_EVERSION);
    free(buf);
    env.version = ANVIL_PROTOCOL_VERSION;
    buf = anv_msg_encode(&env, &len);
    assert_null(anv_msg_decode(buf, len, len - 1, &err));
    assert_int_equal(err, ANV_ETOOBIG);
    assert_null(anv_msg_decode(NULL, 0, 0, &err));
    assert_int_equal(err, ANV_EPROTO);
    free(buf);
}

static void test_sockets(void **state)
{
    (void)state;
    zsock_t *router = zsock_new(ZMQ_ROUTER);
    zsock_set_router_mandatory(router, 1);
    assert_int_equal(zsock_bind(router, "inproc://anv_msg_test"), 0);
    zsock_t *dealer = zsock_new(ZMQ_DEALER);
    zsock_set_identity(dealer, "w1");
    assert_int_equal(zsock_connect(dealer, "inproc://anv_msg_test"), 0);
    anv_msg_stats_t st = {0};
    int err;

    /* a valid envelope arrives with its identity */
    Anvil__Envelope env;
    anv_msg_init(&env);
    Anvil__Heartbeat hb = ANVIL__HEARTBEAT__INIT;
    hb.worker_id = "w1";
    env.body_case = ANVIL__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    assert_int_equal(anv_msg_send(dealer, NULL, &env, NULL), 0);
    zframe_t *id = NULL;
    Anvil__Envelope *in = anv_msg_recv(router, true, true, 0, &id, &st, &err);
    assert_non_null(in);
    assert_non_null(id);
    assert_memory_equal(zframe_data(id), "w1", 2);
    assert_string_equal(in->heartbeat->worker_id, "w1");
    anv_msg_free(&in);

    /* garbage of every kind is counted, not returned */
    zstr_send(dealer, "\xff\xff\xff garbage");
    zmsg_t *two = zmsg_new();
    zmsg_addstr(two, "a");
    zmsg_addstr(two, "b");
    zmsg_send(&two, dealer);
    zframe_t *empty = zframe_new_empty();
    zframe_send(&empty, dealer, 0);
    env.version = 7;
    size_t len;
    uint8_t *buf = anv_msg_encode(&env, &len);
    zframe_t *f = zframe_new(buf, len);
    zframe_send(&f, dealer, 0);
    free(buf);
    for (int i = 0; i < 4; i++) {
        zsock_set_rcvtimeo(router, 1000);
        in = anv_msg_recv(router, true, true, 0, NULL, &st, &err);
        assert_null(in);
        assert_true(err != 0);
    }
    assert_int_equal(st.rejected_malformed, 1);
    assert_int_equal(st.rejected_frames, 1);
    assert_int_equal(st.rejected_empty, 1);
    assert_int_equal(st.rejected_version, 1);
    assert_int_equal(st.received, 1);

    /* nothing waiting: NULL with err 0 */
    in = anv_msg_recv(router, true, false, 0, NULL, &st, &err);
    assert_null(in);
    assert_int_equal(err, 0);

    /* replies reach the dealer; an unknown peer is refused, not dropped */
    env.version = ANVIL_PROTOCOL_VERSION;
    assert_int_equal(anv_msg_send(router, id, &env, &st), 0);
    zsock_set_rcvtimeo(dealer, 1000);
    in = anv_msg_recv(dealer, false, true, 0, NULL, NULL, &err);
    assert_non_null(in);
    anv_msg_free(&in);
    zframe_t *ghost = zframe_new("nobody", 6);
    assert_int_equal(anv_msg_send(router, ghost, &env, &st), -EHOSTUNREACH);
    assert_int_equal(st.send_unroutable, 1);
    zframe_destroy(&ghost);
    zframe_destroy(&id);
    zsock_destroy(&dealer);
    zsock_destroy(&router);
}

int main(void)
{
    anv_log_init("test_anv_msg");
    anv_log_set_level(ANV_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),        cmocka_unit_test(test_job_spec_round_trip),
        cmocka_unit_test(test_truncated),         cmocka_unit_test(test_random_bytes),
        cmocka_unit_test(test_version_and_size),  cmocka_unit_test(test_sockets),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

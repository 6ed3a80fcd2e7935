/*  test_cli_client.c - the CLI's side of the client protocol, against a scripted peer.

    A thread runs a ZeroMQ ROUTER on a loopback port that answers like a broker would, or
    misbehaves on purpose (silence, a stale reply first, an ErrorReply, the wrong reply kind,
    a results stream that stops half way). The real client code and the real subcommands
    (cli_cmd_submit, cli_cmd_results, run in-process) talk to it; the peer records what it
    received, so the tests check what went over the wire: chunking of a submit, the spec only
    on the first chunk and `final` only on the last, nothing at all for a malformed file,
    results split into the results and errors files, and no output file after a broken
    download. This tests the client protocol only; the end-to-end tests against the real
    broker are tests/cli/e2e.sh.
*/
#include "anv_error.h"
#include "anv_msg.h"
#include "cli_client.h"
#include "cli_cmd.h"
#include "cli_util.h"

#include <czmq.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

typedef enum { P_NORMAL, P_SILENT, P_STALE, P_ERROR, P_WRONG, P_RESULTS_BREAK } s_mode_t;

typedef struct {
    zsock_t *router;
    char endpoint[64];
    pthread_t thread;
    volatile int stop;
    volatile s_mode_t mode;
    /* what arrived */
    int messages, chunks, spec_chunks, final_chunks, bad_order;
    uint64_t tasks;
    char key[128];
    int results_pages;
} s_peer_t;

static s_peer_t s_peer;
static char s_dir[256];

static void s_reply(zframe_t *id, uint64_t rid, Anvil__Envelope *env)
{
    env->has_request_id = true;
    env->request_id = rid;
    if (anv_msg_send(s_peer.router, id, env, NULL) != 0)
        s_peer.bad_order++; /* no cmocka asserts in this thread */
}

static Anvil__SampleResult *s_result(int i, bool failed)
{
    Anvil__SampleResult *r = calloc(1, sizeof *r);
    Anvil__Sample *s = calloc(1, sizeof *s);
    anvil__sample_result__init(r);
    anvil__sample__init(s);
    r->sample = s;
    char id[32];
    snprintf(id, sizeof id, "p%d", i / 2);
    s->custom_id = strdup(id);
    s->has_sample_index = true;
    s->sample_index = (uint32_t)(i % 2);
    s->has_n_tokens = true;
    s->n_tokens = 7;
    s->has_finish_reason = true;
    s->finish_reason = failed ? ANVIL__FINISH_REASON__FINISH_ERROR : ANVIL__FINISH_REASON__FINISH_EOS;
    if (failed)
        s->error = strdup("prompt longer than the context");
    else
        s->text = strdup("```python\nx = 1\n```");
    return r;
}

static void s_results_reply(zframe_t *id, uint64_t rid, const char *cursor)
{
    /* 3 pages of 4 results; sample 5 failed */
    int page = cursor && *cursor ? atoi(cursor) : 0;
    s_peer.results_pages++;
    if (s_peer.mode == P_RESULTS_BREAK && page == 1)
        return; /* the broker goes away half way */
    Anvil__Envelope env;
    Anvil__ResultsReply rr;
    anv_msg_init(&env);
    anvil__results_reply__init(&rr);
    Anvil__SampleResult *res[4];
    for (int i = 0; i < 4; i++)
        res[i] = s_result(page * 4 + i, page * 4 + i == 5);
    rr.results = res;
    rr.n_results = 4;
    char next[16];
    snprintf(next, sizeof next, "%d", page + 1);
    rr.has_done = true;
    rr.done = page == 2;
    rr.next_cursor = page == 2 ? NULL : next;
    env.body_case = ANVIL__ENVELOPE__BODY_RESULTS_REPLY;
    env.results_reply = &rr;
    s_reply(id, rid, &env);
    for (int i = 0; i < 4; i++)
        anvil__sample_result__free_unpacked(res[i], NULL);
}

static void s_submit_reply(zframe_t *id, uint64_t rid, const Anvil__SubmitRequest *sr)
{
    s_peer.chunks++;
    if (sr->spec) {
        s_peer.spec_chunks++;
        snprintf(s_peer.key, sizeof s_peer.key, "%s",
                 sr->spec->idempotency_key ? sr->spec->idempotency_key : "");
        if (sr->job_id || s_peer.chunks != 1)
            s_peer.bad_order++;
    } else if (!sr->job_id || strcmp(sr->job_id, "01JOBTEST0000000000000000A")) {
        s_peer.bad_order++;
    }
    if (!sr->has_chunk_index || sr->chunk_index != (uint64_t)(s_peer.chunks - 1))
        s_peer.bad_order++;
    if (s_peer.final_chunks)
        s_peer.bad_order++; /* anything after final */
    if (sr->has_final && sr->final)
        s_peer.final_chunks++;
    s_peer.tasks += sr->n_tasks;
    Anvil__Envelope env;
    Anvil__SubmitReply rep;
    anv_msg_init(&env);
    anvil__submit_reply__init(&rep);
    rep.job_id = "01JOBTEST0000000000000000A";
    rep.has_accepted = true;
    rep.accepted = sr->n_tasks;
    rep.has_durable = true;
    rep.durable = true;
    env.body_case = ANVIL__ENVELOPE__BODY_SUBMIT_REPLY;
    env.submit_reply = &rep;
    s_reply(id, rid, &env);
}

static void *s_peer_main(void *arg)
{
    (void)arg;
    while (!s_peer.stop) {
        zmq_pollitem_t it = {zsock_resolve(s_peer.router), 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 20) <= 0)
            continue;
        zframe_t *id = NULL;
        int err;
        Anvil__Envelope *req = anv_msg_recv(s_peer.router, true, false, 0, &id, NULL, &err);
        if (!req)
            continue;
        s_peer.messages++;
        uint64_t rid = req->request_id;
        Anvil__Envelope env;
        anv_msg_init(&env);
        switch (s_peer.mode) {
        case P_SILENT:
            break;
        case P_ERROR: {
            Anvil__ErrorReply er;
            anvil__error_reply__init(&er);
            er.code = ANV_ENOTFOUND;
            er.message = "no job 'nope'";
            env.body_case = ANVIL__ENVELOPE__BODY_ERROR;
            env.error = &er;
            s_reply(id, rid, &env);
            break;
        }
        case P_WRONG: {
            Anvil__StatusReply st;
            anvil__status_reply__init(&st);
            env.body_case = ANVIL__ENVELOPE__BODY_STATUS_REPLY;
            env.status_reply = &st;
            s_reply(id, rid, &env);
            break;
        }
        default:
            if (req->body_case == ANVIL__ENVELOPE__BODY_SUBMIT) {
                s_submit_reply(id, rid, req->submit);
            } else if (req->body_case == ANVIL__ENVELOPE__BODY_STATUS) {
                Anvil__StatusReply st;
                Anvil__JobStatus js, *jss[1] = {&js};
                anvil__status_reply__init(&st);
                anvil__job_status__init(&js);
                js.job_id = "01JOBTEST0000000000000000A";
                js.has_state = true;
                js.state = ANVIL__JOB_STATE__JOB_DONE;
                st.jobs = jss;
                st.n_jobs = 1;
                env.body_case = ANVIL__ENVELOPE__BODY_STATUS_REPLY;
                env.status_reply = &st;
                s_reply(id, rid, &env);
            } else if (req->body_case == ANVIL__ENVELOPE__BODY_RESULTS) {
                s_results_reply(id, rid, req->results->cursor);
            } else if (req->body_case == ANVIL__ENVELOPE__BODY_WORKERS) {
                Anvil__WorkersReply wr;
                Anvil__WorkerInfo w, *ws[1] = {&w};
                anvil__workers_reply__init(&wr);
                anvil__worker_info__init(&w);
                w.worker_id = "gen-1";
                wr.workers = ws;
                wr.n_workers = 1;
                env.body_case = ANVIL__ENVELOPE__BODY_WORKERS_REPLY;
                env.workers_reply = &wr;
                if (s_peer.mode == P_STALE) {
                    /* an answer to an older request first: it must be ignored */
                    w.worker_id = "stale";
                    s_reply(id, rid - 1, &env);
                    w.worker_id = "gen-1";
                }
                s_reply(id, rid, &env);
            }
            break;
        }
        zframe_destroy(&id);
        anv_msg_free(&req);
    }
    return NULL;
}

static int s_setup(void **state)
{
    zsys_handler_set(NULL);
    snprintf(s_dir, sizeof s_dir, "/tmp/anvil-cli-client-XXXXXX");
    if (!mkdtemp(s_dir))
        return -1;
    s_peer.router = zsock_new(ZMQ_ROUTER);
    zsock_set_router_mandatory(s_peer.router, 1);
    int port = zsock_bind(s_peer.router, "tcp://127.0.0.1:*");
    if (port < 0)
        return -1;
    snprintf(s_peer.endpoint, sizeof s_peer.endpoint, "tcp://127.0.0.1:%d", port);
    return pthread_create(&s_peer.thread, NULL, s_peer_main, NULL);
}

static int s_teardown(void **state)
{
    s_peer.stop = 1;
    pthread_join(s_peer.thread, NULL);
    zsock_destroy(&s_peer.router);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", s_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void s_reset(s_mode_t mode)
{
    s_peer.mode = mode;
    s_peer.messages = s_peer.chunks = s_peer.spec_chunks = s_peer.final_chunks = 0;
    s_peer.bad_order = s_peer.results_pages = 0;
    s_peer.tasks = 0;
    s_peer.key[0] = 0;
}

static int s_workers_call(cli_client_t *c, int timeout_ms, Anvil__Envelope **rep)
{
    Anvil__Envelope req;
    Anvil__WorkersRequest wr;
    anv_msg_init(&req);
    anvil__workers_request__init(&wr);
    req.body_case = ANVIL__ENVELOPE__BODY_WORKERS;
    req.workers = &wr;
    return cli_client_call(c, &req, ANVIL__ENVELOPE__BODY_WORKERS_REPLY, timeout_ms, rep);
}

static void test_call_paths(void **state)
{
    char err[256];
    cli_client_t *c = cli_client_new(s_peer.endpoint, NULL, NULL, err, sizeof err);
    assert_non_null(c);
    Anvil__Envelope *rep = NULL;

    s_reset(P_NORMAL);
    assert_int_equal(s_workers_call(c, 5000, &rep), 0);
    assert_string_equal(rep->workers_reply->workers[0]->worker_id, "gen-1");
    anv_msg_free(&rep);

    s_reset(P_STALE);
    assert_int_equal(s_workers_call(c, 5000, &rep), 0);
    assert_string_equal(rep->workers_reply->workers[0]->worker_id, "gen-1");
    anv_msg_free(&rep);

    s_reset(P_ERROR);
    assert_int_equal(s_workers_call(c, 5000, &rep), ANV_ENOTFOUND);
    assert_null(rep);
    assert_string_equal(cli_client_errstr(c), "no job 'nope'");
    assert_int_equal(cli_exit_for(ANV_ENOTFOUND), CLI_EXIT_NOTFOUND);

    s_reset(P_WRONG);
    assert_int_equal(s_workers_call(c, 5000, &rep), ANV_EPROTO);
    assert_non_null(strstr(cli_client_errstr(c), "answered 'status_reply' to a 'workers'"));

    s_reset(P_SILENT);
    assert_int_equal(s_workers_call(c, 300, &rep), ANV_ETIMEOUT);
    assert_non_null(strstr(cli_client_errstr(c), "no reply from the broker at tcp://127.0.0.1:"));
    assert_int_equal(s_peer.messages, 1);
    cli_client_destroy(&c);

    /* nobody listening at all */
    c = cli_client_new("tcp://127.0.0.1:1", NULL, NULL, err, sizeof err);
    assert_non_null(c);
    assert_int_equal(s_workers_call(c, 300, &rep), ANV_ETIMEOUT);
    cli_client_destroy(&c);
    assert_null(cli_client_new("not-an-endpoint", NULL, NULL, err, sizeof err));
    assert_non_null(strstr(err, "cannot use broker endpoint 'not-an-endpoint'"));
}

static const char *s_file(const char *name, int lines, int bad_line)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", s_dir, name);
    FILE *f = fopen(path, "w");
    for (int i = 1; i <= lines; i++)
        if (i == bad_line)
            fprintf(f, "{\"custom_id\": \"c%d\", \"prompt\": \"p\", \"max_tokens\": -1}\n", i);
        else
            fprintf(f, "{\"custom_id\": \"c%d\", \"prompt\": \"prompt %d\"}\n", i, i);
    fclose(f);
    return path;
}

static int s_run(int (*fn)(int, char **), const char *const *args)
{
    char *argv[32];
    int n = 0;
    for (; args[n]; n++)
        argv[n] = (char *)args[n];
    argv[n] = NULL;
    /* the subcommand writes its job id / summary to stdout: keep the test output readable */
    fflush(stdout);
    int saved = dup(1), nul = open("/dev/null", O_WRONLY);
    dup2(nul, 1);
    close(nul);
    int rc = fn(n, argv);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    return rc;
}

static void test_submit_chunks(void **state)
{
    const char *path = s_file("ok.jsonl", 2500, 0);
    s_reset(P_NORMAL);
    const char *args[] = {"submit", path, "--broker", s_peer.endpoint, "--chunk", "1000",
                          "--name", "my-run", NULL};
    assert_int_equal(s_run(cli_cmd_submit, args), CLI_EXIT_OK);
    assert_int_equal(s_peer.chunks, 3);
    assert_int_equal(s_peer.spec_chunks, 1);
    assert_int_equal(s_peer.final_chunks, 1);
    assert_int_equal(s_peer.bad_order, 0);
    assert_int_equal(s_peer.tasks, 2500);
    assert_string_equal(s_peer.key, "my-run");

    /* a malformed line 1999: nothing at all goes over the wire */
    path = s_file("bad.jsonl", 2500, 1999);
    s_reset(P_NORMAL);
    const char *args2[] = {"submit", path, "--broker", s_peer.endpoint, NULL};
    assert_int_equal(s_run(cli_cmd_submit, args2), CLI_EXIT_INPUT);
    assert_int_equal(s_peer.messages, 0);

    /* --skip-invalid leaves it out */
    s_reset(P_NORMAL);
    const char *args3[] = {"submit", path, "--broker", s_peer.endpoint, "--skip-invalid", NULL};
    assert_int_equal(s_run(cli_cmd_submit, args3), CLI_EXIT_OK);
    assert_int_equal(s_peer.tasks, 2499);
    assert_int_equal(s_peer.chunks, 3);
    assert_int_equal(s_peer.final_chunks, 1);
    assert_int_equal(strlen(s_peer.key), 26); /* no --name: a fresh id */

    /* a broker that never answers: each chunk is tried three times, then exit 4 */
    path = s_file("small.jsonl", 3, 0);
    s_reset(P_SILENT);
    const char *args4[] = {"submit", path, "--broker", s_peer.endpoint, "--timeout", "0.2", NULL};
    assert_int_equal(s_run(cli_cmd_submit, args4), CLI_EXIT_UNREACHABLE);
    assert_int_equal(s_peer.messages, 3);
}

static int s_count_lines(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    int n = 0, ch;
    while ((ch = fgetc(f)) != EOF)
        n += ch == '\n';
    fclose(f);
    return n;
}

static void test_results_pages(void **state)
{
    char out[512], errs[512];
    snprintf(out, sizeof out, "%s/res.jsonl", s_dir);
    snprintf(errs, sizeof errs, "%s/res.errors.jsonl", s_dir);
    s_reset(P_NORMAL);
    const char *args[] = {"results", "01JOBTEST0000000000000000A", "--out", out, "--broker",
                          s_peer.endpoint, NULL};
    assert_int_equal(s_run(cli_cmd_results, args), CLI_EXIT_OK);
    assert_int_equal(s_peer.results_pages, 3);
    assert_int_equal(s_count_lines(out), 11);
    assert_int_equal(s_count_lines(errs), 1);
    FILE *f = fopen(out, "r");
    char line[1024];
    assert_non_null(fgets(line, sizeof line, f));
    fclose(f);
    assert_non_null(strstr(line, "\"custom_id\":\"p0\""));
    assert_non_null(strstr(line, "\"completion_tokens\":7"));
    assert_non_null(strstr(line, "\"finish_reason\":\"eos\""));
    f = fopen(errs, "r");
    assert_non_null(fgets(line, sizeof line, f));
    fclose(f);
    assert_non_null(strstr(line, "\"error\":\"prompt longer than the context\""));

    /* the broker vanishes after page 1: exit 4 and no output file that looks complete */
    unlink(out);
    unlink(errs);
    s_reset(P_RESULTS_BREAK);
    const char *args2[] = {"results", "01JOBTEST0000000000000000A", "--out", out, "--broker",
                           s_peer.endpoint, "--timeout", "0.3", NULL};
    assert_int_equal(s_run(cli_cmd_results, args2), CLI_EXIT_UNREACHABLE);
    assert_int_equal(access(out, F_OK), -1);
    assert_int_equal(access(errs, F_OK), -1);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "ls '%s' | grep -q partial", s_dir);
    assert_int_not_equal(system(cmd), 0); /* temporary files removed too */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_call_paths),
        cmocka_unit_test(test_submit_chunks),
        cmocka_unit_test(test_results_pages),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}

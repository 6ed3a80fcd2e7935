/*  test_client.c - a small client of the broker's client socket, for tests and benchmarks.

    Commands (first positional argument):
      submit            submit --tasks tasks in chunks of --chunk; prints "job <id>" and
                        "accepted A skipped S existing E"
      wait JOB          polls status until the job is terminal or --timeout-s passes; prints the
                        status line; exit 0 when done/cancelled, 1 on timeout
      status JOB        prints one line of key=value counters
      results JOB       pages through every result; prints "results N unique U duplicates D
                        dead X"; exit 1 on a duplicate (job, task, sample)
      watch JOB         reads events from --from; prints "events N last OFFSET types ..."
      cancel JOB        prints "cancelled N"
      retry JOB         prints "requeued N" (--failed: also samples that ended in error)
      workers           one line per worker
      weights           UPDATE_WEIGHTS --version V; prints "weights version V workers N"
      garbage           sends hostile bytes to --endpoint (random, empty, truncated, wrong
                        version, multi-frame) --count times each
      bench             submits --tasks tasks and waits, printing tasks/s; then --latency
                        single-task jobs one at a time, printing p50/p99 submit->result ms;
                        with --latency-log FILE, one line "submit <job> <monotonic ns>" per
                        latency job (taken just before its submit is sent), so that the
                        arrival times a worker logs give the dispatch latency
*/
#include "anv_config.h"
#include "anv_error.h"
#include "anv_id.h"
#include "anv_log.h"
#include "anv_msg.h"
#include "anv_time.h"

#include <czmq.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static zsock_t *g_sock;
static uint64_t g_rid;
static int64_t g_timeout_ms = 15000;
static bool g_failed_only;   /* retry --failed */

static Anvil__Envelope *s_call(Anvil__Envelope *req)
{
    req->has_request_id = 1;
    req->request_id = ++g_rid;
    if (anv_msg_send(g_sock, NULL, req, NULL) != 0)
        return NULL;
    int64_t until = anv_now_ms() + g_timeout_ms;
    while (anv_now_ms() < until && !zsys_interrupted) {
        zmq_pollitem_t it = {zsock_resolve(g_sock), 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 100) <= 0)
            continue;
        int err;
        Anvil__Envelope *r = anv_msg_recv(g_sock, false, false, 0, NULL, NULL, &err);
        if (r && r->request_id == req->request_id)
            return r;
        anv_msg_free(&r);
    }
    fprintf(stderr, "test_client: no reply within %lld ms\n", (long long)g_timeout_ms);
    return NULL;
}

static bool s_is_error(Anvil__Envelope *r)
{
    if (r && r->body_case == ANVIL__ENVELOPE__BODY_ERROR) {
        fprintf(stderr, "test_client: error %d: %s\n", r->error->code, r->error->message);
        return true;
    }
    return !r;
}

typedef struct {
    int64_t tasks, chunk, n, priority, max_attempts, max_tokens;
    bool score, custom_ids, strict;
    char *name, *idem;
    char *model;         /* JobSpec.model ("" = any worker) */
    int64_t task_kind;   /* TaskRef.kind of every task (0 = none) */
} s_submit_opts_t;

/* returns 0 and the job id */
static int s_submit(const s_submit_opts_t *o, char job[ANV_ID_SIZE], bool quiet)
{
    uint64_t acc = 0, skip = 0;
    bool existing = false;
    job[0] = 0;
    Anvil__Task *tasks = calloc((size_t)o->chunk, sizeof *tasks);
    Anvil__Task **ptrs = calloc((size_t)o->chunk, sizeof *ptrs);
    char (*cid)[32] = calloc((size_t)o->chunk, 32);
    char (*prompt)[48] = calloc((size_t)o->chunk, 48);
    Anvil__TaskRef *refs = calloc((size_t)o->chunk, sizeof *refs);
    int rc = 1;
    int64_t i = 0;
    uint64_t chunk_index = 0;
    do {
        int64_t k = o->tasks - i < o->chunk ? o->tasks - i : o->chunk;
        for (int64_t t = 0; t < k; t++) {
            anvil__task__init(&tasks[t]);
            snprintf(prompt[t], 48, "prompt %lld", (long long)(i + t));
            tasks[t].prompt = prompt[t];
            if (o->task_kind > 0) {
                refs[t] = (Anvil__TaskRef)ANVIL__TASK_REF__INIT;
                refs[t].has_kind = 1;
                refs[t].kind = (Anvil__TaskKind)o->task_kind;
                tasks[t].ref = &refs[t];
            }
            if (o->custom_ids) {
                snprintf(cid[t], 32, "c%lld", (long long)(i + t));
                tasks[t].custom_id = cid[t];
            }
            ptrs[t] = &tasks[t];
        }
        Anvil__Envelope env;
        Anvil__SubmitRequest sr = ANVIL__SUBMIT_REQUEST__INIT;
        Anvil__JobSpec spec = ANVIL__JOB_SPEC__INIT;
        Anvil__SamplingParams sp = ANVIL__SAMPLING_PARAMS__INIT;
        anv_msg_init(&env);
        if (!job[0]) {
            spec.name = o->name;
            spec.model = o->model && *o->model ? o->model : NULL;
            spec.idempotency_key = o->idem && *o->idem ? o->idem : NULL;
            spec.has_priority = spec.has_n = spec.has_score = spec.has_max_attempts = 1;
            spec.priority = (int32_t)o->priority;
            spec.n = (uint32_t)o->n;
            spec.score = o->score;
            spec.max_attempts = (uint32_t)o->max_attempts;
            sp.has_max_tokens = 1;
            sp.max_tokens = (uint32_t)o->max_tokens;
            spec.sampling = &sp;
            if (o->strict) {
                spec.has_durability = 1;
                spec.durability = ANVIL__DURABILITY__DURABILITY_STRICT;
            }
            sr.spec = &spec;
        } else {
            sr.job_id = job;
        }
        sr.n_tasks = (size_t)k;
        sr.tasks = ptrs;
        sr.has_final = sr.has_chunk_index = 1;
        sr.final = i + k >= o->tasks;
        sr.chunk_index = chunk_index++;
        env.body_case = ANVIL__ENVELOPE__BODY_SUBMIT;
        env.submit = &sr;
        Anvil__Envelope *r = s_call(&env);
        if (s_is_error(r)) {
            anv_msg_free(&r);
            goto out;
        }
        snprintf(job, ANV_ID_SIZE, "%s", r->submit_reply->job_id);
        acc += r->submit_reply->accepted;
        skip += r->submit_reply->skipped;
        existing = existing || r->submit_reply->existing;
        anv_msg_free(&r);
        i += k;
    } while (i < o->tasks);
    if (!quiet)
        printf("job %s\naccepted %" PRIu64 " skipped %" PRIu64 " existing %d\n", job, acc, skip,
               existing);
    rc = 0;
out:
    free(tasks);
    free(ptrs);
    free(cid);
    free(prompt);
    free(refs);
    return rc;
}

static Anvil__Envelope *s_status(const char *job)
{
    Anvil__Envelope env;
    Anvil__StatusRequest sr = ANVIL__STATUS_REQUEST__INIT;
    anv_msg_init(&env);
    sr.job_id = (char *)job;
    env.body_case = ANVIL__ENVELOPE__BODY_STATUS;
    env.status = &sr;
    Anvil__Envelope *r = s_call(&env);
    if (s_is_error(r) || r->status_reply->n_jobs != 1) {
        anv_msg_free(&r);
        return NULL;
    }
    return r;
}

static const char *s_state_name(Anvil__JobState s)
{
    static const char *n[] = {"none", "submitting", "queued", "running", "done", "cancelled",
                              "failed"};
    return (unsigned)s < 7 ? n[s] : "?";
}

static void s_print_status(const Anvil__JobStatus *s)
{
    printf("state=%s tasks=%" PRIu64 " samples=%" PRIu64 " generated=%" PRIu64 " scored=%" PRIu64
           " failed=%" PRIu64 " dead=%" PRIu64 " correct=%" PRIu64 " tokens=%" PRIu64
           " in_flight=%" PRIu64 " tokens_per_s=%.1f evals_per_min=%.1f eta_s=%.1f"
           " pass_rate=%.3f mean_speedup=%.3f created_ms=%" PRIu64 " finished_ms=%" PRIu64 "\n",
           s_state_name(s->state), s->tasks, s->samples_total, s->generated, s->scored, s->failed,
           s->dead, s->correct, s->tokens, s->in_flight, s->tokens_per_s, s->evals_per_min,
           s->eta_s, s->pass_rate, s->mean_speedup, s->created_ms, s->finished_ms);
}

static int s_wait(const char *job, int64_t timeout_s, bool quiet)
{
    int64_t until = anv_now_ms() + timeout_s * 1000;
    while (anv_now_ms() < until && !zsys_interrupted) {
        Anvil__Envelope *r = s_status(job);
        if (r) {
            Anvil__JobStatus *s = r->status_reply->jobs[0];
            if (s->state == ANVIL__JOB_STATE__JOB_DONE ||
                s->state == ANVIL__JOB_STATE__JOB_CANCELLED ||
                s->state == ANVIL__JOB_STATE__JOB_FAILED) {
                if (!quiet)
                    s_print_status(s);
                anv_msg_free(&r);
                return 0;
            }
            anv_msg_free(&r);
        }
        anv_sleep_ms(quiet ? 2 : 100);
    }
    Anvil__Envelope *r = s_status(job);
    if (r)
        s_print_status(r->status_reply->jobs[0]);
    anv_msg_free(&r);
    fprintf(stderr, "test_client: job %s not finished after %lld s\n", job, (long long)timeout_s);
    return 1;
}

static int s_results(const char *job, int64_t page)
{
    zhashx_t *seen = zhashx_new();
    uint64_t n = 0, dup = 0, dead = 0, correct = 0;
    char cursor[64] = "";
    int rc = 1;
    for (;;) {
        Anvil__Envelope env;
        Anvil__ResultsRequest rq = ANVIL__RESULTS_REQUEST__INIT;
        anv_msg_init(&env);
        rq.job_id = (char *)job;
        rq.cursor = cursor;
        rq.has_page_size = 1;
        rq.page_size = (uint32_t)page;
        env.body_case = ANVIL__ENVELOPE__BODY_RESULTS;
        env.results = &rq;
        Anvil__Envelope *r = s_call(&env);
        if (s_is_error(r)) {
            anv_msg_free(&r);
            goto out;
        }
        Anvil__ResultsReply *rr = r->results_reply;
        for (size_t i = 0; i < rr->n_results; i++) {
            Anvil__Sample *s = rr->results[i]->sample;
            char key[48];
            snprintf(key, sizeof key, "%" PRIu64 ":%u", s->task_index, s->sample_index);
            if (zhashx_lookup(seen, key))
                dup++;
            else
                zhashx_insert(seen, key, (void *)1);
            n++;
            if (s->finish_reason == ANVIL__FINISH_REASON__FINISH_ERROR)
                dead++;
            if (rr->results[i]->exec &&
                rr->results[i]->exec->status == ANVIL__EXEC_STATUS__EXEC_CORRECT)
                correct++;
        }
        snprintf(cursor, sizeof cursor, "%s", rr->next_cursor ? rr->next_cursor : "");
        bool done = rr->done || rr->n_results == 0;
        anv_msg_free(&r);
        if (done)
            break;
    }
    printf("results %" PRIu64 " unique %zu duplicates %" PRIu64 " errors %" PRIu64
           " correct %" PRIu64 "\n", n, zhashx_size(seen), dup, dead, correct);
    rc = dup ? 1 : 0;
out:
    zhashx_destroy(&seen);
    return rc;
}

static int s_watch(const char *job, const char *from, int64_t block_ms, int64_t max_events,
                   bool list)
{
    Anvil__Envelope env;
    Anvil__WatchRequest w = ANVIL__WATCH_REQUEST__INIT;
    anv_msg_init(&env);
    w.job_id = (char *)job;
    w.from_offset = (char *)from;
    w.has_max_events = w.has_block_ms = 1;
    w.max_events = (uint32_t)max_events;
    w.block_ms = (uint32_t)block_ms;
    env.body_case = ANVIL__ENVELOPE__BODY_WATCH;
    env.watch = &w;
    Anvil__Envelope *r = s_call(&env);
    if (s_is_error(r)) {
        anv_msg_free(&r);
        return 1;
    }
    zhashx_t *types = zhashx_new();
    for (size_t i = 0; i < r->watch_reply->n_events; i++) {
        const Anvil__Event *e = r->watch_reply->events[i];
        const char *t = e->type ? e->type : "?";
        if (list)
            printf("event %s %s %" PRIu64 ":%u\n", e->id, t, e->task_index, e->sample_index);
        uintptr_t c = (uintptr_t)zhashx_lookup(types, t);
        zhashx_update(types, t, (void *)(c + 1));
    }
    printf("events %zu last %s types", r->watch_reply->n_events,
           r->watch_reply->last_offset ? r->watch_reply->last_offset : "");
    for (void *v = zhashx_first(types); v; v = zhashx_next(types))
        printf(" %s=%zu", (const char *)zhashx_cursor(types), (size_t)(uintptr_t)v);
    printf("\n");
    zhashx_destroy(&types);
    anv_msg_free(&r);
    return 0;
}

static int s_simple(const char *cmd, const char *job, int64_t version)
{
    Anvil__Envelope env;
    anv_msg_init(&env);
    Anvil__CancelRequest c = ANVIL__CANCEL_REQUEST__INIT;
    Anvil__RetryRequest rt = ANVIL__RETRY_REQUEST__INIT;
    Anvil__WorkersRequest w = ANVIL__WORKERS_REQUEST__INIT;
    Anvil__UpdateWeightsRequest u = ANVIL__UPDATE_WEIGHTS_REQUEST__INIT;
    if (!strcmp(cmd, "cancel")) {
        c.job_id = (char *)job;
        env.body_case = ANVIL__ENVELOPE__BODY_CANCEL;
        env.cancel = &c;
    } else if (!strcmp(cmd, "retry")) {
        rt.job_id = (char *)job;
        rt.has_failed_only = g_failed_only;
        rt.failed_only = g_failed_only;
        env.body_case = ANVIL__ENVELOPE__BODY_RETRY;
        env.retry = &rt;
    } else if (!strcmp(cmd, "workers")) {
        env.body_case = ANVIL__ENVELOPE__BODY_WORKERS;
        env.workers = &w;
    } else {
        u.version = (uint64_t)version;
        u.checkpoint_dir = "/nonexistent/checkpoint";
        env.body_case = ANVIL__ENVELOPE__BODY_UPDATE_WEIGHTS;
        env.update_weights = &u;
    }
    Anvil__Envelope *r = s_call(&env);
    if (s_is_error(r)) {
        anv_msg_free(&r);
        return 1;
    }
    if (r->body_case == ANVIL__ENVELOPE__BODY_CANCEL_REPLY)
        printf("cancelled %" PRIu64 "\n", r->cancel_reply->cancelled);
    else if (r->body_case == ANVIL__ENVELOPE__BODY_RETRY_REPLY)
        printf("requeued %" PRIu64 "\n", r->retry_reply->requeued);
    else if (r->body_case == ANVIL__ENVELOPE__BODY_UPDATE_WEIGHTS_REPLY)
        printf("weights version %" PRIu64 " workers %u\n", r->update_weights_reply->version,
               r->update_weights_reply->workers);
    else if (r->body_case == ANVIL__ENVELOPE__BODY_WORKERS_REPLY) {
        for (size_t i = 0; i < r->workers_reply->n_workers; i++) {
            Anvil__WorkerInfo *x = r->workers_reply->workers[i];
            printf("worker %s kind=%d slots=%u in_flight=%u state=%s version=%" PRIu64 "\n",
                   x->worker_id, (int)x->kind, x->slots, x->in_flight, x->state,
                   x->weight_version);
        }
        printf("workers %zu\n", r->workers_reply->n_workers);
    }
    anv_msg_free(&r);
    return 0;
}

static int s_garbage(const char *endpoint, int64_t count)
{
    zsock_t *s = zsock_new(ZMQ_DEALER);
    zsock_set_linger(s, 2000);
    if (zsock_connect(s, "%s", endpoint) < 0)
        return 1;
    void *zs = zsock_resolve(s);
    uint8_t buf[512];
    for (int64_t i = 0; i < count; i++) {
        /* random bytes */
        size_t n = 1 + (size_t)(rand() % (int)sizeof buf);
        for (size_t k = 0; k < n; k++)
            buf[k] = (uint8_t)rand();
        zmq_send(zs, buf, n, 0);
        /* empty frame */
        zmq_send(zs, "", 0, 0);
        /* a valid heartbeat envelope, truncated */
        Anvil__Envelope env;
        Anvil__Heartbeat hb = ANVIL__HEARTBEAT__INIT;
        Anvil__StatusRequest st = ANVIL__STATUS_REQUEST__INIT;
        anv_msg_init(&env);
        hb.worker_id = "garbage-worker-with-a-long-name";
        env.body_case = ANVIL__ENVELOPE__BODY_HEARTBEAT;
        env.heartbeat = &hb;
        size_t len;
        uint8_t *p = anv_msg_encode(&env, &len);
        zmq_send(zs, p, len / 2, 0);
        free(p);
        /* wrong protocol version */
        env.version = ANVIL_PROTOCOL_VERSION + 41;
        env.body_case = ANVIL__ENVELOPE__BODY_STATUS;
        env.status = &st;
        p = anv_msg_encode(&env, &len);
        zmq_send(zs, p, len, 0);
        free(p);
        /* two frames */
        zmq_send(zs, "ab", 2, ZMQ_SNDMORE);
        zmq_send(zs, "cd", 2, 0);
    }
    zsock_destroy(&s);
    printf("garbage sent %lld x 5 messages\n", (long long)count);
    return 0;
}

static int s_cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static int s_bench(s_submit_opts_t *o, int64_t latency_n, const char *latency_log)
{
    char job[ANV_ID_SIZE];
    int64_t t0 = anv_now_ns();
    if (s_submit(o, job, true) != 0)
        return 1;
    int64_t t1 = anv_now_ns();
    if (s_wait(job, 600, true) != 0)
        return 1;
    int64_t t2 = anv_now_ns();
    double total_s = (double)(t2 - t0) / 1e9;
    printf("bench job %s tasks %lld samples/task %lld\n", job, (long long)o->tasks,
           (long long)o->n);
    printf("bench submit %.3f s (%.0f tasks/s accepted durably)\n", (double)(t1 - t0) / 1e9,
           (double)o->tasks / ((double)(t1 - t0) / 1e9));
    printf("bench end_to_end %.3f s -> %.0f tasks/s (%.0f samples/s) submit->all results "
           "persisted\n", total_s, (double)o->tasks / total_s,
           (double)(o->tasks * o->n) / total_s);
    if (latency_n > 0) {
        int64_t *lat = calloc((size_t)latency_n, sizeof *lat);
        s_submit_opts_t one = *o;
        one.tasks = 1;
        one.chunk = 1;
        one.n = 1;
        FILE *ll = latency_log && *latency_log ? fopen(latency_log, "w") : NULL;
        for (int64_t i = 0; i < latency_n; i++) {
            int64_t a = anv_now_ns();
            if (s_submit(&one, job, true) != 0 || s_wait(job, 30, true) != 0) {
                free(lat);
                if (ll)
                    fclose(ll);
                return 1;
            }
            lat[i] = anv_now_ns() - a;
            if (ll)
                fprintf(ll, "submit %s %lld\n", job, (long long)a);
            anv_sleep_ms(1); /* idle between jobs */
        }
        if (ll)
            fclose(ll);
        qsort(lat, (size_t)latency_n, sizeof *lat, s_cmp_i64);
        printf("bench idle_roundtrip n=%lld p50 %.3f ms p99 %.3f ms (submit -> status done, "
               "incl. client polling)\n", (long long)latency_n,
               (double)lat[latency_n / 2] / 1e6, (double)lat[(latency_n * 99) / 100] / 1e6);
        free(lat);
    }
    return 0;
}

int main(int argc, char **argv)
{
    char *endpoint = NULL, *from = NULL, *name = NULL, *idem = NULL, *latency_log = NULL;
    char *model = NULL;
    int64_t task_kind;
    int64_t tasks, chunk, n, priority, max_attempts, timeout_s, page, count, version, block_ms;
    int64_t max_events;
    bool list = false;
    int64_t latency, max_tokens;
    bool score = false, custom_ids = false, strict = false;
    const anv_cfg_opt_t opts[] = {
        {"endpoint", ANV_CFG_STR, "tcp://127.0.0.1:5555", 0, -1, "broker endpoint", &endpoint,
         false},
        {"tasks", ANV_CFG_INT, "10", 0, 100000000, "tasks to submit", &tasks, false},
        {"chunk", ANV_CFG_INT, "1000", 1, 100000, "tasks per submit chunk", &chunk, false},
        {"n", ANV_CFG_INT, "1", 1, 4096, "samples per task", &n, false},
        {"priority", ANV_CFG_INT, "0", -100, 100, "job priority", &priority, false},
        {"max-attempts", ANV_CFG_INT, "0", 0, 1000, "0 = broker default", &max_attempts, false},
        {"max-tokens", ANV_CFG_INT, "16", 1, 1000000, "sampling max_tokens", &max_tokens, false},
        {"score", ANV_CFG_BOOL, "false", 0, -1, "score samples", &score, false},
        {"custom-ids", ANV_CFG_BOOL, "false", 0, -1, "custom_id c<i> per task", &custom_ids,
         false},
        {"strict", ANV_CFG_BOOL, "false", 0, -1, "strict durability", &strict, false},
        {"name", ANV_CFG_STR, "test", 0, -1, "job name", &name, false},
        {"idem", ANV_CFG_STR, NULL, 0, -1, "idempotency key", &idem, false},
        {"timeout-s", ANV_CFG_INT, "120", 1, 100000, "wait timeout", &timeout_s, false},
        {"page", ANV_CFG_INT, "100", 1, 1000, "results page size", &page, false},
        {"from", ANV_CFG_STR, "0", 0, -1, "watch offset", &from, false},
        {"block-ms", ANV_CFG_INT, "0", 0, 60000, "watch long poll", &block_ms, false},
        {"max-events", ANV_CFG_INT, "10000", 1, 10000, "watch: events per reply", &max_events,
         false},
        {"list", ANV_CFG_BOOL, "false", 0, -1, "watch: one line per event", &list, false},
        {"failed", ANV_CFG_BOOL, "false", 0, -1, "retry: also samples that ended in error",
         &g_failed_only, false},
        {"model", ANV_CFG_STR, "", 0, -1, "submit: the job's model", &model, false},
        {"task-kind", ANV_CFG_INT, "0", 0, 3, "submit: TaskRef.kind of every task", &task_kind,
         false},
        {"count", ANV_CFG_INT, "100", 1, 1000000, "garbage rounds", &count, false},
        {"version", ANV_CFG_INT, "1", 0, INT32_MAX, "weights version", &version, false},
        {"latency", ANV_CFG_INT, "0", 0, 1000000, "bench: idle single-task jobs", &latency,
         false},
        {"latency-log", ANV_CFG_STR, NULL, 0, -1, "bench: submit times of the latency jobs",
         &latency_log, false},
    };
    size_t n_opts = sizeof opts / sizeof opts[0];
    anv_log_init("test-client");
    char err[256];
    anv_cfg_rest_t rest;
    if (anv_config_load(opts, n_opts, argc, argv, &rest, err, sizeof err) != 0 || rest.argc < 1) {
        fprintf(stderr, "usage: test_client CMD [JOB] [options] (%s)\n", err);
        return 2;
    }
    const char *cmd = rest.argv[0], *job = rest.argc > 1 ? rest.argv[1] : "";
    int rc = 2;
    if (!strcmp(cmd, "garbage")) {
        rc = s_garbage(endpoint, count);
        goto out;
    }
    g_sock = zsock_new(ZMQ_DEALER);
    zsock_set_linger(g_sock, 0);
    if (zsock_connect(g_sock, "%s", endpoint) < 0)
        goto out;
    g_timeout_ms = timeout_s * 1000 < 60000 ? timeout_s * 1000 : 60000;
    s_submit_opts_t so = {tasks, chunk, n, priority, max_attempts, max_tokens, score, custom_ids,
                          strict, name, idem, model, task_kind};
    char jid[ANV_ID_SIZE];
    if (!strcmp(cmd, "submit"))
        rc = s_submit(&so, jid, false);
    else if (!strcmp(cmd, "wait"))
        rc = s_wait(job, timeout_s, false);
    else if (!strcmp(cmd, "status")) {
        Anvil__Envelope *r = s_status(job);
        if (r)
            s_print_status(r->status_reply->jobs[0]);
        rc = r ? 0 : 1;
        anv_msg_free(&r);
    } else if (!strcmp(cmd, "results"))
        rc = s_results(job, page);
    else if (!strcmp(cmd, "watch"))
        rc = s_watch(job, from, block_ms, max_events, list);
    else if (!strcmp(cmd, "cancel") || !strcmp(cmd, "retry") || !strcmp(cmd, "workers") ||
             !strcmp(cmd, "weights"))
        rc = s_simple(cmd, job, version);
    else if (!strcmp(cmd, "bench"))
        rc = s_bench(&so, latency, latency_log);
    else
        fprintf(stderr, "test_client: unknown command '%s'\n", cmd);
out:
    zsock_destroy(&g_sock);
    anv_config_free(opts, n_opts, &rest);
    return rc;
}

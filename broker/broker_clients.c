/*  broker_clients.c - client operations on the client ROUTER.

    Each request is answered with one reply carrying its request_id, or with an ErrorReply
    (an ANV_E* code and a message). A submit chunk is acknowledged only after the script that
    stored it returned (and, with strict durability, after WAITAOF or under appendfsync
    always), so an acknowledged task is never lost. WATCH with block_ms is parked and answered
    as soon as the job has new events or the wait is over; the loop never blocks on a client.
    A reply that cannot be sent (client gone, pipe full) is counted and logged, never retried.
*/
#include "anv_error.h"
#include "anv_log.h"
#include "anv_time.h"
#include "broker_internal.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

static void s_reply(broker_t *b, zframe_t *identity, uint64_t request_id, Anvil__Envelope *env)
{
    env->has_request_id = 1;
    env->request_id = request_id;
    int rc = anv_msg_send(b->clients, identity, env, &b->st_clients);
    if (rc != 0) {
        b->m.client_errors++;
        ANV_WARN("cannot send '%s' reply to a client: %s", anv_msg_body_name(env),
                 rc == -EAGAIN ? "its pipe is full" : "it is gone");
    }
}

static void s_error(broker_t *b, zframe_t *identity, uint64_t request_id, int code,
                    const char *msg)
{
    Anvil__Envelope env;
    Anvil__ErrorReply e = ANVIL__ERROR_REPLY__INIT;
    anv_msg_init(&env);
    e.code = code;
    e.message = (char *)(msg ? msg : anv_strerror(code));
    env.body_case = ANVIL__ENVELOPE__BODY_ERROR;
    env.error = &e;
    b->m.client_errors++;
    s_reply(b, identity, request_id, &env);
}

static bool s_valid_job_id(const char *id)
{
    return id && anv_id_valid(id);
}

/* ---- submit ---------------------------------------------------------------------------- */

/* A new job's spec, completed (id, defaults) and packed into *buf; the create arguments are
   the start of a "create_submit" call, whose submit arguments the caller adds. */
static int s_create_args(broker_t *b, Anvil__JobSpec *spec, char job_id[ANV_ID_SIZE],
                         uint8_t **buf, size_t *len)
{
    anv_id_new(job_id);
    spec->has_created_ms = 1;
    spec->created_ms = (uint64_t)anv_wall_ms();
    if (!spec->has_n || spec->n == 0) {
        spec->has_n = 1;
        spec->n = 1;
    }
    if (spec->n > 4096)
        return ANV_ETOOBIG;
    if (spec->has_score_only && spec->score_only) {
        spec->has_score = 1; /* re-scoring is scoring */
        spec->score = 1;
    }
    if (!spec->has_max_attempts || spec->max_attempts == 0) {
        spec->has_max_attempts = 1;
        spec->max_attempts = (uint32_t)b->cfg.max_attempts;
    }
    /* the broker names the job: whatever id the client sent is not stored, and its string
       stays with the message (freed with it; overwriting it leaked it, found by fuzz_broker) */
    char *client_id = spec->id;
    spec->id = job_id;
    *len = anvil__job_spec__get_packed_size(spec);
    *buf = malloc(*len ? *len : 1);
    if (*buf)
        anvil__job_spec__pack(spec, *buf);
    spec->id = client_id;
    if (!*buf)
        return -ENOMEM;
    broker_args_reset(b->args, "create_submit");
    broker_args_int(b->args, anv_wall_ms());
    broker_args_str(b->args, job_id);
    broker_args_str(b->args, spec->idempotency_key);
    broker_args_bin(b->args, *buf, *len);
    broker_args_str(b->args, spec->name);
    broker_args_int(b->args, spec->priority);
    broker_args_int(b->args, spec->n);
    broker_args_str(b->args, spec->score ? "1" : "0");
    broker_args_int(b->args, spec->max_attempts);
    broker_args_str(b->args, spec->tenant);
    broker_args_str(b->args, spec->has_score_only && spec->score_only ? "1" : "0");
    return 0;
}

/* the job exists in Redis now: give it its in-memory record */
static void s_created(broker_t *b, const Anvil__JobSpec *spec, const char *job_id,
                      const uint8_t *buf, size_t len)
{
    if (zhashx_lookup(b->jobs, job_id))
        return;
    Anvil__JobSpec *copy = anvil__job_spec__unpack(NULL, len, buf);
    broker_job_t *j = copy ? broker_job_new(job_id, copy, spec->priority) : NULL;
    if (j)
        zhashx_insert(b->jobs, j->id, j);
    else if (copy)
        anvil__job_spec__free_unpacked(copy, NULL);
    b->m.jobs_submitted++;
    ANV_JINFO(job_id, "job created: name '%s', priority %d, n %u, score %d",
              spec->name ? spec->name : "", spec->priority, spec->n, spec->score);
}

/* A chunk's tasks fit its job: a score-only job's tasks each carry 1 to 4096 completions,
   other jobs' tasks none. Returns 0 or ANV_EFORMAT with the reason in why. */
static int s_check_tasks(const Anvil__SubmitRequest *req, bool score_only, char *why, size_t len)
{
    for (size_t i = 0; i < req->n_tasks; i++) {
        const Anvil__Task *t = req->tasks[i];
        if (score_only && (t->n_completions == 0 || t->n_completions > 4096)) {
            snprintf(why, len, "task %zu of the chunk: a score-only task needs 1 to 4096 "
                               "completions (it has %zu)", i, t->n_completions);
            return ANV_EFORMAT;
        }
        if (!score_only && t->n_completions) {
            snprintf(why, len, "task %zu of the chunk carries completions, which only a "
                               "score-only job takes", i);
            return ANV_EFORMAT;
        }
    }
    return 0;
}

/* The samples of a score-only task: sample k is completion k, packed (the script adds the
   task index and job id). Appends the buffers to *bufs (grown) and their arguments. */
static int s_completion_args(broker_t *b, const Anvil__Task *t, uint8_t ***bufs, size_t *nb,
                             size_t *cap)
{
    for (size_t k = 0; k < t->n_completions; k++) {
        Anvil__Sample sm = ANVIL__SAMPLE__INIT;
        sm.has_sample_index = 1;
        sm.sample_index = (uint32_t)k;
        sm.custom_id = t->custom_id;
        sm.text = t->completions[k];
        sm.has_n_tokens = 1;
        sm.n_tokens = 0;
        if (*nb == *cap) {
            size_t c = *cap ? *cap * 2 : 64;
            uint8_t **nbufs = realloc(*bufs, c * sizeof *nbufs);
            if (!nbufs)
                return -ENOMEM;
            *bufs = nbufs;
            *cap = c;
        }
        size_t len = anvil__sample__get_packed_size(&sm);
        uint8_t *p = malloc(len ? len : 1);
        if (!p)
            return -ENOMEM;
        anvil__sample__pack(&sm, p);
        (*bufs)[(*nb)++] = p;
        broker_args_bin(b->args, p, len);
    }
    return 0;
}

static void s_on_submit(broker_t *b, zframe_t *id, uint64_t rid, Anvil__SubmitRequest *req)
{
    char job_id[ANV_ID_SIZE] = "";
    bool existing = false;
    int rc = 0;
    uint8_t **bufs = NULL, *spec_buf = NULL, **sbufs = NULL;
    size_t *lens = NULL, spec_len = 0, n_sbufs = 0, cap_sbufs = 0;
    redisReply *r = NULL;
    bool strict = b->cfg.strict, score_only = false;
    char why[200] = "";
    /* the first chunk of a new job creates it in the same script call (one round trip) */
    bool create = req->spec && !(req->job_id && req->job_id[0]);
    if (req->n_tasks > 100000) {
        rc = ANV_ETOOBIG;
        goto out;
    }
    if (create) {
        score_only = req->spec->has_score_only && req->spec->score_only;
    } else if (s_valid_job_id(req->job_id)) {
        broker_job_t *j = zhashx_lookup(b->jobs, req->job_id);
        if (!j && broker_sched_load(b, req->job_id) == 0)
            j = zhashx_lookup(b->jobs, req->job_id);
        score_only = j && j->spec && j->spec->has_score_only && j->spec->score_only;
    }
    if ((rc = s_check_tasks(req, score_only, why, sizeof why)) != 0)
        goto out;
    if (create) {
        strict = strict || req->spec->durability == ANVIL__DURABILITY__DURABILITY_STRICT;
        /* settings can change at runtime (CONFIG SET): look again for each strict job */
        if (strict && (broker_store_check_durability(b->store, false) != 0 ||
                       !broker_store_can_strict(b->store))) {
            rc = ANV_EUNSUPPORTED;
            goto out;
        }
        rc = s_create_args(b, req->spec, job_id, &spec_buf, &spec_len);
        if (rc != 0)
            goto out;
    } else if (s_valid_job_id(req->job_id)) {
        snprintf(job_id, sizeof job_id, "%s", req->job_id);
        broker_args_reset(b->args, "submit");
        broker_args_int(b->args, anv_wall_ms());
        broker_args_str(b->args, job_id);
    } else {
        rc = ANV_EPROTO;
        goto out;
    }
    bufs = calloc(req->n_tasks + 1, sizeof *bufs);
    lens = calloc(req->n_tasks + 1, sizeof *lens);
    if (!bufs || !lens) {
        rc = -ENOMEM;
        goto out;
    }
    broker_args_str(b->args, req->has_final && req->final ? "1" : "0");
    broker_args_int(b->args, (int64_t)req->n_tasks);
    /* A chunk whose tasks all have custom ids is idempotent by itself. Otherwise its index
       and a hash of its content make a retried chunk (lost reply) answer as before instead of
       adding its tasks twice. */
    bool keyed = false;
    for (size_t i = 0; i < req->n_tasks; i++)
        keyed = keyed || !req->tasks[i]->custom_id || !req->tasks[i]->custom_id[0];
    char ck[64] = "";
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; keyed && i < req->n_tasks; i++) {
        size_t n = anvil__task__get_packed_size(req->tasks[i]);
        uint8_t tmp[256], *p = n <= sizeof tmp ? tmp : malloc(n);
        if (!p)
            continue;
        anvil__task__pack(req->tasks[i], p);
        for (size_t k = 0; k < n; k++)
            h = (h ^ p[k]) * 1099511628211ull;
        if (p != tmp)
            free(p);
    }
    if (keyed)
        snprintf(ck, sizeof ck, "%llu:%016llx",
                 (unsigned long long)(req->has_chunk_index ? req->chunk_index : 0),
                 (unsigned long long)h);
    broker_args_str(b->args, ck);
    uint32_t xkinds = 0;
    for (size_t i = 0; i < req->n_tasks; i++) {
        const Anvil__TaskRef *ref = req->tasks[i]->ref;
        if (ref && ref->has_kind && ref->kind > 0 && ref->kind < 32)
            xkinds |= 1u << ref->kind;
    }
    broker_args_int(b->args, xkinds);
    for (size_t i = 0; i < req->n_tasks; i++) {
        Anvil__Task *t = req->tasks[i];
        t->has_index = 0;
        /* a score-only task is stored without its completions: they become its samples */
        size_t n_comp = t->n_completions;
        char **comp = t->completions;
        t->n_completions = 0;
        lens[i] = anvil__task__get_packed_size(t);
        bufs[i] = malloc(lens[i] ? lens[i] : 1);
        if (bufs[i])
            anvil__task__pack(t, bufs[i]);
        t->n_completions = n_comp;
        t->completions = comp;
        if (!bufs[i]) {
            rc = -ENOMEM;
            goto out;
        }
        broker_args_str(b->args, t->custom_id);
        broker_args_bin(b->args, bufs[i], lens[i]);
        broker_args_int(b->args, score_only ? (int64_t)n_comp : t->has_n ? t->n : 0);
        if (score_only && (rc = s_completion_args(b, t, &sbufs, &n_sbufs, &cap_sbufs)) != 0)
            goto out;
    }
    rc = broker_store_call(b->store, b->args, &r);
    if (rc == ANV_EREDIS)
        broker_redis_failed(b, "submit");
    if (rc != 0)
        goto out;
    size_t at = 0; /* create_submit replies {job, existing, accepted, skipped, tasks, xq} */
    if (create) {
        snprintf(job_id, sizeof job_id, "%s", broker_reply_str(r, 0, NULL));
        existing = broker_reply_int(r, 1, 0) == 1;
        if (!existing)
            s_created(b, req->spec, job_id, spec_buf, spec_len);
        at = 2;
    }
    if (strict && (rc = broker_store_wait_durable(b->store, 5000)) != 0)
        goto out;
    int64_t acc = broker_reply_int(r, at, 0), skip = broker_reply_int(r, at + 1, 0);
    broker_job_t *j = zhashx_lookup(b->jobs, job_id);
    if (j && acc > 0) {
        if (score_only)
            j->ready_exec += broker_reply_int(r, at + 3, 0);
        else
            j->ready_fresh += acc;
        j->live = true;
        j->xkinds |= xkinds;
    } else if (!j && acc > 0) {
        broker_sched_load(b, job_id);
    }
    b->m.tasks_accepted += (uint64_t)acc;
    b->m.tasks_skipped += (uint64_t)skip;
    Anvil__Envelope env;
    Anvil__SubmitReply sr = ANVIL__SUBMIT_REPLY__INIT;
    anv_msg_init(&env);
    sr.job_id = job_id;
    sr.has_accepted = sr.has_skipped = sr.has_total_tasks = sr.has_durable = sr.has_existing = 1;
    sr.accepted = (uint64_t)acc;
    sr.skipped = (uint64_t)skip;
    sr.total_tasks = (uint64_t)broker_reply_int(r, at + 2, 0);
    sr.durable = 1;
    sr.existing = existing;
    env.body_case = ANVIL__ENVELOPE__BODY_SUBMIT_REPLY;
    env.submit_reply = &sr;
    s_reply(b, id, rid, &env);
    broker_clients_on_job_events(b, job_id);
out:
    if (rc != 0)
        s_error(b, id, rid, rc, rc == ANV_EPROTO ? "submit needs a spec or a job id" :
                rc == ANV_ETOOBIG ? "chunk or n too large" :
                rc == ANV_EUNSUPPORTED ? "strict durability needs WAITAOF (redis >= 7.2) or "
                                         "appendfsync always" :
                why[0] ? why : broker_store_errstr(b->store));
    for (size_t i = 0; bufs && i < req->n_tasks; i++)
        free(bufs[i]);
    for (size_t i = 0; i < n_sbufs; i++)
        free(sbufs[i]);
    free(sbufs);
    free(bufs);
    free(lens);
    free(spec_buf);
    if (r)
        freeReplyObject(r);
}

/* ---- status ---------------------------------------------------------------------------- */

static Anvil__JobState s_state(const char *s)
{
    static const char *names[] = {"", "submitting", "queued", "running", "done", "cancelled",
                                  "failed"};
    for (int i = 1; i < 7; i++)
        if (!strcmp(s, names[i]))
            return (Anvil__JobState)i;
    return ANVIL__JOB_STATE__JOB_NONE;
}

static const char *s_field(const redisReply *h, const char *name)
{
    for (size_t i = 0; h && h->type == REDIS_REPLY_ARRAY && i + 1 < h->elements; i += 2)
        if (!strcmp(h->element[i]->str, name))
            return h->element[i + 1]->str;
    return NULL;
}

static uint64_t s_u(const redisReply *h, const char *name)
{
    const char *v = s_field(h, name);
    long long x = v ? strtoll(v, NULL, 10) : 0;
    return x > 0 ? (uint64_t)x : 0;
}

/* fills st from the job hash; strings point into h */
int broker_clients_job_status(broker_t *b, const char *job_id, Anvil__JobStatus *st,
                              redisReply **h)
{
    char key[64];
    snprintf(key, sizeof key, "anv:job:%s", job_id);
    const char *argv[] = {"HGETALL", key};
    int rc = broker_store_cmd(b->store, h, 2, argv);
    if (rc != 0)
        return rc;
    if ((*h)->type != REDIS_REPLY_ARRAY || (*h)->elements == 0)
        return ANV_ENOTFOUND;
    const redisReply *r = *h;
    anvil__job_status__init(st);
    st->job_id = (char *)job_id;
    st->name = (char *)s_field(r, "name");
    st->has_state = 1;
    st->state = s_state(s_field(r, "state") ? s_field(r, "state") : "");
#define S_SET(f, v)                                                                                \
    do {                                                                                           \
        st->has_##f = 1;                                                                           \
        st->f = (v);                                                                               \
    } while (0)
    S_SET(tasks, s_u(r, "tasks"));
    S_SET(samples_total, s_u(r, "samples_total"));
    S_SET(generated, s_u(r, "generated"));
    S_SET(scored, s_u(r, "scored"));
    S_SET(failed, s_u(r, "failed"));
    S_SET(dead, s_u(r, "dead"));
    S_SET(correct, s_u(r, "correct"));
    S_SET(tokens, s_u(r, "tokens"));
    S_SET(created_ms, s_u(r, "created_ms"));
    S_SET(priority, (int32_t)strtol(s_field(r, "priority") ? s_field(r, "priority") : "0", NULL, 10));
    S_SET(score, s_u(r, "score") == 1);
    uint64_t fin = s_u(r, "finished_ms"), start = s_u(r, "started_ms");
    if (fin)
        S_SET(finished_ms, fin);
    double el = ((double)(fin ? fin : (uint64_t)anv_wall_ms()) - (double)(start ? start : st->created_ms)) / 1000.0;
    if (el > 0.001) {
        S_SET(tokens_per_s, (double)st->tokens / el);
        S_SET(evals_per_min, (double)st->scored * 60.0 / el);
        uint64_t term = s_u(r, "terminal");
        if (term && !fin && st->samples_total > term)
            S_SET(eta_s, (double)(st->samples_total - term) / ((double)term / el));
    }
    if (st->scored)
        S_SET(pass_rate, (double)st->correct / (double)st->scored);
    if (st->correct) {
        const char *sp = s_field(r, "speedup_sum");
        S_SET(mean_speedup, (sp ? strtod(sp, NULL) : 0) / (double)st->correct);
    }
    broker_job_t *j = zhashx_lookup(b->jobs, job_id);
    S_SET(in_flight, j ? (uint64_t)j->in_flight : 0);
#undef S_SET
    return 0;
}

static void s_on_status(broker_t *b, zframe_t *id, uint64_t rid, Anvil__StatusRequest *req)
{
    char ids[1000][ANV_ID_SIZE];
    size_t n = 0;
    if (req->job_id && req->job_id[0]) {
        if (!s_valid_job_id(req->job_id)) {
            s_error(b, id, rid, ANV_ENOTFOUND, "no such job");
            return;
        }
        snprintf(ids[n++], ANV_ID_SIZE, "%s", req->job_id);
    } else {
        uint32_t limit = req->has_limit && req->limit ? req->limit : 20;
        if (limit > 1000)
            limit = 1000;
        char lim[16];
        snprintf(lim, sizeof lim, "%u", limit - 1);
        const char *argv[] = {"ZREVRANGE", "anv:jobs", "0", lim};
        redisReply *r = NULL;
        if (broker_store_cmd(b->store, &r, 4, argv) != 0) {
            s_error(b, id, rid, ANV_EREDIS, broker_store_errstr(b->store));
            return;
        }
        for (size_t i = 0; i < r->elements && n < limit; i++)
            if (s_valid_job_id(r->element[i]->str))
                snprintf(ids[n++], ANV_ID_SIZE, "%s", r->element[i]->str);
        freeReplyObject(r);
    }
    Anvil__JobStatus *sts = calloc(n + 1, sizeof *sts);
    Anvil__JobStatus **ptrs = calloc(n + 1, sizeof *ptrs);
    redisReply **hs = calloc(n + 1, sizeof *hs);
    size_t k = 0;
    int rc = 0;
    for (size_t i = 0; sts && ptrs && hs && i < n; i++) {
        rc = broker_clients_job_status(b, ids[i], &sts[k], &hs[k]);
        if (rc == 0) {
            ptrs[k] = &sts[k];
            k++;
        } else if (hs[k]) {
            freeReplyObject(hs[k]);
            hs[k] = NULL;
        }
        if (rc != 0 && rc != ANV_ENOTFOUND)
            break;
    }
    if (req->job_id && req->job_id[0] && k == 0)
        s_error(b, id, rid, rc ? rc : ANV_ENOTFOUND,
                rc == ANV_EREDIS ? broker_store_errstr(b->store) : "no such job");
    else {
        Anvil__Envelope env;
        Anvil__StatusReply sr = ANVIL__STATUS_REPLY__INIT;
        anv_msg_init(&env);
        sr.n_jobs = k;
        sr.jobs = ptrs;
        env.body_case = ANVIL__ENVELOPE__BODY_STATUS_REPLY;
        env.status_reply = &sr;
        s_reply(b, id, rid, &env);
    }
    for (size_t i = 0; hs && i < k; i++)
        freeReplyObject(hs[i]);
    free(sts);
    free(ptrs);
    free(hs);
}

/* ---- watch ----------------------------------------------------------------------------- */

/* One entry of a job's event stream holds one event (fields t, s) or a list of samples of the
   same type and detail (field ts = "t:s,t:s,..."). Offsets: a stream id means "after that
   entry"; "<id>.<k>" means "inside entry <id>, after its item k" (from 0). An entry's items
   get the offsets "<id>.0" ... "<id>.<n-2>" and, the last one, "<id>", so a client resumes
   exactly from any event it saw. */
typedef struct {
    const char *id, *type, *detail, *t, *s, *ts;
} s_entry_t;

static void s_entry_parse(const redisReply *e, s_entry_t *x)
{
    memset(x, 0, sizeof *x);
    if (e->type != REDIS_REPLY_ARRAY || e->elements != 2 ||
        e->element[0]->type != REDIS_REPLY_STRING)
        return;
    x->id = e->element[0]->str;
    const redisReply *f = e->element[1];
    x->type = s_field(f, "type");
    x->detail = s_field(f, "d");
    x->t = s_field(f, "t");
    x->s = s_field(f, "s");
    x->ts = s_field(f, "ts");
}

static size_t s_entry_items(const s_entry_t *x)
{
    if (!x->ts)
        return 1;
    size_t n = *x->ts ? 1 : 0;
    for (const char *p = x->ts; *p; p++)
        n += *p == ',';
    return n;
}

/* reads events after `offset`; returns the number read, or -1 on a Redis error */
static int s_answer_watch(broker_t *b, zframe_t *id, uint64_t rid, const char *job_id,
                          const char *offset, uint32_t max_events, bool force)
{
    char key[64], start[64], count[16], inside[48] = "";
    size_t skip = 0;
    snprintf(key, sizeof key, "anv:job:%s:events", job_id);
    const char *dot = offset ? strchr(offset, '.') : NULL;
    if (!offset || !offset[0] || !strcmp(offset, "0")) {
        snprintf(start, sizeof start, "-");
    } else if (dot && dot - offset < (ptrdiff_t)sizeof inside) {
        snprintf(inside, sizeof inside, "%.*s", (int)(dot - offset), offset);
        snprintf(start, sizeof start, "%s", inside);
        skip = (size_t)strtoull(dot + 1, NULL, 10) + 1;
    } else {
        snprintf(start, sizeof start, "(%.60s", offset);
    }
    snprintf(count, sizeof count, "%u", max_events);
    const char *argv[] = {"XRANGE", key, start, "+", "COUNT", count};
    redisReply *r = NULL;
    if (broker_store_cmd(b->store, &r, 6, argv) != 0) {
        s_error(b, id, rid, ANV_EREDIS, broker_store_errstr(b->store));
        return -1;
    }
    size_t ne = r->type == REDIS_REPLY_ARRAY ? r->elements : 0;
    /* count the events first: entries expand into their items */
    size_t n = 0;
    for (size_t i = 0; i < ne && n < max_events; i++) {
        s_entry_t x;
        s_entry_parse(r->element[i], &x);
        size_t k = s_entry_items(&x);
        if (x.id && inside[0] && !strcmp(x.id, inside))
            k = k > skip ? k - skip : 0;
        n += k;
    }
    if (n > max_events)
        n = max_events;
    if (n == 0 && !force) {
        freeReplyObject(r);
        return 0;
    }
    Anvil__Event *evs = calloc(n + 1, sizeof *evs);
    Anvil__Event **ptrs = calloc(n + 1, sizeof *ptrs);
    char (*ids)[64] = calloc(n + 1, 64);
    size_t k = 0;
    for (size_t i = 0; evs && ptrs && ids && i < ne && k < n; i++) {
        s_entry_t x;
        s_entry_parse(r->element[i], &x);
        if (!x.id)
            continue;
        size_t items = s_entry_items(&x);
        size_t first = inside[0] && !strcmp(x.id, inside) ? skip : 0;
        const char *p = x.ts;
        for (size_t it = 0; it < items && k < n; it++) {
            const char *t = x.t, *s = x.s;
            char tb[24], sb[16];
            if (x.ts) { /* "t:s" item `it` of the list */
                size_t tl = strcspn(p, ":,");
                snprintf(tb, sizeof tb, "%.*s", (int)(tl < 23 ? tl : 23), p);
                p += tl;
                size_t sl = *p == ':' ? strcspn(p + 1, ",") : 0;
                snprintf(sb, sizeof sb, "%.*s", (int)(sl < 15 ? sl : 15), *p == ':' ? p + 1 : p);
                p += *p == ':' ? 1 + sl : 0;
                if (*p == ',')
                    p++;
                t = tb;
                s = sb;
            }
            if (it < first)
                continue;
            Anvil__Event *ev = &evs[k];
            anvil__event__init(ev);
            ptrs[k] = ev;
            if (it + 1 == items)
                snprintf(ids[k], 64, "%s", x.id);
            else
                snprintf(ids[k], 64, "%s.%zu", x.id, it);
            ev->id = ids[k];
            ev->type = (char *)x.type;
            ev->detail = (char *)x.detail;
            if (t && *t) {
                ev->has_task_index = 1;
                ev->task_index = strtoull(t, NULL, 10);
            }
            if (s && *s) {
                ev->has_sample_index = 1;
                ev->sample_index = (uint32_t)strtoul(s, NULL, 10);
            }
            k++;
        }
    }
    Anvil__Envelope env;
    Anvil__WatchReply wr = ANVIL__WATCH_REPLY__INIT;
    anv_msg_init(&env);
    wr.n_events = k;
    wr.events = ptrs;
    wr.last_offset = (char *)(k ? evs[k - 1].id : (offset ? offset : ""));
    Anvil__JobStatus st;
    redisReply *h = NULL;
    if (broker_clients_job_status(b, job_id, &st, &h) == 0)
        wr.status = &st;
    env.body_case = ANVIL__ENVELOPE__BODY_WATCH_REPLY;
    env.watch_reply = &wr;
    s_reply(b, id, rid, &env);
    if (h)
        freeReplyObject(h);
    free(evs);
    free(ptrs);
    free(ids);
    freeReplyObject(r);
    return (int)k;
}

static void s_watch_destroy(void **item)
{
    broker_watch_t *w = *item;
    if (w) {
        zframe_destroy(&w->identity);
        free(w);
    }
    *item = NULL;
}

static void s_on_watch(broker_t *b, zframe_t *id, uint64_t rid, Anvil__WatchRequest *req)
{
    if (!s_valid_job_id(req->job_id)) {
        s_error(b, id, rid, ANV_ENOTFOUND, "no such job");
        return;
    }
    uint32_t max = req->has_max_events && req->max_events ? req->max_events : 1000;
    if (max > 10000)
        max = 10000;
    uint32_t block = req->has_block_ms ? req->block_ms : 0;
    if (block > 60000)
        block = 60000;
    int n = s_answer_watch(b, id, rid, req->job_id, req->from_offset, max, block == 0);
    if (n != 0)
        return;
    broker_watch_t *w = calloc(1, sizeof *w);
    if (!w) {
        s_answer_watch(b, id, rid, req->job_id, req->from_offset, max, true);
        return;
    }
    w->identity = zframe_dup(id);
    w->request_id = rid;
    snprintf(w->job_id, sizeof w->job_id, "%s", req->job_id);
    snprintf(w->offset, sizeof w->offset, "%s", req->from_offset ? req->from_offset : "");
    w->max_events = max;
    w->deadline_ms = anv_now_ms() + block;
    zlistx_add_end(b->watches, w);
}

void broker_clients_on_job_events(broker_t *b, const char *job_id)
{
    broker_watch_t *w = zlistx_first(b->watches);
    while (w) {
        void *cur = zlistx_cursor(b->watches);
        bool drop = false;
        if (!strcmp(w->job_id, job_id))
            drop = s_answer_watch(b, w->identity, w->request_id, w->job_id, w->offset,
                                  w->max_events, false) != 0;
        w = zlistx_next(b->watches);
        if (drop)
            zlistx_delete(b->watches, cur);
    }
}

/* ---- results --------------------------------------------------------------------------- */

static bool s_matches(const char *filter, const Anvil__Sample *s, const Anvil__ExecResult *e,
                      bool dead)
{
    if (!filter || !filter[0])
        return true;
    if (!strcasecmp(filter, "dead"))
        return dead;
    const ProtobufCEnumValue *fr =
        protobuf_c_enum_descriptor_get_value(&anvil__finish_reason__descriptor, s->finish_reason);
    if (fr && (!strcasecmp(filter, fr->name) || !strcasecmp(filter, fr->name + 7)))
        return true;
    if (e) {
        const ProtobufCEnumValue *es =
            protobuf_c_enum_descriptor_get_value(&anvil__exec_status__descriptor, e->status);
        if (es && (!strcasecmp(filter, es->name) || !strcasecmp(filter, es->name + 5)))
            return true;
    }
    return false;
}

static void s_on_results(broker_t *b, zframe_t *id, uint64_t rid, Anvil__ResultsRequest *req)
{
    if (!s_valid_job_id(req->job_id)) {
        s_error(b, id, rid, ANV_ENOTFOUND, "no such job");
        return;
    }
    uint32_t page = req->has_page_size && req->page_size ? req->page_size : 100;
    if (page > 1000)
        page = 1000;
    broker_args_reset(b->args, "results");
    broker_args_str(b->args, req->job_id);
    broker_args_str(b->args, req->cursor);
    broker_args_int(b->args, page);
    redisReply *r = NULL;
    if (broker_store_call(b->store, b->args, &r) != 0) {
        s_error(b, id, rid, ANV_EREDIS, broker_store_errstr(b->store));
        return;
    }
    const redisReply *items = r->elements == 3 ? r->element[2] : NULL;
    size_t n = items ? items->elements : 0, k = 0;
    Anvil__SampleResult *res = calloc(n + 1, sizeof *res);
    Anvil__SampleResult **ptrs = calloc(n + 1, sizeof *ptrs);
    Anvil__Sample **samples = calloc(n + 1, sizeof *samples);
    Anvil__ExecResult **execs = calloc(n + 1, sizeof *execs);
    Anvil__Sample *dead = calloc(n + 1, sizeof *dead);
    size_t *keep_tok = calloc(n + 1, sizeof(size_t) * 3);
    for (size_t i = 0; res && ptrs && samples && execs && dead && keep_tok && i < n; i++) {
        const redisReply *it = items->element[i];
        size_t sl, el, dl;
        const char *sb = broker_reply_str(it, 4, &sl), *eb = broker_reply_str(it, 5, &el);
        const char *db = broker_reply_str(it, 6, &dl);
        Anvil__Sample *s = sl ? anvil__sample__unpack(NULL, sl, (const uint8_t *)sb) : NULL;
        Anvil__ExecResult *e = el ? anvil__exec_result__unpack(NULL, el, (const uint8_t *)eb) : NULL;
        samples[i] = s;
        execs[i] = e;
        if (!s) {
            /* dead-lettered before it was generated: report it as an error sample */
            anvil__sample__init(&dead[i]);
            dead[i].job_id = req->job_id;
            dead[i].has_task_index = dead[i].has_sample_index = dead[i].has_finish_reason = 1;
            dead[i].task_index = (uint64_t)broker_reply_int(it, 1, 0);
            dead[i].sample_index = (uint32_t)broker_reply_int(it, 2, 0);
            dead[i].finish_reason = ANVIL__FINISH_REASON__FINISH_ERROR;
            dead[i].error = (char *)(dl ? db : "unreadable stored sample");
        }
        Anvil__Sample *use = s ? s : &dead[i];
        if (!s_matches(req->status, use, e, dl > 0))
            continue;
        if (s && !(req->has_with_tokens && req->with_tokens)) {
            keep_tok[3 * i] = s->n_token_ids;
            keep_tok[3 * i + 1] = s->n_logprobs;
            keep_tok[3 * i + 2] = s->n_prompt_token_ids;
            /* the counts stay when the ids go (proto: set even when the ids are not sent) */
            if (!s->has_n_tokens && s->n_token_ids) {
                s->has_n_tokens = 1;
                s->n_tokens = (uint32_t)s->n_token_ids;
            }
            if (!s->has_n_prompt_tokens && s->n_prompt_token_ids) {
                s->has_n_prompt_tokens = 1;
                s->n_prompt_tokens = (uint32_t)s->n_prompt_token_ids;
            }
            s->n_token_ids = s->n_logprobs = s->n_prompt_token_ids = 0;
        }
        anvil__sample_result__init(&res[k]);
        res[k].sample = use;
        res[k].exec = e;
        ptrs[k] = &res[k];
        k++;
    }
    Anvil__Envelope env;
    Anvil__ResultsReply rr = ANVIL__RESULTS_REPLY__INIT;
    anv_msg_init(&env);
    rr.n_results = k;
    rr.results = ptrs;
    rr.next_cursor = (char *)broker_reply_str(r, 0, NULL);
    rr.has_done = 1;
    rr.done = broker_reply_int(r, 1, 1) == 0;
    env.body_case = ANVIL__ENVELOPE__BODY_RESULTS_REPLY;
    env.results_reply = &rr;
    s_reply(b, id, rid, &env);
    for (size_t i = 0; samples && execs && i < n; i++) {
        if (samples[i] && keep_tok) {
            if (keep_tok[3 * i] || keep_tok[3 * i + 1] || keep_tok[3 * i + 2]) {
                samples[i]->n_token_ids = keep_tok[3 * i];
                samples[i]->n_logprobs = keep_tok[3 * i + 1];
                samples[i]->n_prompt_token_ids = keep_tok[3 * i + 2];
            }
            anvil__sample__free_unpacked(samples[i], NULL);
        }
        if (execs[i])
            anvil__exec_result__free_unpacked(execs[i], NULL);
    }
    free(res);
    free(ptrs);
    free(samples);
    free(execs);
    free(dead);
    free(keep_tok);
    freeReplyObject(r);
}

/* ---- cancel, retry, workers ------------------------------------------------------------ */

static void s_cancel_reply(broker_t *b, zframe_t *id, uint64_t rid, uint64_t cancelled,
                           bool partial, uint64_t n_partial)
{
    Anvil__Envelope env;
    Anvil__CancelReply cr = ANVIL__CANCEL_REPLY__INIT;
    anv_msg_init(&env);
    cr.has_cancelled = 1;
    cr.cancelled = cancelled;
    cr.has_partial = partial;
    cr.partial = n_partial;
    env.body_case = ANVIL__ENVELOPE__BODY_CANCEL_REPLY;
    env.cancel_reply = &cr;
    s_reply(b, id, rid, &env);
}

static void s_cancel_destroy(void **item)
{
    broker_cancel_t *c = *item;
    if (c) {
        zframe_destroy(&c->identity);
        free(c);
    }
    *item = NULL;
}

void broker_clients_cancel_destructor(zlistx_t *list)
{
    zlistx_set_destructor(list, s_cancel_destroy);
}

void broker_clients_on_partial(broker_t *b, const char *job_id, uint64_t n)
{
    for (broker_cancel_t *c = zlistx_first(b->cancels); c; c = zlistx_next(b->cancels))
        if (!strcmp(c->job_id, job_id))
            c->partial += n;
}

void broker_clients_check_cancels(broker_t *b, bool timeouts)
{
    int64_t now = anv_now_ms();
    broker_cancel_t *c = zlistx_first(b->cancels);
    while (c) {
        void *cur = zlistx_cursor(b->cancels);
        const broker_job_t *j = zhashx_lookup(b->jobs, c->job_id);
        bool waiting = j && j->in_flight > 0;
        for (size_t i = 0; !waiting && i < b->n_pending; i++)
            waiting = !strcmp(b->pending[i].job_id, c->job_id); /* not committed yet */
        bool late = timeouts && now >= c->deadline_ms;
        if (late && waiting)
            ANV_JWARN(c->job_id, "cancel: %lld units did not send their partial samples in "
                                 "time; answering without them",
                      (long long)(j ? j->in_flight : 0));
        c = zlistx_next(b->cancels);
        if (!waiting || late) {
            broker_cancel_t *x = zlistx_handle_item(cur);
            s_cancel_reply(b, x->identity, x->request_id, x->cancelled, true, x->partial);
            broker_clients_on_job_events(b, x->job_id);
            zlistx_delete(b->cancels, cur);
        }
    }
}

static void s_on_cancel(broker_t *b, zframe_t *id, uint64_t rid, Anvil__CancelRequest *req)
{
    if (!s_valid_job_id(req->job_id)) {
        s_error(b, id, rid, ANV_ENOTFOUND, "no such job");
        return;
    }
    bool partial = req->has_keep_partial && req->keep_partial;
    broker_commit(b);
    size_t cap = zhashx_size(b->leases) + 1, n = 0;
    broker_lease_t **ls = calloc(cap, sizeof *ls);
    broker_args_reset(b->args, "cancel");
    broker_args_int(b->args, anv_wall_ms());
    broker_args_str(b->args, req->job_id);
    broker_args_str(b->args, partial ? "1" : "0");
    for (broker_lease_t *l = zhashx_first(b->leases); ls && l; l = zhashx_next(b->leases))
        if (!strcmp(l->job_id, req->job_id)) {
            ls[n++] = l;
            broker_args_str(b->args, l->id);
        }
    redisReply *r = NULL;
    int rc = broker_store_call(b->store, b->args, &r);
    if (rc != 0) {
        s_error(b, id, rid, rc, broker_store_errstr(b->store));
        free(ls);
        return;
    }
    uint64_t cancelled = r->type == REDIS_REPLY_INTEGER ? (uint64_t)r->integer : 0;
    freeReplyObject(r);
    broker_job_t *j = zhashx_lookup(b->jobs, req->job_id);
    if (j) {
        j->live = false;
        j->partial = partial;
    }
    /* tell each worker holding units of the job to abandon them; with keep_partial, gen
       workers send back what they have and the gen leases stay until it is in */
    zhashx_t *told = zhashx_new();
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
        broker_worker_t *w = ls[i]->worker;
        bool keep = partial && ls[i]->kind == 'g' && w;
        if (w && !zhashx_lookup(told, w->ident_key)) {
            zhashx_insert(told, w->ident_key, w);
            Anvil__Envelope env;
            Anvil__CancelUnits cu = ANVIL__CANCEL_UNITS__INIT;
            anv_msg_init(&env);
            cu.job_id = req->job_id;
            cu.has_keep_partial = keep;
            cu.keep_partial = keep;
            env.body_case = ANVIL__ENVELOPE__BODY_CANCEL_UNITS;
            env.cancel_units = &cu;
            if (broker_send_worker(b, w, &env) == 0)
                b->m.cancels_sent++;
        }
        if (keep)
            kept++;
        else
            broker_lease_forget(b, ls[i]);
    }
    zhashx_destroy(&told);
    free(ls);
    b->m.jobs_cancelled++;
    ANV_JINFO(req->job_id, "job cancelled: %llu units will not run%s",
              (unsigned long long)cancelled, kept ? ", waiting for partial samples" : "");
    broker_cancel_t *c = kept ? calloc(1, sizeof *c) : NULL;
    if (!c) {
        s_cancel_reply(b, id, rid, cancelled, partial, 0);
        broker_clients_on_job_events(b, req->job_id);
        return;
    }
    c->identity = zframe_dup(id);
    c->request_id = rid;
    snprintf(c->job_id, sizeof c->job_id, "%s", req->job_id);
    c->cancelled = cancelled;
    c->deadline_ms = anv_now_ms() + (req->has_partial_wait_ms ? req->partial_wait_ms : 10000);
    zlistx_add_end(b->cancels, c);
}

static void s_on_retry(broker_t *b, zframe_t *id, uint64_t rid, Anvil__RetryRequest *req)
{
    if (!s_valid_job_id(req->job_id)) {
        s_error(b, id, rid, ANV_ENOTFOUND, "no such job");
        return;
    }
    broker_commit(b); /* results on their way count before the failures are looked at */
    broker_args_reset(b->args, "retry");
    broker_args_int(b->args, anv_wall_ms());
    broker_args_str(b->args, req->job_id);
    broker_args_str(b->args, req->has_failed_only && req->failed_only ? "1" : "0");
    redisReply *r = NULL;
    int rc = broker_store_call(b->store, b->args, &r);
    if (rc != 0) {
        s_error(b, id, rid, rc, broker_store_errstr(b->store));
        return;
    }
    uint64_t n = r->type == REDIS_REPLY_INTEGER ? (uint64_t)r->integer : 0;
    freeReplyObject(r);
    if (n)
        broker_sched_load(b, req->job_id);
    ANV_JINFO(req->job_id, "retry%s: %llu units re-queued",
              req->has_failed_only && req->failed_only ? " of failed samples" : "",
              (unsigned long long)n);
    Anvil__Envelope env;
    Anvil__RetryReply rr = ANVIL__RETRY_REPLY__INIT;
    anv_msg_init(&env);
    rr.has_requeued = 1;
    rr.requeued = n;
    env.body_case = ANVIL__ENVELOPE__BODY_RETRY_REPLY;
    env.retry_reply = &rr;
    s_reply(b, id, rid, &env);
    broker_clients_on_job_events(b, req->job_id);
}

static void s_on_workers(broker_t *b, zframe_t *id, uint64_t rid)
{
    size_t n = zhashx_size(b->by_ident), k = 0;
    Anvil__WorkerInfo *wi = calloc(n + 1, sizeof *wi);
    Anvil__WorkerInfo **ptrs = calloc(n + 1, sizeof *ptrs);
    int64_t now = anv_now_ms();
    for (broker_worker_t *w = zhashx_first(b->by_ident); wi && ptrs && w;
         w = zhashx_next(b->by_ident)) {
        Anvil__WorkerInfo *x = &wi[k];
        anvil__worker_info__init(x);
        x->worker_id = w->id;
        x->has_kind = x->has_gpu_index = x->has_weight_version = x->has_slots = 1;
        x->has_in_flight = x->has_last_seen_s = x->has_outstanding_tokens = 1;
        x->kind = w->kind;
        x->hostname = w->hostname;
        x->gpu_index = w->gpu_index;
        x->gpu_name = w->gpu_name;
        x->model = w->model;
        x->weight_version = w->weight_version;
        x->slots = w->slots;
        x->in_flight = w->in_flight;
        x->state = (char *)(w->last_seen_ms == INT64_MIN ? "dead" :
                            w->in_flight >= w->slots ? "busy" : "ready");
        x->last_seen_s = w->last_seen_ms == INT64_MIN ? -1 : (double)(now - w->last_seen_ms) / 1000.0;
        x->outstanding_tokens = w->outstanding_tokens;
        x->has_free_kv_tokens = w->hb_has_free_kv;
        x->free_kv_tokens = w->hb_free_kv;
        x->has_queued_samples = w->hb_has_queued;
        x->queued_samples = w->hb_queued;
        x->has_credit = 1;
        x->credit = broker_worker_credit(w);
        ptrs[k++] = x;
    }
    Anvil__Envelope env;
    Anvil__WorkersReply wr = ANVIL__WORKERS_REPLY__INIT;
    anv_msg_init(&env);
    wr.n_workers = k;
    wr.workers = ptrs;
    env.body_case = ANVIL__ENVELOPE__BODY_WORKERS_REPLY;
    env.workers_reply = &wr;
    s_reply(b, id, rid, &env);
    free(wi);
    free(ptrs);
}

/* ---- weights --------------------------------------------------------------------------- */

/* anv:weights: the trainer's current version, kept across broker restarts */
static void s_weights_store(broker_t *b, const char *dir)
{
    char v[24], ms[24];
    snprintf(v, sizeof v, "%llu", (unsigned long long)b->weight_version);
    snprintf(ms, sizeof ms, "%lld", (long long)anv_wall_ms());
    const char *argv[] = {"HSET", "anv:weights", "version", v, "updated_ms", ms,
                          "checkpoint_dir", dir ? dir : ""};
    if (broker_store_cmd(b->store, NULL, dir ? 8 : 6, argv) != 0)
        broker_redis_failed(b, "weights");
}

void broker_clients_load_weights(broker_t *b)
{
    const char *argv[] = {"HGET", "anv:weights", "version"};
    redisReply *r = NULL;
    if (broker_store_cmd(b->store, &r, 3, argv) == 0 && r->type == REDIS_REPLY_STRING) {
        broker_weights_seen(b, strtoull(r->str, NULL, 10));
        ANV_INFO("current weight version %llu (from redis)",
                 (unsigned long long)b->weight_version);
    }
    if (r)
        freeReplyObject(r);
}

static void s_weights_finish(broker_t *b, int code, const char *msg)
{
    broker_weights_t *u = &b->weights;
    if (code) {
        /* the update did not happen everywhere: the trainer's version stays the old one */
        b->weight_version = u->prev_version;
        b->has_weight_version = u->prev_has;
        if (u->prev_has)
            s_weights_store(b, NULL);
        s_error(b, u->identity, u->request_id, code, msg);
    } else {
        Anvil__Envelope env;
        Anvil__UpdateWeightsReply r = ANVIL__UPDATE_WEIGHTS_REPLY__INIT;
        anv_msg_init(&env);
        double total_ms = (double)(anv_now_ms() - u->started_ms);
        r.has_version = r.has_workers = r.has_seconds = r.has_control_ms = 1;
        r.version = u->version;
        r.workers = u->loaded;
        r.seconds = u->slowest_s;
        r.control_ms = total_ms - u->slowest_s * 1000.0 > 0 ? total_ms - u->slowest_s * 1000.0 : 0;
        env.body_case = ANVIL__ENVELOPE__BODY_UPDATE_WEIGHTS_REPLY;
        env.update_weights_reply = &r;
        s_reply(b, u->identity, u->request_id, &env);
        ANV_INFO("weights v%llu loaded on %u gen workers (slowest %.3f s)",
                 (unsigned long long)u->version, u->loaded, u->slowest_s);
    }
    zframe_destroy(&u->identity);
    zhashx_destroy(&u->waiting);
    u->active = false;
}

static void s_on_update_weights(broker_t *b, zframe_t *id, uint64_t rid,
                                Anvil__UpdateWeightsRequest *req)
{
    broker_weights_t *u = &b->weights;
    if (u->active) {
        s_error(b, id, rid, ANV_ESTATE, "a weights update is already in progress");
        return;
    }
    memset(u, 0, sizeof *u);
    u->active = true;
    u->identity = zframe_dup(id);
    u->request_id = rid;
    u->version = req->version;
    u->started_ms = anv_now_ms();
    u->deadline_ms = u->started_ms + 30 * 60 * 1000;
    u->waiting = zhashx_new();
    b->m.weights_updates++;
    /* the trainer moved on now: from here, samples are judged against this version (staleness
       bounds); a failed update puts the old one back */
    u->prev_version = b->weight_version;
    u->prev_has = b->has_weight_version;
    b->weight_version = req->version;
    b->has_weight_version = true;
    s_weights_store(b, req->checkpoint_dir);
    for (broker_worker_t *w = zhashx_first(b->by_ident); w; w = zhashx_next(b->by_ident)) {
        if (w->kind != ANVIL__WORKER_KIND__WORKER_GEN)
            continue;
        Anvil__Envelope env;
        Anvil__WeightsUpdate wu = ANVIL__WEIGHTS_UPDATE__INIT;
        anv_msg_init(&env);
        wu.version = req->version;
        wu.checkpoint_dir = req->checkpoint_dir;
        wu.has_policy = req->has_policy;
        wu.policy = req->policy;
        env.body_case = ANVIL__ENVELOPE__BODY_WEIGHTS_UPDATE;
        env.weights_update = &wu;
        if (broker_send_worker(b, w, &env) == 0)
            zhashx_insert(u->waiting, w->id, w);
    }
    if (zhashx_size(u->waiting) == 0)
        s_weights_finish(b, 0, NULL);
}

void broker_clients_on_weights_loaded(broker_t *b, broker_worker_t *w, Anvil__WeightsLoaded *wl)
{
    broker_weights_t *u = &b->weights;
    if (wl->version == w->weight_version || (wl->has_ok && wl->ok))
        w->weight_version = wl->version;
    /* a worker that failed to load reports the version it still runs, not the requested one */
    bool failed = wl->has_ok && !wl->ok;
    if (!u->active || (!failed && wl->version != u->version) || !zhashx_lookup(u->waiting, w->id))
        return;
    zhashx_delete(u->waiting, w->id);
    if (wl->has_ok && !wl->ok) {
        char msg[256];
        snprintf(msg, sizeof msg, "worker '%s' cannot load weights v%llu: %s", w->id,
                 (unsigned long long)u->version, wl->error ? wl->error : "");
        s_weights_finish(b, ANV_EFORMAT, msg);
        return;
    }
    u->loaded++;
    if (wl->has_seconds && wl->seconds > u->slowest_s)
        u->slowest_s = wl->seconds;
    if (zhashx_size(u->waiting) == 0)
        s_weights_finish(b, 0, NULL);
}

/* ---- dispatch ---------------------------------------------------------------------------- */

void broker_clients_on_message(broker_t *b, zframe_t *id, Anvil__Envelope *env)
{
    uint64_t rid = env->request_id;
    b->m.client_requests++;
    switch (env->body_case) {
    case ANVIL__ENVELOPE__BODY_SUBMIT:
        s_on_submit(b, id, rid, env->submit);
        break;
    case ANVIL__ENVELOPE__BODY_STATUS:
        s_on_status(b, id, rid, env->status);
        break;
    case ANVIL__ENVELOPE__BODY_WATCH:
        s_on_watch(b, id, rid, env->watch);
        break;
    case ANVIL__ENVELOPE__BODY_RESULTS:
        s_on_results(b, id, rid, env->results);
        break;
    case ANVIL__ENVELOPE__BODY_CANCEL:
        s_on_cancel(b, id, rid, env->cancel);
        break;
    case ANVIL__ENVELOPE__BODY_RETRY:
        s_on_retry(b, id, rid, env->retry);
        break;
    case ANVIL__ENVELOPE__BODY_WORKERS:
        s_on_workers(b, id, rid);
        break;
    case ANVIL__ENVELOPE__BODY_UPDATE_WEIGHTS:
        s_on_update_weights(b, id, rid, env->update_weights);
        break;
    default:
        b->m.client_unhandled++;
        ANV_WARN("client sent '%s', which is not a request", anv_msg_body_name(env));
        s_error(b, id, rid, ANV_EUNSUPPORTED, "not a client request");
        break;
    }
}

void broker_clients_tick(broker_t *b, int64_t now_ms)
{
    broker_watch_t *w = zlistx_first(b->watches);
    while (w) {
        void *cur = zlistx_cursor(b->watches);
        bool drop = now_ms >= w->deadline_ms;
        if (drop)
            s_answer_watch(b, w->identity, w->request_id, w->job_id, w->offset, w->max_events,
                           true);
        w = zlistx_next(b->watches);
        if (drop)
            zlistx_delete(b->watches, cur);
    }
    if (b->weights.active && now_ms >= b->weights.deadline_ms)
        s_weights_finish(b, ANV_ETIMEOUT, "gen workers did not report the new weights in time");
    else if (b->weights.active && zhashx_size(b->weights.waiting) == 0)
        s_weights_finish(b, 0, NULL);
}

void broker_clients_watch_destructor(zlistx_t *list)
{
    zlistx_set_destructor(list, s_watch_destroy);
}

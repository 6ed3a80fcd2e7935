/*  broker_dispatch.c - leasing units to workers and committing their results.

    Dispatch round, per unit kind: add up the credit of the workers of that kind, share it out
    between jobs by weighted fair share (broker_sched.c), lease that many units with ONE script
    call, then send each unit to a worker: gen units to the worker with the fewest outstanding
    tokens (remaining samples x max_tokens of its units), exec units to the one with the most
    free slots. A unit that cannot be sent (full pipe, worker gone) is released at once
    without counting an attempt. Never more units are in flight at a worker than its credit,
    which for a gen worker also follows its free KV (broker_worker_credit).

    Results are queued as they arrive and committed in one script call per loop iteration
    (broker_commit); while Redis is unreachable they stay queued and nothing is lost: the
    worker's credit is returned only in memory, the unit's lease stays in Redis until the
    commit lands. Idempotency is by (job, task, sample) in the script.
*/
#include "anv_error.h"
#include "anv_log.h"
#include "anv_time.h"
#include "broker_internal.h"
#include "broker_wire.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

bool broker_redis_usable(broker_t *b)
{
    return anv_now_ms() >= b->redis_retry_ms;
}

void broker_redis_failed(broker_t *b, const char *what)
{
    /* at most one line a second per operation: one shared limit let the renewals' lines hide
       that a commit failed (results held in memory), which tests and operators look for */
    static struct {
        const char *what;
        int64_t last;
    } seen[16];
    b->m.redis_errors++;
    b->redis_retry_ms = anv_now_ms() + 200;
    int64_t now = anv_now_ms();
    size_t i = 0;
    while (i < 16 && seen[i].what && strcmp(seen[i].what, what) != 0)
        i++;
    if (i == 16)
        i = 15; /* more operations than slots: the last one is shared */
    if (!seen[i].what || now - seen[i].last >= 1000) {
        seen[i].what = what;
        seen[i].last = now;
        ANV_ERROR("redis %s failed: %s (retrying)", what, broker_store_errstr(b->store));
    }
}

bool broker_lease_parse(const char *id, char *kind, char job[ANV_ID_SIZE], uint64_t *task,
                        uint32_t *sample, uint32_t *attempt)
{
    if (!id || (id[0] != 'g' && id[0] != 'e') || id[1] != '.')
        return false;
    const char *p = id + 2, *dot = strchr(p, '.');
    if (!dot || dot - p != ANV_ID_LEN)
        return false;
    memcpy(job, p, ANV_ID_LEN);
    job[ANV_ID_LEN] = 0;
    char *end;
    unsigned long long v[4];
    int want = id[0] == 'g' ? 3 : 4;
    p = dot + 1;
    for (int i = 0; i < want; i++) {
        if (*p < '0' || *p > '9')
            return false;
        v[i] = strtoull(p, &end, 10);
        if (i < want - 1 && *end != '.')
            return false;
        p = end + 1;
    }
    if (*end != 0)
        return false;
    *kind = id[0];
    *task = v[0];
    *sample = id[0] == 'e' ? (uint32_t)v[1] : 0;
    *attempt = (uint32_t)(id[0] == 'e' ? v[2] : v[1]);
    return true;
}

void broker_on_released(broker_t *b, const redisReply *r, size_t at)
{
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements < at + 2)
        return;
    const redisReply *done = r->element[at + 1], *touched = r->element[at];
    for (size_t i = 0; done->type == REDIS_REPLY_ARRAY && i < done->elements; i++) {
        broker_job_t *j = zhashx_lookup(b->jobs, broker_reply_str(done, i, NULL));
        b->m.jobs_done++;
        if (j) {
            j->live = false;
            ANV_JINFO(j->id, "job done (its last units were dead-lettered)");
        }
    }
    for (int pass = 0; pass < 2; pass++) {
        const redisReply *l = pass ? done : touched;
        for (size_t i = 0; l->type == REDIS_REPLY_ARRAY && i < l->elements; i++)
            broker_clients_on_job_events(b, broker_reply_str(l, i, NULL));
    }
}

int broker_release(broker_t *b, const char *const *ids, size_t n, bool penalty, bool fatal,
                   const char *why)
{
    if (!n)
        return 0;
    broker_commit(b); /* results of these units that are queued go first */
    broker_args_reset(b->args, "release");
    broker_args_int(b->args, anv_wall_ms());
    broker_args_str(b->args, penalty ? "1" : "0");
    broker_args_str(b->args, fatal ? "1" : "0");
    broker_args_str(b->args, why);
    broker_args_int(b->args, (int64_t)n);
    for (size_t i = 0; i < n; i++)
        broker_args_str(b->args, ids[i]);
    redisReply *r = NULL;
    int rc = broker_store_call(b->store, b->args, &r);
    if (rc != 0) {
        broker_redis_failed(b, "release");
        return rc;
    }
    b->m.units_requeued += (uint64_t)broker_reply_int(r, 0, 0);
    b->m.units_dead += (uint64_t)broker_reply_int(r, 1, 0);
    broker_on_released(b, r, 3);
    freeReplyObject(r);
    /* ready counts changed: learn them on the next lease call */
    for (size_t i = 0; i < n; i++) {
        char kind, job[ANV_ID_SIZE];
        uint64_t t;
        uint32_t s, a;
        if (broker_lease_parse(ids[i], &kind, job, &t, &s, &a)) {
            broker_job_t *j = zhashx_lookup(b->jobs, job);
            if (j && kind == 'g')
                j->ready_retry++;
            else if (j)
                j->ready_exec++;
        }
    }
    return 0;
}

/* effective sampling: the job's, with the task's fields where it sets them */
static void s_merge_sampling(Anvil__SamplingParams *out, const Anvil__SamplingParams *job,
                             const Anvil__SamplingParams *task)
{
    anvil__sampling_params__init(out);
    const Anvil__SamplingParams *src[2] = {job, task};
    for (int i = 0; i < 2; i++) {
        const Anvil__SamplingParams *s = src[i];
        if (!s)
            continue;
#define S_TAKE(f)                                                                                  \
    if (s->has_##f) {                                                                              \
        out->has_##f = 1;                                                                          \
        out->f = s->f;                                                                             \
    }
        S_TAKE(temperature)
        S_TAKE(top_p)
        S_TAKE(top_k)
        S_TAKE(min_p)
        S_TAKE(max_tokens)
        S_TAKE(seed)
        S_TAKE(logprobs)
        S_TAKE(top_logprobs)
#undef S_TAKE
        if (s->n_stop) {
            out->n_stop = s->n_stop;
            out->stop = s->stop;
        }
        if (s->n_stop_token_ids) {
            out->n_stop_token_ids = s->n_stop_token_ids;
            out->stop_token_ids = s->stop_token_ids;
        }
    }
}

static uint64_t s_fnv(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

static broker_worker_t *s_pick_worker(broker_t *b, Anvil__WorkerKind kind,
                                      const broker_job_t *job)
{
    broker_worker_t *best = NULL;
    for (broker_worker_t *w = zhashx_first(b->by_ident); w; w = zhashx_next(b->by_ident)) {
        if (w->kind != kind || broker_worker_credit(w) == 0 || !broker_worker_fits(b, w, job))
            continue;
        if (!best)
            best = w;
        else if (kind == ANVIL__WORKER_KIND__WORKER_GEN) {
            if (w->outstanding_tokens < best->outstanding_tokens ||
                (w->outstanding_tokens == best->outstanding_tokens &&
                 broker_worker_credit(w) > broker_worker_credit(best)))
                best = w;
        } else if (broker_worker_credit(w) > broker_worker_credit(best)) {
            best = w;
        }
    }
    return best;
}

typedef struct {
    const char *kind, *job, *lease, *samples, *task_b, *sample_b;
    size_t task_len, sample_len;
    uint64_t task;
    uint32_t n, attempt, sample;
} s_unit_t;

static bool s_unit_from(const redisReply *u, size_t i, s_unit_t *x)
{
    x->kind = broker_reply_str(u, i, NULL);
    x->job = broker_reply_str(u, i + 1, NULL);
    x->lease = broker_reply_str(u, i + 2, NULL);
    x->task = (uint64_t)broker_reply_int(u, i + 3, 0);
    x->samples = broker_reply_str(u, i + 4, NULL);
    x->sample = (uint32_t)broker_reply_int(u, i + 4, 0);
    x->n = (uint32_t)broker_reply_int(u, i + 5, 1);
    x->attempt = (uint32_t)broker_reply_int(u, i + 6, 1);
    x->task_b = broker_reply_str(u, i + 7, &x->task_len);
    x->sample_b = broker_reply_str(u, i + 8, &x->sample_len);
    return x->lease[0] != 0;
}

/* the sample indices of a gen unit: "" = 0..n-1, else a csv list; returns the count or 0 */
static uint32_t s_indices(const s_unit_t *x, uint32_t *buf, uint32_t cap, uint32_t **out)
{
    uint32_t n = x->n ? x->n : 1;
    if (x->samples[0]) {
        n = 1;
        for (const char *p = x->samples; *p; p++)
            n += *p == ',';
    }
    uint32_t *idx = n <= cap ? buf : calloc(n, sizeof *idx);
    if (!idx)
        return 0;
    if (x->samples[0]) {
        const char *p = x->samples;
        for (uint32_t k = 0; k < n; k++) {
            idx[k] = (uint32_t)strtoul(p, (char **)&p, 10);
            if (*p == ',')
                p++;
        }
    } else {
        for (uint32_t k = 0; k < n; k++)
            idx[k] = k;
    }
    *out = idx;
    return n;
}

/* Gen units of tasks without their own sampling go out hand-encoded (broker_wire.h), the
   stored task bytes copied as they are. Returns 1 when it did not apply (take the slow path),
   else what the send returned. */
static int s_send_gen_fast(broker_t *b, broker_worker_t *w, broker_job_t *job,
                           const s_unit_t *x, uint32_t *n_samples)
{
    if (!job || !job->spec ||
        broker_wire_has_field((const uint8_t *)x->task_b, x->task_len, 6) != 0)
        return 1; /* sampling to merge, or a task the slow path must judge */
    const Anvil__JobSpec *spec = job->spec;
    const Anvil__SamplingParams *sp = spec->sampling;
    uint32_t idx_buf[64], *idx = NULL;
    uint32_t n = s_indices(x, idx_buf, 64, &idx);
    if (!n)
        return -ENOMEM;
    broker_wire_gen_t u = {
        .lease_id = x->lease,
        .job_id = x->job,
        .task = (const uint8_t *)x->task_b,
        .task_len = x->task_len,
        .task_index = x->task,
        .sampling = job->sampling_pb,
        .sampling_len = job->sampling_len,
        .samples = idx,
        .n_samples = n,
        .base_seed = (sp && sp->has_seed ? sp->seed : s_fnv(x->job)) +
                     x->task * 0x9E3779B97F4A7C15ull,
        .lease_ms = (uint64_t)b->cfg.lease_ms,
        .attempt = x->attempt,
        .chat = spec->has_chat ? spec->chat : 1,
        .has_max_weight_lag = spec->has_max_weight_lag,
        .max_weight_lag = spec->max_weight_lag,
    };
    size_t len;
    uint8_t *buf = broker_wire_gen_unit(&u, &len);
    if (idx != idx_buf)
        free(idx);
    if (!buf)
        return -ENOMEM;
    *n_samples = n;
    return broker_send_worker_raw(b, w, buf, len);
}

/* builds and sends one unit; returns 0, or an error after which the unit must be released */
static int s_send_unit(broker_t *b, broker_worker_t *w, broker_job_t *job, const s_unit_t *x,
                       uint32_t *n_samples, const char **why)
{
    if (x->kind[0] == 'g') {
        int fast = s_send_gen_fast(b, w, job, x, n_samples);
        if (fast != 1) {
            if (fast != 0)
                *why = fast == -EAGAIN ? "worker pipe full" : "worker unreachable";
            return fast;
        }
    }
    Anvil__Task *task = anvil__task__unpack(NULL, x->task_len, (const uint8_t *)x->task_b);
    if (!task) {
        *why = "stored task does not decode";
        return ANV_EFORMAT;
    }
    const Anvil__JobSpec *spec = job ? job->spec : NULL;
    Anvil__Envelope env;
    anv_msg_init(&env);
    int rc = 0;
    uint32_t idx_buf[64], *idx = idx_buf;
    Anvil__Sample *sample = NULL;
    char *whole = NULL;
    if (x->kind[0] == 'g') {
        Anvil__GenUnit gu = ANVIL__GEN_UNIT__INIT;
        Anvil__SamplingParams sp;
        s_merge_sampling(&sp, spec ? spec->sampling : NULL, task->sampling);
        uint32_t n = s_indices(x, idx_buf, 64, &idx);
        if (!n) {
            idx = idx_buf;
            rc = -ENOMEM;
            goto out;
        }
        task->has_index = 1;
        task->index = x->task;
        gu.lease_id = (char *)x->lease;
        gu.job_id = (char *)x->job;
        gu.task = task;
        gu.sampling = &sp;
        gu.n_sample_indices = n;
        gu.sample_indices = idx;
        gu.has_base_seed = 1;
        gu.base_seed = (sp.has_seed ? sp.seed : s_fnv(x->job)) + x->task * 0x9E3779B97F4A7C15ull;
        gu.has_attempt = 1;
        gu.attempt = x->attempt;
        gu.has_lease_ms = 1;
        gu.lease_ms = (uint64_t)b->cfg.lease_ms;
        gu.has_chat = 1;
        gu.chat = spec && spec->has_chat ? spec->chat : 1;
        if (spec && spec->has_max_weight_lag) {
            gu.has_max_weight_lag = 1;
            gu.max_weight_lag = spec->max_weight_lag;
        }
        /* a client resuming an aborted sample: the worker continues from these tokens */
        gu.n_resume_token_ids = task->n_resume_token_ids;
        gu.resume_token_ids = task->resume_token_ids;
        env.body_case = ANVIL__ENVELOPE__BODY_GEN_UNIT;
        env.gen_unit = &gu;
        *n_samples = n;
        rc = broker_send_worker(b, w, &env);
    } else {
        sample = anvil__sample__unpack(NULL, x->sample_len, (const uint8_t *)x->sample_b);
        if (!sample) {
            *why = "stored sample does not decode";
            rc = ANV_EFORMAT;
            goto out;
        }
        Anvil__ExecUnit eu = ANVIL__EXEC_UNIT__INIT;
        eu.lease_id = (char *)x->lease;
        eu.job_id = (char *)x->job;
        eu.has_task_index = 1;
        eu.task_index = x->task;
        eu.has_sample_index = 1;
        eu.sample_index = x->sample;
        eu.ref = task->ref;
        eu.completion = sample->text;
        if (task->resume_text && task->resume_text[0]) {
            /* a resumed sample: its text is the continuation; score the whole completion */
            const char *tail = sample->text ? sample->text : "";
            size_t a = strlen(task->resume_text), t = strlen(tail);
            if (!(whole = malloc(a + t + 1))) {
                rc = -ENOMEM;
                *why = "out of memory";
                goto out;
            }
            memcpy(whole, task->resume_text, a);
            memcpy(whole + a, tail, t + 1);
            eu.completion = whole;
        }
        eu.scoring = spec ? spec->scoring : NULL;
        eu.has_attempt = 1;
        eu.attempt = x->attempt;
        eu.has_lease_ms = 1;
        eu.lease_ms = (uint64_t)b->cfg.lease_ms;
        env.body_case = ANVIL__ENVELOPE__BODY_EXEC_UNIT;
        env.exec_unit = &eu;
        *n_samples = 1;
        rc = broker_send_worker(b, w, &env);
    }
    if (rc != 0)
        *why = rc == -EAGAIN ? "worker pipe full" : "worker unreachable";
out:
    free(whole);
    if (idx != idx_buf)
        free(idx);
    if (sample)
        anvil__sample__free_unpacked(sample, NULL);
    anvil__task__free_unpacked(task, NULL);
    return rc;
}

/* promises one unit of job j to a fitting worker with credit left in this round */
static bool s_reserve(broker_t *b, Anvil__WorkerKind kind, const broker_job_t *j)
{
    broker_worker_t *best = NULL;
    for (broker_worker_t *w = zhashx_first(b->by_ident); w; w = zhashx_next(b->by_ident))
        if (w->kind == kind && w->round_credit > 0 && broker_worker_fits(b, w, j) &&
            (!best || w->round_credit > best->round_credit))
            best = w;
    if (best)
        best->round_credit--;
    return best != NULL;
}

static void s_unblock(broker_t *b)
{
    for (broker_job_t *j = zhashx_first(b->jobs); j; j = zhashx_next(b->jobs))
        j->blocked = false;
}

static void s_dispatch_kind(broker_t *b, int kind)
{
    Anvil__WorkerKind wk = kind == 0 ? ANVIL__WORKER_KIND__WORKER_GEN : ANVIL__WORKER_KIND__WORKER_EXEC;
    int64_t credit = 0;
    for (broker_worker_t *w = zhashx_first(b->by_ident); w; w = zhashx_next(b->by_ident))
        if (w->kind == wk) {
            w->round_credit = broker_worker_credit(w);
            credit += w->round_credit;
        }
    if (credit > b->cfg.batch)
        credit = b->cfg.batch;
    if (credit <= 0)
        return;
    /* share the credit out between jobs, each unit promised to a worker that fits its job
       (model, task kinds); a job no worker with credit fits sits this round out. Tentative
       counts are corrected by the reply. */
    enum { MAXG = 64 };
    broker_job_t *gj[MAXG];
    int64_t gn[MAXG];
    int ng = 0;
    int64_t misses = 0, max_misses = (int64_t)zhashx_size(b->jobs);
    for (int64_t k = 0; k < credit && misses <= max_misses;) {
        broker_job_t *j = broker_sched_pick(b, kind);
        if (!j)
            break;
        if (!s_reserve(b, wk, j)) {
            j->blocked = true;
            misses++;
            continue;
        }
        k++;
        int g = 0;
        while (g < ng && gj[g] != j)
            g++;
        if (g == ng) {
            if (ng == MAXG)
                break;
            gj[ng] = j;
            gn[ng++] = 0;
        }
        gn[g]++;
        broker_sched_charge(b, j, kind);
        if (kind == 0) {
            if (j->ready_retry > 0)
                j->ready_retry--;
            else
                j->ready_fresh--;
        } else {
            j->ready_exec--;
        }
    }
    s_unblock(b);
    if (!ng)
        return;
    broker_args_reset(b->args, "lease");
    broker_args_int(b->args, anv_wall_ms());
    broker_args_int(b->args, b->cfg.lease_ms);
    broker_args_int(b->args, ng);
    for (int g = 0; g < ng; g++) {
        broker_args_str(b->args, gj[g]->id);
        broker_args_str(b->args, kind == 0 ? "g" : "e");
        broker_args_int(b->args, gn[g]);
    }
    redisReply *r = NULL;
    if (broker_store_call(b->store, b->args, &r) != 0) {
        broker_redis_failed(b, "lease");
        for (int g = 0; g < ng; g++) /* undo the tentative counts */
            if (kind == 0)
                gj[g]->ready_fresh += gn[g];
            else
                gj[g]->ready_exec += gn[g];
        return;
    }
    const redisReply *units = r->type == REDIS_REPLY_ARRAY && r->elements == 2 ? r->element[0] : NULL;
    const redisReply *counts = units ? r->element[1] : NULL;
    const char **undeliv = NULL, **fatal = NULL;
    size_t n_und = 0, n_fatal = 0, nu = units ? units->elements / 9 : 0;
    const char *fatal_why = "";
    if (nu) {
        undeliv = calloc(nu, sizeof *undeliv);
        fatal = calloc(nu, sizeof *fatal);
    }
    int64_t now_ns = anv_now_ns();
    for (size_t i = 0; undeliv && fatal && i < nu; i++) {
        s_unit_t x;
        if (!s_unit_from(units, i * 9, &x))
            continue;
        broker_job_t *job = zhashx_lookup(b->jobs, x.job);
        broker_worker_t *w = s_pick_worker(b, wk, job);
        const char *why = "no worker with credit";
        uint32_t n_samples = 0;
        int rc = w ? s_send_unit(b, w, job, &x, &n_samples, &why) : -EAGAIN;
        if (rc == ANV_EFORMAT) {
            fatal[n_fatal++] = x.lease;
            fatal_why = why;
            continue;
        }
        if (rc != 0) {
            undeliv[n_und++] = x.lease;
            b->m.units_undeliverable++;
            continue;
        }
        broker_lease_t *l = calloc(1, sizeof *l);
        if (!l)
            continue; /* sent; its lease expires and the result is still recorded */
        snprintf(l->id, sizeof l->id, "%s", x.lease);
        l->kind = x.kind[0];
        snprintf(l->job_id, sizeof l->job_id, "%s", x.job);
        l->job = job;
        l->task = x.task;
        l->sample = x.sample;
        l->attempt = x.attempt;
        l->remaining = n_samples;
        l->tokens_per_sample = job ? job->max_tokens : 0;
        l->sent_ns = now_ns;
        zhashx_update(b->leases, l->id, l);
        broker_lease_attach(l, w);
        if (job)
            job->in_flight++;
        b->m.units_dispatched++;
        if (x.attempt > 1)
            b->m.units_redispatched++;
    }
    /* exact ready counts from Redis (after this call's pops) */
    for (size_t i = 0; counts && i + 4 < counts->elements; i += 5) {
        broker_job_t *j = zhashx_lookup(b->jobs, broker_reply_str(counts, i, NULL));
        if (!j)
            continue;
        const char *st = broker_reply_str(counts, i + 1, NULL);
        j->live = !strcmp(st, "queued") || !strcmp(st, "running");
        j->ready_retry = broker_reply_int(counts, i + 2, 0);
        j->ready_fresh = broker_reply_int(counts, i + 3, 0);
        j->ready_exec = broker_reply_int(counts, i + 4, 0);
    }
    if (n_und)
        broker_release(b, undeliv, n_und, false, false, "undeliverable");
    if (n_fatal)
        broker_release(b, fatal, n_fatal, false, true, fatal_why);
    free(undeliv);
    free(fatal);
    freeReplyObject(r);
}

void broker_dispatch(broker_t *b)
{
    if (!broker_redis_usable(b))
        return;
    /* an idle gen worker that reports its free KV gets one unit first (broker_worker_credit:
       the size of its units is unknown); once that one is held, a second round offers the
       rest now rather than at the next message */
    bool probe = false;
    for (broker_worker_t *w = zhashx_first(b->by_ident); w; w = zhashx_next(b->by_ident))
        if (w->kind == ANVIL__WORKER_KIND__WORKER_GEN && w->hb_has_free_kv && w->in_flight == 0 &&
            w->slots > 1)
            probe = true;
    s_dispatch_kind(b, 0);
    if (probe && broker_redis_usable(b))
        s_dispatch_kind(b, 0);
    if (broker_redis_usable(b))
        s_dispatch_kind(b, 1);
}

static broker_pending_t *s_pending_add(broker_t *b)
{
    if (b->n_pending == b->cap_pending) {
        size_t cap = b->cap_pending ? b->cap_pending * 2 : 1024;
        broker_pending_t *p = realloc(b->pending, cap * sizeof *p);
        if (!p)
            return NULL;
        b->pending = p;
        b->cap_pending = cap;
    }
    broker_pending_t *p = &b->pending[b->n_pending++];
    memset(p, 0, sizeof *p);
    return p;
}

static void s_invalid(broker_t *b, const char *what, const char *lease)
{
    static int64_t last;
    b->m.results_invalid++;
    if (anv_now_ms() - last >= 1000) {
        last = anv_now_ms();
        ANV_WARN("invalid %s for lease '%.96s' ignored", what, lease ? lease : "");
    }
}

/* a unit's sample arrived: update the in-memory lease; true when the unit is complete.
   `dropped`: this sample is not recorded. *redo (may be NULL) is set at the unit's end when
   some sample of it was not recorded: the unit must go back to its queue. */
static bool s_lease_progress(broker_t *b, const char *lease_id, bool last, bool dropped,
                             bool *redo)
{
    broker_lease_t *l = zhashx_lookup(b->leases, lease_id);
    if (redo)
        *redo = dropped;
    if (!l)
        return last;
    l->redo = l->redo || dropped;
    if (l->remaining > 0) {
        l->remaining--;
        if (l->worker) {
            broker_worker_t *w = l->worker;
            w->outstanding_tokens = w->outstanding_tokens > l->tokens_per_sample
                                        ? w->outstanding_tokens - l->tokens_per_sample
                                        : 0;
        }
        if (l->remaining == 0)
            last = true;
    }
    if (last) {
        if (redo)
            *redo = l->redo;
        broker_hist_add(&b->m.unit_rtt, (anv_now_ns() - l->sent_ns) / 1000);
        broker_lease_forget(b, l);
    }
    return last;
}

void broker_on_gen_result(broker_t *b, broker_worker_t *w, Anvil__GenResult *r)
{
    char kind, job[ANV_ID_SIZE];
    uint64_t t;
    uint32_t s, att;
    if (!broker_lease_parse(r->lease_id, &kind, job, &t, &s, &att) || kind != 'g' || !r->sample) {
        s_invalid(b, "gen result", r->lease_id);
        return;
    }
    Anvil__Sample *sm = r->sample;
    const broker_job_t *jb = zhashx_lookup(b->jobs, job);
    bool is_last = r->has_last && r->last, redo = false;
    const char *ids[1] = {r->lease_id};
    /* a job cancelled with keep_partial records whatever its units send back */
    bool partial = jb && jb->partial;
    /* a job with keep_aborted records aborted samples (tokens so far) for the client to resume */
    bool keep = partial || (sm->finish_reason == ANVIL__FINISH_REASON__FINISH_ABORTED && jb &&
                            jb->spec && jb->spec->has_keep_aborted && jb->spec->keep_aborted);
    bool aborted = sm->finish_reason == ANVIL__FINISH_REASON__FINISH_CANCELLED ||
                   sm->finish_reason == ANVIL__FINISH_REASON__FINISH_ABORTED;
    /* beyond the job's staleness bound (its first token is from a version more than
       max_weight_lag behind the current one): generated again on current weights */
    bool stale = !keep && !aborted && sm->finish_reason != ANVIL__FINISH_REASON__FINISH_ERROR &&
                 broker_job_stale(b, jb, sm->has_weight_version ? sm->weight_version : 0);
    if (stale)
        b->m.results_stale++;
    if (stale || (!keep && aborted)) {
        /* not a result: the unit goes back to the queue when it ends */
        b->m.results_discarded++;
        if (s_lease_progress(b, r->lease_id, is_last, true, NULL))
            broker_release(b, ids, 1, false, false,
                           stale ? "stale samples generated again" : "aborted by the worker");
        return;
    }
    broker_pending_t *p = s_pending_add(b);
    if (!p)
        return;
    /* the lease, not the worker, says what this sample is */
    char *wid = sm->worker_id, *jid = sm->job_id; /* the worker's, freed with the message */
    sm->job_id = job;
    sm->has_task_index = 1;
    sm->task_index = t;
    sm->has_attempt = 1;
    sm->attempt = att;
    if (w)
        sm->worker_id = w->id;
    size_t len = anvil__sample__get_packed_size(sm);
    p->payload = malloc(len ? len : 1);
    if (p->payload)
        p->len = anvil__sample__pack(sm, p->payload);
    sm->job_id = jid; /* borrowed pointers must not be freed with the message (NULLing the
                         job id leaked what the worker sent, found by fuzz_broker) */
    sm->worker_id = wid;
    if (!p->payload) {
        b->n_pending--;
        return;
    }
    p->kind = 'g';
    memcpy(p->job_id, job, sizeof p->job_id);
    p->task = t;
    p->sample = sm->sample_index;
    snprintf(p->lease_id, sizeof p->lease_id, "%s", r->lease_id);
    /* second field: 0 generated, 1 failed, 2 aborted and kept (final, not scored), 3 came
       back after a keep_partial cancel (final, not scored) */
    snprintf(p->info, sizeof p->info, "%zu %d", sm->n_token_ids,
             sm->finish_reason == ANVIL__FINISH_REASON__FINISH_ERROR ? 1
             : partial                                               ? 3
             : keep                                                  ? 2
                                                                     : 0);
    p->last = s_lease_progress(b, r->lease_id, is_last, false, &redo);
    if (p->last && redo && !partial) {
        /* an earlier sample of the unit was dropped: the lease is not ended by this result's
           commit but released after it, back to the retry queue (which leases only the
           samples without a record) */
        p->last = false;
        broker_release(b, ids, 1, false, false, "samples of the unit generated again");
    }
}

void broker_on_exec_done(broker_t *b, broker_worker_t *w, Anvil__ExecDone *r)
{
    char kind, job[ANV_ID_SIZE];
    uint64_t t;
    uint32_t s, att;
    if (!broker_lease_parse(r->lease_id, &kind, job, &t, &s, &att) || kind != 'e' || !r->result) {
        s_invalid(b, "exec result", r->lease_id);
        return;
    }
    broker_pending_t *p = s_pending_add(b);
    if (!p)
        return;
    Anvil__ExecResult *er = r->result;
    char *wid = er->worker_id, *jid = er->job_id;
    er->job_id = job;
    er->has_task_index = er->has_sample_index = er->has_attempt = 1;
    er->task_index = t;
    er->sample_index = s;
    er->attempt = att;
    if (w)
        er->worker_id = w->id;
    size_t len = anvil__exec_result__get_packed_size(er);
    p->payload = malloc(len ? len : 1);
    if (p->payload)
        p->len = anvil__exec_result__pack(er, p->payload);
    er->job_id = jid;
    er->worker_id = wid;
    if (!p->payload) {
        b->n_pending--;
        return;
    }
    const ProtobufCEnumValue *ev =
        protobuf_c_enum_descriptor_get_value(&anvil__exec_status__descriptor, er->status);
    p->kind = 'e';
    memcpy(p->job_id, job, sizeof p->job_id);
    p->task = t;
    p->sample = s;
    snprintf(p->lease_id, sizeof p->lease_id, "%s", r->lease_id);
    snprintf(p->info, sizeof p->info, "%d %.6g %s",
             er->status == ANVIL__EXEC_STATUS__EXEC_CORRECT ? 1 : 0,
             er->has_speedup ? er->speedup : 0.0, ev ? ev->name : "EXEC_NONE");
    p->last = true;
    s_lease_progress(b, r->lease_id, true, false, NULL);
}

void broker_on_unit_failed(broker_t *b, broker_worker_t *w, Anvil__UnitFailed *r)
{
    char kind, job[ANV_ID_SIZE];
    uint64_t t;
    uint32_t s, att;
    if (!broker_lease_parse(r->lease_id, &kind, job, &t, &s, &att)) {
        s_invalid(b, "unit failure", r->lease_id);
        return;
    }
    bool retryable = !r->has_retryable || r->retryable;
    /* a unit handed back for the worker's own reasons is not the unit's failure: no attempt
       is charged (a draining worker's hand-backs used up attempts and dead-lettered units) */
    bool handed_back = r->has_handed_back && r->handed_back && retryable;
    ANV_JINFO(job, "unit '%s' %s worker '%s' (%s): %s", r->lease_id,
              handed_back ? "handed back by" : "failed on", w ? w->id : "?",
              retryable ? "retryable" : "fatal", r->error ? r->error : "");
    if (!handed_back)
        b->m.units_failed++;
    broker_lease_t *l = zhashx_lookup(b->leases, r->lease_id);
    if (l)
        broker_lease_forget(b, l);
    const char *ids[1] = {r->lease_id};
    broker_release(b, ids, 1, !handed_back, !retryable, r->error ? r->error : "unit failed");
}

/* The arguments of one "complete" call for pending[from .. from+k): results grouped by (job,
   kind), in arrival order within a group. Returns false when memory ran out. */
static bool s_complete_args(broker_t *b, size_t from, size_t k)
{
    size_t *next = malloc(k * sizeof *next), *head = malloc(k * sizeof *head);
    size_t *tail = malloc(k * sizeof *tail), *count = malloc(k * sizeof *count);
    zhashx_t *by = zhashx_new();
    size_t ng = 0, last = SIZE_MAX;
    bool ok = next && head && tail && count && by;
    for (size_t i = 0; ok && i < k; i++) {
        const broker_pending_t *p = &b->pending[from + i];
        char key[ANV_ID_SIZE + 2];
        key[0] = p->kind;
        memcpy(key + 1, p->job_id, ANV_ID_SIZE);
        size_t g;
        if (last != SIZE_MAX && b->pending[from + head[last]].kind == p->kind &&
            !strcmp(b->pending[from + head[last]].job_id, p->job_id)) {
            g = last; /* results come in runs of one job */
        } else {
            uintptr_t v = (uintptr_t)zhashx_lookup(by, key);
            if (v) {
                g = v - 1;
            } else {
                g = ng++;
                head[g] = i;
                tail[g] = SIZE_MAX;
                count[g] = 0;
                zhashx_insert(by, key, (void *)(uintptr_t)(g + 1));
            }
        }
        next[i] = SIZE_MAX;
        if (tail[g] != SIZE_MAX)
            next[tail[g]] = i;
        tail[g] = i;
        count[g]++;
        last = g;
    }
    if (ok) {
        broker_args_reset(b->args, "complete");
        broker_args_int(b->args, anv_wall_ms());
        broker_args_int(b->args, (int64_t)ng);
        for (size_t g = 0; g < ng; g++) {
            const broker_pending_t *h = &b->pending[from + head[g]];
            broker_args_str(b->args, h->job_id);
            broker_args_str(b->args, h->kind == 'g' ? "g" : "e");
            broker_args_int(b->args, (int64_t)count[g]);
            for (size_t i = head[g]; i != SIZE_MAX; i = next[i]) {
                const broker_pending_t *p = &b->pending[from + i];
                broker_args_int(b->args, (int64_t)p->task);
                broker_args_int(b->args, p->sample);
                broker_args_str(b->args, p->last ? p->lease_id : "");
                broker_args_bin(b->args, p->payload, p->len);
                broker_args_str(b->args, p->info);
            }
        }
    }
    zhashx_destroy(&by);
    free(next);
    free(head);
    free(tail);
    free(count);
    return ok && broker_args_ok(b->args);
}

int broker_commit(broker_t *b)
{
    if (!b->n_pending)
        return 0;
    if (!broker_redis_usable(b))
        return ANV_EREDIS;
    size_t done = 0;
    int rc = 0;
    while (done < b->n_pending) {
        size_t k = b->n_pending - done;
        if (k > (size_t)b->cfg.batch)
            k = (size_t)b->cfg.batch;
        redisReply *r = NULL;
        rc = s_complete_args(b, done, k) ? broker_store_call(b->store, b->args, &r) : -ENOMEM;
        if (rc != 0) {
            b->m.commit_retries++;
            broker_redis_failed(b, "commit");
            break;
        }
        b->m.results_duplicate += (uint64_t)broker_reply_int(r, 0, 0);
        b->m.results_discarded += (uint64_t)broker_reply_int(r, 1, 0);
        b->m.results_invalid += (uint64_t)broker_reply_int(r, 2, 0);
        b->m.results_recorded += k - (uint64_t)broker_reply_int(r, 0, 0) -
                                 (uint64_t)broker_reply_int(r, 1, 0) -
                                 (uint64_t)broker_reply_int(r, 2, 0);
        for (size_t i = 3; i < r->elements; i++) {
            const redisReply *e = r->element[i];
            const char *jid = broker_reply_str(e, 0, NULL);
            broker_job_t *j = zhashx_lookup(b->jobs, jid);
            bool fin = broker_reply_int(e, 1, 0) == 1;
            if (fin) {
                b->m.jobs_done++;
                ANV_JINFO(jid, "job done");
            }
            b->m.samples_generated += (uint64_t)broker_reply_int(e, 3, 0);
            b->m.tokens_generated += (uint64_t)broker_reply_int(e, 4, 0);
            b->m.evals_done += (uint64_t)broker_reply_int(e, 5, 0);
            b->m.evals_correct += (uint64_t)broker_reply_int(e, 6, 0);
            /* gen units whose last result came with samples still unrecorded (their earlier
               results died with a previous broker): re-queued for those samples */
            int64_t again = broker_reply_int(e, 7, 0);
            if (again > 0) {
                b->m.units_requeued += (uint64_t)again;
                ANV_JWARN(jid, "%lld unit(s) ended with samples unrecorded: re-queued",
                          (long long)again);
            }
            if (j && j->partial)
                broker_clients_on_partial(b, jid, (uint64_t)broker_reply_int(e, 3, 0));
            if (j) {
                j->ready_exec += broker_reply_int(e, 2, 0);
                j->ready_retry += again;
                if (fin)
                    j->live = false;
            }
            broker_clients_on_job_events(b, jid);
        }
        freeReplyObject(r);
        for (size_t i = done; i < done + k; i++)
            free(b->pending[i].payload);
        done += k;
    }
    if (done) {
        memmove(b->pending, b->pending + done, (b->n_pending - done) * sizeof *b->pending);
        b->n_pending -= done;
    }
    return rc;
}

void broker_hist_add(broker_hist_t *h, int64_t us)
{
    h->sum_us += us > 0 ? (double)us : 0;
    int k = 0;
    while (us > 1 && k < BROKER_HIST_BUCKETS - 1) {
        us >>= 1;
        k++;
    }
    h->n[k]++;
    h->count++;
}

double broker_hist_quantile(const broker_hist_t *h, double q)
{
    if (!h->count)
        return 0;
    uint64_t want = (uint64_t)(q * (double)h->count), seen = 0;
    for (int k = 0; k < BROKER_HIST_BUCKETS; k++) {
        seen += h->n[k];
        if (seen > want)
            return (double)(1ull << (k + 1)); /* the bucket's upper bound, in us */
    }
    return (double)(1ull << BROKER_HIST_BUCKETS);
}

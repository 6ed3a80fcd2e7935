/*  broker_sched.c - the job table and weighted fair share between jobs.

    Stride scheduling per unit kind: each live job has a pass value; the next unit goes to the
    job with ready units and the smallest pass, which then advances by 1/weight. A job's weight
    is 2^priority (priority clamped to [-10, 10]), so priority 1 gets twice the share of
    priority 0, and priority 10 about a thousand times: high priority goes first, yet nothing
    is starved outright, and among equal priorities a ten-task job is served alongside a
    million-task job instead of behind it. A job that had nothing ready re-enters at the
    current virtual time, so idleness earns no burst. Ties go to the older job.
*/
#include "anv_error.h"
#include "anv_log.h"
#include "broker_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

broker_job_t *broker_job_new(const char *id, Anvil__JobSpec *spec, int priority)
{
    broker_job_t *j = calloc(1, sizeof *j);
    if (!j)
        return NULL;
    snprintf(j->id, sizeof j->id, "%s", id);
    j->spec = spec;
    broker_job_set_priority(j, priority);
    j->max_tokens = 1024;
    if (spec && spec->sampling && spec->sampling->has_max_tokens && spec->sampling->max_tokens)
        j->max_tokens = spec->sampling->max_tokens;
    j->created_ms = anv_id_time_ms(id);
    j->sampling_len = spec && spec->sampling ? anvil__sampling_params__get_packed_size(spec->sampling)
                                             : 0;
    j->sampling_pb = malloc(j->sampling_len ? j->sampling_len : 1);
    if (!j->sampling_pb) {
        free(j);
        return NULL;
    }
    if (j->sampling_len)
        anvil__sampling_params__pack(spec->sampling, j->sampling_pb);
    return j;
}

void broker_job_destroy(broker_job_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    if ((*self_p)->spec)
        anvil__job_spec__free_unpacked((*self_p)->spec, NULL);
    free((*self_p)->sampling_pb);
    free(*self_p);
    *self_p = NULL;
}

void broker_job_set_priority(broker_job_t *job, int priority)
{
    if (priority < -10)
        priority = -10;
    if (priority > 10)
        priority = 10;
    job->priority = priority;
    job->weight = ldexp(1.0, priority);
}

int64_t broker_job_ready(const broker_job_t *job, int kind)
{
    if (!job->live)
        return 0;
    return kind == 0 ? job->ready_retry + job->ready_fresh : job->ready_exec;
}

broker_job_t *broker_sched_pick(broker_t *b, int kind)
{
    broker_job_t *best = NULL;
    for (broker_job_t *j = zhashx_first(b->jobs); j; j = zhashx_next(b->jobs)) {
        if (j->blocked || broker_job_ready(j, kind) <= 0)
            continue;
        if (j->pass[kind] < b->vtime[kind])
            j->pass[kind] = b->vtime[kind];
        if (!best || j->pass[kind] < best->pass[kind] ||
            (j->pass[kind] == best->pass[kind] && strcmp(j->id, best->id) < 0))
            best = j;
    }
    return best;
}

void broker_sched_charge(broker_t *b, broker_job_t *job, int kind)
{
    b->vtime[kind] = job->pass[kind];
    job->pass[kind] += 1.0 / job->weight;
}

void broker_sched_gc(broker_t *b)
{
    zlistx_t *gone = NULL;
    for (broker_job_t *j = zhashx_first(b->jobs); j; j = zhashx_next(b->jobs)) {
        if (!j->live && j->in_flight <= 0) {
            if (!gone)
                gone = zlistx_new();
            zlistx_add_end(gone, j->id);
        }
    }
    if (!gone)
        return;
    for (const char *id = zlistx_first(gone); id; id = zlistx_next(gone)) {
        /* leases whose job leaves memory keep working: they are looked up by id */
        for (broker_lease_t *l = zhashx_first(b->leases); l; l = zhashx_next(b->leases))
            if (l->job && !strcmp(l->job->id, id))
                l->job = NULL;
        zhashx_delete(b->jobs, id);
    }
    zlistx_destroy(&gone);
}

static void s_destroy_job(void **item)
{
    broker_job_destroy((broker_job_t **)item);
}

int broker_sched_load(broker_t *b, const char *only)
{
    if (!b->jobs) {
        b->jobs = zhashx_new();
        zhashx_set_destructor(b->jobs, s_destroy_job);
    }
    broker_args_reset(b->args, "load");
    if (only)
        broker_args_str(b->args, only);
    redisReply *r = NULL;
    int rc = broker_store_call(b->store, b->args, &r);
    if (rc != 0)
        return rc;
    size_t loaded = 0;
    for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements; i++) {
        const redisReply *e = r->element[i];
        if (e->type != REDIS_REPLY_ARRAY || e->elements < 10)
            continue;
        const char *id = broker_reply_str(e, 0, NULL);
        const char *state = broker_reply_str(e, 1, NULL);
        size_t spec_len;
        const char *spec_b = broker_reply_str(e, 6, &spec_len);
        Anvil__JobSpec *spec =
            spec_len ? anvil__job_spec__unpack(NULL, spec_len, (const uint8_t *)spec_b) : NULL;
        if (spec_len && !spec)
            ANV_JWARN(id, "stored job spec does not decode; using defaults");
        broker_job_t *j = zhashx_lookup(b->jobs, id);
        bool fresh = !j;
        if (j) {
            /* refresh in place: leases point at it */
            if (spec)
                anvil__job_spec__free_unpacked(spec, NULL);
        } else if (!(j = broker_job_new(id, spec, (int)broker_reply_int(e, 2, 0)))) {
            if (spec)
                anvil__job_spec__free_unpacked(spec, NULL);
            continue;
        }
        j->live = !strcmp(state, "queued") || !strcmp(state, "running");
        int64_t tasks = broker_reply_int(e, 3, 0), cursor = broker_reply_int(e, 4, 0);
        j->ready_fresh = tasks > cursor ? tasks - cursor : 0;
        j->ready_retry = broker_reply_int(e, 7, 0);
        j->ready_exec = broker_reply_int(e, 8, 0);
        j->xkinds = (uint32_t)broker_reply_int(e, 10, 0);
        if (fresh)
            zhashx_insert(b->jobs, j->id, j);
        loaded++;
        if (!only)
            ANV_JINFO(j->id, "restored job: state %s, %lld fresh, %lld retry, %lld exec ready", state,
                  (long long)j->ready_fresh, (long long)j->ready_retry,
                  (long long)j->ready_exec);
    }
    freeReplyObject(r);
    if (!only)
        ANV_INFO("restored %zu live jobs from redis", loaded);
    return 0;
}

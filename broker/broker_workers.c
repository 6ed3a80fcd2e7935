/*  broker_workers.c - the worker side of the broker: registration, credit, liveness.

    Workers are known by the ROUTER identity of their connection (by_ident) and by the id they
    announce in READY (by_id). A READY whose worker id is already known on another identity
    is a reconnect with a stale identity: the same incarnation keeps its leases (new socket,
    same process), another incarnation is a restarted process, whose old leases are released.
    Any other message from an unknown identity is answered with DISCONNECT, which makes the
    client library send READY again (this is how workers re-register after a broker restart);
    results from it are still recorded, since lease ids name their unit.

    Heartbeats carry the worker's held lease ids: unknown ones are adopted (after a broker
    restart) if Redis still has them, and known ones it no longer lists are released once they
    are older than two heartbeat intervals (a unit lost on a dropped connection). A worker
    silent for heartbeat_misses intervals is dead: its leases are released at once, counting
    an attempt, and re-dispatched.
*/
#include "anv_error.h"
#include "anv_log.h"
#include "anv_time.h"
#include "broker_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static void s_ident_key(zframe_t *id, char out[64])
{
    static const char hex[] = "0123456789abcdef";
    size_t n = zframe_size(id);
    const uint8_t *p = zframe_data(id);
    if (n > 31)
        n = 31;
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = hex[p[i] >> 4];
        out[2 * i + 1] = hex[p[i] & 15];
    }
    out[2 * n] = 0;
}

void broker_worker_destroy(broker_worker_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    zframe_destroy(&(*self_p)->identity);
    free(*self_p);
    *self_p = NULL;
}

uint32_t broker_worker_credit(const broker_worker_t *w)
{
    if (w->last_seen_ms == INT64_MIN || w->draining)
        return 0;
    uint32_t c = w->slots > w->in_flight ? w->slots - w->in_flight : 0;
    /* a gen worker with a KV cache (READY says its size) whose heartbeats have not said how
       full it is yet: one unit, not its whole slot count at once */
    if (c && w->kind == ANVIL__WORKER_KIND__WORKER_GEN && w->kv_tokens && !w->hb_has_queued &&
        !w->hb_has_free_kv)
        return w->in_flight == 0 ? 1 : 0;
    if (c && w->hb_has_queued) {
        /* A gen worker that reports its engine's queue (samples without KV): its engine admits
           what its KV holds and preempts when the samples outgrow it, so it is the judge of
           its KV. It gets units while that queue, plus the samples of the units sent since
           that it did not list yet, is shorter than the backlog, so the rest wait in the
           broker's queue for any worker with room rather than in this one's; the worker
           heartbeats at once when its queue runs empty. While it holds nothing the size of a
           unit is unknown: one at a time. */
        if (w->in_flight == 0)
            return 1;
        uint64_t q = (uint64_t)w->hb_queued + w->transit_samples;
        uint64_t backlog = w->backlog ? w->backlog : BROKER_GEN_BACKLOG;
        if (q >= backlog)
            return 0;
        uint64_t per = w->unit_samples ? w->unit_samples : 1;
        uint64_t fit = (backlog - q + per - 1) / per;
        return fit < c ? (uint32_t)fit : c;
    }
    /* A worker that reports only its free KV tokens: the units it holds will still generate
       outstanding_tokens (remaining samples x max_tokens, an upper bound); more units are
       offered only as far as the free KV holds those plus units of their mean size. While it
       holds nothing the size of a unit is unknown: one at a time, and a unit larger than the
       whole cache still goes (the engine reports it). */
    if (c && w->hb_has_free_kv) {
        if (w->in_flight == 0)
            return 1;
        uint64_t per = w->outstanding_tokens / w->in_flight;
        uint64_t fit = w->hb_free_kv > w->outstanding_tokens
                           ? (w->hb_free_kv - w->outstanding_tokens) / (per ? per : 1)
                           : 0;
        if (fit < c)
            c = (uint32_t)fit;
    }
    return c;
}

const char *broker_kind_capability(int kind)
{
    switch (kind) {
    case ANVIL__TASK_KIND__TASK_KIND_KERNELBENCH:
        return "kernelbench";
    case ANVIL__TASK_KIND__TASK_KIND_TRITONBENCH_G:
        return "tritonbench-g";
    case ANVIL__TASK_KIND__TASK_KIND_TRITONBENCH_T:
        return "tritonbench-t";
    default:
        return NULL;
    }
}

/* the last part of a path without trailing slashes: its start and length */
static size_t s_base(const char *path, const char **start)
{
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/')
        n--;
    size_t b = n;
    while (b > 0 && path[b - 1] != '/')
        b--;
    *start = path + b;
    return n - b;
}

/* a job's model names the worker's: equal, or equal last parts (a name vs a checkpoint dir) */
static bool s_model_matches(const char *want, const char *have)
{
    if (!want || !want[0])
        return true;
    if (!strcmp(want, have))
        return true;
    const char *a, *b;
    size_t na = s_base(want, &a), nb = s_base(have, &b);
    return na && na == nb && !memcmp(a, b, na);
}

bool broker_job_stale(const broker_t *b, const broker_job_t *j, uint64_t version)
{
    if (!j || !j->spec || !j->spec->has_max_weight_lag || !b->has_weight_version)
        return false;
    uint64_t lag = j->spec->max_weight_lag;
    return b->weight_version > lag && version < b->weight_version - lag;
}

void broker_weights_seen(broker_t *b, uint64_t v)
{
    if (!b->has_weight_version || v > b->weight_version) {
        b->has_weight_version = true;
        b->weight_version = v;
    }
}

bool broker_worker_fits(const broker_t *b, const broker_worker_t *w, const broker_job_t *j)
{
    if (!j)
        return true;
    if (w->kind == ANVIL__WORKER_KIND__WORKER_GEN)
        /* a worker behind the job's staleness bound would only make samples to throw away */
        return !j->spec || (s_model_matches(j->spec->model, w->model) &&
                            !broker_job_stale(b, j, w->weight_version));
    return w->kinds == 0 || (j->xkinds & ~1u & ~w->kinds) == 0;
}

void broker_lease_attach(broker_lease_t *l, broker_worker_t *w)
{
    l->worker = w;
    l->prev = NULL;
    l->next = w->leases;
    if (w->leases)
        w->leases->prev = l;
    w->leases = l;
    w->in_flight++;
    w->outstanding_tokens += (uint64_t)l->remaining * l->tokens_per_sample;
    /* in transit until a heartbeat lists it (broker_lease_listed) */
    l->transit = l->kind == 'g' ? l->remaining : 0;
    w->transit_samples += l->transit;
    if (l->transit)
        w->unit_samples = l->transit;
}

void broker_lease_listed(broker_lease_t *l)
{
    broker_worker_t *w = l->worker;
    if (w && l->transit) {
        w->transit_samples = w->transit_samples > l->transit ? w->transit_samples - l->transit : 0;
        l->transit = 0;
    }
}

void broker_lease_detach(broker_lease_t *l)
{
    broker_worker_t *w = l->worker;
    if (!w)
        return;
    if (l->prev)
        l->prev->next = l->next;
    else
        w->leases = l->next;
    if (l->next)
        l->next->prev = l->prev;
    l->prev = l->next = NULL;
    if (w->in_flight)
        w->in_flight--;
    uint64_t t = (uint64_t)l->remaining * l->tokens_per_sample;
    w->outstanding_tokens = w->outstanding_tokens > t ? w->outstanding_tokens - t : 0;
    broker_lease_listed(l);
    l->worker = NULL;
}

void broker_lease_forget(broker_t *b, broker_lease_t *l)
{
    broker_lease_detach(l);
    if (l->job && l->job->in_flight > 0)
        l->job->in_flight--;
    zhashx_delete(b->leases, l->id);
}

void broker_worker_release_all(broker_t *b, broker_worker_t *w, bool penalty, const char *why)
{
    size_t n = 0;
    for (broker_lease_t *l = w->leases; l; l = l->next)
        n++;
    if (!n)
        return;
    const char **ids = calloc(n, sizeof *ids);
    broker_lease_t **ls = calloc(n, sizeof *ls);
    if (!ids || !ls) {
        free(ids);
        free(ls);
        return; /* the leases expire in Redis and are re-dispatched then */
    }
    size_t i = 0;
    for (broker_lease_t *l = w->leases; l; l = l->next, i++) {
        ids[i] = l->id;
        ls[i] = l;
    }
    if (broker_release(b, ids, n, penalty, false, why) != 0)
        ANV_WARN("cannot release %zu leases of worker '%s' now; they expire in %lld ms", n, w->id,
                 (long long)b->cfg.lease_ms);
    for (i = 0; i < n; i++)
        broker_lease_forget(b, ls[i]);
    free(ids);
    free(ls);
}

void broker_worker_remove(broker_t *b, broker_worker_t *w)
{
    while (w->leases)
        broker_lease_forget(b, w->leases);
    if (zhashx_lookup(b->by_id, w->id) == w)
        zhashx_delete(b->by_id, w->id);
    if (b->weights.active && b->weights.waiting)
        zhashx_delete(b->weights.waiting, w->id);
    zhashx_delete(b->by_ident, w->ident_key); /* destroys w */
}

static void s_free_buf(void *data, void *hint)
{
    (void)hint;
    free(data);
}

int broker_send_worker_raw(broker_t *b, broker_worker_t *w, uint8_t *buf, size_t len)
{
    /* as anv_msg_send: identity frame, then the message, both non-blocking (ROUTER_MANDATORY
       makes an unroutable or full peer an error on the identity frame) */
    void *zs = zsock_resolve(b->workers_sock);
    int rc = 0;
    if (zmq_send(zs, zframe_data(w->identity), zframe_size(w->identity),
                 ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
        rc = -errno;
    if (rc == 0) {
        zmq_msg_t msg;
        zmq_msg_init_data(&msg, buf, len, s_free_buf, NULL);
        buf = NULL;
        if (zmq_msg_send(&msg, zs, ZMQ_DONTWAIT) < 0) {
            rc = -errno;
            zmq_msg_close(&msg);
        }
    }
    free(buf);
    anv_msg_stats_t *st = &b->st_workers;
    if (rc == 0)
        st->sent++;
    else if (rc == -EAGAIN)
        st->send_again++;
    else if (rc == -EHOSTUNREACH)
        st->send_unroutable++;
    else
        st->send_failed++;
    if (rc == -EHOSTUNREACH) {
        /* its connection is gone: reap it on the next tick, re-dispatching its units */
        if (w->last_seen_ms != INT64_MIN)
            ANV_WARN("worker '%s' is unreachable", w->id);
        w->last_seen_ms = INT64_MIN;
    }
    return rc;
}

int broker_send_worker(broker_t *b, broker_worker_t *w, Anvil__Envelope *env)
{
    env->version = ANVIL_PROTOCOL_VERSION;
    size_t len;
    uint8_t *buf = anv_msg_encode(env, &len);
    if (!buf) {
        b->st_workers.send_failed++;
        return -ENOMEM;
    }
    return broker_send_worker_raw(b, w, buf, len);
}

static void s_send_disconnect(broker_t *b, zframe_t *identity, const char *reason)
{
    Anvil__Envelope env;
    Anvil__Disconnect d = ANVIL__DISCONNECT__INIT;
    anv_msg_init(&env);
    d.reason = (char *)reason;
    env.body_case = ANVIL__ENVELOPE__BODY_DISCONNECT;
    env.disconnect = &d;
    anv_msg_send(b->workers_sock, identity, &env, &b->st_workers);
}

static void s_send_heartbeat(broker_t *b, broker_worker_t *w)
{
    Anvil__Envelope env;
    Anvil__Heartbeat hb = ANVIL__HEARTBEAT__INIT;
    anv_msg_init(&env);
    env.body_case = ANVIL__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    if (broker_send_worker(b, w, &env) == 0)
        b->m.heartbeats_out++;
}

static void s_copy(char *dst, size_t n, const char *src)
{
    snprintf(dst, n, "%s", src ? src : "");
}

static void s_on_ready(broker_t *b, zframe_t *identity, const char *key, Anvil__Ready *r)
{
    if ((r->kind != ANVIL__WORKER_KIND__WORKER_GEN && r->kind != ANVIL__WORKER_KIND__WORKER_EXEC) ||
        !r->worker_id || !r->worker_id[0] || strlen(r->worker_id) >= sizeof ((broker_worker_t *)0)->id) {
        b->m.worker_unhandled++;
        ANV_WARN("refused READY with kind %d and worker id '%.64s'", (int)r->kind,
                 r->worker_id ? r->worker_id : "");
        s_send_disconnect(b, identity, "invalid READY");
        return;
    }
    broker_worker_t *w = zhashx_lookup(b->by_ident, key);
    broker_worker_t *old = zhashx_lookup(b->by_id, r->worker_id);
    if (w && strcmp(w->id, r->worker_id) != 0) {
        /* one connection changing its id: treat as leaving and joining */
        broker_worker_release_all(b, w, false, "worker changed id");
        broker_worker_remove(b, w);
        w = NULL;
    }
    if (!w) {
        w = calloc(1, sizeof *w);
        if (!w)
            return;
        w->identity = zframe_dup(identity);
        s_copy(w->ident_key, sizeof w->ident_key, key);
        s_copy(w->id, sizeof w->id, r->worker_id);
        zhashx_update(b->by_ident, w->ident_key, w);
    }
    if (old && old != w) {
        b->m.stale_identity++;
        if (old->incarnation == r->incarnation) {
            /* same process on a new socket: it still holds its units */
            while (old->leases) {
                broker_lease_t *l = old->leases;
                broker_lease_detach(l);
                broker_lease_attach(l, w);
            }
            ANV_INFO("worker '%s' reconnected on a new connection", r->worker_id);
        } else {
            ANV_WARN("worker '%s' restarted (incarnation %llu -> %llu): releasing its old units",
                     r->worker_id, (unsigned long long)old->incarnation,
                     (unsigned long long)r->incarnation);
            broker_worker_release_all(b, old, true, "worker restarted");
        }
        broker_worker_remove(b, old);
    }
    w->kind = r->kind;
    w->incarnation = r->incarnation;
    s_copy(w->hostname, sizeof w->hostname, r->hostname);
    s_copy(w->gpu_name, sizeof w->gpu_name, r->gpu_name);
    s_copy(w->model, sizeof w->model, r->model);
    w->gpu_index = r->has_gpu_index ? r->gpu_index : -1;
    w->weight_version = r->weight_version;
    if (r->kind == ANVIL__WORKER_KIND__WORKER_GEN)
        broker_weights_seen(b, w->weight_version);
    w->kv_tokens = r->kv_tokens;
    w->kinds = 0;
    for (size_t i = 0; i < r->n_capabilities; i++)
        for (int k = 1; k < 32 && r->capabilities[i]; k++)
            if (broker_kind_capability(k) && !strcmp(r->capabilities[i], broker_kind_capability(k)))
                w->kinds |= 1u << k;
    w->slots = r->has_slots ? r->slots : 1;
    w->backlog = (uint32_t)b->cfg.gen_backlog; /* 0 (unset): BROKER_GEN_BACKLOG */
    if (w->slots > 100000)
        w->slots = 100000;
    w->last_seen_ms = anv_now_ms();
    zhashx_update(b->by_id, w->id, w);
    b->m.workers_ready++;
    ANV_INFO("worker '%s' ready: %s, %u slots, host '%s', gpu %d '%s', model '%s' v%llu", w->id,
             w->kind == ANVIL__WORKER_KIND__WORKER_GEN ? "gen" : "exec", w->slots, w->hostname,
             w->gpu_index, w->gpu_name, w->model, (unsigned long long)w->weight_version);
    s_send_heartbeat(b, w);
}

/* adopt leases a worker says it holds that this broker does not know (it restarted) */
static void s_adopt(broker_t *b, broker_worker_t *w, const char **ids, size_t n)
{
    broker_args_reset(b->args, "renew");
    broker_args_int(b->args, anv_wall_ms());
    broker_args_int(b->args, b->cfg.lease_ms);
    for (size_t i = 0; i < n; i++)
        broker_args_str(b->args, ids[i]);
    redisReply *r = NULL;
    if (!broker_redis_usable(b) || broker_store_call(b->store, b->args, &r) != 0) {
        if (!r)
            broker_redis_failed(b, "renew");
        return;
    }
    for (size_t i = 0; i < n && i < r->elements; i++) {
        if (broker_reply_int(r, i, 0) != 1)
            continue;
        broker_lease_t *l = calloc(1, sizeof *l);
        if (!l)
            break;
        s_copy(l->id, sizeof l->id, ids[i]);
        if (!broker_lease_parse(l->id, &l->kind, l->job_id, &l->task, &l->sample, &l->attempt)) {
            free(l);
            continue;
        }
        l->job = zhashx_lookup(b->jobs, l->job_id);
        l->tokens_per_sample = l->job ? l->job->max_tokens : 0;
        l->remaining = l->kind == 'e' ? 1 : 0; /* unknown for gen: the unit ends with `last` */
        l->sent_ns = anv_now_ns();
        if (l->job)
            l->job->in_flight++;
        zhashx_update(b->leases, l->id, l);
        broker_lease_attach(l, w);
        b->m.leases_adopted++;
    }
    freeReplyObject(r);
}

static void s_on_heartbeat(broker_t *b, broker_worker_t *w, Anvil__Heartbeat *hb)
{
    b->m.heartbeats_in++;
    const char **unknown = NULL;
    size_t n_unknown = 0;
    zhashx_t *listed = NULL;
    if (hb->n_lease_ids) {
        unknown = calloc(hb->n_lease_ids, sizeof *unknown);
        listed = zhashx_new();
    }
    for (size_t i = 0; unknown && listed && i < hb->n_lease_ids; i++) {
        const char *id = hb->lease_ids[i];
        if (!id || strlen(id) >= sizeof ((broker_lease_t *)0)->id)
            continue;
        zhashx_insert(listed, id, (void *)1);
        broker_lease_t *l = zhashx_lookup(b->leases, id);
        if (!l)
            unknown[n_unknown++] = id;
        else {
            if (l->worker != w) {
                broker_lease_detach(l);
                broker_lease_attach(l, w);
            }
            broker_lease_listed(l);
        }
    }
    if (n_unknown)
        s_adopt(b, w, unknown, n_unknown);
    /* units it should hold but does not list: lost in transit */
    int64_t old_ns = anv_now_ns() - 2 * b->cfg.heartbeat_ms * 1000000;
    const char *lost[256];
    broker_lease_t *lost_l[256];
    size_t n_lost = 0;
    for (broker_lease_t *l = w->leases; l && n_lost < 256; l = l->next)
        if (l->sent_ns < old_ns && !(listed && zhashx_lookup(listed, l->id))) {
            lost[n_lost] = l->id;
            lost_l[n_lost++] = l;
        }
    if (n_lost) {
        ANV_WARN("worker '%s' does not hold %zu units it was sent; re-queueing them", w->id,
                 n_lost);
        broker_release(b, lost, n_lost, false, false, "unit lost in transit");
        for (size_t i = 0; i < n_lost; i++)
            broker_lease_forget(b, lost_l[i]);
    }
    if (hb->has_weight_version)
        w->weight_version = hb->weight_version;
    if (hb->has_draining && hb->draining && !w->draining) {
        w->draining = true;
        ANV_INFO("worker '%s' is draining: no new units (%u in flight)", w->id, w->in_flight);
    }
    if (hb->has_tokens_generated)
        w->hb_tokens = hb->tokens_generated;
    if (hb->has_evals_done)
        w->hb_evals = hb->evals_done;
    if (hb->has_free_kv_tokens) {
        w->hb_free_kv = hb->free_kv_tokens;
        w->hb_has_free_kv = true;
    }
    if (hb->has_queued_samples) {
        w->hb_queued = hb->queued_samples;
        w->hb_has_queued = true;
    }
    free(unknown);
    zhashx_destroy(&listed);
}

void broker_workers_on_message(broker_t *b, zframe_t *identity, Anvil__Envelope *env)
{
    char key[64];
    s_ident_key(identity, key);
    if (env->body_case == ANVIL__ENVELOPE__BODY_READY) {
        s_on_ready(b, identity, key, env->ready);
        return;
    }
    broker_worker_t *w = zhashx_lookup(b->by_ident, key);
    if (w)
        w->last_seen_ms = anv_now_ms();
    switch (env->body_case) {
    case ANVIL__ENVELOPE__BODY_GEN_RESULT:
        broker_on_gen_result(b, w, env->gen_result);
        break;
    case ANVIL__ENVELOPE__BODY_EXEC_DONE:
        broker_on_exec_done(b, w, env->exec_done);
        break;
    case ANVIL__ENVELOPE__BODY_UNIT_FAILED:
        broker_on_unit_failed(b, w, env->unit_failed);
        break;
    case ANVIL__ENVELOPE__BODY_HEARTBEAT:
        if (w)
            s_on_heartbeat(b, w, env->heartbeat);
        break;
    case ANVIL__ENVELOPE__BODY_CREDIT:
        if (w && env->credit->has_credits) {
            uint64_t s = (uint64_t)w->slots + env->credit->credits;
            w->slots = s > 100000 ? 100000 : (uint32_t)s;
        }
        break;
    case ANVIL__ENVELOPE__BODY_DISCONNECT:
        if (w) {
            ANV_INFO("worker '%s' disconnected: %s", w->id,
                     env->disconnect->reason ? env->disconnect->reason : "");
            b->m.workers_disconnected++;
            broker_worker_release_all(b, w, false, "worker disconnected");
            broker_worker_remove(b, w);
        }
        return;
    case ANVIL__ENVELOPE__BODY_WEIGHTS_LOADED:
        if (w)
            broker_clients_on_weights_loaded(b, w, env->weights_loaded);
        break;
    default:
        b->m.worker_unhandled++;
        ANV_WARN("ignored '%s' message on the worker socket", anv_msg_body_name(env));
        return;
    }
    if (!w) {
        b->m.workers_unknown++;
        s_send_disconnect(b, identity, "unknown worker: send READY");
    }
}

static void s_renew_all(broker_t *b)
{
    size_t cap = zhashx_size(b->leases);
    if (!cap || !broker_redis_usable(b))
        return;
    broker_lease_t **ls = calloc(cap, sizeof *ls);
    if (!ls)
        return;
    size_t n = 0;
    for (broker_lease_t *l = zhashx_first(b->leases); l && n < cap; l = zhashx_next(b->leases))
        if (l->worker)
            ls[n++] = l;
    for (size_t off = 0; off < n; off += 2000) {
        size_t k = n - off < 2000 ? n - off : 2000;
        broker_args_reset(b->args, "renew");
        broker_args_int(b->args, anv_wall_ms());
        broker_args_int(b->args, b->cfg.lease_ms);
        for (size_t i = 0; i < k; i++)
            broker_args_str(b->args, ls[off + i]->id);
        redisReply *r = NULL;
        if (broker_store_call(b->store, b->args, &r) != 0) {
            broker_redis_failed(b, "renew");
            break;
        }
        for (size_t i = 0; i < k; i++) {
            if (broker_reply_int(r, i, 0) == 1)
                b->m.leases_renewed++;
            else
                broker_lease_forget(b, ls[off + i]); /* expired or cancelled meanwhile */
        }
        freeReplyObject(r);
    }
    free(ls);
}

void broker_workers_tick(broker_t *b, int64_t now_ms)
{
    int64_t dead_after = b->cfg.heartbeat_ms * b->cfg.heartbeat_misses;
    zlistx_t *dead = zlistx_new();
    for (broker_worker_t *w = zhashx_first(b->by_ident); w; w = zhashx_next(b->by_ident)) {
        if (w->last_seen_ms == INT64_MIN || now_ms - w->last_seen_ms > dead_after)
            zlistx_add_end(dead, w);
        else
            s_send_heartbeat(b, w);
    }
    for (broker_worker_t *w = zlistx_first(dead); w; w = zlistx_next(dead)) {
        ANV_WARN("worker '%s' lost (silent for %lld ms): re-dispatching its %u units", w->id,
                 (long long)(w->last_seen_ms == INT64_MIN ? -1 : now_ms - w->last_seen_ms),
                 w->in_flight);
        b->m.workers_lost++;
        broker_worker_release_all(b, w, true, "worker lost");
        broker_worker_remove(b, w);
    }
    zlistx_destroy(&dead);
    s_renew_all(b);
}

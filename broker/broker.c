/*  broker.c - the broker object: sockets, the event loop and its timers.

    One thread. Each loop iteration: poll both ROUTERs (never longer than the next timer),
    drain up to `batch` worker messages, commit the results they carried (one script call),
    serve up to 64 client requests, run one dispatch round, and on the heartbeat timer do the
    periodic work (heartbeats, dead workers, lease renewal and expiry, parked watches,
    counters to anv:broker:metrics). Both sockets use ZMQ_ROUTER_MANDATORY and non-blocking
    sends (anv_msg_send), so an unroutable or full peer is an error the caller handles.
    With keys, both are CURVE servers (ZAP domains "client" and "worker") and the ZAP handler
    (broker_auth) is started before either binds, so no handshake is ever unauthenticated.
    While Redis is unreachable, results stay queued and no unit is leased; the loop keeps
    serving heartbeats so workers stay registered.
*/
#include "anv_curve.h"
#include "anv_error.h"
#include "anv_log.h"
#include "anv_time.h"
#include "broker_auth.h"
#include "broker_http.h"
#include "broker_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void s_observe(broker_t *b, int64_t now_ms);

static zsock_t *s_router(const char *endpoint, const char *what, const anv_curve_t *curve)
{
    zsock_t *s = zsock_new(ZMQ_ROUTER);
    if (!s)
        return NULL;
    if (curve)
        anv_curve_server(curve, s, what); /* the ZAP domain names the socket in refusals */
    zsock_set_router_mandatory(s, 1);
    zsock_set_sndhwm(s, 200000);
    zsock_set_rcvhwm(s, 200000);
    zsock_set_linger(s, 0);
    if (zsock_bind(s, "%s", endpoint) < 0) {
        ANV_ERROR("cannot bind %s socket to '%s': %s", what, endpoint, zmq_strerror(errno));
        zsock_destroy(&s);
        return NULL;
    }
    ANV_INFO("%s socket bound to '%s'%s", what, endpoint, curve ? " (curve)" : "");
    return s;
}

/* Keys and the ZAP handler, or the refusal of plaintext beyond loopback. Runs before anything
   else in broker_new so that a bad key file fails at once, not after waiting for Redis. */
static int s_security(broker_t *b, const broker_config_t *cfg)
{
    bool keys = cfg->curve_secret && *cfg->curve_secret;
    bool allow = cfg->curve_allow && *cfg->curve_allow;
    if (!keys) {
        if (allow) {
            ANV_ERROR("--curve-allow needs --curve-secret (the broker's own key pair)");
            return ANV_ECONFIG;
        }
        const char *eps[2] = {cfg->client_endpoint, cfg->worker_endpoint};
        for (int i = 0; i < 2; i++) {
            if (anv_curve_endpoint_local(eps[i]))
                continue;
            if (!cfg->insecure) {
                ANV_ERROR("refusing to bind '%s' without CURVE keys: it is reachable from other "
                          "hosts. Give --curve-secret and --curve-allow (keys from `anvil keys "
                          "gen`), bind a loopback address, or pass --insecure to serve "
                          "plaintext anyway",
                          eps[i]);
                return ANV_ECONFIG;
            }
            ANV_WARN("--insecure: '%s' serves plaintext without authentication to other hosts",
                     eps[i]);
        }
        return 0;
    }
    if (!allow) {
        ANV_ERROR("--curve-secret needs --curve-allow DIR (the public keys of the clients and "
                  "workers let in)");
        return ANV_ECONFIG;
    }
    char err[512];
    b->curve = anv_curve_new(cfg->curve_secret, NULL, err, sizeof err);
    if (!b->curve) {
        ANV_ERROR("--curve-secret: %s", err);
        return ANV_ECONFIG;
    }
    b->auth = broker_auth_new(cfg->curve_allow);
    if (!b->auth)
        return ANV_ECONFIG;
    ANV_INFO("curve on: broker public key '%s', allow-list '%s'", anv_curve_public_txt(b->curve),
             cfg->curve_allow);
    return 0;
}

static void s_destroy_worker(void **item)
{
    broker_worker_destroy((broker_worker_t **)item);
}

static void s_destroy_lease(void **item)
{
    free(*item);
    *item = NULL;
}

broker_t *broker_new(const broker_config_t *cfg)
{
    broker_t *b = calloc(1, sizeof *b);
    if (!b)
        return NULL;
    b->cfg = *cfg;
    b->cfg.metrics_endpoint = NULL; /* only needed in broker_new */
    b->cfg.curve_secret = b->cfg.curve_allow = NULL;
    b->client_endpoint = strdup(cfg->client_endpoint);
    b->worker_endpoint = strdup(cfg->worker_endpoint);
    b->redis_url = strdup(cfg->redis_url);
    b->cfg.client_endpoint = b->client_endpoint;
    b->cfg.worker_endpoint = b->worker_endpoint;
    b->cfg.redis_url = b->redis_url;
    b->started_ms = anv_wall_ms();
    b->by_ident = zhashx_new();
    b->by_id = zhashx_new();
    b->leases = zhashx_new();
    b->watches = zlistx_new();
    b->cancels = zlistx_new();
    b->args = broker_args_new();
    if (!b->client_endpoint || !b->worker_endpoint || !b->redis_url || !b->by_ident || !b->by_id ||
        !b->leases || !b->watches || !b->cancels || !b->args)
        goto fail;
    if (s_security(b, cfg) != 0)
        goto fail;
    zhashx_set_destructor(b->by_ident, s_destroy_worker);
    zhashx_set_destructor(b->leases, s_destroy_lease);
    broker_clients_watch_destructor(b->watches);
    broker_clients_cancel_destructor(b->cancels);
    b->store = broker_store_new(cfg->redis_url, (int)cfg->redis_timeout_ms);
    if (!b->store)
        goto fail;
    /* the broker cannot serve without its state: wait for Redis for up to 30 s */
    int rc = ANV_EREDIS;
    for (int i = 0; i < 60 && !zsys_interrupted; i++) {
        rc = broker_store_check_durability(b->store, cfg->strict);
        if (rc != ANV_EREDIS)
            break;
        if (i == 0)
            ANV_WARN("waiting for redis at '%s': %s", cfg->redis_url, broker_store_errstr(b->store));
        anv_sleep_ms(500);
    }
    if (rc != 0) {
        ANV_ERROR("redis at '%s': %s", cfg->redis_url, broker_store_errstr(b->store));
        goto fail;
    }
    if (broker_sched_load(b, NULL) != 0) {
        ANV_ERROR("cannot restore state from redis: %s", broker_store_errstr(b->store));
        goto fail;
    }
    broker_clients_load_weights(b);
    b->workers_sock = s_router(cfg->worker_endpoint, "worker", b->curve);
    b->clients = s_router(cfg->client_endpoint, "client", b->curve);
    if (!b->workers_sock || !b->clients)
        goto fail;
    if (cfg->metrics_endpoint && cfg->metrics_endpoint[0]) {
        b->http = broker_http_new(cfg->metrics_endpoint);
        if (!b->http)
            goto fail;
        s_observe(b, anv_now_ms());
    }
    const char *argv[] = {"HSET", "anv:broker:info", "started_ms", "", "pid", ""};
    char ts[24], pid[16];
    snprintf(ts, sizeof ts, "%" PRId64, b->started_ms);
    snprintf(pid, sizeof pid, "%d", (int)getpid());
    argv[3] = ts;
    argv[5] = pid;
    broker_store_cmd(b->store, NULL, 6, argv);
    return b;
fail:
    broker_destroy(&b);
    return NULL;
}

void broker_destroy(broker_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    broker_t *b = *self_p;
    for (size_t i = 0; i < b->n_pending; i++)
        free(b->pending[i].payload);
    free(b->pending);
    zlistx_destroy(&b->watches);
    zlistx_destroy(&b->cancels);
    zhashx_destroy(&b->leases);
    zhashx_destroy(&b->by_id);
    zhashx_destroy(&b->by_ident);
    zhashx_destroy(&b->jobs);
    zframe_destroy(&b->weights.identity);
    zhashx_destroy(&b->weights.waiting);
    broker_args_destroy(&b->args);
    broker_store_destroy(&b->store);
    broker_http_destroy(&b->http); /* stops its thread before the state goes */
    zsock_destroy(&b->clients);
    zsock_destroy(&b->workers_sock);
    broker_auth_destroy(&b->auth); /* after the sockets it guards */
    anv_curve_destroy(&b->curve);
    free(b->client_endpoint);
    free(b->worker_endpoint);
    free(b->redis_url);
    free(b);
    *self_p = NULL;
}

static void s_expire(broker_t *b)
{
    for (int round = 0; round < 20 && broker_redis_usable(b); round++) {
        broker_args_reset(b->args, "expire");
        broker_args_int(b->args, anv_wall_ms());
        broker_args_int(b->args, 1000);
        redisReply *r = NULL;
        if (broker_store_call(b->store, b->args, &r) != 0) {
            broker_redis_failed(b, "expire");
            return;
        }
        const redisReply *ids = r->type == REDIS_REPLY_ARRAY && r->elements == 3 ? r->element[0]
                                                                                  : NULL;
        size_t n = ids && ids->type == REDIS_REPLY_ARRAY ? ids->elements : 0;
        for (size_t i = 0; i < n; i++) {
            const char *id = broker_reply_str(ids, i, NULL);
            char kind, job[ANV_ID_SIZE];
            uint64_t t;
            uint32_t s, a;
            broker_lease_t *l = zhashx_lookup(b->leases, id);
            if (l)
                broker_lease_forget(b, l);
            if (broker_lease_parse(id, &kind, job, &t, &s, &a)) {
                broker_job_t *j = zhashx_lookup(b->jobs, job);
                if (j && kind == 'g')
                    j->ready_retry++;
                else if (j)
                    j->ready_exec++;
            }
        }
        b->m.leases_expired += n;
        if (n)
            ANV_WARN("%zu leases expired and were re-queued", n);
        broker_on_released(b, r, 1);
        freeReplyObject(r);
        if (n < 1000)
            break;
    }
}

/* rates, and a new snapshot for the HTTP endpoint */
static void s_observe(broker_t *b, int64_t now_ms)
{
    broker_observe_tick(b, now_ms);
    if (!b->http)
        return;
    b->m.http_requests = broker_http_requests(b->http);
    size_t ml = 0, sl = 0;
    char *m = broker_observe_metrics(b, &ml);
    char *s = broker_observe_status(b, &sl);
    broker_http_publish(b->http, m, ml, s, sl);
}

static void s_publish_metrics(broker_t *b)
{
    if (!broker_redis_usable(b))
        return;
    const broker_metrics_t *m = &b->m;
    const anv_msg_stats_t *w = &b->st_workers, *c = &b->st_clients;
    struct {
        const char *name;
        uint64_t v;
    } f[] = {
        {"units_dispatched", m->units_dispatched}, {"units_redispatched", m->units_redispatched},
        {"units_undeliverable", m->units_undeliverable}, {"results_recorded", m->results_recorded},
        {"results_duplicate", m->results_duplicate}, {"results_discarded", m->results_discarded},
        {"results_invalid", m->results_invalid}, {"units_failed", m->units_failed},
        {"units_requeued", m->units_requeued}, {"units_dead", m->units_dead},
        {"leases_expired", m->leases_expired}, {"leases_renewed", m->leases_renewed},
        {"leases_adopted", m->leases_adopted}, {"workers_ready", m->workers_ready},
        {"workers_lost", m->workers_lost}, {"workers_disconnected", m->workers_disconnected},
        {"workers_unknown", m->workers_unknown}, {"stale_identity", m->stale_identity},
        {"heartbeats_in", m->heartbeats_in}, {"heartbeats_out", m->heartbeats_out},
        {"jobs_submitted", m->jobs_submitted}, {"tasks_accepted", m->tasks_accepted},
        {"tasks_skipped", m->tasks_skipped}, {"jobs_done", m->jobs_done},
        {"jobs_cancelled", m->jobs_cancelled}, {"client_requests", m->client_requests},
        {"client_errors", m->client_errors}, {"client_unhandled", m->client_unhandled},
        {"worker_unhandled", m->worker_unhandled}, {"redis_errors", m->redis_errors},
        {"commit_retries", m->commit_retries}, {"cancels_sent", m->cancels_sent},
        {"weights_updates", m->weights_updates}, {"redis_calls", broker_store_calls(b->store)},
        {"results_stale", m->results_stale}, {"weight_version", b->weight_version},
        {"worker_msgs_in", w->received}, {"worker_msgs_out", w->sent},
        {"worker_rejected_empty", w->rejected_empty},
        {"worker_rejected_oversize", w->rejected_oversize},
        {"worker_rejected_malformed", w->rejected_malformed},
        {"worker_rejected_version", w->rejected_version},
        {"worker_rejected_frames", w->rejected_frames}, {"worker_send_again", w->send_again},
        {"worker_send_unroutable", w->send_unroutable}, {"worker_send_failed", w->send_failed},
        {"client_msgs_in", c->received}, {"client_msgs_out", c->sent},
        {"client_rejected_empty", c->rejected_empty},
        {"client_rejected_oversize", c->rejected_oversize},
        {"client_rejected_malformed", c->rejected_malformed},
        {"client_rejected_version", c->rejected_version},
        {"client_rejected_frames", c->rejected_frames}, {"client_send_again", c->send_again},
        {"client_send_unroutable", c->send_unroutable}, {"client_send_failed", c->send_failed},
        {"workers", zhashx_size(b->by_ident)}, {"leases_held", zhashx_size(b->leases)},
        {"jobs_in_memory", zhashx_size(b->jobs)}, {"results_queued", b->n_pending},
        {"watches_parked", zlistx_size(b->watches)},
        {"unit_rtt_p50_us", (uint64_t)broker_hist_quantile(&m->unit_rtt, 0.50)},
        {"unit_rtt_p99_us", (uint64_t)broker_hist_quantile(&m->unit_rtt, 0.99)},
    };
    size_t n = sizeof f / sizeof f[0];
    const char *argv[2 + 2 * (sizeof f / sizeof f[0])];
    char vals[sizeof f / sizeof f[0]][24];
    argv[0] = "HSET";
    argv[1] = "anv:broker:metrics";
    for (size_t i = 0; i < n; i++) {
        snprintf(vals[i], sizeof vals[i], "%" PRIu64, f[i].v);
        argv[2 + 2 * i] = f[i].name;
        argv[3 + 2 * i] = vals[i];
    }
    if (broker_store_cmd(b->store, NULL, (int)(2 + 2 * n), argv) != 0)
        broker_redis_failed(b, "metrics");
}

static void s_tick(broker_t *b, int64_t now_ms)
{
    broker_workers_tick(b, now_ms);
    if (broker_redis_usable(b))
        s_expire(b);
    broker_clients_tick(b, now_ms);
    broker_clients_check_cancels(b, true);
    broker_sched_gc(b);
    s_publish_metrics(b);
    s_observe(b, now_ms);
}

static void s_drain(broker_t *b, zsock_t *sock, bool workers, int max)
{
    for (int i = 0; i < max; i++) {
        zframe_t *id = NULL;
        int err = 0;
        Anvil__Envelope *env =
            anv_msg_recv(sock, true, false, (size_t)b->cfg.max_msg, &id,
                         workers ? &b->st_workers : &b->st_clients, &err);
        if (!env) {
            if (err == 0)
                break; /* nothing waiting */
            continue;  /* rejected, counted and logged by anv_msg_recv */
        }
        if (workers)
            broker_workers_on_message(b, id, env);
        else
            broker_clients_on_message(b, id, env);
        anv_msg_free(&env);
        zframe_destroy(&id);
    }
}

int broker_run(broker_t *b)
{
    zmq_pollitem_t items[2] = {{zsock_resolve(b->workers_sock), 0, ZMQ_POLLIN, 0},
                               {zsock_resolve(b->clients), 0, ZMQ_POLLIN, 0}};
    b->next_tick_ms = anv_now_ms() + b->cfg.heartbeat_ms;
    ANV_INFO("broker running");
    while (!zsys_interrupted) {
        int64_t now = anv_now_ms();
        int64_t timeout = b->next_tick_ms - now;
        if (b->n_pending && b->redis_retry_ms - now < timeout)
            timeout = b->redis_retry_ms - now;
        if (timeout < 0)
            timeout = 0;
        if (zmq_poll(items, 2, (long)timeout) < 0) {
            if (errno == EINTR)
                continue;
            ANV_ERROR("poll failed: %s", zmq_strerror(errno));
            break;
        }
        s_drain(b, b->workers_sock, true, (int)b->cfg.batch);
        broker_commit(b);
        if (zlistx_size(b->cancels))
            broker_clients_check_cancels(b, false);
        s_drain(b, b->clients, false, 64);
        broker_dispatch(b);
        now = anv_now_ms();
        if (now >= b->next_tick_ms) {
            s_tick(b, now);
            b->next_tick_ms = now + b->cfg.heartbeat_ms;
        }
    }
    ANV_INFO("broker stopping");
    broker_commit(b);
    s_publish_metrics(b);
    broker_store_log_ops(b->store);
    return 0;
}

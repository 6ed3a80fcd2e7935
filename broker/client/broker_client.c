/*  broker_client.c - worker client: a background thread owns the DEALER.

    The application and the thread talk over two inproc PAIR pipes with no high-water mark:
    "up" carries packed envelopes to send (an empty frame asks the thread to stop) and is
    guarded by a mutex so that any thread may send; "down" carries the packed envelopes the
    worker must handle. The thread decodes what the broker sends (for liveness and lease
    bookkeeping) and forwards the original bytes. Results wait in a local queue while the
    DEALER is gone or its pipe is full; nothing is dropped. The held-lease table and the
    heartbeat counters are shared under the same mutex. With CURVE keys, every DEALER the
    thread makes (again after each reconnect) is a CURVE client of the broker's public key.
*/
#include "broker_client.h"
#include "anv_curve.h"
#include "anv_error.h"
#include "anv_log.h"
#include "anv_msg.h"
#include "anv_time.h"

#include <czmq.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct broker_client_t {
    char *endpoint, *worker_id, *hostname, *gpu_name, *model;
    char *ready_file;         /* NULL = none; written by the thread, removed at destroy */
    bool draining;            /* under lock: heartbeats say so, the broker sends nothing new */
    bool ready_written;       /* thread-owned until the thread is joined */
    char **caps;
    size_t n_caps;
    anv_curve_t *curve;       /* own keys and the broker's public key; NULL = plaintext */
    Anvil__WorkerKind kind;
    int32_t gpu_index;
    uint64_t weight_version, kv_tokens, incarnation;
    uint32_t slots;
    int hb_ms, misses;

    pthread_t thread;
    bool started;
    pthread_mutex_t lock;     /* up_app, held, stats, flags below */
    zsock_t *up_app, *up_thr, *down_app, *down_thr;
    zhashx_t *held;           /* lease id -> job id (strdup) */
    broker_client_stats_t stats;
    bool connected;
    uint64_t reconnects;
    anv_msg_stats_t msg;
};

static char *s_dup(const char *s)
{
    return s ? strdup(s) : NULL;
}

static void s_free_str(void **p)
{
    free(*p);
    *p = NULL;
}

/* ---- thread side ----------------------------------------------------------------------- */

typedef struct {
    zsock_t *dealer;
    zsock_t *monitor;         /* the dealer's handshakes (CURVE only) */
    bool told_handshake;      /* a handshake failure was logged for this dealer */
    zlistx_t *queue;          /* zframe_t * waiting to go to the broker */
    int64_t last_rx_ms, next_hb_ms, reconnect_at_ms, last_ready_ms;
    int64_t backoff_ms;
    bool stop;                /* the application asked the thread to stop */
} s_conn_t;

/* The ready file: the worker id, written once when the broker first answers (a readiness
   probe or a script waits for it). A file that cannot be written is logged, not retried. */
static void s_write_ready(broker_client_t *c)
{
    FILE *f = fopen(c->ready_file, "w");
    bool ok = f && fprintf(f, "%s\n", c->worker_id) > 0;
    if (f && fclose(f) != 0)
        ok = false;
    if (!ok) {
        ANV_WARN("cannot write ready file '%s': %s", c->ready_file, strerror(errno));
        if (f)
            unlink(c->ready_file);
        free(c->ready_file);
        c->ready_file = NULL;
        return;
    }
    c->ready_written = true;
}

static int s_send_env(broker_client_t *c, s_conn_t *k, Anvil__Envelope *env)
{
    if (!k->dealer)
        return -ENOTCONN;
    return anv_msg_send(k->dealer, NULL, env, &c->msg);
}

static void s_send_ready(broker_client_t *c, s_conn_t *k)
{
    Anvil__Envelope env;
    Anvil__Ready r = ANVIL__READY__INIT;
    anv_msg_init(&env);
    r.kind = c->kind;
    r.worker_id = c->worker_id;
    r.hostname = c->hostname;
    r.has_gpu_index = 1;
    r.gpu_index = c->gpu_index;
    r.gpu_name = c->gpu_name;
    r.model = c->model;
    r.has_weight_version = 1;
    r.weight_version = c->weight_version;
    r.has_slots = 1;
    r.slots = c->slots;
    r.has_kv_tokens = 1;
    r.kv_tokens = c->kv_tokens;
    r.has_pid = 1;
    r.pid = (uint32_t)getpid();
    r.n_capabilities = c->n_caps;
    r.capabilities = c->caps;
    r.has_incarnation = 1;
    r.incarnation = c->incarnation;
    env.body_case = ANVIL__ENVELOPE__BODY_READY;
    env.ready = &r;
    s_send_env(c, k, &env);
    k->last_ready_ms = anv_now_ms();
}

static bool s_from_app(broker_client_t *c, s_conn_t *k, int max);

static void s_send_heartbeat(broker_client_t *c, s_conn_t *k)
{
    Anvil__Envelope env;
    Anvil__Heartbeat hb = ANVIL__HEARTBEAT__INIT;
    anv_msg_init(&env);
    pthread_mutex_lock(&c->lock);
    /* broker_client_send drops a lease from `held` and hands the unit's last message to the up
       pipe under this lock: moving everything in the pipe out first (to the DEALER or the
       queue, in order) keeps that message ahead of a heartbeat that no longer lists the lease.
       Otherwise the broker could read the heartbeat first and re-queue the unit as lost in
       transit (seen under load: a finished unit dispatched again) */
    s_from_app(c, k, -1);
    size_t n = zhashx_size(c->held);
    char **ids = n ? calloc(n, sizeof *ids) : NULL;
    size_t i = 0;
    for (void *v = zhashx_first(c->held); ids && v; v = zhashx_next(c->held))
        ids[i++] = strdup(zhashx_cursor(c->held));
    broker_client_stats_t st = c->stats;
    hb.has_draining = c->draining;
    hb.draining = c->draining;
    pthread_mutex_unlock(&c->lock);
    hb.worker_id = c->worker_id;
    hb.has_in_flight = hb.has_free_slots = hb.has_tokens_generated = hb.has_evals_done = 1;
    hb.in_flight = (uint32_t)i;
    hb.free_slots = c->slots > i ? c->slots - (uint32_t)i : 0;
    hb.n_lease_ids = i;
    hb.lease_ids = ids;
    hb.tokens_generated = st.tokens_generated;
    hb.evals_done = st.evals_done;
    if (st.free_kv_tokens) {
        hb.has_free_kv_tokens = 1;
        hb.free_kv_tokens = st.free_kv_tokens;
    }
    hb.has_queued_samples = st.has_queued;
    hb.queued_samples = st.queued_samples;
    hb.has_weight_version = 1;
    hb.weight_version = st.weight_version ? st.weight_version : c->weight_version;
    env.body_case = ANVIL__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    if (zlistx_size(k->queue)) {
        /* results still wait for the DEALER (a full pipe, a reconnect): the heartbeat goes
           behind them, for the same reason as above */
        size_t len;
        uint8_t *buf = anv_msg_encode(&env, &len);
        zframe_t *f = buf ? zframe_new(buf, len) : NULL;
        if (f)
            zlistx_add_end(k->queue, f);
        free(buf);
    } else {
        s_send_env(c, k, &env);
    }
    for (size_t j = 0; j < i; j++)
        free(ids[j]);
    free(ids);
}

static void s_connect(broker_client_t *c, s_conn_t *k)
{
    k->dealer = zsock_new(ZMQ_DEALER);
    if (!k->dealer) {
        k->reconnect_at_ms = anv_now_ms() + k->backoff_ms;
        return;
    }
    if (c->curve) {
        anv_curve_client(c->curve, k->dealer);
        k->monitor = anv_curve_monitor_new(k->dealer);
        k->told_handshake = false;
    }
    zsock_set_linger(k->dealer, 0);
    zsock_set_sndhwm(k->dealer, 100000);
    zsock_set_rcvhwm(k->dealer, 100000);
    if (zsock_connect(k->dealer, "%s", c->endpoint) < 0) {
        ANV_ERROR("cannot connect to broker '%s': %s", c->endpoint, zmq_strerror(errno));
        zsock_destroy(&k->monitor);
        zsock_destroy(&k->dealer);
        k->reconnect_at_ms = anv_now_ms() + k->backoff_ms;
        return;
    }
    k->last_rx_ms = anv_now_ms();
    k->next_hb_ms = anv_now_ms();
    s_send_ready(c, k);
    s_send_heartbeat(c, k);
}

/* sends queued frames until the pipe is full */
static void s_flush(broker_client_t *c, s_conn_t *k)
{
    zframe_t *f;
    while (k->dealer && (f = zlistx_first(k->queue))) {
        if (zmq_send(zsock_resolve(k->dealer), zframe_data(f), zframe_size(f), ZMQ_DONTWAIT) < 0)
            break;
        c->msg.sent++;
        zlistx_delete(k->queue, zlistx_cursor(k->queue));
    }
}

static void s_forget_job(broker_client_t *c, const char *job)
{
    zlistx_t *gone = zlistx_new();
    for (char *j = zhashx_first(c->held); j; j = zhashx_next(c->held))
        if (!job || !strcmp(j, job))
            zlistx_add_end(gone, (void *)zhashx_cursor(c->held));
    for (const char *id = zlistx_first(gone); id; id = zlistx_next(gone))
        zhashx_delete(c->held, id);
    zlistx_destroy(&gone);
}

static void s_from_broker(broker_client_t *c, s_conn_t *k)
{
    for (int i = 0; i < 1000; i++) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, zsock_resolve(k->dealer), ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            return;
        }
        int err;
        Anvil__Envelope *env = anv_msg_decode(zmq_msg_data(&m), zmq_msg_size(&m), 0, &err);
        if (!env) {
            if (err == ANV_EVERSION)
                c->msg.rejected_version++;
            else
                c->msg.rejected_malformed++;
            ANV_WARN("rejected message from the broker: %s", anv_strerror(err));
            zmq_msg_close(&m);
            continue;
        }
        c->msg.received++;
        k->last_rx_ms = anv_now_ms();
        k->backoff_ms = 1000;
        if (c->ready_file && !c->ready_written)
            s_write_ready(c);
        pthread_mutex_lock(&c->lock);
        c->connected = true;
        bool forward = false;
        switch (env->body_case) {
        case ANVIL__ENVELOPE__BODY_GEN_UNIT:
            zhashx_update(c->held, env->gen_unit->lease_id, strdup(env->gen_unit->job_id));
            forward = true;
            break;
        case ANVIL__ENVELOPE__BODY_EXEC_UNIT:
            zhashx_update(c->held, env->exec_unit->lease_id, strdup(env->exec_unit->job_id));
            forward = true;
            break;
        case ANVIL__ENVELOPE__BODY_CANCEL_UNITS: {
            Anvil__CancelUnits *cu = env->cancel_units;
            if (cu->n_lease_ids)
                for (size_t j = 0; j < cu->n_lease_ids; j++)
                    zhashx_delete(c->held, cu->lease_ids[j]);
            else
                s_forget_job(c, cu->job_id ? cu->job_id : "");
            forward = true;
            break;
        }
        case ANVIL__ENVELOPE__BODY_WEIGHTS_UPDATE:
            forward = true;
            break;
        default:
            break;
        }
        pthread_mutex_unlock(&c->lock);
        if (env->body_case == ANVIL__ENVELOPE__BODY_DISCONNECT) {
            /* the broker does not know us (it restarted): register again */
            if (anv_now_ms() - k->last_ready_ms >= 200) {
                ANV_INFO("broker asked us to register again: %s",
                         env->disconnect->reason ? env->disconnect->reason : "");
                s_send_ready(c, k);
                s_send_heartbeat(c, k);
            }
        }
        if (forward)
            zmq_send(zsock_resolve(c->down_thr), zmq_msg_data(&m), zmq_msg_size(&m), 0);
        anv_msg_free(&env);
        zmq_msg_close(&m);
    }
}

/* Moves up to max (< 0: all) messages from the application's pipe to the broker, in order;
   returns false once asked to stop (k->stop) */
static bool s_from_app(broker_client_t *c, s_conn_t *k, int max)
{
    for (int i = 0; !k->stop && (max < 0 || i < max); i++) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, zsock_resolve(c->up_thr), ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            break;
        }
        if (zmq_msg_size(&m) == 0) {
            zmq_msg_close(&m);
            k->stop = true;
            break;
        }
        if (zmq_msg_size(&m) == 1) { /* control: heartbeat now (an envelope is never 1 byte) */
            zmq_msg_close(&m);
            k->next_hb_ms = 0;
            continue;
        }
        /* in order: straight to the broker unless older messages are still waiting */
        if (k->dealer && zlistx_size(k->queue) == 0 &&
            zmq_msg_send(&m, zsock_resolve(k->dealer), ZMQ_DONTWAIT) >= 0) {
            c->msg.sent++;
            continue; /* zmq_msg_send took the message */
        }
        zframe_t *f = zframe_new(zmq_msg_data(&m), zmq_msg_size(&m));
        zmq_msg_close(&m);
        if (f)
            zlistx_add_end(k->queue, f);
    }
    return !k->stop;
}

static void s_destroy_frame(void **item)
{
    zframe_destroy((zframe_t **)item);
}

/* A refused key looks like a silent broker; say what it is, once per dealer. */
static void s_check_handshake(broker_client_t *c, s_conn_t *k)
{
    int h = anv_curve_monitor_read(k->monitor);
    if (!h || k->told_handshake)
        return;
    k->told_handshake = true;
    if (h == ANV_EAUTH)
        ANV_ERROR("the broker at '%s' refused this worker's CURVE key '%s': its public key "
                  "file must be in the broker's --curve-allow directory",
                  c->endpoint, anv_curve_public_txt(c->curve));
    else
        ANV_ERROR("the CURVE handshake with the broker at '%s' failed: is --curve-server the "
                  "broker's public key, and does the broker run with --curve-secret?",
                  c->endpoint);
}

static void *s_thread(void *arg)
{
    broker_client_t *c = arg;
    s_conn_t k = {0};
    k.queue = zlistx_new();
    zlistx_set_destructor(k.queue, s_destroy_frame);
    k.backoff_ms = 1000;
    s_connect(c, &k);
    bool run = true;
    while (run) {
        int64_t now = anv_now_ms();
        if (!k.dealer && now >= k.reconnect_at_ms) {
            s_connect(c, &k);
            pthread_mutex_lock(&c->lock);
            c->reconnects++;
            pthread_mutex_unlock(&c->lock);
        }
        int64_t wake = k.dealer ? k.next_hb_ms : k.reconnect_at_ms;
        long timeout = wake > now ? (long)(wake - now) : 0;
        if (k.dealer && zlistx_size(k.queue) && timeout > 10)
            timeout = 10; /* pipe was full: try again soon */
        zmq_pollitem_t items[2] = {{zsock_resolve(c->up_thr), 0, ZMQ_POLLIN, 0},
                                   {k.dealer ? zsock_resolve(k.dealer) : NULL, 0, ZMQ_POLLIN, 0}};
        int rc = zmq_poll(items, k.dealer ? 2 : 1, timeout);
        if (rc < 0 && errno != EINTR)
            break;
        if (rc > 0 && (items[0].revents & ZMQ_POLLIN))
            run = s_from_app(c, &k, 1000);
        if (k.dealer && rc > 0 && (items[1].revents & ZMQ_POLLIN))
            s_from_broker(c, &k);
        s_flush(c, &k);
        if (k.monitor)
            s_check_handshake(c, &k);
        now = anv_now_ms();
        if (k.dealer && now >= k.next_hb_ms) {
            s_send_heartbeat(c, &k);
            k.next_hb_ms = now + c->hb_ms;
        }
        if (k.stop) /* a stop seen while a heartbeat emptied the pipe */
            run = false;
        if (k.dealer && now - k.last_rx_ms > (int64_t)c->hb_ms * c->misses) {
            ANV_WARN("broker '%s' silent for %lld ms: reconnecting in %lld ms", c->endpoint,
                     (long long)(now - k.last_rx_ms), (long long)k.backoff_ms);
            zsock_destroy(&k.monitor);
            zsock_destroy(&k.dealer);
            pthread_mutex_lock(&c->lock);
            c->connected = false;
            pthread_mutex_unlock(&c->lock);
            k.reconnect_at_ms = now + k.backoff_ms;
            k.backoff_ms = k.backoff_ms * 2 > 32000 ? 32000 : k.backoff_ms * 2;
        }
    }
    /* stop: flush what is queued (best effort, 1 s), then say goodbye */
    if (k.dealer) {
        int64_t until = anv_now_ms() + 1000;
        while (zlistx_size(k.queue) && anv_now_ms() < until) {
            s_flush(c, &k);
            if (zlistx_size(k.queue))
                anv_sleep_ms(5);
        }
        if (zlistx_size(k.queue))
            ANV_WARN("%zu messages not sent to the broker at shutdown", zlistx_size(k.queue));
        Anvil__Envelope env;
        Anvil__Disconnect d = ANVIL__DISCONNECT__INIT;
        anv_msg_init(&env);
        d.worker_id = c->worker_id;
        d.reason = "shutdown";
        env.body_case = ANVIL__ENVELOPE__BODY_DISCONNECT;
        env.disconnect = &d;
        s_send_env(c, &k, &env);
        zsock_set_linger(k.dealer, 500); /* let the goodbye leave */
        zsock_destroy(&k.monitor);
        zsock_destroy(&k.dealer);
    }
    zlistx_destroy(&k.queue);
    return NULL;
}

/* ---- application side ------------------------------------------------------------------ */

broker_client_t *broker_client_new(const broker_client_config_t *cfg)
{
    if (!cfg || !cfg->endpoint || (cfg->kind != ANVIL__WORKER_KIND__WORKER_GEN &&
                                   cfg->kind != ANVIL__WORKER_KIND__WORKER_EXEC)) {
        ANV_ERROR("broker client needs an endpoint and a worker kind (gen or exec)");
        return NULL;
    }
    broker_client_t *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    char wid[300];
    snprintf(wid, sizeof wid, "%s-%s-%d", cfg->hostname ? cfg->hostname : host,
             cfg->kind == ANVIL__WORKER_KIND__WORKER_GEN ? "gen" : "exec", (int)getpid());
    c->endpoint = s_dup(cfg->endpoint);
    c->worker_id = s_dup(cfg->worker_id && *cfg->worker_id ? cfg->worker_id : wid);
    if (cfg->ready_file && *cfg->ready_file && !(c->ready_file = strdup(cfg->ready_file)))
        goto fail;
    c->hostname = s_dup(cfg->hostname ? cfg->hostname : host);
    c->gpu_name = s_dup(cfg->gpu_name ? cfg->gpu_name : "");
    c->model = s_dup(cfg->model ? cfg->model : "");
    c->kind = cfg->kind;
    c->gpu_index = cfg->gpu_index;
    c->weight_version = cfg->weight_version;
    c->kv_tokens = cfg->kv_tokens;
    c->slots = cfg->slots ? cfg->slots : 1;
    c->hb_ms = cfg->heartbeat_ms > 0 ? cfg->heartbeat_ms : 1000;
    c->misses = cfg->heartbeat_misses > 0 ? cfg->heartbeat_misses : 3;
    c->incarnation = ((uint64_t)anv_wall_ms() << 20) ^ (uint64_t)getpid() ^
                     ((uint64_t)(uintptr_t)c << 7);
    pthread_mutex_init(&c->lock, NULL);
    c->held = zhashx_new();
    if (!c->endpoint || !c->worker_id || !c->hostname || !c->gpu_name || !c->model || !c->held)
        goto fail;
    zhashx_set_destructor(c->held, s_free_str);
    if (strlen(c->worker_id) >= 128) {
        ANV_ERROR("worker id '%.40s...' is longer than 127 characters", c->worker_id);
        goto fail;
    }
    char err[512];
    if (anv_curve_client_config(cfg->curve_secret, cfg->curve_server, &c->curve, err,
                                sizeof err) != 0) {
        ANV_ERROR("%s", err);
        goto fail;
    }
    if (!c->curve && !anv_curve_endpoint_local(c->endpoint))
        ANV_WARN("connecting to '%s' without CURVE keys: traffic to the broker is plaintext "
                 "(give --curve-secret and --curve-server)",
                 c->endpoint);
    if (cfg->n_capabilities) {
        c->caps = calloc(cfg->n_capabilities, sizeof *c->caps);
        if (!c->caps)
            goto fail;
        for (size_t i = 0; i < cfg->n_capabilities; i++)
            c->caps[c->n_caps++] = s_dup(cfg->capabilities[i]);
    }
    char ep[96];
    snprintf(ep, sizeof ep, "inproc://broker-client-up-%p", (void *)c);
    c->up_app = zsock_new(ZMQ_PAIR);
    c->up_thr = zsock_new(ZMQ_PAIR);
    if (!c->up_app || !c->up_thr)
        goto fail;
    zsock_set_sndhwm(c->up_app, 0);
    zsock_set_rcvhwm(c->up_thr, 0);
    if (zsock_bind(c->up_thr, "%s", ep) < 0 || zsock_connect(c->up_app, "%s", ep) < 0)
        goto fail;
    snprintf(ep, sizeof ep, "inproc://broker-client-down-%p", (void *)c);
    c->down_app = zsock_new(ZMQ_PAIR);
    c->down_thr = zsock_new(ZMQ_PAIR);
    if (!c->down_app || !c->down_thr)
        goto fail;
    zsock_set_sndhwm(c->down_thr, 0);
    zsock_set_rcvhwm(c->down_app, 0);
    if (zsock_bind(c->down_thr, "%s", ep) < 0 || zsock_connect(c->down_app, "%s", ep) < 0)
        goto fail;
    if (pthread_create(&c->thread, NULL, s_thread, c) != 0) {
        ANV_ERROR("cannot start the broker client thread");
        goto fail;
    }
    c->started = true;
    ANV_INFO("worker '%s' connecting to broker '%s' (%u slots)", c->worker_id, c->endpoint,
             c->slots);
    return c;
fail:
    broker_client_destroy(&c);
    return NULL;
}

void broker_client_destroy(broker_client_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    broker_client_t *c = *self_p;
    if (c->started) {
        pthread_mutex_lock(&c->lock);
        zmq_send(zsock_resolve(c->up_app), "", 0, 0);
        pthread_mutex_unlock(&c->lock);
        pthread_join(c->thread, NULL);
    }
    if (c->ready_written)
        unlink(c->ready_file);
    free(c->ready_file);
    zsock_destroy(&c->up_app);
    zsock_destroy(&c->up_thr);
    zsock_destroy(&c->down_app);
    zsock_destroy(&c->down_thr);
    zhashx_destroy(&c->held);
    for (size_t i = 0; i < c->n_caps; i++)
        free(c->caps[i]);
    free(c->caps);
    free(c->endpoint);
    free(c->worker_id);
    free(c->hostname);
    free(c->gpu_name);
    free(c->model);
    anv_curve_destroy(&c->curve);
    pthread_mutex_destroy(&c->lock);
    free(c);
    *self_p = NULL;
}

Anvil__Envelope *broker_client_recv(broker_client_t *self, int timeout_ms)
{
    zmq_pollitem_t it = {zsock_resolve(self->down_app), 0, ZMQ_POLLIN, 0};
    int64_t until = anv_now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
    for (;;) {
        /* a message already waiting needs no poll (one system call less per unit) */
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, it.socket, ZMQ_DONTWAIT) >= 0) {
            int err;
            Anvil__Envelope *env = anv_msg_decode(zmq_msg_data(&m), zmq_msg_size(&m), 0, &err);
            zmq_msg_close(&m);
            if (env)
                return env;
            continue;
        }
        zmq_msg_close(&m);
        long t = timeout_ms < 0 ? -1 : (long)(until - anv_now_ms());
        if (t < -1 || (timeout_ms >= 0 && t < 0))
            t = 0;
        int rc = zmq_poll(&it, 1, t);
        if (rc < 0 && errno == EINTR) {
            if (zsys_interrupted)
                return NULL;
            continue;
        }
        if (rc <= 0)
            return NULL;
    }
}

int broker_client_send(broker_client_t *self, Anvil__Envelope *env)
{
    const char *ends = NULL;
    switch (env->body_case) {
    case ANVIL__ENVELOPE__BODY_GEN_RESULT:
        if (env->gen_result->has_last && env->gen_result->last)
            ends = env->gen_result->lease_id;
        break;
    case ANVIL__ENVELOPE__BODY_EXEC_DONE:
        ends = env->exec_done->lease_id;
        break;
    case ANVIL__ENVELOPE__BODY_UNIT_FAILED:
        ends = env->unit_failed->lease_id;
        break;
    case ANVIL__ENVELOPE__BODY_WEIGHTS_LOADED:
    case ANVIL__ENVELOPE__BODY_CREDIT:
        break;
    default:
        return ANV_EPROTO;
    }
    env->version = ANVIL_PROTOCOL_VERSION;
    size_t len;
    uint8_t *buf = anv_msg_encode(env, &len);
    if (!buf)
        return -ENOMEM;
    pthread_mutex_lock(&self->lock);
    if (ends)
        zhashx_delete(self->held, ends);
    int rc = zmq_send(zsock_resolve(self->up_app), buf, len, 0) < 0 ? -errno : 0;
    pthread_mutex_unlock(&self->lock);
    free(buf);
    return rc;
}

int broker_client_send_gen_result(broker_client_t *self, const char *lease_id,
                                  Anvil__Sample *sample, bool last)
{
    Anvil__Envelope env;
    Anvil__GenResult r = ANVIL__GEN_RESULT__INIT;
    anv_msg_init(&env);
    r.lease_id = (char *)lease_id;
    r.sample = sample;
    r.has_last = 1;
    r.last = last;
    env.body_case = ANVIL__ENVELOPE__BODY_GEN_RESULT;
    env.gen_result = &r;
    return broker_client_send(self, &env);
}

int broker_client_send_exec_done(broker_client_t *self, const char *lease_id,
                                 Anvil__ExecResult *result)
{
    Anvil__Envelope env;
    Anvil__ExecDone d = ANVIL__EXEC_DONE__INIT;
    anv_msg_init(&env);
    d.lease_id = (char *)lease_id;
    d.result = result;
    env.body_case = ANVIL__ENVELOPE__BODY_EXEC_DONE;
    env.exec_done = &d;
    return broker_client_send(self, &env);
}

static int s_unit_failed(broker_client_t *self, const char *lease_id, const char *error,
                         bool retryable, bool handed_back)
{
    Anvil__Envelope env;
    Anvil__UnitFailed f = ANVIL__UNIT_FAILED__INIT;
    anv_msg_init(&env);
    f.lease_id = (char *)lease_id;
    f.error = (char *)error;
    f.has_retryable = 1;
    f.retryable = retryable;
    f.has_handed_back = handed_back;
    f.handed_back = handed_back;
    env.body_case = ANVIL__ENVELOPE__BODY_UNIT_FAILED;
    env.unit_failed = &f;
    return broker_client_send(self, &env);
}

int broker_client_send_unit_failed(broker_client_t *self, const char *lease_id, const char *error,
                                   bool retryable)
{
    return s_unit_failed(self, lease_id, error, retryable, false);
}

int broker_client_hand_back(broker_client_t *self, const char *lease_id, const char *why)
{
    return s_unit_failed(self, lease_id, why, true, true);
}

void broker_client_drain(broker_client_t *self)
{
    pthread_mutex_lock(&self->lock);
    bool was = self->draining;
    self->draining = true;
    if (!was)
        zmq_send(zsock_resolve(self->up_app), "h", 1, 0);
    pthread_mutex_unlock(&self->lock);
}

int broker_client_add_credit(broker_client_t *self, uint32_t credits)
{
    Anvil__Envelope env;
    Anvil__Credit cr = ANVIL__CREDIT__INIT;
    anv_msg_init(&env);
    cr.has_credits = 1;
    cr.credits = credits;
    env.body_case = ANVIL__ENVELOPE__BODY_CREDIT;
    env.credit = &cr;
    int rc = broker_client_send(self, &env);
    if (rc == 0) {
        pthread_mutex_lock(&self->lock);
        self->slots += credits;
        pthread_mutex_unlock(&self->lock);
    }
    return rc;
}

void broker_client_set_stats(broker_client_t *self, const broker_client_stats_t *stats)
{
    pthread_mutex_lock(&self->lock);
    self->stats = *stats;
    pthread_mutex_unlock(&self->lock);
}

void broker_client_heartbeat_now(broker_client_t *self)
{
    pthread_mutex_lock(&self->lock);
    zmq_send(zsock_resolve(self->up_app), "h", 1, 0);
    pthread_mutex_unlock(&self->lock);
}

size_t broker_client_held(broker_client_t *self)
{
    pthread_mutex_lock(&self->lock);
    size_t n = zhashx_size(self->held);
    pthread_mutex_unlock(&self->lock);
    return n;
}

bool broker_client_connected(broker_client_t *self)
{
    pthread_mutex_lock(&self->lock);
    bool v = self->connected;
    pthread_mutex_unlock(&self->lock);
    return v;
}

uint64_t broker_client_reconnects(broker_client_t *self)
{
    pthread_mutex_lock(&self->lock);
    uint64_t v = self->reconnects;
    pthread_mutex_unlock(&self->lock);
    return v;
}

const char *broker_client_worker_id(const broker_client_t *self)
{
    return self->worker_id;
}

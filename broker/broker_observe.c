/*  broker_observe.c - what the broker shows: Prometheus metrics and the status JSON.

    Both are built on the loop's thread once per heartbeat interval (broker_observe_tick keeps
    the rates over the last interval) and handed to broker_http, which serves the latest copy
    from its own thread. Metric names (all prefixed anvil_) are listed in broker/README.md and
    used by deploy/grafana/anvil.json. Gauges come from memory (ready counts, leases, workers);
    counters are the broker's own since it started (Prometheus handles resets); per-worker
    values are what each worker's last heartbeat reported. The status JSON adds the 20 most
    recent jobs read from Redis.
*/
#include "anv_error.h"
#include "anv_log.h"
#include "anv_time.h"
#include "broker_auth.h"
#include "broker_internal.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- text buffer ----------------------------------------------------------------------- */

typedef struct {
    char *p;
    size_t len, cap;
    bool oom;
} s_buf_t;

static void s_printf(s_buf_t *b, const char *fmt, ...)
{
    if (b->oom)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = true;
            return;
        }
        if (b->p && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap * 2 : 16384;
        while (cap < b->len + (size_t)n + 1)
            cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = true;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
}

/* a label value: backslash, double quote and newline escaped */
static void s_label(s_buf_t *b, const char *v)
{
    for (const char *c = v ? v : ""; *c; c++) {
        if (*c == '\\' || *c == '"')
            s_printf(b, "\\%c", *c);
        else if (*c == '\n')
            s_printf(b, "\\n");
        else
            s_printf(b, "%c", *c);
    }
}

static void s_head(s_buf_t *b, const char *name, const char *type, const char *help)
{
    s_printf(b, "# HELP anvil_%s %s\n# TYPE anvil_%s %s\n", name, help, name, type);
}

static void s_one(s_buf_t *b, const char *name, const char *type, const char *help, double v)
{
    s_head(b, name, type, help);
    s_printf(b, "anvil_%s %.17g\n", name, v);
}

/* ---- rates ----------------------------------------------------------------------------- */

void broker_observe_tick(broker_t *b, int64_t now_ms)
{
    uint64_t tok = b->m.tokens_generated, ev = b->m.evals_done, res = b->m.results_recorded;
    if (b->rate.at_ms) {
        double dt = (double)(now_ms - b->rate.at_ms) / 1000.0;
        if (dt < 0.2)
            return; /* too short to be a rate: keep the last one */
        b->rate.tokens_per_s = (double)(tok - b->rate.tokens) / dt;
        b->rate.evals_per_min = (double)(ev - b->rate.evals) * 60.0 / dt;
        b->rate.results_per_s = (double)(res - b->rate.results) / dt;
    }
    b->rate.at_ms = now_ms;
    b->rate.tokens = tok;
    b->rate.evals = ev;
    b->rate.results = res;
}

/* ---- Prometheus ------------------------------------------------------------------------ */

static const char *s_kind(Anvil__WorkerKind k)
{
    return k == ANVIL__WORKER_KIND__WORKER_GEN ? "gen" : "exec";
}

static const char *s_worker_state(const broker_worker_t *w)
{
    if (w->last_seen_ms == INT64_MIN)
        return "dead";
    return w->in_flight >= w->slots ? "busy" : "ready";
}

static int s_cmp_dbl(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void s_queue_metrics(broker_t *b, s_buf_t *o)
{
    int64_t ready[2] = {0, 0}, flight[2] = {0, 0}, live = 0;
    for (broker_job_t *j = zhashx_first(b->jobs); j; j = zhashx_next(b->jobs)) {
        ready[0] += broker_job_ready(j, 0);
        ready[1] += broker_job_ready(j, 1);
        live += j->live;
    }
    size_t n = zhashx_size(b->leases), k = 0;
    double *age = n ? malloc(n * sizeof *age) : NULL;
    int64_t now = anv_now_ns();
    for (broker_lease_t *l = zhashx_first(b->leases); l; l = zhashx_next(b->leases)) {
        flight[l->kind == 'g' ? 0 : 1]++;
        if (age && k < n)
            age[k++] = (double)(now - l->sent_ns) / 1e9;
    }
    s_head(o, "queue_ready", "gauge", "Units ready to dispatch, per stage.");
    s_printf(o, "anvil_queue_ready{stage=\"gen\"} %" PRId64 "\n", ready[0]);
    s_printf(o, "anvil_queue_ready{stage=\"exec\"} %" PRId64 "\n", ready[1]);
    s_head(o, "in_flight", "gauge", "Units leased to workers, per stage.");
    s_printf(o, "anvil_in_flight{stage=\"gen\"} %" PRId64 "\n", flight[0]);
    s_printf(o, "anvil_in_flight{stage=\"exec\"} %" PRId64 "\n", flight[1]);
    if (age)
        qsort(age, k, sizeof *age, s_cmp_dbl);
    s_head(o, "lease_age_seconds", "gauge",
           "Age of the leases held now (since dispatch), as quantiles over them.");
    const double qs[] = {0.5, 0.9, 0.99};
    for (size_t i = 0; i < 3; i++)
        s_printf(o, "anvil_lease_age_seconds{quantile=\"%g\"} %.6f\n", qs[i],
                 k ? age[(size_t)(qs[i] * (double)(k - 1))] : 0.0);
    s_one(o, "lease_age_oldest_seconds", "gauge", "Age of the oldest lease held now.",
          k ? age[k - 1] : 0.0);
    free(age);
    s_one(o, "jobs_live", "gauge", "Jobs queued or running.", (double)live);
    s_one(o, "results_queued", "gauge", "Results received, waiting to be written to Redis.",
          (double)b->n_pending);
    s_one(o, "watches_parked", "gauge", "WATCH long polls waiting for events.",
          (double)zlistx_size(b->watches));
}

static void s_unit_rtt(broker_t *b, s_buf_t *o)
{
    const broker_hist_t *h = &b->m.unit_rtt;
    s_head(o, "unit_round_trip_seconds", "histogram",
           "Lease sent to the unit's last result received.");
    uint64_t cum = 0;
    for (int k = 0; k < 27; k++) { /* le = 4 us, 16 us, ... 67 s, each 4x the last */
        cum += h->n[k];
        if (k % 2 == 1)
            s_printf(o, "anvil_unit_round_trip_seconds_bucket{le=\"%g\"} %" PRIu64 "\n",
                     ldexp(1.0, k + 1) / 1e6, cum);
    }
    s_printf(o, "anvil_unit_round_trip_seconds_bucket{le=\"+Inf\"} %" PRIu64 "\n", h->count);
    s_printf(o, "anvil_unit_round_trip_seconds_sum %.6f\n", h->sum_us / 1e6);
    s_printf(o, "anvil_unit_round_trip_seconds_count %" PRIu64 "\n", h->count);
}

static void s_worker_metrics(broker_t *b, s_buf_t *o)
{
    static const char *states[] = {"ready", "busy", "dead"};
    s_head(o, "workers", "gauge", "Registered workers by kind and state.");
    for (int k = 0; k < 2; k++)
        for (int s = 0; s < 3; s++) {
            int n = 0;
            for (broker_worker_t *w = zhashx_first(b->by_ident); w; w = zhashx_next(b->by_ident))
                n += !strcmp(s_kind(w->kind), k ? "exec" : "gen") &&
                     !strcmp(s_worker_state(w), states[s]);
            s_printf(o, "anvil_workers{kind=\"%s\",state=\"%s\"} %d\n", k ? "exec" : "gen",
                     states[s], n);
        }
    static const struct {
        const char *name, *help;
        int what;
    } per[] = {
        {"worker_slots", "Units the worker may hold (credit).", 0},
        {"worker_in_flight", "Units the worker holds.", 1},
        {"worker_outstanding_tokens", "Tokens still to generate in its units (estimate).", 2},
        {"worker_tokens_generated", "Tokens generated since the worker started (heartbeat).", 3},
        {"worker_evals_done", "Evaluations done since the worker started (heartbeat).", 4},
        {"worker_free_kv_tokens", "Free KV cache tokens (heartbeat).", 5},
        {"worker_queued_samples", "Samples its engine holds without KV (heartbeat).", 8},
        {"worker_weight_version", "Weight version loaded.", 6},
        {"worker_last_seen_seconds", "Seconds since the worker's last message.", 7},
    };
    int64_t now = anv_now_ms();
    for (size_t i = 0; i < sizeof per / sizeof per[0]; i++) {
        s_head(o, per[i].name, "gauge", per[i].help);
        for (broker_worker_t *w = zhashx_first(b->by_ident); w; w = zhashx_next(b->by_ident)) {
            double v;
            switch (per[i].what) {
            case 0: v = w->slots; break;
            case 1: v = w->in_flight; break;
            case 2: v = (double)w->outstanding_tokens; break;
            case 3: v = (double)w->hb_tokens; break;
            case 4: v = (double)w->hb_evals; break;
            case 5:
                if (!w->hb_has_free_kv)
                    continue;
                v = (double)w->hb_free_kv;
                break;
            case 6: v = (double)w->weight_version; break;
            case 8:
                if (!w->hb_has_queued)
                    continue;
                v = (double)w->hb_queued;
                break;
            default:
                v = w->last_seen_ms == INT64_MIN ? -1 : (double)(now - w->last_seen_ms) / 1000.0;
                break;
            }
            s_printf(o, "anvil_%s{worker=\"", per[i].name);
            s_label(o, w->id);
            s_printf(o, "\",kind=\"%s\",host=\"", s_kind(w->kind));
            s_label(o, w->hostname);
            s_printf(o, "\"} %.17g\n", v);
        }
    }
}

static void s_socket_metrics(broker_t *b, s_buf_t *o)
{
    const anv_msg_stats_t *st[2] = {&b->st_workers, &b->st_clients};
    const char *sock[2] = {"worker", "client"};
    s_one(o, "messages_dropped_total", "counter",
          "Messages dropped without being delivered, retried or dead-lettered (always 0).", 0);
    s_one(o, "curve_enabled", "gauge", "1 when both sockets are CURVE servers.", b->auth ? 1 : 0);
    s_one(o, "curve_allowed_keys", "gauge", "Public keys in the --curve-allow directory.",
          b->auth ? (double)broker_auth_keys(b->auth) : 0);
    s_head(o, "curve_handshakes_total", "counter",
           "CURVE handshakes by the allow-list's verdict (refused ones are logged with the key).");
    s_printf(o, "anvil_curve_handshakes_total{verdict=\"allowed\"} %" PRIu64 "\n",
             b->auth ? broker_auth_allowed(b->auth) : 0);
    s_printf(o, "anvil_curve_handshakes_total{verdict=\"refused\"} %" PRIu64 "\n",
             b->auth ? broker_auth_refused(b->auth) : 0);
    s_head(o, "messages_rejected_total", "counter",
           "Received messages refused as invalid input, by socket and reason.");
    for (int i = 0; i < 2; i++) {
        const struct {
            const char *r;
            uint64_t v;
        } rs[] = {{"empty", st[i]->rejected_empty},       {"oversize", st[i]->rejected_oversize},
                  {"malformed", st[i]->rejected_malformed}, {"version", st[i]->rejected_version},
                  {"frames", st[i]->rejected_frames}};
        for (size_t k = 0; k < sizeof rs / sizeof rs[0]; k++)
            s_printf(o, "anvil_messages_rejected_total{socket=\"%s\",reason=\"%s\"} %" PRIu64 "\n",
                     sock[i], rs[k].r, rs[k].v);
    }
    s_head(o, "messages_total", "counter", "Messages received and sent, by socket.");
    for (int i = 0; i < 2; i++)
        s_printf(o,
                 "anvil_messages_total{socket=\"%s\",direction=\"in\"} %" PRIu64 "\n"
                 "anvil_messages_total{socket=\"%s\",direction=\"out\"} %" PRIu64 "\n",
                 sock[i], st[i]->received, sock[i], st[i]->sent);
    s_head(o, "send_failures_total", "counter",
           "Sends that did not go out (the unit or reply is then released or counted).");
    for (int i = 0; i < 2; i++)
        s_printf(o,
                 "anvil_send_failures_total{socket=\"%s\",reason=\"pipe_full\"} %" PRIu64 "\n"
                 "anvil_send_failures_total{socket=\"%s\",reason=\"unroutable\"} %" PRIu64 "\n"
                 "anvil_send_failures_total{socket=\"%s\",reason=\"other\"} %" PRIu64 "\n",
                 sock[i], st[i]->send_again, sock[i], st[i]->send_unroutable, sock[i],
                 st[i]->send_failed);
}

char *broker_observe_metrics(broker_t *b, size_t *len)
{
    s_buf_t o = {0};
    const broker_metrics_t *m = &b->m;
    s_queue_metrics(b, &o);
    s_unit_rtt(b, &o);
    s_worker_metrics(b, &o);
    s_socket_metrics(b, &o);
    s_one(&o, "tokens_per_second", "gauge", "Tokens recorded per second (last interval).",
          b->rate.tokens_per_s);
    s_one(&o, "evaluations_per_minute", "gauge", "Evaluations recorded per minute (last interval).",
          b->rate.evals_per_min);
    s_one(&o, "results_per_second", "gauge", "Results recorded per second (last interval).",
          b->rate.results_per_s);
    s_one(&o, "pass_rate", "gauge", "Correct evaluations / evaluations since the broker started.",
          m->evals_done ? (double)m->evals_correct / (double)m->evals_done : 0.0);
    s_one(&o, "redis_up", "gauge", "1 when Redis is reachable.",
          broker_redis_usable(b) && broker_store_connected(b->store) ? 1 : 0);
    s_one(&o, "broker_uptime_seconds", "gauge", "Seconds since the broker started.",
          (double)(anv_wall_ms() - b->started_ms) / 1000.0);
    const struct {
        const char *name, *help;
        uint64_t v;
    } c[] = {
        {"tokens_total", "Tokens of the samples recorded.", m->tokens_generated},
        {"samples_total", "Samples recorded.", m->samples_generated},
        {"evaluations_total", "Evaluations recorded.", m->evals_done},
        {"evaluations_correct_total", "Correct evaluations recorded.", m->evals_correct},
        {"units_dispatched_total", "Units sent to workers.", m->units_dispatched},
        {"units_redispatched_total", "Units sent again (attempt > 1).", m->units_redispatched},
        {"units_requeued_total", "Units put back in their queue (retries).", m->units_requeued},
        {"dead_letters_total", "Units dead-lettered after their last attempt.", m->units_dead},
        {"units_failed_total", "UNIT_FAILED reports from workers.", m->units_failed},
        {"units_undeliverable_total", "Units released because no send was possible.",
         m->units_undeliverable},
        {"results_recorded_total", "Results written to Redis.", m->results_recorded},
        {"results_duplicate_total", "Results already recorded (a retried unit).",
         m->results_duplicate},
        {"results_discarded_total", "Results of jobs no longer running.", m->results_discarded},
        {"results_stale_total", "Samples beyond their job's staleness bound, generated again.",
         m->results_stale},
        {"results_invalid_total", "Results naming a task or sample that does not exist.",
         m->results_invalid},
        {"leases_expired_total", "Leases that expired.", m->leases_expired},
        {"leases_renewed_total", "Lease renewals.", m->leases_renewed},
        {"leases_adopted_total", "Leases adopted from worker heartbeats after a restart.",
         m->leases_adopted},
        {"workers_ready_total", "READY messages accepted.", m->workers_ready},
        {"workers_lost_total", "Workers declared dead (missed heartbeats).", m->workers_lost},
        {"workers_disconnected_total", "Workers that said DISCONNECT.", m->workers_disconnected},
        {"stale_identity_total", "READY of a known worker on a new connection.",
         m->stale_identity},
        {"jobs_submitted_total", "Jobs created.", m->jobs_submitted},
        {"jobs_done_total", "Jobs that finished.", m->jobs_done},
        {"jobs_cancelled_total", "Jobs cancelled.", m->jobs_cancelled},
        {"tasks_accepted_total", "Tasks accepted durably.", m->tasks_accepted},
        {"tasks_skipped_total", "Tasks skipped on submit (custom id already present).",
         m->tasks_skipped},
        {"client_requests_total", "Client requests.", m->client_requests},
        {"client_errors_total", "Client requests answered with an error.", m->client_errors},
        {"redis_errors_total", "Failed Redis calls.", m->redis_errors},
        {"redis_calls_total", "Redis round trips.", broker_store_calls(b->store)},
        {"heartbeats_in_total", "Heartbeats received from workers.", m->heartbeats_in},
        {"heartbeats_out_total", "Heartbeats sent to workers.", m->heartbeats_out},
        {"http_requests_total", "HTTP requests served.", m->http_requests},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++)
        s_one(&o, c[i].name, "counter", c[i].help, (double)c[i].v);
    if (o.oom) {
        free(o.p);
        return NULL;
    }
    *len = o.len;
    return o.p;
}

/* ---- status JSON ----------------------------------------------------------------------- */

static const char *s_state_name(Anvil__JobState s)
{
    static const char *n[] = {"none", "submitting", "queued", "running", "done", "cancelled",
                              "failed"};
    return (unsigned)s < 7 ? n[s] : "none";
}

static cJSON *s_jobs(broker_t *b)
{
    cJSON *arr = cJSON_CreateArray();
    const char *argv[] = {"ZREVRANGE", "anv:jobs", "0", "19"};
    redisReply *r = NULL;
    if (!arr || !broker_redis_usable(b) || broker_store_cmd(b->store, &r, 4, argv) != 0)
        return arr;
    for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements; i++) {
        const char *id = r->element[i]->str;
        if (!id || !anv_id_valid(id))
            continue;
        Anvil__JobStatus st;
        redisReply *h = NULL;
        if (broker_clients_job_status(b, id, &st, &h) == 0) {
            cJSON *j = cJSON_CreateObject();
            cJSON_AddStringToObject(j, "id", id);
            cJSON_AddStringToObject(j, "name", st.name ? st.name : "");
            cJSON_AddStringToObject(j, "state", s_state_name(st.state));
            cJSON_AddNumberToObject(j, "priority", st.priority);
            cJSON_AddNumberToObject(j, "tasks", (double)st.tasks);
            cJSON_AddNumberToObject(j, "samples", (double)st.samples_total);
            cJSON_AddNumberToObject(j, "generated", (double)st.generated);
            cJSON_AddNumberToObject(j, "scored", (double)st.scored);
            cJSON_AddNumberToObject(j, "failed", (double)st.failed);
            cJSON_AddNumberToObject(j, "dead", (double)st.dead);
            cJSON_AddNumberToObject(j, "correct", (double)st.correct);
            cJSON_AddNumberToObject(j, "tokens", (double)st.tokens);
            cJSON_AddNumberToObject(j, "in_flight", (double)st.in_flight);
            cJSON_AddBoolToObject(j, "score", st.score);
            /* terminal samples: generated (or scored when the job scores) + dead */
            double term = (double)((st.score ? st.scored + st.failed : st.generated) + st.dead);
            cJSON_AddNumberToObject(j, "progress",
                                    st.samples_total ? term / (double)st.samples_total : 0.0);
            cJSON_AddNumberToObject(j, "tokens_per_s", st.tokens_per_s);
            cJSON_AddNumberToObject(j, "evals_per_min", st.evals_per_min);
            cJSON_AddNumberToObject(j, "pass_rate", st.pass_rate);
            cJSON_AddNumberToObject(j, "eta_s", st.eta_s);
            cJSON_AddNumberToObject(j, "created_ms", (double)st.created_ms);
            cJSON_AddNumberToObject(j, "finished_ms", (double)st.finished_ms);
            cJSON_AddItemToArray(arr, j);
        }
        if (h)
            freeReplyObject(h);
    }
    freeReplyObject(r);
    return arr;
}

static cJSON *s_workers(broker_t *b)
{
    cJSON *arr = cJSON_CreateArray();
    int64_t now = anv_now_ms();
    for (broker_worker_t *w = zhashx_first(b->by_ident); arr && w; w = zhashx_next(b->by_ident)) {
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "id", w->id);
        cJSON_AddStringToObject(x, "kind", s_kind(w->kind));
        cJSON_AddStringToObject(x, "state", s_worker_state(w));
        cJSON_AddStringToObject(x, "host", w->hostname);
        cJSON_AddNumberToObject(x, "gpu_index", w->gpu_index);
        cJSON_AddStringToObject(x, "gpu", w->gpu_name);
        cJSON_AddStringToObject(x, "model", w->model);
        cJSON_AddNumberToObject(x, "weight_version", (double)w->weight_version);
        cJSON_AddNumberToObject(x, "slots", w->slots);
        cJSON_AddNumberToObject(x, "in_flight", w->in_flight);
        cJSON_AddNumberToObject(x, "load", w->slots ? (double)w->in_flight / w->slots : 0.0);
        cJSON_AddNumberToObject(x, "outstanding_tokens", (double)w->outstanding_tokens);
        cJSON_AddNumberToObject(x, "tokens_generated", (double)w->hb_tokens);
        cJSON_AddNumberToObject(x, "evals_done", (double)w->hb_evals);
        if (w->hb_has_free_kv)
            cJSON_AddNumberToObject(x, "free_kv_tokens", (double)w->hb_free_kv);
        if (w->hb_has_queued)
            cJSON_AddNumberToObject(x, "queued_samples", (double)w->hb_queued);
        cJSON_AddNumberToObject(x, "last_seen_s", w->last_seen_ms == INT64_MIN
                                                      ? -1.0
                                                      : (double)(now - w->last_seen_ms) / 1000.0);
        cJSON_AddItemToArray(arr, x);
    }
    return arr;
}

char *broker_observe_status(broker_t *b, size_t *len)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    cJSON *br = cJSON_AddObjectToObject(o, "broker");
    cJSON_AddNumberToObject(br, "pid", (double)getpid());
    cJSON_AddNumberToObject(br, "started_ms", (double)b->started_ms);
    cJSON_AddNumberToObject(br, "now_ms", (double)anv_wall_ms());
    cJSON_AddBoolToObject(br, "redis_up", broker_redis_usable(b) && broker_store_connected(b->store));
    cJSON_AddStringToObject(br, "client_endpoint", b->client_endpoint);
    cJSON_AddStringToObject(br, "worker_endpoint", b->worker_endpoint);
    cJSON *ra = cJSON_AddObjectToObject(o, "rates");
    cJSON_AddNumberToObject(ra, "tokens_per_s", b->rate.tokens_per_s);
    cJSON_AddNumberToObject(ra, "evals_per_min", b->rate.evals_per_min);
    cJSON_AddNumberToObject(ra, "results_per_s", b->rate.results_per_s);
    cJSON_AddNumberToObject(ra, "pass_rate", b->m.evals_done ? (double)b->m.evals_correct /
                                                                   (double)b->m.evals_done
                                                             : 0.0);
    int64_t ready[2] = {0, 0}, flight[2] = {0, 0};
    for (broker_job_t *j = zhashx_first(b->jobs); j; j = zhashx_next(b->jobs)) {
        ready[0] += broker_job_ready(j, 0);
        ready[1] += broker_job_ready(j, 1);
    }
    for (broker_lease_t *l = zhashx_first(b->leases); l; l = zhashx_next(b->leases))
        flight[l->kind == 'g' ? 0 : 1]++;
    cJSON *q = cJSON_AddObjectToObject(o, "queue");
    cJSON_AddNumberToObject(q, "gen_ready", (double)ready[0]);
    cJSON_AddNumberToObject(q, "exec_ready", (double)ready[1]);
    cJSON_AddNumberToObject(q, "gen_in_flight", (double)flight[0]);
    cJSON_AddNumberToObject(q, "exec_in_flight", (double)flight[1]);
    cJSON *t = cJSON_AddObjectToObject(o, "totals");
    cJSON_AddNumberToObject(t, "units_dispatched", (double)b->m.units_dispatched);
    cJSON_AddNumberToObject(t, "results_recorded", (double)b->m.results_recorded);
    cJSON_AddNumberToObject(t, "tokens", (double)b->m.tokens_generated);
    cJSON_AddNumberToObject(t, "evaluations", (double)b->m.evals_done);
    cJSON_AddNumberToObject(t, "dead_letters", (double)b->m.units_dead);
    cJSON_AddNumberToObject(t, "requeued", (double)b->m.units_requeued);
    cJSON_AddNumberToObject(t, "jobs_done", (double)b->m.jobs_done);
    cJSON_AddItemToObject(o, "jobs", s_jobs(b));
    cJSON_AddItemToObject(o, "workers", s_workers(b));
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (s)
        *len = strlen(s);
    return s;
}

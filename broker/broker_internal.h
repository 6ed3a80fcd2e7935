/*  broker_internal.h - state shared by the broker's modules (not a public API).

    broker.c owns the loop and the timers; broker_workers.c the worker protocol (READY,
    heartbeats, credit, liveness, lease adoption); broker_dispatch.c leasing, sending units and
    committing results; broker_clients.c the client operations; broker_sched.c the job table
    and the weighted fair share between jobs. Everything runs on the loop's thread.

    Memory mirrors Redis and is rebuilt from it: a job's ready counts come back from every
    lease call; leases held by workers are learnt again from their heartbeats after a restart.
    A lease object exists while a worker holds the unit; it is on its worker's list.
*/
#ifndef BROKER_INTERNAL_H
#define BROKER_INTERNAL_H

#include "anv_id.h"
#include "anv_msg.h"
#include "broker.h"
#include "broker_store.h"

#include <czmq.h>

typedef struct broker_lease_t broker_lease_t;

typedef struct broker_job_t {
    char id[ANV_ID_SIZE];
    Anvil__JobSpec *spec;     /* decoded, owned; sampling and scoring of every unit */
    int priority;
    double weight;            /* 2^priority, clamped: share of dispatch among live jobs */
    double pass[2];           /* stride-scheduling pass per kind (0 gen, 1 exec) */
    int64_t ready_retry;      /* gen units in the retry list */
    int64_t ready_fresh;      /* tasks not yet dispatched (tasks - cursor) */
    int64_t ready_exec;       /* exec units ready */
    int64_t in_flight;        /* leases held by workers */
    bool live;                /* queued or running: may dispatch */
    uint32_t max_tokens;      /* per sample, for load estimates */
    int64_t created_ms;
    uint32_t xkinds;          /* task kinds in the job (1 << Anvil__TaskKind): exec matching */
    uint8_t *sampling_pb;     /* spec->sampling packed (len 0 when none), for broker_wire */
    size_t sampling_len;
    bool blocked;             /* no fitting worker has credit left (this dispatch round) */
    bool partial;             /* cancelled with keep_partial: gen results still recorded */
} broker_job_t;

typedef struct broker_worker_t {
    char id[128];
    char ident_key[64];       /* hex of the ROUTER identity */
    zframe_t *identity;
    Anvil__WorkerKind kind;
    char hostname[64], gpu_name[64], model[128];
    int32_t gpu_index;
    uint64_t weight_version, kv_tokens, incarnation;
    uint32_t slots;           /* credit: units it may hold at once */
    uint32_t kinds;           /* exec: task kinds it can score (1 << kind); 0 = every kind */
    uint32_t round_credit;    /* credit not yet promised in the current dispatch round */
    uint32_t in_flight;
    uint64_t outstanding_tokens;
    int64_t last_seen_ms;
    broker_lease_t *leases;   /* doubly linked list of held leases */
    /* what its last heartbeat reported (counters since the worker started) */
    uint64_t hb_tokens, hb_evals, hb_free_kv;
    bool hb_has_free_kv;
    /* a gen worker that reports its engine's queue (samples without KV) gets units while that
       queue, plus the samples of units sent since that it did not list yet, is below backlog */
    bool hb_has_queued;
    uint32_t hb_queued, backlog;
    uint64_t transit_samples; /* samples of held units no heartbeat listed yet */
    uint32_t unit_samples;    /* samples of the last gen unit sent (a unit's size) */
    bool draining;            /* said so in a heartbeat: gets no new units */
} broker_worker_t;

struct broker_lease_t {
    char id[96];
    char kind;                /* 'g' or 'e' */
    char job_id[ANV_ID_SIZE];
    broker_job_t *job;        /* NULL when the job is not in memory */
    broker_worker_t *worker;
    uint64_t task;
    uint32_t sample;          /* exec units */
    uint32_t attempt;
    uint32_t remaining;       /* samples still to come (gen) */
    uint32_t tokens_per_sample;
    uint32_t transit; /* samples counted in its worker's transit_samples (unlisted) */
    int64_t sent_ns;
    bool redo;                /* a sample of the unit was not recorded (stale, aborted): the
                                 unit goes back to the queue when it ends */
    broker_lease_t *prev, *next;
};

/* one result waiting to be committed */
typedef struct {
    char kind;
    char job_id[ANV_ID_SIZE];
    uint64_t task;
    uint32_t sample;
    char lease_id[96];
    bool last;
    uint8_t *payload;         /* packed Sample or ExecResult (owned) */
    size_t len;
    char info[48];
} broker_pending_t;

typedef struct {
    zframe_t *identity;
    uint64_t request_id;
    char job_id[ANV_ID_SIZE];
    char offset[48];
    uint32_t max_events;
    int64_t deadline_ms;
} broker_watch_t;

#define BROKER_HIST_BUCKETS 40
typedef struct {
    uint64_t n[BROKER_HIST_BUCKETS]; /* bucket k: [2^k, 2^(k+1)) microseconds */
    uint64_t count;
    double sum_us;
} broker_hist_t;

typedef struct {
    uint64_t units_dispatched, units_redispatched, units_undeliverable;
    uint64_t results_recorded, results_duplicate, results_discarded, results_invalid;
    uint64_t units_failed, units_requeued, units_dead, leases_expired, leases_renewed;
    uint64_t leases_adopted, workers_ready, workers_lost, workers_disconnected;
    uint64_t workers_unknown, stale_identity, heartbeats_in, heartbeats_out;
    uint64_t jobs_submitted, tasks_accepted, tasks_skipped, jobs_done, jobs_cancelled;
    uint64_t client_requests, client_errors, client_unhandled, worker_unhandled;
    uint64_t redis_errors, commit_retries, cancels_sent, weights_updates;
    uint64_t samples_generated, tokens_generated, evals_done, evals_correct; /* recorded */
    uint64_t http_requests, results_stale;
    broker_hist_t unit_rtt;   /* lease sent -> last result received */
} broker_metrics_t;

/* a CANCEL with keep_partial, answered once the job's gen units sent back what they had */
typedef struct {
    zframe_t *identity;
    uint64_t request_id;
    char job_id[ANV_ID_SIZE];
    uint64_t cancelled, partial;
    int64_t deadline_ms;
} broker_cancel_t;

typedef struct {
    bool active;
    zframe_t *identity;
    uint64_t request_id, version, prev_version;
    bool prev_has;
    int64_t started_ms, deadline_ms;
    zhashx_t *waiting;        /* worker ids still to report */
    uint32_t loaded;
    double slowest_s;
} broker_weights_t;

struct broker_t {
    broker_config_t cfg;
    char *client_endpoint, *worker_endpoint, *redis_url;
    zsock_t *clients, *workers_sock;
    broker_store_t *store;
    broker_args_t *args;
    zhashx_t *jobs;           /* id -> broker_job_t (owned) */
    zhashx_t *by_ident;       /* ident_key -> broker_worker_t (owned) */
    zhashx_t *by_id;          /* worker id -> broker_worker_t (borrowed) */
    zhashx_t *leases;         /* lease id -> broker_lease_t (owned) */
    double vtime[2];
    broker_pending_t *pending;
    size_t n_pending, cap_pending;
    zlistx_t *watches;        /* broker_watch_t (owned) */
    broker_weights_t weights;
    /* the trainer's weight version: the last UPDATE_WEIGHTS (anv:weights), at least the
       highest a gen worker reported; the staleness bound (JobSpec.max_weight_lag) counts
       from it */
    uint64_t weight_version;
    bool has_weight_version;
    zlistx_t *cancels;        /* broker_cancel_t (owned): keep_partial cancels waiting */
    int64_t redis_retry_ms;   /* no Redis calls before this (backoff while it is down) */
    int64_t next_tick_ms;
    bool dispatch_blocked;
    broker_metrics_t m;
    anv_msg_stats_t st_clients, st_workers;
    int64_t started_ms;
    struct broker_http_t *http; /* NULL unless --metrics-endpoint */
    struct anv_curve_t *curve;  /* own keys; NULL = plaintext */
    struct broker_auth_t *auth; /* the ZAP handler; NULL = plaintext */
    struct {
        int64_t at_ms;          /* when the counters below were taken */
        uint64_t tokens, evals, results;
        double tokens_per_s, evals_per_min, results_per_s;
    } rate;
};

/* broker_sched.c */
broker_job_t *broker_job_new(const char *id, Anvil__JobSpec *spec, int priority);
void broker_job_destroy(broker_job_t **self_p);
void broker_job_set_priority(broker_job_t *job, int priority);
int64_t broker_job_ready(const broker_job_t *job, int kind);
/* The live job with ready units of `kind` that is next in weighted fair share, or NULL. */
broker_job_t *broker_sched_pick(broker_t *b, int kind);
/* Charges `job` for one unit of `kind`. */
void broker_sched_charge(broker_t *b, broker_job_t *job, int kind);
/* Drops jobs that are finished and hold no leases. */
void broker_sched_gc(broker_t *b);
/* Rebuilds the job table from Redis (every live job, or only job `only` when not NULL).
   Returns 0 or ANV_EREDIS. */
int broker_sched_load(broker_t *b, const char *only);

/* broker_workers.c */
void broker_workers_on_message(broker_t *b, zframe_t *identity, Anvil__Envelope *env);
void broker_workers_tick(broker_t *b, int64_t now_ms);
void broker_worker_destroy(broker_worker_t **self_p);
/* Units the worker may be sent now: its slots less those in flight, and for a gen worker no
   more than its engine's queue leaves room for (--gen-backlog), or, from a worker that reports
   only its free KV tokens, no more than that KV holds (see broker_workers.c). */
uint32_t broker_worker_credit(const broker_worker_t *w);
/* queued samples a gen worker may hold when the config says 0 (--gen-backlog) */
#define BROKER_GEN_BACKLOG 64
/* True when worker w may run units of job j (may be NULL: any job): a gen worker must serve the
   model the job names (if it names one), an exec worker must score every task kind the job
   has (if it lists kinds at all). Capability names of the kinds: broker_kind_capability(). */
bool broker_worker_fits(const broker_t *b, const broker_worker_t *w, const broker_job_t *j);
/* The job's staleness bound applies and `version` is beyond it (older than the broker's
   current version minus max_weight_lag). */
bool broker_job_stale(const broker_t *b, const broker_job_t *j, uint64_t version);
/* Raises the current weight version to at least v (a gen worker reports it). */
void broker_weights_seen(broker_t *b, uint64_t v);
/* "kernelbench", "tritonbench-g", "tritonbench-t" for the task kinds, NULL for others */
const char *broker_kind_capability(int kind);
/* Attaches or detaches a lease from its worker, keeping in_flight and load in step. */
void broker_lease_attach(broker_lease_t *l, broker_worker_t *w);
void broker_lease_detach(broker_lease_t *l);
/* A heartbeat of its worker listed the lease: its samples are no longer in transit. */
void broker_lease_listed(broker_lease_t *l);
/* Removes a lease from memory (not from Redis). */
void broker_lease_forget(broker_t *b, broker_lease_t *l);
/* Releases every lease of `w` in Redis (penalty: counts an attempt) and forgets them. */
void broker_worker_release_all(broker_t *b, broker_worker_t *w, bool penalty, const char *why);
void broker_worker_remove(broker_t *b, broker_worker_t *w);
int broker_send_worker(broker_t *b, broker_worker_t *w, Anvil__Envelope *env);
/* Sends an already packed envelope (takes ownership of buf, freed in any case). Same returns
   and counters as broker_send_worker. */
int broker_send_worker_raw(broker_t *b, broker_worker_t *w, uint8_t *buf, size_t len);

/* broker_dispatch.c */
void broker_dispatch(broker_t *b);
/* Queues one result; broker_commit() writes the queue in one call. */
void broker_on_gen_result(broker_t *b, broker_worker_t *w, Anvil__GenResult *r);
void broker_on_exec_done(broker_t *b, broker_worker_t *w, Anvil__ExecDone *r);
void broker_on_unit_failed(broker_t *b, broker_worker_t *w, Anvil__UnitFailed *r);
int broker_commit(broker_t *b);
/* Releases leases in Redis (ids borrowed). Returns 0 or an ANV_E* code. */
int broker_release(broker_t *b, const char *const *ids, size_t n, bool penalty, bool fatal,
                   const char *why);
/* Handles the {jobs with new events} {jobs that became done} lists at r->element[at], at+1 of
   a release or expire reply: counts finished jobs and answers their watchers. */
void broker_on_released(broker_t *b, const redisReply *r, size_t at);
/* Parses "g.job.task.att.seq" / "e.job.task.sample.att.seq". */
bool broker_lease_parse(const char *id, char *kind, char job[ANV_ID_SIZE], uint64_t *task,
                        uint32_t *sample, uint32_t *attempt);
bool broker_redis_usable(broker_t *b);
void broker_redis_failed(broker_t *b, const char *what);

/* broker_clients.c */
void broker_clients_on_message(broker_t *b, zframe_t *identity, Anvil__Envelope *env);
void broker_clients_tick(broker_t *b, int64_t now_ms);
void broker_clients_on_job_events(broker_t *b, const char *job_id);
void broker_clients_on_weights_loaded(broker_t *b, broker_worker_t *w, Anvil__WeightsLoaded *wl);
void broker_clients_watch_destructor(zlistx_t *list);
void broker_clients_cancel_destructor(zlistx_t *list);
/* Answers keep_partial cancels whose units are all back (or whose wait is over). */
void broker_clients_check_cancels(broker_t *b, bool timeouts);
/* Counts partial samples recorded for a job a keep_partial cancel waits on. */
void broker_clients_on_partial(broker_t *b, const char *job_id, uint64_t n);
/* Reads the current weight version from anv:weights (start-up). */
void broker_clients_load_weights(broker_t *b);
/* Fills st from the job's hash (strings point into *h, which the caller frees). Returns 0,
   ANV_ENOTFOUND or ANV_EREDIS. */
int broker_clients_job_status(broker_t *b, const char *job_id, Anvil__JobStatus *st,
                              redisReply **h);

/* broker_observe.c: the Prometheus text and the status JSON, rebuilt every tick */
void broker_observe_tick(broker_t *b, int64_t now_ms);
/* Prometheus text of the broker's state (malloc'ed, *len set). */
char *broker_observe_metrics(broker_t *b, size_t *len);
/* The status JSON (malloc'ed, *len set); reads the recent jobs from Redis. */
char *broker_observe_status(broker_t *b, size_t *len);

void broker_hist_add(broker_hist_t *h, int64_t us);
double broker_hist_quantile(const broker_hist_t *h, double q);

#endif

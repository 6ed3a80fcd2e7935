/*  broker_client.h - the worker side of the broker protocol, for gen and exec workers.

    broker_client_new() starts a background thread that owns the DEALER socket to the broker's
    worker endpoint. It sends READY, then a heartbeat every heartbeat_ms (1 s) whatever the
    worker's own threads are doing, so a long GPU step never makes the worker look dead.
    Heartbeats carry the lease ids the worker holds, so the broker renews those leases (and
    re-adopts them after a broker restart). When nothing has come from the broker for
    heartbeat_misses intervals (3) the thread drops the socket and reconnects with a backoff of
    1 s, 2 s, ... 32 s, sending READY again; a DISCONNECT from the broker (it restarted and
    does not know us) triggers an immediate re-READY on the same socket.

    Units arrive through broker_client_recv(); the library records each unit's lease as held
    until the worker sends its end (GenResult with last, ExecDone, UnitFailed) or the broker
    cancels it. Results queued while the broker is away are kept and sent after reconnecting:
    lease ids name their unit, so a restarted broker still records them (once).

    Threads: broker_client_send() and the setters may be called from any thread;
    broker_client_recv() from one thread at a time. The struct is opaque.
*/
#ifndef BROKER_CLIENT_H
#define BROKER_CLIENT_H

#include "anvil.pb-c.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct broker_client_t broker_client_t;

typedef struct {
    const char *endpoint;        /* broker worker endpoint, e.g. "tcp://127.0.0.1:5556" */
    Anvil__WorkerKind kind;      /* ANVIL__WORKER_KIND__WORKER_GEN or _EXEC */
    const char *worker_id;       /* stable id; NULL or "" = "<hostname>-<gen|exec>-<pid>" */
    const char *hostname;        /* NULL = gethostname() */
    int32_t gpu_index;           /* -1 = CPU */
    const char *gpu_name;
    const char *model;
    uint64_t weight_version;
    uint32_t slots;              /* units held at once (credit); 0 = 1 */
    uint64_t kv_tokens;          /* gen: KV capacity in tokens */
    const char *const *capabilities; /* e.g. "kernelbench"; n_capabilities entries */
    size_t n_capabilities;
    int heartbeat_ms;            /* 0 = 1000 */
    int heartbeat_misses;        /* 0 = 3 */
    const char *curve_secret;    /* own zcert secret file (NULL/"" with curve_server: no CURVE) */
    const char *curve_server;    /* the broker's public key file (NAME.key) */
    const char *ready_file;      /* NULL/"": none; else written with the worker id once the
                                    broker first answers (readiness probes, scripts), removed
                                    by broker_client_destroy */
} broker_client_config_t;

/* Counters reported in heartbeats; set them with broker_client_set_stats(). */
typedef struct {
    uint64_t tokens_generated;
    uint64_t evals_done;
    uint64_t free_kv_tokens;
    uint64_t weight_version;
    bool has_queued;         /* gen: queued_samples is sent (its engine's queue) */
    uint32_t queued_samples; /* gen: samples its engine holds without KV */
} broker_client_stats_t;

/* Copies cfg, loads the CURVE keys, starts the thread and connects. Returns NULL (logged) on a
   bad config (one key file without the other, a key file that does not load) or when the
   thread cannot start; an unreachable broker is not an error (it keeps trying). */
broker_client_t *broker_client_new(const broker_client_config_t *cfg);
/* Sends what is still queued, then DISCONNECT, stops the thread. NULL-safe, idempotent. */
void broker_client_destroy(broker_client_t **self_p);

/* Waits up to timeout_ms (-1 = forever, 0 = poll) for the next message for the worker: a
   gen_unit, exec_unit, cancel_units or weights_update envelope. Returns it (the caller frees
   it with anv_msg_free) or NULL on timeout. */
Anvil__Envelope *broker_client_recv(broker_client_t *self, int timeout_ms);

/* Sends gen_result, exec_done, unit_failed, weights_loaded or credit. The envelope stays the
   caller's. Never drops: if the broker is away it is queued until reconnected. Thread-safe.
   Returns 0, -ENOMEM, or ANV_EPROTO for a body a worker does not send. */
int broker_client_send(broker_client_t *self, Anvil__Envelope *env);

/* Shortcuts for the common messages (thread-safe). `last` marks the unit's final sample. */
int broker_client_send_gen_result(broker_client_t *self, const char *lease_id,
                                  Anvil__Sample *sample, bool last);
int broker_client_send_exec_done(broker_client_t *self, const char *lease_id,
                                 Anvil__ExecResult *result);
int broker_client_send_unit_failed(broker_client_t *self, const char *lease_id, const char *error,
                                   bool retryable);

/* Gives a unit back for the worker's own reasons (draining, shutdown, queue full): the broker
   re-queues it without charging an attempt. Thread-safe. */
int broker_client_hand_back(broker_client_t *self, const char *lease_id, const char *why);
/* Says the worker is stopping: a heartbeat goes out at once and every later one says so; the
   broker sends it no new units. Idempotent, thread-safe. */
void broker_client_drain(broker_client_t *self);

/* Offers `credits` more concurrent units than slots (CREDIT message). Thread-safe. */
int broker_client_add_credit(broker_client_t *self, uint32_t credits);
/* Replaces the counters sent with each heartbeat. Thread-safe. */
void broker_client_set_stats(broker_client_t *self, const broker_client_stats_t *stats);
/* Sends a heartbeat (with the counters set last) now rather than at the next interval: a gen
   worker whose engine's queue ran empty asks for more work so. Thread-safe. */
void broker_client_heartbeat_now(broker_client_t *self);

/* Leases currently held (received, not yet ended). Thread-safe. */
size_t broker_client_held(broker_client_t *self);
/* True while the broker answers heartbeats. Thread-safe. */
bool broker_client_connected(broker_client_t *self);
/* Times the thread dropped the socket and reconnected. Thread-safe. */
uint64_t broker_client_reconnects(broker_client_t *self);
/* The worker id in use (borrowed). */
const char *broker_client_worker_id(const broker_client_t *self);

#endif

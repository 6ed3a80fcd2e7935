/*  broker.h - the Anvil broker: client and worker ROUTERs over a durable queue in Redis.

    broker_new() binds both sockets, connects to Redis, checks durability settings and rebuilds
    the in-memory indexes (live jobs and their ready counts) from Redis. broker_run() is the
    single event loop: it reads worker and client messages in batches, commits each batch of
    results with one script call, leases ready units up to the credit workers advertised (one
    script call per dispatch round), sends them, and once per heartbeat interval sends
    heartbeats, detects dead workers, renews leases, expires stale ones and publishes counters
    (to Redis, and to the HTTP endpoint's snapshot when --metrics-endpoint is set).
    With curve_secret set, both ROUTERs are CURVE servers and broker_auth admits only the
    public keys in curve_allow; without keys only loopback endpoints may be bound, unless
    `insecure` says plaintext across hosts is meant.
    One thread owns the object. See broker/README.md for the protocol and the Redis keys.
*/
#ifndef BROKER_H
#define BROKER_H

#include <stdbool.h>
#include <stdint.h>

typedef struct broker_t broker_t;

typedef struct {
    const char *client_endpoint;  /* e.g. tcp://127.0.0.1:5555 */
    const char *worker_endpoint;  /* e.g. tcp://127.0.0.1:5556 */
    const char *redis_url;
    int64_t redis_timeout_ms;
    int64_t lease_ms;             /* lease length; renewed while the holder heartbeats */
    int64_t max_attempts;         /* default for jobs that do not set theirs */
    int64_t heartbeat_ms;
    int64_t heartbeat_misses;     /* a peer is dead after this many silent intervals */
    bool strict;                  /* --durability strict */
    int64_t batch;                /* most units leased / results committed per script call */
    int64_t gen_backlog;          /* samples a gen worker's engine may hold without KV (its
                                     queue, from heartbeats) before it is sent more units */
    int64_t max_msg;              /* largest accepted message in bytes */
    const char *metrics_endpoint; /* HOST:PORT of the HTTP endpoint (metrics, status); NULL or
                                     "" = none */
    const char *curve_secret;     /* own zcert secret file: both ROUTERs are CURVE servers;
                                     NULL or "" = plaintext */
    const char *curve_allow;      /* directory of the allowed peers' public keys (ZAP) */
    bool insecure;                /* allow plaintext on a non-loopback endpoint */
} broker_config_t;

/* Returns NULL (logged) when a socket cannot be bound, the CURVE keys or allow-list do not
   load, an endpoint is not loopback while there are no keys and `insecure` is off, Redis
   refuses strict durability, or memory runs out. An unreachable Redis is not fatal: the broker retries it. */
broker_t *broker_new(const broker_config_t *cfg);
void broker_destroy(broker_t **self_p);
/* Runs until SIGINT/SIGTERM (zsys_interrupted). Returns 0. */
int broker_run(broker_t *self);

#endif

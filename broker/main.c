/*  main.c - anvil-broker: parses the configuration and runs the broker.

    Configuration (defaults < --config file < ANVIL_<NAME> env < flags) is validated at start
    and logged once; everything else lives in broker.c and its modules.
*/
#include "anv_config.h"
#include "anv_error.h"
#include "anv_log.h"
#include "broker.h"

#include <czmq.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    char *client_ep = NULL, *worker_ep = NULL, *redis_url = NULL, *durability = NULL;
    char *log_level = NULL, *metrics_ep = NULL, *curve_secret = NULL, *curve_allow = NULL;
    bool log_json = false, insecure = false;
    int64_t lease_ms, max_attempts, hb_ms, hb_misses, batch, gen_backlog, redis_timeout, max_msg;
    const anv_cfg_opt_t opts[] = {
        {"client-endpoint", ANV_CFG_STR, "tcp://127.0.0.1:5555", 0, -1,
         "ROUTER endpoint for clients", &client_ep, false},
        {"worker-endpoint", ANV_CFG_STR, "tcp://127.0.0.1:5556", 0, -1,
         "ROUTER endpoint for workers", &worker_ep, false},
        {"redis-url", ANV_CFG_STR, "redis://127.0.0.1:6379", 0, -1, "Redis server", &redis_url,
         false},
        {"redis-timeout-ms", ANV_CFG_INT, "5000", 100, 600000, "Redis connect/command timeout",
         &redis_timeout, false},
        {"lease-ms", ANV_CFG_INT, "30000", 100, 86400000,
         "unit lease; renewed while its worker heartbeats", &lease_ms, false},
        {"max-attempts", ANV_CFG_INT, "3", 1, 1000,
         "attempts before a unit is dead-lettered (jobs may set their own)", &max_attempts,
         false},
        {"heartbeat-ms", ANV_CFG_INT, "1000", 50, 60000, "heartbeat interval", &hb_ms, false},
        {"heartbeat-misses", ANV_CFG_INT, "3", 2, 100, "silent intervals before a peer is dead",
         &hb_misses, false},
        {"durability", ANV_CFG_STR, "default", 0, -1,
         "default (appendfsync policy) or strict (WAITAOF, or appendfsync always)", &durability,
         false},
        {"batch", ANV_CFG_INT, "2000", 1, 100000, "most units / results per redis call", &batch,
         false},
        {"gen-backlog", ANV_CFG_INT, "64", 1, 1000000,
         "samples a gen worker's engine may hold queued (without KV) before it gets more units",
         &gen_backlog, false},
        {"max-msg", ANV_CFG_INT, "67108864", 1024, 1073741824, "largest message in bytes",
         &max_msg, false},
        {"metrics-endpoint", ANV_CFG_STR, "", 0, -1,
         "HOST:PORT for /metrics (Prometheus), /api/status and the status page; empty = off",
         &metrics_ep, false},
        {"curve-secret", ANV_CFG_STR, "", 0, -1,
         "the broker's zcert secret key file (anvil keys gen): CURVE on both sockets",
         &curve_secret, false},
        {"curve-allow", ANV_CFG_STR, "", 0, -1,
         "directory of the public key files (NAME.key) of the clients and workers let in",
         &curve_allow, false},
        {"insecure", ANV_CFG_BOOL, "false", 0, -1,
         "serve plaintext on a non-loopback endpoint when no keys are given", &insecure, false},
        {"log-level", ANV_CFG_STR, "info", 0, -1, "error|warn|info|debug|trace", &log_level,
         false},
        {"log-json", ANV_CFG_BOOL, "false", 0, -1, "JSON log lines", &log_json, false},
    };
    const size_t n_opts = sizeof opts / sizeof opts[0];
    anv_log_init("broker");
    char err[256];
    anv_cfg_rest_t rest;
    int rc = 1;
    broker_t *b = NULL;
    if (anv_config_load(opts, n_opts, argc, argv, &rest, err, sizeof err) != 0) {
        fprintf(stderr, "anvil-broker: %s\n", err);
        goto out;
    }
    if (rest.help) {
        printf("usage: anvil-broker [options]\n");
        anv_config_usage(opts, n_opts, stdout);
        rc = 0;
        goto out;
    }
    if (rest.argc) {
        fprintf(stderr, "anvil-broker: unexpected argument '%s'\n", rest.argv[0]);
        goto out;
    }
    int lvl = anv_log_level_parse(log_level);
    if (lvl < 0 || (strcmp(durability, "default") && strcmp(durability, "strict"))) {
        fprintf(stderr, "anvil-broker: bad %s '%s'\n", lvl < 0 ? "log-level" : "durability",
                lvl < 0 ? log_level : durability);
        goto out;
    }
    anv_log_set_level((anv_log_level_t)lvl);
    anv_log_set_json(log_json);
    anv_config_log(opts, n_opts);
    broker_config_t cfg = {
        .client_endpoint = client_ep,
        .worker_endpoint = worker_ep,
        .redis_url = redis_url,
        .redis_timeout_ms = redis_timeout,
        .lease_ms = lease_ms,
        .max_attempts = max_attempts,
        .heartbeat_ms = hb_ms,
        .heartbeat_misses = hb_misses,
        .strict = !strcmp(durability, "strict"),
        .batch = batch,
        .gen_backlog = gen_backlog,
        .max_msg = max_msg,
        .metrics_endpoint = metrics_ep,
        .curve_secret = curve_secret,
        .curve_allow = curve_allow,
        .insecure = insecure,
    };
    b = broker_new(&cfg);
    if (!b)
        goto out;
    rc = broker_run(b) == 0 ? 0 : 1;
out:
    broker_destroy(&b);
    anv_config_free(opts, n_opts, &rest);
    return rc;
}

/*  broker_store.h - the broker's Redis: one script, batched calls, durability checks.

    Every state transition is one EVALSHA of broker.lua (embedded at build time) whose first
    argument names the operation; see broker/README.md for the operations and the key layout.
    Arguments are collected in a broker_args_t (strings and binary payloads are borrowed until
    the call returns; integers are copied). A script missing from the server (NOSCRIPT, e.g.
    after a Redis restart) is loaded again and the call repeated once. Error replies of the
    script ("ENOTFOUND ...", "ESTATE ...") are mapped to ANV_E* codes with the text in errstr.
    One thread (the broker loop) owns the object.
*/
#ifndef BROKER_STORE_H
#define BROKER_STORE_H

#include <hiredis/hiredis.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct broker_store_t broker_store_t;
typedef struct broker_args_t broker_args_t;

/* Connects to `url` and loads the script. Returns NULL (logged) when the URL is malformed;
   an unreachable server is retried by later calls. */
broker_store_t *broker_store_new(const char *url, int timeout_ms);
void broker_store_destroy(broker_store_t **self_p);

/* Checks the server's persistence settings for `strict` durability: 0 when AOF is on and
   strict writes can be made durable (WAITAOF on Redis >= 7.2, else appendfsync always);
   ANV_ECONFIG with the reason in errstr otherwise. Without strict, only warns. */
int broker_store_check_durability(broker_store_t *self, bool strict);
/* True when the server has WAITAOF (Redis >= 7.2), known after check_durability. */
bool broker_store_has_waitaof(const broker_store_t *self);
/* True when strict writes are possible: WAITAOF, or AOF with appendfsync always. */
bool broker_store_can_strict(const broker_store_t *self);
/* Blocks until the writes made so far are fsynced to the local AOF (WAITAOF 1 0 timeout) when
   the server has WAITAOF; with appendfsync always they already are. Returns 0, ANV_ETIMEOUT
   or ANV_EREDIS. */
int broker_store_wait_durable(broker_store_t *self, int timeout_ms);

/* Runs the script with `args`. Returns 0 with the reply in *out (caller frees with
   freeReplyObject; out may be NULL), ANV_EREDIS (connection, errstr), or the ANV_E* code of a
   script error. */
int broker_store_call(broker_store_t *self, broker_args_t *args, redisReply **out);
/* Runs one plain command (NUL-terminated arguments). Same return convention. */
int broker_store_cmd(broker_store_t *self, redisReply **out, int argc, const char **argv);

const char *broker_store_errstr(const broker_store_t *self);
bool broker_store_connected(const broker_store_t *self);
/* Script calls made and Redis round trips, for metrics. */
uint64_t broker_store_calls(const broker_store_t *self);
/* Logs, per script operation, the calls made and their summed round-trip time. */
void broker_store_log_ops(const broker_store_t *self);

/* Argument vectors. reset() starts a new call for operation `op`. */
broker_args_t *broker_args_new(void);
void broker_args_destroy(broker_args_t **self_p);
void broker_args_reset(broker_args_t *self, const char *op);
void broker_args_str(broker_args_t *self, const char *s);
void broker_args_bin(broker_args_t *self, const void *p, size_t len);
void broker_args_int(broker_args_t *self, int64_t v);
int broker_args_count(const broker_args_t *self);
/* false when memory ran out while adding: the call must not be made. */
bool broker_args_ok(const broker_args_t *self);

/* Reply helpers: element i of an array reply as an integer (or a string holding one), or as a
   borrowed string; defaults when absent or of another type. */
int64_t broker_reply_int(const redisReply *r, size_t i, int64_t def);
const char *broker_reply_str(const redisReply *r, size_t i, size_t *len);

#endif

/*  anv_redis.h - a hiredis connection that reconnects.

    Wraps one synchronous redisContext. A command that fails with an I/O error (the server
    restarted, the connection dropped) is retried once on a fresh connection before the error
    is returned; protocol-level error replies (REDIS_REPLY_ERROR) are returned as they are, for
    the caller to judge. Pipelining: anv_redis_append() queues commands, anv_redis_get_reply()
    reads their replies in order (no reconnect in the middle of a pipeline: an I/O error fails
    the rest of it). Errors are held in the object, as hiredis does (`err`, `errstr`).
    One thread at a time per object.

    URLs: "redis://host:port[/db]", "host:port", "host" (port 6379) or "unix:/path/to.sock".
*/
#ifndef ANV_REDIS_H
#define ANV_REDIS_H

#include <hiredis/hiredis.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct anv_redis_t anv_redis_t;

/* Makes an object for `url` and tries to connect within timeout_ms. Returns NULL only when
   the URL is malformed or memory runs out; a failed connect leaves it disconnected, with the
   reason in anv_redis_errstr(), and the next command tries again. */
anv_redis_t *anv_redis_new(const char *url, int timeout_ms);
void anv_redis_destroy(anv_redis_t **self_p);

/* Connects (or reconnects). Returns 0 or ANV_EREDIS. */
int anv_redis_connect(anv_redis_t *self);
bool anv_redis_connected(const anv_redis_t *self);

/* Runs one command (printf-style, as redisCommand). Returns the reply, owned by the caller
   (freeReplyObject), or NULL with errstr set. */
redisReply *anv_redis_command(anv_redis_t *self, const char *fmt, ...);
/* The same with an argument vector; argvlen may be NULL for NUL-terminated strings. */
redisReply *anv_redis_commandv(anv_redis_t *self, int argc, const char **argv,
                               const size_t *argvlen);

/* Pipelining: queue commands, then read each reply in order. Return 0 or ANV_EREDIS. */
int anv_redis_append(anv_redis_t *self, const char *fmt, ...);
int anv_redis_appendv(anv_redis_t *self, int argc, const char **argv, const size_t *argvlen);
int anv_redis_get_reply(anv_redis_t *self, redisReply **reply);

/* Runs a command and checks for an error reply: returns 0 (reply in *out when out is given,
   else freed) or ANV_EREDIS with the server's error text in errstr. */
int anv_redis_ok(anv_redis_t *self, redisReply **out, const char *fmt, ...);

const char *anv_redis_errstr(const anv_redis_t *self);
int anv_redis_err(const anv_redis_t *self);
/* How many times the connection was re-established. */
unsigned long anv_redis_reconnects(const anv_redis_t *self);
/* The underlying context (borrowed; NULL when disconnected), for callers that need hiredis. */
redisContext *anv_redis_context(anv_redis_t *self);

#endif

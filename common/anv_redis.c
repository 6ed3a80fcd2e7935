/*  anv_redis.c - reconnecting hiredis wrapper.

    The object owns at most one redisContext. On an I/O or EOF error the context is freed and
    the command is re-sent once on a new connection; a second failure is returned. Replies of
    type REDIS_REPLY_ERROR are not connection failures and are never retried here, because the
    command may not be idempotent.
*/
#include "anv_redis.h"
#include "anv_error.h"
#include "anv_log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct anv_redis_t {
    char host[256];
    int port;
    char unix_path[256];
    int db;
    int timeout_ms;
    redisContext *ctx;
    int err;
    char errstr[128];
    unsigned long reconnects;
    unsigned long connects;
};

static int s_parse_url(anv_redis_t *self, const char *url)
{
    if (!url || !*url)
        url = "127.0.0.1:6379";
    if (!strncmp(url, "unix:", 5)) {
        snprintf(self->unix_path, sizeof self->unix_path, "%s", url + 5);
        return self->unix_path[0] ? 0 : -1;
    }
    if (!strncmp(url, "redis://", 8))
        url += 8;
    const char *colon = strrchr(url, ':'), *slash = strchr(url, '/');
    size_t hl = colon ? (size_t)(colon - url) : (slash ? (size_t)(slash - url) : strlen(url));
    if (hl == 0 || hl >= sizeof self->host)
        return -1;
    memcpy(self->host, url, hl);
    self->host[hl] = 0;
    self->port = 6379;
    if (colon) {
        char *end;
        long p = strtol(colon + 1, &end, 10);
        if (p <= 0 || p > 65535 || (*end && *end != '/'))
            return -1;
        self->port = (int)p;
    }
    if (slash) {
        char *end;
        long db = strtol(slash + 1, &end, 10);
        if (*end || db < 0 || db > 1000)
            return -1;
        self->db = (int)db;
    }
    return 0;
}

anv_redis_t *anv_redis_new(const char *url, int timeout_ms)
{
    anv_redis_t *self = calloc(1, sizeof *self);
    if (!self)
        return NULL;
    if (s_parse_url(self, url) != 0) {
        ANV_ERROR("malformed redis url '%s'", url ? url : "");
        free(self);
        return NULL;
    }
    self->timeout_ms = timeout_ms > 0 ? timeout_ms : 2000;
    anv_redis_connect(self);
    return self;
}

void anv_redis_destroy(anv_redis_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    if ((*self_p)->ctx)
        redisFree((*self_p)->ctx);
    free(*self_p);
    *self_p = NULL;
}

static void s_fail(anv_redis_t *self, const char *what)
{
    self->err = ANV_EREDIS;
    snprintf(self->errstr, sizeof self->errstr, "%s", what);
}

int anv_redis_connect(anv_redis_t *self)
{
    if (self->ctx) {
        redisFree(self->ctx);
        self->ctx = NULL;
    }
    struct timeval tv = {self->timeout_ms / 1000, (self->timeout_ms % 1000) * 1000};
    redisContext *c = self->unix_path[0] ? redisConnectUnixWithTimeout(self->unix_path, tv)
                                         : redisConnectWithTimeout(self->host, self->port, tv);
    if (!c || c->err) {
        s_fail(self, c ? c->errstr : "cannot allocate redis context");
        if (c)
            redisFree(c);
        return ANV_EREDIS;
    }
    /* commands get the same timeout as the connect: a hung server cannot hang us forever */
    redisSetTimeout(c, tv);
    redisEnableKeepAlive(c);
    self->ctx = c;
    if (self->db) {
        redisReply *r = redisCommand(c, "SELECT %d", self->db);
        bool bad = !r || r->type == REDIS_REPLY_ERROR;
        if (r)
            freeReplyObject(r);
        if (bad) {
            s_fail(self, "cannot select redis database");
            redisFree(c);
            self->ctx = NULL;
            return ANV_EREDIS;
        }
    }
    if (self->connects++ > 0)
        self->reconnects++;
    self->err = 0;
    self->errstr[0] = 0;
    return 0;
}

bool anv_redis_connected(const anv_redis_t *self)
{
    return self->ctx && !self->ctx->err;
}

static redisReply *s_run(anv_redis_t *self, int argc, const char **argv, const size_t *lens)
{
    for (int attempt = 0; attempt < 2; attempt++) {
        if (!anv_redis_connected(self) && anv_redis_connect(self) != 0)
            continue;
        redisReply *r = redisCommandArgv(self->ctx, argc, argv, lens);
        if (r)
            return r;
        s_fail(self, self->ctx->errstr[0] ? self->ctx->errstr : "redis connection lost");
        redisFree(self->ctx);
        self->ctx = NULL;
    }
    return NULL;
}

redisReply *anv_redis_commandv(anv_redis_t *self, int argc, const char **argv,
                               const size_t *argvlen)
{
    return s_run(self, argc, argv, argvlen);
}

/* printf-style commands are formatted once into the RESP protocol, then sent raw, so a retry
   sends the identical bytes. */
static redisReply *s_run_formatted(anv_redis_t *self, const char *cmd, int len)
{
    for (int attempt = 0; attempt < 2; attempt++) {
        if (!anv_redis_connected(self) && anv_redis_connect(self) != 0)
            continue;
        void *r = NULL;
        if (redisAppendFormattedCommand(self->ctx, cmd, (size_t)len) == REDIS_OK &&
            redisGetReply(self->ctx, &r) == REDIS_OK && r)
            return r;
        s_fail(self, self->ctx->errstr[0] ? self->ctx->errstr : "redis connection lost");
        redisFree(self->ctx);
        self->ctx = NULL;
    }
    return NULL;
}

static redisReply *s_vcommand(anv_redis_t *self, const char *fmt, va_list ap)
{
    char *cmd = NULL;
    int len = redisvFormatCommand(&cmd, fmt, ap);
    if (len < 0) {
        s_fail(self, "cannot format redis command");
        return NULL;
    }
    redisReply *r = s_run_formatted(self, cmd, len);
    redisFreeCommand(cmd);
    return r;
}

redisReply *anv_redis_command(anv_redis_t *self, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = s_vcommand(self, fmt, ap);
    va_end(ap);
    return r;
}

int anv_redis_ok(anv_redis_t *self, redisReply **out, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = s_vcommand(self, fmt, ap);
    va_end(ap);
    if (out)
        *out = NULL;
    if (!r)
        return ANV_EREDIS;
    if (r->type == REDIS_REPLY_ERROR) {
        s_fail(self, r->str);
        freeReplyObject(r);
        return ANV_EREDIS;
    }
    if (out)
        *out = r;
    else
        freeReplyObject(r);
    return 0;
}

int anv_redis_append(anv_redis_t *self, const char *fmt, ...)
{
    if (!anv_redis_connected(self) && anv_redis_connect(self) != 0)
        return ANV_EREDIS;
    va_list ap;
    va_start(ap, fmt);
    int rc = redisvAppendCommand(self->ctx, fmt, ap);
    va_end(ap);
    if (rc != REDIS_OK) {
        s_fail(self, self->ctx->errstr);
        return ANV_EREDIS;
    }
    return 0;
}

int anv_redis_appendv(anv_redis_t *self, int argc, const char **argv, const size_t *argvlen)
{
    if (!anv_redis_connected(self) && anv_redis_connect(self) != 0)
        return ANV_EREDIS;
    if (redisAppendCommandArgv(self->ctx, argc, argv, argvlen) != REDIS_OK) {
        s_fail(self, self->ctx->errstr);
        return ANV_EREDIS;
    }
    return 0;
}

int anv_redis_get_reply(anv_redis_t *self, redisReply **reply)
{
    *reply = NULL;
    if (!self->ctx) {
        s_fail(self, "redis connection lost in a pipeline");
        return ANV_EREDIS;
    }
    void *r = NULL;
    if (redisGetReply(self->ctx, &r) != REDIS_OK || !r) {
        s_fail(self, self->ctx->errstr[0] ? self->ctx->errstr : "redis connection lost");
        redisFree(self->ctx);
        self->ctx = NULL;
        return ANV_EREDIS;
    }
    *reply = r;
    return 0;
}

const char *anv_redis_errstr(const anv_redis_t *self)
{
    return self->errstr;
}

int anv_redis_err(const anv_redis_t *self)
{
    return self->err;
}

unsigned long anv_redis_reconnects(const anv_redis_t *self)
{
    return self->reconnects;
}

redisContext *anv_redis_context(anv_redis_t *self)
{
    return self->ctx;
}

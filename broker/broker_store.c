/*  broker_store.c - Redis access for the broker.

    The script text comes from broker_lua.c (generated from broker.lua by CMake). Calls go
    through anv_redis, which reconnects once on an I/O error; a repeated call is harmless for
    every operation because each one is idempotent or guarded (results by an existence check,
    chunks by their key; a repeated lease only leaves leases that expire and are re-dispatched).
    Script calls are built directly in the Redis protocol (see broker_args_t) and sent as one
    buffer, so nothing is formatted per argument twice.
*/
#include "broker_store.h"
#include "anv_error.h"
#include "anv_log.h"
#include "anv_redis.h"
#include "anv_time.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern const char broker_lua_text[];

/* An argument vector is built directly in the Redis protocol (RESP): the call sends the
   buffer as it is, with no per-argument formatting by hiredis. The first S_HEAD bytes are kept
   free for the "*<argc>" header, written right-aligned at call time; the sha of EVALSHA sits
   at a fixed place and is filled in then too. */
#define S_HEAD 24

struct broker_args_t {
    char *buf;
    size_t len, cap;
    int argc;
    size_t sha_at;       /* offset of the 40 sha bytes */
    char op[16];
    bool oom;
};

struct broker_store_t {
    anv_redis_t *redis;
    char sha[41];
    bool loaded;
    bool waitaof;
    bool fsync_always; /* appendonly yes + appendfsync always */
    int err;
    char errstr[160];
    uint64_t calls;
    struct {
        char op[16];
        uint64_t calls, ns;
    } ops[16];
};

broker_args_t *broker_args_new(void)
{
    return calloc(1, sizeof(broker_args_t));
}

void broker_args_destroy(broker_args_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    free((*self_p)->buf);
    free(*self_p);
    *self_p = NULL;
}

static bool s_room(broker_args_t *a, size_t more)
{
    if (a->oom)
        return false;
    if (a->len + more <= a->cap)
        return true;
    size_t cap = a->cap ? a->cap : 65536;
    while (cap < a->len + more)
        cap *= 2;
    char *p = realloc(a->buf, cap);
    if (!p) {
        a->oom = true;
        return false;
    }
    a->buf = p;
    a->cap = cap;
    return true;
}

/* writes v in decimal at p; returns the number of bytes */
static size_t s_u64(char *p, uint64_t v)
{
    char tmp[24];
    size_t n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    for (size_t i = 0; i < n; i++)
        p[i] = tmp[n - 1 - i];
    return n;
}

static void s_push(broker_args_t *a, const void *p, size_t len)
{
    if (!s_room(a, len + 26))
        return;
    char *w = a->buf + a->len;
    *w++ = '$';
    w += s_u64(w, len);
    *w++ = '\r';
    *w++ = '\n';
    if (len)
        memcpy(w, p, len);
    w += len;
    *w++ = '\r';
    *w++ = '\n';
    a->len = (size_t)(w - a->buf);
    a->argc++;
}

void broker_args_reset(broker_args_t *self, const char *op)
{
    self->len = 0;
    self->argc = 0;
    self->oom = false;
    snprintf(self->op, sizeof self->op, "%s", op);
    if (!s_room(self, S_HEAD))
        return;
    self->len = S_HEAD;
    s_push(self, "EVALSHA", 7);
    self->sha_at = self->len + 5; /* after "$40\r\n" */
    s_push(self, "0000000000000000000000000000000000000000", 40);
    s_push(self, "0", 1);
    s_push(self, op, strlen(op));
}

void broker_args_str(broker_args_t *self, const char *s)
{
    s = s ? s : "";
    s_push(self, s, strlen(s));
}

void broker_args_bin(broker_args_t *self, const void *p, size_t len)
{
    s_push(self, p ? p : "", p ? len : 0);
}

void broker_args_int(broker_args_t *self, int64_t v)
{
    char tmp[24];
    size_t n = 0;
    if (v < 0) {
        tmp[n++] = '-';
        n += s_u64(tmp + n, (uint64_t)0 - (uint64_t)v);
    } else {
        n = s_u64(tmp, (uint64_t)v);
    }
    s_push(self, tmp, n);
}

int broker_args_count(const broker_args_t *self)
{
    return self->argc - 4;
}

bool broker_args_ok(const broker_args_t *self)
{
    return !self->oom;
}

/* the finished command: header written in front of the arguments; returns its start */
static const char *s_finish(broker_args_t *a, const char *sha, size_t *len)
{
    char head[S_HEAD];
    size_t n = 0;
    head[n++] = '*';
    n += s_u64(head + n, (uint64_t)a->argc);
    head[n++] = '\r';
    head[n++] = '\n';
    memcpy(a->buf + S_HEAD - n, head, n);
    memcpy(a->buf + a->sha_at, sha, 40);
    *len = a->len - (S_HEAD - n);
    return a->buf + S_HEAD - n;
}

static void s_fail(broker_store_t *self, int code, const char *msg)
{
    self->err = code;
    snprintf(self->errstr, sizeof self->errstr, "%s", msg ? msg : "unknown error");
}

static int s_load(broker_store_t *self)
{
    redisReply *r = anv_redis_command(self->redis, "SCRIPT LOAD %s", broker_lua_text);
    if (!r) {
        s_fail(self, ANV_EREDIS, anv_redis_errstr(self->redis));
        return ANV_EREDIS;
    }
    int rc = 0;
    if (r->type == REDIS_REPLY_STRING && r->len == 40) {
        memcpy(self->sha, r->str, 40);
        self->sha[40] = 0;
        self->loaded = true;
    } else {
        s_fail(self, ANV_EREDIS, r->type == REDIS_REPLY_ERROR ? r->str : "bad SCRIPT LOAD reply");
        ANV_ERROR("cannot load broker script: %s", self->errstr);
        rc = ANV_EREDIS;
    }
    freeReplyObject(r);
    return rc;
}

broker_store_t *broker_store_new(const char *url, int timeout_ms)
{
    broker_store_t *self = calloc(1, sizeof *self);
    if (!self)
        return NULL;
    self->redis = anv_redis_new(url, timeout_ms);
    if (!self->redis) {
        free(self);
        return NULL;
    }
    if (s_load(self) != 0)
        ANV_WARN("redis at '%s' not ready yet: %s", url, self->errstr);
    return self;
}

void broker_store_destroy(broker_store_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    anv_redis_destroy(&(*self_p)->redis);
    free(*self_p);
    *self_p = NULL;
}

static int s_code_of(const char *msg)
{
    /* the script's errors start with the code name; Redis may prefix "ERR " or similar */
    static const struct {
        const char *name;
        int code;
    } map[] = {{"ENOTFOUND", ANV_ENOTFOUND}, {"ESTATE", ANV_ESTATE}, {"EPROTO", ANV_EPROTO}};
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (strstr(msg, map[i].name))
            return map[i].code;
    return ANV_EREDIS;
}

static void s_account(broker_store_t *self, const char *op, size_t len, int64_t ns)
{
    for (size_t i = 0; i < sizeof self->ops / sizeof self->ops[0]; i++) {
        if (!self->ops[i].op[0] && len < sizeof self->ops[i].op) {
            memcpy(self->ops[i].op, op, len);
            self->ops[i].op[len] = 0;
        }
        if (strlen(self->ops[i].op) == len && !memcmp(self->ops[i].op, op, len)) {
            self->ops[i].calls++;
            self->ops[i].ns += (uint64_t)ns;
            return;
        }
    }
}

void broker_store_log_ops(const broker_store_t *self)
{
    char line[1024];
    size_t off = 0;
    line[0] = 0;
    for (size_t i = 0; i < sizeof self->ops / sizeof self->ops[0] && self->ops[i].op[0]; i++)
        off += (size_t)snprintf(line + off, sizeof line - off, " %s=%llu/%.1fms",
                                self->ops[i].op, (unsigned long long)self->ops[i].calls,
                                (double)self->ops[i].ns / 1e6);
    ANV_INFO("redis script calls (op=calls/round-trip time):%s", line);
}

/* sends a finished RESP command and reads its reply; reconnects once on an I/O error */
static redisReply *s_send_raw(broker_store_t *self, const char *cmd, size_t len)
{
    for (int attempt = 0; attempt < 2; attempt++) {
        if (!anv_redis_connected(self->redis) && anv_redis_connect(self->redis) != 0)
            continue;
        redisContext *ctx = anv_redis_context(self->redis);
        void *r = NULL;
        if (ctx && redisAppendFormattedCommand(ctx, cmd, len) == REDIS_OK &&
            redisGetReply(ctx, &r) == REDIS_OK && r)
            return r;
        /* the connection failed mid-call: the next attempt runs on a new one */
        s_fail(self, ANV_EREDIS, ctx && ctx->errstr[0] ? ctx->errstr : "redis connection lost");
        if (anv_redis_connect(self->redis) != 0)
            break;
    }
    if (!anv_redis_connected(self->redis))
        s_fail(self, ANV_EREDIS, anv_redis_errstr(self->redis));
    return NULL;
}

int broker_store_call(broker_store_t *self, broker_args_t *args, redisReply **out)
{
    if (out)
        *out = NULL;
    if (args->oom) {
        s_fail(self, -ENOMEM, "out of memory building a redis call");
        return -ENOMEM;
    }
    for (int attempt = 0; attempt < 2; attempt++) {
        if (!self->loaded && s_load(self) != 0)
            return ANV_EREDIS;
        size_t len;
        const char *cmd = s_finish(args, self->sha, &len);
        self->calls++;
        int64_t t0 = anv_now_ns();
        redisReply *r = s_send_raw(self, cmd, len);
        s_account(self, args->op, strlen(args->op), anv_now_ns() - t0);
        if (!r)
            return ANV_EREDIS;
        if (r->type == REDIS_REPLY_ERROR) {
            if (!strncmp(r->str, "NOSCRIPT", 8)) {
                freeReplyObject(r);
                self->loaded = false;
                continue;
            }
            int code = s_code_of(r->str);
            s_fail(self, code, r->str);
            freeReplyObject(r);
            return code;
        }
        if (out)
            *out = r;
        else
            freeReplyObject(r);
        self->err = 0;
        return 0;
    }
    s_fail(self, ANV_EREDIS, "script keeps disappearing (NOSCRIPT)");
    return ANV_EREDIS;
}

int broker_store_cmd(broker_store_t *self, redisReply **out, int argc, const char **argv)
{
    if (out)
        *out = NULL;
    self->calls++;
    redisReply *r = anv_redis_commandv(self->redis, argc, argv, NULL);
    if (!r) {
        s_fail(self, ANV_EREDIS, anv_redis_errstr(self->redis));
        return ANV_EREDIS;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        s_fail(self, ANV_EREDIS, r->str);
        freeReplyObject(r);
        return ANV_EREDIS;
    }
    if (out)
        *out = r;
    else
        freeReplyObject(r);
    return 0;
}

/* value of `name` in an INFO section or CONFIG GET reply text */
static bool s_info_field(const char *info, const char *name, char *out, size_t outlen)
{
    size_t nl = strlen(name);
    for (const char *p = info; p && *p;) {
        if (!strncmp(p, name, nl) && p[nl] == ':') {
            p += nl + 1;
            size_t k = strcspn(p, "\r\n");
            snprintf(out, outlen, "%.*s", (int)k, p);
            return true;
        }
        p = strchr(p, '\n');
        if (p)
            p++;
    }
    return false;
}

static bool s_config(broker_store_t *self, const char *name, char *out, size_t outlen)
{
    const char *argv[] = {"CONFIG", "GET", name};
    redisReply *r = NULL;
    out[0] = 0;
    if (broker_store_cmd(self, &r, 3, argv) != 0)
        return false;
    bool ok = r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
              r->element[1]->type == REDIS_REPLY_STRING;
    if (ok)
        snprintf(out, outlen, "%s", r->element[1]->str);
    freeReplyObject(r);
    return ok;
}

int broker_store_check_durability(broker_store_t *self, bool strict)
{
    const char *argv[] = {"INFO", "server"};
    redisReply *r = NULL;
    if (broker_store_cmd(self, &r, 2, argv) != 0)
        return ANV_EREDIS;
    char ver[32] = "";
    if (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS)
        s_info_field(r->str, "redis_version", ver, sizeof ver);
    freeReplyObject(r);
    int major = 0, minor = 0;
    sscanf(ver, "%d.%d", &major, &minor);
    self->waitaof = major > 7 || (major == 7 && minor >= 2);
    char aof[16], fsync[16];
    s_config(self, "appendonly", aof, sizeof aof);
    s_config(self, "appendfsync", fsync, sizeof fsync);
    self->fsync_always = !strcmp(aof, "yes") && !strcmp(fsync, "always");
    ANV_INFO("redis %s: appendonly=%s appendfsync=%s waitaof=%s", ver, aof, fsync,
             self->waitaof ? "yes" : "no");
    if (strcmp(aof, "yes") != 0) {
        if (strict) {
            s_fail(self, ANV_ECONFIG, "durability strict needs appendonly yes");
            return ANV_ECONFIG;
        }
        ANV_WARN("redis has appendonly=%s: accepted jobs are lost if redis dies", aof);
        return 0;
    }
    if (strict && !self->waitaof && strcmp(fsync, "always") != 0) {
        s_fail(self, ANV_ECONFIG,
               "durability strict needs WAITAOF (redis >= 7.2) or appendfsync always");
        return ANV_ECONFIG;
    }
    if (!strict && strcmp(fsync, "everysec") == 0)
        ANV_INFO("appendfsync everysec: up to ~1 s of acknowledged writes can be lost in a "
                 "power failure or kernel crash (not in a redis crash)");
    return 0;
}

bool broker_store_has_waitaof(const broker_store_t *self)
{
    return self->waitaof;
}

bool broker_store_can_strict(const broker_store_t *self)
{
    return self->waitaof || self->fsync_always;
}

int broker_store_wait_durable(broker_store_t *self, int timeout_ms)
{
    if (!self->waitaof)
        return 0; /* appendfsync always, checked at start: the reply came after the fsync */
    char t[24];
    snprintf(t, sizeof t, "%d", timeout_ms);
    const char *argv[] = {"WAITAOF", "1", "0", t};
    redisReply *r = NULL;
    int rc = broker_store_cmd(self, &r, 4, argv);
    if (rc != 0)
        return rc;
    bool ok = r->type == REDIS_REPLY_ARRAY && r->elements >= 1 &&
              r->element[0]->type == REDIS_REPLY_INTEGER && r->element[0]->integer >= 1;
    freeReplyObject(r);
    return ok ? 0 : ANV_ETIMEOUT;
}

const char *broker_store_errstr(const broker_store_t *self)
{
    return self->errstr;
}

bool broker_store_connected(const broker_store_t *self)
{
    return anv_redis_connected(self->redis);
}

uint64_t broker_store_calls(const broker_store_t *self)
{
    return self->calls;
}

int64_t broker_reply_int(const redisReply *r, size_t i, int64_t def)
{
    if (!r || r->type != REDIS_REPLY_ARRAY || i >= r->elements)
        return def;
    const redisReply *e = r->element[i];
    if (e->type == REDIS_REPLY_INTEGER)
        return e->integer;
    if (e->type == REDIS_REPLY_STRING) {
        char *end;
        long long v = strtoll(e->str, &end, 10);
        return end != e->str ? v : def;
    }
    return def;
}

const char *broker_reply_str(const redisReply *r, size_t i, size_t *len)
{
    if (len)
        *len = 0;
    if (!r || r->type != REDIS_REPLY_ARRAY || i >= r->elements)
        return "";
    const redisReply *e = r->element[i];
    if (e->type == REDIS_REPLY_STRING || e->type == REDIS_REPLY_STATUS) {
        if (len)
            *len = e->len;
        return e->str;
    }
    return "";
}

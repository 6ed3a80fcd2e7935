/*  broker_auth.c - the broker's ZAP handler (RFC 27) over a directory of public keys.

    A zactor: its thread owns the REP socket bound to the ZAP endpoint and the allow-list (a
    zhashx of Z85 public key -> file name). Requests are answered in order; each one first
    reads the directory again when the last reading is a second old, so the cost of a flood of
    handshakes is one directory scan a second. A reading that fails keeps the previous list.
    Whether the endpoint could be bound is handed back through `bound` before the actor
    signals, since zactor_new() drops the signal's status. The counters are atomics read by
    the broker's thread.
*/
#include "broker_auth.h"

#include "anv_curve.h"
#include "anv_log.h"
#include "anv_time.h"

#include <czmq.h>
#include <dirent.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define S_ZAP_ENDPOINT "inproc://zeromq.zap.01"
#define S_RESCAN_MS 1000
#define S_REFUSAL_FOLD_MS 60000

struct broker_auth_t {
    char *dir;
    zactor_t *actor;
    atomic_bool bound;
    atomic_uint_fast64_t allowed, refused, keys;
};

typedef struct {
    int64_t last_ms;
    uint64_t folded;
} s_refusal_t;

typedef struct {
    broker_auth_t *self;
    zsock_t *rep;
    zhashx_t *allow;         /* Z85 key -> file name (owned strings) */
    zhashx_t *refusals;      /* "domain key address" -> s_refusal_t (owned) */
    int64_t scanned_ms;
    struct timespec dir_mtime;
} s_state_t;

static void s_free(void **p)
{
    free(*p);
    *p = NULL;
}

/* Reads the directory into a new list. Problems with single files are logged only when the
   directory itself changed (loud), so a bad file is named once, not every second. */
static zhashx_t *s_read_dir(const char *path, bool loud)
{
    DIR *d = opendir(path);
    if (!d) {
        ANV_ERROR("cannot read the curve allow-list directory '%s': %s", path, strerror(errno));
        return NULL;
    }
    zhashx_t *h = zhashx_new();
    zhashx_set_destructor(h, s_free);
    size_t secrets = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *name = e->d_name;
        size_t n = strlen(name);
        if (name[0] == '.')
            continue;
        if (n > 7 && !strcmp(name + n - 7, "_secret")) {
            secrets++;
            continue;
        }
        char file[4096], err[512], pub[ANV_CURVE_KEY_TXT];
        if (snprintf(file, sizeof file, "%s/%s", path, name) >= (int)sizeof file)
            continue;
        struct stat st;
        if (stat(file, &st) != 0 || !S_ISREG(st.st_mode))
            continue; /* subdirectories are not searched */
        if (anv_curve_read_public(file, pub, err, sizeof err) != 0) {
            if (loud)
                ANV_WARN("curve allow-list: skipped, %s", err);
            continue;
        }
        const char *other = zhashx_lookup(h, pub);
        if (other) {
            if (loud)
                ANV_INFO("curve allow-list: '%s' repeats the key of '%s'", name, other);
            continue;
        }
        zhashx_insert(h, pub, strdup(name));
    }
    closedir(d);
    if (loud && secrets)
        ANV_WARN("curve allow-list '%s' holds %zu secret key file(s): they are skipped, but "
                 "only public keys (NAME.key) belong there",
                 path, secrets);
    return h;
}

static void s_rescan(s_state_t *st, bool first)
{
    int64_t now = anv_now_ms();
    if (!first && now - st->scanned_ms < S_RESCAN_MS)
        return;
    st->scanned_ms = now;
    struct stat ds;
    bool changed = first;
    if (stat(st->self->dir, &ds) == 0 && (ds.st_mtim.tv_sec != st->dir_mtime.tv_sec ||
                                           ds.st_mtim.tv_nsec != st->dir_mtime.tv_nsec)) {
        changed = true;
        st->dir_mtime = ds.st_mtim;
    }
    zhashx_t *h = s_read_dir(st->self->dir, changed);
    if (!h)
        return; /* keep the previous list */
    size_t before = st->allow ? zhashx_size(st->allow) : 0;
    zhashx_destroy(&st->allow);
    st->allow = h;
    atomic_store(&st->self->keys, zhashx_size(h));
    if (first || zhashx_size(h) != before) {
        if (zhashx_size(h))
            ANV_INFO("curve allow-list '%s': %zu public keys", st->self->dir, zhashx_size(h));
        else
            ANV_WARN("curve allow-list '%s' holds no public key: every client and worker is "
                     "refused",
                     st->self->dir);
    }
}

static void s_log_refusal(s_state_t *st, const char *domain, const char *addr, const char *key)
{
    char k[256];
    snprintf(k, sizeof k, "%s %s %s", domain, key, addr);
    int64_t now = anv_now_ms();
    s_refusal_t *r = zhashx_lookup(st->refusals, k);
    if (r && now - r->last_ms < S_REFUSAL_FOLD_MS) {
        r->folded++;
        return;
    }
    uint64_t folded = r ? r->folded : 0;
    if (!r) {
        if (zhashx_size(st->refusals) >= 10000)
            zhashx_purge(st->refusals);
        r = calloc(1, sizeof *r);
        if (!r)
            return;
        zhashx_insert(st->refusals, k, r);
    }
    r->last_ms = now;
    r->folded = 0;
    if (folded)
        ANV_WARN("curve: refused %s connection from %s: public key '%s' is not in the "
                 "allow-list '%s' (and %llu more times in the last minute)",
                 domain, addr, key, st->self->dir, (unsigned long long)folded);
    else
        ANV_WARN("curve: refused %s connection from %s: public key '%s' is not in the "
                 "allow-list '%s'",
                 domain, addr, key, st->self->dir);
}

static void s_reply(zsock_t *rep, const char *request_id, const char *code, const char *text,
                    const char *user)
{
    zstr_sendx(rep, "1.0", request_id, code, text, user, "", NULL);
}

/* One request: version, request id, domain, address, identity, mechanism, credentials... */
static void s_handle(s_state_t *st)
{
    zmsg_t *m = zmsg_recv(st->rep);
    if (!m)
        return;
    char *f[6] = {NULL};
    for (int i = 0; i < 6; i++)
        f[i] = zmsg_popstr(m);
    const char *domain = f[2] && *f[2] ? f[2] : "unnamed";
    const char *addr = f[3] && *f[3] ? f[3] : "an unknown address";
    if (!f[5] || !f[0] || strcmp(f[0], "1.0")) {
        ANV_ERROR("curve: malformed ZAP request (version '%s')", f[0] ? f[0] : "");
        s_reply(st->rep, f[1] ? f[1] : "", "500", "malformed ZAP request", "");
        goto out;
    }
    if (!strcmp(f[5], "NULL")) {
        /* only sockets without CURVE use NULL; the broker's CURVE sockets never do */
        s_reply(st->rep, f[1], "200", "OK", "");
        goto out;
    }
    if (strcmp(f[5], "CURVE")) {
        ANV_WARN("curve: refused %s connection from %s: mechanism %s", domain, addr, f[5]);
        atomic_fetch_add(&st->self->refused, 1);
        s_reply(st->rep, f[1], "400", "mechanism not allowed", "");
        goto out;
    }
    zframe_t *cred = zmsg_pop(m);
    char key[ANV_CURVE_KEY_TXT] = "";
    if (cred && zframe_size(cred) == 32)
        zmq_z85_encode(key, zframe_data(cred), 32);
    zframe_destroy(&cred);
    if (!key[0]) {
        ANV_ERROR("curve: ZAP request from %s without a 32-byte key", addr);
        s_reply(st->rep, f[1], "500", "malformed ZAP request", "");
        goto out;
    }
    s_rescan(st, false);
    const char *who = st->allow ? zhashx_lookup(st->allow, key) : NULL;
    if (who) {
        atomic_fetch_add(&st->self->allowed, 1);
        ANV_DEBUG("curve: allowed %s connection from %s with key '%s' (%s)", domain, addr, key,
                  who);
        s_reply(st->rep, f[1], "200", "OK", who);
    } else {
        atomic_fetch_add(&st->self->refused, 1);
        s_log_refusal(st, domain, addr, key);
        s_reply(st->rep, f[1], "400", "key not allowed", "");
    }
out:
    for (int i = 0; i < 6; i++)
        free(f[i]);
    zmsg_destroy(&m);
}

static void s_actor(zsock_t *pipe, void *arg)
{
    s_state_t st = {.self = arg};
    st.refusals = zhashx_new();
    zhashx_set_destructor(st.refusals, s_free);
    st.rep = zsock_new(ZMQ_REP);
    if (st.rep && zsock_bind(st.rep, S_ZAP_ENDPOINT) == 0) {
        s_rescan(&st, true);
        atomic_store(&st.self->bound, st.allow != NULL);
    } else {
        ANV_ERROR("cannot bind the ZAP endpoint '%s': %s", S_ZAP_ENDPOINT,
                  zmq_strerror(zmq_errno()));
    }
    zsock_signal(pipe, 0);
    /* not bound: serve only the pipe until broker_auth_destroy sends $TERM */
    zpoller_t *poller = zpoller_new(pipe, atomic_load(&st.self->bound) ? st.rep : NULL, NULL);
    if (poller)
        zpoller_set_nonstop(poller, true);
    while (poller) {
        void *which = zpoller_wait(poller, -1);
        if (which == pipe) {
            char *cmd = zstr_recv(pipe);
            bool term = !cmd || !strcmp(cmd, "$TERM");
            zstr_free(&cmd);
            if (term)
                break;
        } else if (which && which == st.rep) {
            s_handle(&st);
        } else if (zpoller_terminated(poller) && zmq_errno() == ETERM) {
            break; /* SIGINT is not a reason to stop: the broker's sockets live on a while */
        }
    }
    zpoller_destroy(&poller);
    if (st.rep)
        zsock_unbind(st.rep, S_ZAP_ENDPOINT);
    zsock_destroy(&st.rep);
    zhashx_destroy(&st.allow);
    zhashx_destroy(&st.refusals);
}

broker_auth_t *broker_auth_new(const char *allow_dir)
{
    broker_auth_t *self = calloc(1, sizeof *self);
    if (!self || !(self->dir = strdup(allow_dir)))
        goto fail;
    struct stat st;
    if (stat(allow_dir, &st) != 0) {
        ANV_ERROR("cannot use --curve-allow '%s': %s", allow_dir, strerror(errno));
        goto fail;
    }
    if (!S_ISDIR(st.st_mode)) {
        ANV_ERROR("--curve-allow '%s' is not a directory (it holds the public keys of the "
                  "allowed clients and workers)",
                  allow_dir);
        goto fail;
    }
    self->actor = zactor_new(s_actor, self);
    if (!self->actor || !atomic_load(&self->bound))
        goto fail;
    return self;
fail:
    broker_auth_destroy(&self);
    return NULL;
}

void broker_auth_destroy(broker_auth_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    broker_auth_t *self = *self_p;
    zactor_destroy(&self->actor);
    free(self->dir);
    free(self);
    *self_p = NULL;
}

uint64_t broker_auth_allowed(const broker_auth_t *self)
{
    return atomic_load(&((broker_auth_t *)self)->allowed);
}

uint64_t broker_auth_refused(const broker_auth_t *self)
{
    return atomic_load(&((broker_auth_t *)self)->refused);
}

uint64_t broker_auth_keys(const broker_auth_t *self)
{
    return atomic_load(&((broker_auth_t *)self)->keys);
}

/*  anv_curve.c - CURVE keys: loading zcert files, applying them to sockets, making key pairs.

    Files are parsed with zconfig (the zcert format is ZPL) rather than zcert_load, which
    quietly prefers FILE_secret over FILE and cannot say what is wrong with a file. Secret
    files readable by group or others load with a warning, not an error: Kubernetes mounts
    secrets 0644 unless told otherwise. Key generation goes through zcert (libsodium via
    libzmq), and the secret file is made 0600 explicitly whatever the umask.
*/
#include "anv_curve.h"

#include "anv_error.h"
#include "anv_log.h"

#include <arpa/inet.h>
#include <stdatomic.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define S_MAX_FILE (64 * 1024)

struct anv_curve_t {
    uint8_t public_key[32], secret_key[32], server_key[32];
    bool has_server;
    char public_txt[ANV_CURVE_KEY_TXT];
};

/* Loads one zcert file: its public key (required) and, when secret is not NULL, its secret
   key (required then). */
static int s_load(const char *file, char *pub, char *secret, char *err, size_t errlen)
{
    struct stat st;
    if (stat(file, &st) != 0) {
        int e = errno;
        snprintf(err, errlen, "cannot read key file '%s': %s", file, strerror(e));
        return -e;
    }
    if (!S_ISREG(st.st_mode) || st.st_size > S_MAX_FILE) {
        snprintf(err, errlen, "key file '%s' is not a zcert file (%s)", file,
                 S_ISREG(st.st_mode) ? "too large" : "not a regular file");
        return ANV_EFORMAT;
    }
    /* read it ourselves and parse the text: CZMQ 4.2.1's zconfig_load leaks its zfile when
       the file does not parse (LeakSanitizer in the ASan stage); zconfig_str_load does not */
    char text[S_MAX_FILE + 1];
    FILE *f = fopen(file, "r");
    if (!f) {
        int e = errno;
        snprintf(err, errlen, "cannot read key file '%s': %s", file, strerror(e));
        return -e;
    }
    size_t got = fread(text, 1, S_MAX_FILE, f);
    fclose(f);
    text[got] = '\0';
    zconfig_t *root = memchr(text, '\0', got) ? NULL : zconfig_str_load(text);
    if (!root) {
        snprintf(err, errlen, "cannot read key file '%s': not in zcert format", file);
        return ANV_EFORMAT;
    }
    int rc = 0;
    const char *p = zconfig_get(root, "curve/public-key", NULL);
    const char *s = zconfig_get(root, "curve/secret-key", NULL);
    if (!p || strlen(p) != 40) {
        snprintf(err, errlen, "key file '%s' has no curve public-key of 40 Z85 characters",
                 file);
        rc = ANV_EFORMAT;
        goto out;
    }
    uint8_t bin[32];
    if (!zmq_z85_decode(bin, p)) {
        snprintf(err, errlen, "key file '%s': the public key is not valid Z85", file);
        rc = ANV_EFORMAT;
        goto out;
    }
    snprintf(pub, ANV_CURVE_KEY_TXT, "%s", p);
    if (!secret)
        goto out;
    if (!s || strlen(s) != 40 || !zmq_z85_decode(bin, s)) {
        snprintf(err, errlen,
                 "key file '%s' holds no secret key (give the NAME.key_secret file, made by "
                 "`anvil keys gen`)",
                 file);
        rc = ANV_EFORMAT;
        goto out;
    }
    char derived[ANV_CURVE_KEY_TXT];
    if (zmq_curve_public(derived, s) != 0 || strcmp(derived, p)) {
        snprintf(err, errlen, "key file '%s': its public key is not the one of its secret key",
                 file);
        rc = ANV_EFORMAT;
        goto out;
    }
    snprintf(secret, ANV_CURVE_KEY_TXT, "%s", s);
    if (st.st_mode & 077)
        ANV_WARN("secret key file '%s' is readable by others (mode %03o): chmod 600 it", file,
                 (unsigned)(st.st_mode & 0777));
out:
    zconfig_destroy(&root);
    return rc;
}

anv_curve_t *anv_curve_new(const char *secret_file, const char *server_file, char *err,
                           size_t errlen)
{
    anv_curve_t *self = calloc(1, sizeof *self);
    char *alt = NULL;
    char sec[ANV_CURVE_KEY_TXT], pub[ANV_CURVE_KEY_TXT];
    if (!self) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    if (!secret_file || !*secret_file) {
        snprintf(err, errlen, "no secret key file given");
        goto fail;
    }
    /* NAME.key given where NAME.key_secret is meant: take the secret file beside it */
    const char *file = secret_file;
    size_t n = strlen(secret_file);
    if (n > 4 && !strcmp(secret_file + n - 4, ".key") && (alt = malloc(n + 8))) {
        snprintf(alt, n + 8, "%s_secret", secret_file);
        if (access(alt, F_OK) == 0)
            file = alt;
    }
    if (s_load(file, self->public_txt, sec, err, errlen) != 0)
        goto fail;
    zmq_z85_decode(self->public_key, self->public_txt);
    zmq_z85_decode(self->secret_key, sec);
    if (server_file && *server_file) {
        if (s_load(server_file, pub, NULL, err, errlen) != 0)
            goto fail;
        zmq_z85_decode(self->server_key, pub);
        self->has_server = true;
    }
    free(alt);
    return self;
fail:
    free(alt);
    anv_curve_destroy(&self);
    return NULL;
}

void anv_curve_destroy(anv_curve_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    /* the secret key does not outlive the object in freed memory */
    volatile uint8_t *p = (volatile uint8_t *)*self_p;
    for (size_t i = 0; i < sizeof **self_p; i++)
        p[i] = 0;
    free(*self_p);
    *self_p = NULL;
}

int anv_curve_client_config(const char *secret_file, const char *server_file, anv_curve_t **out,
                            char *err, size_t errlen)
{
    *out = NULL;
    bool has_secret = secret_file && *secret_file, has_server = server_file && *server_file;
    if (!has_secret && !has_server)
        return 0;
    if (has_secret != has_server) {
        snprintf(err, errlen, "CURVE needs both --curve-secret (own key) and --curve-server "
                              "(the broker's public key); only %s was given",
                 has_secret ? "--curve-secret" : "--curve-server");
        return ANV_ECONFIG;
    }
    *out = anv_curve_new(secret_file, server_file, err, errlen);
    return *out ? 0 : ANV_ECONFIG;
}

void anv_curve_server(const anv_curve_t *self, zsock_t *sock, const char *domain)
{
    void *s = zsock_resolve(sock);
    int one = 1;
    zmq_setsockopt(s, ZMQ_CURVE_SERVER, &one, sizeof one);
    zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, self->secret_key, 32);
    zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, self->public_key, 32);
    if (domain)
        zmq_setsockopt(s, ZMQ_ZAP_DOMAIN, domain, strlen(domain));
}

int anv_curve_client(const anv_curve_t *self, zsock_t *sock)
{
    if (!self->has_server)
        return ANV_ECONFIG;
    void *s = zsock_resolve(sock);
    zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, self->server_key, 32);
    zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, self->public_key, 32);
    zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, self->secret_key, 32);
    return 0;
}

const char *anv_curve_public_txt(const anv_curve_t *self)
{
    return self->public_txt;
}

int anv_curve_read_public(const char *file, char *pub, char *err, size_t errlen)
{
    return s_load(file, pub, NULL, err, errlen);
}

zsock_t *anv_curve_monitor_new(zsock_t *sock)
{
    /* a fresh name each time: a closed socket's monitor endpoint may linger a moment */
    static atomic_uint_fast64_t seq;
    char ep[64];
    snprintf(ep, sizeof ep, "inproc://anv-curve-monitor-%llu",
             (unsigned long long)atomic_fetch_add(&seq, 1));
    int events = ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                 ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL;
    if (zmq_socket_monitor(zsock_resolve(sock), ep, events) != 0)
        return NULL;
    zsock_t *mon = zsock_new(ZMQ_PAIR);
    if (mon && zsock_connect(mon, "%s", ep) != 0)
        zsock_destroy(&mon);
    if (mon)
        zsock_set_linger(mon, 0);
    return mon;
}

int anv_curve_monitor_read(zsock_t *monitor)
{
    int rc = 0;
    void *s = zsock_resolve(monitor);
    for (;;) {
        /* an event is two frames: (uint16 event, uint32 value), then the endpoint */
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, s, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            return rc;
        }
        uint16_t ev = 0;
        if (zmq_msg_size(&m) >= 6)
            memcpy(&ev, zmq_msg_data(&m), 2);
        while (zmq_msg_more(&m) && zmq_msg_recv(&m, s, ZMQ_DONTWAIT) >= 0)
            ;
        zmq_msg_close(&m);
        if (ev == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
            rc = ANV_EAUTH;
        else if (rc == 0 && (ev == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL ||
                             ev == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL))
            rc = ANV_EPROTO;
    }
}

bool anv_curve_endpoint_local(const char *ep)
{
    if (!ep)
        return false;
    if (!strncmp(ep, "ipc://", 6) || !strncmp(ep, "inproc://", 9))
        return true;
    if (strncmp(ep, "tcp://", 6))
        return false; /* pgm, ws, ...: assume they leave the host */
    const char *host = ep + 6, *colon = strrchr(host, ':');
    if (!colon || colon == host || strchr(host, ';'))
        return false;
    char h[256];
    size_t n = (size_t)(colon - host);
    if (n >= sizeof h)
        return false;
    memcpy(h, host, n);
    h[n] = 0;
    char *addr = h;
    if (h[0] == '[' && n > 2 && h[n - 1] == ']') {
        h[n - 1] = 0;
        addr = h + 1;
    }
    if (!strcmp(addr, "localhost"))
        return true;
    struct in_addr v4;
    struct in6_addr v6;
    if (inet_pton(AF_INET, addr, &v4) == 1)
        return (ntohl(v4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, addr, &v6) == 1)
        return IN6_IS_ADDR_LOOPBACK(&v6);
    return false; /* '*', interface names, other host names */
}

static bool s_name_ok(const char *name)
{
    if (!name || !*name || strlen(name) > 64 || name[0] == '.')
        return false;
    for (const char *p = name; *p; p++)
        if (!(*p >= 'a' && *p <= 'z') && !(*p >= 'A' && *p <= 'Z') && !(*p >= '0' && *p <= '9') &&
            *p != '-' && *p != '_' && *p != '.')
            return false;
    return true;
}

int anv_curve_keygen(const char *dir, const char *name, bool force, char *pub, char *err,
                     size_t errlen)
{
    if (!s_name_ok(name)) {
        snprintf(err, errlen, "bad key name '%s' (letters, digits, '-', '_', '.'; at most 64)",
                 name ? name : "");
        return ANV_ECONFIG;
    }
    char path[4096], secret[4200];
    if (snprintf(path, sizeof path, "%s/%s.key", dir, name) >= (int)sizeof path) {
        snprintf(err, errlen, "key directory path too long");
        return -ENAMETOOLONG;
    }
    snprintf(secret, sizeof secret, "%s_secret", path);
    if (!force && (access(path, F_OK) == 0 || access(secret, F_OK) == 0)) {
        snprintf(err, errlen, "'%s' already exists (keys are never replaced without --force: "
                              "peers that hold the old public key would be locked out)",
                 access(path, F_OK) == 0 ? path : secret);
        return -EEXIST;
    }
    zcert_t *cert = zcert_new();
    if (!cert) {
        snprintf(err, errlen, "cannot make a key pair (libzmq without CURVE?)");
        return ANV_EUNSUPPORTED;
    }
    zcert_set_meta(cert, "name", "%s", name);
    zcert_set_meta(cert, "created-by", "anvil keys gen");
    int rc = 0;
    unlink(secret); /* a forced rewrite must not inherit a looser mode */
    errno = 0;
    if (zcert_save(cert, path) != 0 || chmod(secret, 0600) != 0) {
        rc = errno ? -errno : -EIO;
        snprintf(err, errlen, "cannot write '%s': %s", path, strerror(-rc));
        goto out;
    }
    if (pub)
        snprintf(pub, ANV_CURVE_KEY_TXT, "%s", zcert_public_txt(cert));
out:
    zcert_destroy(&cert);
    return rc;
}

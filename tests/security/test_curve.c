/*  test_curve.c - anv_curve (key files, endpoints, key generation) and broker_auth (the ZAP
    handler) over real CURVE handshakes on loopback TCP.

    Keys are made in a fresh temporary directory per test. The handshake tests bind a ROUTER
    as the broker does (anv_curve_server + broker_auth on an allow directory) and connect
    DEALERs with allowed, unknown and missing keys; a refused key must be reported by the
    client's handshake monitor (ANV_EAUTH), and a message from it must never arrive.
*/
#include "anv_curve.h"
#include "anv_error.h"
#include "anv_log.h"
#include "anv_time.h"
#include "broker_auth.h"

#include <czmq.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

static char s_dir[256];

static int s_setup(void **state)
{
    (void)state;
    snprintf(s_dir, sizeof s_dir, "/tmp/anvil-curve-XXXXXX");
    assert_non_null(mkdtemp(s_dir));
    return 0;
}

static int s_teardown(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", s_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void s_path(char *buf, size_t len, const char *rel)
{
    snprintf(buf, len, "%s/%s", s_dir, rel);
}

static void s_write(const char *rel, const char *text)
{
    char p[512];
    s_path(p, sizeof p, rel);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_endpoint_local(void **state)
{
    (void)state;
    const char *local[] = {"tcp://127.0.0.1:5555", "tcp://127.1.2.3:1", "tcp://localhost:5555",
                           "tcp://[::1]:5555", "tcp://::1:5555", "ipc:///tmp/x.sock",
                           "inproc://x", "tcp://127.0.0.1:*"};
    const char *remote[] = {"tcp://0.0.0.0:5555", "tcp://*:5555", "tcp://10.0.0.1:5555",
                            "tcp://eth0:5555", "tcp://[::]:5555", "tcp://128.0.0.1:1",
                            "tcp://broker.example:5555", "pgm://eth0;239.1.1.1:5555",
                            "tcp://127.0.0.1", "", "tcp://:5555", "ws://127.0.0.1:1"};
    for (size_t i = 0; i < sizeof local / sizeof *local; i++)
        assert_true(anv_curve_endpoint_local(local[i]));
    for (size_t i = 0; i < sizeof remote / sizeof *remote; i++)
        assert_false(anv_curve_endpoint_local(remote[i]));
    assert_false(anv_curve_endpoint_local(NULL));
}

static void test_keygen_loads_with_zcert(void **state)
{
    (void)state;
    char err[512], pub[ANV_CURVE_KEY_TXT], p[512], ps[512];
    assert_int_equal(anv_curve_keygen(s_dir, "worker", false, pub, err, sizeof err), 0);
    s_path(p, sizeof p, "worker.key");
    s_path(ps, sizeof ps, "worker.key_secret");
    struct stat st;
    assert_int_equal(stat(ps, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    /* CZMQ reads what we wrote: the public file alone, and the pair */
    zcert_t *c = zcert_load(ps);
    assert_non_null(c);
    assert_string_equal(zcert_public_txt(c), pub);
    assert_string_equal(zcert_meta(c, "name"), "worker");
    char derived[41];
    assert_int_equal(zmq_curve_public(derived, zcert_secret_txt(c)), 0);
    assert_string_equal(derived, pub);
    zcert_destroy(&c);
    char other[ANV_CURVE_KEY_TXT];
    assert_int_equal(anv_curve_read_public(p, other, err, sizeof err), 0);
    assert_string_equal(other, pub);
    /* never replaced without force; replaced (with a new key) with it */
    assert_int_equal(anv_curve_keygen(s_dir, "worker", false, NULL, err, sizeof err), -EEXIST);
    assert_non_null(strstr(err, "already exists"));
    assert_int_equal(anv_curve_keygen(s_dir, "worker", true, other, err, sizeof err), 0);
    assert_string_not_equal(other, pub);
    assert_int_equal(anv_curve_keygen(s_dir, "../evil", false, NULL, err, sizeof err),
                     ANV_ECONFIG);
    /* own keys from NAME.key_secret, or from NAME.key next to it */
    anv_curve_t *k = anv_curve_new(ps, p, err, sizeof err);
    assert_non_null(k);
    assert_string_equal(anv_curve_public_txt(k), other);
    anv_curve_destroy(&k);
    k = anv_curve_new(p, p, err, sizeof err);
    assert_non_null(k);
    anv_curve_destroy(&k);
    anv_curve_destroy(&k);
}

static void test_bad_key_files(void **state)
{
    (void)state;
    char err[512], p[512], ps[512];
    assert_int_equal(anv_curve_keygen(s_dir, "a", false, NULL, err, sizeof err), 0);
    assert_int_equal(anv_curve_keygen(s_dir, "b", false, NULL, err, sizeof err), 0);
    s_path(p, sizeof p, "missing.key_secret");
    assert_null(anv_curve_new(p, NULL, err, sizeof err));
    assert_non_null(strstr(err, "No such file"));
    /* a public file where the secret one is meant (no _secret beside it) */
    s_path(p, sizeof p, "a.key");
    char cp[1100];
    snprintf(cp, sizeof cp, "cp '%s' '%s/pub-only.key'", p, s_dir);
    assert_int_equal(system(cp), 0);
    s_path(p, sizeof p, "pub-only.key");
    assert_null(anv_curve_new(p, NULL, err, sizeof err));
    assert_non_null(strstr(err, "holds no secret key"));
    /* a's secret key with b's public key */
    s_path(ps, sizeof ps, "a.key_secret");
    zcert_t *a = zcert_load(ps);
    s_path(p, sizeof p, "b.key");
    zcert_t *b = zcert_load(p);
    assert_non_null(a);
    assert_non_null(b);
    char text[512];
    snprintf(text, sizeof text, "curve\n    public-key = \"%s\"\n    secret-key = \"%s\"\n",
             zcert_public_txt(b), zcert_secret_txt(a));
    s_write("mixed.key_secret", text);
    s_path(p, sizeof p, "mixed.key_secret");
    assert_null(anv_curve_new(p, NULL, err, sizeof err));
    assert_non_null(strstr(err, "not the one of its secret key"));
    zcert_destroy(&a);
    zcert_destroy(&b);
    s_write("garbage.key_secret", "\x01\x02 not a zcert file {{{\n");
    s_path(p, sizeof p, "garbage.key_secret");
    assert_null(anv_curve_new(p, NULL, err, sizeof err));
    s_write("short.key", "curve\n    public-key = \"abc\"\n");
    s_path(p, sizeof p, "short.key");
    char pub[ANV_CURVE_KEY_TXT];
    assert_int_equal(anv_curve_read_public(p, pub, err, sizeof err), ANV_EFORMAT);
    /* the connecting side needs both files or neither */
    anv_curve_t *k = (anv_curve_t *)1;
    assert_int_equal(anv_curve_client_config(NULL, "", &k, err, sizeof err), 0);
    assert_null(k);
    s_path(ps, sizeof ps, "a.key_secret");
    assert_int_equal(anv_curve_client_config(ps, NULL, &k, err, sizeof err), ANV_ECONFIG);
    assert_non_null(strstr(err, "--curve-server"));
}

/* ---- handshakes through broker_auth ---------------------------------------------------- */

typedef struct {
    zsock_t *router;
    broker_auth_t *auth;
    anv_curve_t *keys;
    char endpoint[64];
} s_server_t;

static void s_server_start(s_server_t *s, const char *allow)
{
    char err[512], p[512];
    s_path(p, sizeof p, "broker.key_secret");
    s->keys = anv_curve_new(p, NULL, err, sizeof err);
    assert_non_null(s->keys);
    s_path(p, sizeof p, allow);
    s->auth = broker_auth_new(p);
    assert_non_null(s->auth);
    s->router = zsock_new(ZMQ_ROUTER);
    anv_curve_server(s->keys, s->router, "worker");
    int port = zsock_bind(s->router, "tcp://127.0.0.1:*");
    assert_true(port > 0);
    snprintf(s->endpoint, sizeof s->endpoint, "tcp://127.0.0.1:%d", port);
}

static void s_server_stop(s_server_t *s)
{
    zsock_destroy(&s->router);
    broker_auth_destroy(&s->auth);
    anv_curve_destroy(&s->keys);
}

/* Connects with key NAME (NULL = plaintext), sends "hello" and says whether it arrived within
   wait_ms; *monitor_rc gets what the handshake monitor reported. */
static bool s_try(s_server_t *s, const char *name, int wait_ms, int *monitor_rc)
{
    char err[512], sec[512], srv[512];
    zsock_t *d = zsock_new(ZMQ_DEALER);
    zsock_set_linger(d, 0);
    anv_curve_t *k = NULL;
    zsock_t *mon = NULL;
    if (name) {
        snprintf(sec, sizeof sec, "%s/%s.key_secret", s_dir, name);
        s_path(srv, sizeof srv, "broker.key");
        k = anv_curve_new(sec, srv, err, sizeof err);
        assert_non_null(k);
        assert_int_equal(anv_curve_client(k, d), 0);
        mon = anv_curve_monitor_new(d);
        assert_non_null(mon);
    }
    assert_int_equal(zsock_connect(d, "%s", s->endpoint), 0);
    zstr_send(d, "hello");
    zpoller_t *p = zpoller_new(s->router, NULL);
    bool got = false;
    int mrc = 0;
    for (int t = 0; t < wait_ms && !got; t += 50) {
        if (zpoller_wait(p, 50) == s->router) {
            zmsg_t *m = zmsg_recv(s->router);
            got = m && zmsg_size(m) == 2;
            zmsg_destroy(&m);
        }
        if (mon && !mrc)
            mrc = anv_curve_monitor_read(mon);
    }
    zpoller_destroy(&p);
    *monitor_rc = mrc;
    zsock_destroy(&mon);
    zsock_destroy(&d);
    anv_curve_destroy(&k);
    return got;
}

static void s_copy_to_allow(const char *name)
{
    char cmd[700];
    snprintf(cmd, sizeof cmd, "cp '%s/%s.key' '%s/allow/%s.key'", s_dir, name, s_dir, name);
    assert_int_equal(system(cmd), 0);
}

static void test_zap_allow_list(void **state)
{
    (void)state;
    char err[512], p[512];
    const char *names[] = {"broker", "worker", "rogue", "late"};
    for (int i = 0; i < 4; i++)
        assert_int_equal(anv_curve_keygen(s_dir, names[i], false, NULL, err, sizeof err), 0);
    s_path(p, sizeof p, "allow");
    mkdir(p, 0700);
    s_copy_to_allow("worker");
    /* what must not break the list: the same key twice (CZMQ's zcertstore asserts on it), a
       secret file, a stray non-key file, a hidden file, a subdirectory */
    char cmd[3000];
    snprintf(cmd, sizeof cmd,
             "cp '%s/worker.key' '%s/allow/worker-copy.key' && cp '%s/rogue.key_secret' "
             "'%s/allow/' && echo hello > '%s/allow/README' && cp '%s/rogue.key' "
             "'%s/allow/.hidden' && mkdir '%s/allow/sub' && cp '%s/rogue.key' '%s/allow/sub/'",
             s_dir, s_dir, s_dir, s_dir, s_dir, s_dir, s_dir, s_dir, s_dir, s_dir);
    assert_int_equal(system(cmd), 0);
    s_server_t s = {0};
    s_server_start(&s, "allow");
    assert_int_equal(broker_auth_keys(s.auth), 1);
    int mrc;
    assert_true(s_try(&s, "worker", 3000, &mrc));
    assert_int_equal(mrc, 0);
    /* an unknown key: refused by ZAP, seen as such by the client, nothing delivered */
    assert_false(s_try(&s, "rogue", 1000, &mrc));
    assert_int_equal(mrc, ANV_EAUTH);
    assert_true(broker_auth_refused(s.auth) >= 1);
    /* no keys at all against a CURVE server */
    assert_false(s_try(&s, NULL, 1000, &mrc));
    /* a key added while running is let in within a second or so */
    assert_false(s_try(&s, "late", 500, &mrc));
    s_copy_to_allow("late");
    anv_sleep_ms(1100);
    assert_true(s_try(&s, "late", 3000, &mrc));
    assert_int_equal(broker_auth_keys(s.auth), 2);
    assert_true(broker_auth_allowed(s.auth) >= 2);
    s_server_stop(&s);
}

static void test_auth_bad_dir(void **state)
{
    (void)state;
    char p[512];
    s_path(p, sizeof p, "no-such-dir");
    assert_null(broker_auth_new(p));
    s_write("file", "x");
    s_path(p, sizeof p, "file");
    assert_null(broker_auth_new(p));
    /* the ZAP endpoint is the process's: a second handler cannot take it */
    broker_auth_t *a = broker_auth_new(s_dir);
    assert_non_null(a);
    assert_null(broker_auth_new(s_dir));
    broker_auth_destroy(&a);
    a = broker_auth_new(s_dir); /* free again once the first is gone */
    assert_non_null(a);
    broker_auth_destroy(&a);
    broker_auth_destroy(&a);
}

int main(void)
{
    anv_log_init("test");
    anv_log_set_level(ANV_LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_endpoint_local),
        cmocka_unit_test_setup_teardown(test_keygen_loads_with_zcert, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_bad_key_files, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_zap_allow_list, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_auth_bad_dir, s_setup, s_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*  test_anv_redis.c - the Redis wrapper against the fixture's real redis-server: commands,
    error replies, pipelining, reconnect after the server drops us, and a dead server. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "anv_error.h"
#include "anv_log.h"
#include "anv_redis.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char s_url[256];

static int s_setup(void **state)
{
    (void)state;
    const char *dir = getenv("ANVIL_TEST_REDIS_DIR");
    char path[512];
    snprintf(path, sizeof path, "%s/url", dir ? dir : ".");
    FILE *f = fopen(path, "r");
    if (!f || !fgets(s_url, sizeof s_url, f)) {
        fprintf(stderr, "no redis fixture at '%s'\n", path);
        return -1;
    }
    fclose(f);
    s_url[strcspn(s_url, "\n")] = 0;
    return 0;
}

static void test_commands(void **state)
{
    (void)state;
    anv_redis_t *r = anv_redis_new(s_url, 1000);
    assert_non_null(r);
    assert_true(anv_redis_connected(r));
    assert_int_equal(anv_redis_ok(r, NULL, "SET %s %b", "anv:test:k", "v\0x", (size_t)3), 0);
    redisReply *rep = NULL;
    assert_int_equal(anv_redis_ok(r, &rep, "GET anv:test:k"), 0);
    assert_int_equal(rep->len, 3);
    assert_memory_equal(rep->str, "v\0x", 3);
    freeReplyObject(rep);
    /* an error reply is an error with the server's text, and the connection stays usable */
    assert_int_equal(anv_redis_ok(r, NULL, "INCR anv:test:k"), ANV_EREDIS);
    assert_non_null(strstr(anv_redis_errstr(r), "not an integer"));
    const char *argv[] = {"DEL", "anv:test:k"};
    rep = anv_redis_commandv(r, 2, argv, NULL);
    assert_non_null(rep);
    assert_int_equal(rep->integer, 1);
    freeReplyObject(rep);
    anv_redis_destroy(&r);
    assert_null(r);
    anv_redis_destroy(&r); /* idempotent */
}

static void test_pipeline(void **state)
{
    (void)state;
    anv_redis_t *r = anv_redis_new(s_url, 1000);
    for (int i = 0; i < 1000; i++)
        assert_int_equal(anv_redis_append(r, "RPUSH anv:test:list %d", i), 0);
    for (int i = 0; i < 1000; i++) {
        redisReply *rep;
        assert_int_equal(anv_redis_get_reply(r, &rep), 0);
        assert_int_equal(rep->integer, i + 1);
        freeReplyObject(rep);
    }
    assert_int_equal(anv_redis_ok(r, NULL, "DEL anv:test:list"), 0);
    anv_redis_destroy(&r);
}

static void test_reconnect(void **state)
{
    (void)state;
    anv_redis_t *r = anv_redis_new(s_url, 1000);
    assert_int_equal(anv_redis_ok(r, NULL, "CLIENT SETNAME anvtestvictim"), 0);
    /* a second connection kills the first one, as a server restart would */
    anv_redis_t *killer = anv_redis_new(s_url, 1000);
    assert_int_equal(anv_redis_ok(killer, NULL, "CLIENT KILL TYPE normal SKIPME yes"), 0);
    anv_redis_destroy(&killer);
    unsigned long before = anv_redis_reconnects(r);
    redisReply *rep = anv_redis_command(r, "PING");
    assert_non_null(rep);
    assert_string_equal(rep->str, "PONG");
    freeReplyObject(rep);
    assert_int_equal(anv_redis_reconnects(r), before + 1);
    anv_redis_destroy(&r);
}

static void test_dead_server(void **state)
{
    (void)state;
    /* port 1 on loopback: nothing listens, connect is refused at once */
    anv_redis_t *r = anv_redis_new("redis://127.0.0.1:1", 200);
    assert_non_null(r);
    assert_false(anv_redis_connected(r));
    assert_true(strlen(anv_redis_errstr(r)) > 0);
    assert_null(anv_redis_command(r, "PING"));
    assert_int_equal(anv_redis_err(r), ANV_EREDIS);
    anv_redis_destroy(&r);
    assert_null(anv_redis_new("redis://:99999", 200));
    assert_null(anv_redis_new("redis://host:12/x", 200));
}

int main(void)
{
    anv_log_init("test_anv_redis");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_commands),
        cmocka_unit_test(test_pipeline),
        cmocka_unit_test(test_reconnect),
        cmocka_unit_test(test_dead_server),
    };
    return cmocka_run_group_tests(tests, s_setup, NULL);
}

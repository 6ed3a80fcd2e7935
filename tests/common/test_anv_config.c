/*  test_anv_config.c - precedence defaults < file < env < flags, bounds, types, positionals. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "anv_config.h"
#include "anv_error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char *s_url;
static int64_t s_port;
static double s_ratio;
static bool s_flag;

static const anv_cfg_opt_t s_opts[] = {
    {"redis-url", ANV_CFG_STR, "redis://127.0.0.1:6379", 0, -1, "redis", &s_url, false},
    {"port", ANV_CFG_INT, "5555", 1, 65535, "port", &s_port, false},
    {"ratio", ANV_CFG_DOUBLE, "0.5", 0, 1, "ratio", &s_ratio, false},
    {"verbose", ANV_CFG_BOOL, "false", 0, -1, "verbose", &s_flag, false},
};
#define N_OPTS (sizeof s_opts / sizeof *s_opts)

static int s_teardown(void **state)
{
    (void)state;
    anv_config_free(s_opts, N_OPTS, NULL);
    unsetenv("ANVIL_PORT");
    unsetenv("ANVIL_REDIS_URL");
    unsetenv("ANVIL_CONFIG");
    return 0;
}

static void test_defaults(void **state)
{
    (void)state;
    char err[256];
    char *argv[] = {"prog", NULL};
    assert_int_equal(anv_config_load(s_opts, N_OPTS, 1, argv, NULL, err, sizeof err), 0);
    assert_string_equal(s_url, "redis://127.0.0.1:6379");
    assert_int_equal(s_port, 5555);
    assert_true(s_ratio == 0.5);
    assert_false(s_flag);
}

static void test_precedence(void **state)
{
    (void)state;
    char path[] = "/tmp/anv_cfg_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fprintf(f, "# comment\nport = 6000\nredis_url = \"redis://file:1\"\nratio=0.25\n");
    fclose(f);
    setenv("ANVIL_PORT", "7000", 1);
    char err[256];
    char *argv[] = {"prog", "--config", path, "--ratio=0.75", "--verbose", "pos1", "--", "--pos2"};
    anv_cfg_rest_t rest;
    assert_int_equal(anv_config_load(s_opts, N_OPTS, 8, argv, &rest, err, sizeof err), 0);
    assert_string_equal(s_url, "redis://file:1"); /* file over default */
    assert_int_equal(s_port, 7000);               /* env over file */
    assert_true(s_ratio == 0.75);                 /* flag over file */
    assert_true(s_flag);
    assert_int_equal(rest.argc, 2);
    assert_string_equal(rest.argv[0], "pos1");
    assert_string_equal(rest.argv[1], "--pos2");
    assert_false(rest.help);
    anv_config_free(s_opts, N_OPTS, &rest);
    unlink(path);
}

static void test_errors(void **state)
{
    (void)state;
    char err[256];
    char *a1[] = {"prog", "--port", "70000"};
    assert_int_equal(anv_config_load(s_opts, N_OPTS, 3, a1, NULL, err, sizeof err), ANV_ECONFIG);
    assert_non_null(strstr(err, "outside"));
    char *a2[] = {"prog", "--port", "12x"};
    assert_int_equal(anv_config_load(s_opts, N_OPTS, 3, a2, NULL, err, sizeof err), ANV_ECONFIG);
    assert_non_null(strstr(err, "integer"));
    char *a3[] = {"prog", "--nope"};
    assert_int_equal(anv_config_load(s_opts, N_OPTS, 2, a3, NULL, err, sizeof err), ANV_ECONFIG);
    assert_non_null(strstr(err, "unknown option"));
    char *a4[] = {"prog", "--port"};
    assert_int_equal(anv_config_load(s_opts, N_OPTS, 2, a4, NULL, err, sizeof err), ANV_ECONFIG);
    char *a5[] = {"prog", "stray"};
    assert_int_equal(anv_config_load(s_opts, N_OPTS, 2, a5, NULL, err, sizeof err), ANV_ECONFIG);
    setenv("ANVIL_PORT", "abc", 1);
    char *a6[] = {"prog"};
    assert_int_equal(anv_config_load(s_opts, N_OPTS, 1, a6, NULL, err, sizeof err), ANV_ECONFIG);
    assert_non_null(strstr(err, "ANVIL_PORT"));
    unsetenv("ANVIL_PORT");
    setenv("ANVIL_CONFIG", "/nonexistent/anvil.conf", 1);
    assert_int_equal(anv_config_load(s_opts, N_OPTS, 1, a6, NULL, err, sizeof err), ANV_ECONFIG);
    assert_non_null(strstr(err, "cannot open"));
    unsetenv("ANVIL_CONFIG");
    char *a7[] = {"prog", "--verbose", "--no-verbose", "--ratio", "nan"};
    assert_int_equal(anv_config_load(s_opts, N_OPTS, 5, a7, NULL, err, sizeof err), ANV_ECONFIG);
    assert_false(s_flag);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_defaults, s_teardown),
        cmocka_unit_test_teardown(test_precedence, s_teardown),
        cmocka_unit_test_teardown(test_errors, s_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

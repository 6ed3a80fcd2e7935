/*  test_anv_log.c - one line per record, plain and JSON, level filtering before formatting. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "anv_log.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Runs fn with stderr redirected to a temp file; returns what was written (caller frees). */
static char *s_capture(void (*fn)(void))
{
    char path[] = "/tmp/anv_log_XXXXXX";
    int fd = mkstemp(path);
    int saved = dup(STDERR_FILENO);
    dup2(fd, STDERR_FILENO);
    fn();
    dup2(saved, STDERR_FILENO);
    close(saved);
    off_t n = lseek(fd, 0, SEEK_END);
    char *buf = calloc(1, (size_t)n + 1);
    pread(fd, buf, (size_t)n, 0);
    close(fd);
    unlink(path);
    return buf;
}

static int s_evaluated;
static int s_side_effect(void)
{
    return ++s_evaluated;
}

static void s_plain(void)
{
    anv_log_init("testcomp");
    anv_log_set_json(false);
    anv_log_set_level(ANV_LOG_INFO);
    ANV_INFO("cannot open '%s'", "x.txt");
    ANV_DEBUG("hidden %d", s_side_effect());
    ANV_JWARN("01ARZ3NDEKTSV4RRFFQ69G5FAV", "job slow");
}

static void s_json(void)
{
    anv_log_set_json(true);
    ANV_ERROR("quote \" and\nnewline");
    anv_log_set_json(false);
}

static void test_plain(void **state)
{
    (void)state;
    s_evaluated = 0;
    char *out = s_capture(s_plain);
    assert_int_equal(s_evaluated, 0); /* below the level: arguments not evaluated */
    char *nl = strchr(out, '\n');
    assert_non_null(nl);
    assert_non_null(strstr(out, " testcomp info cannot open 'x.txt'\n"));
    assert_non_null(strstr(nl + 1, " testcomp warn job slow job=01ARZ3NDEKTSV4RRFFQ69G5FAV\n"));
    assert_null(strstr(out, "hidden"));
    free(out);
}

static void test_json(void **state)
{
    (void)state;
    char *out = s_capture(s_json);
    assert_non_null(strstr(out, "\"level\":\"error\""));
    assert_non_null(strstr(out, "\"msg\":\"quote \\\" and\\u000anewline\"}\n"));
    assert_int_equal(strchr(out, '\n') - out, (long)strlen(out) - 1); /* one line */
    free(out);
}

static void test_parse(void **state)
{
    (void)state;
    assert_int_equal(anv_log_level_parse("debug"), ANV_LOG_DEBUG);
    assert_int_equal(anv_log_level_parse("nope"), -1);
    assert_int_equal(anv_log_level_parse(NULL), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plain),
        cmocka_unit_test(test_json),
        cmocka_unit_test(test_parse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

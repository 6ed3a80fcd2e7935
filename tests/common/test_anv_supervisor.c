/*  test_anv_supervisor.c - one child per GPU with its own CUDA_VISIBLE_DEVICES, restart after
    a crash, SIGTERM forwarded and waited for; GPU list parsing.

    The test binary is its own worker: run with "--gpu 0" (as the supervisor runs children) it
    records what it saw in $ANV_SUP_DIR, crashes once on its first run for GPU 3, then waits
    for SIGTERM and exits 0.
*/
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "anv_log.h"
#include "anv_supervisor.h"
#include "anv_time.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char s_dir[] = "/tmp/anv_sup_XXXXXX";

static int s_child_main(void)
{
    const char *dir = getenv("ANV_SUP_DIR"), *vis = getenv("CUDA_VISIBLE_DEVICES");
    char path[512], crashed[512];
    snprintf(crashed, sizeof crashed, "%s/crashed-%s", dir, vis);
    if (!strcmp(vis, "3") && access(crashed, F_OK) != 0) {
        FILE *f = fopen(crashed, "w");
        fclose(f);
        return 3; /* the first run of gpu 3 dies: the supervisor must restart it */
    }
    snprintf(path, sizeof path, "%s/up-%s", dir, vis);
    FILE *f = fopen(path, "w");
    fprintf(f, "%d\n", (int)getpid());
    fclose(f);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigprocmask(SIG_BLOCK, &set, NULL);
    int sig;
    sigwait(&set, &sig);
    snprintf(path, sizeof path, "%s/drained-%s", dir, vis);
    f = fopen(path, "w");
    fclose(f);
    return 0;
}

static bool s_exists(const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", s_dir, name);
    return access(path, F_OK) == 0;
}

static void test_supervise(void **state)
{
    char **argv = *state;
    setenv("ANV_SUP_DIR", s_dir, 1);
    pid_t sup = fork();
    if (sup == 0) {
        int gpus[] = {3, 5};
        char *args[] = {argv[0], NULL};
        _exit(anv_supervisor_run(args, gpus, 2, 5000));
    }
    int64_t deadline = anv_now_ms() + 10000;
    while (!(s_exists("up-3") && s_exists("up-5")) && anv_now_ms() < deadline)
        anv_sleep_ms(50);
    assert_true(s_exists("crashed-3")); /* died once ... */
    assert_true(s_exists("up-3"));      /* ... and was restarted */
    assert_true(s_exists("up-5"));
    kill(sup, SIGTERM);
    int status;
    assert_int_equal(waitpid(sup, &status, 0), sup);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_true(s_exists("drained-3"));
    assert_true(s_exists("drained-5"));
}

static void test_parse(void **state)
{
    (void)state;
    int g[8];
    assert_int_equal(anv_gpu_list_parse("0,2,3", g, 8), 3);
    assert_int_equal(g[2], 3);
    assert_int_equal(anv_gpu_list_parse("none", g, 8), 0);
    assert_int_equal(anv_gpu_list_parse("1,,x", g, 8), -1);
    assert_int_equal(anv_gpu_list_parse("-1", g, 8), -1);
    setenv("CUDA_VISIBLE_DEVICES", "4,5", 1);
    assert_int_equal(anv_gpu_count(), 2);
    assert_int_equal(anv_gpu_list_parse("all", g, 8), 2);
    setenv("CUDA_VISIBLE_DEVICES", "-1", 1);
    assert_int_equal(anv_gpu_count(), 0);
    unsetenv("CUDA_VISIBLE_DEVICES");
}

int main(int argc, char **argv)
{
    if (argc >= 3 && !strcmp(argv[argc - 2], "--gpu"))
        return s_child_main();
    anv_log_init("test_anv_supervisor");
    if (!mkdtemp(s_dir))
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_prestate(test_supervise, argv),
        cmocka_unit_test(test_parse),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", s_dir);
    if (system(cmd) != 0)
        return 1;
    return rc;
}

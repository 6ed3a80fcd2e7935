/*  anv_supervisor.c - fork/exec one worker per GPU, restart on death, forward signals.

    The supervisor blocks SIGCHLD/SIGTERM/SIGINT and waits for them with sigtimedwait, so there
    is no async-signal-safety to worry about: every reaction happens in the main loop. Children
    get the signals unblocked and the default dispositions back before exec.
*/
#include "anv_supervisor.h"
#include "anv_log.h"
#include "anv_time.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define ANV_SUP_MAX 64

int anv_gpu_count(void)
{
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    if (vis) {
        int n = 0;
        for (const char *p = vis; *p;) {
            while (*p == ' ' || *p == ',')
                p++;
            if (!*p)
                break;
            if (*p == '-') /* "-1" hides every device */
                return n;
            n++;
            while (*p && *p != ',')
                p++;
        }
        return n;
    }
    DIR *d = opendir("/proc/driver/nvidia/gpus");
    if (!d)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n;
}

int anv_gpu_list_parse(const char *spec, int *gpus, int max)
{
    if (!spec || !*spec || !strcmp(spec, "none"))
        return 0;
    if (!strcmp(spec, "all")) {
        int n = anv_gpu_count();
        if (n > max)
            n = max;
        for (int i = 0; i < n; i++)
            gpus[i] = i;
        return n;
    }
    int n = 0;
    const char *p = spec;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > 1023 || n >= max)
            return -1;
        gpus[n++] = (int)v;
        if (*end == ',')
            end++;
        else if (*end)
            return -1;
        p = end;
    }
    return n;
}

typedef struct {
    int gpu;
    pid_t pid;
    int64_t started_ms;
    int64_t backoff_ms;
    int64_t restart_at_ms; /* 0 = running or not due */
} s_child_t;

static pid_t s_spawn(char **argv, int gpu)
{
    int argc = 0;
    while (argv[argc])
        argc++;
    char **args = calloc((size_t)argc + 3, sizeof *args);
    if (!args)
        return -1;
    char gpu_arg[16];
    snprintf(gpu_arg, sizeof gpu_arg, "%d", 0); /* the child sees only its device, as 0 */
    for (int i = 0; i < argc; i++)
        args[i] = argv[i];
    args[argc] = "--gpu";
    args[argc + 1] = gpu_arg;
    pid_t pid = fork();
    if (pid == 0) {
        char vis[16];
        snprintf(vis, sizeof vis, "%d", gpu);
        setenv("CUDA_VISIBLE_DEVICES", vis, 1);
        sigset_t all;
        sigfillset(&all);
        sigprocmask(SIG_UNBLOCK, &all, NULL);
        signal(SIGTERM, SIG_DFL);
        signal(SIGINT, SIG_DFL);
        execv("/proc/self/exe", args);
        fprintf(stderr, "cannot exec worker: %s\n", strerror(errno));
        _exit(127);
    }
    free(args);
    return pid;
}

int anv_supervisor_run(char **argv, const int *gpus, int n_gpus, int grace_ms)
{
    if (n_gpus <= 0 || n_gpus > ANV_SUP_MAX) {
        ANV_ERROR("supervisor needs 1..%d gpus, got %d", ANV_SUP_MAX, n_gpus);
        return 1;
    }
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigprocmask(SIG_BLOCK, &set, NULL);

    s_child_t kids[ANV_SUP_MAX] = {0};
    for (int i = 0; i < n_gpus; i++) {
        kids[i].gpu = gpus[i];
        kids[i].backoff_ms = 1000;
        kids[i].pid = s_spawn(argv, gpus[i]);
        kids[i].started_ms = anv_now_ms();
        ANV_INFO("supervisor started worker pid %d on gpu %d", (int)kids[i].pid, gpus[i]);
    }
    int stop_sig = 0, failures = 0;
    while (!stop_sig) {
        struct timespec ts = {0, 200 * 1000000L};
        int sig = sigtimedwait(&set, NULL, &ts);
        if (sig == SIGTERM || sig == SIGINT)
            stop_sig = sig;
        int status;
        pid_t pid;
        while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
            for (int i = 0; i < n_gpus; i++) {
                if (kids[i].pid != pid)
                    continue;
                kids[i].pid = 0;
                if (stop_sig)
                    break;
                if (anv_now_ms() - kids[i].started_ms > 60000)
                    kids[i].backoff_ms = 1000;
                ANV_WARN("worker on gpu %d exited (%s %d); restarting in %lld ms", kids[i].gpu,
                         WIFSIGNALED(status) ? "signal" : "status",
                         WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status),
                         (long long)kids[i].backoff_ms);
                kids[i].restart_at_ms = anv_now_ms() + kids[i].backoff_ms;
                kids[i].backoff_ms = kids[i].backoff_ms * 2 > 32000 ? 32000 : kids[i].backoff_ms * 2;
            }
        }
        for (int i = 0; i < n_gpus && !stop_sig; i++) {
            if (!kids[i].pid && kids[i].restart_at_ms && anv_now_ms() >= kids[i].restart_at_ms) {
                kids[i].pid = s_spawn(argv, kids[i].gpu);
                kids[i].started_ms = anv_now_ms();
                kids[i].restart_at_ms = 0;
            }
        }
    }
    ANV_INFO("supervisor got signal %d: draining %d workers", stop_sig, n_gpus);
    for (int i = 0; i < n_gpus; i++)
        if (kids[i].pid > 0)
            kill(kids[i].pid, SIGTERM);
    int64_t deadline = anv_now_ms() + grace_ms;
    int alive = n_gpus;
    while (alive > 0) {
        alive = 0;
        for (int i = 0; i < n_gpus; i++) {
            if (kids[i].pid <= 0)
                continue;
            int status;
            pid_t r = waitpid(kids[i].pid, &status, WNOHANG);
            if (r == kids[i].pid) {
                if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
                    failures++;
                kids[i].pid = 0;
            } else {
                alive++;
            }
        }
        if (alive && anv_now_ms() > deadline) {
            ANV_WARN("supervisor: %d workers still running after %d ms, killing them", alive,
                     grace_ms);
            for (int i = 0; i < n_gpus; i++)
                if (kids[i].pid > 0)
                    kill(kids[i].pid, SIGKILL);
            failures += alive;
            deadline = INT64_MAX;
        }
        if (alive)
            anv_sleep_ms(50);
    }
    return failures ? 1 : 0;
}

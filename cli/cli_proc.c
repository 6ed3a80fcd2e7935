/*  cli_proc.c - child processes for the local cluster and the demo.

    fork + execve. The daemon child calls setsid() so that it outlives the terminal and a
    Ctrl-C of `anvil up`; its log file is opened O_APPEND so that restarts keep history. The
    parent learns of an exec failure through a close-on-exec pipe: the child writes errno to it
    and exits, so "cannot execute" is reported at spawn time rather than as an early death.
*/
#define _GNU_SOURCE
#include "cli_proc.h"

#include "anv_time.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static char **s_env(const char *const env_add[])
{
    size_t n = 0, k = 0;
    for (char **e = environ; *e; e++)
        n++;
    for (const char *const *a = env_add; a && *a; a++)
        n++;
    char **env = calloc(n + 1, sizeof *env);
    if (!env)
        return NULL;
    for (char **e = environ; *e; e++)
        if (strncmp(*e, "ANVIL_", 6))
            env[k++] = *e;
    for (const char *const *a = env_add; a && *a; a++)
        env[k++] = (char *)*a;
    env[k] = NULL;
    return env;
}

pid_t cli_proc_spawn_daemon(const char *bin, char *const argv[], const char *const env_add[],
                            const char *log_path, char *err, size_t errlen)
{
    char **env = s_env(env_add);
    int pfd[2];
    if (!env || pipe2(pfd, O_CLOEXEC) < 0) {
        snprintf(err, errlen, "cannot start '%s': %s", bin, strerror(errno));
        free(env);
        return -1;
    }
    int logfd = open(log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (logfd < 0) {
        snprintf(err, errlen, "cannot open log '%s': %s", log_path, strerror(errno));
        close(pfd[0]);
        close(pfd[1]);
        free(env);
        return -1;
    }
    pid_t pid = fork();
    if (pid == 0) {
        setsid();
        int nul = open("/dev/null", O_RDONLY);
        if (nul >= 0)
            dup2(nul, 0);
        dup2(logfd, 1);
        dup2(logfd, 2);
        signal(SIGPIPE, SIG_DFL);
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        execve(bin, argv, env);
        int e = errno;
        if (write(pfd[1], &e, sizeof e) < 0)
            _exit(127);
        _exit(127);
    }
    int e = errno;
    close(pfd[1]);
    close(logfd);
    free(env);
    if (pid < 0) {
        close(pfd[0]);
        snprintf(err, errlen, "cannot fork for '%s': %s", bin, strerror(e));
        return -1;
    }
    int child_errno = 0;
    ssize_t n = read(pfd[0], &child_errno, sizeof child_errno);
    close(pfd[0]);
    if (n == (ssize_t)sizeof child_errno) {
        waitpid(pid, NULL, 0);
        snprintf(err, errlen, "cannot execute '%s': %s", bin, strerror(child_errno));
        return -1;
    }
    return pid;
}

static bool s_exe_is(pid_t pid, const char *bin)
{
    char link[64], exe[PATH_MAX + 16];
    snprintf(link, sizeof link, "/proc/%d/exe", (int)pid);
    ssize_t n = readlink(link, exe, sizeof exe - 1);
    if (n < 0)
        return false;
    exe[n] = 0;
    char *del = strstr(exe, " (deleted)"); /* the binary was rebuilt while it ran */
    if (del && !del[10])
        *del = 0;
    return !strcmp(exe, bin);
}

static bool s_zombie(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return true;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *rp = strrchr(buf, ')');
    return !rp || (rp[1] == ' ' && (rp[2] == 'Z' || rp[2] == 'X'));
}

bool cli_proc_alive(pid_t pid, const char *bin)
{
    if (pid <= 0 || kill(pid, 0) < 0)
        return false;
    return s_exe_is(pid, bin) && !s_zombie(pid);
}

bool cli_proc_exited(pid_t pid, int *status)
{
    int st = 0;
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid || (r < 0 && errno == ECHILD && kill(pid, 0) < 0)) {
        if (status)
            *status = st;
        return true;
    }
    return false;
}

int cli_proc_stop(pid_t pid, const char *bin, double grace_s, bool *killed)
{
    *killed = false;
    if (!cli_proc_alive(pid, bin))
        return 0;
    if (kill(pid, SIGTERM) < 0)
        return errno == ESRCH ? 0 : -errno;
    double deadline = anv_now_s() + grace_s;
    for (;;) {
        waitpid(pid, NULL, WNOHANG); /* reaps it when it is our own child */
        if (!cli_proc_alive(pid, bin))
            return 0;
        if (anv_now_s() >= deadline)
            break;
        anv_sleep_ms(50);
    }
    *killed = true;
    if (kill(pid, SIGKILL) < 0 && errno != ESRCH)
        return -errno;
    for (int i = 0; i < 100 && cli_proc_alive(pid, bin); i++) {
        waitpid(pid, NULL, WNOHANG);
        anv_sleep_ms(20);
    }
    return cli_proc_alive(pid, bin) ? -ETIMEDOUT : 0;
}

int cli_proc_run(char *const argv[], char **out)
{
    int pfd[2] = {-1, -1};
    if (out) {
        *out = NULL;
        if (pipe2(pfd, O_CLOEXEC) < 0)
            return -1;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        if (out)
            dup2(pfd[1], 1);
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        signal(SIGPIPE, SIG_DFL);
        execv(argv[0], argv);
        _exit(127);
    }
    if (out)
        close(pfd[1]);
    if (pid < 0) {
        if (out)
            close(pfd[0]);
        return -1;
    }
    if (out) {
        size_t len = 0, cap = 4096;
        char *buf = malloc(cap);
        ssize_t n;
        while (buf && (n = read(pfd[0], buf + len, cap - len - 1)) != 0) {
            if (n < 0) {
                if (errno == EINTR)
                    continue;
                break;
            }
            len += (size_t)n;
            if (len + 1 >= cap) {
                char *b = realloc(buf, cap *= 2);
                if (!b) {
                    free(buf);
                    buf = NULL;
                    break;
                }
                buf = b;
            }
        }
        close(pfd[0]);
        if (buf)
            buf[len] = 0;
        *out = buf;
    }
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

const char *cli_proc_self(void)
{
    static char self[PATH_MAX];
    if (!self[0]) {
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        self[n > 0 ? n : 0] = 0;
    }
    return self;
}

static char *s_resolved_exe(const char *path)
{
    char buf[PATH_MAX];
    if (access(path, X_OK) != 0 || !realpath(path, buf))
        return NULL;
    struct stat st;
    if (stat(buf, &st) != 0 || !S_ISREG(st.st_mode))
        return NULL;
    return strdup(buf);
}

char *cli_proc_find(const char *subdir, const char *name)
{
    char dir[PATH_MAX], p[PATH_MAX + 512];
    snprintf(dir, sizeof dir, "%s", cli_proc_self());
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = 0;
    char *r;
    snprintf(p, sizeof p, "%s/../%s/%s", dir, subdir, name);
    if ((r = s_resolved_exe(p)))
        return r;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    if ((r = s_resolved_exe(p)))
        return r;
    const char *path = getenv("PATH");
    while (path && *path) {
        const char *colon = strchr(path, ':');
        size_t n = colon ? (size_t)(colon - path) : strlen(path);
        snprintf(p, sizeof p, "%.*s/%s", (int)n, path, name);
        if (n && (r = s_resolved_exe(p)))
            return r;
        path = colon ? colon + 1 : NULL;
    }
    return NULL;
}

void cli_proc_log_tail(const char *path, int lines)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    long from = size > 8192 ? size - 8192 : 0;
    fseek(f, from, SEEK_SET);
    char buf[8193];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    /* the last `lines` lines: start after the lines-th newline from the end */
    char *start = buf;
    int seen = 0;
    for (char *p = buf + n; p > buf; p--)
        if (p[-1] == '\n' && p != buf + n && ++seen == lines) {
            start = p;
            break;
        }
    fprintf(stderr, "  --- last lines of %s ---\n", path);
    for (char *line = start; *line;) {
        char *eol = strchr(line, '\n');
        fprintf(stderr, "  | %.*s\n", (int)(eol ? eol - line : (long)strlen(line)), line);
        line = eol ? eol + 1 : line + strlen(line);
    }
}

int cli_proc_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    int port = -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

/*  exec_proc.c - fork/exec with limits, and the reply reader.

    Design: the child, between fork and exec, starts a new session, moves its pipes to fds
    3/4 (and the seccomp program to 5), closes every other fd, sets the rlimits, drops to the
    sandbox uid/gid when asked and execs; nothing there allocates. The parent keeps
    non-blocking ends and uses poll() on the reply and log pipes, so a process that floods
    its stdout or never answers costs nothing but the deadline.
*/
#define _GNU_SOURCE
#include "exec_proc.h"

#include "anv_error.h"
#include "anv_log.h"
#include "anv_time.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/filter.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define EXEC_PROC_MAX_LINE (4u << 20)
#define EXEC_PROC_LOG_RING 8192

#define S_LOG_PIPE_BYTES (1 << 20)

struct exec_proc_t {
    pid_t pid;
    int cmd_fd, reply_fd, log_fd;
    char *io_dir;
    char inner_io[4096];
    char *buf; /* partial reply data */
    size_t len, cap;
    char log[EXEC_PROC_LOG_RING];
    size_t log_len;
    char log_out[EXEC_PROC_LOG_RING + 1];
    bool reaped, ready;
    int status;
    uint64_t started_ms, ready_ms;
    long next_id;
    char desc[64];
};

static void s_limit(int res, int64_t v, int64_t mult)
{
    if (v <= 0)
        return;
    struct rlimit rl = {.rlim_cur = (rlim_t)v * (rlim_t)mult, .rlim_max = (rlim_t)v * (rlim_t)mult};
    setrlimit(res, &rl);
}

static void s_child(char *const argv[], char *const envp[], const exec_proc_limits_t *lim,
                    int cmd_r, int reply_w, int log_w)
{
    setsid();
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    /* move the three pipes and the seccomp fd to their numbers without clobbering each other */
    int fds[3] = {cmd_r, reply_w, lim->seccomp_fd};
    for (int i = 0; i < 3; i++)
        if (fds[i] >= 0 && fds[i] < 10) {
            int n = fcntl(fds[i], F_DUPFD, 10);
            fds[i] = n;
        }
    if (dup2(log_w, 1) < 0 || dup2(log_w, 2) < 0 || dup2(fds[0], 3) < 0 || dup2(fds[1], 4) < 0)
        _exit(127);
    if (fds[2] >= 0 && dup2(fds[2], 5) < 0)
        _exit(127);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) {
        dup2(devnull, 0);
    }
    int keep = fds[2] >= 0 ? 5 : 4;
    if (syscall(SYS_close_range, keep + 1, ~0u, 0) != 0)
        for (int fd = keep + 1; fd < 4096; fd++)
            close(fd);
    s_limit(RLIMIT_AS, lim->as_mb, 1 << 20);
    s_limit(RLIMIT_DATA, lim->data_mb, 1 << 20);
    s_limit(RLIMIT_CPU, lim->cpu_s, 1);
    s_limit(RLIMIT_NOFILE, lim->nofile, 1);
    s_limit(RLIMIT_FSIZE, lim->fsize_mb, 1 << 20);
    struct rlimit core = {0, 0};
    setrlimit(RLIMIT_CORE, &core);
    if (lim->gid >= 0 && (setgroups(0, NULL) != 0 || setresgid((gid_t)lim->gid, (gid_t)lim->gid,
                                                                (gid_t)lim->gid) != 0))
        _exit(126);
    if (lim->uid >= 0 &&
        setresuid((uid_t)lim->uid, (uid_t)lim->uid, (uid_t)lim->uid) != 0)
        _exit(126);
    /* after the uid switch: RLIMIT_NPROC counts the processes of the new uid */
    s_limit(RLIMIT_NPROC, lim->nproc, 1);
    if (lim->seccomp_in_child && fds[2] >= 0) {
        /* rlimit mode: no bwrap to load the program, so load it here (no_new_privs first) */
        static struct sock_filter prog[8192];
        ssize_t n = pread(5, prog, sizeof prog, 0);
        if (n <= 0 || n % (ssize_t)sizeof prog[0])
            _exit(125);
        struct sock_fprog fp = {.len = (unsigned short)(n / (ssize_t)sizeof prog[0]),
                                .filter = prog};
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
            prctl(PR_SET_SECCOMP, 2 /* SECCOMP_MODE_FILTER */, &fp, 0, 0) != 0)
            _exit(125);
        close(5);
    }
    execve(argv[0], argv, envp);
    _exit(127);
}

exec_proc_t *exec_proc_start(char *const argv[],
                             char *const envp[],
                             const exec_proc_limits_t *lim,
                             const char *io_dir)
{
    int cmd[2] = {-1, -1}, rep[2] = {-1, -1}, lg[2] = {-1, -1};
    exec_proc_t *self = calloc(1, sizeof *self);
    if (!self || pipe2(cmd, O_CLOEXEC) || pipe2(rep, O_CLOEXEC) || pipe2(lg, O_CLOEXEC)) {
        ANV_ERROR("cannot create sandbox pipes: %s", strerror(errno));
        goto fail;
    }
    self->io_dir = strdup(io_dir);
    self->cmd_fd = cmd[1];
    self->reply_fd = rep[0];
    self->log_fd = lg[0];
    self->started_ms = anv_now_ms();
    self->pid = fork();
    if (self->pid < 0) {
        ANV_ERROR("cannot fork a sandbox: %s", strerror(errno));
        goto fail;
    }
    if (self->pid == 0) {
        /* the child's ends lose O_CLOEXEC through dup2 in s_child */
        s_child(argv, envp, lim, cmd[0], rep[1], lg[1]);
    }
    close(cmd[0]);
    close(rep[1]);
    close(lg[1]);
    fcntl(self->reply_fd, F_SETFL, O_NONBLOCK);
    fcntl(self->log_fd, F_SETFL, O_NONBLOCK);
    /* room for what a reference prints while the worker waits on the candidate (best effort:
       the kernel may cap it at /proc/sys/fs/pipe-max-size) */
    (void)fcntl(self->log_fd, F_SETPIPE_SZ, S_LOG_PIPE_BYTES);
    return self;
fail:
    for (int i = 0; i < 2; i++) {
        if (cmd[i] >= 0)
            close(cmd[i]);
        if (rep[i] >= 0)
            close(rep[i]);
        if (lg[i] >= 0)
            close(lg[i]);
    }
    if (self) {
        free(self->io_dir);
        free(self);
    }
    return NULL;
}

static void s_drain_log(exec_proc_t *self)
{
    char tmp[4096];
    for (;;) {
        ssize_t n = read(self->log_fd, tmp, sizeof tmp);
        if (n <= 0)
            return;
        for (ssize_t i = 0; i < n; i++) {
            if (self->log_len == EXEC_PROC_LOG_RING) {
                memmove(self->log, self->log + EXEC_PROC_LOG_RING / 2, EXEC_PROC_LOG_RING / 2);
                self->log_len = EXEC_PROC_LOG_RING / 2;
            }
            self->log[self->log_len++] = tmp[i];
        }
    }
}

/* Reads available reply bytes; returns 1 when a full line is in buf, 0 when not yet,
   -EPIPE on EOF, ANV_EPROTO when the line is too long. */
static int s_read_reply(exec_proc_t *self, char **line)
{
    for (;;) {
        char *nl = self->len ? memchr(self->buf, '\n', self->len) : NULL;
        if (nl) {
            size_t n = (size_t)(nl - self->buf);
            *line = malloc(n + 1);
            if (!*line)
                return -ENOMEM;
            memcpy(*line, self->buf, n);
            (*line)[n] = '\0';
            memmove(self->buf, nl + 1, self->len - n - 1);
            self->len -= n + 1;
            return 1;
        }
        if (self->len >= EXEC_PROC_MAX_LINE)
            return ANV_EPROTO;
        if (self->cap - self->len < 65536) {
            size_t cap = self->cap ? self->cap * 2 : 131072;
            char *nb = realloc(self->buf, cap);
            if (!nb)
                return -ENOMEM;
            self->buf = nb;
            self->cap = cap;
        }
        ssize_t n = read(self->reply_fd, self->buf + self->len, self->cap - self->len);
        if (n == 0)
            return -EPIPE;
        if (n < 0)
            return (errno == EAGAIN || errno == EINTR) ? 0 : -EPIPE;
        self->len += (size_t)n;
    }
}

/* Waits for one reply line until deadline (anv_now_ms). */
static int s_next_line(exec_proc_t *self, uint64_t deadline, char **line)
{
    for (;;) {
        int rc = s_read_reply(self, line);
        if (rc != 0)
            return rc == 1 ? 0 : rc;
        uint64_t now = anv_now_ms();
        if (now >= deadline)
            return ANV_ETIMEOUT;
        struct pollfd pf[2] = {{self->reply_fd, POLLIN, 0}, {self->log_fd, POLLIN, 0}};
        int wait = (int)(deadline - now > 1000 ? 1000 : deadline - now);
        if (poll(pf, self->log_fd >= 0 ? 2 : 1, wait) < 0 && errno != EINTR)
            return -EPIPE;
        if (pf[1].revents & POLLIN)
            s_drain_log(self);
        if (pf[1].revents & (POLLHUP | POLLERR) && !(pf[1].revents & POLLIN)) {
            close(self->log_fd);
            self->log_fd = -1;
        }
    }
}

int exec_proc_wait_ready(exec_proc_t *self, int timeout_ms, cJSON **ready)
{
    if (ready)
        *ready = NULL;
    if (self->ready)
        return 0;
    uint64_t deadline = anv_now_ms() + (uint64_t)timeout_ms;
    for (;;) {
        char *line = NULL;
        int rc = s_next_line(self, deadline, &line);
        if (rc != 0)
            return rc;
        cJSON *j = cJSON_Parse(line);
        free(line);
        cJSON *ev = j ? cJSON_GetObjectItem(j, "event") : NULL;
        if (cJSON_IsString(ev) && strcmp(ev->valuestring, "ready") == 0) {
            self->ready = true;
            self->ready_ms = anv_now_ms();
            if (ready)
                *ready = j;
            else
                cJSON_Delete(j);
            return 0;
        }
        cJSON_Delete(j);
    }
}

bool exec_proc_poll_ready(exec_proc_t *self)
{
    if (!self->ready)
        exec_proc_wait_ready(self, 0, NULL);
    return self->ready;
}

bool exec_proc_is_ready(const exec_proc_t *self)
{
    return self->ready;
}

long exec_proc_send(exec_proc_t *self, cJSON *cmd)
{
    long id = ++self->next_id;
    cJSON_DeleteItemFromObject(cmd, "id");
    cJSON_AddNumberToObject(cmd, "id", (double)id);
    char *text = cJSON_PrintUnformatted(cmd);
    if (!text)
        return -ENOMEM;
    size_t n = strlen(text), off = 0;
    text[n++] = '\n'; /* cJSON's buffer has room: the terminating NUL is replaced */
    while (off < n) {
        ssize_t w = write(self->cmd_fd, text + off, n - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            free(text);
            return -EPIPE;
        }
        off += (size_t)w;
    }
    free(text);
    return id;
}

int exec_proc_recv(exec_proc_t *self, long id, int timeout_ms, cJSON **reply)
{
    *reply = NULL;
    uint64_t deadline = anv_now_ms() + (uint64_t)timeout_ms;
    for (;;) {
        char *line = NULL;
        int rc = s_next_line(self, deadline, &line);
        if (rc != 0)
            return rc;
        cJSON *j = cJSON_Parse(line);
        free(line);
        if (!j)
            return ANV_EPROTO;
        cJSON *jid = cJSON_GetObjectItem(j, "id");
        if (cJSON_IsNumber(jid) && (long)jid->valuedouble == id) {
            *reply = j;
            return 0;
        }
        /* a stray or forged line, or the reply to an earlier command nobody waits for any
           more: not the answer to this one */
        cJSON_Delete(j);
    }
}

int exec_proc_call(exec_proc_t *self, cJSON *cmd, int timeout_ms, cJSON **reply)
{
    *reply = NULL;
    long id = exec_proc_send(self, cmd);
    if (id < 0)
        return (int)id;
    return exec_proc_recv(self, id, timeout_ms, reply);
}

static void s_reap(exec_proc_t *self, int wait_ms)
{
    if (self->reaped || self->pid <= 0)
        return;
    uint64_t end = anv_now_ms() + (uint64_t)wait_ms;
    for (;;) {
        pid_t r = waitpid(self->pid, &self->status, WNOHANG);
        if (r == self->pid || (r < 0 && errno == ECHILD)) {
            self->reaped = true;
            return;
        }
        if ((uint64_t)anv_now_ms() >= end)
            return;
        anv_sleep_ms(5);
    }
}

/* sig to every descendant of root (at most S_MAX_DESC), found through /proc: the sandboxed
   interpreter runs in a session of its own under bwrap (--new-session), out of reach of the
   process group's signal */
#define S_MAX_DESC 256
static void s_signal_descendants(pid_t root, int sig)
{
    enum { S_MAX_PROCS = 65536 };
    pid_t(*pp)[2] = malloc(sizeof *pp * S_MAX_PROCS); /* (pid, ppid) of every process */
    pid_t desc[S_MAX_DESC];
    size_t n = 0, nd = 0;
    DIR *d = pp ? opendir("/proc") : NULL;
    struct dirent *e;
    while (d && n < S_MAX_PROCS && (e = readdir(d)) != NULL) {
        char path[64], buf[512];
        long pid = strtol(e->d_name, NULL, 10);
        if (pid <= 0)
            continue;
        snprintf(path, sizeof path, "/proc/%ld/stat", pid);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        size_t got = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[got] = '\0';
        const char *rp = strrchr(buf, ')'); /* the name may hold spaces and parentheses */
        char state;
        long ppid;
        if (rp && sscanf(rp + 1, " %c %ld", &state, &ppid) == 2)
            pp[n][0] = (pid_t)pid, pp[n][1] = (pid_t)ppid, n++;
    }
    if (d)
        closedir(d);
    /* passes until no process is added: a child of root or of one already found */
    for (bool grew = true; grew && nd < S_MAX_DESC;) {
        grew = false;
        for (size_t i = 0; i < n && nd < S_MAX_DESC; i++) {
            bool parent = pp[i][1] == root, known = pp[i][0] == root;
            for (size_t k = 0; k < nd; k++) {
                parent = parent || pp[i][1] == desc[k];
                known = known || pp[i][0] == desc[k];
            }
            if (parent && !known) {
                desc[nd++] = pp[i][0];
                grew = true;
            }
        }
    }
    for (size_t k = 0; k < nd; k++)
        kill(desc[k], sig);
    free(pp);
}

void exec_proc_signal(exec_proc_t *self, int sig)
{
    if (!self || self->pid <= 0 || self->reaped)
        return;
    kill(-self->pid, sig);
    s_signal_descendants(self->pid, sig);
}

void exec_proc_kill(exec_proc_t *self)
{
    if (!self || self->pid <= 0)
        return;
    if (!self->reaped) {
        kill(-self->pid, SIGKILL);
        kill(self->pid, SIGKILL);
    }
    s_reap(self, 2000);
}

bool exec_proc_alive(exec_proc_t *self)
{
    s_reap(self, 0);
    return !self->reaped;
}

const char *exec_proc_exit_desc(exec_proc_t *self)
{
    s_reap(self, 200);
    if (!self->reaped)
        snprintf(self->desc, sizeof self->desc, "running");
    else if (WIFEXITED(self->status))
        snprintf(self->desc, sizeof self->desc, "exit %d", WEXITSTATUS(self->status));
    else if (WIFSIGNALED(self->status))
        snprintf(self->desc, sizeof self->desc, "signal %d (%s)", WTERMSIG(self->status),
                 strsignal(WTERMSIG(self->status)));
    else
        snprintf(self->desc, sizeof self->desc, "status %d", self->status);
    return self->desc;
}

const char *exec_proc_log_tail(exec_proc_t *self)
{
    if (self->log_fd >= 0)
        s_drain_log(self);
    memcpy(self->log_out, self->log, self->log_len);
    self->log_out[self->log_len] = '\0';
    return self->log_out;
}

const char *exec_proc_io_dir(const exec_proc_t *self)
{
    return self->io_dir;
}

void exec_proc_set_inner_io(exec_proc_t *self, const char *inner)
{
    snprintf(self->inner_io, sizeof self->inner_io, "%s", inner);
}

const char *exec_proc_inner_io(const exec_proc_t *self)
{
    return self->inner_io;
}

pid_t exec_proc_pid(const exec_proc_t *self)
{
    return self->pid;
}

uint64_t exec_proc_started_ms(const exec_proc_t *self)
{
    return self->started_ms;
}

uint64_t exec_proc_ready_ms(const exec_proc_t *self)
{
    return self->ready_ms;
}

static int s_rm(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

int exec_proc_rm_tree(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return errno == ENOENT ? 0 : -1;
    return nftw(path, s_rm, 16, FTW_DEPTH | FTW_PHYS) == 0 ? 0 : -1;
}

void exec_proc_destroy(exec_proc_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    exec_proc_t *self = *self_p;
    exec_proc_kill(self);
    if (self->cmd_fd >= 0)
        close(self->cmd_fd);
    if (self->reply_fd >= 0)
        close(self->reply_fd);
    if (self->log_fd >= 0)
        close(self->log_fd);
    if (self->io_dir)
        exec_proc_rm_tree(self->io_dir);
    free(self->io_dir);
    free(self->buf);
    free(self);
    *self_p = NULL;
}

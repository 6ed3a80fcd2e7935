/*  exec_sandbox.c - bubblewrap command lines, the seccomp program, the mode probe.

    Design: the seccomp program is compiled once with libseccomp; every spawn exports it into
    a fresh memfd (bwrap reads it to the end, so one fd cannot be shared between spawns).
    Each process gets a directory of its own under work_dir, chowned to its uid, bound as
    /io. Paths the harness is told to write are inside that directory; exec_proc keeps the
    name it has inside the sandbox ("/io", or the host path in rlimit mode). The default
    work_dir is flocked for the worker's life, so what a killed worker left is found (lock
    free, pid gone) and removed by the next one, and a sandbox name that a dead process with
    the same pid left behind is replaced rather than refused.
*/
#define _GNU_SOURCE
#include "exec_sandbox.h"

#include "anv_error.h"
#include "anv_log.h"
#include "anv_time.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stddef.h>
#include <sched.h>
#include <seccomp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define S_MAX_ARGS 320
#define S_MAX_PREFIX 4

typedef enum { S_BWRAP, S_BWRAP_USER, S_RLIMIT } s_mode_t;

struct exec_sandbox_t {
    exec_sandbox_cfg_t cfg;
    char *strs[12]; /* owned copies of the cfg strings */
    s_mode_t mode;
    scmp_filter_ctx seccomp;
    char prefixes[S_MAX_PREFIX][PATH_MAX];
    int n_prefixes;
    bool root;
    unsigned seq;
};

static const char *s_mode_names[] = {"bwrap", "bwrap-user", "rlimit"};

static scmp_filter_ctx s_seccomp_build(void)
{
    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
    if (!ctx)
        return NULL;
    static const char *deny[] = {
        "ptrace", "process_vm_readv", "process_vm_writev", "mount", "umount2", "pivot_root",
        "chroot", "unshare", "setns", "kexec_load", "kexec_file_load", "init_module",
        "finit_module", "delete_module", "bpf", "perf_event_open", "keyctl", "add_key",
        "request_key", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
        "reboot", "swapon", "swapoff", "acct", "settimeofday", "clock_settime", "clock_adjtime",
        "adjtimex", "mknod", "mknodat", "setsid", "setpgid", "open_by_handle_at",
        "name_to_handle_at", "iopl", "ioperm", "quotactl", "syslog", "vhangup", "fanotify_init",
        "move_mount", "open_tree", "fsopen", "fsmount", "fspick", "lookup_dcookie",
    };
    int rc = 0;
    for (size_t i = 0; i < sizeof deny / sizeof deny[0] && rc == 0; i++) {
        int nr = seccomp_syscall_resolve_name(deny[i]);
        if (nr != __NR_SCMP_ERROR)
            rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), nr, 0);
    }
    if (rc == 0)
        rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(socket), 1,
                              SCMP_A0(SCMP_CMP_NE, AF_UNIX));
    if (rc == 0)
        rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(socketpair), 1,
                              SCMP_A0(SCMP_CMP_NE, AF_UNIX));
    static const unsigned long ns_flags[] = {CLONE_NEWUSER, CLONE_NEWNS,  CLONE_NEWPID,
                                             CLONE_NEWNET,  CLONE_NEWIPC, CLONE_NEWUTS,
                                             CLONE_NEWCGROUP};
    for (size_t i = 0; i < sizeof ns_flags / sizeof ns_flags[0] && rc == 0; i++)
        rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
                              SCMP_A0(SCMP_CMP_MASKED_EQ, ns_flags[i], ns_flags[i]));
    if (rc == 0)
        rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0);
    /* kill(0|-1|-pgid, ...) and tgkill on such ids: only single processes may be signalled */
    const int kills[] = {SCMP_SYS(kill), SCMP_SYS(tgkill)};
    for (int i = 0; i < 2 && rc == 0; i++) {
        rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), kills[i], 1,
                              SCMP_A0(SCMP_CMP_MASKED_EQ, 0x80000000u, 0x80000000u));
        if (rc == 0)
            rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), kills[i], 1,
                                  SCMP_A0(SCMP_CMP_MASKED_EQ, 0xffffffffu, 0));
    }
    if (rc != 0) {
        ANV_ERROR("cannot build the seccomp filter: %s", strerror(-rc));
        seccomp_release(ctx);
        return NULL;
    }
    return ctx;
}

static int s_seccomp_fd(exec_sandbox_t *self)
{
    int fd = memfd_create("anvil-seccomp", MFD_CLOEXEC);
    if (fd < 0)
        return -errno;
    int rc = seccomp_export_bpf(self->seccomp, fd);
    if (rc != 0 || lseek(fd, 0, SEEK_SET) != 0) {
        close(fd);
        return rc ? rc : -errno;
    }
    return fd;
}

static void s_add_prefix(exec_sandbox_t *self, const char *path)
{
    char real[PATH_MAX];
    if (!realpath(path, real))
        return;
    for (int i = 0; i < self->n_prefixes; i++) {
        size_t n = strlen(self->prefixes[i]);
        if (strncmp(real, self->prefixes[i], n) == 0 && (real[n] == '/' || !real[n]))
            return;
    }
    if (self->n_prefixes < S_MAX_PREFIX)
        snprintf(self->prefixes[self->n_prefixes++], PATH_MAX, "%s", real);
}

/* Finds sys.prefix and sys.base_prefix (outside the sandbox, once) so they can be bound. */
static int s_probe_python(exec_sandbox_t *self)
{
    char cmd[PATH_MAX + 128], line[PATH_MAX];
    snprintf(cmd, sizeof cmd,
             "'%s' -c 'import sys; print(sys.prefix); print(sys.base_prefix)' 2>/dev/null",
             self->cfg.python);
    FILE *p = popen(cmd, "r");
    if (!p)
        return -errno;
    while (fgets(line, sizeof line, p)) {
        line[strcspn(line, "\n")] = '\0';
        if (*line)
            s_add_prefix(self, line);
    }
    int st = pclose(p);
    if (st != 0 || self->n_prefixes == 0) {
        ANV_ERROR("cannot run the sandbox interpreter '%s'", self->cfg.python);
        return ANV_ECONFIG;
    }
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", self->cfg.python);
    char *slash = strrchr(dir, '/');
    if (slash) {
        *slash = '\0';
        s_add_prefix(self, dir);
    }
    return 0;
}

typedef struct {
    char *argv[S_MAX_ARGS];
    int n;
    char bufs[S_MAX_ARGS][64];
    int nb;
} s_args_t;

static void s_arg(s_args_t *a, const char *s)
{
    if (a->n < S_MAX_ARGS - 1)
        a->argv[a->n++] = (char *)s;
    a->argv[a->n] = NULL;
}

static const char *s_fmt(s_args_t *a, const char *fmt, long v)
{
    if (a->nb == S_MAX_ARGS)
        return "";
    snprintf(a->bufs[a->nb], sizeof a->bufs[0], fmt, v);
    return a->bufs[a->nb++];
}

static void s_bind_sys_dir(s_args_t *a, const char *path)
{
    char target[PATH_MAX];
    ssize_t n = readlink(path, target, sizeof target - 1);
    if (n > 0) {
        static char links[8][PATH_MAX];
        static int nl;
        char *t = links[nl++ % 8];
        memcpy(t, target, (size_t)n);
        t[n] = '\0';
        s_arg(a, "--symlink");
        s_arg(a, t);
        s_arg(a, path);
    } else if (access(path, F_OK) == 0) {
        s_arg(a, "--ro-bind");
        s_arg(a, path);
        s_arg(a, path);
    }
}

/* bwrap makes missing parents of a mount point 0700 (root's), which the sandbox uid cannot
   traverse: create every ancestor of path 0755 first. */
static void s_parents(s_args_t *a, const char *path)
{
    static char bufs[64][PATH_MAX];
    static int nb;
    for (const char *p = strchr(path + 1, '/'); p; p = strchr(p + 1, '/')) {
        char *d = bufs[nb++ % 64];
        snprintf(d, PATH_MAX, "%.*s", (int)(p - path), path);
        if (strcmp(d, "/usr") == 0 || strcmp(d, "/tmp") == 0)
            continue;
        s_arg(a, "--perms");
        s_arg(a, "0755");
        s_arg(a, "--dir");
        s_arg(a, d);
    }
}

static void s_bwrap_args(exec_sandbox_t *self, s_args_t *a, const char *io_dir, s_mode_t mode)
{
    const exec_sandbox_cfg_t *c = &self->cfg;
    s_arg(a, c->bwrap && *c->bwrap ? c->bwrap : "/usr/bin/bwrap");
    s_arg(a, "--die-with-parent");
    s_arg(a, "--new-session");
    s_arg(a, "--unshare-pid");
    s_arg(a, "--unshare-net");
    s_arg(a, "--unshare-ipc");
    s_arg(a, "--unshare-uts");
    s_arg(a, "--unshare-cgroup-try");
    if (mode == S_BWRAP_USER)
        s_arg(a, "--unshare-user");
    s_arg(a, "--hostname");
    s_arg(a, "anvil-sandbox");
    s_arg(a, "--ro-bind");
    s_arg(a, "/usr");
    s_arg(a, "/usr");
    static const char *sys_dirs[] = {"/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"};
    for (size_t i = 0; i < sizeof sys_dirs / sizeof sys_dirs[0]; i++)
        s_bind_sys_dir(a, sys_dirs[i]);
    static const char *etc[] = {"/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d",
                                "/etc/alternatives"};
    for (size_t i = 0; i < sizeof etc / sizeof etc[0]; i++) {
        s_arg(a, "--ro-bind-try");
        s_arg(a, etc[i]);
        s_arg(a, etc[i]);
    }
    s_arg(a, "--perms");
    s_arg(a, "0755");
    s_arg(a, "--dir");
    s_arg(a, "/anvil");
    s_arg(a, "--ro-bind");
    s_arg(a, c->harness_dir);
    s_arg(a, "/anvil/harness");
    s_arg(a, "--ro-bind");
    s_arg(a, c->launcher);
    s_arg(a, "/anvil/launch");
    s_arg(a, "--proc");
    s_arg(a, "/proc");
    s_arg(a, "--dev");
    s_arg(a, "/dev");
    s_arg(a, "--perms");
    s_arg(a, "1777");
    s_arg(a, "--tmpfs");
    s_arg(a, "/dev/shm");
    s_arg(a, "--perms");
    s_arg(a, "1777");
    s_arg(a, "--tmpfs");
    s_arg(a, "/tmp");
    /* the interpreter's prefixes and the extra binds after the private /tmp and /dev/shm, so
       that a venv under /tmp (a checkout there) is still seen (it was hidden by the tmpfs) */
    for (int i = 0; i < self->n_prefixes; i++) {
        s_parents(a, self->prefixes[i]);
        s_arg(a, "--ro-bind");
        s_arg(a, self->prefixes[i]);
        s_arg(a, self->prefixes[i]);
    }
    if (c->ro_binds && *c->ro_binds) {
        static char extra[4096];
        snprintf(extra, sizeof extra, "%s", c->ro_binds);
        char *save = NULL;
        for (char *t = strtok_r(extra, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            s_parents(a, t);
            s_arg(a, "--ro-bind-try");
            s_arg(a, t);
            s_arg(a, t);
        }
    }
    s_arg(a, "--bind");
    s_arg(a, io_dir);
    s_arg(a, "/io");
    if (strcmp(c->device, "cuda") == 0) {
        static const char *nodes[] = {"/dev/nvidiactl", "/dev/nvidia-uvm",
                                      "/dev/nvidia-uvm-tools"};
        for (size_t i = 0; i < sizeof nodes / sizeof nodes[0]; i++) {
            s_arg(a, "--dev-bind-try");
            s_arg(a, nodes[i]);
            s_arg(a, nodes[i]);
        }
        const char *gpu = s_fmt(a, "/dev/nvidia%ld", c->gpu_index);
        s_arg(a, "--dev-bind-try");
        s_arg(a, gpu);
        s_arg(a, gpu);
        s_arg(a, "--ro-bind-try");
        s_arg(a, "/sys");
        s_arg(a, "/sys");
    }
    s_arg(a, "--chdir");
    s_arg(a, "/tmp");
    s_arg(a, "--cap-drop");
    s_arg(a, "ALL");
    if (mode == S_BWRAP) {
        s_arg(a, "--cap-add");
        s_arg(a, "CAP_SETUID");
        s_arg(a, "--cap-add");
        s_arg(a, "CAP_SETGID");
    }
    s_arg(a, "--seccomp");
    s_arg(a, "5");
    s_arg(a, "/anvil/launch");
}

/* Locks path (a directory) without waiting: the fd, or -1 when another process holds it. */
static int s_lock_dir(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return -1;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static void s_sweep(const char *base)
{
    DIR *d = opendir(base);
    if (!d)
        return;
    struct dirent *e;
    const char *prefix = "anvil-exec-";
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) != 0)
            continue;
        char *end;
        long pid = strtol(e->d_name + strlen(prefix), &end, 10);
        if (end == e->d_name + strlen(prefix) || (*end && *end != '-') || pid <= 0)
            continue;
        /* a pid that looks alive may be a reuse, but then its owner is gone and the lock
           says nothing; leave it rather than guess. A pid of another namespace looks dead:
           its owner's lock keeps it. */
        if (pid != (long)getpid() && !(kill((pid_t)pid, 0) != 0 && errno == ESRCH))
            continue;
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", base, e->d_name);
        int fd = s_lock_dir(path);
        if (fd < 0)
            continue;
        ANV_INFO("removing '%s', left by a worker that is gone", path);
        if (exec_proc_rm_tree(path) != 0)
            ANV_WARN("cannot remove '%s': %s", path, strerror(errno));
        close(fd);
    }
    closedir(d);
}

int exec_sandbox_work_dir(const char *base, char *out, size_t cap)
{
    s_sweep(base);
    for (int k = 0; k < 100; k++) {
        if (k == 0)
            snprintf(out, cap, "%s/anvil-exec-%d", base, (int)getpid());
        else
            snprintf(out, cap, "%s/anvil-exec-%d-%d", base, (int)getpid(), k);
        if (mkdir(out, 0711) != 0 && errno != EEXIST) {
            ANV_ERROR("cannot create '%s': %s", out, strerror(errno));
            return -1;
        }
        int fd = s_lock_dir(out);
        if (fd < 0)
            continue; /* held by a live worker of another PID namespace */
        chmod(out, 0711);
        return fd;
    }
    ANV_ERROR("no usable work directory under '%s'", base);
    return -1;
}

static exec_proc_t *s_spawn(exec_sandbox_t *self, s_mode_t mode, const char *const *cmd)
{
    const exec_sandbox_cfg_t *c = &self->cfg;
    char io_dir[PATH_MAX], env_omp[64], env_gpu[64], env_pp[PATH_MAX + 16];
    unsigned n = self->seq++;
    long uid = -1;
    if (self->root && mode != S_BWRAP_USER)
        uid = (long)(c->uid_base + (n % 1000));
    snprintf(io_dir, sizeof io_dir, "%s/sbx-%d-%u", c->work_dir, (int)getpid(), n);
    int made = mkdir(io_dir, 0700);
    if (made != 0 && errno == EEXIST) {
        /* our pid and sequence number: left by a dead process that had this pid (killed
           before it could clean up), never by a live one */
        ANV_WARN("removing stale sandbox directory '%s'", io_dir);
        made = exec_proc_rm_tree(io_dir) == 0 ? mkdir(io_dir, 0700) : -1;
    }
    if (made != 0 || (uid >= 0 && chown(io_dir, (uid_t)uid, (gid_t)uid) != 0)) {
        ANV_ERROR("cannot create sandbox directory '%s': %s", io_dir, strerror(errno));
        return NULL;
    }
    int sfd = s_seccomp_fd(self);
    if (sfd < 0) {
        ANV_ERROR("cannot export the seccomp filter: %s", strerror(-sfd));
        rmdir(io_dir);
        return NULL;
    }
    s_args_t a = {0};
    if (mode != S_RLIMIT)
        s_bwrap_args(self, &a, io_dir, mode);
    else
        s_arg(&a, c->launcher);
    s_arg(&a, s_fmt(&a, "%ld", mode == S_BWRAP_USER ? -1 : uid));
    s_arg(&a, s_fmt(&a, "%ld", mode == S_BWRAP_USER ? -1 : uid));
    s_arg(&a, s_fmt(&a, "%ld", (long)c->nproc));
    s_arg(&a, "--");
    for (int i = 0; cmd[i]; i++)
        s_arg(&a, cmd[i]);
    snprintf(env_omp, sizeof env_omp, "OMP_NUM_THREADS=%d", c->threads > 0 ? c->threads : 1);
    snprintf(env_gpu, sizeof env_gpu, "CUDA_VISIBLE_DEVICES=%s",
             strcmp(c->device, "cuda") == 0 ? s_fmt(&a, "%ld", c->gpu_index) : "");
    snprintf(env_pp, sizeof env_pp, "PYTHONPATH=%s",
             mode == S_RLIMIT ? c->harness_dir : "/anvil/harness");
    char tmp_env[PATH_MAX + 16], home_env[PATH_MAX + 16], cache_env[PATH_MAX + 32];
    const char *tmp = mode == S_RLIMIT ? io_dir : "/tmp";
    snprintf(tmp_env, sizeof tmp_env, "TMPDIR=%s", tmp);
    snprintf(home_env, sizeof home_env, "HOME=%s", tmp);
    snprintf(cache_env, sizeof cache_env, "TRITON_CACHE_DIR=%s/.triton", tmp);
    /* Triton finds libcuda with `ldconfig -p`, which fails inside the sandbox on some hosts
       (seen on the H200 machine): name the directory for it */
    char libcuda_env[PATH_MAX + 32] = "TRITON_LIBCUDA_PATH_UNSET=1";
    if (strcmp(c->device, "cuda") == 0) {
        static const char *dirs[] = {"/usr/lib/x86_64-linux-gnu", "/usr/local/nvidia/lib64",
                                     "/usr/lib64", "/usr/local/cuda/compat",
                                     "/usr/lib/aarch64-linux-gnu"};
        for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
            char p[PATH_MAX];
            snprintf(p, sizeof p, "%s/libcuda.so.1", dirs[i]);
            if (access(p, R_OK) == 0) {
                snprintf(libcuda_env, sizeof libcuda_env, "TRITON_LIBCUDA_PATH=%s", dirs[i]);
                break;
            }
        }
    }
    char *envp[] = {"PATH=/usr/bin:/bin", home_env, tmp_env, env_pp, cache_env, env_omp, env_gpu,
                    libcuda_env,
                    "PYTHONDONTWRITEBYTECODE=1", "PYTHONNOUSERSITE=1", "LANG=C.UTF-8",
                    /* the sandbox uid has no passwd entry: getpass.getuser() (torch, triton
                       cache paths) reads these before it asks getpwuid() */
                    "USER=anvil", "LOGNAME=anvil",
                    "MKL_NUM_THREADS=1", "TOKENIZERS_PARALLELISM=false",
                    c->triton_interpret ? "TRITON_INTERPRET=1" : "TRITON_INTERPRET=0", NULL};
    exec_proc_limits_t lim = {.cpu_s = c->cpu_s, .nofile = c->nofile, .fsize_mb = c->fsize_mb,
                              .uid = -1, .gid = -1, .seccomp_fd = sfd,
                              .seccomp_in_child = mode == S_RLIMIT};
    if (strcmp(c->device, "cuda") == 0)
        lim.data_mb = c->mem_mb;
    else
        lim.as_mb = c->mem_mb;
    if (mode == S_BWRAP_USER)
        lim.nproc = c->nproc;
    exec_proc_t *p = exec_proc_start(a.argv, envp, &lim, io_dir);
    close(sfd);
    if (!p)
        rmdir(io_dir);
    else
        exec_proc_set_inner_io(p, mode == S_RLIMIT ? io_dir : "/io");
    return p;
}

exec_proc_t *exec_sandbox_spawn_argv(exec_sandbox_t *self, const char *const *cmd)
{
    return s_spawn(self, self->mode, cmd);
}

exec_proc_t *exec_sandbox_spawn(exec_sandbox_t *self)
{
    const char *cmd[] = {self->cfg.python, "-s", "-B", "-m", "anvil_harness", "3", "4", NULL};
    return s_spawn(self, self->mode, cmd);
}

/* Starts the interpreter (python -c pass) in mode m: works when it exits 0 within 20 s. */
static bool s_try(exec_sandbox_t *self, s_mode_t m, char *why, size_t len)
{
    const char *cmd[] = {self->cfg.python, "-s", "-c", "pass", NULL};
    exec_proc_t *p = s_spawn(self, m, cmd);
    if (!p) {
        snprintf(why, len, "cannot start");
        return false;
    }
    uint64_t end = anv_now_ms() + 20000;
    while (exec_proc_alive(p) && (uint64_t)anv_now_ms() < end)
        anv_sleep_ms(5);
    const char *desc = exec_proc_exit_desc(p);
    bool ok = strcmp(desc, "exit 0") == 0;
    if (!ok) {
        const char *tail = exec_proc_log_tail(p);
        snprintf(why, len, "%s: %.200s", desc, tail);
        why[strcspn(why, "\n")] = '\0';
    }
    exec_proc_destroy(&p);
    return ok;
}

exec_sandbox_t *exec_sandbox_new(const exec_sandbox_cfg_t *cfg)
{
    exec_sandbox_t *self = calloc(1, sizeof *self);
    if (!self)
        return NULL;
    self->cfg = *cfg;
    const char **fields[] = {&self->cfg.mode,        &self->cfg.bwrap,    &self->cfg.launcher,
                             &self->cfg.python,      &self->cfg.harness_dir,
                             &self->cfg.work_dir,    &self->cfg.ro_binds, &self->cfg.device};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        self->strs[i] = strdup(*fields[i] ? *fields[i] : "");
        *fields[i] = self->strs[i];
    }
    self->root = geteuid() == 0;
    self->seccomp = s_seccomp_build();
    if (!self->seccomp || s_probe_python(self) != 0)
        goto fail;
    if (access(self->cfg.launcher, X_OK) != 0) {
        ANV_ERROR("sandbox launcher '%s' is not executable", self->cfg.launcher);
        goto fail;
    }
    char why[3][320] = {"", "", ""};
    s_mode_t order[3] = {S_BWRAP, S_BWRAP_USER, S_RLIMIT};
    int first = 0, last = 2;
    if (strcmp(self->cfg.mode, "auto") != 0) {
        for (int i = 0; i < 3; i++)
            snprintf(why[i], sizeof why[i], "not selected: --sandbox-mode %s", self->cfg.mode);
        for (int i = 0; i < 3; i++)
            if (strcmp(self->cfg.mode, s_mode_names[i]) == 0)
                first = last = i;
        if (first != last || strcmp(self->cfg.mode, s_mode_names[first]) != 0) {
            ANV_ERROR("unknown sandbox mode '%s' (auto|bwrap|bwrap-user|rlimit)", self->cfg.mode);
            goto fail;
        }
    } else if (!self->root) {
        first = 1; /* privileged bubblewrap needs root */
        snprintf(why[0], sizeof why[0], "the worker is not root");
    }
    for (int i = first; i <= last; i++) {
        if (s_try(self, order[i], why[i], sizeof why[i])) {
            self->mode = order[i];
            if (i > 0)
                ANV_WARN("sandbox: %s not available (%s)", s_mode_names[0], why[0]);
            if (i > 1)
                ANV_WARN("sandbox: %s not available (%s)", s_mode_names[1], why[1]);
            if (order[i] == S_RLIMIT)
                ANV_WARN("sandbox: WEAK isolation: no namespaces (no private filesystem or "
                         "network namespace); only rlimits, seccomp%s",
                         self->root ? " and a uid of its own" : "");
            ANV_INFO("sandbox mode '%s' (device %s, uid %s)", s_mode_names[i], self->cfg.device,
                     order[i] == S_BWRAP_USER ? "shared with the worker" : "per sandbox");
            return self;
        }
    }
    ANV_ERROR("no sandbox mode works: %s / %s / %s", why[0], why[1], why[2]);
fail:
    exec_sandbox_destroy(&self);
    return NULL;
}

void exec_sandbox_destroy(exec_sandbox_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    exec_sandbox_t *self = *self_p;
    if (self->seccomp)
        seccomp_release(self->seccomp);
    for (size_t i = 0; i < sizeof self->strs / sizeof self->strs[0]; i++)
        free(self->strs[i]);
    free(self);
    *self_p = NULL;
}

const char *exec_sandbox_mode(const exec_sandbox_t *self)
{
    return s_mode_names[self->mode];
}

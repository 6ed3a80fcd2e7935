/*  exec_sandbox.h - how harness processes are isolated, and starting them.

    Modes, strongest first; exec_sandbox_new() probes them in this order (or checks the one
    configured) by starting `true` inside, and logs which one is used and why the stronger
    ones were not:
      bwrap       the worker is root: bubblewrap in privileged mode (new PID, network, IPC,
                  UTS and cgroup namespaces, no user namespace), a new root made of read-only
                  binds of /usr, the Python prefixes and the harness, private /tmp and /dev,
                  /io bound to the process's own directory, GPU device nodes only for cuda;
                  anvil-exec-launch then switches to a uid of its own (uid_base + n), so
                  RLIMIT_NPROC is per sandbox and no capability is left.
      bwrap-user  bubblewrap unprivileged (user namespace added), the worker's own uid; the
                  process limit is shared with the worker's uid.
      rlimit      no namespaces could be created: rlimits, seccomp and (as root) a uid of its
                  own; the filesystem is only as private as its permissions. Weak: logged
                  as a warning at start-up.
    In every mode: the seccomp filter below, rlimits on address space (or data on cuda, where
    the driver's reservations make RLIMIT_AS unusable), CPU, open files, file size, no core
    dumps, a session of its own so a kill takes the whole tree.

    Seccomp (default allow, these fail with EPERM): sockets other than AF_UNIX, ptrace and
    process_vm_*, mount/umount/pivot_root/chroot, unshare/setns and namespace clone flags
    (clone3 fails with ENOSYS so libc falls back to clone), kexec, modules, bpf,
    perf_event_open, keyctl, userfaultfd, io_uring, reboot, swap, clock setting, mknod,
    setsid/setpgid, and kill/tgkill aimed at a process group or -1.
*/
#ifndef EXEC_SANDBOX_H
#define EXEC_SANDBOX_H

#include "exec_proc.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct {
    const char *mode;        /* auto | bwrap | bwrap-user | rlimit */
    const char *bwrap;       /* path of bwrap ("" = /usr/bin/bwrap) */
    const char *launcher;    /* path of anvil-exec-launch */
    const char *python;      /* interpreter with torch and triton */
    const char *harness_dir; /* the directory holding anvil_harness/ */
    const char *work_dir;    /* host directory for the per-process /io directories */
    const char *ro_binds;    /* extra read-only paths, comma-separated */
    const char *device;      /* cpu | cuda */
    int gpu_index;
    bool triton_interpret;   /* TRITON_INTERPRET=1 inside (CPU runs of Triton) */
    int threads;             /* OMP/MKL threads inside */
    int64_t mem_mb, cpu_s, nofile, nproc, fsize_mb;
    int64_t uid_base;
} exec_sandbox_cfg_t;

typedef struct exec_sandbox_t exec_sandbox_t;

/* Copies cfg, finds the Python prefixes, probes the mode. NULL (logged) when no mode works or
   the configuration is unusable. */
exec_sandbox_t *exec_sandbox_new(const exec_sandbox_cfg_t *cfg);
void exec_sandbox_destroy(exec_sandbox_t **self_p);
/* "bwrap", "bwrap-user" or "rlimit". */
const char *exec_sandbox_mode(const exec_sandbox_t *self);
/* Makes the default work directory, base/anvil-exec-<pid> (base/anvil-exec-<pid>-<k> when a
   live worker in another PID namespace holds that name), and removes what killed workers
   left in base: anvil-exec-* directories whose flock is free and whose pid is dead. The
   directory stays flocked through the returned fd (close it at exit); -1 (logged) when none
   could be made. out gets the path. */
int exec_sandbox_work_dir(const char *base, char *out, size_t cap);
/* Starts a harness process (python -m anvil_harness 3 4) in a fresh sandbox. It becomes
   ready by itself (exec_proc_wait_ready). NULL (logged) when it cannot be started. */
exec_proc_t *exec_sandbox_spawn(exec_sandbox_t *self);
/* Starts an arbitrary command in a fresh sandbox (tests, the probe). */
exec_proc_t *exec_sandbox_spawn_argv(exec_sandbox_t *self, const char *const *cmd);

#endif

/*  exec_proc.h - one sandboxed harness process and its JSON-line control channel.

    The process gets fd 3 (commands, read), fd 4 (replies, write) and stdout/stderr on a log
    pipe; it is the leader of its own session, so exec_proc_kill() takes the whole tree (under
    bubblewrap the tree is also a PID namespace that dies with its init). Its host directory
    io_dir is what it sees as /io. Replies are read with a deadline; a line over 4 MiB, bad
    JSON, EOF or a timeout end the exchange with an error the caller turns into a status, and
    a line with another id than the command's is skipped. The log pipe is drained into a 8 KiB
    ring whatever the process prints. One exec_proc_t belongs to one thread.
*/
#ifndef EXEC_PROC_H
#define EXEC_PROC_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct exec_proc_t exec_proc_t;

typedef struct {
    int64_t as_mb;      /* RLIMIT_AS, 0 = unlimited */
    int64_t data_mb;    /* RLIMIT_DATA, 0 = unlimited */
    int64_t cpu_s;      /* RLIMIT_CPU */
    int64_t nofile;     /* RLIMIT_NOFILE */
    int64_t nproc;      /* RLIMIT_NPROC (per uid: give each sandbox its own uid) */
    int64_t fsize_mb;   /* RLIMIT_FSIZE */
    int uid, gid;       /* switch to these before exec when >= 0 (needs root) */
    int seccomp_fd;     /* passed through as fd 5 (bwrap --seccomp 5), -1 = none */
    bool seccomp_in_child; /* load the filter from seccomp_fd in the child itself */
} exec_proc_limits_t;

/* Starts argv (argv[0] a path) with envp. io_dir (copied) is created by the caller and
   removed by exec_proc_destroy(). Returns NULL (and logs why) when fork or pipes fail. */
exec_proc_t *exec_proc_start(char *const argv[],
                             char *const envp[],
                             const exec_proc_limits_t *lim,
                             const char *io_dir);
/* Kills the tree, reaps it, removes io_dir. */
void exec_proc_destroy(exec_proc_t **self_p);
/* Removes path and everything under it without following links; 0, or -1 with errno. A path
   that does not exist is not an error. */
int exec_proc_rm_tree(const char *path);

/* Waits for the harness's {"event":"ready"} line. 0, ANV_ETIMEOUT or -EPIPE (it died). On
   success *ready (may be NULL) gets the parsed line, owned by the caller. */
int exec_proc_wait_ready(exec_proc_t *self, int timeout_ms, cJSON **ready);
bool exec_proc_is_ready(const exec_proc_t *self);
/* Non-blocking: reads what is there; returns true once the ready line has arrived. */
bool exec_proc_poll_ready(exec_proc_t *self);
/* Sends cmd (an id is added) and waits up to timeout_ms for the reply with that id.
   Returns 0 with *reply (caller owns), ANV_ETIMEOUT, -EPIPE (died or closed the pipe) or
   ANV_EPROTO (unparsable or oversized reply). */
int exec_proc_call(exec_proc_t *self, cJSON *cmd, int timeout_ms, cJSON **reply);
/* exec_proc_call in two halves, so that two processes can work at once: send returns the
   command's id (> 0) or -EPIPE / -ENOMEM without waiting; recv waits for the reply to that
   id (0, ANV_ETIMEOUT, -EPIPE or ANV_EPROTO, as above), skipping any other line. The process
   answers its commands in order, so several may be sent before their replies are read; until
   the last one's reply is read (or the process killed) it may still be working, writing its
   files. Its log pipe (1 MiB where the kernel allows) is read only while the caller waits on
   it (or asks for its log tail): one that prints more in the meantime stalls until then. */
long exec_proc_send(exec_proc_t *self, cJSON *cmd);
int exec_proc_recv(exec_proc_t *self, long id, int timeout_ms, cJSON **reply);
/* sig to the process group (SIGSTOP / SIGCONT: exec_pool_pause); nothing once reaped. */
void exec_proc_signal(exec_proc_t *self, int sig);
/* SIGKILL to the process group, then reap (bounded wait). Idempotent. */
void exec_proc_kill(exec_proc_t *self);
bool exec_proc_alive(exec_proc_t *self);
/* "exit 0", "signal 9 (Killed)", "running". */
const char *exec_proc_exit_desc(exec_proc_t *self);
/* Last bytes the process printed (NUL-terminated, borrowed until the next call). */
const char *exec_proc_log_tail(exec_proc_t *self);
const char *exec_proc_io_dir(const exec_proc_t *self);
/* The name of io_dir inside the sandbox ("/io", or the host path when there is no mount
   namespace); set by exec_sandbox. */
void exec_proc_set_inner_io(exec_proc_t *self, const char *inner);
const char *exec_proc_inner_io(const exec_proc_t *self);
pid_t exec_proc_pid(const exec_proc_t *self);
/* anv_now_ms() at start and when it became ready (0 = not yet). */
uint64_t exec_proc_started_ms(const exec_proc_t *self);
uint64_t exec_proc_ready_ms(const exec_proc_t *self);

#endif

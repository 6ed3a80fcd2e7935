/*  cli_proc.h - child processes for the local cluster and the demo.

    Daemons (redis-server, the broker, workers) are started in their own session with stdin
    from /dev/null and stdout/stderr appended to a log file, with an environment that is the
    caller's minus every ANVIL_* variable plus the given ones (so a user's CLI settings never
    leak into a server's configuration). A recorded pid is only ever signalled after checking
    that /proc/PID/exe is still the binary that was started, so a recycled pid is left alone.
*/
#ifndef CLI_PROC_H
#define CLI_PROC_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* Starts bin with argv (argv[0] included, NULL-terminated) and env_add ("K=V" strings,
   NULL-terminated; may be NULL) as a daemon logging to log_path. Returns the pid or -1 with
   the reason in err. The caller may reap it with cli_proc_exited(). */
pid_t cli_proc_spawn_daemon(const char *bin,
                            char *const argv[],
                            const char *const env_add[],
                            const char *log_path,
                            char *err,
                            size_t errlen);
/* True when pid runs `bin` (a resolved path) and is not a zombie. */
bool cli_proc_alive(pid_t pid, const char *bin);
/* For our own children: true once pid has exited (it is reaped; *status gets the wait status). */
bool cli_proc_exited(pid_t pid, int *status);
/* SIGTERM, then waits up to grace_s; SIGKILL after that (*killed = true). Returns 0 when the
   process is gone (or was not running `bin`), -errno otherwise. */
int cli_proc_stop(pid_t pid, const char *bin, double grace_s, bool *killed);

/* Runs argv in the foreground (stdin and stderr inherited). With `out` non-NULL its stdout is
   captured into a new string (caller frees), else inherited. Returns the exit code (128 + the
   signal when killed) or -1 when it could not be started. */
int cli_proc_run(char *const argv[], char **out);

/* Finds a sibling binary: <dir of this executable>/../<subdir>/<name> (a build tree),
   <dir of this executable>/<name> (an installed bin/), then PATH. Returns a new resolved path
   or NULL. */
char *cli_proc_find(const char *subdir, const char *name);
/* This executable's resolved path (static buffer). */
const char *cli_proc_self(void);
/* Prints the last `lines` lines of a log file to stderr, indented. */
void cli_proc_log_tail(const char *path, int lines);
/* A free TCP port on 127.0.0.1 (bound then released: racy by nature), or -1. */
int cli_proc_free_port(void);

#endif

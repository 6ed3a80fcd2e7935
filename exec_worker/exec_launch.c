/*  exec_launch.c - anvil-exec-launch: the last step into the sandbox.

    bubblewrap starts this (as root in privileged mode, or as the worker's user) inside the
    new namespaces, with the seccomp filter already loaded. It switches to the sandbox's own
    uid/gid (so RLIMIT_NPROC counts only that sandbox's processes and every capability is
    gone), sets the per-uid process limit, sets no_new_privs and execs the command:

        anvil-exec-launch UID GID NPROC -- COMMAND [ARGS...]

    UID/GID -1 keep the current ids. Exit 126 when the switch fails, 127 when exec fails.
*/
#define _GNU_SOURCE
#include <errno.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc < 6 || strcmp(argv[4], "--") != 0) {
        fprintf(stderr, "usage: anvil-exec-launch UID GID NPROC -- COMMAND [ARGS...]\n");
        return 2;
    }
    long uid = strtol(argv[1], NULL, 10), gid = strtol(argv[2], NULL, 10);
    long nproc = strtol(argv[3], NULL, 10);
    if (gid >= 0 && (setgroups(0, NULL) != 0 || setresgid((gid_t)gid, (gid_t)gid, (gid_t)gid))) {
        fprintf(stderr, "anvil-exec-launch: cannot switch to gid %ld: %s\n", gid, strerror(errno));
        return 126;
    }
    if (uid >= 0 && setresuid((uid_t)uid, (uid_t)uid, (uid_t)uid) != 0) {
        fprintf(stderr, "anvil-exec-launch: cannot switch to uid %ld: %s\n", uid, strerror(errno));
        return 126;
    }
    if (nproc > 0) {
        struct rlimit rl = {(rlim_t)nproc, (rlim_t)nproc};
        setrlimit(RLIMIT_NPROC, &rl);
    }
    prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
    execv(argv[5], argv + 5);
    fprintf(stderr, "anvil-exec-launch: cannot exec '%s': %s\n", argv[5], strerror(errno));
    return 127;
}

/*  cli_watch.h - following a job until it ends (used by `watch` and `submit --wait`).

    Long-polls WATCH from the last event offset and renders the job's status: on a terminal,
    progress bars redrawn in place (generated / scored / failed, tokens/s, evals/min, pass
    rate, mean speedup, ETA); otherwise one plain line per change (at most one per `interval`
    seconds) plus a line per dead-lettered sample; with --json one JSON status per line. A
    broker that stops answering is retried until `c->timeout` passes without a reply.
*/
#ifndef CLI_WATCH_H
#define CLI_WATCH_H

#include "cli_util.h"

/* Returns CLI_EXIT_OK when the job is done, CLI_EXIT_FAILED when it ended failed or
   cancelled, or the exit code of the error (not found, unreachable, interrupted). */
int cli_watch_job(const char *cmd, const cli_common_t *c, const char *job_id, double interval);

#endif

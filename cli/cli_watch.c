/*  cli_watch.c - `anvil watch JOB`, and the loop `submit --wait` shares.

    One WATCH long poll at a time (block_ms = 1 s) from the last event offset, so that no event
    is read twice and a restarted watch can resume; every reply carries the job's status, which
    is what is rendered. The TTY view redraws a fixed block of lines with ANSI cursor moves;
    it is chosen only when stdout is a terminal and TERM is not "dumb". Interrupting a watch
    only detaches from the job.
*/
#include "cli_watch.h"

#include "anv_error.h"
#include "anv_msg.h"
#include "anv_time.h"
#include "cli_client.h"
#include "cli_cmd.h"
#include "cli_json.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define S_BLOCK_MS 1000
#define S_POLL_GRACE_MS 2000
#define S_BAR 30
#define S_TTY_LINES 4

static void s_bar(char *out, uint64_t done, uint64_t total)
{
    int fill = total ? (int)((double)done / (double)total * S_BAR + 0.5) : 0;
    if (fill > S_BAR)
        fill = S_BAR;
    for (int i = 0; i < S_BAR; i++)
        out[i] = i < fill ? '#' : '.';
    out[S_BAR] = 0;
}

static void s_metrics(const Anvil__JobStatus *s, char *pass, char *speed, char *eta, size_t len)
{
    snprintf(pass, len, "-");
    snprintf(speed, len, "-");
    if (s->has_pass_rate)
        snprintf(pass, len, "%.1f%%", 100 * s->pass_rate);
    if (s->has_mean_speedup)
        snprintf(speed, len, "%.2fx", s->mean_speedup);
    cli_fmt_duration(s->has_eta_s ? s->eta_s : -1, eta, len);
}

static void s_render_tty(const Anvil__JobStatus *s, bool redraw, double elapsed)
{
    char gbar[S_BAR + 1], sbar[S_BAR + 1], pass[32], speed[32], eta[32], el[32];
    uint64_t total = s->samples_total;
    s_bar(gbar, s->generated, total);
    s_bar(sbar, s->scored, total);
    s_metrics(s, pass, speed, eta, sizeof pass);
    cli_fmt_duration(elapsed, el, sizeof el);
    if (redraw)
        printf("\033[%dA", S_TTY_LINES);
    printf("\r\033[Kjob %s%s%s%s  %s  %s\n", s->job_id, s->name ? " '" : "",
           s->name ? s->name : "", s->name ? "'" : "", cli_job_state_name(s->state), el);
    printf("\r\033[K  generated [%s] %llu/%llu  %.0f tok/s\n", gbar,
           (unsigned long long)s->generated, (unsigned long long)total, s->tokens_per_s);
    if (s->has_score && !s->score)
        printf("\r\033[K  scored    (not scored)\n");
    else
        printf("\r\033[K  scored    [%s] %llu/%llu  %.1f evals/min\n", sbar,
               (unsigned long long)s->scored, (unsigned long long)total, s->evals_per_min);
    printf("\r\033[K  failed %llu  dead %llu  pass rate %s  mean speedup %s  ETA %s\n",
           (unsigned long long)s->failed, (unsigned long long)s->dead, pass, speed, eta);
    fflush(stdout);
}

static void s_render_plain(const Anvil__JobStatus *s)
{
    char pass[32], speed[32], eta[32], ts[32];
    s_metrics(s, pass, speed, eta, sizeof pass);
    time_t now = time(NULL);
    strftime(ts, sizeof ts, "%H:%M:%S", localtime(&now));
    printf("%s job %s %s generated %llu/%llu scored %llu failed %llu dead %llu tok/s %.0f "
           "evals/min %.1f pass %s speedup %s eta %s\n",
           ts, s->job_id, cli_job_state_name(s->state), (unsigned long long)s->generated,
           (unsigned long long)s->samples_total, (unsigned long long)s->scored,
           (unsigned long long)s->failed, (unsigned long long)s->dead, s->tokens_per_s,
           s->evals_per_min, pass, speed, eta);
    fflush(stdout);
}

/* A compact fingerprint of what the plain view shows, to print only changes. */
static uint64_t s_fingerprint(const Anvil__JobStatus *s)
{
    return s->generated * 1000003u ^ s->scored * 10007u ^ s->failed * 101u ^ s->dead * 7u ^
           (uint64_t)s->state;
}

int cli_watch_job(const char *cmd, const cli_common_t *c, const char *job_id, double interval)
{
    char err[512], offset[128] = "0";
    cli_client_t *cl = cli_client_open(c, err, sizeof err);
    if (!cl) {
        cli_errorf(cmd, "%s", err);
        return CLI_EXIT_USAGE;
    }
    const char *term = getenv("TERM");
    bool tty = !c->json && isatty(STDOUT_FILENO) && term && strcmp(term, "dumb");
    bool drawn = false;
    uint64_t last_fp = UINT64_MAX;
    double start = anv_now_s(), last_print = 0, last_answer = anv_now_s();
    int code = CLI_EXIT_OK;
    for (;;) {
        Anvil__Envelope req, *rep = NULL;
        Anvil__WatchRequest wr;
        anv_msg_init(&req);
        anvil__watch_request__init(&wr);
        wr.job_id = (char *)job_id;
        wr.from_offset = offset;
        wr.has_max_events = true;
        wr.max_events = 1000;
        wr.has_block_ms = true;
        wr.block_ms = S_BLOCK_MS;
        req.body_case = ANVIL__ENVELOPE__BODY_WATCH;
        req.watch = &wr;
        int rc = cli_client_call(cl, &req, ANVIL__ENVELOPE__BODY_WATCH_REPLY,
                                 S_BLOCK_MS + S_POLL_GRACE_MS, &rep);
        if (rc == ANV_ETIMEOUT && anv_now_s() - last_answer < c->timeout)
            continue; /* a lost poll (a restarting broker): ask again until --timeout */
        if (rc) {
            if (tty && drawn)
                printf("\n");
            if (rc == ANV_ECANCELLED)
                fprintf(stderr, "anvil %s: detached; job %s keeps running (anvil watch %s)\n",
                        cmd, job_id, job_id);
            else
                cli_errorf(cmd, "%s", cli_client_errstr(cl));
            code = rc == ANV_ECANCELLED ? CLI_EXIT_INTERRUPTED : cli_exit_for(rc);
            break;
        }
        last_answer = anv_now_s();
        const Anvil__WatchReply *w = rep->watch_reply;
        if (w->last_offset && *w->last_offset)
            snprintf(offset, sizeof offset, "%s", w->last_offset);
        for (size_t i = 0; i < w->n_events; i++) {
            const Anvil__Event *e = w->events[i];
            if (c->json) {
                cJSON *o = cli_json_event(e);
                cJSON_AddStringToObject(o, "job_id", job_id);
                cli_json_print(o, stdout);
            } else if (e->type && !strcmp(e->type, "dead") && !tty) {
                printf("dead task %llu sample %u: %s\n", (unsigned long long)e->task_index,
                       e->sample_index, e->detail ? e->detail : "");
            }
        }
        const Anvil__JobStatus *s = w->status;
        if (!s) {
            /* the broker has no status for it: there is no such job */
            anv_msg_free(&rep);
            if (tty && drawn)
                printf("\n");
            cli_errorf(cmd, "no such job '%s'", job_id);
            code = CLI_EXIT_NOTFOUND;
            break;
        }
        bool final = cli_job_state_final(s->state);
        double now = anv_now_s();
        if (c->json) {
            if (s_fingerprint(s) != last_fp || final || now - last_print >= interval) {
                cJSON *o = cli_json_job_status(s);
                cli_json_print(o, stdout);
                fflush(stdout);
                last_print = now;
            }
        } else if (tty) {
            s_render_tty(s, drawn, now - start);
            drawn = true;
        } else if (final || (s_fingerprint(s) != last_fp && now - last_print >= interval)) {
            s_render_plain(s);
            last_print = now;
        }
        last_fp = s_fingerprint(s);
        if (final) {
            code = s->state == ANVIL__JOB_STATE__JOB_DONE ? CLI_EXIT_OK : CLI_EXIT_FAILED;
            if (!c->json)
                fprintf(stderr, "job %s %s\n", job_id, cli_job_state_name(s->state));
            anv_msg_free(&rep);
            break;
        }
        anv_msg_free(&rep);
    }
    cli_client_destroy(&cl);
    return code;
}

int cli_cmd_watch(int argc, char **argv)
{
    static const cli_cmd_info_t info = {
        "watch", "JOB [options]",
        "Follows a job until it ends: progress bars on a terminal (generated, scored, failed, "
        "tokens/s, evals/min, pass rate, mean speedup, ETA), plain lines otherwise, JSON lines "
        "with --json. Exits 0 when the job is done, 1 when it failed or was cancelled. Ctrl-C "
        "detaches without cancelling."};
    cli_common_t c = {0};
    double interval = 2;
    anv_cfg_opt_t opts[CLI_MAX_OPTS] = {
        {"interval", ANV_CFG_DOUBLE, "2", 0.1, 3600, "seconds between plain or JSON lines",
         &interval, false}};
    size_t n = 1;
    cli_common_opts(&c, opts, &n);
    anv_cfg_rest_t rest;
    int code;
    cli_load(&info, opts, n, argc, argv, &rest, &c, &code);
    if (code >= 0)
        goto out;
    if (rest.argc != 1) {
        cli_errorf(info.name, "needs exactly one JOB (see anvil watch --help)");
        code = CLI_EXIT_USAGE;
        goto out;
    }
    code = cli_watch_job(info.name, &c, rest.argv[0], interval);
out:
    anv_config_free(opts, n, &rest);
    return code;
}

/*  cli_query.c - the one-shot subcommands: status, cancel, retry, workers, import.

    Each is one request and one reply (cli_rpc), printed as a table for people or as one JSON
    document with --json. `import` talks to no broker: it runs an importer (cli_import.h) into
    a temporary file beside --out and renames it into place only when the whole benchmark was
    written, so a failed import never leaves a partial prompt file behind.
*/
#include "anv_error.h"
#include "anv_msg.h"
#include "anv_time.h"
#include "cli_client.h"
#include "cli_cmd.h"
#include "cli_import.h"
#include "cli_json.h"
#include "cli_util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static bool s_job_id_ok(const char *cmd, const char *id)
{
    size_t n = id ? strlen(id) : 0;
    bool ok = n > 0 && n <= 128;
    for (size_t i = 0; ok && i < n; i++)
        ok = id[i] > ' ' && id[i] < 127;
    if (!ok)
        cli_errorf(cmd, "'%s' is not a job id", id ? id : "");
    return ok;
}

/* ---------------------------------------------------------------------------------------- */
/* status */

static void s_print_jobs(const Anvil__StatusReply *r)
{
    printf("%-26s %-16s %-10s %7s %8s %9s %8s %6s %6s %7s %8s\n", "JOB", "NAME", "STATE", "TASKS",
           "SAMPLES", "GENERATED", "SCORED", "FAILED", "PASS", "SPEEDUP", "AGE");
    int64_t now = anv_wall_ms();
    for (size_t i = 0; i < r->n_jobs; i++) {
        const Anvil__JobStatus *j = r->jobs[i];
        char pass[16] = "-", speed[16] = "-", age[16] = "-";
        if (j->has_pass_rate)
            snprintf(pass, sizeof pass, "%.1f%%", 100 * j->pass_rate);
        if (j->has_mean_speedup)
            snprintf(speed, sizeof speed, "%.2fx", j->mean_speedup);
        if (j->has_created_ms && (int64_t)j->created_ms <= now)
            cli_fmt_duration((double)(now - (int64_t)j->created_ms) / 1000, age, sizeof age);
        printf("%-26s %-16.16s %-10s %7llu %8llu %9llu %8llu %6llu %6s %7s %8s\n", j->job_id,
               j->name ? j->name : "-", cli_job_state_name(j->state),
               (unsigned long long)j->tasks, (unsigned long long)j->samples_total,
               (unsigned long long)j->generated, (unsigned long long)j->scored,
               (unsigned long long)(j->failed + j->dead), pass, speed, age);
    }
}

int cli_cmd_status(int argc, char **argv)
{
    static const cli_cmd_info_t info = {
        "status", "[JOB] [options]",
        "Shows one job (JOB) or the most recent jobs: state, tasks, samples generated and "
        "scored, failures, pass rate and mean speedup."};
    cli_common_t c = {0};
    int64_t limit = 0;
    anv_cfg_opt_t opts[CLI_MAX_OPTS] = {
        {"limit", ANV_CFG_INT, "20", 1, 10000, "at most this many jobs without JOB", &limit,
         false}};
    size_t n = 1;
    cli_common_opts(&c, opts, &n);
    anv_cfg_rest_t rest;
    int code;
    cli_load(&info, opts, n, argc, argv, &rest, &c, &code);
    if (code >= 0)
        goto out;
    code = CLI_EXIT_USAGE;
    if (rest.argc > 1) {
        cli_errorf(info.name, "takes at most one JOB (see anvil status --help)");
        goto out;
    }
    const char *job = rest.argc ? rest.argv[0] : NULL;
    if (job && !s_job_id_ok(info.name, job))
        goto out;
    Anvil__Envelope req, *rep = NULL;
    Anvil__StatusRequest sr;
    anv_msg_init(&req);
    anvil__status_request__init(&sr);
    sr.job_id = (char *)job;
    sr.has_limit = true;
    sr.limit = (uint32_t)limit;
    req.body_case = ANVIL__ENVELOPE__BODY_STATUS;
    req.status = &sr;
    code = cli_rpc(info.name, &c, &req, ANVIL__ENVELOPE__BODY_STATUS_REPLY, &rep);
    if (code)
        goto out;
    const Anvil__StatusReply *r = rep->status_reply;
    if (job && r->n_jobs == 0) {
        cli_errorf(info.name, "no job '%s'", job);
        code = CLI_EXIT_NOTFOUND;
    } else if (c.json) {
        cJSON *doc = job ? cli_json_job_status(r->jobs[0]) : cJSON_CreateArray();
        for (size_t i = 0; !job && doc && i < r->n_jobs; i++)
            cJSON_AddItemToArray(doc, cli_json_job_status(r->jobs[i]));
        cli_json_print(doc, stdout);
    } else if (r->n_jobs == 0) {
        printf("no jobs\n");
    } else {
        s_print_jobs(r);
    }
    anv_msg_free(&rep);
out:
    anv_config_free(opts, n, &rest);
    return code;
}

/* ---------------------------------------------------------------------------------------- */
/* cancel, retry */

static int s_job_cmd(const cli_cmd_info_t *info, int argc, char **argv, bool retry)
{
    cli_common_t c = {0};
    bool failed = false;
    anv_cfg_opt_t opts[CLI_MAX_OPTS] = {
        {"failed", ANV_CFG_BOOL, NULL, 0, -1,
         "re-queue the samples that failed or were dead-lettered", &failed, false}};
    size_t n = retry ? 1 : 0;
    cli_common_opts(&c, opts, &n);
    anv_cfg_rest_t rest;
    int code;
    cli_load(info, opts, n, argc, argv, &rest, &c, &code);
    if (code >= 0)
        goto out;
    code = CLI_EXIT_USAGE;
    if (rest.argc != 1) {
        cli_errorf(info->name, "needs exactly one JOB (see anvil %s --help)", info->name);
        goto out;
    }
    if (retry && !failed) {
        cli_errorf(info->name, "say what to retry: --failed (see anvil retry --help)");
        goto out;
    }
    const char *job = rest.argv[0];
    if (!s_job_id_ok(info->name, job))
        goto out;
    Anvil__Envelope req, *rep = NULL;
    Anvil__CancelRequest cr;
    Anvil__RetryRequest rr;
    anv_msg_init(&req);
    if (retry) {
        anvil__retry_request__init(&rr);
        rr.job_id = (char *)job;
        rr.has_failed_only = true;
        rr.failed_only = true;
        req.body_case = ANVIL__ENVELOPE__BODY_RETRY;
        req.retry = &rr;
    } else {
        anvil__cancel_request__init(&cr);
        cr.job_id = (char *)job;
        req.body_case = ANVIL__ENVELOPE__BODY_CANCEL;
        req.cancel = &cr;
    }
    code = cli_rpc(info->name, &c, &req,
                   retry ? ANVIL__ENVELOPE__BODY_RETRY_REPLY : ANVIL__ENVELOPE__BODY_CANCEL_REPLY,
                   &rep);
    if (code == CLI_EXIT_NOTFOUND || code)
        goto out;
    uint64_t count = retry ? rep->retry_reply->requeued : rep->cancel_reply->cancelled;
    if (c.json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "job_id", job);
        cJSON_AddNumberToObject(o, retry ? "requeued" : "cancelled", (double)count);
        cli_json_print(o, stdout);
    } else if (retry) {
        printf("job %s: %llu failed sample(s) re-queued\n", job, (unsigned long long)count);
    } else {
        printf("job %s cancelled: %llu unit(s) will not run\n", job, (unsigned long long)count);
    }
    anv_msg_free(&rep);
out:
    anv_config_free(opts, n, &rest);
    return code;
}

int cli_cmd_cancel(int argc, char **argv)
{
    static const cli_cmd_info_t info = {
        "cancel", "JOB [options]",
        "Cancels a job: nothing more of it is dispatched and workers abandon its units. "
        "Results recorded so far are kept."};
    return s_job_cmd(&info, argc, argv, false);
}

int cli_cmd_retry(int argc, char **argv)
{
    static const cli_cmd_info_t info = {
        "retry", "JOB --failed [options]",
        "Re-queues the samples of a job that failed or were dead-lettered (with fresh attempt "
        "counts). Samples that succeeded are not run again."};
    return s_job_cmd(&info, argc, argv, true);
}

/* ---------------------------------------------------------------------------------------- */
/* workers */

int cli_cmd_workers(int argc, char **argv)
{
    static const cli_cmd_info_t info = {
        "workers", "[options]",
        "Lists the workers registered with the broker: kind, state, GPU, model and weight "
        "version, slots in use, last heartbeat."};
    cli_common_t c = {0};
    anv_cfg_opt_t opts[CLI_MAX_OPTS];
    size_t n = 0;
    cli_common_opts(&c, opts, &n);
    anv_cfg_rest_t rest;
    int code;
    cli_load(&info, opts, n, argc, argv, &rest, &c, &code);
    if (code >= 0)
        goto out;
    if (rest.argc) {
        cli_errorf(info.name, "takes no arguments");
        code = CLI_EXIT_USAGE;
        goto out;
    }
    Anvil__Envelope req, *rep = NULL;
    Anvil__WorkersRequest wr;
    anv_msg_init(&req);
    anvil__workers_request__init(&wr);
    req.body_case = ANVIL__ENVELOPE__BODY_WORKERS;
    req.workers = &wr;
    code = cli_rpc(info.name, &c, &req, ANVIL__ENVELOPE__BODY_WORKERS_REPLY,
                   &rep);
    if (code)
        goto out;
    const Anvil__WorkersReply *r = rep->workers_reply;
    if (c.json) {
        cJSON *a = cJSON_CreateArray();
        for (size_t i = 0; a && i < r->n_workers; i++)
            cJSON_AddItemToArray(a, cli_json_worker(r->workers[i]));
        cli_json_print(a, stdout);
    } else if (!r->n_workers) {
        printf("no workers registered\n");
    } else {
        printf("%-28s %-5s %-9s %-16s %-4s %-24s %6s %9s %8s\n", "WORKER", "KIND", "STATE", "HOST",
               "GPU", "MODEL", "WEIGHTS", "IN FLIGHT", "SEEN");
        for (size_t i = 0; i < r->n_workers; i++) {
            const Anvil__WorkerInfo *w = r->workers[i];
            char gpu[16], seen[16], slots[32];
            if (w->has_gpu_index && w->gpu_index >= 0)
                snprintf(gpu, sizeof gpu, "%d", w->gpu_index);
            else
                snprintf(gpu, sizeof gpu, "cpu");
            snprintf(seen, sizeof seen, "%.1fs", w->last_seen_s);
            snprintf(slots, sizeof slots, "%u/%u", w->in_flight, w->slots);
            printf("%-28.28s %-5s %-9s %-16.16s %-4s %-24.24s %6llu %9s %8s\n",
                   w->worker_id ? w->worker_id : "-", cli_worker_kind_name(w->kind),
                   w->state ? w->state : "-", w->hostname ? w->hostname : "-", gpu,
                   w->model ? w->model : "-", (unsigned long long)w->weight_version, slots,
                   seen);
        }
    }
    anv_msg_free(&rep);
out:
    anv_config_free(opts, n, &rest);
    return code;
}

/* ---------------------------------------------------------------------------------------- */
/* import */

int cli_cmd_import(int argc, char **argv)
{
    static const cli_cmd_info_t info = {
        "import", "kernelbench|tritonbench-g|tritonbench-t DIR [--out FILE] [options]",
        "Turns a benchmark into a prompt file for `anvil submit`: one line per problem with "
        "the benchmark's own prompt as a user message and the reference (and test) in the "
        "task, so that samples can be scored. DIR is the dataset folder (KernelBench: with "
        "level1/, level2/ ...; TritonBench: with TritonBench_G_v1.json and TritonBench_G_v1/, "
        "or the T equivalents)."};
    cli_common_t c = {0};
    char *out_path = NULL, *match = NULL;
    int64_t level = 0, limit = 0;
    bool simple = false;
    anv_cfg_opt_t opts[CLI_MAX_OPTS] = {
        {"out", ANV_CFG_STR, NULL, 0, -1, "write here instead of standard output", &out_path,
         false},
        {"level", ANV_CFG_INT, "0", 0, 9, "kernelbench: only this level (0 = all)", &level,
         false},
        {"limit", ANV_CFG_INT, "0", 0, 1e9, "at most this many problems (0 = all)", &limit,
         false},
        {"match", ANV_CFG_STR, NULL, 0, -1, "only problems whose name contains this text",
         &match, false},
        {"simple", ANV_CFG_BOOL, NULL, 0, -1,
         "tritonbench: the simple instruction instead of the complex one", &simple, false},
    };
    size_t n = 5;
    cli_common_opts(&c, opts, &n);
    anv_cfg_rest_t rest;
    int code;
    char tmp[4200] = "";
    cli_load(&info, opts, n, argc, argv, &rest, &c, &code);
    if (code >= 0)
        goto out;
    code = CLI_EXIT_USAGE;
    cli_bench_t bench;
    if (rest.argc != 2 || cli_import_bench_parse(rest.argv[0], &bench)) {
        cli_errorf(info.name, "usage: anvil %s %s", info.name, info.synopsis);
        goto out;
    }
    FILE *out = stdout;
    if (out_path && *out_path) {
        snprintf(tmp, sizeof tmp, "%s.partial.%d", out_path, (int)getpid());
        if (!(out = fopen(tmp, "w"))) {
            cli_errorf(info.name, "cannot create '%s': %s", tmp, strerror(errno));
            code = CLI_EXIT_FAILED;
            tmp[0] = 0;
            goto out;
        }
    }
    cli_import_opts_t io = {.level = (int)level, .limit = (size_t)limit,
                            .simple_instruction = simple, .match = match};
    size_t count = 0;
    char err[1024];
    int rc = cli_import_run(bench, rest.argv[1], &io, out, &count, err, sizeof err);
    if (out != stdout && fclose(out) != 0 && !rc) {
        snprintf(err, sizeof err, "cannot write '%s': %s", tmp, strerror(errno));
        rc = -EIO;
    }
    if (!rc && count == 0) {
        snprintf(err, sizeof err, "no problems matched in '%s'", rest.argv[1]);
        rc = ANV_ENOTFOUND;
    }
    if (rc) {
        cli_errorf(info.name, "%s", err);
        code = rc == ANV_ENOTFOUND || rc == ANV_EFORMAT ? CLI_EXIT_INPUT : CLI_EXIT_FAILED;
        goto out;
    }
    if (tmp[0]) {
        if (rename(tmp, out_path) != 0) {
            cli_errorf(info.name, "cannot rename '%s' to '%s': %s", tmp, out_path,
                       strerror(errno));
            code = CLI_EXIT_FAILED;
            goto out;
        }
        tmp[0] = 0;
    }
    if (c.json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "benchmark", rest.argv[0]);
        cJSON_AddNumberToObject(o, "problems", (double)count);
        if (out_path && *out_path)
            cJSON_AddStringToObject(o, "out", out_path);
        cli_json_print(o, out_path && *out_path ? stdout : stderr);
    } else {
        fprintf(stderr, "imported %zu %s problem(s)%s%s\n", count, rest.argv[0],
                out_path && *out_path ? " into " : "", out_path && *out_path ? out_path : "");
    }
    code = CLI_EXIT_OK;
out:
    if (tmp[0])
        unlink(tmp);
    anv_config_free(opts, n, &rest);
    return code;
}

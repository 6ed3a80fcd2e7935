/*  cli_results.c - `anvil results JOB`: a job's samples and scores as JSONL, page by page.

    RESULTS is asked for one page at a time with the cursor of the previous reply, and each
    page is written out before the next is asked for, so memory stays one page whatever the
    job's size. Samples whose generation failed or that were dead-lettered go to a separate
    errors file (as in OpenAI's Batch API); scored samples, whatever their score, are results.
    With --out, both files are written under temporary names and renamed into place only when
    the last page arrived, so a broken download never looks complete.
*/
#include "anv_error.h"
#include "anv_msg.h"
#include "cli_client.h"
#include "cli_cmd.h"
#include "cli_json.h"
#include "cli_util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    const char *final_path;
    char tmp[4200];
    FILE *f;
} s_out_t;

static int s_out_open(s_out_t *o, const char *path)
{
    o->final_path = path;
    snprintf(o->tmp, sizeof o->tmp, "%s.partial.%d", path, (int)getpid());
    if (!(o->f = fopen(o->tmp, "w"))) {
        cli_errorf("results", "cannot create '%s': %s", o->tmp, strerror(errno));
        o->tmp[0] = 0;
        return -errno;
    }
    return 0;
}

/* Closes and renames into place when `commit`, else removes the temporary file. */
static int s_out_close(s_out_t *o, bool commit)
{
    if (!o->f)
        return 0;
    int rc = fclose(o->f) == 0 ? 0 : -errno;
    o->f = NULL;
    if (rc)
        cli_errorf("results", "cannot write '%s': %s", o->tmp, strerror(-rc));
    if (commit && !rc && rename(o->tmp, o->final_path) != 0) {
        rc = -errno;
        cli_errorf("results", "cannot rename '%s' to '%s': %s", o->tmp, o->final_path,
                   strerror(errno));
    }
    if (!commit || rc)
        unlink(o->tmp);
    return rc;
}

/* "out.jsonl" -> "out.errors.jsonl" */
static void s_errors_path(const char *out, char *buf, size_t len)
{
    size_t n = strlen(out);
    if (n > 6 && !strcmp(out + n - 6, ".jsonl"))
        snprintf(buf, len, "%.*s.errors.jsonl", (int)(n - 6), out);
    else
        snprintf(buf, len, "%s.errors.jsonl", out);
}

int cli_cmd_results(int argc, char **argv)
{
    static const cli_cmd_info_t info = {
        "results", "JOB [--out FILE] [--status S] [options]",
        "Writes a job's samples as JSONL, one line per sample: custom_id, sample, text, "
        "prompt_tokens, completion_tokens, finish_reason, weight_version, seed, optional "
        "token_ids + logprobs (--logprobs) and the score (status, speedup, reward, errors). "
        "Samples whose generation failed go to a separate errors file (--errors; with --out "
        "it defaults to FILE.errors.jsonl; without either they stay in the main output). "
        "--status keeps only samples with that finish reason (eos, stop, length, error, ...) "
        "or score status (correct, incorrect, compile_error, runtime_error, timeout, ...). "
        "A job still running gives the results recorded so far."};
    cli_common_t c = {0};
    char *out_path = NULL, *err_path = NULL, *status = NULL;
    int64_t page = 0;
    bool logprobs = false;
    anv_cfg_opt_t opts[CLI_MAX_OPTS] = {
        {"out", ANV_CFG_STR, NULL, 0, -1, "write the results here (default standard output)",
         &out_path, false},
        {"errors", ANV_CFG_STR, NULL, 0, -1, "write failed samples here", &err_path, false},
        {"status", ANV_CFG_STR, NULL, 0, -1, "only samples with this status", &status, false},
        {"logprobs", ANV_CFG_BOOL, NULL, 0, -1, "include token ids and their logprobs",
         &logprobs, false},
        {"page-size", ANV_CFG_INT, "500", 1, 100000, "samples per RESULTS request", &page,
         false},
    };
    size_t n = 5;
    cli_common_opts(&c, opts, &n);
    anv_cfg_rest_t rest;
    int code;
    s_out_t out = {0}, errs = {0};
    cli_client_t *cl = NULL;
    cli_load(&info, opts, n, argc, argv, &rest, &c, &code);
    if (code >= 0)
        goto out;
    if (rest.argc != 1) {
        cli_errorf(info.name, "needs exactly one JOB (see anvil results --help)");
        code = CLI_EXIT_USAGE;
        goto out;
    }
    const char *job = rest.argv[0];
    char derived[4200];
    bool to_file = out_path && *out_path;
    if (to_file && (!err_path || !*err_path)) {
        s_errors_path(out_path, derived, sizeof derived);
        free(err_path);
        err_path = strdup(derived); /* freed by anv_config_free: it owns the slot */
    }
    code = CLI_EXIT_FAILED;
    if (to_file && s_out_open(&out, out_path))
        goto out;
    if (err_path && *err_path && s_out_open(&errs, err_path))
        goto out;
    FILE *fo = to_file ? out.f : stdout;
    FILE *fe = errs.f ? errs.f : fo;
    char err[512];
    if (!(cl = cli_client_open(&c, err, sizeof err))) {
        cli_errorf(info.name, "%s", err);
        code = CLI_EXIT_USAGE;
        goto out;
    }
    /* the job must exist (RESULTS of an unknown id is just empty), and its state says
       whether these are all the results or the ones so far */
    Anvil__Envelope sreq, *srep = NULL;
    Anvil__StatusRequest sr;
    anv_msg_init(&sreq);
    anvil__status_request__init(&sr);
    sr.job_id = (char *)job;
    sreq.body_case = ANVIL__ENVELOPE__BODY_STATUS;
    sreq.status = &sr;
    int rc = cli_client_call(cl, &sreq, ANVIL__ENVELOPE__BODY_STATUS_REPLY,
                             (int)(c.timeout * 1000), &srep);
    if (!rc && srep->status_reply->n_jobs == 0)
        rc = ANV_ENOTFOUND;
    bool running = !rc && !cli_job_state_final(srep->status_reply->jobs[0]->state);
    anv_msg_free(&srep);
    if (rc) {
        cli_errorf(info.name, "%s", rc == ANV_ENOTFOUND ? "no such job" : cli_client_errstr(cl));
        code = cli_exit_for(rc);
        goto out;
    }
    char *cursor = NULL;
    uint64_t n_ok = 0, n_err = 0;
    for (;;) {
        Anvil__Envelope req, *rep = NULL;
        Anvil__ResultsRequest rr;
        anv_msg_init(&req);
        anvil__results_request__init(&rr);
        rr.job_id = (char *)job;
        rr.cursor = cursor;
        rr.has_page_size = true;
        rr.page_size = (uint32_t)page;
        rr.status = status && *status ? status : NULL;
        rr.has_with_tokens = true;
        rr.with_tokens = logprobs;
        req.body_case = ANVIL__ENVELOPE__BODY_RESULTS;
        req.results = &rr;
        rc = cli_client_call(cl, &req, ANVIL__ENVELOPE__BODY_RESULTS_REPLY,
                             (int)(c.timeout * 1000), &rep);
        if (rc)
            break;
        const Anvil__ResultsReply *r = rep->results_reply;
        for (size_t i = 0; i < r->n_results; i++) {
            bool bad = cli_result_is_error(r->results[i]);
            cli_json_print(cli_json_sample_result(r->results[i], logprobs), bad ? fe : fo);
            if (bad)
                n_err++;
            else
                n_ok++;
        }
        /* a running job answers "not done" with no new results once we have caught up */
        bool done = (r->has_done && r->done) || !r->next_cursor || !*r->next_cursor ||
                    r->n_results == 0;
        bool stuck = !done && cursor && !strcmp(cursor, r->next_cursor);
        free(cursor);
        cursor = done ? NULL : strdup(r->next_cursor);
        anv_msg_free(&rep);
        if (stuck) {
            snprintf(err, sizeof err, "the broker returned the same cursor twice");
            rc = ANV_EPROTO;
            break;
        }
        if (done)
            break;
        if (!cursor) {
            rc = -ENOMEM;
            break;
        }
    }
    free(cursor);
    if (rc) {
        if (rc == ANV_ECANCELLED)
            cli_errorf(info.name, "interrupted; nothing was written");
        else
            cli_errorf(info.name, "%s%s", rc == ANV_EPROTO && !*cli_client_errstr(cl)
                                              ? err
                                              : cli_client_errstr(cl),
                       to_file ? "; nothing was written" : "");
        code = rc == ANV_ECANCELLED ? CLI_EXIT_INTERRUPTED : cli_exit_for(rc);
        goto out;
    }
    if (fflush(stdout) != 0 || s_out_close(&out, true) || s_out_close(&errs, true)) {
        code = CLI_EXIT_FAILED;
        goto out;
    }
    if (c.json && to_file) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "job_id", job);
        cJSON_AddNumberToObject(o, "results", (double)n_ok);
        cJSON_AddNumberToObject(o, "errors", (double)n_err);
        cJSON_AddStringToObject(o, "out", out_path);
        if (err_path && *err_path)
            cJSON_AddStringToObject(o, "errors_file", err_path);
        cli_json_print(o, stdout);
    } else {
        fprintf(stderr, "anvil results: %llu result(s)%s%s, %llu error(s)%s%s%s\n",
                (unsigned long long)n_ok, to_file ? " in " : "", to_file ? out_path : "",
                (unsigned long long)n_err, errs.final_path ? " in " : "",
                errs.final_path ? errs.final_path : "",
                running ? " (the job is still running: the results so far)" : "");
    }
    code = CLI_EXIT_OK;
out:
    s_out_close(&out, false);
    s_out_close(&errs, false);
    cli_client_destroy(&cl);
    anv_config_free(opts, n, &rest);
    return code;
}

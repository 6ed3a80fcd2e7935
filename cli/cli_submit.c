/*  cli_submit.c - `anvil submit FILE`: validate the whole file, then queue it in chunks.

    Two passes over the file (cli_jsonl): the first validates every line and counts the
    tasks, so that a malformed line N stops the submit before anything is queued (or, with
    --skip-invalid, is reported and left out); the second re-reads the file and sends it in
    SUBMIT chunks bounded by task count and packed bytes, the first carrying the JobSpec and
    the last `final`. The job's idempotency key is --name (or a fresh id when there is none),
    and the broker skips tasks whose custom_id it already has, so re-running the same command
    after an interruption or a lost reply resumes the job and queues nothing twice; a chunk
    whose reply is lost is therefore simply sent again. The job id is printed (alone on stdout)
    only when the broker reports the final chunk durable. With --score-only every line carries
    existing completions ("completion" or "completions") and a task: nothing is generated, the
    job (JobSpec.score_only) re-scores them.
*/
#include "anv_error.h"
#include "anv_id.h"
#include "anv_msg.h"
#include "anv_time.h"
#include "cli_client.h"
#include "cli_cmd.h"
#include "cli_jsonl.h"
#include "cli_util.h"
#include "cli_watch.h"

#include <stdlib.h>
#include <string.h>

#define S_CHUNK_BYTES (8u << 20)
#define S_SHOW_ERRORS 10
#define S_CHUNK_ATTEMPTS 3

typedef struct {
    int64_t samples, max_tokens, top_k, seed, priority, chunk, max_attempts;
    double temperature, top_p, interval;
    char *name;
    bool score, wait, skip_invalid, strict, raw, score_only;
} s_opts_t;

typedef struct {
    uint64_t valid, invalid, samples;
    bool any_ref;
} s_scan_t;

/* What is wrong with a well-formed line in this mode (score-only or not), or NULL. */
static const char *s_line_problem(const s_opts_t *o, const Anvil__Task *t)
{
    if (o->score_only && !t->n_completions)
        return "--score-only needs a 'completion' or 'completions' on every line";
    if (o->score_only && (!t->ref || t->ref->kind == ANVIL__TASK_KIND__TASK_KIND_NONE))
        return "a completion needs a 'task' (kind and reference) to be scored against";
    if (!o->score_only && t->n_completions)
        return "the line carries completions: re-score them with --score-only";
    return NULL;
}

/* Pass 1: every line. Prints the first errors; returns 0 or an exit code. */
static int s_validate(const char *file, cli_jsonl_t *r, const s_opts_t *o, s_scan_t *scan)
{
    Anvil__Task *t = NULL;
    int rc;
    memset(scan, 0, sizeof *scan);
    while ((rc = cli_jsonl_next(r, &t)) != 0) {
        const char *why = rc == 1 ? s_line_problem(o, t) : NULL;
        if (why) {
            if (++scan->invalid <= S_SHOW_ERRORS)
                fprintf(stderr, "%s: line %llu: %s\n", file,
                        (unsigned long long)cli_jsonl_line(r), why);
            cli_task_free(&t);
            continue;
        }
        if (rc == 1) {
            scan->valid++;
            scan->samples += t->n_completions ? t->n_completions
                             : t->has_n       ? t->n
                                              : (uint64_t)o->samples;
            scan->any_ref = scan->any_ref ||
                            (t->ref && t->ref->kind != ANVIL__TASK_KIND__TASK_KIND_NONE);
            cli_task_free(&t);
            continue;
        }
        if (rc != ANV_EFORMAT) {
            cli_errorf("submit", "%s", cli_jsonl_errstr(r));
            return CLI_EXIT_INPUT;
        }
        if (++scan->invalid <= S_SHOW_ERRORS)
            fprintf(stderr, "%s: %s\n", file, cli_jsonl_errstr(r));
    }
    if (scan->invalid > S_SHOW_ERRORS)
        fprintf(stderr, "%s: ... and %llu more malformed line(s)\n", file,
                (unsigned long long)(scan->invalid - S_SHOW_ERRORS));
    if (scan->invalid && !o->skip_invalid) {
        cli_errorf("submit", "nothing was queued: %llu malformed line(s) in '%s'; fix them or "
                             "pass --skip-invalid to leave them out",
                   (unsigned long long)scan->invalid, file);
        return CLI_EXIT_INPUT;
    }
    if (!scan->valid) {
        cli_errorf("submit", "nothing was queued: '%s' holds no prompts", file);
        return CLI_EXIT_INPUT;
    }
    return 0;
}

static void s_spec(const s_opts_t *o, int argc, char **argv, bool default_score,
                   const char *key, Anvil__JobSpec *spec, Anvil__SamplingParams *sp)
{
    anvil__job_spec__init(spec);
    anvil__sampling_params__init(sp);
    spec->name = o->name && *o->name ? o->name : NULL;
    spec->idempotency_key = (char *)key;
    spec->has_priority = true;
    spec->priority = (int32_t)o->priority;
    spec->has_n = true;
    spec->n = (uint32_t)o->samples;
    spec->has_score = true;
    spec->score = cli_opt_given(argc, argv, "score") ? o->score : default_score;
    spec->has_chat = true;
    spec->chat = !o->raw;
    if (o->score_only) {
        spec->has_score_only = spec->score_only = true;
        spec->score = true;
    }
    spec->has_created_ms = true;
    spec->created_ms = (uint64_t)anv_wall_ms();
    if (o->strict)
        spec->has_durability = true, spec->durability = ANVIL__DURABILITY__DURABILITY_STRICT;
    if (o->max_attempts)
        spec->has_max_attempts = true, spec->max_attempts = (uint32_t)o->max_attempts;
    bool any = false;
    if (cli_opt_given(argc, argv, "temperature"))
        sp->has_temperature = any = true, sp->temperature = (float)o->temperature;
    if (cli_opt_given(argc, argv, "top-p"))
        sp->has_top_p = any = true, sp->top_p = (float)o->top_p;
    if (cli_opt_given(argc, argv, "top-k"))
        sp->has_top_k = any = true, sp->top_k = (int32_t)o->top_k;
    if (cli_opt_given(argc, argv, "max-tokens") && o->max_tokens > 0)
        sp->has_max_tokens = any = true, sp->max_tokens = (uint32_t)o->max_tokens;
    if (cli_opt_given(argc, argv, "seed"))
        sp->has_seed = any = true, sp->seed = (uint64_t)o->seed;
    spec->sampling = any ? sp : NULL;
}

typedef struct {
    cli_client_t *client;
    const cli_common_t *c;
    Anvil__JobSpec *spec;
    char job_id[160];
    uint64_t chunk_index, accepted, skipped, sent;
    bool existing, durable;
} s_submit_t;

/* Sends one chunk, again when its reply is lost (the broker skips what it already has). */
static int s_send_chunk(s_submit_t *s, Anvil__Task **tasks, size_t n, bool final)
{
    Anvil__Envelope req, *rep = NULL;
    Anvil__SubmitRequest sr;
    anv_msg_init(&req);
    anvil__submit_request__init(&sr);
    if (!s->job_id[0])
        sr.spec = s->spec;
    else
        sr.job_id = s->job_id;
    sr.tasks = tasks;
    sr.n_tasks = n;
    sr.has_final = true;
    sr.final = final;
    sr.has_chunk_index = true;
    sr.chunk_index = s->chunk_index;
    req.body_case = ANVIL__ENVELOPE__BODY_SUBMIT;
    req.submit = &sr;
    int rc = ANV_ETIMEOUT;
    for (int attempt = 1; attempt <= S_CHUNK_ATTEMPTS && rc == ANV_ETIMEOUT; attempt++) {
        rc = cli_client_call(s->client, &req, ANVIL__ENVELOPE__BODY_SUBMIT_REPLY,
                             (int)(s->c->timeout * 1000), &rep);
        if (rc == ANV_ETIMEOUT && attempt < S_CHUNK_ATTEMPTS)
            fprintf(stderr, "anvil submit: no reply to chunk %llu, sending it again (%d/%d)\n",
                    (unsigned long long)s->chunk_index, attempt + 1, S_CHUNK_ATTEMPTS);
    }
    if (rc) {
        if (rc == ANV_ECANCELLED)
            cli_errorf("submit", "interrupted");
        else
            cli_errorf("submit", "chunk %llu: %s", (unsigned long long)s->chunk_index,
                       cli_client_errstr(s->client));
        return rc;
    }
    const Anvil__SubmitReply *r = rep->submit_reply;
    if (!s->job_id[0]) {
        snprintf(s->job_id, sizeof s->job_id, "%s", r->job_id);
        s->existing = r->has_existing && r->existing;
        if (s->existing)
            fprintf(stderr, "anvil submit: job %s named '%s' exists: adding only the prompts it "
                            "does not have\n",
                    s->job_id, s->spec->name ? s->spec->name : "");
    } else if (strcmp(s->job_id, r->job_id)) {
        cli_errorf("submit", "the broker answered chunk %llu for job %s, not %s",
                   (unsigned long long)s->chunk_index, r->job_id, s->job_id);
        anv_msg_free(&rep);
        return ANV_EPROTO;
    }
    s->accepted += r->accepted;
    s->skipped += r->skipped;
    s->durable = r->has_durable && r->durable;
    s->chunk_index++;
    s->sent += n;
    anv_msg_free(&rep);
    return 0;
}

/* Pass 2: re-read and send. */
static int s_send_all(s_submit_t *s, cli_jsonl_t *r, const s_opts_t *o, uint64_t valid)
{
    size_t cap = (size_t)o->chunk, n = 0, bytes = 0;
    Anvil__Task **tasks = calloc(cap, sizeof *tasks);
    int rc = 0;
    if (!tasks)
        return -ENOMEM;
    uint64_t seen = 0;
    for (;;) {
        Anvil__Task *t = NULL;
        int got = cli_jsonl_next(r, &t);
        if (got < 0 && got != ANV_EFORMAT) {
            cli_errorf("submit", "%s", cli_jsonl_errstr(r));
            rc = got;
            break;
        }
        if (got == ANV_EFORMAT)
            continue; /* reported and counted in the first pass */
        if (got == 1 && s_line_problem(o, t)) {
            cli_task_free(&t); /* reported and counted in the first pass */
            continue;
        }
        if (got == 1) {
            seen++;
            size_t sz = anvil__task__get_packed_size(t);
            if (n && (n == cap || bytes + sz > S_CHUNK_BYTES)) {
                if ((rc = s_send_chunk(s, tasks, n, false)))
                    break;
                while (n)
                    cli_task_free(&tasks[--n]);
                bytes = 0;
            }
            tasks[n++] = t;
            bytes += sz;
            if (seen < valid)
                continue;
        }
        /* end of file (or the last valid task): the final chunk */
        if (seen != valid) {
            cli_errorf("submit", "'%s' changed while it was being submitted (%llu prompts "
                                 "now, %llu before)",
                       "input", (unsigned long long)seen, (unsigned long long)valid);
            rc = ANV_ESTATE;
            break;
        }
        rc = s_send_chunk(s, tasks, n, true);
        break;
    }
    while (n)
        cli_task_free(&tasks[--n]);
    free(tasks);
    return rc;
}

int cli_cmd_submit(int argc, char **argv)
{
    static const cli_cmd_info_t info = {
        "submit", "FILE.jsonl [options]",
        "Queues every prompt of FILE (Anvil JSONL or OpenAI Batch API JSONL, detected per "
        "file; - = standard input) as one job and prints the job id once the job is durable. "
        "The whole file is validated first: a malformed line stops the submit before "
        "anything is queued. Per-line fields (n, temperature, max_tokens, ...) override the "
        "flags. --name is also the idempotency key: submitting the same file with the same "
        "name again resumes the job and queues nothing twice."};
    cli_common_t c = {0};
    s_opts_t o = {0};
    anv_cfg_opt_t opts[CLI_MAX_OPTS] = {
        {"samples", ANV_CFG_INT, "1", 1, 4096, "samples per prompt (n)", &o.samples, false},
        {"max-tokens", ANV_CFG_INT, NULL, 0, 1 << 20,
         "tokens per sample at most (0 = the broker's default)", &o.max_tokens, false},
        {"temperature", ANV_CFG_DOUBLE, NULL, 0, 10, "sampling temperature, 0 = greedy",
         &o.temperature, false},
        {"top-p", ANV_CFG_DOUBLE, NULL, 0, 1, "nucleus sampling, in (0, 1]", &o.top_p, false},
        {"top-k", ANV_CFG_INT, NULL, 0, 1e6, "top-k sampling, 0 = off", &o.top_k, false},
        {"seed", ANV_CFG_INT, NULL, 0, 9007199254740992.0,
         "base seed; sample i of a prompt draws from (seed, i)", &o.seed, false},
        {"priority", ANV_CFG_INT, "0", -1000, 1000, "higher runs first", &o.priority, false},
        {"name", ANV_CFG_STR, NULL, 0, -1, "job name and idempotency key", &o.name, false},
        {"score", ANV_CFG_BOOL, NULL, 0, -1,
         "score samples (--no-score: generate only; default: when prompts carry a task)",
         &o.score, false},
        {"wait", ANV_CFG_BOOL, NULL, 0, -1, "follow the job until it ends (as anvil watch)",
         &o.wait, false},
        {"interval", ANV_CFG_DOUBLE, "2", 0.1, 3600, "--wait: seconds between plain lines",
         &o.interval, false},
        {"skip-invalid", ANV_CFG_BOOL, NULL, 0, -1,
         "leave malformed lines out (they are listed) instead of refusing the file",
         &o.skip_invalid, false},
        {"strict", ANV_CFG_BOOL, NULL, 0, -1, "durable = fsynced (WAITAOF) before the reply",
         &o.strict, false},
        {"raw", ANV_CFG_BOOL, NULL, 0, -1, "send prompts as they are, without the chat "
                                           "template", &o.raw, false},
        {"max-attempts", ANV_CFG_INT, "0", 0, 100, "attempts per unit (0 = the broker's)",
         &o.max_attempts, false},
        {"chunk", ANV_CFG_INT, "1000", 1, 100000, "prompts per SUBMIT message", &o.chunk,
         false},
        {"score-only", ANV_CFG_BOOL, NULL, 0, -1,
         "re-score existing completions (each line: 'completion' or 'completions' and a "
         "'task'); nothing is generated", &o.score_only, false},
    };
    size_t n = 17;
    cli_common_opts(&c, opts, &n);
    anv_cfg_rest_t rest;
    int code;
    cli_jsonl_t *r = NULL;
    s_submit_t s = {0};
    cli_load(&info, opts, n, argc, argv, &rest, &c, &code);
    if (code >= 0)
        goto out;
    if (rest.argc != 1) {
        cli_errorf(info.name, "needs exactly one FILE (see anvil submit --help)");
        code = CLI_EXIT_USAGE;
        goto out;
    }
    const char *file = rest.argv[0];
    char err[512];
    if (cli_opt_given(argc, argv, "top-p") && o.top_p <= 0) {
        cli_errorf(info.name, "--top-p must be in (0, 1]");
        code = CLI_EXIT_USAGE;
        goto out;
    }
    if (!(r = cli_jsonl_open(file, err, sizeof err))) {
        cli_errorf(info.name, "%s", err);
        code = CLI_EXIT_INPUT;
        goto out;
    }
    s_scan_t scan;
    if ((code = s_validate(file, r, &o, &scan)))
        goto out;
    cli_fmt_t fmt = cli_jsonl_format(r);
    if (cli_jsonl_rewind(r)) {
        cli_errorf(info.name, "%s", cli_jsonl_errstr(r));
        code = CLI_EXIT_INPUT;
        goto out;
    }
    if (!(s.client = cli_client_open(&c, err, sizeof err))) {
        cli_errorf(info.name, "%s", err);
        code = CLI_EXIT_USAGE;
        goto out;
    }
    char key[ANV_ID_SIZE + 8];
    if (o.name && *o.name)
        snprintf(key, sizeof key, "%s", o.name);
    else
        anv_id_new(key);
    Anvil__JobSpec spec;
    Anvil__SamplingParams sp;
    s_spec(&o, argc, argv, scan.any_ref, key, &spec, &sp);
    s.c = &c;
    s.spec = &spec;
    int rc = s_send_all(&s, r, &o, scan.valid);
    if (rc) {
        if (s.job_id[0])
            fprintf(stderr, "anvil submit: job %s has %llu of %llu prompts; run the same "
                            "command%s again to resume it\n",
                    s.job_id, (unsigned long long)(s.accepted + s.skipped),
                    (unsigned long long)scan.valid,
                    o.name && *o.name ? "" : " with --name NAME (and that name from now on)");
        code = rc == ANV_ECANCELLED ? CLI_EXIT_INTERRUPTED
               : rc == ANV_ESTATE   ? CLI_EXIT_INPUT
                                    : cli_exit_for(rc);
        goto out;
    }
    if (!s.durable) {
        cli_errorf(info.name, "the broker did not confirm that job %s is durable", s.job_id);
        code = CLI_EXIT_REFUSED;
        goto out;
    }
    if (c.json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "job_id", s.job_id);
        cJSON_AddStringToObject(j, "format", fmt == CLI_FMT_OPENAI ? "openai" : "anvil");
        cJSON_AddNumberToObject(j, "tasks", (double)scan.valid);
        cJSON_AddNumberToObject(j, "samples", (double)scan.samples);
        cJSON_AddNumberToObject(j, "accepted", (double)s.accepted);
        cJSON_AddNumberToObject(j, "skipped", (double)s.skipped);
        cJSON_AddNumberToObject(j, "invalid", (double)scan.invalid);
        cJSON_AddBoolToObject(j, "existing", s.existing);
        cJSON_AddBoolToObject(j, "durable", true);
        cli_json_print(j, stdout);
    } else {
        printf("%s\n", s.job_id);
        fprintf(stderr, "anvil submit: job %s: %llu prompt(s) queued, %llu already there, "
                        "%llu sample(s) in all (%s format%s)\n",
                s.job_id, (unsigned long long)s.accepted, (unsigned long long)s.skipped,
                (unsigned long long)scan.samples, cli_jsonl_format_name(fmt),
                scan.invalid ? ", malformed lines left out" : "");
    }
    fflush(stdout);
    code = o.wait ? cli_watch_job(info.name, &c, s.job_id, o.interval) : CLI_EXIT_OK;
out:
    cli_client_destroy(&s.client);
    cli_jsonl_destroy(&r);
    anv_config_free(opts, n, &rest);
    return code;
}

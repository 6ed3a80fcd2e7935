/*  cli_demo.c - `anvil demo`: the whole path on one machine, with a summary at the end.

    up -> import a handful of KernelBench level-1 problems -> submit with several samples each
    -> watch -> results -> a summary table. Each step runs this same binary as a child process
    (the real commands, not a shortcut), so the demo shows exactly what a user would type, and
    the summary is computed from the results file the `results` step wrote. Nothing is made
    up: when something is missing (a binary, the model or the random-model tool, the dataset)
    the step that needs it fails, says what is missing, and the demo stops with its exit code.
*/
#include "anv_id.h"
#include "cli_cmd.h"
#include "cli_import.h"
#include "cli_proc.h"
#include "cli_util.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define S_MAX_ARGS 40

typedef struct {
    char *argv[S_MAX_ARGS];
    int n;
} s_args_t;

static void s_arg(s_args_t *a, const char *s)
{
    if (a->n < S_MAX_ARGS - 1)
        a->argv[a->n++] = (char *)s;
    a->argv[a->n] = NULL;
}

static void s_arg_opt(s_args_t *a, const char *flag, const char *v)
{
    if (v && *v) {
        s_arg(a, flag);
        s_arg(a, v);
    }
}

/* The KernelBench folder: --dataset, else the usual places. */
static bool s_dataset(const char *given, char *out, size_t len)
{
    if (given && *given) {
        snprintf(out, len, "%s", given);
        return access(out, R_OK) == 0;
    }
    const char *shared = getenv("ANVIL_SHARED_DIR");
    char self[PATH_MAX];
    snprintf(self, sizeof self, "%s", cli_proc_self());
    char *slash = strrchr(self, '/');
    if (slash)
        *slash = 0;
    char cands[4][2048];
    int n = 0;
    if (shared && *shared)
        snprintf(cands[n++], sizeof cands[0], "%s/datasets/kernelbench", shared);
#ifdef ANVIL_SOURCE_DIR
    snprintf(cands[n++], sizeof cands[0], "%s/../shared/datasets/kernelbench", ANVIL_SOURCE_DIR);
#endif
    snprintf(cands[n++], sizeof cands[0], "%.1900s/../share/anvil/datasets/kernelbench", self);
    for (int i = 0; i < n; i++) {
        char lvl[2100];
        snprintf(lvl, sizeof lvl, "%.2047s/level1", cands[i]);
        if (access(lvl, R_OK) == 0) {
            snprintf(out, len, "%.2047s", cands[i]);
            return true;
        }
    }
    return false;
}

typedef struct {
    char id[200];
    int samples, correct, scored;
    double best;
} s_problem_t;

/* The summary, from the results file. */
static int s_summary(const char *path, const char *errors_path)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        cli_errorf("demo", "cannot open '%s': %s", path, strerror(errno));
        return CLI_EXIT_FAILED;
    }
    static const char *const statuses[] = {"correct",       "incorrect",     "format_error",
                                           "rejected_static", "compile_error", "runtime_error",
                                           "timeout",       "crashed",       NULL};
    int counts[16] = {0}, unscored = 0, total = 0, correct = 0, n_speed = 0;
    double sum_speed = 0, max_speed = 0;
    s_problem_t probs[64];
    int n_probs = 0;
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) > 0) {
        cJSON *o = cJSON_Parse(line);
        if (!o)
            continue;
        total++;
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(o, "custom_id");
        const cJSON *score = cJSON_GetObjectItemCaseSensitive(o, "score");
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(score, "status");
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(score, "speedup");
        s_problem_t *p = NULL;
        for (int i = 0; cJSON_IsString(id) && i < n_probs && !p; i++)
            if (!strcmp(probs[i].id, id->valuestring))
                p = &probs[i];
        if (!p && cJSON_IsString(id) && n_probs < 64) {
            p = &probs[n_probs++];
            memset(p, 0, sizeof *p);
            snprintf(p->id, sizeof p->id, "%s", id->valuestring);
        }
        if (p)
            p->samples++;
        if (!cJSON_IsString(st)) {
            unscored++;
        } else {
            int k = 0;
            while (statuses[k] && strcmp(statuses[k], st->valuestring))
                k++;
            counts[k]++;
            if (p)
                p->scored++;
            if (k == 0) {
                correct++;
                if (p)
                    p->correct++;
                if (cJSON_IsNumber(sp) && isfinite(sp->valuedouble)) {
                    sum_speed += sp->valuedouble;
                    n_speed++;
                    if (sp->valuedouble > max_speed)
                        max_speed = sp->valuedouble;
                    if (p && sp->valuedouble > p->best)
                        p->best = sp->valuedouble;
                }
            }
        }
        cJSON_Delete(o);
    }
    free(line);
    fclose(f);
    int errors = 0;
    if ((f = fopen(errors_path, "r"))) {
        int c;
        while ((c = fgetc(f)) != EOF)
            errors += c == '\n';
        fclose(f);
    }
    int scored = total - unscored;
    printf("\n%-48s %7s %7s %8s\n", "PROBLEM", "SAMPLES", "CORRECT", "BEST");
    for (int i = 0; i < n_probs; i++) {
        char best[32] = "-";
        if (probs[i].correct)
            snprintf(best, sizeof best, "%.2fx", probs[i].best);
        printf("%-48.48s %7d %7d %8s\n", probs[i].id, probs[i].samples, probs[i].correct, best);
    }
    printf("\nsamples %d (scored %d, not scored %d, failed to generate %d)\n", total, scored,
           unscored, errors);
    for (int k = 0; statuses[k]; k++)
        if (counts[k])
            printf("  %-16s %d\n", statuses[k], counts[k]);
    if (scored)
        printf("pass rate %.1f%% (%d of %d scored)\n", 100.0 * correct / scored, correct, scored);
    if (n_speed)
        printf("speedup of correct samples: mean %.2fx, best %.2fx\n", sum_speed / n_speed,
               max_speed);
    printf("results: %s\n", path);
    return CLI_EXIT_OK;
}

int cli_cmd_demo(int argc, char **argv)
{
    static const cli_cmd_info_t info = {
        "demo", "[--data DIR] [--gpus LIST|none] [--model DIR] [options]",
        "Runs the whole path on this machine: `anvil up`, imports a handful of KernelBench "
        "level-1 problems, submits them with several samples each, watches the job, fetches "
        "the results and prints a summary (status counts, pass rate, speedups). Without "
        "--model the gen worker runs a small random model (made by the engine's tool), which "
        "writes nonsense: the demo then shows the machinery, not a model's skill. The cluster "
        "stays up afterwards (anvil down stops it) unless --down."};
    cli_common_t c = {0};
    char *gpus = NULL, *model = NULL, *dataset = NULL, *bb = NULL, *gb = NULL, *eb = NULL,
         *mm = NULL, *cep = NULL, *wep = NULL;
    int64_t problems = 5, samples = 4, max_tokens = 512;
    bool down = false, started = false, curve = false;
    anv_cfg_opt_t opts[CLI_MAX_OPTS] = {
        {"gpus", ANV_CFG_STR, NULL, 0, -1, "as anvil up --gpus", &gpus, false},
        {"model", ANV_CFG_STR, NULL, 0, -1, "as anvil up --model", &model, false},
        {"problems", ANV_CFG_INT, "5", 1, 100, "KernelBench level-1 problems to submit",
         &problems, false},
        {"samples", ANV_CFG_INT, "4", 1, 64, "samples per problem", &samples, false},
        {"max-tokens", ANV_CFG_INT, "512", 1, 1 << 20, "tokens per sample at most", &max_tokens,
         false},
        {"dataset", ANV_CFG_STR, NULL, 0, -1, "KernelBench folder (default: the shared datasets)",
         &dataset, false},
        {"down", ANV_CFG_BOOL, NULL, 0, -1, "stop the cluster at the end", &down, false},
        {"broker-bin", ANV_CFG_STR, NULL, 0, -1, "as anvil up", &bb, false},
        {"gen-worker-bin", ANV_CFG_STR, NULL, 0, -1, "as anvil up", &gb, false},
        {"exec-worker-bin", ANV_CFG_STR, NULL, 0, -1, "as anvil up", &eb, false},
        {"make-model", ANV_CFG_STR, NULL, 0, -1, "as anvil up", &mm, false},
        {"client-endpoint", ANV_CFG_STR, NULL, 0, -1, "as anvil up", &cep, false},
        {"worker-endpoint", ANV_CFG_STR, NULL, 0, -1, "as anvil up", &wep, false},
        {"curve", ANV_CFG_BOOL, NULL, 0, -1,
         "as anvil up --curve: CURVE keys on every socket (the demo's own commands use them)",
         &curve, false},
    };
    size_t n = 14;
    cli_common_opts(&c, opts, &n);
    anv_cfg_rest_t rest;
    int code;
    char *out = NULL;
    cJSON *sub = NULL;
    cli_load(&info, opts, n, argc, argv, &rest, &c, &code);
    if (code >= 0)
        goto out;
    const char *self = cli_proc_self();
    char kb[PATH_MAX];
    if (!s_dataset(dataset, kb, sizeof kb)) {
        cli_errorf(info.name, "KernelBench is not where the demo looks (set --dataset DIR or "
                              "ANVIL_SHARED_DIR); nothing was started");
        code = CLI_EXIT_INPUT;
        goto out;
    }
    /* 1. up */
    printf("== anvil up\n");
    s_args_t a = {0};
    s_arg(&a, self);
    s_arg(&a, "up");
    s_arg_opt(&a, "--data", c.data);
    s_arg_opt(&a, "--gpus", gpus);
    s_arg_opt(&a, "--model", model);
    s_arg_opt(&a, "--broker-bin", bb);
    s_arg_opt(&a, "--gen-worker-bin", gb);
    s_arg_opt(&a, "--exec-worker-bin", eb);
    s_arg_opt(&a, "--make-model", mm);
    s_arg_opt(&a, "--client-endpoint", cep);
    s_arg_opt(&a, "--worker-endpoint", wep);
    if (curve)
        s_arg(&a, "--curve");
    if ((code = cli_proc_run(a.argv, NULL)) != 0) {
        cli_errorf(info.name, "the local cluster did not start (see above): nothing was run");
        goto out;
    }
    started = true;
    /* 2. import */
    char dir[PATH_MAX], prompts[PATH_MAX + 64], results[PATH_MAX + 128], errors[PATH_MAX + 160];
    snprintf(dir, sizeof dir, "%s/demo", c.data);
    cli_mkdir_p(dir);
    snprintf(prompts, sizeof prompts, "%s/kernelbench-level1.jsonl", dir);
    char nprob[16], nsamp[16], ntok[16], key[ANV_ID_SIZE + 8];
    snprintf(nprob, sizeof nprob, "%lld", (long long)problems);
    printf("== anvil import kernelbench %s --level 1 --limit %s --out %s\n", kb, nprob, prompts);
    a.n = 0;
    s_arg(&a, self);
    s_arg(&a, "import");
    s_arg(&a, "kernelbench");
    s_arg(&a, kb);
    s_arg(&a, "--level");
    s_arg(&a, "1");
    s_arg(&a, "--limit");
    s_arg(&a, nprob);
    s_arg(&a, "--out");
    s_arg(&a, prompts);
    if ((code = cli_proc_run(a.argv, NULL)) != 0)
        goto out;
    /* 3. submit */
    snprintf(nsamp, sizeof nsamp, "%lld", (long long)samples);
    snprintf(ntok, sizeof ntok, "%lld", (long long)max_tokens);
    char name[64];
    snprintf(name, sizeof name, "demo-%s", anv_id_new(key));
    printf("== anvil submit %s --samples %s --max-tokens %s --name %s\n", prompts, nsamp, ntok,
           name);
    a.n = 0;
    s_arg(&a, self);
    s_arg(&a, "submit");
    s_arg(&a, prompts);
    s_arg(&a, "--samples");
    s_arg(&a, nsamp);
    s_arg(&a, "--max-tokens");
    s_arg(&a, ntok);
    s_arg(&a, "--name");
    s_arg(&a, name);
    s_arg(&a, "--data");
    s_arg(&a, c.data);
    s_arg(&a, "--json");
    if ((code = cli_proc_run(a.argv, &out)) != 0)
        goto out;
    sub = out ? cJSON_Parse(out) : NULL;
    const cJSON *job = cJSON_GetObjectItemCaseSensitive(sub, "job_id");
    if (!cJSON_IsString(job)) {
        cli_errorf(info.name, "submit printed no job id");
        code = CLI_EXIT_FAILED;
        goto out;
    }
    printf("job %s\n", job->valuestring);
    /* 4. watch */
    printf("== anvil watch %s\n", job->valuestring);
    a.n = 0;
    s_arg(&a, self);
    s_arg(&a, "watch");
    s_arg(&a, job->valuestring);
    s_arg(&a, "--data");
    s_arg(&a, c.data);
    int watched = cli_proc_run(a.argv, NULL);
    if (watched != CLI_EXIT_OK && watched != CLI_EXIT_FAILED) {
        code = watched;
        goto out;
    }
    /* 5. results */
    snprintf(results, sizeof results, "%s/results-%s.jsonl", dir, job->valuestring);
    snprintf(errors, sizeof errors, "%s/results-%s.errors.jsonl", dir, job->valuestring);
    printf("== anvil results %s --out %s\n", job->valuestring, results);
    a.n = 0;
    s_arg(&a, self);
    s_arg(&a, "results");
    s_arg(&a, job->valuestring);
    s_arg(&a, "--out");
    s_arg(&a, results);
    s_arg(&a, "--data");
    s_arg(&a, c.data);
    if ((code = cli_proc_run(a.argv, NULL)) != 0)
        goto out;
    /* 6. summary */
    code = s_summary(results, errors);
    if (!model || !*model)
        printf("(a small random model wrote these samples: they show the machinery, not a "
               "model's skill; --model DIR runs a real checkpoint)\n");
    if (code == CLI_EXIT_OK && watched != CLI_EXIT_OK)
        code = watched;
out:
    if (down && started) {
        s_args_t d = {0};
        s_arg(&d, self);
        s_arg(&d, "down");
        s_arg(&d, "--data");
        s_arg(&d, c.data);
        cli_proc_run(d.argv, NULL);
    } else if (started) {
        printf("the cluster is still up: anvil down --data %s stops it\n", c.data);
    }
    cJSON_Delete(sub);
    free(out);
    anv_config_free(opts, n, &rest);
    return code;
}

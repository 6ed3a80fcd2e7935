/*  main.c - anvil-exec-worker: configuration and wiring.

    Modes: `--score-once --kind K --task FILE --candidate FILE [--device cpu|cuda] --json`
    scores one completion and prints one result JSON; `--score-batch FILE.jsonl` scores one
    JSON object per line ({"kind", "task", "candidate", "globals"?, "static_checks"?}, paths
    relative to the file) with one scorer (one sandbox probe, one warm pool) and prints one
    result line each. Exit status: 0 whenever every unit got a verdict, whatever the verdict;
    1 when something could not be scored; 2 on bad configuration. Without either, the worker
    serves the broker (exec_serve.h) with the same scorer until SIGTERM/SIGINT.
*/
#include "anv_config.h"
#include "anv_error.h"
#include "anv_log.h"
#include "exec_batch.h"
#include "exec_reward.h"
#include "exec_sandbox.h"
#include "exec_score.h"
#include "exec_serve.h"

#include <czmq.h>
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef EXEC_DEFAULT_HARNESS
#define EXEC_DEFAULT_HARNESS "/usr/share/anvil/harness"
#endif
#ifndef EXEC_DEFAULT_PYTHON
#define EXEC_DEFAULT_PYTHON "/usr/bin/python3"
#endif

typedef struct {
    bool require_triton;
    bool score_once, json, pretty, log_json, static_checks, flush_l2, interpret;
    char *score_batch, *kind, *task, *candidate, *device, *globals, *log_level;
    char *sandbox_mode, *bwrap, *launcher, *python, *harness_dir, *work_dir, *ro_binds;
    char *reward_formula, *allow_ops, *broker, *worker_id, *ready_file, *curve_secret;
    char *curve_server;
    int64_t gpu, threads, mem_mb, cpu_s, nofile, nproc, fsize_mb, uid_base, pool_size,
        ready_timeout, trials, warmup, min_iters, max_iters, batch, spin_us, check_sample,
        compile_timeout,
        run_timeout;
    double target_rel_err, speedup_cap, atol, rtol, min_gpu_share;
} s_cfg_t;

static s_cfg_t C;
static volatile sig_atomic_t s_stop;

static void s_on_signal(int sig)
{
    (void)sig;
    s_stop = 1;
}

#define S_OPT(n, t, d, lo, hi, h, dst) {n, t, d, lo, hi, h, dst, false}
static const anv_cfg_opt_t s_opts[] = {
    S_OPT("score-once", ANV_CFG_BOOL, "false", 0, -1, "score one candidate and exit", &C.score_once),
    S_OPT("score-batch", ANV_CFG_STR, "", 0, -1, "score every line of a JSONL file", &C.score_batch),
    S_OPT("kind", ANV_CFG_STR, "kernelbench", 0, -1, "kernelbench|tritonbench-g|tritonbench-t", &C.kind),
    S_OPT("task", ANV_CFG_STR, "", 0, -1, "task file (score-once)", &C.task),
    S_OPT("candidate", ANV_CFG_STR, "", 0, -1, "completion file (score-once)", &C.candidate),
    S_OPT("device", ANV_CFG_STR, "cpu", 0, -1, "cpu|cuda", &C.device),
    S_OPT("gpu", ANV_CFG_INT, "0", 0, 64, "GPU index (cuda)", &C.gpu),
    S_OPT("task-globals", ANV_CFG_STR, "", 0, -1, "JSON object overriding task constants", &C.globals),
    S_OPT("json", ANV_CFG_BOOL, "false", 0, -1, "print the result as JSON", &C.json),
    S_OPT("pretty", ANV_CFG_BOOL, "false", 0, -1, "indent the JSON", &C.pretty),
    S_OPT("sandbox-mode", ANV_CFG_STR, "auto", 0, -1, "auto|bwrap|bwrap-user|rlimit", &C.sandbox_mode),
    S_OPT("bwrap", ANV_CFG_STR, "/usr/bin/bwrap", 0, -1, "bubblewrap binary", &C.bwrap),
    S_OPT("launcher", ANV_CFG_STR, "", 0, -1, "anvil-exec-launch (default: beside this binary)", &C.launcher),
    S_OPT("python", ANV_CFG_STR, EXEC_DEFAULT_PYTHON, 0, -1, "interpreter with torch and triton", &C.python),
    S_OPT("harness-dir", ANV_CFG_STR, EXEC_DEFAULT_HARNESS, 0, -1, "directory holding anvil_harness", &C.harness_dir),
    S_OPT("work-dir", ANV_CFG_STR, "", 0, -1, "per-sandbox /io directories (default /dev/shm or /tmp)", &C.work_dir),
    S_OPT("ro-binds", ANV_CFG_STR, "", 0, -1, "extra read-only paths in the sandbox, comma-separated", &C.ro_binds),
    S_OPT("triton-interpret", ANV_CFG_BOOL, "true", 0, -1, "TRITON_INTERPRET=1 on cpu", &C.interpret),
    S_OPT("threads", ANV_CFG_INT, "1", 1, 256, "CPU threads inside a sandbox", &C.threads),
    S_OPT("mem-mb", ANV_CFG_INT, "16384", 0, 1 << 24, "address space (cpu) / data (cuda) limit", &C.mem_mb),
    S_OPT("cpu-s", ANV_CFG_INT, "1800", 1, 86400, "CPU seconds per sandboxed process", &C.cpu_s),
    S_OPT("nofile", ANV_CFG_INT, "512", 16, 65536, "open files per process", &C.nofile),
    S_OPT("nproc", ANV_CFG_INT, "256", 8, 65536, "processes and threads per sandbox uid", &C.nproc),
    S_OPT("fsize-mb", ANV_CFG_INT, "16384", 1, 1 << 24, "largest file a sandbox may write", &C.fsize_mb),
    S_OPT("uid-base", ANV_CFG_INT, "61000", 1000, 4000000000.0, "first sandbox uid (root only)", &C.uid_base),
    S_OPT("pool-size", ANV_CFG_INT, "0", 0, 16,
          "warm candidate interpreters (0: 2 with --device cuda, 1 on the cpu)", &C.pool_size),
    S_OPT("ready-timeout", ANV_CFG_INT, "300", 1, 3600, "seconds to wait for a warm interpreter", &C.ready_timeout),
    S_OPT("trials", ANV_CFG_INT, "5", 5, 63, "correctness trials", &C.trials),
    S_OPT("warmup", ANV_CFG_INT, "3", 0, 1000, "warm-up calls before timing", &C.warmup),
    S_OPT("min-iters", ANV_CFG_INT, "10", 1, 1000, "timed iterations at least", &C.min_iters),
    S_OPT("max-iters", ANV_CFG_INT, "200", 1, 1000, "timed iterations at most", &C.max_iters),
    S_OPT("batch", ANV_CFG_INT, "10", 1, 1000, "iterations per interleaved batch", &C.batch),
    S_OPT("target-rel-err", ANV_CFG_DOUBLE, "0.01", 0, 1, "stop when both means are this precise", &C.target_rel_err),
    S_OPT("flush-l2", ANV_CFG_BOOL, "true", 0, -1, "flush L2 before each timed call", &C.flush_l2),
    S_OPT("spin-us", ANV_CFG_INT, "300", 0, 100000, "GPU spin before each timed call's start event, hiding launch latency (cuda; 0 off)", &C.spin_us),
    S_OPT("check-sample", ANV_CFG_INT, "65536", 0, 1073741824, "elements of each output leaf a timing round compares, chosen after the calls (0: whole outputs)", &C.check_sample),
    S_OPT("reward-formula", ANV_CFG_STR, EXEC_REWARD_DEFAULT, 0, -1, "reward expression", &C.reward_formula),
    S_OPT("speedup-cap", ANV_CFG_DOUBLE, "3", 0, 1e6, "cap in the reward formula", &C.speedup_cap),
    S_OPT("compile-timeout", ANV_CFG_INT, "120", 1, 86400, "seconds for load and first call", &C.compile_timeout),
    S_OPT("run-timeout", ANV_CFG_INT, "180", 1, 86400, "seconds for trials and timing", &C.run_timeout),
    S_OPT("atol", ANV_CFG_DOUBLE, "-1", -1, 1e9, "absolute tolerance (-1: per dtype)", &C.atol),
    S_OPT("rtol", ANV_CFG_DOUBLE, "-1", -1, 1e9, "relative tolerance (-1: per dtype)", &C.rtol),
    S_OPT("static-checks", ANV_CFG_BOOL, "true", 0, -1, "reject on static violations", &C.static_checks),
    S_OPT("allow-ops", ANV_CFG_STR, "", 0, -1, "extra torch ops on the forward path (* = any)", &C.allow_ops),
    S_OPT("min-gpu-share", ANV_CFG_DOUBLE, "0.5", 0, 1, "flag below this share (cuda)", &C.min_gpu_share),
    S_OPT("require-triton", ANV_CFG_BOOL, "true", 0, -1, "a correct candidate must launch its own Triton kernels (off only to calibrate)", &C.require_triton),
    S_OPT("broker", ANV_CFG_STR, "tcp://127.0.0.1:5556", 0, -1, "broker worker endpoint (serving mode)", &C.broker),
    S_OPT("worker-id", ANV_CFG_STR, "", 0, -1, "stable worker id (default host-exec-pid)", &C.worker_id),
    S_OPT("ready-file", ANV_CFG_STR, "", 0, -1, "file written once registered with the broker", &C.ready_file),
    S_OPT("curve-secret", ANV_CFG_STR, "", 0, -1, "own zcert secret key file (CURVE, serving mode)", &C.curve_secret),
    S_OPT("curve-server", ANV_CFG_STR, "", 0, -1, "the broker's public key file (CURVE, serving mode)", &C.curve_server),
    S_OPT("log-level", ANV_CFG_STR, "info", 0, -1, "error|warn|info|debug|trace", &C.log_level),
    S_OPT("log-json", ANV_CFG_BOOL, "false", 0, -1, "JSON log lines", &C.log_json),
};
#define S_NOPTS (sizeof s_opts / sizeof s_opts[0])

static char *s_read_file(const char *path, size_t max)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        ANV_ERROR("cannot open '%s': %s", path, strerror(errno));
        return NULL;
    }
    char *buf = malloc(max + 1);
    size_t n = buf ? fread(buf, 1, max + 1, f) : 0;
    fclose(f);
    if (!buf)
        return NULL;
    if (n > max) {
        ANV_ERROR("'%s' is larger than %zu bytes", path, max);
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    return buf;
}

static void s_spec(exec_spec_t *s)
{
    exec_spec_default(s);
    s->trials = (int)C.trials;
    s->warmup = (int)C.warmup;
    s->min_iters = (int)C.min_iters;
    s->max_iters = (int)C.max_iters;
    s->batch = (int)C.batch;
    s->target_rel_err = C.target_rel_err;
    s->flush_l2 = C.flush_l2;
    s->spin_us = (int)C.spin_us;
    s->check_sample = (int)C.check_sample;
    s->reward_formula = C.reward_formula;
    s->speedup_cap = C.speedup_cap;
    s->compile_timeout_s = (int)C.compile_timeout;
    s->run_timeout_s = (int)C.run_timeout;
    s->atol = C.atol;
    s->rtol = C.rtol;
    s->static_checks = C.static_checks;
    s->allow_ops = C.allow_ops;
    s->min_gpu_share = C.min_gpu_share;
    s->require_launches = C.require_triton;
}

static int s_print(const exec_result_t *r)
{
    if (C.json || C.score_batch[0]) {
        char *j = exec_result_to_json(r, C.pretty);
        if (!j)
            return -ENOMEM;
        printf("%s\n", j);
        free(j);
    } else {
        printf("%s reward=%.4f speedup=%.4f %s\n", exec_status_name(r->status), r->reward,
               r->speedup, r->error);
    }
    fflush(stdout);
    return 0;
}

static int s_one(exec_scorer_t *sc, const char *kind, const char *task_path,
                 const char *cand_path, const char *globals, const exec_spec_t *spec)
{
    char *task = s_read_file(task_path, 4u << 20), *cand = s_read_file(cand_path, 4u << 20);
    int rc = ANV_EFORMAT;
    if (task && cand) {
        exec_task_t t = {.kind = kind, .name = task_path, .source = task, .globals = globals};
        exec_result_t r;
        rc = exec_scorer_score(sc, &t, cand, spec, &r);
        s_print(&r);
        exec_result_release(&r);
    }
    free(task);
    free(cand);
    return rc;
}

static int s_batch(exec_scorer_t *sc, const exec_spec_t *base)
{
    FILE *f = fopen(C.score_batch, "r");
    if (!f) {
        ANV_ERROR("cannot open '%s': %s", C.score_batch, strerror(errno));
        return 1;
    }
    char dirbuf[PATH_MAX], err[256];
    snprintf(dirbuf, sizeof dirbuf, "%s", C.score_batch);
    const char *dir = dirname(dirbuf);
    int failures = 0, lineno = 0;
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    /* getline: a line of any length is one line (fgets into a fixed buffer split long ones) */
    while ((n = getline(&line, &cap, f)) >= 0) {
        lineno++;
        exec_batch_item_t it;
        int rc = exec_batch_parse(line, (size_t)n, dir, &it, err, sizeof err);
        if (rc == 0)
            continue;
        if (rc < 0) {
            ANV_ERROR("'%s' line %d: %s", C.score_batch, lineno,
                      rc == ANV_EFORMAT ? err : anv_strerror(rc));
            failures++;
            continue;
        }
        exec_spec_t spec = *base;
        if (it.static_checks >= 0)
            spec.static_checks = it.static_checks;
        if (s_one(sc, it.kind ? it.kind : C.kind, it.task_path, it.cand_path,
                  it.globals ? it.globals : C.globals, &spec) != 0)
            failures++;
        exec_batch_item_release(&it);
    }
    free(line);
    fclose(f);
    return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    char err[256], exe[PATH_MAX], launcher[PATH_MAX];
    anv_log_init("exec-worker");
    signal(SIGPIPE, SIG_IGN);
    anv_cfg_rest_t rest;
    if (anv_config_load(s_opts, S_NOPTS, argc, argv, &rest, err, sizeof err) != 0) {
        fprintf(stderr, "anvil-exec-worker: %s\n", err);
        anv_config_free(s_opts, S_NOPTS, &rest);
        return 2;
    }
    int rc = 2;
    if (rest.help) {
        printf("usage: anvil-exec-worker [--broker ENDPOINT] [--device cpu|cuda] (serve the broker)\n"
               "       anvil-exec-worker --score-once --kind K --task FILE --candidate FILE "
               "[--device cpu|cuda] [--json]\n       anvil-exec-worker --score-batch FILE.jsonl\n");
        anv_config_usage(s_opts, S_NOPTS, stdout);
        rc = 0;
        goto out;
    }
    int lvl = anv_log_level_parse(C.log_level);
    if (lvl < 0) {
        fprintf(stderr, "anvil-exec-worker: unknown log level '%s'\n", C.log_level);
        goto out;
    }
    anv_log_set_level((anv_log_level_t)lvl);
    anv_log_set_json(C.log_json);
    if (strcmp(C.device, "cpu") != 0 && strcmp(C.device, "cuda") != 0) {
        fprintf(stderr, "anvil-exec-worker: --device must be cpu or cuda\n");
        goto out;
    }
    if (C.score_once && (!C.task[0] || !C.candidate[0])) {
        fprintf(stderr, "anvil-exec-worker: --score-once needs --task and --candidate\n");
        goto out;
    }
    exec_reward_vars_t probe = {1, 1, 3, 1, 1, 1, 1, 0, 0};
    double v;
    if (exec_reward_eval(C.reward_formula, &probe, &v, err, sizeof err) != 0) {
        fprintf(stderr, "anvil-exec-worker: %s\n", err);
        goto out;
    }
    anv_config_log(s_opts, S_NOPTS);
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = '\0';
    snprintf(launcher, sizeof launcher, "%s/anvil-exec-launch", dirname(exe));
    char work[PATH_MAX];
    int work_lock = -1;
    if (C.work_dir[0]) {
        snprintf(work, sizeof work, "%s", C.work_dir);
        if (mkdir(work, 0711) != 0 && errno != EEXIST) {
            fprintf(stderr, "anvil-exec-worker: cannot create '%s': %s\n", work, strerror(errno));
            goto out;
        }
        chmod(work, 0711);
    } else {
        work_lock = exec_sandbox_work_dir(access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp",
                                          work, sizeof work);
        if (work_lock < 0) {
            fprintf(stderr, "anvil-exec-worker: cannot make a work directory (see the log)\n");
            goto out;
        }
    }
    exec_scorer_cfg_t sc_cfg = {
        .sandbox = {.mode = C.sandbox_mode, .bwrap = C.bwrap,
                    .launcher = C.launcher[0] ? C.launcher : launcher, .python = C.python,
                    .harness_dir = C.harness_dir, .work_dir = work, .ro_binds = C.ro_binds,
                    .device = C.device, .gpu_index = (int)C.gpu,
                    .triton_interpret = C.interpret && strcmp(C.device, "cpu") == 0,
                    .threads = (int)C.threads, .mem_mb = C.mem_mb, .cpu_s = C.cpu_s,
                    .nofile = C.nofile, .nproc = C.nproc, .fsize_mb = C.fsize_mb,
                    .uid_base = C.uid_base},
        /* on the H200 an evaluation (~4 s) is shorter than an interpreter's import (~5 s):
           with one warm interpreter every candidate would wait for the next */
        .pool_size = C.pool_size ? (int)C.pool_size : strcmp(C.device, "cuda") == 0 ? 2 : 1,
        .ready_timeout_s = (int)C.ready_timeout,
    };
    exec_scorer_t *sc = exec_scorer_new(&sc_cfg);
    if (!sc) {
        fprintf(stderr, "anvil-exec-worker: cannot start the scorer (see the log)\n");
        rc = 1;
    } else {
        exec_spec_t spec;
        s_spec(&spec);
        if (C.score_batch[0]) {
            rc = s_batch(sc, &spec);
        } else if (C.score_once) {
            rc = s_one(sc, C.kind, C.task, C.candidate, C.globals, &spec) != 0;
        } else {
            /* CZMQ would install its own SIGTERM handler when the first socket is made;
               the drain is ours */
            zsys_handler_set(NULL);
            struct sigaction sa = {0};
            sa.sa_handler = s_on_signal;
            sigaction(SIGTERM, &sa, NULL);
            sigaction(SIGINT, &sa, NULL);
            bool cuda = strcmp(C.device, "cuda") == 0;
            exec_serve_cfg_t scfg = {.broker = C.broker, .worker_id = C.worker_id,
                                     .gpu_index = cuda ? (int)C.gpu : -1, .device = C.device,
                                     .ready_file = C.ready_file,
                                     .curve_secret = C.curve_secret,
                                     .curve_server = C.curve_server};
            rc = exec_serve_run(sc, &scfg, &spec, &s_stop) != 0;
        }
        exec_scorer_destroy(&sc);
    }
    if (work_lock >= 0) {
        exec_proc_rm_tree(work);
        close(work_lock);
    }
out:
    anv_config_free(s_opts, S_NOPTS, &rest);
    return rc;
}

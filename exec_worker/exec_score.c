/*  exec_score.c - one evaluation, phase by phase (see exec_score.h).

    Design: every exchange with the candidate's process goes through s_cand_call(), which
    turns a timeout, a death or a harness-side exception into the candidate's status; every
    exchange with the reference's goes through s_ref_check(), and its failure means the task
    cannot be scored: that, no warm interpreter and an unreadable reference output are the only
    errors returned to the caller. The two processes work at once in one place only, by the
    order of the commands (the worker is single-threaded): the reference's trials are sent
    before the candidate's load, and their reply is collected after the candidate's first
    trial by s_ref_trials_collect(), which every way out of s_score() after the send also
    passes through, so that the reference is idle (or killed) when an evaluation ends. The
    candidate's trials are sent at once, one command each, and compared one by one as their
    replies come (the candidate runs trial i + 1 while the worker compares trial i); the first
    mismatch ends the evaluation, and the candidate is killed with the trials still queued. A reference
    failure found there replaces the candidate's verdict, whatever it was. Secrets (seeds)
    come from getrandom() per evaluation and are never reused. The candidate's process is
    killed at the end of every evaluation whatever happened. A timing round is one `time`
    command per side (the worker's clock around each is the external check on the time the
    side reports), then one `dump` per side, which writes the output that side kept from a
    secretly chosen iteration, outside that clock; then the worker compares the two files. A
    round times --batch calls per side until a round's check (dumps and compare) costs more
    than its calls, as with large outputs; later rounds then time more calls, keeping at least
    S_MIN_CHECKS rounds over --max-iters (timing.rounds in the result says how many ran). A
    round's compared output is, for each leaf larger than --check-sample elements, that many
    elements at indices the worker draws after the calls (the same on both sides) plus the
    leaf's shape: a 256 MiB output is checked through a 256 KiB file, and a call that skipped
    or faked its work differs in nearly every sampled element. The trials and the check after
    timing still compare whole outputs. Timing starts only once both sides are idle, and the
    pool's interpreters still importing are stopped while it runs (exec_pool_pause).
*/
#define _GNU_SOURCE
#include "exec_score.h"

#include "anv_error.h"
#include "anv_log.h"
#include "anv_time.h"
#include "exec_compare.h"
#include "exec_extract.h"
#include "exec_pool.h"
#include "exec_reward.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#define S_MAX_TRIALS 64
#define S_MAX_ITERS 1000
#define S_MIN_CHECKS 8 /* compared timing rounds kept when max_iters allows (see s_timing) */

struct exec_scorer_t {
    exec_scorer_cfg_t cfg;
    exec_sandbox_t *sandbox;
    exec_pool_t *pool;
    exec_proc_t *ref;
    cJSON *ref_ready;
    uint64_t evals;
};

void exec_spec_default(exec_spec_t *s)
{
    memset(s, 0, sizeof *s);
    s->trials = 5;
    s->warmup = 3;
    s->min_iters = 10;
    s->max_iters = 200;
    s->batch = 10;
    s->target_rel_err = 0.01;
    s->flush_l2 = true;
    /* on the H200 a fused Triton GELU (0.134 ms a call) spread 4.5 % over 5 scorings with a
       100 us spin, its host launch p90 0.11-0.14 ms; with 300 us, 0.28 % (launch p90 <= 0.17) */
    s->spin_us = 300;
    s->check_sample = 65536;
    s->reward_formula = EXEC_REWARD_DEFAULT;
    s->speedup_cap = 3.0;
    s->compile_timeout_s = 120;
    s->run_timeout_s = 180;
    s->atol = s->rtol = -1;
    s->static_checks = true;
    s->allow_ops = "";
    s->min_gpu_share = 0.5;
    s->require_launches = true;
}

const char *exec_task_kind_name(Anvil__TaskKind kind)
{
    switch (kind) {
    case ANVIL__TASK_KIND__TASK_KIND_KERNELBENCH:
        return "kernelbench";
    case ANVIL__TASK_KIND__TASK_KIND_TRITONBENCH_G:
        return "tritonbench-g";
    case ANVIL__TASK_KIND__TASK_KIND_TRITONBENCH_T:
        return "tritonbench-t";
    default:
        return NULL;
    }
}

void exec_spec_from_proto(exec_spec_t *s, const Anvil__ScoringSpec *pb)
{
    if (!pb)
        return;
    if (pb->has_trials && pb->trials >= 5)
        s->trials = (int)pb->trials;
    if (pb->reward_formula && *pb->reward_formula)
        s->reward_formula = pb->reward_formula;
    if (pb->has_speedup_cap)
        s->speedup_cap = pb->speedup_cap;
    if (pb->has_compile_timeout_s && pb->compile_timeout_s)
        s->compile_timeout_s = (int)pb->compile_timeout_s;
    if (pb->has_run_timeout_s && pb->run_timeout_s)
        s->run_timeout_s = (int)pb->run_timeout_s;
    if (pb->has_atol)
        s->atol = pb->atol;
    if (pb->has_rtol)
        s->rtol = pb->rtol;
    const Anvil__TimingSpec *t = pb->timing;
    if (t) {
        if (t->has_warmup)
            s->warmup = (int)t->warmup;
        if (t->has_min_iters && t->min_iters)
            s->min_iters = (int)t->min_iters;
        if (t->has_max_iters && t->max_iters)
            s->max_iters = (int)t->max_iters;
        if (t->has_target_rel_err && t->target_rel_err > 0)
            s->target_rel_err = t->target_rel_err;
        if (t->has_flush_l2)
            s->flush_l2 = t->flush_l2;
    }
}

/* -- helpers ----------------------------------------------------------------------------- */

static double s_seed(void)
{
    uint64_t v = 0;
    if (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v)
        v = anv_now_ns() * 0x9E3779B97F4A7C15ull;
    return (double)(v & ((1ull << 48) - 1));
}

static cJSON *s_cmd(const char *name)
{
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "cmd", name);
    return c;
}

static double s_num(const cJSON *o, const char *k, double def)
{
    const cJSON *v = cJSON_GetObjectItem(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : def;
}

static const char *s_str(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItem(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static char *s_dup(const char *s)
{
    return s ? strdup(s) : NULL;
}

static void s_path(char *buf, size_t len, exec_proc_t *p, bool inner, const char *name, int i)
{
    snprintf(buf, len, "%s/%s%d.anvt", inner ? exec_proc_inner_io(p) : exec_proc_io_dir(p),
             name, i);
}

typedef enum { S_OK = 0, S_FAILED = 1 } s_outcome_t;

/* Maps the outcome of an exchange with the candidate's process (rc of exec_proc_call or
   exec_proc_recv, and its *reply) to a status. Returns S_OK with *reply, or S_FAILED with out
   filled (and the process killed when it timed out or died). */
static s_outcome_t s_cand_check(exec_proc_t *p, int rc, int timeout_s, const char *budget,
                                exec_result_t *out, cJSON **reply)
{
    if (rc == ANV_ETIMEOUT) {
        exec_proc_kill(p);
        exec_result_set(out, EXEC_ST_TIMEOUT, "exceeded the %s budget of %d s", budget,
                        timeout_s);
        exec_result_set_traceback(out, s_dup(exec_proc_log_tail(p)));
        return S_FAILED;
    }
    if (rc != 0) {
        exec_proc_kill(p);
        exec_result_set(out, EXEC_ST_CRASHED, "the candidate's process died (%s)%s",
                        exec_proc_exit_desc(p), rc == ANV_EPROTO ? " or garbled its replies" : "");
        exec_result_set_traceback(out, s_dup(exec_proc_log_tail(p)));
        return S_FAILED;
    }
    const cJSON *tampered = cJSON_GetObjectItem(*reply, "tampered");
    if (cJSON_IsArray(tampered) && cJSON_GetArraySize(tampered) > 0) {
        const cJSON *first = cJSON_GetArrayItem(tampered, 0);
        exec_result_set(out, EXEC_ST_INCORRECT,
                        "the candidate rebound '%s' (timers, synchronize and the launcher "
                        "must stay untouched)",
                        cJSON_IsString(first) ? first->valuestring : "?");
        exec_result_flag(out, "tampered");
        cJSON_Delete(*reply);
        *reply = NULL;
        return S_FAILED;
    }
    if (!cJSON_IsTrue(cJSON_GetObjectItem(*reply, "ok"))) {
        const char *phase = s_str(*reply, "phase");
        bool compile = phase && strcmp(phase, "compile") == 0;
        exec_result_set(out, compile ? EXEC_ST_COMPILE_ERROR : EXEC_ST_RUNTIME_ERROR, "%s",
                        s_str(*reply, "error") ? s_str(*reply, "error") : "unknown error");
        exec_result_set_traceback(out, s_dup(s_str(*reply, "tb")));
        cJSON_Delete(*reply);
        *reply = NULL;
        return S_FAILED;
    }
    return S_OK;
}

/* Sends cmd (taken) to the candidate's process and waits for its reply: s_cand_check. */
static s_outcome_t s_cand_call(exec_proc_t *p, cJSON *cmd, int timeout_s, const char *budget,
                               exec_result_t *out, cJSON **reply)
{
    int rc = exec_proc_call(p, cmd, timeout_s * 1000, reply);
    cJSON_Delete(cmd);
    return s_cand_check(p, rc, timeout_s, budget, out, reply);
}

static int s_ref_ensure(exec_scorer_t *self, exec_result_t *out)
{
    if (self->ref && exec_proc_alive(self->ref)) {
        if (exec_proc_is_ready(self->ref))
            return 0;
        if (exec_proc_wait_ready(self->ref, self->cfg.ready_timeout_s * 1000, &self->ref_ready) ==
            0)
            return 0;
    }
    if (self->ref)
        ANV_WARN("reference interpreter gone (%s): restarting", exec_proc_exit_desc(self->ref));
    exec_proc_destroy(&self->ref);
    cJSON_Delete(self->ref_ready);
    self->ref_ready = NULL;
    self->ref = exec_sandbox_spawn(self->sandbox);
    if (!self->ref ||
        exec_proc_wait_ready(self->ref, self->cfg.ready_timeout_s * 1000, &self->ref_ready)) {
        const char *tail = self->ref ? exec_proc_log_tail(self->ref) : "spawn failed";
        size_t n = strlen(tail);
        exec_result_set(out, EXEC_ST_NONE, "the reference interpreter did not start: %s",
                        tail + (n > 300 ? n - 300 : 0));
        exec_result_set_traceback(out, s_dup(tail));
        exec_proc_destroy(&self->ref);
        return ANV_EINTERNAL;
    }
    return 0;
}

/* The outcome of an exchange with the reference process (rc of exec_proc_call, or of its
   send or recv half, and *reply): any failure means the task cannot be scored. It sets
   EXEC_ST_NONE and returns non-zero; a reference that did not answer is killed (the next
   evaluation starts another). */
static int s_ref_check(exec_scorer_t *self, int rc, exec_result_t *out, cJSON **reply)
{
    if (rc != 0) {
        exec_result_set(out, EXEC_ST_NONE, "reference interpreter failed: %s (%s)",
                        anv_strerror(rc), exec_proc_exit_desc(self->ref));
        exec_result_set_traceback(out, s_dup(exec_proc_log_tail(self->ref)));
        exec_proc_destroy(&self->ref);
        return rc;
    }
    if (!cJSON_IsTrue(cJSON_GetObjectItem(*reply, "ok"))) {
        exec_result_set(out, EXEC_ST_NONE, "the reference failed: %s",
                        s_str(*reply, "error") ? s_str(*reply, "error") : "?");
        exec_result_set_traceback(out, s_dup(s_str(*reply, "tb")));
        cJSON_Delete(*reply);
        *reply = NULL;
        return ANV_EINTERNAL;
    }
    return 0;
}

/* A call to the reference process (cmd taken), checked by s_ref_check. */
static int s_ref_call(exec_scorer_t *self, cJSON *cmd, int timeout_s, exec_result_t *out,
                      cJSON **reply)
{
    int rc = exec_proc_call(self->ref, cmd, timeout_s * 1000, reply);
    cJSON_Delete(cmd);
    return s_ref_check(self, rc, out, reply);
}

static void s_add_task(cJSON *c, const exec_task_t *task, const char *device, double init_seed)
{
    cJSON_AddStringToObject(c, "kind", task->kind);
    cJSON_AddStringToObject(c, "task", task->source);
    cJSON_AddStringToObject(c, "device", device);
    cJSON_AddNumberToObject(c, "init_seed", init_seed);
    cJSON *g = task->globals && *task->globals ? cJSON_Parse(task->globals) : NULL;
    if (g)
        cJSON_AddItemToObject(c, "globals", g);
}

static cJSON *s_trials_cmd(const double *seeds, int n, int first, exec_proc_t *p,
                           const char *prefix, bool train_odd)
{
    cJSON *c = s_cmd("trials"), *s = cJSON_AddArrayToObject(c, "seeds");
    cJSON *m = cJSON_AddArrayToObject(c, "modes"), *d = cJSON_AddArrayToObject(c, "dump");
    for (int i = 0; i < n; i++) {
        char path[4200];
        s_path(path, sizeof path, p, true, prefix, first + i);
        cJSON_AddItemToArray(s, cJSON_CreateNumber(seeds[first + i]));
        cJSON_AddItemToArray(m, cJSON_CreateNumber(train_odd && ((first + i) % 2)));
        cJSON_AddItemToArray(d, cJSON_CreateString(path));
    }
    return c;
}

/* -- correctness ------------------------------------------------------------------------- */

typedef struct {
    bool zero_pass, const_pass, cand_const, ref_const_any_not;
} s_degen_t;

/* Compares trial files first..first+n-1; fills out and returns S_FAILED on a mismatch. */
static s_outcome_t s_compare_trials(exec_proc_t *ref, exec_proc_t *cand, int first, int n,
                                    const exec_tol_t *tol, exec_result_t *out, s_degen_t *dg,
                                    const char *when, int *err)
{
    for (int i = first; i < first + n; i++) {
        char rp[4200], cp[4200];
        exec_cmp_t cmp;
        s_path(rp, sizeof rp, ref, false, "ref", i);
        s_path(cp, sizeof cp, cand, false, "cand", i);
        int rc = exec_compare_files(rp, cp, tol, &cmp);
        if (rc != 0) {
            exec_result_set(out, EXEC_ST_NONE, "%s", cmp.reason);
            *err = rc;
            return S_FAILED;
        }
        if (cmp.compared) {
            out->max_abs_err = isnan(out->max_abs_err) ? cmp.max_abs
                                                       : fmax(out->max_abs_err, cmp.max_abs);
            out->max_rel_err = isnan(out->max_rel_err) ? cmp.max_rel
                                                       : fmax(out->max_rel_err, cmp.max_rel);
        }
        dg->zero_pass = dg->zero_pass && cmp.zero_would_pass;
        dg->const_pass = dg->const_pass && cmp.const_would_pass;
        dg->cand_const = dg->cand_const && cmp.cand_constant;
        dg->ref_const_any_not = dg->ref_const_any_not || !cmp.ref_constant;
        if (!cmp.match) {
            exec_result_set(out, EXEC_ST_INCORRECT, "%s%s (trial %d)", when, cmp.reason, i);
            return S_FAILED;
        }
    }
    return S_OK;
}

/* -- timing ------------------------------------------------------------------------------ */

typedef struct {
    double dev[S_MAX_ITERS], host[S_MAX_ITERS];
    double launch[S_MAX_ITERS]; /* CUDA: host time from the spin's launch to the call's return */
    int n, late_n, n_launch;
    double wall_ms, reported_ms; /* the worker's clock around batches; the side's host sum */
    double late_wall_ms, late_reported_ms; /* the same, rounds after the first (no warm-up) */
    bool has_dev;
} s_series_t;

static void s_stats(const double *v, int n, double *mean, double *rel)
{
    double s = 0, ss = 0;
    for (int i = 0; i < n; i++)
        s += v[i];
    *mean = n ? s / n : NAN;
    for (int i = 0; i < n; i++)
        ss += (v[i] - *mean) * (v[i] - *mean);
    double sd = n > 1 ? sqrt(ss / (n - 1)) : INFINITY;
    *rel = (n > 1 && *mean > 0) ? sd / sqrt(n) / *mean : INFINITY;
}

static int s_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* q[] = the 10th, 50th and 90th percentiles (nearest rank) of v[0..n); NAN when n == 0 */
static void s_quantiles(const double *v, int n, double q[3])
{
    static double tmp[S_MAX_ITERS];
    static const double at[3] = {0.10, 0.50, 0.90};
    if (n <= 0 || n > S_MAX_ITERS) {
        q[0] = q[1] = q[2] = NAN;
        return;
    }
    memcpy(tmp, v, (size_t)n * sizeof *v);
    qsort(tmp, (size_t)n, sizeof *tmp, s_cmp_double);
    for (int i = 0; i < 3; i++) {
        int r = (int)ceil(at[i] * n) - 1;
        q[i] = tmp[r < 0 ? 0 : r];
    }
}

static const double *s_series_times(const s_series_t *s)
{
    return s->has_dev ? s->dev : s->host;
}

/* One batch on one side; the side keeps its output of iteration dump_at for the next dump. */
static cJSON *s_time_cmd(const double *seeds, int k, int warmup, const exec_spec_t *spec,
                         int dump_at)
{
    cJSON *c = s_cmd("time"), *s = cJSON_AddArrayToObject(c, "seeds");
    for (int i = 0; i < k; i++)
        cJSON_AddItemToArray(s, cJSON_CreateNumber(seeds[i]));
    cJSON_AddNumberToObject(c, "warmup", warmup);
    cJSON_AddBoolToObject(c, "flush_l2", spec->flush_l2);
    cJSON_AddNumberToObject(c, "dump_at", dump_at);
    cJSON_AddNumberToObject(c, "spin_us", spec->spin_us > 0 ? spec->spin_us : 0);
    return c;
}

/* sample > 0: each leaf of more elements is written as `sample` of its elements at indices
   drawn from `seed` (the same on both sides), with its shape */
static cJSON *s_dump_cmd(const char *path, int sample, uint64_t seed)
{
    cJSON *c = s_cmd("dump");
    cJSON_AddStringToObject(c, "path", path);
    if (sample > 0) {
        cJSON *o = cJSON_AddObjectToObject(c, "sample");
        cJSON_AddNumberToObject(o, "count", sample);
        cJSON_AddNumberToObject(o, "seed", (double)(seed >> 11)); /* exact in a double */
    }
    return c;
}

/* Whole seconds left before deadline (ms), at least 1. */
static int s_left_s(uint64_t deadline)
{
    uint64_t now = anv_now_ms();
    return now + 1000 < deadline ? (int)((deadline - now) / 1000) : 1;
}

static void s_series_add(s_series_t *s, const cJSON *rep, double wall, int round)
{
    const cJSON *host = cJSON_GetObjectItem(rep, "host_ms"), *dev = cJSON_GetObjectItem(rep, "dev_ms");
    const cJSON *launch = cJSON_GetObjectItem(rep, "launch_ms");
    int n = cJSON_GetArraySize(host);
    double reported = 0;
    s->wall_ms += wall;
    s->has_dev = cJSON_IsArray(dev) && cJSON_GetArraySize(dev) == n;
    const cJSON *l;
    if (!cJSON_IsArray(launch))
        launch = NULL;
    cJSON_ArrayForEach(l, launch)
    {
        if (s->n_launch < S_MAX_ITERS && cJSON_IsNumber(l))
            s->launch[s->n_launch++] = l->valuedouble;
    }
    for (int i = 0; i < n && s->n < S_MAX_ITERS; i++) {
        double h = cJSON_GetArrayItem(host, i)->valuedouble;
        s->host[s->n] = h;
        s->dev[s->n] = s->has_dev ? cJSON_GetArrayItem(dev, i)->valuedouble : h;
        reported += h;
        s->n++;
    }
    s->reported_ms += reported;
    if (round > 0) {
        s->late_wall_ms += wall;
        s->late_reported_ms += reported;
        s->late_n += n;
    }
}

/* The round's two dumps (reference first) into rdump / cdump (paths inside the sandboxes). */
static s_outcome_t s_dumps(exec_scorer_t *self, exec_proc_t *cand, const char *rdump,
                           const char *cdump, int sample, uint64_t deadline, exec_result_t *out,
                           int *err)
{
    cJSON *rep = NULL;
    uint64_t seed = 0;
    if (getrandom(&seed, sizeof seed, 0) != (ssize_t)sizeof seed)
        seed = anv_now_ns(); /* no entropy: still unknown to the candidate before its call */
    int rc = s_ref_call(self, s_dump_cmd(rdump, sample, seed), s_left_s(deadline), out, &rep);
    cJSON_Delete(rep);
    rep = NULL;
    if (rc != 0) {
        *err = rc;
        return S_FAILED;
    }
    if (s_cand_call(cand, s_dump_cmd(cdump, sample, seed), s_left_s(deadline), "run", out,
                    &rep) != S_OK)
        return S_FAILED;
    cJSON_Delete(rep);
    return S_OK;
}

static s_outcome_t s_timing(exec_scorer_t *self, exec_proc_t *cand, const exec_spec_t *spec,
                            const exec_tol_t *tol, exec_result_t *out, uint64_t deadline,
                            int *err)
{
    double dump_ms = 0, cmp_ms = 0; /* parts of the phase, for timing.phases */
    static s_series_t ref_s, cand_s; /* large; the scorer is single-threaded */
    memset(&ref_s, 0, sizeof ref_s);
    memset(&cand_s, 0, sizeof cand_s);
    int batch = spec->batch > 0 ? spec->batch : 10, max_iters = spec->max_iters;
    if (max_iters > S_MAX_ITERS)
        max_iters = S_MAX_ITERS;
    double base = s_seed(), last_round_ms = 0;
    /* calls per round: the configured batch, grown when a round's check costs more than its
       timed calls, never past what leaves S_MIN_CHECKS rounds in max_iters */
    int k_round = batch, issued = 0, cap = max_iters / S_MIN_CHECKS, checked = 0;
    if (cap < batch)
        cap = batch;
    for (int round = 0; cand_s.n < max_iters; round++) {
        double seeds[S_MAX_ITERS];
        int k = k_round < max_iters - cand_s.n ? k_round : max_iters - cand_s.n;
        for (int i = 0; i < k; i++)
            seeds[i] = base + issued + i;
        issued += k;
        unsigned char r = 0;
        getrandom(&r, 1, 0);
        int dump_at = r % k;
        char rdump[4200], cdump[4200], rhost[4200], chost[4200];
        snprintf(rdump, sizeof rdump, "%s/tref%d.anvt", exec_proc_inner_io(self->ref), round);
        snprintf(cdump, sizeof cdump, "%s/tcand%d.anvt", exec_proc_inner_io(cand), round);
        snprintf(rhost, sizeof rhost, "%s/tref%d.anvt", exec_proc_io_dir(self->ref), round);
        snprintf(chost, sizeof chost, "%s/tcand%d.anvt", exec_proc_io_dir(cand), round);
        uint64_t t_round = anv_now_ms(), t_calls = anv_now_ns();
        for (int side = 0; side < 2; side++) {
            bool ref_turn = (side == 0) == (round % 2 == 0); /* swap the order every round */
            int warm = round == 0 ? spec->warmup : 0;
            cJSON *rep = NULL;
            uint64_t t0 = anv_now_ns();
            int left = s_left_s(deadline);
            if (ref_turn) {
                int rc = s_ref_call(self, s_time_cmd(seeds, k, warm, spec, dump_at), left, out,
                                    &rep);
                if (rc != 0) {
                    *err = rc;
                    return S_FAILED;
                }
                s_series_add(&ref_s, rep, (double)(anv_now_ns() - t0) / 1e6, round);
            } else {
                if (s_cand_call(cand, s_time_cmd(seeds, k, warm, spec, dump_at), left, "run", out,
                                &rep) != S_OK)
                    return S_FAILED;
                s_series_add(&cand_s, rep, (double)(anv_now_ns() - t0) / 1e6, round);
            }
            cJSON_Delete(rep);
        }
        /* both batches first, back to back; then the files, which the batches' clock does not
           see (a 256 MiB write varies with the page cache and read as candidate work) */
        uint64_t t_dump = anv_now_ns();
        double calls_ms = (double)(t_dump - t_calls) / 1e6;
        s_outcome_t dumped = s_dumps(self, cand, rdump, cdump, spec->check_sample, deadline, out, err);
        uint64_t t_cmp = anv_now_ns();
        dump_ms += (double)(t_cmp - t_dump) / 1e6;
        if (dumped != S_OK) {
            unlink(rhost);
            unlink(chost);
            return S_FAILED;
        }
        exec_cmp_t cmp;
        int rc = exec_compare_files(rhost, chost, tol, &cmp);
        cmp_ms += (double)(anv_now_ns() - t_cmp) / 1e6;
        unlink(rhost);
        unlink(chost);
        if (rc != 0) {
            exec_result_set(out, EXEC_ST_NONE, "%s", cmp.reason);
            *err = rc;
            return S_FAILED;
        }
        if (!cmp.match) {
            exec_result_set(out, EXEC_ST_INCORRECT, "output during timing differs: %s",
                            cmp.reason);
            return S_FAILED;
        }
        /* large outputs: two dumps and a compare of 256 MiB took ~0.3 s a round on the H200
           against ~1 ms calls, most of an evaluation; later rounds then time about as many
           calls as their check costs. Each round still compares one of its calls, chosen at
           random after they ran, so a candidate wrong in a fraction f of its timed calls
           passes a round with probability about 1 - f, and all of them with (1 - f)^rounds:
           S_MIN_CHECKS rounds keep that below 0.4 % for f = 1/2. */
        checked++;
        double check_ms = (double)(anv_now_ns() - t_dump) / 1e6;
        if (check_ms > calls_ms && k_round < cap) {
            double grow = ceil((double)k * check_ms / fmax(calls_ms, 1e-3));
            int want = grow > (double)cap ? cap : (int)grow;
            if (want > k_round)
                k_round = want;
        }
        last_round_ms = (double)(anv_now_ms() - t_round);
        double rm, rr, cm, cr;
        s_stats(s_series_times(&ref_s), ref_s.n, &rm, &rr);
        s_stats(s_series_times(&cand_s), cand_s.n, &cm, &cr);
        if (cand_s.n >= spec->min_iters && rr <= spec->target_rel_err &&
            cr <= spec->target_rel_err)
            break;
        if (anv_now_ms() + (uint64_t)(2 * last_round_ms) >= deadline) {
            exec_result_flag(out, "timing_budget_exhausted");
            break;
        }
    }
    double rm, rr, cm, cr, rh, ch, dummy;
    s_stats(s_series_times(&ref_s), ref_s.n, &rm, &rr);
    s_stats(s_series_times(&cand_s), cand_s.n, &cm, &cr);
    s_stats(ref_s.host, ref_s.n, &rh, &dummy);
    s_stats(cand_s.host, cand_s.n, &ch, &dummy);
    /* device events must not exceed the host interval around them; work the events do not
       see (side streams) shows as host time far above event time: then host time counts.
       Host time also spans the spin before the start event; both sides carry it, so the terms
       relative to the reference's own host-minus-event time absorb it. Side-stream work short
       enough to run beside the spin is not seen here (about 1.5 spins; the 0.2 ms slack
       already hid that much before the spin existed): the static checks reject streams */
    if (cand_s.has_dev) {
        if (cm > ch * 1.05 + 0.05) {
            exec_result_flag(out, "timer_inconsistent");
            cm = ch;
        }
        if (ch > 1.5 * cm + 0.2 && ch > 1.5 * (rh - rm + cm)) {
            exec_result_flag(out, "host_device_gap");
            cm = ch - (rh - rm);
        }
    }
    /* the worker's own clock: what the candidate's side took beyond its reported time must
       not be far above what the reference's side took beyond its own (same harness code).
       The first round carries the warm-up calls, whose cost (lazy module loading, allocator
       growth, autotuning) differs between a fresh candidate process and the long-lived
       reference: it is left out whenever later rounds exist (on the H200 it made the first
       candidate of a worker read 3.5x slower than the same code as reference). */
    bool late = ref_s.late_n > 0 && cand_s.late_n > 0;
    double ref_over = late ? (ref_s.late_wall_ms - ref_s.late_reported_ms) / ref_s.late_n
                           : (ref_s.wall_ms - ref_s.reported_ms) / fmax(ref_s.n, 1);
    double cand_ext = late ? cand_s.late_wall_ms / cand_s.late_n - ref_over
                           : (cand_s.wall_ms / fmax(cand_s.n, 1)) - ref_over;
    if (ch < 0.5 * cand_ext && cand_ext - ch > 1.0) {
        exec_result_flag(out, "external_clock_mismatch");
        cm = cand_ext;
    }
    out->ref_ms = rm;
    out->cand_ms = cm;
    out->ref_host_ms = rh;
    out->cand_host_ms = ch;
    out->ref_rel_err = rr;
    out->cand_rel_err = cr;
    out->ref_iters = ref_s.n;
    out->cand_iters = cand_s.n;
    s_quantiles(s_series_times(&ref_s), ref_s.n, out->ref_q);
    s_quantiles(s_series_times(&cand_s), cand_s.n, out->cand_q);
    double lq[3];
    s_quantiles(ref_s.launch, ref_s.n_launch, lq);
    out->ref_launch_p90 = lq[2];
    s_quantiles(cand_s.launch, cand_s.n_launch, lq);
    out->cand_launch_p90 = lq[2];
    out->spin_us = spec->spin_us;
    out->timing_rounds = checked;
    out->phase_ms[EXEC_PH_TIMING_DUMP] = dump_ms;
    out->phase_ms[EXEC_PH_TIMING_COMPARE] = cmp_ms;
    return S_OK;
}

/* -- one evaluation ---------------------------------------------------------------------- */

/* The GPU, driver, versions and clocks, as the interpreter p reports them. Returns the
   exchange's rc (non-zero: p did not answer in time or died). */
static int s_env(exec_proc_t *p, const char *device, exec_result_t *out)
{
    cJSON *c = s_cmd("env"), *rep = NULL;
    cJSON_AddStringToObject(c, "device", device);
    int rc = exec_proc_call(p, c, 20000, &rep);
    if (rc == 0) {
        snprintf(out->gpu, sizeof out->gpu, "%s", s_str(rep, "gpu") ? s_str(rep, "gpu") : "");
        snprintf(out->driver, sizeof out->driver, "%s",
                 s_str(rep, "driver") ? s_str(rep, "driver") : "");
        snprintf(out->torch, sizeof out->torch, "%s", s_str(rep, "torch") ? s_str(rep, "torch") : "");
        snprintf(out->triton, sizeof out->triton, "%s",
                 s_str(rep, "triton") ? s_str(rep, "triton") : "");
        snprintf(out->clocks, sizeof out->clocks, "%s",
                 s_str(rep, "clocks") ? s_str(rep, "clocks") : "");
    }
    cJSON_Delete(c);
    cJSON_Delete(rep);
    return rc;
}

static void s_reward(const exec_spec_t *spec, exec_result_t *out)
{
    bool ok = out->status == EXEC_ST_CORRECT;
    exec_reward_vars_t v = {
        .correct = ok,
        .speedup = ok && isfinite(out->speedup) ? out->speedup : 0,
        .cap = spec->speedup_cap,
        .ref_ms = isfinite(out->ref_ms) ? out->ref_ms : 0,
        .cand_ms = isfinite(out->cand_ms) ? out->cand_ms : 0,
        .launches = out->launches,
        .gpu_share = isfinite(out->gpu_share) ? out->gpu_share : 0,
        .max_abs_err = isfinite(out->max_abs_err) ? out->max_abs_err : 0,
        .max_rel_err = isfinite(out->max_rel_err) ? out->max_rel_err : 0,
    };
    char err[160];
    if (exec_reward_eval(spec->reward_formula, &v, &out->reward, err, sizeof err) != 0) {
        ANV_WARN("%s: reward 0", err);
        out->reward = 0;
        exec_result_flag(out, "bad_reward_formula");
    }
}

/* Ends phase `ph` of the evaluation at now; *t is the phase's start and becomes now. */
static void s_phase(exec_result_t *out, exec_phase_t ph, uint64_t *t)
{
    uint64_t now = anv_now_ns();
    out->phase_ms[ph] = (double)(now - *t) / 1e6;
    *t = now;
}

/* The reference's trials: sent before the candidate loads, collected after its trials (or
   wherever the evaluation ends before), so that both processes work at once. */
typedef struct {
    long id;                    /* the command's id while its reply is outstanding, else 0 */
    uint64_t deadline;          /* anv_now_ms() by which the reply must have come... */
    uint64_t budget_ms;         /* ...or this long after the wait for it began, if later */
    bool mutates[S_MAX_TRIALS]; /* per trial, once collected: the reference modified inputs */
} s_ref_trials_t;

/* Sends the reference's trials (cmd taken) without waiting for them; timeout_s bounds them
   from now. 0, or non-zero as s_ref_check. */
static int s_ref_trials_send(exec_scorer_t *self, cJSON *cmd, int timeout_s, s_ref_trials_t *rt,
                             exec_result_t *out)
{
    long id = exec_proc_send(self->ref, cmd);
    cJSON_Delete(cmd);
    if (id < 0) {
        cJSON *none = NULL;
        return s_ref_check(self, (int)id, out, &none);
    }
    rt->id = id;
    rt->budget_ms = (uint64_t)timeout_s * 1000;
    rt->deadline = anv_now_ms() + rt->budget_ms;
    return 0;
}

/* Waits for the reference's trials to answer, when they are outstanding (phase ref_wait;
   *t_ph becomes its end), until their deadline or, if later, a whole run budget from now:
   the worker reads the reference's pipes only while it waits on it, so a reference that
   printed more than its log pipe holds has been stopped since (a reference that hangs costs
   up to two budgets). After it the reference is idle or killed,
   so no reply of this evaluation reaches the next one and no file of its trials appears after
   exec_scorer_score() has removed them. 0, or non-zero as s_ref_check: the reference's
   failure replaces whatever verdict out holds, since a verdict against a reference that
   failed means nothing. */
static int s_ref_trials_collect(exec_scorer_t *self, s_ref_trials_t *rt, int n,
                                exec_result_t *out, uint64_t *t_ph)
{
    if (rt->id == 0)
        return 0;
    uint64_t now = anv_now_ms();
    cJSON *rep = NULL;
    *t_ph = anv_now_ns(); /* the wait alone: not the rest of a phase the candidate failed in */
    uint64_t until = rt->deadline > now + rt->budget_ms ? rt->deadline : now + rt->budget_ms;
    int rc = exec_proc_recv(self->ref, rt->id, (int)(until - now), &rep);
    rt->id = 0;
    if ((rc = s_ref_check(self, rc, out, &rep)) == 0) {
        const cJSON *m = cJSON_GetObjectItem(rep, "mutated");
        for (int i = 0; i < n; i++)
            rt->mutates[i] = cJSON_IsTrue(cJSON_GetArrayItem(m, i));
    }
    cJSON_Delete(rep);
    s_phase(out, EXEC_PH_REF_WAIT, t_ph);
    return rc;
}

/* One evaluation's settings and secrets, shared by its phases. */
typedef struct {
    const exec_task_t *task;
    const exec_spec_t *spec;
    const char *code, *device;
    int trials;
    bool kb; /* kernelbench: odd trials run in train mode */
    double init_seed, seeds[S_MAX_TRIALS];
} s_eval_t;

/* The strings of arr, each ended by a newline, in one string (caller frees); NULL when none. */
static char *s_join_lines(const cJSON *arr)
{
    size_t len = 0;
    char *all = NULL;
    const cJSON *e;
    cJSON_ArrayForEach(e, arr)
    {
        if (!cJSON_IsString(e))
            continue;
        size_t n = strlen(e->valuestring);
        char *na = realloc(all, len + n + 2);
        if (!na)
            break;
        all = na;
        memcpy(all + len, e->valuestring, n);
        all[len + n] = '\n';
        all[len + n + 1] = '\0';
        len += n + 1;
    }
    return all;
}

/* The static checks, in the reference interpreter (no candidate code runs there). S_FAILED
   with out filled when they reject the code, or with *err when the reference failed. */
static s_outcome_t s_static(exec_scorer_t *self, const s_eval_t *ev, exec_result_t *out,
                            uint64_t *t_ph, int *err)
{
    s_outcome_t res = S_FAILED;
    cJSON *rep = NULL, *c = s_cmd("static");
    cJSON_AddStringToObject(c, "code", ev->code);
    cJSON_AddStringToObject(c, "kind", ev->task->kind);
    cJSON_AddStringToObject(c, "task", ev->task->source);
    cJSON *allow = cJSON_AddArrayToObject(c, "allow_ops");
    char ops[1024];
    snprintf(ops, sizeof ops, "%s", ev->spec->allow_ops ? ev->spec->allow_ops : "");
    char *save = NULL;
    for (char *t = strtok_r(ops, ",", &save); t; t = strtok_r(NULL, ",", &save))
        cJSON_AddItemToArray(allow, cJSON_CreateString(t));
    if ((*err = s_ref_call(self, c, 60, out, &rep)) != 0)
        return S_FAILED;
    s_phase(out, EXEC_PH_STATIC, t_ph);
    const cJSON *errs = cJSON_GetObjectItem(rep, "errors");
    if (s_str(rep, "syntax_error")) {
        exec_result_set(out, EXEC_ST_COMPILE_ERROR, "syntax error: %s", s_str(rep, "syntax_error"));
        goto out;
    }
    if (cJSON_GetArraySize(errs) > 0) {
        out->static_errors = s_join_lines(errs);
        if (ev->spec->static_checks) {
            exec_result_set(out, EXEC_ST_REJECTED_STATIC, "%s",
                            cJSON_GetArrayItem(errs, 0)->valuestring);
            goto out;
        }
        exec_result_flag(out, "static_violations_ignored");
    }
    res = S_OK;
out:
    cJSON_Delete(rep);
    return res;
}

/* What the candidate's trials reported, for the verdict after the compare. */
typedef struct {
    uint64_t run_deadline; /* anv_now_ms() at which the run budget ends (from the trials on) */
    int zero_trial;        /* the first trial without a launch of the candidate's, or -1 */
    bool mutates[S_MAX_TRIALS];
} s_cand_trials_t;

/* The candidate's load (phase cand_load), then its trials, each compared with the
   reference's as soon as its reply says its file is complete: every trial is sent at once
   (one command each; the harness runs them in order), so the candidate runs trial i + 1
   while the worker compares trial i, and the first mismatch ends the evaluation without
   waiting for the trials after it (the candidate is killed with them). The reference's trials
   are collected before the first comparison. Phases: cand_trials (the trials' wall time less
   the comparisons and the wait for the reference), ref_wait, compare. S_FAILED with out
   filled (and *err when the task cannot be scored); the first failure in trial order decides
   the status. */
static s_outcome_t s_cand_trials(exec_scorer_t *self, exec_proc_t *cand, const s_eval_t *ev,
                                 const exec_tol_t *tol, s_ref_trials_t *rt, s_degen_t *dg,
                                 exec_result_t *out, s_cand_trials_t *ct, uint64_t *t_ph,
                                 int *err)
{
    cJSON *rep = NULL, *c = s_cmd("load");
    s_add_task(c, ev->task, ev->device, ev->init_seed);
    cJSON_AddStringToObject(c, "code", ev->code);
    if (s_cand_call(cand, c, ev->spec->compile_timeout_s, "compile", out, &rep) != S_OK)
        return S_FAILED;
    out->load_ms = s_num(rep, "load_ms", NAN);
    cJSON_Delete(rep);
    rep = NULL;
    s_phase(out, EXEC_PH_CAND_LOAD, t_ph);
    ct->run_deadline = anv_now_ms() + (uint64_t)ev->spec->run_timeout_s * 1000;
    const int budget_s = ev->spec->compile_timeout_s + ev->spec->run_timeout_s;
    const uint64_t deadline = anv_now_ms() + (uint64_t)budget_s * 1000, t0 = anv_now_ns();
    uint64_t cmp_ns = 0, wait_ns = 0;
    s_outcome_t res = S_FAILED;
    long ids[S_MAX_TRIALS];
    for (int i = 0; i < ev->trials; i++) {
        cJSON *cmd = s_trials_cmd(ev->seeds, 1, i, cand, "cand", ev->kb);
        ids[i] = exec_proc_send(cand, cmd);
        cJSON_Delete(cmd);
        if (ids[i] < 0) {
            s_cand_check(cand, (int)ids[i], budget_s, "compile+run", out, &rep);
            goto out;
        }
    }
    unsigned min_l = UINT_MAX;
    ct->zero_trial = -1;
    for (int i = 0; i < ev->trials; i++) {
        uint64_t now = anv_now_ms();
        int rc = exec_proc_recv(cand, ids[i], now < deadline ? (int)(deadline - now) : 0, &rep);
        if (s_cand_check(cand, rc, budget_s, "compile+run", out, &rep) != S_OK)
            goto out;
        if (i == 0)
            out->compile_ms = s_num(rep, "first_ms", NAN); /* the first call compiles */
        const cJSON *l = cJSON_GetArrayItem(cJSON_GetObjectItem(rep, "launches"), 0);
        unsigned n = cJSON_IsNumber(l) ? (unsigned)l->valuedouble : 0;
        if (n < min_l)
            min_l = n;
        if (n == 0 && ct->zero_trial < 0)
            ct->zero_trial = i;
        ct->mutates[i] = cJSON_IsTrue(cJSON_GetArrayItem(cJSON_GetObjectItem(rep, "mutated"), 0));
        cJSON_Delete(rep);
        rep = NULL;
        uint64_t t = anv_now_ns();
        if (i == 0) {
            uint64_t tw = t;
            *err = s_ref_trials_collect(self, rt, ev->trials + 1, out, &tw);
            wait_ns = anv_now_ns() - t;
            if (*err != 0)
                goto out;
            t = anv_now_ns();
        }
        s_outcome_t same = s_compare_trials(self->ref, cand, i, 1, tol, out, dg, "", err);
        cmp_ns += anv_now_ns() - t;
        if (same != S_OK)
            goto out;
    }
    out->launches = min_l == UINT_MAX ? 0 : min_l;
    res = S_OK;
out:
    cJSON_Delete(rep);
    *t_ph = anv_now_ns();
    out->phase_ms[EXEC_PH_CAND_TRIALS] = (double)(*t_ph - t0 - cmp_ns - wait_ns) / 1e6;
    out->phase_ms[EXEC_PH_COMPARE] = (double)cmp_ns / 1e6;
    return res;
}

/* What the trials say beyond matching outputs: inputs modified, a constant output where a
   constant passes, no launch of the candidate's kernels. S_FAILED with out filled. */
static s_outcome_t s_trials_verdict(const s_eval_t *ev, const s_cand_trials_t *ct,
                                    const bool *ref_mutates, const s_degen_t *dg,
                                    exec_result_t *out)
{
    for (int i = 0; i < ev->trials; i++) {
        if (ct->mutates[i] && !ref_mutates[i]) {
            exec_result_set(out, EXEC_ST_INCORRECT, "the candidate modified its inputs (trial %d)",
                            i);
            return S_FAILED;
        }
    }
    if (dg->zero_pass)
        exec_result_flag(out, "zero_output_would_pass");
    if (dg->const_pass)
        exec_result_flag(out, "constant_output_would_pass");
    if ((dg->zero_pass || dg->const_pass) && dg->cand_const && dg->ref_const_any_not) {
        exec_result_set(out, EXEC_ST_INCORRECT,
                        "the output is a constant; on this task a constant passes the tolerance "
                        "but the reference is not constant");
        return S_FAILED;
    }
    if (ct->zero_trial >= 0 && ev->spec->require_launches) {
        exec_result_set(out, EXEC_ST_INCORRECT,
                        "no Triton kernel of the candidate was launched in trial %d (%s mode)",
                        ct->zero_trial, ev->kb && ct->zero_trial % 2 ? "train" : "eval");
        return S_FAILED;
    }
    return S_OK;
}

/* The check after timing (the last trial output of each side, compared) and, on a GPU, the
   profiler's share of GPU time. S_FAILED with out filled (and *err when it cannot be
   scored). */
static s_outcome_t s_after_timing(exec_scorer_t *self, exec_proc_t *cand, const s_eval_t *ev,
                                  const exec_tol_t *tol, uint64_t run_deadline, s_degen_t *dg,
                                  exec_result_t *out, uint64_t *t_ph, int *err)
{
    s_outcome_t res = S_FAILED;
    cJSON *rep = NULL;
    int left = s_left_s(run_deadline) + 5;
    if (s_cand_call(cand, s_trials_cmd(ev->seeds, 1, ev->trials, cand, "cand", false), left,
                    "run", out, &rep) != S_OK)
        return S_FAILED;
    const cJSON *l_after = cJSON_GetArrayItem(cJSON_GetObjectItem(rep, "launches"), 0);
    if (ev->spec->require_launches && (!cJSON_IsNumber(l_after) || l_after->valuedouble < 1)) {
        exec_result_set(out, EXEC_ST_INCORRECT,
                        "no Triton kernel of the candidate was launched after timing");
        goto out;
    }
    cJSON_Delete(rep);
    rep = NULL;
    if (s_compare_trials(self->ref, cand, ev->trials, 1, tol, out, dg, "after timing: ", err) !=
        S_OK)
        goto out;
    s_phase(out, EXEC_PH_CHECK, t_ph);
    if (strcmp(ev->device, "cuda") == 0) {
        cJSON *c = s_cmd("profile");
        cJSON_AddNumberToObject(c, "seed", s_seed());
        if (s_cand_call(cand, c, 60, "run", out, &rep) != S_OK)
            goto out;
        out->gpu_share = s_num(rep, "gpu_share", NAN);
        if (isfinite(out->gpu_share) && out->gpu_share < ev->spec->min_gpu_share)
            exec_result_flag(out, "low_gpu_share");
        s_phase(out, EXEC_PH_PROFILE, t_ph);
    }
    res = S_OK;
out:
    cJSON_Delete(rep);
    return res;
}

static int s_score(exec_scorer_t *self, const exec_task_t *task, const char *code,
                   const exec_spec_t *spec, exec_result_t *out)
{
    uint64_t t_ph = anv_now_ns();
    s_eval_t ev = {.task = task, .spec = spec, .code = code, .device = self->cfg.sandbox.device,
                   .kb = strcmp(task->kind, "kernelbench") == 0, .init_seed = s_seed()};
    ev.trials = spec->trials < 5                  ? 5
                : spec->trials > S_MAX_TRIALS - 1 ? S_MAX_TRIALS - 1
                                                  : spec->trials;
    for (int i = 0; i <= ev.trials; i++)
        ev.seeds[i] = s_seed();
    out->trials = ev.trials;
    cJSON *rep = NULL, *c;
    exec_proc_t *cand = NULL;
    s_cand_trials_t ct = {0};
    s_ref_trials_t rt = {0};
    s_degen_t dg = {true, true, true, false};
    int err = 0, rc;
    exec_tol_t tol;
    exec_tol_default(&tol);
    exec_tol_override(&tol, spec->atol, spec->rtol);

    if ((err = s_ref_ensure(self, out)) != 0)
        return err;
    s_phase(out, EXEC_PH_REF_START, &t_ph);
    if (s_static(self, &ev, out, &t_ph, &err) != S_OK)
        goto done;

    /* the reference's load, then its trials + 1 outputs (the last is the check after
       timing), which run while the candidate loads and runs its own */
    c = s_cmd("load");
    s_add_task(c, task, ev.device, ev.init_seed);
    if ((err = s_ref_call(self, c, spec->compile_timeout_s, out, &rep)) != 0)
        return err;
    cJSON_Delete(rep);
    if ((err = s_ref_trials_send(self,
                                 s_trials_cmd(ev.seeds, ev.trials + 1, 0, self->ref, "ref", ev.kb),
                                 spec->run_timeout_s, &rt, out)) != 0)
        return err;
    s_phase(out, EXEC_PH_REF, &t_ph);

    /* the candidate, in a fresh warm interpreter */
    cand = exec_pool_take(self->pool, self->cfg.ready_timeout_s * 1000, &out->wait_ms);
    if (!cand) {
        exec_result_set(out, EXEC_ST_NONE, "no warm interpreter became ready");
        err = ANV_EINTERNAL;
        goto done;
    }
    if (s_cand_trials(self, cand, &ev, &tol, &rt, &dg, out, &ct, &t_ph, &err) != S_OK)
        goto done;
    if (s_trials_verdict(&ev, &ct, rt.mutates, &dg, out) != S_OK)
        goto done;

    /* timing, then the check after timing; the interpreters still importing for the next
       candidates are stopped meanwhile (their CPU load read as launch jitter) */
    exec_pool_pause(self->pool);
    s_outcome_t timed = s_timing(self, cand, spec, &tol, out, ct.run_deadline, &err);
    exec_pool_resume(self->pool);
    if (timed != S_OK)
        goto done;
    s_phase(out, EXEC_PH_TIMING, &t_ph);
    if (s_after_timing(self, cand, &ev, &tol, ct.run_deadline, &dg, out, &t_ph, &err) != S_OK)
        goto done;
    exec_result_set(out, EXEC_ST_CORRECT, "%s", "");
    out->speedup = out->cand_ms > 0 ? out->ref_ms / out->cand_ms : NAN;
done:
    /* whatever ended the evaluation, the reference's trials are not left running */
    rc = s_ref_trials_collect(self, &rt, ev.trials + 1, out, &t_ph);
    if (rc != 0)
        err = rc;
    /* the environment from the reference, idle now (the candidate may still be busy with
       trials queued after the one that failed) */
    exec_proc_destroy(&cand);
    if (self->ref && exec_proc_alive(self->ref) && exec_proc_is_ready(self->ref)) {
        if (s_env(self->ref, ev.device, out) != 0)
            exec_proc_destroy(&self->ref); /* restarted by the next evaluation */
    } else if (self->ref_ready) {
        snprintf(out->torch, sizeof out->torch, "%s", s_str(self->ref_ready, "torch"));
        snprintf(out->triton, sizeof out->triton, "%s", s_str(self->ref_ready, "triton"));
    }
    return err;
}

int exec_scorer_score(exec_scorer_t *self,
                      const exec_task_t *task,
                      const char *completion,
                      const exec_spec_t *spec,
                      exec_result_t *out)
{
    uint64_t t0 = anv_now_ns();
    exec_result_init(out);
    snprintf(out->device, sizeof out->device, "%s", self->cfg.sandbox.device);
    snprintf(out->sandbox, sizeof out->sandbox, "%s", exec_sandbox_mode(self->sandbox));
    char why[256];
    int rc = 0;
    char *code = exec_extract_code(completion, why, sizeof why);
    if (!code) {
        exec_result_set(out, EXEC_ST_FORMAT_ERROR, "%s", why);
    } else {
        rc = s_score(self, task, code, spec, out);
        free(code);
    }
    /* the reference's files of this evaluation */
    if (self->ref) {
        char cmd[4300];
        snprintf(cmd, sizeof cmd, "%s", exec_proc_io_dir(self->ref));
        for (int i = 0; i < S_MAX_TRIALS; i++) {
            char p[4400];
            snprintf(p, sizeof p, "%s/ref%d.anvt", cmd, i);
            unlink(p);
        }
    }
    s_reward(spec, out);
    out->eval_ms = (double)(anv_now_ns() - t0) / 1e6;
    self->evals++;
    if (rc != 0)
        ANV_ERROR("task '%s' cannot be scored: %s", task->name ? task->name : "?", out->error);
    else
        ANV_INFO("task '%s': %s%s%s (%.0f ms)", task->name ? task->name : "?",
                 exec_status_name(out->status), *out->error ? ": " : "", out->error,
                 out->eval_ms);
    return rc;
}

exec_scorer_t *exec_scorer_new(const exec_scorer_cfg_t *cfg)
{
    exec_scorer_t *self = calloc(1, sizeof *self);
    if (!self)
        return NULL;
    self->cfg = *cfg;
    if (self->cfg.ready_timeout_s <= 0)
        self->cfg.ready_timeout_s = 300;
    self->sandbox = exec_sandbox_new(&cfg->sandbox);
    if (!self->sandbox)
        goto fail;
    self->cfg.sandbox.device = cfg->sandbox.device; /* borrowed for the scorer's lifetime */
    self->ref = exec_sandbox_spawn(self->sandbox);
    self->pool = exec_pool_new(self->sandbox, cfg->pool_size);
    if (!self->ref || !self->pool)
        goto fail;
    return self;
fail:
    exec_scorer_destroy(&self);
    return NULL;
}

void exec_scorer_destroy(exec_scorer_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    exec_scorer_t *self = *self_p;
    exec_pool_destroy(&self->pool);
    exec_proc_destroy(&self->ref);
    cJSON_Delete(self->ref_ready);
    exec_sandbox_destroy(&self->sandbox);
    free(self);
    *self_p = NULL;
}

const char *exec_scorer_sandbox_mode(const exec_scorer_t *self)
{
    return exec_sandbox_mode(self->sandbox);
}

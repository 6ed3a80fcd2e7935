/*  exec_result.c - result bookkeeping, JSON (cJSON) and protobuf-c conversion.

    Design: the JSON document is the complete record (it is also stored in ExecResult's
    result_json); the proto carries the same figures in typed fields. NAN means "not
    measured" in both.
*/
#include "exec_result.h"

#include "anv_error.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const exec_phase_names[EXEC_PH_N] = {
    "ref_start", "static", "ref",         "cand_load",      "cand_trials", "ref_wait",
    "compare",   "timing", "timing_dump", "timing_compare", "check",       "profile"};

void exec_result_init(exec_result_t *r)
{
    memset(r, 0, sizeof *r);
    r->max_abs_err = r->max_rel_err = r->ref_ms = r->cand_ms = NAN;
    r->ref_host_ms = r->cand_host_ms = r->ref_rel_err = r->cand_rel_err = NAN;
    r->speedup = r->compile_ms = r->load_ms = r->gpu_share = NAN;
    for (int i = 0; i < 3; i++)
        r->ref_q[i] = r->cand_q[i] = NAN;
    r->ref_launch_p90 = r->cand_launch_p90 = NAN;
    for (int i = 0; i < EXEC_PH_N; i++)
        r->phase_ms[i] = NAN;
    r->reward = 0;
}

void exec_result_release(exec_result_t *r)
{
    free(r->traceback);
    free(r->static_errors);
    for (size_t i = 0; i < r->n_flags; i++)
        free(r->flags[i]);
    memset(r, 0, sizeof *r);
}

bool exec_result_has_flag(const exec_result_t *r, const char *flag)
{
    for (size_t i = 0; i < r->n_flags; i++)
        if (strcmp(r->flags[i], flag) == 0)
            return true;
    return false;
}

void exec_result_flag(exec_result_t *r, const char *flag)
{
    if (r->n_flags == EXEC_MAX_FLAGS || exec_result_has_flag(r, flag))
        return;
    char *f = strdup(flag);
    if (f)
        r->flags[r->n_flags++] = f;
}

void exec_result_set(exec_result_t *r, exec_status_t st, const char *fmt, ...)
{
    va_list ap;
    r->status = st;
    va_start(ap, fmt);
    vsnprintf(r->error, sizeof r->error, fmt, ap);
    va_end(ap);
    for (char *p = r->error; *p; p++)
        if (*p == '\n' || *p == '\r')
            *p = ' ';
}

void exec_result_set_traceback(exec_result_t *r, char *tb)
{
    free(r->traceback);
    r->traceback = tb;
    if (tb) {
        size_t n = strlen(tb);
        if (n > 4000)
            memmove(tb, tb + n - 4000, 4001);
    }
}

const char *exec_status_name(exec_status_t st)
{
    switch (st) {
    case EXEC_ST_FORMAT_ERROR:
        return "format_error";
    case EXEC_ST_REJECTED_STATIC:
        return "rejected_static";
    case EXEC_ST_COMPILE_ERROR:
        return "compile_error";
    case EXEC_ST_RUNTIME_ERROR:
        return "runtime_error";
    case EXEC_ST_TIMEOUT:
        return "timeout";
    case EXEC_ST_CRASHED:
        return "crashed";
    case EXEC_ST_INCORRECT:
        return "incorrect";
    case EXEC_ST_CORRECT:
        return "correct";
    default:
        return "none";
    }
}

static void s_num(cJSON *o, const char *k, double v)
{
    if (isfinite(v))
        cJSON_AddNumberToObject(o, k, v);
    else if (isinf(v))
        cJSON_AddNumberToObject(o, k, v > 0 ? 1e308 : -1e308);
    else
        cJSON_AddNullToObject(o, k);
}

static void s_str(cJSON *o, const char *k, const char *v)
{
    if (v && *v)
        cJSON_AddStringToObject(o, k, v);
    else
        cJSON_AddNullToObject(o, k);
}

char *exec_result_to_json(const exec_result_t *r, bool pretty)
{
    cJSON *o = cJSON_CreateObject(), *env, *flags, *timing;
    if (!o)
        return NULL;
    cJSON_AddStringToObject(o, "status", exec_status_name(r->status));
    cJSON_AddNumberToObject(o, "reward", r->reward);
    s_num(o, "speedup", r->speedup);
    s_str(o, "error", r->error);
    s_str(o, "traceback_tail", r->traceback);
    if (r->static_errors) {
        cJSON *arr = cJSON_AddArrayToObject(o, "static_errors");
        char *copy = strdup(r->static_errors), *save = NULL;
        for (char *t = copy ? strtok_r(copy, "\n", &save) : NULL; t;
             t = strtok_r(NULL, "\n", &save))
            cJSON_AddItemToArray(arr, cJSON_CreateString(t));
        free(copy);
    }
    s_num(o, "max_abs_err", r->max_abs_err);
    s_num(o, "max_rel_err", r->max_rel_err);
    s_num(o, "ref_ms", r->ref_ms);
    s_num(o, "cand_ms", r->cand_ms);
    s_num(o, "compile_ms", r->compile_ms);
    cJSON_AddNumberToObject(o, "launches", r->launches);
    s_num(o, "gpu_share", r->gpu_share);
    cJSON_AddNumberToObject(o, "trials", r->trials);
    timing = cJSON_AddObjectToObject(o, "timing");
    s_num(timing, "ref_host_ms", r->ref_host_ms);
    s_num(timing, "cand_host_ms", r->cand_host_ms);
    s_num(timing, "ref_rel_err", r->ref_rel_err);
    s_num(timing, "cand_rel_err", r->cand_rel_err);
    cJSON_AddNumberToObject(timing, "ref_iters", r->ref_iters);
    cJSON_AddNumberToObject(timing, "cand_iters", r->cand_iters);
    cJSON_AddNumberToObject(timing, "rounds", r->timing_rounds);
    /* the per-call spread behind each mean: a bimodal series shows as p90 far above p50 */
    static const char *qn[2][3] = {{"ref_p10_ms", "ref_p50_ms", "ref_p90_ms"},
                                   {"cand_p10_ms", "cand_p50_ms", "cand_p90_ms"}};
    for (int i = 0; i < 3; i++) {
        s_num(timing, qn[0][i], r->ref_q[i]);
        s_num(timing, qn[1][i], r->cand_q[i]);
    }
    s_num(timing, "ref_launch_p90_ms", r->ref_launch_p90);
    s_num(timing, "cand_launch_p90_ms", r->cand_launch_p90);
    if (r->spin_us > 0)
        cJSON_AddNumberToObject(timing, "spin_us", r->spin_us);
    s_num(timing, "load_ms", r->load_ms);
    s_num(timing, "eval_ms", r->eval_ms);
    s_num(timing, "wait_ms", r->wait_ms);
    cJSON *phases = cJSON_AddObjectToObject(timing, "phases");
    for (int i = 0; i < EXEC_PH_N; i++)
        s_num(phases, exec_phase_names[i], r->phase_ms[i]);
    env = cJSON_AddObjectToObject(o, "env");
    s_str(env, "gpu", r->gpu);
    s_str(env, "driver", r->driver);
    s_str(env, "torch", r->torch);
    s_str(env, "triton", r->triton);
    s_str(env, "clocks", r->clocks);
    s_str(env, "device", r->device);
    s_str(env, "sandbox", r->sandbox);
    flags = cJSON_AddArrayToObject(o, "flags");
    for (size_t i = 0; i < r->n_flags; i++)
        cJSON_AddItemToArray(flags, cJSON_CreateString(r->flags[i]));
    char *s = pretty ? cJSON_Print(o) : cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

static char *s_dup(const char *s)
{
    return s && *s ? strdup(s) : NULL;
}

#define S_OPT(field, v)                                                                        \
    do {                                                                                       \
        if (isfinite(v)) {                                                                     \
            out->has_##field = 1;                                                              \
            out->field = (v);                                                                  \
        }                                                                                      \
    } while (0)

int exec_result_to_proto(const exec_result_t *r, Anvil__ExecResult *out)
{
    anvil__exec_result__init(out);
    out->has_status = 1;
    out->status = (Anvil__ExecStatus)r->status;
    out->error = s_dup(r->error);
    out->traceback_tail = s_dup(r->traceback);
    S_OPT(max_abs_err, r->max_abs_err);
    S_OPT(max_rel_err, r->max_rel_err);
    S_OPT(ref_ms, r->ref_ms);
    S_OPT(cand_ms, r->cand_ms);
    S_OPT(speedup, r->speedup);
    S_OPT(gpu_share, r->gpu_share);
    S_OPT(compile_ms, r->compile_ms);
    out->has_launches = 1;
    out->launches = r->launches;
    out->has_reward = 1;
    out->reward = r->reward;
    out->env = calloc(1, sizeof *out->env);
    if (!out->env)
        goto oom;
    anvil__exec_env__init(out->env);
    out->env->gpu = s_dup(r->gpu);
    out->env->driver = s_dup(r->driver);
    out->env->torch = s_dup(r->torch);
    out->env->triton = s_dup(r->triton);
    out->env->clocks = s_dup(r->clocks);
    out->env->device = s_dup(r->device);
    if (r->n_flags) {
        out->flags = calloc(r->n_flags, sizeof(char *));
        if (!out->flags)
            goto oom;
        for (size_t i = 0; i < r->n_flags; i++)
            if ((out->flags[out->n_flags] = strdup(r->flags[i])) != NULL)
                out->n_flags++;
    }
    out->result_json = exec_result_to_json(r, false);
    return 0;
oom:
    exec_result_proto_free(out);
    return -ENOMEM;
}

void exec_result_proto_free(Anvil__ExecResult *out)
{
    free(out->error);
    free(out->traceback_tail);
    if (out->env) {
        free(out->env->gpu);
        free(out->env->driver);
        free(out->env->torch);
        free(out->env->triton);
        free(out->env->clocks);
        free(out->env->device);
        free(out->env);
    }
    for (size_t i = 0; i < out->n_flags; i++)
        free(out->flags[i]);
    free(out->flags);
    free(out->result_json);
    anvil__exec_result__init(out);
}

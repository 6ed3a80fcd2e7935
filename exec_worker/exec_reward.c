/*  exec_reward.c - recursive-descent evaluator of reward formulas.

    Design: the formula is short and evaluated once per result, so it is parsed and evaluated
    in one pass, without building a tree; the first error stops the evaluation. Depth is
    bounded so a hostile formula from a job spec cannot exhaust the stack.
*/
#include "exec_reward.h"

#include "anv_error.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *s, *p;
    const exec_reward_vars_t *v;
    char *err;
    size_t errlen;
    int failed, depth;
} s_parser_t;

static double s_expr(s_parser_t *ps);

static void s_error(s_parser_t *ps, const char *what)
{
    if (ps->failed)
        return;
    ps->failed = 1;
    snprintf(ps->err, ps->errlen, "reward formula: %s at position %d", what,
             (int)(ps->p - ps->s));
}

static void s_ws(s_parser_t *ps)
{
    while (isspace((unsigned char)*ps->p))
        ps->p++;
}

static int s_eat(s_parser_t *ps, const char *tok)
{
    s_ws(ps);
    size_t n = strlen(tok);
    if (strncmp(ps->p, tok, n) == 0) {
        ps->p += n;
        return 1;
    }
    return 0;
}

static int s_var(s_parser_t *ps, const char *name, size_t n, double *out)
{
    static const struct {
        const char *name;
        size_t off;
    } vars[] = {
        {"correct", offsetof(exec_reward_vars_t, correct)},
        {"speedup", offsetof(exec_reward_vars_t, speedup)},
        {"cap", offsetof(exec_reward_vars_t, cap)},
        {"ref_ms", offsetof(exec_reward_vars_t, ref_ms)},
        {"cand_ms", offsetof(exec_reward_vars_t, cand_ms)},
        {"launches", offsetof(exec_reward_vars_t, launches)},
        {"gpu_share", offsetof(exec_reward_vars_t, gpu_share)},
        {"max_abs_err", offsetof(exec_reward_vars_t, max_abs_err)},
        {"max_rel_err", offsetof(exec_reward_vars_t, max_rel_err)},
    };
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        if (strlen(vars[i].name) == n && strncmp(vars[i].name, name, n) == 0) {
            *out = *(const double *)((const char *)ps->v + vars[i].off);
            return 1;
        }
    }
    return 0;
}

static double s_call(s_parser_t *ps, const char *name, size_t n)
{
    double a[3] = {0, 0, 0};
    int argc = 0;
    if (!s_eat(ps, ")")) {
        do {
            if (argc == 3) {
                s_error(ps, "too many arguments");
                return 0;
            }
            a[argc++] = s_expr(ps);
        } while (!ps->failed && s_eat(ps, ","));
        if (!s_eat(ps, ")"))
            s_error(ps, "expected ')'");
    }
    if (ps->failed)
        return 0;
#define S_FN(nm, k) (n == strlen(nm) && strncmp(name, nm, n) == 0 && argc == (k))
    if (S_FN("min", 2))
        return fmin(a[0], a[1]);
    if (S_FN("max", 2))
        return fmax(a[0], a[1]);
    if (S_FN("clamp", 3))
        return fmin(fmax(a[0], a[1]), a[2]);
    if (S_FN("log", 1))
        return log(a[0]);
    if (S_FN("sqrt", 1))
        return sqrt(a[0]);
    if (S_FN("abs", 1))
        return fabs(a[0]);
#undef S_FN
    s_error(ps, "unknown function or wrong number of arguments");
    return 0;
}

static double s_primary(s_parser_t *ps)
{
    s_ws(ps);
    if (++ps->depth > 64) {
        s_error(ps, "nested too deeply");
        return 0;
    }
    double v = 0;
    if (s_eat(ps, "(")) {
        v = s_expr(ps);
        if (!s_eat(ps, ")"))
            s_error(ps, "expected ')'");
    } else if (s_eat(ps, "-")) {
        v = -s_primary(ps);
    } else if (isdigit((unsigned char)*ps->p) || *ps->p == '.') {
        char *end;
        v = strtod(ps->p, &end);
        ps->p = end;
    } else if (isalpha((unsigned char)*ps->p) || *ps->p == '_') {
        const char *name = ps->p;
        while (isalnum((unsigned char)*ps->p) || *ps->p == '_')
            ps->p++;
        size_t n = (size_t)(ps->p - name);
        if (s_eat(ps, "("))
            v = s_call(ps, name, n);
        else if (!s_var(ps, name, n, &v))
            s_error(ps, "unknown variable");
    } else {
        s_error(ps, "expected a number, variable or '('");
    }
    ps->depth--;
    return v;
}

static double s_term(s_parser_t *ps)
{
    double v = s_primary(ps);
    while (!ps->failed) {
        if (s_eat(ps, "*"))
            v *= s_primary(ps);
        else if (s_eat(ps, "/"))
            v /= s_primary(ps);
        else
            break;
    }
    return v;
}

static double s_sum(s_parser_t *ps)
{
    double v = s_term(ps);
    while (!ps->failed) {
        if (s_eat(ps, "+"))
            v += s_term(ps);
        else if (s_eat(ps, "-"))
            v -= s_term(ps);
        else
            break;
    }
    return v;
}

static double s_expr(s_parser_t *ps)
{
    double v = s_sum(ps);
    while (!ps->failed) {
        if (s_eat(ps, "<="))
            v = v <= s_sum(ps);
        else if (s_eat(ps, ">="))
            v = v >= s_sum(ps);
        else if (s_eat(ps, "=="))
            v = v == s_sum(ps);
        else if (s_eat(ps, "!="))
            v = v != s_sum(ps);
        else if (s_eat(ps, "<"))
            v = v < s_sum(ps);
        else if (s_eat(ps, ">"))
            v = v > s_sum(ps);
        else
            break;
    }
    return v;
}

int exec_reward_eval(const char *formula,
                     const exec_reward_vars_t *vars,
                     double *value,
                     char *err,
                     size_t errlen)
{
    s_parser_t ps = {.s = formula, .p = formula, .v = vars, .err = err, .errlen = errlen};
    double v = s_expr(&ps);
    s_ws(&ps);
    if (!ps.failed && *ps.p)
        s_error(&ps, "unexpected text");
    if (ps.failed)
        return ANV_EFORMAT;
    *value = isfinite(v) ? v : 0.0;
    return 0;
}

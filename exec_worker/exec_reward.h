/*  exec_reward.h - the configurable reward formula.

    A formula is an arithmetic expression over the result's figures, e.g. the default
    "correct * (1 + min(speedup, cap))". Grammar: numbers, variables, + - * /, unary -,
    comparisons (< <= > >= == !=, giving 1 or 0), parentheses and the functions min(a, b),
    max(a, b), clamp(x, lo, hi), log(x), sqrt(x), abs(x). Variables: correct (0/1), speedup,
    cap, ref_ms, cand_ms, launches, gpu_share, max_abs_err, max_rel_err. Unknown names and
    syntax errors are reported with their position. A non-finite value (speedup of an
    incorrect candidate, division by zero) evaluates to 0.
*/
#ifndef EXEC_REWARD_H
#define EXEC_REWARD_H

#include <stddef.h>

#define EXEC_REWARD_DEFAULT "correct * (1 + min(speedup, cap))"

typedef struct {
    double correct, speedup, cap, ref_ms, cand_ms, launches, gpu_share, max_abs_err,
        max_rel_err;
} exec_reward_vars_t;

/* Evaluates formula with vars into *value. Returns 0 or ANV_EFORMAT with the reason in err. */
int exec_reward_eval(const char *formula,
                     const exec_reward_vars_t *vars,
                     double *value,
                     char *err,
                     size_t errlen);

#endif

/*  anv_config.h - configuration tables.

    Each binary declares one table of options (name, type, bounds, default, help, destination).
    anv_config_load() fills every destination in precedence order: defaults < `--config FILE`
    (lines of `name = value`, '#' comments) < `ANVIL_<NAME>` environment variables (upper case,
    '-' as '_') < command-line flags (`--name value`, `--name=value`, and `--name` / `--no-name`
    for booleans). Values are validated against type and bounds; the first problem is reported
    in `err` and the load fails. Arguments that are not options are returned as positionals.
    anv_config_log() logs the effective configuration once, at info level.
*/
#ifndef ANV_CONFIG_H
#define ANV_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum {
    ANV_CFG_STR,    /* dst: char ** (owned by the table; freed by anv_config_free) */
    ANV_CFG_INT,    /* dst: int64_t * */
    ANV_CFG_DOUBLE, /* dst: double * */
    ANV_CFG_BOOL,   /* dst: bool * */
} anv_cfg_type_t;

typedef struct {
    const char *name; /* "redis-url": flag --redis-url, env ANVIL_REDIS_URL */
    anv_cfg_type_t type;
    const char *def;  /* default, as text; NULL = empty string / 0 / false */
    double min, max;  /* bounds for INT and DOUBLE; ignored when min > max */
    const char *help;
    void *dst;
    bool secret;      /* not printed by anv_config_log */
} anv_cfg_opt_t;

typedef struct {
    int argc;         /* positional arguments, in order */
    char **argv;      /* borrowed from the argv given to anv_config_load */
    bool help;        /* --help or -h was given */
} anv_cfg_rest_t;

/* Loads the table from defaults, file, environment and argv (argv[0] is skipped).
   Returns 0, or ANV_ECONFIG with the reason in err. `rest` may be NULL when the binary takes
   no positionals (then a positional is an error). */
int anv_config_load(const anv_cfg_opt_t *opts,
                    size_t n_opts,
                    int argc,
                    char **argv,
                    anv_cfg_rest_t *rest,
                    char *err,
                    size_t errlen);
/* Prints "  --name TYPE  help (default X)" lines for --help. */
void anv_config_usage(const anv_cfg_opt_t *opts, size_t n_opts, FILE *out);
/* Logs every option and its value on one line. */
void anv_config_log(const anv_cfg_opt_t *opts, size_t n_opts);
/* Frees the strings the table owns and frees rest->argv. */
void anv_config_free(const anv_cfg_opt_t *opts, size_t n_opts, anv_cfg_rest_t *rest);

#endif

/*  cli_util.h - what every `anvil` subcommand shares: options, exit codes, messages.

    Each subcommand has one option table (anv_config: defaults < --config < ANVIL_<NAME> <
    flags) made of its own options plus the common ones filled in by cli_common_opts(). Its
    help text is printed by cli_help() with the exit codes below, which are the same for every
    subcommand. User-facing errors go to stderr as one line "anvil <cmd>: <reason>"; results
    go to stdout (tables for people, one JSON document or JSON lines with --json).
    SIGINT/SIGTERM set a flag (cli_interrupted) that the long-running loops poll; CZMQ's own
    handler is switched off so that it does not swallow them.
*/
#ifndef CLI_UTIL_H
#define CLI_UTIL_H

#include "anv_config.h"

#include <cjson/cJSON.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* exit codes (documented in every --help) */
#define CLI_EXIT_OK 0
#define CLI_EXIT_FAILED 1      /* the job ended failed or cancelled, or some work failed */
#define CLI_EXIT_USAGE 2       /* bad flags or arguments */
#define CLI_EXIT_INPUT 3       /* malformed input file, missing dataset */
#define CLI_EXIT_UNREACHABLE 4 /* the broker did not answer in time */
#define CLI_EXIT_REFUSED 5     /* the broker answered with an error */
#define CLI_EXIT_NOTFOUND 6    /* no such job */
#define CLI_EXIT_CLUSTER 7     /* the local cluster could not start or stop (binary, model, ...) */
#define CLI_EXIT_INTERRUPTED 130

#define CLI_DEFAULT_BROKER "tcp://127.0.0.1:5555"
#define CLI_MAX_OPTS 48

typedef struct cli_common_t {
    char *broker;   /* client endpoint; "" = the local cluster's, else CLI_DEFAULT_BROKER */
    char *curve_secret; /* own secret key file; "" = the local cluster's when it runs CURVE */
    char *curve_server; /* the broker's public key file; likewise */
    char *data;     /* local cluster directory; "" = ~/.local/share/anvil */
    double timeout; /* seconds to wait for one broker reply */
    bool json;
    char *log_level;
} cli_common_t;

typedef struct {
    const char *name;     /* "submit" */
    const char *synopsis; /* "FILE.jsonl [options]" */
    const char *summary;  /* one paragraph */
} cli_cmd_info_t;

/* Appends the common options (broker, curve-secret, curve-server, data, timeout, json,
   log-level) to opts at *n. */
void cli_common_opts(cli_common_t *c, anv_cfg_opt_t *opts, size_t *n);
/* Loads a subcommand's table from argv (argv[0] = the subcommand name). On --help prints the
   help and returns 0 with *exit_now = CLI_EXIT_OK; on a bad option prints the reason and sets
   *exit_now = CLI_EXIT_USAGE. Also applies log-level and resolves c->data and c->broker. */
void cli_load(const cli_cmd_info_t *info,
              const anv_cfg_opt_t *opts,
              size_t n,
              int argc,
              char **argv,
              anv_cfg_rest_t *rest,
              cli_common_t *c,
              int *exit_now);
void cli_help(const cli_cmd_info_t *info, const anv_cfg_opt_t *opts, size_t n, FILE *out);
/* True when the option was set by a flag (--name, --name=, --no-name) or by ANVIL_<NAME>. */
bool cli_opt_given(int argc, char **argv, const char *name);

/* "anvil <cmd>: <message>" on stderr. */
void cli_errorf(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Maps an ANV_E* / -errno code from a broker call to an exit code. */
int cli_exit_for(int rc);

/* The local cluster directory (~/.local/share/anvil unless given); caller frees. */
char *cli_data_dir(const char *given);
/* Makes a directory and its parents (mode 0700). Returns 0 or -errno. */
int cli_mkdir_p(const char *path);

extern volatile sig_atomic_t cli_interrupted;
void cli_signals_install(void);

/* Prints a cJSON document on one line to out (anv_jsonl_write) and deletes it. */
void cli_json_print(cJSON *doc, FILE *out);
/* "1h02m", "3m07s", "12s" */
void cli_fmt_duration(double seconds, char *buf, size_t len);

#endif

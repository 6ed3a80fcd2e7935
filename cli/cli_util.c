/*  cli_util.c - what every `anvil` subcommand shares: options, exit codes, messages.

    The broker endpoint is resolved once per command: --broker / ANVIL_BROKER when given, else
    the client endpoint recorded by `anvil up` in the data directory (so that commands reach the
    local cluster whatever ports it got), else CLI_DEFAULT_BROKER. The CURVE keys likewise:
    --curve-secret / --curve-server (or ANVIL_CURVE_SECRET / ANVIL_CURVE_SERVER) when given,
    else the client keys `anvil up --curve` recorded, when the broker is that cluster's.
*/
#include "cli_util.h"

#include "anv_error.h"
#include "anv_jsonl.h"
#include "anv_log.h"

#include <czmq.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

volatile sig_atomic_t cli_interrupted;

void cli_common_opts(cli_common_t *c, anv_cfg_opt_t *opts, size_t *n)
{
    const anv_cfg_opt_t common[] = {
        {"broker", ANV_CFG_STR, NULL, 0, -1,
         "broker client endpoint (default: the local cluster's, else " CLI_DEFAULT_BROKER ")",
         &c->broker, false},
        {"curve-secret", ANV_CFG_STR, NULL, 0, -1,
         "own CURVE secret key file (default: the local cluster's when it runs CURVE)",
         &c->curve_secret, false},
        {"curve-server", ANV_CFG_STR, NULL, 0, -1, "the broker's CURVE public key file",
         &c->curve_server, false},
        {"data", ANV_CFG_STR, NULL, 0, -1,
         "local cluster directory (default ~/.local/share/anvil)", &c->data, false},
        {"timeout", ANV_CFG_DOUBLE, "10", 0.1, 3600, "seconds to wait for a broker reply",
         &c->timeout, false},
        {"json", ANV_CFG_BOOL, NULL, 0, -1, "machine-readable output (JSON)", &c->json, false},
        {"log-level", ANV_CFG_STR, "warn", 0, -1, "error|warn|info|debug|trace", &c->log_level,
         false},
    };
    for (size_t i = 0; i < sizeof common / sizeof common[0]; i++)
        opts[(*n)++] = common[i];
}

void cli_help(const cli_cmd_info_t *info, const anv_cfg_opt_t *opts, size_t n, FILE *out)
{
    fprintf(out, "usage: anvil %s %s\n\n%s\n\noptions:\n", info->name, info->synopsis,
            info->summary);
    anv_config_usage(opts, n, out);
    fprintf(out, "\nexit codes:\n"
                 "  0    success\n"
                 "  1    the job ended failed or cancelled, or some of the work failed\n"
                 "  2    bad flags or arguments\n"
                 "  3    malformed input file or missing dataset (nothing was queued)\n"
                 "  4    the broker did not answer in time (is it running? try `anvil up`)\n"
                 "  5    the broker refused the request\n"
                 "  6    no such job\n"
                 "  7    the local cluster could not start or stop\n"
                 "  130  interrupted\n");
}

bool cli_opt_given(int argc, char **argv, const char *name)
{
    size_t len = strlen(name);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--"))
            break;
        if (strncmp(a, "--", 2))
            continue;
        a += 2;
        if (!strncmp(a, "no-", 3) && !strncmp(a + 3, name, len) && !a[3 + len])
            return true;
        if (!strncmp(a, name, len) && (!a[len] || a[len] == '='))
            return true;
    }
    char env[128] = "ANVIL_";
    size_t k = 6;
    for (const char *p = name; *p && k < sizeof env - 1; p++)
        env[k++] = *p == '-' ? '_' : (char)(*p >= 'a' && *p <= 'z' ? *p - 32 : *p);
    env[k] = 0;
    return getenv(env) != NULL;
}

char *cli_data_dir(const char *given)
{
    if (given && *given)
        return strdup(given);
    const char *xdg = getenv("XDG_DATA_HOME"), *home = getenv("HOME");
    char buf[4096];
    if (xdg && *xdg)
        snprintf(buf, sizeof buf, "%s/anvil", xdg);
    else
        snprintf(buf, sizeof buf, "%s/.local/share/anvil", home && *home ? home : "/tmp");
    return strdup(buf);
}

int cli_mkdir_p(const char *path)
{
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return -ENAMETOOLONG;
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = 0;
        if (mkdir(buf, 0700) < 0 && errno != EEXIST)
            return -errno;
        *p = '/';
    }
    if (mkdir(buf, 0700) < 0 && errno != EEXIST)
        return -errno;
    return 0;
}

/* A string `anvil up` recorded in DIR/run/cluster.json ("client_endpoint", ...), or NULL. */
static char *s_cluster_field(const char *data, const char *key)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/run/cluster.json", data);
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    char buf[65536];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    cJSON *o = cJSON_Parse(buf);
    const cJSON *ep = cJSON_GetObjectItemCaseSensitive(o, key);
    char *r = cJSON_IsString(ep) ? strdup(ep->valuestring) : NULL;
    cJSON_Delete(o);
    return r;
}

void cli_load(const cli_cmd_info_t *info, const anv_cfg_opt_t *opts, size_t n, int argc,
              char **argv, anv_cfg_rest_t *rest, cli_common_t *c, int *exit_now)
{
    char err[512];
    *exit_now = -1;
    if (anv_config_load(opts, n, argc, argv, rest, err, sizeof err) != 0) {
        cli_errorf(info->name, "%s (see anvil %s --help)", err, info->name);
        *exit_now = CLI_EXIT_USAGE;
        return;
    }
    if (rest && rest->help) {
        cli_help(info, opts, n, stdout);
        *exit_now = CLI_EXIT_OK;
        return;
    }
    int lvl = anv_log_level_parse(c->log_level ? c->log_level : "warn");
    if (lvl < 0) {
        cli_errorf(info->name, "unknown --log-level '%s'", c->log_level);
        *exit_now = CLI_EXIT_USAGE;
        return;
    }
    anv_log_set_level((anv_log_level_t)lvl);
    char *data = cli_data_dir(c->data);
    free(c->data);
    c->data = data;
    char *cluster_ep = data ? s_cluster_field(data, "client_endpoint") : NULL;
    if (!c->broker || !*c->broker) {
        free(c->broker);
        c->broker = cluster_ep ? strdup(cluster_ep) : strdup(CLI_DEFAULT_BROKER);
    }
    /* no keys given: the local cluster's, when that is the broker we talk to */
    if ((!c->curve_secret || !*c->curve_secret) && (!c->curve_server || !*c->curve_server) &&
        cluster_ep && c->broker && !strcmp(cluster_ep, c->broker)) {
        free(c->curve_secret);
        free(c->curve_server);
        c->curve_secret = s_cluster_field(data, "curve_secret");
        c->curve_server = s_cluster_field(data, "curve_server");
    }
    free(cluster_ep);
    if (!c->data || !c->broker) {
        cli_errorf(info->name, "out of memory");
        *exit_now = CLI_EXIT_FAILED;
    }
}

void cli_errorf(const char *cmd, const char *fmt, ...)
{
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "anvil %s: %s\n", cmd, msg);
}

int cli_exit_for(int rc)
{
    switch (rc) {
    case 0:
        return CLI_EXIT_OK;
    case ANV_ETIMEOUT:
        return CLI_EXIT_UNREACHABLE;
    case ANV_ENOTFOUND:
        return CLI_EXIT_NOTFOUND;
    case ANV_EFORMAT:
        return CLI_EXIT_INPUT;
    case ANV_ECONFIG:
        return CLI_EXIT_USAGE;
    case ANV_ECANCELLED:
        return CLI_EXIT_INTERRUPTED;
    default:
        return CLI_EXIT_REFUSED;
    }
}

static void s_on_signal(int sig)
{
    (void)sig;
    cli_interrupted = 1;
}

void cli_signals_install(void)
{
    zsys_handler_set(NULL); /* CZMQ would otherwise take SIGINT for itself */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = s_on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

void cli_json_print(cJSON *doc, FILE *out)
{
    char *s = doc ? cJSON_PrintUnformatted(doc) : NULL;
    if (s) {
        anv_jsonl_write(s, out);
        free(s);
    }
    cJSON_Delete(doc);
}

void cli_fmt_duration(double s, char *buf, size_t len)
{
    if (!(s >= 0) || s > 1e9) {
        snprintf(buf, len, "--");
        return;
    }
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(buf, len, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else if (t >= 60)
        snprintf(buf, len, "%ldm%02lds", t / 60, t % 60);
    else
        snprintf(buf, len, "%lds", t);
}

/*  anv_config.c - defaults < file < ANVIL_* environment < flags, validated.

    Every source goes through s_set(), which parses and checks one value against its option;
    so a bad value is reported the same way wherever it came from, naming the source.
*/
#include "anv_config.h"
#include "anv_error.h"
#include "anv_log.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const anv_cfg_opt_t *s_find(const anv_cfg_opt_t *opts, size_t n, const char *name,
                                   size_t len)
{
    for (size_t i = 0; i < n; i++)
        if (strlen(opts[i].name) == len && strncmp(opts[i].name, name, len) == 0)
            return &opts[i];
    /* file keys may use '_' where flags use '-' */
    for (size_t i = 0; i < n; i++) {
        if (strlen(opts[i].name) != len)
            continue;
        size_t k = 0;
        for (; k < len; k++) {
            char a = opts[i].name[k], b = name[k];
            if (!(a == b || (a == '-' && b == '_')))
                break;
        }
        if (k == len)
            return &opts[i];
    }
    return NULL;
}

static int s_parse_bool(const char *v, bool *out)
{
    if (!strcmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes") || !strcasecmp(v, "on"))
        *out = true;
    else if (!strcmp(v, "0") || !strcasecmp(v, "false") || !strcasecmp(v, "no") ||
             !strcasecmp(v, "off") || !*v)
        *out = false;
    else
        return -1;
    return 0;
}

static int s_set(const anv_cfg_opt_t *o, const char *v, const char *src, char *err, size_t errlen)
{
    if (!v)
        v = "";
    switch (o->type) {
    case ANV_CFG_STR: {
        char **dst = o->dst;
        char *copy = strdup(v);
        if (!copy)
            return -ENOMEM;
        free(*dst);
        *dst = copy;
        return 0;
    }
    case ANV_CFG_BOOL:
        if (s_parse_bool(v, o->dst) != 0) {
            snprintf(err, errlen, "%s: '%s' must be true or false, not '%s'", src, o->name, v);
            return ANV_ECONFIG;
        }
        return 0;
    case ANV_CFG_INT: {
        char *end;
        errno = 0;
        long long x = *v ? strtoll(v, &end, 0) : 0;
        if (*v && (errno || *end)) {
            snprintf(err, errlen, "%s: '%s' must be an integer, not '%s'", src, o->name, v);
            return ANV_ECONFIG;
        }
        if (o->min <= o->max && ((double)x < o->min || (double)x > o->max)) {
            snprintf(err, errlen, "%s: '%s' = %lld is outside [%.17g, %.17g]", src, o->name, x,
                     o->min, o->max);
            return ANV_ECONFIG;
        }
        *(int64_t *)o->dst = x;
        return 0;
    }
    case ANV_CFG_DOUBLE: {
        char *end;
        errno = 0;
        double x = *v ? strtod(v, &end) : 0;
        if (*v && (errno || *end || !isfinite(x))) {
            snprintf(err, errlen, "%s: '%s' must be a number, not '%s'", src, o->name, v);
            return ANV_ECONFIG;
        }
        if (o->min <= o->max && (x < o->min || x > o->max)) {
            snprintf(err, errlen, "%s: '%s' = %g is outside [%g, %g]", src, o->name, x, o->min,
                     o->max);
            return ANV_ECONFIG;
        }
        *(double *)o->dst = x;
        return 0;
    }
    }
    return ANV_EINTERNAL;
}

static char *s_trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1]))
        *--e = 0;
    return s;
}

static int s_load_file(const anv_cfg_opt_t *opts, size_t n, const char *path, char *err,
                       size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "cannot open config file '%s': %s", path, strerror(errno));
        return ANV_ECONFIG;
    }
    char line[4096];
    int rc = 0, lineno = 0;
    while (rc == 0 && fgets(line, sizeof line, f)) {
        lineno++;
        char *s = s_trim(line);
        if (!*s || *s == '#')
            continue;
        char *eq = strchr(s, '=');
        if (!eq) {
            snprintf(err, errlen, "%s:%d: expected 'name = value'", path, lineno);
            rc = ANV_ECONFIG;
            break;
        }
        *eq = 0;
        char *key = s_trim(s), *val = s_trim(eq + 1);
        size_t vl = strlen(val);
        if (vl >= 2 && val[0] == '"' && val[vl - 1] == '"') {
            val[vl - 1] = 0;
            val++;
        }
        const anv_cfg_opt_t *o = s_find(opts, n, key, strlen(key));
        if (!o) {
            snprintf(err, errlen, "%s:%d: unknown option '%s'", path, lineno, key);
            rc = ANV_ECONFIG;
            break;
        }
        char src[64];
        snprintf(src, sizeof src, "line %d of the config file", lineno);
        rc = s_set(o, val, src, err, errlen);
    }
    fclose(f);
    return rc;
}

int anv_config_load(const anv_cfg_opt_t *opts, size_t n, int argc, char **argv,
                    anv_cfg_rest_t *rest, char *err, size_t errlen)
{
    int rc;
    if (rest) {
        memset(rest, 0, sizeof *rest);
        rest->argv = calloc((size_t)argc + 1, sizeof(char *));
        if (!rest->argv)
            return -ENOMEM;
    }
    for (size_t i = 0; i < n; i++)
        if ((rc = s_set(&opts[i], opts[i].def, "default", err, errlen)) != 0)
            return rc;

    /* --config FILE is looked for first, since flags override the file */
    const char *file = getenv("ANVIL_CONFIG");
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--"))
            break;
        if (!strcmp(argv[i], "--config") && i + 1 < argc)
            file = argv[i + 1];
        else if (!strncmp(argv[i], "--config=", 9))
            file = argv[i] + 9;
    }
    if (file && *file && (rc = s_load_file(opts, n, file, err, errlen)) != 0)
        return rc;

    for (size_t i = 0; i < n; i++) {
        char env[128] = "ANVIL_";
        size_t k = 6;
        for (const char *p = opts[i].name; *p && k < sizeof env - 1; p++)
            env[k++] = *p == '-' ? '_' : (char)toupper((unsigned char)*p);
        env[k] = 0;
        const char *v = getenv(env);
        if (v && (rc = s_set(&opts[i], v, env, err, errlen)) != 0)
            return rc;
    }

    bool only_positional = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (only_positional || a[0] != '-' || !a[1]) {
            if (!rest) {
                snprintf(err, errlen, "unexpected argument '%s'", a);
                return ANV_ECONFIG;
            }
            rest->argv[rest->argc++] = argv[i];
            continue;
        }
        if (!strcmp(a, "--")) {
            only_positional = true;
            continue;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            if (rest)
                rest->help = true;
            continue;
        }
        if (strncmp(a, "--", 2) != 0) {
            snprintf(err, errlen, "unknown option '%s'", a);
            return ANV_ECONFIG;
        }
        const char *name = a + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        if (len == 6 && !strncmp(name, "config", 6)) {
            if (!eq)
                i++;
            continue;
        }
        const anv_cfg_opt_t *o = s_find(opts, n, name, len);
        const char *val = eq ? eq + 1 : NULL;
        if (!o && len > 3 && !strncmp(name, "no-", 3)) {
            o = s_find(opts, n, name + 3, len - 3);
            if (o && o->type == ANV_CFG_BOOL && !eq) {
                *(bool *)o->dst = false;
                continue;
            }
            o = NULL;
        }
        if (!o) {
            snprintf(err, errlen, "unknown option '--%.*s'", (int)len, name);
            return ANV_ECONFIG;
        }
        if (!val) {
            if (o->type == ANV_CFG_BOOL) {
                val = "true";
            } else if (i + 1 < argc) {
                val = argv[++i];
            } else {
                snprintf(err, errlen, "option '--%s' needs a value", o->name);
                return ANV_ECONFIG;
            }
        }
        char src[160];
        snprintf(src, sizeof src, "flag --%s", o->name);
        if ((rc = s_set(o, val, src, err, errlen)) != 0)
            return rc;
    }
    return 0;
}

void anv_config_usage(const anv_cfg_opt_t *opts, size_t n, FILE *out)
{
    static const char *types[] = {"TEXT", "INT", "NUM", ""};
    for (size_t i = 0; i < n; i++) {
        char flag[96];
        snprintf(flag, sizeof flag, "--%s %s", opts[i].name, types[opts[i].type]);
        fprintf(out, "  %-30s %s", flag, opts[i].help ? opts[i].help : "");
        if (opts[i].def && *opts[i].def)
            fprintf(out, " (default %s)", opts[i].def);
        fputc('\n', out);
    }
    fprintf(out, "  %-30s %s\n", "--config FILE", "read 'name = value' lines from FILE");
    fprintf(out, "  Every option can also be set as ANVIL_<NAME> in the environment.\n");
}

void anv_config_log(const anv_cfg_opt_t *opts, size_t n)
{
    char line[1900];
    size_t k = 0;
    line[0] = 0;
    for (size_t i = 0; i < n && k < sizeof line - 1; i++) {
        const anv_cfg_opt_t *o = &opts[i];
        int w = 0;
        size_t room = sizeof line - k;
        if (o->secret)
            w = snprintf(line + k, room, " %s=***", o->name);
        else if (o->type == ANV_CFG_STR)
            w = snprintf(line + k, room, " %s='%s'", o->name,
                         *(char **)o->dst ? *(char **)o->dst : "");
        else if (o->type == ANV_CFG_INT)
            w = snprintf(line + k, room, " %s=%lld", o->name, (long long)*(int64_t *)o->dst);
        else if (o->type == ANV_CFG_DOUBLE)
            w = snprintf(line + k, room, " %s=%g", o->name, *(double *)o->dst);
        else
            w = snprintf(line + k, room, " %s=%s", o->name, *(bool *)o->dst ? "true" : "false");
        k += (w > 0 && (size_t)w < room) ? (size_t)w : room - 1;
    }
    ANV_INFO("config%s", line);
}

void anv_config_free(const anv_cfg_opt_t *opts, size_t n, anv_cfg_rest_t *rest)
{
    for (size_t i = 0; i < n; i++)
        if (opts[i].type == ANV_CFG_STR) {
            char **dst = opts[i].dst;
            free(*dst);
            *dst = NULL;
        }
    if (rest) {
        free(rest->argv);
        rest->argv = NULL;
        rest->argc = 0;
    }
}

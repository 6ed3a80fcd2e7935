/*  cli_keys.c - `anvil keys gen`: CURVE key pairs for the broker, clients and workers.

    Generation itself is anv_curve_keygen() (zcert: libsodium through libzmq), shared with
    nothing else so that every key file Anvil makes has the same form. The allow/ copies are
    rewritten from the public files, never from the secret ones, and through a temporary file
    and rename, so a broker reading the directory never sees half a file.
*/
#include "cli_keys.h"

#include "anv_curve.h"
#include "anv_error.h"
#include "cli_cmd.h"
#include "cli_util.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *const s_set[] = {"broker", "client", "worker"};

/* Copies the public file DIR/NAME.key to DIR/allow/NAME.key. */
static int s_allow_copy(const char *dir, const char *name, char *err, size_t errlen)
{
    char src[PATH_MAX], dst[PATH_MAX], tmp[PATH_MAX + 8], buf[4096];
    snprintf(src, sizeof src, "%s/%s.key", dir, name);
    snprintf(dst, sizeof dst, "%s/allow/%s.key", dir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp", dst);
    FILE *in = fopen(src, "r"), *out = in ? fopen(tmp, "w") : NULL;
    int rc = 0;
    size_t n;
    if (!in || !out)
        rc = -errno;
    while (!rc && (n = fread(buf, 1, sizeof buf, in)) > 0)
        if (fwrite(buf, 1, n, out) != n)
            rc = -errno;
    if (in)
        fclose(in);
    if (out && fclose(out) && !rc)
        rc = -errno;
    if (!rc && rename(tmp, dst) != 0)
        rc = -errno;
    if (rc) {
        snprintf(err, errlen, "cannot copy '%s' to '%s': %s", src, dst, strerror(-rc));
        unlink(tmp);
    }
    return rc;
}

int cli_keys_make_set(const char *dir, bool force, bool reuse, char *err, size_t errlen)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/allow", dir);
    int rc = cli_mkdir_p(path);
    if (rc) {
        snprintf(err, errlen, "cannot create '%s': %s", path, strerror(-rc));
        return rc;
    }
    for (size_t i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s.key_secret", dir, s_set[i]);
        char pub[PATH_MAX + 16];
        snprintf(pub, sizeof pub, "%s/%s.key", dir, s_set[i]);
        if (reuse && !force && access(path, R_OK) == 0 && access(pub, R_OK) == 0)
            continue;
        rc = anv_curve_keygen(dir, s_set[i], force, NULL, err, errlen);
        if (rc)
            return rc;
    }
    for (size_t i = 1; i < 3; i++)
        if ((rc = s_allow_copy(dir, s_set[i], err, errlen)) != 0)
            return rc;
    return 0;
}

static int s_print(const char *dir, const char *name, bool json, cJSON *arr)
{
    char path[PATH_MAX], pub[ANV_CURVE_KEY_TXT], err[512];
    snprintf(path, sizeof path, "%s/%s.key", dir, name);
    if (anv_curve_read_public(path, pub, err, sizeof err) != 0) {
        cli_errorf("keys", "%s", err);
        return -1;
    }
    if (json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", name);
        cJSON_AddStringToObject(o, "public_file", path);
        strncat(path, "_secret", sizeof path - strlen(path) - 1);
        cJSON_AddStringToObject(o, "secret_file", path);
        cJSON_AddStringToObject(o, "public_key", pub);
        cJSON_AddItemToArray(arr, o);
    } else {
        printf("%-8s %s  (%s/%s.key, secret %s/%s.key_secret)\n", name, pub, dir, name, dir,
               name);
    }
    return 0;
}

int cli_cmd_keys(int argc, char **argv)
{
    static const cli_cmd_info_t info = {
        "keys", "gen --out DIR (--name NAME | --all) [--force]",
        "Makes CURVE key pairs (CZMQ zcert files): NAME.key is the public key, to copy where "
        "peers need it; NAME.key_secret (mode 0600) stays on the host that uses it. --all "
        "makes the set broker, client and worker, and DIR/allow with copies of the client and "
        "worker public keys. Run the broker with --curve-secret DIR/broker.key_secret "
        "--curve-allow DIR/allow; workers and clients with --curve-secret DIR/worker.key_secret "
        "(or client.key_secret) and --curve-server DIR/broker.key. More peers: `anvil keys gen "
        "--out DIR --name NAME`, then copy NAME.key into the broker's allow directory (read "
        "again within a second, no restart). Existing keys are never replaced without --force."};
    cli_common_t c = {0};
    char *out = NULL, *name = NULL;
    bool all = false, force = false;
    anv_cfg_opt_t opts[CLI_MAX_OPTS] = {
        {"out", ANV_CFG_STR, NULL, 0, -1, "directory to write the key files to", &out, false},
        {"name", ANV_CFG_STR, NULL, 0, -1, "one key pair: NAME.key and NAME.key_secret", &name,
         false},
        {"all", ANV_CFG_BOOL, "false", 0, -1, "broker, client and worker pairs and DIR/allow",
         &all, false},
        {"force", ANV_CFG_BOOL, "false", 0, -1, "replace existing key files", &force, false},
    };
    size_t n = 4;
    cli_common_opts(&c, opts, &n);
    anv_cfg_rest_t rest;
    int code;
    char err[512];
    cli_load(&info, opts, n, argc, argv, &rest, &c, &code);
    if (code >= 0)
        goto out;
    code = CLI_EXIT_USAGE;
    if (rest.argc != 1 || strcmp(rest.argv[0], "gen")) {
        cli_errorf(info.name, "usage: anvil keys %s", info.synopsis);
        goto out;
    }
    if (!out || !*out) {
        cli_errorf(info.name, "--out DIR is required");
        goto out;
    }
    if (all == (name && *name)) {
        cli_errorf(info.name, "give either --name NAME or --all");
        goto out;
    }
    code = CLI_EXIT_FAILED;
    int rc = cli_mkdir_p(out);
    if (rc) {
        cli_errorf(info.name, "cannot create '%s': %s", out, strerror(-rc));
        goto out;
    }
    rc = all ? cli_keys_make_set(out, force, false, err, sizeof err)
             : anv_curve_keygen(out, name, force, NULL, err, sizeof err);
    if (rc) {
        cli_errorf(info.name, "%s", err);
        code = rc == ANV_ECONFIG ? CLI_EXIT_USAGE : CLI_EXIT_FAILED;
        goto out;
    }
    cJSON *arr = c.json ? cJSON_CreateArray() : NULL;
    code = CLI_EXIT_OK;
    for (size_t i = 0; i < (all ? 3 : 1); i++)
        if (s_print(out, all ? s_set[i] : name, c.json, arr))
            code = CLI_EXIT_FAILED;
    if (c.json)
        cli_json_print(arr, stdout);
    else if (all)
        printf("allow-list for the broker: %s/allow (client.key, worker.key)\n", out);
out:
    anv_config_free(opts, n, &rest);
    return code;
}

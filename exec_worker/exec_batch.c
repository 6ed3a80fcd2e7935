/*  exec_batch.c - parse one line of a --score-batch file (see exec_batch.h).

    The line is parsed with its length (a NUL inside it is an error, not an early end), and
    paths are built on the heap: a long path is passed on whole and fails to open with its own
    error, instead of being cut to PATH_MAX and naming another file.
*/
#include "exec_batch.h"

#include "anv_error.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *s_join(const char *dir, const char *path)
{
    bool abs = path[0] == '/';
    size_t n = (abs ? 0 : strlen(dir) + 1) + strlen(path) + 1;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s%s%s", abs ? "" : dir, abs ? "" : "/", path);
    return p;
}

int exec_batch_parse(const char *line, size_t len, const char *dir, exec_batch_item_t *item,
                     char *err, size_t errlen)
{
    memset(item, 0, sizeof *item);
    item->static_checks = -1;
    size_t i = 0;
    while (i < len && strchr(" \t\r\n", line[i]) && line[i])
        i++;
    if (i == len)
        return 0;
    int rc = ANV_EFORMAT;
    cJSON *j = cJSON_ParseWithLength(line, len);
    if (!cJSON_IsObject(j)) {
        snprintf(err, errlen, "not a JSON object");
        goto out;
    }
    const cJSON *k = cJSON_GetObjectItem(j, "kind"), *t = cJSON_GetObjectItem(j, "task");
    const cJSON *c = cJSON_GetObjectItem(j, "candidate"), *g = cJSON_GetObjectItem(j, "globals");
    const cJSON *st = cJSON_GetObjectItem(j, "static_checks");
    if (!cJSON_IsString(t) || !cJSON_IsString(c) || !t->valuestring[0] || !c->valuestring[0]) {
        snprintf(err, errlen, "needs \"task\" and \"candidate\"");
        goto out;
    }
    if (k && !cJSON_IsString(k)) {
        snprintf(err, errlen, "\"kind\" must be a string");
        goto out;
    }
    rc = -ENOMEM;
    item->task_path = s_join(dir, t->valuestring);
    item->cand_path = s_join(dir, c->valuestring);
    item->kind = k ? strdup(k->valuestring) : NULL;
    item->globals = cJSON_IsObject(g) ? cJSON_PrintUnformatted(g) : NULL;
    if (!item->task_path || !item->cand_path || (k && !item->kind) ||
        (cJSON_IsObject(g) && !item->globals))
        goto out;
    if (cJSON_IsBool(st))
        item->static_checks = cJSON_IsTrue(st);
    rc = 1;
out:
    cJSON_Delete(j);
    if (rc != 1)
        exec_batch_item_release(item);
    return rc;
}

void exec_batch_item_release(exec_batch_item_t *item)
{
    free(item->kind);
    free(item->task_path);
    free(item->cand_path);
    free(item->globals);
    memset(item, 0, sizeof *item);
    item->static_checks = -1;
}

/*  fuzz_util.c - scratch directory and input splitting for the fuzz targets (see fuzz_util.h).
*/
#include "fuzz_util.h"

#include "anv_log.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char s_dir[512];

static void s_cleanup(void)
{
    DIR *d = opendir(s_dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        unlink(fuzz_path(e->d_name));
    }
    if (d)
        closedir(d);
    rmdir(s_dir);
}

void fuzz_quiet(void)
{
    anv_log_set_level(ANV_LOG_ERROR);
}

const char *fuzz_dir(void)
{
    if (s_dir[0])
        return s_dir;
    const char *tmp = getenv("TMPDIR");
    snprintf(s_dir, sizeof s_dir, "%s/anvil-fuzz-in.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(s_dir)) {
        perror("mkdtemp");
        abort();
    }
    atexit(s_cleanup);
    return s_dir;
}

const char *fuzz_path(const char *name)
{
    static char path[1024];
    snprintf(path, sizeof path, "%s/%s", fuzz_dir(), name);
    return path;
}

void fuzz_write(const char *name, const uint8_t *data, size_t len)
{
    const char *path = fuzz_path(name);
    if (!data) {
        unlink(path);
        return;
    }
    FILE *f = fopen(path, "wb");
    if (!f || (len && fwrite(data, 1, len, f) != len) || fclose(f) != 0) {
        perror(path);
        abort();
    }
}

void fuzz_split(const uint8_t *data, size_t size, size_t *alen, const uint8_t **b, size_t *blen)
{
    const uint8_t *nul = memchr(data, 0, size);
    *alen = nul ? (size_t)(nul - data) : size;
    *b = nul ? nul + 1 : NULL;
    *blen = nul ? size - *alen - 1 : 0;
}

char *fuzz_strndup(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (!s)
        abort();
    memcpy(s, data, size);
    s[size] = 0;
    return s;
}

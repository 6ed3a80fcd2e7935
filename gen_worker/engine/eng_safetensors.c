/*  eng_safetensors.c - safetensors header parsing and validation over an mmap'd file.

    The header is parsed once with cJSON into a flat array of tensors sorted by name, so that
    lookups are a binary search. Validation order follows the file: length prefix, JSON,
    per-tensor fields, then bounds; the first problem found is reported with the tensor name.
*/
#include "eng_safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define S_MAX_HEADER (100u << 20) /* the format's own limit is 100 MB */

struct eng_st_file {
    void *map; /* mmap'd image, or NULL when parsing a caller's buffer */
    size_t map_len;
    int n;
    eng_st_tensor_t *tensors;
    char **names;
};

static int s_dtype(const char *s, eng_dtype_t *out)
{
    if (strcmp(s, "BF16") == 0)
        *out = ENG_DTYPE_BF16;
    else if (strcmp(s, "F16") == 0)
        *out = ENG_DTYPE_F16;
    else if (strcmp(s, "F32") == 0)
        *out = ENG_DTYPE_F32;
    else
        return -1;
    return 0;
}

static int s_cmp(const void *a, const void *b)
{
    return strcmp(((const eng_st_tensor_t *)a)->name, ((const eng_st_tensor_t *)b)->name);
}

/* Reads a non-negative integer JSON number exactly (doubles hold integers to 2^53). */
static int s_uint(const cJSON *j, uint64_t *out)
{
    if (!cJSON_IsNumber(j) || j->valuedouble < 0 || j->valuedouble > 9007199254740992.0 ||
        j->valuedouble != (double)(uint64_t)j->valuedouble)
        return -1;
    *out = (uint64_t)j->valuedouble;
    return 0;
}

static int s_tensor(const cJSON *item,
                    const uint8_t *data,
                    uint64_t data_len,
                    eng_st_tensor_t *t,
                    char *err,
                    size_t errlen)
{
    const char *name = item->string;
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(item, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
    if (!cJSON_IsObject(item) || !cJSON_IsString(dt) || !cJSON_IsArray(shape) ||
        !cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2) {
        snprintf(err, errlen, "tensor '%s': missing or malformed dtype/shape/data_offsets", name);
        return -1;
    }
    if (s_dtype(dt->valuestring, &t->dtype)) {
        snprintf(err, errlen, "tensor '%s': unsupported dtype '%s' (supported: BF16, F16, F32)",
                 name, dt->valuestring);
        return -1;
    }
    int nd = cJSON_GetArraySize(shape);
    if (nd > ENG_ST_MAX_DIMS) {
        snprintf(err, errlen, "tensor '%s': %d dimensions (at most %d)", name, nd, ENG_ST_MAX_DIMS);
        return -1;
    }
    uint64_t elems = 1;
    t->ndim = nd;
    for (int i = 0; i < nd; i++) {
        uint64_t d;
        if (s_uint(cJSON_GetArrayItem(shape, i), &d) || d > (1ull << 40) ||
            (d && elems > UINT64_MAX / d)) {
            snprintf(err, errlen, "tensor '%s': bad shape", name);
            return -1;
        }
        elems *= d;
        t->shape[i] = (int64_t)d;
    }
    uint64_t begin, end;
    if (s_uint(cJSON_GetArrayItem(offs, 0), &begin) || s_uint(cJSON_GetArrayItem(offs, 1), &end) ||
        end < begin) {
        snprintf(err, errlen, "tensor '%s': bad data_offsets", name);
        return -1;
    }
    if (end > data_len) {
        snprintf(err, errlen,
                 "tensor '%s': data ends at byte %llu but the file holds %llu data bytes "
                 "(truncated file?)",
                 name, (unsigned long long)end, (unsigned long long)data_len);
        return -1;
    }
    if (elems > UINT64_MAX / 4 || end - begin != elems * eng_dtype_size(t->dtype)) {
        snprintf(err, errlen, "tensor '%s': %llu data bytes do not match its shape and dtype", name,
                 (unsigned long long)(end - begin));
        return -1;
    }
    t->data = data + begin;
    t->nbytes = (size_t)(end - begin);
    return 0;
}

eng_st_file_t *eng_st_parse(const void *buf, size_t len, char *err, size_t errlen)
{
    eng_st_file_t *self = NULL;
    cJSON *root = NULL;
    const uint8_t *p = buf;
    if (len < 8) {
        snprintf(err, errlen, "file of %zu bytes is too short for a safetensors header", len);
        goto fail;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | p[i];
    if (hlen > S_MAX_HEADER || hlen > len - 8) {
        snprintf(err, errlen, "header length %llu does not fit the file of %zu bytes",
                 (unsigned long long)hlen, len);
        goto fail;
    }
    root = cJSON_ParseWithLength((const char *)p + 8, (size_t)hlen);
    if (!cJSON_IsObject(root)) {
        snprintf(err, errlen, "header is not a JSON object");
        goto fail;
    }
    self = calloc(1, sizeof(*self));
    if (!self)
        goto nomem;
    int cap = cJSON_GetArraySize(root);
    self->tensors = calloc((size_t)cap + 1, sizeof(eng_st_tensor_t));
    self->names = calloc((size_t)cap + 1, sizeof(char *));
    if (!self->tensors || !self->names)
        goto nomem;
    const uint8_t *data = p + 8 + hlen;
    uint64_t data_len = len - 8 - hlen;
    const cJSON *item;
    cJSON_ArrayForEach(item, root)
    {
        if (strcmp(item->string, "__metadata__") == 0)
            continue;
        eng_st_tensor_t *t = &self->tensors[self->n];
        if (s_tensor(item, data, data_len, t, err, errlen))
            goto fail;
        self->names[self->n] = strdup(item->string);
        if (!self->names[self->n])
            goto nomem;
        t->name = self->names[self->n];
        self->n++;
    }
    qsort(self->tensors, (size_t)self->n, sizeof(eng_st_tensor_t), s_cmp);
    for (int i = 1; i < self->n; i++)
        if (strcmp(self->tensors[i - 1].name, self->tensors[i].name) == 0) {
            snprintf(err, errlen, "tensor '%s' appears twice", self->tensors[i].name);
            goto fail;
        }
    cJSON_Delete(root);
    return self;
nomem:
    snprintf(err, errlen, "out of memory");
fail:
    cJSON_Delete(root);
    eng_st_destroy(&self);
    return NULL;
}

eng_st_file_t *eng_st_open(const char *path, char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, errlen, "cannot open '%s': %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "'%s' is not a regular file", path);
        close(fd);
        return NULL;
    }
    size_t len = (size_t)st.st_size;
    void *map = len ? mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
    close(fd);
    if (map == MAP_FAILED) {
        snprintf(err, errlen, "cannot map '%s' (%zu bytes): %s", path, len,
                 len ? strerror(errno) : "empty file");
        return NULL;
    }
    char inner[256];
    eng_st_file_t *self = eng_st_parse(map, len, inner, sizeof(inner));
    if (!self) {
        snprintf(err, errlen, "'%s': %s", path, inner);
        munmap(map, len);
        return NULL;
    }
    self->map = map;
    self->map_len = len;
    return self;
}

void eng_st_destroy(eng_st_file_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    eng_st_file_t *self = *self_p;
    if (self->names)
        for (int i = 0; i < self->n + 1; i++)
            free(self->names[i]);
    free(self->names);
    free(self->tensors);
    if (self->map)
        munmap(self->map, self->map_len);
    free(self);
    *self_p = NULL;
}

int eng_st_count(const eng_st_file_t *self)
{
    return self->n;
}

const eng_st_tensor_t *eng_st_at(const eng_st_file_t *self, int i)
{
    return i >= 0 && i < self->n ? &self->tensors[i] : NULL;
}

const eng_st_tensor_t *eng_st_find(const eng_st_file_t *self, const char *name)
{
    eng_st_tensor_t key = {.name = name};
    return bsearch(&key, self->tensors, (size_t)self->n, sizeof(eng_st_tensor_t), s_cmp);
}

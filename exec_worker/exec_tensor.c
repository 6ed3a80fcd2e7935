/*  exec_tensor.c - mapped, validated reader of harness tensor records.

    Design: one mmap of the whole file; a first pass validates every record (magic, dtype,
    ndim, element count times item size equals nbytes, no overflow, everything inside the
    file) and records the leaves; exec_leaf_get() converts one stored scalar to double (fp16,
    bf16 by bit manipulation, no hardware dependence).
*/
#include "exec_tensor.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define EXEC_TENSOR_MAGIC 0x54564E41u
#define EXEC_TENSOR_MAX_LEAVES 65536

struct exec_tensors_t {
    uint8_t *map;
    size_t size;
    exec_leaf_t *leaves;
    size_t n;
};

static const struct {
    const char *name;
    int item; /* bytes per stored scalar */
    int lanes;
    bool is_float;
} s_dt[EXEC_DT_COUNT] = {
    [EXEC_DT_F32] = {"float32", 4, 1, true},      [EXEC_DT_F64] = {"float64", 8, 1, true},
    [EXEC_DT_F16] = {"float16", 2, 1, true},      [EXEC_DT_BF16] = {"bfloat16", 2, 1, true},
    [EXEC_DT_I8] = {"int8", 1, 1, false},         [EXEC_DT_I16] = {"int16", 2, 1, false},
    [EXEC_DT_I32] = {"int32", 4, 1, false},       [EXEC_DT_I64] = {"int64", 8, 1, false},
    [EXEC_DT_U8] = {"uint8", 1, 1, false},        [EXEC_DT_BOOL] = {"bool", 1, 1, false},
    [EXEC_DT_STR] = {"str", 1, 1, false},         [EXEC_DT_NONE] = {"none", 0, 1, false},
    [EXEC_DT_C64] = {"complex64", 4, 2, true},    [EXEC_DT_C128] = {"complex128", 8, 2, true},
    [EXEC_DT_F8E4M3] = {"float8_e4m3fn", 4, 1, true},
    [EXEC_DT_F8E5M2] = {"float8_e5m2", 4, 1, true},
};

static bool s_valid_dtype(uint32_t dt)
{
    return dt >= 1 && dt < EXEC_DT_COUNT;
}

int exec_dtype_lanes(uint32_t dtype)
{
    return s_valid_dtype(dtype) ? s_dt[dtype].lanes : 1;
}

bool exec_dtype_is_float(uint32_t dtype)
{
    return s_valid_dtype(dtype) && s_dt[dtype].is_float;
}

const char *exec_dtype_name(uint32_t dtype)
{
    return s_valid_dtype(dtype) ? s_dt[dtype].name : "unknown";
}

static uint64_t s_rd64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static uint32_t s_rd32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static int s_parse(exec_tensors_t *self, char *err, size_t errlen)
{
    size_t off = 0, cap = 0;
    while (off < self->size) {
        const uint8_t *p = self->map + off;
        if (self->size - off < 24) {
            snprintf(err, errlen, "truncated record header at byte %zu", off);
            return -EINVAL;
        }
        uint32_t magic = s_rd32(p), dt = s_rd32(p + 4), ndim = s_rd32(p + 8);
        uint32_t keylen = s_rd32(p + 12);
        uint64_t nbytes = s_rd64(p + 16);
        if (magic != EXEC_TENSOR_MAGIC || !s_valid_dtype(dt) || ndim > EXEC_TENSOR_MAX_NDIM ||
            keylen > 255) {
            snprintf(err, errlen, "bad record header at byte %zu", off);
            return -EINVAL;
        }
        size_t head = 24 + 8 * (size_t)ndim + keylen;
        head += (8 - head % 8) % 8;
        if (self->size - off < head || nbytes > self->size - off - head) {
            snprintf(err, errlen, "record at byte %zu runs past the end of the file", off);
            return -EINVAL;
        }
        if (self->n == EXEC_TENSOR_MAX_LEAVES) {
            snprintf(err, errlen, "more than %d leaves", EXEC_TENSOR_MAX_LEAVES);
            return -EINVAL;
        }
        if (self->n == cap) {
            cap = cap ? cap * 2 : 16;
            exec_leaf_t *nl = realloc(self->leaves, cap * sizeof *nl);
            if (!nl)
                return -ENOMEM;
            self->leaves = nl;
        }
        exec_leaf_t *l = &self->leaves[self->n];
        memset(l, 0, sizeof *l);
        l->dtype = dt;
        l->ndim = ndim;
        l->keylen = keylen;
        l->key = (const char *)p + 24 + 8 * ndim;
        l->nbytes = nbytes;
        l->data = p + head;
        uint64_t numel = 1;
        for (uint32_t d = 0; d < ndim; d++) {
            int64_t s = (int64_t)s_rd64(p + 24 + 8 * d);
            if (s < 0 || (s > 0 && numel > UINT64_MAX / (uint64_t)s)) {
                snprintf(err, errlen, "bad shape in record at byte %zu", off);
                return -EINVAL;
            }
            l->shape[d] = s;
            numel *= (uint64_t)s;
        }
        l->numel = numel;
        if (dt == EXEC_DT_STR) {
            l->numel = nbytes;
        } else if (dt == EXEC_DT_NONE) {
            if (nbytes) {
                snprintf(err, errlen, "None record with data at byte %zu", off);
                return -EINVAL;
            }
        } else {
            uint64_t per = (uint64_t)s_dt[dt].item * (uint64_t)s_dt[dt].lanes;
            if (numel > UINT64_MAX / per || numel * per != nbytes) {
                snprintf(err, errlen, "record '%.*s': %llu bytes for %llu elements of %s",
                         (int)keylen, l->key, (unsigned long long)nbytes,
                         (unsigned long long)numel, s_dt[dt].name);
                return -EINVAL;
            }
        }
        self->n++;
        uint64_t adv = head + nbytes + (8 - nbytes % 8) % 8;
        if (adv > self->size - off)
            adv = self->size - off;
        off += adv;
    }
    return 0;
}

exec_tensors_t *exec_tensors_open(const char *path, char *err, size_t errlen)
{
    exec_tensors_t *self = calloc(1, sizeof *self);
    int fd = -1;
    struct stat st;
    if (!self) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0 || fstat(fd, &st) != 0) {
        snprintf(err, errlen, "cannot open '%s': %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "'%s' is not a regular file", path);
        goto fail;
    }
    self->size = (size_t)st.st_size;
    if (self->size) {
        /* populated at once: one call maps every page, instead of a fault per 4 KiB page
           during the comparison (a quarter of its time on a 256 MiB output) */
        self->map = mmap(NULL, self->size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
        if (self->map == MAP_FAILED) {
            self->map = NULL;
            snprintf(err, errlen, "cannot map '%s': %s", path, strerror(errno));
            goto fail;
        }
    }
    close(fd);
    fd = -1;
    if (s_parse(self, err, errlen) != 0)
        goto fail;
    if (self->n == 0) {
        snprintf(err, errlen, "'%s' holds no output", path);
        goto fail;
    }
    return self;
fail:
    if (fd >= 0)
        close(fd);
    exec_tensors_destroy(&self);
    return NULL;
}

void exec_tensors_destroy(exec_tensors_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    exec_tensors_t *self = *self_p;
    if (self->map)
        munmap(self->map, self->size);
    free(self->leaves);
    free(self);
    *self_p = NULL;
}

size_t exec_tensors_count(const exec_tensors_t *self)
{
    return self ? self->n : 0;
}

const exec_leaf_t *exec_tensors_leaf(const exec_tensors_t *self, size_t i)
{
    return self && i < self->n ? &self->leaves[i] : NULL;
}

static double s_half(uint16_t h)
{
    uint32_t sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    double v;
    if (exp == 0)
        v = man * 0x1p-24;
    else if (exp == 31)
        v = man ? (double)NAN : (double)INFINITY;
    else
        v = (1.0 + man / 1024.0) * __builtin_ldexp(1.0, (int)exp - 15);
    return sign ? -v : v;
}

/* the two float layouts the comparison reads in bulk (exec_leaf_read) and one at a time */
static inline double s_f32(const uint8_t *p, uint64_t j)
{
    float f;
    memcpy(&f, p + 4 * j, 4);
    return f;
}

static inline double s_bf16(const uint8_t *p, uint64_t j)
{
    uint16_t h;
    memcpy(&h, p + 2 * j, 2);
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

double exec_leaf_get(const exec_leaf_t *l, uint64_t j)
{
    const uint8_t *p = l->data;
    switch (l->dtype) {
    case EXEC_DT_F32:
    case EXEC_DT_C64:
    case EXEC_DT_F8E4M3:
    case EXEC_DT_F8E5M2:
        return s_f32(p, j);
    case EXEC_DT_F64:
    case EXEC_DT_C128: {
        double d;
        memcpy(&d, p + 8 * j, 8);
        return d;
    }
    case EXEC_DT_F16: {
        uint16_t h;
        memcpy(&h, p + 2 * j, 2);
        return s_half(h);
    }
    case EXEC_DT_BF16:
        return s_bf16(p, j);
    case EXEC_DT_I8:
        return (int8_t)p[j];
    case EXEC_DT_U8:
    case EXEC_DT_BOOL:
    case EXEC_DT_STR:
        return p[j];
    case EXEC_DT_I16: {
        int16_t v;
        memcpy(&v, p + 2 * j, 2);
        return v;
    }
    case EXEC_DT_I32: {
        int32_t v;
        memcpy(&v, p + 4 * j, 4);
        return v;
    }
    case EXEC_DT_I64: {
        int64_t v;
        memcpy(&v, p + 8 * j, 8);
        return (double)v;
    }
    default:
        return NAN;
    }
}

void exec_leaf_read(const exec_leaf_t *l, uint64_t j0, uint64_t n, double *dst)
{
    const uint8_t *p = l->data;
    switch (l->dtype) {
    case EXEC_DT_F32:
    case EXEC_DT_C64:
    case EXEC_DT_F8E4M3:
    case EXEC_DT_F8E5M2:
        for (uint64_t i = 0; i < n; i++)
            dst[i] = s_f32(p, j0 + i);
        return;
    case EXEC_DT_F64:
    case EXEC_DT_C128:
        memcpy(dst, p + 8 * j0, 8 * n);
        return;
    case EXEC_DT_BF16:
        for (uint64_t i = 0; i < n; i++)
            dst[i] = s_bf16(p, j0 + i);
        return;
    default:
        for (uint64_t i = 0; i < n; i++)
            dst[i] = exec_leaf_get(l, j0 + i);
    }
}

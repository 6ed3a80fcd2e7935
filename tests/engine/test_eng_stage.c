/*  test_eng_stage.c - the staging ring: contents land intact whatever the sizes, a buffer is
    never refilled before its transfer completed, errors of the callbacks come back.

    The fake device completes a transfer only when wait() is called for its buffer (the
    bytes are read from the staging buffer then), so a copier that reused a buffer too early
    would deliver the wrong bytes. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* cmocka needs the headers above first */
#include <cmocka.h>

#include "eng_safetensors.h"
#include "eng_stage.h"

typedef struct {
    void *dst[ENG_STAGE_MAX_BUFS];
    size_t n[ENG_STAGE_MAX_BUFS];
    int in_flight[ENG_STAGE_MAX_BUFS];
    void **bufs;
    int submits, waits, fail_at;
} s_dev_t;

static int s_submit(void *ctx, int b, void *dst, size_t n)
{
    s_dev_t *d = ctx;
    if (d->fail_at && ++d->submits == d->fail_at)
        return -EIO;
    if (!d->fail_at)
        d->submits++;
    assert_false(d->in_flight[b]); /* never submitted twice without a wait */
    d->dst[b] = dst, d->n[b] = n, d->in_flight[b] = 1;
    return 0;
}

static int s_wait(void *ctx, int b)
{
    s_dev_t *d = ctx;
    d->waits++;
    if (d->in_flight[b])
        memcpy(d->dst[b], d->bufs[b], d->n[b]); /* the transfer "completes" now */
    d->in_flight[b] = 0;
    return 0;
}

static void s_ring(eng_stage_t *s, s_dev_t *d, int n_bufs, size_t buf_bytes)
{
    memset(s, 0, sizeof(*s));
    memset(d, 0, sizeof(*d));
    for (int i = 0; i < n_bufs; i++)
        s->bufs[i] = malloc(buf_bytes);
    s->n_bufs = n_bufs, s->buf_bytes = buf_bytes;
    s->submit = s_submit, s->wait = s_wait, s->ctx = d;
    d->bufs = s->bufs;
    assert_int_equal(eng_stage_init(s), 0);
}

static void s_ring_free(eng_stage_t *s)
{
    for (int i = 0; i < s->n_bufs; i++)
        free(s->bufs[i]);
}

static void test_sizes(void **state)
{
    (void)state;
    size_t sizes[] = {0, 1, 7, 64, 65, 1000, 4096, 10007};
    for (int nb = 1; nb <= 3; nb++) {
        eng_stage_t s;
        s_dev_t d;
        s_ring(&s, &d, nb, 64);
        size_t total = 0;
        for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
            size_t n = sizes[i];
            uint8_t *src = malloc(n + 1), *dst = calloc(1, n + 1);
            for (size_t k = 0; k < n; k++)
                src[k] = (uint8_t)(k * 131 + i * 7 + 1);
            assert_int_equal(eng_stage_copy(&s, dst, src, n), 0);
            /* fill the source with garbage: the copier must have read it already */
            memset(src, 0xee, n);
            assert_int_equal(eng_stage_finish(&s), 0);
            for (size_t k = 0; k < n; k++)
                assert_int_equal(dst[k], (uint8_t)(k * 131 + i * 7 + 1));
            total += n;
            free(src), free(dst);
        }
        assert_int_equal(s.bytes, total);
        assert_int_equal(s.pending, 0);
        s_ring_free(&s);
    }
}

/* many tensors back to back without a finish between them share the ring */
static void test_back_to_back(void **state)
{
    (void)state;
    eng_stage_t s;
    s_dev_t d;
    s_ring(&s, &d, 2, 100);
    enum { T = 50 };
    uint8_t *src[T], *dst[T];
    size_t n[T];
    for (int t = 0; t < T; t++) {
        n[t] = (size_t)(t * 37) % 450 + 1;
        src[t] = malloc(n[t]), dst[t] = calloc(1, n[t]);
        for (size_t k = 0; k < n[t]; k++)
            src[t][k] = (uint8_t)(t + k);
        assert_int_equal(eng_stage_copy(&s, dst[t], src[t], n[t]), 0);
    }
    assert_int_equal(eng_stage_finish(&s), 0);
    for (int t = 0; t < T; t++) {
        assert_memory_equal(dst[t], src[t], n[t]);
        free(src[t]), free(dst[t]);
    }
    assert_true(d.waits >= s.chunks); /* every chunk's transfer was waited for */
    s_ring_free(&s);
}

static void test_errors(void **state)
{
    (void)state;
    eng_stage_t s;
    s_dev_t d;
    s_ring(&s, &d, 2, 16);
    d.fail_at = 3;
    uint8_t src[100] = {1}, dst[100];
    assert_int_equal(eng_stage_copy(&s, dst, src, sizeof(src)), -EIO);
    s_ring_free(&s);
    eng_stage_t bad = {0};
    assert_int_equal(eng_stage_init(&bad), -EINVAL);
    bad.n_bufs = ENG_STAGE_MAX_BUFS + 1;
    assert_int_equal(eng_stage_init(&bad), -EINVAL);
}

/* a real safetensors file, mmap'd, staged tensor by tensor */
static void test_safetensors_file(void **state)
{
    (void)state;
    char path[] = "/tmp/test_eng_stage_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char *hdr = "{\"a\":{\"dtype\":\"BF16\",\"shape\":[300],\"data_offsets\":[0,600]},"
                      "\"b\":{\"dtype\":\"F32\",\"shape\":[5,7],\"data_offsets\":[600,740]}}";
    uint64_t hl = strlen(hdr);
    uint8_t data[740];
    for (int i = 0; i < 740; i++)
        data[i] = (uint8_t)(i * 13);
    assert_int_equal(write(fd, &hl, 8), 8);
    assert_int_equal(write(fd, hdr, hl), (ssize_t)hl);
    assert_int_equal(write(fd, data, sizeof(data)), (ssize_t)sizeof(data));
    close(fd);
    char err[256];
    eng_st_file_t *f = eng_st_open(path, err, sizeof(err));
    assert_non_null(f);
    eng_stage_t s;
    s_dev_t d;
    s_ring(&s, &d, 3, 64);
    uint8_t out[740];
    size_t off = 0;
    for (int i = 0; i < eng_st_count(f); i++) {
        const eng_st_tensor_t *t = eng_st_at(f, i);
        assert_int_equal(eng_stage_copy(&s, out + off, t->data, t->nbytes), 0);
        off += t->nbytes;
    }
    assert_int_equal(eng_stage_finish(&s), 0);
    assert_int_equal(off, sizeof(data));
    assert_memory_equal(out, data, sizeof(data)); /* tensors sorted by name: a, b */
    s_ring_free(&s);
    eng_st_destroy(&f);
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_back_to_back),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_safetensors_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

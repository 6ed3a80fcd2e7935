/*  test_eng_safetensors.c - safetensors parsing: a valid image, then every malformed header
    the parser must refuse with a message (and no crash), and a truncated file on disk. */
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

/* Builds [u64 len][header][data_len bytes] in a malloc'd buffer. */
static uint8_t *s_image(const char *header, size_t data_len, size_t *len)
{
    size_t h = strlen(header);
    *len = 8 + h + data_len;
    uint8_t *b = calloc(1, *len);
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(b + 8, header, h);
    for (size_t i = 0; i < data_len; i++)
        b[8 + h + i] = (uint8_t)i;
    return b;
}

static void test_valid(void **state)
{
    size_t len;
    uint8_t *b = s_image("{\"__metadata__\":{\"format\":\"pt\"},"
                         "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]},"
                         "\"a\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,8]}}",
                         16, &len);
    char err[256] = "";
    eng_st_file_t *f = eng_st_parse(b, len, err, sizeof(err));
    assert_non_null(f);
    assert_int_equal(eng_st_count(f), 2);
    const eng_st_tensor_t *a = eng_st_find(f, "a");
    assert_non_null(a);
    assert_int_equal(a->dtype, ENG_DTYPE_BF16);
    assert_int_equal(a->ndim, 2);
    assert_int_equal(a->nbytes, 8);
    assert_ptr_equal(a->data, b + len - 16);
    assert_null(eng_st_find(f, "c"));
    eng_st_destroy(&f);
    assert_null(f);
    free(b);
}

static void s_refused(const char *header, size_t data_len, const char *needle)
{
    size_t len;
    uint8_t *b = s_image(header, data_len, &len);
    char err[256] = "";
    eng_st_file_t *f = eng_st_parse(b, len, err, sizeof(err));
    if (f || !strstr(err, needle))
        fail_msg("header %s: expected an error containing '%s', got '%s'", header, needle, err);
    free(b);
}

static void test_refused(void **state)
{
    s_refused("[1,2]", 0, "not a JSON object");
    s_refused("{\"a\":", 0, "not a JSON object");
    s_refused("{\"a\":{\"dtype\":\"I8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
              "unsupported dtype 'I8'");
    s_refused("{\"a\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8,
              "unsupported dtype 'F64'");
    s_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8, "truncated");
    s_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,16]}}", 16,
              "do not match");
    s_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", 16,
              "bad data_offsets");
    s_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 16, "bad shape");
    s_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 16,
              "bad shape");
    s_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1099511627776,1099511627776],"
              "\"data_offsets\":[0,4]}}",
              16, "bad shape");
    s_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}",
              16, "dimensions");
    s_refused("{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 16, "malformed");
    s_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 16, "malformed");
    s_refused("{\"a\":7}", 16, "malformed");
    s_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
              "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
              16, "twice");
}

static void test_bad_length_prefix(void **state)
{
    char err[256] = "";
    uint8_t small[4] = {0};
    assert_null(eng_st_parse(small, sizeof(small), err, sizeof(err)));
    assert_non_null(strstr(err, "too short"));
    size_t len;
    uint8_t *b = s_image("{}", 0, &len);
    b[0] = 200; /* header length past the end of the file */
    assert_null(eng_st_parse(b, len, err, sizeof(err)));
    assert_non_null(strstr(err, "does not fit"));
    memset(b, 0xff, 8);
    assert_null(eng_st_parse(b, len, err, sizeof(err)));
    free(b);
}

static void test_open_truncated_file(void **state)
{
    char path[] = "/tmp/test_eng_st_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    size_t len;
    uint8_t *b =
        s_image("{\"a\":{\"dtype\":\"F32\",\"shape\":[64],\"data_offsets\":[0,256]}}", 256, &len);
    assert_int_equal(write(fd, b, len - 100), (ssize_t)(len - 100)); /* cut the data short */
    close(fd);
    char err[512] = "";
    eng_st_file_t *f = eng_st_open(path, err, sizeof(err));
    assert_null(f);
    assert_non_null(strstr(err, "truncated"));
    assert_non_null(strstr(err, path));
    unlink(path);
    assert_null(eng_st_open(path, err, sizeof(err)));
    assert_non_null(strstr(err, "cannot open"));
    free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_bad_length_prefix),
        cmocka_unit_test(test_open_truncated_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

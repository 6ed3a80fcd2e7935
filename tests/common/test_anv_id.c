/*  test_anv_id.c - ULIDs: shape, strict ordering, embedded time, validation. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "anv_id.h"
#include "anv_time.h"

#include <string.h>

static void test_shape_and_order(void **state)
{
    (void)state;
    char prev[ANV_ID_SIZE] = "";
    for (int i = 0; i < 100000; i++) {
        char id[ANV_ID_SIZE];
        anv_id_new(id);
        assert_int_equal(strlen(id), ANV_ID_LEN);
        assert_true(anv_id_valid(id));
        if (i)
            assert_true(strcmp(prev, id) < 0); /* strictly increasing, also within one ms */
        memcpy(prev, id, sizeof id);
    }
}

static void test_time(void **state)
{
    (void)state;
    int64_t before = anv_wall_ms();
    char id[ANV_ID_SIZE];
    anv_id_new(id);
    int64_t t = anv_id_time_ms(id);
    assert_true(t >= before - 1);
    assert_true(t <= anv_wall_ms() + 1);
}

static void test_invalid(void **state)
{
    (void)state;
    assert_false(anv_id_valid(NULL));
    assert_false(anv_id_valid(""));
    assert_false(anv_id_valid("01ARZ3NDEKTSV4RRFFQ69G5FA"));   /* 25 chars */
    assert_false(anv_id_valid("01ARZ3NDEKTSV4RRFFQ69G5FAVX")); /* 27 chars */
    assert_false(anv_id_valid("01ARZ3NDEKTSV4RRFFQ69G5FAU"));  /* U is not Crockford */
    assert_false(anv_id_valid("81ARZ3NDEKTSV4RRFFQ69G5FAV"));  /* overflows 128 bits */
    assert_true(anv_id_valid("01ARZ3NDEKTSV4RRFFQ69G5FAV"));
    /* the 48-bit prefix, decoded independently: int(s, base32) >> 80 */
    assert_int_equal(anv_id_time_ms("01ARZ3NDEKTSV4RRFFQ69G5FAV"), 1469922850259LL);
    assert_int_equal(anv_id_time_ms("bad"), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shape_and_order),
        cmocka_unit_test(test_time),
        cmocka_unit_test(test_invalid),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*  test_eng_utf8.c - the UTF-8 helpers streaming decode relies on: the complete-prefix rule
    (hold back an incomplete tail, never a valid or hopeless one) and lossy repair with one
    U+FFFD per maximal invalid subpart. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* cmocka needs the headers above first */
#include <cmocka.h>

#include "eng_tokenizer.h"

static void test_complete_prefix(void **state)
{
    const char *euro = "\xe2\x82\xac", *rocket = "\xf0\x9f\x9a\x80";
    assert_int_equal(eng_utf8_complete_prefix("abc", 3), 3);
    assert_int_equal(eng_utf8_complete_prefix(euro, 3), 3);
    assert_int_equal(eng_utf8_complete_prefix(euro, 2), 0);
    assert_int_equal(eng_utf8_complete_prefix(euro, 1), 0);
    assert_int_equal(eng_utf8_complete_prefix(rocket, 3), 0);
    assert_int_equal(eng_utf8_complete_prefix("ab\xf0\x9f", 4), 2);
    assert_int_equal(eng_utf8_complete_prefix("ab\x80", 3), 3); /* stray continuation */
    assert_int_equal(eng_utf8_complete_prefix("ab\xff", 3), 3); /* never valid: emit */
    assert_int_equal(eng_utf8_complete_prefix("", 0), 0);
}

static void s_lossy(const char *in, size_t n, const char *want)
{
    char *got = eng_utf8_lossy(in, n);
    assert_non_null(got);
    assert_string_equal(got, want);
    free(got);
}

static void test_lossy(void **state)
{
    const char *r = "\xef\xbf\xbd";
    char want[64];
    s_lossy("plain \xe2\x82\xac", 9, "plain \xe2\x82\xac");
    snprintf(want, sizeof(want), "a%sb", r); /* truncated 3-byte sequence: one U+FFFD */
    s_lossy("a\xe2\x82"
            "b",
            4, want);
    snprintf(want, sizeof(want), "%s%s", r, r); /* overlong C0 80: two */
    s_lossy("\xc0\x80", 2, want);
    snprintf(want, sizeof(want), "%s%s%s", r, r, r); /* surrogate ED A0 80: three */
    s_lossy("\xed\xa0\x80", 3, want);
    snprintf(want, sizeof(want), "x%s", r); /* cut 4-byte sequence at the end: one */
    s_lossy("x\xf0\x9f\x9a", 4, want);
    s_lossy("", 0, "");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_complete_prefix),
        cmocka_unit_test(test_lossy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

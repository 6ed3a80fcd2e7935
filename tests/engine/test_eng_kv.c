/*  test_eng_kv.c - the KV block manager: allocation, refcounts, fork, copy-on-write,
    all-or-nothing appends and the peak counter. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/* cmocka needs the headers above first */
#include <cmocka.h>

#include "eng_kv.h"
#include "eng_ops.h"

static void test_append_slots(void **state)
{
    eng_kv_t *kv = eng_kv_new(8, 4);
    eng_kv_seq_t s = {0};
    int32_t slots[16];
    eng_kv_copy_t copy;
    assert_int_equal(eng_kv_blocks_needed(kv, &s, 6), 2);
    assert_int_equal(eng_kv_append(kv, &s, 6, slots, &copy), 0);
    assert_int_equal(copy.src, -1);
    assert_int_equal(s.n_tokens, 6);
    assert_int_equal(s.n_blocks, 2);
    for (int t = 0; t < 6; t++)
        assert_int_equal(slots[t], s.blocks[t / 4] * 4 + t % 4);
    assert_int_equal(eng_kv_free_blocks(kv), 6);
    assert_int_equal(eng_kv_blocks_needed(kv, &s, 2), 0);
    assert_int_equal(eng_kv_blocks_needed(kv, &s, 3), 1);
    eng_kv_release(kv, &s);
    assert_int_equal(eng_kv_free_blocks(kv), 8);
    assert_int_equal(eng_kv_peak_blocks(kv), 2);
    eng_kv_seq_free(&s);
    eng_kv_destroy(&kv);
    assert_null(kv);
}

static void test_fork_cow(void **state)
{
    eng_kv_t *kv = eng_kv_new(8, 4);
    eng_kv_seq_t a = {0}, b = {0}, c = {0};
    int32_t slots[8];
    eng_kv_copy_t copy;
    assert_int_equal(eng_kv_append(kv, &a, 6, slots, &copy), 0); /* 1 full + 1 partial */
    assert_int_equal(eng_kv_fork(kv, &a, &b), 0);
    assert_int_equal(eng_kv_fork(kv, &a, &c), 0);
    assert_int_equal(eng_kv_refcount(kv, a.blocks[0]), 3);
    assert_int_equal(eng_kv_refcount(kv, a.blocks[1]), 3);
    assert_int_equal(eng_kv_free_blocks(kv), 6);
    int32_t shared_partial = a.blocks[1];
    /* b writes into the shared partial block: it gets a private copy */
    assert_int_equal(eng_kv_blocks_needed(kv, &b, 1), 1);
    assert_int_equal(eng_kv_append(kv, &b, 1, slots, &copy), 0);
    assert_int_equal(copy.src, shared_partial);
    assert_int_not_equal(copy.dst, shared_partial);
    assert_int_equal(b.blocks[1], copy.dst);
    assert_int_equal(b.blocks[0], a.blocks[0]); /* the full block stays shared */
    assert_int_equal(slots[0], copy.dst * 4 + 2);
    assert_int_equal(eng_kv_refcount(kv, shared_partial), 2);
    assert_int_equal(eng_kv_refcount(kv, copy.dst), 1);
    /* c copies too; then a is the last owner and appends in place */
    assert_int_equal(eng_kv_append(kv, &c, 1, slots, &copy), 0);
    assert_int_not_equal(copy.src, -1);
    assert_int_equal(eng_kv_refcount(kv, shared_partial), 1);
    assert_int_equal(eng_kv_append(kv, &a, 1, slots, &copy), 0);
    assert_int_equal(copy.src, -1);
    assert_int_equal(slots[0], shared_partial * 4 + 2);
    assert_int_equal(eng_kv_refcount(kv, a.blocks[0]), 3);
    eng_kv_release(kv, &b);
    eng_kv_release(kv, &c);
    assert_int_equal(eng_kv_refcount(kv, a.blocks[0]), 1);
    eng_kv_release(kv, &a);
    assert_int_equal(eng_kv_free_blocks(kv), 8);
    for (int i = 0; i < 8; i++)
        assert_int_equal(eng_kv_refcount(kv, i), 0);
    eng_kv_seq_free(&a);
    eng_kv_seq_free(&b);
    eng_kv_seq_free(&c);
    eng_kv_destroy(&kv);
}

static void test_fork_full_block_no_copy(void **state)
{
    eng_kv_t *kv = eng_kv_new(4, 4);
    eng_kv_seq_t a = {0}, b = {0};
    int32_t slots[8];
    eng_kv_copy_t copy;
    assert_int_equal(eng_kv_append(kv, &a, 4, slots, &copy), 0);
    assert_int_equal(eng_kv_fork(kv, &a, &b), 0);
    assert_int_equal(eng_kv_blocks_needed(kv, &b, 1), 1); /* a new block, not a copy */
    assert_int_equal(eng_kv_append(kv, &b, 1, slots, &copy), 0);
    assert_int_equal(copy.src, -1);
    assert_int_equal(eng_kv_refcount(kv, a.blocks[0]), 2);
    eng_kv_release(kv, &a);
    eng_kv_release(kv, &b);
    eng_kv_seq_free(&a);
    eng_kv_seq_free(&b);
    eng_kv_destroy(&kv);
}

/* a recomputed sample shares its prompt's full blocks with a sibling and appends after them */
static void test_fork_prefix(void **state)
{
    eng_kv_t *kv = eng_kv_new(8, 4);
    eng_kv_seq_t a = {0}, b = {0}, c = {0};
    int32_t slots[16];
    eng_kv_copy_t copy;
    assert_int_equal(eng_kv_append(kv, &a, 10, slots, &copy), 0); /* 2 full blocks + 2 */
    assert_int_equal(eng_kv_fork_prefix(kv, &a, &b, 4), -EINVAL); /* beyond a's 3 blocks */
    assert_int_equal(eng_kv_fork_prefix(kv, &a, &b, 2), 0);
    assert_int_equal(b.n_tokens, 8);
    assert_int_equal(b.n_blocks, 2);
    assert_memory_equal(b.blocks, a.blocks, 2 * sizeof(int32_t));
    assert_int_equal(eng_kv_refcount(kv, a.blocks[0]), 2);
    assert_int_equal(eng_kv_refcount(kv, a.blocks[2]), 1);
    assert_int_equal(eng_kv_fork_prefix(kv, &a, &b, 1), -EINVAL); /* b is not empty */
    assert_int_equal(eng_kv_free_blocks(kv), 5);
    assert_int_equal(eng_kv_blocks_needed(kv, &b, 5), 2); /* new blocks from a boundary */
    assert_int_equal(eng_kv_append(kv, &b, 5, slots, &copy), 0);
    assert_int_equal(copy.src, -1);
    assert_int_equal(slots[0] / 4 != a.blocks[2], 1);
    assert_int_equal(eng_kv_free_blocks(kv), 3);
    assert_int_equal(eng_kv_fork_prefix(kv, &a, &c, 0), 0); /* nothing shared */
    assert_int_equal(c.n_tokens, 0);
    eng_kv_release(kv, &a);
    assert_int_equal(eng_kv_refcount(kv, b.blocks[0]), 1); /* b keeps the prompt's blocks */
    assert_int_equal(eng_kv_free_blocks(kv), 4);
    eng_kv_release(kv, &b);
    assert_int_equal(eng_kv_free_blocks(kv), 8);
    eng_kv_seq_free(&a);
    eng_kv_seq_free(&b);
    eng_kv_seq_free(&c);
    eng_kv_destroy(&kv);
}

static void test_enospc_changes_nothing(void **state)
{
    eng_kv_t *kv = eng_kv_new(3, 2);
    eng_kv_seq_t a = {0}, b = {0};
    int32_t slots[8];
    eng_kv_copy_t copy;
    assert_int_equal(eng_kv_append(kv, &a, 3, slots, &copy), 0); /* 2 blocks */
    assert_int_equal(eng_kv_fork(kv, &a, &b), 0);
    assert_int_equal(eng_kv_append(kv, &b, 3, slots, &copy), -ENOSPC); /* cow + 1 > 1 free */
    assert_int_equal(b.n_tokens, 3);
    assert_int_equal(b.n_blocks, 2);
    assert_int_equal(eng_kv_free_blocks(kv), 1);
    assert_int_equal(eng_kv_refcount(kv, a.blocks[1]), 2);
    assert_int_equal(eng_kv_append(kv, &b, 1, slots, &copy), 0); /* just the copy fits */
    assert_int_equal(eng_kv_free_blocks(kv), 0);
    assert_int_equal(eng_kv_append(kv, &a, 2, slots, &copy), -ENOSPC);
    assert_int_equal(eng_kv_peak_blocks(kv), 3);
    eng_kv_release(kv, &a);
    eng_kv_release(kv, &b);
    assert_int_equal(eng_kv_free_blocks(kv), 3);
    eng_kv_seq_free(&a);
    eng_kv_seq_free(&b);
    eng_kv_destroy(&kv);
}

/* the default pool: a GPU's free memory less 10 %, 4 GiB and what a weight update allocates
   beside the loaded set (a second copy where it cannot be written in place); no device or too
   little: the fallback */
static void test_auto_bytes(void **state)
{
    (void)state;
    const size_t G = (size_t)1 << 30, fb = (size_t)256 << 20;
    assert_int_equal(eng_kv_auto_bytes(0, 0, fb), fb);
    assert_int_equal(eng_kv_auto_bytes(4 * G, 0, fb), fb);
    assert_int_equal(eng_kv_auto_bytes(100 * G, 0, fb), 100 * G - 4 * G - 10 * G);
    assert_int_equal(eng_kv_auto_bytes(100 * G, 20 * G, fb), 100 * G - 4 * G - 10 * G - 20 * G);
    assert_int_equal(eng_kv_auto_bytes(20 * G, 16 * G, fb), fb);
    /* H200 after the 8B weights (16.5 GB): about 89 GB of KV, and the reload still fits */
    size_t h200 = (size_t)(122.5 * (double)G), w8b = (size_t)16500924416ull;
    size_t kv = eng_kv_auto_bytes(h200, w8b, fb);
    assert_true(kv > 80 * G);
    assert_true(h200 - kv > w8b + 4 * G);
}

/* fp8 KV (E4M3 fn): every finite code survives a round trip, ties go to even, large values
   saturate to 448, subnormals keep their 2^-9 step, NaN stays NaN */
static void test_f8e4m3(void **state)
{
    (void)state;
    for (int b = 0; b < 256; b++) {
        if ((b & 0x7f) == 0x7f) {
            assert_true(isnan(eng_f8e4m3_to_f32((uint8_t)b)));
            continue;
        }
        float f = eng_f8e4m3_to_f32((uint8_t)b);
        assert_int_equal(eng_f32_to_f8e4m3(f), b);
    }
    assert_true(eng_f8e4m3_to_f32(0x7e) == 448.0f);
    assert_true(eng_f8e4m3_to_f32(0x01) == 0x1p-9f);
    assert_true(eng_f8e4m3_to_f32(0x08) == 0x1p-6f);
    assert_true(eng_f8e4m3_to_f32(eng_f32_to_f8e4m3(1.0625f)) == 1.0f);  /* tie: even */
    assert_true(eng_f8e4m3_to_f32(eng_f32_to_f8e4m3(1.1875f)) == 1.25f); /* tie: even */
    assert_true(eng_f8e4m3_to_f32(eng_f32_to_f8e4m3(1.07f)) == 1.125f);
    assert_true(eng_f8e4m3_to_f32(eng_f32_to_f8e4m3(15.5f)) == 16.0f);        /* carries a binade */
    assert_true(eng_f8e4m3_to_f32(eng_f32_to_f8e4m3(0x1.8p-10f)) == 0x1p-9f); /* tie: odd up */
    assert_true(eng_f8e4m3_to_f32(eng_f32_to_f8e4m3(0x1p-11f)) == 0.0f);
    assert_int_equal(eng_f32_to_f8e4m3(1000.0f), 0x7e);
    assert_int_equal(eng_f32_to_f8e4m3(-1e30f), 0xfe);
    assert_int_equal(eng_f32_to_f8e4m3(INFINITY), 0x7e);
    assert_int_equal(eng_f32_to_f8e4m3(NAN) & 0x7f, 0x7f);
    eng_dtype_t dt;
    assert_int_equal(eng_kv_dtype_parse("FP8", &dt), 0);
    assert_int_equal(dt, ENG_DTYPE_F8E4M3);
    assert_int_equal(eng_dtype_size(dt), 1);
    assert_int_equal(eng_kv_dtype_parse("bf16", &dt), 0);
    assert_int_equal(dt, ENG_DTYPE_BF16);
    assert_int_equal(eng_kv_dtype_parse("int4", &dt), -1);
    /* the CPU backend keeps f32 only */
    assert_null(eng_backend_new_kv("cpu", 1, "fp8"));
    eng_backend_t *be = eng_backend_new_kv("cpu", 1, "f32");
    assert_non_null(be);
    be->destroy(&be);
}

static void test_bad_args(void **state)
{
    assert_null(eng_kv_new(0, 16));
    assert_null(eng_kv_new(4, 0));
    eng_kv_destroy(NULL);
    eng_kv_t *kv = NULL;
    eng_kv_destroy(&kv);
    kv = eng_kv_new(2, 2);
    assert_int_equal(eng_kv_refcount(kv, -1), -1);
    assert_int_equal(eng_kv_refcount(kv, 2), -1);
    eng_kv_destroy(&kv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_append_slots),
        cmocka_unit_test(test_fork_cow),
        cmocka_unit_test(test_fork_full_block_no_copy),
        cmocka_unit_test(test_fork_prefix),
        cmocka_unit_test(test_enospc_changes_nothing),
        cmocka_unit_test(test_auto_bytes),
        cmocka_unit_test(test_f8e4m3),
        cmocka_unit_test(test_bad_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

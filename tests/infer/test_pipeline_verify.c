/* test_pipeline_verify.c: the pipeline's slice check (pl_slice_verify).
 * pl_checksum_avx512 against format_checksum (the library's XXH3-64) on
 * random contents, lengths 0..4096 and some long ones, at every alignment
 * (XXH3 has separate paths for <= 16, <= 128, <= 240 bytes and long
 * inputs, and the long one its stripes, blocks and last partial stripe);
 * then a real container's slices: intact, each passes; one byte flipped
 * anywhere (first, last, random), it fails with -EIO and the same message
 * as format_slice_verify; a bad index fails as format_slice_verify does.
 * Without AVX-512 the checksum cases skip (pl_slice_verify then is
 * format_slice_verify). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline.h"
#include "testutil.h"
#include "tiny_q5.h"

static void test_checksum_matches_library(void **state)
{
    (void)state;
#if SLUICE_KERNELS_X86
    if (!sl_cpu_features_hw()->avx512)
        skip();
    struct test_rng g;
    test_rng_init(&g, test_seed());
    size_t cap = (size_t)3 << 20;
    uint8_t *buf = malloc(cap + 64);
    assert_non_null(buf);
    for (size_t i = 0; i < cap + 64; i++)
        buf[i] = (uint8_t)test_rng_u64(&g);
    for (size_t len = 0; len <= 4096; len++) {
        const uint8_t *d = buf + test_rng_below(&g, 64);
        assert_int_equal(pl_checksum_avx512(d, len), format_checksum(d, len));
    }
    for (int k = 0; k < 40; k++) {
        size_t len = 4096 + test_rng_below(&g, (uint32_t)(cap - 4096));
        const uint8_t *d = buf + test_rng_below(&g, 64);
        assert_int_equal(pl_checksum_avx512(d, len), format_checksum(d, len));
    }
    free(buf);
#else
    skip();
#endif
}

static void check_same(const struct format_reader *r, uint32_t s, const uint8_t *data)
{
    struct sl_err e1 = {{0}}, e2 = {{0}};
    int a = pl_slice_verify(r, s, data, &e1), b = format_slice_verify(r, s, data, &e2);
    assert_int_equal(a, b);
    assert_string_equal(e1.msg, e2.msg);
}

static void test_slices(void **state)
{
    (void)state;
    char fm[4096], qm[4096];
    assert_int_equal(tiny_q5_models(7, fm, qm), 0);
    struct format_reader *r = NULL;
    struct sl_err err = {{0}};
    assert_int_equal(format_reader_open(qm, &r, &err), 0);
    struct test_rng g;
    test_rng_init(&g, test_seed() ^ 0x5eed);
    uint32_t ns = format_reader_n_slices(r), checked = 0;
    for (uint32_t s = 0; s < ns; s++) {
        const struct format_slice_info *si = format_reader_slice(r, s);
        if (!si->length)
            continue;
        uint8_t *buf = malloc((size_t)si->length);
        assert_non_null(buf);
        assert_int_equal(format_reader_read_slice(r, s, buf, si->length, &err), 0);
        assert_int_equal(pl_slice_verify(r, s, buf, &err), 0);
        size_t at[3] = {0, (size_t)si->length - 1, test_rng_below(&g, (uint32_t)si->length)};
        for (int k = 0; k < 3; k++) {
            buf[at[k]] ^= (uint8_t)(1u << test_rng_below(&g, 8));
            struct sl_err e = {{0}};
            assert_int_equal(pl_slice_verify(r, s, buf, &e), -EIO);
            assert_non_null(strstr(e.msg, "checksum mismatch"));
            check_same(r, s, buf);
            buf[at[k]] = 0;
            assert_int_equal(format_reader_read_slice(r, s, buf, si->length, &err), 0);
        }
        check_same(r, s, buf);
        free(buf);
        checked++;
    }
    assert_true(checked > 0);
    uint8_t one = 0;
    check_same(r, ns, &one); /* no such slice */
    struct sl_err e = {{0}};
    assert_int_equal(pl_slice_verify(r, ns, &one, &e), -EINVAL);
    format_reader_close(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_checksum_matches_library),
        cmocka_unit_test(test_slices),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

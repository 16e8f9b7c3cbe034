/* test_format_checksum.c: format_checksum's AVX-512 way against the
 * reference (the system's libxxhash, fmt_checksum_portable), bit for bit, on
 * random contents at every alignment: every length 0..4096 (XXH3 has
 * separate paths for <= 16, <= 128, <= 240 bytes and long inputs, and the
 * long one its stripes, blocks and last partial stripe) and long lengths up
 * to 3 MiB; one flipped bit anywhere changes the value, as the reference's;
 * format_checksum itself is one of the two as the CPU and SLUICE_SIMD say.
 * format_hash (the checksum in pieces) gives the reference's value for the
 * whole however the bytes are split, reset and reused, either way.
 * Without AVX-512 the comparison skips. */
#include <stdlib.h>

#include "format_internal.h"
#include "testutil.h"

static uint8_t *random_buf(struct test_rng *g, size_t n)
{
    uint8_t *b = malloc(n);
    assert_non_null(b);
    for (size_t i = 0; i < n; i++)
        b[i] = (uint8_t)test_rng_u64(g);
    return b;
}

static void test_avx512_matches_reference(void **state)
{
    (void)state;
#if SLUICE_KERNELS_X86
    if (!sl_cpu_features_hw()->avx512)
        skip();
    struct test_rng g;
    test_rng_init(&g, test_seed());
    size_t cap = (size_t)3 << 20;
    uint8_t *buf = random_buf(&g, cap + 64);
    for (size_t len = 0; len <= 4096; len++) {
        const uint8_t *d = buf + test_rng_below(&g, 64);
        assert_int_equal(fmt_checksum_avx512(d, len), fmt_checksum_portable(d, len));
    }
    for (int k = 0; k < 40; k++) {
        size_t len = 4096 + test_rng_below(&g, (uint32_t)(cap - 4096));
        const uint8_t *d = buf + test_rng_below(&g, 64);
        assert_int_equal(fmt_checksum_avx512(d, len), fmt_checksum_portable(d, len));
    }
    free(buf);
#else
    skip();
#endif
}

/* A flipped bit (first byte, last byte, a random one) changes the value of
 * both ways, and both agree on the corrupt bytes too. */
static void test_flipped_bit(void **state)
{
    (void)state;
    struct test_rng g;
    test_rng_init(&g, test_seed() + 1);
    static const size_t lens[] = {1, 17, 129, 241, 1024, 65536 + 7, 1u << 20};
    uint8_t *buf = random_buf(&g, (size_t)1 << 20);
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        size_t len = lens[i];
        uint64_t ok = fmt_checksum_portable(buf, len);
        assert_int_equal(format_checksum(buf, len), ok);
        size_t at[3] = {0, len - 1, test_rng_below(&g, (uint32_t)len)};
        for (int k = 0; k < 3; k++) {
            uint8_t bit = (uint8_t)(1u << test_rng_below(&g, 8));
            buf[at[k]] ^= bit;
            uint64_t bad = fmt_checksum_portable(buf, len);
            assert_true(bad != ok);
            assert_int_equal(format_checksum(buf, len), bad);
#if SLUICE_KERNELS_X86
            if (sl_cpu_features_hw()->avx512)
                assert_int_equal(fmt_checksum_avx512(buf, len), bad);
#endif
            buf[at[k]] ^= bit;
        }
    }
    free(buf);
}

/* format_hash over random splits (pieces of 0 bytes to 300 KiB, at random
 * alignments) equals the reference over the whole, for lengths 0 to 3 MiB;
 * one state reset and reused across lengths; the AVX-512 way's state alone
 * too where the CPU has it. */
static void test_hash_pieces(void **state)
{
    (void)state;
    struct test_rng g;
    test_rng_init(&g, test_seed() + 2);
    size_t cap = (size_t)3 << 20;
    uint8_t *buf = random_buf(&g, cap + 64);
    struct format_hash *h = format_hash_new();
    assert_non_null(h);
    for (int k = 0; k < 60; k++) {
        size_t len = k < 20 ? test_rng_below(&g, 600) : test_rng_below(&g, (uint32_t)cap);
        const uint8_t *d = buf + test_rng_below(&g, 64);
        uint64_t ref = fmt_checksum_portable(d, len);
        for (int way = 0; way < 2; way++) {
            void *st = NULL;
#if SLUICE_KERNELS_X86
            if (way == 1 && sl_cpu_features_hw()->avx512)
                st = fmt_hash_avx512_new();
#endif
            if (way == 1 && !st)
                continue;
            if (way == 0)
                format_hash_reset(h);
            for (size_t off = 0; off < len;) {
                size_t n = test_rng_below(&g, 4) == 0 ? test_rng_below(&g, 64)
                                                      : test_rng_below(&g, 300u << 10);
                n = n < len - off ? n : len - off;
                if (way == 0)
                    format_hash_update(h, d + off, n);
#if SLUICE_KERNELS_X86
                else
                    fmt_hash_avx512_update(st, d + off, n);
#endif
                off += n;
            }
            uint64_t got = way == 0 ? format_hash_digest(h) : 0;
#if SLUICE_KERNELS_X86
            if (way == 1) {
                got = fmt_hash_avx512_digest(st);
                fmt_hash_avx512_free(st);
            }
#endif
            assert_int_equal(got, ref);
        }
    }
    /* a bit flipped in the last piece: the flipped bytes' value, not the original's */
    format_hash_reset(h);
    format_hash_update(h, buf, 1000);
    buf[1500] ^= 4;
    format_hash_update(h, buf + 1000, 1000);
    assert_int_equal(format_hash_digest(h), fmt_checksum_portable(buf, 2000));
    buf[1500] ^= 4;
    assert_true(format_hash_digest(h) != fmt_checksum_portable(buf, 2000));
    format_hash_free(h);
    format_hash_free(NULL);
    free(buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_avx512_matches_reference),
        cmocka_unit_test(test_flipped_bit),
        cmocka_unit_test(test_hash_pieces),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

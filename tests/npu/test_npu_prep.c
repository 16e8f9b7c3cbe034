/* test_npu_prep.c: the AVX-512 VNNI kernel's staging of the activations
 * (prep: XOR 0x80, k padded to k4 with zeros, R-row interleave) against its
 * byte-by-byte reference npu_prep_vnni_ref, bit for bit, for every register
 * tiling: random m (whole 4- and 2-row units and the rows past them, tiles
 * cut short), k below, at and past multiples of 64 and of 4 (the vector
 * loop's tail and the padded group), row strides lda > k, bytes at +-127,
 * -128 and 0; bytes the layout does not define (rows past m in the last
 * tile) are filled with a marker first and must be the same on both sides
 * only where defined. A reference that ignores the XOR, or the pad, fails
 * (checked). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "npu.h"
#include "npu_gemm_internal.h"
#include "testutil.h"

static struct test_rng rng;

/* the tiling's rows: its name starts with them ("6x64") */
static uint32_t tile_rows(const struct npu_kernel_ops *ops, int t)
{
    return (uint32_t)atoi(ops->tile_names[t]);
}

/* 1 when prep of tiling t matches the reference on m x k (stride lda) */
static int same(const struct npu_kernel_ops *ops, int t, uint32_t m, uint32_t k, size_t lda,
                const int8_t *a)
{
    const uint32_t k4 = (k + 3) & ~3u, R = tile_rows(ops, t);
    const size_t bytes = npu_gemm_prep_bytes(k4, m);
    uint8_t *got = malloc(bytes), *want = malloc(bytes);
    assert_non_null(got);
    assert_non_null(want);
    memset(got, 0xA5, bytes);
    memset(want, 0xA5, bytes);
    ops->prep(a, lda, m, k, k4, t, got);
    npu_prep_vnni_ref(a, lda, m, k, k4, R, want);
    int ok = 1;
    for (uint32_t i = 0; i < m && ok; i++)
        for (uint32_t g = 0; g < k4 / 4 && ok; g++) {
            const size_t off = npu_gemm_a_off(i, g, k4, R);
            if (memcmp(got + off, want + off, 4)) {
                fprintf(stderr, "tiling %s m %u k %u lda %zu: row %u group %u differs\n",
                        ops->tile_names[t], m, k, lda, i, g);
                ok = 0;
            }
        }
    free(got);
    free(want);
    return ok;
}

static int8_t *random_rows(uint32_t m, size_t lda)
{
    int8_t *a = malloc((size_t)m * lda + 1);
    assert_non_null(a);
    for (size_t i = 0; i < (size_t)m * lda; i++) {
        const uint32_t r = test_rng_below(&rng, 8);
        a[i] = (int8_t)(r == 0 ? -128 : r == 1 ? 127 : r == 2 ? -127 : r == 3 ? 0
                        : (int)test_rng_below(&rng, 256) - 128);
    }
    return a;
}

static void test_random(void **state)
{
    (void)state;
    if (!npu_kernel_available(NPU_KERNEL_AVX512VNNI)) {
        fprintf(stderr, "avx512vnni: not on this CPU, skipped\n");
        skip();
    }
    const struct npu_kernel_ops *ops = npu_kernel_ops(NPU_KERNEL_AVX512VNNI);
    static const uint32_t ks[] = {1, 3, 4, 63, 64, 65, 67, 128, 130, 256, 2048, 5632};
    for (int rep = 0; rep < 150; rep++) {
        const uint32_t m = 1 + test_rng_below(&rng, rep < 100 ? 40 : 300);
        const uint32_t k = rep < 60 ? ks[rep % (sizeof ks / sizeof ks[0])]
                                    : 1 + test_rng_below(&rng, 700);
        const size_t lda = k + (rep % 3 ? test_rng_below(&rng, 70) : 0);
        int8_t *a = random_rows(m, lda);
        for (int t = 0; t < ops->tiles; t++)
            assert_true(same(ops, t, m, k, lda, a));
        free(a);
    }
}

/* The comparison can fail: a staging without the XOR differs. */
static void test_can_fail(void **state)
{
    (void)state;
    const uint32_t m = 13, k = 130, k4 = 132, R = 8;
    int8_t *a = random_rows(m, k);
    const size_t bytes = npu_gemm_prep_bytes(k4, m);
    uint8_t *x = calloc(1, bytes), *y = calloc(1, bytes);
    assert_non_null(x);
    assert_non_null(y);
    npu_prep_vnni_ref(a, k, m, k, k4, R, x);
    npu_prep_vnni_ref(a, k, m, k, k4, R, y);
    assert_memory_equal(x, y, bytes);
    y[npu_gemm_a_off(5, 7, k4, R) + 2] ^= 0x80; /* one byte unflipped */
    assert_memory_not_equal(x, y, bytes);
    /* the pad: group 32 holds k's bytes 128, 129 and two zeros */
    assert_int_equal(x[npu_gemm_a_off(3, 32, k4, R) + 2], 0);
    assert_int_equal(x[npu_gemm_a_off(3, 32, k4, R) + 0], (uint8_t)a[3 * k + 128] ^ 0x80);
    free(a);
    free(x);
    free(y);
}

int main(void)
{
    test_rng_init(&rng, test_seed());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random),
        cmocka_unit_test(test_can_fail),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_npu_rowmajor.c: the row-major few-rows linear (npu_rowmajor.c, its
 * AMX kernel) against the scalar definition, bit for bit: random m in 1..16,
 * n multiples of 16 (one block, a whole pass of four and the blocks after
 * the last pass), k multiples of 64 (one step and several), codes over the
 * whole int8 range including -128 (the kernel multiplies signed x signed,
 * nothing negated), extreme activations, outputs written into a wider row
 * stride (the columns beside them untouched); the same floats as the packed
 * GEMM (npu_linear_s8) on the same weights; the staging buffer filled with
 * junk first; and the shapes it refuses (-EINVAL, nothing written). Skips,
 * saying so, where AMX is not available. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "npu.h"
#include "testutil.h"

static struct test_rng rng;

static void fill(int8_t *p, size_t n, int lo, int hi)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (int8_t)(lo + (int)test_rng_below(&rng, (uint32_t)(hi - lo + 1)));
}

/* one case: m rows, n channels, k inputs, output row stride ldy >= n */
static void one(uint32_t m, uint32_t n, uint32_t k, size_t ldy, int wide_codes)
{
    int8_t *q = malloc((size_t)n * k), *xq = malloc((size_t)m * k);
    float *scale = malloc(sizeof(float) * n);
    float *y = malloc(sizeof(float) * m * ldy), *yr = malloc(sizeof(float) * m * ldy);
    const size_t sb = npu_rowmajor_stage_bytes(m, k);
    void *stage = aligned_alloc(64, (sb + 63) / 64 * 64);
    assert_true(q && xq && scale && y && yr && stage);
    fill(q, (size_t)n * k, wide_codes ? -128 : -15, wide_codes ? 127 : 15);
    fill(xq, (size_t)m * k, -127, 127);
    if (test_rng_below(&rng, 4) == 0) /* extremes: the largest sums */
        for (size_t i = 0; i < (size_t)m * k; i++)
            xq[i] = 127, q[i % ((size_t)n * k)] = (int8_t)(wide_codes ? -128 : -127);
    for (uint32_t r = 0; r < n; r++)
        scale[r] = 1e-3f * (1.0f + test_rng_float(&rng));
    const float act = 0.0173f * (0.5f + test_rng_float(&rng));
    memset(stage, 0x5a, sb);
    for (size_t i = 0; i < (size_t)m * ldy; i++)
        y[i] = yr[i] = -7.0f;
    npu_rowmajor_stage(xq, m, k, stage);
    assert_int_equal(npu_linear_s8_rowmajor(q, scale, n, k, stage, m, act, y, ldy), 0);
    npu_linear_s8_rowmajor_ref(q, scale, n, k, xq, m, act, yr, ldy);
    assert_memory_equal(y, yr, sizeof(float) * m * ldy); /* beside the n columns: untouched */
    if (!wide_codes) { /* the packed GEMM's floats (its weights refuse -128) */
        struct npu_weights *w;
        assert_int_equal(npu_weights_create(q, scale, n, k, &w), 0);
        float *yp = malloc(sizeof(float) * m * n);
        assert_non_null(yp);
        npu_linear_s8(w, xq, m, act, yp);
        for (uint32_t i = 0; i < m; i++)
            assert_memory_equal(yp + (size_t)i * n, y + i * ldy, sizeof(float) * n);
        free(yp);
        npu_weights_destroy(w);
    }
    free(q), free(xq), free(scale), free(y), free(yr), free(stage);
}

static void test_rowmajor_random(void **state)
{
    (void)state;
    for (int it = 0; it < 60; it++) {
        uint32_t m = 1 + test_rng_below(&rng, 16);
        uint32_t n = 16 * (1 + test_rng_below(&rng, 11)); /* 1..11 blocks: passes of 4 and after */
        uint32_t k = 64 * (1 + test_rng_below(&rng, 12));
        size_t ldy = n + (test_rng_below(&rng, 2) ? 0 : 1 + test_rng_below(&rng, 40));
        one(m, n, k, ldy, (int)test_rng_below(&rng, 2));
    }
}

static void test_rowmajor_shapes(void **state)
{
    (void)state;
    /* the verification shapes on tinyllama's linears (tiles of 96 channels) */
    static const uint32_t ms[] = {1, 4, 8, 16};
    for (int i = 0; i < 4; i++) {
        one(ms[i], 96, 2048, 96, 0);
        one(ms[i], 32, 5632, 48, 1);
    }
}

/* A call on n channels of k inputs (8 rows) is refused, nothing written. */
static void refused_untouched(uint32_t n, uint32_t k)
{
    static int8_t q[64 * 128], xq[8 * 128];
    static float scale[64], y[8 * 64];
    _Alignas(64) static int8_t stage[8 * 128 + 64];
    for (int i = 0; i < 8 * 64; i++)
        y[i] = 3.0f;
    npu_rowmajor_stage(xq, 8, k / 4 * 4, stage);
    assert_int_equal(npu_linear_s8_rowmajor(q, scale, n, k, stage, 8, 1.0f, y, n), -EINVAL);
    for (int i = 0; i < 8 * 64; i++)
        assert_true(y[i] == 3.0f);
}

static void test_rowmajor_refuses(void **state)
{
    (void)state;
    assert_true(npu_rowmajor_takes(8, 64, 128));
    assert_false(npu_rowmajor_takes(0, 64, 128));
    assert_false(npu_rowmajor_takes(NPU_ROWMAJOR_ROWS_MAX + 1, 64, 128));
    assert_false(npu_rowmajor_takes(8, 40, 128));
    assert_false(npu_rowmajor_takes(8, 64, 100));
    refused_untouched(40, 100);
    refused_untouched(32, 100);
}

/* Without AMX (a CPU or a build without it) no shape is taken, and a call
 * is refused with nothing written: the caller packs instead. */
static void test_rowmajor_absent(void **state)
{
    (void)state;
    assert_false(npu_rowmajor_takes(8, 64, 128));
    refused_untouched(64, 128);
}

int main(void)
{
    if (!npu_kernel_available(NPU_KERNEL_AMX)) {
        const struct CMUnitTest absent[] = {cmocka_unit_test(test_rowmajor_absent)};
        printf("AMX is not available here: only the refusals are checked\n");
        return cmocka_run_group_tests(absent, NULL, NULL);
    }
    test_rng_init(&rng, test_seed());
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_rowmajor_random),
                                       cmocka_unit_test(test_rowmajor_shapes),
                                       cmocka_unit_test(test_rowmajor_refuses)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}

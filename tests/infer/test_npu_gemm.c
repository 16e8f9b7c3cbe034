/* test_npu_gemm.c: every int8 GEMM kernel the CPU has against the scalar
 * reference, bit for bit, over shapes that are not multiples of the tiles
 * (m, n, k), k not a multiple of 4, output ranges [r0, r1) that start and end
 * inside a 16-channel block, and all-extreme inputs (every a and b at +-127,
 * where a saturating kernel would differ). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "npu.h"
#include "npu_gemm.h"
#include "testutil.h"

static struct test_rng rng;

static void fill(int8_t *x, size_t n, int mode)
{
    for (size_t i = 0; i < n; i++) {
        if (mode == 1)
            x[i] = 127;
        else if (mode == 2)
            x[i] = (int8_t)(test_rng_below(&rng, 2) ? 127 : -127);
        else
            x[i] = (int8_t)((int)test_rng_below(&rng, 255) - 127);
    }
}

static void check(uint32_t m, uint32_t n, uint32_t k, uint32_t r0, uint32_t r1, int mode)
{
    int8_t *a = malloc((size_t)m * k + 1), *b = malloc((size_t)n * k + 1);
    fill(a, (size_t)m * k, mode);
    fill(b, (size_t)n * k, mode == 1 ? 1 : mode);
    if (mode == 1) /* a = 127, b = -127: the most negative sums */
        memset(b, 0x81, (size_t)n * k);
    struct npu_gemm_b *pb;
    assert_int_equal(npu_gemm_b_create(b, n, k, &pb), 0);
    uint32_t w = r1 - r0;
    int32_t *ref = malloc(sizeof(int32_t) * m * w + 4), *got = malloc(sizeof(int32_t) * m * w + 4);
    npu_gemm_s8_kernel(NPU_KERNEL_SCALAR, pb, a, m, r0, r1, ref, w);
    for (int kern = 1; kern < NPU_KERNEL_COUNT; kern++) {
        if (!npu_kernel_available((enum npu_kernel)kern))
            continue;
        memset(got, 0x55, sizeof(int32_t) * m * w);
        npu_gemm_s8_kernel((enum npu_kernel)kern, pb, a, m, r0, r1, got, w);
        for (size_t i = 0; i < (size_t)m * w; i++)
            if (got[i] != ref[i])
                fail_msg("%s m=%u n=%u k=%u range [%u,%u) mode %d: C[%zu][%zu] = %d, scalar %d",
                         npu_kernel_name((enum npu_kernel)kern), m, n, k, r0, r1, mode, i / w,
                         i % w, got[i], ref[i]);
    }
    /* the reference itself against a direct sum */
    for (uint32_t i = 0; i < m; i += 1 + m / 3)
        for (uint32_t r = r0; r < r1; r += 1 + w / 5) {
            int64_t s = 0;
            for (uint32_t j = 0; j < k; j++)
                s += (int32_t)a[(size_t)i * k + j] * b[(size_t)r * k + j];
            assert_int_equal(ref[(size_t)i * w + (r - r0)], s);
        }
    npu_gemm_b_destroy(pb);
    free(a);
    free(b);
    free(ref);
    free(got);
}

static void test_shapes(void **st)
{
    (void)st;
    static const uint32_t ms[] = {1, 2, 3, 5, 6, 7, 13, 32};
    static const uint32_t ns[] = {1, 15, 16, 17, 33, 64, 100, 129};
    static const uint32_t ks[] = {1, 3, 4, 5, 31, 64, 173, 256};
    for (size_t a = 0; a < sizeof ms / 4; a++)
        for (size_t b = 0; b < sizeof ns / 4; b++)
            for (size_t c = 0; c < sizeof ks / 4; c++)
                check(ms[a], ns[b], ks[c], 0, ns[b], 0);
}

static void test_ranges(void **st)
{
    (void)st;
    for (int t = 0; t < 60; t++) {
        uint32_t n = 1 + test_rng_below(&rng, 200), k = 1 + test_rng_below(&rng, 300);
        uint32_t r0 = test_rng_below(&rng, n), r1 = r0 + 1 + test_rng_below(&rng, n - r0);
        check(1 + test_rng_below(&rng, 20), n, k, r0, r1, 0);
    }
}

static void test_extremes(void **st)
{
    (void)st;
    check(7, 48, 1031, 0, 48, 1);  /* large negative sums, long k */
    check(9, 37, 2048, 0, 37, 2);  /* random signs at full magnitude */
}

static void test_linear(void **st)
{
    (void)st;
    /* the dequantized linear equals (s * scale[r]) * acc for every kernel */
    uint32_t m = 5, n = 40, k = 70;
    int8_t *q = malloc(n * k), *xq = malloc(m * k);
    fill(q, n * k, 0);
    fill(xq, m * k, 0);
    float scale[40], y[5 * 40];
    for (int i = 0; i < 40; i++)
        scale[i] = 0.01f * (float)(i + 1);
    struct npu_weights *w;
    assert_int_equal(npu_weights_create(q, scale, n, k, &w), 0);
    npu_linear_s8(w, xq, m, 0.5f, y);
    for (uint32_t i = 0; i < m; i++)
        for (uint32_t r = 0; r < n; r++) {
            int32_t acc = 0;
            for (uint32_t j = 0; j < k; j++)
                acc += xq[i * k + j] * q[r * k + j];
            assert_true(y[i * n + r] == (0.5f * scale[r]) * (float)acc);
        }
    /* quantization: round to nearest even, clamp at 127, zero for a bad scale */
    float x[6] = {0.5f, 1.5f, -2.5f, 1000.0f, -1000.0f, 3.2f};
    int8_t o[6];
    npu_quantize_act(x, 6, 1.0f, o);
    int8_t want[6] = {0, 2, -2, 127, -127, 3};
    assert_memory_equal(o, want, 6);
    npu_quantize_act(x, 6, 0.0f, o);
    for (int i = 0; i < 6; i++)
        assert_int_equal(o[i], 0);
    assert_true(npu_act_scale_dynamic(x, 6) == 1000.0f / 127.0f);
    float z[3] = {0, 0, 0};
    assert_true(npu_act_scale_dynamic(z, 3) == 1.0f);
    npu_weights_destroy(w);
    free(q);
    free(xq);
}

int main(void)
{
    test_rng_init(&rng, test_seed());
    for (int k = 0; k < NPU_KERNEL_COUNT; k++)
        fprintf(stderr, "kernel %-10s %s\n", npu_kernel_name((enum npu_kernel)k),
                npu_kernel_available((enum npu_kernel)k) ? "tested" : "not on this CPU: skipped");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shapes),
        cmocka_unit_test(test_ranges),
        cmocka_unit_test(test_extremes),
        cmocka_unit_test(test_linear),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

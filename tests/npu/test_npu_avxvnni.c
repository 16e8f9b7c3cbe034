/* test_npu_avxvnni.c: the AVX-VNNI kernel's logic (staging, tiling, edges,
 * correction, dequantization) against the scalar reference on CPUs without
 * AVX-VNNI: its source is compiled here with vpdpbusd in the EVEX encoding
 * (AVX512-VL VNNI, the same operation), see npu_gemm_avxvnni.c. Where the
 * CPU has AVX-VNNI itself, test_npu_gemm runs the real kernel. Skips without
 * AVX-512 VNNI. */
#define NPU_AVXVNNI_EVEX 1
#include "npu_gemm_avxvnni.c"

#include <stdio.h>
#include <stdlib.h>

#include "testutil.h"

extern const struct npu_kernel_ops npu_ops_avxvnni_evex;

static struct test_rng rng;

static void check(uint32_t m, uint32_t n, uint32_t k, uint32_t r0, uint32_t r1, int extreme)
{
    int8_t *a = malloc((size_t)m * k), *bw = malloc((size_t)n * k);
    float *scale = malloc(sizeof(float) * n);
    for (size_t i = 0; i < (size_t)m * k; i++)
        a[i] = extreme ? 127 : (int8_t)((int)test_rng_below(&rng, 255) - 127);
    for (size_t i = 0; i < (size_t)n * k; i++)
        bw[i] = extreme ? -127 : (int8_t)((int)test_rng_below(&rng, 255) - 127);
    for (uint32_t r = 0; r < n; r++)
        scale[r] = 1e-3f * (1.0f + test_rng_float(&rng));
    struct npu_gemm_b *b;
    assert_int_equal(npu_gemm_b_create(bw, n, k, &b), 0);
    const uint32_t w = r1 - r0;
    int32_t *c[2];
    float *y[2];
    const struct npu_kernel_ops *ops[2] = {&npu_ops_scalar, &npu_ops_avxvnni_evex};
    for (int v = 0; v < 2; v++) {
        uint8_t *stage = malloc(npu_gemm_prep_bytes(b->k4, m));
        c[v] = malloc(sizeof(int32_t) * m * w);
        y[v] = malloc(sizeof(float) * m * w);
        ops[v]->prep(a, k, m, k, b->k4, 0, stage);
        struct npu_gemm_args g = {.b = b, .a = stage, .m = m, .r0 = r0, .r1 = r1, .c = c[v],
                                  .ldc = w, .act_scale = 0.02f, .scale = scale};
        ops[v]->gemm(&g);
        g.c = NULL, g.y = y[v], g.ldy = w;
        ops[v]->gemm(&g);
        free(stage);
    }
    for (size_t i = 0; i < (size_t)m * w; i++)
        if (c[0][i] != c[1][i] || memcmp(&y[0][i], &y[1][i], sizeof(float)))
            fail_msg("avxvnni m=%u n=%u k=%u [%u,%u): [%zu][%zu] %d / %.9g, scalar %d / %.9g", m,
                     n, k, r0, r1, i / w, i % w, c[1][i], (double)y[1][i], c[0][i],
                     (double)y[0][i]);
    for (int v = 0; v < 2; v++)
        free(c[v]), free(y[v]);
    npu_gemm_b_destroy(b);
    free(a);
    free(bw);
    free(scale);
}

static void test_avxvnni_logic(void **st)
{
    (void)st;
    static const uint32_t ms[] = {1, 2, 3, 4, 7, 16};
    static const uint32_t ns[] = {1, 8, 15, 16, 17, 40, 100};
    static const uint32_t ks[] = {1, 3, 4, 6, 33, 130};
    for (size_t i = 0; i < 6; i++)
        for (size_t j = 0; j < 7; j++)
            for (size_t q = 0; q < 6; q++)
                check(ms[i], ns[j], ks[q], 0, ns[j], 0);
    for (int t = 0; t < 40; t++) {
        uint32_t n = 1 + test_rng_below(&rng, 120);
        uint32_t r0 = test_rng_below(&rng, n), r1 = r0 + 1 + test_rng_below(&rng, n - r0);
        check(1 + test_rng_below(&rng, 12), n, 1 + test_rng_below(&rng, 200), r0, r1, 0);
    }
    check(5, 35, 2051, 0, 35, 1); /* a = 127, b = -127 everywhere */
}

int main(void)
{
    if (!sl_cpu_features_hw()->avx512vnni)
        test_skip_all("this CPU has no AVX-512 VNNI to run the EVEX build of the AVX-VNNI "
                      "kernel");
    test_rng_init(&rng, test_seed());
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_avxvnni_logic)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}

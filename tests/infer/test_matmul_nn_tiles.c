/* test_matmul_nn_tiles.c: the probabilities-times-values kernels
 * (infer_matmul_nn_avx2: 4-row tiles of 24, 16 and 8 columns, 2-row tiles of
 * 32 and the masked column tail; infer_matmul_nn_avx512: 1-4 rows in
 * chunks of 4 16-lane vectors and a tail of 1-3, 5-8 rows in 32-column
 * passes of 1-2 vectors) compute every output element
 * as one FMA chain over the keys in ascending order, from zero or (add) from
 * y: the bits of the scalar twin below (fmaf, the same chain), for random
 * row counts (1-4, 1-8), key counts, column counts around every tile edge,
 * strides and both start modes; the stride gaps stay untouched. Seed printed
 * (testutil). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "infer_matmul.h"
#include "testutil.h"

static struct test_rng rng;

#ifdef SLUICE_KERNELS_X86
/* The twin: y[i][c] = fma(p[i][t], v[t][c], y[i][c]) for t = 0.. in order. */
static void nn_fma_twin(float *y, size_t ldy, const float *p, size_t ldp, uint32_t mr,
                        const float *v, size_t ldv, uint32_t T, uint32_t cols, int add)
{
    for (uint32_t i = 0; i < mr; i++)
        for (uint32_t c = 0; c < cols; c++) {
            float acc = add ? y[i * ldy + c] : 0.0f;
            for (uint32_t t = 0; t < T; t++)
                acc = fmaf(p[i * ldp + t], v[t * ldv + c], acc);
            y[i * ldy + c] = acc;
        }
}

static void fill(float *a, size_t n)
{
    for (size_t i = 0; i < n; i++)
        a[i] = test_rng_normal(&rng);
}
#endif

#ifdef SLUICE_KERNELS_X86
/* fn (up to max_rows rows a call) against the twin on random shapes */
static void nn_bits(infer_matmul_nn_fn *fn, enum infer_matmul_kernel k, uint32_t max_rows)
{
    static const uint32_t colss[] = {1,  7,  8,  15, 16, 17, 23, 24, 25,  31,  32,  33,  40, 47,
                                     48, 49, 56, 63, 64, 65, 72, 80, 96, 112, 113, 127, 128, 130};
    uint32_t checked = 0, wide = 0;
    for (int it = 0; it < 400; it++) {
        uint32_t mr = 1 + test_rng_below(&rng, max_rows), T = 1 + test_rng_below(&rng, 300);
        uint32_t C = colss[test_rng_below(&rng, sizeof colss / sizeof colss[0])];
        int add = (int)test_rng_below(&rng, 2);
        size_t ldp = T + test_rng_below(&rng, 5), ldv = C + test_rng_below(&rng, 40);
        size_t ldy = C + test_rng_below(&rng, 4);
        float *p = malloc(sizeof(float) * mr * ldp), *v = malloc(sizeof(float) * T * ldv);
        float *y0 = malloc(sizeof(float) * mr * ldy), *y1 = malloc(sizeof(float) * mr * ldy);
        assert_true(p && v && y0 && y1);
        fill(p, mr * ldp);
        fill(v, T * ldv);
        for (size_t i = 0; i < mr * ldy; i++) /* a start for add; gaps must stay */
            y0[i] = y1[i] = (i % ldy) < C ? test_rng_normal(&rng) : -9.0f;
        nn_fma_twin(y0, ldy, p, ldp, mr, v, ldv, T, C, add);
        fn(y1, ldy, p, ldp, mr, v, ldv, T, C, add);
        if (memcmp(y0, y1, sizeof(float) * mr * ldy) != 0)
            fail_msg("nn %s rows %u T %u cols %u add %d: not the FMA chain's bits",
                     infer_matmul_kernel_name(k), mr, T, C, add);
        checked += mr == 4 && C >= 8;
        wide += mr > 4;
        free(p);
        free(v);
        free(y0);
        free(y1);
    }
    assert_true(checked > 200 / max_rows); /* the 4-row tiles were exercised */
    if (max_rows > 4)
        assert_true(wide > 100); /* and the 5-8-row passes */
}

/* Every row count, every column count 0-130 (each tile and tail after full
 * chunks), 0, 1 and 37 keys, both start modes: fn against the twin, with a
 * guard after the last row (a mask past the end fails here, not only under
 * ASan) and gaps between rows that must keep their fill. */
static void nn_sweep(infer_matmul_nn_fn *fn, enum infer_matmul_kernel k, uint32_t max_rows)
{
    enum { GUARD = 16, MAXC = 130, MAXT = 37 };
    static const uint32_t Ts[] = {0, 1, MAXT};
    float *p = malloc(sizeof(float) * 8 * MAXT), *v = malloc(sizeof(float) * MAXT * MAXC);
    float *y0 = malloc(sizeof(float) * (8 * (MAXC + 3) + GUARD));
    float *y1 = malloc(sizeof(float) * (8 * (MAXC + 3) + GUARD));
    assert_true(p && v && y0 && y1 && max_rows <= 8);
    fill(p, 8 * MAXT);
    fill(v, MAXT * MAXC);
    for (uint32_t mr = 1; mr <= max_rows; mr++)
        for (uint32_t C = 0; C <= MAXC; C++)
            for (int add = 0; add < 2; add++)
                for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
                    const uint32_t T = Ts[ti];
                    const size_t ldy = C + 3, n = mr * ldy + GUARD;
                    for (size_t i = 0; i < n; i++)
                        y0[i] = y1[i] = i < mr * ldy && i % ldy < C ? (float)(i % 7) : -9.0f;
                    nn_fma_twin(y0, ldy, p, MAXT, mr, v, MAXC, T, C, add);
                    fn(y1, ldy, p, MAXT, mr, v, MAXC, T, C, add);
                    if (memcmp(y0, y1, sizeof(float) * n) != 0)
                        fail_msg("nn %s sweep rows %u T %u cols %u add %d: not the twin's bits "
                                 "(or a write outside the rows)",
                                 infer_matmul_kernel_name(k), mr, T, C, add);
                }
    free(p);
    free(v);
    free(y0);
    free(y1);
}
#endif

static void test_nn_avx2_bits(void **st)
{
    (void)st;
#ifndef SLUICE_KERNELS_X86
    printf("a build without the x86 kernels: the AVX2 tiles are not built\n");
    skip();
#else
    if (!infer_matmul_kernel_available(INFER_MATMUL_AVX2))
        skip();
    nn_bits(infer_matmul_nn_avx2, INFER_MATMUL_AVX2, 4);
    nn_sweep(infer_matmul_nn_avx2, INFER_MATMUL_AVX2, 4);
#endif
}

static void test_nn_avx512_bits(void **st)
{
    (void)st;
#ifndef SLUICE_KERNELS_X86
    printf("a build without the x86 kernels: the AVX-512 kernel is not built\n");
    skip();
#else
    if (!infer_matmul_kernel_available(INFER_MATMUL_AVX512))
        skip();
    nn_bits(infer_matmul_nn_avx512, INFER_MATMUL_AVX512, INFER_MATMUL_NN_ROWS_AVX512);
    nn_sweep(infer_matmul_nn_avx512, INFER_MATMUL_AVX512, INFER_MATMUL_NN_ROWS_AVX512);
#endif
}

int main(void)
{
    test_rng_init(&rng, test_seed());
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_nn_avx2_bits),
                                       cmocka_unit_test(test_nn_avx512_bits)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}

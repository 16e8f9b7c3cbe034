/* test_npu_gemm_rows.c: the AVX2 few-rows int8 kernel (npu_gemm_rows_avx2.c,
 * 1..16 rows on blocks whose codes are within +-16) bit for bit against its
 * scalar reference (npu_gemm_rows_ref: the kernel's own int16 steps), the
 * exact scalar GEMM (the specification) and the AVX2 3x32 tiles it replaces
 * for 4..16 rows (npu_gemm_avx2_tiles), int32 and dequantized float outputs:
 * random shapes (k not a multiple of 4 or of the 64-value panel, ranges
 * inside blocks, an odd last block), extreme operands (a + 128 = 255 or 1
 * against codes +-16: the largest int16 rounds), and through the dispatched
 * kernel with tiny and wider blocks mixed. Also that the reference does
 * model int16 saturation: with codes of 17..64 it differs from the exact
 * GEMM, so agreement on tiny codes is a real check. And the staged linear
 * (npu_stage_act once, npu_linear_s8_staged per refill) against
 * npu_linear_s8_range. Every GEMM also runs a third pass adding its float
 * output to a random residual (npu_gemm_args.add, the pipeline's fused
 * residual add) on a wider row stride: the scalar kernel's sums against
 * residual + its own float output, the others against the scalar's, bit for
 * bit, and no write past a row's channels. Seed printed. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "npu.h"
#include "npu_gemm_internal.h"
#include "testutil.h"

static struct test_rng rng;

/* mode 0: random a, codes in [-16, 16]; 1: a = 127, codes +16 or -16 per
 * row (u = 255: rounds of 4 x 8160); 2: a = -127 (u = 1) and +-127 mixed,
 * codes +-16; 3: codes in [-16, 16] but a few rows wide (mixed blocks) */
static void make(int8_t *a, size_t na, int8_t *b, uint32_t n, uint32_t k, int mode)
{
    for (size_t i = 0; i < na; i++)
        a[i] = mode == 1   ? 127
               : mode == 2 ? (int8_t)(test_rng_below(&rng, 2) ? 127 : -127)
                           : (int8_t)((int)test_rng_below(&rng, 255) - 127);
    for (uint32_t r = 0; r < n; r++) {
        int8_t s = (int8_t)(test_rng_below(&rng, 2) ? NPU_GEMM_TINY : -NPU_GEMM_TINY);
        int wide = mode == 3 && test_rng_below(&rng, 6) == 0;
        for (uint32_t j = 0; j < k; j++) {
            int8_t *p = b + (size_t)r * k + j;
            if (mode == 1 || mode == 2)
                *p = s;
            else if (wide)
                *p = (int8_t)((int)test_rng_below(&rng, 255) - 127);
            else
                *p = (int8_t)((int)test_rng_below(&rng, 2 * NPU_GEMM_TINY + 1) - NPU_GEMM_TINY);
        }
    }
}

struct out {
    int32_t *c;
    float *y;
    float *ya; /* the add pass's output: [m][w + ADD_PAD], the residual plus y */
};

/* The add pass's rows are ADD_PAD floats wider than the outputs (the
 * pipeline's residual rows are a wider stride apart), the gap a sentinel
 * that no kernel may write. */
#define ADD_PAD 5
#define ADD_SENTINEL 7.25f

/* One GEMM into o (int32, then float, then the float added to the residual
 * res [m][w + ADD_PAD], npu_gemm_args.add) through fn, or (fn NULL) the rows
 * kernel / reference column by column (rows_fn). */
static void run(void (*fn)(const struct npu_gemm_args *),
                void (*rows_fn)(const struct npu_gemm_args *, uint32_t, int),
                const struct npu_gemm_b *pb, const uint8_t *stage, uint32_t m, uint32_t r0,
                uint32_t r1, const float *scale, const float *res, struct out *o)
{
    uint32_t w = r1 - r0;
    memset(o->c, 0x55, sizeof(int32_t) * m * w);
    memset(o->y, 0x55, sizeof(float) * m * w);
    memcpy(o->ya, res, sizeof(float) * m * (w + ADD_PAD));
    struct npu_gemm_args g = {.b = pb, .a = stage, .m = m, .r0 = r0, .r1 = r1, .c = o->c,
                              .ldc = w, .act_scale = 0.0173f, .scale = scale};
    for (int pass = 0; pass < 3; pass++) {
        if (pass == 1) {
            g.c = NULL;
            g.y = o->y;
            g.ldy = w;
        } else if (pass == 2) {
            g.y = o->ya;
            g.ldy = w + ADD_PAD;
            g.add = 1;
        }
        if (fn) {
            fn(&g);
            continue;
        }
        const uint32_t blk0 = r0 / 16, blk1 = (r1 + 15) / 16;
        for (uint32_t bl = blk0; bl < blk1; bl += 2)
            rows_fn(&g, bl, blk1 - bl >= 2 ? 2 : 1);
    }
}

static void expect_same(const struct out *got, const struct out *ref, uint32_t m, uint32_t w,
                        const char *what, uint32_t n, uint32_t k, int mode)
{
    const size_t lda = w + ADD_PAD;
    for (size_t i = 0; i < (size_t)m * lda; i++) {
        if (i % lda >= w && got->ya[i] != ADD_SENTINEL)
            fail_msg("%s m=%u n=%u k=%u mode %d: the add wrote past its row (y[%zu][%zu])", what, m,
                     n, k, mode, i / lda, i % lda);
        if (i % lda < w && memcmp(&got->ya[i], &ref->ya[i], sizeof(float)))
            fail_msg("%s m=%u n=%u k=%u mode %d: y[%zu][%zu] added = %.9g, exact %.9g", what, m, n,
                     k, mode, i / lda, i % lda, (double)got->ya[i], (double)ref->ya[i]);
    }
    for (size_t i = 0; i < (size_t)m * w; i++) {
        if (got->c[i] != ref->c[i])
            fail_msg("%s m=%u n=%u k=%u mode %d: C[%zu][%zu] = %d, exact %d", what, m, n, k, mode,
                     i / w, i % w, got->c[i], ref->c[i]);
        if (memcmp(&got->y[i], &ref->y[i], sizeof(float)))
            fail_msg("%s m=%u n=%u k=%u mode %d: y[%zu][%zu] = %.9g, exact %.9g", what, m, n, k,
                     mode, i / w, i % w, (double)got->y[i], (double)ref->y[i]);
    }
}

static void check(uint32_t m, uint32_t n, uint32_t k, uint32_t r0, uint32_t r1, int mode)
{
    int8_t *a = malloc((size_t)m * k), *b = malloc((size_t)n * k);
    float *scale = malloc(sizeof(float) * n);
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(scale);
    make(a, (size_t)m * k, b, n, k, mode);
    for (uint32_t r = 0; r < n; r++)
        scale[r] = (0.5f + test_rng_float(&rng)) * 1e-3f;
    struct npu_gemm_b *pb;
    assert_int_equal(npu_gemm_b_create(b, n, k, &pb), 0);
    const uint32_t w = r1 - r0;
    const size_t lda = w + ADD_PAD;
    struct out o[4];
    for (int i = 0; i < 4; i++) {
        o[i].c = malloc(sizeof(int32_t) * m * w);
        o[i].y = malloc(sizeof(float) * m * w);
        o[i].ya = malloc(sizeof(float) * m * lda);
        assert_non_null(o[i].c);
        assert_non_null(o[i].y);
        assert_non_null(o[i].ya);
    }
    /* the residual: random, of the outputs' magnitude and far beyond it */
    float *res = malloc(sizeof(float) * m * lda);
    assert_non_null(res);
    for (size_t i = 0; i < (size_t)m * lda; i++)
        res[i] = i % lda < w ? (test_rng_float(&rng) - 0.5f) * (i % 3 ? 0.5f : 1e5f) : ADD_SENTINEL;
    /* the exact GEMM, from the scalar staging */
    uint8_t *st_s = malloc(npu_gemm_prep_bytes(pb->k4, m)), *st = malloc(npu_gemm_prep_bytes(pb->k4, m));
    assert_non_null(st_s);
    assert_non_null(st);
    npu_ops_scalar.prep(a, k, m, k, pb->k4, 0, st_s);
    run(npu_ops_scalar.gemm, NULL, pb, st_s, m, r0, r1, scale, res, &o[0]);
    /* the add's definition: the residual plus the float output, one rounding */
    for (size_t i = 0; i < (size_t)m * w; i++) {
        float want = res[i / w * lda + i % w] + o[0].y[i];
        if (memcmp(&o[0].ya[i / w * lda + i % w], &want, sizeof(float)))
            fail_msg("scalar m=%u n=%u k=%u mode %d: y[%zu][%zu] added = %.9g, residual + y %.9g",
                     m, n, k, mode, i / w, i % w, (double)o[0].ya[i / w * lda + i % w],
                     (double)want);
    }
    /* the AVX2 staging (signed, 3-row interleave) is what the rows kernel
     * reads; the reference is portable C and reads it too */
    int avx2 = npu_kernel_available(NPU_KERNEL_AVX2);
    if (avx2)
        npu_ops_avx2.prep(a, k, m, k, pb->k4, 0, st);
    else { /* the same layout, built here */
        memset(st, 0, npu_gemm_prep_bytes(pb->k4, m));
        for (uint32_t i = 0; i < m; i++)
            for (uint32_t j = 0; j < k; j++)
                st[npu_gemm_a_off(i, j / 4, pb->k4, 3) + j % 4] = (uint8_t)a[(size_t)i * k + j];
    }
    int all_tiny = 1;
    for (uint32_t bl = r0 / 16; bl < (r1 + 15) / 16; bl++)
        all_tiny &= pb->tiny[bl];
    assert_true(all_tiny || mode == 3);
    if (all_tiny) {
        run(NULL, npu_gemm_rows_ref, pb, st, m, r0, r1, scale, res, &o[1]);
        expect_same(&o[1], &o[0], m, w, "reference", n, k, mode);
    }
    if (avx2) {
        if (all_tiny) {
            run(NULL, npu_gemm_rows_avx2, pb, st, m, r0, r1, scale, res, &o[2]);
            expect_same(&o[2], &o[0], m, w, "rows kernel", n, k, mode);
        }
        run(npu_gemm_avx2_tiles, NULL, pb, st, m, r0, r1, scale, res, &o[3]);
        expect_same(&o[3], &o[0], m, w, "avx2 tiles", n, k, mode);
        run(npu_ops_avx2.gemm, NULL, pb, st, m, r0, r1, scale, res, &o[2]);
        expect_same(&o[2], &o[3], m, w, "avx2 dispatched vs tiles", n, k, mode);
    }
    npu_gemm_b_destroy(pb);
    for (int i = 0; i < 4; i++) {
        free(o[i].c);
        free(o[i].y);
        free(o[i].ya);
    }
    free(res);
    free(st_s);
    free(st);
    free(a);
    free(b);
    free(scale);
}

static void test_random(void **state)
{
    (void)state;
    for (int t = 0; t < 300; t++) {
        uint32_t m = 1 + test_rng_below(&rng, NPU_GEMM_ROWS_MAX);
        uint32_t n = 1 + test_rng_below(&rng, 120), k = 1 + test_rng_below(&rng, 700);
        uint32_t r0 = test_rng_below(&rng, n), r1 = r0 + 1 + test_rng_below(&rng, n - r0);
        if (t % 4 == 0)
            r0 = 0, r1 = n;
        check(m, n, k, r0, r1, t % 5 == 4 ? 3 : 0);
    }
}

static void test_extremes(void **state)
{
    (void)state;
    for (uint32_t m = 1; m <= NPU_GEMM_ROWS_MAX; m++) {
        check(m, 48, 4099, 0, 48, 1);   /* u = 255, codes +-16, long k, padded */
        check(m, 37, 1031, 3, 35, 2);   /* u = 1 or 255, a range inside blocks */
        check(m, 70, 2048, 0, 70, 3);   /* tiny and wide blocks, the dispatcher */
    }
}

/* The reference models the int16 steps: with codes beyond +-16 (17 and up)
 * and u = 255 its rounds wrap and it must disagree with the exact GEMM
 * (so agreement above means the kernel's steps stay exact). */
static void test_reference_can_fail(void **state)
{
    (void)state;
    const uint32_t m = 2, n = 16, k = 64;
    int8_t a[2 * 64], b[16 * 64];
    memset(a, 127, sizeof a);
    memset(b, 40, sizeof b);
    struct npu_gemm_b *pb;
    assert_int_equal(npu_gemm_b_create(b, n, k, &pb), 0);
    assert_int_equal(pb->tiny[0], 0);
    uint8_t *st = calloc(1, npu_gemm_prep_bytes(pb->k4, m));
    assert_non_null(st);
    for (uint32_t i = 0; i < m; i++)
        for (uint32_t j = 0; j < k; j++)
            st[npu_gemm_a_off(i, j / 4, pb->k4, 3) + j % 4] = (uint8_t)a[(size_t)i * k + j];
    int32_t c[2 * 16];
    struct npu_gemm_args g = {.b = pb, .a = st, .m = m, .r0 = 0, .r1 = n, .c = c, .ldc = n};
    npu_gemm_rows_ref(&g, 0, 1);
    assert_int_not_equal(c[0], 127 * 40 * 64); /* the exact sum */
    free(st);
    npu_gemm_b_destroy(pb);
}

/* npu_linear_s8_staged (activations staged once, npu_stage_act) equals
 * npu_linear_s8_range bit for bit: weights refilled between calls with the
 * same staging, random rows, shapes and channel ranges. */
static void test_staged(void **state)
{
    (void)state;
    for (int t = 0; t < 60; t++) {
        uint32_t m = 1 + test_rng_below(&rng, NPU_GEMM_ROWS_MAX);
        uint32_t n = 1 + test_rng_below(&rng, 100), k = 1 + test_rng_below(&rng, 600);
        int8_t *a = malloc((size_t)m * k), *b = malloc((size_t)n * k);
        float *scale = malloc(sizeof(float) * n), *want = malloc(sizeof(float) * m * n);
        float *got = malloc(sizeof(float) * m * n);
        void *st = sl_alloc_aligned(npu_stage_bytes(m, k), 64);
        assert_true(a && b && scale && want && got && st);
        make(a, (size_t)m * k, b, n, k, t % 3 == 2 ? 3 : 0);
        npu_stage_act(a, m, k, st);
        struct npu_weights *w;
        assert_int_equal(npu_weights_alloc(n, k, &w), 0);
        for (int fill = 0; fill < 3; fill++) {
            for (size_t i = 0; i < (size_t)n * k; i++)
                if (fill)
                    b[i] = (int8_t)((int)test_rng_below(&rng, 33) - 16);
            for (uint32_t r = 0; r < n; r++)
                scale[r] = 1e-3f * (float)(1 + test_rng_below(&rng, 1000));
            assert_int_equal(npu_weights_fill(w, 0, n, b, scale), 0);
            uint32_t r0 = test_rng_below(&rng, n), r1 = r0 + 1 + test_rng_below(&rng, n - r0);
            memset(want, 0, sizeof(float) * m * n);
            memset(got, 0, sizeof(float) * m * n);
            npu_linear_s8_range(w, a, m, 0.031f, want, n, r0, r1);
            npu_linear_s8_staged(w, st, m, 0.031f, got, n, r0, r1);
            assert_memory_equal(got, want, sizeof(float) * m * n);
        }
        npu_weights_destroy(w);
        sl_free_aligned(st);
        free(a);
        free(b);
        free(scale);
        free(want);
        free(got);
    }
}

int main(void)
{
    test_rng_init(&rng, test_seed());
    fprintf(stderr, "avx2 few-rows kernel: %s\n",
            npu_kernel_available(NPU_KERNEL_AVX2) ? "tested"
                                                  : "not on this CPU: reference only");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random),
        cmocka_unit_test(test_extremes),
        cmocka_unit_test(test_reference_can_fail),
        cmocka_unit_test(test_staged),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_gptq.c: GPTQ-style error compensation (quantizer_gptq.c) and the
 * shadow calibration of one linear (quantizer_shadow.c), on random data
 * (seed printed):
 *  - GPTQ's codes stay on each row's grid, rows of width 1 are untouched,
 *    and the output error ||X W^T - X (s Q)^T||^2 on the calibration rows is
 *    below round-to-nearest's (correlated inputs, where it matters);
 *  - the shadow calibration's bulk scale leaves about the asked share of
 *    activations beyond it, its hot channels are those holding the
 *    outliers, its hot columns are the codes, and a high importance
 *    threshold prunes (the maximum-based scale kept). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quantizer_internal.h"
#include "testutil.h"

static double out_err(const float *w, const int8_t *q, const float *sc, const float *x,
                      uint32_t rows, uint32_t cols, uint32_t n)
{
    double e = 0;
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t r = 0; r < rows; r++) {
            if (r == 5)
                continue; /* the width-1 row: the same codes either way */
            double a = 0, b = 0;
            for (uint32_t c = 0; c < cols; c++) {
                a += (double)x[(size_t)i * cols + c] * w[(size_t)r * cols + c];
                b += (double)x[(size_t)i * cols + c] * sc[r] * q[(size_t)r * cols + c];
            }
            e += (a - b) * (a - b);
        }
    return e;
}

static void test_gptq_beats_rtn(void **st)
{
    (void)st;
    struct test_rng g;
    test_rng_init(&g, test_seed());
    const uint32_t rows = 24, cols = 64, n = 256;
    float *w = malloc(sizeof(float) * rows * cols), *x = malloc(sizeof(float) * n * cols);
    float *sc = malloc(sizeof(float) * rows), *tmp = malloc(sizeof(float) * cols);
    int8_t *q0 = malloc(rows * cols), *q1 = malloc(rows * cols);
    uint8_t *wid = malloc(rows);
    for (uint32_t i = 0; i < rows * cols; i++)
        w[i] = test_rng_normal(&g);
    /* correlated inputs: a few shared factors plus noise */
    for (uint32_t i = 0; i < n; i++) {
        float f[4];
        for (int k = 0; k < 4; k++)
            f[k] = test_rng_normal(&g);
        for (uint32_t c = 0; c < cols; c++)
            x[(size_t)i * cols + c] = f[c % 4] + 0.3f * test_rng_normal(&g);
    }
    for (uint32_t b = 2; b <= 8; b += 3) {
        for (uint32_t r = 0; r < rows; r++)
            wid[r] = r == 5 ? 1 : (uint8_t)b;
        quantizer_tensor_quantize(w, rows, cols, NULL, wid, QUANTIZER_CLIP_MSE, q0, sc, tmp);
        memcpy(q1, q0, rows * cols);
        assert_int_equal(quantizer_gptq(w, rows, cols, x, n, NULL, wid, sc, q1), 0);
        int lim = (1 << (b - 1)) - 1;
        for (uint32_t r = 0; r < rows; r++)
            for (uint32_t c = 0; c < cols; c++) {
                int v = q1[(size_t)r * cols + c];
                if (r == 5)
                    assert_int_equal(v, q0[(size_t)r * cols + c]);
                else
                    assert_true(v >= -lim && v <= lim);
            }
        double e0 = out_err(w, q0, sc, x, rows, cols, n), e1 = out_err(w, q1, sc, x, rows, cols, n);
        if (!(e1 < 0.9 * e0))
            fail_msg("%u bits: GPTQ error %g, round-to-nearest %g", b, e1, e0);
    }
    /* no calibration rows: the codes stay */
    memcpy(q1, q0, rows * cols);
    assert_int_equal(quantizer_gptq(w, rows, cols, x, 0, NULL, wid, sc, q1), 0);
    assert_memory_equal(q0, q1, rows * cols);
    free(w);
    free(x);
    free(sc);
    free(tmp);
    free(q0);
    free(q1);
    free(wid);
}

/* Block multipliers (quantizer_mult.c): codes stay on each row's grid, the
 * multipliers are within 1..format_packed_mult_max(b), the NPU's values are
 * code * m, and with weights whose magnitude varies from block to block the
 * output error is below GPTQ on the plain grid of the same width. */
static void test_block_mult(void **st)
{
    (void)st;
    struct test_rng g;
    test_rng_init(&g, test_seed() + 2);
    const uint32_t rows = 24, cols = 128, n = 256, nb = cols / 32;
    float *w = malloc(sizeof(float) * rows * cols), *x = malloc(sizeof(float) * n * cols);
    float *sc0 = malloc(sizeof(float) * rows), *sc1 = malloc(sizeof(float) * rows);
    float *tmp = malloc(sizeof(float) * cols);
    int8_t *q0 = malloc(rows * cols), *q1 = malloc(rows * cols), *npu = malloc(rows * cols);
    uint8_t *wid = malloc(rows), *m = malloc(rows * nb);
    for (uint32_t i = 0; i < rows * cols; i++) /* blocks of 32 at scales 1, 1/2, 1/4, 1/8 */
        w[i] = test_rng_normal(&g) / (float)(1u << ((i % cols) / 32 + i / cols) % 4);
    for (uint32_t i = 0; i < n * cols; i++)
        x[i] = test_rng_normal(&g);
    for (uint32_t b = 3; b <= 8; b++) {
        for (uint32_t r = 0; r < rows; r++)
            wid[r] = r == 6 ? 1 : (uint8_t)b;
        quantizer_tensor_quantize(w, rows, cols, NULL, wid, QUANTIZER_CLIP_MSE, q0, sc0, tmp);
        memcpy(q1, q0, rows * cols);
        memcpy(sc1, sc0, sizeof(float) * rows);
        assert_int_equal(quantizer_gptq(w, rows, cols, x, n, NULL, wid, sc0, q0), 0);
        assert_int_equal(quantizer_mult(w, rows, cols, x, n, NULL, wid, sc1, q1, m, npu), 0);
        for (uint32_t r = 0; r < rows; r++) {
            int l = wid[r] == 1 ? 1 : (1 << (wid[r] - 1)) - 1;
            for (uint32_t c = 0; c < cols; c++) {
                size_t e = (size_t)r * cols + c;
                uint32_t mm = m[r * nb + c / 32];
                assert_true(q1[e] >= -l && q1[e] <= l);
                assert_true(mm >= 1 && mm <= (wid[r] == 1 ? 1 : format_packed_mult_max(wid[r])));
                assert_int_equal(npu[e], q1[e] * (int)mm);
            }
        }
        double e0 = 0, e1 = 0;
        for (uint32_t i = 0; i < n; i++)
            for (uint32_t r = 0; r < rows; r++) {
                if (wid[r] == 1)
                    continue;
                double a = 0, d0 = 0, d1 = 0;
                for (uint32_t c = 0; c < cols; c++) {
                    double xv = x[(size_t)i * cols + c];
                    a += xv * w[(size_t)r * cols + c];
                    d0 += xv * sc0[r] * q0[(size_t)r * cols + c];
                    d1 += xv * sc1[r] * npu[(size_t)r * cols + c];
                }
                e0 += (a - d0) * (a - d0);
                e1 += (a - d1) * (a - d1);
            }
        if (b < 8 && !(e1 < 0.8 * e0)) /* at 8 bits M = 1: no multipliers to gain from */
            fail_msg("%u bits: block multipliers' error %g, plain grid %g", b, e1, e0);
    }
    free(w);
    free(x);
    free(sc0);
    free(sc1);
    free(tmp);
    free(q0);
    free(q1);
    free(npu);
    free(wid);
    free(m);
}

static void test_shadow_calibration(void **st)
{
    (void)st;
    struct test_rng g;
    test_rng_init(&g, test_seed() + 1);
    const uint32_t rows = 8, cols = 100, n = 400;
    float *x = malloc(sizeof(float) * n * cols);
    int8_t *codes = malloc(rows * cols);
    for (uint32_t i = 0; i < rows * cols; i++)
        codes[i] = (int8_t)((int)test_rng_below(&g, 255) - 127);
    for (uint32_t i = 0; i < n * cols; i++) {
        uint32_t c = i % cols;
        x[i] = test_rng_normal(&g) * (c == 7 || c == 42 ? 30.0f : 1.0f); /* two hot channels */
    }
    float amax = 0;
    for (uint32_t i = 0; i < n * cols; i++)
        amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    struct quantizer_opts o = {.shadow = 1, .shadow_quantile = 0.99, .shadow_cover = 0.8,
                               .shadow_hot_max = 0.05};
    struct quantizer_shadow_in in = {.opts = &o, .layer = 3, .role = FORMAT_ROLE_W_DOWN,
                                     .rows = rows, .cols = cols, .x = x, .n_sample = n,
                                     .act_max = amax / 127, .codes = codes};
    struct format_shadow_linear e;
    float act;
    assert_int_equal(quantizer_shadow_calibrate(&in, &e, &act), 0);
    assert_true(e.flags & FORMAT_SHADOW_ON);
    assert_true(act < amax / 127 && act > 0);
    assert_true(e.calib_rate > 0.005 && e.calib_rate <= 0.0101);
    assert_true(fabsf(e.importance - amax / (act * 127)) < 1e-3f * e.importance);
    assert_int_equal(e.n_hot, 2);
    assert_int_equal(e.hot[0], 7);
    assert_int_equal(e.hot[1], 42);
    for (uint32_t k = 0; k < 2; k++)
        for (uint32_t r = 0; r < rows; r++)
            assert_int_equal(e.w[k * rows + r], codes[r * cols + e.hot[k]]);
    free(e.hot);
    free(e.w);
    /* pruned: importance below the threshold */
    o.shadow_min_importance = 1e6;
    assert_int_equal(quantizer_shadow_calibrate(&in, &e, &act), 0);
    assert_false(e.flags & FORMAT_SHADOW_ON);
    assert_true(act == amax / 127);
    assert_int_equal(e.n_hot, 0);
    free(x);
    free(codes);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gptq_beats_rtn),
        cmocka_unit_test(test_block_mult),
        cmocka_unit_test(test_shadow_calibration),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_npu_reshape.c: npu_weights_reshape, the int8 pool's reuse of one
 * weight storage for linears of other shapes (infer/pipeline_pool.c).
 * - a storage reshaped to a shape that fits, then filled, gives outputs
 *   bit for bit equal to weights created fresh with the same codes: random
 *   shapes (rows and columns off 16 and 4 included, so the padding the
 *   packer writes is checked over leftover bytes of an earlier, larger
 *   shape), more rows than the storage was made for (its per-row arrays
 *   grow), fewer, and back;
 * - a shape whose codes do not fit gives -ENOSPC, zero or too large
 *   dimensions -EINVAL, and the weights stay as they were (same shape, same
 *   outputs);
 * - npu_weights_capacity is the storage of the allocated shape. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "npu.h"
#include "testutil.h"

static struct test_rng rng;

static void random_codes(int8_t *q, float *sc, uint32_t rows, uint32_t cols)
{
    for (size_t i = 0; i < (size_t)rows * cols; i++)
        q[i] = (int8_t)((int)test_rng_below(&rng, 255) - 127);
    for (uint32_t r = 0; r < rows; r++)
        sc[r] = 0.001f + test_rng_float(&rng);
}

/* y of w on m random activation rows equals y of fresh weights of (q, sc) */
static void check_same(const struct npu_weights *w, const int8_t *q, const float *sc,
                       uint32_t rows, uint32_t cols)
{
    const uint32_t m = 5;
    int8_t *x = malloc((size_t)m * cols);
    float *y0 = malloc(sizeof(float) * m * rows), *y1 = malloc(sizeof(float) * m * rows);
    assert_non_null(x);
    assert_non_null(y0);
    assert_non_null(y1);
    for (size_t i = 0; i < (size_t)m * cols; i++)
        x[i] = (int8_t)((int)test_rng_below(&rng, 255) - 127);
    struct npu_weights *f;
    assert_int_equal(npu_weights_create(q, sc, rows, cols, &f), 0);
    npu_linear_s8(f, x, m, 0.5f, y0);
    npu_linear_s8(w, x, m, 0.5f, y1);
    for (size_t i = 0; i < (size_t)m * rows; i++)
        if (memcmp(&y0[i], &y1[i], sizeof(float)))
            fail_msg("%ux%u: output %zu differs: %.9g reshaped vs %.9g fresh", rows, cols, i,
                     (double)y1[i], (double)y0[i]);
    npu_weights_destroy(f);
    free(x);
    free(y0);
    free(y1);
}

static void fill(struct npu_weights *w, int8_t *q, float *sc, uint32_t rows, uint32_t cols)
{
    random_codes(q, sc, rows, cols);
    /* in 16-row pieces, last first, as the pipeline's unpacking tasks may */
    for (uint32_t r0 = (rows - 1) / 16 * 16;; r0 -= 16) {
        uint32_t n = rows - r0 < 16 ? rows - r0 : 16;
        assert_int_equal(npu_weights_fill(w, r0, n, q + (size_t)r0 * cols, sc + r0), 0);
        if (!r0)
            break;
    }
}

static void test_reshape_same_outputs(void **st)
{
    (void)st;
    const uint32_t R0 = 200, C0 = 300; /* storage: 208 x 300 codes */
    int8_t *q = malloc((size_t)4 * R0 * C0);
    float *sc = malloc(sizeof(float) * 16384); /* rows of any shape that fits (<= 62400 / 4) */
    assert_non_null(q);
    assert_non_null(sc);
    struct npu_weights *w;
    assert_int_equal(npu_weights_alloc(R0, C0, &w), 0);
    const size_t cap = npu_weights_capacity(w);
    assert_int_equal(cap, (size_t)208 * 300);
    fill(w, q, sc, R0, C0);
    check_same(w, q, sc, R0, C0);
    /* fixed cases: more rows (the per-row arrays grow), fewer, odd sizes */
    static const uint32_t fixed[][2] = {{760, 80}, {17, 5}, {1, 3}, {400, 156}, {33, 1},
                                        {200, 300}};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) {
        uint32_t rows = fixed[i][0], cols = fixed[i][1];
        assert_int_equal(npu_weights_reshape(w, rows, cols), 0);
        assert_int_equal(npu_weights_rows(w), rows);
        assert_int_equal(npu_weights_cols(w), cols);
        assert_int_equal(npu_weights_capacity(w), cap);
        fill(w, q, sc, rows, cols);
        check_same(w, q, sc, rows, cols);
    }
    for (int it = 0; it < 40; it++) {
        uint32_t rows = 1 + test_rng_below(&rng, 900), cols = 1 + test_rng_below(&rng, 400);
        size_t need = (size_t)((rows + 15) / 16 * 16) * ((cols + 3) / 4 * 4);
        uint32_t r0 = npu_weights_rows(w), c0 = npu_weights_cols(w);
        int ret = npu_weights_reshape(w, rows, cols);
        if (need > cap) {
            assert_int_equal(ret, -ENOSPC);
            assert_int_equal(npu_weights_rows(w), r0); /* unchanged: still computes */
            assert_int_equal(npu_weights_cols(w), c0);
            check_same(w, q, sc, r0, c0);
            continue;
        }
        assert_int_equal(ret, 0);
        fill(w, q, sc, rows, cols);
        check_same(w, q, sc, rows, cols);
    }
    uint32_t r0 = npu_weights_rows(w), c0 = npu_weights_cols(w);
    assert_int_equal(npu_weights_reshape(w, 0, 4), -EINVAL);
    assert_int_equal(npu_weights_reshape(w, 4, 0), -EINVAL);
    assert_int_equal(npu_weights_reshape(w, UINT32_MAX, 1), -EINVAL);
    assert_int_equal(npu_weights_reshape(w, 1, UINT32_MAX), -EINVAL);
    assert_int_equal(npu_weights_reshape(NULL, 4, 4), -EINVAL);
    assert_int_equal(npu_weights_reshape(w, 209, 300), -ENOSPC);
    assert_int_equal(npu_weights_rows(w), r0);
    assert_int_equal(npu_weights_cols(w), c0);
    check_same(w, q, sc, r0, c0);
    npu_weights_destroy(w);
    free(q);
    free(sc);
}

int main(void)
{
    uint64_t seed = test_seed();
    fprintf(stderr, "seed %llu\n", (unsigned long long)seed);
    test_rng_init(&rng, seed);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_reshape_same_outputs)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}

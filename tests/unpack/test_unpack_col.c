/* test_unpack_col.c: unpack_tensor_col against unpack_tensor_rows (the
 * specification's codes), bit for bit: every encoding (adaptive, bitplane,
 * int4int8), every width 1..8 (random per row), column counts with and
 * without tail groups (512) and tails of 8, adaptive with block
 * multipliers (header version 2, multipliers past the width's maximum
 * too); every column of small tensors, random columns of wide ones; a
 * column past the end refused. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quantizer.h"
#include "testutil.h"
#include "unpack.h"

static struct test_rng rng;

static int8_t rand_code(uint32_t b)
{
    if (b == 1)
        return test_rng_below(&rng, 2) ? 1 : -1;
    int m = (1 << (b - 1)) - 1;
    return (int8_t)((int)test_rng_below(&rng, (uint32_t)(2 * m + 1)) - m);
}

static void check(uint32_t enc, uint32_t rows, uint32_t cols, int with_mult)
{
    uint32_t nb = format_packed_mult_blocks(cols);
    uint8_t *widths = malloc(rows), *mult = malloc((size_t)rows * nb);
    int8_t *q = malloc((size_t)rows * cols), *all = malloc((size_t)rows * cols);
    int8_t *col = malloc(rows);
    float *scales = malloc(sizeof(float) * rows);
    for (uint32_t r = 0; r < rows; r++) {
        widths[r] = (uint8_t)(1 + test_rng_below(&rng, 8));
        scales[r] = 0.01f * (float)(r + 1);
        for (uint32_t k = 0; k < nb; k++)
            mult[(size_t)r * nb + k] = (uint8_t)(1 + test_rng_below(&rng, 4));
        for (uint32_t c = 0; c < cols; c++)
            q[(size_t)r * cols + c] = rand_code(widths[r]);
    }
    void *bytes;
    uint64_t len;
    struct sl_err err = {{0}};
    if (quantizer_pack_mult(enc, q, widths, scales, rows, cols, with_mult ? mult : NULL, &bytes,
                            &len, &err) < 0)
        fail_msg("pack %ux%u: %s", rows, cols, err.msg);
    struct unpack_tensor u;
    assert_int_equal(unpack_tensor_init(&u, enc, bytes, len, rows, cols, &err), 0);
    assert_int_equal(unpack_tensor_rows(&u, UNPACK_KERNEL_SCALAR, 0, rows, all, NULL), 0);
    uint32_t ncheck = cols <= 700 ? cols : 64;
    for (uint32_t t = 0; t < ncheck; t++) {
        uint32_t c = cols <= 700 ? t : test_rng_below(&rng, cols);
        if (t == ncheck - 1)
            c = cols - 1;
        memset(col, 0x5a, rows);
        assert_int_equal(unpack_tensor_col(&u, c, col), 0);
        for (uint32_t r = 0; r < rows; r++)
            if (col[r] != all[(size_t)r * cols + c])
                fail_msg("encoding %u, %ux%u%s: row %u (width %u) column %u: %d, rows give %d",
                         enc, rows, cols, with_mult ? " with multipliers" : "", r, widths[r], c,
                         col[r], all[(size_t)r * cols + c]);
    }
    assert_int_equal(unpack_tensor_col(&u, cols, col), -EINVAL);
    unpack_tensor_fini(&u);
    free(bytes);
    free(widths);
    free(mult);
    free(q);
    free(all);
    free(col);
    free(scales);
}

static void test_col(void **st)
{
    (void)st;
    static const uint32_t cols[] = {1, 7, 8, 64, 172, 512, 688, 1031, 2048, 5632};
    static const uint32_t encs[] = {FORMAT_ENC_ADAPTIVE, FORMAT_ENC_BITPLANE,
                                    FORMAT_ENC_INT4INT8};
    for (size_t e = 0; e < 3; e++)
        for (size_t i = 0; i < sizeof cols / sizeof cols[0]; i++) {
            uint32_t rows = 1 + test_rng_below(&rng, 40);
            check(encs[e], rows, cols[i], 0);
            if (encs[e] == FORMAT_ENC_ADAPTIVE)
                check(encs[e], rows, cols[i], 1);
        }
}

int main(void)
{
    test_rng_init(&rng, test_seed());
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_col)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}

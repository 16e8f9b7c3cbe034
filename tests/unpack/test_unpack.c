/* test_unpack.c: packed encodings.
 * - pack then unpack (scalar spec) gives the codes back, for every single
 *   width 1..8 and random mixes, over shapes with D < R, D = R, D a multiple
 *   of R, tails (D % R != 0, D % 8 != 0), for adaptive, bitplane, int4int8;
 * - every SIMD kernel the CPU has is bit-exact with the scalar kernel, also
 *   on arbitrary (random) code bytes, not only on packer output;
 * - corrupt packed tensors are rejected with a message. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quantizer.h"
#include "testutil.h"
#include "unpack.h"

static struct test_rng rng;

static const uint32_t encs[3] = {FORMAT_ENC_ADAPTIVE, FORMAT_ENC_BITPLANE, FORMAT_ENC_INT4INT8};
static const uint32_t colsets[] = {8, 64, 100, 172, 256, 511, 512, 513, 688, 1024, 1500, 2048};

static int8_t rand_code(uint32_t b)
{
    if (b == 1)
        return test_rng_below(&rng, 2) ? 1 : -1;
    int m = (1 << (b - 1)) - 1;
    return (int8_t)((int)test_rng_below(&rng, (uint32_t)(2 * m + 1)) - m);
}

/* For int4int8, widths <= 4 store nibbles: codes must fit [-7, 7] (they do,
 * the grid of b <= 4 is within it). */
static void check_case(uint32_t enc, uint32_t rows, uint32_t cols, const uint8_t *widths)
{
    int8_t *q = malloc((size_t)rows * cols), *out = malloc((size_t)rows * cols);
    float *sc = malloc(sizeof(float) * rows), *sc2 = malloc(sizeof(float) * rows);
    for (uint32_t r = 0; r < rows; r++) {
        sc[r] = 0.001f * (float)(r + 1);
        for (uint32_t c = 0; c < cols; c++)
            q[(size_t)r * cols + c] = rand_code(widths[r]);
    }
    void *bytes;
    uint64_t len;
    struct sl_err err;
    if (quantizer_pack(enc, q, widths, sc, rows, cols, &bytes, &len, &err) < 0)
        fail_msg("pack: %s", err.msg);
    struct format_tensor_info t = {.encoding = enc, .n_dims = 2, .shape = {rows, cols},
                                   .length = len};
    snprintf(t.name, sizeof t.name, "t");
    if (unpack_tensor_int8(&t, bytes, out, sc2, &err) < 0)
        fail_msg("unpack: %s", err.msg);
    if (memcmp(q, out, (size_t)rows * cols) != 0)
        fail_msg("%s %ux%u: round trip differs", format_encoding_traits(enc)->name, rows, cols);
    assert_memory_equal(sc, sc2, sizeof(float) * rows);
    /* every kernel against the scalar spec, on packer output and on random bytes */
    struct unpack_tensor u;
    assert_int_equal(unpack_tensor_init(&u, enc, bytes, len, rows, cols, &err), 0);
    int8_t *ref = malloc((size_t)rows * cols), *got = malloc((size_t)rows * cols);
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) /* arbitrary codes, including the values the packer never writes */
            for (uint64_t i = 0; i < u.layout.data_len; i++)
                ((uint8_t *)u.layout.data)[i] = (uint8_t)test_rng_u64(&rng);
        unpack_tensor_rows(&u, UNPACK_KERNEL_SCALAR, 0, rows, ref, NULL);
        for (int k = 1; k < UNPACK_KERNEL_COUNT; k++) {
            if (!unpack_kernel_available((enum unpack_kernel)k))
                continue;
            memset(got, 0x5a, (size_t)rows * cols);
            unpack_tensor_rows(&u, (enum unpack_kernel)k, 0, rows, got, NULL);
            for (size_t i = 0; i < (size_t)rows * cols; i++)
                if (got[i] != ref[i])
                    fail_msg("%s kernel %s, %ux%u, pass %d: weight %zu (row %zu, width %u) is "
                             "%d, scalar says %d",
                             format_encoding_traits(enc)->name,
                             unpack_kernel_name((enum unpack_kernel)k), rows, cols, pass, i,
                             i / cols, unpack_tensor_width(&u, (uint32_t)(i / cols)), got[i],
                             ref[i]);
        }
        /* int8 range: never -128 */
        for (size_t i = 0; i < (size_t)rows * cols; i++)
            assert_true(ref[i] != -128);
    }
    unpack_tensor_fini(&u);
    free(ref);
    free(got);
    free(bytes);
    free(q);
    free(out);
    free(sc);
    free(sc2);
}

static void test_single_widths(void **st)
{
    (void)st;
    for (int e = 0; e < 3; e++)
        for (uint32_t b = 1; b <= 8; b++)
            for (size_t ci = 0; ci < sizeof colsets / sizeof colsets[0]; ci++) {
                uint8_t w[5] = {(uint8_t)b, (uint8_t)b, (uint8_t)b, (uint8_t)b, (uint8_t)b};
                check_case(encs[e], 5, colsets[ci], w);
            }
}

static void test_mixed_widths(void **st)
{
    (void)st;
    for (int e = 0; e < 3; e++)
        for (int k = 0; k < 40; k++) {
            uint32_t rows = 1 + test_rng_below(&rng, 40);
            uint32_t cols = colsets[test_rng_below(&rng, sizeof colsets / sizeof colsets[0])];
            if (k % 4 == 0)
                cols = 1 + test_rng_below(&rng, 1200); /* any length */
            uint8_t *w = malloc(rows);
            for (uint32_t r = 0; r < rows; r++)
                w[r] = (uint8_t)(1 + test_rng_below(&rng, 8));
            check_case(encs[e], rows, cols, w);
            free(w);
        }
}

static void test_sizes(void **st)
{
    (void)st;
    /* adaptive and bitplane hold b bits per weight (rows padded to 8 weights);
     * int4int8 pads: 4 bits for b <= 4, 8 bits otherwise */
    for (uint32_t b = 1; b <= 8; b++) {
        assert_int_equal(format_packed_row_bytes(FORMAT_ENC_ADAPTIVE, b, 2048), b * 256);
        assert_int_equal(format_packed_row_bytes(FORMAT_ENC_BITPLANE, b, 2048), b * 256);
        assert_int_equal(format_packed_row_bytes(FORMAT_ENC_ADAPTIVE, b, 172), b * 22);
        assert_int_equal(format_packed_row_bytes(FORMAT_ENC_INT4INT8, b, 2048),
                         b <= 4 ? 1024 : 2048);
    }
}

static void test_rejects(void **st)
{
    (void)st;
    uint32_t rows = 4, cols = 600;
    uint8_t w[4] = {3, 5, 8, 1};
    int8_t *q = calloc(rows, cols);
    for (uint32_t i = 0; i < rows * cols; i++)
        q[i] = (int8_t)(i % 2 ? 1 : -1);
    float sc[4] = {1, 1, 1, 1};
    void *bytes;
    uint64_t len;
    struct sl_err err;
    assert_int_equal(quantizer_pack(FORMAT_ENC_ADAPTIVE, q, w, sc, rows, cols, &bytes, &len, &err),
                     0);
    struct format_tensor_info t = {.encoding = FORMAT_ENC_ADAPTIVE, .n_dims = 2,
                                   .shape = {rows, cols}, .length = len};
    int8_t *out = malloc(rows * cols);
    float so[4];
    uint8_t *b = bytes;
    /* truncated */
    t.length = len - 1;
    assert_int_equal(unpack_tensor_int8(&t, b, out, so, &err), -EINVAL);
    t.length = len;
    /* bad magic, bad shape in the header, a width change that breaks the length */
    b[0] ^= 1;
    assert_int_equal(unpack_tensor_int8(&t, b, out, so, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "magic"));
    b[0] ^= 1;
    b[8] ^= 1;
    assert_int_equal(unpack_tensor_int8(&t, b, out, so, &err), -EINVAL);
    b[8] ^= 1;
    b[FORMAT_PACKED_HEADER] ^= 7; /* row 0's width */
    assert_int_equal(unpack_tensor_int8(&t, b, out, so, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "widths"));
    b[FORMAT_PACKED_HEADER] ^= 7;
    /* a NaN scale */
    uint64_t scoff = format_packed_prefix_bytes(rows) - 64;
    float nan = __builtin_nanf("");
    uint8_t keep[4];
    memcpy(keep, b + scoff, 4);
    memcpy(b + scoff, &nan, 4);
    assert_int_equal(unpack_tensor_int8(&t, b, out, so, &err), -EINVAL);
    memcpy(b + scoff, keep, 4);
    assert_int_equal(unpack_tensor_int8(&t, b, out, so, &err), 0);
    assert_memory_equal(out, q, rows * cols);
    /* the packer refuses codes outside a width's grid */
    q[0] = 5; /* row 0 is 3 bits: grid [-3, 3] */
    assert_int_equal(quantizer_pack(FORMAT_ENC_ADAPTIVE, q, w, sc, rows, cols, &bytes, &len, &err),
                     -EINVAL);
    /* and a float tensor is not unpackable */
    t.encoding = FORMAT_ENC_F32;
    assert_int_equal(unpack_tensor_int8(&t, b, out, so, &err), -EINVAL);
    free(b);
    free(out);
    free(q);
}

int main(void)
{
    test_rng_init(&rng, test_seed());
    for (int k = 0; k < UNPACK_KERNEL_COUNT; k++)
        fprintf(stderr, "kernel %-7s %s\n", unpack_kernel_name((enum unpack_kernel)k),
                unpack_kernel_available((enum unpack_kernel)k) ? "tested" : "not on this CPU: skipped");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_single_widths),
        cmocka_unit_test(test_mixed_widths),
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_rejects),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

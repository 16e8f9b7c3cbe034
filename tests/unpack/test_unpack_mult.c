/* test_unpack_mult.c: packed adaptive tensors with block multipliers
 * (header version 2, docs/FORMAT-packed.md).
 * - the multiply kernels: every SIMD one bit-exact with the scalar one on
 *   random values and multipliers, lengths with and without tails;
 * - round trip: quantizer_pack_mult then unpack (unpack_tensor_int8, every
 *   kernel, cached and streaming stores, sub-ranges, unpack_row +
 *   unpack_row_mult, unpack_tensor_dot) gives q * min(m, mult_max(width)),
 *   for every width 1..8 mixed, row lengths below, at and past a group;
 * - arbitrary code and multiplier bytes: every kernel as the scalar one,
 *   values within [-127, 127];
 * - rejects: a multiplier block other than 32, nonzero bits after the
 *   multipliers, version 2 on another encoding, the packer's bad multipliers;
 *   a version 1 tensor still parses with none.
 * The seed is printed; SLUICE_TEST_SEED=<seed> replays a run. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quantizer.h"
#include "testutil.h"
#include "unpack.h"
#include "unpack_internal.h"

static struct test_rng rng;

static int8_t rand_code(uint32_t b)
{
    if (b == 1)
        return test_rng_below(&rng, 2) ? 1 : -1;
    int m = (1 << (b - 1)) - 1;
    return (int8_t)((int)test_rng_below(&rng, (uint32_t)(2 * m + 1)) - m);
}

static void test_mult_kernels(void **st)
{
    (void)st;
    static const uint32_t lens[] = {0, 1, 31, 32, 33, 64, 100, 255, 1024, 2049};
    const struct unpack_kernels *simd[] = {
#if SLUICE_KERNELS_X86
        sl_cpu_features()->avx2 ? &unpack_kernels_avx2 : NULL,
        sl_cpu_features()->avx512 ? &unpack_kernels_avx512 : NULL,
#endif
        NULL};
    int8_t a[2049], b[2049], src[2049];
    uint8_t m[65];
    for (uint32_t w = 1; w <= 8; w++)
        for (int rep = 0; rep < 20; rep++)
            for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
                uint32_t n = lens[li], mx = format_packed_mult_max(w);
                for (uint32_t i = 0; i < n; i++)
                    src[i] = rand_code(w);
                for (uint32_t k = 0; k < 65; k++)
                    m[k] = (uint8_t)(1 + test_rng_below(&rng, mx));
                memcpy(a, src, n);
                unpack_mult_scalar(a, n, m);
                for (uint32_t i = 0; i < n; i++) /* the definition */
                    assert_int_equal(a[i], src[i] * m[i / 32]);
                for (size_t k = 0; k < sizeof simd / sizeof simd[0]; k++) {
                    if (!simd[k])
                        continue;
                    memcpy(b, src, n);
                    simd[k]->mult(b, n, m);
                    if (memcmp(a, b, n) != 0)
                        fail_msg("mult kernel %zu, width %u, n %u: differs from scalar", k, w, n);
                }
            }
}

static void check_mult(uint32_t rows, uint32_t cols)
{
    uint32_t nb = format_packed_mult_blocks(cols);
    uint8_t *widths = malloc(rows), *mult = malloc((size_t)rows * nb);
    int8_t *q = malloc((size_t)rows * cols), *want = malloc((size_t)rows * cols);
    int8_t *got = sl_alloc_aligned((size_t)rows * cols, 64), *row = malloc(cols);
    float *scales = malloc(sizeof(float) * rows), *sc = malloc(sizeof(float) * rows);
    for (uint32_t r = 0; r < rows; r++) {
        widths[r] = (uint8_t)(1 + test_rng_below(&rng, 8));
        scales[r] = 0.01f * (float)(r + 1);
        for (uint32_t k = 0; k < nb; k++) /* any of 1..4, also past the width's maximum */
            mult[(size_t)r * nb + k] = (uint8_t)(1 + test_rng_below(&rng, 4));
        uint32_t mx = format_packed_mult_max(widths[r]);
        for (uint32_t c = 0; c < cols; c++) {
            size_t e = (size_t)r * cols + c;
            uint32_t m = mult[(size_t)r * nb + c / 32];
            q[e] = rand_code(widths[r]);
            want[e] = (int8_t)(q[e] * (m < mx ? m : mx));
        }
    }
    void *bytes;
    uint64_t len;
    struct sl_err err = {{0}};
    if (quantizer_pack_mult(FORMAT_ENC_ADAPTIVE, q, widths, scales, rows, cols, mult, &bytes, &len,
                            &err) < 0)
        fail_msg("pack %ux%u: %s", rows, cols, err.msg);
    uint64_t data = 0;
    for (uint32_t r = 0; r < rows; r++)
        data += format_packed_row_bytes(FORMAT_ENC_ADAPTIVE, widths[r], cols);
    assert_int_equal(len, format_packed_prefix_bytes_mult(rows, cols, 1) + data);
    assert_int_equal(sl_load_le32((const uint8_t *)bytes + 4), 2);
    assert_int_equal(sl_load_le32((const uint8_t *)bytes + 20), FORMAT_PACKED_MULT_BLOCK);
    struct format_tensor_info t;
    memset(&t, 0, sizeof t);
    snprintf(t.name, sizeof t.name, "blk.0.ffn_up");
    t.encoding = FORMAT_ENC_ADAPTIVE;
    t.n_dims = 2;
    t.shape[0] = rows;
    t.shape[1] = cols;
    t.length = len;
    if (unpack_tensor_int8(&t, bytes, got, sc, &err) < 0)
        fail_msg("unpack %ux%u: %s", rows, cols, err.msg);
    assert_memory_equal(got, want, (size_t)rows * cols);
    assert_memory_equal(sc, scales, sizeof(float) * rows);
    struct unpack_tensor u;
    assert_int_equal(unpack_tensor_init(&u, FORMAT_ENC_ADAPTIVE, bytes, len, rows, cols, &err), 0);
    assert_non_null(u.layout.mult);
    for (int k = 0; k < UNPACK_KERNEL_COUNT; k++) {
        if (!unpack_kernel_available((enum unpack_kernel)k))
            continue;
        for (int store = UNPACK_STORE_CACHED; store <= UNPACK_STORE_STREAM; store++) {
            memset(got, 0x5a, (size_t)rows * cols);
            assert_int_equal(unpack_tensor_rows_store(&u, (enum unpack_kernel)k, 0, rows, got, NULL,
                                                      (enum unpack_store)store),
                             0);
            if (memcmp(got, want, (size_t)rows * cols) != 0)
                fail_msg("kernel %s, store %d, %ux%u: rows differ",
                         unpack_kernel_name((enum unpack_kernel)k), store, rows, cols);
        }
        uint32_t r0 = test_rng_below(&rng, rows), r1 = r0 + 1 + test_rng_below(&rng, rows - r0);
        assert_int_equal(unpack_tensor_rows(&u, (enum unpack_kernel)k, r0, r1, got, NULL), 0);
        assert_memory_equal(got, want + (size_t)r0 * cols, (size_t)(r1 - r0) * cols);
        int8_t *x = malloc((size_t)2 * cols);
        int32_t acc[2 * 64];
        for (uint32_t c = 0; c < 2 * cols; c++)
            x[c] = (int8_t)((int)test_rng_below(&rng, 256) - 128);
        uint32_t d1 = rows < 64 ? rows : 64;
        assert_int_equal(unpack_tensor_dot(&u, (enum unpack_kernel)k, 0, d1, x, 2, acc, 64), 0);
        for (uint32_t i = 0; i < 2; i++)
            for (uint32_t r = 0; r < d1; r++) {
                int32_t s = 0;
                for (uint32_t c = 0; c < cols; c++)
                    s += (int32_t)want[(size_t)r * cols + c] * x[(size_t)i * cols + c];
                assert_int_equal(acc[i * 64 + r], s);
            }
        free(x);
    }
    /* arbitrary code and multiplier bytes: every kernel as the scalar one */
    int8_t *ref = malloc((size_t)rows * cols);
    uint8_t *save = malloc(u.layout.data_len);
    uint8_t *mb = (uint8_t *)u.layout.mult;
    uint64_t mlen = (2ull * rows * nb) / 8, mbits = 2ull * rows * nb;
    memcpy(save, u.layout.data, u.layout.data_len);
    for (uint64_t i = 0; i < u.layout.data_len; i++)
        ((uint8_t *)u.layout.data)[i] = (uint8_t)test_rng_u64(&rng);
    for (uint64_t i = 0; i < mlen; i++)
        mb[i] = (uint8_t)test_rng_u64(&rng);
    if (mbits % 8)
        mb[mlen] = (uint8_t)(test_rng_u64(&rng) & ((1u << (mbits % 8)) - 1));
    assert_int_equal(unpack_tensor_rows(&u, UNPACK_KERNEL_SCALAR, 0, rows, ref, NULL), 0);
    for (size_t i = 0; i < (size_t)rows * cols; i++)
        assert_true(ref[i] >= -127);
    for (int k = 1; k < UNPACK_KERNEL_COUNT; k++) {
        if (!unpack_kernel_available((enum unpack_kernel)k))
            continue;
        for (int store = UNPACK_STORE_CACHED; store <= UNPACK_STORE_STREAM; store++) {
            assert_int_equal(unpack_tensor_rows_store(&u, (enum unpack_kernel)k, 0, rows, got, NULL,
                                                      (enum unpack_store)store),
                             0);
            if (memcmp(got, ref, (size_t)rows * cols) != 0)
                fail_msg("kernel %s, store %d, %ux%u, random bytes: differs from scalar",
                         unpack_kernel_name((enum unpack_kernel)k), store, rows, cols);
        }
    }
    /* one row from its bytes, as embedding lookups read it */
    for (uint32_t r = 0; r < rows; r++) {
        uint32_t b = unpack_tensor_width(&u, r);
        assert_int_equal(unpack_row(FORMAT_ENC_ADAPTIVE, unpack_kernel_best(),
                                    u.layout.data + u.row_off[r], cols, b, row),
                         0);
        assert_int_equal(unpack_row_mult(&u.layout, r, b, row), 0);
        assert_memory_equal(row, ref + (size_t)r * cols, cols);
    }
    memcpy((uint8_t *)u.layout.data, save, u.layout.data_len);
    free(save);
    free(ref);
    unpack_tensor_fini(&u);
    free(bytes);
    free(widths);
    free(mult);
    free(q);
    free(want);
    sl_free_aligned(got);
    free(row);
    free(scales);
    free(sc);
}

static void test_round_trip(void **st)
{
    (void)st;
    static const uint32_t colsets[] = {7, 31, 64, 256, 513, 688, 1024, 1100};
    for (int rep = 0; rep < 3; rep++)
        for (size_t ci = 0; ci < sizeof colsets / sizeof colsets[0]; ci++)
            check_mult(1 + test_rng_below(&rng, 40), colsets[ci]);
}

static void test_rejects(void **st)
{
    (void)st;
    uint32_t rows = 3, cols = 100, nb = format_packed_mult_blocks(cols);
    uint8_t widths[3] = {5, 5, 4}, mult[3 * 4];
    float scales[3] = {1, 2, 3};
    int8_t q[3 * 100] = {0};
    memset(mult, 2, sizeof mult);
    void *bytes;
    uint64_t len;
    struct sl_err err = {{0}};
    assert_int_equal(nb, 4);
    /* the packer refuses another encoding and multipliers outside 1..4 */
    assert_int_equal(quantizer_pack_mult(FORMAT_ENC_BITPLANE, q, widths, scales, rows, cols, mult,
                                         &bytes, &len, &err),
                     -EINVAL);
    mult[5] = 5;
    assert_int_equal(quantizer_pack_mult(FORMAT_ENC_ADAPTIVE, q, widths, scales, rows, cols, mult,
                                         &bytes, &len, &err),
                     -EINVAL);
    mult[5] = 0;
    assert_int_equal(quantizer_pack_mult(FORMAT_ENC_ADAPTIVE, q, widths, scales, rows, cols, mult,
                                         &bytes, &len, &err),
                     -EINVAL);
    mult[5] = 4;
    assert_int_equal(quantizer_pack_mult(FORMAT_ENC_ADAPTIVE, q, widths, scales, rows, cols, mult,
                                         &bytes, &len, &err),
                     0);
    uint8_t *p = bytes;
    uint64_t moff = format_packed_prefix_bytes(rows);
    struct format_packed_layout lay;
    assert_int_equal(format_packed_parse(FORMAT_ENC_ADAPTIVE, p, len, rows, cols, &lay, &err), 0);
    assert_ptr_equal(lay.mult, p + moff);
    assert_int_equal(format_packed_mult(lay.mult, nb, 1, 1), 4);
    assert_int_equal(format_packed_mult(lay.mult, nb, 2, 3), 2);
    /* 24 bits of multipliers: bits past them, and the padding, must be zero */
    p[moff + 3] = 1;
    assert_int_equal(format_packed_parse(FORMAT_ENC_ADAPTIVE, p, len, rows, cols, &lay, &err),
                     -EINVAL);
    assert_non_null(strstr(err.msg, "multipliers"));
    p[moff + 3] = 0;
    static const uint32_t bad[] = {0, 16, 64};
    for (size_t i = 0; i < 3; i++) {
        sl_store_le32(p + 20, bad[i]);
        assert_int_equal(format_packed_parse(FORMAT_ENC_ADAPTIVE, p, len, rows, cols, &lay, &err),
                         -EINVAL);
    }
    sl_store_le32(p + 20, FORMAT_PACKED_MULT_BLOCK);
    memcpy(p, "SLBP", 4); /* version 2 on the bitplane encoding */
    assert_int_equal(format_packed_parse(FORMAT_ENC_BITPLANE, p, len, rows, cols, &lay, &err),
                     -EINVAL);
    memcpy(p, "SLAD", 4);
    assert_int_equal(format_packed_parse(FORMAT_ENC_ADAPTIVE, p, len, rows, cols, &lay, &err), 0);
    /* truncated inside the multipliers */
    assert_int_equal(format_packed_parse(FORMAT_ENC_ADAPTIVE, p, moff + 2, rows, cols, &lay, &err),
                     -EINVAL);
    free(bytes);
    /* version 1 still parses, with no multipliers */
    assert_int_equal(quantizer_pack(FORMAT_ENC_ADAPTIVE, q, widths, scales, rows, cols, &bytes,
                                    &len, &err),
                     0);
    assert_int_equal(sl_load_le32((uint8_t *)bytes + 4), 1);
    assert_int_equal(format_packed_parse(FORMAT_ENC_ADAPTIVE, bytes, len, rows, cols, &lay, &err),
                     0);
    assert_null(lay.mult);
    assert_int_equal(lay.mult_block, 0);
    free(bytes);
}

int main(void)
{
    test_rng_init(&rng, test_seed());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mult_kernels),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_rejects),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

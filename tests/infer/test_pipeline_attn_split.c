/* test_pipeline_attn_split.c: where the prefill attention of a chunk is cut
 * into pieces of query rows (pl_attn_split), on shapes alone. For random
 * chunks (rows, first position, flops a key) and each way of choosing: cuts
 * strictly ascending, on multiples of 16 (INFER_ATT_ROWS), inside (0, n),
 * at most PL_ATTN_MAX_PIECES pieces; want > 0: no piece longer than want
 * rounded up to 16, pieces equal to within 16 rows; want 0 (by work):
 * the piece count is the work over PL_ATTN_PIECE_FLOP (rounded, capped by
 * the blocks and PL_ATTN_MAX_PIECES) and each cut is the first block
 * boundary with its share of the work before it. One piece for chunks of
 * at most 16 rows, for want >= n (every value up to UINT32_MAX, where a
 * rounding up wrapped once) and for no work a key. */
#include <stdint.h>
#include <stdlib.h>

#include "pipeline.h"
#include "testutil.h"

static double work(double per_key, double pos0, double r)
{
    return per_key * (r * pos0 + r * (r + 1) / 2);
}

/* the invariants every split holds */
static void check_shape(const uint32_t *s, uint32_t np, uint32_t n)
{
    assert_true(np >= 1 && np <= PL_ATTN_MAX_PIECES);
    assert_int_equal(s[0], 0);
    assert_int_equal(s[np], n);
    for (uint32_t k = 1; k < np; k++) {
        assert_true(s[k] > s[k - 1]);
        assert_int_equal(s[k] % INFER_ATT_ROWS, 0);
        assert_true(s[k] < n);
    }
}

static void test_by_rows(void **st)
{
    (void)st;
    struct test_rng r;
    test_rng_init(&r, test_seed());
    uint32_t s[PL_ATTN_MAX_PIECES + 1];
    for (int it = 0; it < 3000; it++) {
        uint32_t n = 1 + test_rng_below(&r, 2048), want = 1 + test_rng_below(&r, n + 40);
        uint32_t pos0 = test_rng_below(&r, 8192);
        uint32_t np = pl_attn_split(n, pos0, 1 + test_rng_below(&r, 8192), want, s);
        check_shape(s, np, n);
        uint32_t blocks = (n + 15) / 16, step = (want + 15) / 16;
        if (n <= INFER_ATT_ROWS || want >= n) {
            assert_int_equal(np, 1);
            continue;
        }
        uint32_t parts = (blocks + step - 1) / step;
        if (parts > PL_ATTN_MAX_PIECES)
            parts = PL_ATTN_MAX_PIECES;
        assert_int_equal(np, parts);
        uint32_t lo = UINT32_MAX, hi = 0;
        for (uint32_t k = 0; k < np; k++) {
            uint32_t len = s[k + 1] - s[k];
            if (parts < PL_ATTN_MAX_PIECES)
                assert_true(len <= step * INFER_ATT_ROWS);
            if (k + 1 < np) { /* the last piece may be short of a whole block */
                lo = len < lo ? len : lo;
                hi = len > hi ? len : hi;
            }
        }
        if (np > 2)
            assert_true(hi - lo <= INFER_ATT_ROWS);
    }
}

static void test_by_work(void **st)
{
    (void)st;
    struct test_rng r;
    test_rng_init(&r, test_seed() + 1);
    uint32_t s[PL_ATTN_MAX_PIECES + 1];
    int split = 0;
    for (int it = 0; it < 3000; it++) {
        uint32_t n = 1 + test_rng_below(&r, 2048), pos0 = test_rng_below(&r, 8192);
        double per_key = 4.0 * (1 + test_rng_below(&r, 32)) * 64;
        uint32_t np = pl_attn_split(n, pos0, per_key, 0, s);
        check_shape(s, np, n);
        uint32_t blocks = (n + 15) / 16;
        double total = work(per_key, pos0, n), d = total / PL_ATTN_PIECE_FLOP + 0.5;
        uint32_t parts = d >= PL_ATTN_MAX_PIECES ? PL_ATTN_MAX_PIECES : (uint32_t)d;
        parts = parts > blocks ? blocks : parts;
        if (n <= INFER_ATT_ROWS || parts <= 1) {
            assert_int_equal(np, 1);
            continue;
        }
        split++;
        /* the cuts: for each share k of parts - 1, the first block boundary
         * with at least k / parts of the work before it (found here by a
         * scan of every boundary), each distinct one inside the chunk once */
        uint32_t want_s[PL_ATTN_MAX_PIECES + 1], m = 1;
        want_s[0] = 0;
        for (uint32_t k = 1; k < parts; k++) {
            uint32_t b = 1;
            while (b < blocks && work(per_key, pos0, (double)b * 16) < total * k / parts)
                b++;
            if (b < blocks && b * 16 > want_s[m - 1])
                want_s[m++] = b * 16;
        }
        want_s[m] = n;
        if (np != m)
            fail_msg("n %u pos0 %u per_key %g: %u pieces, expected %u", n, pos0, per_key, np, m);
        for (uint32_t k = 0; k <= m; k++)
            assert_int_equal(s[k], want_s[k]);
    }
    assert_true(split > 100); /* the draw reaches the split path */
}

static void test_one_piece(void **st)
{
    (void)st;
    uint32_t s[PL_ATTN_MAX_PIECES + 1];
    const uint32_t wants[] = {0, 1, 15, 16, 17, 300, 511, 512, 513, UINT32_MAX - 15,
                              UINT32_MAX - 14, UINT32_MAX - 1, UINT32_MAX};
    for (uint32_t i = 0; i < sizeof wants / sizeof *wants; i++) {
        uint32_t w = wants[i];
        /* a chunk of 16 rows is one block */
        assert_int_equal(pl_attn_split(16, 4000, 1e9, w, s), 1);
        assert_int_equal(s[1], 16);
        uint32_t np = pl_attn_split(512, 0, 8192, w, s);
        check_shape(s, np, 512);
        if (w >= 512)
            assert_int_equal(np, 1);
        else if (w)
            assert_int_equal(np, (32 + (w + 15) / 16 - 1) / ((w + 15) / 16));
    }
    /* no work a key: one piece by work */
    assert_int_equal(pl_attn_split(512, 100, 0, 0, s), 1);
    /* the tinyllama shape's first 512-token chunk (256 rows at 0, 8 heads of
     * 64 a group): 4 * 8 * 64 flops a key, about 70 MFLOP: three pieces */
    assert_int_equal(pl_attn_split(256, 0, 4.0 * 8 * 64, 0, s), 3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_by_rows),
        cmocka_unit_test(test_by_work),
        cmocka_unit_test(test_one_piece),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

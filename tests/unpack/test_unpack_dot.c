/* test_unpack_dot.c: dot products straight from packed rows
 * (unpack_tensor_dot, decode from packed weights).
 * - the scalar kernel is the specification: sum_c q[r][c] * x[i][c] with q
 *   the codes that went into the packer, computed here in 64-bit;
 * - every SIMD kernel this CPU has is bit-exact with it, for every single
 *   width 1..8 and random mixes of widths, row lengths below, at and above
 *   R = 512 with tails (odd lengths, D % 8 != 0), activation rows m = 1..17
 *   (the blocks of 2, 4, 8 and 16 rows of the multi-row kernels and their
 *   mixes: 13 = 8 + 4 + 1, 17 = 16 + 1),
 *   row sub-ranges, and extreme activations (all -128 or 127 against the
 *   widest codes: the saturation and overflow corners of pmaddubsw and
 *   vpdpbusd);
 * - on arbitrary code bytes (codes the packer never writes, 2^b - 1, and
 *   tail padding bits set) every kernel agrees with the scalar kernel and
 *   with unpack_tensor_rows followed by a plain dot product;
 * - the baseline encodings (bitplane, int4int8) give the same integers;
 * - unpack_tensor_dot_x (x's sums and tail prepared once) gives the same
 *   integers on every kernel, for every case above, and so does
 *   unpack_tensor_dot_xm (every row's prepared once, all m rows at a time);
 * - unpack_tensor_dot_tiles (AMX tiles, 1-16 rows) gives them too, for
 *   every adaptive case above where it takes the tensor (both strides and
 *   pass orders, sub-ranges, partial blocks of 16 channels, tails, random bytes);
 * - bad arguments are refused with -EINVAL / -EOVERFLOW.
 * The seed is printed; SLUICE_TEST_SEED=<seed> replays a run. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "quantizer.h"
#include "testutil.h"
#include "unpack.h"

static struct test_rng rng;
static unsigned tiles_checked; /* cases unpack_tensor_dot_tiles took */

static const uint32_t colsets[] = {1,   7,   8,    9,    64,   100,  172,  256, 504,
                                   511, 512, 513,  688,  1024, 1100, 1536, 2048};
#define NCOLS (sizeof colsets / sizeof colsets[0])
static const uint32_t msets[] = {1, 2, 3, 4, 5, 6, 7, 8, 13, 15, 16, 17};
#define NM (sizeof msets / sizeof msets[0])

static int8_t rand_code(uint32_t b)
{
    if (b == 1)
        return test_rng_below(&rng, 2) ? 1 : -1;
    int m = (1 << (b - 1)) - 1;
    return (int8_t)((int)test_rng_below(&rng, (uint32_t)(2 * m + 1)) - m);
}

/* x: 0 random, 1 all -128, 2 all 127, 3 random extremes (+-127, -128) */
static void fill_x(int8_t *x, size_t n, int mode)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t v = test_rng_below(&rng, 256);
        x[i] = mode == 0   ? (int8_t)((int)v - 128)
               : mode == 1 ? -128
               : mode == 2 ? 127
                           : (int8_t)(v % 3 == 0 ? -128 : v % 3 == 1 ? -127 : 127);
    }
}

struct packed {
    uint32_t enc, rows, cols;
    int8_t *q;
    uint8_t *widths;
    float *scales;
    uint8_t *bytes;
    uint64_t len;
};

static void packed_make(struct packed *p, uint32_t enc, uint32_t rows, uint32_t cols,
                        const uint8_t *widths, int extreme)
{
    p->enc = enc;
    p->rows = rows;
    p->cols = cols;
    p->q = malloc((size_t)rows * cols);
    p->widths = malloc(rows);
    p->scales = malloc(sizeof(float) * rows);
    assert_non_null(p->q);
    for (uint32_t r = 0; r < rows; r++) {
        uint32_t b = widths[r];
        int top = b == 1 ? 1 : (1 << (b - 1)) - 1;
        p->widths[r] = (uint8_t)b;
        p->scales[r] = 0.01f * (float)(r + 1);
        for (uint32_t c = 0; c < cols; c++)
            p->q[(size_t)r * cols + c] =
                extreme ? (int8_t)(test_rng_below(&rng, 2) ? top : -top) : rand_code(b);
    }
    void *bytes;
    struct sl_err err = {{0}};
    if (quantizer_pack(enc, p->q, p->widths, p->scales, rows, cols, &bytes, &p->len, &err) < 0)
        fail_msg("pack %ux%u: %s", rows, cols, err.msg);
    p->bytes = bytes;
}

static void packed_free(struct packed *p)
{
    free(p->q);
    free(p->widths);
    free(p->scales);
    free(p->bytes);
}

/* Every kernel on rows [r0, r1) of u, m activation rows, against want
 * [m][r1 - r0] (NULL: against the scalar kernel). */
static void check_kernels(const struct unpack_tensor *u, const int8_t *x, uint32_t m,
                          uint32_t r0, uint32_t r1, const int64_t *want, const char *what)
{
    uint32_t n = r1 - r0;
    int32_t *ref = malloc(sizeof(int32_t) * m * (n ? n : 1));
    int32_t *got = malloc(sizeof(int32_t) * m * (n + 3)); /* room for a wider stride */
    assert_non_null(ref);
    assert_non_null(got);
    assert_int_equal(unpack_tensor_dot(u, UNPACK_KERNEL_SCALAR, r0, r1, x, m, ref, n), 0);
    if (want)
        for (size_t i = 0; i < (size_t)m * n; i++)
            if ((int64_t)ref[i] != want[i])
                fail_msg("%s: scalar dot [%zu] %d, want %lld (cols %u, m %u)", what, i, ref[i],
                         (long long)want[i], u->layout.cols, m);
    enum unpack_kernel ks[UNPACK_KERNEL_COUNT];
    int nk = unpack_kernels_available(ks);
    /* output rows n apart, then n + 3 apart (the forward's stride is the
     * linear's rows): the gaps keep their fill */
    /* each kernel with and without the AVX-512 dot kernels' far prefetch
     * (unpack_dot_far_prefetch: the CPU decides which one runs; m > 1 takes
     * the multi-row kernel) */
    for (int far = 0; far < 2; far++) {
        unpack_dot_set_far_prefetch(far);
        for (int k = 1; k < nk; k++)
            for (uint32_t ld = n; ld <= n + 3 && n; ld += 3) {
                memset(got, 0x5a, sizeof(int32_t) * m * (n + 3));
                assert_int_equal(unpack_tensor_dot(u, ks[k], r0, r1, x, m, got, ld), 0);
                for (size_t i = 0; i < (size_t)m * n; i++) {
                    int32_t g = got[i / n * ld + i % n];
                    if (g != ref[i])
                        fail_msg("%s: kernel %s dot [%zu] = %d, scalar %d (cols %u, m %u, rows "
                                 "%u..%u, width %u, stride %u, far %d)",
                                 what, unpack_kernel_name(ks[k]), i, g, ref[i], u->layout.cols, m,
                                 r0, r1, unpack_tensor_width(u, r0 + (uint32_t)(i % n)), ld, far);
                }
                for (size_t i = 0; i < (size_t)m * ld; i++)
                    if (i % ld >= n && got[i] != 0x5a5a5a5a)
                        fail_msg("%s: kernel %s wrote between rows at %zu (stride %u)", what,
                                 unpack_kernel_name(ks[k]), i, ld);
            }
    }
    unpack_dot_set_far_prefetch(-1);
    /* unpack_tensor_dot_tiles (AMX), where it takes the tensor: the same
     * integers, both strides, gaps untouched */
    if (n && unpack_dot_tiles_takes(u, m)) {
        void *st = aligned_alloc(64, (unpack_dot_tiles_stage_bytes(u->layout.cols, m) + 63) / 64 * 64);
        assert_non_null(st);
        assert_int_equal(unpack_dot_tiles_stage(u->layout.cols, x, m, st), 0);
        for (int v = 0; v < 4; v++) { /* both strides, both pass orders (_down) */
            const uint32_t ld = v & 1 ? n + 3 : n;
            memset(got, 0x5a, sizeof(int32_t) * m * (n + 3));
            assert_int_equal(v & 2 ? unpack_tensor_dot_tiles_down(u, r0, r1, st, got, ld)
                                   : unpack_tensor_dot_tiles(u, r0, r1, st, got, ld),
                             0);
            for (size_t i = 0; i < (size_t)m * ld; i++) {
                if (i % ld >= n) {
                    if (got[i] != 0x5a5a5a5a)
                        fail_msg("%s: tiles wrote between rows at %zu (stride %u)", what, i, ld);
                    continue;
                }
                if (got[i] != ref[i / ld * n + i % ld])
                    fail_msg("%s: tiles dot [%zu] = %d, scalar %d (cols %u, m %u, rows %u..%u, "
                             "width %u, stride %u, down %d)",
                             what, i, got[i], ref[i / ld * n + i % ld], u->layout.cols, m, r0, r1,
                             unpack_tensor_width(u, r0 + (uint32_t)(i % ld)), ld, v >> 1);
            }
        }
        tiles_checked++;
        free(st);
    }
    /* unpack_tensor_dot_x: one activation row at a time, x's part prepared once */
    for (int far = 0; far < 2; far++) {
        unpack_dot_set_far_prefetch(far);
        for (int k = 0; k < nk; k++)
            for (uint32_t i = 0; i < m; i++) {
                const int8_t *xi = x + (size_t)i * u->layout.cols;
                struct unpack_dot_x px;
                unpack_dot_x_init(u, xi, &px);
                memset(got, 0x5a, sizeof(int32_t) * (n ? n : 1));
                assert_int_equal(unpack_tensor_dot_x(u, ks[k], r0, r1, xi, &px, got), 0);
                for (uint32_t j = 0; j < n; j++)
                    if (got[j] != ref[(size_t)i * n + j])
                        fail_msg("%s: kernel %s dot_x [%u][%u] = %d, dot %d (cols %u, rows %u..%u, "
                                 "far %d)",
                                 what, unpack_kernel_name(ks[k]), i, j, got[j],
                                 ref[(size_t)i * n + j], u->layout.cols, r0, r1, far);
            }
    }
    unpack_dot_set_far_prefetch(-1);
    /* unpack_tensor_dot_xm: all m rows, each row's part prepared once (m
     * may exceed 16: the blocks of 16 index px past the first block) */
    struct unpack_dot_x *px = malloc(sizeof *px * m);
    assert_non_null(px);
    for (uint32_t i = 0; i < m; i++)
        unpack_dot_x_init(u, x + (size_t)i * u->layout.cols, &px[i]);
    for (int far = 0; far < 2; far++) {
        unpack_dot_set_far_prefetch(far);
        for (int k = 0; k < nk; k++)
            for (uint32_t ld = n; ld <= n + 3 && n; ld += 3) {
                memset(got, 0x5a, sizeof(int32_t) * m * (n + 3));
                assert_int_equal(unpack_tensor_dot_xm(u, ks[k], r0, r1, x, m, px, got, ld), 0);
                for (size_t i = 0; i < (size_t)m * ld; i++) {
                    int32_t want_i = i % ld >= n ? 0x5a5a5a5a : ref[i / ld * n + i % ld];
                    if (got[i] != want_i)
                        fail_msg("%s: kernel %s dot_xm [%zu] = %d, want %d (cols %u, m %u, rows "
                                 "%u..%u, stride %u, far %d)",
                                 what, unpack_kernel_name(ks[k]), i, got[i], want_i,
                                 u->layout.cols, m, r0, r1, ld, far);
                }
            }
    }
    unpack_dot_set_far_prefetch(-1);
    free(px);
    free(ref);
    free(got);
}

static void check_case(uint32_t enc, uint32_t rows, uint32_t cols, const uint8_t *widths,
                       uint32_t m, int xmode, int extreme)
{
    struct packed p;
    packed_make(&p, enc, rows, cols, widths, extreme);
    int8_t *x = malloc((size_t)m * cols);
    int64_t *want = malloc(sizeof(int64_t) * m * rows);
    fill_x(x, (size_t)m * cols, xmode);
    for (uint32_t i = 0; i < m; i++)
        for (uint32_t r = 0; r < rows; r++) {
            int64_t s = 0;
            for (uint32_t c = 0; c < cols; c++)
                s += (int64_t)p.q[(size_t)r * cols + c] * x[(size_t)i * cols + c];
            want[(size_t)i * rows + r] = s;
        }
    struct unpack_tensor u;
    struct sl_err err = {{0}};
    if (unpack_tensor_init(&u, enc, p.bytes, p.len, rows, cols, &err) < 0)
        fail_msg("init: %s", err.msg);
    char what[96];
    snprintf(what, sizeof what, "%s %ux%u x%d", format_encoding_traits(enc)->name, rows, cols,
             xmode);
    check_kernels(&u, x, m, 0, rows, want, what);
    if (rows > 2) { /* a sub-range, as the decode split uses */
        uint32_t r0 = 1 + test_rng_below(&rng, rows - 2), r1 = r0 + 1 + test_rng_below(&rng, rows - r0);
        check_kernels(&u, x, m, r0, r1, NULL, what);
    }
    unpack_tensor_fini(&u);
    free(x);
    free(want);
    packed_free(&p);
}

static void test_single_widths(void **st)
{
    (void)st;
    uint8_t w[8];
    for (uint32_t b = 1; b <= 8; b++) {
        memset(w, (int)b, sizeof w);
        for (size_t c = 0; c < NCOLS; c++)
            check_case(FORMAT_ENC_ADAPTIVE, 3, colsets[c], w, msets[c % NM], (int)(c % 4), 0);
    }
}

static void test_mixed_widths(void **st)
{
    (void)st;
    for (int it = 0; it < 24; it++) {
        uint32_t rows = 1 + test_rng_below(&rng, 40);
        uint32_t cols = test_rng_below(&rng, 2) ? colsets[test_rng_below(&rng, NCOLS)]
                                                : 1 + test_rng_below(&rng, 3000);
        uint8_t *w = malloc(rows);
        for (uint32_t r = 0; r < rows; r++)
            w[r] = (uint8_t)(1 + test_rng_below(&rng, 8));
        check_case(FORMAT_ENC_ADAPTIVE, rows, cols, w, msets[it % NM], it % 4, 0);
        free(w);
    }
    /* 101 rows: four 32-channel passes with the partial one last, so the tile
     * kernel's pass arithmetic past the second pass (either direction) is
     * reached; the direction itself cannot change a result */
    static const uint32_t ms[] = {6, 16}, colss[] = {700, 2048};
    for (int it = 0; it < 4; it++) {
        uint8_t w[101];
        for (uint32_t r = 0; r < 101; r++)
            w[r] = (uint8_t)(1 + test_rng_below(&rng, 8));
        check_case(FORMAT_ENC_ADAPTIVE, 101, colss[it / 2], w, ms[it % 2], it % 4, 0);
    }
}

/* The widest codes against the extreme activations: where an unsigned code
 * times -128 or 127 would saturate a 16-bit pair sum or wrap an int32 lane. */
static void test_extremes(void **st)
{
    (void)st;
    static const uint32_t cols[] = {512, 1536, 4096, 5632, 700};
    for (uint32_t b = 1; b <= 8; b++)
        for (size_t c = 0; c < sizeof cols / sizeof cols[0]; c++)
            for (int xm = 1; xm <= 3; xm++) {
                uint8_t w[2] = {(uint8_t)b, (uint8_t)b};
                check_case(FORMAT_ENC_ADAPTIVE, 2, cols[c], w, xm == 3 ? 16 : 1 + (uint32_t)c, xm,
                           1);
            }
}

static void test_baselines(void **st)
{
    (void)st;
    const uint32_t encs[2] = {FORMAT_ENC_BITPLANE, FORMAT_ENC_INT4INT8};
    for (int e = 0; e < 2; e++)
        for (int it = 0; it < 6; it++) {
            uint32_t rows = 1 + test_rng_below(&rng, 20), cols = 1 + test_rng_below(&rng, 1500);
            uint8_t *w = malloc(rows);
            for (uint32_t r = 0; r < rows; r++)
                w[r] = (uint8_t)(1 + test_rng_below(&rng, 8));
            check_case(encs[e], rows, cols, w, msets[it % NM], it % 4, 0);
            free(w);
        }
}

/* Arbitrary code bytes: every kernel against the scalar one, and the scalar
 * one against unpack_tensor_rows + a plain dot product. */
static void test_random_bytes(void **st)
{
    (void)st;
    for (int it = 0; it < 40; it++) {
        uint32_t rows = 1 + test_rng_below(&rng, 24);
        uint32_t cols = it % 2 ? colsets[test_rng_below(&rng, NCOLS)] : 1 + test_rng_below(&rng, 2600);
        uint32_t m = msets[it % NM];
        uint8_t *w = malloc(rows);
        for (uint32_t r = 0; r < rows; r++)
            w[r] = (uint8_t)(1 + test_rng_below(&rng, 8));
        struct packed p;
        packed_make(&p, FORMAT_ENC_ADAPTIVE, rows, cols, w, 0);
        uint64_t code0 = format_packed_prefix_bytes(rows);
        for (uint64_t i = code0; i < p.len; i++)
            p.bytes[i] = (uint8_t)test_rng_u64(&rng);
        struct unpack_tensor u;
        struct sl_err err = {{0}};
        if (unpack_tensor_init(&u, FORMAT_ENC_ADAPTIVE, p.bytes, p.len, rows, cols, &err) < 0)
            fail_msg("init: %s", err.msg);
        int8_t *x = malloc((size_t)m * cols), *q = malloc((size_t)rows * cols);
        int64_t *want = malloc(sizeof(int64_t) * m * rows);
        fill_x(x, (size_t)m * cols, it % 4);
        assert_int_equal(unpack_tensor_rows(&u, UNPACK_KERNEL_SCALAR, 0, rows, q, NULL), 0);
        for (uint32_t i = 0; i < m; i++)
            for (uint32_t r = 0; r < rows; r++) {
                int64_t s = 0;
                for (uint32_t c = 0; c < cols; c++)
                    s += (int64_t)q[(size_t)r * cols + c] * x[(size_t)i * cols + c];
                want[(size_t)i * rows + r] = s;
            }
        check_kernels(&u, x, m, 0, rows, want, "random bytes");
        unpack_tensor_fini(&u);
        free(x);
        free(q);
        free(want);
        free(w);
        packed_free(&p);
    }
}

static void test_api(void **st)
{
    (void)st;
    uint8_t w[4] = {5, 5, 5, 5};
    struct packed p;
    packed_make(&p, FORMAT_ENC_ADAPTIVE, 4, 64, w, 0);
    struct unpack_tensor u;
    struct sl_err err = {{0}};
    assert_int_equal(unpack_tensor_init(&u, FORMAT_ENC_ADAPTIVE, p.bytes, p.len, 4, 64, &err), 0);
    int8_t x[128] = {0};
    int32_t acc[8];
    assert_int_equal(unpack_tensor_dot(&u, UNPACK_KERNEL_SCALAR, 0, 4, x, 0, acc, 4), -EINVAL);
    assert_int_equal(unpack_tensor_dot(&u, UNPACK_KERNEL_SCALAR, 3, 2, x, 1, acc, 4), -EINVAL);
    assert_int_equal(unpack_tensor_dot(&u, UNPACK_KERNEL_SCALAR, 0, 5, x, 1, acc, 4), -EINVAL);
    assert_int_equal(unpack_tensor_dot(&u, UNPACK_KERNEL_SCALAR, 0, 4, x, 2, acc, 3), -EINVAL);
    assert_int_equal(unpack_tensor_dot(&u, (enum unpack_kernel)UNPACK_KERNEL_COUNT, 0, 4, x, 1,
                                       acc, 4),
                     -EINVAL);
    assert_int_equal(unpack_tensor_dot(&u, UNPACK_KERNEL_SCALAR, 2, 2, x, 1, acc, 0), 0);
    assert_int_equal(unpack_tensor_dot(&u, UNPACK_KERNEL_SCALAR, 0, 4, x, 1, acc, 0), 0);
    for (int i = 0; i < 4; i++)
        assert_int_equal(acc[i], 0);
    struct unpack_dot_x px;
    unpack_dot_x_init(&u, x, &px);
    assert_int_equal(unpack_tensor_dot_x(&u, UNPACK_KERNEL_SCALAR, 3, 2, x, &px, acc), -EINVAL);
    assert_int_equal(unpack_tensor_dot_x(&u, UNPACK_KERNEL_SCALAR, 0, 5, x, &px, acc), -EINVAL);
    assert_int_equal(unpack_tensor_dot_x(&u, (enum unpack_kernel)UNPACK_KERNEL_COUNT, 0, 4, x,
                                         &px, acc),
                     -EINVAL);
    assert_int_equal(unpack_tensor_dot_x(&u, UNPACK_KERNEL_SCALAR, 2, 2, x, &px, acc), 0);
    /* the far prefetch switch: set, then back to the CPU's default (0 or 1,
     * whatever SLUICE_DOT_FAR says when it is 0 or 1) */
    const int far_default = unpack_dot_far_prefetch();
    assert_true(far_default == 0 || far_default == 1);
    const char *fe = getenv("SLUICE_DOT_FAR");
    if (fe && (!strcmp(fe, "0") || !strcmp(fe, "1")))
        assert_int_equal(far_default, fe[0] - '0');
    unpack_dot_set_far_prefetch(0);
    assert_int_equal(unpack_dot_far_prefetch(), 0);
    unpack_dot_set_far_prefetch(1);
    assert_int_equal(unpack_dot_far_prefetch(), 1);
    unpack_dot_set_far_prefetch(7); /* not a mode: the default */
    assert_int_equal(unpack_dot_far_prefetch(), far_default);
    unpack_dot_set_far_prefetch(0);
    unpack_dot_set_far_prefetch(-1);
    assert_int_equal(unpack_dot_far_prefetch(), far_default);
    /* the tile path's refusals */
    assert_int_equal(unpack_dot_tiles_takes(&u, 0), 0);
    assert_int_equal(unpack_dot_tiles_takes(&u, UNPACK_TILES_ROWS_MAX + 1), 0);
    void *stg = aligned_alloc(64, (unpack_dot_tiles_stage_bytes(128, 2) + 63) / 64 * 64);
    assert_non_null(stg);
    assert_int_equal(unpack_dot_tiles_stage(64, x, 0, stg), -EINVAL);
    assert_int_equal(unpack_dot_tiles_stage(64, x, UNPACK_TILES_ROWS_MAX + 1, stg), -EINVAL);
    assert_int_equal(unpack_dot_tiles_stage(0, x, 1, stg), -EINVAL);
    assert_int_equal(unpack_dot_tiles_stage(128, x, 1, stg), 0); /* cols 128 against 64 */
    assert_int_equal(unpack_tensor_dot_tiles(&u, 0, 4, stg, acc, 4), -EINVAL);
    assert_int_equal(unpack_dot_tiles_stage(64, x, 2, stg), 0);
    if (unpack_dot_tiles_takes(&u, 2)) {
        assert_int_equal(unpack_tensor_dot_tiles(&u, 3, 2, stg, acc, 4), -EINVAL);
        assert_int_equal(unpack_tensor_dot_tiles(&u, 0, 5, stg, acc, 5), -EINVAL);
        assert_int_equal(unpack_tensor_dot_tiles(&u, 0, 4, stg, acc, 3), -EINVAL);
        assert_int_equal(unpack_tensor_dot_tiles_down(&u, 0, 5, stg, acc, 5), -EINVAL);
        assert_int_equal(unpack_tensor_dot_tiles(&u, 2, 2, stg, acc, 0), 0);
    } else {
        assert_int_equal(unpack_tensor_dot_tiles(&u, 0, 4, stg, acc, 4), -EINVAL);
        assert_int_equal(unpack_tensor_dot_tiles_down(&u, 0, 4, stg, acc, 4), -EINVAL);
    }
    free(stg);
    unpack_tensor_fini(&u);
    /* rows longer than the int32 bound */
    struct unpack_tensor big = u;
    big.layout.cols = UNPACK_CORR_MAX_COLS + 1;
    assert_int_equal(unpack_tensor_dot(&big, UNPACK_KERNEL_SCALAR, 0, 0, x, 1, acc, 0),
                     -EOVERFLOW);
    assert_int_equal(unpack_tensor_dot_x(&big, UNPACK_KERNEL_SCALAR, 0, 0, x, &px, acc),
                     -EOVERFLOW);
    packed_free(&p);
}

int main(void)
{
    test_rng_init(&rng, test_seed());
    for (int k = 0; k < UNPACK_KERNEL_COUNT; k++)
        fprintf(stderr, "kernel %-7s %s\n", unpack_kernel_name((enum unpack_kernel)k),
                unpack_kernel_available((enum unpack_kernel)k)
                    ? "tested against scalar"
                    : "skipped: not in this build, not on this CPU, or off by SLUICE_SIMD");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_single_widths), cmocka_unit_test(test_mixed_widths),
        cmocka_unit_test(test_extremes),      cmocka_unit_test(test_baselines),
        cmocka_unit_test(test_random_bytes),  cmocka_unit_test(test_api),
    };
    int ret = cmocka_run_group_tests(tests, NULL, NULL);
    fprintf(stderr, "unpack_tensor_dot_tiles (AMX): %u cases checked%s\n", tiles_checked,
            tiles_checked ? "" : " (not in this build or not on this CPU)");
#ifdef SLUICE_KERNELS_AMX
    /* built and on an AMX CPU (not turned off by SLUICE_SIMD): a kernel that
     * stopped taking its cases would otherwise pass unseen */
    if (sl_cpu_features()->amx && !tiles_checked) {
        fprintf(stderr, "FAIL: the AMX tile kernel is built and the CPU has AMX, "
                        "but it took no case\n");
        ret = 1;
    }
#endif
    return ret;
}

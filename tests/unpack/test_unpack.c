/* test_unpack.c: the packed encodings (docs/FORMAT-packed.md), packer and
 * unpackers.
 * - golden bytes: the packer writes the layout the document describes, byte
 *   for byte (header, widths, scales, adaptive stripes, bitplane planes,
 *   int4int8 nibbles), computed here independently of the unpacker;
 * - round trip: pack then unpack gives the codes and scales back, for every
 *   single width 1..8 and random mixes, over row lengths below R, equal to R,
 *   multiples of R, with tails (D % R != 0, D % 8 != 0), for every encoding;
 * - every SIMD kernel this CPU has is bit-exact with the scalar kernel, on
 *   packer output and on arbitrary code bytes; sub-ranges of rows agree;
 * - the vpdpbusd correction (128 x row sum) for every kernel and q8;
 * - corrupt tensors (truncated, bad fields, bad widths, bad scales, length
 *   mismatch, random corruption) are rejected with a sentence, never a crash.
 * The seed is printed; SLUICE_TEST_SEED=<seed> replays a run. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quantizer.h"
#include "testutil.h"
#include "unpack.h"

static struct test_rng rng;

static const uint32_t encs[3] = {FORMAT_ENC_ADAPTIVE, FORMAT_ENC_BITPLANE, FORMAT_ENC_INT4INT8};
static const uint32_t colsets[] = {1,   7,   8,   9,   64,  100,  172,  256,  504,
                                   511, 512, 513, 688, 1024, 1100, 1500, 2048};
#define NCOLS (sizeof colsets / sizeof colsets[0])

static const char *enc_name(uint32_t enc)
{
    return format_encoding_traits(enc)->name;
}

static int8_t rand_code(uint32_t b)
{
    if (b == 1)
        return test_rng_below(&rng, 2) ? 1 : -1;
    int m = (1 << (b - 1)) - 1;
    return (int8_t)((int)test_rng_below(&rng, (uint32_t)(2 * m + 1)) - m);
}

/* A packed tensor and what went into it. */
struct packed {
    uint32_t enc, rows, cols;
    int8_t *q;
    uint8_t *widths;
    float *scales;
    uint8_t *bytes;
    uint64_t len;
};

static void packed_make(struct packed *p, uint32_t enc, uint32_t rows, uint32_t cols,
                        const uint8_t *widths)
{
    p->enc = enc;
    p->rows = rows;
    p->cols = cols;
    p->q = malloc((size_t)rows * cols);
    p->widths = malloc(rows);
    p->scales = malloc(sizeof(float) * rows);
    assert_non_null(p->q);
    for (uint32_t r = 0; r < rows; r++) {
        p->widths[r] = widths[r];
        p->scales[r] = 0.001f * (float)(r + 1);
        for (uint32_t c = 0; c < cols; c++)
            p->q[(size_t)r * cols + c] = rand_code(widths[r]);
    }
    void *bytes;
    struct sl_err err = {{0}};
    if (quantizer_pack(enc, p->q, p->widths, p->scales, rows, cols, &bytes, &p->len, &err) < 0)
        fail_msg("pack %s %ux%u: %s", enc_name(enc), rows, cols, err.msg);
    p->bytes = bytes;
}

static void packed_free(struct packed *p)
{
    free(p->q);
    free(p->widths);
    free(p->scales);
    free(p->bytes);
}

static struct format_tensor_info info_of(const struct packed *p)
{
    struct format_tensor_info t;
    memset(&t, 0, sizeof t);
    snprintf(t.name, sizeof t.name, "blk.0.ffn_up");
    t.encoding = p->enc;
    t.n_dims = 2;
    t.shape[0] = p->rows;
    t.shape[1] = p->cols;
    t.length = p->len;
    return t;
}

/* Round trip through unpack_tensor_int8, then every kernel against the scalar
 * one on the packer's bytes and on random code bytes. */
static void check_case(uint32_t enc, uint32_t rows, uint32_t cols, const uint8_t *widths)
{
    struct packed p;
    packed_make(&p, enc, rows, cols, widths);
    size_t n = (size_t)rows * cols;
    int8_t *out = malloc(n), *ref = malloc(n), *got = sl_alloc_aligned(n, 64);
    float *sc = malloc(sizeof(float) * rows);
    struct sl_err err = {{0}};
    struct format_tensor_info t = info_of(&p);
    if (unpack_tensor_int8(&t, p.bytes, out, sc, &err) < 0)
        fail_msg("unpack %s %ux%u: %s", enc_name(enc), rows, cols, err.msg);
    for (size_t i = 0; i < n; i++)
        if (out[i] != p.q[i])
            fail_msg("%s %ux%u: round trip: weight %zu (row %zu, width %u) is %d, packed %d",
                     enc_name(enc), rows, cols, i, i / cols, widths[i / cols], out[i], p.q[i]);
    assert_memory_equal(sc, p.scales, sizeof(float) * rows);

    struct unpack_tensor u;
    assert_int_equal(unpack_tensor_init(&u, enc, p.bytes, p.len, rows, cols, &err), 0);
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) /* arbitrary codes, including those the packer never writes */
            for (uint64_t i = 0; i < u.layout.data_len; i++)
                ((uint8_t *)u.layout.data)[i] = (uint8_t)test_rng_u64(&rng);
        assert_int_equal(unpack_tensor_rows(&u, UNPACK_KERNEL_SCALAR, 0, rows, ref, NULL), 0);
        for (size_t i = 0; i < n; i++) { /* on the row's grid (int4int8: 4 or 8 bits) */
            int b = (int)unpack_tensor_width(&u, (uint32_t)(i / cols));
            if (enc == FORMAT_ENC_INT4INT8)
                b = b <= 4 ? 4 : 8;
            int m = b == 1 ? 1 : (1 << (b - 1)) - 1;
            if (ref[i] < -m || ref[i] > m || (b == 1 && ref[i] == 0))
                fail_msg("%s: weight %zu = %d is off the %d-bit grid", enc_name(enc), i, ref[i],
                         b);
        }
        for (int k = 1; k < UNPACK_KERNEL_COUNT; k++) {
            if (!unpack_kernel_available((enum unpack_kernel)k))
                continue;
            /* cached stores, and streaming stores (used where got is aligned and cols
             * a multiple of 64) */
            for (int store = UNPACK_STORE_CACHED; store <= UNPACK_STORE_STREAM; store++) {
                memset(got, 0x5a, n);
                assert_int_equal(unpack_tensor_rows_store(&u, (enum unpack_kernel)k, 0, rows, got,
                                                          NULL, (enum unpack_store)store),
                                 0);
                for (size_t i = 0; i < n; i++)
                    if (got[i] != ref[i])
                        fail_msg("%s kernel %s, store %d, %ux%u, pass %d: weight %zu (row %zu, "
                                 "width %u) is %d, scalar says %d",
                                 enc_name(enc), unpack_kernel_name((enum unpack_kernel)k), store,
                                 rows, cols, pass, i, i / cols,
                                 unpack_tensor_width(&u, (uint32_t)(i / cols)), got[i], ref[i]);
            }
        }
    }
    unpack_tensor_fini(&u);
    free(out);
    free(ref);
    sl_free_aligned(got);
    free(sc);
    packed_free(&p);
}

static void test_single_widths(void **st)
{
    (void)st;
    for (int e = 0; e < 3; e++)
        for (uint32_t b = 1; b <= 8; b++)
            for (size_t ci = 0; ci < NCOLS; ci++) {
                uint8_t w[3] = {(uint8_t)b, (uint8_t)b, (uint8_t)b};
                check_case(encs[e], 3, colsets[ci], w);
            }
}

static void test_mixed_widths(void **st)
{
    (void)st;
    for (int e = 0; e < 3; e++)
        for (int k = 0; k < 60; k++) {
            uint32_t rows = 1 + test_rng_below(&rng, 40);
            uint32_t cols = colsets[test_rng_below(&rng, NCOLS)];
            if (k % 3 == 0)
                cols = 1 + test_rng_below(&rng, 2100); /* any length, tails of every size */
            uint8_t *w = malloc(rows);
            for (uint32_t r = 0; r < rows; r++)
                w[r] = (uint8_t)(1 + test_rng_below(&rng, 8));
            check_case(encs[e], rows, cols, w);
            free(w);
        }
}

/* ---- golden bytes ------------------------------------------------------------------- */

static uint32_t code_of(int q, uint32_t b)
{
    return b == 1 ? (q > 0) : (uint32_t)(q + (1 << (b - 1)) - 1);
}

/* The header, width array and scales of docs/FORMAT-packed.md. */
static void check_prefix(const struct packed *p)
{
    const uint8_t *b = p->bytes;
    static const char *magic[] = {[FORMAT_ENC_ADAPTIVE] = "SLAD",
                                  [FORMAT_ENC_INT4INT8] = "SL48",
                                  [FORMAT_ENC_BITPLANE] = "SLBP"};
    assert_memory_equal(b, magic[p->enc], 4);
    assert_int_equal(sl_load_le32(b + 4), 1);
    assert_int_equal(sl_load_le32(b + 8), p->rows);
    assert_int_equal(sl_load_le32(b + 12), p->cols);
    assert_int_equal(sl_load_le32(b + 16), p->enc == FORMAT_ENC_ADAPTIVE ? 512 : 0);
    assert_int_equal(sl_load_le32(b + 20), 0);
    uint64_t wbytes = (3 * (uint64_t)p->rows + 7) / 8 + 1;
    uint64_t soff = (32 + wbytes + 63) / 64 * 64, doff = (soff + 4 * p->rows + 63) / 64 * 64;
    assert_int_equal(format_packed_prefix_bytes(p->rows), doff);
    assert_int_equal(sl_load_le64(b + 24), p->len - doff);
    for (uint32_t r = 0; r < p->rows; r++) { /* bit 3r + i of the array is bit i of width-1 */
        uint32_t v = 0;
        for (int i = 0; i < 3; i++) {
            uint64_t bit = 3 * (uint64_t)r + (uint64_t)i;
            v |= (uint32_t)((b[32 + bit / 8] >> (bit % 8)) & 1) << i;
        }
        assert_int_equal(v + 1, p->widths[r]);
    }
    for (uint32_t r = 0; r < p->rows; r++)
        assert_true(sl_load_lef32(b + soff + 4 * r) == p->scales[r]);
}

/* Adaptive: row of D weights with width b starting at `row`, byte by byte:
 * group g holds weights [512g, ...); tail group of round_up(t, 8) weights;
 * S = group/8; plane blocks in weightlet order; block j of a w-bit plane,
 * byte i, holds stripe k = j*(8/w) + l at bits [8 - w(l+1), 8 - wl). */
static void expect_adaptive_row(const int8_t *q, uint32_t D, uint32_t b, const uint8_t *row)
{
    static const uint8_t pl[9][4] = {{0},    {1},       {2},    {2, 1}, {4},
                                     {4, 1}, {4, 2},    {4, 2, 1}, {4, 4}};
    size_t off = 0;
    for (uint32_t g0 = 0; g0 < D; g0 += 512) {
        uint32_t G = D - g0 >= 512 ? 512 : (D - g0 + 7) / 8 * 8, S = G / 8;
        uint32_t below = b; /* code bits below the current plane */
        for (int p = 0; p < 4 && pl[b][p]; p++) {
            uint32_t w = pl[b][p], per = 8 / w;
            below -= w;
            for (uint32_t j = 0; j < w; j++)
                for (uint32_t i = 0; i < S; i++) {
                    uint32_t want = 0;
                    for (uint32_t l = 0; l < per; l++) {
                        uint32_t k = j * per + l, x = g0 + k * S + i;
                        uint32_t bits = x < D ? (code_of(q[x], b) >> below) & ((1u << w) - 1) : 0;
                        want |= bits << (8 - w * (l + 1));
                    }
                    if (row[off] != want)
                        fail_msg("adaptive D=%u b=%u: byte %zu (group %u, plane %u, block %u, "
                                 "byte %u) is 0x%02x, layout says 0x%02x",
                                 D, b, off, g0 / 512, w, j, i, row[off], want);
                    off++;
                }
        }
    }
    assert_int_equal(off, format_packed_row_bytes(FORMAT_ENC_ADAPTIVE, b, D));
}

static void test_golden(void **st)
{
    (void)st;
    /* the worked example of the document: b = 5, u = j % 31 */
    {
        int8_t q[512];
        for (int j = 0; j < 512; j++)
            q[j] = (int8_t)(j % 31 - 15);
        uint8_t w = 5;
        float s = 0.5f;
        void *bytes;
        uint64_t len;
        struct sl_err err = {{0}};
        assert_int_equal(quantizer_pack(FORMAT_ENC_ADAPTIVE, q, &w, &s, 1, 512, &bytes, &len, &err),
                         0);
        const uint8_t *d = (const uint8_t *)bytes + 128;
        assert_int_equal(len, 128 + 5 * 64);
        /* block 0, byte 3: weight 3 (u = 3, 4-bit weightlet 1) high, weight 67 (u = 5, 2) low */
        assert_int_equal(d[3], (1 << 4) | 2);
        /* block 1, byte 0: weights 128 (u = 4 -> 2) and 192 (u = 6 -> 3) */
        assert_int_equal(d[64], (2 << 4) | 3);
        /* block 4 (1-bit plane), byte 1: weights 1, 65, 129, ..., 449, bit 7 first */
        uint32_t want = 0;
        for (int l = 0; l < 8; l++)
            want |= (uint32_t)(((64 * l + 1) % 31) & 1) << (7 - l);
        assert_int_equal(d[256 + 1], want);
        free(bytes);
    }
    /* the width array example of the document */
    {
        uint8_t w[5] = {3, 5, 8, 1, 7};
        struct packed p;
        packed_make(&p, FORMAT_ENC_BITPLANE, 5, 16, w);
        assert_int_equal(p.bytes[32], 0xE2);
        assert_int_equal(p.bytes[33], 0x61);
        assert_int_equal(p.bytes[34], 0);
        packed_free(&p);
    }
    for (uint32_t b = 1; b <= 8; b++) {
        static const uint32_t Ds[] = {1, 8, 13, 64, 172, 512, 688, 1031};
        for (size_t di = 0; di < sizeof Ds / sizeof Ds[0]; di++) {
            uint32_t D = Ds[di];
            uint8_t widths[2] = {(uint8_t)b, (uint8_t)(9 - b)};
            for (int e = 0; e < 3; e++) {
                struct packed p;
                packed_make(&p, encs[e], 2, D, widths);
                check_prefix(&p);
                const uint8_t *row = p.bytes + format_packed_prefix_bytes(2);
                for (uint32_t r = 0; r < 2; r++) {
                    uint32_t wb = widths[r];
                    const int8_t *qr = p.q + (size_t)r * D;
                    if (p.enc == FORMAT_ENC_ADAPTIVE) {
                        expect_adaptive_row(qr, D, wb, row);
                    } else if (p.enc == FORMAT_ENC_BITPLANE) {
                        /* planes in order, each over round_up(D, 8) weights, LSB first */
                        static const uint8_t pl[9][4] = {{0},    {1},    {2},       {2, 1}, {4},
                                                         {4, 1}, {4, 2}, {4, 2, 1}, {4, 4}};
                        const uint8_t *plane = row;
                        uint32_t below = wb;
                        for (int k = 0; k < 4 && pl[wb][k]; k++) {
                            uint32_t w = pl[wb][k];
                            below -= w;
                            for (uint32_t j = 0; j < (D + 7) / 8 * 8; j++) {
                                uint32_t bits = (plane[j * w / 8] >> (j * w % 8)) & ((1u << w) - 1);
                                uint32_t want =
                                    j < D ? (code_of(qr[j], wb) >> below) & ((1u << w) - 1) : 0;
                                assert_int_equal(bits, want);
                            }
                            plane += (D + 7) / 8 * 8 * w / 8;
                        }
                    } else {
                        for (uint32_t j = 0; j < D; j++) {
                            int v = wb <= 4 ? (int)((row[j / 2] >> (4 * (j % 2))) & 0xf)
                                            : (int)(int8_t)row[j];
                            if (wb <= 4 && v >= 8)
                                v -= 16;
                            assert_int_equal(v, qr[j]);
                        }
                        if (wb <= 4 && D % 2) /* the unused high nibble is zero */
                            assert_int_equal(row[D / 2] >> 4, 0);
                    }
                    row += format_packed_row_bytes(p.enc, wb, D);
                }
                assert_ptr_equal(row, p.bytes + p.len);
                packed_free(&p);
            }
        }
    }
}

static void test_sizes(void **st)
{
    (void)st;
    /* adaptive and bitplane: b bits per weight over rows padded to 8 weights;
     * int4int8: 4 bits for b <= 4, 8 bits otherwise */
    for (uint32_t b = 1; b <= 8; b++) {
        assert_int_equal(format_packed_row_bytes(FORMAT_ENC_ADAPTIVE, b, 2048), b * 256);
        assert_int_equal(format_packed_row_bytes(FORMAT_ENC_BITPLANE, b, 2048), b * 256);
        assert_int_equal(format_packed_row_bytes(FORMAT_ENC_ADAPTIVE, b, 172), b * 22);
        assert_int_equal(format_packed_row_bytes(FORMAT_ENC_ADAPTIVE, b, 688), b * 86);
        assert_int_equal(format_packed_row_bytes(FORMAT_ENC_BITPLANE, b, 172), b * 22);
        assert_int_equal(format_packed_row_bytes(FORMAT_ENC_INT4INT8, b, 2048),
                         b <= 4 ? 1024 : 2048);
        assert_int_equal(format_packed_row_bytes(FORMAT_ENC_INT4INT8, b, 171), b <= 4 ? 86 : 171);
    }
    assert_int_equal(format_packed_prefix_bytes(1), 128);     /* header+widths 64, scales 64 */
    /* 4096 rows: widths 1537 bytes end at 1569 -> scales at 1600, codes at 1600 + 16384 */
    assert_int_equal(format_packed_prefix_bytes(4096), 1600 + 16384);
}

/* ---- correction -------------------------------------------------------------------- */

static void test_correction(void **st)
{
    (void)st;
    for (int e = 0; e < 3; e++) {
        uint32_t rows = 17, cols = colsets[test_rng_below(&rng, NCOLS)] + 64;
        uint8_t w[17];
        for (uint32_t r = 0; r < rows; r++)
            w[r] = (uint8_t)(1 + r % 8);
        struct packed p;
        packed_make(&p, encs[e], rows, cols, w);
        int32_t want[17], corr[17];
        for (uint32_t r = 0; r < rows; r++) {
            int32_t s = 0;
            for (uint32_t c = 0; c < cols; c++)
                s += p.q[(size_t)r * cols + c];
            want[r] = 128 * s;
        }
        struct format_tensor_info t = info_of(&p);
        int8_t *q = malloc((size_t)rows * cols);
        float sc[17];
        struct sl_err err = {{0}};
        assert_int_equal(unpack_tensor_int8_corr(&t, p.bytes, q, sc, corr, &err), 0);
        assert_memory_equal(corr, want, sizeof want);
        struct unpack_tensor u;
        assert_int_equal(unpack_tensor_init(&u, p.enc, p.bytes, p.len, rows, cols, &err), 0);
        for (int k = 0; k < UNPACK_KERNEL_COUNT; k++) {
            if (!unpack_kernel_available((enum unpack_kernel)k))
                continue;
            memset(corr, 0, sizeof corr);
            /* rows 3..16 only: the sub-range lands at the start of q and corr */
            assert_int_equal(unpack_tensor_rows(&u, (enum unpack_kernel)k, 3, rows, q, corr), 0);
            assert_memory_equal(corr, want + 3, sizeof(int32_t) * (rows - 3));
            assert_memory_equal(q, p.q + (size_t)3 * cols, (size_t)(rows - 3) * cols);
        }
        unpack_tensor_fini(&u);
        free(q);
        packed_free(&p);
    }
    /* q8: a copy, and the same correction */
    uint32_t rows = 3, cols = 100;
    size_t len = 64 + (size_t)rows * cols;
    uint8_t *b = calloc(1, len);
    int32_t want[3] = {0};
    for (uint32_t r = 0; r < rows; r++) {
        sl_store_lef32(b + 4 * r, 0.25f * (float)(r + 1));
        for (uint32_t c = 0; c < cols; c++) {
            int8_t v = (int8_t)((int)test_rng_below(&rng, 255) - 127);
            b[64 + r * cols + c] = (uint8_t)v;
            want[r] += 128 * v;
        }
    }
    struct format_tensor_info t;
    memset(&t, 0, sizeof t);
    snprintf(t.name, sizeof t.name, "output");
    t.encoding = FORMAT_ENC_Q8_CHANNEL;
    t.n_dims = 2;
    t.shape[0] = rows;
    t.shape[1] = cols;
    t.length = len;
    int8_t q[300];
    float sc[3];
    int32_t corr[3];
    struct sl_err err = {{0}};
    assert_int_equal(unpack_tensor_int8_corr(&t, b, q, sc, corr, &err), 0);
    assert_memory_equal(q, b + 64, sizeof q);
    assert_memory_equal(corr, want, sizeof want);
    assert_true(sc[2] == 0.75f);
    b[64 + 5] = 0x80; /* -128 is not a q8 code */
    assert_int_equal(unpack_tensor_int8(&t, b, q, sc, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "output"));
    t.length = len - 1;
    assert_int_equal(unpack_tensor_int8(&t, b, q, sc, &err), -EINVAL);
    free(b);
}

/* ---- API edges ----------------------------------------------------------------------- */

static void test_api(void **st)
{
    (void)st;
    enum unpack_kernel ks[UNPACK_KERNEL_COUNT];
    int n = unpack_kernels_available(ks);
    assert_true(n >= 1);
    assert_int_equal(ks[0], UNPACK_KERNEL_SCALAR);
    assert_true(unpack_kernel_available(unpack_kernel_best()));
    for (int i = 0; i < n; i++)
        assert_true(unpack_kernel_available(ks[i]));
    assert_string_equal(unpack_kernel_name(UNPACK_KERNEL_AVX512), "avx512");
    assert_string_equal(unpack_kernel_name((enum unpack_kernel)99), "unknown");
    assert_false(unpack_kernel_available((enum unpack_kernel)99));

    uint8_t w[2] = {3, 6};
    struct packed p;
    packed_make(&p, FORMAT_ENC_ADAPTIVE, 2, 100, w);
    struct unpack_tensor u;
    struct sl_err err = {{0}};
    assert_int_equal(unpack_tensor_init(&u, p.enc, p.bytes, p.len, 2, 100, &err), 0);
    assert_int_equal(unpack_tensor_width(&u, 1), 6);
    assert_true(unpack_tensor_scale(&u, 1) == p.scales[1]);
    int8_t q[200];
    assert_int_equal(unpack_tensor_rows(&u, UNPACK_KERNEL_SCALAR, 1, 3, q, NULL), -EINVAL);
    assert_int_equal(unpack_tensor_rows(&u, UNPACK_KERNEL_SCALAR, 2, 1, q, NULL), -EINVAL);
    assert_int_equal(unpack_tensor_rows(&u, (enum unpack_kernel)99, 0, 1, q, NULL), -EINVAL);
    for (int k = 0; k < UNPACK_KERNEL_COUNT; k++)
        if (!unpack_kernel_available((enum unpack_kernel)k))
            assert_int_equal(unpack_tensor_rows(&u, (enum unpack_kernel)k, 0, 1, q, NULL),
                             -EINVAL);
    assert_int_equal(unpack_tensor_rows(&u, UNPACK_KERNEL_SCALAR, 1, 1, q, NULL), 0); /* empty */
    assert_int_equal(unpack_tensor_rows(&u, UNPACK_KERNEL_SCALAR, 1, 2, q, NULL), 0);
    assert_memory_equal(q, p.q + 100, 100);
    /* unpack_row from the raw row bytes, with every kernel */
    for (int e = 0; e < 3; e++) {
        struct packed p2;
        packed_make(&p2, encs[e], 2, 100, w);
        const uint8_t *row = p2.bytes + format_packed_prefix_bytes(2);
        for (int k = 0; k < UNPACK_KERNEL_COUNT; k++) {
            if (!unpack_kernel_available((enum unpack_kernel)k)) {
                assert_int_equal(unpack_row(p2.enc, (enum unpack_kernel)k, row, 100, 3, q), -EINVAL);
                continue;
            }
            const uint8_t *r1 = row + format_packed_row_bytes(p2.enc, 3, 100);
            assert_int_equal(unpack_row(p2.enc, (enum unpack_kernel)k, r1, 100, 6, q), 0);
            assert_memory_equal(q, p2.q + 100, 100);
            assert_int_equal(unpack_row(p2.enc, (enum unpack_kernel)k, row, 100, 3, q), 0);
            assert_memory_equal(q, p2.q, 100);
        }
        assert_int_equal(unpack_row(p2.enc, UNPACK_KERNEL_SCALAR, row, 100, 0, q), -EINVAL);
        assert_int_equal(unpack_row(p2.enc, UNPACK_KERNEL_SCALAR, row, 100, 9, q), -EINVAL);
        assert_int_equal(unpack_row(p2.enc, UNPACK_KERNEL_SCALAR, row, 0, 3, q), -EINVAL);
        assert_int_equal(unpack_row(FORMAT_ENC_Q8_CHANNEL, UNPACK_KERNEL_SCALAR, row, 100, 3, q),
                         -EINVAL);
        packed_free(&p2);
    }
    unpack_tensor_fini(&u);
    unpack_tensor_fini(&u); /* twice is fine */
    packed_free(&p);

    /* rows too long for an int32 correction */
    uint32_t cols = UNPACK_CORR_MAX_COLS + 8;
    uint8_t w1 = 1;
    packed_make(&p, FORMAT_ENC_ADAPTIVE, 1, cols, &w1);
    struct format_tensor_info t = info_of(&p);
    int8_t *big = malloc(cols);
    float sc;
    int32_t corr;
    assert_int_equal(unpack_tensor_int8_corr(&t, p.bytes, big, &sc, &corr, &err), -EOVERFLOW);
    assert_int_equal(unpack_tensor_int8(&t, p.bytes, big, &sc, &err), 0);
    assert_memory_equal(big, p.q, cols);
    free(big);
    packed_free(&p);

    /* the packer refuses what the format cannot hold */
    int8_t q2[4] = {5, 0, 0, 0}; /* 3 bits: grid [-3, 3] */
    uint8_t w3 = 3, w9 = 9;
    float s1 = 1, snan = NAN, sneg = -1;
    void *bytes;
    uint64_t len;
    assert_int_equal(quantizer_pack(FORMAT_ENC_ADAPTIVE, q2, &w3, &s1, 1, 4, &bytes, &len, &err),
                     -EINVAL);
    assert_non_null(strstr(err.msg, "grid"));
    q2[0] = 0;
    assert_int_equal(quantizer_pack(FORMAT_ENC_ADAPTIVE, q2, &w9, &s1, 1, 4, &bytes, &len, &err),
                     -EINVAL);
    assert_int_equal(quantizer_pack(FORMAT_ENC_BITPLANE, q2, &w3, &snan, 1, 4, &bytes, &len, &err),
                     -EINVAL);
    assert_int_equal(quantizer_pack(FORMAT_ENC_BITPLANE, q2, &w3, &sneg, 1, 4, &bytes, &len, &err),
                     -EINVAL);
    assert_int_equal(quantizer_pack(FORMAT_ENC_Q8_CHANNEL, q2, &w3, &s1, 1, 4, &bytes, &len, &err),
                     -EINVAL);
    uint8_t w1b = 1; /* b = 1 holds signs only: 0 is not a code */
    assert_int_equal(quantizer_pack(FORMAT_ENC_ADAPTIVE, q2, &w1b, &s1, 1, 4, &bytes, &len, &err),
                     -EINVAL);
}

/* ---- rejection --------------------------------------------------------------------------- */

/* unpack_tensor_int8 must fail with -EINVAL and a message containing `what`
 * (and the tensor's name); the outputs are sized for the true shape. */
static void expect_reject(const struct format_tensor_info *t, const void *bytes, const char *what,
                          const char *label)
{
    size_t n = (size_t)t->shape[0] * (t->shape[1] ? t->shape[1] : 1);
    int8_t *q = malloc(n ? n : 1);
    float *sc = malloc(sizeof(float) * (t->shape[0] ? t->shape[0] : 1));
    struct sl_err err = {{0}};
    int ret = unpack_tensor_int8(t, bytes, q, sc, &err);
    if (ret != -EINVAL)
        fail_msg("%s: %s accepted (ret %d)", enc_name(t->encoding), label, ret);
    if (!strstr(err.msg, t->name) || (what && !strstr(err.msg, what)))
        fail_msg("%s: %s: message '%s' lacks '%s'", enc_name(t->encoding), label, err.msg,
                 what ? what : t->name);
    /* the format module's validator (the traits table) agrees, for a matrix */
    const struct format_encoding_traits *tr = format_encoding_traits(t->encoding);
    if (t->n_dims == 2 && tr && tr->validate)
        assert_int_equal(tr->validate(bytes, t->length, t->shape[0], t->shape[1], &err), -EINVAL);
    free(q);
    free(sc);
}

static void test_rejects(void **st)
{
    (void)st;
    for (int e = 0; e < 3; e++) {
        uint32_t rows = 5, cols = 600;
        uint8_t w[5] = {3, 5, 8, 1, 7};
        struct packed p;
        packed_make(&p, encs[e], rows, cols, w);
        struct format_tensor_info t = info_of(&p);
        uint8_t *b = p.bytes;
        uint64_t soff = 64, doff = format_packed_prefix_bytes(rows);

        /* every truncation, into a buffer of exactly that length (ASan sees over-reads) */
        for (uint64_t l = 0; l < p.len; l += (l < doff + 8 ? 1 : 97)) {
            uint8_t *cut = malloc(l ? l : 1);
            memcpy(cut, b, l);
            t.length = l;
            expect_reject(&t, cut, l < doff ? "shorter" : "code bytes", "truncation");
            free(cut);
        }
        t.length = p.len + 1; /* one byte too many */
        uint8_t *longer = calloc(1, p.len + 1);
        memcpy(longer, b, p.len);
        expect_reject(&t, longer, "code bytes", "trailing byte");
        free(longer);
        t.length = p.len;

        struct {
            uint64_t off;
            uint8_t x;
            const char *what, *label;
        } flips[] = {
            {0, 1, "magic", "magic"},
            {4, 2, "version", "version"},
            {8, 1, "header", "rows"},
            {12, 1, "header", "cols"},
            {16, 1, "group", "group"},
            {20, 1, "reserved", "reserved"},
            {24, 1, "code bytes", "data_len"},
            {32, 7, "widths", "row 0's width"},          /* 3 -> 8 bits: lengths disagree */
            {33, 0x80, "widths", "width padding bits"},  /* bit 15: past 5 x 3 bits */
            {34, 1, "widths", "spare byte"},
            {40, 1, "widths", "padding before the scales"},
            {soff + 4 * rows, 1, "padding", "padding after the scales"},
        };
        for (size_t i = 0; i < sizeof flips / sizeof flips[0]; i++) {
            b[flips[i].off] ^= flips[i].x;
            expect_reject(&t, b, flips[i].what, flips[i].label);
            b[flips[i].off] ^= flips[i].x;
        }
        float bad[3] = {NAN, -1.0f, INFINITY};
        for (int i = 0; i < 3; i++) {
            uint8_t keep[4];
            memcpy(keep, b + soff + 4, 4);
            sl_store_lef32(b + soff + 4, bad[i]);
            expect_reject(&t, b, "scale of row 1", "bad scale");
            memcpy(b + soff + 4, keep, 4);
        }
        /* shape disagreeing with the header; not a matrix; not quantized */
        t.shape[1] = cols + 1;
        expect_reject(&t, b, "header", "shape");
        t.shape[1] = cols;
        t.n_dims = 1;
        expect_reject(&t, b, "not a quantized matrix", "1-D");
        t.n_dims = 2;
        t.encoding = FORMAT_ENC_F32;
        expect_reject(&t, b, "not a quantized matrix", "f32");
        t.encoding = 77;
        expect_reject(&t, b, "not a quantized matrix", "unknown encoding");
        t.encoding = p.enc;
        /* the untouched bytes still unpack */
        int8_t *q = malloc((size_t)rows * cols);
        float sc[5];
        struct sl_err err = {{0}};
        assert_int_equal(unpack_tensor_int8(&t, b, q, sc, &err), 0);
        assert_memory_equal(q, p.q, (size_t)rows * cols);
        free(q);
        packed_free(&p);
    }
}

/* Random corruption of the prefix and random lengths: an error or a tensor
 * that decodes onto the grid, never a crash (run under ASan in CI). */
static void test_random_corruption(void **st)
{
    (void)st;
    for (int iter = 0; iter < 600; iter++) {
        uint32_t enc = encs[iter % 3];
        uint32_t rows = 1 + test_rng_below(&rng, 12), cols = 1 + test_rng_below(&rng, 1200);
        uint8_t w[12];
        for (uint32_t r = 0; r < rows; r++)
            w[r] = (uint8_t)(1 + test_rng_below(&rng, 8));
        struct packed p;
        packed_make(&p, enc, rows, cols, w);
        uint64_t doff = format_packed_prefix_bytes(rows);
        uint64_t len = p.len;
        int mode = (int)test_rng_below(&rng, 3);
        if (mode == 0) { /* flip bits in the prefix */
            int nflip = 1 + (int)test_rng_below(&rng, 4);
            for (int i = 0; i < nflip; i++)
                p.bytes[test_rng_below(&rng, (uint32_t)doff)] ^=
                    (uint8_t)(1u << test_rng_below(&rng, 8));
        } else if (mode == 1) { /* a random length */
            len = test_rng_below(&rng, (uint32_t)p.len + 64);
        } else { /* overwrite a random header word with a random value */
            sl_store_le32(p.bytes + 4 * test_rng_below(&rng, 8), (uint32_t)test_rng_u64(&rng));
        }
        uint8_t *buf = malloc(len ? len : 1); /* exactly len bytes */
        memcpy(buf, p.bytes, len < p.len ? len : p.len);
        if (len > p.len)
            memset(buf + p.len, 0, len - p.len);
        struct format_tensor_info t = info_of(&p);
        t.length = len;
        int8_t *q = malloc((size_t)rows * cols);
        float *sc = malloc(sizeof(float) * rows);
        struct sl_err err = {{0}};
        int ret = unpack_tensor_int8(&t, buf, q, sc, &err);
        if (ret == 0) {
            for (size_t i = 0; i < (size_t)rows * cols; i++)
                assert_true(q[i] >= -127);
            for (uint32_t r = 0; r < rows; r++)
                assert_true(isfinite(sc[r]) && sc[r] >= 0);
        } else {
            assert_int_equal(ret, -EINVAL);
            assert_true(err.msg[0] != 0);
        }
        free(q);
        free(sc);
        free(buf);
        packed_free(&p);
    }
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
        cmocka_unit_test(test_golden),       cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_single_widths), cmocka_unit_test(test_mixed_widths),
        cmocka_unit_test(test_correction),   cmocka_unit_test(test_api),
        cmocka_unit_test(test_rejects),      cmocka_unit_test(test_random_corruption),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

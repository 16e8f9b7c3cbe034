/* test_npu_gemm.c: every int8 GEMM kernel the CPU has, with every register
 * tiling, against the scalar reference, bit for bit (int32 and dequantized
 * float outputs), over shapes that are not multiples of the tiles (m, n, k),
 * k not a multiple of 4, output ranges [r0, r1) that start and end inside a
 * 16-channel block, and all-extreme inputs (every a and b at +-127, where a
 * saturating kernel would differ), also for weights whose codes are within
 * +-64 (the AVX2 kernel's unsigned step: b at +-64, a at +-127), alone and
 * mixed with wide blocks, and within +-16 (its int16 rounds of four groups:
 * b at +16, a at 127), alone and mixed with narrow and wide blocks; the
 * prepared-weight and quantization
 * contracts of npu.h; every kernel and tiling's float output added to what
 * y holds (npu_gemm_args.add) against y's random values plus the reference's
 * float output, bit for bit. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "npu.h"
#include "npu_gemm_internal.h"
#include "testutil.h"

static struct test_rng rng;

static void fill(int8_t *x, size_t n, int mode)
{
    for (size_t i = 0; i < n; i++) {
        if (mode == 1)
            x[i] = 127;
        else if (mode == 2)
            x[i] = (int8_t)(test_rng_below(&rng, 2) ? 127 : -127);
        else
            x[i] = (int8_t)((int)test_rng_below(&rng, 255) - 127);
    }
}

/* Runs kernel kern with tiling tile: int32 into c, float into y, and (ya
 * not NULL) the float added to what ya holds. */
static void run(enum npu_kernel kern, int tile, const struct npu_gemm_b *b, const int8_t *a,
                uint32_t m, uint32_t r0, uint32_t r1, float act, const float *scale, int32_t *c,
                float *y, float *ya, size_t ldya)
{
    const struct npu_kernel_ops *ops = npu_kernel_ops(kern);
    uint8_t *stage = malloc(npu_gemm_prep_bytes(b->k4, m));
    assert_non_null(stage);
    ops->prep(a, b->k, m, b->k, b->k4, tile, stage);
    struct npu_gemm_args g = {.b = b, .a = stage, .m = m, .r0 = r0, .r1 = r1, .c = c,
                              .ldc = r1 - r0, .act_scale = act, .scale = scale, .tile = tile};
    ops->gemm(&g);
    g.c = NULL;
    g.y = y;
    g.ldy = r1 - r0;
    ops->gemm(&g);
    if (ya) {
        g.y = ya;
        g.ldy = ldya;
        g.add = 1;
        ops->gemm(&g);
    }
    free(stage);
}

static void check(uint32_t m, uint32_t n, uint32_t k, uint32_t r0, uint32_t r1, int mode)
{
    int8_t *a = malloc((size_t)m * k + 1), *b = malloc((size_t)n * k + 1);
    float *scale = malloc(sizeof(float) * n);
    fill(a, (size_t)m * k, mode >= 3 ? (mode == 4 ? 2 : 0) : mode);
    fill(b, (size_t)n * k, mode >= 3 ? (mode == 4 ? 2 : 0) : mode);
    if (mode == 1) /* a = 127, b = -127: the most negative sums */
        memset(b, 0x81, (size_t)n * k);
    /* narrow codes (|b| <= 64: the AVX2 kernel's shorter step), 3: random,
     * 4: +-64 against +-127 activations (the largest pair sums), 5: narrow
     * but for a few random rows (mixed blocks) */
    for (size_t i = 0; mode >= 3 && i < (size_t)n * k; i++)
        b[i] = mode == 4 ? (int8_t)(b[i] > 0 ? 64 : -64) : (int8_t)(b[i] / 2 - (b[i] > 0));
    for (uint32_t r = 0; mode == 5 && r < n; r++)
        if (test_rng_below(&rng, 5) == 0)
            fill(b + (size_t)r * k, k, 0);
    /* tiny codes (within +-NPU_GEMM_TINY: the AVX2 kernel's int16 rounds of
     * four groups), 6: every a = 127 and every b = +16 (the largest int16
     * round sums, 4 x 2 x 255 x 16 = 32640), 7: random a and b within +-16,
     * 8: each 16-channel block tiny at random, tiny at +-16, narrow or wide
     * (every pairing of tiny with another kind in the 2-block tiles) */
    if (mode == 6) {
        memset(a, 127, (size_t)m * k);
        memset(b, 16, (size_t)n * k);
    }
    /* 9: every a = 127, and in each 32-channel column one block tiny at +16
     * and the other narrow at +64, either way round: the 3-row tile's mixed
     * step at the int16 limit of both its kinds (32640) */
    if (mode == 9) {
        memset(a, 127, (size_t)m * k);
        for (uint32_t r = 0; r < n; r += 32) {
            const uint32_t first = test_rng_below(&rng, 2);
            for (uint32_t q = r; q < r + 32 && q < n; q++)
                memset(b + (size_t)q * k, ((q - r < 16) == (first == 1)) ? 16 : 64, k);
        }
    }
    for (uint32_t r = 0; (mode == 7 || mode == 8) && r < n; r += 16) {
        const uint32_t kind = mode == 7 ? 0 : test_rng_below(&rng, 4);
        for (size_t i = (size_t)r * k; i < (size_t)(r + 16 < n ? r + 16 : n) * k; i++) {
            const int v = (int)test_rng_below(&rng, 255) - 127;
            b[i] = (int8_t)(kind == 0   ? v % 17
                            : kind == 1 ? (v < 0 ? -16 : 16)
                            : kind == 2 ? v / 2
                                        : v);
        }
    }
    for (uint32_t r = 0; r < n; r++)
        scale[r] = (0.5f + test_rng_float(&rng)) * 1e-3f;
    const float act = 0.0173f;
    struct npu_gemm_b *pb;
    assert_int_equal(npu_gemm_b_create(b, n, k, &pb), 0);
    if (mode == 6 || mode == 7) /* the case under test is there */
        for (uint32_t bl = 0; bl < pb->n16 / 16; bl++)
            assert_int_equal(pb->tiny[bl], 1);
    if (mode == 9) /* one tiny block in every full column of two */
        for (uint32_t bl = 0; bl + 1 < n / 16; bl += 2)
            assert_int_equal(pb->tiny[bl] + pb->tiny[bl + 1], 1);
    uint32_t w = r1 - r0;
    size_t cnt = (size_t)m * w;
    int32_t *ref = malloc(sizeof(int32_t) * cnt + 4), *got = malloc(sizeof(int32_t) * cnt + 4);
    float *yref = malloc(sizeof(float) * cnt + 4), *ygot = malloc(sizeof(float) * cnt + 4);
    /* the residual the add pass adds to (random, of the outputs' magnitude
     * and far beyond it), and its sums with the reference's floats; its rows
     * are a wider stride apart (as the pipeline's residual rows are), with
     * a sentinel between them that no kernel may touch */
    const size_t lda2 = w + 37, cnt2 = (size_t)m * lda2;
    float *base = malloc(sizeof(float) * cnt2 + 4), *sum = malloc(sizeof(float) * cnt + 4);
    float *yadd = malloc(sizeof(float) * cnt2 + 4);
    for (size_t i = 0; i < cnt2; i++)
        base[i] = i % lda2 < w ? (test_rng_float(&rng) - 0.5f) * (i % 3 ? 40.0f : 1e5f) : 7.25f;
    run(NPU_KERNEL_SCALAR, 0, pb, a, m, r0, r1, act, scale, ref, yref, NULL, 0);
    for (size_t i = 0; i < cnt; i++)
        sum[i] = base[i / w * lda2 + i % w] + yref[i];
    for (int kern = 0; kern < NPU_KERNEL_COUNT; kern++) {
        if (!npu_kernel_available((enum npu_kernel)kern))
            continue;
        const struct npu_kernel_ops *ops = npu_kernel_ops((enum npu_kernel)kern);
        for (int t = 0; t < ops->tiles; t++) {
            memset(got, 0x55, sizeof(int32_t) * cnt);
            memset(ygot, 0x55, sizeof(float) * cnt);
            memcpy(yadd, base, sizeof(float) * cnt2);
            run((enum npu_kernel)kern, t, pb, a, m, r0, r1, act, scale, got, ygot, yadd, lda2);
            for (size_t i = 0; i < cnt2; i++)
                if (i % lda2 >= w && yadd[i] != 7.25f)
                    fail_msg("%s tile %s m=%u n=%u k=%u range [%u,%u): the add wrote past its "
                             "row's channels (y[%zu][%zu])",
                             npu_kernel_name((enum npu_kernel)kern), ops->tile_names[t], m, n, k,
                             r0, r1, i / lda2, i % lda2);
            for (size_t i = 0; i < cnt; i++) {
                if (got[i] != ref[i])
                    fail_msg("%s tile %s m=%u n=%u k=%u range [%u,%u) mode %d: C[%zu][%zu] = "
                             "%d, scalar %d",
                             npu_kernel_name((enum npu_kernel)kern), ops->tile_names[t], m, n, k,
                             r0, r1, mode, i / w, i % w, got[i], ref[i]);
                if (memcmp(&ygot[i], &yref[i], sizeof(float)))
                    fail_msg("%s tile %s m=%u n=%u k=%u range [%u,%u): y[%zu][%zu] = %.9g, "
                             "scalar %.9g",
                             npu_kernel_name((enum npu_kernel)kern), ops->tile_names[t], m, n, k,
                             r0, r1, i / w, i % w, (double)ygot[i], (double)yref[i]);
                if (memcmp(&yadd[i / w * lda2 + i % w], &sum[i], sizeof(float)))
                    fail_msg("%s tile %s m=%u n=%u k=%u range [%u,%u): y[%zu][%zu] added = %.9g, "
                             "residual + scalar %.9g",
                             npu_kernel_name((enum npu_kernel)kern), ops->tile_names[t], m, n, k,
                             r0, r1, i / w, i % w, (double)yadd[i / w * lda2 + i % w],
                             (double)sum[i]);
            }
        }
        /* the public entry (allocates its own staging, default tiling) */
        memset(got, 0x55, sizeof(int32_t) * cnt);
        npu_gemm_s8_kernel((enum npu_kernel)kern, pb, a, m, r0, r1, got, w);
        assert_memory_equal(got, ref, sizeof(int32_t) * cnt);
    }
    /* the reference itself against a direct sum of the unpacked operands */
    for (uint32_t i = 0; i < m; i += 1 + m / 3)
        for (uint32_t r = r0; r < r1; r += 1 + w / 5) {
            int64_t s = 0;
            for (uint32_t j = 0; j < k; j++)
                s += (int32_t)a[(size_t)i * k + j] * b[(size_t)r * k + j];
            assert_int_equal(ref[(size_t)i * w + (r - r0)], s);
            float want = (act * scale[r]) * (float)s;
            assert_true(yref[(size_t)i * w + (r - r0)] == want);
        }
    npu_gemm_b_destroy(pb);
    free(a);
    free(b);
    free(scale);
    free(ref);
    free(got);
    free(yref);
    free(ygot);
    free(base);
    free(sum);
    free(yadd);
}

static void test_shapes(void **st)
{
    (void)st;
    static const uint32_t ms[] = {1, 2, 3, 5, 6, 7, 8, 11, 12, 13, 25, 32};
    static const uint32_t ns[] = {1, 15, 16, 17, 33, 48, 64, 100, 129};
    static const uint32_t ks[] = {1, 3, 4, 5, 31, 64, 173, 256};
    for (size_t a = 0; a < sizeof ms / 4; a++)
        for (size_t b = 0; b < sizeof ns / 4; b++)
            for (size_t c = 0; c < sizeof ks / 4; c++)
                for (int mode = 0; mode < 9; mode += 3)
                    check(ms[a], ns[b], ks[c], 0, ns[b], mode == 6 ? 7 : mode);
}

static void test_ranges(void **st)
{
    (void)st;
    for (int t = 0; t < 80; t++) {
        uint32_t n = 1 + test_rng_below(&rng, 200), k = 1 + test_rng_below(&rng, 300);
        uint32_t r0 = test_rng_below(&rng, n), r1 = r0 + 1 + test_rng_below(&rng, n - r0);
        check(1 + test_rng_below(&rng, 40), n, k, r0, r1, t % 3 == 0 ? 0 : t % 3 == 1 ? 3 : 5);
    }
}

static void test_extremes(void **st)
{
    (void)st;
    check(7, 48, 1031, 0, 48, 1);   /* large negative sums, long k */
    check(13, 37, 2048, 0, 37, 2);  /* random signs at full magnitude */
    check(25, 70, 4099, 5, 66, 1);  /* k = 4099: pads, a range inside blocks */
    check(13, 37, 2048, 0, 37, 4);  /* narrow codes at +-64, activations at +-127 */
    check(11, 100, 14337, 3, 97, 4); /* the same over a long k: no int32 overflow */
    check(9, 129, 777, 0, 129, 5);  /* narrow and wide blocks mixed */
    check(13, 64, 2048, 0, 64, 6);  /* tiny codes at +16, activations at 127 */
    check(8, 70, 4099, 3, 67, 6);   /* the same, an odd k and a range inside blocks */
    check(13, 64, 2048, 0, 64, 9);  /* mixed tiny/narrow columns at their limits, */
    check(14, 96, 4099, 5, 90, 9);  /* row tails of 1 and 2, an odd k, a range */
    check(20, 64, 1027, 0, 64, 9);  /* inside blocks */
}

/* Tiny blocks alone and paired with tiny, narrow and wide ones (the AVX2
 * kernel's 2-row tiles and mixed 3-row tiles), random shapes: odd m and k,
 * ranges that start and end inside blocks. */
static void test_tiny(void **st)
{
    (void)st;
    for (int t = 0; t < 60; t++) {
        uint32_t n = 1 + test_rng_below(&rng, 300), k = 1 + test_rng_below(&rng, 400);
        uint32_t r0 = t % 2 ? test_rng_below(&rng, n) : 0;
        uint32_t r1 = t % 2 ? r0 + 1 + test_rng_below(&rng, n - r0) : n;
        check(1 + test_rng_below(&rng, 40), n, k, r0, r1, t % 4 == 0 ? 7 : 8);
    }
    check(256, 2048, 2048, 0, 2048, 8); /* a prefill chunk of the model's shape */
}

/* npu_gemm_tiny_rows counts what the AVX2 kernel runs with its tiny step:
 * tiny blocks in 32-channel pairs without a wide block (a tiny block beside a
 * narrow one counts; beside a wide one it does not), a last lone block of 5
 * rows; 0 for kernels without the step. And the step's peak is measured. */
static void test_tiny_rows(void **st)
{
    (void)st;
    const uint32_t cols = 37, rows = 16 * 6 + 5;
    int8_t *q = malloc((size_t)rows * cols);
    assert_non_null(q);
    /* blocks: tiny tiny | tiny narrow | wide tiny | tail of 5 tiny rows */
    static const int kind[7] = {0, 0, 0, 1, 2, 0, 0};
    for (uint32_t r = 0; r < rows; r++)
        for (uint32_t c = 0; c < cols; c++) {
            const int v = (int)test_rng_below(&rng, 33) - 16; /* within +-16 */
            q[(size_t)r * cols + c] = (int8_t)v;
        }
    for (uint32_t bl = 0; bl < 7; bl++)
        if (kind[bl]) /* one code beyond +-16 (narrow) or beyond +-64 (wide) */
            q[(size_t)(bl * 16 + 3) * cols + 5] = (int8_t)(kind[bl] == 1 ? -17 : 65);
    const uint32_t want = 32 + 16 + 0 + 5;
    if (npu_kernel_available(NPU_KERNEL_AVX2)) {
        assert_int_equal(npu_gemm_tiny_rows(NPU_KERNEL_AVX2, q, rows, cols), want);
        assert_true(npu_gemm_peak_tiny_gops(NPU_KERNEL_AVX2, 0.02) > 0);
    } else {
        assert_int_equal(npu_gemm_tiny_rows(NPU_KERNEL_AVX2, q, rows, cols), 0);
    }
    assert_int_equal(npu_gemm_tiny_rows(NPU_KERNEL_SCALAR, q, rows, cols), 0);
    assert_true(npu_gemm_peak_tiny_gops(NPU_KERNEL_SCALAR, 0.01) == 0);
    free(q);
}

/* Every kernel's weight packer against the scalar one: packed bytes, row
 * sums and wide flags identical, pieces in any order, -128 reported. Codes
 * are full-range, or within +-64 (narrow blocks) with single codes at the
 * edges (+-64, +-65, -128) planted; k from 1 to 300 (tails of every length
 * under 32 and 4) and the model's multiples of 32. */
static void test_pack(void **st)
{
    (void)st;
    for (int t = 0; t < 120; t++) {
        uint32_t n = 1 + test_rng_below(&rng, 100), k = 1 + test_rng_below(&rng, 300);
        if (t == 0)
            n = 16, k = 64;
        if (t % 7 == 3)
            k = 32 * (1 + test_rng_below(&rng, 12));
        int8_t *q = malloc((size_t)n * k);
        if (t % 3 == 1) { /* narrow: within +-64, or tiny: within +-16 */
            int lim = t % 2 ? 64 : 16;
            for (size_t i = 0; i < (size_t)n * k; i++)
                q[i] = (int8_t)((int)test_rng_below(&rng, 2 * lim + 1) - lim);
            static const int8_t edge[] = {64, -64, 65, -65, 16, -16, 17, -17};
            for (int e = 0; e < 2; e++)
                q[test_rng_below(&rng, n * k)] = edge[test_rng_below(&rng, 8)];
        } else {
            fill(q, (size_t)n * k, t % 3 == 2 ? 2 : 0);
        }
        int want_bad = t % 5 == 4;
        size_t at_bad = want_bad ? test_rng_below(&rng, n * k) : 0;
        if (want_bad)
            q[at_bad] = -128;
        struct npu_gemm_b *ref, *got;
        assert_int_equal(npu_gemm_b_alloc(n, k, &ref), 0);
        assert_int_equal(npu_ops_scalar.pack(ref, q, 0, n), want_bad);
        for (uint32_t r = 0; r < n; r += 16) { /* wide and tiny: their definitions */
            int big = 0, small = 1;
            for (uint32_t i = r; i < n && i < r + 16; i++)
                for (uint32_t j = 0; j < k; j++) {
                    int v = q[(size_t)i * k + j];
                    big |= v > 64 || v < -64;
                    small &= v <= NPU_GEMM_TINY && v >= -NPU_GEMM_TINY;
                }
            assert_int_equal(ref->wide[r / 16], big);
            assert_int_equal(ref->tiny[r / 16], small);
        }
        for (int kern = 1; kern < NPU_KERNEL_COUNT; kern++) {
            const struct npu_kernel_ops *ops = npu_kernel_ops((enum npu_kernel)kern);
            if (!npu_kernel_available((enum npu_kernel)kern) || !ops->pack)
                continue;
            assert_int_equal(npu_gemm_b_alloc(n, k, &got), 0);
            memset(got->packed, 0x5a, (size_t)got->n16 * got->k4);
            memset(got->rowsum, 0x5a, sizeof(int32_t) * got->n16);
            memset(got->wide, 0x5a, got->n16 / 16);
            memset(got->tiny, 0x5a, got->n16 / 16);
            /* in two pieces, the later one first */
            uint32_t cut = n > 16 ? 16 * (1 + test_rng_below(&rng, (n - 1) / 16)) : n;
            /* each piece reports a -128 of its own rows, and only that */
            int in_hi = want_bad && at_bad >= (size_t)cut * k;
            if (cut < n)
                assert_int_equal(ops->pack(got, q + (size_t)cut * k, cut, n), in_hi);
            assert_int_equal(ops->pack(got, q, 0, cut), want_bad && !in_hi);
            assert_memory_equal(got->packed, ref->packed, (size_t)ref->n16 * ref->k4);
            assert_memory_equal(got->rowsum, ref->rowsum, sizeof(int32_t) * ref->n16);
            assert_memory_equal(got->wide, ref->wide, ref->n16 / 16);
            assert_memory_equal(got->tiny, ref->tiny, ref->n16 / 16);
            npu_gemm_b_destroy(got);
        }
        /* and the layout is what npu_gemm_b_at reads */
        for (uint32_t r = 0; r < n; r += 1 + n / 7)
            for (uint32_t j = 0; j < k; j += 1 + k / 9)
                assert_int_equal(npu_gemm_b_at(ref, r, j), q[(size_t)r * k + j]);
        npu_gemm_b_destroy(ref);
        free(q);
    }
}

static void test_weights(void **st)
{
    (void)st;
    /* -128 is refused (the AVX2 kernel negates weights) */
    int8_t bad[3 * 5];
    float sc[3] = {1, 1, 1};
    memset(bad, 1, sizeof bad);
    bad[7] = -128;
    struct npu_weights *w = (struct npu_weights *)1;
    assert_int_equal(npu_weights_create(bad, sc, 3, 5, &w), -ERANGE);
    assert_null(w);
    assert_int_equal(npu_weights_create(bad, sc, 0, 5, &w), -EINVAL);
    assert_int_equal(npu_weights_create(NULL, sc, 3, 5, &w), -EINVAL);

    /* filled in 16-row pieces (in any order) = created at once; rows read back */
    const uint32_t R = 70, C = 37;
    int8_t *q = malloc(R * C), *row = malloc(C);
    float *scale = malloc(sizeof(float) * R);
    fill(q, (size_t)R * C, 0);
    for (uint32_t r = 0; r < R; r++)
        scale[r] = 0.01f * (float)(r + 1);
    struct npu_weights *wa, *wb;
    assert_int_equal(npu_weights_create(q, scale, R, C, &wa), 0);
    assert_int_equal(npu_weights_alloc(R, C, &wb), 0);
    /* faulting the storage in ahead, before and between fills, changes no
     * contents (the pipeline does it beside the fills); out of range: nothing */
    const size_t storage = npu_weights_storage(wb);
    assert_true(storage >= (size_t)R * C);
    int pf = npu_weights_prefault(wb, 0, storage);
    assert_true(pf == 0 || pf == -EINVAL); /* -EINVAL: a kernel before 5.14 */
    assert_int_equal(npu_weights_prefault(wb, storage, 4096), 0);
    assert_int_equal(npu_weights_fill(wb, 8, 16, q + 8 * C, scale + 8), -EINVAL); /* unaligned */
    assert_int_equal(npu_weights_fill(wb, 64, 8, q, scale), -EINVAL); /* ends mid-block */
    assert_int_equal(npu_weights_fill(wb, 64, 6, q + 64 * C, scale + 64), 0);
    assert_int_equal(npu_weights_fill(wb, 16, 48, q + 16 * C, scale + 16), 0);
    npu_weights_prefault(wb, 100, storage); /* rows already filled stay as they are */
    assert_int_equal(npu_weights_fill(wb, 0, 16, q, scale), 0);
    assert_int_equal(npu_weights_rows(wb), R);
    assert_int_equal(npu_weights_cols(wb), C);
    assert_true(npu_weights_bytes(wb) >= (size_t)R * C);
    for (uint32_t r = 0; r < R; r++) {
        npu_weights_row(wb, r, row);
        assert_memory_equal(row, q + (size_t)r * C, C);
        assert_true(npu_weights_scale(wb, r) == scale[r]);
    }
    const uint32_t M = 9;
    int8_t *xq = malloc(M * C);
    fill(xq, (size_t)M * C, 0);
    float *ya = malloc(sizeof(float) * M * R), *yb = malloc(sizeof(float) * M * R);
    npu_linear_s8(wa, xq, M, 0.25f, ya);
    npu_linear_s8(wb, xq, M, 0.25f, yb);
    assert_memory_equal(ya, yb, sizeof(float) * M * R);
    free(ya);
    free(yb);
    free(xq);
    npu_weights_destroy(wa);
    npu_weights_destroy(wb);
    npu_weights_destroy(NULL);
    free(q);
    free(row);
    free(scale);
}

static void test_linear(void **st)
{
    (void)st;
    /* the dequantized linear equals (s * scale[r]) * acc, also for a range */
    uint32_t m = 7, n = 40, k = 70;
    int8_t *q = malloc(n * k), *xq = malloc(m * k);
    fill(q, n * k, 0);
    fill(xq, m * k, 0);
    float scale[40], y[7 * 40];
    for (int i = 0; i < 40; i++)
        scale[i] = 0.01f * (float)(i + 1);
    struct npu_weights *w;
    assert_int_equal(npu_weights_create(q, scale, n, k, &w), 0);
    npu_linear_s8(w, xq, m, 0.5f, y);
    for (uint32_t i = 0; i < m; i++)
        for (uint32_t r = 0; r < n; r++) {
            int32_t acc = 0;
            for (uint32_t j = 0; j < k; j++)
                acc += xq[i * k + j] * q[r * k + j];
            assert_true(y[i * n + r] == (0.5f * scale[r]) * (float)acc);
        }
    float yr[7 * 40];
    for (size_t i = 0; i < 7 * 40; i++)
        yr[i] = -1.0f;
    npu_linear_s8_range(w, xq, m, 0.5f, yr, n, 5, 23);
    for (uint32_t i = 0; i < m; i++)
        for (uint32_t r = 0; r < n; r++)
            assert_true(yr[i * n + r] == (r >= 5 && r < 23 ? y[i * n + r] : -1.0f));
    npu_weights_destroy(w);
    free(q);
    free(xq);
}

static void test_quantize(void **st)
{
    (void)st;
    /* round half to even, clamp at +-127, NaN to 0, zero for a bad scale */
    float x[9] = {0.5f, 1.5f, -2.5f, 1000.0f, -1000.0f, 3.2f, NAN, INFINITY, -INFINITY};
    int8_t o[9];
    npu_quantize_act(x, 9, 1.0f, o);
    int8_t want[9] = {0, 2, -2, 127, -127, 3, 0, 127, -127};
    assert_memory_equal(o, want, 9);
    const float bad_scales[4] = {0.0f, -1.0f, NAN, INFINITY};
    for (int b = 0; b < 4; b++) {
        memset(o, 1, sizeof o);
        npu_quantize_act(x, 9, bad_scales[b], o);
        for (int i = 0; i < 9; i++)
            assert_int_equal(o[i], 0);
    }
    float y[3] = {0.3f, -0.7f, 0.1f};
    npu_quantize_act(y, 3, 0.1f, o); /* x * (1 / s): 0.3 * 10 = 3, -7, 1 */
    assert_int_equal(o[0], 3);
    assert_int_equal(o[1], -7);
    assert_int_equal(o[2], 1);
    /* dynamic scale: max|x| / 127 over finite values, never 0 */
    assert_true(npu_act_scale_dynamic(x, 6) == 1000.0f / 127.0f);
    assert_true(npu_act_scale_dynamic(x, 9) == 1000.0f / 127.0f);
    float z[3] = {0, 0, 0};
    assert_true(npu_act_scale_dynamic(z, 3) == 1.0f);
    float tiny[1] = {1e-40f};
    assert_true(npu_act_scale_dynamic(tiny, 1) == NPU_ACT_SCALE_MIN);
}

/* Every kernel's activation quantizer and max-abs against the scalar ones,
 * bit for bit: random values, exact ties (k + 0.5), the clamp bounds,
 * NaN, infinities, denormals, every tail length. */
static void test_quantize_kernels(void **st)
{
    (void)st;
    enum { N = 1000 };
    float *x = malloc(sizeof(float) * N);
    enum { GUARD = 64 }; /* bytes after the n outputs that must stay untouched */
    int8_t *ref = malloc(N), *got = malloc(N + GUARD);
    static const float specials[] = {0.5f,  -0.5f, 1.5f,    -2.5f,     126.5f, -126.5f,
                                     127.5f, 200.f, -1e30f, 1e-40f,   -0.0f,  INFINITY,
                                     -INFINITY, NAN, 3.4e38f, -126.49f};
    for (int round = 0; round < 40; round++) {
        size_t n = round < 20 ? (size_t)round : 1 + test_rng_below(&rng, N);
        for (size_t i = 0; i < n; i++) {
            uint32_t pick = test_rng_below(&rng, 4);
            if (pick == 0)
                x[i] = specials[test_rng_below(&rng, 16)];
            else if (pick == 1) /* exact ties after the scale of 1 */
                x[i] = (float)((int)test_rng_below(&rng, 300) - 150) + 0.5f;
            else
                x[i] = (test_rng_float(&rng) - 0.5f) * 300.0f;
        }
        const float inv = round % 3 == 0 ? 1.0f : 0.37f + test_rng_float(&rng);
        npu_ops_scalar.quant(x, n, inv, ref);
        float mref = npu_ops_scalar.absmax(x, n);
        for (int kern = 1; kern < NPU_KERNEL_COUNT; kern++) {
            const struct npu_kernel_ops *ops = npu_kernel_ops((enum npu_kernel)kern);
            if (!npu_kernel_available((enum npu_kernel)kern) || !ops->quant)
                continue;
            memset(got, 0x55, N + GUARD);
            ops->quant(x, n, inv, got);
            for (size_t i = 0; i < n; i++)
                if (got[i] != ref[i])
                    fail_msg("%s quantize x=%.9g inv=%.9g: %d, scalar %d",
                             npu_kernel_name((enum npu_kernel)kern), (double)x[i], (double)inv,
                             got[i], ref[i]);
            for (size_t i = n; i < n + GUARD; i++) /* nothing written past n */
                if (got[i] != 0x55)
                    fail_msg("%s quantize of %zu values wrote byte %zu",
                             npu_kernel_name((enum npu_kernel)kern), n, i);
            float m = ops->absmax(x, n);
            assert_memory_equal(&m, &mref, sizeof m);
        }
    }
    free(x);
    free(ref);
    free(got);
}

int main(void)
{
    test_rng_init(&rng, test_seed());
    for (int k = 0; k < NPU_KERNEL_COUNT; k++)
        fprintf(stderr, "kernel %-10s %s\n", npu_kernel_name((enum npu_kernel)k),
                npu_kernel_available((enum npu_kernel)k) ? "tested"
                                                         : "not on this CPU: skipped");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shapes),  cmocka_unit_test(test_ranges),
        cmocka_unit_test(test_extremes), cmocka_unit_test(test_tiny),
        cmocka_unit_test(test_tiny_rows),
        cmocka_unit_test(test_pack),
        cmocka_unit_test(test_weights),
        cmocka_unit_test(test_linear),  cmocka_unit_test(test_quantize),
        cmocka_unit_test(test_quantize_kernels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_verify_kernels.c: the kernels that make a draft tree's verification
 * cheap (speculative decoding) give every row the bits a one-row decode
 * step gives it, on random shapes (seed printed):
 * - the few-rows AVX2 float kernel (infer_matmul_rows_avx2) against a
 *   scalar reference of the AVX2 tile's arithmetic (8 FMA lanes from zero,
 *   the column tail as zeros, lanes j + j+4, then j + j+2, then 0 + 1) and
 *   against the one-row tile; strides, row ranges and column tails;
 * - the few-rows AVX-512 float kernel (infer_matmul_rows_avx512) the same
 *   way, against the AVX-512 tile's arithmetic (16 FMA lanes from zero, then
 *   lanes j + j+8, j + j+4, j + j+2, 0 + 1: _mm512_reduce_add_ps) and its
 *   one-row tile;
 * - infer_matmul_nt for 1..16 rows against one call per row (any kernel);
 * - tree attention (infer_attn_tree) against infer_attn_list run on each
 *   row's visible slots, for random trees, contexts and head ranges, with
 *   memory of its own and through a shared scratch (two head ranges). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "infer_internal.h"
#include "infer_matmul.h"
#include "testutil.h"

static struct test_rng rng;

static void fill(float *x, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++)
        x[i] = scale * test_rng_normal(&rng);
}

#ifdef SLUICE_KERNELS_X86
/* The AVX2 tile's dot product, one operation at a time. */
static float dot_avx2_order(const float *x, const float *w, uint32_t cols)
{
    float lane[8] = {0};
    for (uint32_t c = 0; c < cols; c += 8)
        for (uint32_t j = 0; j < 8; j++) {
            float a = c + j < cols ? x[c + j] : 0.0f, b = c + j < cols ? w[c + j] : 0.0f;
            lane[j] = fmaf(a, b, lane[j]);
        }
    float s[4];
    for (int j = 0; j < 4; j++)
        s[j] = lane[j] + lane[j + 4];
    float t0 = s[0] + s[2], t1 = s[1] + s[3];
    return t0 + t1;
}

/* The AVX-512 tile's dot product, one operation at a time. */
static float dot_avx512_order(const float *x, const float *w, uint32_t cols)
{
    float lane[16] = {0};
    for (uint32_t c = 0; c < cols; c += 16)
        for (uint32_t j = 0; j < 16; j++) {
            float a = c + j < cols ? x[c + j] : 0.0f, b = c + j < cols ? w[c + j] : 0.0f;
            lane[j] = fmaf(a, b, lane[j]);
        }
    for (uint32_t h = 8; h; h /= 2)
        for (uint32_t j = 0; j < h; j++)
            lane[j] = lane[j] + lane[j + h];
    return lane[0];
}
#endif

static int same_bits(float a, float b)
{
    return !memcmp(&a, &b, sizeof a);
}

#ifdef SLUICE_KERNELS_X86
typedef void rows_fn(float *y, size_t ldy, const float *x, size_t ldx, uint32_t n, const float *w,
                     size_t ldw, uint32_t cols, uint32_t r0, uint32_t r1);

/* A few-rows kernel against its tile's arithmetic (dot) and its one-row
 * tile, on random shapes. */
static void rows_kernel_check(rows_fn *rows, float (*dot)(const float *, const float *, uint32_t),
                              infer_matmul_tile_fn *one_tile)
{
    enum { MAXN = INFER_MATMUL_ROWS_MAX, MAXR = 40, MAXC = 300, PAD = 5 };
    float *x = malloc(sizeof(float) * MAXN * (MAXC + PAD));
    float *w = malloc(sizeof(float) * MAXR * (MAXC + PAD));
    float *y = malloc(sizeof(float) * MAXN * (MAXR + PAD));
    float *one = malloc(sizeof(float) * 4);
    assert_true(x && w && y && one);
    /* 400 random shapes, then every row count with every width of a
     * range's last tile (1..9 w rows: each pass size and tile tail) on long
     * rows (random columns above the short path's 64) */
    for (int it = 0; it < 400 + MAXN * 9; it++) {
        uint32_t n = 1 + test_rng_below(&rng, MAXN), R = 1 + test_rng_below(&rng, MAXR);
        /* every other shape short (attention scores: a head's columns) */
        uint32_t C = 1 + test_rng_below(&rng, it % 2 ? MAXC : 80);
        if (it >= 400) {
            n = 1 + (uint32_t)(it - 400) / 9, R = 1 + (uint32_t)(it - 400) % 9;
            C = 65 + test_rng_below(&rng, MAXC - 64);
        }
        size_t ldx = C + test_rng_below(&rng, PAD), ldw = C + test_rng_below(&rng, PAD);
        size_t ldy = R + test_rng_below(&rng, PAD);
        uint32_t r0 = test_rng_below(&rng, R), r1 = r0 + 1 + test_rng_below(&rng, R - r0);
        if (it >= 400)
            r0 = 0, r1 = R;
        fill(x, (size_t)n * ldx, 1.0f);
        fill(w, (size_t)R * ldw, 0.5f);
        if (it % 7 == 0) /* exact zeros and signed zeros in the products */
            for (uint32_t c = 0; c < C; c += 3)
                x[c] = (c & 1) ? -0.0f : 0.0f;
        /* the whole buffer: rows at or past n must stay untouched too */
        for (size_t i = 0; i < (size_t)MAXN * (MAXR + PAD); i++)
            y[i] = -9.0f;
        rows(y, ldy, x, ldx, n, w, ldw, C, r0, r1);
        for (size_t i = (size_t)n * ldy; i < (size_t)MAXN * (MAXR + PAD); i++)
            if (y[i] != -9.0f)
                fail_msg("n=%u R=%u C=%u: y[%zu] past the n rows written", n, R, C, i);
        for (uint32_t i = 0; i < n; i++)
            for (uint32_t r = 0; r < ldy; r++) {
                float got = y[i * ldy + r];
                if (r < r0 || r >= r1) {
                    if (got != -9.0f)
                        fail_msg("n=%u R=%u C=%u: [%u][%u] outside [%u, %u) written", n, R, C, i, r,
                                 r0, r1);
                    continue;
                }
                float ref = dot(x + i * ldx, w + r * ldw, C);
                one_tile(one, 1, x + i * ldx, ldx, 1, w + r * ldw, ldw, 1, C, INFER_W_F32);
                if (!same_bits(got, ref) || !same_bits(got, one[0]))
                    fail_msg("n=%u R=%u C=%u [%u][%u]: %a, reference %a, one-row tile %a", n, R, C,
                             i, r, (double)got, (double)ref, (double)one[0]);
            }
    }
    free(x);
    free(w);
    free(y);
    free(one);
}
#endif

static void test_rows_kernel(void **st)
{
    (void)st;
#ifdef SLUICE_KERNELS_X86
    if (!infer_matmul_kernel_available(INFER_MATMUL_AVX2)) {
        fprintf(stderr, "no AVX2 here: the few-rows kernel is not tested\n");
        skip();
    }
    rows_kernel_check(infer_matmul_rows_avx2, dot_avx2_order, infer_matmul_tile_avx2);
#else
    fprintf(stderr, "not x86: the few-rows AVX2 kernel is not built\n");
    skip();
#endif
}

static void test_rows_kernel_avx512(void **st)
{
    (void)st;
#ifdef SLUICE_KERNELS_X86
    if (!infer_matmul_kernel_available(INFER_MATMUL_AVX512)) {
        fprintf(stderr, "no AVX-512 here: the few-rows AVX-512 kernel is not tested\n");
        skip();
    }
    rows_kernel_check(infer_matmul_rows_avx512, dot_avx512_order, infer_matmul_tile_avx512);
#else
    fprintf(stderr, "not x86: the few-rows AVX-512 kernel is not built\n");
    skip();
#endif
}

/* The AVX-512 tile's full 4 x 4 case (its 16 sums reduced together) gives
 * each sum the bits of a 1 x 1 tile (_mm512_reduce_add_ps): F32, F16 and
 * BF16 weights, column counts with and without a tail, strides. */
static void test_tile_avx512_4x4(void **st)
{
    (void)st;
#ifdef SLUICE_KERNELS_X86
    if (!infer_matmul_kernel_available(INFER_MATMUL_AVX512)) {
        fprintf(stderr, "no AVX-512 here: the AVX-512 tile is not run\n");
        skip();
    }
    enum { MAXC = 200, PAD = 5 };
    float *x = malloc(sizeof(float) * 4 * (MAXC + PAD));
    float *wf = malloc(sizeof(float) * 4 * (MAXC + PAD));
    uint16_t *wh = malloc(sizeof(uint16_t) * 4 * (MAXC + PAD));
    float *y = malloc(sizeof(float) * 4 * (4 + PAD)), one[1];
    assert_true(x && wf && wh && y);
    for (int it = 0; it < 600; it++) {
        uint32_t wt = (uint32_t)(it % 3); /* INFER_W_F32, _F16, _BF16 */
        uint32_t C = 1 + test_rng_below(&rng, MAXC);
        size_t ldx = C + test_rng_below(&rng, PAD), ldw = C + test_rng_below(&rng, PAD);
        size_t ldy = 4 + test_rng_below(&rng, PAD);
        fill(x, 4 * ldx, 1.0f);
        fill(wf, 4 * ldw, 0.5f);
        if (it % 7 == 0) /* exact and signed zeros */
            for (uint32_t c = 0; c < C; c += 3)
                x[c] = (c & 1) ? -0.0f : 0.0f;
        for (size_t i = 0; i < 4 * ldw; i++)
            wh[i] = wt == INFER_W_F16 ? sl_f32_to_f16(wf[i]) : sl_f32_to_bf16(wf[i]);
        const void *w = wt == INFER_W_F32 ? (const void *)wf : (const void *)wh;
        size_t esz = wt == INFER_W_F32 ? 4 : 2;
        for (size_t i = 0; i < 4 * ldy; i++)
            y[i] = -9.0f;
        infer_matmul_tile_avx512(y, ldy, x, ldx, 4, w, ldw, 4, C, wt);
        for (uint32_t a = 0; a < 4; a++)
            for (uint32_t b = 0; b < ldy; b++) {
                float got = y[a * ldy + b];
                if (b >= 4) {
                    if (got != -9.0f)
                        fail_msg("wt %u C=%u: [%u][%u] outside the tile written", wt, C, a, b);
                    continue;
                }
                infer_matmul_tile_avx512(one, 1, x + a * ldx, ldx, 1,
                                         (const char *)w + b * ldw * esz, ldw, 1, C, wt);
                if (!same_bits(got, one[0]))
                    fail_msg("wt %u C=%u [%u][%u]: %a, 1 x 1 tile %a", wt, C, a, b, (double)got,
                             (double)one[0]);
            }
    }
    free(x);
    free(wf);
    free(wh);
    free(y);
#else
    fprintf(stderr, "not x86: the AVX-512 tile is not built\n");
    skip();
#endif
}

/* infer_swiglu_avx512 (one pass) against infer_op_swiglu's generic arithmetic
 * with the AVX-512 exp (-g into a buffer, infer_exp_sum of it minus 0, then
 * g * (1 / (1 + e)) * u), bit for bit: lengths with tails, large, tiny,
 * signed-zero, infinite and NaN inputs; and infer_op_swiglu, which
 * dispatches to it here, gives the same bits. */
static void test_swiglu_avx512(void **st)
{
    (void)st;
#ifdef SLUICE_KERNELS_X86
    if (!infer_matmul_kernel_available(INFER_MATMUL_AVX512)) {
        fprintf(stderr, "no AVX-512 here: the AVX-512 SwiGLU is not run\n");
        skip();
    }
    enum { MAXN = 700 };
    float *g = malloc(sizeof(float) * MAXN), *u = malloc(sizeof(float) * MAXN);
    float *h = malloc(sizeof(float) * (MAXN + 1)), *h2 = malloc(sizeof(float) * (MAXN + 1));
    float *ref = malloc(sizeof(float) * MAXN), *e = malloc(sizeof(float) * MAXN);
    assert_true(g && u && h && h2 && ref && e);
    static const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 88.5f, -88.5f,
                                     87.0f, -87.0f, 1e-30f, -1e-30f, 200.0f, -200.0f};
    for (int it = 0; it < 300; it++) {
        uint32_t n = 1 + test_rng_below(&rng, MAXN);
        float scale = it % 3 == 0 ? 30.0f : 3.0f;
        fill(g, n, scale);
        fill(u, n, 1.0f);
        if (it % 4 == 0)
            for (uint32_t i = 0; i < n; i += 5)
                g[i] = specials[test_rng_below(&rng, sizeof specials / sizeof specials[0])];
        for (uint32_t i = 0; i < n; i++)
            e[i] = -g[i];
        (void)infer_exp_sum(INFER_MATMUL_AVX512, e, n, 0.0f);
        for (uint32_t i = 0; i < n; i++) {
            float val = g[i];
            val *= 1.0f / (1.0f + e[i]);
            ref[i] = val * u[i];
        }
        h[n] = h2[n] = -5.0f;
        infer_swiglu_avx512(h, g, u, n);
        infer_op_swiglu(h2, g, u, n);
        for (uint32_t i = 0; i < n; i++)
            if (!same_bits(h[i], ref[i]) || !same_bits(h2[i], ref[i]))
                fail_msg("n=%u [%u]: g %a: %a, op %a, generic %a", n, i, (double)g[i],
                         (double)h[i], (double)h2[i], (double)ref[i]);
        assert_true(h[n] == -5.0f && h2[n] == -5.0f);
    }
    free(g);
    free(u);
    free(h);
    free(h2);
    free(ref);
    free(e);
#else
    fprintf(stderr, "not x86: the AVX-512 SwiGLU is not built\n");
    skip();
#endif
}

/* Through the dispatcher: n rows at once equal n calls of one row. */
static void test_nt_rows_invariant(void **st)
{
    (void)st;
    enum { MAXN = 16, MAXR = 37, MAXC = 140 };
    float *x = malloc(sizeof(float) * MAXN * MAXC), *w = malloc(sizeof(float) * MAXR * MAXC);
    float *y1 = malloc(sizeof(float) * MAXR);
    assert_true(x && w && y1);
    for (int k = 0; k < INFER_MATMUL_COUNT; k++) {
        if (!infer_matmul_kernel_available((enum infer_matmul_kernel)k))
            continue;
        for (int it = 0; it < 60; it++) {
            uint32_t n = 1 + test_rng_below(&rng, MAXN), R = 1 + test_rng_below(&rng, MAXR);
            uint32_t C = 1 + test_rng_below(&rng, MAXC);
            fill(x, (size_t)n * C, 1.0f);
            fill(w, (size_t)R * C, 0.5f);
            /* y exactly n x R plus a guard: a write past the last row fails here, not
             * only under ASan */
            enum { GUARD = 16 };
            float *y = malloc(sizeof(float) * ((size_t)n * R + GUARD));
            assert_true(y);
            for (int g = 0; g < GUARD; g++)
                y[(size_t)n * R + g] = -7.0f;
            infer_matmul_linear_kernel((enum infer_matmul_kernel)k, y, x, w, INFER_W_F32, n, R, C,
                                       0, R);
            for (int g = 0; g < GUARD; g++)
                if (y[(size_t)n * R + g] != -7.0f)
                    fail_msg("kernel %s n=%u R=%u C=%u: wrote past its %u rows",
                             infer_matmul_kernel_name((enum infer_matmul_kernel)k), n, R, C, n);
            for (uint32_t i = 0; i < n; i++) {
                infer_matmul_linear_kernel((enum infer_matmul_kernel)k, y1, x + i * C, w,
                                           INFER_W_F32, 1, R, C, 0, R);
                if (memcmp(y1, y + i * R, sizeof(float) * R))
                    fail_msg("kernel %s n=%u R=%u C=%u: row %u differs from its one-row run",
                             infer_matmul_kernel_name((enum infer_matmul_kernel)k), n, R, C, i);
            }
            free(y);
        }
    }
    free(x);
    free(w);
    free(y1);
}

/* Tree attention against infer_attn_list on each row's visible slots:
 * kjv6L-1k's heads (8/2 of 32), tinyllama's (32/4 of 64), heads of 128 and
 * 16 query heads a kv head, trees of up to 40 rows (the transposed-key
 * scores from 16 query rows a kv head up to 256, the matmul on both sides),
 * and shapes the AVX-512 scores do not take (heads of 16 and 8). */
static void test_tree_attention(void **st)
{
    (void)st;
    struct format_config c = {.n_heads = 8, .n_kv_heads = 2, .head_dim = 32};
    enum { MAX_ROWS = 40 };
    for (int it = 0; it < 168; it++) {
        static const uint32_t shapes[][3] = {{8, 2, 32}, {4, 4, 16}, {6, 3, 8},  {2, 1, 64},
                                             {32, 4, 64}, {4, 1, 128}, {16, 1, 32}};
        const uint32_t *sh = shapes[it % 7];
        c.n_heads = sh[0];
        c.n_kv_heads = sh[1];
        c.head_dim = sh[2];
        c.dim = c.n_heads * c.head_dim;
        uint32_t hs = c.head_dim, qdim = c.dim, kv_mul = c.n_heads / c.n_kv_heads;
        size_t kv_dim = (size_t)c.n_kv_heads * hs;
        uint32_t n = 1 + test_rng_below(&rng, it % 3 == 0 ? MAX_ROWS : 16);
        /* past 256 slots: the values product in blocks of keys (nn_blocks) */
        uint32_t base = test_rng_below(&rng, it % 7 == 1 ? 400 : it % 3 ? 90 : 3);
        uint32_t T = base + n;
        int32_t parent[MAX_ROWS];
        for (uint32_t i = 0; i < n; i++) /* any earlier row, or none */
            parent[i] = (int32_t)test_rng_below(&rng, i + 1) - 1;
        if (it % 5 == 0)
            for (uint32_t i = 0; i < n; i++) /* a chain */
                parent[i] = (int32_t)i - 1;
        float *kc = malloc(sizeof(float) * T * kv_dim), *vc = malloc(sizeof(float) * T * kv_dim);
        float *q = malloc(sizeof(float) * n * qdim);
        float *out = malloc(sizeof(float) * n * qdim), *ref = malloc(sizeof(float) * n * qdim);
        float *a = malloc(sizeof(float) * T), *gather = malloc(sizeof(float) * T * hs);
        uint32_t *list = malloc(sizeof(uint32_t) * T);
        assert_true(kc && vc && q && out && ref && a && gather && list);
        fill(kc, T * kv_dim, 1.0f);
        fill(vc, T * kv_dim, 1.0f);
        fill(q, (size_t)n * qdim, 1.0f);
        /* a head range on kv-head bounds, as the attention's thread split makes */
        uint32_t g0 = test_rng_below(&rng, c.n_kv_heads);
        uint32_t g1 = g0 + 1 + test_rng_below(&rng, c.n_kv_heads - g0);
        uint32_t h0 = g0 * kv_mul, h1 = g1 * kv_mul;
        for (size_t i = 0; i < (size_t)n * qdim; i++)
            out[i] = ref[i] = -7.0f;
        struct infer_attn_rows rows = {.n = n, .base = base, .parent = parent};
        assert_int_equal(infer_attn_tree(&c, kc, vc, &rows, q, h0, h1, out), 0);
        for (uint32_t i = 0; i < n; i++) {
            uint32_t len = 0, depth = 0;
            for (uint32_t s = 0; s < base; s++)
                list[len++] = s;
            for (int32_t r = (int32_t)i; r >= 0; r = parent[r])
                depth++;
            for (int32_t r = (int32_t)i, at = (int32_t)(len + depth); r >= 0; r = parent[r])
                list[--at] = base + (uint32_t)r;
            len += depth;
            for (uint32_t h = h0; h < h1; h++)
                infer_attn_list(ref + (size_t)i * qdim + (size_t)h * hs,
                                q + (size_t)i * qdim + (size_t)h * hs,
                                kc + (size_t)(h / kv_mul) * hs, vc + (size_t)(h / kv_mul) * hs,
                                kv_dim, hs, list, len, a, gather);
        }
        if (memcmp(out, ref, sizeof(float) * n * qdim)) {
            for (size_t j = 0; j < (size_t)n * qdim; j++)
                if (!same_bits(out[j], ref[j]))
                    fail_msg("heads %u/%u hs %u, %u rows after %u slots, heads [%u, %u): "
                             "row %zu col %zu: %a vs infer_attn_list %a",
                             c.n_heads, c.n_kv_heads, hs, n, base, h0, h1, j / qdim, j % qdim,
                             (double)out[j], (double)ref[j]);
        }
        /* again through a shared scratch (the state's, as the forward pass
         * passes it; filled with NaN first): the heads in two calls on
         * kv-head bounds that share it, as the attention's two threads do;
         * a scratch one float short is not used (memory of the call's own) */
        size_t fl = infer_attn_tree_floats(&c, n, T);
        float *scr = malloc(sizeof(float) * fl);
        assert_non_null(scr);
        memset(scr, 0xff, sizeof(float) * fl);
        rows.tree_scratch = scr;
        rows.tree_floats = it % 4 == 3 ? fl - 1 : fl;
        uint32_t hm = (g0 + (g1 - g0) / 2) * kv_mul;
        for (size_t i = 0; i < (size_t)n * qdim; i++)
            out[i] = -7.0f;
        if (hm > h0)
            assert_int_equal(infer_attn_tree(&c, kc, vc, &rows, q, h0, hm, out), 0);
        assert_int_equal(infer_attn_tree(&c, kc, vc, &rows, q, hm, h1, out), 0);
        for (size_t j = 0; j < (size_t)n * qdim; j++)
            if (!same_bits(out[j], ref[j]))
                fail_msg("shared scratch (%zu floats): %u rows after %u slots, heads [%u, %u) "
                         "split at %u: row %zu col %zu: %a vs infer_attn_list %a",
                         rows.tree_floats, n, base, h0, h1, hm, j / qdim, j % qdim,
                         (double)out[j], (double)ref[j]);
        free(scr);
        free(kc);
        free(vc);
        free(q);
        free(out);
        free(ref);
        free(a);
        free(gather);
        free(list);
    }
}

int main(void)
{
    uint64_t seed = test_seed();
    fprintf(stderr, "test_verify_kernels seed %llu (matmul kernel in use: %s)\n",
            (unsigned long long)seed, infer_matmul_kernel_name(infer_matmul_kernel_used()));
    test_rng_init(&rng, seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rows_kernel),
        cmocka_unit_test(test_rows_kernel_avx512),
        cmocka_unit_test(test_tile_avx512_4x4),
        cmocka_unit_test(test_swiglu_avx512),
        cmocka_unit_test(test_nt_rows_invariant),
        cmocka_unit_test(test_tree_attention),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

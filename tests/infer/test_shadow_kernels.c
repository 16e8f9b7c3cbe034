/* test_shadow_kernels.c: the shadow term's kernels (infer_shadow.c) against
 * their scalar references, bit for bit, on random data: the int8 axpy, the
 * column gather, the column kernels, finding the clipped activations (float
 * and quantized) and walking them. No model (test_shadow has those). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "infer.h"
#include "infer_internal.h"
#include "infer_matmul.h"
#include "npu.h"
#include "testutil.h"

/* The term's SIMD inner loops against the scalar one, bit for bit, on
 * random lengths, offsets and values (seed printed). */
static void test_axpy_kernels(void **st)
{
    (void)st;
#ifdef SLUICE_KERNELS_X86
    struct test_rng g;
    test_rng_init(&g, test_seed() + 77);
    enum infer_matmul_kernel ks[2] = {INFER_MATMUL_AVX2, INFER_MATMUL_AVX512};
    void (*fn[2])(float *, float, const int8_t *, uint32_t) = {infer_shadow_axpy_s8_avx2,
                                                               infer_shadow_axpy_s8_avx512};
    int ran = 0;
    for (int k = 0; k < 2; k++) {
        if (!infer_matmul_kernel_available(ks[k]))
            continue;
        ran++;
        for (int t = 0; t < 200; t++) {
            uint32_t n = test_rng_below(&g, 300), off = test_rng_below(&g, 16);
            int8_t *w = malloc(n + 16);
            float *a = malloc(sizeof(float) * (n + 16)), *b = malloc(sizeof(float) * (n + 16));
            for (uint32_t i = 0; i < n + 16; i++) {
                w[i] = (int8_t)((int)test_rng_below(&g, 255) - 127);
                a[i] = b[i] = test_rng_normal(&g) * 100;
            }
            float e = test_rng_normal(&g) * 1000;
            infer_shadow_axpy_s8_scalar(a + off, e, w + off, n);
            fn[k](b + off, e, w + off, n);
            assert_memory_equal(a, b, sizeof(float) * (n + 16));
            free(w);
            free(a);
            free(b);
        }
    }
    if (!ran)
        print_message("no SIMD kernel on this CPU: only the scalar one runs\n");
#else
    print_message("no x86 SIMD kernels in this build\n");
#endif
}


/* npu_weights_gather_cols against npu_weights_col, for shapes off the
 * blocks of 16 rows and groups of 4 columns. */
static void test_gather_cols(void **st)
{
    (void)st;
    struct test_rng g;
    test_rng_init(&g, test_seed() + 91);
    for (int t = 0; t < 40; t++) {
        uint32_t rows = 1 + test_rng_below(&g, 70), cols = 1 + test_rng_below(&g, 90);
        int8_t *q = malloc((size_t)rows * cols);
        float *sc = malloc(sizeof(float) * rows);
        for (size_t i = 0; i < (size_t)rows * cols; i++)
            q[i] = (int8_t)((int)test_rng_below(&g, 255) - 127);
        for (uint32_t r = 0; r < rows; r++)
            sc[r] = 0.01f;
        struct npu_weights *w;
        assert_int_equal(npu_weights_create(q, sc, rows, cols, &w), 0);
        uint32_t *c = malloc(sizeof(uint32_t) * cols), n = 0;
        for (uint32_t j = 0; j < cols; j++)
            if (test_rng_below(&g, 3) == 0)
                c[n++] = j;
        int8_t *a = malloc((size_t)rows * (n + 1)), *b = malloc(rows);
        npu_weights_gather_cols(w, c, n, a);
        for (uint32_t k = 0; k < n; k++) {
            npu_weights_col(w, c[k], b);
            assert_memory_equal(a + (size_t)k * rows, b, rows);
            for (uint32_t r = 0; r < rows; r++)
                assert_int_equal(b[r], q[(size_t)r * cols + c[k]]);
        }
        npu_weights_destroy(w);
        free(q);
        free(sc);
        free(c);
        free(a);
        free(b);
    }
}

/* infer_shadow_cols (the term reading the NPU's packed weights in place,
 * 16 rows at a time): the scalar and AVX2 kernels against the plain
 * definition computed from the int8 matrix (per token row, in ascending
 * column order: acc = +0, acc += ex * (float)W[o][c], then acc * (s *
 * scale[o]) stored or added), bit for bit, on random shapes off the blocks
 * of 16 rows and groups of 4 columns, all blocks or a random range of them
 * (the rest left alone), random hot columns (resident copies), repeated
 * columns and extreme values (seed printed). */
static void test_cols_kernels(void **st)
{
    (void)st;
    struct test_rng g;
    test_rng_init(&g, test_seed() + 94);
    int avx2 = 0;
#ifdef SLUICE_KERNELS_X86
    avx2 = infer_matmul_kernel_available(INFER_MATMUL_AVX2);
#endif
    if (!avx2)
        print_message("no AVX2 on this CPU or build: only the scalar kernel runs\n");
    for (int it = 0; it < 300; it++) {
        uint32_t rows = 1 + test_rng_below(&g, it < 100 ? 40 : 300);
        uint32_t cols = 1 + test_rng_below(&g, 90);
        int8_t *q = malloc((size_t)rows * cols);
        float *sc = malloc(sizeof(float) * rows);
        for (size_t i = 0; i < (size_t)rows * cols; i++)
            q[i] = (int8_t)((int)test_rng_below(&g, 255) - 127);
        for (uint32_t r = 0; r < rows; r++)
            sc[r] = test_rng_below(&g, 10) == 0 ? 1e30f : 0.001f + test_rng_normal(&g) * 0.01f;
        struct npu_weights *w;
        assert_int_equal(npu_weights_create(q, sc, rows, cols, &w), 0);
        /* distinct columns, their hot copies, elements per column */
        uint32_t nt = 1 + test_rng_below(&g, 12), nd = 0;
        uint32_t *col = malloc(sizeof(uint32_t) * cols);
        const int8_t **hot = malloc(sizeof *hot * cols);
        int8_t *hcopy = malloc((size_t)rows * cols);
        uint32_t *start = malloc(sizeof(uint32_t) * (cols + 1));
        uint32_t *tok = malloc(sizeof(uint32_t) * cols * 4);
        float *ex = malloc(sizeof(float) * cols * 4);
        uint32_t ne = 0;
        for (uint32_t c = 0; c < cols; c++) {
            if (test_rng_below(&g, 3) != 0)
                continue;
            col[nd] = c;
            hot[nd] = NULL;
            if (test_rng_below(&g, 4) == 0) {
                npu_weights_col(w, c, hcopy + (size_t)nd * rows);
                hot[nd] = hcopy + (size_t)nd * rows;
            }
            start[nd] = ne;
            uint32_t k = 1 + test_rng_below(&g, 4); /* a token twice: allowed */
            for (uint32_t j = 0; j < k; j++, ne++) {
                tok[ne] = test_rng_below(&g, nt);
                float v = test_rng_normal(&g) * 50;
                ex[ne] = test_rng_below(&g, 20) == 0 ? -0.0f : v;
            }
            nd++;
        }
        start[nd] = ne;
        float s = 0.02f + (float)test_rng_below(&g, 100) * 0.001f;
        /* the blocks of 16 rows computed: all, or a random range (a piece) */
        uint32_t nb = (rows + 15) / 16, b0 = 0, b1 = nb;
        if (test_rng_below(&g, 2)) {
            b0 = test_rng_below(&g, nb);
            b1 = b0 + 1 + test_rng_below(&g, nb - b0);
        }
        uint32_t o0 = b0 * 16, o1 = b1 * 16 < rows ? b1 * 16 : rows;
        for (int store = 0; store < 2; store++) {
            float *ref = malloc(sizeof(float) * nt * rows);
            /* aligned rows (the AVX2 kernel streams them) or not */
            size_t gsz = (sizeof(float) * ((size_t)nt * rows + 8) + 63) / 64 * 64;
            float *gbuf[2] = {aligned_alloc(64, gsz), aligned_alloc(64, gsz)};
            uint32_t off = test_rng_below(&g, 2) ? 0 : test_rng_below(&g, 8);
            float *got[2] = {gbuf[0] + off, gbuf[1] + off};
            for (uint32_t i = 0; i < nt * rows; i++)
                ref[i] = got[0][i] = got[1][i] = store ? NAN : test_rng_normal(&g);
            for (uint32_t t = 0; t < nt; t++) { /* the plain definition */
                for (uint32_t o = o0; o < o1; o++) { /* the others left alone */
                    float a = 0.0f;
                    for (uint32_t d = 0; d < nd; d++)
                        for (uint32_t j = start[d]; j < start[d + 1]; j++)
                            if (tok[j] == t)
                                a += ex[j] * (float)q[(size_t)o * cols + col[d]];
                    float *y = ref + (size_t)t * rows + o;
                    if (store)
                        *y = a * (s * sc[o]);
                    else
                        *y += a * (s * sc[o]);
                }
            }
            for (int kk = 0; kk < 1 + avx2; kk++) {
                float **out = malloc(sizeof(float *) * nt);
                for (uint32_t t = 0; t < nt; t++)
                    out[t] = got[kk] + (size_t)t * rows;
                float *acc = malloc(sizeof(float) * 16 * INFER_SHADOW_COLS_GROUP * nt);
                struct infer_shadow_cols k = {.nd = nd, .col = col, .hot = hot, .start = start,
                                              .tok = tok, .ex = ex, .nt = nt, .out = out,
                                              .rows = rows, .b0 = b0, .b1 = b1, .scale = sc,
                                              .s = s, .store = store, .acc = acc};
                k.packed = npu_weights_packed(w, &k.block);
                if (kk == 0)
                    infer_shadow_cols_scalar(&k, b0, b1);
#ifdef SLUICE_KERNELS_X86
                else
                    infer_shadow_cols_avx2(&k);
#endif
                assert_memory_equal(got[kk], ref, sizeof(float) * nt * rows);
                free(acc);
                free(out);
            }
            free(ref);
            free(gbuf[0]);
            free(gbuf[1]);
        }
        npu_weights_destroy(w);
        free(q);
        free(sc);
        free(col);
        free(hot);
        free(hcopy);
        free(start);
        free(tok);
        free(ex);
    }
}

/* infer_find_clipped (blocks of 16 skipped four lanes at a time) against
 * the plain definition, with NaN, infinities and lengths off the blocks. */
static void test_find_clipped(void **st)
{
    (void)st;
    struct test_rng g;
    test_rng_init(&g, test_seed() + 92);
    struct infer_clipbuf cb = {0};
    for (int t = 0; t < 300; t++) {
        uint32_t n = 1 + test_rng_below(&g, 9), cols = 1 + test_rng_below(&g, 100);
        uint32_t rate = 1 + test_rng_below(&g, 400);
        float s = 0.01f + test_rng_float(&g);
        size_t len = (size_t)n * cols;
        float *x = malloc(sizeof(float) * len);
        for (size_t i = 0; i < len; i++) {
            x[i] = test_rng_normal(&g) * 30 * s;
            uint32_t k = test_rng_below(&g, rate);
            if (k == 0)
                x[i] *= 10;
            else if (k == 1 && rate > 50)
                x[i] = test_rng_below(&g, 2) ? NAN : -INFINITY;
            else if (k == 2)
                x[i] = (test_rng_below(&g, 2) ? 127.0f : -127.0f) * s; /* the edge */
        }
        struct infer_clipped c;
        assert_int_equal(infer_find_clipped(&cb, x, n, cols, s, &c), 0);
        uint32_t m = 0;
        for (size_t i = 0; i < len; i++) {
            float v = x[i] * (1.0f / s);
            if (!(v > 127.0f || v < -127.0f))
                continue;
            assert_true(m < c.n);
            assert_int_equal(c.row[m], i / cols);
            assert_int_equal(c.col[m], i % cols);
            float e = v > 0 ? v - 127.0f : v + 127.0f;
            assert_memory_equal(&c.excess[m], &e, sizeof e);
            m++;
        }
        assert_int_equal(m, c.n);
        free(x);
    }
    infer_clipbuf_free(&cb);
}

/* The skip of infer_find_clipped: infer_clip_next_avx2 against
 * infer_clip_next_scalar and the plain definition (the first block of 8 with
 * x * inv beyond +-127, else len rounded down to 8), on random lengths and
 * offsets with the edge +-127, NaN and infinities (seed printed). */
static void test_clip_next(void **st)
{
    (void)st;
    struct test_rng g;
    test_rng_init(&g, test_seed() + 95);
    int avx2 = 0;
#ifdef SLUICE_KERNELS_X86
    avx2 = infer_matmul_kernel_available(INFER_MATMUL_AVX2);
#endif
    if (!avx2)
        print_message("no AVX2 on this CPU or build: only the scalar skip runs\n");
    for (int t = 0; t < 2000; t++) {
        size_t len = test_rng_below(&g, 200), off = test_rng_below(&g, 8);
        float *x = malloc(sizeof(float) * (len + 8));
        float s = 0.01f + test_rng_float(&g), inv = 1.0f / s;
        uint32_t rate = 1 + test_rng_below(&g, 300);
        for (size_t i = 0; i < len + 8; i++) {
            x[i] = test_rng_normal(&g) * 30 * s;
            uint32_t k = test_rng_below(&g, rate);
            if (k == 0)
                x[i] *= 10;
            else if (k == 1)
                x[i] = test_rng_below(&g, 3) == 0 ? NAN
                       : test_rng_below(&g, 2)     ? INFINITY
                                                   : -INFINITY;
            else if (k == 2) /* the edge, and just past it */
                x[i] = (test_rng_below(&g, 2) ? 127.0f : -127.0f) * s *
                       (test_rng_below(&g, 2) ? 1.0f : 1.0000001f);
        }
        const float *p = x + off;
        size_t want = len / 8 * 8;
        for (size_t i = 0; i < len / 8 * 8; i++) {
            float v = p[i] * inv;
            if (v > 127.0f || v < -127.0f) {
                want = i / 8 * 8;
                break;
            }
        }
        assert_int_equal(infer_clip_next_scalar(p, len, inv), want);
#ifdef SLUICE_KERNELS_X86
        if (avx2)
            assert_int_equal(infer_clip_next_avx2(p, len, inv), want);
#endif
        free(x);
    }
}

/* infer_find_clipped_q (from the quantizer's codes) against
 * infer_find_clipped (from the floats): the same elements, order and
 * excesses, on random shapes with outliers, NaN, infinities and the +-127
 * edge, at bad scales too; and its skip, infer_clip_next_q_avx2 against
 * infer_clip_next_q_scalar and the definition. */
static void test_find_clipped_q(void **st)
{
    (void)st;
    struct test_rng g;
    test_rng_init(&g, test_seed() + 96);
    int avx2 = 0;
#ifdef SLUICE_KERNELS_X86
    avx2 = infer_matmul_kernel_available(INFER_MATMUL_AVX2);
#endif
    struct infer_clipbuf ba = {0}, bb = {0};
    for (int t = 0; t < 1500; t++) {
        uint32_t n = 1 + test_rng_below(&g, 9), cols = 1 + test_rng_below(&g, 150);
        size_t len = (size_t)n * cols, off = test_rng_below(&g, 32);
        float *x = malloc(sizeof(float) * len);
        int8_t *xq = malloc(len + 32);
        float s = 0.01f + test_rng_float(&g);
        uint32_t pick = test_rng_below(&g, 20);
        if (pick == 0)
            s = 0.0f;
        else if (pick == 1)
            s = INFINITY;
        else if (pick == 2)
            s = NAN;
        else if (pick == 3)
            s = 1e-30f;
        uint32_t rate = 1 + test_rng_below(&g, 300);
        for (size_t i = 0; i < len; i++) {
            x[i] = test_rng_normal(&g) * 30 * (isfinite(s) && s > 0 ? s : 0.5f);
            uint32_t k = test_rng_below(&g, rate);
            if (k == 0)
                x[i] *= 10;
            else if (k == 1)
                x[i] = test_rng_below(&g, 3) == 0 ? NAN
                       : test_rng_below(&g, 2)     ? INFINITY
                                                   : -INFINITY;
            else if (k == 2) /* the edges: 126.5, 127, just past, 127.5 */
                x[i] = (test_rng_below(&g, 2) ? 1.0f : -1.0f) * s *
                       (test_rng_below(&g, 4) == 0   ? 126.5f
                        : test_rng_below(&g, 3) == 0 ? 127.5f
                        : test_rng_below(&g, 2)      ? 127.0f
                                                     : 127.00001f);
        }
        npu_quantize_act(x, len, s, xq);
        struct infer_clipped a, b;
        assert_int_equal(infer_find_clipped(&ba, x, n, cols, s, &a), 0);
        assert_int_equal(infer_find_clipped_q(&bb, x, xq, n, cols, s, &b), 0);
        assert_int_equal(a.n, b.n);
        assert_int_equal(a.store, b.store);
        assert_memory_equal(&a.act_scale, &b.act_scale, sizeof a.act_scale);
        if (a.n) {
            assert_memory_equal(a.row, b.row, sizeof *a.row * a.n);
            assert_memory_equal(a.col, b.col, sizeof *a.col * a.n);
            assert_memory_equal(a.excess, b.excess, sizeof *a.excess * a.n);
        }
        /* the skip alone, from an unaligned start */
        memmove(xq + off, xq, len);
        const int8_t *p = xq + off;
        size_t want = len / 32 * 32;
        for (size_t i = 0; i < len / 32 * 32; i++)
            if (p[i] == 127 || p[i] == -127) {
                want = i / 32 * 32;
                break;
            }
        assert_int_equal(infer_clip_next_q_scalar(p, len), want);
#ifdef SLUICE_KERNELS_X86
        if (avx2)
            assert_int_equal(infer_clip_next_q_avx2(p, len), want);
#else
        (void)avx2;
#endif
        free(x);
        free(xq);
    }
    infer_clipbuf_free(&ba);
    infer_clipbuf_free(&bb);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_axpy_kernels),
        cmocka_unit_test(test_gather_cols),
        cmocka_unit_test(test_cols_kernels),
        cmocka_unit_test(test_find_clipped),
        cmocka_unit_test(test_clip_next),
        cmocka_unit_test(test_find_clipped_q),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

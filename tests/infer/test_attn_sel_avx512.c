/* test_attn_sel_avx512.c: sparse attention's AVX-512 exact stage
 * (attn_sel_avx512.c), randomized (the seed is printed):
 * - attn_sel_row_avx512 bit for bit equal to its scalar twin
 *   attn_sel_row_ref16 and, where the AVX-512 matmul kernel is the one in
 *   use, to infer_attn_list (so keep 1 stays dense on such machines);
 * - attn_sel_rows_avx512 (key blocks shared by many pairs, read in place or
 *   packed) bit for bit equal to the scalar twin on each pair;
 * - the twin differs from the 8-lane one (attn_sel_row_ref) somewhere, so
 *   the comparisons can tell the two folds apart;
 * - the top-k's threshold kernels (attn_topk_avx512.c: indices above,
 *   candidates' compaction, count, range) equal to their scalar twins,
 *   NaN, infinities, ties and signed zeros included.
 * Skipped, with a message, where the CPU has no AVX-512. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_sparse.h"
#include "infer_internal.h"
#include "infer_matmul.h"
#include "testutil.h"

static struct test_rng rng;

static int have_avx512(void)
{
    if (infer_matmul_kernel_available(INFER_MATMUL_AVX512))
        return 1;
    fprintf(stderr, "no AVX-512 here: kernel not tested\n");
    return 0;
}

static uint32_t random_list(uint32_t T, uint32_t *list)
{
    uint32_t len = 0;
    uint32_t p = 1 + test_rng_below(&rng, 100);
    for (uint32_t t = 0; t < T; t++)
        if (test_rng_below(&rng, 100) < p)
            list[len++] = t;
    if (len == 0)
        list[len++] = test_rng_below(&rng, T);
    return len;
}

static void fill(float *x, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++)
        x[i] = test_rng_normal(&rng) * scale;
}

static void test_row(void **state)
{
    (void)state;
    if (!have_avx512())
        skip();
    static const uint32_t hss[] = {16, 32, 48, 64, 80, 128, 192};
    int differs = 0;
    for (int it = 0; it < 200; it++) {
        uint32_t hs = hss[test_rng_below(&rng, 7)], kvh = 1 + test_rng_below(&rng, 4);
        uint32_t T = 1 + test_rng_below(&rng, it < 100 ? 40 : 700);
        size_t kv_dim = (size_t)kvh * hs;
        float *k = malloc(sizeof(float) * T * kv_dim), *v = malloc(sizeof(float) * T * kv_dim);
        float *q = malloc(sizeof(float) * hs), *a = malloc(sizeof(float) * T);
        float *o1 = malloc(sizeof(float) * hs), *o2 = malloc(sizeof(float) * hs);
        float *o3 = malloc(sizeof(float) * hs), *g = malloc(sizeof(float) * T * hs);
        uint32_t *list = malloc(sizeof(uint32_t) * T);
        assert_true(k && v && q && a && o1 && o2 && o3 && g && list);
        fill(k, T * kv_dim, 1.0f);
        fill(v, T * kv_dim, 1.0f);
        fill(q, hs, it % 3 == 0 ? 3.0f : 0.5f);
        uint32_t len = it % 7 == 0 ? T : random_list(T, list);
        if (len == T)
            for (uint32_t t = 0; t < T; t++)
                list[t] = t;
        const float *kh = k + (kvh - 1) * hs, *vh = v + (kvh - 1) * hs;
        attn_sel_row_ref16(o1, q, kh, vh, kv_dim, hs, list, len, a);
        attn_sel_row_avx512(o3, q, kh, vh, kv_dim, hs, list, len, a);
        if (memcmp(o1, o3, sizeof(float) * hs))
            fail_msg("hs %u T %u len %u: AVX-512 kernel != scalar twin", hs, T, len);
        if (infer_matmul_kernel_used() == INFER_MATMUL_AVX512) {
            infer_attn_list(o2, q, kh, vh, kv_dim, hs, list, len, a, g);
            if (memcmp(o2, o3, sizeof(float) * hs))
                fail_msg("hs %u T %u len %u: AVX-512 kernel != infer_attn_list", hs, T, len);
            attn_sel_row(o2, q, kh, vh, kv_dim, hs, list, len, a, g);
            assert_memory_equal(o2, o3, sizeof(float) * hs);
        }
        attn_sel_row_ref(o2, q, kh, vh, kv_dim, hs, list, len, a);
        differs |= memcmp(o1, o2, sizeof(float) * hs) != 0;
        free(k);
        free(v);
        free(q);
        free(a);
        free(o1);
        free(o2);
        free(o3);
        free(g);
        free(list);
    }
    assert_true(differs); /* the 16-lane fold is not the 8-lane one */
}

static void test_rows_blocked(void **state)
{
    (void)state;
    if (!have_avx512())
        skip();
    for (int it = 0; it < 40; it++) {
        uint32_t hs = it % 2 ? 64 : 128 + 16 * (it % 3 == 0), kvh = 2;
        uint32_t T = 1 + test_rng_below(&rng, 900), R = 1 + test_rng_below(&rng, 200);
        uint32_t kb = 1 + test_rng_below(&rng, 300);
        size_t kv_dim = (size_t)kvh * hs;
        float *k = malloc(sizeof(float) * T * kv_dim), *v = malloc(sizeof(float) * T * kv_dim);
        float *q = malloc(sizeof(float) * R * hs), *a = malloc(sizeof(float) * R * T);
        float *o1 = malloc(sizeof(float) * R * hs), *o2 = malloc(sizeof(float) * R * hs);
        float *g = malloc(sizeof(float) * (T > kb ? T : kb) * hs);
        uint32_t *list = malloc(sizeof(uint32_t) * R * T), *cur = malloc(sizeof(uint32_t) * R);
        struct attn_sel_pair *p = malloc(sizeof *p * R);
        assert_true(k && v && q && a && o1 && o2 && g && list && cur && p);
        fill(k, T * kv_dim, 1.0f);
        fill(v, T * kv_dim, 1.0f);
        fill(q, R * hs, 1.0f);
        for (uint32_t r = 0; r < R; r++) {
            uint32_t len = random_list(T, list + (size_t)r * T);
            p[r] = (struct attn_sel_pair){q + (size_t)r * hs, list + (size_t)r * T, len,
                                          a + (size_t)r * T, o1 + (size_t)r * hs};
        }
        attn_sel_rows_avx512(R, p, k + hs, v + hs, kv_dim, hs, kb, T, cur, it % 2 ? g : NULL);
        for (uint32_t r = 0; r < R; r++)
            attn_sel_row_ref16(o2 + (size_t)r * hs, p[r].q, k + hs, v + hs, kv_dim, hs,
                               p[r].list, p[r].len, a + (size_t)r * T);
        if (memcmp(o1, o2, sizeof(float) * R * hs))
            fail_msg("T %u R %u kb %u hs %u: AVX-512 blocked pairs != scalar twin", T, R, kb, hs);
        /* the dispatch: the kernel in use's bits (attn_sel_row's) */
        attn_sel_rows(R, p, k + hs, v + hs, kv_dim, hs, kb, T, cur, g);
        for (uint32_t r = 0; r < R; r++)
            attn_sel_row(o2 + (size_t)r * hs, p[r].q, k + hs, v + hs, kv_dim, hs, p[r].list,
                         p[r].len, a + (size_t)r * T, g);
        if (memcmp(o1, o2, sizeof(float) * R * hs))
            fail_msg("T %u R %u kb %u hs %u: attn_sel_rows != attn_sel_row", T, R, kb, hs);
        free(k);
        free(v);
        free(q);
        free(a);
        free(o1);
        free(o2);
        free(g);
        free(list);
        free(cur);
        free(p);
    }
}

static void random_scores(float *s, uint32_t n, int kind)
{
    for (uint32_t i = 0; i < n; i++) {
        if (kind == 0)
            s[i] = (float)test_rng_below(&rng, 5) - 2.0f; /* ties */
        else if (kind == 1 && i % 13 == 0)
            s[i] = i % 26 ? INFINITY : -INFINITY;
        else if (kind == 2 && i % 29 == 0)
            s[i] = NAN;
        else if (kind == 3)
            s[i] = i % 2 ? 0.0f : -0.0f;
        else
            s[i] = test_rng_normal(&rng) * (kind == 4 ? 1e-30f : 1.0f);
    }
}

static void test_threshold(void **state)
{
    (void)state;
    if (!have_avx512())
        skip();
    for (int it = 0; it < 400; it++) {
        uint32_t n = test_rng_below(&rng, it < 300 ? 300 : 5000);
        float *s = malloc(sizeof(float) * (n + 1));
        uint32_t *i1 = malloc(sizeof(uint32_t) * (n + 1)), *i2 = malloc(sizeof(uint32_t) * (n + 1));
        uint32_t *c1 = malloc(sizeof(uint32_t) * (n + 1));
        float *v1 = malloc(sizeof(float) * (n + 1)), *v2 = malloc(sizeof(float) * (n + 1));
        assert_true(s && i1 && i2 && c1 && v1 && v2);
        random_scores(s, n, it % 6);
        float th = it % 10 == 0 ? NAN : it % 10 == 1 ? -INFINITY : test_rng_normal(&rng);
        int nan1, nan2;
        uint32_t base = it % 3 ? test_rng_below(&rng, 100000) : 0; /* the slots' offset */
        uint32_t m1 = attn_above_scalar(s, n, th, base, i1, v1, &nan1);
        uint32_t m2 = attn_above_avx512(s, n, th, base, i2, v2, &nan2);
        assert_int_equal(m1, m2);
        assert_int_equal(nan1, nan2);
        assert_memory_equal(i1, i2, sizeof(uint32_t) * m1);
        assert_memory_equal(v1, v2, sizeof(float) * m1);
        assert_int_equal(attn_above_avx512(s, n, th, base, i2, NULL, &nan2), m1);
        assert_memory_equal(i1, i2, sizeof(uint32_t) * m1);
        float t2 = it % 7 == 0 ? NAN : test_rng_normal(&rng);
        for (uint32_t j = 0; j < n; j++)
            i2[j] = j * 3 + 1;
        uint32_t o1 = attn_keep_above_scalar(i2, s, n, t2, c1);
        uint32_t o2 = attn_keep_above_avx512(i2, s, n, t2, i2); /* in place */
        assert_int_equal(o1, o2);
        assert_memory_equal(c1, i2, sizeof(uint32_t) * o1);
        assert_int_equal(attn_count_avx512(s, n, th), attn_count_scalar(s, n, th));
        float lo1, hi1, lo2, hi2;
        attn_range_scalar(s, n, &lo1, &hi1, &nan1);
        attn_range_avx512(s, n, &lo2, &hi2, &nan2);
        assert_int_equal(nan1, nan2);
        assert_true(lo1 == lo2 && hi1 == hi2); /* equal values (+0 and -0 alike) */
        free(s);
        free(i1);
        free(i2);
        free(c1);
        free(v1);
        free(v2);
    }
}

int main(void)
{
    test_rng_init(&rng, test_seed());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_row),
        cmocka_unit_test(test_rows_blocked),
        cmocka_unit_test(test_threshold),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

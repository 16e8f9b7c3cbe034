/* test_attn_group.c: sparse attention's shared selection (select_group:
 * one key list per query row and kv head, shared by its query heads):
 * - attn_group_combine against its definition, max_h(est_h - off_h), off_h
 *   the head's maximum plus sq times the log of its softmax's denominator
 *   (attn_group_exp2_sum_scalar; both against the rule in double precision);
 * - attn_group_rows: every head's output bit-identical to infer_attn_list
 *   for that head over the shared list (random head counts, head sizes,
 *   lists, strides), and its AVX2 and AVX-512 kernels to their scalar twins;
 * - sparse attention with the shared selection at keep 1 bit-identical to
 *   dense (prefill chunk and decode row, estimates inline and on the
 *   device), and at keep < 1 equal to infer_attn_list over the keys a
 *   reference picks from the combined NPU estimates (every head of a kv
 *   head the same keys), and != the per-head selection's output. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_sparse.h"
#include "infer_internal.h"
#include "infer_matmul.h"
#include "attn_ref.h"
#include "testutil.h"

static struct test_rng rng;

static void test_combine(void **state)
{
    (void)state;
    static const float hds[] = {16.0f, 32.0f, 64.0f, 128.0f};
    for (int it = 0; it < 200; it++) {
        uint32_t G = 1 + test_rng_below(&rng, 8), vis = 1 + test_rng_below(&rng, 300);
        size_t ld = vis + test_rng_below(&rng, 40);
        float sq = sqrtf(hds[it % 4]);
        float *e = malloc(sizeof(float) * G * ld), *c = malloc(sizeof(float) * vis);
        float *cs = malloc(sizeof(float) * vis), *off = malloc(sizeof(float) * G);
        assert_true(e && c && cs && off);
        for (size_t i = 0; i < G * ld; i++)
            e[i] = (test_rng_float(&rng) - 0.5f) * (float)(1 + it % 9) * 10.0f;
        attn_group_combine(e, ld, G, vis, sq, c);
        attn_group_combine_scalar(e, ld, G, vis, sq, cs); /* the twin, whatever dispatches */
        for (uint32_t j = 0; j < G; j++) {
            float m = -INFINITY;
            for (uint32_t u = 0; u < vis; u++)
                m = fmaxf(m, e[j * ld + u]);
            float k = ATTN_EXP2_LOG2E / sq;
            off[j] = m + logf(attn_group_exp2_sum_scalar(e + j * ld, vis, k, m * k)) * sq;
            /* the sum itself against 2^x in double (its cubic: 1.5e-4) */
            double s2 = 0;
            for (uint32_t u = 0; u < vis; u++) {
                float x = fmaf(e[j * ld + u], k, -m * k);
                s2 += exp2(x < -126.0f ? -126.0 : x > 0.0f ? 0.0 : (double)x);
            }
            float s1 = attn_group_exp2_sum_scalar(e + j * ld, vis, k, m * k);
            if (fabs(s1 - s2) > 2e-4 * s2)
                fail_msg("G %u vis %u head %u: sum %g vs %g in double", G, vis, j, s1, s2);
            /* the rule in double: the head's log-denominator of e / sq */
            double z = 0;
            for (uint32_t u = 0; u < vis; u++)
                z += exp(((double)e[j * ld + u] - m) / sq);
            double offd = m + log(z) * sq;
            if (fabs(offd - off[j]) > 3e-4 * sq + 1e-5 * (1.0 + fabs(offd)))
                fail_msg("G %u vis %u head %u: offset %g vs %g in double", G, vis, j, off[j],
                         offd);
        }
        for (uint32_t t = 0; t < vis; t++) {
            float best = -INFINITY;
            for (uint32_t j = 0; j < G; j++)
                best = fmaxf(best, e[j * ld + t] - off[j]);
            if (c[t] != best || cs[t] != best)
                fail_msg("G %u vis %u t %u: %g (scalar %g) vs %g", G, vis, t, c[t], cs[t], best);
        }
        free(e);
        free(c);
        free(cs);
        free(off);
    }
    /* the clamp: exponents under -126 count as -126, over 0 as 0, NaN as -126 */
    float row[37];
    for (int i = 0; i < 37; i++)
        row[i] = i % 3 == 0 ? -1000.0f : i % 3 == 1 ? NAN : -200.0f;
    assert_true(attn_group_exp2_sum_scalar(row, 37, 1.0f, 0.0f) == ldexpf(37.0f, -126));
    for (int i = 0; i < 37; i++)
        row[i] = 5.0f;
    assert_true(attn_group_exp2_sum_scalar(row, 37, 1.0f, 0.0f) == 37.0f);
}

/* the AVX-512 kernel against the scalar definition bit for bit, with rows
 * of NaNs, zeros of both signs (a maximum of +0 or -0: the order decides
 * its sign), infinities and ordinary values */
#ifdef SLUICE_KERNELS_X86
typedef void combine_fn(const float *est, size_t ld, uint32_t G, uint32_t visible, float sq,
                        float *c);
/* a SIMD combine against the scalar definition, bit for bit, on rows with
 * NaN, infinities and signed zeros (and rows whose maximum is a zero) */
static void check_combine(const char *name, combine_fn *fn)
{
    static const float special[] = {0.0f, -0.0f, NAN, INFINITY, -INFINITY, 1.0f, -1.0f};
    int zero_max = 0;
    for (int it = 0; it < 400; it++) {
        /* up to 16 rows (the combine pipelines three at a time) and several
         * 16-lane steps before the tail */
        uint32_t G = 1 + test_rng_below(&rng, 16), vis = 1 + test_rng_below(&rng, 600);
        size_t ld = vis + test_rng_below(&rng, 40);
        float *e = malloc(sizeof(float) * G * ld), *c1 = malloc(sizeof(float) * vis);
        float *c2 = malloc(sizeof(float) * vis);
        float sq = sqrtf((float)(8u << (it % 4)));
        assert_true(e && c1 && c2);
        /* 0 plain, 1 some specials, 2 signed zeros, 3 <= 0, 4 one slot a
         * zero of either sign in every row and the rest far below: offsets
         * exactly 0, so the rows' c values tie as +0 against -0 there
         * (d > c ? d : c keeps the first; >= would not) */
        uint32_t mode = (uint32_t)it % 5;
        uint32_t tail = vis % 16; /* the slot in the tail half the time */
        uint32_t zslot = tail && test_rng_below(&rng, 2) ? vis - 1 - test_rng_below(&rng, tail)
                                                         : test_rng_below(&rng, vis);
        for (size_t i = 0; i < G * ld; i++) {
            float x = (test_rng_float(&rng) - 0.5f) * 20.0f;
            if (mode == 1 && test_rng_below(&rng, 8) == 0)
                x = special[test_rng_below(&rng, 7)];
            if (mode == 2)
                x = test_rng_below(&rng, 3) ? -fabsf(x) : (test_rng_below(&rng, 2) ? 0.0f : -0.0f);
            if (mode == 3)
                x = -fabsf(x) * (float)test_rng_below(&rng, 2);
            if (mode == 4)
                x = i % ld == zslot ? (test_rng_below(&rng, 2) ? 0.0f : -0.0f) : -1e4f;
            e[i] = x;
        }
        attn_group_combine_scalar(e, ld, G, vis, sq, c1);
        fn(e, ld, G, vis, sq, c2);
        if (memcmp(c1, c2, sizeof(float) * vis))
            fail_msg("it %d G %u vis %u: %s != scalar", it, G, vis, name);
        fn(e, ld, 0, vis, sq, c2); /* no rows: c untouched */
        if (memcmp(c1, c2, sizeof(float) * vis))
            fail_msg("it %d vis %u: %s with no rows wrote c", it, vis, name);
        /* rows whose maximum is a zero (of either sign): the case the order decides */
        for (uint32_t j = 0; j < G; j++) {
            float m = -INFINITY;
            for (uint32_t u = 0; u < vis; u++)
                m = fmaxf(m, e[j * ld + u]);
            zero_max += m == 0.0f;
        }
        free(e);
        free(c1);
        free(c2);
    }
    assert_true(zero_max > 100);
}
#endif

static void test_combine_avx512(void **state)
{
    (void)state;
#ifndef SLUICE_KERNELS_X86
    printf("test_combine_avx512: a build without the x86 kernels, skipped\n");
#else
    if (!infer_matmul_kernel_available(INFER_MATMUL_AVX512)) {
        printf("test_combine_avx512: no AVX-512 here, skipped\n");
        return;
    }
    check_combine("avx512", attn_group_combine_avx512);
#endif
}

static void test_combine_avx2(void **state)
{
    (void)state;
#ifndef SLUICE_KERNELS_X86
    printf("test_combine_avx2: a build without the x86 kernels, skipped\n");
#else
    if (!infer_matmul_kernel_available(INFER_MATMUL_AVX2)) {
        printf("test_combine_avx2: no AVX2 here, skipped\n");
        return;
    }
    check_combine("avx2", attn_group_combine_avx2);
#endif
}

static void test_group_rows(void **state)
{
    (void)state;
    int avx2_checked = 0, avx512_checked = 0;
    static const uint32_t sizes[] = {8, 24, 32, 64, 72, 128, 13, 144};
    for (int it = 0; it < 120; it++) {
        uint32_t G = 1 + test_rng_below(&rng, 8), hs = sizes[it % 8];
        uint32_t KV = 1 + test_rng_below(&rng, 3), g = test_rng_below(&rng, KV);
        uint32_t T = 1 + test_rng_below(&rng, 700);
        size_t kv_dim = (size_t)KV * hs, ldq = hs + test_rng_below(&rng, 3) * 8; /* row stride */
        float *k = malloc(sizeof(float) * T * kv_dim), *v = malloc(sizeof(float) * T * kv_dim);
        float *q = malloc(sizeof(float) * G * ldq), *out = malloc(sizeof(float) * G * ldq);
        float *ref = malloc(sizeof(float) * hs), *s = malloc(sizeof(float) * G * T);
        float *gather = malloc(sizeof(float) * T * hs), *a = malloc(sizeof(float) * T);
        uint32_t *list = malloc(sizeof(uint32_t) * T);
        assert_true(k && v && q && out && ref && s && gather && a && list);
        for (size_t i = 0; i < T * kv_dim; i++) {
            k[i] = test_rng_normal(&rng);
            v[i] = test_rng_normal(&rng);
        }
        for (size_t i = 0; i < G * ldq; i++)
            q[i] = test_rng_normal(&rng) * 0.5f;
        /* a random ascending list, sometimes every slot, sometimes one */
        uint32_t len = 0, mode = test_rng_below(&rng, 4);
        for (uint32_t t = 0; t < T; t++)
            if (mode == 0 || test_rng_below(&rng, 5) == 0)
                list[len++] = t;
        if (len == 0)
            list[len++] = test_rng_below(&rng, T);
        const float *kh = k + (size_t)g * hs, *vh = v + (size_t)g * hs;
        attn_group_rows(out, ldq, q, ldq, G, hs, kh, vh, kv_dim, list, len, s, gather);
#ifdef SLUICE_KERNELS_X86
        /* the AVX2 kernel against its scalar twin, where this CPU has it */
        if (hs % 8 == 0 && infer_matmul_kernel_available(INFER_MATMUL_AVX2)) {
            float *o2 = malloc(sizeof(float) * G * ldq), *o3 = malloc(sizeof(float) * G * ldq);
            assert_true(o2 && o3);
            attn_group_rows_avx2(o2, ldq, q, ldq, G, hs, kh, vh, kv_dim, list, len, s);
            attn_group_rows_ref(o3, ldq, q, ldq, G, hs, kh, vh, kv_dim, list, len, s);
            for (uint32_t j = 0; j < G; j++)
                if (memcmp(o2 + (size_t)j * ldq, o3 + (size_t)j * ldq, sizeof(float) * hs))
                    fail_msg("avx2 vs twin: G %u hs %u len %u head %u: %.9g vs %.9g", G, hs, len,
                             j, o2[(size_t)j * ldq], o3[(size_t)j * ldq]);
            free(o2);
            free(o3);
            avx2_checked++;
        }
        /* the AVX-512 kernel against its scalar twin, where this CPU has it */
        if (hs % 16 == 0 && infer_matmul_kernel_available(INFER_MATMUL_AVX512)) {
            float *o2 = malloc(sizeof(float) * G * ldq), *o3 = malloc(sizeof(float) * G * ldq);
            assert_true(o2 && o3);
            attn_group_rows_avx512(o2, ldq, q, ldq, G, hs, kh, vh, kv_dim, list, len, s);
            attn_group_rows_ref16(o3, ldq, q, ldq, G, hs, kh, vh, kv_dim, list, len, s);
            for (uint32_t j = 0; j < G; j++)
                if (memcmp(o2 + (size_t)j * ldq, o3 + (size_t)j * ldq, sizeof(float) * hs))
                    fail_msg("avx512 vs twin: G %u hs %u len %u head %u: %.9g vs %.9g", G, hs,
                             len, j, o2[(size_t)j * ldq], o3[(size_t)j * ldq]);
            free(o2);
            free(o3);
            avx512_checked++;
        }
#endif
        for (uint32_t j = 0; j < G; j++) {
            infer_attn_list(ref, q + (size_t)j * ldq, kh, vh, kv_dim, hs, list, len, a, gather);
            if (memcmp(ref, out + (size_t)j * ldq, sizeof(float) * hs))
                fail_msg("G %u hs %u T %u len %u head %u: %.9g vs %.9g", G, hs, T, len, j,
                         out[(size_t)j * ldq], ref[0]);
        }
        free(k);
        free(v);
        free(q);
        free(out);
        free(ref);
        free(s);
        free(gather);
        free(a);
        free(list);
    }
#ifndef SLUICE_KERNELS_X86
    printf("test_group_rows: a build without the x86 kernels, their twin checks skipped\n");
    (void)avx2_checked;
    (void)avx512_checked;
#else
    if (infer_matmul_kernel_available(INFER_MATMUL_AVX2))
        assert_true(avx2_checked > 50);
    else
        printf("test_group_rows: no AVX2 here, the kernel's twin check skipped\n");
    if (infer_matmul_kernel_available(INFER_MATMUL_AVX512))
        assert_true(avx512_checked > 30);
    else
        printf("test_group_rows: no AVX-512 here, its kernel's twin check skipped\n");
#endif
}

/* attn_group_rows_blk: R rows with their own lists walked together, each
 * row's heads bit for bit the twin's (AVX-512: attn_group_rows_ref16; the
 * dispatcher elsewhere: attn_group_rows) */
static void test_group_rows_blk(void **state)
{
    (void)state;
#ifdef SLUICE_KERNELS_X86
    int avx512 = infer_matmul_kernel_used() == INFER_MATMUL_AVX512;
#else
    int avx512 = 0;
#endif
    static const uint32_t sizes[] = {64, 128, 32, 144};
    for (int it = 0; it < 60; it++) {
        uint32_t G = 1 + test_rng_below(&rng, 8), hs = sizes[it % 4], R = 1 + test_rng_below(&rng, 12);
        uint32_t KV = 1 + test_rng_below(&rng, 3), g = test_rng_below(&rng, KV);
        uint32_t T = 1 + test_rng_below(&rng, 900), kb = 1 + test_rng_below(&rng, 300);
        size_t kv_dim = (size_t)KV * hs, ldq = (size_t)G * hs + 16 * test_rng_below(&rng, 2);
        float *k = malloc(sizeof(float) * T * kv_dim), *v = malloc(sizeof(float) * T * kv_dim);
        float *q = malloc(sizeof(float) * R * ldq), *o1 = calloc((size_t)R * ldq, sizeof(float));
        float *o2 = calloc((size_t)R * ldq, sizeof(float)), *s = malloc(sizeof(float) * R * G * T);
        float *s2 = malloc(sizeof(float) * G * T), *gather = malloc(sizeof(float) * T * hs);
        uint32_t *lists = malloc(sizeof(uint32_t) * R * T), cur[12];
        struct attn_group_row w[12];
        assert_true(k && v && q && o1 && o2 && s && s2 && gather && lists);
        for (size_t i = 0; i < T * kv_dim; i++) {
            k[i] = test_rng_normal(&rng);
            v[i] = test_rng_normal(&rng);
        }
        for (size_t i = 0; i < R * ldq; i++)
            q[i] = test_rng_normal(&rng) * 0.5f;
        for (uint32_t r = 0; r < R; r++) {
            uint32_t *l = lists + (size_t)r * T, len = 0, mode = test_rng_below(&rng, 4);
            for (uint32_t t = 0; t < T; t++)
                if (mode == 0 || test_rng_below(&rng, 5) == 0)
                    l[len++] = t;
            if (len == 0)
                l[len++] = test_rng_below(&rng, T);
            /* heads of a row hs apart within the row's ldq (as a query row's heads) */
            w[r] = (struct attn_group_row){q + r * ldq, o1 + r * ldq, l, len, s + (size_t)r * G * T, 0,
                                           NULL};
        }
        const float *kh = k + (size_t)g * hs, *vh = v + (size_t)g * hs;
        attn_group_rows_blk(R, w, G, hs, hs, hs, kh, vh, kv_dim, kb, T, cur, gather);
        for (uint32_t r = 0; r < R; r++) {
#ifdef SLUICE_KERNELS_X86
            if (avx512)
                attn_group_rows_ref16(o2 + r * ldq, hs, q + r * ldq, hs, G, hs, kh, vh, kv_dim,
                                      w[r].list, w[r].len, s2);
            else
#endif
                attn_group_rows(o2 + r * ldq, hs, q + r * ldq, hs, G, hs, kh, vh, kv_dim,
                                w[r].list, w[r].len, s2, gather);
            if (memcmp(o1 + r * ldq, o2 + r * ldq, sizeof(float) * G * hs))
                fail_msg("R %u row %u G %u hs %u T %u kb %u len %u: blk != twin", R, r, G, hs, T,
                         kb, w[r].len);
        }
        free(k);
        free(v);
        free(q);
        free(o1);
        free(o2);
        free(s);
        free(s2);
        free(gather);
        free(lists);
    }
    if (!avx512)
        printf("test_group_rows_blk: the dense kernel is not AVX-512 here: checked against "
               "attn_group_rows\n");
}

static void test_keep_all_is_dense(void **state)
{
    (void)state;
    struct format_config c = attn_ref_shape(8, 2, 32, 1024);
    uint32_t T = 600;
    struct infer_kv *kv = attn_ref_cache(&rng, &c, T);
    for (int inl = 0; inl < 2; inl++) {
        struct infer_sparse_opts o = {.keep = 1.0, .sinks = 4, .window = 16, .inline_npu = inl,
                                      .select_group = 1};
        attn_ref_keep_all(&rng, &c, kv, T, &o, 2.0f);
    }
    infer_kv_destroy(kv);
}

/* keep < 1: per row and kv head, the keys the combined estimates pick (a
 * reference: the NPU path's estimates of each head, combined, selected),
 * and every head of the kv head over them through infer_attn_list */
static void test_group_reference(void **state)
{
    (void)state;
    struct format_config c = attn_ref_shape(8, 2, 32, 1024);
    uint32_t T = 530, n = 30, base = T - n, hd = c.head_dim, H = c.n_heads;
    uint32_t G = H / c.n_kv_heads;
    size_t qdim = (size_t)H * hd, kv_dim = (size_t)c.n_kv_heads * hd;
    struct infer_kv *kv = attn_ref_cache(&rng, &c, T);
    float *q = attn_ref_q(&rng, &c, n, 2.0f), *os = malloc(sizeof(float) * n * qdim);
    float *oh = malloc(sizeof(float) * n * qdim);
    struct infer_sparse_opts o = {.keep = 0.15, .sinks = 3, .window = 10, .select_group = 1};
    struct infer_sparse *sp, *sp2, *sph;
    struct sl_err err;
    assert_int_equal(infer_sparse_create(&c, NULL, &o, &sp, &err), 0);
    assert_int_equal(infer_sparse_create(&c, NULL, &o, &sp2, &err), 0);
    o.select_group = 0;
    assert_int_equal(infer_sparse_create(&c, NULL, &o, &sph, &err), 0);
    attn_ref_run(infer_sparse_attention(sp), &c, kv, 0, n, base, q, os);
    attn_ref_run(infer_sparse_attention(sph), &c, kv, 0, n, base, q, oh);
    assert_true(memcmp(os, oh, sizeof(float) * n * qdim) != 0); /* another selection */
    float *est = malloc(sizeof(float) * G * n * 1024), *comb = malloc(sizeof(float) * T);
    float *a = malloc(sizeof(float) * T), *gather = malloc(sizeof(float) * T * hd), out[32];
    uint32_t *sel = malloc(sizeof(uint32_t) * T), *work = malloc(sizeof(uint32_t) * 2 * T);
    assert_true(est && comb && a && gather && sel && work);
    for (uint32_t g = 0; g < c.n_kv_heads; g++) {
        uint32_t L = 0;
        float qs, qs0 = 0;
        /* sp2 saw no call before: its bucket grid is centred the same way */
        for (uint32_t j = 0; j < G; j++) {
            assert_int_equal(attn_sparse_estimate(sp2, kv, 0, q, n, base, g * G + j,
                                                  est + (size_t)j * n * 1024, &L, &qs, &err),
                             0);
            if (j == 0)
                qs0 = qs;
            assert_true(qs == qs0); /* one bucket for the kv head's heads */
        }
        for (uint32_t i = 0; i < n; i++) {
            uint32_t vis = base + i + 1, k = attn_keep_count(0.15, vis);
            /* the heads' rows, n * 1024 apart, each of stride L */
            float *rowsj = malloc(sizeof(float) * G * vis);
            for (uint32_t j = 0; j < G; j++)
                memcpy(rowsj + (size_t)j * vis, est + (size_t)j * n * 1024 + (size_t)i * L,
                       sizeof(float) * vis);
            attn_group_combine(rowsj, vis, G, vis, sqrtf((float)hd), comb);
            free(rowsj);
            uint32_t m = attn_select_row(comb, vis, k, 3, 10, sel, work);
            for (uint32_t j = 0; j < G; j++) {
                uint32_t h = g * G + j;
                infer_attn_list(out, q + i * qdim + (size_t)h * hd,
                                infer_kv_keys(kv, 0) + (size_t)g * hd,
                                infer_kv_values(kv, 0) + (size_t)g * hd, kv_dim, hd, sel, m, a,
                                gather);
                if (memcmp(out, os + i * qdim + (size_t)h * hd, sizeof(float) * hd))
                    fail_msg("head %u row %u: k %u m %u out %g vs %g", h, i, k, m, out[0],
                             os[i * qdim + (size_t)h * hd]);
            }
        }
    }
    struct infer_sparse_stats st;
    infer_sparse_stats(sp, &st);
    assert_true(st.keys_kept < st.keys_visible / 5 && st.keys_kept > 0);
    infer_sparse_destroy(sp);
    infer_sparse_destroy(sp2);
    infer_sparse_destroy(sph);
    infer_kv_destroy(kv);
    free(q);
    free(os);
    free(oh);
    free(est);
    free(comb);
    free(a);
    free(gather);
    free(sel);
    free(work);
}

int main(void)
{
    test_rng_init(&rng, test_seed());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_combine),
        cmocka_unit_test(test_combine_avx512),
        cmocka_unit_test(test_combine_avx2),
        cmocka_unit_test(test_group_rows),
        cmocka_unit_test(test_group_rows_blk),
        cmocka_unit_test(test_keep_all_is_dense),
        cmocka_unit_test(test_group_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_attn_rows.c: sparse attention's row blocks (infer_sparse_opts.row_block:
 * R adjacent query rows of a head share one key list; the rows' members
 * attend prefixes of it): the blocked exact stage with per-member prefixes
 * against its twin bit for bit, keep 100% equal to dense, and the path's
 * output against a reference built from the estimates (combined per block,
 * selected, the block's newest keys appended, infer_attn_list per row). */
#include <errno.h>
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

/* attn_group_rows_blk with members of their own prefix lengths (lens) and
 * entries of fewer members (m), q and outputs a query row apart (ldq =
 * ldo = the row's width, as row blocks call it), against each member alone
 * over its prefix: attn_group_rows_ref16 under the AVX-512 kernel (its
 * bits), else attn_group_rows (which the fallback itself runs per member:
 * there only the wiring is checked: prefix lengths, member order, members
 * past m untouched) */
static void test_blk_prefix(void **state)
{
    (void)state;
#ifdef SLUICE_KERNELS_X86
    int avx512 = infer_matmul_kernel_used() == INFER_MATMUL_AVX512;
#else
    int avx512 = 0;
#endif
    static const uint32_t sizes[] = {64, 128, 32, 144};
    enum { RMAX = 10, GMAX = 16 };
    for (int it = 0; it < 80; it++) {
        uint32_t G = 1 + test_rng_below(&rng, GMAX), hs = sizes[it % 4];
        uint32_t R = 1 + test_rng_below(&rng, RMAX), KV = 1 + test_rng_below(&rng, 3);
        uint32_t g = test_rng_below(&rng, KV), T = 1 + test_rng_below(&rng, 700);
        uint32_t kb = 1 + test_rng_below(&rng, 300);
        size_t kv_dim = (size_t)KV * hs, ld = (size_t)hs * (1 + test_rng_below(&rng, 3));
        size_t nq = (size_t)R * G * ld;
        float *k = malloc(sizeof(float) * T * kv_dim), *v = malloc(sizeof(float) * T * kv_dim);
        float *q = malloc(sizeof(float) * nq), *o1 = calloc(nq, sizeof(float));
        float *o2 = calloc(nq, sizeof(float)), *s = malloc(sizeof(float) * R * G * T);
        float *s2 = malloc(sizeof(float) * T), *gather = malloc(sizeof(float) * T * hs);
        uint32_t *lists = malloc(sizeof(uint32_t) * R * T), cur[RMAX], lens[RMAX][GMAX];
        struct attn_group_row w[RMAX];
        assert_true(k && v && q && o1 && o2 && s && s2 && gather && lists);
        for (size_t i = 0; i < T * kv_dim; i++) {
            k[i] = test_rng_normal(&rng);
            v[i] = test_rng_normal(&rng);
        }
        for (size_t i = 0; i < nq; i++)
            q[i] = test_rng_normal(&rng) * 0.5f;
        for (uint32_t r = 0; r < R; r++) {
            uint32_t *l = lists + (size_t)r * T, len = 0, mode = test_rng_below(&rng, 4);
            for (uint32_t t = 0; t < T; t++)
                if (mode == 0 || test_rng_below(&rng, 5) == 0)
                    l[len++] = t;
            if (len == 0)
                l[len++] = test_rng_below(&rng, T);
            uint32_t m = test_rng_below(&rng, 3) ? G : 1 + test_rng_below(&rng, G);
            int pre = test_rng_below(&rng, 4) != 0; /* else lens NULL: all len */
            for (uint32_t h = 0; h < m; h++) /* mostly near len, as a block's rows */
                lens[r][h] = test_rng_below(&rng, 3) ? len - test_rng_below(&rng, len < 4 ? len : 4)
                                                     : 1 + test_rng_below(&rng, len);
            w[r] = (struct attn_group_row){q + r * G * ld, o1 + r * G * ld, l, len,
                                           s + (size_t)r * G * T, m == G ? 0 : m,
                                           pre ? lens[r] : NULL};
            if (!pre)
                for (uint32_t h = 0; h < m; h++)
                    lens[r][h] = len;
        }
        const float *kh = k + (size_t)g * hs, *vh = v + (size_t)g * hs;
        attn_group_rows_blk(R, w, G, ld, ld, hs, kh, vh, kv_dim, kb, T, cur, gather);
        for (uint32_t r = 0; r < R; r++) {
            uint32_t m = w[r].m ? w[r].m : G;
            for (uint32_t h = 0; h < m; h++) {
                size_t at = (r * G + h) * ld;
#ifdef SLUICE_KERNELS_X86
                if (avx512)
                    attn_group_rows_ref16(o2 + at, hs, q + at, hs, 1, hs, kh, vh, kv_dim,
                                          w[r].list, lens[r][h], s2);
                else
#endif
                    attn_group_rows(o2 + at, hs, q + at, hs, 1, hs, kh, vh, kv_dim, w[r].list,
                                    lens[r][h], s2, gather);
                if (memcmp(o1 + at, o2 + at, sizeof(float) * hs))
                    fail_msg("R %u entry %u member %u/%u hs %u T %u kb %u len %u prefix %u: "
                             "blk != twin",
                             R, r, h, m, hs, T, kb, w[r].len, lens[r][h]);
            }
            for (uint32_t h = m; h < G; h++) /* members past m untouched */
                for (uint32_t c = 0; c < hs; c++)
                    assert_true(o1[(r * G + h) * ld + c] == 0.0f);
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
        printf("test_blk_prefix: the dense kernel is not AVX-512 here: checked against "
               "attn_group_rows\n");
}

static void test_keep_all_is_dense(void **state)
{
    (void)state;
    struct format_config c = attn_ref_shape(8, 2, 64, 1024);
    uint32_t T = 600;
    struct infer_kv *kv = attn_ref_cache(&rng, &c, T);
    static const uint32_t Rs[] = {2, 4, 5, 16};
    for (int it = 0; it < 8; it++) {
        struct infer_sparse_opts o = {.keep = 1.0, .sinks = 4, .window = 16,
                                      .inline_npu = it & 1, .row_block = Rs[it / 2]};
        attn_ref_keep_all(&rng, &c, kv, T, &o, 2.0f);
    }
    infer_kv_destroy(kv);
}

/* keep < 1, estimates on the device (one launch covers the call's 29 rows,
 * so the blocks start at rows 0, R, 2R, ...): per head and block, the keys
 * the rows' combined estimates pick over the first row's keys (a
 * reference: the NPU path's estimates, combined, selected; the last block,
 * of one row, ranks its own estimates), the block's newer keys appended,
 * each row through infer_attn_list over its prefix. A decode step (one row)
 * with row blocks equals one without. */
static void test_rows_reference(void **state)
{
    (void)state;
    struct format_config c = attn_ref_shape(8, 2, 32, 1024);
    uint32_t T = 530, n = 29, base = T - n, hd = c.head_dim, H = c.n_heads, R = 4;
    size_t qdim = (size_t)H * hd, kv_dim = (size_t)c.n_kv_heads * hd;
    double keep = 0.15;
    struct infer_kv *kv = attn_ref_cache(&rng, &c, T);
    float *q = attn_ref_q(&rng, &c, n, 2.0f), *os = malloc(sizeof(float) * n * qdim);
    float *oh = malloc(sizeof(float) * n * qdim);
    struct infer_sparse_opts o = {.keep = keep, .sinks = 3, .window = 10, .row_block = R};
    struct infer_sparse *sp, *sp2, *sph;
    struct sl_err err;
    assert_int_equal(infer_sparse_create(&c, NULL, &o, &sp, &err), 0);
    assert_int_equal(infer_sparse_create(&c, NULL, &o, &sp2, &err), 0);
    o.row_block = 0;
    assert_int_equal(infer_sparse_create(&c, NULL, &o, &sph, &err), 0);
    struct infer_sparse *bad = NULL;
    o.row_block = 3;
    o.select_group = 1;
    assert_int_equal(infer_sparse_create(&c, NULL, &o, &bad, &err), -EINVAL);
    o.select_group = 0;
    o.row_block = 17;
    assert_int_equal(infer_sparse_create(&c, NULL, &o, &bad, &err), -EINVAL);
    assert_null(bad);
    o.row_block = R;
    attn_ref_run(infer_sparse_attention(sp), &c, kv, 0, n, base, q, os);
    attn_ref_run(infer_sparse_attention(sph), &c, kv, 0, n, base, q, oh);
    assert_true(memcmp(os, oh, sizeof(float) * n * qdim) != 0); /* another selection */
    float *est = malloc(sizeof(float) * n * 1024), *comb = malloc(sizeof(float) * T);
    float *a = malloc(sizeof(float) * T), *gather = malloc(sizeof(float) * T * hd), out[32];
    uint32_t *sel = malloc(sizeof(uint32_t) * T), *work = malloc(sizeof(uint32_t) * 2 * T);
    assert_true(est && comb && a && gather && sel && work);
    uint64_t kept = 0, visible = 0;
    for (uint32_t h = 0; h < H; h++) {
        uint32_t L = 0, g = h / (H / c.n_kv_heads);
        float qs;
        assert_int_equal(attn_sparse_estimate(sp2, kv, 0, q, n, base, h, est, &L, &qs, &err), 0);
        for (uint32_t i0 = 0; i0 < n; i0 += R) {
            uint32_t m = n - i0 < R ? n - i0 : R, v0 = base + i0 + 1, mid = (m - 1) / 2;
            uint32_t k = attn_keep_count(keep, v0 + mid);
            k = k > mid ? k - mid : 1;
            const float *rank = est + (size_t)i0 * L;
            if (m > 1) {
                attn_group_combine(est + (size_t)i0 * L, L, m, v0, sqrtf((float)hd), comb);
                rank = comb;
            }
            uint32_t ns = attn_select_row(rank, v0, k, 3, 10, sel, work);
            for (uint32_t j = 1; j < m; j++)
                sel[ns + j - 1] = v0 + j - 1;
            for (uint32_t j = 0; j < m; j++) {
                uint32_t i = i0 + j;
                infer_attn_list(out, q + i * qdim + (size_t)h * hd,
                                infer_kv_keys(kv, 0) + (size_t)g * hd,
                                infer_kv_values(kv, 0) + (size_t)g * hd, kv_dim, hd, sel, ns + j,
                                a, gather);
                if (memcmp(out, os + i * qdim + (size_t)h * hd, sizeof(float) * hd))
                    fail_msg("head %u row %u: k %u ns %u out %g vs %g", h, i, k, ns, out[0],
                             os[i * qdim + (size_t)h * hd]);
                kept += ns + j;
                visible += v0 + j;
            }
        }
    }
    struct infer_sparse_stats st;
    infer_sparse_stats(sp, &st);
    assert_true(st.keys_kept == kept && st.keys_visible == visible);
    /* the real ratio: within a key a row of the keep */
    assert_true(fabs((double)kept / (double)visible - keep) < 2.0 / base);
    float *q1 = attn_ref_q(&rng, &c, 1, 2.0f), *d1 = malloc(sizeof(float) * qdim);
    float *d2 = malloc(sizeof(float) * qdim);
    assert_true(q1 && d1 && d2);
    attn_ref_run(infer_sparse_attention(sp), &c, kv, 0, 1, T - 1, q1, d1);
    attn_ref_run(infer_sparse_attention(sph), &c, kv, 0, 1, T - 1, q1, d2);
    assert_memory_equal(d1, d2, sizeof(float) * qdim);
    free(q1);
    free(d1);
    free(d2);
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
        cmocka_unit_test(test_blk_prefix),
        cmocka_unit_test(test_keep_all_is_dense),
        cmocka_unit_test(test_rows_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

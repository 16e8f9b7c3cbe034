/* test_attn_sparse.c: sparse attention (shadowAttn 3.2-3.4), piece by piece
 * and whole:
 * - top-k selection against a full sort (random sizes, ties, both paths);
 * - the keys a row keeps (sinks, window, top of the rest: count and set);
 * - eq. 3's ratios (mean, cap, order) and the Q scale buckets;
 * - the NPU estimate bit-exact with the scalar specification, its K codes
 *   those of the KV cache's int8 mirror;
 * - sparse attention at keep 1 bit-identical to dense (prefill chunk and
 *   decode row), and at keep < 1 equal to the dense kernel's selection path
 *   over the keys a scalar reference picks;
 * - the greedy plan (Algorithm 1) against every order on small cases;
 * - the cold-start pipeline and the batched forward give identical logits
 *   with sparse attention (a synthetic model). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_sparse.h"
#include "import.h"
#include "infer_internal.h"
#include "npu.h"
#include "attn_ref.h"
#include "testutil.h"
#include "topk_ref.h"

static struct test_rng rng;

static void test_topk(void **state)
{
    (void)state;
    for (int it = 0; it < 400; it++) {
        uint32_t n = 1 + test_rng_below(&rng, it < 200 ? 100 : 5000);
        uint32_t k = test_rng_below(&rng, n + 1);
        float *s = malloc(sizeof(float) * n);
        uint32_t *a = malloc(sizeof(uint32_t) * (n + 1)), *b = malloc(sizeof(uint32_t) * (n + 1));
        uint32_t *work = malloc(sizeof(uint32_t) * 2 * n);
        assert_true(s && a && b && work);
        int kind = it % 5;
        for (uint32_t i = 0; i < n; i++) {
            if (kind == 0) /* many ties */
                s[i] = (float)test_rng_below(&rng, 7) - 3.0f;
            else if (kind == 1) /* all equal */
                s[i] = 1.5f;
            else if (kind == 2) /* wide range, negative and positive */
                s[i] = test_rng_normal(&rng) * powf(10.0f, (float)test_rng_below(&rng, 8) - 4);
            else if (kind == 3 && i % 17 == 0) /* an infinity: the general path */
                s[i] = i % 34 ? INFINITY : -INFINITY;
            else
                s[i] = test_rng_normal(&rng);
        }
        attn_topk(s, n, k, a, work);
        topk_ref_sort(s, n, k, b);
        for (uint32_t j = 0; j < k; j++)
            if (a[j] != b[j])
                fail_msg("n %u k %u kind %d: index %u is %u, the sort says %u", n, k, kind, j,
                         a[j], b[j]);
        free(s);
        free(a);
        free(b);
        free(work);
    }
}

static void test_select_row(void **state)
{
    (void)state;
    for (int it = 0; it < 300; it++) {
        uint32_t visible = 1 + test_rng_below(&rng, 600);
        double r = test_rng_float(&rng);
        uint32_t k = attn_keep_count(r, visible);
        assert_true(k >= 1 && k <= visible);
        assert_true(k >= (uint32_t)floor(r * visible) && k <= (uint32_t)ceil(r * visible) + 1);
        uint32_t sinks = test_rng_below(&rng, 8), window = test_rng_below(&rng, 80);
        float *e = malloc(sizeof(float) * visible);
        uint32_t *sel = malloc(sizeof(uint32_t) * visible), *work = malloc(8 * visible + 8);
        uint32_t *ref = malloc(sizeof(uint32_t) * visible);
        for (uint32_t t = 0; t < visible; t++)
            e[t] = test_rng_normal(&rng);
        uint32_t ns = attn_select_row(e, visible, k, sinks, window, sel, work);
        assert_int_equal(ns, k);
        for (uint32_t j = 1; j < ns; j++)
            assert_true(sel[j] > sel[j - 1]);
        /* reference: window, sinks, then the top of the middle by a sort */
        uint32_t w = window < k ? window : k, s = sinks < k - w ? sinks : k - w;
        if (k == visible) {
            s = k;
            w = 0;
        }
        uint32_t mid = visible - s - w, rest = k - s - w, o = 0;
        for (uint32_t t = 0; t < s; t++)
            ref[o++] = t;
        topk_ref_sort(e + s, mid, rest, ref + o);
        for (uint32_t j = 0; j < rest; j++)
            ref[o + j] += s;
        o += rest;
        for (uint32_t t = visible - w; t < visible; t++)
            ref[o++] = t;
        qsort(ref, o, sizeof *ref, topk_ref_cmp_u32);
        assert_int_equal(o, k);
        assert_memory_equal(sel, ref, sizeof(uint32_t) * k);
        /* with a guess for the threshold (none, a good one, one too high):
         * the guessed paths write the sinks' offset with their candidates */
        float hint[ATTN_HINT] = {it % 3 == 0 ? NAN : it % 3 == 1 ? 0.5f : 1e3f,
                                 it % 4 == 0 ? NAN : it % 4 == 1 ? 0.01f : 1e3f};
        assert_int_equal(attn_select_row_hint(e, visible, k, sinks, window, sel, work, hint), k);
        assert_memory_equal(sel, ref, sizeof(uint32_t) * k);
        if (visible > 200) { /* the hint it leaves, for a second row like it */
            assert_int_equal(attn_select_row_hint(e, visible, k, sinks, window, sel, work, hint),
                             k);
            assert_memory_equal(sel, ref, sizeof(uint32_t) * k);
        }
        free(e);
        free(sel);
        free(work);
        free(ref);
    }
}

/* Small k (early rows, small keep): the row itself and its recent keys go
 * before the sinks (the old rule kept only the first slots, not the row). */
static void test_select_row_small_k(void **state)
{
    (void)state;
    enum { V = 40 };
    float e[V];
    uint32_t sel[V], work[2 * V];
    for (uint32_t t = 0; t < V; t++)
        e[t] = (float)((t * 7) % 13); /* largest (12) at t = 11, 24, 37 */
    /* k 3 < window 16: the last 3 slots only, the row (39) included */
    assert_int_equal(attn_select_row(e, V, 3, 4, 16, sel, work), 3);
    assert_int_equal(sel[0], 37);
    assert_int_equal(sel[1], 38);
    assert_int_equal(sel[2], 39);
    /* k 1: the row itself */
    assert_int_equal(attn_select_row(e, V, 1, 4, 16, sel, work), 1);
    assert_int_equal(sel[0], 39);
    /* k 6, window 3, sinks 4: the window, then 3 sinks, no top-k */
    assert_int_equal(attn_select_row(e, V, 6, 4, 3, sel, work), 6);
    const uint32_t want6[6] = {0, 1, 2, 37, 38, 39};
    assert_memory_equal(sel, want6, sizeof want6);
    /* k 9, window 3, sinks 4: 2 of the rest by score (24 and 11: 12 each, 37 is
     * in the window) */
    assert_int_equal(attn_select_row(e, V, 9, 4, 3, sel, work), 9);
    const uint32_t want9[9] = {0, 1, 2, 3, 11, 24, 37, 38, 39};
    assert_memory_equal(sel, want9, sizeof want9);
}

static void test_ratios(void **state)
{
    (void)state;
    enum { L = 3, H = 4 };
    float head[L * H] = {0.5f, -0.1f, 0.02f, 3.0f, 0.1f, 0.1f, 0.1f, 0.1f, 0.0f, 0.2f, 0.4f, 0.8f};
    float layer[L] = {1.0f, -0.5f, 2.0f};
    float r[L * H];
    for (int f = 0; f <= 2; f++) {
        double floor_share = f * 0.5, keep = 0.3;
        attn_ratios(head, layer, L, H, keep, floor_share, r);
        double sum = 0;
        for (int i = 0; i < L * H; i++) {
            assert_true(r[i] > 0 && r[i] <= 1.0f);
            assert_true(r[i] >= floor_share * keep - 1e-6);
            sum += r[i];
        }
        assert_true(fabs(sum / (L * H) - keep) < 1e-4); /* the budget is spent */
    }
    attn_ratios(head, layer, L, H, 0.3, 0.0, r);
    assert_true(r[3] == 1.0f); /* the most important head capped at 1 */
    assert_true(r[11] > r[10] && r[10] > r[9]); /* order of importance kept */
    assert_true(r[1] < r[0]); /* a negative loss gets the floor weight */
    attn_ratios(NULL, NULL, L, H, 0.3, 0.0, r);
    for (int i = 0; i < L * H; i++)
        assert_true(r[i] == 0.3f);
    /* buckets: a grid mean * 0.5^(b - 4), the nearest in squared error */
    assert_true(attn_bucket_scale(2.0f, 0.5f, 9, 4) == 2.0f);
    assert_true(attn_bucket_scale(2.0f, 0.5f, 9, 5) == 1.0f);
    assert_true(attn_bucket_scale(2.0f, 0.5f, 9, 3) == 4.0f);
    assert_int_equal(attn_bucket_pick(2.0f, 0.5f, 9, 2.1f), 4);
    assert_int_equal(attn_bucket_pick(2.0f, 0.5f, 9, 3.5f), 3);
    assert_int_equal(attn_bucket_pick(2.0f, 0.5f, 9, 1000.0f), 0);
    assert_int_equal(attn_bucket_pick(2.0f, 0.5f, 9, 1e-6f), 8);
}

static void test_estimate(void **state)
{
    (void)state;
    struct format_config c = attn_ref_shape(8, 2, 64, 1024);
    uint32_t T = 700, n = 20, base = T - n, hd = c.head_dim;
    size_t kv_dim = (size_t)c.n_kv_heads * hd;
    struct infer_kv *kv = attn_ref_cache(&rng, &c, T);
    float *q = attn_ref_q(&rng, &c, n, 1.0f);
    struct infer_sparse *sp;
    struct sl_err err;
    assert_int_equal(infer_sparse_create(&c, NULL, NULL, &sp, &err), 0);
    float *est = malloc(sizeof(float) * n * 1024), *ref = malloc(sizeof(float) * n * 1024);
    int8_t *q8 = malloc((size_t)n * hd), *kq = malloc(hd);
    assert_true(est && ref && q8 && kq);
    for (uint32_t layer = 0; layer < 2; layer++)
        for (uint32_t h = 0; h < c.n_heads; h++) {
            uint32_t L;
            float qs;
            if (attn_sparse_estimate(sp, kv, layer, q, n, base, h, est, &L, &qs, &err) < 0)
                fail_msg("estimate: %s", err.msg);
            assert_true(L >= T && L % 256 == 0);
            for (uint32_t i = 0; i < n; i++) {
                /* 7-bit Q codes at the bucket's code scale */
                int8_t q127[256];
                npu_quantize_act(q + (size_t)i * c.n_heads * hd + (size_t)h * hd, hd, qs, q127);
                for (uint32_t d = 0; d < hd; d++) {
                    int v = q127[d] > ATTN_EST_QQ    ? ATTN_EST_QQ
                            : q127[d] < -ATTN_EST_QQ ? -ATTN_EST_QQ
                                                     : q127[d];
                    q8[(size_t)i * hd + d] = (int8_t)v;
                }
            }
            int8_t q7[256];
            for (uint32_t i = 0; i < n; i++) { /* attn_quantize_q is that rule */
                attn_quantize_q(q + (size_t)i * c.n_heads * hd + (size_t)h * hd, hd, qs, q7);
                assert_memory_equal(q7, q8 + (size_t)i * hd, hd);
            }
            uint32_t g = h / (c.n_heads / c.n_kv_heads);
            const int8_t *k8 = infer_kv_keys_i8(kv, layer) + (size_t)g * hd;
            const float *k8s = infer_kv_keys_i8_scale(kv, layer);
            float *ks = malloc(sizeof(float) * T);
            int8_t *k7 = malloc((size_t)T * hd);
            assert_true(ks && k7);
            for (uint32_t t = 0; t < T; t++) {
                const float *kf = infer_kv_keys(kv, layer) + t * kv_dim + (size_t)g * hd;
                /* the cache's mirror is attn_quantize_key's rule */
                float s = attn_quantize_key(kf, hd, kq);
                assert_true(s == k8s[(size_t)t * c.n_kv_heads + g]);
                assert_memory_equal(kq, k8 + t * kv_dim, hd);
                /* the estimate's keys: the same rule within +-ATTN_EST_QMAX */
                ks[t] = attn_quantize_key_q(kf, hd, ATTN_EST_QMAX, k7 + (size_t)t * hd);
                for (uint32_t d = 0; d < hd; d++)
                    assert_true(abs(k7[(size_t)t * hd + d]) <= ATTN_EST_QMAX);
            }
            attn_estimate_ref(q8, n, hd, qs, k7, hd, ks, T, ref, L);
            for (uint32_t i = 0; i < n; i++)
                assert_memory_equal(est + (size_t)i * L, ref + (size_t)i * L, sizeof(float) * T);
            free(ks);
            free(k7);
        }
    infer_sparse_destroy(sp);
    infer_kv_destroy(kv);
    free(est);
    free(ref);
    free(q8);
    free(kq);
    free(q);
}

/* the int8 keys prepared call by call, growing past two buckets (the
 * earlier calls' codes kept, the new slots quantized), then rewound to a
 * cache whose slots from 400 on changed: every estimate equals a fresh
 * instance's that prepared the same cache in one call */
static void test_estimate_grown(void **state)
{
    (void)state;
    struct format_config c = attn_ref_shape(8, 2, 64, 1024);
    uint32_t n = 20, hd = c.head_dim;
    size_t kv_dim = (size_t)c.n_kv_heads * hd;
    struct infer_kv *kv = attn_ref_cache(&rng, &c, 700);
    float *q = attn_ref_q(&rng, &c, n, 1.0f);
    float *est = malloc(sizeof(float) * n * 1024), *ref = malloc(sizeof(float) * n * 1024);
    float *k = malloc(sizeof(float) * 300 * kv_dim), *v = malloc(sizeof(float) * 300 * kv_dim);
    assert_true(est && ref && k && v);
    struct infer_sparse *sp, *fresh;
    struct sl_err err;
    assert_int_equal(infer_sparse_create(&c, NULL, NULL, &sp, &err), 0);
    static const uint32_t bases[] = {100, 300, 600, 400};
    uint32_t h = 5, L, L2;
    float qs, qs2;
    for (uint32_t b = 0; b < 4; b++) {
        if (b == 3) { /* slots 400.. rewritten */
            assert_int_equal(infer_kv_truncate(kv, 400), 0);
            for (size_t i = 0; i < 300 * kv_dim; i++) {
                k[i] = test_rng_normal(&rng) * 2.0f;
                v[i] = test_rng_normal(&rng);
            }
            assert_int_equal(infer_kv_append(kv, k, v, 300), 0);
        }
        uint32_t base = bases[b], T = base + n;
        for (uint32_t layer = 0; layer < 2; layer++) {
            assert_int_equal(infer_sparse_create(&c, NULL, NULL, &fresh, &err), 0);
            if (attn_sparse_estimate(sp, kv, layer, q, n, base, h, est, &L, &qs, &err) < 0 ||
                attn_sparse_estimate(fresh, kv, layer, q, n, base, h, ref, &L2, &qs2, &err) < 0)
                fail_msg("estimate: %s", err.msg);
            assert_true(qs == qs2 && L >= T && L2 >= T);
            for (uint32_t i = 0; i < n; i++)
                if (memcmp(est + (size_t)i * L, ref + (size_t)i * L2, sizeof(float) * T))
                    fail_msg("base %u layer %u row %u: the estimates differ", base, layer, i);
            infer_sparse_destroy(fresh);
        }
    }
    infer_sparse_destroy(sp);
    infer_kv_destroy(kv);
    free(est);
    free(ref);
    free(k);
    free(v);
    free(q);
}

static void test_keep_all_is_dense(void **state)
{
    (void)state;
    struct format_config c = attn_ref_shape(8, 2, 32, 1024);
    uint32_t T = 600;
    struct infer_kv *kv = attn_ref_cache(&rng, &c, T);
    for (int inl = 0; inl < 2; inl++) {
        struct infer_sparse_opts o = {.keep = 1.0, .sinks = 4, .window = 16, .inline_npu = inl};
        attn_ref_keep_all(&rng, &c, kv, T, &o, 1.0f);
    }
    infer_kv_destroy(kv);
}

/* keep < 1: sparse attention (estimates on the device thread, or inline:
 * per head, as its rows pick their keys) against the reference: per head
 * its NPU estimate, the keys each row picks, infer_attn_list over them (the
 * dense kernel's selection path). T 3000:
 * a head's 30 rows of inline estimates (3072 keys, 369 KB) run in two
 * pieces (EST_PIECE_BYTES, attn_sparse_int.h); T 3007 with no recent
 * window: a piece's last keys (up to 15 past a 16-key boundary) are picked
 * by their estimates alone, so a piece that estimated too few keys fails */
static void sparse_reference(int inl, uint32_t T, uint32_t window)
{
    struct format_config c = attn_ref_shape(8, 2, 32, 4096);
    uint32_t n = 30, base = T - n, hd = c.head_dim, H = c.n_heads;
    size_t qdim = (size_t)H * hd;
    struct infer_kv *kv = attn_ref_cache(&rng, &c, T);
    float *q = attn_ref_q(&rng, &c, n, 1.0f), *os = malloc(sizeof(float) * n * qdim);
    struct infer_sparse_opts o = {.keep = 0.15, .sinks = 3, .window = window, .inline_npu = inl};
    struct infer_sparse *sp, *sp2;
    struct sl_err err;
    assert_int_equal(infer_sparse_create(&c, NULL, &o, &sp, &err), 0);
    assert_int_equal(infer_sparse_create(&c, NULL, &o, &sp2, &err), 0);
    attn_ref_run(infer_sparse_attention(sp), &c, kv, 0, n, base, q, os);
    float *est = malloc(sizeof(float) * n * (T + 256)), *a = malloc(sizeof(float) * T),
          *gather = malloc(sizeof(float) * T * hd), out[64];
    uint32_t *sel = malloc(sizeof(uint32_t) * T), *work = malloc(sizeof(uint32_t) * 2 * T);
    size_t kv_dim = (size_t)c.n_kv_heads * hd;
    for (uint32_t h = 0; h < H; h++) {
        uint32_t L;
        float qs;
        /* sp2 saw no call before: its bucket grid is centred the same way */
        assert_int_equal(attn_sparse_estimate(sp2, kv, 0, q, n, base, h, est, &L, &qs, &err), 0);
        for (uint32_t i = 0; i < n; i++) {
            uint32_t vis = base + i + 1, k = attn_keep_count(0.15, vis);
            uint32_t m = attn_select_row(est + (size_t)i * L, vis, k, 3, window, sel, work);
            uint32_t g = h / (H / c.n_kv_heads);
            infer_attn_list(out, q + i * qdim + (size_t)h * hd,
                            infer_kv_keys(kv, 0) + (size_t)g * hd,
                            infer_kv_values(kv, 0) + (size_t)g * hd, kv_dim, hd, sel, m, a,
                            gather);
            if (memcmp(out, os + i * qdim + (size_t)h * hd, sizeof(float) * hd))
                fail_msg("head %u row %u: k %u m %u out %g vs %g", h, i, k, m, out[0],
                         os[i * qdim + (size_t)h * hd]);
        }
    }
    struct infer_sparse_stats st;
    infer_sparse_stats(sp, &st);
    assert_true(st.keys_kept < st.keys_visible / 5);
    infer_sparse_destroy(sp);
    infer_sparse_destroy(sp2);
    infer_kv_destroy(kv);
    free(q);
    free(os);
    free(est);
    free(a);
    free(gather);
    free(sel);
    free(work);
}

static void test_sparse_reference(void **state)
{
    (void)state;
    sparse_reference(0, 530, 10);
    sparse_reference(1, 530, 10);
    sparse_reference(1, 3000, 10);
    sparse_reference(1, 3007, 0);
}

/* the greedy plan against every order of up to 4 launches (1 head each)
 * and every pipeline: it is a heuristic, so only sanity: never worse than
 * the worst order, and exact for the one-launch case */
static double simulate(uint32_t n, const uint32_t *ord, const double *tn, const double *tk,
                       const double *tq)
{
    double a = 0, b = 0, c = 0;
    for (uint32_t i = 0; i < n; i++) {
        a += tn[ord[i]];
        b = fmax(a, b) + tk[ord[i]];
        c = fmax(c, b) + tq[ord[i]];
    }
    return c;
}

static void test_plan(void **state)
{
    (void)state;
    for (int it = 0; it < 200; it++) {
        uint32_t n = 1 + test_rng_below(&rng, 4), cnt[4], order[4];
        uint32_t head[4][ATTN_PLAN_MAX];
        double tn[4], tk[4], tq[4];
        for (uint32_t i = 0; i < n; i++) {
            cnt[i] = 1;
            head[i][0] = i;
            tn[i] = 1 + test_rng_below(&rng, 10);
            tk[i] = 1 + test_rng_below(&rng, 10);
            tq[i] = 1 + test_rng_below(&rng, 10);
        }
        double planned = attn_plan(n, tn, cnt, head, tk, tq, order);
        assert_true(fabs(simulate(n, order, tn, tk, tq) - planned) < 1e-9);
        double worst = 0;
        uint32_t perm[4] = {0, 1, 2, 3};
        /* every permutation (Heap's algorithm is overkill for n <= 4) */
        for (uint32_t p = 0; p < 24; p++) {
            uint32_t x[4], used = 0, q = p, ok = 1;
            for (uint32_t i = 0; i < n; i++) {
                uint32_t r = q % (n - i);
                q /= (n - i);
                uint32_t j = 0;
                for (;; j++)
                    if (!(used & (1u << j)) && r-- == 0)
                        break;
                used |= 1u << j;
                x[i] = perm[j];
            }
            if (ok)
                worst = fmax(worst, simulate(n, x, tn, tk, tq));
        }
        assert_true(planned <= worst + 1e-9);
    }
}

/* the cold-start pipeline against the batched forward, sparse attention on
 * both (a fresh instance each: the same calls see the same buckets) */
static void test_pipeline_identical(void **state)
{
    (void)state;
    char path[4096];
    snprintf(path, sizeof path, "%s/tiny.sluice", test_tmpdir());
    struct sl_err err;
    if (import_synth("tiny", 7, path, NULL, NULL, &err) < 0)
        fail_msg("synth: %s", err.msg);
    struct format_reader *r;
    assert_int_equal(format_reader_open(path, &r, &err), 0);
    struct format_config c = *format_reader_config(r);
    format_reader_close(r);
    uint32_t n = c.seq_len < 300 ? c.seq_len : 300, chunk = 64;
    int *ids = malloc(sizeof(int) * n);
    for (uint32_t i = 0; i < n; i++)
        ids[i] = i == 0 ? 1 : 3 + (int)((i * 2654435761u) % (c.vocab_size - 3));
    size_t V = c.vocab_size;
    float *l1 = malloc(sizeof(float) * V), *l2 = malloc(sizeof(float) * V);
    struct infer_sparse_opts o = {.keep = 0.3, .sinks = 2, .window = 8};
    struct infer_sparse *s1, *s2;
    assert_int_equal(infer_sparse_create(&c, NULL, &o, &s1, &err), 0);
    assert_int_equal(infer_sparse_create(&c, NULL, &o, &s2, &err), 0);
    struct infer_pipeline_opts po;
    infer_pipeline_opts_init(&po);
    po.chunk = chunk;
    po.attn = infer_sparse_attention(s1);
    struct infer_model *m;
    struct infer_state *st;
    if (infer_pipeline_prefill(path, ids, n, &po, &m, &st, l1, NULL, &err) < 0)
        fail_msg("pipeline: %s", err.msg);
    infer_state_destroy(st);
    struct infer_state *st2;
    assert_int_equal(infer_state_create(m, chunk, &st2, &err), 0);
    infer_state_set_attention(st2, infer_sparse_attention(s2));
    assert_int_equal(infer_forward(m, st2, ids, n, 0, l2, INFER_LOGITS_LAST, &err), 0);
    assert_memory_equal(l1, l2, sizeof(float) * V);
    struct infer_sparse_stats a, b;
    infer_sparse_stats(s1, &a);
    infer_sparse_stats(s2, &b);
    assert_true(a.keys_kept < a.keys_visible && a.keys_kept == b.keys_kept);
    /* and the dense logits differ (sparse attention really ran) */
    infer_state_set_attention(st2, NULL);
    assert_int_equal(infer_forward(m, st2, ids, n, 0, l2, INFER_LOGITS_LAST, &err), 0);
    assert_true(memcmp(l1, l2, sizeof(float) * V) != 0);
    infer_state_destroy(st2);
    infer_model_destroy(m);
    infer_sparse_destroy(s1);
    infer_sparse_destroy(s2);
    free(ids);
    free(l1);
    free(l2);
}

/* min_keys and max_rows: calls outside run the dense implementation */
static void test_dense_fallback(void **state)
{
    (void)state;
    struct format_config c = attn_ref_shape(8, 2, 32, 1024);
    uint32_t T = 300;
    size_t qdim = (size_t)c.n_heads * c.head_dim;
    struct infer_kv *kv = attn_ref_cache(&rng, &c, T);
    struct infer_sparse_opts o = {.keep = 0.1, .window = 4, .min_keys = 200, .max_rows = 1};
    struct infer_sparse *sp;
    struct sl_err err;
    assert_int_equal(infer_sparse_create(&c, NULL, &o, &sp, &err), 0);
    float *q = attn_ref_q(&rng, &c, 20, 1.0f), *od = malloc(sizeof(float) * 20 * qdim),
          *os = malloc(sizeof(float) * 20 * qdim);
    /* 20 rows: over max_rows; 1 row over 100 keys: under min_keys; both dense */
    attn_ref_run(&infer_attention_dense, &c, kv, 0, 20, T - 20, q, od);
    attn_ref_run(infer_sparse_attention(sp), &c, kv, 0, 20, T - 20, q, os);
    assert_memory_equal(od, os, sizeof(float) * 20 * qdim);
    attn_ref_run(&infer_attention_dense, &c, kv, 0, 1, 99, q, od);
    attn_ref_run(infer_sparse_attention(sp), &c, kv, 0, 1, 99, q, os);
    assert_memory_equal(od, os, sizeof(float) * qdim);
    struct infer_sparse_stats st;
    infer_sparse_stats(sp, &st);
    assert_int_equal(st.dense_calls, 2);
    /* 1 row over 300 keys: sparse, a tenth of them */
    attn_ref_run(infer_sparse_attention(sp), &c, kv, 0, 1, T - 1, q, os);
    infer_sparse_stats(sp, &st);
    assert_int_equal(st.calls, 3);
    assert_int_equal(st.dense_calls, 2);
    assert_int_equal(st.keys_kept, (uint64_t)c.n_heads * 30);
    infer_sparse_destroy(sp);
    infer_kv_destroy(kv);
    free(q);
    free(od);
    free(os);
}

/* ---- the profile: run on a synthetic model, stored in a container's
 * metadata, read back; a key of the wrong size refused by name ---- */

struct meta_ctx {
    struct format_writer *w;
    struct sl_err *err;
    const char *corrupt; /* this key is written one byte short */
};

static int set_meta(void *ctx, const char *key, const void *v, size_t len)
{
    struct meta_ctx *m = ctx;
    if (m->corrupt && !strcmp(key, m->corrupt))
        len--;
    return format_writer_set_meta(m->w, key, v, len, m->err);
}

static void copy_with_profile(const char *src, const char *dst,
                              const struct infer_attn_profile *p, const char *corrupt)
{
    struct sl_err err;
    struct format_reader *r;
    struct format_writer *w;
    assert_int_equal(format_reader_open(src, &r, &err), 0);
    assert_int_equal(format_writer_create(dst, &w, &err), 0);
    assert_int_equal(format_writer_set_config(w, format_reader_config(r), &err), 0);
    assert_int_equal(format_writer_set_tokenizer(w, format_reader_tokenizer(r), &err), 0);
    struct meta_ctx m = {w, &err, corrupt};
    assert_int_equal(infer_attn_profile_write(p, set_meta, &m), 0);
    for (uint32_t i = 0; i < format_reader_n_tensors(r); i++) {
        const struct format_tensor_info *t = format_reader_tensor(r, i);
        void *raw = malloc(t->length);
        assert_int_equal(format_reader_read_tensor(r, i, raw, t->length, &err), 0);
        struct format_tensor_desc d = {.name = t->name, .layer = t->layer, .role = t->role,
                                       .encoding = t->encoding, .n_dims = t->n_dims,
                                       .act_scale = t->act_scale};
        memcpy(d.shape, t->shape, sizeof d.shape);
        memcpy(d.bits_hist, t->bits_hist, sizeof d.bits_hist);
        assert_int_equal(format_writer_add_tensor(w, &d, raw, t->length, &err), 0);
        free(raw);
    }
    assert_int_equal(format_writer_finish(w, &err), 0);
    format_writer_destroy(w);
    format_reader_close(r);
}

static void test_profile(void **state)
{
    (void)state;
    char path[4096], out[4096];
    snprintf(path, sizeof path, "%s/tiny-prof.sluice", test_tmpdir());
    snprintf(out, sizeof out, "%s/tiny-prof-attn.sluice", test_tmpdir());
    struct sl_err err;
    if (import_synth("tiny", 3, path, NULL, NULL, &err) < 0)
        fail_msg("synth: %s", err.msg);
    struct infer_model *m;
    assert_int_equal(infer_model_load(path, NULL, &m, &err), 0);
    const struct format_config cfg = *infer_model_config(m), *c = &cfg; /* outlives m */
    uint32_t n = 256;
    int *ids = malloc(sizeof(int) * n);
    for (uint32_t i = 0; i < n; i++)
        ids[i] = 3 + (int)((i * 2654435761u) % (c->vocab_size - 3));
    struct infer_attn_profile_opts po = {.chunk_tokens = 128, .batch = 64, .keep = 0.25};
    struct infer_attn_profile *p;
    if (infer_attn_profile_run(m, ids, n, &po, &p, &err) < 0)
        fail_msg("profile: %s", err.msg);
    uint32_t LH = c->n_layers * c->n_heads;
    double mean = 0;
    for (uint32_t i = 0; i < LH; i++) {
        assert_true(isfinite(p->head_imp[i]) && p->q_scale[i] > 0);
        mean += p->keep_ratio[i];
    }
    assert_true(fabs(mean / LH - 0.25) < 1e-3);
    assert_int_equal(p->calib_tokens, 256);
    assert_int_equal(p->buckets, 9);
    /* zeroing every head of a layer costs more than zeroing one (a trained
     * model's property; random weights only make it likely, so: finite) */
    assert_true(isfinite(p->layer_imp[0]) && isfinite(p->loss) && p->loss > 0);
    /* too few tokens: a sentence, not a crash */
    struct infer_attn_profile *q = NULL;
    assert_int_equal(infer_attn_profile_run(m, ids, 100, &po, &q, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "fewer than one chunk"));
    infer_model_destroy(m);

    copy_with_profile(path, out, p, NULL);
    struct format_reader *r;
    assert_int_equal(format_reader_open(out, &r, &err), 0);
    assert_int_equal(infer_attn_profile_read(r, &q, &err), 0);
    assert_memory_equal(q->head_imp, p->head_imp, sizeof(float) * LH);
    assert_memory_equal(q->layer_imp, p->layer_imp, sizeof(float) * c->n_layers);
    assert_memory_equal(q->q_scale, p->q_scale, sizeof(float) * LH);
    assert_memory_equal(q->keep_ratio, p->keep_ratio, sizeof(float) * LH);
    assert_true(q->keep == p->keep && q->step == p->step && q->buckets == p->buckets &&
                q->loss == p->loss && q->cost_topk == p->cost_topk);
    infer_attn_profile_destroy(q);
    format_reader_close(r);
    /* the model without a profile: -ENOENT */
    assert_int_equal(format_reader_open(path, &r, &err), 0);
    assert_int_equal(infer_attn_profile_read(r, &q, &err), -ENOENT);
    format_reader_close(r);
    /* a key one byte short: -EINVAL naming it */
    copy_with_profile(path, out, p, "attn.q_scale");
    assert_int_equal(format_reader_open(out, &r, &err), 0);
    assert_int_equal(infer_attn_profile_read(r, &q, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "attn.q_scale"));
    format_reader_close(r);
    infer_attn_profile_destroy(p);
    free(ids);
}

static void test_bad_options(void **state)
{
    (void)state;
    struct format_config c = attn_ref_shape(8, 2, 32, 128);
    struct infer_sparse *sp = NULL;
    struct sl_err err;
    struct infer_sparse_opts o = {.keep = 1.5};
    assert_int_equal(infer_sparse_create(&c, NULL, &o, &sp, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "keep ratio"));
    o = (struct infer_sparse_opts){.keep = 0.5, .floor_share = 2};
    assert_int_equal(infer_sparse_create(&c, NULL, &o, &sp, &err), -EINVAL);
    assert_null(sp);
}

int main(void)
{
    test_rng_init(&rng, test_seed());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_topk),
        cmocka_unit_test(test_select_row),
        cmocka_unit_test(test_select_row_small_k),
        cmocka_unit_test(test_ratios),
        cmocka_unit_test(test_estimate),
        cmocka_unit_test(test_estimate_grown),
        cmocka_unit_test(test_keep_all_is_dense),
        cmocka_unit_test(test_sparse_reference),
        cmocka_unit_test(test_plan),
        cmocka_unit_test(test_pipeline_identical),
        cmocka_unit_test(test_dense_fallback),
        cmocka_unit_test(test_profile),
        cmocka_unit_test(test_bad_options),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

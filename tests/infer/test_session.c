/* test_session.c: the front end's seams. The KV cache's append, truncate,
 * commit and int8 mirror against hand-computed contents; the batched forward
 * (a chain in one call equals the same tokens one by one, bit for bit, float
 * weights); draft
 * trees (every tree row's logits equal plain decoding of its path, bit for
 * bit, and committing an accepted path leaves the cache exactly as plain
 * decoding would); the dense attention with tree masks and key selections
 * against a double-precision reference; the linear path's clipped
 * excess; sessions (NPU-shared decode identical to the calling thread
 * alone, two sessions sharing one model, rewind). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "import.h"
#include "infer_internal.h"
#include "npu.h"
#include "quantizer.h"
#include "testutil.h"
#include "tiny_q5.h"

static char float_model[4096], q_model[4096];

static int setup(void **st)
{
    (void)st;
    return tiny_q5_models(5, float_model, q_model);
}

static int *ids(uint32_t n, uint32_t vocab, uint32_t salt)
{
    int *t = malloc(sizeof(int) * n);
    assert_non_null(t);
    for (uint32_t i = 0; i < n; i++)
        t[i] = i == 0 ? 1 : 3 + (int)((i * 2654435761u + salt) % (vocab - 3));
    return t;
}

/* ---- the KV cache ---------------------------------------------------------------- */

static void fill_rows(float *k, float *v, uint32_t n, uint32_t kv_dim, float base)
{
    for (uint32_t r = 0; r < n; r++)
        for (uint32_t j = 0; j < kv_dim; j++) {
            k[r * kv_dim + j] = base + (float)r + (float)j / 100.0f;
            v[r * kv_dim + j] = -(base + (float)r) - (float)j / 100.0f;
        }
}

static void test_kv(void **st)
{
    (void)st;
    struct format_config c = {.n_layers = 2, .n_kv_heads = 2, .head_dim = 4, .n_heads = 4,
                              .seq_len = 16, .dim = 16};
    struct sl_err err;
    struct infer_kv *kv;
    assert_int_equal(infer_kv_create(&c, 17, 0, &kv, &err), -EINVAL);
    assert_int_equal(infer_kv_create(&c, 0, INFER_KV_K8, &kv, &err), 0);
    assert_int_equal(infer_kv_capacity(kv), 16);
    /* keys and values start on a cache line (16 slots x 8 floats a layer:
     * every layer's too), so the attention kernels' loads do not straddle */
    for (uint32_t l = 0; l < 2; l++) {
        assert_int_equal((uintptr_t)infer_kv_keys(kv, l) % 64, 0);
        assert_int_equal((uintptr_t)infer_kv_values(kv, l) % 64, 0);
    }
    const uint32_t W = 8;
    float k[6 * 8], v[6 * 8];
    uint32_t pos[6] = {3, 4, 5, 5, 6, 7};
    assert_int_equal(infer_kv_reserve(kv, 6, pos, 0), 0);
    for (uint32_t l = 0; l < 2; l++) {
        fill_rows(k, v, 6, W, 10.0f * (float)(l + 1));
        infer_kv_write(kv, l, 0, 6, k, v, 0, 2);
    }
    assert_int_equal(infer_kv_len(kv), 6);
    assert_int_equal(infer_kv_pos(kv, 3), 5);
    /* the int8 mirror: per slot and head, scale max|k| / 127 */
    const int8_t *k8 = infer_kv_keys_i8(kv, 1);
    const float *ks = infer_kv_keys_i8_scale(kv, 1);
    const float *kf = infer_kv_keys(kv, 1);
    for (uint32_t s = 0; s < 6; s++)
        for (uint32_t h = 0; h < 2; h++) {
            float amax = 0;
            for (uint32_t j = 0; j < 4; j++)
                amax = fmaxf(amax, fabsf(kf[s * W + h * 4 + j]));
            assert_float_equal(ks[s * 2 + h], amax / 127.0f, 1e-7);
            for (uint32_t j = 0; j < 4; j++) {
                float want = rintf(kf[s * W + h * 4 + j] / ks[s * 2 + h]);
                assert_true(fabsf((float)k8[s * W + h * 4 + j] - want) <= 1.0f);
            }
        }
    /* commit slots 2, 4, 5 after base 1: they become 1, 2, 3 */
    float before[6 * 8];
    memcpy(before, infer_kv_values(kv, 0), sizeof before);
    const uint32_t bad1[] = {2, 2}, bad2[] = {0, 3}, bad3[] = {3, 6};
    assert_int_equal(infer_kv_commit(kv, 1, bad1, 2), -EINVAL);
    assert_int_equal(infer_kv_commit(kv, 1, bad2, 2), -EINVAL);
    assert_int_equal(infer_kv_commit(kv, 1, bad3, 2), -EINVAL);
    assert_int_equal(infer_kv_len(kv), 6); /* nothing changed */
    const uint32_t keep[] = {2, 4, 5};
    assert_int_equal(infer_kv_commit(kv, 1, keep, 3), 0);
    assert_int_equal(infer_kv_len(kv), 4);
    const float *after = infer_kv_values(kv, 0);
    assert_memory_equal(after, before, W * sizeof(float)); /* slot 0 stays */
    for (uint32_t i = 0; i < 3; i++)
        assert_memory_equal(after + (1 + i) * W, before + keep[i] * W, W * sizeof(float));
    assert_int_equal(infer_kv_pos(kv, 1), 5);
    assert_int_equal(infer_kv_pos(kv, 3), 7);
    assert_int_equal(infer_kv_truncate(kv, 5), -EINVAL);
    assert_int_equal(infer_kv_truncate(kv, 2), 0);
    assert_int_equal(infer_kv_len(kv), 2);
    assert_int_equal(infer_kv_reserve(kv, 15, NULL, 0), -ENOSPC);
    infer_kv_destroy(kv);
    infer_kv_destroy(NULL);
    /* a cache large enough to be mapped on its own (malloc puts it 16
     * bytes past a page's start): still on a cache line */
    struct format_config big = c;
    big.head_dim = 16;
    big.seq_len = 1024;
    assert_int_equal(infer_kv_create(&big, 0, 0, &kv, &err), 0);
    for (uint32_t l = 0; l < 2; l++) {
        assert_int_equal((uintptr_t)infer_kv_keys(kv, l) % 64, 0);
        assert_int_equal((uintptr_t)infer_kv_values(kv, l) % 64, 0);
    }
    infer_kv_destroy(kv);
}

/* ---- the batched forward ------------------------------------------------------------ */

/* The first n slots of two states' caches hold the same bits, every layer. */
static void same_cache(const struct format_config *c, struct infer_state *a,
                       struct infer_state *b, uint32_t n)
{
    size_t w = (size_t)n * c->n_kv_heads * c->head_dim * sizeof(float);
    for (uint32_t l = 0; l < c->n_layers; l++) {
        assert_memory_equal(infer_kv_keys(infer_state_kv(a), l), infer_kv_keys(infer_state_kv(b), l), w);
        assert_memory_equal(infer_kv_values(infer_state_kv(a), l),
                            infer_kv_values(infer_state_kv(b), l), w);
    }
}

/* One call of n rows against n calls of one row: the same logits, bit for bit. */
static void chain_split(const char *path)
{
    struct sl_err err = {{0}};
    struct infer_model *m;
    assert_int_equal(infer_model_load(path, NULL, &m, &err), 0);
    const struct format_config *c = infer_model_config(m);
    uint32_t V = c->vocab_size, n = 40;
    int *t = ids(n, V, 7);
    struct infer_state *a, *b;
    assert_int_equal(infer_state_create(m, 16, &a, &err), 0); /* n > max_batch */
    assert_int_equal(infer_state_create(m, 1, &b, &err), 0);
    float *la = malloc(sizeof(float) * V * n), *lb = malloc(sizeof(float) * V);
    uint32_t *rows = malloc(sizeof *rows * n);
    for (uint32_t i = 0; i < n; i++)
        rows[i] = i;
    struct infer_batch bat = {.n = n, .tokens = t, .logits_rows = rows, .n_logits = n};
    /* every row's logits needs a head over single rows for dynamic scales to
     * match: ask per row in a chain of one-row calls */
    for (uint32_t i = 0; i < n; i++) {
        struct infer_batch one = {.n = 1, .tokens = t + i, .logits_rows = rows, .n_logits = 1};
        assert_int_equal(infer_forward_batch(m, b, &one, lb, &err), 0);
    }
    assert_int_equal(infer_kv_len(infer_state_kv(b)), n);
    uint32_t last = n - 1;
    bat.logits_rows = &last;
    bat.n_logits = 1;
    assert_int_equal(infer_forward_batch(m, a, &bat, la, &err), 0);
    assert_memory_equal(la, lb, sizeof(float) * V);
    /* and the caches agree slot for slot */
    same_cache(c, a, b, n);
    /* errors: parents that are not earlier rows, logits rows out of order,
     * past the context; the cache is left as it was */
    int32_t par[2] = {0, -1};
    struct infer_batch badp = {.n = 2, .tokens = t, .parent = par};
    assert_int_equal(infer_forward_batch(m, a, &badp, la, &err), -EINVAL);
    uint32_t lr[2] = {1, 0};
    struct infer_batch badl = {.n = 2, .tokens = t, .logits_rows = lr, .n_logits = 2};
    assert_int_equal(infer_forward_batch(m, a, &badl, la, &err), -EINVAL);
    int badtok[2] = {1, (int)V};
    struct infer_batch badt = {.n = 2, .tokens = badtok};
    assert_int_equal(infer_forward_batch(m, a, &badt, la, &err), -EINVAL);
    assert_int_equal(infer_kv_len(infer_state_kv(a)), n);
    free(la);
    free(lb);
    free(rows);
    free(t);
    infer_state_destroy(a);
    infer_state_destroy(b);
    infer_model_destroy(m);
}

static void test_chain(void **st)
{
    (void)st;
    /* float weights (int8 with dynamic activation scales shares one scale
     * across a batch, so only static scales split freely: test_pipeline) */
    chain_split(float_model);
}

/* A tree after a prompt: row parents and positions; each row's logits equal
 * plain decoding of its path; committing one path equals plain decoding's
 * cache. */
static void tree_vs_plain(const char *path)
{
    struct sl_err err = {{0}};
    struct infer_model *m;
    assert_int_equal(infer_model_load(path, NULL, &m, &err), 0);
    const struct format_config *c = infer_model_config(m);
    uint32_t V = c->vocab_size, np = 20;
    int *p = ids(np, V, 3);
    /*        row: 0  1  2  3  4  5  6
     *     parent:-1  0  0  1  3 -1  5     two roots, branches at row 0 */
    const int32_t parent[7] = {-1, 0, 0, 1, 3, -1, 5};
    const int tok[7] = {40, 41, 42, 43, 44, 45, 46};
    uint32_t pos[7], rows[7];
    for (uint32_t i = 0; i < 7; i++) {
        uint32_t d = 0;
        for (int32_t r = (int32_t)i; r >= 0; r = parent[r])
            d++;
        pos[i] = np + d - 1;
        rows[i] = i;
    }
    struct infer_state *s;
    assert_int_equal(infer_state_create(m, 16, &s, &err), 0);
    float *lt = malloc(sizeof(float) * V * 7), *lp = malloc(sizeof(float) * V);
    assert_int_equal(infer_forward(m, s, p, np, 0, lp, INFER_LOGITS_LAST, &err), 0);
    struct infer_batch tree = {.n = 7, .tokens = tok, .pos = pos, .parent = parent,
                               .logits_rows = rows, .n_logits = 7};
    /* float weights: a row's bits do not depend on its batch (int8 with
     * dynamic activation scales would share one scale across the batch) */
    assert_false(infer_model_is_quantized(m));
    struct infer_state *plain;
    assert_int_equal(infer_state_create(m, 16, &plain, &err), 0);
    assert_int_equal(infer_forward_batch(m, s, &tree, lt, &err), 0);
    assert_int_equal(infer_kv_len(infer_state_kv(s)), np + 7);
    for (uint32_t i = 0; i < 7; i++) {
        /* the path root..i, decoded plainly after the prompt */
        int path_tok[8];
        uint32_t d = 0;
        for (int32_t r = (int32_t)i; r >= 0; r = parent[r])
            d++;
        uint32_t at = d;
        for (int32_t r = (int32_t)i; r >= 0; r = parent[r])
            path_tok[--at] = tok[r];
        assert_int_equal(infer_forward(m, plain, p, np, 0, lp, INFER_LOGITS_LAST, &err), 0);
        for (uint32_t j = 0; j < d; j++)
            assert_int_equal(infer_forward(m, plain, &path_tok[j], 1, np + j, lp,
                                           INFER_LOGITS_LAST, &err), 0);
        assert_memory_equal(lt + (size_t)i * V, lp, sizeof(float) * V);
    }
    {
        /* accept the path 0 -> 1 -> 3 -> 4: the cache equals plain decoding's */
        const uint32_t acc[4] = {np + 0, np + 1, np + 3, np + 4};
        assert_int_equal(infer_kv_commit(infer_state_kv(s), np, acc, 4), 0);
        const int path_tok[4] = {40, 41, 43, 44};
        assert_int_equal(infer_forward(m, plain, p, np, 0, lp, INFER_LOGITS_LAST, &err), 0);
        assert_int_equal(infer_forward(m, plain, path_tok, 4, np, lp, INFER_LOGITS_LAST, &err),
                         0);
        same_cache(c, s, plain, np + 4);
        for (uint32_t i = 0; i < np + 4; i++)
            assert_int_equal(infer_kv_pos(infer_state_kv(s), i), i);
        /* decoding on from the committed cache: the same next logits */
        float *l2 = malloc(sizeof(float) * V);
        int nx = 50;
        assert_int_equal(infer_forward(m, s, &nx, 1, np + 4, l2, INFER_LOGITS_LAST, &err), 0);
        assert_int_equal(infer_forward(m, plain, &nx, 1, np + 4, lp, INFER_LOGITS_LAST, &err),
                         0);
        assert_memory_equal(l2, lp, sizeof(float) * V);
        free(l2);
    }
    free(lt);
    free(lp);
    free(p);
    infer_state_destroy(s);
    infer_state_destroy(plain);
    infer_model_destroy(m);
}

static void test_tree(void **st)
{
    (void)st;
    tree_vs_plain(float_model);
}

/* ---- dense attention against a double-precision reference --------------------------- */

static void attn_ref(double *out, const float *q, const float *kc, const float *vc,
                     uint32_t kv_dim, uint32_t hs, uint32_t h, uint32_t kv_mul,
                     const uint32_t *list, uint32_t len)
{
    double *a = malloc(sizeof(double) * len), mx = -INFINITY, sum = 0;
    for (uint32_t j = 0; j < len; j++) {
        double d = 0;
        for (uint32_t c = 0; c < hs; c++)
            d += (double)q[h * hs + c] * kc[(size_t)list[j] * kv_dim + (h / kv_mul) * hs + c];
        a[j] = d / sqrt((double)hs);
        mx = fmax(mx, a[j]);
    }
    for (uint32_t j = 0; j < len; j++)
        sum += (a[j] = exp(a[j] - mx));
    for (uint32_t c = 0; c < hs; c++) {
        double o = 0;
        for (uint32_t j = 0; j < len; j++)
            o += a[j] / sum * vc[(size_t)list[j] * kv_dim + (h / kv_mul) * hs + c];
        out[c] = o;
    }
    free(a);
}

static void test_attention_masks(void **st)
{
    (void)st;
    struct test_rng rng;
    test_rng_init(&rng, test_seed());
    struct format_config c = {.n_layers = 1, .n_heads = 4, .n_kv_heads = 2, .head_dim = 16,
                              .seq_len = 64, .dim = 64};
    struct sl_err err;
    struct infer_kv *kv;
    assert_int_equal(infer_kv_create(&c, 0, 0, &kv, &err), 0);
    const uint32_t base = 23, n = 6, kvd = 32, qd = 64;
    float k[29 * 32], v[29 * 32], q[6 * 64], out[6 * 64];
    for (uint32_t i = 0; i < (base + n) * kvd; i++) {
        k[i] = test_rng_normal(&rng);
        v[i] = test_rng_normal(&rng);
    }
    for (uint32_t i = 0; i < n * qd; i++)
        q[i] = test_rng_normal(&rng);
    assert_int_equal(infer_kv_reserve(kv, base + n, NULL, 0), 0);
    infer_kv_write(kv, 0, 0, base + n, k, v, 0, 2);
    float *scratch = malloc(sizeof(float) * INFER_ATT_ROWS * (base + n));
    const int32_t parent[6] = {-1, 0, 0, 2, -1, 4};
    uint32_t list[64];
    /* chain, tree, selection */
    for (int mode = 0; mode < 3; mode++) {
        uint32_t sel[6 * 4 * 8], nsel[6 * 4];
        struct infer_attn_rows r = {.n = n, .base = base, .parent = mode == 1 ? parent : NULL};
        if (mode == 2) {
            for (uint32_t i = 0; i < n * 4; i++) {
                uint32_t cnt = 0, lim = base + i / 4 + 1;
                for (uint32_t s = 0; s < lim && cnt < 8; s++)
                    if (s < 2 || test_rng_below(&rng, 3) == 0)
                        sel[i * 8 + cnt++] = s;
                nsel[i] = cnt;
            }
            r.sel = sel;
            r.n_sel = nsel;
            r.sel_stride = 8;
        }
        memset(out, 0, sizeof out);
        assert_int_equal(infer_attention_dense.run(&infer_attention_dense, &c, kv, 0, &r, q, 0,
                                                   4, out, scratch),
                         0);
        for (uint32_t i = 0; i < n; i++)
            for (uint32_t h = 0; h < 4; h++) {
                uint32_t len = 0;
                const uint32_t *l = list;
                if (mode == 2) {
                    l = sel + (i * 4 + h) * 8;
                    len = nsel[i * 4 + h];
                } else if (mode == 1) {
                    for (uint32_t s = 0; s < base; s++)
                        list[len++] = s;
                    uint32_t anc[8], na = 0;
                    for (int32_t x = (int32_t)i; x >= 0; x = parent[x])
                        anc[na++] = base + (uint32_t)x;
                    while (na)
                        list[len++] = anc[--na];
                } else {
                    for (uint32_t s = 0; s <= base + i; s++)
                        list[len++] = s;
                }
                double ref[16];
                attn_ref(ref, q + i * qd, k, v, kvd, 16, h, 2, l, len);
                for (uint32_t cc = 0; cc < 16; cc++)
                    assert_true(fabs(out[i * qd + h * 16 + cc] - ref[cc]) <= 1e-5 + 1e-5 * fabs(ref[cc]));
            }
    }
    free(scratch);
    infer_kv_destroy(kv);
}

/* ---- the linear path: what the quantizer clipped ------------------------------------ */

static void test_clipped(void **st)
{
    (void)st;
    struct infer_state s = {0};
    float x[2 * 5] = {0.5f, 130.0f, -200.0f, 126.9f, NAN, -127.4f, 127.6f, 0, 1000, -1};
    int8_t xq[10];
    struct infer_clipped c;
    assert_int_equal(infer_quantize_clipped(&s, x, 2, 5, 1.0f, xq, &c), 0);
    assert_int_equal(c.n, 5);
    const uint32_t wr[5] = {0, 0, 1, 1, 1}, wc[5] = {1, 2, 0, 1, 3};
    const float we[5] = {3.0f, -73.0f, -0.4f, 0.6f, 873.0f};
    for (uint32_t i = 0; i < c.n; i++) {
        assert_int_equal(c.row[i], wr[i]);
        assert_int_equal(c.col[i], wc[i]);
        assert_float_equal(c.excess[i], we[i], 1e-4);
        /* NPU part plus excess restores x / s */
        assert_float_equal((float)xq[c.row[i] * 5 + c.col[i]] + c.excess[i],
                           x[c.row[i] * 5 + c.col[i]], 1e-4);
    }
    free(s.clip_row);
    free(s.clip_col);
    free(s.clip_excess);
}

struct term_count {
    uint32_t calls, layers_seen;
};

static int count_term(void *ctx, int layer, uint32_t role, const struct infer_clipped *clip,
                      float *y, uint32_t n, uint32_t rows)
{
    (void)role;
    (void)clip;
    (void)y;
    (void)n;
    (void)rows;
    struct term_count *t = ctx;
    t->calls++;
    t->layers_seen |= 1u << (layer + 1);
    return 0;
}

static void test_linear_term(void **st)
{
    (void)st;
    struct sl_err err = {{0}};
    struct infer_model *m;
    assert_int_equal(infer_model_load(q_model, NULL, &m, &err), 0);
    const struct format_config *c = infer_model_config(m);
    uint32_t V = c->vocab_size;
    int *t = ids(12, V, 1);
    struct infer_state *s;
    assert_int_equal(infer_state_create(m, 16, &s, &err), 0);
    float *a = malloc(sizeof(float) * V), *b = malloc(sizeof(float) * V);
    assert_int_equal(infer_forward(m, s, t, 12, 0, a, INFER_LOGITS_LAST, &err), 0);
    struct term_count tc = {0};
    infer_model_set_linear_term(m, count_term, &tc);
    assert_int_equal(infer_forward(m, s, t, 12, 0, b, INFER_LOGITS_LAST, &err), 0);
    /* a term that adds nothing changes nothing; it ran for every int8 linear */
    assert_memory_equal(a, b, sizeof(float) * V);
    assert_int_equal(tc.calls, c->n_layers * 7 + 1);
    assert_int_equal(tc.layers_seen, (1u << (c->n_layers + 1)) - 1);
    infer_model_set_linear_term(m, NULL, NULL);
    free(a);
    free(b);
    free(t);
    infer_state_destroy(s);
    infer_model_destroy(m);
}

/* ---- sessions ------------------------------------------------------------------------- */

struct collect {
    int tok[64];
    uint32_t n;
};

static int collect_tok(void *ctx, int token)
{
    struct collect *c = ctx;
    if (c->n < 64)
        c->tok[c->n++] = token;
    return 0;
}

static void test_sessions(void **st)
{
    (void)st;
    struct sl_err err = {{0}};
    struct infer_model *m;
    assert_int_equal(infer_model_load(q_model, NULL, &m, &err), 0);
    const struct format_config *c = infer_model_config(m);
    int *p = ids(30, c->vocab_size, 11);
    /* the calling thread alone, and with the NPU device taking half of every
     * matmul (a low threshold so the tiny model's matmuls go there) */
    struct infer_session_opts alone = {.max_batch = 16, .no_npu = 1};
    struct infer_session_opts npu = {.max_batch = 16, .npu_min_weights = 1};
    struct infer_session *s1, *s2;
    assert_int_equal(infer_session_create(m, &alone, &s1, &err), 0);
    assert_int_equal(infer_session_create(m, &npu, &s2, &err), 0);
    assert_int_equal(infer_session_prefill(s1, p, 30, &err), 0);
    assert_int_equal(infer_session_prefill(s2, p, 30, &err), 0);
    assert_memory_equal(infer_session_logits(s1), infer_session_logits(s2),
                        sizeof(float) * c->vocab_size);
    /* interleaved steps on two sessions sharing the model */
    struct collect g1 = {0}, g2 = {0};
    uint32_t n1, n2;
    for (int round = 0; round < 4; round++) {
        assert_int_equal(infer_session_generate(s1, 5, NULL, 0, collect_tok, &g1, &n1, &err), 0);
        assert_int_equal(infer_session_generate(s2, 5, NULL, 0, collect_tok, &g2, &n2, &err), 0);
        assert_int_equal(n1, 5);
        assert_int_equal(n2, 5);
    }
    assert_int_equal(g1.n, 20);
    assert_memory_equal(g1.tok, g2.tok, sizeof(int) * 20);
    struct infer_session_stats ss;
    infer_session_stats(s2, &ss);
    /* the device thread ran parts, or (a few rows: linear_s8_few) the calling
     * thread took back the parts it had not started */
    struct npu_device_stats ds;
    npu_device_stats(infer_session_state(s2)->dev, &ds);
    assert_true(ss.npu_jobs + ds.jobs_revoked > 0);
    assert_int_equal(ss.prompt_tokens, 30);
    infer_session_stats(s1, &ss);
    assert_int_equal(ss.npu_jobs, 0);
    /* rewind to the prompt and generate again: the same tokens (greedy) */
    assert_int_equal(infer_session_len(s1), 30 + 20); /* every token taken was run */
    assert_int_equal(infer_session_rewind(s1, 51, &err), -EINVAL);
    /* (the same batches as before: 16 + 14 rows; int8 with dynamic
     * activation scales shares a scale within a batch) */
    assert_int_equal(infer_session_rewind(s1, 16, &err), 0);
    assert_int_equal(infer_session_prefill(s1, p + 16, 14, &err), 0);
    struct collect g3 = {0};
    assert_int_equal(infer_session_generate(s1, 20, NULL, 0, collect_tok, &g3, &n1, &err), 0);
    assert_memory_equal(g1.tok, g3.tok, sizeof(int) * 20);
    /* a stop token ends generation: counted, not passed on */
    /* (the same batches as before: 16 + 14 rows; int8 with dynamic
     * activation scales shares a scale within a batch) */
    assert_int_equal(infer_session_rewind(s1, 16, &err), 0);
    assert_int_equal(infer_session_prefill(s1, p + 16, 14, &err), 0);
    struct collect g4 = {0};
    assert_int_equal(infer_session_generate(s1, 20, &g1.tok[3], 1, collect_tok, &g4, &n1, &err),
                     0);
    assert_int_equal(n1, 4);
    assert_int_equal(g4.n, 3);
    infer_session_destroy(s1);
    infer_session_destroy(s2);
    infer_session_destroy(NULL);
    free(p);
    infer_model_destroy(m);
}

/* The cold start's session: same first logits as infer_forward, and decode
 * on the kept NPU device equals the sequential runtime. */
static void test_cold_session(void **st)
{
    (void)st;
    struct sl_err err = {{0}};
    struct infer_model *m;
    assert_int_equal(infer_model_load(q_model, NULL, &m, &err), 0);
    const struct format_config *c = infer_model_config(m);
    uint32_t V = c->vocab_size;
    int *p = ids(50, V, 5);
    struct infer_state *s;
    assert_int_equal(infer_state_create(m, 32, &s, &err), 0);
    float *lg = malloc(sizeof(float) * V);
    assert_int_equal(infer_forward(m, s, p, 50, 0, lg, INFER_LOGITS_LAST, &err), 0);
    struct infer_session_opts so = {.max_batch = 32, .npu_min_weights = 1};
    struct infer_pipeline_opts po = {.chunk = 32, .steal_threshold = 5, .steal_ahead = 1.0};
    struct infer_session *sess;
    assert_int_equal(infer_session_cold_start(q_model, p, 50, &so, &po, &sess, NULL, &err), 0);
    assert_memory_equal(infer_session_logits(sess), lg, sizeof(float) * V);
    for (int i = 0; i < 8; i++) {
        int next = 60 + i;
        assert_int_equal(infer_forward(m, s, &next, 1, 50 + (uint32_t)i, lg, INFER_LOGITS_LAST,
                                       &err), 0);
        assert_int_equal(infer_session_step(sess, next, &err), 0);
        assert_memory_equal(infer_session_logits(sess), lg, sizeof(float) * V);
    }
    struct infer_session_stats ss;
    infer_session_stats(sess, &ss);
    struct npu_device_stats ds;
    npu_device_stats(infer_session_state(sess)->dev, &ds);
    assert_true(ss.npu_jobs + ds.jobs_revoked > 0); /* ran there, or taken back */
    assert_int_equal(ss.decoded, 8);
    infer_session_destroy(sess);
    free(lg);
    free(p);
    infer_state_destroy(s);
    infer_model_destroy(m);
}

/* The cold start opens the container (reads and decompresses its index)
 * once: from a path, once in all; from the caller's open reader, not at all
 * (po.reader; the model holds the reader, so the caller may close its own
 * first). The same logits and decode either way. Bad containers still fail
 * with their sentences, and a failed cold start leaves the caller's reader
 * open and whole. */
static void test_cold_opens_once(void **st)
{
    (void)st;
    struct sl_err err = {{0}};
    struct infer_session_opts so = {.max_batch = 32, .npu_min_weights = 1};
    struct infer_pipeline_opts po = {.chunk = 32, .steal_threshold = 5, .steal_ahead = 1.0};
    struct format_reader *r;
    assert_int_equal(format_reader_open(q_model, &r, &err), 0);
    uint32_t V = format_reader_config(r)->vocab_size;
    int *p = ids(40, V, 9);
    struct infer_session *a, *b;
    uint64_t n0 = format_reader_opens();
    assert_int_equal(infer_session_cold_start(q_model, p, 40, &so, &po, &a, NULL, &err), 0);
    assert_true(format_reader_opens() == n0 + 1); /* was 3 with sluice run's own */
    po.reader = r;
    assert_int_equal(infer_session_cold_start(q_model, p, 40, &so, &po, &b, NULL, &err), 0);
    assert_true(format_reader_opens() == n0 + 1);
    format_reader_close(r); /* b's model holds it on */
    assert_memory_equal(infer_session_logits(a), infer_session_logits(b), sizeof(float) * V);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(infer_session_step(a, 70 + i, &err), 0);
        assert_int_equal(infer_session_step(b, 70 + i, &err), 0);
        assert_memory_equal(infer_session_logits(a), infer_session_logits(b), sizeof(float) * V);
    }
    infer_session_destroy(a);
    infer_session_destroy(b);

    /* a failure after the reader was handed over: the caller's stays open */
    assert_int_equal(format_reader_open(q_model, &r, &err), 0);
    po.reader = r;
    uint32_t ctx = format_reader_config(r)->seq_len;
    int *longp = calloc(ctx + 1, sizeof *longp);
    assert_non_null(longp);
    memset(&err, 0, sizeof err);
    assert_true(infer_session_cold_start(q_model, longp, ctx + 1, &so, &po, &b, NULL, &err) < 0);
    assert_non_null(strstr(err.msg, "does not fit the context"));
    assert_int_equal(format_reader_config(r)->vocab_size, V);
    format_reader_close(r);
    free(longp);

    /* bad containers, from a path: their own sentences, nothing opened */
    char bad[4200];
    snprintf(bad, sizeof bad, "%s/not-a-container.sluice", test_tmpdir());
    FILE *f = fopen(bad, "wb");
    assert_non_null(f);
    for (int i = 0; i < 4096; i++)
        fputc('x', f);
    assert_int_equal(fclose(f), 0);
    po.reader = NULL;
    uint64_t n1 = format_reader_opens();
    memset(&err, 0, sizeof err);
    assert_true(infer_session_cold_start(bad, p, 40, &so, &po, &b, NULL, &err) < 0);
    assert_non_null(strstr(err.msg, "not a sluice container"));
    snprintf(bad, sizeof bad, "%s/missing.sluice", test_tmpdir());
    memset(&err, 0, sizeof err);
    assert_true(infer_session_cold_start(bad, p, 40, &so, &po, &b, NULL, &err) < 0);
    assert_non_null(strstr(err.msg, "cannot open"));
    assert_true(format_reader_opens() == n1);
    free(p);
}

/* Every allocation of a session's life (create, prefill, decode steps with
 * the NPU device taking half of each matmul, destroy) fails once in turn:
 * each run either ends in an error with a sentence or, where a failure is
 * absorbed (a staging buffer the calling thread can do without), in the very
 * same tokens; nothing leaks (LeakSanitizer in the ASan build). */
static int session_run(struct infer_model *m, const int *p, uint32_t np, int *out, uint32_t nout,
                       struct sl_err *err)
{
    struct infer_session_opts so = {.max_batch = 16, .npu_min_weights = 1};
    struct infer_session *s = NULL;
    uint32_t taken = 0;
    struct collect g = {0};
    int ret = infer_session_create(m, &so, &s, err);
    if (ret == 0)
        ret = infer_session_prefill(s, p, np, err);
    if (ret == 0)
        ret = infer_session_generate(s, nout, NULL, 0, collect_tok, &g, &taken, err);
    infer_session_destroy(s);
    if (ret == 0)
        memcpy(out, g.tok, sizeof(int) * nout);
    return ret;
}

static void test_session_faults(void **st)
{
    (void)st;
    struct sl_err err = {{0}};
    struct infer_model *m;
    assert_int_equal(infer_model_load(q_model, NULL, &m, &err), 0);
    int *p = ids(20, infer_model_config(m)->vocab_size, 2);
    int want[6], got[6];
    sl_fault_alloc_arm(-1); /* count only */
    assert_int_equal(session_run(m, p, 20, want, 6, &err), 0);
    long n = sl_fault_alloc_count();
    sl_fault_alloc_arm(0);
    assert_true(n > 10);
    uint32_t failed = 0;
    for (long k = 1; k <= n + 2; k++) {
        memset(&err, 0, sizeof err);
        sl_fault_alloc_arm(k);
        int ret = session_run(m, p, 20, got, 6, &err);
        sl_fault_alloc_arm(0);
        if (ret < 0) {
            failed++;
            assert_true(err.msg[0] != 0);
        } else {
            assert_memory_equal(got, want, sizeof want);
        }
    }
    fprintf(stderr, "session: %ld allocations, %u failures reported, the rest absorbed\n", n,
            failed);
    assert_true(failed > 0);
    free(p);
    infer_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kv),
        cmocka_unit_test(test_chain),
        cmocka_unit_test(test_tree),
        cmocka_unit_test(test_attention_masks),
        cmocka_unit_test(test_clipped),
        cmocka_unit_test(test_linear_term),
        cmocka_unit_test(test_sessions),
        cmocka_unit_test(test_cold_session),
        cmocka_unit_test(test_cold_opens_once),
        cmocka_unit_test(test_session_faults),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}

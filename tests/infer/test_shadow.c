/* test_shadow.c: shadow outlier execution (llm.npu 3.3). On a synthetic
 * model calibrated through the observer and quantized with --shadow:
 *  - the container is version 2 and its hot columns are exactly the NPU's
 *    int8 weight columns;
 *  - every shadowed linear's output (NPU part plus CPU term) equals the float
 *    reference s * scale[r] * sum_c (x_c / s, rounded where not clipped)
 *    W[r][c] to float rounding, and without the term it does not;
 *  - the cold-start pipeline (which runs the term as CPU tasks beside the
 *    NPU's matmuls) gives bit-identical logits to the plain forward with the
 *    shadow attached, for every policy and several chunkings, and with
 *    no_shadow to the plain forward without it;
 *  - malformed shadow metadata is refused with a message naming the entry. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "import.h"
#include "infer.h"
#include "infer_internal.h"
#include "infer_matmul.h"
#include "npu.h"
#include "quantizer.h"
#include "testutil.h"
#include "tiny_q5.h"

static char float_model[4096], shadow_model[4096], shadow5_model[4096], mult5_model[4096];

static int setup(void **st)
{
    (void)st;
    const char *dir = test_tmpdir();
    struct sl_err err = {{0}};
    snprintf(float_model, sizeof float_model, "%s/tiny.sluice", dir);
    snprintf(shadow_model, sizeof shadow_model, "%s/tiny-shadow8.sluice", dir);
    snprintf(shadow5_model, sizeof shadow5_model, "%s/tiny-shadow5.sluice", dir);
    snprintf(mult5_model, sizeof mult5_model, "%s/tiny-mult5.sluice", dir);
    if (import_synth("tiny", 11, float_model, NULL, NULL, &err) < 0)
        return -1;
    struct infer_model *m;
    struct infer_state *s;
    if (infer_model_load(float_model, NULL, &m, &err) < 0)
        return -1;
    const struct format_config *c = infer_model_config(m);
    struct quantizer_calib *calib;
    if (quantizer_calib_create(c, 64, &calib) < 0)
        return -1;
    infer_model_set_observer(m, quantizer_calib_observe, calib);
    int ret = infer_state_create(m, 256, &s, &err);
    int *ids = tiny_prompt(200, c->vocab_size, 99);
    /* every row's logits: the classifier's inputs are calibrated too */
    float *lg = malloc(sizeof(float) * c->vocab_size * 200);
    if (ret == 0)
        ret = infer_forward(m, s, ids, 200, 0, lg, INFER_LOGITS_ALL, &err);
    free(lg);
    free(ids);
    infer_state_destroy(s);
    infer_model_destroy(m);
    /* a low quantile: many outliers, so every path is exercised */
    struct quantizer_opts o = {.method = QUANTIZER_METHOD_EDGEFLOW, .bits = 8,
                               .budget = QUANTIZER_BUDGET_TENSOR, .alpha = -1,
                               .encoding = FORMAT_ENC_ADAPTIVE, .shadow = 1,
                               .shadow_quantile = 0.99, .shadow_cover = 0.5};
    if (ret == 0)
        ret = quantizer_quantize(float_model, calib, &o, shadow_model, NULL, &err);
    o.bits = 5;
    o.shadow_min_importance = 2.5; /* prunes some linears */
    if (ret == 0)
        ret = quantizer_quantize(float_model, calib, &o, shadow5_model, NULL, &err);
    /* GPTQ with block multipliers (packed header version 2, a version 3 container) */
    o.shadow_min_importance = 0;
    o.gptq = 1;
    o.block_mult = 1;
    if (ret == 0)
        ret = quantizer_quantize(float_model, calib, &o, mult5_model, NULL, &err);
    quantizer_calib_destroy(calib);
    if (ret < 0)
        fprintf(stderr, "%s\n", err.msg);
    return ret;
}

static void check_container(const char *path, uint32_t version)
{
    struct sl_err err = {{0}};
    struct infer_model *m;
    assert_int_equal(infer_model_load(path, NULL, &m, &err), 0);
    const struct format_reader *r = infer_model_reader(m);
    assert_int_equal(format_reader_version(r), version);
    const void *v;
    size_t len;
    assert_int_equal(format_reader_meta_get(r, FORMAT_SHADOW_META_KEY, &v, &len), 0);
    struct format_shadow_linear *e;
    uint32_t n;
    assert_int_equal(format_shadow_parse(infer_model_config(m), v, len, &e, &n, &err), 0);
    assert_int_equal(n, infer_model_config(m)->n_layers * 7 + 1); /* and the classifier */
    uint32_t on = 0;
    for (uint32_t i = 0; i < n; i++) {
        struct infer_linear *lin = infer_model_linear(m, e[i].layer, e[i].role);
        assert_non_null(lin);
        assert_non_null(lin->npu);
        uint32_t role = e[i].layer < 0 && infer_model_config(m)->tied_embedding
                            ? FORMAT_ROLE_TOK_EMBD
                            : e[i].role;
        const struct format_tensor_info *t =
            format_reader_tensor(r, (uint32_t)format_reader_find(r, e[i].layer, role));
        if (!(e[i].flags & FORMAT_SHADOW_ON)) {
            assert_true(t->act_scale == e[i].act_max);
            continue;
        }
        on++;
        assert_true(t->act_scale > 0 && t->act_scale < e[i].act_max); /* the bulk */
        assert_true(e[i].n_hot > 0);
        int8_t *col = malloc(e[i].rows);
        for (uint32_t k = 0; k < e[i].n_hot; k++) {
            npu_weights_col(lin->npu, e[i].hot[k], col);
            assert_memory_equal(col, e[i].w + (size_t)k * e[i].rows, e[i].rows);
        }
        free(col);
    }
    assert_true(on > 0);
    format_shadow_free(e, n);
    infer_model_destroy(m);
}

static void test_container(void **st)
{
    (void)st;
    check_container(shadow_model, 2);
}

static void check(const char *model, enum infer_policy pol, uint32_t chunk, uint32_t split,
                  uint32_t n, int shadow);

/* Block multipliers: a version 3 container whose decoder linears' packed
 * tensors are header version 2; the NPU's int8 weights are codes times
 * multipliers (off the uniform 5-bit grid), the hot columns are still exactly
 * the NPU's, and the pipeline gives the plain forward's bits. */
static void test_block_mult(void **st)
{
    (void)st;
    check_container(mult5_model, 3);
    struct sl_err err = {{0}};
    struct infer_model *m;
    assert_int_equal(infer_model_load(mult5_model, NULL, &m, &err), 0);
    const struct format_reader *r = infer_model_reader(m);
    uint32_t tables = 0, off_grid = 0;
    for (uint32_t l = 0; l < infer_model_config(m)->n_layers; l++)
        for (uint32_t role = FORMAT_ROLE_WQ; role <= FORMAT_ROLE_W_DOWN; role++) {
            int i = format_reader_find(r, (int32_t)l, role);
            if (role == FORMAT_ROLE_FFN_NORM || i < 0)
                continue;
            const struct format_tensor_info *t = format_reader_tensor(r, (uint32_t)i);
            uint8_t *bytes = malloc(t->length);
            assert_int_equal(format_reader_read_tensor(r, (uint32_t)i, bytes, t->length, &err), 0);
            tables += sl_load_le32(bytes + 4) == 2;
            free(bytes);
            struct infer_linear *lin = infer_model_linear(m, (int)l, role);
            int8_t *row = malloc(t->shape[1]);
            for (uint32_t o = 0; o < lin->rows; o++) {
                npu_weights_row(lin->npu, o, row);
                for (uint64_t c = 0; c < t->shape[1]; c++)
                    off_grid += row[c] > 15 || row[c] < -15;
            }
            free(row);
        }
    assert_int_equal(tables, infer_model_config(m)->n_layers * 7);
    assert_true(off_grid > 0);
    infer_model_destroy(m);
    check(mult5_model, INFER_POLICY_FULL, 64, 48, 130, 1);
}

/* Largest |y - ref| / (sum_c |term_c| + tiny) over a shadowed linear's
 * outputs for random inputs with outliers; with or without the term. */
static double linear_error(struct infer_model *m, struct infer_state *s, int layer, uint32_t role,
                           int with_term, uint64_t *clipped)
{
    struct infer_linear *lin = infer_model_linear(m, layer, role);
    struct sl_err err = {{0}};
    uint32_t rows = lin->rows, cols = lin->cols, n = 7;
    float act = lin->act_scale;
    struct test_rng g;
    test_rng_init(&g, test_seed() + (uint64_t)layer * 16 + role);
    float *x = malloc(sizeof(float) * n * cols), *y = malloc(sizeof(float) * n * rows);
    for (uint32_t i = 0; i < n * cols; i++) {
        x[i] = test_rng_normal(&g) * 40 * act;
        if (test_rng_below(&g, 20) == 0)
            x[i] *= 8; /* beyond 127 s */
    }
    if (!with_term)
        infer_model_set_linear_term(m, NULL, NULL);
    assert_int_equal(infer_linear_exec(m, s, layer, role, lin, y, x, n, &err), 0);
    if (!with_term)
        infer_shadow_attach(m, (struct infer_shadow *)infer_model_shadow(m));
    int8_t *w = malloc(cols);
    double worst = 0;
    *clipped = 0;
    for (uint32_t o = 0; o < rows; o++) {
        npu_weights_row(lin->npu, o, w);
        double sc = (double)act * npu_weights_scale(lin->npu, o);
        for (uint32_t i = 0; i < n; i++) {
            double ref = 0, mag = 0;
            for (uint32_t c = 0; c < cols; c++) {
                float v = x[(size_t)i * cols + c] * (1.0f / act);
                double q = v > 127.0f || v < -127.0f ? (double)v : (double)rintf(v);
                *clipped += o == 0 && (v > 127.0f || v < -127.0f);
                ref += q * w[c];
                mag += fabs(q * w[c]);
            }
            double d = fabs(y[(size_t)i * rows + o] - sc * ref) / (sc * mag + 1e-30);
            worst = d > worst ? d : worst;
        }
    }
    free(w);
    free(x);
    free(y);
    return worst;
}

static void test_float_reference(void **st)
{
    (void)st;
    struct sl_err err = {{0}};
    struct infer_model *m;
    struct infer_state *s;
    assert_int_equal(infer_model_load(shadow_model, NULL, &m, &err), 0);
    assert_int_equal(infer_model_shadow_enable(m, &err), 0);
    assert_int_equal(infer_state_create(m, 16, &s, &err), 0);
    uint32_t checked = 0;
    for (int l = -1; l < (int)infer_model_config(m)->n_layers; l++)
        for (uint32_t role = FORMAT_ROLE_WQ; role <= FORMAT_ROLE_CLASSIFIER; role++) {
            if (!infer_shadow_wants((void *)infer_model_shadow(m), l, role))
                continue;
            uint64_t clipped;
            double e = linear_error(m, s, l, role, 1, &clipped);
            assert_true(clipped > 0);
            if (e > 1e-5)
                fail_msg("layer %d %s: relative error %g against the float reference", l,
                         format_role_name(role), e);
            /* without the term the clipped excess is lost: far off */
            double e0 = linear_error(m, s, l, role, 0, &clipped);
            if (e0 < 1e-3)
                fail_msg("layer %d %s: error %g without the term", l, format_role_name(role), e0);
            checked++;
        }
    assert_true(checked >= 8);
    assert_true(infer_shadow_wants((void *)infer_model_shadow(m), -1, FORMAT_ROLE_CLASSIFIER));
    struct infer_shadow_stats ss;
    infer_shadow_get_stats(infer_model_shadow(m), &ss);
    assert_true(ss.clipped > 0 && ss.cols_hot > 0 && ss.cols_cold > 0);
    assert_true(ss.cols_hot + ss.cols_cold <= ss.clipped); /* a channel gathered once a call */
    infer_state_destroy(s);
    infer_model_destroy(m);
}

/* The pipeline's residency (test_packed_residency sets PACKED). */
static enum infer_resident check_resident = INFER_RESIDENT_AUTO;

/* The pipeline against infer_forward with the shadow attached (shadow 1)
 * or without it and the pipeline's no_shadow (shadow 0). */
static void check(const char *model, enum infer_policy pol, uint32_t chunk, uint32_t split,
                  uint32_t n, int shadow)
{
    struct sl_err err = {{0}};
    struct infer_model *m;
    struct infer_state *s;
    assert_int_equal(infer_model_load(model, NULL, &m, &err), 0);
    if (shadow)
        assert_int_equal(infer_model_shadow_enable(m, &err), 0);
    uint32_t V = infer_model_config(m)->vocab_size;
    int *ids = tiny_prompt(n, V, n * 3 + chunk);
    float *a = malloc(sizeof(float) * V), *b = malloc(sizeof(float) * V);
    assert_int_equal(infer_state_create(m, chunk, &s, &err), 0);
    assert_int_equal(infer_forward(m, s, ids, n, 0, a, INFER_LOGITS_LAST, &err), 0);
    struct infer_pipeline_opts o;
    infer_pipeline_opts_init(&o);
    o.policy = pol;
    o.chunk = chunk;
    o.split = split;
    o.cpu_workers = 2;
    o.no_shadow = !shadow;
    o.resident = check_resident;
    struct infer_model *pm;
    struct infer_state *ps;
    if (infer_pipeline_prefill(model, ids, n, &o, &pm, &ps, b, NULL, &err) < 0)
        fail_msg("policy %s, chunk %u: %s", infer_policy_name(pol), chunk, err.msg);
    if (memcmp(a, b, sizeof(float) * V) != 0)
        fail_msg("%s, policy %s, chunk %u, split %u, %u tokens, shadow %d: logits differ", model,
                 infer_policy_name(pol), chunk, split, n, shadow);
    assert_int_equal(infer_model_shadow(pm) != NULL, shadow);
    if (shadow) {
        struct infer_shadow_stats sa, sb;
        infer_shadow_get_stats(infer_model_shadow(m), &sa);
        infer_shadow_get_stats(infer_model_shadow(pm), &sb);
        assert_true(sa.clipped > 0);
        assert_true(sb.clipped == sa.clipped); /* the same outliers, found by each */
        if (check_resident == INFER_RESIDENT_PACKED) {
            /* the int8 copies are gone: the term read cold columns from the
             * packed codes */
            size_t i8, pk;
            infer_model_weight_bytes(pm, &i8, &pk);
            assert_true(pk > 0 && sb.cols_cold > 0);
            assert_true(i8 < pk / 4); /* at most what is not kept packed */
        }
    }
    int t = 5; /* a decoding step after both */
    assert_int_equal(infer_forward(m, s, &t, 1, n, a, INFER_LOGITS_LAST, &err), 0);
    assert_int_equal(infer_forward(pm, ps, &t, 1, n, b, INFER_LOGITS_LAST, &err), 0);
    assert_memory_equal(a, b, sizeof(float) * V);
    infer_state_destroy(ps);
    infer_model_destroy(pm);
    infer_state_destroy(s);
    infer_model_destroy(m);
    free(ids);
    free(a);
    free(b);
}

static void test_pipeline_identical(void **st)
{
    (void)st;
    for (int p = 0; p < INFER_POLICY_COUNT; p++) {
        check(shadow_model, (enum infer_policy)p, 64, 48, 150, 1);
        check(shadow_model, (enum infer_policy)p, 256, 0, 40, 1);
    }
    check(shadow_model, INFER_POLICY_FULL, 16, 16, 33, 1);
    check(shadow5_model, INFER_POLICY_FULL, 64, 48, 130, 1);
    check(shadow5_model, INFER_POLICY_LLMNPU, 32, 0, 70, 1);
    /* off: the pipeline's no_shadow against the plain forward without it */
    check(shadow_model, INFER_POLICY_FULL, 64, 48, 150, 0);
}

/* Packed residency with the shadow term: the term reads its weight columns
 * from the packed codes (the int8 copies are freed as the prefill goes and
 * are gone for decoding), with the same bits as int8 residency: the
 * pipeline's logits equal the plain forward with the shadow attached, for
 * several chunkings, policies and containers (5-bit, block multipliers),
 * and so does a decoding step after it; no_shadow still equals the plain
 * forward without the term. AUTO resolves to INT8 for a container with
 * shadow metadata unless no_shadow. */
static void test_packed_residency(void **st)
{
    (void)st;
    check_resident = INFER_RESIDENT_PACKED;
    check(shadow_model, INFER_POLICY_FULL, 64, 48, 150, 1);
    check(shadow_model, INFER_POLICY_FULL, 256, 0, 40, 1);
    check(shadow_model, INFER_POLICY_SEQUENTIAL, 32, 0, 70, 1);
    check(shadow5_model, INFER_POLICY_FULL, 64, 48, 130, 1);
    check(mult5_model, INFER_POLICY_FULL, 64, 48, 130, 1);
    check(shadow_model, INFER_POLICY_FULL, 64, 48, 150, 0);
    check_resident = INFER_RESIDENT_AUTO;
    struct sl_err err = {{0}};
    struct infer_model *m;
    assert_int_equal(infer_model_load(shadow_model, NULL, &m, &err), 0);
    const struct format_reader *r = infer_model_reader(m);
    assert_int_equal(infer_resident_resolve(INFER_RESIDENT_AUTO, r, 0), INFER_RESIDENT_INT8);
    assert_int_equal(infer_resident_resolve(INFER_RESIDENT_PACKED, r, 0), INFER_RESIDENT_PACKED);
    infer_model_destroy(m);
}

static void test_pruned(void **st)
{
    (void)st;
    struct sl_err err = {{0}};
    struct infer_model *m;
    assert_int_equal(infer_model_load(shadow5_model, NULL, &m, &err), 0);
    assert_int_equal(infer_model_shadow_enable(m, &err), 0);
    uint32_t on, all = infer_shadow_linears(infer_model_shadow(m), &on);
    assert_int_equal(all, infer_model_config(m)->n_layers * 7 + 1);
    assert_true(on > 0 && on < all); /* importance 2.5 pruned some, not all */
    infer_model_destroy(m);
    /* a model without shadow metadata */
    assert_int_equal(infer_model_load(float_model, NULL, &m, &err), 0);
    assert_int_equal(infer_model_shadow_enable(m, &err), -ENOENT);
    assert_non_null(strstr(err.msg, "shadow"));
    infer_model_destroy(m);
}

static void test_malformed(void **st)
{
    (void)st;
    struct format_config c = {.arch = FORMAT_ARCH_LLAMA, .dim = 8, .hidden_dim = 16, .n_layers = 2,
                              .n_heads = 2, .n_kv_heads = 1, .head_dim = 4, .vocab_size = 8,
                              .seq_len = 8, .bos_id = 1, .eos_id = 2, .rope_theta = 1e4f,
                              .norm_eps = 1e-5f};
    uint32_t hot[2] = {1, 5};
    int8_t w[2 * 16];
    for (int i = 0; i < 32; i++)
        w[i] = (int8_t)(i - 16);
    struct format_shadow_linear e = {.layer = 1, .role = FORMAT_ROLE_W_GATE,
                                     .flags = FORMAT_SHADOW_ON, .act_max = 0.5f,
                                     .importance = 3, .calib_rate = 0.01f, .rows = 16, .cols = 8,
                                     .n_hot = 2, .hot = hot, .w = w};
    void *buf;
    size_t len;
    assert_int_equal(format_shadow_encode(&e, 1, &buf, &len), 0);
    struct format_shadow_linear *out;
    uint32_t n;
    struct sl_err err = {{0}};
    assert_int_equal(format_shadow_parse(&c, buf, len, &out, &n, &err), 0);
    assert_int_equal(n, 1);
    assert_int_equal(out[0].n_hot, 2);
    assert_int_equal(out[0].hot[1], 5);
    assert_memory_equal(out[0].w, w, sizeof w);
    format_shadow_free(out, n);
    /* truncated, trailing, a wrong shape, descending channels, code -128 */
    assert_int_equal(format_shadow_parse(&c, buf, len - 4, &out, &n, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "entry 0"));
    uint8_t *b = buf;
    uint8_t *big = malloc(len + 4);
    memcpy(big, b, len);
    memset(big + len, 0, 4);
    assert_int_equal(format_shadow_parse(&c, big, len + 4, &out, &n, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "trailing"));
    free(big);
    e.rows = 8;
    free(buf);
    assert_int_equal(format_shadow_encode(&e, 1, &buf, &len), 0);
    assert_int_equal(format_shadow_parse(&c, buf, len, &out, &n, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "names no linear"));
    free(buf);
    e.rows = 16;
    hot[0] = 6;
    assert_int_equal(format_shadow_encode(&e, 1, &buf, &len), 0);
    assert_int_equal(format_shadow_parse(&c, buf, len, &out, &n, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "ascend"));
    free(buf);
    hot[0] = 1;
    w[3] = -128;
    assert_int_equal(format_shadow_encode(&e, 1, &buf, &len), 0);
    assert_int_equal(format_shadow_parse(&c, buf, len, &out, &n, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "-128"));
    free(buf);
}

/* The term on pieces of the output channels (infer_clipped r0, r1: the
 * pipeline's matmul pieces): pieces on blocks of 16 (read in place) and off
 * them (the gather path), in any order, give the whole call's bits, each
 * leaving the other channels alone; a bad range is refused. */
static void test_term_pieces(void **st)
{
    (void)st;
    struct sl_err err = {{0}};
    struct infer_model *m;
    assert_int_equal(infer_model_load(shadow_model, NULL, &m, &err), 0);
    assert_int_equal(infer_model_shadow_enable(m, &err), 0);
    struct infer_shadow *sh = (struct infer_shadow *)infer_model_shadow(m);
    struct test_rng g;
    test_rng_init(&g, test_seed() + 97);
    struct infer_clipbuf cb = {0};
    uint32_t checked = 0;
    for (int l = -1; l < (int)infer_model_config(m)->n_layers; l++)
        for (uint32_t role = FORMAT_ROLE_WQ; role <= FORMAT_ROLE_CLASSIFIER; role++) {
            if (!infer_shadow_wants(sh, l, role))
                continue;
            struct infer_linear *lin = infer_model_linear(m, l, role);
            uint32_t n = 7, rows = lin->rows, cols = lin->cols;
            float *x = malloc(sizeof(float) * n * cols);
            float *base = malloc(sizeof(float) * n * rows), *want = malloc(sizeof(float) * n * rows);
            float *got = malloc(sizeof(float) * n * rows);
            for (uint32_t i = 0; i < n * cols; i++)
                x[i] = test_rng_normal(&g) * 60 * lin->act_scale *
                       (test_rng_below(&g, 8) == 0 ? 6.0f : 1.0f);
            for (uint32_t i = 0; i < n * rows; i++)
                base[i] = want[i] = test_rng_normal(&g);
            struct infer_clipped clip;
            assert_int_equal(infer_find_clipped(&cb, x, n, cols, lin->act_scale, &clip), 0);
            assert_true(clip.n > 0);
            for (int pass = 0; pass < 3; pass++) {
                memcpy(got, base, sizeof(float) * n * rows);
                if (pass == 0) /* the whole call: the reference */
                    assert_int_equal(infer_shadow_term(sh, l, role, &clip, want, n, rows), 0);
                infer_shadow_set_fused(sh, pass < 2);
                uint32_t r0 = 0;
                while (pass && r0 < rows) {
                    /* pass 1: pieces on blocks of 16; pass 2: any (the gather path) */
                    uint32_t len = 1 + test_rng_below(&g, rows / 3 + 1);
                    if (pass == 1)
                        len = 16 * (1 + test_rng_below(&g, rows / 48 + 1));
                    struct infer_clipped c = clip;
                    c.r0 = r0;
                    c.r1 = rows - r0 < len ? rows : r0 + len;
                    assert_int_equal(infer_shadow_term(sh, l, role, &c, got, n, rows), 0);
                    r0 = c.r1;
                }
                if (pass)
                    assert_memory_equal(got, want, sizeof(float) * n * rows);
            }
            struct infer_clipped bad = clip;
            bad.r0 = 5;
            bad.r1 = 5;
            assert_int_equal(infer_shadow_term(sh, l, role, &bad, got, n, rows), -EINVAL);
            bad.r0 = 0;
            bad.r1 = rows + 1;
            assert_int_equal(infer_shadow_term(sh, l, role, &bad, got, n, rows), -EINVAL);
            assert_memory_equal(got, want, sizeof(float) * n * rows);
            free(x);
            free(base);
            free(want);
            free(got);
            checked++;
        }
    assert_true(checked >= 8);
    infer_shadow_set_fused(sh, 1);
    infer_clipbuf_free(&cb);
    infer_model_destroy(m);
}

/* The term with the cold columns gathered in one pass, one at a time past
 * a small budget, or one at a time throughout, and reading the weights in
 * place (the default): the same bits. */
static void test_gather_budget(void **st)
{
    (void)st;
    struct sl_err err = {{0}};
    struct infer_model *m;
    struct infer_state *s;
    assert_int_equal(infer_model_load(shadow_model, NULL, &m, &err), 0);
    assert_int_equal(infer_model_shadow_enable(m, &err), 0);
    assert_int_equal(infer_state_create(m, 16, &s, &err), 0);
    struct infer_shadow *sh = (struct infer_shadow *)infer_model_shadow(m);
    struct test_rng g;
    test_rng_init(&g, test_seed() + 93);
    uint32_t checked = 0;
    for (int l = -1; l < (int)infer_model_config(m)->n_layers; l++)
        for (uint32_t role = FORMAT_ROLE_WQ; role <= FORMAT_ROLE_CLASSIFIER; role++) {
            if (!infer_shadow_wants(sh, l, role))
                continue;
            struct infer_linear *lin = infer_model_linear(m, l, role);
            uint32_t n = 9, rows = lin->rows, cols = lin->cols;
            float *x = malloc(sizeof(float) * n * cols);
            float *y[4];
            for (uint32_t i = 0; i < n * cols; i++)
                x[i] = test_rng_normal(&g) * 60 * lin->act_scale *
                       (test_rng_below(&g, 8) == 0 ? 6.0f : 1.0f);
            size_t budget[3] = {(size_t)32 << 20, (size_t)rows * 2, 0};
            for (int k = 0; k < 4; k++) { /* k 3: the fused path (default) */
                y[k] = malloc(sizeof(float) * n * rows);
                infer_shadow_set_fused(sh, k == 3);
                infer_shadow_set_gather_max(sh, budget[k < 3 ? k : 0]);
                assert_int_equal(infer_linear_exec(m, s, l, role, lin, y[k], x, n, &err), 0);
            }
            assert_memory_equal(y[0], y[1], sizeof(float) * n * rows);
            assert_memory_equal(y[0], y[2], sizeof(float) * n * rows);
            assert_memory_equal(y[0], y[3], sizeof(float) * n * rows);
            for (int k = 0; k < 4; k++)
                free(y[k]);
            free(x);
            checked++;
        }
    assert_true(checked >= 8);
    infer_state_destroy(s);
    infer_model_destroy(m);
}

/* term_fused's scratch sets (a pool in the shadow): a warm call allocates
 * nothing; every allocation of a call failing in turn gives -ENOMEM with
 * the output untouched, and the next call (the set kept) the right bits;
 * concurrent callers get a set each, never more sets than callers, and the
 * same bits; infer_shadow_destroy frees them (ASan). */
struct scratch_job {
    struct infer_shadow *sh;
    int layer;
    uint32_t role, n, rows, reps;
    const struct infer_clipped *clip;
    const float *base, *want;
    float *y;
    int bad;
};

static void *scratch_thread(void *arg)
{
    struct scratch_job *j = arg;
    for (uint32_t r = 0; r < j->reps; r++) {
        memcpy(j->y, j->base, sizeof(float) * j->n * j->rows);
        if (infer_shadow_term(j->sh, j->layer, j->role, j->clip, j->y, j->n, j->rows) != 0 ||
            memcmp(j->y, j->want, sizeof(float) * j->n * j->rows) != 0)
            j->bad++;
    }
    return NULL;
}

/* Packed residency, a fresh shadow (its scratch sets never used) and a call
 * whose clipped elements all sit in hot columns: no cold column to decode
 * from the packed codes, so nothing is asked of the set's cold-column
 * buffer. That is no failure (it once was -ENOMEM), and the fused term
 * gives the gathering path's bits. */
static void test_packed_hot_only(void **st)
{
    (void)st;
    struct sl_err err = {{0}};
    struct infer_model *m0;
    assert_int_equal(infer_model_load(shadow5_model, NULL, &m0, &err), 0);
    uint32_t V = infer_model_config(m0)->vocab_size, np = 40;
    infer_model_destroy(m0);
    int *ids = tiny_prompt(np, V, 11);
    float *lg = malloc(sizeof(float) * V);
    struct infer_pipeline_opts o;
    infer_pipeline_opts_init(&o);
    o.chunk = 64;
    o.cpu_workers = 2;
    o.resident = INFER_RESIDENT_PACKED;
    struct infer_model *pm;
    struct infer_state *ps;
    if (infer_pipeline_prefill(shadow5_model, ids, np, &o, &pm, &ps, lg, NULL, &err) < 0)
        fail_msg("%s", err.msg);
    const void *v;
    size_t len;
    struct format_shadow_linear *e;
    uint32_t ne, tried = 0;
    assert_int_equal(format_reader_meta_get(infer_model_reader(pm), FORMAT_SHADOW_META_KEY, &v, &len), 0);
    assert_int_equal(format_shadow_parse(infer_model_config(pm), v, len, &e, &ne, &err), 0);
    for (uint32_t i = 0; i < ne; i++) {
        struct infer_linear *lin = infer_model_linear(pm, e[i].layer, e[i].role);
        if (!(e[i].flags & FORMAT_SHADOW_ON) || e[i].layer < 0 || !lin->upk || e[i].n_hot == 0 ||
            e[i].rows % 16)
            continue;
        /* two token rows, each clipped in the first and the last hot column */
        const uint32_t n = 2, rows = e[i].rows, last = e[i].hot[e[i].n_hot - 1];
        uint32_t row[4] = {0, 0, 1, 1}, col[4] = {e[i].hot[0], last, e[i].hot[0], last};
        const float ex[4] = {3.5f, -2.25f, -1.5f, 4.0f};
        struct infer_clipped clip = {.n = e[i].n_hot > 1 ? 4 : 2, .row = row, .col = col,
                                     .excess = ex, .act_scale = lin->act_scale};
        if (e[i].n_hot == 1)
            row[1] = 1; /* one column: rows 0 and 1 */
        float *want = calloc((size_t)n * rows, sizeof(float));
        float *got = calloc((size_t)n * rows, sizeof(float));
        struct infer_shadow *sh;
        assert_int_equal(infer_shadow_create(pm, &sh, &err), 0);
        infer_shadow_set_fused(sh, 0); /* the reference: the gathering path */
        assert_int_equal(infer_shadow_term(sh, e[i].layer, e[i].role, &clip, want, n, rows), 0);
        infer_shadow_destroy(sh);
        assert_int_equal(infer_shadow_create(pm, &sh, &err), 0);
        infer_shadow_set_fused(sh, 1);
        assert_int_equal(infer_shadow_term(sh, e[i].layer, e[i].role, &clip, got, n, rows), 0);
        uint32_t sets;
        assert_int_equal(infer_shadow_scratch_sets(sh, &sets), 1); /* the fused path ran */
        infer_shadow_destroy(sh);
        assert_memory_equal(got, want, sizeof(float) * n * rows);
        free(want);
        free(got);
        tried++;
    }
    assert_true(tried > 0);
    format_shadow_free(e, ne);
    infer_state_destroy(ps);
    infer_model_destroy(pm);
    free(ids);
    free(lg);
}

static void test_term_scratch(void **st)
{
    (void)st;
    struct sl_err err = {{0}};
    struct infer_model *m;
    assert_int_equal(infer_model_load(shadow_model, NULL, &m, &err), 0);
    struct test_rng g;
    test_rng_init(&g, test_seed() + 101);
    int layer = -2;
    uint32_t role = 0;
    struct infer_shadow *sh;
    assert_int_equal(infer_shadow_create(m, &sh, &err), 0);
    for (int l = 0; layer == -2 && l < (int)infer_model_config(m)->n_layers; l++)
        for (uint32_t r = FORMAT_ROLE_WQ; layer == -2 && r <= FORMAT_ROLE_W_DOWN; r++)
            if (infer_shadow_wants(sh, l, r) && infer_model_linear(m, l, r)->rows >= 32)
                layer = l, role = r;
    assert_true(layer >= 0);
    struct infer_linear *lin = infer_model_linear(m, layer, role);
    uint32_t n = 7, rows = lin->rows, cols = lin->cols;
    float *x = malloc(sizeof(float) * n * cols), *base = malloc(sizeof(float) * n * rows);
    float *want = malloc(sizeof(float) * n * rows), *got = malloc(sizeof(float) * n * rows);
    for (uint32_t i = 0; i < n * cols; i++)
        x[i] = test_rng_normal(&g) * 60 * lin->act_scale *
               (test_rng_below(&g, 8) == 0 ? 6.0f : 1.0f);
    for (uint32_t i = 0; i < n * rows; i++)
        base[i] = test_rng_normal(&g);
    struct infer_clipbuf cb = {0};
    struct infer_clipped clip;
    assert_int_equal(infer_find_clipped(&cb, x, n, cols, lin->act_scale, &clip), 0);
    assert_true(clip.n > 2 && clip.row[clip.n - 1] > clip.row[0]);
    /* the reference: the gathering path (no scratch set) */
    infer_shadow_set_fused(sh, 0);
    memcpy(want, base, sizeof(float) * n * rows);
    assert_int_equal(infer_shadow_term(sh, layer, role, &clip, want, n, rows), 0);
    infer_shadow_set_fused(sh, 1);
    uint32_t pooled;
    assert_int_equal(infer_shadow_scratch_sets(sh, &pooled), 0);
    memcpy(got, base, sizeof(float) * n * rows);
    assert_int_equal(infer_shadow_term(sh, layer, role, &clip, got, n, rows), 0);
    assert_memory_equal(got, want, sizeof(float) * n * rows);
    assert_int_equal(infer_shadow_scratch_sets(sh, &pooled), 1);
    assert_int_equal(pooled, 1);
    /* warm: no allocation at all, the same bits */
    memcpy(got, base, sizeof(float) * n * rows);
    sl_fault_alloc_arm(-1);
    int ret = infer_shadow_term(sh, layer, role, &clip, got, n, rows);
    long allocs = sl_fault_alloc_count();
    sl_fault_alloc_arm(0);
    assert_int_equal(ret, 0);
    assert_int_equal(allocs, 0);
    assert_memory_equal(got, want, sizeof(float) * n * rows);
    assert_int_equal(infer_shadow_scratch_sets(sh, NULL), 1);
    /* each allocation of a first call (k = 1, 2, ...) and of a call that
     * outgrows a set warmed by a smaller one failing in turn */
    struct infer_clipped small = clip;
    small.n = 1;
    float *ys = malloc(sizeof(float) * n * rows);
    for (int grow = 0; grow < 2; grow++) {
        uint32_t failed = 0;
        for (long k = 1;; k++) {
            struct infer_shadow *s2;
            assert_int_equal(infer_shadow_create(m, &s2, &err), 0);
            if (grow)
                assert_int_equal(infer_shadow_term(s2, layer, role, &small, ys, n, rows), 0);
            memcpy(got, base, sizeof(float) * n * rows);
            sl_fault_alloc_arm(k);
            ret = infer_shadow_term(s2, layer, role, &clip, got, n, rows);
            allocs = sl_fault_alloc_count();
            sl_fault_alloc_arm(0);
            if (allocs < k) { /* nothing failed: every allocation passed */
                assert_int_equal(ret, 0);
                assert_memory_equal(got, want, sizeof(float) * n * rows);
                infer_shadow_destroy(s2);
                break;
            }
            assert_int_equal(ret, -ENOMEM);
            assert_memory_equal(got, base, sizeof(float) * n * rows);
            failed++;
            /* the set (if one was made) went back to the pool and still works */
            memcpy(got, base, sizeof(float) * n * rows);
            assert_int_equal(infer_shadow_term(s2, layer, role, &clip, got, n, rows), 0);
            assert_memory_equal(got, want, sizeof(float) * n * rows);
            assert_int_equal(infer_shadow_scratch_sets(s2, &pooled), 1);
            assert_int_equal(pooled, 1);
            infer_shadow_destroy(s2);
        }
        assert_true(failed >= (grow ? 2u : 8u));
    }
    free(ys);
    /* concurrent callers: a set each at most, the same bits */
    enum { T = 4 };
    pthread_t tid[T];
    struct scratch_job job[T];
    for (int t = 0; t < T; t++) {
        job[t] = (struct scratch_job){sh, layer, role, n, rows, 40, &clip, base, want,
                                      malloc(sizeof(float) * n * rows), 0};
        assert_int_equal(pthread_create(&tid[t], NULL, scratch_thread, &job[t]), 0);
    }
    for (int t = 0; t < T; t++) {
        assert_int_equal(pthread_join(tid[t], NULL), 0);
        assert_int_equal(job[t].bad, 0);
        free(job[t].y);
    }
    uint32_t sets = infer_shadow_scratch_sets(sh, &pooled);
    assert_true(sets >= 1 && sets <= T);
    assert_int_equal(pooled, sets);
    infer_shadow_destroy(sh);
    infer_clipbuf_free(&cb);
    free(x);
    free(base);
    free(want);
    free(got);
    infer_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_container),
        cmocka_unit_test(test_block_mult),
        cmocka_unit_test(test_float_reference),
        cmocka_unit_test(test_pipeline_identical),
        cmocka_unit_test(test_pruned),
        cmocka_unit_test(test_packed_residency),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_gather_budget),
        cmocka_unit_test(test_term_pieces),
        cmocka_unit_test(test_term_scratch),
        cmocka_unit_test(test_packed_hot_only),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}

/* test_smooth.c: NPU-aware smoothing (EdgeFlow 4.1).
 * - one group: (x / s) (W diag(s))^T equals x W^T within float rounding for
 *   any alpha; SmoothQuant's scales follow its formula; the smoothed
 *   activation maximum; the O projection's scale is common to each GQA group;
 * - the alpha search returns the grid point of least error, and with
 *   outlier input channels it smooths (alpha > 0) and beats no smoothing;
 * - whole models: the smoothed float model (quantizer_quantize with
 *   float_out) computes the same logits as the original: the synthetic tiny
 *   model (GQA 4/2) with a fixed alpha, the searched alphas and SmoothQuant's
 *   migration; with --real (ctest test_smooth_real, integration) the real
 *   kjv6L (GQA 8/2) calibrated on its text, when ../shared is present. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "import.h"
#include "infer.h"
#include "quantizer_internal.h"
#include "testfmt.h"
#include "testutil.h"

static struct test_rng rng;

/* Inputs with a few outlier channels (like the inputs of Q/K/V in LLMs). */
static void outlier_inputs(float *x, uint32_t n, uint32_t in, float *in_max)
{
    for (uint32_t c = 0; c < in; c++)
        in_max[c] = 0;
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t c = 0; c < in; c++) {
            float v = test_rng_normal(&rng) * (c % 16 == 3 ? 40.0f : 1.0f);
            x[(size_t)i * in + c] = v;
            in_max[c] = fmaxf(in_max[c], fabsf(v));
        }
}

static void random_w(float *w, uint32_t rows, uint32_t cols)
{
    for (uint32_t i = 0; i < rows * cols; i++)
        w[i] = 0.05f * test_rng_normal(&rng);
}

static void test_group_invariance(void **st)
{
    (void)st;
    enum { N = 16, IN = 64, ROWS = 48 };
    float x[N * IN], w[ROWS * IN], in_max[IN], s[IN], xs[IN], ws[IN];
    outlier_inputs(x, N, IN, in_max);
    random_w(w, ROWS, IN);
    for (int k = 0; k <= 10; k++) {
        quantizer_smooth_scales(in_max, IN, k / 10.0, s);
        double worst = 0;
        for (uint32_t i = 0; i < N; i++)
            for (uint32_t r = 0; r < ROWS; r++) {
                double ref = 0, norm = 0;
                float y = 0;
                for (uint32_t c = 0; c < IN; c++) {
                    xs[c] = x[i * IN + c] / s[c];
                    ws[c] = w[r * IN + c] * s[c];
                    ref += (double)x[i * IN + c] * w[r * IN + c];
                    norm += fabs((double)x[i * IN + c] * w[r * IN + c]);
                    y += xs[c] * ws[c];
                }
                worst = fmax(worst, fabs(y - ref) / norm);
            }
        assert_true(worst < 1e-5);
    }
    /* alpha 0 is the identity; alpha 1 makes every smoothed channel max 1 */
    quantizer_smooth_scales(in_max, IN, 0, s);
    for (uint32_t c = 0; c < IN; c++)
        assert_true(s[c] == 1.0f);
    quantizer_smooth_scales(in_max, IN, 1, s);
    assert_true(fabsf(quantizer_smooth_act_max(in_max, s, IN) - 1.0f) < 1e-6f);
    assert_true(quantizer_smooth_act_max(in_max, NULL, IN) > 30.0f);
    /* a dead channel keeps scale 1 */
    in_max[5] = 0;
    quantizer_smooth_scales(in_max, IN, 0.5, s);
    assert_true(s[5] == 1.0f);
}

static void test_smoothquant_scales(void **st)
{
    (void)st;
    const float in_max[3] = {4.0f, 9.0f, 0.0f};
    const float w1[2 * 3] = {0.5f, -1.0f, 1.0f, 0.25f, 0.1f, 1.0f};
    const float w2[1 * 3] = {-2.0f, 0.0f, 0.0f};
    struct quantizer_smooth_member m[2] = {{w1, 2, 3}, {w2, 1, 3}};
    float s[3];
    quantizer_smooth_sq_scales(in_max, 3, m, 2, 0.5, s);
    /* s_j = max|X_j|^0.5 / max|W_j|^0.5 over both members */
    assert_true(fabsf(s[0] - 2.0f / sqrtf(2.0f)) < 1e-6f);
    assert_true(fabsf(s[1] - 3.0f / 1.0f) < 1e-6f);
    assert_true(s[2] == 1.0f); /* no activation: unchanged */
}

/* Statistics to static activation scales (issue 21, finding 3): max / 127,
 * 0 for an input that was always 0, and an error naming the layer, the role
 * and the value for anything NaN, infinite or negative, never a scale or 0. */
static void test_act_scale(void **st)
{
    (void)st;
    struct sl_err err = {{0}};
    const float in_max[4] = {1.0f, 12.7f, 0.5f, 0.0f}, s[4] = {1.0f, 0.1f, 2.0f, 4.0f};
    float out = -1;
    assert_int_equal(quantizer_act_scale(0, FORMAT_ROLE_WQ, in_max, NULL, 4, &out, &err), 0);
    assert_true(out == 12.7f / 127.0f);
    assert_int_equal(quantizer_act_scale(0, FORMAT_ROLE_WQ, in_max, s, 4, &out, &err), 0);
    assert_true(out == (12.7f / 0.1f) / 127.0f);
    const float zero[2] = {0, 0};
    assert_int_equal(quantizer_act_scale(1, FORMAT_ROLE_WO, zero, NULL, 2, &out, &err), 0);
    assert_true(out == 0.0f);

    static const struct {
        float max, s; /* channel 2's statistic and smoothing scale */
        int layer;
        uint32_t role;
        const char *where, *shown;
    } bad[] = {
        {NAN, 1.0f, 3, FORMAT_ROLE_WQ, "layer 3 wq:", "maximum nan"},
        {INFINITY, 1.0f, 0, FORMAT_ROLE_W_DOWN, "layer 0 w_down:", "maximum inf"},
        {-1.0f, 1.0f, 1, FORMAT_ROLE_WO, "layer 1 wo:", "maximum -1"},
        {2.0f, 0.0f, 2, FORMAT_ROLE_W_GATE, "layer 2 w_gate:", "activation maximum inf"},
        {2.0f, -1.0f, -1, FORMAT_ROLE_CLASSIFIER, "classifier:", "activation maximum -2"},
        {0.0f, 0.0f, 0, FORMAT_ROLE_WQ, "layer 0 wq:", "nan; a static"}, /* 0/0: -nan */
        {2.0f, NAN, 0, FORMAT_ROLE_WQ, "layer 0 wq:", "smoothing scale nan"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        float mx[4] = {1, 1, bad[i].max, 1}, sc[4] = {1, 1, bad[i].s, 1};
        out = 0.25f;
        memset(&err, 0, sizeof err);
        assert_int_equal(quantizer_act_scale(bad[i].layer, bad[i].role, mx, sc, 4, &out, &err),
                         -EINVAL);
        assert_true(out == 0.25f); /* untouched */
        if (strncmp(err.msg, bad[i].where, strlen(bad[i].where)) || !strstr(err.msg, "channel 2") ||
            !strstr(err.msg, bad[i].shown))
            fail_msg("case %zu: %s", i, err.msg);
    }
}

static void test_o_common(void **st)
{
    (void)st;
    struct format_config c = {.n_heads = 8, .n_kv_heads = 2, .head_dim = 4};
    float in_max[32], out[32];
    for (int i = 0; i < 32; i++)
        in_max[i] = test_rng_float(&rng) * 10;
    quantizer_smooth_o_common(&c, in_max, out);
    for (uint32_t kv = 0; kv < 2; kv++)
        for (uint32_t d = 0; d < 4; d++) {
            float mx = 0;
            for (uint32_t h = kv * 4; h < kv * 4 + 4; h++)
                mx = fmaxf(mx, in_max[h * 4 + d]);
            for (uint32_t h = kv * 4; h < kv * 4 + 4; h++)
                assert_true(out[h * 4 + d] == mx);
        }
}

static void test_search(void **st)
{
    (void)st;
    enum { N = 64, IN = 128, R1 = 96, R2 = 32 };
    float *x = malloc(sizeof(float) * N * IN), *w1 = malloc(sizeof(float) * R1 * IN);
    float *w2 = malloc(sizeof(float) * R2 * IN), in_max[IN], s[IN], s0[IN];
    outlier_inputs(x, N, IN, in_max);
    random_w(w1, R1, IN);
    random_w(w2, R2, IN);
    struct quantizer_smooth_group g = {.in = IN,
                                       .in_max = in_max,
                                       .x = x,
                                       .n_sample = N,
                                       .m = {{w1, R1, IN}, {w2, R2, IN}},
                                       .nm = 2};
    const struct quantizer_tensor_rule rules[] = {
        {.bits = 4.5}, {.bits = 6, .uniform_bits = 6}, {.bits = 3.5, .clip = QUANTIZER_CLIP_MSE}};
    for (size_t k = 0; k < 3; k++) {
        double err;
        double err1, a1 = quantizer_smooth_search(&g, &rules[k], 10, 0, 1, s, &err1);
        double a = quantizer_smooth_search(&g, &rules[k], 10, 0, 0, s, &err);
        /* the one-standard-error rule smooths no more, and no better */
        assert_true(a1 >= 0 && a1 <= a && err1 >= err);
        assert_true(a >= 0 && a <= 1);
        double best = INFINITY;
        for (int j = 0; j <= 10; j++) {
            quantizer_smooth_scales(in_max, IN, j / 10.0, s0);
            double e = quantizer_smooth_error(&g, s0, &rules[k], 0);
            best = fmin(best, e);
            if (fabs(j / 10.0 - a) < 1e-9)
                assert_true(fabs(e - err) <= 1e-12 * e);
        }
        assert_true(err == best);
        quantizer_smooth_scales(in_max, IN, 0, s0);
        double e0 = quantizer_smooth_error(&g, s0, &rules[k], 0);
        fprintf(stderr,
                "rule %zu: alpha %.1f, error %.3g (one-SE rule: alpha %.1f, %.3g; no "
                "smoothing %.3g)\n",
                k, a, err, a1, err1, e0);
        assert_true(err <= e0); /* alpha 0 is on the grid */
        /* 40x outlier channels: per-tensor activation quantization needs
         * smoothing, and a 40x outlier is no noise, at 4.5 and 6 bits. At 3.5
         * bits with MSE clipping the weights' own error dominates, and in
         * about 1% of random draws no alpha beats none (seen in CI: seed
         * 1795463249778315), so the rule there is only held to the grid. */
        if (k < 2) {
            assert_true(a1 > 0 && err1 < e0);
            assert_true(a > 0);
            assert_true(err < 0.5 * e0);
        }
        /* the written scales are S_I^alpha */
        quantizer_smooth_scales(in_max, IN, a, s0);
        assert_memory_equal(s, s0, sizeof s);
    }
    /* more bits, less error (same alpha) */
    quantizer_smooth_scales(in_max, IN, 0.5, s);
    struct quantizer_tensor_rule r3 = {.bits = 3, .uniform_bits = 3};
    struct quantizer_tensor_rule r8 = {.bits = 8, .uniform_bits = 8};
    assert_true(quantizer_smooth_error(&g, s, &r8, 0) < quantizer_smooth_error(&g, s, &r3, 0));
    /* evaluating a subset of rows stays close */
    double full = quantizer_smooth_error(&g, s, &rules[0], 0);
    double part = quantizer_smooth_error(&g, s, &rules[0], 16);
    assert_true(part > 0.3 * full && part < 3 * full);
    /* no samples: no error, alpha 0 */
    g.n_sample = 0;
    assert_true(quantizer_smooth_search(&g, &rules[0], 10, 0, 0, s, NULL) == 0);
    assert_true(quantizer_smooth_search(&g, &rules[0], 10, 0, 1, s, NULL) == 0);
    free(x);
    free(w1);
    free(w2);
}

/* ---- whole models ---------------------------------------------------------------------------- */

/* Calibration through the runtime's observer: one forward of ids. */
static struct quantizer_calib *calibrate(const char *model, const int *ids, uint32_t n)
{
    struct sl_err err;
    struct infer_model *m;
    struct infer_state *s;
    assert_int_equal(infer_model_load(model, NULL, &m, &err), 0);
    const struct format_config *c = infer_model_config(m);
    struct quantizer_calib *cal;
    assert_int_equal(quantizer_calib_create(c, 128, &cal), 0);
    infer_model_set_observer(m, quantizer_calib_observe, cal);
    assert_int_equal(infer_state_create(m, n, &s, &err), 0);
    float *lg = malloc(sizeof(float) * c->vocab_size);
    assert_int_equal(infer_forward(m, s, ids, n, 0, lg, INFER_LOGITS_LAST, &err), 0);
    assert_true(quantizer_calib_ok(cal));
    assert_int_equal(quantizer_calib_rows(cal), n);
    free(lg);
    infer_state_destroy(s);
    infer_model_destroy(m);
    return cal;
}

static float *logits_all(const char *model, const int *ids, uint32_t n, uint32_t *vocab)
{
    struct sl_err err;
    struct infer_model *m;
    struct infer_state *s;
    if (infer_model_load(model, NULL, &m, &err) < 0)
        fail_msg("%s", err.msg);
    *vocab = infer_model_config(m)->vocab_size;
    assert_int_equal(infer_state_create(m, n, &s, &err), 0);
    float *lg = malloc(sizeof(float) * n * *vocab);
    assert_int_equal(infer_forward(m, s, ids, n, 0, lg, INFER_LOGITS_ALL, &err), 0);
    infer_state_destroy(s);
    infer_model_destroy(m);
    return lg;
}

static float *norm_weight(const char *model, int layer, uint32_t role, uint32_t *n)
{
    struct format_reader *r;
    struct sl_err err;
    assert_int_equal(format_reader_open(model, &r, &err), 0);
    uint64_t numel;
    float *f = test_tensor_f32(r, layer, role, &numel, NULL);
    *n = (uint32_t)numel;
    format_reader_close(r);
    return f;
}

/* Smooths `model` (float_out) and compares logits on ids; returns the
 * largest relative change of any norm weight (that smoothing happened). */
static double smoothed_same(const char *model, struct quantizer_calib *cal,
                            enum quantizer_method method, double alpha, const int *ids, uint32_t n,
                            const char *out)
{
    struct quantizer_opts o = {.method = method, .bits = 5, .alpha = alpha, .float_out = 1};
    struct quantizer_report rep;
    struct sl_err err;
    if (quantizer_quantize(model, cal, &o, out, &rep, &err) < 0)
        fail_msg("%s", err.msg);
    assert_true(rep.groups > 0);
    uint32_t v1, v2;
    float *a = logits_all(model, ids, n, &v1), *b = logits_all(out, ids, n, &v2);
    assert_int_equal(v1, v2);
    double worst = 0, scale = 0;
    for (size_t i = 0; i < (size_t)n * v1; i++) {
        scale = fmax(scale, fabs((double)a[i]));
        worst = fmax(worst, fabs((double)a[i] - b[i]));
    }
    fprintf(stderr, "%s %s alpha %.2f: max |logit change| %.3g of max |logit| %.3g\n", model,
            quantizer_method_name(method), alpha < 0 ? rep.mean_alpha : alpha, worst, scale);
    assert_true(worst <= 1e-5 * scale); /* measured 3e-7 to 5e-7 */
    free(a);
    free(b);
    /* the norms carry the smoothing */
    struct format_reader *r;
    assert_int_equal(format_reader_open(model, &r, &err), 0);
    uint32_t L = format_reader_config(r)->n_layers;
    format_reader_close(r);
    double changed = 0;
    for (uint32_t l = 0; l < L; l++) {
        uint32_t n1, n2;
        float *x = norm_weight(model, (int)l, FORMAT_ROLE_ATTN_NORM, &n1);
        float *y = norm_weight(out, (int)l, FORMAT_ROLE_ATTN_NORM, &n2);
        for (uint32_t i = 0; i < n1; i++)
            changed = fmax(changed, fabs((double)y[i] / x[i] - 1));
        free(x);
        free(y);
    }
    return changed;
}

static void test_model_invariance_synth(void **st)
{
    (void)st;
    struct sl_err err;
    const char *model = test_tmp_path("tiny.sluice");
    assert_int_equal(import_synth("tiny", 21, model, NULL, NULL, &err), 0);
    enum { N = 96 };
    int ids[N];
    ids[0] = 1;
    for (int i = 1; i < N; i++)
        ids[i] = 3 + (int)test_rng_below(&rng, 500);
    struct quantizer_calib *cal = calibrate(model, ids, N);
    assert_true(smoothed_same(model, cal, QUANTIZER_METHOD_EDGEFLOW, 0.5, ids, N,
                              test_tmp_path("s1.sluice")) > 0.1);
    smoothed_same(model, cal, QUANTIZER_METHOD_EDGEFLOW, -1, ids, N, test_tmp_path("s2.sluice"));
    assert_true(smoothed_same(model, cal, QUANTIZER_METHOD_SMOOTHQUANT, -1, ids, N,
                              test_tmp_path("s3.sluice")) > 0.1);
    /* without calibration nothing is smoothed: the float model is copied */
    struct quantizer_opts o = {
        .method = QUANTIZER_METHOD_EDGEFLOW, .bits = 5, .alpha = -1, .float_out = 1};
    struct quantizer_report rep;
    assert_int_equal(quantizer_quantize(model, NULL, &o, test_tmp_path("s4.sluice"), &rep, &err),
                     0);
    assert_int_equal(rep.groups, 0);
    quantizer_calib_destroy(cal);
}

static void test_model_invariance_kjv(void **st)
{
    (void)st;
    const char *bin = test_shared_path("models/kjv6L.bin");
    char bin_s[4096], tok_s[4096], txt_s[4096];
    if (!bin)
        skip();
    snprintf(bin_s, sizeof bin_s, "%s", bin);
    snprintf(tok_s, sizeof tok_s, "%s", test_shared_path("models/kjv6L.tok1024.bin"));
    snprintf(txt_s, sizeof txt_s, "%s", test_shared_path("models/kjv6L.calib.txt"));
    struct sl_err err;
    const char *model = test_tmp_path("kjv.sluice");
    struct import_opts io = {.tokenizer = tok_s, .dtype = -1};
    if (import_model(bin_s, &io, model, &err) < 0)
        fail_msg("%s", err.msg);
    /* calibrate on the first 256 tokens of the text, compare on the next 256 */
    struct format_reader *r;
    assert_int_equal(format_reader_open(model, &r, &err), 0);
    struct infer_tokenizer *tk;
    assert_int_equal(
        infer_tokenizer_create(format_reader_tokenizer(r), format_reader_config(r), &tk, &err), 0);
    size_t len;
    char *text = test_read_file(txt_s, &len);
    assert_non_null(text);
    int *ids;
    uint32_t n;
    assert_int_equal(infer_tokenizer_encode_stream(tk, text, len, &ids, &n), 0);
    assert_true(n > 600);
    ids[0] = ids[256] = 1; /* BOS */
    struct quantizer_calib *cal = calibrate(model, ids, 256);
    assert_true(smoothed_same(model, cal, QUANTIZER_METHOD_EDGEFLOW, 0.5, ids + 256, 256,
                              test_tmp_path("k1.sluice")) > 0.1);
    smoothed_same(model, cal, QUANTIZER_METHOD_EDGEFLOW, -1, ids + 256, 256,
                  test_tmp_path("k2.sluice"));
    smoothed_same(model, cal, QUANTIZER_METHOD_SMOOTHQUANT, -1, ids + 256, 256,
                  test_tmp_path("k3.sluice"));
    quantizer_calib_destroy(cal);
    free(ids);
    free(text);
    infer_tokenizer_destroy(tk);
    format_reader_close(r);
}

int main(int argc, char **argv)
{
    test_rng_init(&rng, test_seed());
    if (argc > 1 && !strcmp(argv[1], "--real")) {
        if (!test_shared_path("models/kjv6L.bin"))
            test_skip_all("../shared/models/kjv6L.bin not found");
        const struct CMUnitTest real[] = {cmocka_unit_test(test_model_invariance_kjv)};
        return cmocka_run_group_tests(real, NULL, NULL);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_group_invariance),
        cmocka_unit_test(test_smoothquant_scales),
        cmocka_unit_test(test_act_scale),
        cmocka_unit_test(test_o_common),
        cmocka_unit_test(test_search),
        cmocka_unit_test(test_model_invariance_synth),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

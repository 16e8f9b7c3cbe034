/* test_synth.c: synthetic models.
 * - determinism: the same shape and seed give byte-identical files (also on
 *   1 or 3 generating threads), another seed a different one;
 * - the built-in shapes are the real architectures' (tinyllama-1.1b,
 *   llama3-8b fields as published) and valid;
 * - the vocabulary: <unk> <s> </s>, the 256 byte tokens, distinct pieces; any
 *   UTF-8 prompt tokenizes and decodes back to itself;
 * - the statistics: log-normal row scales, heavy tails, norm weights around 1
 *   with a few large channels;
 * - numerically stable: a forward pass through the runtime keeps the residual
 *   stream bounded, logits finite, and the inputs of the Q/K/V, gate/up and
 *   classifier projections show the outlier channels smoothing targets. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "import.h"
#include "infer.h"
#include "testfmt.h"
#include "testutil.h"

/* A tensor of a synthetic model as floats; synth writes F16. */
static float *tensor_f32(struct format_reader *r, int layer, uint32_t role, uint64_t *n)
{
    const struct format_tensor_info *t;
    float *f = test_tensor_f32(r, layer, role, n, &t);
    assert_int_equal(t->encoding, FORMAT_ENC_F16);
    return f;
}

static void test_determinism(void **st)
{
    (void)st;
    struct sl_err err;
    assert_int_equal(import_synth("tiny", 5, test_tmp_path("s1.sluice"), NULL, NULL, &err), 0);
    assert_int_equal(import_synth("tiny", 5, test_tmp_path("s2.sluice"), NULL, NULL, &err), 0);
    assert_int_equal(import_synth("tiny", 6, test_tmp_path("s3.sluice"), NULL, NULL, &err), 0);
    size_t l1, l2, l3;
    uint8_t *a = test_read_file(test_tmp_path("s1.sluice"), &l1);
    uint8_t *b = test_read_file(test_tmp_path("s2.sluice"), &l2);
    uint8_t *c = test_read_file(test_tmp_path("s3.sluice"), &l3);
    assert_int_equal(l1, l2);
    assert_memory_equal(a, b, l1);
    assert_true(l1 != l3 || memcmp(a, c, l1) != 0);
    assert_true(l1 < (4u << 20)); /* "a few MB at most" */
    /* rows are split among threads: 1 or 3 threads give the same bytes */
    for (int t = 1; t <= 3; t += 2) {
        char n[8];
        snprintf(n, sizeof n, "%d", t);
        setenv("SLUICE_SYNTH_THREADS", n, 1);
        assert_int_equal(import_synth("tiny", 5, test_tmp_path("s2.sluice"), NULL, NULL, &err), 0);
        unsetenv("SLUICE_SYNTH_THREADS");
        free(b);
        b = test_read_file(test_tmp_path("s2.sluice"), &l2);
        assert_int_equal(l1, l2);
        assert_memory_equal(a, b, l1);
    }
    free(a);
    free(b);
    free(c);
    struct format_reader *r;
    assert_int_equal(format_reader_open(test_tmp_path("s1.sluice"), &r, &err), 0);
    const void *v;
    uint64_t n;
    assert_int_equal(format_reader_meta_get(r, "synth.shape", &v, &n), 0);
    assert_memory_equal(v, "tiny", 4);
    assert_int_equal(format_reader_meta_get(r, "synth.seed", &v, &n), 0);
    assert_memory_equal(v, "5", 1);
    format_reader_close(r);
    assert_int_equal(import_synth("nope", 1, test_tmp_path("x.sluice"), NULL, NULL, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "nope"));
}

static void test_shapes(void **st)
{
    (void)st;
    size_t n;
    const struct import_synth_shape *s = import_synth_shapes(&n);
    int seen = 0;
    for (size_t i = 0; i < n; i++) {
        struct sl_err err;
        assert_int_equal(format_config_validate(&s[i].cfg, s[i].name, &err), 0);
        assert_int_equal(s[i].cfg.tied_embedding, 0);
        assert_int_equal(s[i].cfg.head_dim * s[i].cfg.n_heads, s[i].cfg.dim);
        assert_true(strlen(s[i].description) > 0);
        const struct format_config *c = &s[i].cfg;
        if (!strcmp(s[i].name, "tinyllama-1.1b")) {
            seen |= 1;
            assert_int_equal(c->dim, 2048);
            assert_int_equal(c->hidden_dim, 5632);
            assert_int_equal(c->n_layers, 22);
            assert_int_equal(c->n_heads, 32);
            assert_int_equal(c->n_kv_heads, 4);
            assert_int_equal(c->vocab_size, 32000);
            assert_int_equal(c->seq_len, 2048);
            assert_true(c->rope_theta == 10000.0f);
        } else if (!strcmp(s[i].name, "llama3-8b")) {
            seen |= 2;
            assert_int_equal(c->dim, 4096);
            assert_int_equal(c->hidden_dim, 14336);
            assert_int_equal(c->n_layers, 32);
            assert_int_equal(c->n_heads, 32);
            assert_int_equal(c->n_kv_heads, 8);
            assert_int_equal(c->vocab_size, 128256);
            assert_int_equal(c->seq_len, 8192);
            assert_true(c->rope_theta == 500000.0f);
        } else if (!strcmp(s[i].name, "tiny")) {
            seen |= 4;
        }
    }
    assert_int_equal(seen, 7);
}

static void test_vocab(void **st)
{
    (void)st;
    struct sl_err err;
    assert_int_equal(import_synth("tiny", 9, test_tmp_path("v.sluice"), NULL, NULL, &err), 0);
    struct format_reader *r;
    assert_int_equal(format_reader_open(test_tmp_path("v.sluice"), &r, &err), 0);
    const struct format_config *c = format_reader_config(r);
    const struct format_tokenizer *t = format_reader_tokenizer(r);
    assert_int_equal(t->n_tokens, c->vocab_size);
    assert_int_equal(c->bos_id, 1);
    assert_int_equal(c->eos_id, 2);
    assert_memory_equal(t->tokens[0], "<unk>", 5);
    assert_memory_equal(t->tokens[1], "<s>", 3);
    assert_memory_equal(t->tokens[2], "</s>", 4);
    for (int b = 0; b < 256; b++) {
        char want[8];
        snprintf(want, sizeof want, "<0x%02X>", b);
        assert_int_equal(t->lens[3 + b], 6);
        assert_memory_equal(t->tokens[3 + b], want, 6);
    }
    for (uint32_t i = 0; i < t->n_tokens; i++)
        for (uint32_t j = i + 1; j < t->n_tokens; j++)
            assert_false(t->lens[i] == t->lens[j] &&
                         !memcmp(t->tokens[i], t->tokens[j], t->lens[i]));
    /* any prompt tokenizes (byte fallback) and decodes back */
    struct infer_tokenizer *tk;
    assert_int_equal(infer_tokenizer_create(t, c, &tk, &err), 0);
    const char *prompt = "Zwölf Boxkämpfer jagen Viktor quer über den großen Sylter Deich. "
                         "\xe6\x97\xa5\xe6\x9c\xac 123 {x: [1, 2]}\n\ttab";
    int toks[512];
    uint32_t nt;
    assert_int_equal(infer_tokenizer_encode(tk, prompt, 1, toks, 512, &nt), 0);
    assert_true(nt > 10);
    char back[1024];
    size_t bl = 0;
    for (uint32_t i = 1; i < nt; i++) {
        assert_true(toks[i] >= 3 && (uint32_t)toks[i] < c->vocab_size);
        size_t pl;
        const char *p = infer_tokenizer_decode(tk, toks[i - 1], toks[i], &pl);
        assert_true(bl + pl < sizeof back);
        memcpy(back + bl, p, pl);
        bl += pl;
    }
    assert_int_equal(bl, strlen(prompt));
    assert_memory_equal(back, prompt, bl);
    infer_tokenizer_destroy(tk);
    format_reader_close(r);
}

static void test_statistics(void **st)
{
    (void)st;
    struct sl_err err;
    assert_int_equal(import_synth("tiny", 11, test_tmp_path("t.sluice"), NULL, NULL, &err), 0);
    struct format_reader *r;
    assert_int_equal(format_reader_open(test_tmp_path("t.sluice"), &r, &err), 0);
    const struct format_config *c = format_reader_config(r);
    uint32_t dim = c->dim;
    /* the outlier channels, as the attention norm of layer 0 shows them */
    uint64_t n;
    float *norm = tensor_f32(r, 0, FORMAT_ROLE_ATTN_NORM, &n);
    assert_int_equal(n, dim);
    int n_out = 0;
    double sum = 0, sumsq = 0;
    int *is_out = calloc(dim, sizeof(int));
    for (uint32_t k = 0; k < dim; k++) {
        if (norm[k] > 4.0f) {
            is_out[k] = 1;
            n_out++;
            continue;
        }
        sum += norm[k];
        sumsq += (double)norm[k] * norm[k];
    }
    double mean = sum / (dim - n_out), sd = sqrt(sumsq / (dim - n_out) - mean * mean);
    assert_true(n_out >= 2 && n_out <= 8);
    assert_true(fabs(mean - 1.0) < 0.05);
    assert_true(sd > 0.05 && sd < 0.2);
    /* every norm (the final one too) has the same outlier channels */
    float *onorm = tensor_f32(r, -1, FORMAT_ROLE_OUT_NORM, &n);
    for (uint32_t k = 0; k < dim; k++)
        assert_int_equal(onorm[k] > 4.0f, is_out[k]);
    free(onorm);
    /* wq: log-normal row scales (sd of log row rms near 0.35), heavy tails
     * (kurtosis of the normalized weights > 3), outlier columns shrunk */
    float *wq = tensor_f32(r, 0, FORMAT_ROLE_WQ, &n);
    uint32_t rows = (uint32_t)(n / dim);
    double ls = 0, lss = 0, m2 = 0, m4 = 0, colsum_out = 0, colsum_in = 0;
    for (uint32_t i = 0; i < rows; i++) {
        double ss = 0;
        for (uint32_t k = 0; k < dim; k++)
            if (!is_out[k])
                ss += (double)wq[i * dim + k] * wq[i * dim + k];
        double rms = sqrt(ss / (dim - n_out));
        ls += log(rms);
        lss += log(rms) * log(rms);
        for (uint32_t k = 0; k < dim; k++) {
            double z = wq[i * dim + k] / rms;
            if (is_out[k]) {
                colsum_out += fabs(z);
            } else {
                m2 += z * z;
                m4 += z * z * z * z;
                colsum_in += fabs(z);
            }
        }
    }
    double lmean = ls / rows, lsd = sqrt(lss / rows - lmean * lmean);
    assert_true(lsd > 0.2 && lsd < 0.5);
    double cnt = (double)rows * (dim - n_out);
    double kurt = (m4 / cnt) / ((m2 / cnt) * (m2 / cnt));
    assert_true(kurt > 3.5);
    assert_true(colsum_out / (rows * n_out) < 0.3 * colsum_in / cnt);
    free(wq);
    free(norm);
    free(is_out);
    format_reader_close(r);
}

struct act_stats {
    int is_out[4096];
    uint32_t dim;
    double max_out[FORMAT_ROLE_COUNT], max_in[FORMAT_ROLE_COUNT]; /* over rows, per role */
    int bad;
};

static void observe(void *ctx, int layer, uint32_t role, const float *x, uint32_t rows,
                    uint32_t in_cols, const float *y, uint32_t out_cols)
{
    (void)layer;
    struct act_stats *s = ctx;
    for (uint64_t i = 0; i < (uint64_t)rows * out_cols; i++)
        s->bad |= !isfinite(y[i]);
    if (in_cols != s->dim)
        return;
    for (uint32_t rr = 0; rr < rows; rr++)
        for (uint32_t k = 0; k < in_cols; k++) {
            double a = fabs(x[(uint64_t)rr * in_cols + k]);
            double *m = s->is_out[k] ? &s->max_out[role] : &s->max_in[role];
            *m = a > *m ? a : *m;
        }
}

static void test_forward(void **st)
{
    (void)st;
    struct sl_err err;
    assert_int_equal(import_synth("tiny", 13, test_tmp_path("f.sluice"), NULL, NULL, &err), 0);
    struct format_reader *r;
    assert_int_equal(format_reader_open(test_tmp_path("f.sluice"), &r, &err), 0);
    uint64_t n;
    float *norm = tensor_f32(r, 0, FORMAT_ROLE_ATTN_NORM, &n);
    static struct act_stats s;
    memset(&s, 0, sizeof s);
    s.dim = (uint32_t)n;
    for (uint32_t k = 0; k < n; k++)
        s.is_out[k] = norm[k] > 4.0f;
    free(norm);
    format_reader_close(r);

    struct infer_model *m;
    if (infer_model_load(test_tmp_path("f.sluice"), NULL, &m, &err) < 0)
        fail_msg("%s", err.msg);
    const struct format_config *c = infer_model_config(m);
    struct infer_state *state;
    assert_int_equal(infer_state_create(m, 64, &state, &err), 0);
    infer_model_set_observer(m, observe, &s);
    enum { T = 48 };
    int toks[T];
    struct test_rng rng;
    test_rng_init(&rng, test_seed());
    toks[0] = 1;
    for (int i = 1; i < T; i++)
        toks[i] = 3 + (int)test_rng_below(&rng, c->vocab_size - 3);
    /* the residual stream layer by layer */
    float *x = malloc(sizeof(float) * T * c->dim);
    assert_int_equal(infer_embed(m, toks, T, x, &err), 0);
    double rms0 = 0;
    for (uint32_t i = 0; i < T * c->dim; i++)
        rms0 += (double)x[i] * x[i];
    rms0 = sqrt(rms0 / (T * c->dim));
    for (uint32_t l = 0; l < c->n_layers; l++) {
        assert_int_equal(infer_layer_forward(m, state, (int)l, x, T, 0, &err), 0);
        double rms = 0;
        for (uint32_t i = 0; i < T * c->dim; i++) {
            assert_true(isfinite(x[i]));
            rms += (double)x[i] * x[i];
        }
        rms = sqrt(rms / (T * c->dim));
        /* bounded growth: each layer adds O(1) relative to the stream */
        assert_true(rms < rms0 * (2.0 + l));
    }
    float *logits = malloc(sizeof(float) * T * c->vocab_size);
    assert_int_equal(infer_head_forward(m, state, x, T, logits, &err), 0);
    double lsum = 0, lsq = 0;
    for (uint64_t i = 0; i < (uint64_t)T * c->vocab_size; i++) {
        assert_true(isfinite(logits[i]));
        lsum += logits[i];
        lsq += (double)logits[i] * logits[i];
    }
    double cnt = (double)T * c->vocab_size, lsd = sqrt(lsq / cnt - (lsum / cnt) * (lsum / cnt));
    assert_true(lsd > 0.1 && lsd < 50.0); /* not degenerate, not exploding */
    assert_false(s.bad);
    /* outlier channels in the inputs of the projections reading a norm */
    static const uint32_t roles[] = {FORMAT_ROLE_WQ,     FORMAT_ROLE_WK,   FORMAT_ROLE_WV,
                                     FORMAT_ROLE_W_GATE, FORMAT_ROLE_W_UP, FORMAT_ROLE_CLASSIFIER};
    for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++)
        if (!(s.max_out[roles[i]] > 2.0 * s.max_in[roles[i]]))
            fail_msg("role %u: outlier channels max %g, others %g", roles[i], s.max_out[roles[i]],
                     s.max_in[roles[i]]);
    free(logits);
    free(x);
    infer_state_destroy(state);
    infer_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_determinism), cmocka_unit_test(test_shapes),
        cmocka_unit_test(test_vocab),       cmocka_unit_test(test_statistics),
        cmocka_unit_test(test_forward),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_spec_real.c: speculative decoding on every real model in
 * ../shared/models (kjv6L, kjv6L-1k, aidreams260K, imported from their
 * llama2.c files; kjv6L also quantized to int8 with static activation
 * scales) over its golden prompts and a context-heavy prompt (a passage of
 * its calibration text, then the passage's opening again): greedy tokens
 * identical to plain decoding, and the KV cache and last logits identical
 * bit for bit afterwards, for 4, 8 and 16-row trees, with calibration,
 * reuse and a history. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "import.h"
#include "infer.h"
#include "testutil.h"

#define GEN 96

struct toks {
    int t[4096];
    uint32_t n;
};

static int keep(void *ctx, int tok)
{
    struct toks *c = ctx;
    if (c->n < 4096)
        c->t[c->n++] = tok;
    return 0;
}

/* A context-heavy prompt: lines [a, a + lines) of the calibration text, then
 * the first 40 bytes of line a; NULL when the text is short. */
static char *context_prompt(const char *calib, int a, int lines, size_t max_passage)
{
    char *text = test_read_file(calib, NULL);
    if (!text)
        return NULL;
    char *out = calloc(1, strlen(text) + 64);
    const char *p = text, *first = NULL;
    for (int line = 0; *p && line < a + lines; line++) {
        const char *e = strchr(p, '\n');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (line >= a) {
            if (!first)
                first = p;
            size_t at = strlen(out);
            memcpy(out + at, p, len);
            memcpy(out + at + len, " ", 2);
        }
        p = e ? e + 1 : p + len;
    }
    if (strlen(out) > max_passage)
        out[max_passage] = 0;
    if (first) {
        size_t at = strlen(out);
        memcpy(out + at, first, 40);
        out[at + 40] = 0;
    }
    free(text);
    return out;
}

static uint32_t g_rounds, g_accepted;

static void check_prompt(struct infer_model *m, const struct infer_tokenizer *tk,
                         const char *prompt, uint32_t rows, int calibrate, const int *history,
                         uint32_t n_history)
{
    const struct format_config *c = infer_model_config(m);
    static int ids[4096];
    uint32_t n;
    assert_int_equal(infer_tokenizer_encode(tk, prompt, 1, ids, c->seq_len - 24, &n), 0);
    uint32_t gen = c->seq_len - n - 1 < GEN ? c->seq_len - n - 1 : GEN;
    struct sl_err err;
    struct infer_session_opts so = {.max_batch = 64};
    struct infer_session *a, *b;
    assert_int_equal(infer_session_create(m, &so, &a, &err), 0);
    assert_int_equal(infer_session_create(m, &so, &b, &err), 0);
    assert_int_equal(infer_session_prefill(a, ids, n, &err), 0);
    assert_int_equal(infer_session_prefill(b, ids, n, &err), 0);
    static struct toks ta, tb;
    ta.n = tb.n = 0;
    uint32_t na, nb;
    assert_int_equal(infer_session_generate(a, gen, NULL, 0, keep, &ta, &na, &err), 0);
    struct infer_spec *sp;
    struct infer_spec_opts o = {
        .max_rows = rows, .calibrate = calibrate, .history = history, .n_history = n_history};
    assert_int_equal(infer_spec_create(b, ids, n, &o, &sp, &err), 0);
    assert_int_equal(infer_spec_generate(sp, gen, NULL, 0, keep, &tb, &nb, &err), 0);
    struct infer_spec_stats st;
    infer_spec_stats(sp, &st);
    g_rounds += st.rounds;
    g_accepted += st.accepted;
    assert_int_equal(na, nb);
    assert_int_equal(ta.n, tb.n);
    assert_memory_equal(ta.t, tb.t, sizeof(int) * ta.n);
    struct infer_kv *ka = infer_state_kv(infer_session_state(a));
    struct infer_kv *kb = infer_state_kv(infer_session_state(b));
    assert_int_equal(infer_kv_len(ka), infer_kv_len(kb));
    size_t w = (size_t)c->n_kv_heads * c->head_dim * infer_kv_len(ka) * sizeof(float);
    for (uint32_t l = 0; l < c->n_layers; l++) {
        assert_memory_equal(infer_kv_keys(ka, l), infer_kv_keys(kb, l), w);
        assert_memory_equal(infer_kv_values(ka, l), infer_kv_values(kb, l), w);
    }
    for (uint32_t i = 0; i < infer_kv_len(ka); i++)
        assert_int_equal(infer_kv_pos(ka, i), infer_kv_pos(kb, i));
    assert_memory_equal(infer_session_logits(a), infer_session_logits(b),
                        sizeof(float) * c->vocab_size);
    infer_spec_destroy(sp);
    infer_session_destroy(a);
    infer_session_destroy(b);
}

static void run_model(const char *bin, const char *tok, const char *name, int quantize)
{
    char src[4096], tk_path[4096], out[4200], calib[4096];
    snprintf(src, sizeof src, "%s", test_shared_path(bin));
    snprintf(tk_path, sizeof tk_path, "%s", test_shared_path(tok));
    snprintf(out, sizeof out, "%s/%s.sluice", test_tmpdir(), name);
    struct import_opts io = {.tokenizer = tk_path, .dtype = -1};
    struct sl_err err;
    if (import_model(src, &io, out, &err) < 0)
        fail_msg("import %s: %s", src, err.msg);
    if (quantize) {
        char q[4300];
        snprintf(q, sizeof q, "%s.q8", out);
        if (test_system("%s quantize %s -o %s --bits 8 --method uniform --budget tensor "
                        "--calib-tokens 64 "
                        ">/dev/null",
                        test_sluice_bin(), out, q) != 0)
            fail_msg("sluice quantize %s failed", out);
        snprintf(out, sizeof out, "%s", q);
    }
    struct infer_model *m;
    assert_int_equal(infer_model_load(out, NULL, &m, &err), 0);
    assert_int_equal(infer_spec_exact(m), 1);
    struct infer_tokenizer *tk;
    assert_int_equal(infer_tokenizer_create(format_reader_tokenizer(infer_model_reader(m)),
                                            infer_model_config(m), &tk, &err),
                     0);
    /* the golden prompts of this model (kjv6L-1k has long1; the others greedy1-3) */
    const char *model_name = !strcmp(name, "kjv6L-1k")    ? "kjv6L-1k"
                             : !strncmp(name, "kjv6L", 5) ? "kjv6L"
                                                          : name;
    static const char *const cases[] = {"greedy1", "greedy2", "greedy3", "long1"};
    uint32_t rows_cycle[3] = {4, 8, 16}, k = 0;
    int history[64];
    for (int i = 0; i < 64; i++)
        history[i] = i % 17 == 16 ? -1 : 3 + i * 5 % 300;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char rel[512];
        snprintf(rel, sizeof rel, "golden/%s.%s.prompt.txt", model_name, cases[i]);
        char path[4600];
        snprintf(path, sizeof path, "%s/%s", test_shared_dir(), rel);
        char *text = test_read_file(path, NULL); /* not every model has every case */
        if (!text)
            continue;
        size_t len = strlen(text);
        while (len && text[len - 1] == '\n')
            text[--len] = 0;
        check_prompt(m, tk, text, rows_cycle[k % 3], k % 2, k % 3 == 2 ? history : NULL, 64);
        k++;
        free(text);
    }
    snprintf(calib, sizeof calib, "%s",
             test_shared_path(!strncmp(name, "kjv", 3) ? "models/kjv6L.calib.txt"
                                                       : "models/aidreams260K.calib.txt"));
    for (int a = 0; a < 2; a++) {
        uint32_t seq = infer_model_config(m)->seq_len;
        char *pr =
            context_prompt(calib, 10 + 20 * a, seq >= 1024 ? 6 : 2, seq >= 256 ? 100000 : 150);
        assert_non_null(pr);
        check_prompt(m, tk, pr, rows_cycle[(k + a) % 3], a == 0, NULL, 0);
        free(pr);
    }
    infer_tokenizer_destroy(tk);
    infer_model_destroy(m);
}

static void test_kjv6L(void **st)
{
    (void)st;
    run_model("models/kjv6L.bin", "models/kjv6L.tok1024.bin", "kjv6L", 0);
}

static void test_kjv6L_1k(void **st)
{
    (void)st;
    run_model("models/kjv6L-1k.bin", "models/kjv6L-1k.tok1024.bin", "kjv6L-1k", 0);
}

static void test_aidreams(void **st)
{
    (void)st;
    run_model("models/aidreams260K.bin", "models/aidreams260K.tok512.bin", "aidreams260K", 0);
}

static void test_kjv6L_int8(void **st)
{
    (void)st;
    run_model("models/kjv6L.bin", "models/kjv6L.tok1024.bin", "kjv6L-q8", 1);
}

/* Speculation did something: drafts were verified and some accepted. */
static void test_drafts_used(void **st)
{
    (void)st;
    assert_true(g_rounds > 0);
    assert_true(g_accepted > 0);
}

int main(void)
{
    if (!test_shared_path("models/kjv6L.bin") || !test_shared_path("golden"))
        test_skip_all("../shared (models and golden prompts) is absent; set SLUICE_SHARED");
    if (!test_sluice_bin())
        test_skip_all("the sluice binary is unknown ($SLUICE_BIN)");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kjv6L),       cmocka_unit_test(test_kjv6L_1k),
        cmocka_unit_test(test_aidreams),    cmocka_unit_test(test_kjv6L_int8),
        cmocka_unit_test(test_drafts_used),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

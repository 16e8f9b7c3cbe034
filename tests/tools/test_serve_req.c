/* test_serve_req.c: the server's pure parts: request bodies to struct
 * serve_req or an OpenAI-shaped error (every field, type and range), stop
 * sequences and UTF-8 hold-back over a growing reply (against a brute-force
 * reference on random texts), and chat templates. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve_req.h"
#include "serve_text.h"
#include "testutil.h"

static const struct serve_limits lim = {.model_id = "kjv", .max_tokens = 256};

static void parse_ok(enum serve_kind k, const char *body, struct serve_req *r)
{
    struct serve_error e;
    if (serve_req_parse(k, body, strlen(body), &lim, r, &e) != 0)
        fail_msg("%s: refused: %s", body, e.message);
}

static void test_defaults(void **state)
{
    (void)state;
    struct serve_req r;
    parse_ok(SERVE_COMPLETIONS, "{\"prompt\":\"In the beginning\"}", &r);
    assert_string_equal(r.prompt, "In the beginning");
    assert_null(r.model);
    assert_false(r.max_tokens_set);
    assert_true(r.temperature == 1.0 && r.top_p == 1.0);
    assert_int_equal(r.seed, 42);
    assert_false(r.stream);
    assert_int_equal(r.n_stop, 0);
    serve_req_free(&r);
}

static void test_fields(void **state)
{
    (void)state;
    struct serve_req r;
    parse_ok(SERVE_COMPLETIONS,
             "{\"model\":\"kjv\",\"prompt\":[\"x\"],\"max_tokens\":7,\"temperature\":0,"
             "\"top_p\":0.5,\"seed\":-1,\"stop\":[\"\\n\",\"Amen\"],\"stream\":true,"
             "\"stream_options\":{\"include_usage\":true},\"n\":1,\"user\":\"ignored\"}",
             &r);
    assert_string_equal(r.model, "kjv");
    assert_string_equal(r.prompt, "x");
    assert_true(r.max_tokens_set && r.max_tokens == 7);
    assert_true(r.temperature == 0 && r.top_p == 0.5);
    assert_true(r.seed == UINT64_MAX);
    assert_int_equal(r.n_stop, 2);
    assert_string_equal(r.stop[0], "\n");
    assert_string_equal(r.stop[1], "Amen");
    assert_true(r.stream && r.include_usage);
    serve_req_free(&r);
    parse_ok(SERVE_CHAT,
             "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\","
             "\"content\":[{\"type\":\"text\",\"text\":\"Hi \"},{\"type\":\"text\",\"text\":"
             "\"there\"}]},{\"role\":\"assistant\",\"content\":null}],"
             "\"max_completion_tokens\":3,\"stop\":\"END\"}",
             &r);
    assert_int_equal(r.n_msgs, 3);
    assert_string_equal(r.msgs[1].content, "Hi there");
    assert_string_equal(r.msgs[2].content, "");
    assert_true(r.max_tokens_set && r.max_tokens == 3);
    assert_int_equal(r.n_stop, 1);
    serve_req_free(&r);
}

static void test_errors(void **state)
{
    (void)state;
    static const struct {
        enum serve_kind k;
        const char *body, *param;
        int status;
    } cases[] = {
        {SERVE_COMPLETIONS, "{", NULL, 400},
        {SERVE_COMPLETIONS, "", NULL, 400},
        {SERVE_COMPLETIONS, "\"str\"", NULL, 400},
        {SERVE_COMPLETIONS, "{} trailing", NULL, 400},
        {SERVE_COMPLETIONS, "{}", "prompt", 400},
        {SERVE_COMPLETIONS, "{\"prompt\":null}", "prompt", 400},
        {SERVE_COMPLETIONS, "{\"prompt\":[\"a\",\"b\"]}", "prompt", 400},
        {SERVE_COMPLETIONS, "{\"prompt\":[1,2]}", "prompt", 400},
        {SERVE_COMPLETIONS, "{\"prompt\":\"a\",\"model\":\"gpt\"}", "model", 404},
        {SERVE_COMPLETIONS, "{\"prompt\":\"a\",\"model\":[]}", "model", 400},
        {SERVE_COMPLETIONS, "{\"prompt\":\"a\",\"max_tokens\":0}", "max_tokens", 400},
        {SERVE_COMPLETIONS, "{\"prompt\":\"a\",\"max_tokens\":-3}", "max_tokens", 400},
        {SERVE_COMPLETIONS, "{\"prompt\":\"a\",\"max_tokens\":1.5}", "max_tokens", 400},
        {SERVE_COMPLETIONS, "{\"prompt\":\"a\",\"max_tokens\":257}", "max_tokens", 400},
        {SERVE_COMPLETIONS, "{\"prompt\":\"a\",\"max_tokens\":\"4\"}", "max_tokens", 400},
        {SERVE_COMPLETIONS, "{\"prompt\":\"a\",\"temperature\":-0.1}", "temperature", 400},
        {SERVE_COMPLETIONS, "{\"prompt\":\"a\",\"temperature\":2.5}", "temperature", 400},
        {SERVE_COMPLETIONS, "{\"prompt\":\"a\",\"temperature\":true}", "temperature", 400},
        {SERVE_COMPLETIONS, "{\"prompt\":\"a\",\"top_p\":-1}", "top_p", 400},
        {SERVE_COMPLETIONS, "{\"prompt\":\"a\",\"seed\":1.5}", "seed", 400},
        {SERVE_COMPLETIONS, "{\"prompt\":\"a\",\"n\":3}", "n", 400},
        {SERVE_COMPLETIONS, "{\"prompt\":\"a\",\"stream\":1}", "stream", 400},
        {SERVE_COMPLETIONS, "{\"prompt\":\"a\",\"stream_options\":3}", "stream_options", 400},
        {SERVE_COMPLETIONS, "{\"prompt\":\"a\",\"stop\":5}", "stop", 400},
        {SERVE_COMPLETIONS, "{\"prompt\":\"a\",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", "stop",
         400},
        {SERVE_CHAT, "{\"prompt\":\"a\"}", "messages", 400},
        {SERVE_CHAT, "{\"messages\":{}}", "messages", 400},
        {SERVE_CHAT, "{\"messages\":[5]}", "messages", 400},
        {SERVE_CHAT, "{\"messages\":[{\"role\":\"user\"},{\"role\":\"bot\",\"content\":\"\"}]}",
         "messages", 400},
        {SERVE_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}",
         "messages", 400},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct serve_req r;
        struct serve_error e;
        int ret = serve_req_parse(cases[i].k, cases[i].body, strlen(cases[i].body), &lim, &r, &e);
        if (ret >= 0)
            fail_msg("%s: accepted", cases[i].body);
        assert_int_equal(e.status, cases[i].status);
        if (cases[i].param && (!e.param || strcmp(e.param, cases[i].param)))
            fail_msg("%s: param %s, want %s", cases[i].body, e.param ? e.param : "null",
                     cases[i].param);
        assert_true(strlen(e.message) > 5);
        assert_null(r.prompt);
        assert_null(r.msgs);
        /* the body is OpenAI's shape */
        char *js = serve_error_json(&e);
        cJSON *j = cJSON_Parse(js);
        const cJSON *o = cJSON_GetObjectItemCaseSensitive(j, "error");
        assert_true(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(o, "message")));
        assert_true(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(o, "type")));
        assert_non_null(cJSON_GetObjectItemCaseSensitive(o, "param"));
        assert_non_null(cJSON_GetObjectItemCaseSensitive(o, "code"));
        cJSON_Delete(j);
        free(js);
    }
}

/* The reference: the earliest stop start at or after sent; else the longest
 * end such that no stop could still begin before it, minus a partial UTF-8
 * character. */
static int ref_scan(char *const *stop, uint32_t n, const char *t, size_t len, size_t sent,
                    size_t *cut, size_t *safe)
{
    for (size_t p = sent; p < len; p++)
        for (uint32_t i = 0; i < n; i++) {
            size_t sl = strlen(stop[i]);
            if (p + sl <= len && !memcmp(t + p, stop[i], sl)) {
                *cut = p;
                return 1;
            }
        }
    size_t end = len;
    for (size_t p = sent; p < len; p++) {
        int could = 0;
        for (uint32_t i = 0; i < n; i++)
            could |= strlen(stop[i]) > len - p && !memcmp(t + p, stop[i], len - p);
        if (could) {
            end = p;
            break;
        }
    }
    /* a lead byte whose character is not complete before end */
    for (size_t b = 1; b <= 4 && b <= end; b++) {
        unsigned char c = (unsigned char)t[end - b];
        if ((c & 0xC0) == 0x80)
            continue;
        size_t need = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3
                                  : (c & 0xF8) == 0xF0 ? 4 : 1;
        if (need > b)
            end -= b;
        break;
    }
    *safe = end > sent ? end : sent;
    return 0;
}

static void test_stop_scan(void **state)
{
    (void)state;
    struct test_rng rng;
    test_rng_init(&rng, test_seed());
    static const char alpha[] = "ab\n \xc3\xa9\xe2\x82\xac";
    for (int iter = 0; iter < 20000; iter++) {
        char s0[8], s1[8], text[40];
        char *stops[2] = {s0, s1};
        uint32_t n = test_rng_below(&rng, 3);
        for (uint32_t i = 0; i < 2; i++) {
            uint32_t l = 1 + test_rng_below(&rng, 4);
            for (uint32_t k = 0; k < l; k++)
                stops[i][k] = alpha[test_rng_below(&rng, sizeof alpha - 1)];
            stops[i][l] = 0;
        }
        size_t len = test_rng_below(&rng, 30);
        for (size_t k = 0; k < len; k++)
            text[k] = alpha[test_rng_below(&rng, sizeof alpha - 1)];
        text[len] = 0;
        size_t sent = 0;
        /* grow the text piece by piece as a reply does */
        for (size_t end = 0; end <= len; end += 1 + test_rng_below(&rng, 3)) {
            size_t cut = 0, safe = 0, rcut = 0, rsafe = 0;
            int got = serve_stop_scan(stops, n, text, end, sent, &cut, &safe);
            int want = ref_scan(stops, n, text, end, sent, &rcut, &rsafe);
            assert_int_equal(got, want);
            if (got) {
                assert_int_equal(cut, rcut);
                break;
            }
            assert_int_equal(safe, rsafe);
            sent = safe;
        }
    }
}

static void test_templates(void **state)
{
    (void)state;
    struct serve_msg m[] = {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."},
                            {"user", "Who?"}};
    const char *stop;
    char *s = serve_template_render(SERVE_TPL_TRANSCRIPT, m, 4, &stop);
    assert_string_equal(s, "System: Be brief.\nUser: Hi\nAssistant: Hello.\nUser: Who?\n"
                           "Assistant:");
    assert_string_equal(stop, "\nUser:");
    free(s);
    assert_int_equal(serve_template_detect(NULL), SERVE_TPL_TRANSCRIPT);
    assert_int_equal(serve_template_detect("{% for m in messages %}<|im_start|>"),
                     SERVE_TPL_CHATML);
    assert_int_equal(serve_template_detect("<|start_header_id|>"), SERVE_TPL_LLAMA3);
    assert_int_equal(serve_template_detect("[INST] {{ m }} [/INST]"), SERVE_TPL_LLAMA2);
    s = serve_template_render(SERVE_TPL_CHATML, m + 1, 1, &stop);
    assert_string_equal(s, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    free(s);
    s = serve_template_render(SERVE_TPL_LLAMA2, m, 4, &stop);
    assert_string_equal(s, "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello. "
                           "[INST] Who? [/INST]");
    free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),  cmocka_unit_test(test_fields),
        cmocka_unit_test(test_errors),    cmocka_unit_test(test_stop_scan),
        cmocka_unit_test(test_templates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

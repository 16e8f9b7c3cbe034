/* test_tokenizer.c: byte-pair encoding on a small hand-made vocabulary:
 * dummy prefix, merges by highest score, byte fallback, BOS, decoding rules
 * (leading space after BOS, <0xXX> pieces), printability, and the encoder's
 * output buffer limit, random round trips, and the stream encoder against
 * the whole-text one. The real vocabularies are covered by test_golden. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "infer.h"
#include "testutil.h"

#define NT (3 + 256 + 8)
static char *strs[NT];
static uint32_t lens[NT];
static float scores[NT];
static struct format_tokenizer tok;
static struct format_config cfg = {.bos_id = 1, .eos_id = 2, .vocab_size = NT};

static void build_vocab(void)
{
    const char *special[3] = {"<unk>", "<s>", "</s>"};
    int i = 0;
    for (; i < 3; i++)
        strs[i] = strdup(special[i]);
    for (int b = 0; b < 256; b++, i++) {
        char buf[8];
        snprintf(buf, sizeof buf, "<0x%02X>", b);
        strs[i] = strdup(buf);
    }
    /* merges, best first: "ab" beats "bc", then " ab" etc. */
    const char *m[8] = {" ", "a", "b", "c", "ab", "bc", " ab", " abc"};
    float sc[8] = {-10, -10, -10, -10, -1, -2, -3, -4};
    for (int k = 0; k < 8; k++, i++) {
        strs[i] = strdup(m[k]);
        scores[i] = sc[k];
    }
    for (int k = 0; k < NT; k++)
        lens[k] = (uint32_t)strlen(strs[k]);
    tok = (struct format_tokenizer){NT, 6, scores, lens, (const char *const *)strs};
}

static int id_of(const char *s)
{
    for (int i = 0; i < NT; i++)
        if (!strcmp(strs[i], s))
            return i;
    return -1;
}

static void test_encode(void **st)
{
    (void)st;
    struct infer_tokenizer *t;
    struct sl_err err;
    assert_int_equal(infer_tokenizer_create(&tok, &cfg, &t, &err), 0);
    int ids[32];
    uint32_t n;
    /* " abc": " "+"a"+"b"+"c" -> " "+"ab"+"c" (ab beats bc) -> " ab"+"c" -> " abc" */
    assert_int_equal(infer_tokenizer_encode(t, "abc", 1, ids, 32, &n), 0);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], id_of(" abc"));
    /* unknown bytes fall back to <0xXX>; no BOS */
    assert_int_equal(infer_tokenizer_encode(t, "b\xc3\xa9", 0, ids, 32, &n), 0);
    assert_int_equal(n, 4);
    assert_int_equal(ids[0], id_of(" "));
    assert_int_equal(ids[1], id_of("b"));
    assert_int_equal(ids[2], id_of("<0xC3>"));
    assert_int_equal(ids[3], id_of("<0xA9>"));
    /* the dummy prefix is a token of its own, never grouped with a
     * continuation byte that starts the text (run.c pushes it first) */
    assert_int_equal(infer_tokenizer_encode(t,
                                            "\x98"
                                            "a",
                                            0, ids, 32, &n),
                     0);
    assert_int_equal(n, 3);
    assert_int_equal(ids[0], id_of(" "));
    assert_int_equal(ids[1], id_of("<0x98>"));
    assert_int_equal(ids[2], id_of("a"));
    /* a space inside the text is grouped with its continuation bytes like
     * any lead byte (run.c's rule), so both fall back to bytes */
    assert_int_equal(infer_tokenizer_encode(t, "a \x98", 0, ids, 32, &n), 0);
    assert_int_equal(n, 4);
    assert_int_equal(ids[1], id_of("a"));
    assert_int_equal(ids[2], id_of("<0x20>"));
    assert_int_equal(ids[3], id_of("<0x98>"));
    /* empty text: just BOS */
    assert_int_equal(infer_tokenizer_encode(t, "", 1, ids, 32, &n), 0);
    assert_int_equal(n, 1);
    /* the output limit */
    assert_int_equal(infer_tokenizer_encode(t, "zzzz", 1, ids, 3, &n), -ENOSPC);
    infer_tokenizer_destroy(t);
}

static void test_decode(void **st)
{
    (void)st;
    struct infer_tokenizer *t;
    struct sl_err err;
    assert_int_equal(infer_tokenizer_create(&tok, &cfg, &t, &err), 0);
    size_t len;
    const char *p = infer_tokenizer_decode(t, 1, id_of(" abc"), &len);
    assert_int_equal(len, 3); /* leading space dropped after BOS */
    assert_memory_equal(p, "abc", 3);
    p = infer_tokenizer_decode(t, id_of("a"), id_of(" abc"), &len);
    assert_int_equal(len, 4);
    p = infer_tokenizer_decode(t, id_of("a"), id_of("<0x0A>"), &len);
    assert_int_equal(len, 1);
    assert_int_equal(p[0], '\n');
    assert_true(infer_piece_printable(p, len));
    p = infer_tokenizer_decode(t, id_of("a"), id_of("<0x01>"), &len);
    assert_false(infer_piece_printable(p, len)); /* a lone control byte is not printed */
    p = infer_tokenizer_decode(t, id_of("a"), 99999, &len);
    assert_int_equal(len, 0);
    infer_tokenizer_destroy(t);
}

static void test_roundtrip_random(void **st)
{
    (void)st;
    struct infer_tokenizer *t;
    struct sl_err err;
    assert_int_equal(infer_tokenizer_create(&tok, &cfg, &t, &err), 0);
    struct test_rng rng;
    test_rng_init(&rng, test_seed());
    for (int k = 0; k < 200; k++) {
        char text[40];
        int len = 1 + (int)test_rng_below(&rng, 38);
        for (int i = 0; i < len; i++)
            text[i] = (char)(1 + test_rng_below(&rng, 255));
        text[len] = 0;
        int ids[200];
        uint32_t n;
        assert_int_equal(infer_tokenizer_encode(t, text, 1, ids, 200, &n), 0);
        /* decoding the pieces (without the dummy space) gives the text back */
        char back[200];
        size_t bl = 0;
        for (uint32_t i = 1; i < n; i++) {
            size_t pl;
            const char *p = infer_tokenizer_decode(t, ids[i - 1], ids[i], &pl);
            memcpy(back + bl, p, pl);
            bl += pl;
        }
        assert_int_equal(bl, (size_t)len);
        assert_memory_equal(back, text, (size_t)len);
    }
    infer_tokenizer_destroy(t);
}

/* The stream encoder cuts before spaces; with a vocabulary whose tokens
 * never hold a space after their first byte it must equal the whole-text
 * encoder (without BOS), on random texts rich in spaces and merges. */
static void test_stream_equals_whole(void **st)
{
    (void)st;
    struct infer_tokenizer *t;
    struct sl_err err;
    assert_int_equal(infer_tokenizer_create(&tok, &cfg, &t, &err), 0);
    struct test_rng rng;
    test_rng_init(&rng, test_seed());
    const char alphabet[] = "abc  \x98\xc3\xa9z";
    for (int k = 0; k < 300; k++) {
        char text[64];
        int len = (int)test_rng_below(&rng, 63);
        for (int i = 0; i < len; i++)
            text[i] = alphabet[test_rng_below(&rng, sizeof alphabet - 1)];
        text[len] = 0;
        int whole[200];
        uint32_t nw;
        assert_int_equal(infer_tokenizer_encode(t, text, 0, whole, 200, &nw), 0);
        int *stream;
        uint32_t ns;
        assert_int_equal(infer_tokenizer_encode_stream(t, text, (size_t)len, &stream, &ns), 0);
        assert_int_equal(ns, nw);
        if (nw)
            assert_memory_equal(stream, whole, nw * sizeof(int));
        free(stream);
    }
    infer_tokenizer_destroy(t);
}

int main(void)
{
    build_vocab();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_encode),
        cmocka_unit_test(test_decode),
        cmocka_unit_test(test_roundtrip_random),
        cmocka_unit_test(test_stream_equals_whole),
    };
    int r = cmocka_run_group_tests(tests, NULL, NULL);
    for (int i = 0; i < NT; i++)
        free(strs[i]);
    return r;
}

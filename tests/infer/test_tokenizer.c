/* test_tokenizer.c: byte-pair encoding.
 *
 * On a small hand-made vocabulary: dummy prefix, merges by highest score,
 * byte fallback, BOS, decoding rules (leading space after BOS, <0xXX>
 * pieces), printability, the output limit and the count it reports, random
 * round trips, the stream encoder against the whole-text one, and injected
 * allocation failures.
 *
 * Against a reference: the quadratic merge loop of llama2.c's run.c, written
 * again below apart from the library, which merges with a heap instead. They
 * must agree token for token on random texts (vocabulary pieces, ASCII,
 * UTF-8 of every length, stray and control bytes) over random synthetic
 * vocabularies with many equal scores, and a 32K-character text must encode
 * in milliseconds.
 *
 * With --real (../shared): the same differential on the real vocabularies,
 * every golden prompt against its golden ids with max = the model's context
 * (the 2,504-character kjv6L-1k prompt included), and 32K characters of KJV. */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "infer.h"
#include "testutil.h"
#include "tok_ref.h"

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

/* ---- injected allocation failures ---------------------------------------------------
 * The test links with -Wl,--wrap=malloc: the library's malloc calls land in
 * __wrap_malloc, which fails the k-th one when armed. */

void *__real_malloc(size_t n);
void *__wrap_malloc(size_t n);
static long alloc_countdown = -1; /* allocations left before one fails; -1: none fails */

void *__wrap_malloc(size_t n)
{
    if (alloc_countdown >= 0 && alloc_countdown-- == 0)
        return NULL;
    return __real_malloc(n);
}

/* Every allocation of an encode (and of a stream encode whose pieces grow)
 * fails in turn: -ENOMEM comes back, nothing leaks (ASan), and once enough
 * allocations succeed the result is the unfailed one. create's own failure
 * and refusal come back too. */
static void test_enomem(void **st)
{
    (void)st;
    struct infer_tokenizer *t;
    struct sl_err err;
    assert_int_equal(infer_tokenizer_create(&tok, &cfg, &t, &err), 0);
    const char *text = "ab c abcabc \xc3\xa9 abcabcabcabc";
    int want[64], got[64];
    uint32_t nw, ng;
    assert_int_equal(infer_tokenizer_encode(t, text, 1, want, 64, &nw), 0);
    int *sw, *sg;
    uint32_t nsw, nsg;
    assert_int_equal(infer_tokenizer_encode_stream(t, text, strlen(text), &sw, &nsw), 0);
    int failed = 0;
    for (long k = 0;; k++) {
        alloc_countdown = k;
        int ret = infer_tokenizer_encode(t, text, 1, got, 64, &ng);
        alloc_countdown = -1;
        if (ret == 0) {
            assert_int_equal(ng, nw);
            assert_memory_equal(got, want, nw * sizeof(int));
            break;
        }
        assert_int_equal(ret, -ENOMEM);
        failed++;
    }
    assert_true(failed > 0);
    failed = 0;
    for (long k = 0;; k++) {
        alloc_countdown = k;
        int ret = infer_tokenizer_encode_stream(t, text, strlen(text), &sg, &nsg);
        alloc_countdown = -1;
        if (ret == 0) {
            assert_int_equal(nsg, nsw);
            assert_memory_equal(sg, sw, nsw * sizeof(int));
            free(sg);
            break;
        }
        assert_int_equal(ret, -ENOMEM);
        failed++;
    }
    assert_true(failed > 2); /* the output, the work area, and its growth for a longer piece */
    free(sw);
    infer_tokenizer_destroy(t);
    /* the index of create, and a vocabulary create refuses */
    alloc_countdown = 0;
    assert_int_equal(infer_tokenizer_create(&tok, &cfg, &t, &err), -ENOMEM);
    alloc_countdown = -1;
    struct format_tokenizer empty = tok;
    empty.n_tokens = 0;
    assert_int_equal(infer_tokenizer_create(&empty, &cfg, &t, &err), -EINVAL);
}

/* The first encodes of a fresh tokenizer on several threads at once (the
 * index is sorted by whichever comes first, once): each gets what a
 * tokenizer that had already encoded gives. */
struct first_encode {
    const struct infer_tokenizer *t;
    pthread_barrier_t *go;
    int ids[64];
    uint32_t n;
    int ret;
};

static void *first_encode_run(void *arg)
{
    struct first_encode *f = arg;
    pthread_barrier_wait(f->go);
    f->ret = infer_tokenizer_encode(f->t, "abc b\xc3\xa9 zz abc", 1, f->ids, 64, &f->n);
    return NULL;
}

static void test_first_encode_threads(void **st)
{
    (void)st;
    struct sl_err err;
    struct infer_tokenizer *warm;
    assert_int_equal(infer_tokenizer_create(&tok, &cfg, &warm, &err), 0);
    int want[64];
    uint32_t nw;
    assert_int_equal(infer_tokenizer_encode(warm, "abc b\xc3\xa9 zz abc", 1, want, 64, &nw), 0);
    for (int round = 0; round < 20; round++) {
        struct infer_tokenizer *t;
        assert_int_equal(infer_tokenizer_create(&tok, &cfg, &t, &err), 0);
        enum { N = 4 };
        pthread_barrier_t go;
        assert_int_equal(pthread_barrier_init(&go, NULL, N), 0);
        struct first_encode f[N];
        pthread_t th[N];
        for (int i = 0; i < N; i++) {
            f[i] = (struct first_encode){.t = t, .go = &go, .ret = 1};
            assert_int_equal(pthread_create(&th[i], NULL, first_encode_run, &f[i]), 0);
        }
        int joined = 0; /* every thread joined before any check can jump out */
        for (int i = 0; i < N; i++)
            joined += pthread_join(th[i], NULL) == 0;
        assert_int_equal(joined, N);
        for (int i = 0; i < N; i++) {
            assert_int_equal(f[i].ret, 0);
            assert_int_equal(f[i].n, nw);
            assert_memory_equal(f[i].ids, want, sizeof(int) * nw);
        }
        pthread_barrier_destroy(&go);
        infer_tokenizer_destroy(t);
    }
    infer_tokenizer_destroy(warm);
}

/* ---- the library against the reference ----------------------------------------------- */

static void assert_ids_equal(const int *got, size_t n_got, const int *want, size_t n_want,
                             const char *what, const char *text)
{
    if (n_got == n_want && (n_got == 0 || !memcmp(got, want, n_got * sizeof *got)))
        return;
    size_t i = 0;
    while (i < n_got && i < n_want && got[i] == want[i])
        i++;
    fail_msg("%s: %zu tokens, the reference %zu; first difference at %zu (%d, %d) for \"%.200s\"",
             what, n_got, n_want, i, i < n_got ? got[i] : -1, i < n_want ? want[i] : -1, text);
}

/* rounds random texts of up to max_len bytes through encode (with and
 * without BOS, max = exactly the count) and encode_stream */
static void differential(const struct vocab *v, struct test_rng *rng, int rounds, size_t max_len)
{
    struct infer_tokenizer *t;
    struct sl_err err;
    assert_int_equal(infer_tokenizer_create(&v->tok, &v->cfg, &t, &err), 0);
    struct ref r;
    tok_ref_init(&r, v);
    char *text = malloc(max_len + 1);
    int *want = malloc(sizeof(int) * (max_len + 2)), *got = malloc(sizeof(int) * (max_len + 2));
    assert_non_null(text);
    assert_non_null(want);
    assert_non_null(got);
    for (int k = 0; k < rounds; k++) {
        /* mostly short texts, where edge cases are dense; some long ones */
        size_t len = test_rng_below(rng, 4) ? test_rng_below(rng, 40)
                                            : test_rng_below(rng, (uint32_t)max_len + 1);
        tok_random_text(rng, v, text, len);
        int bos = (int)test_rng_below(rng, 2);
        size_t nw = tok_ref_encode(&r, bos, text, len, want);
        uint32_t ng;
        assert_int_equal(infer_tokenizer_encode(t, text, bos, got, (uint32_t)nw, &ng), 0);
        assert_ids_equal(got, ng, want, nw, v->name, text);
        int *sg;
        uint32_t nsg;
        nw = tok_ref_stream(&r, text, len, want);
        assert_int_equal(infer_tokenizer_encode_stream(t, text, len, &sg, &nsg), 0);
        assert_ids_equal(sg, nsg, want, nw, "stream", text);
        free(sg);
    }
    free(got);
    free(want);
    free(text);
    tok_ref_fini(&r);
    infer_tokenizer_destroy(t);
}

static void test_differential_synth(void **st)
{
    (void)st;
    struct test_rng rng;
    test_rng_init(&rng, test_seed() ^ 0x5eed);
    for (int k = 0; k < 20; k++) {
        struct vocab v;
        tok_vocab_synth(&v, &rng);
        differential(&v, &rng, 100, 600);
        tok_vocab_free(&v);
    }
}

/* The output limit counts final tokens, not characters, and a refusal
 * reports the count needed. */
static void test_limit_counts_tokens(void **st)
{
    (void)st;
    struct infer_tokenizer *t;
    struct sl_err err;
    assert_int_equal(infer_tokenizer_create(&tok, &cfg, &t, &err), 0);
    /* 100 x "abc" as one word: " abc" then "ab"+"c" 99 times, 1 + 199 tokens
     * with BOS from 301 characters */
    char text[301];
    for (int i = 0; i < 100; i++)
        memcpy(text + 3 * i, "abc", 3);
    text[300] = 0;
    int ids[200];
    uint32_t n;
    assert_int_equal(infer_tokenizer_encode(t, text, 1, ids, 200, &n), 0);
    assert_int_equal(n, 200);
    assert_int_equal(ids[1], id_of(" abc"));
    assert_int_equal(ids[198], id_of("ab"));
    assert_int_equal(ids[199], id_of("c"));
    n = 0;
    assert_int_equal(infer_tokenizer_encode(t, text, 1, ids, 199, &n), -ENOSPC);
    assert_int_equal(n, 200);
    /* max = 0 only counts */
    assert_int_equal(infer_tokenizer_encode(t, text, 0, NULL, 0, &n), -ENOSPC);
    assert_int_equal(n, 199);
    assert_int_equal(infer_tokenizer_encode(t, "", 1, NULL, 0, &n), -ENOSPC);
    assert_int_equal(n, 1);
    assert_int_equal(infer_tokenizer_encode(t, "", 0, NULL, 0, &n), 0);
    assert_int_equal(n, 0);
    infer_tokenizer_destroy(t);
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* A 32K-character text encodes in milliseconds (best of three, bound
 * generous for loaded and sanitized builds) and token for token as the
 * reference merges it piece by piece, which the vocabulary (no space after
 * a token's first byte) makes equal to merging it whole. */
static void check_long(const struct vocab *v, const char *text, size_t len)
{
    struct infer_tokenizer *t;
    struct sl_err err;
    for (uint32_t i = 0; i < v->n; i++)
        assert_true(v->lens[i] < 2 || !memchr(v->strs[i] + 1, ' ', v->lens[i] - 1));
    assert_int_equal(infer_tokenizer_create(&v->tok, &v->cfg, &t, &err), 0);
    struct ref r;
    tok_ref_init(&r, v);
    int *want = malloc(sizeof(int) * (len + 2)), *got = malloc(sizeof(int) * (len + 2));
    assert_non_null(want);
    assert_non_null(got);
    want[0] = 1;
    size_t nw = 1 + tok_ref_stream(&r, text, len, want + 1);
    double best = 1e30;
    for (int k = 0; k < 3; k++) {
        uint32_t ng;
        double t0 = now_ms();
        assert_int_equal(infer_tokenizer_encode(t, text, 1, got, (uint32_t)len + 2, &ng), 0);
        double ms = now_ms() - t0;
        best = ms < best ? ms : best;
        assert_ids_equal(got, ng, want, nw, v->name, "(the long text)");
    }
    print_message("%s: %zu characters, %zu tokens in %.2f ms\n", v->name, len, nw, best);
    assert_true(best < 200);
    free(got);
    free(want);
    tok_ref_fini(&r);
    infer_tokenizer_destroy(t);
}

#define LONG_LEN 32768

static void test_long_synth(void **st)
{
    (void)st;
    struct test_rng rng;
    test_rng_init(&rng, test_seed() ^ 0x1092);
    struct vocab v;
    tok_vocab_synth(&v, &rng);
    /* words of merged pieces between spaces, so that merges are many */
    char *text = malloc(LONG_LEN + 1);
    assert_non_null(text);
    size_t n = 0;
    while (n < LONG_LEN) {
        uint32_t id = 3 + test_rng_below(&rng, v.n - 3);
        const char *p = v.strs[id];
        uint32_t l = v.lens[id];
        if (test_rng_below(&rng, 5) == 0) {
            p = " ";
            l = 1;
        }
        if (n + l > LONG_LEN)
            l = (uint32_t)(LONG_LEN - n);
        memcpy(text + n, p, l);
        n += l;
    }
    text[n] = 0;
    check_long(&v, text, n);
    free(text);
    tok_vocab_free(&v);
}

/* ---- --real: the vocabularies and golden outputs in ../shared ------------------------- */

static const char *real_vocabs[] = {"kjv6L.tok1024.bin", "aidreams260K.tok512.bin"};

static void test_differential_real(void **st)
{
    (void)st;
    struct test_rng rng;
    test_rng_init(&rng, test_seed() ^ 0xd1ff);
    int done = 0;
    for (size_t i = 0; i < sizeof real_vocabs / sizeof *real_vocabs; i++) {
        char rel[256];
        snprintf(rel, sizeof rel, "models/%s", real_vocabs[i]);
        const char *path = test_shared_path(rel);
        struct vocab v;
        if (!path || tok_vocab_load(&v, path, real_vocabs[i]) < 0)
            continue;
        differential(&v, &rng, 500, 1500);
        tok_vocab_free(&v);
        done++;
    }
    if (!done)
        skip();
}

/* The first tokenizer file models/M.tok*.bin of model M, in path[]. */
static int find_tokenizer(const char *model, char *path, size_t len)
{
    const char *dir = test_shared_path("models");
    DIR *d = dir ? opendir(dir) : NULL;
    if (!d)
        return -1;
    char prefix[300];
    snprintf(prefix, sizeof prefix, "%s.tok", model);
    int found = -1;
    struct dirent *e;
    while (found < 0 && (e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (!strncmp(e->d_name, prefix, strlen(prefix)) && l > 4 &&
            !strcmp(e->d_name + l - 4, ".bin")) {
            snprintf(path, len, "%s/%s", dir, e->d_name);
            found = 0;
        }
    }
    closedir(d);
    return found;
}

/* The context of model M: seq_len, the 7th int32 of the llama2.c header of
 * models/M.bin; 0 when there is no such file. */
static uint32_t model_seq_len(const char *model)
{
    char rel[300];
    snprintf(rel, sizeof rel, "models/%s.bin", model);
    const char *path = test_shared_path(rel);
    FILE *f = path ? fopen(path, "rb") : NULL;
    if (!f)
        return 0;
    int32_t h[7];
    size_t got = fread(h, sizeof *h, 7, f);
    fclose(f);
    return got == 7 && h[6] > 0 ? (uint32_t)h[6] : 0;
}

/* Every golden prompt (golden/M.CASE.prompt.txt, see golden/README.md)
 * encodes with M's tokenizer file to the prefix of M.CASE.ids.txt, with max
 * = M's context: the 2,504-character, 827-token kjv6L-1k.long1 prompt fits
 * its 1,024-token context, and 826 tokens of room report that it needs 828. */
static void test_golden_prompts(void **st)
{
    (void)st;
    const char *gdir = test_shared_path("golden");
    DIR *d = gdir ? opendir(gdir) : NULL;
    if (!d)
        skip();
    char golden[4096];
    snprintf(golden, sizeof golden, "%s", gdir);
    int cases = 0, long_cases = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *suffix = ".prompt.txt";
        size_t l = strlen(e->d_name), sl = strlen(suffix);
        if (l <= sl || strcmp(e->d_name + l - sl, suffix))
            continue;
        char stem[256], model[256], path[4096];
        snprintf(stem, sizeof stem, "%.*s", (int)(l - sl), e->d_name);
        snprintf(model, sizeof model, "%.*s", (int)strcspn(stem, "."), stem);
        struct vocab v;
        if (find_tokenizer(model, path, sizeof path) < 0 || tok_vocab_load(&v, path, model) < 0)
            fail_msg("golden prompt %s: no tokenizer models/%s.tok*.bin", e->d_name, model);
        uint32_t ctx = model_seq_len(model);
        if (!ctx)
            fail_msg("golden prompt %s: no models/%s.bin for the context", e->d_name, model);
        snprintf(path, sizeof path, "%s/%s", golden, e->d_name);
        size_t plen;
        char *prompt = test_read_file(path, &plen);
        assert_non_null(prompt);
        snprintf(path, sizeof path, "%s/%s.ids.txt", golden, stem);
        int *ids = malloc(sizeof(int) * ctx), *enc = malloc(sizeof(int) * ctx);
        assert_non_null(ids);
        assert_non_null(enc);
        int got = test_read_ints(path, ids, (int)ctx);
        assert_true(got >= 0);
        uint32_t n_ids = (uint32_t)got;
        struct infer_tokenizer *t;
        struct sl_err err;
        assert_int_equal(infer_tokenizer_create(&v.tok, &v.cfg, &t, &err), 0);
        uint32_t np;
        assert_int_equal(infer_tokenizer_encode(t, prompt, 1, enc, ctx, &np), 0);
        print_message("%s: %zu characters, %u tokens with BOS, context %u\n", stem, plen, np, ctx);
        assert_true(np < n_ids);
        for (uint32_t i = 0; i < np; i++)
            if (enc[i] != ids[i])
                fail_msg("%s: token %u is %d, golden %d", stem, i, enc[i], ids[i]);
        if (plen > ctx) { /* more characters than the context holds tokens */
            uint32_t need;
            assert_int_equal(infer_tokenizer_encode(t, prompt, 1, enc, np - 1, &need), -ENOSPC);
            assert_int_equal(need, np);
            long_cases++;
        }
        if (!strcmp(stem, "kjv6L-1k.long1")) {
            assert_int_equal(np, 828);
            assert_int_equal(ctx, 1024);
        }
        infer_tokenizer_destroy(t);
        free(enc);
        free(ids);
        free(prompt);
        tok_vocab_free(&v);
        cases++;
    }
    closedir(d);
    if (!cases)
        skip();
    assert_true(long_cases > 0 || !test_shared_path("golden/kjv6L-1k.long1.prompt.txt"));
}

/* 32K characters of KJV (kjv6L.calib.txt repeated as needed) */
static void test_long_real(void **st)
{
    (void)st;
    struct vocab v;
    const char *path = test_shared_path("models/kjv6L.tok1024.bin");
    if (!path || tok_vocab_load(&v, path, "kjv6L.tok1024.bin") < 0)
        skip();
    size_t len;
    char *src =
        (path = test_shared_path("models/kjv6L.calib.txt")) ? test_read_file(path, &len) : NULL;
    if (!src) {
        tok_vocab_free(&v);
        skip();
    }
    char *text = malloc(LONG_LEN + 1);
    assert_non_null(text);
    for (size_t i = 0; i < LONG_LEN; i++)
        text[i] = src[i % len];
    text[LONG_LEN] = 0;
    check_long(&v, text, LONG_LEN);
    free(text);
    free(src);
    tok_vocab_free(&v);
}

int main(int argc, char **argv)
{
    build_vocab();
    int r;
    if (argc > 1 && !strcmp(argv[1], "--real")) {
        if (!test_shared_path("models") || !test_shared_path("golden"))
            test_skip_all("../shared (models and golden outputs) is absent; set SLUICE_SHARED");
        const struct CMUnitTest real[] = {
            cmocka_unit_test(test_golden_prompts),
            cmocka_unit_test(test_differential_real),
            cmocka_unit_test(test_long_real),
        };
        r = cmocka_run_group_tests_name("tokenizer_real", real, NULL, NULL);
    } else {
        const struct CMUnitTest tests[] = {
            cmocka_unit_test(test_encode),
            cmocka_unit_test(test_decode),
            cmocka_unit_test(test_roundtrip_random),
            cmocka_unit_test(test_stream_equals_whole),
            cmocka_unit_test(test_limit_counts_tokens),
            cmocka_unit_test(test_enomem),
            cmocka_unit_test(test_first_encode_threads),
            cmocka_unit_test(test_differential_synth),
            cmocka_unit_test(test_long_synth),
        };
        r = cmocka_run_group_tests(tests, NULL, NULL);
    }
    for (int i = 0; i < NT; i++)
        free(strs[i]);
    return r;
}

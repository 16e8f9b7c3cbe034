/* tok_ref.c: vocabularies, the reference encoder and random texts for the
 * tokenizer tests (tok_ref.h). */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok_ref.h"

/* ---- vocabularies: synthetic, or llama2.c tokenizer files ---------------------------- */

static void vocab_add(struct vocab *v, const char *s, uint32_t len, float score)
{
    if (v->n == v->cap) {
        v->cap = v->cap ? 2 * v->cap : 512;
        v->strs = realloc(v->strs, sizeof *v->strs * v->cap);
        v->lens = realloc(v->lens, sizeof *v->lens * v->cap);
        v->scores = realloc(v->scores, sizeof *v->scores * v->cap);
        assert_non_null(v->strs);
        assert_non_null(v->lens);
        assert_non_null(v->scores);
    }
    v->strs[v->n] = malloc(len + 1);
    assert_non_null(v->strs[v->n]);
    memcpy(v->strs[v->n], s, len);
    v->strs[v->n][len] = 0;
    v->lens[v->n] = len;
    v->scores[v->n] = score;
    v->n++;
}

static int vocab_has(const struct vocab *v, const char *s, uint32_t len)
{
    for (uint32_t i = 0; i < v->n; i++)
        if (v->lens[i] == len && !memcmp(v->strs[i], s, len))
            return 1;
    return 0;
}

static void vocab_done(struct vocab *v)
{
    v->tok = (struct format_tokenizer){v->n, 0, v->scores, v->lens, (const char *const *)v->strs};
    for (uint32_t i = 0; i < v->n; i++)
        if (v->lens[i] > v->tok.max_token_len)
            v->tok.max_token_len = v->lens[i];
    v->cfg = (struct format_config){.bos_id = 1, .eos_id = 2, .vocab_size = v->n};
}

void tok_vocab_free(struct vocab *v)
{
    for (uint32_t i = 0; i < v->n; i++)
        free(v->strs[i]);
    free(v->strs);
    free(v->lens);
    free(v->scores);
    *v = (struct vocab){0};
}

/* A random vocabulary in llama2.c's layout: control tokens, byte tokens for
 * most bytes (the others fall back to <unk>), characters of 1-4 bytes, and
 * merges of existing tokens with scores from a small set, so that equal
 * scores are common, plus scores the merge rule never takes (-1e30, -inf,
 * NaN) and "<s" + ">", which spells a control token. No token holds a space
 * after its first byte (SentencePiece's split_by_whitespace), so the stream
 * encoder must equal the whole-text one. */
void tok_vocab_synth(struct vocab *v, struct test_rng *rng)
{
    *v = (struct vocab){.name = "synthetic"};
    vocab_add(v, "<unk>", 5, 0);
    vocab_add(v, "<s>", 3, 0);
    vocab_add(v, "</s>", 4, 0);
    for (int b = 0; b < 256; b++) {
        char s[8];
        snprintf(s, sizeof s, "<0x%02X>", b);
        if (test_rng_below(rng, 10) < 8)
            vocab_add(v, s, 6, 0);
    }
    const char *chars[] = {
        " ", "a", "b", "c", "d", "<", "s", ">", "\xc3\xa9", "\xe6\x97\xa5", "\xf0\x9f\x98\x80",
        "<s"};
    uint32_t first_char = v->n;
    for (size_t i = 0; i < sizeof chars / sizeof *chars; i++)
        vocab_add(v, chars[i], (uint32_t)strlen(chars[i]), -100);
    const float odd[] = {-1e30f, -INFINITY, NAN, 0.0f, -0.0f, -2e30f};
    for (int k = 0; k < 400 && v->n < first_char + 160; k++) {
        uint32_t a = first_char + test_rng_below(rng, v->n - first_char);
        uint32_t b = first_char + test_rng_below(rng, v->n - first_char);
        char s[32];
        uint32_t len = v->lens[a] + v->lens[b];
        if (len > 12 || memchr(v->strs[b], ' ', v->lens[b]))
            continue;
        memcpy(s, v->strs[a], v->lens[a]);
        memcpy(s + v->lens[a], v->strs[b], v->lens[b]);
        if (vocab_has(v, s, len))
            continue;
        float sc = test_rng_below(rng, 12) == 0 ? odd[test_rng_below(rng, 6)]
                                                : -(float)(1 + test_rng_below(rng, 6));
        vocab_add(v, s, len, sc);
    }
    vocab_done(v);
}

/* A llama2.c tokenizer file: int32 max_token_length, then per token a
 * float32 score, an int32 length and the bytes. BOS 1, EOS 2. */
int tok_vocab_load(struct vocab *v, const char *path, const char *name)
{
    size_t len;
    unsigned char *d = test_read_file(path, &len);
    if (!d)
        return -1;
    *v = (struct vocab){.name = name};
    size_t o = 4;
    while (o + 8 <= len) {
        float score;
        int32_t l;
        memcpy(&score, d + o, 4);
        memcpy(&l, d + o + 4, 4);
        o += 8;
        assert_true(l >= 0 && (size_t)l <= len - o);
        vocab_add(v, (const char *)d + o, (uint32_t)l, score);
        o += (size_t)l;
    }
    free(d);
    assert_int_equal(o, len);
    vocab_done(v);
    return 0;
}

/* ---- the reference: run.c's merge loop, quadratic ------------------------------------ */

static const struct vocab *ref_sorting; /* qsort's comparator has no context */

static int ref_cmp(const char *a, uint32_t al, const char *b, uint32_t bl)
{
    int c = memcmp(a, b, al < bl ? al : bl);
    return c ? c : (al > bl) - (al < bl);
}

static int ref_cmp_ids(const void *x, const void *y)
{
    uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;
    const struct vocab *v = ref_sorting;
    return ref_cmp(v->strs[a], v->lens[a], v->strs[b], v->lens[b]);
}

void tok_ref_init(struct ref *r, const struct vocab *v)
{
    r->v = v;
    r->sorted = malloc(sizeof *r->sorted * v->n);
    assert_non_null(r->sorted);
    for (uint32_t i = 0; i < v->n; i++)
        r->sorted[i] = i;
    ref_sorting = v;
    qsort(r->sorted, v->n, sizeof *r->sorted, ref_cmp_ids);
    for (int b = 0; b < 256; b++)
        r->byte_id[b] = -1;
    /* the first token spelling <0xXX>, hex digits of either case */
    for (int i = (int)v->n - 1; i >= 0; i--) {
        unsigned x;
        char tail;
        if (v->lens[i] == 6 && !memcmp(v->strs[i], "<0x", 3) && isxdigit(v->strs[i][3]) &&
            isxdigit(v->strs[i][4]) && sscanf(v->strs[i] + 3, "%2x%c", &x, &tail) == 2 &&
            tail == '>')
            r->byte_id[x] = i;
    }
}

void tok_ref_fini(struct ref *r)
{
    free(r->sorted);
}

/* The token spelled s[0..len), or -1. The test vocabularies hold no string
 * twice, so any search finds the library's answer. */
static int ref_find(const struct ref *r, const char *s, uint32_t len)
{
    size_t lo = 0, hi = r->v->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        uint32_t id = r->sorted[mid];
        int c = ref_cmp(s, len, r->v->strs[id], r->v->lens[id]);
        if (!c)
            return (int)id;
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return -1;
}

static int ref_usable(const struct ref *r, int id)
{
    return id >= 0 && id != 0 && id != (int)r->v->cfg.bos_id && id != (int)r->v->cfg.eos_id;
}

/* run.c's encode for one piece: the dummy space, code points or their
 * bytes, then the best pair (strict > from the left, so the leftmost of
 * equal scores) merged until none is. out has room for len + 1 ids. */
static size_t ref_piece(const struct ref *r, int dummy, const char *s, size_t len, int *out)
{
    const struct vocab *v = r->v;
    size_t n = 0;
    if (dummy) {
        int sp = ref_find(r, " ", 1);
        out[n++] = ref_usable(r, sp) ? sp : r->byte_id[' '] >= 0 ? r->byte_id[' '] : 0;
    }
    for (size_t i = 0; i < len;) {
        size_t cl = 1;
        while (cl < 4 && i + cl < len && ((unsigned char)s[i + cl] & 0xc0) == 0x80)
            cl++;
        int id = ref_find(r, s + i, (uint32_t)cl);
        if (ref_usable(r, id)) {
            out[n++] = id;
        } else {
            for (size_t j = 0; j < cl; j++) {
                int b = r->byte_id[(unsigned char)s[i + j]];
                out[n++] = b >= 0 ? b : 0;
            }
        }
        i += cl;
    }
    char pair[64];
    for (;;) {
        float best = -1e30f;
        int best_id = -1;
        size_t at = 0;
        for (size_t i = 0; i + 1 < n; i++) {
            uint32_t la = v->lens[out[i]], lb = v->lens[out[i + 1]];
            assert_true(la + lb <= sizeof pair);
            memcpy(pair, v->strs[out[i]], la);
            memcpy(pair + la, v->strs[out[i + 1]], lb);
            int id = ref_find(r, pair, la + lb);
            if (ref_usable(r, id) && v->scores[id] > best) {
                best = v->scores[id];
                best_id = id;
                at = i;
            }
        }
        if (best_id < 0)
            return n;
        out[at] = best_id;
        memmove(out + at + 1, out + at + 2, (n - at - 2) * sizeof *out);
        n--;
    }
}

/* infer_tokenizer_encode's contract: BOS, then the text as one piece. */
size_t tok_ref_encode(const struct ref *r, int add_bos, const char *s, size_t len, int *out)
{
    size_t n = 0;
    if (add_bos)
        out[n++] = (int)r->v->cfg.bos_id;
    return len ? n + ref_piece(r, 1, s, len, out + n) : n;
}

/* infer_tokenizer_encode_stream's: the text cut before every space, each
 * piece merged alone, the dummy space on the first. */
size_t tok_ref_stream(const struct ref *r, const char *s, size_t len, int *out)
{
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        size_t j = i + 1;
        while (j < len && s[j] != ' ')
            j++;
        n += ref_piece(r, i == 0, s + i, j - i, out + n);
        i = j;
    }
    return n;
}

/* ---- random texts ---------------------------------------------------------------------- */

static size_t put_utf8(char *o, uint32_t cp)
{
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | cp >> 6);
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | cp >> 12);
        o[1] = (char)(0x80 | (cp >> 6 & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | cp >> 18);
    o[1] = (char)(0x80 | (cp >> 12 & 0x3f));
    o[2] = (char)(0x80 | (cp >> 6 & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* len bytes (no NUL) mixing the vocabulary's pieces (control and <0xXX>
 * spellings included), ASCII, spaces, UTF-8 code points of 2-4 bytes, stray
 * continuation or lead bytes and control bytes; NUL-terminated. */
void tok_random_text(struct test_rng *rng, const struct vocab *v, char *o, size_t len)
{
    size_t n = 0;
    while (n < len) {
        char c[8];
        const char *p = c;
        size_t l = 1;
        uint32_t kind = test_rng_below(rng, 20);
        if (kind < 9) {
            uint32_t id = test_rng_below(rng, v->n);
            p = v->strs[id];
            l = v->lens[id];
            if (memchr(p, 0, l))
                continue;
        } else if (kind < 13) {
            c[0] = (char)(0x21 + test_rng_below(rng, 0x5e));
        } else if (kind < 16) {
            c[0] = ' ';
        } else if (kind < 18) {
            static const uint32_t lo[3] = {0x80, 0x800, 0x10000},
                                  span[3] = {0x780, 0xf800, 0x100000};
            uint32_t w = test_rng_below(rng, 3);
            l = put_utf8(c, lo[w] + test_rng_below(rng, span[w]));
        } else if (kind < 19) {
            c[0] = (char)(0x80 + test_rng_below(rng, 0x80));
        } else {
            c[0] = (char)(1 + test_rng_below(rng, 31));
        }
        if (n + l > len)
            l = len - n;
        memcpy(o + n, p, l);
        n += l;
    }
    o[n] = 0;
}

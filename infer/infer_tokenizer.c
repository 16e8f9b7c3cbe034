/* infer_tokenizer.c: llama2.c-style byte-pair encoding over the container's
 * vocabulary: BOS, a dummy-prefix space, one token per UTF-8 code point (or
 * byte-fallback tokens <0xXX>), then repeated merges of the adjacent pair
 * whose concatenation is the highest-scoring token. */
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "infer.h"

struct tok_index {
    const char *str;
    uint32_t len;
    int id;
};

struct infer_tokenizer {
    uint32_t n;
    uint32_t bos, eos;
    const char *const *strs;
    const uint32_t *lens;
    const float *scores;
    struct tok_index *sorted; /* by (bytes, length) for binary search */
    int byte_id[256];         /* token of <0xXX>, or -1 */
    unsigned char byte_piece[256][2];
};

static int cmp_bytes(const char *a, uint32_t al, const char *b, uint32_t bl)
{
    uint32_t m = al < bl ? al : bl;
    int c = memcmp(a, b, m);
    if (c)
        return c;
    return al < bl ? -1 : al > bl;
}

static int cmp_index(const void *a, const void *b)
{
    const struct tok_index *x = a, *y = b;
    return cmp_bytes(x->str, x->len, y->str, y->len);
}

static int lookup(const struct infer_tokenizer *t, const char *s, uint32_t len)
{
    size_t lo = 0, hi = t->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = cmp_bytes(s, len, t->sorted[mid].str, t->sorted[mid].len);
        if (c == 0)
            return t->sorted[mid].id;
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return -1;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

/* The byte of a "<0xXX>" piece, or -1. */
static int byte_token(const char *s, uint32_t len)
{
    if (len != 6 || memcmp(s, "<0x", 3) || s[5] != '>')
        return -1;
    int h = hexval(s[3]), l = hexval(s[4]);
    return h < 0 || l < 0 ? -1 : h * 16 + l;
}

int infer_tokenizer_create(const struct format_tokenizer *tok, const struct format_config *cfg,
                           struct infer_tokenizer **out, struct sl_err *err)
{
    struct infer_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    t->n = tok->n_tokens;
    t->bos = cfg->bos_id;
    t->eos = cfg->eos_id;
    t->strs = tok->tokens;
    t->lens = tok->lens;
    t->scores = tok->scores;
    t->sorted = malloc(sizeof *t->sorted * t->n);
    if (!t->sorted) {
        free(t);
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    for (int b = 0; b < 256; b++) {
        t->byte_id[b] = -1;
        t->byte_piece[b][0] = (unsigned char)b;
        t->byte_piece[b][1] = 0;
    }
    for (uint32_t i = 0; i < t->n; i++) {
        t->sorted[i] = (struct tok_index){tok->tokens[i], tok->lens[i], (int)i};
        int b = byte_token(tok->tokens[i], tok->lens[i]);
        if (b >= 0 && t->byte_id[b] < 0)
            t->byte_id[b] = (int)i;
    }
    qsort(t->sorted, t->n, sizeof *t->sorted, cmp_index);
    *out = t;
    return 0;
}

void infer_tokenizer_destroy(struct infer_tokenizer *t)
{
    if (!t)
        return;
    free(t->sorted);
    free(t);
}

uint32_t infer_tokenizer_vocab_size(const struct infer_tokenizer *t)
{
    return t->n;
}

static int is_control(const struct infer_tokenizer *t, int id)
{
    return (uint32_t)id == t->bos || (uint32_t)id == t->eos || id == 0;
}

/* An optional dummy-prefix space, the code points (or byte fallbacks) of
 * text[0..len), then merges; writes tokens[0..max). The dummy prefix is a
 * token of its own before the text's first code point (as run.c pushes it),
 * never grouped with a continuation byte that starts the text; merges then
 * run over both. */
static int encode_piece(const struct infer_tokenizer *t, int dummy_prefix, const char *text,
                        size_t len, int *tokens, uint32_t max, uint32_t *n_out)
{
    uint32_t n = 0;
#define PUSH(id)                                                                                   \
    do {                                                                                           \
        if (n >= max)                                                                              \
            return -ENOSPC;                                                                        \
        tokens[n++] = (id);                                                                        \
    } while (0)
    if (dummy_prefix) {
        /* SentencePiece's add_dummy_prefix */
        int sp = lookup(t, " ", 1);
        if (sp >= 0 && !is_control(t, sp))
            PUSH(sp);
        else
            PUSH(t->byte_id[' '] >= 0 ? t->byte_id[' '] : 0);
    }
    const unsigned char *p = (const unsigned char *)text, *end = p + len;
    while (p < end) {
        /* one UTF-8 code point: a lead byte and its continuation bytes (at most 4) */
        uint32_t cl = 1;
        while (cl < 4 && p + cl < end && (p[cl] & 0xc0) == 0x80)
            cl++;
        int id = lookup(t, (const char *)p, cl);
        if (id >= 0 && !is_control(t, id)) {
            PUSH(id);
        } else {
            for (uint32_t i = 0; i < cl; i++) {
                int b = t->byte_id[p[i]];
                PUSH(b >= 0 ? b : 0); /* <unk> when the vocabulary has no byte tokens */
            }
        }
        p += cl;
    }
    /* merge the best adjacent pair until none merges */
    char *buf = NULL;
    size_t cap = 0;
    for (;;) {
        float best = -1e30f;
        int best_id = -1;
        uint32_t best_i = 0;
        for (uint32_t i = 0; i + 1 < n; i++) {
            uint32_t a = t->lens[tokens[i]], b = t->lens[tokens[i + 1]];
            if (a + b > cap) {
                char *nb = realloc(buf, (a + b) * 2);
                if (!nb) {
                    free(buf);
                    return -ENOMEM;
                }
                buf = nb;
                cap = (a + b) * 2;
            }
            memcpy(buf, t->strs[tokens[i]], a);
            memcpy(buf + a, t->strs[tokens[i + 1]], b);
            int id = lookup(t, buf, a + b);
            if (id >= 0 && !is_control(t, id) && t->scores[id] > best) {
                best = t->scores[id];
                best_id = id;
                best_i = i;
            }
        }
        if (best_id < 0)
            break;
        tokens[best_i] = best_id;
        memmove(tokens + best_i + 1, tokens + best_i + 2, (n - best_i - 2) * sizeof(int));
        n--;
    }
    free(buf);
    *n_out = n;
    return 0;
#undef PUSH
}

int infer_tokenizer_encode(const struct infer_tokenizer *t, const char *text, int add_bos,
                           int *tokens, uint32_t max, uint32_t *n_out)
{
    uint32_t n = 0;
    if (add_bos) {
        if (max < 1)
            return -ENOSPC;
        tokens[n++] = (int)t->bos;
    }
    size_t len = strlen(text);
    if (len == 0) {
        *n_out = n;
        return 0;
    }
    /* the whole text is one piece, as llama2.c's run.c merges it */
    uint32_t k;
    int ret = encode_piece(t, 1, text, len, tokens + n, max - n, &k);
    if (ret < 0)
        return ret;
    *n_out = n + k;
    return 0;
}

int infer_tokenizer_encode_stream(const struct infer_tokenizer *t, const char *text, size_t len,
                                  int **tokens, uint32_t *n_out)
{
    size_t cap = len + 16;
    int *out = malloc(sizeof(int) * cap);
    if (!out)
        return -ENOMEM;
    uint32_t n = 0;
    size_t i = 0;
    int first = 1;
    while (i < len) {
        /* a piece: the text from a space up to the next space; the first
         * piece gets the dummy prefix (a token of its own, as in
         * infer_tokenizer_encode) */
        size_t j = i + (text[i] == ' ' ? 1 : 0);
        while (j < len && text[j] != ' ')
            j++;
        uint32_t k;
        int ret = encode_piece(t, first, text + i, j - i, out + n, (uint32_t)(cap - n), &k);
        first = 0;
        if (ret < 0) {
            free(out);
            return ret;
        }
        n += k;
        i = j;
    }
    *tokens = out;
    *n_out = n;
    return 0;
}

const char *infer_tokenizer_decode(const struct infer_tokenizer *t, int prev, int token,
                                   size_t *len)
{
    if (token < 0 || (uint32_t)token >= t->n) {
        *len = 0;
        return "";
    }
    const char *piece = t->strs[token];
    size_t l = t->lens[token];
    /* after BOS, SentencePiece's decoder strips the leading space */
    if (prev >= 0 && (uint32_t)prev == t->bos && l > 0 && piece[0] == ' ') {
        piece++;
        l--;
    }
    int b = byte_token(piece, (uint32_t)l);
    if (b >= 0) {
        *len = 1;
        return (const char *)t->byte_piece[b];
    }
    *len = l;
    return piece;
}

int infer_piece_printable(const char *piece, size_t len)
{
    if (len == 0 || piece[0] == '\0')
        return 0;
    if (len == 1) {
        unsigned char c = (unsigned char)piece[0];
        return isprint(c) || isspace(c);
    }
    return 1;
}

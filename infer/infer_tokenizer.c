/* infer_tokenizer.c: llama2.c-style byte-pair encoding over the container's
 * vocabulary: BOS, a dummy-prefix space, one token per UTF-8 code point (or
 * byte-fallback tokens <0xXX>), then repeated merges of the adjacent pair
 * whose concatenation is the highest-scoring token. */
#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "infer.h"

struct tok_index {
    const char *str;
    uint32_t len;
    int id;
};

/* The pieces by (bytes, length) for binary search, sorted on the first
 * encode: a run with a synthetic prompt (--prompt-tokens) never encodes,
 * and the sort of a 32k-piece vocabulary was 9 ms of a warm cold start's
 * process start, 18-19 ms cold (docs/BENCHMARKS.md, fifteenth session, e22).
 * Filled at create; the sort under the lock, once. */
struct tok_sorted {
    pthread_mutex_t lock;
    atomic_int ready;
    struct tok_index *v;
};

struct infer_tokenizer {
    uint32_t n;
    uint32_t bos, eos;
    const char *const *strs;
    const uint32_t *lens;
    const float *scores;
    uint32_t max_len;         /* the longest token's bytes */
    struct tok_sorted *sorted; /* its own allocation: sorted through a const tokenizer */
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
        const struct tok_index *e = &t->sorted->v[mid];
        int c = cmp_bytes(s, len, e->str, e->len);
        if (c == 0)
            return e->id;
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
    /* token 0 stands in for bytes without a token; a pair's two strings
     * are looked up as one uint32_t length */
    if (tok->n_tokens == 0) {
        sl_err_set(err, "the vocabulary is empty");
        return -EINVAL;
    }
    for (uint32_t i = 0; i < tok->n_tokens; i++) {
        if (tok->lens[i] > UINT32_MAX / 2) {
            sl_err_set(err, "token %u is %u bytes long", i, tok->lens[i]);
            return -EINVAL;
        }
    }
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
    t->sorted = calloc(1, sizeof *t->sorted);
    if (t->sorted)
        t->sorted->v = malloc(sizeof *t->sorted->v * t->n);
    if (!t->sorted || !t->sorted->v || pthread_mutex_init(&t->sorted->lock, NULL)) {
        if (t->sorted)
            free(t->sorted->v);
        free(t->sorted);
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
        t->sorted->v[i] = (struct tok_index){tok->tokens[i], tok->lens[i], (int)i};
        if (tok->lens[i] > t->max_len)
            t->max_len = tok->lens[i];
        int b = byte_token(tok->tokens[i], tok->lens[i]);
        if (b >= 0 && t->byte_id[b] < 0)
            t->byte_id[b] = (int)i;
    }
    *out = t;
    return 0;
}

/* The index sorted (once, whichever thread encodes first). */
static void sorted_ready(const struct infer_tokenizer *t)
{
    struct tok_sorted *x = t->sorted;
    if (atomic_load_explicit(&x->ready, memory_order_acquire))
        return;
    pthread_mutex_lock(&x->lock);
    if (!atomic_load_explicit(&x->ready, memory_order_relaxed)) {
        qsort(x->v, t->n, sizeof *x->v, cmp_index);
        atomic_store_explicit(&x->ready, 1, memory_order_release);
    }
    pthread_mutex_unlock(&x->lock);
}

void infer_tokenizer_destroy(struct infer_tokenizer *t)
{
    if (!t)
        return;
    pthread_mutex_destroy(&t->sorted->lock);
    free(t->sorted->v);
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

/* ---- merging: a binary heap of candidate pairs over a linked list ------------------
 *
 * The merge rule is llama2.c's: repeatedly merge the adjacent pair whose
 * concatenation is the highest-scoring mergeable token, the leftmost one
 * among equal scores. Rescanning every pair after each merge is quadratic;
 * here each pair is looked up once when it forms and waits in a max-heap, so
 * a piece of n symbols merges in O(n log n). A merge changes only the pairs
 * on either side of it: their old entries are left in the heap and dropped
 * when they surface (lazy invalidation), and the two new pairs are pushed. */

#define TOK_NONE SIZE_MAX /* no neighbour: either end of the list */

/* One symbol of the piece: its token (-1 once merged into its left
 * neighbour) and its neighbours. A symbol keeps its index when it absorbs
 * its right neighbour, so index order is list order. */
struct tok_sym {
    int id;
    size_t prev, next;
};

/* A candidate merge of symbol `left` with its right neighbour, pushed when
 * the two held lid and rid. merged and score depend on (lid, rid) alone, so
 * an entry whose symbols still hold lid and rid describes the current pair
 * exactly, however many merges happened since; any other entry is stale. */
struct tok_pair {
    float score; /* of merged */
    int merged;
    int lid, rid;
    size_t left;
};

/* Working storage of one encode call, reused across the pieces of a stream.
 * The heap needs 2 * n entries for n symbols: n - 1 first pairs, and each of
 * the at most n - 1 merges pops one entry before pushing two. */
struct tok_work {
    struct tok_sym *sym;   /* [cap] */
    struct tok_pair *heap; /* [2 * cap] */
    size_t cap, n_heap;
    char *buf; /* [2 * max_len]: a pair's two strings side by side */
};

static int work_init(struct tok_work *w, const struct infer_tokenizer *t)
{
    sorted_ready(t); /* every encode starts here */
    *w = (struct tok_work){0};
    w->buf = malloc(2 * (size_t)t->max_len + 1);
    return w->buf ? 0 : -ENOMEM;
}

static void work_fini(struct tok_work *w)
{
    free(w->sym);
    free(w->heap);
    free(w->buf);
}

/* Room for n symbols; the old contents need not survive. */
static int work_reserve(struct tok_work *w, size_t n)
{
    if (n <= w->cap)
        return 0;
    if (n > SIZE_MAX / (2 * sizeof *w->heap))
        return -ENOMEM;
    free(w->sym);
    free(w->heap);
    w->cap = 0;
    w->sym = malloc(n * sizeof *w->sym);
    w->heap = malloc(2 * n * sizeof *w->heap);
    if (!w->sym || !w->heap)
        return -ENOMEM;
    w->cap = n;
    return 0;
}

/* Heap order: the higher score first, then the leftmost pair, which is the
 * pair the quadratic scan (a strict > from the left) picks among equals. */
static int pair_before(const struct tok_pair *a, const struct tok_pair *b)
{
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

/* Pushes the merge of symbol left with its right neighbour when their
 * concatenation is a mergeable token. */
static void pair_push(const struct infer_tokenizer *t, struct tok_work *w, size_t left)
{
    int a = w->sym[left].id, b = w->sym[w->sym[left].next].id;
    uint32_t la = t->lens[a], lb = t->lens[b];
    memcpy(w->buf, t->strs[a], la);
    memcpy(w->buf + la, t->strs[b], lb);
    int id = lookup(t, w->buf, la + lb);
    /* the scan this replaces started from -1e30 with a strict >: a lower
     * score (or NaN) never merges */
    if (id < 0 || is_control(t, id) || !(t->scores[id] > -1e30f))
        return;
    assert(w->n_heap < 2 * w->cap);
    struct tok_pair p = {t->scores[id], id, a, b, left};
    size_t i = w->n_heap++;
    while (i > 0 && pair_before(&p, &w->heap[(i - 1) / 2])) {
        w->heap[i] = w->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    w->heap[i] = p;
}

static struct tok_pair pair_pop(struct tok_work *w)
{
    struct tok_pair top = w->heap[0], last = w->heap[--w->n_heap];
    size_t i = 0, n = w->n_heap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && pair_before(&w->heap[c + 1], &w->heap[c]))
            c++;
        if (!pair_before(&w->heap[c], &last))
            break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    w->heap[i] = last;
    return top;
}

/* Merges the linked symbols sym[0..n) until no pair merges. */
static void merge_all(const struct infer_tokenizer *t, struct tok_work *w, size_t n)
{
    w->n_heap = 0;
    for (size_t i = 0; i + 1 < n; i++)
        pair_push(t, w, i);
    while (w->n_heap > 0) {
        struct tok_pair p = pair_pop(w);
        struct tok_sym *l = &w->sym[p.left];
        if (l->id != p.lid || l->next == TOK_NONE || w->sym[l->next].id != p.rid)
            continue; /* stale */
        size_t r = l->next;
        l->id = p.merged;
        w->sym[r].id = -1;
        l->next = w->sym[r].next;
        if (l->next != TOK_NONE)
            w->sym[l->next].prev = p.left;
        if (l->prev != TOK_NONE)
            pair_push(t, w, l->prev);
        if (l->next != TOK_NONE)
            pair_push(t, w, p.left);
    }
}

/* An optional dummy-prefix space, the code points (or byte fallbacks) of
 * text[0..len), then merges. Writes the first max tokens to tokens and the
 * count, which may exceed max, to *n_out. The dummy prefix is a token of its
 * own before the text's first code point (as run.c pushes it), never grouped
 * with a continuation byte that starts the text; merges then run over both. */
static int encode_piece(const struct infer_tokenizer *t, struct tok_work *w, int dummy_prefix,
                        const char *text, size_t len, int *tokens, size_t max, size_t *n_out)
{
    /* at most one symbol per byte, and the dummy prefix */
    int ret = work_reserve(w, len + 1);
    if (ret < 0)
        return ret;
    size_t n = 0;
    if (dummy_prefix) {
        /* SentencePiece's add_dummy_prefix */
        int sp = lookup(t, " ", 1);
        if (sp >= 0 && !is_control(t, sp))
            w->sym[n++].id = sp;
        else
            w->sym[n++].id = t->byte_id[' '] >= 0 ? t->byte_id[' '] : 0;
    }
    const unsigned char *p = (const unsigned char *)text, *end = p + len;
    while (p < end) {
        /* one UTF-8 code point: a lead byte and its continuation bytes (at most 4) */
        uint32_t cl = 1;
        while (cl < 4 && p + cl < end && (p[cl] & 0xc0) == 0x80)
            cl++;
        int id = lookup(t, (const char *)p, cl);
        if (id >= 0 && !is_control(t, id)) {
            w->sym[n++].id = id;
        } else {
            for (uint32_t i = 0; i < cl; i++) {
                int b = t->byte_id[p[i]];
                w->sym[n++].id = b >= 0 ? b : 0; /* <unk> when the vocabulary has no byte tokens */
            }
        }
        p += cl;
    }
    for (size_t i = 0; i < n; i++) {
        w->sym[i].prev = i > 0 ? i - 1 : TOK_NONE;
        w->sym[i].next = i + 1 < n ? i + 1 : TOK_NONE;
    }
    merge_all(t, w, n);
    /* symbol 0 is never absorbed: it heads the list */
    size_t k = 0;
    for (size_t i = n > 0 ? 0 : TOK_NONE; i != TOK_NONE; i = w->sym[i].next) {
        if (k < max)
            tokens[k] = w->sym[i].id;
        k++;
    }
    *n_out = k;
    return 0;
}

int infer_tokenizer_encode(const struct infer_tokenizer *t, const char *text, int add_bos,
                           int *tokens, uint32_t max, uint32_t *n_out)
{
    size_t n = add_bos ? 1 : 0, k = 0, len = strlen(text);
    if (n > 0 && max > 0)
        tokens[0] = (int)t->bos;
    if (len > 0) {
        /* the whole text is one piece, as llama2.c's run.c merges it */
        struct tok_work w;
        int ret = work_init(&w, t);
        if (ret == 0)
            ret = encode_piece(t, &w, 1, text, len, max > n ? tokens + n : NULL,
                               max > n ? max - n : 0, &k);
        work_fini(&w);
        if (ret < 0)
            return ret;
    }
    n += k;
    *n_out = n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
    return n > max ? -ENOSPC : 0;
}

int infer_tokenizer_encode_stream(const struct infer_tokenizer *t, const char *text, size_t len,
                                  int **tokens, uint32_t *n_out)
{
    /* at most one token per byte, and the dummy prefix */
    if (len >= UINT32_MAX)
        return -EOVERFLOW;
    struct tok_work w;
    int ret = work_init(&w, t);
    if (ret < 0)
        return ret;
    int *out = malloc(sizeof(int) * (len + 1));
    if (!out) {
        ret = -ENOMEM;
        goto fail;
    }
    size_t n = 0, i = 0;
    int first = 1;
    while (i < len) {
        /* a piece: the text from a space up to the next space; the first
         * piece gets the dummy prefix (a token of its own, as in
         * infer_tokenizer_encode) */
        size_t j = i + (text[i] == ' ' ? 1 : 0);
        while (j < len && text[j] != ' ')
            j++;
        size_t k;
        ret = encode_piece(t, &w, first, text + i, j - i, out + n, len + 1 - n, &k);
        if (ret < 0)
            goto fail;
        assert(k <= len + 1 - n);
        first = 0;
        n += k;
        i = j;
    }
    work_fini(&w);
    *tokens = out;
    *n_out = (uint32_t)n;
    return 0;
fail:
    free(out);
    work_fini(&w);
    return ret;
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

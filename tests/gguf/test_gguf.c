/* test_gguf.c: the GGUF view (gguf.h) without a mount. A random container
 * with every quantized encoding (tests/fs/fs_testmodel.c; dim 224, so the
 * FFN width 560 is not a multiple of 32 and w_down takes the F16 fallback):
 * - the header, parsed here independently of the writer: magic, version,
 *   every llama.* key and the vocabulary from the container, tensor infos,
 *   offsets at general.alignment (32 and 4096);
 * - every tensor's values: Q8_0 blocks hold the row's codes and fp16(scale),
 *   F16 fp16(scale * code), F32 scale * code, norms the container's floats;
 * - reads of random ranges, by 8 threads at once, with no cache, a 2-chunk
 *   cache (evictions) and a large one, equal the file written in one pass;
 *   the counters add up;
 * - a corrupt slice: every range that needs it is -EIO, every other range
 *   reads right; writing the file fails and leaves nothing behind;
 * - a read inside the header needs no slice; a small read of a chunk not
 *   converted yet converts just its range; gguf_view_warm converts a chunk
 *   ahead of readers (pushing it when asked), never evicts a chunk nobody
 *   has read, and readers evict read chunks first; warming over a corrupt
 *   slice caches nothing wrong;
 * - bad options are refused;
 * - a scale (Q8_0) or a weight (F16) beyond fp16's range, or a negative or
 *   NaN scale, is an error for its rows, never a clamped or infinite value;
 *   rows longer than 256 (rounded once per code) give the same bits as
 *   rounding each weight, and fail only for a code that is present. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../gguf/gguf_internal.h"
#include "../fs/fs_testmodel.h"
#include "format.h"
#include "gguf.h"
#include "testutil.h"
#include "unpack.h"

static char model[PATH_MAX], bad_model[PATH_MAX];
static const char *dir;

static int setup(void **st)
{
    (void)st;
    dir = test_tmpdir();
    struct sl_err err = {{0}};
    snprintf(model, sizeof model, "%s/m.sluice", dir);
    if (fs_test_model_write(model, test_seed(), 6, 224, &err) < 0)
        fail_msg("%s", err.msg);
    return 0;
}

struct opened {
    struct format_reader *r;
    struct gguf_view *v;
    struct gguf_source src;
};

static void open_view(struct opened *o, const char *path, uint32_t qtype, uint32_t align,
                      uint64_t cache)
{
    struct sl_err err = {{0}};
    struct gguf_view_opts opts;
    gguf_view_opts_init(&opts);
    opts.qtype = qtype;
    opts.alignment = align;
    opts.cache_bytes = cache;
    if (format_reader_open(path, &o->r, &err) < 0 ||
        gguf_view_create(o->r, &opts, &o->v, &err) < 0 ||
        gguf_file_source_create(o->r, &o->src, &err) < 0)
        fail_msg("%s", err.msg);
}

static void close_view(struct opened *o)
{
    gguf_file_source_destroy(&o->src);
    gguf_view_destroy(o->v);
    format_reader_close(o->r);
}

/* The whole file, written in one pass by gguf_view_write_file. */
static uint8_t *whole(struct opened *o, size_t *len)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/whole.gguf", dir);
    struct sl_err err = {{0}};
    if (gguf_view_write_file(o->v, &o->src, p, NULL, NULL, &err) < 0)
        fail_msg("%s", err.msg);
    uint8_t *b = test_read_file(p, len);
    assert_non_null(b);
    assert_int_equal(*len, gguf_view_size(o->v));
    unlink(p);
    return b;
}

/* ---- an independent reader of what the view wrote ----------------------------------- */

struct cur {
    const uint8_t *p, *end;
};

static uint64_t g64(struct cur *c)
{
    assert_true(c->end - c->p >= 8);
    uint64_t v = sl_load_le64(c->p);
    c->p += 8;
    return v;
}

static uint32_t g32(struct cur *c)
{
    assert_true(c->end - c->p >= 4);
    uint32_t v = sl_load_le32(c->p);
    c->p += 4;
    return v;
}

static const uint8_t *gstr(struct cur *c, uint64_t *n)
{
    *n = g64(c);
    assert_true((uint64_t)(c->end - c->p) >= *n);
    const uint8_t *s = c->p;
    c->p += *n;
    return s;
}

static int is(const uint8_t *s, uint64_t n, const char *want)
{
    return n == strlen(want) && !memcmp(s, want, n);
}

static void check_header(const uint8_t *f, size_t len, const struct format_reader *r,
                         const struct gguf_view *v, uint32_t align)
{
    const struct format_config *c = format_reader_config(r);
    const struct format_tokenizer *tok = format_reader_tokenizer(r);
    struct cur k = {f, f + len};
    assert_memory_equal(f, "GGUF", 4);
    k.p += 4;
    assert_int_equal(g32(&k), 3);
    uint64_t nt = g64(&k), nkv = g64(&k);
    assert_int_equal(nt, format_reader_n_tensors(r));
    int seen = 0;
    for (uint64_t i = 0; i < nkv; i++) {
        uint64_t kl, sl;
        const uint8_t *key = gstr(&k, &kl);
        uint32_t type = g32(&k);
        const struct {
            const char *key;
            uint32_t v;
        } u32s[] = {{"general.alignment", align},
                    {"llama.context_length", c->seq_len},
                    {"llama.embedding_length", c->dim},
                    {"llama.block_count", c->n_layers},
                    {"llama.feed_forward_length", c->hidden_dim},
                    {"llama.attention.head_count", c->n_heads},
                    {"llama.attention.head_count_kv", c->n_kv_heads},
                    {"llama.rope.dimension_count", c->head_dim},
                    {"tokenizer.ggml.bos_token_id", c->bos_id},
                    {"tokenizer.ggml.eos_token_id", c->eos_id}};
        int done = 0;
        for (size_t j = 0; j < sizeof u32s / sizeof u32s[0]; j++)
            if (is(key, kl, u32s[j].key)) {
                assert_int_equal(type, 4);
                assert_int_equal(g32(&k), u32s[j].v);
                seen++, done = 1;
            }
        if (done)
            continue;
        if (is(key, kl, "general.architecture") || is(key, kl, "tokenizer.ggml.model")) {
            assert_int_equal(type, 8);
            const uint8_t *s = gstr(&k, &sl);
            assert_true(is(s, sl, "llama"));
            seen++;
        } else if (is(key, kl, "llama.rope.freq_base") ||
                   is(key, kl, "llama.attention.layer_norm_rms_epsilon")) {
            assert_int_equal(type, 6);
            float want = is(key, kl, "llama.rope.freq_base") ? c->rope_theta : c->norm_eps;
            assert_true(sl_load_lef32(k.p) == want);
            k.p += 4;
            seen++;
        } else if (is(key, kl, "tokenizer.ggml.tokens")) {
            assert_int_equal(type, 9);
            assert_int_equal(g32(&k), 8);
            assert_int_equal(g64(&k), tok->n_tokens);
            for (uint32_t t = 0; t < tok->n_tokens; t++) {
                const uint8_t *s = gstr(&k, &sl);
                if (t == c->bos_id || t == c->eos_id)
                    continue;
                /* spaces become U+2581, nothing else changes */
                char want[256];
                uint64_t n = 0;
                for (uint32_t b = 0; b < tok->lens[t]; b++) {
                    if (tok->tokens[t][b] == ' ')
                        memcpy(want + n, "\xe2\x96\x81", 3), n += 3;
                    else
                        want[n++] = tok->tokens[t][b];
                }
                assert_int_equal(sl, n);
                assert_memory_equal(s, want, n);
            }
            seen++;
        } else if (is(key, kl, "tokenizer.ggml.scores") ||
                   is(key, kl, "tokenizer.ggml.token_type")) {
            int scores = is(key, kl, "tokenizer.ggml.scores");
            assert_int_equal(type, 9);
            assert_int_equal(g32(&k), scores ? 6 : 5);
            assert_int_equal(g64(&k), tok->n_tokens);
            for (uint32_t t = 0; t < tok->n_tokens; t++) {
                uint32_t x = g32(&k);
                if (scores) {
                    float fx;
                    memcpy(&fx, &x, 4);
                    assert_true(fx == tok->scores[t]);
                } else {
                    assert_int_equal(x, t == c->bos_id || t == c->eos_id ? 3 : 1);
                }
            }
            seen++;
        } else if (type == 8) {
            gstr(&k, &sl);
        } else if (type == 7) {
            k.p += 1;
        } else {
            assert_true(type == 4 || type == 5 || type == 6);
            k.p += 4;
        }
    }
    assert_int_equal(seen, 17);
    for (uint64_t i = 0; i < nt; i++) {
        const struct gguf_view_tensor *t = gguf_view_tensor(v, (uint32_t)i);
        const struct format_tensor_info *ti = format_reader_tensor(r, t->tensor);
        uint64_t nl;
        const uint8_t *name = gstr(&k, &nl);
        char want[FORMAT_NAME_MAX];
        format_tensor_name(ti->layer, ti->role, want, sizeof want);
        assert_true(is(name, nl, want));
        assert_true(is(name, nl, t->name));
        uint32_t nd = g32(&k);
        assert_int_equal(nd, ti->n_dims);
        assert_int_equal(g64(&k), nd == 2 ? ti->shape[1] : ti->shape[0]);
        if (nd == 2)
            assert_int_equal(g64(&k), ti->shape[0]);
        assert_int_equal(g32(&k), t->type);
        uint64_t off = g64(&k);
        assert_int_equal(off % align, 0);
        assert_int_equal(gguf_view_header_size(v) + off, t->offset);
        assert_true(t->offset + t->size <= len);
    }
    assert_int_equal(gguf_view_header_size(v), sl_align_up((uint64_t)(k.p - f), align));
    for (const uint8_t *p = k.p; p < f + gguf_view_header_size(v); p++)
        assert_int_equal(*p, 0);
    assert_int_equal(len % align, 0);
}

/* Every tensor's values against the container's, decoded independently. */
static void check_values(const uint8_t *f, const struct format_reader *r, const struct gguf_view *v)
{
    struct sl_err err = {{0}};
    for (uint32_t i = 0; i < gguf_view_n_tensors(v); i++) {
        const struct gguf_view_tensor *t = gguf_view_tensor(v, i);
        const struct format_tensor_info *ti = format_reader_tensor(r, t->tensor);
        uint8_t *raw = malloc(ti->length);
        assert_non_null(raw);
        assert_int_equal(format_reader_read_tensor(r, t->tensor, raw, ti->length, &err), 0);
        const uint8_t *d = f + t->offset;
        if (ti->n_dims == 1) {
            assert_int_equal(t->type, GGUF_GGML_F32);
            float *want = malloc(4 * ti->shape[0]);
            assert_int_equal(format_decode_float(ti->encoding, raw, want, ti->shape[0]), 0);
            for (uint64_t k = 0; k < ti->shape[0]; k++)
                assert_true(sl_load_lef32(d + 4 * k) == want[k]);
            free(want);
            free(raw);
            continue;
        }
        uint64_t rows = ti->shape[0], cols = ti->shape[1];
        int8_t *q = malloc(rows * cols);
        float *sc = malloc(4 * rows);
        assert_int_equal(unpack_tensor_int8(ti, raw, q, sc, &err), 0);
        if (t->f16_fallback)
            assert_true(t->type == GGUF_GGML_F16 && cols % 32 != 0);
        if (t->type == GGUF_GGML_Q8_0)
            assert_int_equal(cols % 32, 0);
        for (uint64_t rr = 0; rr < rows; rr++) {
            const int8_t *qr = q + rr * cols;
            if (t->type == GGUF_GGML_Q8_0) {
                const uint8_t *row = d + rr * (cols / 32 * 34);
                for (uint64_t b = 0; b < cols / 32; b++) {
                    assert_int_equal(sl_load_le16(row + 34 * b), sl_f32_to_f16(sc[rr]));
                    assert_memory_equal(row + 34 * b + 2, qr + 32 * b, 32);
                }
            } else if (t->type == GGUF_GGML_F16) {
                for (uint64_t cc = 0; cc < cols; cc++)
                    assert_int_equal(sl_load_le16(d + 2 * (rr * cols + cc)),
                                     sl_f32_to_f16(sc[rr] * (float)qr[cc]));
            } else {
                assert_int_equal(t->type, GGUF_GGML_F32);
                for (uint64_t cc = 0; cc < cols; cc++)
                    assert_true(sl_load_lef32(d + 4 * (rr * cols + cc)) == sc[rr] * (float)qr[cc]);
            }
        }
        free(q);
        free(sc);
        free(raw);
    }
}

static void test_layout_and_values(void **st)
{
    (void)st;
    const uint32_t types[3] = {GGUF_GGML_Q8_0, GGUF_GGML_F16, GGUF_GGML_F32};
    const uint32_t aligns[2] = {32, 4096};
    for (int ti = 0; ti < 3; ti++)
        for (int ai = 0; ai < 2; ai++) {
            struct opened o;
            open_view(&o, model, types[ti], aligns[ai], 0);
            size_t len;
            uint8_t *f = whole(&o, &len);
            check_header(f, len, o.r, o.v, aligns[ai]);
            check_values(f, o.r, o.v);
            int fallbacks = 0;
            for (uint32_t i = 0; i < gguf_view_n_tensors(o.v); i++)
                fallbacks += gguf_view_tensor(o.v, i)->f16_fallback;
            /* w_down of each of the 6 layers has rows of 560 */
            assert_int_equal(fallbacks, types[ti] == GGUF_GGML_Q8_0 ? 6 : 0);
            free(f);
            close_view(&o);
        }
}

/* ---- random concurrent reads ------------------------------------------------------------ */

struct reader_arg {
    struct opened *o;
    const uint8_t *want;
    size_t len;
    uint64_t seed;
    int bad;
};

static void *reader(void *p)
{
    struct reader_arg *a = p;
    struct test_rng g;
    test_rng_init(&g, a->seed);
    uint8_t *buf = malloc(400000);
    for (int i = 0; i < 150 && !a->bad; i++) {
        uint64_t off = test_rng_u64(&g) % (a->len + 100);
        size_t n = 1 + test_rng_below(&g, i % 3 == 0 ? 400000 : 5000);
        struct sl_err err = {{0}};
        ssize_t k = gguf_view_read(a->o->v, &a->o->src, buf, n, off, &err);
        size_t expect = off >= a->len ? 0 : (a->len - off < n ? a->len - off : n);
        if (k != (ssize_t)expect || (expect && memcmp(buf, a->want + off, expect)))
            a->bad = 1;
    }
    free(buf);
    return NULL;
}

static void test_concurrent_reads(void **st)
{
    (void)st;
    const uint64_t caches[3] = {0, 2 * GGUF_VIEW_CHUNK, 64 * GGUF_VIEW_CHUNK};
    struct opened ref;
    open_view(&ref, model, GGUF_GGML_Q8_0, 32, 0);
    size_t len;
    uint8_t *want = whole(&ref, &len);
    assert_true(len > 3 * GGUF_VIEW_CHUNK); /* several chunks */
    for (int c = 0; c < 3; c++) {
        struct opened o;
        open_view(&o, model, GGUF_GGML_Q8_0, 32, caches[c]);
        pthread_t th[8];
        struct reader_arg a[8];
        for (int i = 0; i < 8; i++) {
            a[i] = (struct reader_arg){&o, want, len, test_seed() + 977 * (uint64_t)i + c, 0};
            assert_int_equal(pthread_create(&th[i], NULL, reader, &a[i]), 0);
        }
        for (int i = 0; i < 8; i++) {
            pthread_join(th[i], NULL);
            if (a[i].bad)
                fail_msg("reader %d read wrong bytes (cache %llu)", i,
                         (unsigned long long)caches[c]);
        }
        struct gguf_view_stats s;
        gguf_view_get_stats(o.v, &s);
        assert_int_equal(s.errors, 0);
        assert_true(s.resident <= caches[c]);
        if (caches[c]) {
            assert_true(s.misses > 0 && s.hits > 0);
            /* a chunk is converted at most once while it stays cached */
            if (c == 2)
                assert_int_equal(s.evictions, 0);
            else
                assert_true(s.evictions > 0);
            if (c == 2)
                assert_true(s.misses <= (len + GGUF_VIEW_CHUNK - 1) / GGUF_VIEW_CHUNK);
        } else {
            assert_int_equal(s.hits + s.misses, 0);
        }
        close_view(&o);
    }
    free(want);
    close_view(&ref);
}

/* ---- the header, small reads, warming -------------------------------------------------- */

/* The file source, counting acquires. */
struct counting {
    struct gguf_source inner;
    int acquires;
};

static int cnt_acquire(void *ctx, uint32_t slice, const uint8_t **data, void **token,
                       struct sl_err *err)
{
    struct counting *c = ctx;
    __atomic_add_fetch(&c->acquires, 1, __ATOMIC_RELAXED);
    return c->inner.acquire(c->inner.ctx, slice, data, token, err);
}

static void cnt_release(void *ctx, uint32_t slice, void *token)
{
    struct counting *c = ctx;
    c->inner.release(c->inner.ctx, slice, token);
}

static struct gguf_source counting_source(struct counting *c, const struct gguf_source *inner)
{
    c->inner = *inner;
    c->acquires = 0;
    return (struct gguf_source){c, cnt_acquire, cnt_release, NULL};
}

static void test_header_and_small_reads(void **st)
{
    (void)st;
    struct opened o;
    open_view(&o, model, GGUF_GGML_Q8_0, 32, 8 * GGUF_VIEW_CHUNK);
    size_t len;
    uint8_t *want = whole(&o, &len);
    close_view(&o);
    open_view(&o, model, GGUF_GGML_Q8_0, 32, 8 * GGUF_VIEW_CHUNK);
    struct counting c;
    struct gguf_source src = counting_source(&c, &o.src);
    uint64_t head = gguf_view_header_size(o.v);
    uint8_t *buf = malloc(2 * GGUF_VIEW_CHUNK);
    assert_non_null(buf);
    struct gguf_view_stats s;

    /* the header: from memory */
    assert_int_equal(gguf_view_read(o.v, &src, buf, head, 0, NULL), (ssize_t)head);
    assert_memory_equal(buf, want, head);
    assert_int_equal(c.acquires, 0);
    gguf_view_get_stats(o.v, &s);
    assert_int_equal(s.hits + s.misses + s.direct + s.resident, 0);

    /* a small read of chunk 2: its range only, nothing cached */
    uint64_t off = 2 * GGUF_VIEW_CHUNK + 1000;
    assert_int_equal(gguf_view_read(o.v, &src, buf, 5000, off, NULL), 5000);
    assert_memory_equal(buf, want + off, 5000);
    assert_true(c.acquires > 0);
    gguf_view_get_stats(o.v, &s);
    assert_int_equal(s.direct, 1);
    assert_int_equal(s.misses + s.resident, 0);

    /* a large one converts and caches the chunk; a small one then hits it */
    size_t big = GGUF_VIEW_SMALL_READ + 1;
    assert_int_equal(gguf_view_read(o.v, &src, buf, big, 2 * GGUF_VIEW_CHUNK, NULL),
                     (ssize_t)big);
    assert_memory_equal(buf, want + 2 * GGUF_VIEW_CHUNK, big);
    assert_int_equal(gguf_view_read(o.v, &src, buf, 5000, off, NULL), 5000);
    assert_memory_equal(buf, want + off, 5000);
    gguf_view_get_stats(o.v, &s);
    assert_int_equal(s.misses, 1);
    assert_int_equal(s.hits, 1);
    assert_int_equal(s.direct, 1);
    assert_int_equal(s.resident, GGUF_VIEW_CHUNK);
    free(buf);
    free(want);
    close_view(&o);
}

struct pushed {
    const uint8_t *want;
    int calls, bad;
    uint64_t last;
};

static int push_check(void *ctx, uint64_t start, const void *data, size_t len)
{
    struct pushed *p = ctx;
    p->calls++;
    p->last = start;
    if (start % GGUF_VIEW_CHUNK || len > GGUF_VIEW_CHUNK || memcmp(data, p->want + start, len))
        p->bad = 1;
    return 0;
}

static void test_warm(void **st)
{
    (void)st;
    struct opened o;
    open_view(&o, model, GGUF_GGML_Q8_0, 32, 0);
    size_t len;
    uint8_t *want = whole(&o, &len);
    assert_true(len > 3 * GGUF_VIEW_CHUNK);
    assert_int_equal(gguf_view_warm(o.v, &o.src, 0, NULL, NULL, NULL), -EINVAL); /* no cache */
    close_view(&o);

    open_view(&o, model, GGUF_GGML_Q8_0, 32, 2 * GGUF_VIEW_CHUNK);
    struct counting c;
    struct gguf_source src = counting_source(&c, &o.src);
    struct pushed p = {want, 0, 0, 0};
    struct gguf_view_stats s;
    uint8_t *buf = malloc(GGUF_VIEW_CHUNK);
    assert_non_null(buf);
    const uint64_t C = GGUF_VIEW_CHUNK;
    struct sl_err err = {{0}};
    assert_int_equal(gguf_view_warm(o.v, &src, len, NULL, NULL, &err), -EINVAL);

    /* chunks 0 and 1 warmed (1 pushed), nobody has read 0: 2 finds no room */
    assert_int_equal(gguf_view_warm(o.v, &src, 10, NULL, NULL, &err), 0);
    assert_int_equal(gguf_view_warm(o.v, &src, C + 10, push_check, &p, &err), 0);
    assert_int_equal(p.calls, 1);
    assert_int_equal(p.last, C);
    assert_false(p.bad);
    assert_int_equal(gguf_view_warm(o.v, &src, 10, NULL, NULL, &err), 0); /* cached: no-op */
    gguf_view_get_stats(o.v, &s);
    assert_int_equal(s.warmed, 2);
    assert_int_equal(s.pushed, 1);
    /* chunk 1 counts as read (pushed): chunk 2 may evict it, not chunk 0 */
    assert_int_equal(gguf_view_warm(o.v, &src, 2 * C, NULL, NULL, &err), 0);
    gguf_view_get_stats(o.v, &s);
    assert_int_equal(s.evictions, 1);
    assert_int_equal(s.resident, 2 * C);
    /* now 0 and 2 are cached and unread: no room for 3 */
    assert_int_equal(gguf_view_warm(o.v, &src, 3 * C, NULL, NULL, &err), -ENOSPC);
    gguf_view_get_stats(o.v, &s);
    assert_int_equal(s.evictions, 1);
    assert_int_equal(s.warmed, 3);

    /* readers hit warmed chunks */
    int before = c.acquires;
    assert_int_equal(gguf_view_read(o.v, &src, buf, C, 0, NULL), (ssize_t)C);
    assert_memory_equal(buf, want, C);
    assert_int_equal(c.acquires, before);
    gguf_view_get_stats(o.v, &s);
    assert_int_equal(s.hits, 1);
    assert_int_equal(s.misses, 0);
    /* chunk 0 is read now: warming 3 evicts it, not the unread chunk 2 */
    assert_int_equal(gguf_view_warm(o.v, &src, 3 * C, NULL, NULL, &err), 0);
    assert_int_equal(gguf_view_read(o.v, &src, buf, C, 2 * C, NULL), (ssize_t)C);
    assert_memory_equal(buf, want + 2 * C, C);
    gguf_view_get_stats(o.v, &s);
    assert_int_equal(s.hits, 2);
    assert_int_equal(s.misses, 0);
    assert_int_equal(s.evictions, 2);
    /* a reader needing room evicts the read chunk 2 before the unread 3 */
    assert_int_equal(gguf_view_read(o.v, &src, buf, C, C, NULL), (ssize_t)C);
    assert_memory_equal(buf, want + C, C);
    size_t tail = len - 3 * C < C ? len - 3 * C : C;
    assert_int_equal(gguf_view_read(o.v, &src, buf, tail, 3 * C, NULL), (ssize_t)tail);
    assert_memory_equal(buf, want + 3 * C, tail);
    gguf_view_get_stats(o.v, &s);
    assert_int_equal(s.misses, 1);
    assert_int_equal(s.hits, 3);
    assert_int_equal(s.errors, 0);
    free(buf);
    free(want);
    close_view(&o);
}

/* ---- a corrupt slice -------------------------------------------------------------------- */

static void test_corrupt_slice(void **st)
{
    (void)st;
    struct opened ref;
    open_view(&ref, model, GGUF_GGML_Q8_0, 32, 0);
    size_t len;
    uint8_t *want = whole(&ref, &len);
    /* flip one byte in the middle of layer 2's slice */
    snprintf(bad_model, sizeof bad_model, "%s/bad.sluice", dir);
    assert_int_equal(test_system("cp '%s' '%s'", model, bad_model), 0);
    uint32_t bad = 0;
    for (uint32_t i = 0; i < format_reader_n_slices(ref.r); i++)
        if (format_reader_slice(ref.r, i)->layer == 2)
            bad = i;
    const struct format_slice_info *si = format_reader_slice(ref.r, bad);
    int fd = open(bad_model, O_RDWR);
    assert_true(fd >= 0);
    uint8_t b;
    off_t at = (off_t)(si->offset + si->length / 3);
    assert_int_equal(pread(fd, &b, 1, at), 1);
    b ^= 0x10;
    assert_int_equal(pwrite(fd, &b, 1, at), 1);
    close(fd);
    for (int cached = 0; cached < 2; cached++) {
        struct opened o;
        open_view(&o, bad_model, GGUF_GGML_Q8_0, 32, cached ? 8 * GGUF_VIEW_CHUNK : 0);
        if (cached) { /* warming caches the good chunks and nothing of the bad */
            int n_failed = 0;
            for (uint64_t off = 0; off < gguf_view_size(o.v); off += GGUF_VIEW_CHUNK) {
                struct sl_err err = {{0}};
                int ret = gguf_view_warm(o.v, &o.src, off, NULL, NULL, &err);
                assert_true(ret == 0 || ret == -EIO);
                n_failed += ret < 0;
            }
            assert_true(n_failed > 0);
        }
        for (uint32_t i = 0; i < gguf_view_n_tensors(o.v); i++) {
            const struct gguf_view_tensor *t = gguf_view_tensor(o.v, i);
            uint32_t slice = format_reader_tensor(o.r, t->tensor)->slice;
            uint64_t n = t->size < 100 ? t->size : 100;
            uint8_t buf[100];
            struct sl_err err = {{0}};
            ssize_t k = gguf_view_read(o.v, &o.src, buf, n, t->offset + t->size - n, &err);
            if (slice == bad) {
                assert_int_equal(k, -EIO);
                assert_non_null(strstr(err.msg, "checksum"));
            } else {
                /* a range needs only its own tensor (cached or not) */
                assert_int_equal(k, (ssize_t)n);
                assert_memory_equal(buf, want + t->offset + t->size - n, n);
            }
        }
        /* the header still reads */
        uint8_t h[64];
        assert_int_equal(gguf_view_read(o.v, &o.src, h, 64, 0, NULL), 64);
        assert_memory_equal(h, want, 64);
        /* and a file written from it never appears */
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/never.gguf", dir);
        struct sl_err err = {{0}};
        assert_int_equal(gguf_view_write_file(o.v, &o.src, p, NULL, NULL, &err), -EIO);
        struct stat sst;
        assert_int_equal(stat(p, &sst), -1);
        assert_int_equal(test_system("ls '%s' | grep -q never.gguf", dir), 1);
        struct gguf_view_stats s;
        gguf_view_get_stats(o.v, &s);
        assert_true(s.errors > 0);
        close_view(&o);
    }
    free(want);
    close_view(&ref);
}

static void test_bad_options(void **st)
{
    (void)st;
    struct sl_err err = {{0}};
    struct format_reader *r;
    assert_int_equal(format_reader_open(model, &r, &err), 0);
    struct gguf_view_opts o;
    struct gguf_view *v = NULL;
    gguf_view_opts_init(&o);
    o.alignment = 48;
    assert_int_equal(gguf_view_create(r, &o, &v, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "power of two"));
    gguf_view_opts_init(&o);
    o.qtype = GGUF_GGML_BF16;
    assert_int_equal(gguf_view_create(r, &o, &v, &err), -EINVAL);
    assert_null(v);
    format_reader_close(r);
}

/* One q8 tensor of 2 rows x 64 made up here, converted by gv_convert. */
static void test_scale_range(void **st)
{
    (void)st;
    uint8_t src[128 + 64];
    memset(src, 0, sizeof src);
    for (int i = 0; i < 128; i++)
        src[64 + i] = (uint8_t)(int8_t)(i % 2 ? 100 : -100);
    int8_t q[64];
    uint8_t row[256], out[512];
    struct gv_scratch sc = {q, row};
    struct gv_tensor t;
    memset(&t, 0, sizeof t);
    snprintf(t.pub.name, sizeof t.pub.name, "blk.0.attn_q.weight");
    t.pub.n_dims = 2;
    t.enc = FORMAT_ENC_Q8_CHANNEL;
    t.rows = 2, t.cols = 64, t.src_len = sizeof src;
    struct sl_err err = {{0}};
    assert_int_equal(gv_parse(&t, src, &err), 0);
    const float scales[4][2] = {{0.5f, 1e6f}, {0.5f, 700.0f}, {0.5f, -1.0f}, {0.5f, NAN}};
    const uint32_t types[3] = {GGUF_GGML_Q8_0, GGUF_GGML_F16, GGUF_GGML_F32};
    for (int k = 0; k < 4; k++)
        for (int ty = 0; ty < 3; ty++) {
            sl_store_lef32(src, scales[k][0]);
            sl_store_lef32(src + 4, scales[k][1]);
            t.pub.type = types[ty];
            t.row_bytes = ty == 0 ? 68 : ty == 1 ? 128 : 256;
            err.msg[0] = 0;
            /* row 0 converts whatever row 1 holds */
            assert_int_equal(gv_convert(&t, src, 0, t.row_bytes, out, &sc, &err), 0);
            int ret = gv_convert(&t, src, 0, 2 * t.row_bytes, out, &sc, &err);
            /* 1e6 overflows fp16 as a scale; 700 * 100 overflows it as a weight */
            int want = k >= 2 ? -EINVAL : ty == 0 ? (k == 0 ? -ERANGE : 0) : ty == 1 ? -ERANGE : 0;
            if (ret != want)
                fail_msg("scale %g as type %u: %d, want %d (%s)", (double)scales[k][1], types[ty],
                         ret, want, err.msg);
            if (want)
                assert_non_null(strstr(err.msg, "row 1"));
        }
}

/* Rows longer than 256 weights as F16 (one rounding per code): the bits of
 * rounding each weight, and an error only for a code that overflows. */
static void test_f16_long_rows(void **st)
{
    (void)st;
    enum { COLS = 288 };
    uint8_t src[64 + COLS];
    memset(src, 0, sizeof src);
    int8_t q[COLS];
    uint8_t row[2 * COLS], out[2 * COLS];
    struct gv_scratch sc = {q, row};
    struct gv_tensor t;
    memset(&t, 0, sizeof t);
    snprintf(t.pub.name, sizeof t.pub.name, "blk.0.ffn_down.weight");
    t.pub.n_dims = 2;
    t.pub.type = GGUF_GGML_F16;
    t.enc = FORMAT_ENC_Q8_CHANNEL;
    t.rows = 1, t.cols = COLS, t.src_len = sizeof src, t.row_bytes = 2 * COLS;
    struct sl_err err = {{0}};
    assert_int_equal(gv_parse(&t, src, &err), 0);
    struct test_rng g;
    test_rng_init(&g, test_seed());
    /* 700 * 93 = 65100 rounds to fp16's largest finite value; 700 * 94 overflows */
    for (int c = 0; c < COLS; c++)
        src[64 + c] = (uint8_t)(int8_t)((int)test_rng_below(&g, 187) - 93);
    const float scales[3] = {700.0f, 0.0123f, 1e-7f};
    for (int k = 0; k < 3; k++) {
        sl_store_lef32(src, scales[k]);
        if (k == 1) /* every code from here on */
            for (int c = 0; c < COLS; c++)
                src[64 + c] = (uint8_t)(int8_t)(c < 256 ? c - 128 : (int)test_rng_below(&g, 256) - 128);
        assert_int_equal(gv_convert(&t, src, 0, t.row_bytes, out, &sc, &err), 0);
        for (int c = 0; c < COLS; c++) {
            uint16_t h = sl_f32_to_f16(scales[k] * (float)(int8_t)src[64 + c]);
            if (sl_load_le16(out + 2 * c) != h)
                fail_msg("scale %g col %d: %04x, want %04x", (double)scales[k], c,
                         sl_load_le16(out + 2 * c), h);
        }
    }
    sl_store_lef32(src, 700.0f);
    src[64 + 200] = (uint8_t)(int8_t)-94;
    assert_int_equal(gv_convert(&t, src, 0, t.row_bytes, out, &sc, &err), -ERANGE);
    assert_non_null(strstr(err.msg, "exceeds fp16"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_and_values), cmocka_unit_test(test_concurrent_reads),
        cmocka_unit_test(test_corrupt_slice),     cmocka_unit_test(test_bad_options),
        cmocka_unit_test(test_scale_range),       cmocka_unit_test(test_header_and_small_reads),
        cmocka_unit_test(test_warm),              cmocka_unit_test(test_f16_long_rows),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}

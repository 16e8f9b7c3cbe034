/* fs_views.c: files computed on read.
 *   <role>.int8    rows x cols int8 codes of a quantized tensor (what
 *                  unpack_tensor_int8 gives); a read unpacks only the rows it
 *                  covers, from the verified slice
 *   <role>.scales  rows float32 (little-endian): the per-row dequantization
 *                  scales, copied from the tensor's scale section
 *   stats.json     a snapshot taken at open */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fs_internal.h"
#include "unpack.h"

struct fs_view {
    enum fs_kind kind;
    uint32_t slice;
    uint64_t tensor_off;     /* the tensor's offset inside its slice */
    uint32_t encoding;
    uint64_t rows, cols;
    /* packed encodings: section offsets from the tensor's start, and each
     * row's code offset from the data section (unpack_tensor_init's row_off) */
    uint64_t widths_off, scales_off, data_off, data_len;
    uint64_t mult_off; /* packed header version 2: the block multipliers; 0: none */
    uint32_t group;
    uint64_t *row_off;
    /* stats.json */
    char *text;
    size_t len;
};

/* Parses the tensor once, from its verified bytes, and keeps what later reads
 * need as offsets (the slice's bytes may move between reads). */
struct parse_arg {
    struct fs_view *v;
    const struct format_tensor_info *t;
    const uint8_t *p;        /* the tensor's first byte */
    struct sl_err *err;
};

static int parse_fn(void *p)
{
    struct parse_arg *a = p;
    struct fs_view *v = a->v;
    const struct format_tensor_info *t = a->t;
    if (t->encoding == FORMAT_ENC_Q8_CHANNEL) {
        /* scale[rows], padding to 64 bytes, q[rows][cols]; -128 is refused
         * exactly as unpack_tensor_int8 refuses it */
        const struct format_encoding_traits *tr = format_encoding_traits(t->encoding);
        if (tr->size(v->rows, v->cols) != t->length)
            return -EINVAL;
        int ret = tr->validate(a->p, t->length, v->rows, v->cols, a->err);
        if (ret < 0)
            return ret;
        v->scales_off = 0;
        v->data_off = sl_align_up(v->rows * 4, 64);
        return 0;
    }
    struct unpack_tensor u;
    int ret = unpack_tensor_init(&u, t->encoding, a->p, t->length, v->rows, v->cols, a->err);
    if (ret < 0)
        return ret;
    v->widths_off = (uint64_t)(u.layout.widths - a->p);
    v->scales_off = (uint64_t)(u.layout.scales - a->p);
    v->mult_off = u.layout.mult ? (uint64_t)(u.layout.mult - a->p) : 0; /* 0: none */
    v->data_off = (uint64_t)(u.layout.data - a->p);
    v->data_len = u.layout.data_len;
    v->group = u.layout.group;
    v->row_off = u.row_off; /* taken over; not finalized */
    return 0;
}

int fs_view_open(struct fs_state *s, const struct fs_node *n, struct fs_view **out)
{
    struct fs_view *v = calloc(1, sizeof *v);
    if (!v)
        return -ENOMEM;
    v->kind = n->kind;
    if (n->kind == FS_STATS) {
        v->text = fs_stats_json(s, &v->len);
        if (!v->text) {
            free(v);
            return -ENOMEM;
        }
        *out = v;
        return 0;
    }
    const struct format_tensor_info *t = format_reader_tensor(s->r, (uint32_t)n->tensor);
    const struct format_slice_info *si = format_reader_slice(s->r, n->slice);
    v->slice = n->slice;
    v->tensor_off = t->offset - si->offset;
    v->encoding = t->encoding;
    v->rows = t->shape[0];
    v->cols = t->shape[1];
    struct fs_pin pin;
    int ret = fs_slice_acquire(s, n->slice, &pin);
    if (ret < 0) {
        free(v);
        return ret;
    }
    struct sl_err err = {{0}};
    struct parse_arg a = {v, t, pin.data + v->tensor_off, &err};
    ret = pin.mapped ? fs_guarded(parse_fn, &a) : parse_fn(&a);
    fs_slice_release(s, &pin);
    if (ret < 0) {
        fs_log(s, "%s: tensor '%s': %s", s->container, t->name,
               err.msg[0] ? err.msg : "malformed or unreadable");
        free(v->row_off);
        free(v);
        return ret == -ENOMEM ? ret : -EIO;
    }
    *out = v;
    return 0;
}

void fs_view_close(struct fs_view *v)
{
    if (!v)
        return;
    free(v->row_off);
    free(v->text);
    free(v);
}

struct read_arg {
    const struct fs_view *v;
    const uint8_t *p;        /* the tensor's first byte */
    char *buf;
    size_t size;
    uint64_t off;
    int8_t *row;             /* cols bytes of scratch for partial rows */
};

/* Copies or unpacks bytes [off, off + size) of the view into buf. */
static int read_fn(void *p)
{
    struct read_arg *a = p;
    const struct fs_view *v = a->v;
    if (v->kind == FS_SCALES) {
        memcpy(a->buf, a->p + v->scales_off + a->off, a->size);
        return 0;
    }
    if (v->encoding == FORMAT_ENC_Q8_CHANNEL) {
        memcpy(a->buf, a->p + v->data_off + a->off, a->size);
        return 0;
    }
    /* packed: unpack whole rows r0..r1-1 and copy the part asked for */
    uint64_t r0 = a->off / v->cols, r1 = (a->off + a->size + v->cols - 1) / v->cols;
    struct unpack_tensor u = {
        .layout = {.encoding = v->encoding,
                   .rows = (uint32_t)v->rows,
                   .cols = (uint32_t)v->cols,
                   .group = v->group,
                   .widths = a->p + v->widths_off,
                   .scales = a->p + v->scales_off,
                   .mult = v->mult_off ? a->p + v->mult_off : NULL,
                   .mult_block = v->mult_off ? FORMAT_PACKED_MULT_BLOCK : 0,
                   .data = a->p + v->data_off,
                   .data_len = v->data_len},
        .row_off = v->row_off,
    };
    enum unpack_kernel k = unpack_kernel_best();
    char *dst = a->buf;
    uint64_t pos = a->off;
    for (uint64_t r = r0; r < r1; r++) {
        uint64_t row_start = r * v->cols;
        uint64_t from = pos - row_start;
        uint64_t take = v->cols - from;
        if (take > a->size - (size_t)(dst - a->buf))
            take = a->size - (size_t)(dst - a->buf);
        int ret;
        if (from == 0 && take == v->cols) {
            ret = unpack_tensor_rows(&u, k, (uint32_t)r, (uint32_t)r + 1, (int8_t *)dst, NULL);
        } else {
            ret = unpack_tensor_rows(&u, k, (uint32_t)r, (uint32_t)r + 1, a->row, NULL);
            memcpy(dst, a->row + from, take);
        }
        if (ret < 0)
            return ret;
        dst += take;
        pos += take;
    }
    return 0;
}

uint64_t fs_view_size(const struct fs_view *v)
{
    return v->kind == FS_STATS ? v->len : v->kind == FS_SCALES ? v->rows * 4 : v->rows * v->cols;
}

ssize_t fs_view_read(struct fs_state *s, struct fs_view *v, char *buf, size_t size, uint64_t off)
{
    uint64_t total = fs_view_size(v);
    if (off >= total)
        return 0;
    if (size > total - off)
        size = (size_t)(total - off);
    if (v->kind == FS_STATS) {
        memcpy(buf, v->text + off, size);
        return (ssize_t)size;
    }
    int8_t small[4096], *row = small;
    if (v->kind == FS_INT8 && v->cols > sizeof small && !(row = malloc(v->cols)))
        return -ENOMEM;
    struct fs_pin pin;
    int ret = fs_slice_acquire(s, v->slice, &pin);
    if (ret == 0) {
        struct read_arg a = {v, pin.data + v->tensor_off, buf, size, off, row};
        ret = pin.mapped ? fs_guarded(read_fn, &a) : read_fn(&a);
        fs_slice_release(s, &pin);
    }
    if (row != small)
        free(row);
    return ret < 0 ? ret : (ssize_t)size;
}

/* ---- stats.json ----------------------------------------------------------------------- */

/* stats.json has one fixed size for the whole mount (stat must agree with
 * every snapshot, and fstat does not say which open file it asks about): the
 * JSON is written with bounded-width fields and padded with spaces to the
 * bound computed from the tree. Files appear once they have been read. */

#define STATS_U64 20 /* digits of the largest uint64 */

static const char *const store_keys[] = {"budget",        "resident",  "loads",
                                         "bytes_read",    "prefetches", "prefetch_hits",
                                         "waits",         "evictions", "verify_failures"};

static const char *const gguf_keys[] = {"budget",    "resident",  "hits",
                                        "misses",    "waits",     "warmed",
                                        "pushed",    "direct",    "evictions",
                                        "bytes_converted", "errors"};

static size_t path_of(const struct fs_state *s, const struct fs_node *n, char *buf, size_t len)
{
    if (n->parent)
        return (size_t)snprintf(buf, len, "%s/%s", s->nodes[n->parent].name, n->name);
    return (size_t)snprintf(buf, len, "%s", n->name);
}

uint64_t fs_stats_size(const struct fs_state *s)
{
    /* header: pid, seconds, totals, the store object, the braces */
    uint64_t n = 512 + 6 * STATS_U64;
    for (size_t k = 0; k < sizeof store_keys / sizeof store_keys[0]; k++)
        n += strlen(store_keys[k]) + 8 + STATS_U64;
    n += 64; /* "gguf": {"type": "Q8_0" ... } */
    for (size_t k = 0; k < sizeof gguf_keys / sizeof gguf_keys[0]; k++)
        n += strlen(gguf_keys[k]) + 8 + STATS_U64;
    for (uint32_t i = 1; i < s->n_nodes; i++) {
        char path[128];
        if (s->nodes[i].kind != FS_DIR)
            n += path_of(s, &s->nodes[i], path, sizeof path) + 40 + 2 * STATS_U64;
    }
    return n;
}

struct out {
    char *p;
    size_t len, cap;
};

static void put(struct out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct out *o, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(o->p + o->len, o->cap - o->len, fmt, ap);
    va_end(ap);
    if (k > 0)
        o->len = o->len + (size_t)k < o->cap ? o->len + (size_t)k : o->cap;
}

char *fs_stats_json(struct fs_state *s, size_t *len)
{
    size_t size = (size_t)fs_stats_size(s);
    struct out o = {malloc(size + 1), 0, size + 1};
    if (!o.p)
        return NULL;
    uint64_t tb = 0, tr = 0;
    for (uint32_t i = 1; i < s->n_nodes; i++) {
        tb += atomic_load(&s->nodes[i].bytes_served);
        tr += atomic_load(&s->nodes[i].reads_served);
    }
    uint64_t ms = (sl_now_ns() - s->mount_ns) / 1000000u;
    put(&o, "{\n  \"pid\": %d,\n  \"seconds_since_mount\": %" PRIu64 ".%03u,\n", (int)getpid(),
        ms / 1000, (unsigned)(ms % 1000));
    put(&o, "  \"bytes\": %" PRIu64 ",\n  \"reads\": %" PRIu64 ",\n", tb, tr);
    if (s->store) {
        struct fs_store_stats ss;
        fs_store_get_stats(s->store, &ss);
        const uint64_t v[] = {ss.budget,     ss.resident,      ss.loads,
                              ss.bytes_read, ss.prefetches,    ss.prefetch_hits,
                              ss.waits,      ss.evictions,     ss.verify_failures};
        put(&o, "  \"store\": {\"direct\": %s", ss.direct ? "true" : "false");
        for (size_t k = 0; k < sizeof v / sizeof v[0]; k++)
            put(&o, ", \"%s\": %" PRIu64, store_keys[k], v[k]);
        put(&o, "},\n");
    }
    if (s->gguf) {
        struct gguf_view_stats g;
        gguf_view_get_stats(s->gguf, &g);
        const uint64_t v[] = {g.budget,    g.resident,  g.hits,
                              g.misses,    g.waits,     g.warmed,
                              g.pushed,    g.direct,    g.evictions,
                              g.bytes_converted, g.errors};
        put(&o, "  \"gguf\": {\"type\": \"%s\"",
            s->opts.gguf_qtype == GGUF_GGML_F16   ? "F16"
            : s->opts.gguf_qtype == GGUF_GGML_F32 ? "F32"
                                                  : "Q8_0");
        for (size_t k = 0; k < sizeof v / sizeof v[0]; k++)
            put(&o, ", \"%s\": %" PRIu64, gguf_keys[k], v[k]);
        put(&o, "},\n");
    }
    put(&o, "  \"files\": {");
    int first = 1;
    for (uint32_t i = 1; i < s->n_nodes; i++) {
        const struct fs_node *n = &s->nodes[i];
        uint64_t b = atomic_load(&n->bytes_served), rd = atomic_load(&n->reads_served);
        if (n->kind == FS_DIR || !rd)
            continue;
        char path[128];
        path_of(s, n, path, sizeof path);
        put(&o, "%s\n    \"%s\": {\"bytes\": %" PRIu64 ", \"reads\": %" PRIu64 "}", first ? "" : ",",
            path, b, rd);
        first = 0;
    }
    put(&o, "\n  }\n}");
    /* pad to the fixed size; the bound leaves room, so nothing was cut */
    memset(o.p + o.len, ' ', size - o.len);
    o.p[size - 1] = '\n';
    o.p[size] = 0;
    *len = size;
    return o.p;
}

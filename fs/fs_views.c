/* fs_views.c: files computed on read.
 *   <role>.int8    rows x cols int8 codes of a quantized tensor (what
 *                  unpack_tensor_int8 gives); a read unpacks only the rows it
 *                  covers, from the verified slice
 *   <role>.scales  rows float32 (little-endian): the per-row dequantization
 *                  scales, copied from the tensor's scale section
 *   stats.json     a snapshot taken at open */
#include <cjson/cJSON.h>
#include <errno.h>
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

ssize_t fs_view_read(struct fs_state *s, struct fs_view *v, char *buf, size_t size, uint64_t off)
{
    uint64_t total = v->kind == FS_STATS ? v->len
                     : v->kind == FS_SCALES ? v->rows * 4
                                            : v->rows * v->cols;
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

static char *print_json(cJSON *o, size_t *len)
{
    char *t = o ? cJSON_Print(o) : NULL;
    cJSON_Delete(o);
    if (!t)
        return NULL;
    size_t l = strlen(t);
    char *r = realloc(t, l + 2);
    if (!r) {
        free(t);
        return NULL;
    }
    r[l] = '\n';
    r[l + 1] = 0;
    *len = l + 1;
    return r;
}

char *fs_stats_json(struct fs_state *s, size_t *len)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "pid", (double)getpid());
    cJSON_AddNumberToObject(o, "seconds_since_mount", (double)(sl_now_ns() - s->mount_ns) / 1e9);
    uint64_t tb = 0, tr = 0;
    cJSON *f = cJSON_CreateObject();
    for (uint32_t i = 1; i < s->n_nodes; i++) {
        struct fs_node *n = &s->nodes[i];
        if (n->kind == FS_DIR)
            continue;
        uint64_t b = atomic_load(&n->bytes_served), rd = atomic_load(&n->reads_served);
        tb += b;
        tr += rd;
        if (!rd)
            continue;
        char path[128];
        if (n->parent)
            snprintf(path, sizeof path, "%s/%s", s->nodes[n->parent].name, n->name);
        else
            snprintf(path, sizeof path, "%s", n->name);
        cJSON *e = cJSON_AddObjectToObject(f, path);
        cJSON_AddNumberToObject(e, "bytes", (double)b);
        cJSON_AddNumberToObject(e, "reads", (double)rd);
    }
    cJSON_AddNumberToObject(o, "bytes", (double)tb);
    cJSON_AddNumberToObject(o, "reads", (double)tr);
    cJSON_AddItemToObject(o, "files", f);
    if (s->store) {
        struct fs_store_stats ss;
        fs_store_get_stats(s->store, &ss);
        cJSON *e = cJSON_AddObjectToObject(o, "store");
        cJSON_AddBoolToObject(e, "direct", ss.direct);
        cJSON_AddNumberToObject(e, "budget", (double)ss.budget);
        cJSON_AddNumberToObject(e, "resident", (double)ss.resident);
        cJSON_AddNumberToObject(e, "loads", (double)ss.loads);
        cJSON_AddNumberToObject(e, "bytes_read", (double)ss.bytes_read);
        cJSON_AddNumberToObject(e, "prefetches", (double)ss.prefetches);
        cJSON_AddNumberToObject(e, "prefetch_hits", (double)ss.prefetch_hits);
        cJSON_AddNumberToObject(e, "waits", (double)ss.waits);
        cJSON_AddNumberToObject(e, "evictions", (double)ss.evictions);
        cJSON_AddNumberToObject(e, "verify_failures", (double)ss.verify_failures);
    }
    return print_json(o, len);
}

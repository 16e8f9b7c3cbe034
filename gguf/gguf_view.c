/* gguf_view.c: reads of any range of the virtual file. The file is a list of
 * extents: the header (in memory), each tensor's data (converted from its
 * verified slice), zero padding between them. A read inside the header is
 * copied from memory. With a cache, reads go through chunks of
 * GGUF_VIEW_CHUNK bytes: a chunk is converted once, by the first reader that
 * needs it (others wait for it) or ahead of the readers by gguf_view_warm,
 * and kept until evicted (chunks already read first, least recently used
 * first); a small read (GGUF_VIEW_SMALL_READ) of a chunk not converted yet,
 * a read when no room can be made (every chunk pinned), or one whose chunk
 * cannot be converted (a corrupt slice under part of it) converts just its
 * own range without caching, so an error covers only the ranges that need
 * the bad bytes. Without a cache, a read converts exactly its range. Chunk
 * buffers are slots of one mapping in huge pages, reused after an eviction.
 * One mutex guards the chunk table and the counters; conversions run
 * outside it. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "gguf_internal.h"

#define HUGE_PAGE (2u << 20)

/* The chunk buffers' mapping: as many slots as the budget holds or the file
 * has chunks, whichever is fewer, aligned to a huge page. Without it (the
 * mapping refused) chunks are malloc'ed one by one. */
static int arena_create(struct gguf_view *v, struct sl_err *err)
{
    uint64_t slots = v->o.cache_bytes / GGUF_VIEW_CHUNK;
    if (slots > v->n_chunks)
        slots = v->n_chunks;
    if (!slots || slots > UINT32_MAX)
        return 0;
    v->free_slots = malloc(slots * sizeof *v->free_slots);
    if (!v->free_slots) {
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    uint64_t len = slots * GGUF_VIEW_CHUNK + HUGE_PAGE;
    uint8_t *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return 0;
    uint8_t *a = (uint8_t *)sl_align_up((uint64_t)(uintptr_t)p, HUGE_PAGE);
    madvise(a, slots * GGUF_VIEW_CHUNK, MADV_HUGEPAGE);
    v->arena = a;
    v->arena_map = (uint64_t)(a - p);
    v->arena_len = len;
    v->n_slots = (uint32_t)slots;
    return 0;
}

/* Under mu: a chunk buffer (within the budget: the caller counts it). */
static uint8_t *buf_get(struct gguf_view *v)
{
    if (!v->arena)
        return malloc(GGUF_VIEW_CHUNK);
    if (v->n_free)
        return v->arena + (uint64_t)v->free_slots[--v->n_free] * GGUF_VIEW_CHUNK;
    if (v->n_fresh < v->n_slots)
        return v->arena + (uint64_t)v->n_fresh++ * GGUF_VIEW_CHUNK;
    return NULL;
}

static void buf_put(struct gguf_view *v, uint8_t *b)
{
    if (!v->arena)
        free(b);
    else
        v->free_slots[v->n_free++] = (uint32_t)((uint64_t)(b - v->arena) / GGUF_VIEW_CHUNK);
}

int gguf_view_create(const struct format_reader *r, const struct gguf_view_opts *o,
                     struct gguf_view **out, struct sl_err *err)
{
    if (o->alignment < 8 || o->alignment > 65536 || (o->alignment & (o->alignment - 1))) {
        sl_err_set(err, "GGUF alignment %u: want a power of two in 8..65536", o->alignment);
        return -EINVAL;
    }
    if (o->qtype != GGUF_GGML_Q8_0 && o->qtype != GGUF_GGML_F16 && o->qtype != GGUF_GGML_F32) {
        sl_err_set(err, "GGUF type %u for quantized tensors: want Q8_0, F16 or F32", o->qtype);
        return -EINVAL;
    }
    struct gguf_view *v = calloc(1, sizeof *v);
    if (!v) {
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    v->r = r;
    v->o = *o;
    pthread_mutex_init(&v->mu, NULL);
    pthread_cond_init(&v->changed, NULL);
    int ret = gv_layout(v, err);
    for (uint32_t i = 0; ret == 0 && i < v->n; i++) {
        const struct gv_tensor *t = &v->t[i];
        if (t->pub.n_dims == 2 && t->cols > v->cmax)
            v->cmax = t->cols;
        if (t->pub.n_dims == 2 && t->row_bytes > v->rbmax)
            v->rbmax = t->row_bytes;
    }
    v->cmax = v->cmax ? v->cmax : 1;
    v->rbmax = v->rbmax ? v->rbmax : 1;
    if (ret == 0 && o->cache_bytes >= GGUF_VIEW_CHUNK) {
        v->n_chunks = (v->size + GGUF_VIEW_CHUNK - 1) / GGUF_VIEW_CHUNK;
        v->chunks = calloc(v->n_chunks ? v->n_chunks : 1, sizeof *v->chunks);
        if (!v->chunks) {
            sl_err_set(err, "out of memory");
            ret = -ENOMEM;
        }
    }
    if (ret == 0 && v->chunks)
        ret = arena_create(v, err);
    v->stats.budget = o->cache_bytes;
    if (ret < 0) {
        gguf_view_destroy(v);
        return ret;
    }
    *out = v;
    return 0;
}

void gguf_view_destroy(struct gguf_view *v)
{
    if (!v)
        return;
    for (uint64_t i = 0; !v->arena && v->chunks && i < v->n_chunks; i++)
        free(v->chunks[i].buf);
    free(v->chunks);
    if (v->arena)
        munmap(v->arena - v->arena_map, v->arena_len);
    free(v->free_slots);
    for (uint32_t i = 0; v->t && i < v->n; i++)
        free(v->t[i].row_off);
    free(v->t);
    free(v->head);
    pthread_cond_destroy(&v->changed);
    pthread_mutex_destroy(&v->mu);
    free(v);
}

uint64_t gguf_view_size(const struct gguf_view *v)
{
    return v->size;
}

uint64_t gguf_view_header_size(const struct gguf_view *v)
{
    return v->head_len;
}

uint32_t gguf_view_n_tensors(const struct gguf_view *v)
{
    return v->n;
}

const struct gguf_view_tensor *gguf_view_tensor(const struct gguf_view *v, uint32_t i)
{
    return i < v->n ? &v->t[i].pub : NULL;
}

void gguf_view_get_stats(struct gguf_view *v, struct gguf_view_stats *out)
{
    pthread_mutex_lock(&v->mu);
    *out = v->stats;
    pthread_mutex_unlock(&v->mu);
}

/* ---- converting a range ------------------------------------------------------------ */

struct conv_arg {
    struct gv_tensor *t;
    const uint8_t *p;
    uint64_t a, b;
    uint8_t *dst;
    const struct gv_scratch *s;
    struct sl_err *err;
    int parse;
};

static int conv_fn(void *p)
{
    struct conv_arg *c = p;
    if (c->parse)
        return gv_parse(c->t, c->p, c->err);
    return gv_convert(c->t, c->p, c->a, c->b, c->dst, c->s, c->err);
}

static int guarded(const struct gguf_source *src, struct conv_arg *c)
{
    return src->guard ? src->guard(src->ctx, conv_fn, c) : conv_fn(c);
}

/* Bytes [a, b) of tensor t's data into dst. */
static int convert_tensor(struct gguf_view *v, const struct gguf_source *src, struct gv_tensor *t,
                          uint64_t a, uint64_t b, uint8_t *dst, const struct gv_scratch *s,
                          struct sl_err *err)
{
    const uint8_t *data;
    void *token = NULL;
    int ret = src->acquire(src->ctx, t->slice, &data, &token, err);
    if (ret < 0)
        return ret;
    struct conv_arg c = {t, data + t->src_off, a, b, dst, s, err, 0};
    if (format_encoding_traits(t->enc)->quantized) {
        pthread_mutex_lock(&v->mu);
        if (!t->parsed) {
            c.parse = 1;
            ret = guarded(src, &c);
            c.parse = 0;
            t->parsed = ret == 0;
        }
        pthread_mutex_unlock(&v->mu);
    }
    if (ret == 0)
        ret = guarded(src, &c);
    src->release(src->ctx, t->slice, token);
    if (ret < 0 && !err->msg[0])
        sl_err_set(err, "tensor '%s': cannot convert (the container changed under the view?)",
                   t->pub.name);
    return ret < 0 ? (ret == -ENOMEM ? ret : -EIO) : 0;
}

/* The first tensor whose data ends after pos (tensors are in file order). */
static uint32_t tensor_at(const struct gguf_view *v, uint64_t pos)
{
    uint32_t lo = 0, hi = v->n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (v->t[mid].pub.offset + v->t[mid].pub.size <= pos)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Bytes [off, off + len) of the file (within it) into dst, no cache. */
static int fill(struct gguf_view *v, const struct gguf_source *src, uint8_t *dst, uint64_t off,
                uint64_t len, const struct gv_scratch *s, struct sl_err *err)
{
    uint64_t pos = off, end = off + len, converted = 0;
    int ret = 0;
    while (pos < end && ret == 0) {
        uint8_t *d = dst + (pos - off);
        if (pos < v->head_len) {
            uint64_t n = (end < v->head_len ? end : v->head_len) - pos;
            memcpy(d, v->head + pos, n);
            pos += n;
            continue;
        }
        uint32_t i = tensor_at(v, pos);
        uint64_t next = i < v->n ? v->t[i].pub.offset : v->size;
        if (pos < next) { /* padding */
            uint64_t n = (end < next ? end : next) - pos;
            memset(d, 0, n);
            pos += n;
            continue;
        }
        struct gv_tensor *t = &v->t[i];
        uint64_t a = pos - t->pub.offset;
        uint64_t b =
            (end < t->pub.offset + t->pub.size ? end : t->pub.offset + t->pub.size) - t->pub.offset;
        ret = convert_tensor(v, src, t, a, b, d, s, err);
        converted += b - a;
        pos = t->pub.offset + b;
    }
    pthread_mutex_lock(&v->mu);
    v->stats.bytes_converted += ret == 0 ? converted : 0;
    pthread_mutex_unlock(&v->mu);
    return ret;
}

/* ---- the chunk cache ---------------------------------------------------------------- */

/* Under mu: a chunk buffer within the budget, evicting unpinned ready chunks:
 * those a reader has read first, least recently used first, then (readers
 * only) the others; a prefetch (warm) never evicts a chunk no reader has read
 * yet. NULL when no room can be made. */
static uint8_t *make_room(struct gguf_view *v, int warm)
{
    while (v->stats.resident + GGUF_VIEW_CHUNK > v->o.cache_bytes) {
        struct gv_chunk *victim = NULL;
        for (uint64_t i = 0; i < v->n_chunks; i++) {
            struct gv_chunk *c = &v->chunks[i];
            if (c->state != 2 || c->pins || (warm && !c->read))
                continue;
            if (!victim || c->read > victim->read ||
                (c->read == victim->read && c->tick < victim->tick))
                victim = c;
        }
        if (!victim)
            return NULL;
        buf_put(v, victim->buf);
        victim->buf = NULL;
        victim->state = 0;
        v->stats.resident -= GGUF_VIEW_CHUNK;
        v->stats.evictions++;
    }
    uint8_t *b = buf_get(v);
    if (b)
        v->stats.resident += GGUF_VIEW_CHUNK;
    return b;
}

/* Under mu, with chunk ci marked converting and buf from make_room: converts
 * it (dropping the lock meanwhile); 0 with the chunk ready, or -errno with
 * the chunk idle again and buf freed. */
static int convert_chunk(struct gguf_view *v, const struct gguf_source *src, uint64_t ci,
                         uint8_t *buf, const struct gv_scratch *s, struct sl_err *err)
{
    struct gv_chunk *c = &v->chunks[ci];
    uint64_t cs = ci * GGUF_VIEW_CHUNK;
    uint64_t clen = v->size - cs < GGUF_VIEW_CHUNK ? v->size - cs : GGUF_VIEW_CHUNK;
    c->state = 1;
    pthread_mutex_unlock(&v->mu);
    int ret = fill(v, src, buf, cs, clen, s, err);
    pthread_mutex_lock(&v->mu);
    if (ret < 0) {
        buf_put(v, buf);
        v->stats.resident -= GGUF_VIEW_CHUNK;
        c->state = 0;
    } else {
        c->buf = buf;
        c->state = 2;
        c->read = 0;
        c->tick = ++v->tick;
    }
    pthread_cond_broadcast(&v->changed);
    return ret;
}

/* n bytes at `from` inside chunk ci into out. */
static int chunk_read(struct gguf_view *v, const struct gguf_source *src, uint64_t ci, uint8_t *out,
                      uint64_t from, uint64_t n, const struct gv_scratch *s, struct sl_err *err)
{
    struct gv_chunk *c = &v->chunks[ci];
    uint64_t cs = ci * GGUF_VIEW_CHUNK;
    pthread_mutex_lock(&v->mu);
    int waited = 0;
    for (;;) {
        if (c->state == 2) {
            if (!waited)
                v->stats.hits++;
            break;
        }
        if (n <= GGUF_VIEW_SMALL_READ) { /* do not wait for the whole chunk */
            v->stats.direct++;
            pthread_mutex_unlock(&v->mu);
            return fill(v, src, out, cs + from, n, s, err);
        }
        if (c->state == 1) {
            if (!waited)
                v->stats.waits++;
            waited = 1;
            pthread_cond_wait(&v->changed, &v->mu);
            continue;
        }
        uint8_t *buf = make_room(v, 0);
        if (!buf) { /* everything pinned: convert just this range */
            v->stats.direct++;
            pthread_mutex_unlock(&v->mu);
            return fill(v, src, out, cs + from, n, s, err);
        }
        v->stats.misses++;
        if (convert_chunk(v, src, ci, buf, s, err) < 0) {
            pthread_mutex_unlock(&v->mu);
            /* a bad slice under another part of the chunk must not fail this
             * range: convert just what was asked (it fails if it needs it) */
            err->msg[0] = 0;
            return fill(v, src, out, cs + from, n, s, err);
        }
        break;
    }
    c->pins++;
    c->read = 1;
    c->tick = ++v->tick;
    pthread_mutex_unlock(&v->mu);
    memcpy(out, c->buf + from, n);
    pthread_mutex_lock(&v->mu);
    c->pins--;
    pthread_mutex_unlock(&v->mu);
    return 0;
}

static uint8_t *scratch_alloc(const struct gguf_view *v, struct gv_scratch *s)
{
    uint8_t *p = malloc(v->cmax + v->rbmax);
    if (p)
        *s = (struct gv_scratch){(int8_t *)p, p + v->cmax};
    return p;
}

int gguf_view_warm(struct gguf_view *v, const struct gguf_source *src, uint64_t off,
                   int (*push)(void *ctx, uint64_t start, const void *data, size_t len),
                   void *ctx, struct sl_err *err)
{
    struct sl_err local = {{0}};
    if (!err)
        err = &local;
    if (!v->chunks || off >= v->size) {
        sl_err_set(err, "nothing to warm at offset %llu", (unsigned long long)off);
        return -EINVAL;
    }
    uint64_t ci = off / GGUF_VIEW_CHUNK;
    struct gv_chunk *c = &v->chunks[ci];
    pthread_mutex_lock(&v->mu);
    if (c->state != 0) {
        pthread_mutex_unlock(&v->mu);
        return 0;
    }
    uint8_t *buf = make_room(v, 1);
    if (!buf) {
        pthread_mutex_unlock(&v->mu);
        return -ENOSPC;
    }
    struct gv_scratch s;
    uint8_t *scratch = scratch_alloc(v, &s);
    if (!scratch) {
        buf_put(v, buf);
        v->stats.resident -= GGUF_VIEW_CHUNK;
        pthread_mutex_unlock(&v->mu);
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    int ret = convert_chunk(v, src, ci, buf, &s, err);
    free(scratch);
    if (ret < 0) {
        pthread_mutex_unlock(&v->mu);
        return ret;
    }
    v->stats.warmed++;
    if (push) {
        uint64_t cs = ci * GGUF_VIEW_CHUNK;
        uint64_t clen = v->size - cs < GGUF_VIEW_CHUNK ? v->size - cs : GGUF_VIEW_CHUNK;
        c->pins++;
        pthread_mutex_unlock(&v->mu);
        int pret = push(ctx, cs, c->buf, (size_t)clen);
        pthread_mutex_lock(&v->mu);
        c->pins--;
        if (pret == 0) {
            c->read = 1;
            v->stats.pushed++;
        }
    }
    pthread_mutex_unlock(&v->mu);
    return 0;
}

ssize_t gguf_view_read(struct gguf_view *v, const struct gguf_source *src, void *buf, size_t len,
                       uint64_t off, struct sl_err *err)
{
    struct sl_err local = {{0}};
    if (!err)
        err = &local;
    err->msg[0] = 0;
    if (off >= v->size)
        return 0;
    if (len > v->size - off)
        len = (size_t)(v->size - off);
    if (off + len <= v->head_len) { /* the header: in memory, no slice needed */
        memcpy(buf, v->head + off, len);
        return (ssize_t)len;
    }
    struct gv_scratch s;
    uint8_t *scratch = scratch_alloc(v, &s);
    if (!scratch) {
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    int ret = 0;
    if (!v->chunks) {
        ret = fill(v, src, buf, off, len, &s, err);
    } else {
        uint64_t pos = off, end = off + len;
        while (pos < end && ret == 0) {
            uint64_t ci = pos / GGUF_VIEW_CHUNK, ce = (ci + 1) * GGUF_VIEW_CHUNK;
            uint64_t n = (end < ce ? end : ce) - pos;
            ret = chunk_read(v, src, ci, (uint8_t *)buf + (pos - off), pos % GGUF_VIEW_CHUNK, n, &s,
                             err);
            pos += n;
        }
    }
    free(scratch);
    if (ret < 0) {
        pthread_mutex_lock(&v->mu);
        v->stats.errors++;
        pthread_mutex_unlock(&v->mu);
        return ret;
    }
    return (ssize_t)len;
}

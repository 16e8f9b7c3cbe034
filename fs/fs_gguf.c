/* fs_gguf.c: model.gguf, the GGUF view (gguf.h) over the slice store: the
 * view asks for slices, the store hands out verified bytes (pinned), and a
 * conversion over a page-cache slice runs under the SIGBUS guard.
 *
 * Warmers: from an open of model.gguf on, -o gguf_warm threads convert its
 * cache chunks in file order (gguf_view_warm), so llama.cpp's reads (its
 * header parse, then a populate of the whole mapping) find them converted
 * instead of waiting for each slice's read, check and conversion in turn.
 * They stay at most half the cache ahead of the furthest sequential read
 * (the whole file when it fits: a small model is converted while the reader
 * parses the header), never evict a chunk nobody has read yet, and stop at
 * the end of the file until the next open. A first open (none other still
 * open) restarts the frontier at 0: a reader whose pages are all in the
 * kernel's cache sends no reads, so at most half the cache is converted for
 * it in vain. */
#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fs_internal.h"

static int src_acquire(void *ctx, uint32_t slice, const uint8_t **data, void **token,
                       struct sl_err *err)
{
    struct fs_state *s = ctx;
    struct fs_pin *pin = malloc(sizeof *pin);
    if (!pin) {
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    int ret = fs_slice_acquire(s, slice, pin);
    if (ret < 0) {
        free(pin);
        sl_err_set(err, "slice %u is unreadable or failed its checksum", slice);
        return ret;
    }
    *data = pin->data;
    *token = pin;
    return 0;
}

static void src_release(void *ctx, uint32_t slice, void *token)
{
    (void)slice;
    struct fs_pin *pin = token;
    fs_slice_release(ctx, pin);
    free(pin);
}

static int src_guard(void *ctx, int (*fn)(void *), void *arg)
{
    (void)ctx;
    return fs_guarded(fn, arg);
}

int fs_gguf_create(struct fs_state *s, struct sl_err *err)
{
    struct gguf_view_opts o;
    gguf_view_opts_init(&o);
    o.qtype = s->opts.gguf_qtype;
    o.cache_bytes = s->opts.gguf_cache;
    int ret = gguf_view_create(s->r, &o, &s->gguf, err);
    if (ret < 0)
        return ret;
    s->gguf_src = (struct gguf_source){s, src_acquire, src_release, src_guard};
    return 0;
}

/* ---- warmers -------------------------------------------------------------------------- */

/* A warmed chunk into the kernel's page cache (FUSE notify_store), so the
 * reader's faults find it there without a request. Not without keep_cache:
 * the next open would drop the pages. */
static int push_pages(void *ctx, uint64_t start, const void *data, size_t len)
{
    struct fs_state *s = ctx;
    struct fuse_bufvec bv = FUSE_BUFVEC_INIT(len);
    bv.buf[0].mem = (void *)(uintptr_t)data;
    return fuse_lowlevel_notify_store(s->se, (fuse_ino_t)s->warm.ino, (off_t)start, &bv, 0);
}

static void *warm_main(void *p)
{
    struct fs_state *s = p;
    struct fs_warm *w = &s->warm;
    uint64_t size = gguf_view_size(s->gguf);
    pthread_mutex_lock(&w->mu);
    while (!w->stop) {
        uint64_t off = w->next;
        if (!w->active || off >= size || off >= w->frontier + w->window || w->blocked) {
            if (off >= size)
                w->active = 0;
            pthread_cond_wait(&w->cv, &w->mu);
            continue;
        }
        w->next = off + GGUF_VIEW_CHUNK;
        pthread_mutex_unlock(&w->mu);
        struct sl_err err = {{0}};
        int ret = gguf_view_warm(s->gguf, &s->gguf_src, off,
                                 s->se && s->opts.keep_cache ? push_pages : NULL, s, &err);
        pthread_mutex_lock(&w->mu);
        if (ret == -ENOSPC) { /* retried after the next read */
            if (w->next > off)
                w->next = off;
            w->blocked = 1;
        }
        /* other errors: the chunk's readers convert (and report) it */
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

int fs_gguf_start(struct fs_state *s, struct sl_err *err)
{
    struct fs_warm *w = &s->warm;
    uint32_t n = s->opts.gguf_warm;
    if (!s->gguf || s->opts.gguf_cache < GGUF_VIEW_CHUNK || !n)
        return 0;
    if (n > sizeof w->th / sizeof w->th[0])
        n = sizeof w->th / sizeof w->th[0];
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    w->window = s->opts.gguf_cache / 2 / GGUF_VIEW_CHUNK * GGUF_VIEW_CHUNK;
    if (w->window < GGUF_VIEW_CHUNK)
        w->window = GGUF_VIEW_CHUNK;
    for (uint32_t i = 0; i < n; i++) {
        int ret = pthread_create(&w->th[i], NULL, warm_main, s);
        if (ret) {
            sl_err_set(err, "cannot start model.gguf's warmer thread: %s", strerror(ret));
            fs_gguf_stop(s);
            return -ret;
        }
        w->n_started++;
    }
    return 0;
}

int fs_gguf_stop(struct fs_state *s)
{
    struct fs_warm *w = &s->warm;
    if (!w->n_started)
        return 0;
    pthread_mutex_lock(&w->mu);
    w->stop = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 2;
    int stuck = 0;
    for (uint32_t i = 0; i < w->n_started; i++)
        if (pthread_timedjoin_np(w->th[i], NULL, &until) != 0)
            stuck = 1;
    if (stuck) {
        fs_log(s, "a model.gguf warmer is stuck pushing pages at exit; leaving it to the exit");
        return -ETIMEDOUT;
    }
    w->n_started = 0;
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    return 0;
}

/* Queues the slices under model.gguf's first `span` bytes, in file order,
 * to be read ahead (the store drops what its budget cannot hold), the slice
 * under the file's last page second: glibc's fseek to the end, which
 * llama.cpp does right after the header, reads that page. */
static void prefetch_slices(struct fs_state *s, uint64_t span)
{
    uint32_t n = gguf_view_n_tensors(s->gguf), last = UINT32_MAX;
    for (uint32_t i = 0; i < n; i++) {
        const struct gguf_view_tensor *t = gguf_view_tensor(s->gguf, i);
        if (i > 0 && t->offset >= span)
            break;
        uint32_t slice = format_reader_tensor(s->r, t->tensor)->slice;
        if (slice != last)
            fs_store_prefetch(s->store, slice);
        if (i == 0 && n > 1)
            fs_store_prefetch(s->store,
                              format_reader_tensor(s->r, gguf_view_tensor(s->gguf, n - 1)->tensor)->slice);
        last = slice;
    }
}

void fs_gguf_opened(struct fs_state *s, uint64_t ino)
{
    struct fs_warm *w = &s->warm;
    /* without warmers: just the first slice, which the first chunk needs */
    prefetch_slices(s, w->n_started ? w->window : 1);
    if (!w->n_started)
        return;
    pthread_mutex_lock(&w->mu);
    if (w->opens++ == 0)
        w->frontier = 0;
    w->next = 0; /* chunks still cached are skipped at once */
    w->ino = ino;
    w->active = 1;
    w->blocked = 0;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

void fs_gguf_released(struct fs_state *s)
{
    struct fs_warm *w = &s->warm;
    if (!w->n_started)
        return;
    pthread_mutex_lock(&w->mu);
    if (w->opens)
        w->opens--;
    pthread_mutex_unlock(&w->mu);
}

/* A read of [off, off + size) happened (it has marked its chunks read). */
static void warm_note_read(struct fs_state *s, uint64_t off, size_t size)
{
    struct fs_warm *w = &s->warm;
    if (!w->n_started)
        return;
    pthread_mutex_lock(&w->mu);
    int wake = w->blocked;
    w->blocked = 0;
    if (off <= w->frontier + w->window && off + size > w->frontier) {
        w->frontier = off + size;
        wake = 1;
    }
    if (wake && w->active)
        pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* ---- reads ------------------------------------------------------------------------------- */

ssize_t fs_gguf_read(struct fs_state *s, char *buf, size_t size, uint64_t off)
{
    struct sl_err err = {{0}};
    ssize_t k = gguf_view_read(s->gguf, &s->gguf_src, buf, size, off, &err);
    warm_note_read(s, off, size);
    if (k < 0 && atomic_fetch_add(&s->gguf_logged, 1) < 10)
        fs_log(s, "%s: model.gguf [%llu, +%zu): %s", s->container, (unsigned long long)off, size,
               err.msg[0] ? err.msg : strerror((int)-k));
    return k;
}

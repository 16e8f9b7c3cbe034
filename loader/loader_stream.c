/* loader_stream.c: the streaming core's public side: a stream opened over a
 * list of requests (checked, files opened, ring and backend set up, the I/O
 * thread of loader_io.c started), the consumer's next/release in request
 * order, stats, and close. Releasing frees ring space and lets the I/O thread
 * go on.
 *
 * Lock: s->lock guards everything below the options; the I/O thread drops it
 * only to wait for completions, to verify a checksum, or to back off. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "loader_internal.h"

/* ---- public ------------------------------------------------------------------------ */

static void defaults(struct loader_opts *o)
{
    if (!o->queue_depth)
        o->queue_depth = 16;
    if (o->queue_depth > 256)
        o->queue_depth = 256;
    if (!o->chunk_bytes)
        o->chunk_bytes = 1u << 20;
    if (o->chunk_bytes > (1u << 30))
        o->chunk_bytes = 1u << 30;
    o->chunk_bytes = (uint32_t)sl_align_up(o->chunk_bytes, LOADER_ALIGN);
    if (!o->pread_threads)
        o->pread_threads = o->queue_depth < 8 ? o->queue_depth : 8;
    const char *env = getenv("SLUICE_LOADER");
    if (env && !strcmp(env, "pread"))
        o->force_pread = 1;
}

/* The ring: sized, mapped (mirrored if possible), cut into registration pieces. */
static int ring_setup(struct loader_stream *s, uint64_t largest, struct sl_err *err)
{
    const struct loader_opts *o = &s->opts;
    uint64_t window = (uint64_t)o->queue_depth * o->chunk_bytes;
    uint64_t least = sl_align_up(largest, LOADER_ALIGN) + o->chunk_bytes;
    int want_mirror = !(s->have_faults && s->faults.no_mirror);
    int ret = -EINVAL;
    for (int attempt = 0; attempt < 2; attempt++) {
        uint64_t bytes = o->ring_bytes;
        /* default: a consumer can hold one request while the next is read
         * (the plain ring can lose up to one request's size to wrapping) */
        if (!bytes) {
            bytes = (want_mirror ? 2 : 3) * sl_align_up(largest, LOADER_ALIGN) + window;
            if (bytes < (32u << 20))
                bytes = 32u << 20;
        }
        if (bytes < least)
            bytes = least;
        bytes = sl_align_up(bytes, LOADER_ALIGN);
        ret = loader_ring_init(&s->ring, bytes, want_mirror);
        if (ret == 0)
            break;
        if (!want_mirror)
            break;
        want_mirror = 0;
    }
    if (ret < 0) {
        sl_err_set(err, "loader: cannot map a read ring: %s", strerror(-ret));
        return ret;
    }
    /* registration pieces: at least a chunk, and few enough for the kernel's
     * table (16384 buffers of at most 1 GiB) */
    uint64_t piece = o->chunk_bytes > (4u << 20) ? o->chunk_bytes : (4u << 20);
    while (s->ring.bytes / piece >= 16384)
        piece *= 2;
    if (piece > (1u << 30))
        piece = 1u << 30;
    s->piece_bytes = piece;
    return 0;
}

int loader_stream_open(const struct loader_request *reqs, uint32_t n,
                       const struct loader_opts *opts, struct loader_stream **out,
                       struct sl_err *err)
{
    struct loader_stream *s = sl_calloc(1, sizeof *s);
    if (!s) {
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    if (opts)
        s->opts = *opts;
    defaults(&s->opts);
    if (opts && opts->faults) {
        s->faults = *opts->faults;
        s->have_faults = 1;
    }
    s->start_ns = sl_now_ns();
    s->all_direct = !s->opts.no_direct;
    s->all_fixed = !s->opts.no_register;
    s->depth = s->min_depth = s->opts.queue_depth;
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->cond_done, NULL);
    pthread_cond_init(&s->cond_space, NULL);
    int ret = -ENOMEM;
    s->reqs = sl_calloc(n ? n : 1, sizeof *s->reqs);
    s->files = sl_calloc(n ? n : 1, sizeof *s->files);
    s->ios = sl_calloc(s->opts.queue_depth, sizeof *s->ios);
    s->vq = sl_calloc(n ? n : 1, sizeof *s->vq);
    if (!s->reqs || !s->files || !s->ios || !s->vq) {
        sl_err_set(err, "out of memory");
        goto fail;
    }
    s->n = n;
    uint64_t largest = 0;
    for (uint32_t i = 0; i < n; i++) {
        const struct loader_request *r = &reqs[i];
        const char *name = r->path ? r->path : "(descriptor)";
        if (!r->dest != !reqs[0].dest || (uintptr_t)r->dest % LOADER_ALIGN) {
            sl_err_set(err, "%s: request %u: %s", name, i,
                       r->dest ? "its buffer is not 4 KiB aligned"
                               : "either every request has a buffer of its own or none");
            ret = -EINVAL;
            goto fail;
        }
        if (r->length == 0 || r->offset + r->length < r->offset ||
            r->offset + r->length > (uint64_t)INT64_MAX) {
            sl_err_set(err, "%s: request %u has an invalid range (offset %" PRIu64
                       ", length %" PRIu64 ")", name, i, r->offset, r->length);
            ret = -EINVAL;
            goto fail;
        }
        if (s->opts.verify) {
            const struct format_slice_info *si =
                r->tag < format_reader_n_slices(s->opts.verify)
                    ? format_reader_slice(s->opts.verify, (uint32_t)r->tag)
                    : NULL;
            if (!si || si->length != r->length) {
                sl_err_set(err, "%s: request %u (tag %" PRIu64 ") is not a whole slice of %s, "
                           "cannot verify it", name, i, r->tag,
                           format_reader_path(s->opts.verify));
                ret = -EINVAL;
                goto fail;
            }
        }
        s->reqs[i].r = *r;
        int fi = loader_file_index(s, r, err);
        if (fi < 0) {
            ret = fi;
            goto fail;
        }
        s->reqs[i].file = (uint32_t)fi;
        s->reqs[i].r.path = s->files[fi].path;
        if (r->length > largest && !r->dest)
            largest = r->length; /* own buffers: the ring holds nothing */
    }
    loader_choose_direct(s);
    if (n == 0) {
        s->stop = 1; /* nothing to read: next() returns 0 */
        *out = s;
        return 0;
    }
    ret = ring_setup(s, largest, err);
    if (ret < 0)
        goto fail;
    for (uint32_t i = 0; i < s->opts.queue_depth; i++) {
        s->ios[i].next = s->free_ios;
        s->free_ios = &s->ios[i];
    }
    s->be = s->opts.force_pread ? &loader_backend_pread : &loader_backend_uring;
    ret = s->be->init(s, err);
    if (ret < 0 && s->be == &loader_backend_uring) {
        loader_warn(s, "io_uring unavailable (%s): reading with a pread thread pool",
                    strerror(-ret));
        s->be = &loader_backend_pread;
        ret = s->be->init(s, err);
    }
    if (ret < 0) {
        s->be = NULL;
        goto fail;
    }
    if (s->be->kind != LOADER_BACKEND_URING)
        s->all_fixed = 0;
    if (pthread_create(&s->thread, NULL, loader_io_thread, s) != 0) {
        sl_err_set(err, "loader: cannot start the I/O thread");
        ret = -EAGAIN;
        goto fail;
    }
    s->thread_started = 1;
    *out = s;
    return 0;
fail:
    loader_stream_close(s);
    return ret;
}

int loader_stream_next(struct loader_stream *s, struct loader_slice *out, struct sl_err *err)
{
    pthread_mutex_lock(&s->lock);
    if (s->deliver_next >= s->n) {
        pthread_mutex_unlock(&s->lock);
        return 0;
    }
    struct loader_req_state *q = &s->reqs[s->deliver_next];
    while (!q->done && !s->error)
        pthread_cond_wait(&s->cond_done, &s->lock);
    if (!q->done) {
        int e = s->error;
        if (err)
            *err = s->err;
        pthread_mutex_unlock(&s->lock);
        return e;
    }
    out->index = s->deliver_next;
    out->tag = q->r.tag;
    out->data = loader_req_data(s, q);
    out->length = q->r.length;
    s->deliver_next++;
    s->delivered++;
    s->bytes += q->r.length;
    s->end_ns = sl_now_ns();
    if (!s->first_ns)
        s->first_ns = s->end_ns;
    pthread_mutex_unlock(&s->lock);
    return 1;
}

void loader_stream_release(struct loader_stream *s, const struct loader_slice *sl)
{
    pthread_mutex_lock(&s->lock);
    if (sl->index < s->deliver_next)
        s->reqs[sl->index].released = 1;
    /* free the released prefix, in allocation order */
    int freed = 0;
    while (s->release_next < s->deliver_next && s->reqs[s->release_next].released) {
        struct loader_req_state *q = &s->reqs[s->release_next];
        s->used -= q->alloc_len;
        s->release_next++;
        freed = 1;
        if (s->release_next < s->n && s->reqs[s->release_next].alloc_len)
            s->tail = s->reqs[s->release_next].alloc_off;
        else
            s->tail = s->head;
    }
    if (freed)
        pthread_cond_signal(&s->cond_space);
    pthread_mutex_unlock(&s->lock);
}

int loader_stream_run(struct loader_stream *s, loader_slice_fn fn, void *user,
                      struct sl_err *err)
{
    struct loader_slice sl;
    int ret;
    while ((ret = loader_stream_next(s, &sl, err)) == 1) {
        int r = fn(user, &sl);
        loader_stream_release(s, &sl);
        if (r)
            return r;
    }
    return ret;
}

void loader_stream_stats(const struct loader_stream *s, struct loader_stats *o)
{
    struct loader_stream *m = (struct loader_stream *)s;
    pthread_mutex_lock(&m->lock);
    memset(o, 0, sizeof *o);
    o->backend = s->be ? s->be->kind : LOADER_BACKEND_PREAD;
    o->direct = s->all_direct;
    for (uint32_t i = 0; i < s->n_files; i++)
        o->buffered_files += s->files[i].fd_direct < 0;
    o->fixed = s->all_fixed;
    o->mirror = s->ring.mirror;
    o->requests = s->delivered;
    o->bytes = s->bytes;
    o->reads = s->reads;
    o->retries = s->retries;
    o->out_of_order = s->out_of_order;
    o->min_depth = s->min_depth;
    o->ring_bytes = s->ring.bytes;
    o->peak_bytes = s->peak;
    o->first_ns = s->first_ns > s->start_ns ? s->first_ns - s->start_ns : 0;
    o->elapsed_ns = s->end_ns > s->start_ns ? s->end_ns - s->start_ns : 0;
    snprintf(o->note, sizeof o->note, "%s", s->note);
    pthread_mutex_unlock(&m->lock);
}

void loader_stream_close(struct loader_stream *s)
{
    if (!s)
        return;
    if (s->thread_started) {
        pthread_mutex_lock(&s->lock);
        s->stop = 1;
        pthread_cond_broadcast(&s->cond_space);
        pthread_mutex_unlock(&s->lock);
        pthread_join(s->thread, NULL);
    }
    if (s->be)
        s->be->fini(s); /* waits for reads still in the kernel before the ring goes */
    for (uint32_t i = 0; s->files && i < s->n_files; i++) {
        struct loader_file *f = &s->files[i];
        if (f->own_direct && f->fd_direct >= 0)
            close(f->fd_direct);
        if (f->own_buffered && f->fd_buffered >= 0)
            close(f->fd_buffered);
        free(f->path);
    }
    loader_ring_fini(&s->ring);
    free(s->files);
    free(s->reqs);
    free(s->ios);
    free(s->vq);
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->cond_done);
    pthread_cond_destroy(&s->cond_space);
    free(s);
}

/* loader_stream.c: the streaming core. An I/O thread allocates each request
 * contiguous space in the ring (in order), cuts it into chunk reads, keeps up
 * to queue_depth of them in flight through the backend, handles short reads,
 * EAGAIN, EINTR and O_DIRECT refusals, and marks requests complete; the
 * consumer takes them in order and releases them, which frees ring space
 * and lets the I/O thread go on. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loader_internal.h"

#define ALIGN 4096u

int64_t loader_pread_once(int fd, void *buf, uint64_t len, uint64_t off)
{
    for (;;) {
        ssize_t k = pread(fd, buf, (size_t)len, (off_t)off);
        if (k >= 0)
            return k;
        if (errno != EINTR)
            return -errno;
    }
}

/* ---- files ------------------------------------------------------------------------ */

static int file_index(struct loader_stream *s, const struct loader_request *r, struct sl_err *err)
{
    for (uint32_t i = 0; i < s->n_files; i++) {
        struct loader_file *f = &s->files[i];
        if (r->path ? (f->path && !strcmp(f->path, r->path)) : (!f->path && f->fd_buffered == r->fd))
            return (int)i;
    }
    struct loader_file *f = &s->files[s->n_files];
    f->fd_direct = f->fd_buffered = -1;
    if (!r->path) {
        if (r->fd < 0) {
            sl_err_set(err, "loader: request without a path or a descriptor");
            return -EINVAL;
        }
        f->fd_buffered = r->fd;
        s->all_direct = 0;
        return (int)s->n_files++;
    }
    f->path = strdup(r->path);
    if (!f->path) {
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    if (!s->opts.no_direct) {
        f->fd_direct = open(r->path, O_RDONLY | O_DIRECT | O_CLOEXEC);
        if (f->fd_direct < 0 && errno == EINVAL) {
            snprintf(s->note, sizeof s->note, "%s: O_DIRECT refused (EINVAL), reading buffered",
                     r->path);
        } else if (f->fd_direct < 0) {
            int e = errno;
            sl_err_set(err, "%s: cannot open: %s", r->path, strerror(e));
            free(f->path);
            f->path = NULL;
            return -e;
        }
    }
    if (f->fd_direct < 0) {
        s->all_direct = 0;
        f->fd_buffered = open(r->path, O_RDONLY | O_CLOEXEC);
        if (f->fd_buffered < 0) {
            int e = errno;
            sl_err_set(err, "%s: cannot open: %s", r->path, strerror(e));
            free(f->path);
            f->path = NULL;
            return -e;
        }
    }
    return (int)s->n_files++;
}

/* The buffered descriptor of a file, opened on first need. */
static int buffered_fd(struct loader_stream *s, uint32_t fi)
{
    struct loader_file *f = &s->files[fi];
    if (f->fd_buffered < 0 && f->path)
        f->fd_buffered = open(f->path, O_RDONLY | O_CLOEXEC);
    return f->fd_buffered;
}

/* ---- ring ------------------------------------------------------------------------- */

/* Contiguous space for request i, or 0 if the ring is full now. */
static int ring_alloc(struct loader_stream *s, struct loader_req_state *q)
{
    uint64_t len = sl_align_up(q->r.length, ALIGN);
    uint64_t at;
    if (s->used == 0) {
        s->head = s->tail = 0;
        at = 0;
    } else if (s->head > s->tail) {
        if (s->ring_bytes - s->head >= len)
            at = s->head;
        else if (s->tail >= len)
            at = 0; /* wrap; the end's leftover stays unused */
        else
            return 0;
    } else {
        if (s->tail - s->head >= len)
            at = s->head;
        else
            return 0;
    }
    q->alloc_off = at;
    q->alloc_len = len;
    q->buf = s->ring + at;
    s->head = at + len;
    s->used += len;
    if (s->used > s->peak)
        s->peak = s->used;
    return 1;
}

/* ---- the I/O thread -------------------------------------------------------------- */

static void set_error(struct loader_stream *s, int e, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void set_error(struct loader_stream *s, int e, const char *fmt, ...)
{
    if (s->error)
        return;
    s->error = e;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->err.msg, sizeof s->err.msg, fmt, ap);
    va_end(ap);
    pthread_cond_broadcast(&s->cond_done);
}

static int submit_io(struct loader_stream *s, struct loader_io *io)
{
    s->inflight++;
    int ret = s->be->submit(s, io);
    if (ret < 0) {
        s->inflight--;
        return ret;
    }
    return 0;
}

/* Fills the queue: next chunks of the current request, then new requests
 * while ring space lasts. Called with the lock held. */
static int fill(struct loader_stream *s)
{
    while (s->free_ios && s->alloc_next < s->n && !s->error && !s->stop) {
        struct loader_req_state *q = &s->reqs[s->alloc_next];
        if (!q->buf && !ring_alloc(s, q))
            return 0; /* wait for a release */
        struct loader_file *f = &s->files[q->file];
        uint64_t off = q->r.offset + q->submitted;
        uint64_t len = q->r.length - q->submitted;
        if (len > s->opts.chunk_bytes)
            len = s->opts.chunk_bytes;
        struct loader_io *io = s->free_ios;
        s->free_ios = io->next;
        io->off = off;
        io->len = (uint32_t)len;
        io->buf = q->buf + q->submitted;
        io->req = s->alloc_next;
        io->file = q->file;
        /* O_DIRECT wants aligned offsets, lengths and buffers; anything else
         * (a range that is not 4 KiB aligned) is read buffered */
        io->direct = f->fd_direct >= 0 && off % ALIGN == 0 && len % ALIGN == 0;
        io->fd = io->direct ? f->fd_direct : buffered_fd(s, q->file);
        if (io->fd < 0) {
            set_error(s, -EBADF, "%s: cannot open for buffered reads", f->path ? f->path : "(fd)");
            return -EBADF;
        }
        int ret = submit_io(s, io);
        if (ret < 0) {
            io->next = s->free_ios;
            s->free_ios = io;
            set_error(s, ret, "%s: cannot submit a read at offset %" PRIu64 ": %s",
                      f->path ? f->path : "(fd)", off, strerror(-ret));
            return ret;
        }
        q->submitted += len;
        if (q->submitted == q->r.length)
            s->alloc_next++;
    }
    return 0;
}

/* Applies the test fault plan to a completion. */
static void inject(struct loader_stream *s, struct loader_io *io)
{
    if (!s->have_faults)
        return;
    uint64_t n = ++s->completions;
    const struct loader_faults *f = &s->faults;
    if (f->direct_einval && io->direct) {
        io->res = -EINVAL;
    } else if (f->eio_at && n == f->eio_at) {
        io->res = -EIO;
    } else if (f->eagain_every && n % f->eagain_every == 0) {
        io->res = -EAGAIN;
    } else if (f->eintr_every && n % f->eintr_every == 0) {
        io->res = -EINTR;
    } else if (f->short_read_every && n % f->short_read_every == 0 && io->res > (int64_t)ALIGN) {
        io->res = (io->res / 2) & ~(int64_t)(ALIGN - 1);
    }
}

/* Handles one completion (lock held). */
static void complete(struct loader_stream *s, struct loader_io *io)
{
    s->inflight--;
    inject(s, io);
    struct loader_req_state *q = &s->reqs[io->req];
    struct loader_file *f = &s->files[io->file];
    const char *name = f->path ? f->path : "(descriptor)";
    int64_t res = io->res;
    if (res == -EAGAIN || res == -EINTR) {
        s->retries++;
        if (submit_io(s, io) == 0)
            return;
        res = -EIO;
    }
    if (res == -EINVAL && io->direct) {
        /* the file system refused O_DIRECT at read time: go buffered */
        if (!s->note[0])
            snprintf(s->note, sizeof s->note, "%s: O_DIRECT read refused (EINVAL), reading "
                                              "buffered", name);
        close(f->fd_direct);
        f->fd_direct = -1;
        s->all_direct = 0;
        io->direct = 0;
        io->fd = buffered_fd(s, io->file);
        s->retries++;
        if (io->fd >= 0 && submit_io(s, io) == 0)
            return;
        res = -EIO;
    }
    if (res < 0) {
        set_error(s, (int)res, "%s: read of %u bytes at offset %" PRIu64 " failed: %s", name,
                  io->len, io->off, strerror((int)-res));
    } else if (res == 0) {
        set_error(s, -EIO, "%s: unexpected end of file at offset %" PRIu64 " (truncated?)", name,
                  io->off);
    } else if ((uint64_t)res < io->len) {
        /* short read: the rest in a new read (buffered if it is no longer aligned) */
        s->reads++;
        s->retries++;
        q->done_bytes += (uint64_t)res;
        io->off += (uint64_t)res;
        io->buf += res;
        io->len -= (uint32_t)res;
        if (io->direct && (io->off % ALIGN || (uintptr_t)io->buf % ALIGN)) {
            io->direct = 0;
            io->fd = buffered_fd(s, io->file);
        }
        if (io->fd >= 0 && submit_io(s, io) == 0)
            return;
        set_error(s, -EIO, "%s: cannot resubmit a short read at offset %" PRIu64, name, io->off);
    } else {
        s->reads++;
        q->done_bytes += (uint64_t)res;
        if (q->done_bytes == q->r.length) {
            q->done = 1;
            pthread_cond_broadcast(&s->cond_done);
        }
    }
    io->next = s->free_ios;
    s->free_ios = io;
}

static void *io_thread(void *arg)
{
    struct loader_stream *s = arg;
    struct loader_io *done[64];
    pthread_mutex_lock(&s->lock);
    for (;;) {
        fill(s);
        if (s->inflight == 0) {
            if (s->stop || s->error || s->alloc_next == s->n)
                break;
            pthread_cond_wait(&s->cond_space, &s->lock); /* ring full: wait for a release */
            continue;
        }
        pthread_mutex_unlock(&s->lock);
        int k = s->be->wait(s, done, 64);
        pthread_mutex_lock(&s->lock);
        if (k < 0) {
            set_error(s, k, "loader: waiting for reads failed: %s", strerror(-k));
            /* reads may still be in flight in the kernel: the backend's fini
             * waits for them before the buffers go */
            break;
        }
        for (int i = 0; i < k; i++)
            complete(s, done[i]);
    }
    pthread_cond_broadcast(&s->cond_done);
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

/* ---- public ------------------------------------------------------------------------ */

static void defaults(struct loader_opts *o)
{
    if (!o->queue_depth)
        o->queue_depth = 16;
    if (o->queue_depth > 256)
        o->queue_depth = 256;
    if (!o->chunk_bytes)
        o->chunk_bytes = 1u << 20;
    o->chunk_bytes = (uint32_t)sl_align_up(o->chunk_bytes, ALIGN);
    if (!o->ring_bytes)
        o->ring_bytes = 256ull << 20;
    if (!o->pread_threads)
        o->pread_threads = 4;
    const char *env = getenv("SLUICE_LOADER");
    if (env && !strcmp(env, "pread"))
        o->force_pread = 1;
}

int loader_stream_open(const struct loader_request *reqs, uint32_t n,
                       const struct loader_opts *opts, struct loader_stream **out,
                       struct sl_err *err)
{
    struct loader_stream *s = calloc(1, sizeof *s);
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
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->cond_done, NULL);
    pthread_cond_init(&s->cond_space, NULL);
    int ret = -ENOMEM;
    s->reqs = calloc(n ? n : 1, sizeof *s->reqs);
    s->files = calloc(n ? n : 1, sizeof *s->files);
    s->ios = calloc(s->opts.queue_depth, sizeof *s->ios);
    if (!s->reqs || !s->files || !s->ios) {
        sl_err_set(err, "out of memory");
        goto fail;
    }
    s->n = n;
    uint64_t largest = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (reqs[i].length == 0 || reqs[i].offset + reqs[i].length < reqs[i].offset) {
            sl_err_set(err, "%s: request %u has an invalid range", reqs[i].path ? reqs[i].path : "fd",
                       i);
            ret = -EINVAL;
            goto fail;
        }
        s->reqs[i].r = reqs[i];
        int fi = file_index(s, &reqs[i], err);
        if (fi < 0) {
            ret = fi;
            goto fail;
        }
        s->reqs[i].file = (uint32_t)fi;
        s->reqs[i].r.path = s->files[fi].path;
        if (reqs[i].length > largest)
            largest = reqs[i].length;
    }
    /* a request is delivered whole: the ring holds at least the largest */
    s->ring_bytes = sl_align_up(s->opts.ring_bytes, ALIGN);
    if (s->ring_bytes < sl_align_up(largest, ALIGN) + s->opts.chunk_bytes)
        s->ring_bytes = sl_align_up(largest, ALIGN) + s->opts.chunk_bytes;
    s->ring = sl_alloc_aligned(s->ring_bytes, ALIGN);
    if (!s->ring) {
        sl_err_set(err, "out of memory for a %" PRIu64 "-byte read ring", s->ring_bytes);
        goto fail;
    }
    for (uint32_t i = 0; i < s->opts.queue_depth; i++) {
        s->ios[i].next = s->free_ios;
        s->free_ios = &s->ios[i];
    }
    s->be = s->opts.force_pread ? &loader_backend_pread : &loader_backend_uring;
    ret = s->be->init(s, err);
    if (ret < 0 && s->be == &loader_backend_uring) {
        if (!s->note[0])
            snprintf(s->note, sizeof s->note, "io_uring unavailable (%s): pread thread pool",
                     strerror(-ret));
        s->be = &loader_backend_pread;
        ret = s->be->init(s, err);
    }
    if (ret < 0)
        goto fail;
    if (pthread_create(&s->thread, NULL, io_thread, s) != 0) {
        s->be->fini(s);
        sl_err_set(err, "cannot start the I/O thread");
        ret = -EAGAIN;
        goto fail;
    }
    s->thread_started = 1;
    *out = s;
    return 0;
fail:
    s->be = NULL;
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
    out->data = q->buf;
    out->length = q->r.length;
    s->deliver_next++;
    s->bytes += q->r.length;
    s->end_ns = sl_now_ns();
    pthread_mutex_unlock(&s->lock);
    return 1;
}

void loader_stream_release(struct loader_stream *s, const struct loader_slice *sl)
{
    pthread_mutex_lock(&s->lock);
    if (sl->index < s->n)
        s->reqs[sl->index].released = 1;
    /* free the released prefix, in allocation order */
    while (s->release_next < s->n && s->reqs[s->release_next].released) {
        struct loader_req_state *q = &s->reqs[s->release_next];
        s->used -= q->alloc_len;
        q->buf = NULL;
        s->release_next++;
        if (s->release_next < s->n && s->reqs[s->release_next].alloc_len)
            s->tail = s->reqs[s->release_next].alloc_off;
        else
            s->tail = s->head;
    }
    pthread_cond_signal(&s->cond_space);
    pthread_mutex_unlock(&s->lock);
}

void loader_stream_stats(const struct loader_stream *s, struct loader_stats *o)
{
    struct loader_stream *m = (struct loader_stream *)s;
    pthread_mutex_lock(&m->lock);
    memset(o, 0, sizeof *o);
    o->backend = s->be ? s->be->kind : LOADER_BACKEND_PREAD;
    o->direct = s->all_direct;
    o->bytes = s->bytes;
    o->reads = s->reads;
    o->retries = s->retries;
    o->ring_bytes = s->ring_bytes;
    o->peak_bytes = s->peak;
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
        s->be->fini(s); /* waits for reads still in the kernel */
    for (uint32_t i = 0; s->files && i < s->n_files; i++) {
        if (s->files[i].fd_direct >= 0)
            close(s->files[i].fd_direct);
        if (s->files[i].path && s->files[i].fd_buffered >= 0)
            close(s->files[i].fd_buffered);
        free(s->files[i].path);
    }
    free(s->files);
    free(s->reqs);
    free(s->ios);
    sl_free_aligned(s->ring);
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->cond_done);
    pthread_cond_destroy(&s->cond_space);
    free(s);
}

int loader_requests_from_container(const struct format_reader *r, const char *path,
                                   struct loader_request **reqs, uint32_t *n,
                                   struct sl_err *err)
{
    uint32_t ns = format_reader_n_slices(r);
    struct loader_request *q = calloc(ns, sizeof *q);
    if (!q) {
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    for (uint32_t i = 0; i < ns; i++) {
        const struct format_slice_info *s = format_reader_slice(r, i);
        q[i] = (struct loader_request){.path = path ? path : format_reader_path(r), .fd = -1,
                                       .offset = s->offset, .length = s->length, .tag = i};
    }
    *reqs = q;
    *n = ns;
    return 0;
}

/* loader_stream.c: the streaming core. An I/O thread gives each request, in
 * order, contiguous space in the ring, cuts it into chunk reads, keeps up to
 * `depth` of them in flight through the backend, handles short reads, EAGAIN,
 * EINTR, ENOMEM and O_DIRECT refusals, verifies checksums when asked, and
 * marks requests deliverable; the consumer takes them in order and releases
 * them, which frees ring space and lets the I/O thread go on.
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

#define FUSE_MAGIC 0x65735546 /* FUSE_SUPER_MAGIC, linux/magic.h */
#define CACHE_SAMPLES 64

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

void loader_warn(struct loader_stream *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->note, sizeof s->note, fmt, ap);
    va_end(ap);
    if (s->opts.warn)
        s->opts.warn(s->opts.warn_user, s->note);
}

static const char *file_name(const struct loader_file *f)
{
    return f->path ? f->path : "(caller's descriptor)";
}

/* ---- files ------------------------------------------------------------------------ */

int loader_reopen_fd(int fd, int flags)
{
    char p[64];
    snprintf(p, sizeof p, "/proc/self/fd/%d", fd);
    return open(p, O_RDONLY | O_CLOEXEC | flags);
}

static int open_direct(struct loader_stream *s, struct loader_file *f)
{
    if (s->have_faults && s->faults.direct_open_einval) {
        errno = EINVAL;
        return -1;
    }
    return f->path ? open(f->path, O_RDONLY | O_CLOEXEC | O_DIRECT)
                   : loader_reopen_fd(f->caller_fd, O_DIRECT);
}

/* The index of the request's file, opened on first sight. */
static int file_index(struct loader_stream *s, const struct loader_request *r, struct sl_err *err)
{
    for (uint32_t i = 0; i < s->n_files; i++) {
        const struct loader_file *f = &s->files[i];
        if (r->path ? (f->path && !strcmp(f->path, r->path)) : (!f->path && f->caller_fd == r->fd))
            return (int)i;
    }
    struct loader_file *f = &s->files[s->n_files];
    memset(f, 0, sizeof *f);
    f->caller_fd = f->fd_direct = f->fd_buffered = -1;
    if (!r->path) {
        if (r->fd < 0) {
            sl_err_set(err, "loader: request without a path or a descriptor");
            return -EINVAL;
        }
        f->caller_fd = r->fd;
        int fl = fcntl(r->fd, F_GETFL);
        if (fl < 0) {
            int e = errno;
            sl_err_set(err, "loader: descriptor %d: %s", r->fd, strerror(e));
            return -e;
        }
        if (fl & O_DIRECT) {
            f->fd_direct = r->fd;
        } else {
            f->fd_buffered = r->fd;
            if (!s->opts.no_direct) {
                f->fd_direct = open_direct(s, f);
                f->own_direct = f->fd_direct >= 0;
            }
        }
        if (f->fd_direct < 0 && !s->opts.no_direct)
            loader_warn(s, "descriptor %d: cannot reopen it with O_DIRECT, reading buffered",
                        r->fd);
        return (int)s->n_files++;
    }
    f->path = sl_strdup(r->path);
    if (!f->path) {
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    if (!s->opts.no_direct) {
        f->fd_direct = open_direct(s, f);
        if (f->fd_direct >= 0) {
            f->own_direct = 1;
        } else if (errno == EINVAL) {
            loader_warn(s, "%s: O_DIRECT refused (EINVAL), reading buffered", r->path);
            f->warned = 1;
        } else {
            int e = errno;
            sl_err_set(err, "%s: cannot open: %s", r->path, strerror(e));
            free(f->path);
            return -e;
        }
    }
    if (f->fd_direct < 0) {
        f->fd_buffered = open(r->path, O_RDONLY | O_CLOEXEC);
        if (f->fd_buffered < 0) {
            int e = errno;
            sl_err_set(err, "%s: cannot open: %s", r->path, strerror(e));
            free(f->path);
            return -e;
        }
        f->own_buffered = 1;
    }
    return (int)s->n_files++;
}

/* The buffered descriptor of a file, opened on first need; -1 if impossible. */
static int buffered_fd(struct loader_file *f)
{
    if (f->fd_buffered < 0) {
        f->fd_buffered = f->path ? open(f->path, O_RDONLY | O_CLOEXEC) : loader_reopen_fd(f->caller_fd, 0);
        f->own_buffered = f->fd_buffered >= 0;
    }
    return f->fd_buffered;
}

/* 1 if the pages of [lo, hi) of the file are in the page cache: every one of
 * CACHE_SAMPLES pages spread over it (mincore through a mapping that is never
 * touched, so nothing is read). */
static int file_cached(int fd, uint64_t lo, uint64_t hi)
{
    lo &= ~(uint64_t)(LOADER_ALIGN - 1);
    if (hi <= lo || hi - lo > (uint64_t)SIZE_MAX / 2)
        return 0;
    size_t len = (size_t)(hi - lo);
    uint8_t *p = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, (off_t)lo);
    if (p == MAP_FAILED)
        return 0;
    int cached = 1;
    for (uint64_t k = 0; k < CACHE_SAMPLES && cached; k++) {
        uint64_t at = (uint64_t)len * k / CACHE_SAMPLES & ~(uint64_t)(LOADER_ALIGN - 1);
        unsigned char v = 0;
        if (mincore(p + at, 1, &v) < 0 || !(v & 1))
            cached = 0;
    }
    munmap(p, len);
    return cached;
}

/* Files read buffered where O_DIRECT cannot help (see loader_opts.always_direct). */
static void choose_direct(struct loader_stream *s)
{
    for (uint32_t i = 0; i < s->n_files; i++) {
        struct loader_file *f = &s->files[i];
        if (f->fd_direct < 0 || s->opts.always_direct)
            continue;
        const char *why = NULL;
        struct statfs sfs;
        if (fstatfs(f->fd_direct, &sfs) == 0 && sfs.f_type == FUSE_MAGIC) {
            why = "on FUSE";
        } else {
            uint64_t lo = UINT64_MAX, hi = 0;
            for (uint32_t j = 0; j < s->n; j++) {
                const struct loader_req_state *q = &s->reqs[j];
                if (q->file != i)
                    continue;
                if (q->r.offset < lo)
                    lo = q->r.offset;
                if (q->r.offset + q->r.length > hi)
                    hi = q->r.offset + q->r.length;
            }
            if (file_cached(f->fd_direct, lo, hi))
                why = "in the page cache already";
        }
        if (!why)
            continue;
        snprintf(s->note, sizeof s->note, "%s: %s, reading buffered", file_name(f), why);
        if (f->own_direct)
            close(f->fd_direct);
        f->fd_direct = -1;
        f->own_direct = 0;
    }
}

/* ---- ring ------------------------------------------------------------------------- */

/* Contiguous space for request q, or 0 if the ring is too full now. */
static int ring_alloc(struct loader_stream *s, struct loader_req_state *q)
{
    uint64_t len = sl_align_up(q->r.length, LOADER_ALIGN), R = s->ring.bytes, at;
    if (s->used == 0)
        s->head = s->tail = 0;
    if (s->ring.mirror) {
        /* the free space [head, tail) wraps through the mirror: always contiguous */
        if (R - s->used < len)
            return 0;
        at = s->head;
        s->head = (at + len) % R;
    } else {
        if (s->used == 0 || s->head > s->tail) {
            if (R - s->head >= len)
                at = s->head;
            else if (s->tail >= len)
                at = 0; /* wrap; the end's leftover stays unused this round */
            else
                return 0;
        } else if (s->tail - s->head >= len) {
            at = s->head;
        } else {
            return 0;
        }
        s->head = at + len;
    }
    q->alloc_off = at;
    q->alloc_len = len;
    s->used += len;
    if (s->used > s->peak)
        s->peak = s->used;
    return 1;
}

static uint8_t *req_data(const struct loader_stream *s, const struct loader_req_state *q)
{
    return q->r.dest ? (uint8_t *)q->r.dest : s->ring.base + q->alloc_off;
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

static void retry_push(struct loader_stream *s, struct loader_io *io, int front)
{
    if (front || !s->retry) {
        io->next = s->retry;
        s->retry = io;
        if (!s->retry_tail)
            s->retry_tail = io;
    } else {
        io->next = NULL;
        s->retry_tail->next = io;
        s->retry_tail = io;
    }
}

static struct loader_io *retry_pop(struct loader_stream *s)
{
    struct loader_io *io = s->retry;
    if (io) {
        s->retry = io->next;
        if (!s->retry)
            s->retry_tail = NULL;
    }
    return io;
}

static void lower_depth(struct loader_stream *s)
{
    uint32_t d = s->inflight > 1 ? s->inflight : 1;
    if (d > s->depth / 2)
        d = s->depth / 2 ? s->depth / 2 : 1;
    s->depth = d;
    if (d < s->min_depth)
        s->min_depth = d;
    s->ok_streak = 0;
}

/* Hands io to the backend; 1 if it went, 0 if the backend is out of room
 * for now (io is back on the retry list), or a negative errno (stream failed). */
static int submit_io(struct loader_stream *s, struct loader_io *io)
{
    struct loader_file *f = &s->files[io->file];
    io->direct = f->fd_direct >= 0 && io->off % LOADER_ALIGN == 0 &&
                 (uintptr_t)io->buf % LOADER_ALIGN == 0;
    io->fd = io->direct ? f->fd_direct : buffered_fd(f);
    if (io->fd < 0) {
        set_error(s, -EBADF, "%s: cannot open it for buffered reads", file_name(f));
        return -EBADF;
    }
    /* O_DIRECT reads whole 4 KiB blocks: the ring space of a request is
     * rounded up to 4 KiB, and a read past the end of the file is short */
    io->rlen = io->direct ? (uint32_t)sl_align_up(io->len, LOADER_ALIGN) : io->len;
    io->res = 0;
    s->inflight++;
    int ret = s->be->submit(s, io);
    if (ret == 0)
        return 1;
    s->inflight--;
    if (ret == -EAGAIN || ret == -ENOMEM || ret == -EBUSY) {
        if (++io->tries > LOADER_MAX_TRIES) {
            set_error(s, ret, "%s: cannot submit a read at offset %" PRIu64 ": %s",
                      file_name(f), io->off, strerror(-ret));
            return ret;
        }
        lower_depth(s);
        retry_push(s, io, 1);
        return 0;
    }
    set_error(s, ret, "%s: cannot submit a read at offset %" PRIu64 ": %s", file_name(f),
              io->off, strerror(-ret));
    return ret;
}

/* Fills the queue: reads waiting for resubmission first, then the next
 * chunks of the current request, then new requests while ring space lasts. */
static void fill(struct loader_stream *s)
{
    while (s->inflight < s->depth && !s->error && !s->stop) {
        struct loader_io *io = retry_pop(s);
        if (io) {
            if (submit_io(s, io) <= 0)
                return;
            continue;
        }
        if (!s->free_ios || s->alloc_next >= s->n)
            return;
        struct loader_req_state *q = &s->reqs[s->alloc_next];
        if (!q->r.dest && !q->alloc_len && !ring_alloc(s, q))
            return; /* wait for a release */
        uint64_t len = q->r.length - q->submitted;
        if (len > s->opts.chunk_bytes)
            len = s->opts.chunk_bytes;
        /* a read stays inside the ring's first mapping and one registration piece */
        uint64_t ring_off = q->r.dest ? 0 : (q->alloc_off + q->submitted) % s->ring.bytes;
        uint64_t room = s->piece_bytes - ring_off % s->piece_bytes;
        if (room > s->ring.bytes - ring_off)
            room = s->ring.bytes - ring_off;
        if (len > room && !q->r.dest)
            len = room;
        io = s->free_ios;
        s->free_ios = io->next;
        uint8_t *buf = q->r.dest ? (uint8_t *)q->r.dest + q->submitted : s->ring.base + ring_off;
        *io = (struct loader_io){.off = q->r.offset + q->submitted, .ring_off = ring_off,
                                 .buf = buf, .len = (uint32_t)len, .dest = q->r.dest != NULL,
                                 .req = s->alloc_next, .file = q->file};
        q->submitted += len;
        if (q->submitted == q->r.length)
            s->alloc_next++;
        if (submit_io(s, io) <= 0)
            return;
    }
}

/* Applies the test fault plan to a completion; 1 if it is parked (delayed). */
static int inject(struct loader_stream *s, struct loader_io *io)
{
    if (!s->have_faults)
        return 0;
    uint64_t n = ++s->completions;
    const struct loader_faults *f = &s->faults;
    if (f->direct_read_einval && io->direct)
        io->res = -EINVAL;
    else if (f->eio_at && n == f->eio_at)
        io->res = -EIO;
    else if (f->eagain_every && n % f->eagain_every == 0)
        io->res = -EAGAIN;
    else if (f->eintr_every && n % f->eintr_every == 0)
        io->res = -EINTR;
    else if (f->enomem_every && n % f->enomem_every == 0)
        io->res = -ENOMEM;
    else if (f->short_read_every && n % f->short_read_every == 0 && io->res > (int64_t)LOADER_ALIGN)
        io->res = (io->res / 2) & ~(int64_t)(LOADER_ALIGN - 1);
    else if (f->delay_every && n % f->delay_every == 0) {
        io->next = s->parked;
        s->parked = io;
        return 1;
    }
    return 0;
}

/* A request has all its bytes. */
static void request_read(struct loader_stream *s, uint32_t i)
{
    struct loader_req_state *q = &s->reqs[i];
    q->read_done = 1;
    if (i != s->complete_next)
        s->out_of_order++;
    while (s->complete_next < s->n && s->reqs[s->complete_next].read_done)
        s->complete_next++;
    if (s->opts.verify) {
        s->vq[s->vq_tail++] = i;
    } else {
        q->done = 1;
        pthread_cond_broadcast(&s->cond_done);
    }
}

/* Handles one completion; the io goes back to the free list or is resubmitted. */
static void complete(struct loader_stream *s, struct loader_io *io)
{
    struct loader_req_state *q = &s->reqs[io->req];
    struct loader_file *f = &s->files[io->file];
    int64_t res = io->res;
    if (res == -EAGAIN || res == -EINTR || res == -ENOMEM) {
        if (++io->tries > LOADER_MAX_TRIES) {
            set_error(s, (int)res, "%s: read of %u bytes at offset %" PRIu64
                      " keeps failing: %s", file_name(f), io->len, io->off, strerror((int)-res));
            goto free_io;
        }
        if (res == -ENOMEM)
            lower_depth(s); /* the kernel is short of memory: fewer reads in flight */
        s->retries++;
        retry_push(s, io, 1);
        return;
    }
    if (res == -EINVAL && io->direct) {
        /* the file system refused O_DIRECT at read time: read this file buffered */
        if (!f->warned)
            loader_warn(s, "%s: O_DIRECT read refused (EINVAL), reading buffered", file_name(f));
        f->warned = 1;
        if (f->own_direct && f->fd_direct >= 0)
            close(f->fd_direct);
        f->fd_direct = -1;
        s->all_direct = 0;
        s->retries++;
        retry_push(s, io, 1);
        return;
    }
    if (res < 0) {
        set_error(s, (int)res, "%s: read of %u bytes at offset %" PRIu64 " failed: %s",
                  file_name(f), io->len, io->off, strerror((int)-res));
        goto free_io;
    }
    if (res == 0) {
        set_error(s, -EIO, "%s: unexpected end of file at offset %" PRIu64
                  " (the file is shorter than the request)", file_name(f), io->off);
        goto free_io;
    }
    s->reads++;
    if (!io->direct)
        s->all_direct = 0;
    if (!io->fixed && s->be->kind == LOADER_BACKEND_URING)
        s->all_fixed = 0;
    uint64_t got = (uint64_t)res < io->len ? (uint64_t)res : io->len;
    q->done_bytes += got;
    if (got < io->len) {
        /* short read: the rest in a new read (buffered if no longer aligned) */
        io->off += got;
        io->ring_off += got;
        io->buf += got;
        io->len -= (uint32_t)got;
        io->tries = 0;
        s->retries++;
        retry_push(s, io, 1);
        return;
    }
    if (s->depth < s->opts.queue_depth && ++s->ok_streak >= 64) {
        s->depth++; /* memory came back: slowly up again */
        s->ok_streak = 0;
    }
    if (q->done_bytes == q->r.length)
        request_read(s, io->req);
free_io:
    io->next = s->free_ios;
    s->free_ios = io;
}

/* Verifies the oldest request waiting for it; drops the lock meanwhile. */
static void verify_one(struct loader_stream *s)
{
    uint32_t i = s->vq[s->vq_head++];
    struct loader_req_state *q = &s->reqs[i];
    if (s->be->flush)
        s->be->flush(s); /* keep the disk busy meanwhile */
    const void *data = req_data(s, q);
    pthread_mutex_unlock(&s->lock);
    struct sl_err e = {{0}};
    int ret = format_slice_verify(s->opts.verify, (uint32_t)q->r.tag, data, &e);
    pthread_mutex_lock(&s->lock);
    if (ret < 0) {
        set_error(s, ret, "%s (read from %s at offset %" PRIu64 ")", e.msg,
                  file_name(&s->files[q->file]), q->r.offset);
        return;
    }
    q->done = 1;
    pthread_cond_broadcast(&s->cond_done);
}

static void *io_thread(void *arg)
{
    struct loader_stream *s = arg;
    struct loader_io *done[64];
    pthread_mutex_lock(&s->lock);
    for (;;) {
        fill(s);
        if (s->error || s->stop)
            break;
        if (s->vq_head < s->vq_tail) {
            verify_one(s);
            continue;
        }
        if (s->inflight == 0) {
            if (s->parked) {
                /* nothing else will complete: the delayed ones go now */
                struct loader_io *p = s->parked;
                s->parked = NULL;
                while (p) {
                    struct loader_io *nx = p->next;
                    complete(s, p);
                    p = nx;
                }
                continue;
            }
            if (s->retry) {
                /* submissions refused with nothing in flight: back off */
                pthread_mutex_unlock(&s->lock);
                usleep(1000);
                pthread_mutex_lock(&s->lock);
                continue;
            }
            if (s->alloc_next == s->n)
                break; /* everything read (and verified) */
            pthread_cond_wait(&s->cond_space, &s->lock); /* ring full: wait for a release */
            continue;
        }
        struct loader_io *parked = s->parked; /* handled after this batch */
        s->parked = NULL;
        pthread_mutex_unlock(&s->lock);
        int k = s->be->wait(s, done, 64);
        pthread_mutex_lock(&s->lock);
        if (k < 0) {
            set_error(s, k, "loader: waiting for reads failed: %s", strerror(-k));
            break; /* reads still in the kernel are collected by the backend's fini */
        }
        for (int i = 0; i < k; i++) {
            s->inflight--;
            if (!inject(s, done[i]))
                complete(s, done[i]);
        }
        while (parked) {
            struct loader_io *nx = parked->next;
            complete(s, parked);
            parked = nx;
        }
    }
    s->stop = 1;
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
        int fi = file_index(s, r, err);
        if (fi < 0) {
            ret = fi;
            goto fail;
        }
        s->reqs[i].file = (uint32_t)fi;
        s->reqs[i].r.path = s->files[fi].path;
        if (r->length > largest && !r->dest)
            largest = r->length; /* own buffers: the ring holds nothing */
    }
    choose_direct(s);
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
    if (pthread_create(&s->thread, NULL, io_thread, s) != 0) {
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
    out->data = req_data(s, q);
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

/* ---- request lists ----------------------------------------------------------------- */

int loader_requests_from_container(const struct format_reader *r, const char *path,
                                   struct loader_request **reqs, uint32_t *n,
                                   struct sl_err *err)
{
    uint32_t ns = format_reader_n_slices(r);
    struct loader_request *q = sl_calloc(ns ? ns : 1, sizeof *q);
    if (!q) {
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    for (uint32_t i = 0; i < ns; i++) {
        const struct format_slice_info *si = format_reader_slice(r, i);
        q[i] = (struct loader_request){.path = path ? path : format_reader_path(r), .fd = -1,
                                       .offset = si->offset, .length = si->length, .tag = i};
    }
    *reqs = q;
    *n = ns;
    return 0;
}

int loader_requests_from_mount(const struct format_reader *r, const char *dir,
                               struct loader_request **reqs, uint32_t *n,
                               struct sl_err *err)
{
    uint32_t ns = format_reader_n_slices(r);
    size_t plen = strlen(dir) + sizeof "/layer.2147483647/slice.bin";
    struct loader_request *q = sl_calloc(1, (ns ? ns : 1) * (sizeof *q + plen));
    if (!q) {
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    char *paths = (char *)(q + (ns ? ns : 1));
    for (uint32_t i = 0; i < ns; i++) {
        const struct format_slice_info *si = format_reader_slice(r, i);
        char *p = paths + (size_t)i * plen;
        /* the layout of fs.h: one directory per slice holding slice.bin */
        if (si->kind == FORMAT_SLICE_LAYER)
            snprintf(p, plen, "%s/layer.%03d/slice.bin", dir, si->layer);
        else
            snprintf(p, plen, "%s/%s/slice.bin", dir,
                     si->kind == FORMAT_SLICE_EMBED ? "embed" : "head");
        q[i] = (struct loader_request){.path = p, .fd = -1, .offset = 0, .length = si->length,
                                       .tag = i};
    }
    *reqs = q;
    *n = ns;
    return 0;
}

/* loader_io.c: the stream's I/O thread. It gives each request, in order,
 * contiguous space in the ring, cuts it into chunk reads, keeps up to `depth`
 * of them in flight through the backend, handles short reads, EAGAIN, EINTR,
 * ENOMEM and O_DIRECT refusals, verifies checksums when asked, and marks
 * requests deliverable.
 *
 * Lock: s->lock guards the stream's state; the I/O thread drops it only to
 * wait for completions, to verify a checksum, or to back off. */
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

uint8_t *loader_req_data(const struct loader_stream *s, const struct loader_req_state *q)
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
    io->fd = io->direct ? f->fd_direct : loader_buffered_fd(f);
    if (io->fd < 0) {
        set_error(s, -EBADF, "%s: cannot open it for buffered reads", loader_file_name(f));
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
                      loader_file_name(f), io->off, strerror(-ret));
            return ret;
        }
        lower_depth(s);
        retry_push(s, io, 1);
        return 0;
    }
    set_error(s, ret, "%s: cannot submit a read at offset %" PRIu64 ": %s", loader_file_name(f),
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
                      " keeps failing: %s", loader_file_name(f), io->len, io->off,
                      strerror((int)-res));
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
            loader_warn(s, "%s: O_DIRECT read refused (EINVAL), reading buffered",
                        loader_file_name(f));
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
                  loader_file_name(f), io->len, io->off, strerror((int)-res));
        goto free_io;
    }
    if (res == 0) {
        set_error(s, -EIO, "%s: unexpected end of file at offset %" PRIu64
                  " (the file is shorter than the request)", loader_file_name(f), io->off);
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
    const void *data = loader_req_data(s, q);
    pthread_mutex_unlock(&s->lock);
    struct sl_err e = {{0}};
    int ret = format_slice_verify(s->opts.verify, (uint32_t)q->r.tag, data, &e);
    pthread_mutex_lock(&s->lock);
    if (ret < 0) {
        set_error(s, ret, "%s (read from %s at offset %" PRIu64 ")", e.msg,
                  loader_file_name(&s->files[q->file]), q->r.offset);
        return;
    }
    q->done = 1;
    pthread_cond_broadcast(&s->cond_done);
}

void *loader_io_thread(void *arg)
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

/* loader_uring.c: the io_uring backend. The ring's memory is registered with
 * the kernel (read_fixed: no page pinning per read) piece by piece, each piece
 * the first time a read goes into it, into a sparse buffer table: pinning a
 * page means touching it first, and doing all of a large ring up front would
 * delay the first read (150 ms for 256 MiB measured here), while a piece
 * pinned as the reading reaches it overlaps the reads already in flight.
 * Where registration is refused (RLIMIT_MEMLOCK for ordinary users, kernels
 * without sparse tables) reads go out as plain reads, with a warning. */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "loader_internal.h"

enum piece_state { PIECE_NEW = 0, PIECE_FIXED = 1, PIECE_PLAIN = 2 };

struct uring_state {
    struct io_uring ring;
    uint8_t *pieces;       /* enum piece_state per registration piece */
    uint32_t n_pieces;
    uint32_t unsubmitted;  /* SQEs prepared but not yet handed to the kernel */
};

static int uring_init(struct loader_stream *s, struct sl_err *err)
{
    if (s->have_faults && s->faults.uring_setup_errno)
        return -s->faults.uring_setup_errno;
    struct uring_state *u = sl_calloc(1, sizeof *u);
    if (!u) {
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    u->n_pieces = (uint32_t)((s->ring.bytes + s->piece_bytes - 1) / s->piece_bytes);
    u->pieces = sl_calloc(u->n_pieces, 1);
    if (!u->pieces) {
        free(u);
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    /* completions never outnumber submissions: a CQ of twice the SQ cannot overflow */
    int ret = io_uring_queue_init(s->opts.queue_depth, &u->ring, 0);
    if (ret < 0) {
        free(u->pieces);
        free(u);
        return ret; /* the caller falls back to the pread pool */
    }
    if (s->opts.no_register) {
        memset(u->pieces, PIECE_PLAIN, u->n_pieces);
    } else if ((ret = io_uring_register_buffers_sparse(&u->ring, u->n_pieces)) < 0) {
        memset(u->pieces, PIECE_PLAIN, u->n_pieces);
        loader_warn(s, "io_uring buffer table refused (%s): plain reads", strerror(-ret));
    }
    s->be_state = u;
    return 0;
}

/* Registers piece p of the ring (first use); PIECE_PLAIN if refused. */
static void register_piece(struct loader_stream *s, struct uring_state *u, uint32_t p)
{
    uint64_t off = (uint64_t)p * s->piece_bytes;
    uint64_t len = s->ring.bytes - off < s->piece_bytes ? s->ring.bytes - off : s->piece_bytes;
    struct iovec iov = {s->ring.base + off, (size_t)len};
    __u64 tag = 0;
    /* what is already queued goes to the kernel first: the pinning below
     * takes a while and the disk should not wait for it */
    if (u->unsubmitted && io_uring_submit(&u->ring) >= 0)
        u->unsubmitted = 0;
    int ret = io_uring_register_buffers_update_tag(&u->ring, p, &iov, &tag, 1);
    if (ret == 1) {
        u->pieces[p] = PIECE_FIXED;
    } else {
        u->pieces[p] = PIECE_PLAIN;
        loader_warn(s, "io_uring buffer registration refused (%s): plain reads",
                    strerror(ret < 0 ? -ret : EIO));
    }
}

static int uring_submit(struct loader_stream *s, struct loader_io *io)
{
    struct uring_state *u = s->be_state;
    uint32_t p = (uint32_t)(io->ring_off / s->piece_bytes);
    if (!io->dest && u->pieces[p] == PIECE_NEW)
        register_piece(s, u, p);
    struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
    if (!sqe) {
        int ret = io_uring_submit(&u->ring);
        if (ret < 0)
            return ret;
        u->unsubmitted = 0;
        sqe = io_uring_get_sqe(&u->ring);
        if (!sqe)
            return -EBUSY;
    }
    io->fixed = !io->dest && u->pieces[p] == PIECE_FIXED;
    if (io->fixed)
        io_uring_prep_read_fixed(sqe, io->fd, io->buf, io->rlen, io->off, (int)p);
    else
        io_uring_prep_read(sqe, io->fd, io->buf, io->rlen, io->off);
    io_uring_sqe_set_data(sqe, io);
    u->unsubmitted++;
    return 0;
}

static void uring_flush(struct loader_stream *s)
{
    struct uring_state *u = s->be_state;
    if (u->unsubmitted && io_uring_submit(&u->ring) >= 0)
        u->unsubmitted = 0;
}

static int uring_wait(struct loader_stream *s, struct loader_io **done, int max)
{
    struct uring_state *u = s->be_state;
    struct io_uring_cqe *cqe;
    int ret;
    /* the SQ is only touched under the stream's lock, which the caller has
     * dropped: but only this thread prepares SQEs, so it is safe to submit */
    for (unsigned tries = 0;; tries++) {
        ret = io_uring_submit_and_wait(&u->ring, 1);
        if (ret >= 0) {
            u->unsubmitted = 0;
            break;
        }
        if (ret == -EINTR)
            continue;
        if ((ret == -EAGAIN || ret == -ENOMEM || ret == -EBUSY) && tries < LOADER_MAX_TRIES) {
            /* the kernel cannot take the submissions now; completions may
             * already be waiting, otherwise try again shortly */
            if (io_uring_peek_cqe(&u->ring, &cqe) == 0)
                break;
            usleep(1000);
            continue;
        }
        return ret;
    }
    int k = 0;
    while (k < max && io_uring_peek_cqe(&u->ring, &cqe) == 0) {
        struct loader_io *io = io_uring_cqe_get_data(cqe);
        io->res = cqe->res;
        done[k++] = io;
        io_uring_cqe_seen(&u->ring, cqe);
    }
    return k;
}

static void uring_fini(struct loader_stream *s)
{
    struct uring_state *u = s->be_state;
    if (!u)
        return;
    /* reads still in flight write into the ring: collect them first */
    if (u->unsubmitted)
        io_uring_submit(&u->ring);
    while (s->inflight > 0) {
        struct io_uring_cqe *cqe;
        int ret = io_uring_wait_cqe(&u->ring, &cqe);
        if (ret == -EINTR)
            continue;
        if (ret < 0)
            break;
        io_uring_cqe_seen(&u->ring, cqe);
        s->inflight--;
    }
    io_uring_queue_exit(&u->ring);
    free(u->pieces);
    free(u);
    s->be_state = NULL;
}

const struct loader_backend_ops loader_backend_uring = {
    LOADER_BACKEND_URING, uring_init, uring_submit, uring_flush, uring_wait, uring_fini,
};

/* ---- batches of small reads ---------------------------------------------------------- */

static int batch_pread(int fd, const uint64_t *offs, const uint64_t *lens, void *const *bufs,
                       uint32_t i, uint64_t got, struct sl_err *err)
{
    while (got < lens[i]) {
        int64_t r = loader_pread_once(fd, (uint8_t *)bufs[i] + got, lens[i] - got, offs[i] + got);
        if (r < 0) {
            sl_err_set(err, "read of %llu bytes at offset %llu failed: %s",
                       (unsigned long long)lens[i], (unsigned long long)offs[i],
                       strerror((int)-r));
            return (int)r;
        }
        if (r == 0) {
            sl_err_set(err, "read of %llu bytes at offset %llu: unexpected end of file",
                       (unsigned long long)lens[i], (unsigned long long)offs[i]);
            return -EIO;
        }
        got += (uint64_t)r;
    }
    return 0;
}

int loader_read_batch(int fd, const uint64_t *offs, const uint64_t *lens, void *const *bufs,
                      uint32_t n, struct sl_err *err)
{
    struct io_uring ring;
    uint32_t depth = n < 64 ? (n ? n : 1) : 64;
    const char *env = getenv("SLUICE_LOADER");
    if ((env && !strcmp(env, "pread")) || io_uring_queue_init(depth, &ring, 0) < 0) {
        for (uint32_t i = 0; i < n; i++) {
            int ret = batch_pread(fd, offs, lens, bufs, i, 0, err);
            if (ret < 0)
                return ret;
        }
        return 0;
    }
    int ret = 0;
    uint32_t next = 0, done = 0, inflight = 0;
    while (done < n && ret == 0) {
        while (next < n && inflight < depth) {
            struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
            if (!sqe)
                break;
            io_uring_prep_read(sqe, fd, bufs[next], (unsigned)lens[next], offs[next]);
            io_uring_sqe_set_data(sqe, (void *)(uintptr_t)next);
            next++;
            inflight++;
        }
        struct io_uring_cqe *cqe;
        int r = io_uring_submit_and_wait(&ring, 1);
        if (r < 0 && r != -EINTR) {
            sl_err_set(err, "io_uring submission failed: %s", strerror(-r));
            ret = r;
            break;
        }
        while (io_uring_peek_cqe(&ring, &cqe) == 0) {
            uint32_t i = (uint32_t)(uintptr_t)io_uring_cqe_get_data(cqe);
            int res = cqe->res;
            io_uring_cqe_seen(&ring, cqe);
            inflight--;
            if (res < 0 && res != -EAGAIN && res != -EINTR && res != -ENOMEM) {
                sl_err_set(err, "read of %llu bytes at offset %llu failed: %s",
                           (unsigned long long)lens[i], (unsigned long long)offs[i],
                           strerror(-res));
                ret = res;
                continue;
            }
            /* short, or a transient failure: finish this one synchronously */
            if ((uint64_t)(res > 0 ? res : 0) < lens[i]) {
                int r2 = batch_pread(fd, offs, lens, bufs, i, res > 0 ? (uint64_t)res : 0, err);
                if (r2 < 0) {
                    ret = r2;
                    continue;
                }
            }
            done++;
        }
    }
    /* drain anything still in flight before the caller's buffers are reused */
    while (inflight > 0) {
        struct io_uring_cqe *cqe;
        int r = io_uring_wait_cqe(&ring, &cqe);
        if (r == -EINTR)
            continue;
        if (r < 0)
            break;
        io_uring_cqe_seen(&ring, cqe);
        inflight--;
    }
    io_uring_queue_exit(&ring);
    return ret;
}

int loader_read_batch_random(int fd, const uint64_t *offs, const uint64_t *lens,
                             void *const *bufs, uint32_t n, struct sl_err *err)
{
    int rfd = loader_reopen_fd(fd, 0);
    if (rfd < 0)
        return loader_read_batch(fd, offs, lens, bufs, n, err);
    (void)posix_fadvise(rfd, 0, 0, POSIX_FADV_RANDOM); /* advice only: reads work without it */
    int ret = loader_read_batch(rfd, offs, lens, bufs, n, err);
    close(rfd);
    return ret;
}

/* loader_uring.c: the io_uring backend: one registered buffer (the whole
 * ring) so reads are read_fixed (no per-read page pinning); falls back to
 * plain reads when registration is refused (e.g. RLIMIT_MEMLOCK). */
#include <errno.h>
#include <liburing.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "loader_internal.h"

struct uring_state {
    struct io_uring ring;
    int fixed;
};

static int uring_init(struct loader_stream *s, struct sl_err *err)
{
    if (s->have_faults && s->faults.fail_uring_setup)
        return -ENOSYS;
    struct uring_state *u = calloc(1, sizeof *u);
    if (!u) {
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    int ret = io_uring_queue_init(s->opts.queue_depth * 2, &u->ring, 0);
    if (ret < 0) {
        free(u);
        return ret; /* the caller falls back to the pread pool */
    }
    struct iovec iov = {s->ring, (size_t)s->ring_bytes};
    u->fixed = s->ring_bytes <= (1ull << 30) && io_uring_register_buffers(&u->ring, &iov, 1) == 0;
    s->be_state = u;
    return 0;
}

static int uring_submit(struct loader_stream *s, struct loader_io *io)
{
    struct uring_state *u = s->be_state;
    struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
    if (!sqe) {
        int ret = io_uring_submit(&u->ring);
        if (ret < 0)
            return ret;
        sqe = io_uring_get_sqe(&u->ring);
        if (!sqe)
            return -EBUSY;
    }
    if (u->fixed)
        io_uring_prep_read_fixed(sqe, io->fd, io->buf, io->len, io->off, 0);
    else
        io_uring_prep_read(sqe, io->fd, io->buf, io->len, io->off);
    io_uring_sqe_set_data(sqe, io);
    return 0;
}

static int uring_wait(struct loader_stream *s, struct loader_io **done, int max)
{
    struct uring_state *u = s->be_state;
    struct io_uring_cqe *cqe;
    int ret;
    do {
        ret = io_uring_submit_and_wait(&u->ring, 1);
    } while (ret == -EINTR);
    if (ret < 0 && ret != -EBUSY)
        return ret;
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
    while (s->inflight > 0) {
        struct io_uring_cqe *cqe;
        io_uring_submit(&u->ring);
        if (io_uring_wait_cqe(&u->ring, &cqe) < 0)
            break;
        io_uring_cqe_seen(&u->ring, cqe);
        s->inflight--;
    }
    io_uring_queue_exit(&u->ring);
    free(u);
    s->be_state = NULL;
}

const struct loader_backend_ops loader_backend_uring = {LOADER_BACKEND_URING, uring_init,
                                                        uring_submit, uring_wait, uring_fini};

int loader_read_batch(int fd, const uint64_t *offs, const uint64_t *lens, void *const *bufs,
                      uint32_t n, struct sl_err *err)
{
    struct io_uring ring;
    uint32_t depth = n < 64 ? (n ? n : 1) : 64;
    if (io_uring_queue_init(depth, &ring, 0) < 0) {
        for (uint32_t i = 0; i < n; i++) {
            int64_t r = loader_pread_once(fd, bufs[i], lens[i], offs[i]);
            if (r != (int64_t)lens[i]) {
                sl_err_set(err, "read of %llu bytes at %llu failed",
                           (unsigned long long)lens[i], (unsigned long long)offs[i]);
                return r < 0 ? (int)r : -EIO;
            }
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
            ret = r;
            break;
        }
        while (io_uring_peek_cqe(&ring, &cqe) == 0) {
            uint32_t i = (uint32_t)(uintptr_t)io_uring_cqe_get_data(cqe);
            int res = cqe->res;
            io_uring_cqe_seen(&ring, cqe);
            inflight--;
            if (res != (int)lens[i]) {
                /* short or failed: finish this one synchronously */
                int64_t got = res > 0 ? res : 0;
                if (res < 0 && res != -EAGAIN && res != -EINTR) {
                    sl_err_set(err, "read of %llu bytes at %llu failed: %s",
                               (unsigned long long)lens[i], (unsigned long long)offs[i],
                               strerror(-res));
                    ret = res;
                    continue;
                }
                int64_t r2 = loader_pread_once(fd, (uint8_t *)bufs[i] + got, lens[i] - got,
                                               offs[i] + got);
                if (r2 != (int64_t)(lens[i] - got)) {
                    sl_err_set(err, "read of %llu bytes at %llu came up short",
                               (unsigned long long)lens[i], (unsigned long long)offs[i]);
                    ret = -EIO;
                    continue;
                }
            }
            done++;
        }
    }
    /* drain anything still in flight before the buffers are reused */
    while (inflight > 0) {
        struct io_uring_cqe *cqe;
        if (io_uring_wait_cqe(&ring, &cqe) < 0)
            break;
        io_uring_cqe_seen(&ring, cqe);
        inflight--;
    }
    io_uring_queue_exit(&ring);
    return ret;
}

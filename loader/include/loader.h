/*
 * loader.h: streams byte ranges (a model's slices, in execution order) from
 * storage into a bounded ring of aligned buffers, with io_uring (O_DIRECT,
 * registered buffers, several reads in flight) or a pread thread pool, and
 * hands each range to the consumer whole and in order.
 *
 *   struct loader_request *reqs; uint32_t n;
 *   loader_requests_from_container(reader, NULL, &reqs, &n, &err);
 *   // or loader_requests_from_mount(reader, "/mnt/model", &reqs, &n, &err);
 *   struct loader_opts o = {.verify = reader};            // checksums, optional
 *   struct loader_stream *s;
 *   loader_stream_open(reqs, n, &o, &s, &err);            // reading starts now
 *   struct loader_slice sl;
 *   while (loader_stream_next(s, &sl, &err) == 1) {       // blocks for the next in order
 *       use(sl.data, sl.length);
 *       loader_stream_release(s, &sl);                    // gives its ring space back
 *   }
 *   loader_stream_close(s);
 *   free(reqs);
 *
 * The core is a list of read requests {path or fd, offset, length, tag}, so it
 * reads a container, the slice files of a `sluice mount`, or anything else.
 *
 * Memory (requests without a buffer of their own, loader_request.dest,
 * which are read straight into it): one ring of ring_bytes (the only buffer memory the loader has, 4 KiB
 * aligned), whatever the size of the model. A request is delivered whole in
 * one contiguous buffer (unpack wants a slice in one piece, and its checksum
 * covers all of it), so the ring is at least the largest request plus one
 * chunk; it is sized to the largest request rather than streaming a request in
 * pieces because pieces would have to be copied back together downstream. The
 * ring is mapped twice back to back (a memfd), so a slice that wraps around the
 * end is still contiguous and no space is lost to wrapping: any run of
 * unreleased slices totalling at most ring_bytes fits. Pages are touched (and
 * registered with io_uring) in pieces as the reading first reaches them, so
 * opening costs nothing up front and the first read starts at once.
 *
 * Threads: reading runs on a thread of the loader's own, so the disk stays
 * busy while the consumer computes. next() may be called from any one thread
 * at a time (it need not be the thread that opened the stream); release() may
 * be called from any thread, in any order (space is reused in delivery order,
 * once every earlier slice is released too). A consumer that keeps unreleased
 * slices totalling more than ring_bytes minus the next request's size, and
 * waits in next() for that request with nobody else to release, waits forever:
 * with the default ring a consumer can always hold one slice while it waits for
 * the next one. close() may be called at any time, from the consumer's thread.
 */
#ifndef SLUICE_LOADER_H
#define SLUICE_LOADER_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "format.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One byte range to read: from `path` (opened by the loader, O_DIRECT when
 * the file system allows it) or, with path NULL, from the caller's open `fd`
 * (kept open by the caller until close; the loader reopens it through
 * /proc/self/fd with O_DIRECT when it can, and otherwise reads it as is). */
struct loader_request {
    const char *path;
    int fd;
    uint64_t offset;
    uint64_t length;         /* > 0 */
    uint64_t tag;            /* the caller's, returned with the slice */
    /* NULL: read into the ring. Else the caller's buffer, 4 KiB aligned, of
     * at least length rounded up to 4 KiB (O_DIRECT reads whole blocks):
     * the bytes are read straight into it (the data delivered points there
     * and stays the caller's after release and close), so a consumer that
     * keeps every slice needs no ring and no copy. Either every request of
     * a stream has one or none (-EINVAL). */
    void *dest;
};

enum loader_backend {
    LOADER_BACKEND_URING = 0,
    LOADER_BACKEND_PREAD = 1,
};

/* Fault injection, for tests. Completions are counted from 1 across the
 * stream; every n-th one (0 = never) is turned into the named event before
 * the loader sees it, whichever backend produced it. */
struct loader_faults {
    uint32_t short_read_every;  /* only half the bytes (rounded down to 4 KiB) arrive */
    uint32_t eagain_every;      /* -EAGAIN: resubmitted */
    uint32_t eintr_every;       /* -EINTR: resubmitted */
    uint32_t enomem_every;      /* -ENOMEM: fewer reads in flight, then resubmitted */
    uint32_t delay_every;       /* handled only after the next batch of completions
                                 * (forces out-of-order completions) */
    uint32_t eio_at;            /* this completion fails with -EIO */
    int direct_open_einval;     /* open(O_DIRECT) fails with EINVAL (a file system refusing it) */
    int direct_read_einval;     /* O_DIRECT reads complete with -EINVAL */
    int uring_setup_errno;      /* io_uring setup fails with this errno (ENOSYS, EPERM) */
    int no_mirror;              /* the ring is not double-mapped (as without memfd) */
};

/* Warnings (O_DIRECT refused, io_uring unavailable, buffers not registered)
 * go to this callback when set, from the opening thread or the I/O thread;
 * the last one is also kept in loader_stats.note. */
typedef void (*loader_warn_fn)(void *user, const char *msg);

struct loader_opts {
    uint32_t queue_depth;       /* reads in flight (default 16, at most 256) */
    uint32_t chunk_bytes;       /* bytes per read (default 1 MiB; rounded up to 4 KiB) */
    uint64_t ring_bytes;        /* buffer memory; default (0): twice the largest request
                                 * plus queue_depth chunks, at least 32 MiB; never less
                                 * than the largest request plus one chunk */
    int no_direct;              /* 1: buffered reads only */
    /* By default a file is read buffered, not O_DIRECT, where O_DIRECT cannot
     * help: on FUSE (the daemon does the disk reads; O_DIRECT only turns off
     * the kernel's FUSE page cache and readahead) and when the ranges to read
     * are in the page cache already (64 pages sampled with mincore: a warm
     * start, where buffered reads run at memory speed). 1: O_DIRECT anyway. */
    int always_direct;
    int no_register;            /* 1: no registered buffers (plain io_uring reads) */
    int force_pread;            /* 1: pread thread pool (also SLUICE_LOADER=pread) */
    uint32_t pread_threads;     /* default: min(queue_depth, 8) */
    /* Verifies every request as slice `tag` of this container before it is
     * delivered (on the I/O thread, while later reads are in flight); a
     * mismatch stops the stream with -EIO naming the slice. NULL: the caller
     * verifies (format_slice_verify), or nobody. */
    const struct format_reader *verify;
    loader_warn_fn warn;
    void *warn_user;
    const struct loader_faults *faults; /* tests only; NULL */
};

struct loader_slice {
    uint32_t index;             /* position in the request list */
    uint64_t tag;
    const void *data;           /* 4096-aligned, valid until released */
    uint64_t length;
};

struct loader_stats {
    enum loader_backend backend;
    int direct;                 /* 1 if every read used O_DIRECT */
    uint32_t buffered_files;    /* files read buffered (by policy or refusal) */
    int fixed;                  /* 1 if every io_uring read used registered buffers */
    int mirror;                 /* 1 if the ring is double-mapped */
    uint32_t requests;          /* delivered */
    uint64_t bytes;             /* delivered */
    uint64_t reads;             /* read operations completed */
    uint64_t retries;           /* resubmissions (short reads, EAGAIN, EINTR, ENOMEM) */
    uint64_t out_of_order;      /* requests completed while an earlier one was not */
    uint32_t min_depth;         /* lowest in-flight limit (lowered on ENOMEM) */
    uint64_t ring_bytes;        /* the ring's size */
    uint64_t peak_bytes;        /* most ring bytes in use at once */
    uint64_t first_ns;          /* open to the first delivery */
    uint64_t elapsed_ns;        /* open to the last delivery */
    char note[256];             /* last warning or policy note, e.g. "x: O_DIRECT refused
                                 * (EINVAL), reading buffered", "x: in the page cache
                                 * already, reading buffered" */
};

struct loader_stream;

/* Opens the files and starts reading (the requests and their paths are
 * copied). Errors: -EINVAL (an empty or overflowing range, a verify tag that
 * is not a slice of the right length), -ENOMEM, or the errno of opening a
 * file, with a message naming it. */
int loader_stream_open(const struct loader_request *reqs, uint32_t n,
                       const struct loader_opts *opts, struct loader_stream **out,
                       struct sl_err *err);

/* The next request in order: 1 and *out, 0 after the last, or a negative
 * errno with a message naming the file and offset of the failed read (the
 * stream is then stopped; later calls return the same error). Blocks until
 * the request is complete (and verified). */
int loader_stream_next(struct loader_stream *s, struct loader_slice *out, struct sl_err *err);

/* Gives a delivered slice's buffer back. */
void loader_stream_release(struct loader_stream *s, const struct loader_slice *sl);

/* Calls fn for every remaining request in order on the calling thread and
 * releases each when fn returns: the completion callback form of next().
 * Returns 0 when all were delivered, fn's value if it returns nonzero (the
 * rest is not read), or a stream error as next() does. */
typedef int (*loader_slice_fn)(void *user, const struct loader_slice *sl);
int loader_stream_run(struct loader_stream *s, loader_slice_fn fn, void *user,
                      struct sl_err *err);

/* Stops reading (reads still in the kernel are waited for) and frees
 * everything, the ring included: data of unreleased slices goes with it.
 * NULL is fine. */
void loader_stream_close(struct loader_stream *s);

/* A snapshot; may be called at any time from any thread. */
void loader_stream_stats(const struct loader_stream *s, struct loader_stats *out);

/* One request per slice of a container, in execution order, reading `path`
 * (NULL: the reader's own path); tag = slice index. *reqs is one malloc'ed
 * block (free() it); the paths point into the reader or into `path`. */
int loader_requests_from_container(const struct format_reader *r, const char *path,
                                   struct loader_request **reqs, uint32_t *n,
                                   struct sl_err *err);

/* One request per slice, reading the whole-slice files of a `sluice mount`
 * of that container at `dir` (embed/slice.bin, layer.NNN/slice.bin,
 * head/slice.bin); tag = slice index. *reqs is one malloc'ed block holding
 * the paths too (free() it). */
int loader_requests_from_mount(const struct format_reader *r, const char *dir,
                               struct loader_request **reqs, uint32_t *n,
                               struct sl_err *err);

/* Reads n small ranges of one file at once (io_uring batch, or pread where
 * io_uring is unavailable): for the embedding rows a prompt needs ahead of
 * the stream. bufs[i] receives lens[i] bytes from offs[i]; short reads are
 * completed; -EIO with a message at end of file. */
int loader_read_batch(int fd, const uint64_t *offs, const uint64_t *lens, void *const *bufs,
                      uint32_t n, struct sl_err *err);
/* The same, for ranges scattered over a large file (the embedding rows of a
 * prompt): read through a second open file description of fd advised
 * POSIX_FADV_RANDOM, so that no read pulls in read-ahead bytes nobody asked
 * for (on a throttled disk they cost as much as wanted ones). Reopened through
 * /proc/self/fd, the same inode even if the path was replaced since; where
 * that fails, read through fd itself as loader_read_batch does. */
int loader_read_batch_random(int fd, const uint64_t *offs, const uint64_t *lens,
                             void *const *bufs, uint32_t n, struct sl_err *err);

#ifdef __cplusplus
}
#endif

#endif

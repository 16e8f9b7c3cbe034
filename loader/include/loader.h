/*
 * loader.h: streams byte ranges (a model's slices, in execution order) from
 * storage into a bounded ring of aligned buffers, with io_uring (O_DIRECT,
 * registered buffers, several reads in flight) or a pread thread pool, and
 * hands each range to the consumer in order.
 *
 *   struct loader_request *reqs; uint32_t n;
 *   loader_requests_from_container(reader, NULL, &reqs, &n, &err);
 *   struct loader_stream *s;
 *   loader_stream_open(reqs, n, NULL, &s, &err);        // reading starts now
 *   struct loader_slice sl;
 *   while (loader_stream_next(s, &sl, &err) == 1) {     // blocks for the next in order
 *       use(sl.data, sl.length);
 *       loader_stream_release(s, &sl);                  // frees its ring space
 *   }
 *   loader_stream_close(s);
 *
 * Memory: at most ring_bytes of buffers (raised to the largest request plus
 * one chunk if a request is larger: a request is delivered whole, in one
 * contiguous buffer). The reading runs on a thread of its own, so the disk
 * stays busy while the consumer computes; the consumer must release slices
 * in the order it received them.
 *
 * Threads: next/release/close from one consumer thread (any thread, one at a
 * time). Data returned by next stays valid until its release.
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
 * the file system allows it) or from an open `fd` (path NULL; used as is). */
struct loader_request {
    const char *path;
    int fd;
    uint64_t offset;
    uint64_t length;
    uint64_t tag;            /* the caller's, returned with the slice */
};

enum loader_backend {
    LOADER_BACKEND_URING = 0,
    LOADER_BACKEND_PREAD = 1,
};

/* Fault injection, for tests: every n-th read completion (1-based counting,
 * 0 = never) is turned into the named event before the loader sees it. */
struct loader_faults {
    uint32_t short_read_every;  /* half the bytes (4 KiB aligned) arrive */
    uint32_t eagain_every;      /* -EAGAIN */
    uint32_t eintr_every;       /* -EINTR */
    uint32_t eio_at;            /* this read fails with -EIO (once) */
    int direct_einval;          /* O_DIRECT reads fail with -EINVAL (a file system refusing it) */
    int fail_uring_setup;       /* io_uring_queue_init "fails" with -ENOSYS */
};

struct loader_opts {
    uint32_t queue_depth;       /* reads in flight (default 16) */
    uint32_t chunk_bytes;       /* bytes per read (default 1 MiB; multiple of 4096) */
    uint64_t ring_bytes;        /* buffer memory (default 256 MiB) */
    int no_direct;              /* 1: buffered reads only */
    int force_pread;            /* 1: pread thread pool (also SLUICE_LOADER=pread) */
    uint32_t pread_threads;     /* default 4 */
    const struct loader_faults *faults;
};

struct loader_slice {
    uint32_t index;             /* position in the request list */
    uint64_t tag;
    const void *data;           /* 4096-aligned */
    uint64_t length;
};

struct loader_stats {
    enum loader_backend backend;
    int direct;                 /* 1 if every file was read with O_DIRECT */
    uint64_t bytes;             /* delivered */
    uint64_t reads;             /* read operations completed */
    uint64_t retries;           /* resubmissions (short reads, EAGAIN, EINTR) */
    uint64_t ring_bytes;        /* the ring's size */
    uint64_t peak_bytes;        /* most ring bytes in use at once */
    uint64_t elapsed_ns;        /* open to the last delivery */
    char note[256];             /* e.g. "x.sluice: O_DIRECT refused (EINVAL), reading buffered" */
};

struct loader_stream;

/* Starts reading (the requests are copied). Errors: -EINVAL (bad request),
 * -ENOMEM, or the errno of opening a file, with a message naming it. */
int loader_stream_open(const struct loader_request *reqs, uint32_t n,
                       const struct loader_opts *opts, struct loader_stream **out,
                       struct sl_err *err);

/* The next request in order: 1 and *out, 0 at the end, or a negative errno
 * with a message naming the file and offset of a failed read. Blocks until
 * the request is complete. */
int loader_stream_next(struct loader_stream *s, struct loader_slice *out, struct sl_err *err);

/* Gives a delivered slice's buffer back (in delivery order). */
void loader_stream_release(struct loader_stream *s, const struct loader_slice *sl);

/* Stops reading (pending reads are waited for) and frees everything. NULL ok. */
void loader_stream_close(struct loader_stream *s);

void loader_stream_stats(const struct loader_stream *s, struct loader_stats *out);

/* One request per slice of a container, in execution order, reading `path`
 * (default: the reader's own path). *reqs is malloc'ed; tag = slice index. */
int loader_requests_from_container(const struct format_reader *r, const char *path,
                                   struct loader_request **reqs, uint32_t *n,
                                   struct sl_err *err);

/* Reads n small ranges of one file at once (io_uring batch, or pread): for
 * the embedding rows a prompt needs ahead of the stream. bufs[i] receives
 * lens[i] bytes from offs[i]. */
int loader_read_batch(int fd, const uint64_t *offs, const uint64_t *lens, void *const *bufs,
                      uint32_t n, struct sl_err *err);

#ifdef __cplusplus
}
#endif

#endif

/* loader_internal.h: the stream's state and the two I/O backends (io_uring,
 * pread pool) behind one small interface. */
#ifndef SLUICE_LOADER_INTERNAL_H
#define SLUICE_LOADER_INTERNAL_H

#include <pthread.h>

#include "loader.h"

/* One read in flight. */
struct loader_io {
    int fd;
    uint64_t off;
    uint32_t len;
    uint8_t *buf;
    uint32_t req;          /* request index */
    uint32_t file;         /* file index */
    int direct;            /* fd is an O_DIRECT descriptor */
    int64_t res;           /* bytes or -errno, set on completion */
    struct loader_io *next;/* free list / pread queues */
};

struct loader_file {
    char *path;            /* NULL for caller fds */
    int fd_direct;         /* -1 if none */
    int fd_buffered;       /* -1 until needed (caller fd for path-less requests) */
};

struct loader_req_state {
    struct loader_request r;
    uint32_t file;
    uint8_t *buf;          /* its ring space */
    uint64_t alloc_off;    /* offset of that space in the ring */
    uint64_t alloc_len;
    uint64_t submitted;    /* bytes handed to reads */
    uint64_t done_bytes;
    int done;
    int released;
};

struct loader_backend_ops;

struct loader_stream {
    struct loader_opts opts;
    struct loader_faults faults;
    int have_faults;
    const struct loader_backend_ops *be;
    void *be_state;

    struct loader_file *files;
    uint32_t n_files;
    struct loader_req_state *reqs;
    uint32_t n;

    uint8_t *ring;
    uint64_t ring_bytes;
    uint64_t head, tail;   /* next allocation; start of the oldest unreleased slice */
    uint64_t used, peak;
    uint32_t alloc_next;   /* next request to allocate/submit */
    uint32_t deliver_next; /* next request to hand to the consumer */
    uint32_t release_next; /* next request to be released */

    struct loader_io *ios; /* queue_depth of them */
    struct loader_io *free_ios;
    uint32_t inflight;

    pthread_t thread;
    int thread_started;
    pthread_mutex_t lock;
    pthread_cond_t cond_done;   /* a request completed, or an error */
    pthread_cond_t cond_space;  /* ring space was released, or stop */
    int stop;
    int error;                  /* first error, negative errno */
    struct sl_err err;

    uint64_t start_ns, end_ns;
    uint64_t bytes, reads, retries, completions;
    int all_direct;
    char note[256];
};

struct loader_backend_ops {
    enum loader_backend kind;
    int (*init)(struct loader_stream *s, struct sl_err *err);
    int (*submit)(struct loader_stream *s, struct loader_io *io);
    /* Waits for at least one completion; fills done[] (up to max) and
     * returns how many, or a negative errno. */
    int (*wait)(struct loader_stream *s, struct loader_io **done, int max);
    void (*fini)(struct loader_stream *s);
};

extern const struct loader_backend_ops loader_backend_uring;
extern const struct loader_backend_ops loader_backend_pread;

/* Pread of up to len bytes at off, retrying EINTR; bytes or -errno. */
int64_t loader_pread_once(int fd, void *buf, uint64_t len, uint64_t off);

#endif

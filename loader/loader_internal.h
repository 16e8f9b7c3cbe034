/* loader_internal.h: the stream's state, the ring's memory, and the two I/O
 * backends (io_uring, pread pool) behind one small interface. */
#ifndef SLUICE_LOADER_INTERNAL_H
#define SLUICE_LOADER_INTERNAL_H

#include <pthread.h>

#include "loader.h"

#define LOADER_ALIGN 4096u            /* O_DIRECT alignment of offsets, lengths, buffers */
#define LOADER_MAX_TRIES 1000u        /* consecutive transient failures of one read */

/* ---- ring memory (loader_ring.c) --------------------------------------------------- */

/* `bytes` of 4 KiB-aligned memory, untouched until used. With `mirror`, the
 * same pages are mapped again right after the first mapping (a memfd mapped
 * twice), so base[bytes + i] is base[i]: a range that wraps around the end is
 * contiguous. */
struct loader_ring {
    uint8_t *base;
    uint64_t bytes;
    size_t map_bytes;      /* what to munmap */
    int mirror;
};

/* 0, or -ENOMEM / the errno of a failed mapping (with want_mirror, -errno of
 * memfd_create or mmap: the caller then asks for a plain ring). */
/* A second open file description of the descriptor fd (its own file offset
 * and read-ahead state), through /proc/self/fd; flags: O_DIRECT or 0. -1 with
 * errno on failure. */
int loader_reopen_fd(int fd, int flags);

int loader_ring_init(struct loader_ring *r, uint64_t bytes, int want_mirror);
void loader_ring_fini(struct loader_ring *r);

/* ---- the stream (loader_stream.c, loader_io.c, loader_files.c) ------------------------ */

/* One read. Its buffer is inside the ring's first mapping (ring_off <
 * ring bytes, never crossing the end or a registration piece). */
struct loader_io {
    int fd;
    uint64_t off;          /* file offset */
    uint64_t ring_off;     /* buffer offset in the ring */
    uint8_t *buf;
    uint32_t len;          /* bytes still wanted */
    uint32_t rlen;         /* bytes asked for (len rounded up to 4 KiB when direct) */
    uint32_t req;          /* request index */
    uint32_t file;         /* file index */
    int direct;            /* fd is an O_DIRECT descriptor */
    int fixed;             /* went out as a read_fixed (set by the backend) */
    int dest;              /* into the request's own buffer (not the ring: never fixed) */
    uint32_t tries;        /* consecutive transient failures */
    int64_t res;           /* bytes or -errno, set on completion */
    struct loader_io *next;/* free, retry, parked lists; pread queues */
};

struct loader_file {
    char *path;            /* NULL for caller descriptors */
    int caller_fd;         /* -1 for paths */
    int fd_direct;         /* -1 if none */
    int fd_buffered;       /* -1 until needed */
    int own_direct, own_buffered; /* close them at the end */
    int warned;
};

struct loader_req_state {
    struct loader_request r;
    uint32_t file;
    uint64_t alloc_off;    /* offset of its space in the ring (0 <= off < ring bytes) */
    uint64_t alloc_len;    /* 0 until allocated */
    uint64_t submitted;    /* bytes handed to reads */
    uint64_t done_bytes;
    int read_done;         /* every byte is in */
    int done;              /* read and verified: deliverable */
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

    struct loader_ring ring;
    uint64_t piece_bytes;  /* reads never cross a multiple of this (registration pieces) */
    uint64_t head, tail;   /* next allocation; start of the oldest unreleased request */
    uint64_t used, peak;
    uint32_t alloc_next;   /* next request to allocate/submit */
    uint32_t complete_next;/* first request not completely read */
    uint32_t deliver_next; /* next request to hand to the consumer */
    uint32_t release_next; /* oldest request not yet released */

    struct loader_io *ios; /* queue_depth of them */
    struct loader_io *free_ios;
    struct loader_io *retry, *retry_tail; /* waiting to be (re)submitted */
    struct loader_io *parked;              /* injected delays */
    uint32_t inflight;     /* handed to the backend, not yet completed */
    uint32_t depth;        /* in-flight limit now (<= queue_depth; lowered on ENOMEM) */
    uint32_t min_depth;
    uint32_t ok_streak;    /* completions since the depth was last lowered */

    uint32_t *vq;          /* requests waiting for verification (FIFO) */
    uint32_t vq_head, vq_tail;

    pthread_t thread;
    int thread_started;
    pthread_mutex_t lock;
    pthread_cond_t cond_done;   /* a request became deliverable, or an error */
    pthread_cond_t cond_space;  /* ring space was released, or stop */
    int stop;
    int error;                  /* first error, negative errno */
    struct sl_err err;

    uint64_t start_ns, first_ns, end_ns;
    uint64_t bytes, reads, retries, completions, out_of_order;
    uint32_t delivered;
    int all_direct, all_fixed;
    char note[256];
};

struct loader_backend_ops {
    enum loader_backend kind;
    int (*init)(struct loader_stream *s, struct sl_err *err);
    /* Queues one read (lock held); 0, or a negative errno: -EAGAIN, -ENOMEM
     * and -EBUSY are transient (the read is retried later). */
    int (*submit)(struct loader_stream *s, struct loader_io *io);
    /* Hands queued reads to the kernel now (lock held); may be NULL. */
    void (*flush)(struct loader_stream *s);
    /* Waits (lock not held) for at least one completion; fills done[] (up to
     * max) and returns how many, or a negative errno. */
    int (*wait)(struct loader_stream *s, struct loader_io **done, int max);
    /* Waits for every read still in flight, then frees the backend. */
    void (*fini)(struct loader_stream *s);
};

extern const struct loader_backend_ops loader_backend_uring;
extern const struct loader_backend_ops loader_backend_pread;

/* Pread of up to len bytes at off, retrying EINTR; bytes or -errno. */
int64_t loader_pread_once(int fd, void *buf, uint64_t len, uint64_t off);

/* Records a warning (lock held or not yet shared): the note, and the
 * caller's callback. */
void loader_warn(struct loader_stream *s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* ---- shared between the stream's files ------------------------------------------- */

/* loader_files.c: a file's name for messages; its buffered descriptor, opened
 * on first need (-1 if impossible); the index of a request's file, opened on
 * first sight (negative errno with err set on failure); the choice of files
 * read buffered where O_DIRECT cannot help (see loader_opts.always_direct). */
const char *loader_file_name(const struct loader_file *f);
int loader_buffered_fd(struct loader_file *f);
int loader_file_index(struct loader_stream *s, const struct loader_request *r,
                      struct sl_err *err);
void loader_choose_direct(struct loader_stream *s);

/* loader_io.c: where request q's bytes are (its buffer, or its ring space);
 * the I/O thread's body (arg: the stream). */
uint8_t *loader_req_data(const struct loader_stream *s, const struct loader_req_state *q);
void *loader_io_thread(void *arg);

#endif

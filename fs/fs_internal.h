/* fs_internal.h: the pieces behind the FUSE callbacks.
 *   fs_tree.c    the node table (files and directories), built once at mount
 *   fs_slices.c  verified slice bytes: the slice store and its loader thread
 *   fs_views.c   computed files: int8 and scales views, stats.json
 *   fs_ops.c     the FUSE low-level callbacks (fs_do_<op> + thin wrappers)
 *   fs_mount.c   options, mounting, daemonizing, unmounting */
#ifndef SLUICE_FS_INTERNAL_H
#define SLUICE_FS_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <sys/types.h>
#include <time.h>

#include "format.h"
#include "fs.h"
#include "gguf.h"

/* ---- the node table (fs_tree.c) ------------------------------------------------ */

enum fs_kind {
    FS_DIR = 0,
    FS_GEN,      /* content generated at mount time (config, tokenizer, manifest) */
    FS_RANGE,    /* a byte range of one slice (a tensor, or the whole slice) */
    FS_INT8,     /* computed: a quantized tensor unpacked to int8 codes, rows x cols */
    FS_SCALES,   /* computed: its per-row float32 scales */
    FS_STATS,    /* computed on open: stats.json */
    FS_GGUF,     /* computed on read: model.gguf (gguf.h) */
};

struct fs_node {
    uint64_t ino;            /* index + 1; the root is 1 */
    uint32_t parent;         /* index of the parent directory */
    char name[48];
    enum fs_kind kind;
    uint64_t size;           /* exact, computed from the index (views too) */
    uint64_t off;            /* FS_RANGE: offset inside its slice */
    uint32_t slice;          /* FS_RANGE, FS_INT8, FS_SCALES: the slice holding the bytes */
    int32_t tensor;          /* tensor files and views; -1 otherwise */
    char *data;              /* FS_GEN */
    uint32_t first_child;    /* FS_DIR: index + 1 of the first child, 0 = none */
    uint32_t next_sibling;   /* index + 1, 0 = none */
    uint32_t n_children;     /* FS_DIR */
    atomic_uint_fast64_t bytes_served;
    atomic_uint_fast64_t reads_served;
};

struct fs_store;
struct fuse_session;

/* model.gguf's warmers (fs_gguf.c): threads converting chunks in file order
 * from its open on, up to `window` bytes past the furthest sequential read. */
struct fs_warm {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t th[8];
    uint32_t n_started;
    int stop;
    int active;              /* an open started a pass that has not reached the end */
    int blocked;             /* the cache is full of unread chunks: wait for a read */
    uint32_t opens;          /* opens of model.gguf not yet released */
    uint64_t next;           /* the next offset to warm */
    uint64_t frontier;       /* end of the furthest read that continued the previous ones */
    uint64_t window;
    uint64_t ino;            /* model.gguf's inode, for pushing pages */
};

struct fs_state {
    struct fs_options opts;
    char container[4096];    /* absolute path */
    struct format_reader *r;
    struct fs_node *nodes;
    uint32_t n_nodes, cap_nodes;
    struct fs_store *store;
    uint64_t mount_ns;
    struct timespec mtime;   /* the container's, shown as every file's times */
    int log_fd;              /* -1: none */
    struct gguf_view *gguf;  /* model.gguf */
    struct gguf_source gguf_src; /* verified slices from the store, for the view */
    atomic_uint gguf_logged; /* failures logged so far (at most a few) */
    struct fs_warm warm;
    struct fuse_session *se; /* for notifications (pushing model.gguf's pages) */
};

/* Builds the node table; fills err on failure. */
int fs_tree_build(struct fs_state *s, struct sl_err *err);
void fs_tree_free(struct fs_state *s);

/* Child of dir `parent` (index) named `name`, or NULL. */
struct fs_node *fs_tree_lookup(struct fs_state *s, uint32_t parent, const char *name);

/* The directory name of a slice ("embed", "layer.007", "head"). */
void fs_slice_dirname(const struct format_slice_info *si, char *buf, size_t n);

/* A log line: to the log file if any, stderr (in the foreground), syslog. */
void fs_log(struct fs_state *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- verified slice bytes (fs_slices.c) ------------------------------------------ */

/* A reader's hold on a verified slice. Memory slices: `data` is the store's
 * copy (the very bytes that were hashed) and stays valid until
 * fs_slice_release. Page-cache slices (larger than half the budget, or
 * -o pagecache): `data` points into a read-only mapping of the container and
 * `fd`/`pos` name the same bytes for splicing; `mapped` is 1. */
struct fs_pin {
    const uint8_t *data;
    int fd;
    off_t pos;               /* offset of the slice in the container */
    int mapped;
    uint32_t slice;
    int held;                /* 1: release must unpin a memory slot */
};

struct fs_store_stats {
    uint64_t loads;          /* slices read from the container into memory */
    uint64_t bytes_read;     /* bytes read from the container by the store */
    uint64_t prefetches;     /* loads started ahead of a reader */
    uint64_t prefetch_hits;  /* first accesses that found the slice loaded or loading */
    uint64_t waits;          /* acquires that waited for a load */
    uint64_t evictions;
    uint64_t verify_failures;
    uint64_t resident;       /* bytes of memory holding slices now */
    uint64_t budget;
    int direct;              /* 1: the store reads with O_DIRECT */
};

/* Creates the store for s->r (opens the container again, with O_DIRECT where
 * allowed, maps it, sizes the budget) without starting its thread. */
int fs_store_create(struct fs_state *s, struct fs_store **out, struct sl_err *err);
/* Starts the loader thread (after daemonizing: fork keeps one thread). */
int fs_store_start(struct fs_store *st, struct sl_err *err);
void fs_store_destroy(struct fs_store *st); /* NULL ok; joins the thread */

/* Waits until slice i is verified and pins it: 0, or -EIO (corrupt slice,
 * read error, container changed; logged once), -ENOMEM. Any thread. */
int fs_slice_acquire(struct fs_state *s, uint32_t i, struct fs_pin *pin);
void fs_slice_release(struct fs_state *s, struct fs_pin *pin);

/* Runs fn(arg) with SIGBUS (a truncated container under the mapping) turned
 * into -EIO. fn must not take locks or allocate. */
int fs_guarded(int (*fn)(void *), void *arg);

/* For page-cache slices: -EIO if the container's size or mtime changed since
 * mount (its bytes may no longer be the verified ones). */
int fs_store_check_unchanged(struct fs_state *s);

void fs_store_get_stats(struct fs_store *st, struct fs_store_stats *out);

/* Queues slice i (and the `prefetch` after it) to be read ahead, as a
 * prefetch, if it is neither loaded nor loading: for a reader that is about
 * to start there (model.gguf's open). */
void fs_store_prefetch(struct fs_store *st, uint32_t i);

/* ---- computed views (fs_views.c) -------------------------------------------------- */

/* Per-open state of a computed file. */
struct fs_view;

/* Validates and prepares a view at open (int8/scales: the tensor's slice is
 * verified and the tensor parsed; stats: a snapshot is taken). */
int fs_view_open(struct fs_state *s, const struct fs_node *n, struct fs_view **out);
void fs_view_close(struct fs_view *v); /* NULL ok */

/* Fills buf with bytes [off, off + size) of the view (clipped at its end) and
 * returns the count, or -errno. */
ssize_t fs_view_read(struct fs_state *s, struct fs_view *v, char *buf, size_t size, uint64_t off);

uint64_t fs_view_size(const struct fs_view *v);

/* stats.json as of now (malloc'ed; *len = fs_stats_size), NULL when out of
 * memory. Its size is fixed for the mount: the JSON is padded with spaces. */
char *fs_stats_json(struct fs_state *s, size_t *len);
uint64_t fs_stats_size(const struct fs_state *s);

/* ---- model.gguf (fs_gguf.c) ----------------------------------------------------------- */

/* Creates s->gguf from the options and sets up its slice source (the store). */
int fs_gguf_create(struct fs_state *s, struct sl_err *err);
/* Starts the warmer threads (after daemonizing), idle until an open; a
 * no-op without model.gguf, its cache or -o gguf_warm. */
int fs_gguf_start(struct fs_state *s, struct sl_err *err);
/* Stops and joins them (safe if never started): 0, or -ETIMEDOUT when one
 * stays blocked (pushing onto a page whose read the stopped request loop
 * will never answer: only after a signal); then nothing it may touch (the
 * session, view, store) may be freed. */
int fs_gguf_stop(struct fs_state *s);
/* model.gguf (inode ino) was opened (a warm pass starts from its beginning)
 * / released. */
void fs_gguf_opened(struct fs_state *s, uint64_t ino);
void fs_gguf_released(struct fs_state *s);
/* Bytes [off, off + size) of model.gguf into buf: the count, or -errno
 * (-EIO for a corrupt slice; logged). */
ssize_t fs_gguf_read(struct fs_state *s, char *buf, size_t size, uint64_t off);

/* ---- the callback table (fs_ops.c) ------------------------------------------------- */

struct fuse_lowlevel_ops;
const struct fuse_lowlevel_ops *fs_ops_table(void);

#endif

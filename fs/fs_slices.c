/* fs_slices.c: verified slice bytes for the FUSE callbacks.
 *
 * Every slice is read whole and hashed before any of its bytes is served.
 * One loader thread does all the container reads, in queue order: slices a
 * reader waits for first, then prefetches (the next `prefetch` slices after
 * the one a reader just started), so a sequential reader finds slice i+1
 * loaded or loading while it consumes slice i and the disk never idles.
 *
 * Memory slices (length <= budget / 2): read with O_DIRECT (no second copy
 * in the page cache) into a buffer of the store, hashed, and served from that
 * buffer, so the served bytes are exactly the hashed ones. Buffers are
 * evicted least recently used when the budget is full; a slice read again is
 * hashed again. Page-cache slices (larger, or -o pagecache): hashed through a
 * read-only mapping of the container, then served by splicing from the
 * container's descriptor; the verdict is cached (the pages the hash read are
 * the ones served unless the kernel drops them and reads the disk again).
 *
 * Locking: one mutex (mu) guards the slot table, the queue and the counters;
 * `changed` is broadcast whenever a slot changes state or loses its last pin;
 * `work` wakes the loader. Reads and hashing run without the lock. */

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <setjmp.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fs_internal.h"

enum slot_state {
    SLOT_IDLE = 0,     /* not in memory (or, page-cache slices: not verified yet) */
    SLOT_QUEUED,       /* waiting for the loader */
    SLOT_LOADING,      /* the loader reads and hashes it now */
    SLOT_READY,        /* verified: memory slices hold the bytes */
};

struct fs_slot {
    enum slot_state state;
    int mem;           /* 1: memory slice, 0: page-cache slice */
    int demand;        /* queued: a reader waits for it (else a prefetch) */
    int by_prefetch;   /* queued by a prefetch and not yet touched */
    int touched;       /* acquired since it became ready */
    int bad;           /* failed verification: every acquire gives -EIO */
    int fail;          /* a load that could not run (-ENOMEM), for the waiting reader */
    uint64_t seq;      /* queue order */
    uint64_t tick;     /* last acquire (LRU) */
    uint32_t pins;
    uint32_t waiters;  /* readers waiting in acquire: a slot they wait for is not evicted */
    uint8_t *buf;      /* memory slices when ready/loading */
    uint64_t cap;      /* its capacity (whole huge pages) */
};

struct fs_store {
    struct fs_state *s;
    const struct format_reader *r;
    uint32_t n;
    struct fs_slot *slots;
    int fd;            /* reads of memory slices: O_DIRECT where allowed */
    int fd_splice;     /* buffered descriptor for page-cache slices */
    const uint8_t *map;
    uint64_t map_len;
    struct stat st0;   /* the container at mount */
    uint64_t budget, resident;
    uint32_t prefetch;
    pthread_mutex_t mu;
    pthread_cond_t changed, work;
    pthread_t thread;
    int started, stop;
    uint64_t seq, tick;
    struct fs_store_stats stats;
};

/* ---- SIGBUS guard ------------------------------------------------------------------ */

static _Thread_local sigjmp_buf *guard_env;

static void on_sigbus(int sig, siginfo_t *si, void *ctx)
{
    (void)si, (void)ctx;
    if (guard_env)
        siglongjmp(*guard_env, 1);
    signal(sig, SIG_DFL);
    raise(sig);
}

int fs_guarded(int (*fn)(void *), void *arg)
{
    sigjmp_buf env;
    if (sigsetjmp(env, 1)) {
        guard_env = NULL;
        return -EIO;
    }
    guard_env = &env;
    int ret = fn(arg);
    guard_env = NULL;
    return ret;
}

/* ---- buffers ------------------------------------------------------------------------ */

/* Slice buffers of 2 MiB and more are anonymous mappings in whole huge
 * pages: a fresh buffer faults 512 times fewer, and pinning it for each
 * reply (the kernel copies FUSE replies from pinned user pages) walks one
 * entry per 2 MiB. Smaller ones stay in 4 KiB pages. */
#define HUGE (2u << 20)

static uint64_t buf_cap(uint64_t len)
{
    return sl_align_up(len, len >= HUGE ? HUGE : 4096);
}

static uint8_t *buf_alloc(uint64_t cap)
{
    if (cap < HUGE) {
        uint8_t *p = mmap(NULL, (size_t)cap, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        return p == MAP_FAILED ? NULL : p;
    }
    /* over-map by one huge page to align the start, then trim */
    size_t map = (size_t)cap + HUGE;
    uint8_t *p = mmap(NULL, map, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    uint8_t *a = (uint8_t *)sl_align_up((uint64_t)(uintptr_t)p, HUGE);
    if (a > p)
        munmap(p, (size_t)(a - p));
    if (a + cap < p + map)
        munmap(a + cap, (size_t)(p + map - (a + cap)));
    madvise(a, (size_t)cap, MADV_HUGEPAGE);
    return a;
}

static void buf_free(uint8_t *p, uint64_t cap)
{
    if (p)
        munmap(p, (size_t)cap);
}

/* ---- creation ------------------------------------------------------------------------ */

int fs_store_create(struct fs_state *s, struct fs_store **out, struct sl_err *err)
{
    struct fs_store *st = calloc(1, sizeof *st);
    if (!st) {
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    int ret;
    st->s = s;
    st->r = s->r;
    st->n = format_reader_n_slices(s->r);
    st->fd = st->fd_splice = -1;
    st->map = MAP_FAILED;
    pthread_mutex_init(&st->mu, NULL);
    pthread_cond_init(&st->changed, NULL);
    pthread_cond_init(&st->work, NULL);
    st->slots = calloc(st->n ? st->n : 1, sizeof *st->slots);
    if (!st->slots) {
        ret = -ENOMEM;
        sl_err_set(err, "out of memory");
        goto fail;
    }
    st->fd_splice = open(s->container, O_RDONLY | O_CLOEXEC);
    if (st->fd_splice < 0 || fstat(st->fd_splice, &st->st0) < 0) {
        ret = -errno;
        sl_err_set(err, "%s: %s", s->container, strerror(errno));
        goto fail;
    }
    posix_fadvise(st->fd_splice, 0, 0, POSIX_FADV_SEQUENTIAL);
    st->fd = s->opts.store_direct ? open(s->container, O_RDONLY | O_CLOEXEC | O_DIRECT) : -1;
    st->stats.direct = st->fd >= 0;
    if (st->fd < 0)
        st->fd = st->fd_splice; /* tmpfs and friends: buffered reads */
    st->map_len = (uint64_t)st->st0.st_size;
    st->map = mmap(NULL, st->map_len, PROT_READ, MAP_SHARED, st->fd_splice, 0);
    if (st->map == MAP_FAILED) {
        ret = -errno;
        sl_err_set(err, "%s: cannot map the container: %s", s->container, strerror(errno));
        goto fail;
    }

    /* budget: room for the slice being served, the one loading and one more */
    uint64_t largest_layer = 0, largest = 0;
    for (uint32_t i = 0; i < st->n; i++) {
        const struct format_slice_info *si = format_reader_slice(s->r, i);
        if (si->kind == FORMAT_SLICE_LAYER && buf_cap(si->length) > largest_layer)
            largest_layer = buf_cap(si->length);
        if (buf_cap(si->length) > largest)
            largest = buf_cap(si->length);
    }
    st->budget = (uint64_t)s->opts.cache_mb << 20;
    if (!st->budget) {
        /* three of the largest slices, unless those are embedding or head
         * slices much larger than a layer (they then go the page-cache way) */
        st->budget = 3 * (largest <= 2 * largest_layer ? largest : largest_layer);
        if (st->budget < (256ull << 20))
            st->budget = 256ull << 20;
    }
    st->stats.budget = st->budget;
    st->prefetch = s->opts.prefetch;
    for (uint32_t i = 0; i < st->n; i++)
        st->slots[i].mem = !s->opts.pagecache &&
                           buf_cap(format_reader_slice(s->r, i)->length) <= st->budget / 2;

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, NULL);
    *out = st;
    return 0;
fail:
    fs_store_destroy(st);
    return ret;
}

void fs_store_destroy(struct fs_store *st)
{
    if (!st)
        return;
    if (st->started) {
        pthread_mutex_lock(&st->mu);
        st->stop = 1;
        pthread_cond_broadcast(&st->work);
        pthread_cond_broadcast(&st->changed);
        pthread_mutex_unlock(&st->mu);
        pthread_join(st->thread, NULL);
    }
    for (uint32_t i = 0; st->slots && i < st->n; i++)
        buf_free(st->slots[i].buf, st->slots[i].cap);
    free(st->slots);
    if (st->map != MAP_FAILED)
        munmap((void *)st->map, st->map_len);
    if (st->fd >= 0 && st->fd != st->fd_splice)
        close(st->fd);
    if (st->fd_splice >= 0)
        close(st->fd_splice);
    pthread_cond_destroy(&st->work);
    pthread_cond_destroy(&st->changed);
    pthread_mutex_destroy(&st->mu);
    free(st);
}

/* ---- loading --------------------------------------------------------------------------- */

/* Reads len bytes at off into buf (memory slices). Chunks of 16 MiB: one
 * large request at a time keeps a throttled disk at its limit. */
static int read_range(struct fs_store *st, uint8_t *buf, uint64_t len, uint64_t off)
{
    uint64_t done = 0;
    while (done < len) {
        size_t want = len - done > (16u << 20) ? (16u << 20) : (size_t)(len - done);
        ssize_t k = pread(st->fd, buf + done, want, (off_t)(off + done));
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && errno == EINVAL && st->fd != st->fd_splice) {
            /* O_DIRECT refused at read time: buffered from now on */
            close(st->fd);
            st->fd = st->fd_splice;
            st->stats.direct = 0;
            continue;
        }
        if (k < 0)
            return -errno;
        if (k == 0)
            return -ENODATA; /* the container is shorter than at mount */
        done += (uint64_t)k;
    }
    return 0;
}

struct verify_arg {
    const struct format_reader *r;
    uint32_t slice;
    const uint8_t *data;
    struct sl_err *err;
};

static int verify_fn(void *p)
{
    struct verify_arg *a = p;
    return format_slice_verify(a->r, a->slice, a->data, a->err);
}

/* Reads (memory) or pages in (page cache) slice i and hashes it; 0 or -EIO
 * with err filled. Runs without the lock. */
static int load_slice(struct fs_store *st, uint32_t i, uint8_t *buf, struct sl_err *err)
{
    const struct format_slice_info *si = format_reader_slice(st->r, i);
    if (si->offset + si->length > st->map_len) {
        sl_err_set(err, "%s: slice %u lies beyond the end of the file", st->s->container, i);
        return -EIO;
    }
    struct verify_arg a = {st->r, i, buf, err};
    if (buf) {
        int ret = read_range(st, buf, si->length, si->offset);
        if (ret < 0) {
            sl_err_set(err, "%s: reading slice %u at offset %" PRIu64 ": %s", st->s->container, i,
                       si->offset, ret == -ENODATA ? "the file is truncated" : strerror(-ret));
            return -EIO;
        }
        return format_slice_verify(st->r, i, buf, err) < 0 ? -EIO : 0;
    }
    int ret = fs_store_check_unchanged(st->s);
    if (ret < 0) {
        sl_err_set(err, "%s changed while mounted (size or mtime): refusing to serve it",
                   st->s->container);
        return ret;
    }
    a.data = st->map + si->offset;
    madvise((void *)((uintptr_t)a.data & ~(uintptr_t)4095), si->length, MADV_SEQUENTIAL);
    ret = fs_guarded(verify_fn, &a);
    if (ret < 0 && !err->msg[0])
        sl_err_set(err, "%s: slice %u: the file shrank while it was read", st->s->container, i);
    return ret < 0 ? -EIO : 0;
}

/* Under mu: the next job, demand before prefetch, each in queue order. */
static struct fs_slot *pick_job(struct fs_store *st, uint32_t *idx)
{
    struct fs_slot *best = NULL;
    for (uint32_t i = 0; i < st->n; i++) {
        struct fs_slot *sl = &st->slots[i];
        if (sl->state != SLOT_QUEUED)
            continue;
        if (!best || sl->demand > best->demand ||
            (sl->demand == best->demand && sl->seq < best->seq)) {
            best = sl;
            *idx = i;
        }
    }
    return best;
}

/* Under mu: a buffer of capacity >= cap. Evicts unpinned ready memory slots,
 * least recently used first; a prefetch evicts only slots a reader has
 * already touched (never another prefetch). A victim's buffer that is big
 * enough is reused as it is (no fresh pages to fault and zero). Returns the
 * buffer and its capacity, or NULL when nothing can be evicted now. */
static uint8_t *make_room(struct fs_store *st, uint64_t cap, int demand, uint64_t *got)
{
    while (st->resident + cap > st->budget) {
        struct fs_slot *victim = NULL;
        for (uint32_t i = 0; i < st->n; i++) {
            struct fs_slot *sl = &st->slots[i];
            if (sl->state != SLOT_READY || !sl->mem || sl->pins || sl->waiters ||
                (!demand && !sl->touched))
                continue;
            if (!victim || sl->tick < victim->tick)
                victim = sl;
        }
        if (!victim)
            return NULL;
        uint8_t *b = victim->buf;
        uint64_t vcap = victim->cap;
        victim->buf = NULL;
        victim->cap = 0;
        victim->state = SLOT_IDLE;
        victim->touched = 0;
        st->stats.evictions++;
        if (vcap >= cap) {
            *got = vcap; /* reuse: resident unchanged */
            return b;
        }
        buf_free(b, vcap);
        st->resident -= vcap;
    }
    uint8_t *b = buf_alloc(cap);
    if (b) {
        st->resident += cap;
        *got = cap;
    }
    return b;
}

static void *loader_main(void *p)
{
    struct fs_store *st = p;
    pthread_mutex_lock(&st->mu);
    while (!st->stop) {
        uint32_t i = 0;
        struct fs_slot *sl = pick_job(st, &i);
        if (!sl) {
            pthread_cond_wait(&st->work, &st->mu);
            continue;
        }
        uint64_t len = format_reader_slice(st->r, i)->length;
        uint8_t *buf = NULL;
        uint64_t cap = 0;
        if (sl->mem) {
            buf = make_room(st, buf_cap(len), sl->demand, &cap);
            if (!buf && !sl->demand) {
                sl->state = SLOT_IDLE; /* no room for a prefetch: drop it */
                sl->by_prefetch = 0;
                pthread_cond_broadcast(&st->changed);
                continue;
            }
            if (!buf) {
                /* a reader waits: if pinned slots may free memory, wait for
                 * their pins to drop and try again; else give up */
                int pinned = 0;
                for (uint32_t k = 0; k < st->n; k++)
                    pinned |= st->slots[k].pins > 0 || st->slots[k].waiters > 0;
                if (pinned) {
                    pthread_cond_wait(&st->changed, &st->mu);
                } else {
                    sl->state = SLOT_IDLE;
                    sl->fail = -ENOMEM;
                    pthread_cond_broadcast(&st->changed);
                }
                continue;
            }
        }
        sl->state = SLOT_LOADING;
        if (!sl->demand)
            st->stats.prefetches++;
        pthread_mutex_unlock(&st->mu);

        struct sl_err err = {{0}};
        int ret = load_slice(st, i, buf, &err);
        if (ret < 0)
            fs_log(st->s, "%s", err.msg);

        pthread_mutex_lock(&st->mu);
        if (ret == 0) {
            sl->state = SLOT_READY;
            sl->buf = buf;
            sl->cap = cap;
            sl->touched = 0;
            if (buf) {
                st->stats.loads++;
                st->stats.bytes_read += len;
            }
        } else {
            sl->state = SLOT_IDLE;
            sl->bad = 1;
            st->stats.verify_failures++;
            if (buf) {
                buf_free(buf, cap);
                st->resident -= cap;
            }
        }
        pthread_cond_broadcast(&st->changed);
    }
    pthread_mutex_unlock(&st->mu);
    return NULL;
}

int fs_store_start(struct fs_store *st, struct sl_err *err)
{
    int ret = pthread_create(&st->thread, NULL, loader_main, st);
    if (ret) {
        sl_err_set(err, "cannot start the loader thread: %s", strerror(ret));
        return -ret;
    }
    st->started = 1;
    return 0;
}

/* ---- acquiring ------------------------------------------------------------------------- */

/* Under mu: queues slice i. */
static void enqueue(struct fs_store *st, uint32_t i, int demand)
{
    struct fs_slot *sl = &st->slots[i];
    sl->state = SLOT_QUEUED;
    sl->demand = demand;
    sl->by_prefetch = !demand;
    sl->seq = ++st->seq;
    pthread_cond_signal(&st->work);
}

/* Under mu: a reader started slice i; queue the next ones. */
static void schedule_prefetch(struct fs_store *st, uint32_t i)
{
    for (uint32_t k = 1; k <= st->prefetch && i + k < st->n; k++) {
        struct fs_slot *sl = &st->slots[i + k];
        if (sl->state == SLOT_IDLE && !sl->bad)
            enqueue(st, i + k, 0);
    }
}

void fs_store_prefetch(struct fs_store *st, uint32_t i)
{
    if (i >= st->n)
        return;
    pthread_mutex_lock(&st->mu);
    struct fs_slot *sl = &st->slots[i];
    if (sl->state == SLOT_IDLE && !sl->bad && !st->stop) {
        enqueue(st, i, 0);
        schedule_prefetch(st, i);
    }
    pthread_mutex_unlock(&st->mu);
}

int fs_slice_acquire(struct fs_state *s, uint32_t i, struct fs_pin *pin)
{
    struct fs_store *st = s->store;
    memset(pin, 0, sizeof *pin);
    if (i >= st->n)
        return -EINVAL;
    struct fs_slot *sl = &st->slots[i];
    int waited = 0;
    pthread_mutex_lock(&st->mu);
    for (;;) {
        if (sl->bad || st->stop) {
            pthread_mutex_unlock(&st->mu);
            return -EIO;
        }
        if (sl->state == SLOT_READY)
            break;
        if (sl->fail && waited) {
            int ret = sl->fail;
            sl->fail = 0;
            pthread_mutex_unlock(&st->mu);
            return ret;
        }
        if (sl->state == SLOT_IDLE) {
            sl->fail = 0;
            enqueue(st, i, 1);
            schedule_prefetch(st, i);
        } else if (sl->state == SLOT_QUEUED && !sl->demand) {
            sl->demand = 1; /* a prefetch someone now waits for: first in line */
        }
        if (!waited)
            st->stats.waits++;
        waited = 1;
        sl->waiters++;
        pthread_cond_wait(&st->changed, &st->mu);
        sl->waiters--;
    }
    if (!sl->touched) {
        sl->touched = 1;
        if (sl->by_prefetch)
            st->stats.prefetch_hits++;
        sl->by_prefetch = 0;
        schedule_prefetch(st, i);
    }
    sl->tick = ++st->tick;
    const struct format_slice_info *si = format_reader_slice(st->r, i);
    pin->slice = i;
    pin->fd = st->fd_splice;
    pin->pos = (off_t)si->offset;
    if (sl->mem) {
        sl->pins++;
        pin->held = 1;
        pin->data = sl->buf;
    } else {
        pin->mapped = 1;
        pin->data = st->map + si->offset;
    }
    pthread_mutex_unlock(&st->mu);
    if (pin->mapped && fs_store_check_unchanged(s) < 0) {
        fs_log(s, "%s changed while mounted (size or mtime): refusing to serve it", s->container);
        memset(pin, 0, sizeof *pin);
        return -EIO;
    }
    return 0;
}

void fs_slice_release(struct fs_state *s, struct fs_pin *pin)
{
    if (!pin->held)
        return;
    struct fs_store *st = s->store;
    pthread_mutex_lock(&st->mu);
    if (--st->slots[pin->slice].pins == 0)
        pthread_cond_broadcast(&st->changed);
    pthread_mutex_unlock(&st->mu);
    pin->held = 0;
}

int fs_store_check_unchanged(struct fs_state *s)
{
    struct fs_store *st = s->store;
    struct stat now;
    if (fstat(st->fd_splice, &now) < 0)
        return -EIO;
    if (now.st_size != st->st0.st_size || now.st_mtim.tv_sec != st->st0.st_mtim.tv_sec ||
        now.st_mtim.tv_nsec != st->st0.st_mtim.tv_nsec)
        return -EIO;
    return 0;
}

void fs_store_get_stats(struct fs_store *st, struct fs_store_stats *out)
{
    pthread_mutex_lock(&st->mu);
    *out = st->stats;
    out->resident = st->resident;
    pthread_mutex_unlock(&st->mu);
}

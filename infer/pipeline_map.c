/* pipeline_map.c: packed residency's slices from the page cache.
 *
 * Packed residency keeps every slice it reads for decoding. Read with
 * O_DIRECT into memory of the model's own, each of those pages is fresh
 * anonymous memory that the kernel zeroes before the read overwrites it: on
 * the llama3-8b shape (5 GB) that zeroing cost the loader's thread 6.7 s of
 * CPU in a 31 s cold start, beside the prefill's compute on 2 cores
 * (docs/BENCHMARKS.md, issue 22, sixth session). Mapped from the page cache
 * instead, the pages the disk fills are the pages the model keeps: nothing
 * is zeroed and nothing copied. A read-ahead thread populates the slices
 * in order up to a window past the one the driver waits for (the reads are
 * charged to this process as O_DIRECT's were), and the driver thread
 * populates the slice's page table entries (MADV_POPULATE_READ), which
 * waits for its reads; a read error then comes back as an error here, not
 * as a SIGBUS in a compute thread. The driver hashes the slice piece by
 * piece as its pages come in (its VERIFY task only decodes the norms), and
 * once all of it matched, the slice has arrived.
 *
 * What the hash cannot cover: the pages stay the file's, and the kernel may
 * drop them under memory pressure and read them again later, during the
 * prefill or decode. So the file must not change while the model is loaded:
 * truncated by another process, or failing to read at that point, it gives a
 * SIGBUS in whichever thread touches the page; rewritten in place, it gives
 * bytes that were never verified. Sluice's own writers replace a file by
 * rename, which leaves a mapped file intact; where a file may change under
 * the model, infer_pipeline_opts.slices_read (O_DIRECT into the model's own
 * memory) is the safe path.
 *
 * The mapping is shared and read-only; the model unmaps it
 * (infer_model_destroy). A file that cannot be mapped, or a kernel without
 * MADV_POPULATE_READ (before Linux 5.14), gets the O_DIRECT path. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "pipeline.h"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 /* linux/mman.h, Linux 5.14 */
#endif

/* How far past the slice it waits for the driver's reads run ahead: the
 * ring's size, at least 256 MiB (0.3 s at 800 MB/s). The driver hashes each
 * slice as it arrives, the first touch of its pages, which in a VM costs
 * up to 0.4 s of CPU per 137 MB slice under load: the disk must not wait for
 * that. The pages are the model's own in packed residency; nothing is read
 * that the prefill does not need. */
static uint64_t map_window(const struct pl *p)
{
    uint64_t w = p->o->ring_bytes;
    return w > (256u << 20) ? w : (256u << 20);
}

int pl_map_open(struct pl *p)
{
    uint64_t len = format_reader_file_size(p->r);
    if (!len || len > SIZE_MAX)
        return -EINVAL;
    p->slice_ok = sl_calloc(format_reader_n_slices(p->r) + 1, 1);
    if (!p->slice_ok)
        return -ENOMEM;
    void *m = mmap(NULL, (size_t)len, PROT_READ, MAP_SHARED, format_reader_fd(p->r), 0);
    if (m == MAP_FAILED) {
        int e = errno;
        free(p->slice_ok);
        p->slice_ok = NULL;
        return -e;
    }
    /* while the slices come in: the fault path reads ahead asynchronously
     * (read-ahead markers), so the read-ahead thread's populate streams;
     * normal again once they are in (pl_map_feed). The file's read-ahead
     * window doubled too (POSIX_FADV_SEQUENTIAL: twice the device's
     * read_ahead_kb, 16 MiB here, for the faults and the WILLNEED below):
     * the 8 MiB windows left the throttled disk short of requests; 128-token
     * cold TTFT median 0.877 -> 0.829 s, the load 0.848 -> 0.804 s
     * (docs/BENCHMARKS.md, eleventh session, y22c) */
    (void)madvise(m, (size_t)len, MADV_SEQUENTIAL);
    (void)posix_fadvise(format_reader_fd(p->r), 0, 0, POSIX_FADV_SEQUENTIAL); /* advice */
    /* the reads start now, while the caller builds the graph (as the
     * loader stream's do), at the first layer's slice where the embedding
     * is untied: its slice, before the layers', is not read for the prompt
     * (its rows are read on their own, pl_embed_rows_ask); pl_map_feed advises
     * on from here */
    uint64_t start = len;
    for (uint32_t s = 0; s < format_reader_n_slices(p->r) && !p->c->tied_embedding; s++) {
        const struct format_slice_info *si = format_reader_slice(p->r, s);
        if (si->kind == FORMAT_SLICE_LAYER && si->offset < start)
            start = si->offset;
    }
    if (start == len)
        start = 0;
    /* does this kernel populate (and can it read the file)? Probed at the
     * file's first page, which the reader's header read has just brought
     * in (with random advice: no read-ahead mark, docs/BENCHMARKS.md,
     * fifteenth session, f22), so the probe waits for no disk read; a probe
     * at the first layer's page would hold the setup until that read
     * completes. After the advice: on a miss the fault reads ahead from the
     * page instead of around it */
    size_t probe = len < 4096 ? (size_t)len : 4096;
    if (madvise(m, probe, MADV_POPULATE_READ) < 0) {
        int e = errno;
        (void)posix_fadvise(format_reader_fd(p->r), 0, 0, POSIX_FADV_NORMAL); /* advice */
        munmap(m, (size_t)len);
        free(p->slice_ok);
        p->slice_ok = NULL;
        return -e;
    }
    p->m->slices = m;
    p->m->slices_mapped = (size_t)len;
    uint64_t window = map_window(p);
    p->ra_end = window < len - start ? start + window : len;
    (void)posix_fadvise(format_reader_fd(p->r), (off_t)start, (off_t)(p->ra_end - start),
                        POSIX_FADV_WILLNEED);
    return 0;
}

/* Bytes [off, off + len) of slice s read (waiting for them) and mapped. */
static int populate_range(struct pl *p, uint32_t s, uint64_t off, uint64_t len, struct sl_err *err)
{
    const struct format_slice_info *si = format_reader_slice(p->r, s);
    if (!len)
        return 0;
    uint8_t *base = p->m->slices;
    uintptr_t lo = (uintptr_t)(base + si->offset + off) & ~(uintptr_t)4095;
    uintptr_t hi = (uintptr_t)(base + si->offset + off + len);
    /* EINTR: interrupted by a signal, whatever was populated stays; again */
    int ret;
    do
        ret = madvise((void *)lo, hi - lo, MADV_POPULATE_READ);
    while (ret < 0 && errno == EINTR);
    if (ret < 0) {
        int e = errno;
        sl_err_set(err, "%s: cannot read slice %u (%" PRIu64 " bytes at %" PRIu64 "): %s",
                   format_reader_path(p->r), s, si->length, si->offset, strerror(e));
        return e == EFAULT ? -EIO : -e; /* EFAULT: a page could not be read */
    }
    return 0;
}

/* Slice s's pages read (waiting for them) and mapped. */
int pl_map_populate(struct pl *p, uint32_t s, struct sl_err *err)
{
    return populate_range(p, s, 0, format_reader_slice(p->r, s)->length, err);
}

/* The driver's step: slice s read and hashed in pieces of hash_step, each
 * hashed as soon as its pages are in, while the disk reads the next ones;
 * hashed after the whole slice instead, the last slice's hash (the 41 MB
 * head slice on the TinyLlama shape: 5-17 ms) ran after the last weight
 * byte, on the first token's path. The pieces hash to the slice's checksum
 * (format_hash); the slice is only reported (pl_arrived) once all of it
 * matched and validated, so a corrupt slice still fails the run before any
 * task reads it. `first` is called once the slice is wholly read (before its
 * last piece's hash). */
static int populate_hashed(struct pl *p, uint32_t s, struct format_hash *h,
                           void (*first)(void *), void *arg, struct sl_err *err)
{
    const struct format_slice_info *si = format_reader_slice(p->r, s);
    const uint64_t step = p->o->hash_step ? sl_align_up(p->o->hash_step, 4096) : (2u << 20);
    const uint8_t *data = (const uint8_t *)p->m->slices + si->offset;
    format_hash_reset(h);
    uint64_t off = 0;
    do { /* once for an empty slice */
        uint64_t n = si->length - off < step ? si->length - off : step;
        int ret = populate_range(p, s, off, n, err);
        if (ret < 0)
            return ret;
        if (off + n == si->length) {
            if (s < PL_MAX_SLICES)
                p->read_events[s] = sl_now_ns();
            if (first)
                first(arg);
        }
        /* the first read of these pages, the costly one where memory the
         * guest has not touched faults in the hypervisor (docs/BENCHMARKS.md,
         * issue 22, sixth session): here, not on a CPU worker, whose VERIFY
         * task only decodes the norms; this thread would only wait for the
         * disk */
        format_hash_update(h, data + off, (size_t)n);
        off += n;
    } while (off < si->length);
    return format_slice_verify_sum(p->r, s, data, format_hash_digest(h), err);
}

/* The read-ahead thread: populates the slices in `order` ahead of the
 * driver, at most the window past the slice the driver waits for, so that
 * the disk keeps reading while the driver hashes. Read-ahead advice cannot
 * do this: one POSIX_FADV_WILLNEED reads no more than the device's read-ahead
 * size (force_page_cache_ra; 8 MiB here, the rest of a 137 MB slice was read
 * by the driver's own populate while the disk idled during each hash), and
 * advice in steps of that size gets the reads going but fills the page
 * cache with single pages, whose mappings cost 0.3-0.4 s more to tear down
 * at exit than the large folios the fault path reads (docs/BENCHMARKS.md,
 * issue 22, seventh session). Its populate reads through the fault path
 * (the mapping advised MADV_SEQUENTIAL meanwhile, so each fault also starts
 * the next read-ahead window): large folios, and the disk streams. A
 * failure here only means the driver's own populate reads the slice (and
 * reports the error). */
struct prefetch {
    struct pl *p;
    const uint32_t *order;
    uint32_t n, cur; /* cur: the slice (index in order) the driver waits for */
    int first_in;    /* the first slice is populated: until then the disk is its alone */
    uint64_t window;
    int stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

static void *prefetch_worker(void *arg)
{
    struct prefetch *f = arg;
    const struct format_reader *r = f->p->r;
    pthread_mutex_lock(&f->mu);
    /* nothing runs before the first slice is in: reading the next ones
     * beside it would halve its share of a throttled disk and delay the
     * first task by as much (the first layer's compute then outlasts the
     * next slice's read) */
    while (!f->stop && !f->first_in)
        pthread_cond_wait(&f->cv, &f->mu);
    for (uint32_t j = 0; j < f->n && !f->stop; j++) {
        const struct format_slice_info *si = format_reader_slice(r, f->order[j]);
        for (;;) {
            const struct format_slice_info *c = format_reader_slice(r, f->order[f->cur]);
            if (f->stop || j <= f->cur || si->offset + si->length <= c->offset + c->length + f->window)
                break;
            pthread_cond_wait(&f->cv, &f->mu);
        }
        if (f->stop || j <= f->cur) /* the driver populates cur itself, or is past it */
            continue;
        pthread_mutex_unlock(&f->mu);
        struct sl_err ignored;
        (void)pl_map_populate(f->p, f->order[j], &ignored);
        pthread_mutex_lock(&f->mu);
    }
    pthread_mutex_unlock(&f->mu);
    return NULL;
}

static void first_in(void *arg)
{
    struct prefetch *f = arg;
    pthread_mutex_lock(&f->mu);
    f->first_in = 1;
    pthread_cond_signal(&f->cv);
    pthread_mutex_unlock(&f->mu);
}

/* the read-ahead thread stopped and joined (where it was started) */
static void prefetch_stop(struct prefetch *f, int started, pthread_t *tid)
{
    if (!started)
        return;
    pthread_mutex_lock(&f->mu);
    f->stop = 1;
    pthread_cond_signal(&f->cv);
    pthread_mutex_unlock(&f->mu);
    pthread_join(*tid, NULL);
    pthread_cond_destroy(&f->cv);
    pthread_mutex_destroy(&f->mu);
}

int pl_map_feed(struct pl *p, struct sl_err *err)
{
    const struct format_reader *r = p->r;
    uint32_t ns = format_reader_n_slices(r), n = 0;
    uint32_t *order = sl_malloc(sizeof *order * (ns ? ns : 1));
    if (!order) {
        sl_err_set(err, "out of memory for the slice order");
        return -ENOMEM;
    }
    /* the slices the first token needs, in file order (the untied embedding
     * is populated after it, pl_embed_finish) */
    for (uint32_t i = 0; i < ns; i++)
        if (p->slice_needed[i])
            order[n++] = i;
    for (uint32_t j = 1; j < n; j++) /* insertion: the slices are nearly in order */
        for (uint32_t k = j; k > 0 && format_reader_slice(r, order[k - 1])->offset >
                                          format_reader_slice(r, order[k])->offset; k--) {
            uint32_t t = order[k];
            order[k] = order[k - 1];
            order[k - 1] = t;
        }
    struct format_hash *h = format_hash_new();
    if (!h) {
        free(order);
        sl_err_set(err, "out of memory for the slices' hash");
        return -ENOMEM;
    }
    struct prefetch f = {.p = p, .order = order, .n = n, .window = map_window(p)};
    pthread_t tid;
    int started = 0;
    if (pthread_mutex_init(&f.mu, NULL) == 0) {
        if (pthread_cond_init(&f.cv, NULL) == 0) {
            started = pthread_create(&tid, NULL, prefetch_worker, &f) == 0;
            if (!started)
                pthread_cond_destroy(&f.cv);
        }
        if (!started)
            pthread_mutex_destroy(&f.mu);
    }
    int ret = 0;
    for (uint32_t j = 0; j < n && ret == 0; j++) {
        uint32_t s = order[j];
        const struct format_slice_info *si = format_reader_slice(r, s);
        if (started) { /* the read-ahead thread may go on to the window past this slice */
            pthread_mutex_lock(&f.mu);
            f.cur = j;
            pthread_cond_signal(&f.cv);
            pthread_mutex_unlock(&f.mu);
        }
        /* the first slice read: the read-ahead thread may start (while this
         * one hashes the slice's last piece) */
        ret = populate_hashed(p, s, h, started && j == 0 ? first_in : NULL, &f, err);
        const uint8_t *data = (const uint8_t *)p->m->slices + si->offset;
        if (ret < 0)
            break;
        pthread_mutex_lock(&p->lock);
        p->slice_ok[s] = 1;
        p->slice_data[s] = data;
        p->bytes_read += si->length;
        int stop = pl_arrived(p, s) < 0 || p->stop; /* a failure sets p->stop */
        pthread_mutex_unlock(&p->lock);
        if (stop)
            break;
    }
    /* kept for decoding: not the first pages to drop under memory pressure */
    (void)madvise(p->m->slices, p->m->slices_mapped, MADV_NORMAL);
    (void)posix_fadvise(format_reader_fd(r), 0, 0, POSIX_FADV_NORMAL);
    format_hash_free(h);
    prefetch_stop(&f, started, &tid);
    free(order);
    return ret;
}

/* no_decode (the reclaim thread): layer `layer`'s matmuls are all done and
 * nothing decodes after the first token, so its slices' page table entries
 * go now, at idle priority during the prefill, rather than in the munmap
 * after the first token (on the llama3-8b shape, 1.2 M entries: 64-72 ms
 * between the first token and the exit). Only the entries go: the pages
 * stay the page cache's, and a later touch maps them again (MADV_DONTNEED on
 * a shared file mapping), so a page shared with a neighbouring slice, or a
 * reader this misses, costs a fault, never a wrong byte. The range is
 * rounded inward to whole pages all the same. */
void pl_map_release(struct pl *p, int layer)
{
    uint8_t *base = p->m->slices;
    long ps = sysconf(_SC_PAGESIZE);
    uintptr_t mask = ps > 0 ? (uintptr_t)ps - 1 : 4095;
    for (uint32_t s = 0; s < format_reader_n_slices(p->r); s++) {
        const struct format_slice_info *si = format_reader_slice(p->r, s);
        if (si->kind != FORMAT_SLICE_LAYER || si->layer != layer || !si->length)
            continue;
        uintptr_t lo = ((uintptr_t)(base + si->offset) + mask) & ~mask;
        uintptr_t hi = (uintptr_t)(base + si->offset + si->length) & ~mask;
        if (hi > lo) /* a failure leaves the entries to the munmap */
            (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
    }
}

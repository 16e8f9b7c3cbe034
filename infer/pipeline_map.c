/* pipeline_map.c: packed residency's slices from the page cache.
 *
 * Packed residency keeps every slice it reads for decoding. Read with
 * O_DIRECT into memory of the model's own, each of those pages is fresh
 * anonymous memory that the kernel zeroes before the read overwrites it: on
 * the llama3-8b shape (5 GB) that zeroing cost the loader's thread 6.7 s of
 * CPU in a 31 s cold start, beside the prefill's compute on 2 cores
 * (docs/BENCHMARKS.md, issue 22, sixth session). Mapped from the page cache
 * instead, the pages the disk fills are the pages the model keeps: nothing
 * is zeroed and nothing copied. The driver thread asks the kernel to read
 * ahead (posix_fadvise WILLNEED, a window past the slice it waits for, in
 * slice order: the reads are charged to this process as O_DIRECT's were) and
 * then populates the slice's page table entries (MADV_POPULATE_READ), which
 * waits for its reads; a read error then comes back as an error here, not
 * as a SIGBUS in a compute thread. The driver then hashes the slice (its
 * VERIFY task only decodes the norms), and the slice has arrived.
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
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include "pipeline.h"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 /* linux/mman.h, Linux 5.14 */
#endif

/* Read-ahead advice: the kernel reads at most max(the device's read-ahead,
 * its largest request) from the start of one POSIX_FADV_WILLNEED call and
 * drops the rest (force_page_cache_ra), so a range is advised in steps of
 * the device's read-ahead size (its queue's read_ahead_kb in sysfs; 128 KiB,
 * the kernel's default, where that cannot be read). Advised as one call,
 * each slice's 137 MB on the llama3-8b shape got its first 8 MiB read ahead
 * and the rest read by the populate's faults: the disk idled while the
 * slice before it was hashed (docs/BENCHMARKS.md, issue 22, seventh
 * session). */
static uint64_t advice_step(int fd)
{
    struct stat st;
    uint64_t kb = 0;
    if (fstat(fd, &st) == 0) {
        static const char *const where[] = {"/sys/dev/block/%u:%u/queue/read_ahead_kb",
                                            "/sys/dev/block/%u:%u/../queue/read_ahead_kb"};
        for (size_t i = 0; i < sizeof where / sizeof *where && !kb; i++) {
            char path[96];
            snprintf(path, sizeof path, where[i], major(st.st_dev), minor(st.st_dev));
            FILE *f = fopen(path, "re");
            if (!f)
                continue;
            unsigned long long v;
            if (fscanf(f, "%llu", &v) == 1)
                kb = v;
            fclose(f);
        }
    }
    if (kb < 128)
        kb = 128;
    return (kb < (64u << 10) ? kb : (64u << 10)) << 10;
}

/* How far past the slice it waits for the driver keeps the reads advised:
 * the ring's size, at least 256 MiB (0.3 s at 800 MB/s). The driver hashes
 * each slice after it arrives, the first touch of its pages, which in a VM
 * costs up to 0.4 s of CPU per 137 MB slice under load: the disk must not
 * wait for that. The pages are the model's own in packed residency; nothing
 * is read that the prefill does not need. */
static uint64_t map_window(const struct pl *p)
{
    uint64_t w = p->o->ring_bytes;
    return w > (256u << 20) ? w : (256u << 20);
}

static void advise_range(struct pl *p, uint64_t off, uint64_t len)
{
    int fd = format_reader_fd(p->r);
    for (uint64_t o = off; o < off + len; o += p->ra_step) {
        uint64_t n = off + len - o < p->ra_step ? off + len - o : p->ra_step;
        /* advice: a failure only means the populate reads on demand */
        (void)posix_fadvise(fd, (off_t)o, (off_t)n, POSIX_FADV_WILLNEED);
    }
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
    /* the first page: does this kernel populate (and can it read the file)? */
    if (madvise(m, len < 4096 ? (size_t)len : 4096, MADV_POPULATE_READ) < 0) {
        int e = errno;
        munmap(m, (size_t)len);
        free(p->slice_ok);
        p->slice_ok = NULL;
        return -e;
    }
    p->m->slices = m;
    p->m->slices_mapped = (size_t)len;
    /* the reads start now, while the caller builds the graph (as the
     * loader stream's do), at the first layer's slice where the embedding
     * is untied: its slice, before the layers', is not read for the prompt
     * (its rows are read on their own, pl_embed_rows); pl_map_feed advises
     * on from here */
    uint64_t start = len;
    for (uint32_t s = 0; s < format_reader_n_slices(p->r) && !p->c->tied_embedding; s++) {
        const struct format_slice_info *si = format_reader_slice(p->r, s);
        if (si->kind == FORMAT_SLICE_LAYER && si->offset < start)
            start = si->offset;
    }
    if (start == len)
        start = 0;
    uint64_t window = map_window(p);
    p->ra_end = window < len - start ? start + window : len;
    p->ra_step = advice_step(format_reader_fd(p->r));
    advise_range(p, start, p->ra_end - start);
    return 0;
}

/* Slice s's pages read (waiting for them) and mapped. */
int pl_map_populate(struct pl *p, uint32_t s, struct sl_err *err)
{
    const struct format_slice_info *si = format_reader_slice(p->r, s);
    if (!si->length)
        return 0;
    uint8_t *base = p->m->slices;
    uintptr_t lo = (uintptr_t)(base + si->offset) & ~(uintptr_t)4095;
    uintptr_t hi = (uintptr_t)(base + si->offset + si->length);
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

/* Read-ahead advice for the slices in `order` from `from` on, until the
 * advised bytes reach `until` (file offsets grow with the order here). */
static void advise(struct pl *p, const uint32_t *order, uint32_t n, uint32_t from, uint64_t until)
{
    for (uint32_t j = from; j < n && p->ra_end < until; j++) {
        const struct format_slice_info *si = format_reader_slice(p->r, order[j]);
        uint64_t end = si->offset + si->length;
        if (end <= p->ra_end)
            continue;
        uint64_t off = si->offset > p->ra_end ? si->offset : p->ra_end;
        advise_range(p, off, end - off);
        p->ra_end = end;
    }
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
    const uint64_t window = map_window(p);
    int ret = 0;
    for (uint32_t j = 0; j < n && ret == 0; j++) {
        uint32_t s = order[j];
        const struct format_slice_info *si = format_reader_slice(r, s);
        /* this slice whole and a window past it: the disk keeps busy while
         * this thread waits for the slice, and while the compute consumes it */
        advise(p, order, n, j, si->offset + si->length + window);
        ret = pl_map_populate(p, s, err);
        const uint8_t *data = (const uint8_t *)p->m->slices + si->offset;
        /* hashed here, not by a VERIFY task on a CPU worker: this is the
         * first read of the slice's pages, the costly one where memory the
         * guest has not touched faults in the hypervisor (docs/BENCHMARKS.md,
         * issue 22, sixth session); this thread would only wait for the disk */
        if (ret == 0)
            ret = format_slice_verify(r, s, data, err);
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
    free(order);
    return ret;
}

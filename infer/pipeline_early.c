/* pipeline_early.c: packed residency's first weight bytes read into the page
 * cache from the moment the caller has the container's index, before its
 * tokenizer, its attention setup and the pipeline's graph (a cold
 * 128-token run spent 24-50 ms there with the disk idle: the weights' first
 * read went out after them; docs/BENCHMARKS.md, thirteenth session, q22).
 *
 * A thread of its own maps the file and populates the first layers' bytes
 * in file order, one read-ahead window at a time (MADV_POPULATE_READ on a
 * MADV_SEQUENTIAL mapping: the fault path's large folios, as the pipeline's
 * own read-ahead thread reads them, pipeline_map.c). One window in flight,
 * not a deep queue: the setup's own reads (the tokenizer's bytes, the
 * embedding rows, the binary's pages) wait behind at most one window in the
 * throttled disk's FIFO; advice of 32-64 MiB at once delayed them by
 * 40-80 ms (twelfth session, c22). The pipeline then maps the same pages
 * from the page cache; where it reaches a window this thread is reading, it
 * waits for that read, it does not read again.
 *
 * Only where the pipeline maps the file (pl_map_open: packed residency,
 * slices on 4 KiB, not slices_read): the int8 residency and slices_read
 * read with O_DIRECT, which would read these bytes a second time. The
 * bytes read are capped (EARLY_BYTES): past them the pipeline's own reads
 * have long begun. A failed read only ends the thread: the pipeline reads
 * the bytes itself and reports the error. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common.h"
#include "format.h"
#include "infer.h"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 /* linux/mman.h, Linux 5.14 */
#endif

#define EARLY_BYTES (64u << 20) /* 80 ms at 800 MB/s: the setup takes 24-50 ms */
#define EARLY_STEP (8u << 20)   /* one read-ahead window of the device (read_ahead_kb) */

struct infer_early {
    pthread_t thread;
    pthread_mutex_t mu;
    int stop;
    uint8_t *map;
    size_t map_len;
    uint64_t lo, hi; /* the range read: [lo, hi) of the file */
};

static int early_stopped(struct infer_early *e)
{
    pthread_mutex_lock(&e->mu);
    int s = e->stop;
    pthread_mutex_unlock(&e->mu);
    return s;
}

static void *early_worker(void *arg)
{
    struct infer_early *e = arg;
    for (uint64_t at = e->lo; at < e->hi && !early_stopped(e); at += EARLY_STEP) {
        uint64_t end = at + EARLY_STEP < e->hi ? at + EARLY_STEP : e->hi;
        int ret;
        do
            ret = madvise(e->map + at, (size_t)(end - at), MADV_POPULATE_READ);
        while (ret < 0 && errno == EINTR);
        if (ret < 0)
            break; /* the pipeline's own read reports it */
    }
    return NULL;
}

int infer_pipeline_read_early(const struct format_reader *r, const struct infer_pipeline_opts *o,
                              struct infer_early **out, struct sl_err *err)
{
    *out = NULL;
    struct infer_pipeline_opts def;
    if (!o) {
        infer_pipeline_opts_init(&def);
        o = &def;
    }
    /* resolved as the pipeline resolves it (infer_session.c, pipeline.c) */
    if (infer_resident_resolve(o->resident, r, o->no_shadow) != INFER_RESIDENT_PACKED ||
        o->slices_read)
        return 0; /* the pipeline reads with O_DIRECT: nothing to read ahead of it */
    uint64_t len = format_reader_file_size(r), lo = len;
    uint32_t ns = format_reader_n_slices(r);
    for (uint32_t i = 0; i < ns; i++) {
        const struct format_slice_info *si = format_reader_slice(r, i);
        if (si->offset % 4096)
            return 0; /* the pipeline will not map this file */
        if (si->kind == FORMAT_SLICE_LAYER && si->offset < lo)
            lo = si->offset;
    }
    if (lo >= len || len > SIZE_MAX)
        return 0;
    struct infer_early *e = sl_calloc(1, sizeof *e);
    if (!e) {
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    e->lo = lo;
    e->hi = len - lo > EARLY_BYTES ? lo + EARLY_BYTES : len;
    e->map_len = (size_t)len;
    void *m = mmap(NULL, e->map_len, PROT_READ, MAP_SHARED, format_reader_fd(r), 0);
    if (m == MAP_FAILED) {
        free(e);
        return 0; /* nor will the pipeline map it */
    }
    e->map = m;
    (void)madvise(m, e->map_len, MADV_SEQUENTIAL); /* advice: the windows read ahead */
    int ret = pthread_mutex_init(&e->mu, NULL);
    if (ret == 0) {
        ret = pthread_create(&e->thread, NULL, early_worker, e);
        if (ret != 0)
            pthread_mutex_destroy(&e->mu);
    }
    if (ret != 0) {
        munmap(e->map, e->map_len);
        free(e);
        sl_err_set(err, "cannot start the early read's thread: %s", strerror(ret));
        return -ret;
    }
    *out = e;
    return 0;
}

void infer_pipeline_early_end(struct infer_early *e)
{
    if (!e)
        return;
    pthread_mutex_lock(&e->mu);
    e->stop = 1;
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->thread, NULL);
    pthread_mutex_destroy(&e->mu);
    munmap(e->map, e->map_len); /* the pages stay the page cache's (and the pipeline's map) */
    free(e);
}

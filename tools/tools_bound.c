/* tools_bound.c: the raw read and the per-round ratios of bench coldstart's
 * bound (tools_bound.h). */
#include "tools_bound.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include "common.h"

#define RAW_CHUNK (16u << 20)

int tools_raw_read(const char *path, uint64_t bytes, struct tools_raw_read *out)
{
    *out = (struct tools_raw_read){0};
    int fd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    uint8_t *buf = sl_alloc_aligned(RAW_CHUNK, 4096);
    if (!buf) {
        close(fd);
        return -ENOMEM;
    }
    uint64_t want = (bytes + 4095) & ~(uint64_t)4095, off = 0, t0 = sl_now_ns(), tb = 0;
    ssize_t k = 0;
    for (;;) {
        size_t n = RAW_CHUNK;
        if (!tb && want > off && want - off < n)
            n = (size_t)(want - off); /* one request ends at the asked bytes */
        k = pread(fd, buf, n, (off_t)off);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        off += (uint64_t)k;
        if (!tb && want && off >= want) {
            tb = sl_now_ns();
            out->bytes = off;
        }
    }
    int err = k < 0 ? -errno : 0;
    uint64_t t1 = sl_now_ns();
    sl_free_aligned(buf);
    close(fd);
    if (err)
        return err;
    if (off == 0)
        return -ENODATA;
    if (!tb) { /* none asked, or more than the file holds: the whole file */
        tb = t1;
        out->bytes = off;
    }
    out->bytes_s = (double)(tb - t0) / 1e9;
    out->file = off;
    out->file_s = (double)(t1 - t0) / 1e9;
    return 0;
}

double tools_bound_round(double raw_s, double compute_s)
{
    if (raw_s <= 0)
        return 0;
    return raw_s > compute_s ? raw_s : compute_s;
}

int tools_bound_ratios(const double *ttft, const double *bound, size_t rounds,
                       struct tools_stats *st)
{
    double *v = malloc((rounds ? rounds : 1) * sizeof *v);
    if (!v) {
        *st = (struct tools_stats){0};
        return -ENOMEM;
    }
    size_t n = 0;
    for (size_t r = 0; r < rounds; r++)
        if (ttft[r] > 0 && bound[r] > 0)
            v[n++] = ttft[r] / bound[r];
    int ret = tools_stats_compute(v, n, st);
    free(v);
    return ret;
}

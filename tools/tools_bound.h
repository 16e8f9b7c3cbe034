/* tools_bound.h: the read bound of `sluice bench coldstart`, measured the way
 * its contenders are: a raw O_DIRECT read of the same number of bytes, one
 * per round next to the contenders' runs (same throttle, same minute), and
 * each run's ratio taken against the raw read of its own round, so that a
 * slow minute of the device moves both.
 *
 *   struct tools_raw_read rr;
 *   if (tools_raw_read(model, bytes, &rr) < 0)      // -errno
 *       ...
 *   bound_r = tools_bound_round(rr.bytes_s, compute_s);
 *   tools_bound_ratios(ttft, bound, rounds, &st);   // ttft[r] / bound[r]
 */
#ifndef SLUICE_TOOLS_BOUND_H
#define SLUICE_TOOLS_BOUND_H

#include <stddef.h>
#include <stdint.h>

#include "tools_stats.h"

struct tools_raw_read {
    uint64_t bytes;     /* read up to `bytes_s`: the asked count rounded up to 4 KiB
                           (O_DIRECT), at most the file's size */
    double bytes_s;     /* seconds from the first read to the last of those bytes */
    uint64_t file;      /* the whole file's bytes (the read goes on to its end) */
    double file_s;      /* seconds for the whole file (its MB/s: the old bound's rate) */
};

/* Reads `path` with O_DIRECT in 16 MiB requests, one at a time, from offset
 * 0 to its end; one request ends exactly at `bytes` (rounded up to 4 KiB), so
 * *out->bytes_s is the time a raw read of that many bytes takes (bytes 0 or
 * past the end: the whole file). Returns 0, or a negative errno (open, the
 * buffer, a read; the file empty). */
int tools_raw_read(const char *path, uint64_t bytes, struct tools_raw_read *out);

/* One round's bound: the raw read of the bytes, or the compute bound where
 * that is larger; never less than the raw read (0: not measured). */
double tools_bound_round(double raw_s, double compute_s);

/* Per-round ratios ttft[r] / bound[r] over the rounds where both are
 * measured (> 0), summarized into *st (n: how many). Returns 0 or -ENOMEM. */
int tools_bound_ratios(const double *ttft, const double *bound, size_t rounds,
                       struct tools_stats *st);

#endif

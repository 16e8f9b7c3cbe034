/* tools_stats.h: summaries of repeated measurements for the benchmarks and
 * the evaluation (min, median, max, mean, percentiles). The input is never
 * reordered: a sorted copy is taken, so the caller's samples keep their run
 * order (bench coldstart finds its median run's breakdown by the TTFT).
 *
 *   struct tools_stats st;
 *   if (tools_stats_compute(ttft, n, &st) < 0)   // only -ENOMEM
 *       ...
 *   printf("min %.3f median %.3f\n", st.min, st.median);
 */
#ifndef SLUICE_TOOLS_STATS_H
#define SLUICE_TOOLS_STATS_H

#include <stddef.h>

struct tools_stats {
    size_t n;
    double min, max, mean;
    /* the upper median, sorted[n / 2]: one of the samples (for even n the
     * larger middle one), so a median run can be looked up by its value */
    double median;
};

/* Summarizes v[0..n); with n == 0 every field is 0. Returns 0, or -ENOMEM
 * when the sorted copy cannot be allocated (*st is then zeroed). */
int tools_stats_compute(const double *v, size_t n, struct tools_stats *st);

/* The p-quantile (0 <= p <= 1) of v[0..n) by the nearest rank below:
 * sorted[floor((n - 1) * p)], a value that occurred. 0 into *out for n == 0.
 * Returns 0, -EINVAL for p outside [0, 1], -ENOMEM. */
int tools_stats_percentile(const double *v, size_t n, double p, double *out);

#endif

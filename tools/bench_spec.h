/* bench_spec.h: the two halves of `sluice bench spec` (bench_spec.c: the
 * task benchmark; bench_spec_cost.c: --verify-cost). */
#ifndef SLUICE_BENCH_SPEC_H
#define SLUICE_BENCH_SPEC_H

#include <stdint.h>

#include "infer.h"

/* v[0..n): 0 min, 1 median, 2 max (0 on an error). */
double bench_spec_stat(const double *v, uint32_t n, int which);
/* One forward of 1, 4, 8 and 16 rows after a context of ctx tokens, runs
 * times each, interleaved; the graph-switching measurement. 0 or 1. */
/* m: int8 weights; NULL: packed residency, a cold start of path.
 * one_thread (with m): the same forwards, interleaved, on a session without
 * the NPU device thread too. shape (1, 4, 8 or 16; 0: all): only that
 * forward is timed (a profile of one shape). */
int bench_spec_cost(struct infer_model *m, const char *path, uint32_t ctx, uint32_t runs,
                    uint32_t shape, int one_thread, int json);

#endif

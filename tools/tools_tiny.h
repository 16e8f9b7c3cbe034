/* tools_tiny.h: how many of a prefill's GEMM operations the int8 kernel
 * runs with its tiny step (blocks of codes within +-16, npu.h), for the
 * second bound of `sluice bench coldstart`. */
#ifndef SLUICE_TOOLS_TINY_H
#define SLUICE_TOOLS_TINY_H

#include <stdint.h>

#include "common.h"
#include "npu.h"

/* Over every layer's linear weights of MODEL (unpacked to int8 codes, as
 * the pipeline does), the operations (2 per multiply-add) of an n-row
 * prefill that kernel k computes with its tiny step: *full for every row of
 * every layer, *required for what the first token needs (the last layer's K
 * and V of every row, its Q, O and FFN of the last row only). Both 0 for a
 * kernel without a tiny step. 0, or a negative errno with err filled (the
 * model cannot be read or unpacked, out of memory). */
int tools_tiny_ops(const char *model, enum npu_kernel k, uint32_t n, double *full,
                   double *required, struct sl_err *err);

#endif

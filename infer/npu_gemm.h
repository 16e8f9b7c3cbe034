/* npu_gemm.h: the GEMM kernel API lives in infer.h (public, for the
 * benchmark); this internal header only includes it. */
#ifndef SLUICE_NPU_GEMM_H
#define SLUICE_NPU_GEMM_H

#include "infer.h"

#endif

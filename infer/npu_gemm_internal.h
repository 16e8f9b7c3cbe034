/* npu_gemm_internal.h: the prepared-weight struct and the kernel entry
 * points, one per instruction-set file. The build defines SLUICE_KERNELS_X86
 * when it compiles the x86 files; the CPU's features decide at run time. */
#ifndef SLUICE_NPU_GEMM_INTERNAL_H
#define SLUICE_NPU_GEMM_INTERNAL_H

#include "npu_gemm.h"

struct npu_gemm_b {
    uint32_t n, k;
    uint32_t k4, n16;      /* k rounded up to 4, n to 16 */
    int8_t *packed;        /* [n16/16][k4/4][16][4]: the only copy of the weights */
    int32_t *rowsum;       /* [n16] sum of each row's codes (the +128 correction / 128) */
};

typedef void npu_gemm_fn(const struct npu_gemm_b *b, const int8_t *a, uint32_t m, uint32_t r0,
                         uint32_t r1, int32_t *c, size_t ldc);

npu_gemm_fn npu_gemm_scalar;
npu_gemm_fn npu_gemm_avx2;
npu_gemm_fn npu_gemm_avx512vnni;
npu_gemm_fn npu_gemm_avxvnni;

/* Weight (r, c) in the packed layout. */
static inline int8_t npu_gemm_b_at(const struct npu_gemm_b *b, uint32_t r, uint32_t c)
{
    return b->packed[((size_t)(r / 16) * (b->k4 / 4) + c / 4) * 64 + (r % 16) * 4 + c % 4];
}

/* Register-only peak loops: iters x (16 x 64 | 12 x 32) multiply-adds. */
uint64_t npu_peak_avx512vnni(uint64_t iters);
uint64_t npu_peak_avx2(uint64_t iters);

#endif

/* npu_gemm_scalar.c: the reference int8 GEMM (the specification). It reads
 * the weights through the packed layout's index arithmetic, so the weights
 * are stored once. */
#include "npu_gemm_internal.h"

void npu_gemm_scalar(const struct npu_gemm_b *b, const int8_t *a, uint32_t m, uint32_t r0,
                     uint32_t r1, int32_t *c, size_t ldc)
{
    for (uint32_t i = 0; i < m; i++) {
        const int8_t *ai = a + (size_t)i * b->k;
        for (uint32_t r = r0; r < r1; r++) {
            int32_t acc = 0;
            for (uint32_t j = 0; j < b->k; j++)
                acc += (int32_t)ai[j] * (int32_t)npu_gemm_b_at(b, r, j);
            c[(size_t)i * ldc + (r - r0)] = acc;
        }
    }
}

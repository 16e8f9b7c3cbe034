/* npu_store_avx2.h: the store the AVX2 kernels share (npu_gemm_avx2.c,
 * npu_gemm_rows_avx2.c, npu_est_avx2.c, npu_gemm_avxvnni.c). Include it
 * only from files built with the AVX2 flags. */
#ifndef SLUICE_NPU_STORE_AVX2_H
#define SLUICE_NPU_STORE_AVX2_H

#include <immintrin.h>
#include <stdint.h>

#include "npu_gemm_internal.h"

/* Row i, channels c0..c0+7 of the int32 sums v, kept inside [r0, r1):
 * int32 (g->c), or the dequantized float, the two scales' product first, as
 * the scalar GEMM computes it (with g->add, added to y's value). */
static inline __attribute__((always_inline)) void
npu_avx2_store8(__m256i v, const struct npu_gemm_args *g, uint32_t i, uint32_t c0)
{
    const uint32_t lo = g->r0, hi = g->r1;
    int32_t t[8];
    if (g->c) {
        if (c0 >= lo && c0 + 8 <= hi) {
            _mm256_storeu_si256((__m256i *)(g->c + (size_t)i * g->ldc + (c0 - lo)), v);
            return;
        }
        _mm256_storeu_si256((__m256i *)t, v);
        for (uint32_t q = 0; q < 8; q++)
            if (c0 + q >= lo && c0 + q < hi)
                g->c[(size_t)i * g->ldc + (c0 + q - lo)] = t[q];
        return;
    }
    float *yi = g->y + (size_t)i * g->ldy;
    if (c0 >= lo && c0 + 8 <= hi) {
        __m256 sc = _mm256_mul_ps(_mm256_set1_ps(g->act_scale), _mm256_loadu_ps(g->scale + c0));
        __m256 f = _mm256_mul_ps(sc, _mm256_cvtepi32_ps(v));
        if (g->add)
            f = _mm256_add_ps(_mm256_loadu_ps(yi + (c0 - lo)), f);
        _mm256_storeu_ps(yi + (c0 - lo), f);
        return;
    }
    _mm256_storeu_si256((__m256i *)t, v);
    for (uint32_t q = 0; q < 8; q++)
        if (c0 + q >= lo && c0 + q < hi) {
            float f = (g->act_scale * g->scale[c0 + q]) * (float)t[q];
            yi[c0 + q - lo] = g->add ? yi[c0 + q - lo] + f : f;
        }
}

#endif

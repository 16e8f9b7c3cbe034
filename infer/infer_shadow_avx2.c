/* infer_shadow_avx2.c: the shadow term's inner loop with AVX2 (compiled with
 * SLUICE_FLAGS_AVX2; called only where the CPU has it). Bit for bit
 * infer_shadow_axpy_s8_scalar (widen exactly, multiply, then add). */
#include <immintrin.h>

#include "infer_internal.h"

void infer_shadow_axpy_s8_avx2(float *acc, float e, const int8_t *w, uint32_t n)
{
    const __m256 ve = _mm256_set1_ps(e);
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const void *)(w + i))));
        __m256 a = _mm256_loadu_ps(acc + i);
        _mm256_storeu_ps(acc + i, _mm256_add_ps(a, _mm256_mul_ps(ve, f)));
    }
    for (; i < n; i++)
        acc[i] += e * (float)w[i];
}

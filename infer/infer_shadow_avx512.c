/* infer_shadow_avx512.c: the shadow term's inner loop with AVX-512 (compiled
 * with SLUICE_FLAGS_AVX512; called only where the CPU has it). Bit for bit
 * infer_shadow_axpy_s8_scalar: each lane widens the int8 exactly, multiplies,
 * then adds (no fused multiply-add), as the scalar loop does. */
#include <immintrin.h>

#include "infer_internal.h"

void infer_shadow_axpy_s8_avx512(float *acc, float e, const int8_t *w, uint32_t n)
{
    const __m512 ve = _mm512_set1_ps(e);
    uint32_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const void *)(w + i))));
        __m512 a = _mm512_loadu_ps(acc + i);
        _mm512_storeu_ps(acc + i, _mm512_add_ps(a, _mm512_mul_ps(ve, f)));
    }
    for (; i < n; i++)
        acc[i] += e * (float)w[i];
}

/* infer_div_max_avx512_inl.h: the scaling step of the softmax's first pass,
 * static inline, for the dense kernel (infer_matmul_avx512.c's
 * infer_div_max_avx512) and sparse attention's per-block softmax
 * (attn_sel_avx512.c): the same bits in both. Included only by files built
 * with the AVX-512 flags. */
#ifndef SLUICE_INFER_DIV_MAX_AVX512_INL_H
#define SLUICE_INFER_DIV_MAX_AVX512_INL_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>

/* a[0..n) each replaced by x / d (x * iv where pow2: d a power of two, iv
 * = 1 / d, the same bits), and per lane the largest result (ordered
 * compares: NaN never wins; -inf in a lane that saw none) */
static inline __m512 infer_div_max16_avx512(float *a, uint32_t n, int pow2, __m512 iv, __m512 dv)
{
    __m512 acc = _mm512_set1_ps(-INFINITY);
    for (uint32_t t = 0; t < n; t += 16) {
        __mmask16 m = n - t >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - t)) - 1);
        __m512 in = _mm512_maskz_loadu_ps(m, a + t);
        __m512 x = pow2 ? _mm512_mul_ps(in, iv) : _mm512_div_ps(in, dv);
        _mm512_mask_storeu_ps(a + t, m, x);
        acc = _mm512_mask_mov_ps(acc, m & _mm512_cmp_ps_mask(x, acc, _CMP_GT_OQ), x);
    }
    return acc;
}

#endif

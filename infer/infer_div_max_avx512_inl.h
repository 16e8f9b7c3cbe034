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

/* infer_div_max_reduce16 of the 16 lanes in registers: lane i takes lane
 * i + w where that is strictly greater (ordered: NaN never wins), w = 8, 4,
 * 2, 1; lane 0 returned */
static inline float infer_div_max_fold16_avx512(__m512 acc)
{
    __m512 o = _mm512_shuffle_f32x4(acc, acc, 0x4E); /* lanes i + 8 */
    acc = _mm512_mask_mov_ps(acc, 0x00ff & _mm512_cmp_ps_mask(o, acc, _CMP_GT_OQ), o);
    o = _mm512_shuffle_f32x4(acc, acc, 0xB1); /* i + 4 */
    acc = _mm512_mask_mov_ps(acc, 0x000f & _mm512_cmp_ps_mask(o, acc, _CMP_GT_OQ), o);
    o = _mm512_permute_ps(acc, 0x4E); /* i + 2 */
    acc = _mm512_mask_mov_ps(acc, 0x0003 & _mm512_cmp_ps_mask(o, acc, _CMP_GT_OQ), o);
    o = _mm512_permute_ps(acc, 0xB1); /* i + 1 */
    acc = _mm512_mask_mov_ps(acc, 0x0001 & _mm512_cmp_ps_mask(o, acc, _CMP_GT_OQ), o);
    return _mm512_cvtss_f32(acc);
}

#endif

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
#include <string.h>

/* Whether x / d may be taken as x * (1 / d): d a positive power of two
 * whose inverse is a normal float (sqrt(64) = 8: a 64-wide head's
 * scaling), where both are the same real number, rounded once, so the same
 * bits at a multiply's cost (the division is the step's bottleneck); *iv =
 * 1 / d then, else 1. */
static inline int infer_div_pow2(float d, __m512 *iv)
{
    uint32_t db;
    memcpy(&db, &d, sizeof db);
    uint32_t e = db >> 23;
    int pow2 = (db & 0x7fffffu) == 0 && e >= 1 && e <= 253; /* positive: sign 0 */
    *iv = _mm512_set1_ps(pow2 ? 1.0f / d : 1.0f);
    return pow2;
}

/* One step of 16 lanes (m the valid ones): x / d stored at dst, and acc's
 * lanes raised to it where it is strictly greater (ordered: NaN never wins) */
static inline __m512 infer_div_max_step16(float *dst, __mmask16 m, __m512 in, int pow2, __m512 iv,
                                          __m512 dv, __m512 acc)
{
    __m512 x = pow2 ? _mm512_mul_ps(in, iv) : _mm512_div_ps(in, dv);
    _mm512_mask_storeu_ps(dst, m, x);
    return _mm512_mask_mov_ps(acc, m & _mm512_cmp_ps_mask(x, acc, _CMP_GT_OQ), x);
}

/* a[0..n) each replaced by x / d (x * iv where pow2: infer_div_pow2), and
 * per lane the largest result (-inf in a lane that saw none) */
static inline __m512 infer_div_max16_avx512(float *a, uint32_t n, int pow2, __m512 iv, __m512 dv)
{
    __m512 acc = _mm512_set1_ps(-INFINITY);
    for (uint32_t t = 0; t < n; t += 16) {
        __mmask16 m = n - t >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - t)) - 1);
        acc = infer_div_max_step16(a + t, m, _mm512_maskz_loadu_ps(m, a + t), pow2, iv, dv, acc);
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

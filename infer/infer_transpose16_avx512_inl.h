/* infer_transpose16_avx512_inl.h: a 16 x 16 float transpose in registers,
 * static inline, for the RMS norm's sums of squares (infer_ops_avx512.c) and
 * the keys transposed for the scores (infer_attn_kt_avx512.c). Included only
 * by files built with the AVX-512 flags. */
#ifndef SLUICE_INFER_TRANSPOSE16_AVX512_INL_H
#define SLUICE_INFER_TRANSPOSE16_AVX512_INL_H

#include <immintrin.h>

/* r[i] = 16 floats of row i (i < 16), transposed in place: r[j] = column j,
 * row i in lane i (4 steps of 16 shuffles) */
static inline __attribute__((always_inline)) void infer_transpose16(__m512 r[16])
{
    __m512 t[16];
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) { /* lane L: rows 2k, 2k+1 of columns 4L..4L+3 */
        t[2 * k] = _mm512_unpacklo_ps(r[2 * k], r[2 * k + 1]);
        t[2 * k + 1] = _mm512_unpackhi_ps(r[2 * k], r[2 * k + 1]);
    }
#pragma GCC unroll 4
    for (int g = 0; g < 4; g++) { /* r[4g + c]: column 4L + c of rows 4g..4g+3 in lane L */
        __m512d a = _mm512_castps_pd(t[4 * g]), b = _mm512_castps_pd(t[4 * g + 2]);
        __m512d e = _mm512_castps_pd(t[4 * g + 1]), f = _mm512_castps_pd(t[4 * g + 3]);
        r[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
        r[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        r[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(e, f));
        r[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(e, f));
    }
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) { /* t[c]: columns c, c + 8; t[4 + c]: c + 4, c + 12 */
        t[c] = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88);
        t[4 + c] = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xdd);
        t[8 + c] = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);
        t[12 + c] = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xdd);
    }
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) { /* column c: rows 0-3, 4-7, 8-11, 12-15 */
        r[c] = _mm512_shuffle_f32x4(t[c], t[8 + c], 0x88);
        r[8 + c] = _mm512_shuffle_f32x4(t[c], t[8 + c], 0xdd);
        r[4 + c] = _mm512_shuffle_f32x4(t[4 + c], t[12 + c], 0x88);
        r[12 + c] = _mm512_shuffle_f32x4(t[4 + c], t[12 + c], 0xdd);
    }
}

#endif

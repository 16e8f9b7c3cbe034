/* infer_ops_avx512.c: the float CPU operators of a layer (infer_ops.c) with
 * AVX-512F, computing exactly what the portable code computes.
 *
 * RMSNorm: a row's sum of squares is one chain of additions, element after
 * element (a product rounded, then added), whose 4-cycle latency per element
 * decides the portable loop's time (2048 elements: about 8,000 cycles a
 * row). Here 16 rows go through the chain together, row i in lane i (a
 * gather per element), and 32 rows as two independent chains: every row's
 * sum is still its own elements' products added in element order, so the
 * same bits. The scaling and the weights then take 16 elements at a time
 * (the same two products each).
 *
 * RoPE: each pair's two outputs as the portable code writes them (two
 * products, then their difference or sum, no FMA), 8 pairs a vector. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "infer_matmul.h"

/* out[r][j] = w[j] * (s * x[r][j]) for j < d */
static inline void scale_row(float *o, const float *xr, const float *w, uint32_t d, float s)
{
    __m512 sv = _mm512_set1_ps(s);
    for (uint32_t j = 0; j < d; j += 16) {
        __mmask16 m = d - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (d - j)) - 1);
        __m512 v = _mm512_mul_ps(sv, _mm512_maskz_loadu_ps(m, xr + j));
        _mm512_mask_storeu_ps(o + j, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, w + j), v));
    }
}

/* ss /= d; ss += eps; 1 / sqrt(ss): the portable code's steps, lane by lane */
static inline __m512 inv_rms(__m512 ss, uint32_t d, float eps)
{
    ss = _mm512_div_ps(ss, _mm512_set1_ps((float)d));
    ss = _mm512_add_ps(ss, _mm512_set1_ps(eps));
    return _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_sqrt_ps(ss));
}

static void scale_rows(float *out, const float *x, const float *w, uint32_t d, __m512 s,
                       uint32_t rows)
{
    float sv[16];
    _mm512_storeu_ps(sv, s);
    for (uint32_t i = 0; i < rows; i++)
        scale_row(out + (size_t)i * d, x + (size_t)i * d, w, d, sv[i]);
}

void infer_rmsnorm_avx512(float *out, const float *x, const float *w, uint32_t n, uint32_t d,
                          float eps)
{
    uint32_t r = 0;
    /* lane i reads row i: 15 rows' offset must fit the gather's int32 index */
    if (d <= (uint32_t)(INT32_MAX / 16)) {
        const __m512i idx = _mm512_mullo_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32((int)d));
        for (; r + 32 <= n; r += 32) {
            const float *x0 = x + (size_t)r * d, *x1 = x0 + (size_t)16 * d;
            __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
            for (uint32_t j = 0; j < d; j++) {
                __m512 v0 = _mm512_i32gather_ps(idx, x0 + j, 4);
                __m512 v1 = _mm512_i32gather_ps(idx, x1 + j, 4);
                a0 = _mm512_add_ps(a0, _mm512_mul_ps(v0, v0));
                a1 = _mm512_add_ps(a1, _mm512_mul_ps(v1, v1));
            }
            /* the sums are taken before any row is written: out may alias x */
            __m512 s0 = inv_rms(a0, d, eps), s1 = inv_rms(a1, d, eps);
            scale_rows(out + (size_t)r * d, x0, w, d, s0, 16);
            scale_rows(out + (size_t)(r + 16) * d, x1, w, d, s1, 16);
        }
        for (; r + 16 <= n; r += 16) {
            const float *x0 = x + (size_t)r * d;
            __m512 a0 = _mm512_setzero_ps();
            for (uint32_t j = 0; j < d; j++) {
                __m512 v0 = _mm512_i32gather_ps(idx, x0 + j, 4);
                a0 = _mm512_add_ps(a0, _mm512_mul_ps(v0, v0));
            }
            scale_rows(out + (size_t)r * d, x0, w, d, inv_rms(a0, d, eps), 16);
        }
    }
    for (; r < n; r++) { /* the last rows one at a time, as the portable code */
        const float *xr = x + (size_t)r * d;
        float ss = infer_rmsnorm_ss_scalar(xr, d);
        ss /= (float)d;
        ss += eps;
        ss = 1.0f / sqrtf(ss);
        scale_row(out + (size_t)r * d, xr, w, d, ss);
    }
}

void infer_rope_pairs_avx512(float *xh, const float *cos_tab, const float *sin_tab,
                             uint32_t half)
{
    /* lanes 2j, 2j+1 hold pair j: c and s duplicated into both lanes */
    const __m512i dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    const __mmask16 even = 0x5555;
    for (uint32_t j = 0; j < half; j += 8) {
        uint32_t np = half - j < 8 ? half - j : 8;
        /* np pairs: np table entries, 2 np floats of the head */
        __mmask16 mp = (__mmask16)((1u << np) - 1), m = (__mmask16)((1u << (2 * np)) - 1);
        __m512 c = _mm512_permutexvar_ps(dup, _mm512_maskz_loadu_ps(mp, cos_tab + j));
        __m512 s = _mm512_permutexvar_ps(dup, _mm512_maskz_loadu_ps(mp, sin_tab + j));
        __m512 v = _mm512_maskz_loadu_ps(m, xh + 2 * j);
        __m512 sw = _mm512_permute_ps(v, 0xB1); /* v1, v0 in each pair */
        __m512 p1 = _mm512_mul_ps(v, c);        /* even: v0 * c, odd: v1 * c */
        __m512 p2 = _mm512_mul_ps(sw, s);       /* even: v1 * s, odd: v0 * s */
        /* even: v0 * c - v1 * s; odd: v0 * s + v1 * c (that operand order) */
        __m512 o = _mm512_mask_sub_ps(_mm512_add_ps(p2, p1), even, p1, p2);
        _mm512_mask_storeu_ps(xh + 2 * j, m, o);
    }
}

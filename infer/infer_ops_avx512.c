/* infer_ops_avx512.c: the float CPU operators of a layer (infer_ops.c) with
 * AVX-512F, computing exactly what the portable code computes.
 *
 * RMSNorm: a row's sum of squares is one chain of additions, element after
 * element (a product rounded, then added), whose 4-cycle latency per element
 * decides the portable loop's time (2048 elements: about 8,000 cycles a
 * row). Here 16 rows go through the chain together, row i in lane i: 16
 * elements of each of 16 rows squared, the 16 x 16 block transposed in
 * registers, then its 16 columns added in order (a gather per element
 * instead measured 1.3x the portable loop only). Every row's sum is still
 * its own elements' products added in element order, so the same bits. The
 * scaling and the weights then take 16 elements at a time (the same two
 * products each).
 *
 * RoPE: each pair's two outputs as the portable code writes them (two
 * products, then their difference or sum, no FMA), 8 pairs a vector. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "infer_transpose16_avx512_inl.h"
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

/* rows' (1..16) sums of squares, row i in lane i, each in element order;
 * lanes past rows are zero (their loads masked off) */
static inline __m512 sums16(const float *x, uint32_t d, uint32_t rows)
{
    __m512 acc = _mm512_setzero_ps();
    for (uint32_t j = 0; j < d; j += 16) {
        uint32_t nc = d - j < 16 ? d - j : 16;
        __mmask16 m = (__mmask16)((1u << nc) - 1);
        __m512 r[16];
#pragma GCC unroll 16
        for (uint32_t i = 0; i < 16; i++) {
            const float *xi = x + (size_t)(i < rows ? i : 0) * d + j;
            __m512 v = _mm512_maskz_loadu_ps(i < rows ? m : 0, xi);
            r[i] = _mm512_mul_ps(v, v);
        }
        infer_transpose16(r); /* sq[j] = column j's squares */
        for (uint32_t c = 0; c < nc; c++) /* the columns past d are not added */
            acc = _mm512_add_ps(acc, r[c]);
    }
    return acc;
}

void infer_rmsnorm_avx512(float *out, const float *x, const float *w, uint32_t n, uint32_t d,
                          float eps)
{
    /* 16 rows at a time; a last group of 2..15 rows (a draft tree's
     * verification, a few sequences' step) the same way with the absent
     * rows' lanes masked off: each row's sum is still one chain in element
     * order, as the portable code adds it, but the rows' chains run side by
     * side instead of one after another */
    uint32_t r = 0, rows;
    for (; r + 2 <= n; r += rows) {
        rows = n - r < 16 ? n - r : 16;
        const float *x0 = x + (size_t)r * d;
        /* the sums are taken before any row is written: out may alias x */
        scale_rows(out + (size_t)r * d, x0, w, d, inv_rms(sums16(x0, d, rows), d, eps), rows);
    }
    for (; r < n; r++) { /* a last single row as the portable code */
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

/* attn_topk_avx512.c: the top-k's threshold kernels with AVX-512F
 * (attn_sparse.h has the definitions; attn_sel.c the scalar twins and the
 * dispatch): 16 lanes a compare, the kept lanes left-packed by vpcompressd
 * in a register (no table) and stored whole, the count advanced by the
 * mask's popcount; the count and range passes 16 lanes a step. Integer and
 * index results: the same as the AVX2 kernels and the scalar twins. */
#include <immintrin.h>
#include <math.h>

#include "attn_sparse.h"

uint32_t attn_above_avx512(const float *s, uint32_t n, float th, uint32_t base, uint32_t *idx,
                           float *val, int *nan)
{
    const __m512 t = _mm512_set1_ps(th);
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __mmask16 un = 0;
    uint32_t m = 0, i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(s + i);
        un |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        __mmask16 k = _mm512_cmp_ps_mask(v, t, _CMP_GE_OQ);
        /* m <= i: the 16 lanes stored land below i + 16 <= n */
        _mm512_storeu_si512(idx + m,
                            _mm512_maskz_compress_epi32(
                                k, _mm512_add_epi32(lane, _mm512_set1_epi32((int)(base + i)))));
        if (val)
            _mm512_storeu_ps(val + m, _mm512_maskz_compress_ps(k, v));
        m += (uint32_t)__builtin_popcount((unsigned)k);
    }
    int any = un != 0;
    for (; i < n; i++) {
        any |= s[i] != s[i];
        idx[m] = base + i;
        if (val)
            val[m] = s[i];
        m += s[i] >= th;
    }
    *nan = any;
    return m;
}

uint32_t attn_keep_above_avx512(const uint32_t *idx, const float *val, uint32_t m, float th,
                                uint32_t *out)
{
    const __m512 t = _mm512_set1_ps(th);
    uint32_t o = 0, j = 0;
    for (; j + 16 <= m; j += 16) {
        __mmask16 k = _mm512_cmp_ps_mask(_mm512_loadu_ps(val + j), t, _CMP_GE_OQ);
        __m512i v = _mm512_loadu_si512(idx + j);
        /* o <= j: the 16 lanes stored land below j + 16 <= m (and after the
         * loads of idx[j..j + 16) when out is idx) */
        _mm512_storeu_si512(out + o, _mm512_maskz_compress_epi32(k, v));
        o += (uint32_t)__builtin_popcount((unsigned)k);
    }
    for (; j < m; j++) {
        uint32_t v = idx[j];
        out[o] = v;
        o += val[j] >= th;
    }
    return o;
}

uint32_t attn_count_avx512(const float *s, uint32_t n, float th)
{
    const __m512 t = _mm512_set1_ps(th);
    __m512i c = _mm512_setzero_si512();
    const __m512i one = _mm512_set1_epi32(1);
    uint32_t i = 0;
    for (; i + 16 <= n; i += 16)
        c = _mm512_mask_add_epi32(c, _mm512_cmp_ps_mask(_mm512_loadu_ps(s + i), t, _CMP_GE_OQ),
                                  c, one);
    uint32_t m = (uint32_t)_mm512_reduce_add_epi32(c);
    for (; i < n; i++)
        m += s[i] >= th;
    return m;
}

void attn_range_avx512(const float *s, uint32_t n, float *lo, float *hi, int *nan)
{
    /* four minima and four maxima, 64 values a step: one chain waited on
     * vminps/vmaxps's latency (4 cycles a vector; the range pass cost as
     * much as three counting passes). The minimum and maximum do not depend
     * on the order (equal values: +0 and -0 alike) */
    __m512 mn[4], mx[4];
    for (int j = 0; j < 4; j++) {
        mn[j] = _mm512_set1_ps(INFINITY);
        mx[j] = _mm512_set1_ps(-INFINITY);
    }
    __mmask16 un = 0;
    uint32_t i = 0;
    for (; i + 64 <= n; i += 64)
        for (int j = 0; j < 4; j++) {
            __m512 v = _mm512_loadu_ps(s + i + 16 * j);
            un |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
            mn[j] = _mm512_min_ps(v, mn[j]); /* a NaN lane keeps the second operand */
            mx[j] = _mm512_max_ps(v, mx[j]);
        }
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(s + i);
        un |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        mn[0] = _mm512_min_ps(v, mn[0]);
        mx[0] = _mm512_max_ps(v, mx[0]);
    }
    __m512 mn01 = _mm512_min_ps(mn[0], mn[1]), mn23 = _mm512_min_ps(mn[2], mn[3]);
    __m512 mx01 = _mm512_max_ps(mx[0], mx[1]), mx23 = _mm512_max_ps(mx[2], mx[3]);
    float a[16], b[16], l = INFINITY, h = -INFINITY;
    _mm512_storeu_ps(a, _mm512_min_ps(mn01, mn23));
    _mm512_storeu_ps(b, _mm512_max_ps(mx01, mx23));
    for (int j = 0; j < 16; j++) {
        l = a[j] < l ? a[j] : l;
        h = b[j] > h ? b[j] : h;
    }
    int any = un != 0;
    for (; i < n; i++) {
        any |= s[i] != s[i];
        l = s[i] < l ? s[i] : l;
        h = s[i] > h ? s[i] : h;
    }
    *lo = l;
    *hi = h;
    *nan = any;
}

/* attn_group_avx2.c: the shared selection's combine (attn_group_combine:
 * the group's estimates folded into one score per slot) with AVX2 and FMA,
 * the bits of attn_group_combine_scalar (attn_group.c), for the machines
 * without AVX-512, where the plain-C loop (one ldexpf call a slot) ran. */
#include <immintrin.h>
#include <math.h>

#include "attn_sparse.h"

/* the first n - t (< 8) lanes set */
static __m256i tail_mask(uint32_t left)
{
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)left), idx);
}

/* 8 lanes of the scalar twin's terms: fmadd, max then min (a NaN gives
 * -126, as the scalar compare does), floor, the cubic by fmadd, times
 * 2^floor built in the exponent field (exact: the terms are normal) */
static inline __m256 terms(__m256 e, __m256 kv, __m256 nmk)
{
    const __m256 lo = _mm256_set1_ps(-126.0f), zero = _mm256_setzero_ps();
    const __m256 c0 = _mm256_set1_ps(ATTN_EXP2_C0), c1 = _mm256_set1_ps(ATTN_EXP2_C1);
    const __m256 c2 = _mm256_set1_ps(ATTN_EXP2_C2), c3 = _mm256_set1_ps(ATTN_EXP2_C3);
    __m256 x = _mm256_fmadd_ps(e, kv, nmk);
    x = _mm256_min_ps(_mm256_max_ps(x, lo), zero);
    __m256 fl = _mm256_round_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_sub_ps(x, fl);
    __m256 p = _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_fmadd_ps(c3, f, c2), f, c1), f, c0);
    __m256i ex = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fl), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(ex));
}

/* attn_group_exp2_sum_scalar's sum: its 16 lanes as two vectors (slot t
 * into lane t mod 16), a partial step's missing slots added as +0 (the
 * lanes hold sums of positive terms: unchanged), folded as the twin folds */
static float exp2_sum(const float *e, uint32_t n, float k, float mk)
{
    const __m256 kv = _mm256_set1_ps(k), nmk = _mm256_set1_ps(-mk);
    __m256 a = _mm256_setzero_ps(), b = a;
    uint32_t t = 0;
    for (; t + 16 <= n; t += 16) {
        a = _mm256_add_ps(a, terms(_mm256_loadu_ps(e + t), kv, nmk));
        b = _mm256_add_ps(b, terms(_mm256_loadu_ps(e + t + 8), kv, nmk));
    }
    for (int half = 0; half < 2 && t < n; half++, t += 8) {
        __m256i m = tail_mask(n - t < 8 ? n - t : 8);
        __m256 x = _mm256_and_ps(terms(_mm256_maskload_ps(e + t, m), kv, nmk),
                                 _mm256_castsi256_ps(m));
        if (half == 0)
            a = _mm256_add_ps(a, x);
        else
            b = _mm256_add_ps(b, x);
    }
    float l[16];
    _mm256_storeu_ps(l, a);
    _mm256_storeu_ps(l + 8, b);
    for (int w = 8; w >= 1; w /= 2)
        for (int i = 0; i < w; i++)
            l[i] += l[i + w];
    return l[0];
}

/* as attn_group_combine_avx512 did before its rows were pipelined (a pass
 * per stage and row): each head's maximum lane by lane
 * (_mm256_max_ps(e, m) is the scalar e > m ? e : m), folded in the same
 * way, the scalar order only where it is a zero (the sign of a +0/-0 tie
 * is the order's); the offset by exp2_sum and logf; the per-slot
 * subtraction and maximum (d > c ? d : c) */
void attn_group_combine_avx2(const float *est, size_t ld, uint32_t G, uint32_t visible, float sq,
                             float *c)
{
    const float k = ATTN_EXP2_LOG2E / sq;
    for (uint32_t j = 0; j < G; j++) {
        const float *e = est + (size_t)j * ld;
        __m256 mv = _mm256_set1_ps(-INFINITY);
        uint32_t t = 0;
        for (; t + 8 <= visible; t += 8)
            mv = _mm256_max_ps(_mm256_loadu_ps(e + t), mv);
        float l[8], m = -INFINITY;
        _mm256_storeu_ps(l, mv);
        for (int i = 0; i < 8; i++)
            m = l[i] > m ? l[i] : m;
        for (; t < visible; t++)
            m = e[t] > m ? e[t] : m;
        if (m == 0.0f) { /* +0 or -0: the scalar order's */
            m = -INFINITY;
            for (t = 0; t < visible; t++)
                m = e[t] > m ? e[t] : m;
        }
        float off = m + logf(exp2_sum(e, visible, k, m * k)) * sq;
        if (!isfinite(off))
            off = m;
        const __m256 ms = _mm256_set1_ps(off);
        for (t = 0; t + 8 <= visible; t += 8) {
            __m256 d = _mm256_sub_ps(_mm256_loadu_ps(e + t), ms);
            _mm256_storeu_ps(c + t, j == 0 ? d : _mm256_max_ps(d, _mm256_loadu_ps(c + t)));
        }
        for (; t < visible; t++) {
            float d = e[t] - off;
            c[t] = j == 0 ? d : d > c[t] ? d : c[t];
        }
    }
}

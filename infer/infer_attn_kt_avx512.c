/* infer_attn_kt_avx512.c: a prefill row's attention scores for a kv
 * group's query heads against keys stored transposed (AVX-512F), with the
 * softmax's first step (the scaling and the row's maximum) fused in.
 *
 * Through infer_matmul_nt a score is one FMA chain per lane (16 lanes, the
 * columns c = 16j + l in lane l) and a horizontal sum across the lanes:
 * at a head's 64 columns that sum (shuffles, all on one port) costs about
 * what the 4 FMAs cost. Here 16 keys fill the lanes instead: with the keys
 * transposed (kt[c][t]), lane-sum l of 16 keys at once is the same chain,
 * acc = fma(q[16j + l], kt[16j + l][t..t+16), acc) from zero for j
 * ascending, and the horizontal sum becomes the same tree of additions done
 * vertically, (l + l+8), then + (l+4), + (l+2), + (l+1): each score gets
 * exactly the operations, operands and order of the tile's, so the same
 * bits (test_attn_kt). The scores are then scaled as infer_div_max_avx512
 * scales them (x * (1 / d) where d is a power of two, else x / d), and the
 * maximum kept per lane t & 15 as it keeps it: the first step of
 * infer_softmax_scaled without a pass of its own. */
#include <assert.h>
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "infer_div_max_avx512_inl.h"
#include "infer_transpose16_avx512_inl.h"
#include "infer_matmul.h"

void infer_keys_transpose(float *kt, size_t ldt, const float *k, size_t ldk, uint32_t T,
                          uint32_t hs)
{
    uint32_t t = 0;
    if (hs % 16 == 0) {
        /* 16 keys by 16 columns a block, transposed in registers; the last
         * block's missing keys are zeros (the padding up to a multiple of 16) */
        for (; t < T; t += 16) {
            uint32_t nk = T - t < 16 ? T - t : 16;
            for (uint32_t cb = 0; cb < hs; cb += 16) {
                __m512 r[16];
                for (uint32_t i = 0; i < 16; i++)
                    r[i] = i < nk ? _mm512_loadu_ps(k + (size_t)(t + i) * ldk + cb)
                                  : _mm512_setzero_ps();
                infer_transpose16(r); /* r[c]: column c of the 16 keys */
                for (uint32_t c = 0; c < 16; c++)
                    _mm512_storeu_ps(kt + (size_t)(cb + c) * ldt + t, r[c]);
            }
        }
        for (uint32_t c = 0; c < hs && t < ldt; c++)
            memset(kt + (size_t)c * ldt + t, 0, sizeof(float) * (ldt - t));
        return;
    }
    /* 16 keys a step: each key row read once, written as a column */
    for (; t + 16 <= T; t += 16)
        for (uint32_t c = 0; c < hs; c++) {
            float col[16];
            for (uint32_t i = 0; i < 16; i++)
                col[i] = k[(size_t)(t + i) * ldk + c];
            memcpy(kt + (size_t)c * ldt + t, col, sizeof col);
        }
    for (uint32_t c = 0; c < hs; c++) {
        for (uint32_t u = t; u < T; u++)
            kt[(size_t)c * ldt + u] = k[(size_t)u * ldk + c];
        for (uint32_t u = T; u < ldt; u++)
            kt[(size_t)c * ldt + u] = 0.0f;
    }
}

/* Up to KT_R query rows share each key vector's loads. */
#define KT_R 4

/* (lane-sum l + lane-sum l+8) of 16 keys for query rows q[0..r): lane-sum
 * l is the chain acc = fma(q[16j + l], kt[16j + l][.], acc) from zero, j
 * ascending (nj column blocks) */
static inline __attribute__((always_inline)) void pair(__m512 *s, const float *const *q,
                                                       const uint32_t r, const float *kt,
                                                       size_t ldt, uint32_t l, const uint32_t nj)
{
    __m512 lo[KT_R], hi[KT_R];
#pragma GCC unroll 4
    for (uint32_t a = 0; a < r; a++)
        lo[a] = hi[a] = _mm512_setzero_ps();
#pragma GCC unroll 8
    for (uint32_t j = 0; j < nj; j++) {
        __m512 kl = _mm512_loadu_ps(kt + (size_t)(16 * j + l) * ldt);
        __m512 kh = _mm512_loadu_ps(kt + (size_t)(16 * j + l + 8) * ldt);
#pragma GCC unroll 4
        for (uint32_t a = 0; a < r; a++) {
            lo[a] = _mm512_fmadd_ps(_mm512_set1_ps(q[a][16 * j + l]), kl, lo[a]);
            hi[a] = _mm512_fmadd_ps(_mm512_set1_ps(q[a][16 * j + l + 8]), kh, hi[a]);
        }
    }
#pragma GCC unroll 4
    for (uint32_t a = 0; a < r; a++)
        s[a] = _mm512_add_ps(lo[a], hi[a]);
}

/* s2 = pair(l) + pair(l + 4) */
static inline __attribute__((always_inline)) void quad(__m512 *s, const float *const *q,
                                                       const uint32_t r, const float *kt,
                                                       size_t ldt, uint32_t l, const uint32_t nj)
{
    __m512 a[KT_R], b[KT_R];
    pair(a, q, r, kt, ldt, l, nj);
    pair(b, q, r, kt, ldt, l + 4, nj);
#pragma GCC unroll 4
    for (uint32_t i = 0; i < r; i++)
        s[i] = _mm512_add_ps(a[i], b[i]);
}

/* The 16 scores of keys kt[.][0..16) for query rows q[0..r):
 * _mm512_reduce_add_ps's tree, s1[i] = p[i] + p[i+8], s2[j] = s1[j] +
 * s1[j+4], s3[k] = s2[k] + s2[k+2], s3[0] + s3[1], evaluated depth first
 * (few live registers). */
static inline __attribute__((always_inline)) void scores16(__m512 *x, const float *const *q,
                                                           const uint32_t r, const float *kt,
                                                           size_t ldt, const uint32_t nj)
{
    __m512 a[KT_R], b[KT_R], s30[KT_R];
    quad(a, q, r, kt, ldt, 0, nj);
    quad(b, q, r, kt, ldt, 2, nj);
#pragma GCC unroll 4
    for (uint32_t i = 0; i < r; i++)
        s30[i] = _mm512_add_ps(a[i], b[i]);
    quad(a, q, r, kt, ldt, 1, nj);
    quad(b, q, r, kt, ldt, 3, nj);
#pragma GCC unroll 4
    for (uint32_t i = 0; i < r; i++)
        x[i] = _mm512_add_ps(s30[i], _mm512_add_ps(a[i], b[i]));
}

/* Rows q[0..r) over keys [0, T): scaled scores into att rows, maxima. */
static inline __attribute__((always_inline)) void
rows(float *att, size_t lda, const float *const *q, const uint32_t r, const float *kt, size_t ldt,
     uint32_t T, int pow2, __m512 iv, __m512 dv, float *maxv, const uint32_t nj)
{
    __m512 mx[KT_R];
#pragma GCC unroll 4
    for (uint32_t a = 0; a < r; a++)
        mx[a] = _mm512_set1_ps(-INFINITY);
    for (uint32_t t = 0; t < T; t += 16) {
        __mmask16 m = T - t >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (T - t)) - 1);
        __m512 x[KT_R];
        scores16(x, q, r, kt + t, ldt, nj);
#pragma GCC unroll 4
        for (uint32_t a = 0; a < r; a++) {
            mx[a] = infer_div_max_step16(att + (size_t)a * lda + t, m, x[a], pow2, iv, dv, mx[a]);
        }
    }
#pragma GCC unroll 4
    for (uint32_t a = 0; a < r; a++)
        maxv[a] = infer_div_max_fold16_avx512(mx[a]);
}

static inline __attribute__((always_inline)) void scores(float *att, size_t lda, const float *q,
                                                         size_t ldq, uint32_t nq, const float *kt,
                                                         size_t ldt, uint32_t T, float d,
                                                         float *maxv, const uint32_t nj)
{
    __m512 iv;
    const __m512 dv = _mm512_set1_ps(d);
    const int pow2 = infer_div_pow2(d, &iv); /* infer_div_max_avx512's rule */
    uint32_t i = 0;
    for (; i + KT_R <= nq; i += KT_R) {
        const float *qr[KT_R];
        for (uint32_t a = 0; a < KT_R; a++)
            qr[a] = q + (size_t)(i + a) * ldq;
        rows(att + (size_t)i * lda, lda, qr, KT_R, kt, ldt, T, pow2, iv, dv, maxv + i, nj);
    }
    for (; i < nq; i++) {
        const float *qr[1] = {q + (size_t)i * ldq};
        rows(att + (size_t)i * lda, lda, qr, 1, kt, ldt, T, pow2, iv, dv, maxv + i, nj);
    }
}

#define SCORES_NJ(NJ)                                                                              \
    static void scores_##NJ(float *att, size_t lda, const float *q, size_t ldq, uint32_t nq,       \
                            const float *kt, size_t ldt, uint32_t T, float d, float *maxv)         \
    {                                                                                              \
        scores(att, lda, q, ldq, nq, kt, ldt, T, d, maxv, NJ);                                     \
    }
SCORES_NJ(2)
SCORES_NJ(4)
SCORES_NJ(8)

typedef void scores_fn(float *att, size_t lda, const float *q, size_t ldq, uint32_t nq,
                       const float *kt, size_t ldt, uint32_t T, float d, float *maxv);
static scores_fn *const by_nj[INFER_ATT_KT_MAX_HS / 16] = {
    [1] = scores_2, [3] = scores_4, [7] = scores_8};

void infer_attn_scores_kt_avx512(float *att, size_t lda, const float *q, size_t ldq, uint32_t nq,
                                 const float *kt, size_t ldt, uint32_t T, uint32_t hs, float d,
                                 float *maxv)
{
    assert(INFER_ATT_KT_HS(hs)); /* the head sizes with a kernel */
    by_nj[hs / 16 - 1](att, lda, q, ldq, nq, kt, ldt, T, d, maxv);
}

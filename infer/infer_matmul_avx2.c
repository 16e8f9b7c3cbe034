/* infer_matmul_avx2.c: the float matmul kernels with AVX2 + FMA. 16 ymm
 * registers hold 2 x rows by 4 w rows = 8 accumulators plus the 6 loaded
 * vectors, so a 4-row NT tile runs as two 2-row passes (the w rows come back
 * from L1); NN likewise handles 2 p rows by 32 columns at a time. F16/BF16
 * weights are widened as they are loaded (F16C vcvtph2ps, or a 16-bit
 * shift). Column tails use masked loads and stores. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "infer_matmul.h"

static inline float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Lanes below n (n may be <= 0 or >= 8) load, the rest read as 0. */
static inline __m256i lanes(int n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* 8 weights from w (element type wt) at element c, widened to float; with
 * n < 8 only the first n are read, the rest are 0. */
static inline __attribute__((always_inline)) __m256 load_w(const void *w, size_t c, uint32_t wt,
                                                           int n)
{
    if (wt == INFER_W_F32) {
        const float *p = (const float *)w + c;
        return n >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, lanes(n));
    }
    const uint16_t *p = (const uint16_t *)w + c;
    __m128i h;
    if (n >= 8) {
        h = _mm_loadu_si128((const __m128i *)p);
    } else {
        uint16_t tmp[8] = {0}; /* no 16-bit masked load in AVX2 */
        memcpy(tmp, p, (size_t)n * 2);
        h = _mm_loadu_si128((const __m128i *)tmp);
    }
    if (wt == INFER_W_F16)
        return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); /* bf16 */
}

static inline __attribute__((always_inline)) void tile(float *y, size_t ldy, const float *x,
                                                       size_t ldx, const uint32_t mr, const void *w,
                                                       size_t ldw, const uint32_t nr, uint32_t cols,
                                                       const uint32_t wt)
{
    size_t esz = wt == INFER_W_F32 ? 4 : 2;
    const char *wb = w;
    __m256 acc[2][INFER_MATMUL_NR];
#pragma GCC unroll 2
    for (uint32_t a = 0; a < mr; a++)
#pragma GCC unroll 4
        for (uint32_t b = 0; b < nr; b++)
            acc[a][b] = _mm256_setzero_ps();
    uint32_t c = 0;
    for (; c + 8 <= cols; c += 8) {
        __m256 xv[2], wv[INFER_MATMUL_NR];
#pragma GCC unroll 2
        for (uint32_t a = 0; a < mr; a++)
            xv[a] = _mm256_loadu_ps(x + a * ldx + c);
#pragma GCC unroll 4
        for (uint32_t b = 0; b < nr; b++)
            wv[b] = load_w(wb + b * ldw * esz, c, wt, 8);
#pragma GCC unroll 2
        for (uint32_t a = 0; a < mr; a++)
#pragma GCC unroll 4
            for (uint32_t b = 0; b < nr; b++)
                acc[a][b] = _mm256_fmadd_ps(xv[a], wv[b], acc[a][b]);
    }
    if (c < cols) {
        __m256i m = lanes((int)(cols - c));
        __m256 xv[2], wv[INFER_MATMUL_NR];
#pragma GCC unroll 2
        for (uint32_t a = 0; a < mr; a++)
            xv[a] = _mm256_maskload_ps(x + a * ldx + c, m);
#pragma GCC unroll 4
        for (uint32_t b = 0; b < nr; b++)
            wv[b] = load_w(wb + b * ldw * esz, c, wt, (int)(cols - c));
#pragma GCC unroll 2
        for (uint32_t a = 0; a < mr; a++)
#pragma GCC unroll 4
            for (uint32_t b = 0; b < nr; b++)
                acc[a][b] = _mm256_fmadd_ps(xv[a], wv[b], acc[a][b]);
    }
#pragma GCC unroll 2
    for (uint32_t a = 0; a < mr; a++)
#pragma GCC unroll 4
        for (uint32_t b = 0; b < nr; b++)
            y[a * ldy + b] = hsum(acc[a][b]);
}

#define TILE(M, N, WT, SUF)                                                                        \
    static void tile_##M##x##N##SUF(float *y, size_t ldy, const float *x, size_t ldx,              \
                                    const void *w, size_t ldw, uint32_t cols)                      \
    {                                                                                              \
        tile(y, ldy, x, ldx, M, w, ldw, N, cols, WT);                                              \
    }
#define TILE_ROW(M, WT, SUF)                                                                       \
    TILE(M, 1, WT, SUF) TILE(M, 2, WT, SUF) TILE(M, 3, WT, SUF) TILE(M, 4, WT, SUF)
#define TILE_ALL(WT, SUF) TILE_ROW(1, WT, SUF) TILE_ROW(2, WT, SUF)
TILE_ALL(INFER_W_F32, _f32)
TILE_ALL(INFER_W_F16, _f16)
TILE_ALL(INFER_W_BF16, _bf16)

typedef void tile_fixed_fn(float *y, size_t ldy, const float *x, size_t ldx, const void *w,
                           size_t ldw, uint32_t cols);
#define TABLE(SUF)                                                                                 \
    {                                                                                              \
        {tile_1x1##SUF, tile_1x2##SUF, tile_1x3##SUF, tile_1x4##SUF},                              \
            {tile_2x1##SUF, tile_2x2##SUF, tile_2x3##SUF, tile_2x4##SUF},                          \
    }
static tile_fixed_fn *const tiles[3][2][4] = {TABLE(_f32), TABLE(_f16), TABLE(_bf16)};

void infer_matmul_tile_avx2(float *y, size_t ldy, const float *x, size_t ldx, uint32_t mr,
                            const void *w, size_t ldw, uint32_t nr, uint32_t cols, uint32_t wt)
{
    /* rows 0-1, then rows 2-3 */
    uint32_t m0 = mr < 2 ? mr : 2;
    tiles[wt][m0 - 1][nr - 1](y, ldy, x, ldx, w, ldw, cols);
    if (mr > 2)
        tiles[wt][mr - 3][nr - 1](y + 2 * ldy, ldy, x + 2 * ldx, ldx, w, ldw, cols);
}

/* 32 columns of 1-2 rows; FULL: all 32 inside cols, plain loads and stores
 * (masked stores are slow on some cores), else masked: the same values. */
static inline __attribute__((always_inline)) void nn32(float *y, size_t ldy, const float *p,
                                                       size_t ldp, const uint32_t mr,
                                                       const float *v, size_t ldv, uint32_t T,
                                                       uint32_t cols, int add, uint32_t c0,
                                                       const int FULL)
{
    __m256i m[4];
    for (int j = 0; j < 4; j++)
        m[j] = lanes((int)cols - (int)(c0 + 8 * (uint32_t)j));
    __m256 acc[2][4];
#pragma GCC unroll 2
    for (uint32_t a = 0; a < mr; a++)
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++)
            acc[a][j] = !add ? _mm256_setzero_ps()
                        : FULL ? _mm256_loadu_ps(y + a * ldy + c0 + 8 * j)
                               : _mm256_maskload_ps(y + a * ldy + c0 + 8 * j, m[j]);
    for (uint32_t t = 0; t < T; t++) {
        const float *vt = v + t * ldv + c0;
        __m256 vv[4];
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++)
            vv[j] = FULL ? _mm256_loadu_ps(vt + 8 * j) : _mm256_maskload_ps(vt + 8 * j, m[j]);
#pragma GCC unroll 2
        for (uint32_t a = 0; a < mr; a++) {
            __m256 pa = _mm256_set1_ps(p[a * ldp + t]);
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++)
                acc[a][j] = _mm256_fmadd_ps(pa, vv[j], acc[a][j]);
        }
    }
#pragma GCC unroll 2
    for (uint32_t a = 0; a < mr; a++)
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            if (FULL)
                _mm256_storeu_ps(y + a * ldy + c0 + 8 * j, acc[a][j]);
            else
                _mm256_maskstore_ps(y + a * ldy + c0 + 8 * j, m[j], acc[a][j]);
        }
}

static inline __attribute__((always_inline)) void nn(float *y, size_t ldy, const float *p,
                                                     size_t ldp, const uint32_t mr, const float *v,
                                                     size_t ldv, uint32_t T, uint32_t cols, int add)
{
    uint32_t c0 = 0;
    for (; c0 + 32 <= cols; c0 += 32)
        nn32(y, ldy, p, ldp, mr, v, ldv, T, cols, add, c0, 1);
    if (c0 < cols)
        nn32(y, ldy, p, ldp, mr, v, ldv, T, cols, add, c0, 0);
}

static void nn_1(float *y, size_t ldy, const float *p, size_t ldp, const float *v, size_t ldv,
                 uint32_t T, uint32_t cols, int add)
{
    nn(y, ldy, p, ldp, 1, v, ldv, T, cols, add);
}

static void nn_2(float *y, size_t ldy, const float *p, size_t ldp, const float *v, size_t ldv,
                 uint32_t T, uint32_t cols, int add)
{
    nn(y, ldy, p, ldp, 2, v, ldv, T, cols, add);
}

/* 4 rows by NV x 8 columns from c0 (all inside cols): 4 x NV accumulators
 * (12 with NV 3, plus 3 value vectors and a broadcast: all 16 registers),
 * so each value vector loaded serves 4 rows and an iteration has 12
 * independent FMAs, past their latency (nn32's 2 rows: 8 FMAs, and each
 * value vector loaded once per row pair). Every element is the same FMA
 * chain over t as nn32's: the same bits. */
static inline __attribute__((always_inline)) void nn4(float *y, size_t ldy, const float *p,
                                                      size_t ldp, const float *v, size_t ldv,
                                                      uint32_t T, int add, uint32_t c0,
                                                      const int NV)
{
    __m256 acc[4][3];
#pragma GCC unroll 4
    for (int a = 0; a < 4; a++)
#pragma GCC unroll 3
        for (int j = 0; j < NV; j++)
            acc[a][j] = add ? _mm256_loadu_ps(y + a * ldy + c0 + 8 * j) : _mm256_setzero_ps();
    const float *vt = v + c0;
    for (uint32_t t = 0; t < T; t++, vt += ldv) {
        __m256 vv[3];
#pragma GCC unroll 3
        for (int j = 0; j < NV; j++)
            vv[j] = _mm256_loadu_ps(vt + 8 * j);
#pragma GCC unroll 4
        for (int a = 0; a < 4; a++) {
            __m256 pa = _mm256_broadcast_ss(p + a * ldp + t);
#pragma GCC unroll 3
            for (int j = 0; j < NV; j++)
                acc[a][j] = _mm256_fmadd_ps(pa, vv[j], acc[a][j]);
        }
    }
#pragma GCC unroll 4
    for (int a = 0; a < 4; a++)
#pragma GCC unroll 3
        for (int j = 0; j < NV; j++)
            _mm256_storeu_ps(y + a * ldy + c0 + 8 * j, acc[a][j]);
}

static void nn4_24(float *y, size_t ldy, const float *p, size_t ldp, const float *v, size_t ldv,
                   uint32_t T, int add, uint32_t c0)
{
    nn4(y, ldy, p, ldp, v, ldv, T, add, c0, 3);
}

static void nn4_16(float *y, size_t ldy, const float *p, size_t ldp, const float *v, size_t ldv,
                   uint32_t T, int add, uint32_t c0)
{
    nn4(y, ldy, p, ldp, v, ldv, T, add, c0, 2);
}

static void nn4_8(float *y, size_t ldy, const float *p, size_t ldp, const float *v, size_t ldv,
                  uint32_t T, int add, uint32_t c0)
{
    nn4(y, ldy, p, ldp, v, ldv, T, add, c0, 1);
}

void infer_matmul_nn_avx2(float *y, size_t ldy, const float *p, size_t ldp, uint32_t mr,
                          const float *v, size_t ldv, uint32_t T, uint32_t cols, int add)
{
    if (mr == 4) { /* 24 columns at a time, then 16, 8, and a tail of 1-7 as below */
        uint32_t c0 = 0;
        for (; c0 + 24 <= cols; c0 += 24)
            nn4_24(y, ldy, p, ldp, v, ldv, T, add, c0);
        if (c0 + 16 <= cols) {
            nn4_16(y, ldy, p, ldp, v, ldv, T, add, c0);
            c0 += 16;
        }
        if (c0 + 8 <= cols) {
            nn4_8(y, ldy, p, ldp, v, ldv, T, add, c0);
            c0 += 8;
        }
        if (c0 < cols) {
            nn_2(y + c0, ldy, p, ldp, v + c0, ldv, T, cols - c0, add);
            nn_2(y + 2 * ldy + c0, ldy, p + 2 * ldp, ldp, v + c0, ldv, T, cols - c0, add);
        }
        return;
    }
    if (mr >= 2)
        nn_2(y, ldy, p, ldp, v, ldv, T, cols, add);
    else
        nn_1(y, ldy, p, ldp, v, ldv, T, cols, add);
    if (mr == 3)
        nn_1(y + 2 * ldy, ldy, p + 2 * ldp, ldp, v, ldv, T, cols, add);
    else if (mr == 4)
        nn_2(y + 2 * ldy, ldy, p + 2 * ldp, ldp, v, ldv, T, cols, add);
}

/* ---- exp for softmax: infer_exp_sum_scalar's definition, 8 lanes ----------------------------- */

static __m256 exp8(__m256 x)
{
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(INFER_EXP_LOG2E)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-INFER_EXP_LN2_HI), x);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(INFER_EXP_LN2_LO), r);
    __m256 p = _mm256_set1_ps(INFER_EXP_P5);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(INFER_EXP_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(INFER_EXP_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(INFER_EXP_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(INFER_EXP_P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(INFER_EXP_P0));
    __m256 e = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    __m256i ni = _mm256_cvtps_epi32(
        _mm256_max_ps(_mm256_min_ps(n, _mm256_set1_ps(127.0f)), _mm256_set1_ps(-126.0f)));
    __m256 two =
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(ni, _mm256_set1_epi32(127)), 23));
    e = _mm256_mul_ps(e, two);
    e = _mm256_blendv_ps(e, _mm256_setzero_ps(),
                         _mm256_cmp_ps(x, _mm256_set1_ps(INFER_EXP_LO), _CMP_LT_OQ));
    e = _mm256_blendv_ps(e, _mm256_set1_ps(INFINITY),
                         _mm256_cmp_ps(x, _mm256_set1_ps(INFER_EXP_HI), _CMP_GT_OQ));
    return _mm256_blendv_ps(e, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

/* lanes [0, k) of 8 set */
static __m256i first_lanes(uint32_t k)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

static __m256 exp_part(float *a, uint32_t left, __m256 s)
{
    if (left >= 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(a), s));
        _mm256_storeu_ps(a, e);
        return e;
    }
    __m256i m = first_lanes(left);
    __m256 e = exp8(_mm256_sub_ps(_mm256_maskload_ps(a, m), s));
    _mm256_maskstore_ps(a, m, e);
    return _mm256_and_ps(e, _mm256_castsi256_ps(m));
}

float infer_exp_sum_avx2(float *a, uint32_t n, float sub)
{
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps(), s = _mm256_set1_ps(sub);
    for (uint32_t t = 0; t < n; t += 16) {
        lo = _mm256_add_ps(lo, exp_part(a + t, n - t, s));
        if (n - t > 8)
            hi = _mm256_add_ps(hi, exp_part(a + t + 8, n - t - 8, s));
    }
    __m256 s8 = _mm256_add_ps(lo, hi);
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

/* ---- softmax scaling: infer_div_max_scalar's definition, 2 x 8 lanes ----------------------- */

static __m256 div_part(float *a, uint32_t left, __m256 dv, __m256 acc)
{
    if (left >= 8) { /* plain load and store: masked stores are slow on some cores */
        __m256 x = _mm256_div_ps(_mm256_loadu_ps(a), dv);
        _mm256_storeu_ps(a, x);
        return _mm256_blendv_ps(acc, x, _mm256_cmp_ps(x, acc, _CMP_GT_OQ));
    }
    __m256i m = first_lanes(left);
    __m256 x = _mm256_div_ps(_mm256_maskload_ps(a, m), dv);
    _mm256_maskstore_ps(a, m, x);
    __m256 gt = _mm256_and_ps(_mm256_cmp_ps(x, acc, _CMP_GT_OQ), _mm256_castsi256_ps(m));
    return _mm256_blendv_ps(acc, x, gt);
}

/* infer_div_max_reduce16 of lanes lo (m[0..8)) and hi (m[8..16)) in
 * registers: each step keeps m[i + w] where it is greater than m[i] (an
 * ordered compare: NaN and ties keep m[i]), w = 8, 4, 2, 1, as the scalar
 * loop does. */
static float reduce16(__m256 lo, __m256 hi)
{
    __m256 m8 = _mm256_blendv_ps(lo, hi, _mm256_cmp_ps(hi, lo, _CMP_GT_OQ));
    __m128 a = _mm256_castps256_ps128(m8), b = _mm256_extractf128_ps(m8, 1);
    __m128 m4 = _mm_blendv_ps(a, b, _mm_cmp_ps(b, a, _CMP_GT_OQ));
    __m128 c = _mm_movehl_ps(m4, m4); /* m[i + 2] at lane i */
    __m128 m2 = _mm_blendv_ps(m4, c, _mm_cmp_ps(c, m4, _CMP_GT_OQ));
    __m128 d = _mm_movehdup_ps(m2); /* m[1] at lane 0 */
    __m128 m1 = _mm_blendv_ps(m2, d, _mm_cmp_ps(d, m2, _CMP_GT_OQ));
    return _mm_cvtss_f32(m1);
}

float infer_div_max_avx2(float *a, uint32_t n, float d)
{
    __m256 dv = _mm256_set1_ps(d);
    __m256 lo = _mm256_set1_ps(-INFINITY), hi = lo;
    for (uint32_t t = 0; t < n; t += 16) {
        lo = div_part(a + t, n - t, dv, lo);
        if (n - t > 8)
            hi = div_part(a + t + 8, n - t - 8, dv, hi);
    }
    return reduce16(lo, hi);
}

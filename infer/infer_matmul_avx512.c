/* infer_matmul_avx512.c: the float matmul kernels with AVX-512F (+BW for
 * masked 16-bit loads). NT: 4 x rows by 4 w rows = 16 accumulators of 16
 * lanes (of 32 zmm registers), one FMA per loaded pair; F16/BF16 weights are
 * widened as they are loaded (vcvtph2ps, or a 16-bit shift). NN: 1-4 p rows
 * by up to 64 columns of v (at most 16 accumulators; a narrower tail runs
 * only the vectors it has), 5-8 p rows by 32 columns (8 x 2 accumulators);
 * each v row piece is loaded once for all the p rows. Column tails use
 * masked loads and stores. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "infer_div_max_avx512_inl.h"
#include "infer_matmul.h"

/* 16 weights from w (element type wt) at element c, widened to float;
 * lanes outside m read as 0. */
static inline __attribute__((always_inline)) __m512 load_w(const void *w, size_t c, uint32_t wt,
                                                           __mmask16 m, int full)
{
    if (wt == INFER_W_F32) {
        const float *p = (const float *)w + c;
        return full ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(m, p);
    }
    const uint16_t *p = (const uint16_t *)w + c;
    __m256i h = full ? _mm256_loadu_si256((const __m256i *)p) : _mm256_maskz_loadu_epi16(m, p);
    if (wt == INFER_W_F16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); /* bf16 */
}

/* The 16 sums of a full 4 x 4 tile with the additions of
 * _mm512_reduce_add_ps (lane i + i+8, then j + j+4, then k + k+2, then
 * 0 + 1; float addition commutes exactly), but on four vectors at once at
 * every level: 15 adds and 30 shuffles instead of 16 separate reductions of
 * 7 shuffles and 4 adds each. With head_dim 64 the attention scores are
 * 4 FMAs per accumulator, so the reductions were most of the tile's work.
 * v[4b + a] = acc[a][b], so that 128-bit lane a of the result is y[a][0..3]. */
static inline __attribute__((always_inline)) void reduce_store_4x4(float *y, size_t ldy,
                                                                   __m512 acc[4][4])
{
    __m512 v[16], w[8], z[4], u[2];
#pragma GCC unroll 4
    for (int a = 0; a < 4; a++)
#pragma GCC unroll 4
        for (int b = 0; b < 4; b++)
            v[4 * b + a] = acc[a][b];
    /* w[p]: lanes 0-7 v[2p][i] + v[2p][i+8], lanes 8-15 the same of v[2p+1] */
#pragma GCC unroll 8
    for (int p = 0; p < 8; p++)
        w[p] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], 0xEE));
    /* z[q]: 128-bit lane m holds v[4q + m]'s four sums j + j+4 */
#pragma GCC unroll 4
    for (int q = 0; q < 4; q++)
        z[q] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * q], w[2 * q + 1], 0x88),
                             _mm512_shuffle_f32x4(w[2 * q], w[2 * q + 1], 0xDD));
    /* u[h], lane L: k + k+2 (k = 0, 1) of v[8h + L], then of v[8h + 4 + L] */
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++)
        u[h] = _mm512_add_ps(_mm512_shuffle_ps(z[2 * h], z[2 * h + 1], 0x44),
                             _mm512_shuffle_ps(z[2 * h], z[2 * h + 1], 0xEE));
    /* r, lane L element m: the sum of v[4m + L] = acc[L][m] */
    __m512 r = _mm512_add_ps(_mm512_shuffle_ps(u[0], u[1], 0x88),
                             _mm512_shuffle_ps(u[0], u[1], 0xDD));
    _mm_storeu_ps(y, _mm512_castps512_ps128(r));
    _mm_storeu_ps(y + ldy, _mm512_extractf32x4_ps(r, 1));
    _mm_storeu_ps(y + 2 * ldy, _mm512_extractf32x4_ps(r, 2));
    _mm_storeu_ps(y + 3 * ldy, _mm512_extractf32x4_ps(r, 3));
}

static inline __attribute__((always_inline)) void tile(float *y, size_t ldy, const float *x,
                                                       size_t ldx, const uint32_t mr, const void *w,
                                                       size_t ldw, const uint32_t nr, uint32_t cols,
                                                       const uint32_t wt)
{
    size_t esz = wt == INFER_W_F32 ? 4 : 2;
    const char *wb = w;
    __m512 acc[INFER_MATMUL_MR][INFER_MATMUL_NR];
#pragma GCC unroll 4
    for (uint32_t a = 0; a < mr; a++)
#pragma GCC unroll 4
        for (uint32_t b = 0; b < nr; b++)
            acc[a][b] = _mm512_setzero_ps();
    uint32_t c = 0;
    for (; c + 16 <= cols; c += 16) {
        __m512 xv[INFER_MATMUL_MR], wv[INFER_MATMUL_NR];
#pragma GCC unroll 4
        for (uint32_t a = 0; a < mr; a++)
            xv[a] = _mm512_loadu_ps(x + a * ldx + c);
#pragma GCC unroll 4
        for (uint32_t b = 0; b < nr; b++)
            wv[b] = load_w(wb + b * ldw * esz, c, wt, 0xffff, 1);
#pragma GCC unroll 4
        for (uint32_t a = 0; a < mr; a++)
#pragma GCC unroll 4
            for (uint32_t b = 0; b < nr; b++)
                acc[a][b] = _mm512_fmadd_ps(xv[a], wv[b], acc[a][b]);
    }
    if (c < cols) {
        __mmask16 m = (__mmask16)((1u << (cols - c)) - 1);
        __m512 xv[INFER_MATMUL_MR], wv[INFER_MATMUL_NR];
#pragma GCC unroll 4
        for (uint32_t a = 0; a < mr; a++)
            xv[a] = _mm512_maskz_loadu_ps(m, x + a * ldx + c);
#pragma GCC unroll 4
        for (uint32_t b = 0; b < nr; b++)
            wv[b] = load_w(wb + b * ldw * esz, c, wt, m, 0);
#pragma GCC unroll 4
        for (uint32_t a = 0; a < mr; a++)
#pragma GCC unroll 4
            for (uint32_t b = 0; b < nr; b++)
                acc[a][b] = _mm512_fmadd_ps(xv[a], wv[b], acc[a][b]);
    }
    if (mr == 4 && nr == 4) {
        reduce_store_4x4(y, ldy, acc);
        return;
    }
#pragma GCC unroll 4
    for (uint32_t a = 0; a < mr; a++)
#pragma GCC unroll 4
        for (uint32_t b = 0; b < nr; b++)
            y[a * ldy + b] = _mm512_reduce_add_ps(acc[a][b]);
}

#define TILE(M, N, WT, SUF)                                                                        \
    static void tile_##M##x##N##SUF(float *y, size_t ldy, const float *x, size_t ldx,              \
                                    const void *w, size_t ldw, uint32_t cols)                      \
    {                                                                                              \
        tile(y, ldy, x, ldx, M, w, ldw, N, cols, WT);                                              \
    }
#define TILE_ROW(M, WT, SUF)                                                                       \
    TILE(M, 1, WT, SUF) TILE(M, 2, WT, SUF) TILE(M, 3, WT, SUF) TILE(M, 4, WT, SUF)
#define TILE_ALL(WT, SUF)                                                                          \
    TILE_ROW(1, WT, SUF) TILE_ROW(2, WT, SUF) TILE_ROW(3, WT, SUF) TILE_ROW(4, WT, SUF)
TILE_ALL(INFER_W_F32, _f32)
TILE_ALL(INFER_W_F16, _f16)
TILE_ALL(INFER_W_BF16, _bf16)

typedef void tile_fixed_fn(float *y, size_t ldy, const float *x, size_t ldx, const void *w,
                           size_t ldw, uint32_t cols);
#define TABLE(SUF)                                                                                 \
    {                                                                                              \
        {tile_1x1##SUF, tile_1x2##SUF, tile_1x3##SUF, tile_1x4##SUF},                              \
            {tile_2x1##SUF, tile_2x2##SUF, tile_2x3##SUF, tile_2x4##SUF},                          \
            {tile_3x1##SUF, tile_3x2##SUF, tile_3x3##SUF, tile_3x4##SUF},                          \
            {tile_4x1##SUF, tile_4x2##SUF, tile_4x3##SUF, tile_4x4##SUF},                          \
    }
static tile_fixed_fn *const tiles[3][4][4] = {TABLE(_f32), TABLE(_f16), TABLE(_bf16)};

void infer_matmul_tile_avx512(float *y, size_t ldy, const float *x, size_t ldx, uint32_t mr,
                              const void *w, size_t ldw, uint32_t nr, uint32_t cols, uint32_t wt)
{
    tiles[wt][mr - 1][nr - 1](y, ldy, x, ldx, w, ldw, cols);
}

/* Lanes [c, min(c + 16, cols)) of a 16-lane vector starting at column c. */
static inline __mmask16 lanes(uint32_t c, uint32_t cols)
{
    if (c >= cols)
        return 0;
    return cols - c >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (cols - c)) - 1);
}

/* One chunk of nv (1..4) 16-lane column vectors from column c0 (the last
 * one masked to cols): mr rows' sums (mr x nv <= 32 accumulators: up to 4
 * rows with 4 vectors, up to 8 with 2), each value row loaded once for
 * them. mr and nv are constants where it is called: a head of 32 columns
 * runs 2 vectors, not 4 with 2 of them masked off (their FMAs on zeros took
 * half the work). Every output is one FMA chain over the keys in order,
 * whatever nv and mr: the same bits. */
static inline __attribute__((always_inline)) void nn_chunk(float *y, size_t ldy, const float *p,
                                                           size_t ldp, const uint32_t mr,
                                                           const float *v, size_t ldv, uint32_t T,
                                                           uint32_t c0, uint32_t cols, int add,
                                                           const int nv)
{
    __mmask16 m[4];
    for (int j = 0; j < nv; j++)
        m[j] = lanes(c0 + 16 * (uint32_t)j, cols);
    __m512 acc[INFER_MATMUL_NN_ROWS_AVX512][4];
#pragma GCC unroll 8
    for (uint32_t a = 0; a < mr; a++)
#pragma GCC unroll 4
        for (int j = 0; j < nv; j++)
            acc[a][j] =
                add ? _mm512_maskz_loadu_ps(m[j], y + a * ldy + c0 + 16 * j) : _mm512_setzero_ps();
    for (uint32_t t = 0; t < T; t++) {
        const float *vt = v + t * ldv + c0;
        __m512 vv[4];
#pragma GCC unroll 4
        for (int j = 0; j < nv; j++)
            vv[j] = _mm512_maskz_loadu_ps(m[j], vt + 16 * j);
#pragma GCC unroll 8
        for (uint32_t a = 0; a < mr; a++) {
            __m512 pa = _mm512_set1_ps(p[a * ldp + t]);
#pragma GCC unroll 4
            for (int j = 0; j < nv; j++)
                acc[a][j] = _mm512_fmadd_ps(pa, vv[j], acc[a][j]);
        }
    }
#pragma GCC unroll 8
    for (uint32_t a = 0; a < mr; a++)
#pragma GCC unroll 4
        for (int j = 0; j < nv; j++)
            _mm512_mask_storeu_ps(y + a * ldy + c0 + 16 * j, m[j], acc[a][j]);
}

/* 1-4 rows: 64 columns a chunk (mr x 4 accumulators), the tail in as few
 * vectors as it needs. 5-8 rows: 32 columns a pass (mr x 2), so each value
 * is loaded once for all the rows (two 4-row calls would load it twice);
 * a pass over the keys reads 32 columns of each value row, the next
 * columns the next pass (p is read again each pass, twice as often as at
 * 64). mr is a constant in each nn_M. */
static inline __attribute__((always_inline)) void nn(float *y, size_t ldy, const float *p,
                                                     size_t ldp, const uint32_t mr, const float *v,
                                                     size_t ldv, uint32_t T, uint32_t cols, int add)
{
    uint32_t c0 = 0;
    if (mr > INFER_MATMUL_MR) {
        for (; c0 + 16 < cols; c0 += 32) /* 17 to 32 columns from c0 */
            nn_chunk(y, ldy, p, ldp, mr, v, ldv, T, c0, cols, add, 2);
        if (c0 < cols)
            nn_chunk(y, ldy, p, ldp, mr, v, ldv, T, c0, cols, add, 1);
        return;
    }
    for (; c0 + 48 < cols; c0 += 64) /* 49 to 64 columns from c0 */
        nn_chunk(y, ldy, p, ldp, mr, v, ldv, T, c0, cols, add, 4);
    /* the tail: 0 to 48 columns in as many vectors as they need */
    uint32_t rem = cols > c0 ? cols - c0 : 0;
    if (rem > 32)
        nn_chunk(y, ldy, p, ldp, mr, v, ldv, T, c0, cols, add, 3);
    else if (rem > 16)
        nn_chunk(y, ldy, p, ldp, mr, v, ldv, T, c0, cols, add, 2);
    else if (rem > 0)
        nn_chunk(y, ldy, p, ldp, mr, v, ldv, T, c0, cols, add, 1);
}

#define NN(M)                                                                                      \
    static void nn_##M(float *y, size_t ldy, const float *p, size_t ldp, const float *v,           \
                       size_t ldv, uint32_t T, uint32_t cols, int add)                             \
    {                                                                                              \
        nn(y, ldy, p, ldp, M, v, ldv, T, cols, add);                                               \
    }
NN(1)
NN(2)
NN(3)
NN(4)
NN(5)
NN(6)
NN(7)
NN(8)

typedef void nn_fixed_fn(float *y, size_t ldy, const float *p, size_t ldp, const float *v,
                         size_t ldv, uint32_t T, uint32_t cols, int add);
static nn_fixed_fn *const nns[INFER_MATMUL_NN_ROWS_AVX512] = {nn_1, nn_2, nn_3, nn_4,
                                                              nn_5, nn_6, nn_7, nn_8};

void infer_matmul_nn_avx512(float *y, size_t ldy, const float *p, size_t ldp, uint32_t mr,
                            const float *v, size_t ldv, uint32_t T, uint32_t cols, int add)
{
    nns[mr - 1](y, ldy, p, ldp, v, ldv, T, cols, add);
}

/* ---- exp for softmax: infer_exp_sum_scalar's definition, 16 lanes ---------------------------- */

static __m512 exp16(__m512 x)
{
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(INFER_EXP_LOG2E)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-INFER_EXP_LN2_HI), x);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(INFER_EXP_LN2_LO), r);
    __m512 p = _mm512_set1_ps(INFER_EXP_P5);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(INFER_EXP_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(INFER_EXP_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(INFER_EXP_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(INFER_EXP_P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(INFER_EXP_P0));
    __m512 e = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    /* 2^n for the lanes in range (others are replaced below) */
    __m512i ni = _mm512_cvtps_epi32(
        _mm512_max_ps(_mm512_min_ps(n, _mm512_set1_ps(127.0f)), _mm512_set1_ps(-126.0f)));
    __m512 two =
        _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(ni, _mm512_set1_epi32(127)), 23));
    e = _mm512_mul_ps(e, two);
    __mmask16 lo = _mm512_cmp_ps_mask(x, _mm512_set1_ps(INFER_EXP_LO), _CMP_LT_OQ);
    __mmask16 hi = _mm512_cmp_ps_mask(x, _mm512_set1_ps(INFER_EXP_HI), _CMP_GT_OQ);
    __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    e = _mm512_mask_mov_ps(e, lo, _mm512_setzero_ps());
    e = _mm512_mask_mov_ps(e, hi, _mm512_set1_ps(INFINITY));
    return _mm512_mask_mov_ps(e, nan, x);
}

float infer_exp_sum_avx512(float *a, uint32_t n, float sub)
{
    __m512 acc = _mm512_setzero_ps(), s = _mm512_set1_ps(sub);
    for (uint32_t t = 0; t < n; t += 16) {
        __mmask16 m = n - t >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - t)) - 1);
        __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, a + t), s));
        _mm512_mask_storeu_ps(a + t, m, e);
        acc = _mm512_add_ps(acc, _mm512_maskz_mov_ps(m, e));
    }
    __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(acc),
                              _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1)));
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

/* ---- SwiGLU: infer_op_swiglu's arithmetic, 16 lanes ------------------------------------ */

void infer_swiglu_avx512(float *h, const float *g, const float *u, size_t n)
{
    const __m512 one = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u);
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 gv = _mm512_maskz_loadu_ps(m, g + i);
        /* -g (a sign flip, as C's unary minus), then exp(-g - 0) as infer_exp_sum does */
        __m512 ng = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(gv), sign));
        __m512 e = exp16(_mm512_sub_ps(ng, zero));
        __m512 v = _mm512_mul_ps(gv, _mm512_div_ps(one, _mm512_add_ps(one, e)));
        _mm512_mask_storeu_ps(h + i, m, _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, u + i)));
    }
}

/* ---- softmax scaling: infer_div_max_scalar's definition, 16 lanes -------------------------- */

float infer_div_max_avx512(float *a, uint32_t n, float d)
{
    __m512 iv, dv = _mm512_set1_ps(d);
    int pow2 = infer_div_pow2(d, &iv);
    return infer_div_max_fold16_avx512(infer_div_max16_avx512(a, n, pow2, iv, dv));
}

/* infer_matmul_rows_avx2.c: the float NT matmul for a few x rows (a draft
 * tree's verification, a multi-sequence step, a plain decode step:
 * 1..INFER_MATMUL_ROWS_MAX rows)
 * with AVX2 + FMA, on float32 weights.
 *
 * The blocked kernel (infer_matmul.c + infer_matmul_avx2.c) runs 2 x rows by
 * 4 w rows per pass and goes through every w block once per 4 x rows: with
 * 8 accumulators and index arithmetic in the loop, the rows past the first
 * cost almost as much as the first (8 rows ~3x one row on kjv6L-1k). Here
 * each tile of 3 w rows stays in registers and L1 while every x row passes
 * over it, 4 at a time: 12 accumulators, 3 weight vectors and one x vector
 * (all 16 ymm registers), 7 loads per 12 FMAs, pointers stepped in the
 * loop, the weights two tiles ahead prefetched. The weights cross the
 * memory bus once per call whatever the rows.
 *
 * Every output is the AVX2 tile's: 8 lanes summed with FMA in column order
 * from zero, the column tail masked to zeros, then the same horizontal sum
 * (lanes j + j+4, then j + j+2, then 0 + 1). So a row gets the same bits
 * here as in a one-row decode step (test_matmul_rows). */
#include <immintrin.h>

#include "infer_matmul.h"

static inline float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#define ROWS_NR 3 /* w rows per tile */
#define ROWS_MR 4 /* x rows per pass over it */
/* Weights are asked for this many rows ahead (two tiles): without it the
 * tile's first pass over 3 rows streams at 6-8 GB/s; with it at 17-40 GB/s
 * (2-16 rows, measured on this AVX2 machine). */
#define PF_ROWS 6

/* y[a * ldy + b] = dot(x row a, w row b) for a < mr, b < nr. */
static inline __attribute__((always_inline)) void tile(float *y, size_t ldy, const float *x,
                                                       size_t ldx, const uint32_t mr,
                                                       const float *w, size_t ldw,
                                                       const uint32_t nr, uint32_t cols)
{
    __m256 acc[ROWS_MR][ROWS_NR];
    const float *xp[ROWS_MR], *wp[ROWS_NR];
#pragma GCC unroll 4
    for (uint32_t a = 0; a < mr; a++) {
        xp[a] = x + a * ldx;
#pragma GCC unroll 3
        for (uint32_t b = 0; b < nr; b++)
            acc[a][b] = _mm256_setzero_ps();
    }
#pragma GCC unroll 3
    for (uint32_t b = 0; b < nr; b++)
        wp[b] = w + b * ldw;
    for (uint32_t k = cols / 8; k; k--) {
        __m256 wv[ROWS_NR];
#pragma GCC unroll 3
        for (uint32_t b = 0; b < nr; b++) {
            _mm_prefetch((const char *)(wp[b] + PF_ROWS * ldw), _MM_HINT_T0);
            wv[b] = _mm256_loadu_ps(wp[b]);
            wp[b] += 8;
        }
#pragma GCC unroll 4
        for (uint32_t a = 0; a < mr; a++) {
            __m256 xv = _mm256_loadu_ps(xp[a]);
            xp[a] += 8;
#pragma GCC unroll 3
            for (uint32_t b = 0; b < nr; b++)
                acc[a][b] = _mm256_fmadd_ps(xv, wv[b], acc[a][b]);
        }
    }
    if (cols % 8) {
        __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(cols % 8)),
                                       _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        __m256 wv[ROWS_NR];
#pragma GCC unroll 3
        for (uint32_t b = 0; b < nr; b++)
            wv[b] = _mm256_maskload_ps(wp[b], m);
#pragma GCC unroll 4
        for (uint32_t a = 0; a < mr; a++) {
            __m256 xv = _mm256_maskload_ps(xp[a], m);
#pragma GCC unroll 3
            for (uint32_t b = 0; b < nr; b++)
                acc[a][b] = _mm256_fmadd_ps(xv, wv[b], acc[a][b]);
        }
    }
#pragma GCC unroll 4
    for (uint32_t a = 0; a < mr; a++)
#pragma GCC unroll 3
        for (uint32_t b = 0; b < nr; b++)
            y[a * ldy + b] = hsum(acc[a][b]);
}

typedef void tile_fn(float *y, size_t ldy, const float *x, size_t ldx, const float *w, size_t ldw,
                     uint32_t cols);
#define TILE(M, N)                                                                                 \
    static void tile_##M##x##N(float *y, size_t ldy, const float *x, size_t ldx, const float *w,   \
                               size_t ldw, uint32_t cols)                                          \
    {                                                                                              \
        tile(y, ldy, x, ldx, M, w, ldw, N, cols);                                                  \
    }
#define TILE_ROW(M) TILE(M, 1) TILE(M, 2) TILE(M, 3)
TILE_ROW(1)
TILE_ROW(2)
TILE_ROW(3)
TILE_ROW(4)
static tile_fn *const tiles[ROWS_MR][ROWS_NR] = {{tile_1x1, tile_1x2, tile_1x3},
                                                 {tile_2x1, tile_2x2, tile_2x3},
                                                 {tile_3x1, tile_3x2, tile_3x3},
                                                 {tile_4x1, tile_4x2, tile_4x3}};

void infer_matmul_rows_avx2(float *y, size_t ldy, const float *x, size_t ldx, uint32_t n,
                            const float *w, size_t ldw, uint32_t cols, uint32_t r0, uint32_t r1)
{
    for (uint32_t r = r0; r < r1; r += ROWS_NR) {
        uint32_t nr = r1 - r < ROWS_NR ? r1 - r : ROWS_NR;
        const float *wr = w + r * ldw;
        for (uint32_t i = 0; i < n; i += ROWS_MR) {
            uint32_t mr = n - i < ROWS_MR ? n - i : ROWS_MR;
            tiles[mr - 1][nr - 1](y + i * ldy + r, ldy, x + i * ldx, ldx, wr, ldw, cols);
        }
    }
}

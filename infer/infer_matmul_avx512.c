/* infer_matmul_avx512.c: the float matmul tile with AVX-512F: 4 input rows x
 * 4 weight rows = 16 accumulators of 16 lanes (of 32 zmm registers), one
 * FMA per loaded pair; the column tail uses masked loads. */
#include <immintrin.h>

#include "infer_matmul.h"

static inline __attribute__((always_inline)) void tile(float *y, size_t ldy, const float *x,
                                                       const uint32_t mr, const float *w,
                                                       const uint32_t nr, uint32_t cols)
{
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
            xv[a] = _mm512_loadu_ps(x + (size_t)a * cols + c);
#pragma GCC unroll 4
        for (uint32_t b = 0; b < nr; b++)
            wv[b] = _mm512_loadu_ps(w + (size_t)b * cols + c);
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
            xv[a] = _mm512_maskz_loadu_ps(m, x + (size_t)a * cols + c);
#pragma GCC unroll 4
        for (uint32_t b = 0; b < nr; b++)
            wv[b] = _mm512_maskz_loadu_ps(m, w + (size_t)b * cols + c);
#pragma GCC unroll 4
        for (uint32_t a = 0; a < mr; a++)
#pragma GCC unroll 4
            for (uint32_t b = 0; b < nr; b++)
                acc[a][b] = _mm512_fmadd_ps(xv[a], wv[b], acc[a][b]);
    }
#pragma GCC unroll 4
    for (uint32_t a = 0; a < mr; a++)
#pragma GCC unroll 4
        for (uint32_t b = 0; b < nr; b++)
            y[a * ldy + b] = _mm512_reduce_add_ps(acc[a][b]);
}

#define TILE(M, N)                                                                           \
    static void tile_##M##x##N(float *y, size_t ldy, const float *x, const float *w,        \
                               uint32_t cols)                                                \
    {                                                                                        \
        tile(y, ldy, x, M, w, N, cols);                                                      \
    }
#define TILE_ROW(M) TILE(M, 1) TILE(M, 2) TILE(M, 3) TILE(M, 4)
TILE_ROW(1)
TILE_ROW(2)
TILE_ROW(3)
TILE_ROW(4)

typedef void tile_fixed_fn(float *y, size_t ldy, const float *x, const float *w, uint32_t cols);
static tile_fixed_fn *const tiles[4][4] = {
    {tile_1x1, tile_1x2, tile_1x3, tile_1x4},
    {tile_2x1, tile_2x2, tile_2x3, tile_2x4},
    {tile_3x1, tile_3x2, tile_3x3, tile_3x4},
    {tile_4x1, tile_4x2, tile_4x3, tile_4x4},
};

void infer_matmul_tile_avx512(float *y, size_t ldy, const float *x, uint32_t mr, const float *w,
                              uint32_t nr, uint32_t cols)
{
    tiles[mr - 1][nr - 1](y, ldy, x, w, cols);
}

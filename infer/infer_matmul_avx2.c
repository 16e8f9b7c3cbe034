/* infer_matmul_avx2.c: the float matmul tile with AVX2 + FMA. 16 ymm
 * registers hold 2 input rows x 4 weight rows = 8 accumulators plus the 6
 * loaded vectors, so a 4-row tile runs as two 2-row passes (the weight rows
 * come back from L1). The column tail uses masked loads. */
#include <immintrin.h>

#include "infer_matmul.h"

static inline float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline __attribute__((always_inline)) void tile(float *y, size_t ldy, const float *x,
                                                       const uint32_t mr, const float *w,
                                                       const uint32_t nr, uint32_t cols)
{
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
            xv[a] = _mm256_loadu_ps(x + (size_t)a * cols + c);
#pragma GCC unroll 4
        for (uint32_t b = 0; b < nr; b++)
            wv[b] = _mm256_loadu_ps(w + (size_t)b * cols + c);
#pragma GCC unroll 2
        for (uint32_t a = 0; a < mr; a++)
#pragma GCC unroll 4
            for (uint32_t b = 0; b < nr; b++)
                acc[a][b] = _mm256_fmadd_ps(xv[a], wv[b], acc[a][b]);
    }
    if (c < cols) {
        /* lanes below cols - c load, the rest read as 0 */
        __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(cols - c)),
                                       _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        __m256 xv[2], wv[INFER_MATMUL_NR];
#pragma GCC unroll 2
        for (uint32_t a = 0; a < mr; a++)
            xv[a] = _mm256_maskload_ps(x + (size_t)a * cols + c, m);
#pragma GCC unroll 4
        for (uint32_t b = 0; b < nr; b++)
            wv[b] = _mm256_maskload_ps(w + (size_t)b * cols + c, m);
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

#define TILE(M, N)                                                                           \
    static void tile_##M##x##N(float *y, size_t ldy, const float *x, const float *w,        \
                               uint32_t cols)                                                \
    {                                                                                        \
        tile(y, ldy, x, M, w, N, cols);                                                      \
    }
#define TILE_ROW(M) TILE(M, 1) TILE(M, 2) TILE(M, 3) TILE(M, 4)
TILE_ROW(1)
TILE_ROW(2)

typedef void tile_fixed_fn(float *y, size_t ldy, const float *x, const float *w, uint32_t cols);
static tile_fixed_fn *const tiles[2][4] = {
    {tile_1x1, tile_1x2, tile_1x3, tile_1x4},
    {tile_2x1, tile_2x2, tile_2x3, tile_2x4},
};

void infer_matmul_tile_avx2(float *y, size_t ldy, const float *x, uint32_t mr, const float *w,
                            uint32_t nr, uint32_t cols)
{
    /* rows 0-1, then rows 2-3 */
    uint32_t m0 = mr < 2 ? mr : 2;
    tiles[m0 - 1][nr - 1](y, ldy, x, w, cols);
    if (mr > 2)
        tiles[mr - 3][nr - 1](y + 2 * ldy, ldy, x + 2 * (size_t)cols, w, cols);
}

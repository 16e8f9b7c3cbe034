/* infer_matmul_avx512.c: the float matmul kernels with AVX-512F.
 * NT: 4 x rows by 4 w rows = 16 accumulators of 16 lanes (of 32 zmm
 * registers), one FMA per loaded pair. NN: up to 4 p rows by 64 columns of v
 * = 16 accumulators; each v row is loaded once for the 4 p rows. Column
 * tails use masked loads and stores. */
#include <immintrin.h>

#include "infer_matmul.h"

static inline __attribute__((always_inline)) void tile(float *y, size_t ldy, const float *x,
                                                       size_t ldx, const uint32_t mr,
                                                       const float *w, size_t ldw,
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
            xv[a] = _mm512_loadu_ps(x + a * ldx + c);
#pragma GCC unroll 4
        for (uint32_t b = 0; b < nr; b++)
            wv[b] = _mm512_loadu_ps(w + b * ldw + c);
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
            wv[b] = _mm512_maskz_loadu_ps(m, w + b * ldw + c);
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
    static void tile_##M##x##N(float *y, size_t ldy, const float *x, size_t ldx,            \
                               const float *w, size_t ldw, uint32_t cols)                    \
    {                                                                                        \
        tile(y, ldy, x, ldx, M, w, ldw, N, cols);                                            \
    }
#define TILE_ROW(M) TILE(M, 1) TILE(M, 2) TILE(M, 3) TILE(M, 4)
TILE_ROW(1)
TILE_ROW(2)
TILE_ROW(3)
TILE_ROW(4)

typedef void tile_fixed_fn(float *y, size_t ldy, const float *x, size_t ldx, const float *w,
                           size_t ldw, uint32_t cols);
static tile_fixed_fn *const tiles[4][4] = {
    {tile_1x1, tile_1x2, tile_1x3, tile_1x4},
    {tile_2x1, tile_2x2, tile_2x3, tile_2x4},
    {tile_3x1, tile_3x2, tile_3x3, tile_3x4},
    {tile_4x1, tile_4x2, tile_4x3, tile_4x4},
};

void infer_matmul_tile_avx512(float *y, size_t ldy, const float *x, size_t ldx, uint32_t mr,
                              const float *w, size_t ldw, uint32_t nr, uint32_t cols)
{
    tiles[mr - 1][nr - 1](y, ldy, x, ldx, w, ldw, cols);
}

/* Lanes [c, min(c + 16, cols)) of a 16-lane vector starting at column c. */
static inline __mmask16 lanes(uint32_t c, uint32_t cols)
{
    if (c >= cols)
        return 0;
    return cols - c >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (cols - c)) - 1);
}

static inline __attribute__((always_inline)) void nn(float *y, size_t ldy, const float *p,
                                                     size_t ldp, const uint32_t mr,
                                                     const float *v, size_t ldv, uint32_t T,
                                                     uint32_t cols)
{
    for (uint32_t c0 = 0; c0 < cols; c0 += 64) {
        __mmask16 m[4];
        for (int j = 0; j < 4; j++)
            m[j] = lanes(c0 + 16 * (uint32_t)j, cols);
        __m512 acc[INFER_MATMUL_MR][4];
#pragma GCC unroll 4
        for (uint32_t a = 0; a < mr; a++)
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++)
                acc[a][j] = _mm512_setzero_ps();
        for (uint32_t t = 0; t < T; t++) {
            const float *vt = v + t * ldv + c0;
            __m512 vv[4];
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++)
                vv[j] = _mm512_maskz_loadu_ps(m[j], vt + 16 * j);
#pragma GCC unroll 4
            for (uint32_t a = 0; a < mr; a++) {
                __m512 pa = _mm512_set1_ps(p[a * ldp + t]);
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++)
                    acc[a][j] = _mm512_fmadd_ps(pa, vv[j], acc[a][j]);
            }
        }
#pragma GCC unroll 4
        for (uint32_t a = 0; a < mr; a++)
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++)
                _mm512_mask_storeu_ps(y + a * ldy + c0 + 16 * j, m[j], acc[a][j]);
    }
}

#define NN(M)                                                                                \
    static void nn_##M(float *y, size_t ldy, const float *p, size_t ldp, const float *v,    \
                       size_t ldv, uint32_t T, uint32_t cols)                                \
    {                                                                                        \
        nn(y, ldy, p, ldp, M, v, ldv, T, cols);                                              \
    }
NN(1)
NN(2)
NN(3)
NN(4)

typedef void nn_fixed_fn(float *y, size_t ldy, const float *p, size_t ldp, const float *v,
                         size_t ldv, uint32_t T, uint32_t cols);
static nn_fixed_fn *const nns[4] = {nn_1, nn_2, nn_3, nn_4};

void infer_matmul_nn_avx512(float *y, size_t ldy, const float *p, size_t ldp, uint32_t mr,
                            const float *v, size_t ldv, uint32_t T, uint32_t cols)
{
    nns[mr - 1](y, ldy, p, ldp, v, ldv, T, cols);
}

/* infer_matmul_rows_avx512.c: the float NT matmul for a few x rows (a draft
 * tree's verification, a multi-sequence step, a plain decode step:
 * 1..INFER_MATMUL_ROWS_MAX rows) with AVX-512F, on float32 weights.
 *
 * The blocked kernel (infer_matmul.c + infer_matmul_avx512.c) passes over
 * each 128 KiB block of w once per 4 x rows: the first pass streams the
 * weights from memory, the second computes from L2 with nothing to overlap
 * (8 rows 1.6x one row on kjv6L-1k, 16 rows 2.5x, on the Xeon). Here each
 * tile of 3 w rows stays in registers and L1 while every x row passes over
 * it, 8 at a time: 24 accumulators, 3 weight vectors and one x vector (28 of
 * the 32 zmm registers), 11 loads per 24 FMAs, the weights two tiles ahead
 * prefetched. The weights cross the memory bus once per call whatever the
 * rows, and up to 8 rows the multiply-adds hide under the weights' stream.
 *
 * Every output is the AVX-512 tile's: 16 lanes summed with FMA in column
 * order from zero, the column tail masked to zeros, then the same
 * _mm512_reduce_add_ps. So a row gets the same bits here as in a one-row
 * decode step through the blocked kernel (test_verify_kernels). */
#include <immintrin.h>

#include "infer_matmul.h"

#define ROWS_NR 3 /* w rows per tile */
#define ROWS_MR 8 /* x rows per pass over it */
/* Weights are asked for this many rows ahead (two tiles). */
#define PF_ROWS 6

/* y[a * ldy + b] = dot(x row a, w row b) for a < mr, b < nr. */
static inline __attribute__((always_inline)) void tile(float *y, size_t ldy, const float *x,
                                                       size_t ldx, const uint32_t mr,
                                                       const float *w, size_t ldw,
                                                       const uint32_t nr, uint32_t cols)
{
    __m512 acc[ROWS_MR][ROWS_NR];
    const float *xp[ROWS_MR], *wp[ROWS_NR];
#pragma GCC unroll 8
    for (uint32_t a = 0; a < mr; a++) {
        xp[a] = x + a * ldx;
#pragma GCC unroll 3
        for (uint32_t b = 0; b < nr; b++)
            acc[a][b] = _mm512_setzero_ps();
    }
#pragma GCC unroll 3
    for (uint32_t b = 0; b < nr; b++)
        wp[b] = w + b * ldw;
    for (uint32_t k = cols / 16; k; k--) {
        __m512 wv[ROWS_NR];
#pragma GCC unroll 3
        for (uint32_t b = 0; b < nr; b++) {
            _mm_prefetch((const char *)(wp[b] + PF_ROWS * ldw), _MM_HINT_T0);
            wv[b] = _mm512_loadu_ps(wp[b]);
            wp[b] += 16;
        }
#pragma GCC unroll 8
        for (uint32_t a = 0; a < mr; a++) {
            __m512 xv = _mm512_loadu_ps(xp[a]);
            xp[a] += 16;
#pragma GCC unroll 3
            for (uint32_t b = 0; b < nr; b++)
                acc[a][b] = _mm512_fmadd_ps(xv, wv[b], acc[a][b]);
        }
    }
    if (cols % 16) {
        __mmask16 m = (__mmask16)((1u << (cols % 16)) - 1);
        __m512 wv[ROWS_NR];
#pragma GCC unroll 3
        for (uint32_t b = 0; b < nr; b++)
            wv[b] = _mm512_maskz_loadu_ps(m, wp[b]);
#pragma GCC unroll 8
        for (uint32_t a = 0; a < mr; a++) {
            __m512 xv = _mm512_maskz_loadu_ps(m, xp[a]);
#pragma GCC unroll 3
            for (uint32_t b = 0; b < nr; b++)
                acc[a][b] = _mm512_fmadd_ps(xv, wv[b], acc[a][b]);
        }
    }
#pragma GCC unroll 8
    for (uint32_t a = 0; a < mr; a++)
#pragma GCC unroll 3
        for (uint32_t b = 0; b < nr; b++)
            y[a * ldy + b] = _mm512_reduce_add_ps(acc[a][b]);
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
TILE_ROW(5)
TILE_ROW(6)
TILE_ROW(7)
TILE_ROW(8)
#define ROW_FNS(M) {tile_##M##x1, tile_##M##x2, tile_##M##x3}
static tile_fn *const tiles[ROWS_MR][ROWS_NR] = {ROW_FNS(1), ROW_FNS(2), ROW_FNS(3), ROW_FNS(4),
                                                 ROW_FNS(5), ROW_FNS(6), ROW_FNS(7), ROW_FNS(8)};

/* ---- short rows (attention scores: a head's dimension of columns) ---- */

/* Up to this many columns the outputs are taken 16 w rows at a time and their
 * horizontal sums are done together: the tile's per-output
 * _mm512_reduce_add_ps (3 extracts and a shuffle a sum) costs more than the
 * dot product itself at a head's 32 or 64 columns. */
#define SHORT_COLS 64

/* lane i = the horizontal sum of in[(i % 4) * 4 + i / 4], in
 * _mm512_reduce_add_ps's order: lanes j + j+8, then j + j+4, j + j+2, 0 + 1
 * (each step one IEEE addition per lane, the same operands, so the same
 * bits), four steps for 16 sums at once, two shuffles an addition. */
static inline __attribute__((always_inline)) __m512 reduce16(const __m512 in[16])
{
    __m512 v[8], w[4], x[2];
#pragma GCC unroll 8
    for (int p = 0; p < 8; p++) /* [a0-7 + a8-15 | b0-7 + b8-15] */
        v[p] = _mm512_add_ps(_mm512_shuffle_f32x4(in[2 * p], in[2 * p + 1], 0x44),
                             _mm512_shuffle_f32x4(in[2 * p], in[2 * p + 1], 0xEE));
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) /* 128-bit lane L: in[4k + L]'s 4 partial sums */
        w[k] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0x88),
                             _mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0xDD));
#pragma GCC unroll 2
    for (int q = 0; q < 2; q++) /* lane L: 2 sums of in[8q + L], then of in[8q + 4 + L] */
        x[q] = _mm512_add_ps(_mm512_shuffle_ps(w[2 * q], w[2 * q + 1], 0x44),
                             _mm512_shuffle_ps(w[2 * q], w[2 * q + 1], 0xEE));
    /* lane 4L + m: in[L + 4m] */
    return _mm512_add_ps(_mm512_shuffle_ps(x[0], x[1], 0x88), _mm512_shuffle_ps(x[0], x[1], 0xDD));
}

/* y[b] = dot(x, w row b) for b < nr (1..16): the tile's accumulation per
 * output (rows past nr repeat the last one and are not stored). */
static inline __attribute__((always_inline)) void short16(float *y, const float *x,
                                                          const float *w, size_t ldw,
                                                          uint32_t nr, uint32_t cols)
{
    __m512 acc[16];
    const float *wp[16];
#pragma GCC unroll 16
    for (uint32_t b = 0; b < 16; b++) {
        acc[b] = _mm512_setzero_ps();
        wp[b] = w + (b < nr ? b : nr - 1) * ldw;
    }
    uint32_t c = 0;
    for (; c + 16 <= cols; c += 16) {
        __m512 xv = _mm512_loadu_ps(x + c);
#pragma GCC unroll 16
        for (uint32_t b = 0; b < 16; b++)
            acc[b] = _mm512_fmadd_ps(xv, _mm512_loadu_ps(wp[b] + c), acc[b]);
    }
    if (c < cols) {
        __mmask16 m = (__mmask16)((1u << (cols - c)) - 1);
        __m512 xv = _mm512_maskz_loadu_ps(m, x + c);
#pragma GCC unroll 16
        for (uint32_t b = 0; b < 16; b++)
            acc[b] = _mm512_fmadd_ps(xv, _mm512_maskz_loadu_ps(m, wp[b] + c), acc[b]);
    }
    __m512 in[16];
#pragma GCC unroll 16
    for (int j = 0; j < 16; j++)
        in[j] = acc[(j % 4) * 4 + j / 4];
    _mm512_mask_storeu_ps(y, (__mmask16)((1u << nr) - 1), reduce16(in));
}

void infer_matmul_rows_avx512(float *y, size_t ldy, const float *x, size_t ldx, uint32_t n,
                              const float *w, size_t ldw, uint32_t cols, uint32_t r0, uint32_t r1)
{
    if (cols <= SHORT_COLS) {
        for (uint32_t r = r0; r < r1; r += 16)
            for (uint32_t i = 0; i < n; i++)
                short16(y + i * ldy + r, x + i * ldx, w + r * ldw, ldw, r1 - r < 16 ? r1 - r : 16,
                        cols);
        return;
    }
    for (uint32_t r = r0; r < r1; r += ROWS_NR) {
        uint32_t nr = r1 - r < ROWS_NR ? r1 - r : ROWS_NR;
        const float *wr = w + r * ldw;
        for (uint32_t i = 0; i < n; i += ROWS_MR) {
            uint32_t mr = n - i < ROWS_MR ? n - i : ROWS_MR;
            tiles[mr - 1][nr - 1](y + i * ldy + r, ldy, x + i * ldx, ldx, wr, ldw, cols);
        }
    }
}

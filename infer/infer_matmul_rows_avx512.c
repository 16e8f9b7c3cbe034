/* infer_matmul_rows_avx512.c: the float NT matmul for a few x rows (a draft
 * tree's verification, a multi-sequence step, a plain decode step:
 * 1..INFER_MATMUL_ROWS_MAX rows) with AVX-512F, on float32 weights.
 *
 * The blocked kernel (infer_matmul.c + infer_matmul_avx512.c) passes over
 * each 128 KiB block of w once per 4 x rows: the first pass streams the
 * weights from memory, the second computes from L2 with nothing to overlap
 * (8 rows 1.6x one row on kjv6L-1k, 16 rows 2.5x, on the Xeon). Here each
 * tile of 4 w rows (3 for a single x row) stays in registers and L1 while
 * the x rows pass over it, up to 6 at a time (mr x 4 accumulators), the
 * weights prefetched two tiles ahead: they cross the memory bus once per call
 * whatever the rows.
 *
 * Every output is the AVX-512 tile's: 16 lanes summed with FMA in column
 * order from zero, the column tail masked to zeros, then the lanes summed as
 * _mm512_reduce_add_ps sums them. A tile's horizontal sums are taken 16 at a
 * time (reduce16: the same additions on the same operands, two shuffles an
 * addition instead of about eight operations an output; at kjv6L-1k's 256
 * columns a dot product is only 16 FMAs). So a row gets the same bits here as
 * in a one-row decode step through the blocked kernel (test_verify_kernels).
 *
 * Against the former kernel (8 x 3 tiles, one _mm512_reduce_add_ps an
 * output) on kjv6L-1k's shapes, one thread, weights in L2: 3.5-4.1 vector
 * FMAs a ns at 4-6 rows against 2.4-2.5 (a 4-6 row matmul 0.6-0.7x the
 * time); over the whole model's weights (17.6 MB, streamed) 3-6 rows
 * 0.82-0.91x, 12-16 rows 0.68-0.89x, 1, 2, 7 and 8 rows unchanged within the
 * noise. Wider tiles for one to three x rows (6, 8 or 16 w rows) were no
 * faster: those calls are bound by the weights' stream. */
#include <immintrin.h>

#include "infer_matmul.h"

/* At most this many x rows per pass over a tile of ROWS_NR w rows: mr x
 * ROWS_NR accumulators, ROWS_NR weight vectors and one x vector within the 32
 * registers. A call's rows are cut into passes of nearly equal size (8 rows:
 * 4 + 4; 16: 6 + 5 + 5): GCC spilled the former 8 x 3 tile's accumulators
 * (1.8-2.7 vector FMAs a ns from L2 against 3.2-3.7 for two passes of 4). */
#define ROWS_PASS_MAX 6
#define ROWS_NR 4

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

/* The horizontal sums of acc[0..n) (n <= 32), acc[t] to out[t]: 16 at a
 * time, a group's missing inputs repeating its last (not stored); up to 4
 * alone. */
static inline __attribute__((always_inline)) void reduce_all(float *out, const __m512 *acc,
                                                             const uint32_t n)
{
    if (n <= 4) {
#pragma GCC unroll 4
        for (uint32_t t = 0; t < n; t++)
            out[t] = _mm512_reduce_add_ps(acc[t]);
        return;
    }
#pragma GCC unroll 2
    for (uint32_t g = 0; g < n; g += 16) {
        __m512 in[16];
#pragma GCC unroll 16
        for (uint32_t j = 0; j < 16; j++) {
            uint32_t t = g + (j % 4) * 4 + j / 4; /* lane t - g gets acc[t] */
            in[j] = acc[t < n ? t : n - 1];
        }
        _mm512_storeu_ps(out + g, reduce16(in));
    }
}

/* y[a * ldy + b] = dot(x row a, w row b) for a < mr, b < nv (1..nr): rows
 * nv..nr-1 of the tile repeat w row nv - 1 and are not stored. The loads
 * go by the narrower side: nr weight vectors held while each x row's vector
 * meets them, or mr x vectors held while each weight vector meets them. */
static inline __attribute__((always_inline)) void tile(float *y, size_t ldy, const float *x,
                                                       size_t ldx, const uint32_t mr,
                                                       const float *w, size_t ldw,
                                                       const uint32_t nr, uint32_t nv,
                                                       uint32_t cols)
{
    __m512 acc[ROWS_PASS_MAX * ROWS_NR];
    const float *wp[ROWS_NR];
    /* prefetch distance in bytes: two tiles of w rows (an address, never
     * dereferenced: past the last tile it may point beyond w) */
    const size_t pf = 2 * nr * ldw * sizeof(float);
#pragma GCC unroll 32
    for (uint32_t t = 0; t < mr * nr; t++)
        acc[t] = _mm512_setzero_ps();
#pragma GCC unroll 16
    for (uint32_t b = 0; b < nr; b++)
        wp[b] = w + (b < nv ? b : nv - 1) * ldw;
    uint32_t c = 0;
    for (; c + 16 <= cols; c += 16) {
        if (nr <= mr) {
            __m512 wv[ROWS_NR];
#pragma GCC unroll 16
            for (uint32_t b = 0; b < nr; b++) {
                _mm_prefetch((const char *)((uintptr_t)(wp[b] + c) + pf), _MM_HINT_T0);
                wv[b] = _mm512_loadu_ps(wp[b] + c);
            }
#pragma GCC unroll 8
            for (uint32_t a = 0; a < mr; a++) {
                __m512 xv = _mm512_loadu_ps(x + a * ldx + c);
#pragma GCC unroll 16
                for (uint32_t b = 0; b < nr; b++)
                    acc[a * nr + b] = _mm512_fmadd_ps(xv, wv[b], acc[a * nr + b]);
            }
        } else {
            __m512 xv[ROWS_PASS_MAX];
#pragma GCC unroll 8
            for (uint32_t a = 0; a < mr; a++)
                xv[a] = _mm512_loadu_ps(x + a * ldx + c);
#pragma GCC unroll 16
            for (uint32_t b = 0; b < nr; b++) {
                _mm_prefetch((const char *)((uintptr_t)(wp[b] + c) + pf), _MM_HINT_T0);
                __m512 wv = _mm512_loadu_ps(wp[b] + c);
#pragma GCC unroll 8
                for (uint32_t a = 0; a < mr; a++)
                    acc[a * nr + b] = _mm512_fmadd_ps(xv[a], wv, acc[a * nr + b]);
            }
        }
    }
    if (c < cols) {
        __mmask16 m = (__mmask16)((1u << (cols - c)) - 1);
        __m512 xv[ROWS_PASS_MAX];
#pragma GCC unroll 8
        for (uint32_t a = 0; a < mr; a++)
            xv[a] = _mm512_maskz_loadu_ps(m, x + a * ldx + c);
#pragma GCC unroll 16
        for (uint32_t b = 0; b < nr; b++) {
            __m512 wv = _mm512_maskz_loadu_ps(m, wp[b] + c);
#pragma GCC unroll 8
            for (uint32_t a = 0; a < mr; a++)
                acc[a * nr + b] = _mm512_fmadd_ps(xv[a], wv, acc[a * nr + b]);
        }
    }
    float out[(ROWS_PASS_MAX * ROWS_NR + 15) / 16 * 16]; /* whole groups of 16 */
    reduce_all(out, acc, mr * nr);
    for (uint32_t a = 0; a < mr; a++)
        for (uint32_t b = 0; b < nv; b++)
            y[a * ldy + b] = out[a * nr + b];
}

typedef void tile_fn(float *y, size_t ldy, const float *x, size_t ldx, const float *w, size_t ldw,
                     uint32_t nv, uint32_t cols);
#define TILE(M)                                                                                    \
    static void tile_##M(float *y, size_t ldy, const float *x, size_t ldx, const float *w,         \
                         size_t ldw, uint32_t nv, uint32_t cols)                                   \
    {                                                                                              \
        tile(y, ldy, x, ldx, M, w, ldw, ROWS_NR, nv, cols);                                        \
    }
/* One x row (a decode step) takes 3 w rows a tile: from L2 1.64-1.74 vector
 * FMAs a ns against 1.43-1.65 with 4 (and the former kernel's 1.56-1.69). */
static void tile_1x3(float *y, size_t ldy, const float *x, size_t ldx, const float *w, size_t ldw,
                     uint32_t nv, uint32_t cols)
{
    tile(y, ldy, x, ldx, 1, w, ldw, 3, nv, cols);
}
/* passes of n >= 2 rows have at least 2 (n / ceil(n / 6)); tile_1 keeps the
 * table whole */
TILE(1)
TILE(2)
TILE(3)
TILE(4)
TILE(5)
TILE(6)
static tile_fn *const tiles[ROWS_PASS_MAX] = {tile_1, tile_2, tile_3, tile_4, tile_5, tile_6};

/* ---- short rows (attention scores: a head's dimension of columns) ---- */

/* Up to this many columns the outputs are taken 16 w rows at a time and their
 * horizontal sums are done together: the tile's per-output
 * _mm512_reduce_add_ps (3 extracts and a shuffle a sum) costs more than the
 * dot product itself at a head's 32 or 64 columns. */
#define SHORT_COLS 64

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
    if (n == 0 || r0 >= r1)
        return;
    if (cols <= SHORT_COLS) {
        for (uint32_t r = r0; r < r1; r += 16)
            for (uint32_t i = 0; i < n; i++)
                short16(y + i * ldy + r, x + i * ldx, w + r * ldw, ldw, r1 - r < 16 ? r1 - r : 16,
                        cols);
        return;
    }
    /* passes of n / np rows, the first n % np one more */
    uint32_t np = (n + ROWS_PASS_MAX - 1) / ROWS_PASS_MAX, q = n / np, extra = n % np;
    if (n == 1) {
        for (uint32_t r = r0; r < r1; r += 3)
            tile_1x3(y + r, ldy, x, ldx, w + r * ldw, ldw, r1 - r < 3 ? r1 - r : 3, cols);
        return;
    }
    for (uint32_t r = r0; r < r1; r += ROWS_NR) {
        uint32_t nv = r1 - r < ROWS_NR ? r1 - r : ROWS_NR;
        const float *wr = w + r * ldw;
        for (uint32_t p = 0, i = 0; p < np; p++) {
            uint32_t mr = q + (p < extra);
            tiles[mr - 1](y + i * ldy + r, ldy, x + i * ldx, ldx, wr, ldw, nv, cols);
            i += mr;
        }
    }
}

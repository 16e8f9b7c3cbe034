/* npu_gemm_avx512vnni.c: int8 GEMM with AVX-512 VNNI, bit-exact with
 * npu_gemm_scalar.c.
 *
 * vpdpbusd multiplies unsigned bytes by signed bytes, four at a time into
 * each 32-bit lane. Activations a in [-127, 127] are offset to a + 128 in
 * [1, 255] (a XOR 0x80), and the sum of 128 * b over each weight row (the
 * rowsum computed when the weights were prepared) is subtracted at the end:
 * sum (a + 128) b - 128 sum b = sum a b, exactly, in int32.
 *
 * Weights are prepared as [n/16][k/4][16][4]: one 64-byte zmm holds four k
 * values for 16 output channels, which is what one vpdpbusd consumes against
 * a broadcast of four activation bytes. Register tile: 6 rows x 64 channels
 * (24 accumulators); the weight panel (64 channels x k) stays in L2 while
 * every row tile of the activations passes over it. */
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "npu_gemm_internal.h"

#define MR 6

/* Offset activations to u8 with k padded to a multiple of 4 (zeros). */
static uint8_t *offset_a(const int8_t *a, uint32_t m, uint32_t k, uint32_t k4)
{
    uint8_t *u = sl_alloc_aligned((size_t)m * k4 + 64, 64);
    if (!u)
        return NULL;
    for (uint32_t i = 0; i < m; i++) {
        const uint8_t *src = (const uint8_t *)a + (size_t)i * k;
        uint8_t *dst = u + (size_t)i * k4;
        uint32_t j = 0;
        for (; j + 64 <= k; j += 64)
            _mm512_storeu_si512(dst + j, _mm512_xor_si512(_mm512_loadu_si512(src + j),
                                                          _mm512_set1_epi8((char)0x80)));
        for (; j < k; j++)
            dst[j] = src[j] ^ 0x80;
        for (; j < k4; j++)
            dst[j] = 0; /* contributes 0 * 0: the padded weights are zero too */
    }
    return u;
}

/* Stores accumulator v (channels c0..c0+15) of row i, minus the correction,
 * keeping only channels inside [lo, hi). */
static inline __attribute__((always_inline)) void store_block(__m512i v, const int32_t *rowsum,
                                                              int32_t *crow, uint32_t c0,
                                                              uint32_t lo, uint32_t hi)
{
    v = _mm512_sub_epi32(v, _mm512_slli_epi32(_mm512_loadu_si512(rowsum + c0), 7));
    uint32_t s = c0 < lo ? lo - c0 : 0;
    uint32_t e = c0 + 16 > hi ? hi - c0 : 16;
    if (s == 0 && e == 16) {
        _mm512_storeu_si512(crow + (c0 - lo), v);
        return;
    }
    __mmask16 keep = (__mmask16)(((1u << e) - 1) & ~((1u << s) - 1));
    if (s) /* the range starts inside this block: move its lanes down */
        v = _mm512_maskz_compress_epi32(keep, v);
    _mm512_mask_storeu_epi32(crow + (c0 + s - lo), (__mmask16)((1u << (e - s)) - 1), v);
}

/* The full 6 x 64 tile, written out so the 24 accumulators stay in registers. */
static void tile_6x4(const uint8_t *a, uint32_t k4, const int8_t *bp, size_t bstride,
                     const int32_t *rowsum, int32_t *c, size_t ldc, uint32_t col0, uint32_t lo,
                     uint32_t hi)
{
#define ROW(i) __m512i c##i##0 = _mm512_setzero_si512(), c##i##1 = c##i##0, c##i##2 = c##i##0, \
                       c##i##3 = c##i##0
    ROW(0);
    ROW(1);
    ROW(2);
    ROW(3);
    ROW(4);
    ROW(5);
#undef ROW
    const uint8_t *a0 = a, *a1 = a + k4, *a2 = a + 2 * (size_t)k4, *a3 = a + 3 * (size_t)k4;
    const uint8_t *a4 = a + 4 * (size_t)k4, *a5 = a + 5 * (size_t)k4;
    const int8_t *b0 = bp, *b1 = bp + bstride, *b2 = bp + 2 * bstride, *b3 = bp + 3 * bstride;
#pragma GCC unroll 4
    for (uint32_t g = 0; g < k4; g += 4) {
        __m512i w0 = _mm512_load_si512(b0 + 16 * (size_t)g);
        __m512i w1 = _mm512_load_si512(b1 + 16 * (size_t)g);
        __m512i w2 = _mm512_load_si512(b2 + 16 * (size_t)g);
        __m512i w3 = _mm512_load_si512(b3 + 16 * (size_t)g);
        int32_t t;
#define ROW(i)                                                                                \
    memcpy(&t, a##i + g, 4);                                                                  \
    {                                                                                         \
        __m512i av = _mm512_set1_epi32(t);                                                    \
        c##i##0 = _mm512_dpbusd_epi32(c##i##0, av, w0);                                       \
        c##i##1 = _mm512_dpbusd_epi32(c##i##1, av, w1);                                       \
        c##i##2 = _mm512_dpbusd_epi32(c##i##2, av, w2);                                       \
        c##i##3 = _mm512_dpbusd_epi32(c##i##3, av, w3);                                       \
    }
        ROW(0)
        ROW(1)
        ROW(2)
        ROW(3)
        ROW(4)
        ROW(5)
#undef ROW
    }
#define ROW(i)                                                                                \
    store_block(c##i##0, rowsum, c + i * ldc, col0, lo, hi);                                  \
    store_block(c##i##1, rowsum, c + i * ldc, col0 + 16, lo, hi);                             \
    store_block(c##i##2, rowsum, c + i * ldc, col0 + 32, lo, hi);                             \
    store_block(c##i##3, rowsum, c + i * ldc, col0 + 48, lo, hi);
    ROW(0)
    ROW(1)
    ROW(2)
    ROW(3)
    ROW(4)
    ROW(5)
#undef ROW
}

/* Edges: fewer rows or blocks, one block at a time (accumulators for up to
 * MR rows). */
static void tile_edge(const uint8_t *a, uint32_t k4, const int8_t *bp, size_t bstride,
                      const int32_t *rowsum, int rows, int nb, int32_t *c, size_t ldc,
                      uint32_t col0, uint32_t lo, uint32_t hi)
{
    for (int j = 0; j < nb; j++) {
        const int8_t *bj = bp + (size_t)j * bstride;
        for (int i = 0; i < rows; i++) {
            const uint8_t *ai = a + (size_t)i * k4;
            __m512i acc = _mm512_setzero_si512();
            for (uint32_t g = 0; g < k4; g += 4) {
                int32_t t;
                memcpy(&t, ai + g, 4);
                acc = _mm512_dpbusd_epi32(acc, _mm512_set1_epi32(t),
                                          _mm512_load_si512(bj + 16 * (size_t)g));
            }
            store_block(acc, rowsum, c + (size_t)i * ldc, col0 + 16 * (uint32_t)j, lo, hi);
        }
    }
}

void npu_gemm_avx512vnni(const struct npu_gemm_b *b, const int8_t *a, uint32_t m, uint32_t r0,
                         uint32_t r1, int32_t *c, size_t ldc)
{
    if (m == 0 || r1 <= r0)
        return;
    uint8_t *au = offset_a(a, m, b->k, b->k4);
    if (!au) {
        npu_gemm_scalar(b, a, m, r0, r1, c, ldc);
        return;
    }
    size_t bstride = (size_t)b->k4 / 4 * 64; /* bytes per 16-channel block */
    uint32_t blk0 = r0 / 16, blk1 = (r1 + 15) / 16;
    for (uint32_t bl = blk0; bl < blk1; bl += 4) {
        int nb = blk1 - bl < 4 ? (int)(blk1 - bl) : 4;
        const int8_t *bp = b->packed + (size_t)bl * bstride;
        for (uint32_t i = 0; i < m; i += MR) {
            int rows = m - i < MR ? (int)(m - i) : MR;
            const uint8_t *ai = au + (size_t)i * b->k4;
            int32_t *ci = c + (size_t)i * ldc;
            if (rows == MR && nb == 4)
                tile_6x4(ai, b->k4, bp, bstride, b->rowsum, ci, ldc, bl * 16, r0, r1);
            else
                tile_edge(ai, b->k4, bp, bstride, b->rowsum, rows, nb, ci, ldc, bl * 16, r0, r1);
        }
    }
    sl_free_aligned(au);
}

/* Peak: 16 independent vpdpbusd chains on registers only (no memory), so
 * throughput, not latency, bounds the loop. 64 multiply-adds per instruction. */
uint64_t npu_peak_avx512vnni(uint64_t iters)
{
    __m512i acc[16];
    __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(5);
    for (int i = 0; i < 16; i++)
        acc[i] = _mm512_set1_epi32(i);
    for (uint64_t it = 0; it < iters; it++) {
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++)
            acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
        __asm__ volatile("" : "+v"(a)); /* keep the loop from being folded */
    }
    __m512i s = acc[0];
    for (int i = 1; i < 16; i++)
        s = _mm512_add_epi32(s, acc[i]);
    return (uint64_t)(uint32_t)_mm512_reduce_add_epi32(s);
}

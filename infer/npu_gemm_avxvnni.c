/* npu_gemm_avxvnni.c: int8 GEMM with AVX-VNNI (the VEX-encoded vpdpbusd of
 * Alder Lake and later), bit-exact with npu_gemm_scalar.c. Same method as the
 * AVX-512 VNNI kernel (activations offset by 128, rowsum correction) on ymm:
 * 8 channels x 4 k per register. */
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "npu_gemm_internal.h"

#define MR 3

static inline __attribute__((always_inline)) void store8(__m256i v, const int32_t *rowsum,
                                                         int32_t *crow, uint32_t c0, uint32_t lo,
                                                         uint32_t hi)
{
    v = _mm256_sub_epi32(v, _mm256_slli_epi32(
                                _mm256_loadu_si256((const __m256i *)(rowsum + c0)), 7));
    if (c0 >= lo && c0 + 8 <= hi) {
        _mm256_storeu_si256((__m256i *)(crow + (c0 - lo)), v);
        return;
    }
    int32_t t[8];
    _mm256_storeu_si256((__m256i *)t, v);
    for (uint32_t i = 0; i < 8; i++)
        if (c0 + i >= lo && c0 + i < hi)
            crow[c0 + i - lo] = t[i];
}

/* Full tile: 3 rows x 32 channels, 12 accumulators in registers. */
static void tile_3x4(const uint8_t *a, uint32_t k4, const int8_t *bp, size_t bstride,
                     const int32_t *rowsum, int32_t *c, size_t ldc, uint32_t col0, uint32_t lo,
                     uint32_t hi)
{
    __m256i c00 = _mm256_setzero_si256(), c01 = c00, c02 = c00, c03 = c00;
    __m256i c10 = c00, c11 = c00, c12 = c00, c13 = c00;
    __m256i c20 = c00, c21 = c00, c22 = c00, c23 = c00;
    const uint8_t *a0 = a, *a1 = a + k4, *a2 = a + 2 * (size_t)k4;
#pragma GCC unroll 4
    for (uint32_t g = 0; g < k4; g += 4) {
        const int8_t *p0 = bp + 16 * (size_t)g, *p1 = bp + bstride + 16 * (size_t)g;
        __m256i w0 = _mm256_load_si256((const __m256i *)p0);
        __m256i w1 = _mm256_load_si256((const __m256i *)(p0 + 32));
        __m256i w2 = _mm256_load_si256((const __m256i *)p1);
        __m256i w3 = _mm256_load_si256((const __m256i *)(p1 + 32));
        int32_t t;
#define ROW(i)                                                                                \
    memcpy(&t, a##i + g, 4);                                                                  \
    {                                                                                         \
        __m256i av = _mm256_set1_epi32(t);                                                    \
        c##i##0 = _mm256_dpbusd_avx_epi32(c##i##0, av, w0);                                   \
        c##i##1 = _mm256_dpbusd_avx_epi32(c##i##1, av, w1);                                   \
        c##i##2 = _mm256_dpbusd_avx_epi32(c##i##2, av, w2);                                   \
        c##i##3 = _mm256_dpbusd_avx_epi32(c##i##3, av, w3);                                   \
    }
        ROW(0)
        ROW(1)
        ROW(2)
#undef ROW
    }
#define ROW(i)                                                                                \
    store8(c##i##0, rowsum, c + i * ldc, col0, lo, hi);                                       \
    store8(c##i##1, rowsum, c + i * ldc, col0 + 8, lo, hi);                                   \
    store8(c##i##2, rowsum, c + i * ldc, col0 + 16, lo, hi);                                  \
    store8(c##i##3, rowsum, c + i * ldc, col0 + 24, lo, hi);
    ROW(0)
    ROW(1)
    ROW(2)
#undef ROW
}

static void tile_edge(const uint8_t *a, uint32_t k4, const int8_t *bp, size_t bstride,
                      const int32_t *rowsum, int rows, int nb, int32_t *c, size_t ldc,
                      uint32_t col0, uint32_t lo, uint32_t hi)
{
    for (int j = 0; j < 2 * nb; j++) {
        const int8_t *bj = bp + (size_t)(j / 2) * bstride + 32 * (j % 2);
        for (int i = 0; i < rows; i++) {
            __m256i acc = _mm256_setzero_si256();
            for (uint32_t g = 0; g < k4; g += 4) {
                int32_t t;
                memcpy(&t, a + (size_t)i * k4 + g, 4);
                acc = _mm256_dpbusd_avx_epi32(acc, _mm256_set1_epi32(t),
                                              _mm256_load_si256((const __m256i *)(bj + 16 * (size_t)g)));
            }
            store8(acc, rowsum, c + (size_t)i * ldc, col0 + 8 * (uint32_t)j, lo, hi);
        }
    }
}

void npu_gemm_avxvnni(const struct npu_gemm_b *b, const int8_t *a, uint32_t m, uint32_t r0,
                      uint32_t r1, int32_t *c, size_t ldc)
{
    if (m == 0 || r1 <= r0)
        return;
    uint8_t *au = sl_alloc_aligned((size_t)m * b->k4 + 64, 64);
    if (!au) {
        npu_gemm_scalar(b, a, m, r0, r1, c, ldc);
        return;
    }
    for (uint32_t i = 0; i < m; i++) {
        for (uint32_t j = 0; j < b->k; j++)
            au[(size_t)i * b->k4 + j] = (uint8_t)a[(size_t)i * b->k + j] ^ 0x80;
        for (uint32_t j = b->k; j < b->k4; j++)
            au[(size_t)i * b->k4 + j] = 0;
    }
    size_t bstride = (size_t)b->k4 / 4 * 64;
    uint32_t blk0 = r0 / 16, blk1 = (r1 + 15) / 16;
    for (uint32_t bl = blk0; bl < blk1; bl += 2) {
        int nb = blk1 - bl < 2 ? (int)(blk1 - bl) : 2;
        const int8_t *bp = b->packed + (size_t)bl * bstride;
        for (uint32_t i = 0; i < m; i += MR) {
            int rows = m - i < MR ? (int)(m - i) : MR;
            if (rows == MR && nb == 2)
                tile_3x4(au + (size_t)i * b->k4, b->k4, bp, bstride, b->rowsum,
                         c + (size_t)i * ldc, ldc, bl * 16, r0, r1);
            else
                tile_edge(au + (size_t)i * b->k4, b->k4, bp, bstride, b->rowsum, rows, nb,
                          c + (size_t)i * ldc, ldc, bl * 16, r0, r1);
        }
    }
    sl_free_aligned(au);
}

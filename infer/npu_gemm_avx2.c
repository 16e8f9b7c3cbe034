/* npu_gemm_avx2.c: int8 GEMM with AVX2, bit-exact with npu_gemm_scalar.c.
 *
 * vpmaddubsw multiplies unsigned by signed bytes and adds pairs into int16
 * with saturation. Feeding it a + 128 (up to 255) times weights of 127 would
 * saturate (2 x 255 x 127 > 32767), so the sign of a is moved onto b instead:
 * |a| * (b * sign(a)) with |a| <= 127 and |b| <= 127 keeps every pair sum
 * within 2 x 127 x 127 = 32258, exact in int16; vpmaddwd by ones widens the
 * pairs to int32. Weights use the same [n/16][k/4][16][4] layout as the VNNI
 * kernel: a 64-byte group is two ymm of 8 channels x 4 k. */
#include <immintrin.h>
#include <string.h>

#include "common.h"
#include "npu_gemm_internal.h"

#define MR 3

/* 8 channels starting at c0 of one row into C, inside [lo, hi). */
static inline __attribute__((always_inline)) void store8(__m256i v, int32_t *crow, uint32_t c0,
                                                         uint32_t lo, uint32_t hi)
{
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

/* One k group (4 values) of row a4 against one 8-channel register. */
#define STEP(acc, aa, av, w)                                                                  \
    acc = _mm256_add_epi32(                                                                   \
        acc, _mm256_madd_epi16(_mm256_maddubs_epi16(aa, _mm256_sign_epi8(w, av)), ones))

/* Full tile: 3 rows x 32 channels (two 16-channel blocks = 4 ymm), k % 4 == 0
 * handled by the caller's padded copy of the activations. */
static void tile_3x4(const int8_t *a, uint32_t k4, const int8_t *bp, size_t bstride, int32_t *c,
                     size_t ldc, uint32_t col0, uint32_t lo, uint32_t hi)
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i c00 = _mm256_setzero_si256(), c01 = c00, c02 = c00, c03 = c00;
    __m256i c10 = c00, c11 = c00, c12 = c00, c13 = c00;
    __m256i c20 = c00, c21 = c00, c22 = c00, c23 = c00;
    const int8_t *a0 = a, *a1 = a + k4, *a2 = a + 2 * (size_t)k4;
#pragma GCC unroll 2
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
        __m256i av = _mm256_set1_epi32(t), aa = _mm256_abs_epi8(av);                          \
        STEP(c##i##0, aa, av, w0);                                                            \
        STEP(c##i##1, aa, av, w1);                                                            \
        STEP(c##i##2, aa, av, w2);                                                            \
        STEP(c##i##3, aa, av, w3);                                                            \
    }
        ROW(0)
        ROW(1)
        ROW(2)
#undef ROW
    }
#define ROW(i)                                                                                \
    store8(c##i##0, c + i * ldc, col0, lo, hi);                                               \
    store8(c##i##1, c + i * ldc, col0 + 8, lo, hi);                                           \
    store8(c##i##2, c + i * ldc, col0 + 16, lo, hi);                                          \
    store8(c##i##3, c + i * ldc, col0 + 24, lo, hi);
    ROW(0)
    ROW(1)
    ROW(2)
#undef ROW
}

static void tile_edge(const int8_t *a, uint32_t k4, const int8_t *bp, size_t bstride, int rows,
                      int nb, int32_t *c, size_t ldc, uint32_t col0, uint32_t lo, uint32_t hi)
{
    const __m256i ones = _mm256_set1_epi16(1);
    for (int j = 0; j < 2 * nb; j++) {
        const int8_t *bj = bp + (size_t)(j / 2) * bstride + 32 * (j % 2);
        for (int i = 0; i < rows; i++) {
            __m256i acc = _mm256_setzero_si256();
            for (uint32_t g = 0; g < k4; g += 4) {
                int32_t t;
                memcpy(&t, a + (size_t)i * k4 + g, 4);
                __m256i av = _mm256_set1_epi32(t), aa = _mm256_abs_epi8(av);
                __m256i w = _mm256_load_si256((const __m256i *)(bj + 16 * (size_t)g));
                STEP(acc, aa, av, w);
            }
            store8(acc, c + (size_t)i * ldc, col0 + 8 * (uint32_t)j, lo, hi);
        }
    }
}

void npu_gemm_avx2(const struct npu_gemm_b *b, const int8_t *a, uint32_t m, uint32_t r0,
                   uint32_t r1, int32_t *c, size_t ldc)
{
    if (m == 0 || r1 <= r0)
        return;
    /* a copy with k padded to a multiple of 4 (zeros multiply zero weights) */
    int8_t *ap = sl_alloc_aligned((size_t)m * b->k4 + 64, 64);
    if (!ap) {
        npu_gemm_scalar(b, a, m, r0, r1, c, ldc);
        return;
    }
    for (uint32_t i = 0; i < m; i++) {
        memcpy(ap + (size_t)i * b->k4, a + (size_t)i * b->k, b->k);
        memset(ap + (size_t)i * b->k4 + b->k, 0, b->k4 - b->k);
    }
    size_t bstride = (size_t)b->k4 / 4 * 64;
    uint32_t blk0 = r0 / 16, blk1 = (r1 + 15) / 16;
    for (uint32_t bl = blk0; bl < blk1; bl += 2) {
        int nb = blk1 - bl < 2 ? (int)(blk1 - bl) : 2;
        const int8_t *bp = b->packed + (size_t)bl * bstride;
        for (uint32_t i = 0; i < m; i += MR) {
            int rows = m - i < MR ? (int)(m - i) : MR;
            const int8_t *ai = ap + (size_t)i * b->k4;
            int32_t *ci = c + (size_t)i * ldc;
            if (rows == MR && nb == 2)
                tile_3x4(ai, b->k4, bp, bstride, ci, ldc, bl * 16, r0, r1);
            else
                tile_edge(ai, b->k4, bp, bstride, rows, nb, ci, ldc, bl * 16, r0, r1);
        }
    }
    sl_free_aligned(ap);
}

/* Peak of this kernel's inner step (sign, maddubs, madd, add): 12 chains. 32
 * multiply-adds per step. */
uint64_t npu_peak_avx2(uint64_t iters)
{
    __m256i acc[12];
    __m256i a = _mm256_set1_epi8(3), b = _mm256_set1_epi8(5), ones = _mm256_set1_epi16(1);
    for (int i = 0; i < 12; i++)
        acc[i] = _mm256_set1_epi32(i);
    for (uint64_t it = 0; it < iters; it++) {
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) {
            __m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(a), _mm256_sign_epi8(b, a));
            acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(p, ones));
        }
        __asm__ volatile("" : "+x"(a));
    }
    __m256i s = acc[0];
    for (int i = 1; i < 12; i++)
        s = _mm256_add_epi32(s, acc[i]);
    int32_t v[8];
    _mm256_storeu_si256((__m256i *)v, s);
    return (uint64_t)(uint32_t)(v[0] + v[7]);
}

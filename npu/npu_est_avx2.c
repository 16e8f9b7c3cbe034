/* npu_est_avx2.c: the AVX2 int8 GEMM for narrow activations (npu_est.h),
 * bit-exact with npu_gemm_scalar.c (contract in npu_gemm_internal.h).
 *
 * The 3x32 tile of npu_gemm_avx2.c takes, per 32 multiply-adds on codes
 * within +-64, maddubs(a + 128, b), madd by ones, add: two multiplier uops.
 * With activations within +-63 the unsigned operand a + 64 is at most 127,
 * so a maddubs pair sum is at most 2 x 127 x 64 = 16256 and two groups' sums
 * add up in int16 exactly (32512 < 32767) before one madd: 1.5 multiplier
 * uops per 32 multiply-adds. Within +-31, a + 32 <= 63 lets four groups add
 * up (4 x 2 x 63 x 64 = 32256): 1.25. offset x rowsum(b) comes off at the
 * end; the int32 sums are exact at every step, so the outputs equal every
 * other kernel's bit for bit.
 *
 * Loop order: a column of two 16-channel blocks (32 channels; for the
 * estimate's k of 64 or 128, 2 or 4 KiB of weights that stay in L1) over
 * every row; a row's four accumulators live in registers and the weights
 * are memory operands of maddubs. Activations are staged row-major with the
 * offset added (npu_est_prep), so a group's 4 bytes are one broadcast. */
#include <immintrin.h>
#include <string.h>

#include "npu_est.h"
#include "npu_store_avx2.h"

#define AI static inline __attribute__((always_inline))

/* One row (staged bytes ar) x NBK blocks (2 ymm of 8 channels each) from bp
 * into acc: groups P at a time added in int16, then the tail one group at a
 * time. GR: the group count when known at compile time (the loop unrolled),
 * else 0 (groups). */
AI void row_sums(const int NBK, const int P, const int GR, const uint8_t *ar, const int8_t *bp,
                 size_t bstride, uint32_t groups, __m256i acc[4])
{
    const __m256i ones = _mm256_set1_epi16(1);
    if (GR)
        groups = (uint32_t)GR;
#pragma GCC unroll 4
    for (int j = 0; j < 2 * NBK; j++)
        acc[j] = _mm256_setzero_si256();
    const uint32_t gp = groups / (uint32_t)P * (uint32_t)P;
    uint32_t q = 0;
#pragma GCC unroll 16
    for (; q < gp; q += (uint32_t)P) {
        __m256i av[4];
#pragma GCC unroll 4
        for (int e = 0; e < P; e++) {
            int32_t v;
            memcpy(&v, ar + 4 * ((size_t)q + (size_t)e), 4);
            av[e] = _mm256_set1_epi32(v);
        }
#pragma GCC unroll 4
        for (int j = 0; j < 2 * NBK; j++) {
            const int8_t *w = bp + (size_t)(j / 2) * bstride + 64 * (size_t)q + 32 * (j % 2);
            __m256i t = _mm256_maddubs_epi16(av[0], _mm256_load_si256((const __m256i *)w));
#pragma GCC unroll 3
            for (int e = 1; e < P; e++)
                t = _mm256_add_epi16(
                    t, _mm256_maddubs_epi16(av[e], _mm256_load_si256((const __m256i *)(w + 64 * e))));
            acc[j] = _mm256_add_epi32(acc[j], _mm256_madd_epi16(t, ones));
        }
    }
    for (; q < groups; q++) {
        int32_t v;
        memcpy(&v, ar + 4 * (size_t)q, 4);
        const __m256i av = _mm256_set1_epi32(v);
#pragma GCC unroll 4
        for (int j = 0; j < 2 * NBK; j++) {
            const int8_t *w = bp + (size_t)(j / 2) * bstride + 64 * (size_t)q + 32 * (j % 2);
            acc[j] = _mm256_add_epi32(
                acc[j], _mm256_madd_epi16(
                            _mm256_maddubs_epi16(av, _mm256_load_si256((const __m256i *)w)), ones));
        }
    }
}

/* Every row over one column of NBK blocks at channel c0: the offset x rowsum
 * correction and (float output, all 8 NBK channels inside [r0, r1)) the
 * scales' products taken once for the column. */
AI void column(const int NBK, const int P, const int GR, const struct npu_gemm_args *g,
               const int8_t *bp, size_t bstride, uint32_t c0)
{
    const uint32_t k4 = g->b->k4, groups = k4 / 4;
    const int shift = P == 4 ? 5 : 6; /* offset 32 or 64 */
    __m256i corr[4];
    __m256 sc[4];
#pragma GCC unroll 4
    for (int j = 0; j < 2 * NBK; j++) {
        corr[j] = _mm256_slli_epi32(
            _mm256_loadu_si256((const __m256i *)(g->b->rowsum + c0 + 8 * (uint32_t)j)), shift);
        sc[j] = _mm256_setzero_ps();
    }
    const int fast = !g->c && c0 >= g->r0 && c0 + 16 * (uint32_t)NBK <= g->r1;
    if (fast)
#pragma GCC unroll 4
        for (int j = 0; j < 2 * NBK; j++)
            sc[j] = _mm256_mul_ps(_mm256_set1_ps(g->act_scale),
                                  _mm256_loadu_ps(g->scale + c0 + 8 * (uint32_t)j));
    for (uint32_t i = 0; i < g->m; i++) {
        __m256i acc[4];
        row_sums(NBK, P, GR, g->a + (size_t)i * k4, bp, bstride, groups, acc);
        if (fast) {
            float *yi = g->y + (size_t)i * g->ldy + (c0 - g->r0);
#pragma GCC unroll 4
            for (int j = 0; j < 2 * NBK; j++)
                _mm256_storeu_ps(yi + 8 * j,
                                 _mm256_mul_ps(sc[j], _mm256_cvtepi32_ps(
                                                          _mm256_sub_epi32(acc[j], corr[j]))));
        } else {
#pragma GCC unroll 4
            for (int j = 0; j < 2 * NBK; j++)
                npu_avx2_store8(_mm256_sub_epi32(acc[j], corr[j]), g, i, c0 + 8 * (uint32_t)j);
        }
    }
}

/* The column for P and a group count: 16 and 32 (head sizes 64 and 128)
 * unrolled. */
AI void column_p(const int NBK, const int P, const struct npu_gemm_args *g, const int8_t *bp,
                 size_t bstride, uint32_t c0)
{
    switch (g->b->k4 / 4) {
    case 16:
        column(NBK, P, 16, g, bp, bstride, c0);
        break;
    case 32:
        column(NBK, P, 32, g, bp, bstride, c0);
        break;
    default:
        column(NBK, P, 0, g, bp, bstride, c0);
    }
}

void npu_est_gemm_avx2(const struct npu_gemm_args *g, int P)
{
    if (g->m == 0 || g->r1 <= g->r0)
        return;
    const size_t bstride = npu_gemm_b_block_bytes(g->b);
    const uint32_t blk0 = g->r0 / 16, blk1 = (g->r1 + 15) / 16;
    for (uint32_t bl = blk0; bl < blk1; bl += 2) {
        const int8_t *bp = g->b->packed + (size_t)bl * bstride;
        const int two = blk1 - bl >= 2;
        if (P == 4 && two)
            column_p(2, 4, g, bp, bstride, bl * 16);
        else if (P == 4)
            column_p(1, 4, g, bp, bstride, bl * 16);
        else if (two)
            column_p(2, 2, g, bp, bstride, bl * 16);
        else
            column_p(1, 2, g, bp, bstride, bl * 16);
    }
}

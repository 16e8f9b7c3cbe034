/* npu_gemm_rows_avx2.c: the AVX2 int8 GEMM for a few activation rows (1 to
 * NPU_GEMM_ROWS_MAX: decode and verification steps) on weight blocks whose
 * codes are all within +-NPU_GEMM_TINY (5-bit and smaller codes), bit-exact
 * with npu_gemm_scalar.c (contract in npu_gemm_internal.h).
 *
 * At 4-16 rows the 3x32 tile of npu_gemm_avx2.c is bound by its multiply
 * steps (maddubs, madd, add per 32 multiply-adds: two multiplier uops), not
 * by memory. With codes within +-16 the int16 pair sums of maddubs of a +
 * 128 (<= 255) are at most 2 x 255 x 16 = 8160, so four of them add up in
 * int16 exactly (<= 32640 < 32767): one madd (int16 pairs -> int32) per four
 * maddubs, 1.25 multiplier uops per 32 multiply-adds instead of 2. The sums
 * are the same integers (exact at every step), so the results equal every
 * other kernel's bit for bit; 128 x rowsum comes off at the end as in the
 * narrow step.
 *
 * Loop order: a column of two 16-channel blocks (32 channels), cut into
 * k-panels of PANEL groups (4 k values each; 1 KiB per block); every row
 * passes over the panel while it is in L1, so each weight byte comes from
 * memory once for all rows. A row's panel sums stay in registers (4 int32
 * vectors) and are added into a per-column accumulator in memory (rows x
 * 32 int32). The weights PF_PANELS panels ahead are prefetched once,
 * spread over the rows' passes, across the end of the column into the next.
 * Activations are read from the AVX2 kernel's staging (signed, 3-row
 * interleave) and offset to a + 128 per broadcast. */
#include <immintrin.h>
#include <string.h>

#include "npu_gemm_internal.h"
#include "npu_store_avx2.h"

#define AI static inline __attribute__((always_inline))
/* keeps GCC -O3 from hoisting every maddubs of an unrolled panel above the
 * adds (it then spilled the products to the stack: +10-25% at 8 rows with
 * the order pinned after each group, BENCHMARKS "Issue 18, eighth session") */
#define REG(v) __asm__("" : "+x"(v))
#define PANEL 16    /* groups (4 k values) per k-panel: four int16 rounds of 4 */
#ifndef PF_PANELS
#define PF_PANELS 6 /* how far ahead the weights are prefetched, in panels */
#endif

/* a + 128 of the row's four staged bytes of a group */
AI __m256i bcast_u(const uint8_t *p)
{
    int32_t av;
    memcpy(&av, p, 4);
    return _mm256_xor_si256(_mm256_set1_epi32(av), _mm256_set1_epi8((char)0x80));
}

AI __m256i mb(__m256i u, const int8_t *w) { return _mm256_maddubs_epi16(u, _mm256_load_si256((const __m256i *)w)); }

/* One int16 round of cn (1..4) groups of one row: s[j] += the round's sums
 * of weight vector j. aq: the row's staged bytes of the round's first group
 * (group e at aq + 12 e); w0, w1: the two blocks' bytes of that group (group
 * e at + 64 e; w1 unused when NV == 2). */
AI void round4(const int NV, const int cn, const uint8_t *aq, const int8_t *w0, const int8_t *w1,
               __m256i *s)
{
    __m256i u = bcast_u(aq);
    __m256i t0 = mb(u, w0), t1 = mb(u, w0 + 32), t2 = t0, t3 = t1;
    if (NV == 4)
        t2 = mb(u, w1), t3 = mb(u, w1 + 32);
    REG(t0);
    REG(t1);
    REG(t2);
    REG(t3);
    for (int e = 1; e < cn; e++) {
        u = bcast_u(aq + 12 * e);
        t0 = _mm256_add_epi16(t0, mb(u, w0 + 64 * e));
        t1 = _mm256_add_epi16(t1, mb(u, w0 + 64 * e + 32));
        if (NV == 4) {
            t2 = _mm256_add_epi16(t2, mb(u, w1 + 64 * e));
            t3 = _mm256_add_epi16(t3, mb(u, w1 + 64 * e + 32));
        }
        REG(t0);
        REG(t1);
        REG(t2);
        REG(t3);
    }
    const __m256i ones = _mm256_set1_epi16(1);
    s[0] = _mm256_add_epi32(s[0], _mm256_madd_epi16(t0, ones));
    s[1] = _mm256_add_epi32(s[1], _mm256_madd_epi16(t1, ones));
    if (NV == 4) {
        s[2] = _mm256_add_epi32(s[2], _mm256_madd_epi16(t2, ones));
        s[3] = _mm256_add_epi32(s[3], _mm256_madd_epi16(t3, ones));
    }
}

/* One row over nq groups (PANEL: the four rounds unrolled). */
AI void row_panel(const int NV, const uint8_t *aq, const int8_t *w0, const int8_t *w1,
                  uint32_t nq, __m256i *s)
{
    if (nq == PANEL) {
#pragma GCC unroll 4
        for (int c = 0; c < PANEL; c += 4)
            round4(NV, 4, aq + 12 * c, w0 + 64 * c, w1 + 64 * c, s);
        return;
    }
    uint32_t c = 0;
    for (; c + 4 <= nq; c += 4)
        round4(NV, 4, aq + 12 * c, w0 + 64 * c, w1 + 64 * c, s);
    switch (nq - c) {
    case 3:
        round4(NV, 3, aq + 12 * c, w0 + 64 * c, w1 + 64 * c, s);
        break;
    case 2:
        round4(NV, 2, aq + 12 * c, w0 + 64 * c, w1 + 64 * c, s);
        break;
    case 1:
        round4(NV, 1, aq + 12 * c, w0 + 64 * c, w1 + 64 * c, s);
        break;
    default:
        break;
    }
}

/* Full panels (nq == PANEL) unrolled by the compiler; the last one general. */
AI void column(const int NV, const struct npu_gemm_args *g, const int8_t *bp, size_t bstride,
               uint32_t c0)
{
    const uint32_t k4 = g->b->k4, groups = k4 / 4, m = g->m;
    __m256i acc[NPU_GEMM_ROWS_MAX][4];
    for (uint32_t i = 0; i < m; i++)
        for (int j = 0; j < NV; j++)
            acc[i][j] = _mm256_setzero_si256();
    for (uint32_t q0 = 0; q0 < groups; q0 += PANEL) {
        const uint32_t nq = groups - q0 < PANEL ? groups - q0 : PANEL;
        /* the weights PF_PANELS panels ahead: in this column, and past the
         * blocks' ends the same panels of the next column's blocks (which
         * come next; each block's first panels were a stall per column
         * otherwise: +10-18% at 4-8 rows streamed from memory, BENCHMARKS) */
        const size_t off = 64 * (size_t)(q0 + PF_PANELS * PANEL);
        const int8_t *pf =
            off < bstride ? bp + off : bp + (size_t)(NV / 2) * bstride + (off - bstride);
        const uint32_t nl = (uint32_t)(NV / 2) * PANEL; /* lines to prefetch */
        for (uint32_t i = 0; i < m; i++) {
            /* row i's share of them, so that the loads stay in flight while
             * the rows multiply (all at once before the first row: the
             * memory idled during the rest; 4 rows +10-15%, BENCHMARKS) */
            for (uint32_t l = i * nl / m; l < (i + 1) * nl / m; l++) {
                const int8_t *pl = pf + (size_t)(l / PANEL) * bstride + 64 * (size_t)(l % PANEL);
                _mm_prefetch((const char *)pl, _MM_HINT_T0);
            }
            const uint8_t *ai = g->a + npu_gemm_a_off(i, 0, k4, 3);
            __m256i s[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(),
                            _mm256_setzero_si256(), _mm256_setzero_si256()};
            const uint8_t *aq = ai + (size_t)q0 * 12;
            const int8_t *w0 = bp + 64 * (size_t)q0, *w1 = w0 + bstride;
            row_panel(NV, aq, w0, w1, nq, s);
            for (int j = 0; j < NV; j++)
                acc[i][j] = _mm256_add_epi32(acc[i][j], s[j]);
        }
    }
    for (int j = 0; j < NV; j++) {
        const __m256i corr = _mm256_slli_epi32(
            _mm256_loadu_si256((const __m256i *)(g->b->rowsum + c0 + 8 * (uint32_t)j)), 7);
        for (uint32_t i = 0; i < m; i++)
            npu_avx2_store8(_mm256_sub_epi32(acc[i][j], corr), g, i, c0 + 8 * (uint32_t)j);
    }
}

void npu_gemm_rows_avx2(const struct npu_gemm_args *g, uint32_t bl, int nb)
{
    const size_t bstride = npu_gemm_b_block_bytes(g->b);
    const int8_t *bp = g->b->packed + (size_t)bl * bstride;
    if (nb == 2)
        column(4, g, bp, bstride, bl * 16);
    else
        column(2, g, bp, bstride, bl * 16);
}

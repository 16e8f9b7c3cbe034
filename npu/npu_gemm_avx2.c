/* npu_gemm_avx2.c: int8 GEMM with AVX2, bit-exact with npu_gemm_scalar.c
 * (contract in npu_gemm_internal.h).
 *
 * vpmaddubsw multiplies unsigned by signed bytes and adds pairs into int16
 * with saturation. Feeding it a + 128 (up to 255) times weights of 127 would
 * saturate (2 x 255 x 127 > 32767), so the sign of a is moved onto b instead:
 * |a| * (b * sign(a)). |a| <= 128 read as unsigned and |b| <= 127 (weights of
 * -128 are refused when they are prepared: negating one would overflow) keep
 * every pair sum within 2 x 128 x 127 = 32512, exact in int16; vpmaddwd by
 * ones widens the pairs to int32. Weights use the [n/16][k/4][16][4] layout of
 * the VNNI kernel: a 64-byte group is two ymm of 8 channels x 4 k. Register
 * tile: 3 rows x 32 channels (12 accumulators). Blocks whose codes are all
 * within +-NPU_GEMM_TINY (most of a 5-bit model's) add four maddubs in int16
 * before one madd: 1.25 multiplier uops per 32 multiply-adds instead of 2
 * (quad, tile2_tiny); measured 1.10-1.17x on the model's tensors. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "npu_gemm_internal.h"
#include "npu_store_avx2.h"

#define AI static inline __attribute__((always_inline))
#define LR 3 /* rows per tile */
/* 1: two tiny blocks take the 2-row tile (tile2_tiny), 0: the 3-row one */
#ifndef TWO_ROWS
#define TWO_ROWS 1
#endif
/* keeps GCC from reassociating the sums of a tile (it gathered every
 * product first, then added them up through the stack) */
#define REG(v) __asm__("" : "+x"(v))
#define NB 2 /* 16-channel blocks per tile */
/* the fewest rows that take the few-rows kernel (npu_gemm_rows_avx2.c) */
#ifndef NPU_GEMM_ROWS_MIN
#define NPU_GEMM_ROWS_MIN 4
#endif

static const char *const tile_names[] = {"3x32"};

/* Stage A unchanged (signed), k padded with zeros, LR-row interleave. */
static void prep_avx2(const int8_t *a, size_t lda_in, uint32_t m, uint32_t k, uint32_t k4,
                      int tile, uint8_t *out)
{
    const size_t step = (size_t)LR * 4;
    const uint32_t kf = k & ~3u;
    for (uint32_t i = 0; i < m; i++) {
        const uint8_t *src = (const uint8_t *)a + (size_t)i * lda_in;
        uint8_t *dst = out + npu_gemm_a_off(i, 0, k4, LR);
        for (uint32_t j = 0; j < kf; j += 4)
            memcpy(dst + (size_t)(j / 4) * step, src + j, 4);
        if (kf < k4) {
            uint8_t t[4] = {0, 0, 0, 0};
            memcpy(t, src + kf, k - kf);
            memcpy(dst + (size_t)(kf / 4) * step, t, 4);
        }
    }
}

/* The end of a tile whose sums were taken on a + 128 (the narrow and tiny
 * steps): 128 x rowsum comes off each channel, then MR rows x NBK blocks of
 * acc (rows of 2 * NB vectors) are stored. */
AI void store_narrow(const int MR, const int NBK, __m256i (*acc)[2 * NB],
                     const struct npu_gemm_args *g, uint32_t i0, uint32_t c0)
{
#pragma GCC unroll 4
    for (int j = 0; j < 2 * NBK; j++) {
        const __m256i corr = _mm256_slli_epi32(
            _mm256_loadu_si256((const __m256i *)(g->b->rowsum + c0 + 8 * (uint32_t)j)), 7);
#pragma GCC unroll 3
        for (int i = 0; i < MR; i++)
            npu_avx2_store8(_mm256_sub_epi32(acc[i][j], corr), g, i0 + (uint32_t)i, c0 + 8 * (uint32_t)j);
    }
}

/* MR rows (of an LR-row tile) x nbk blocks (2 ymm each). NARROW: every
 * code of the blocks is within +-64, so the step is maddubs(a + 128, b)
 * (pair sums at most 2 x 255 x 64 = 32640: exact in int16), madd, add, and
 * 128 x rowsum(b) comes off at the end: the same int32 sums with one
 * instruction less per step and no absolute value per row. */
AI void tile(const int MR, const int NBK, const int NARROW, const uint8_t *a, const int8_t *bp,
             size_t bstride, const struct npu_gemm_args *g, uint32_t i0, uint32_t c0)
{
    const uint32_t groups = g->b->k4 / 4;
    const __m256i ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8((char)0x80);
    __m256i acc[LR][2 * NB];
#pragma GCC unroll 3
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int j = 0; j < 2 * NBK; j++)
            acc[i][j] = _mm256_setzero_si256();
    for (uint32_t q = 0; q < groups; q++) {
        __m256i w[2 * NB];
#pragma GCC unroll 4
        for (int j = 0; j < 2 * NBK; j++)
            w[j] = _mm256_load_si256(
                (const __m256i *)(bp + (size_t)(j / 2) * bstride + 64 * (size_t)q + 32 * (j % 2)));
        const uint8_t *aq = a + (size_t)q * LR * 4;
#pragma GCC unroll 3
        for (int i = 0; i < MR; i++) {
            int32_t t;
            memcpy(&t, aq + 4 * i, 4);
            const __m256i av = _mm256_set1_epi32(t);
            if (NARROW) {
                const __m256i au = _mm256_xor_si256(av, flip); /* a + 128, unsigned */
#pragma GCC unroll 4
                for (int j = 0; j < 2 * NBK; j++)
                    acc[i][j] = _mm256_add_epi32(
                        acc[i][j], _mm256_madd_epi16(_mm256_maddubs_epi16(au, w[j]), ones));
            } else {
                const __m256i aa = _mm256_abs_epi8(av);
#pragma GCC unroll 4
                for (int j = 0; j < 2 * NBK; j++)
                    acc[i][j] = _mm256_add_epi32(
                        acc[i][j],
                        _mm256_madd_epi16(_mm256_maddubs_epi16(aa, _mm256_sign_epi8(w[j], av)), ones));
            }
        }
    }
    if (NARROW) {
        store_narrow(MR, NBK, acc, g, i0, c0);
        return;
    }
#pragma GCC unroll 3
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int j = 0; j < 2 * NBK; j++)
            npu_avx2_store8(acc[i][j], g, i0 + (uint32_t)i, c0 + 8 * (uint32_t)j);
}

/* CN (1..4) groups of the narrow step for MR rows x NBK blocks, from the
 * staged rows aq and the blocks' bytes bq (group e at + 64 e). T0, T1:
 * block 0, 1 is tiny (every code within +-NPU_GEMM_TINY). A tiny block's
 * maddubs results (pair sums of (a + 128) x code, at most 2 x 255 x 16 =
 * 8160) add up over the CN groups in int16 (at most 4 x 8160 = 32640:
 * exact), then one madd widens them into acc; the other block takes the
 * narrow step per group. The same int32 sums either way. */
AI void quad(const int MR, const int NBK, const int T0, const int T1, const int CN,
             const uint8_t *aq, const int8_t *bq, size_t bstride, __m256i acc[LR][2 * NB])
{
    const __m256i ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8((char)0x80);
    __m256i t[LR][2 * NB];
#pragma GCC unroll 4
    for (int e = 0; e < CN; e++) {
        __m256i au[LR];
#pragma GCC unroll 3
        for (int i = 0; i < MR; i++) {
            int32_t v;
            memcpy(&v, aq + (size_t)e * LR * 4 + 4 * i, 4);
            au[i] = _mm256_xor_si256(_mm256_set1_epi32(v), flip); /* a + 128, unsigned */
        }
#pragma GCC unroll 4
        for (int j = 0; j < 2 * NBK; j++) {
            const int tiny = j / 2 ? T1 : T0;
            const __m256i w = _mm256_load_si256(
                (const __m256i *)(bq + (size_t)(j / 2) * bstride + 64 * (size_t)e + 32 * (j % 2)));
#pragma GCC unroll 3
            for (int i = 0; i < MR; i++) {
                const __m256i p = _mm256_maddubs_epi16(au[i], w);
                if (tiny) {
                    t[i][j] = e ? _mm256_add_epi16(t[i][j], p) : p;
                    REG(t[i][j]);
                } else {
                    acc[i][j] = _mm256_add_epi32(acc[i][j], _mm256_madd_epi16(p, ones));
                    REG(acc[i][j]);
                }
            }
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < 2 * NBK; j++)
        if (j / 2 ? T1 : T0)
#pragma GCC unroll 3
            for (int i = 0; i < MR; i++)
                acc[i][j] = _mm256_add_epi32(acc[i][j], _mm256_madd_epi16(t[i][j], ones));
}

/* The tile of two tiny blocks: MR (1 or 2) rows x 32 channels, any rows
 * (ar: each row's staged bytes, 12 per group in the 3-row interleave), four
 * groups per int16 round as in quad. Two rows, not three: the 8 int16 sums,
 * 2 rows, a weight vector and a product fit the 16 ymm registers with room
 * to spare (GCC spilled the 3-row tile's sums). */
AI void quad2(const int MR, const int CN, const uint8_t *const *ar, const int8_t *bq,
              size_t bstride, __m256i acc[2][2 * NB])
{
    const __m256i ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8((char)0x80);
    __m256i t[2][2 * NB];
#pragma GCC unroll 4
    for (int e = 0; e < CN; e++) {
        __m256i au[2];
#pragma GCC unroll 2
        for (int i = 0; i < MR; i++) {
            int32_t v;
            memcpy(&v, ar[i] + (size_t)e * LR * 4, 4);
            au[i] = _mm256_xor_si256(_mm256_set1_epi32(v), flip);
        }
#pragma GCC unroll 4
        for (int j = 0; j < 2 * NB; j++) {
            const __m256i w = _mm256_load_si256(
                (const __m256i *)(bq + (size_t)(j / 2) * bstride + 64 * (size_t)e + 32 * (j % 2)));
#pragma GCC unroll 2
            for (int i = 0; i < MR; i++) {
                const __m256i p = _mm256_maddubs_epi16(au[i], w);
                t[i][j] = e ? _mm256_add_epi16(t[i][j], p) : p;
                REG(t[i][j]);
            }
        }
    }
#pragma GCC unroll 2
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int j = 0; j < 2 * NB; j++)
            acc[i][j] = _mm256_add_epi32(acc[i][j], _mm256_madd_epi16(t[i][j], ones));
}

/* quad2 for two rows and four groups in assembly: GCC, given the
 * intrinsics, read every weight vector from memory once per row (twice
 * the loads) and moved each sum through a scratch register. Rows a + 128
 * in ymm8 and ymm9, the weight vector in ymm10, the product in ymm11; the
 * 8 int16 sums (t[i][j] = %[t<2j+i>]) go out, widened as in quad2. */
#define Q2_ROWS(e)                                                                          \
    "vpbroadcastd 12*" e "(%[a0]), %%ymm8\n\tvpxor %[flip], %%ymm8, %%ymm8\n\t"              \
    "vpbroadcastd 12*" e "(%[a1]), %%ymm9\n\tvpxor %[flip], %%ymm9, %%ymm9\n\t"
#define Q2_SET(off, w, t0, t1)                                                              \
    "vmovdqa " off "(%[" w "]), %%ymm10\n\t"                                                \
    "vpmaddubsw %%ymm10, %%ymm8, %[" t0 "]\n\tvpmaddubsw %%ymm10, %%ymm9, %[" t1 "]\n\t"
#define Q2_ADD(off, w, t0, t1)                                                              \
    "vmovdqa " off "(%[" w "]), %%ymm10\n\t"                                                \
    "vpmaddubsw %%ymm10, %%ymm8, %%ymm11\n\tvpaddw %%ymm11, %[" t0 "], %[" t0 "]\n\t"        \
    "vpmaddubsw %%ymm10, %%ymm9, %%ymm11\n\tvpaddw %%ymm11, %[" t1 "], %[" t1 "]\n\t"
#define Q2_ALL(OP, e)                                                                       \
    OP("64*" e, "w0", "t0", "t1") OP("64*" e "+32", "w0", "t2", "t3")                        \
    OP("64*" e, "w1", "t4", "t5") OP("64*" e "+32", "w1", "t6", "t7")

AI void quad2_asm(const uint8_t *const *ar, const int8_t *bq, size_t bstride,
                  __m256i acc[2][2 * NB])
{
    const __m256i ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8((char)0x80);
    const int8_t *w1 = bq + bstride;
    __m256i t0, t1, t2, t3, t4, t5, t6, t7;
    __asm__(Q2_ROWS("0") Q2_ALL(Q2_SET, "0") Q2_ROWS("1") Q2_ALL(Q2_ADD, "1") Q2_ROWS("2")
                Q2_ALL(Q2_ADD, "2") Q2_ROWS("3") Q2_ALL(Q2_ADD, "3")
            : [t0] "=&x"(t0), [t1] "=&x"(t1), [t2] "=&x"(t2), [t3] "=&x"(t3), [t4] "=&x"(t4),
              [t5] "=&x"(t5), [t6] "=&x"(t6), [t7] "=&x"(t7)
            : [a0] "r"(ar[0]), [a1] "r"(ar[1]), [w0] "r"(bq), [w1] "r"(w1), [flip] "x"(flip),
              "m"(*(const uint8_t(*)[4 * LR * 4])ar[0]), "m"(*(const uint8_t(*)[4 * LR * 4])ar[1]),
              "m"(*(const int8_t(*)[256])bq), "m"(*(const int8_t(*)[256])w1)
            : "xmm8", "xmm9", "xmm10", "xmm11");
    const __m256i t[8] = {t0, t1, t2, t3, t4, t5, t6, t7};
#pragma GCC unroll 4
    for (int j = 0; j < 2 * NB; j++)
#pragma GCC unroll 2
        for (int i = 0; i < 2; i++)
            acc[i][j] = _mm256_add_epi32(acc[i][j], _mm256_madd_epi16(t[2 * j + i], ones));
}

AI void tile2_tiny(const int MR, const struct npu_gemm_args *g, const int8_t *bp, size_t bstride,
                   uint32_t i0, uint32_t c0)
{
    const uint32_t k4 = g->b->k4, groups = k4 / 4, g4 = groups & ~3u;
    const uint8_t *ar[2] = {g->a + npu_gemm_a_off(i0, 0, k4, LR),
                            g->a + npu_gemm_a_off(MR > 1 ? i0 + 1 : i0, 0, k4, LR)};
    __m256i acc[2][2 * NB];
#pragma GCC unroll 2
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int j = 0; j < 2 * NB; j++)
            acc[i][j] = _mm256_setzero_si256();
    for (uint32_t q = 0; q < g4; q += 4) {
        const uint8_t *aq[2] = {ar[0] + (size_t)q * LR * 4, ar[1] + (size_t)q * LR * 4};
        if (MR == 2)
            quad2_asm(aq, bp + 64 * (size_t)q, bstride, acc);
        else
            quad2(MR, 4, aq, bp + 64 * (size_t)q, bstride, acc);
    }
    const uint8_t *at[2] = {ar[0] + (size_t)g4 * LR * 4, ar[1] + (size_t)g4 * LR * 4};
    const int8_t *bt = bp + 64 * (size_t)g4;
    switch (groups - g4) {
    case 3:
        quad2(MR, 3, at, bt, bstride, acc);
        break;
    case 2:
        quad2(MR, 2, at, bt, bstride, acc);
        break;
    case 1:
        quad2(MR, 1, at, bt, bstride, acc);
        break;
    default:
        break;
    }
    store_narrow(MR, NB, acc, g, i0, c0);
}

/* The narrow tile (codes within +-64) where at least one of its blocks is
 * tiny: groups four at a time through quad, then the rowsum correction. */
AI void tile_tiny(const int MR, const int NBK, const int T0, const int T1, const uint8_t *a,
                  const int8_t *bp, size_t bstride, const struct npu_gemm_args *g, uint32_t i0,
                  uint32_t c0)
{
    const uint32_t groups = g->b->k4 / 4, g4 = groups & ~3u;
    __m256i acc[LR][2 * NB];
#pragma GCC unroll 3
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int j = 0; j < 2 * NBK; j++)
            acc[i][j] = _mm256_setzero_si256();
    for (uint32_t q = 0; q < g4; q += 4)
        quad(MR, NBK, T0, T1, 4, a + (size_t)q * LR * 4, bp + 64 * (size_t)q, bstride, acc);
    const uint8_t *at = a + (size_t)g4 * LR * 4;
    const int8_t *bt = bp + 64 * (size_t)g4;
    switch (groups - g4) {
    case 3:
        quad(MR, NBK, T0, T1, 3, at, bt, bstride, acc);
        break;
    case 2:
        quad(MR, NBK, T0, T1, 2, at, bt, bstride, acc);
        break;
    case 1:
        quad(MR, NBK, T0, T1, 1, at, bt, bstride, acc);
        break;
    default:
        break;
    }
    store_narrow(MR, NBK, acc, g, i0, c0);
}

/* One column of tiles (NBK blocks from bp) over every row. TINY: 0, or 1 +
 * which blocks are tiny (bit 0: block 0, bit 1: block 1), for narrow tiles. */
AI void tiles_col(const int NBK, const int NARROW, const int TINY, const struct npu_gemm_args *g,
                  const int8_t *bp, size_t bstride, uint32_t c0)
{
    const uint32_t k4 = g->b->k4, mfull = g->m / LR * LR;
    const int T0 = TINY ? (TINY - 1) & 1 : 0, T1 = TINY ? ((TINY - 1) >> 1) & 1 : 0;
    if (TINY == 4 && NBK == NB && TWO_ROWS) {
        uint32_t i = 0;
        for (; i + 2 <= g->m; i += 2)
            tile2_tiny(2, g, bp, bstride, i, c0);
        if (i < g->m)
            tile2_tiny(1, g, bp, bstride, i, c0);
        return;
    }
    for (uint32_t i = 0; i < mfull; i += LR) {
        if (TINY)
            tile_tiny(LR, NBK, T0, T1, g->a + (size_t)i * k4, bp, bstride, g, i, c0);
        else
            tile(LR, NBK, NARROW, g->a + (size_t)i * k4, bp, bstride, g, i, c0);
    }
    const uint32_t left = g->m - mfull;
    if (left == 0)
        return;
    if (TINY && left == 2)
        tile_tiny(2, NBK, T0, T1, g->a + (size_t)mfull * k4, bp, bstride, g, mfull, c0);
    else if (TINY)
        tile_tiny(1, NBK, T0, T1, g->a + (size_t)mfull * k4, bp, bstride, g, mfull, c0);
    else if (left == 2)
        tile(2, NBK, NARROW, g->a + (size_t)mfull * k4, bp, bstride, g, mfull, c0);
    else
        tile(1, NBK, NARROW, g->a + (size_t)mfull * k4, bp, bstride, g, mfull, c0);
}

/* rows: whether columns of tiny blocks take the few-rows kernel */
static void gemm_cols(const struct npu_gemm_args *g, int rows)
{
    if (g->m == 0 || g->r1 <= g->r0)
        return;
    rows = rows && g->m >= NPU_GEMM_ROWS_MIN && g->m <= NPU_GEMM_ROWS_MAX;
    const size_t bstride = npu_gemm_b_block_bytes(g->b);
    const uint32_t blk0 = g->r0 / 16, blk1 = (g->r1 + 15) / 16;
    for (uint32_t bl = blk0; bl < blk1; bl += NB) {
        const int8_t *bp = g->b->packed + (size_t)bl * bstride;
        const uint32_t c0 = bl * 16;
        if (rows && g->b->tiny[bl] && (blk1 - bl < NB || g->b->tiny[bl + 1])) {
            npu_gemm_rows_avx2(g, bl, blk1 - bl >= NB ? NB : 1);
        } else if (blk1 - bl >= NB) {
            if (!g->b->wide[bl] && !g->b->wide[bl + 1]) {
                switch (g->b->tiny[bl] | g->b->tiny[bl + 1] << 1) {
                case 1:
                    tiles_col(NB, 1, 2, g, bp, bstride, c0);
                    break;
                case 2:
                    tiles_col(NB, 1, 3, g, bp, bstride, c0);
                    break;
                case 3:
                    tiles_col(NB, 1, 4, g, bp, bstride, c0);
                    break;
                default:
                    tiles_col(NB, 1, 0, g, bp, bstride, c0);
                }
            } else {
                tiles_col(NB, 0, 0, g, bp, bstride, c0);
            }
        } else if (!g->b->wide[bl]) { /* one block left */
            if (g->b->tiny[bl])
                tiles_col(1, 1, 2, g, bp, bstride, c0);
            else
                tiles_col(1, 1, 0, g, bp, bstride, c0);
        } else {
            tiles_col(1, 0, 0, g, bp, bstride, c0);
        }
    }
}

static void gemm_avx2(const struct npu_gemm_args *g) { gemm_cols(g, 1); }

void npu_gemm_avx2_tiles(const struct npu_gemm_args *g) { gemm_cols(g, 0); }

/* Packing 8 rows x 32 bytes at a time: each row is one ymm of 8 dwords (the
 * 4-byte k groups) and the packed unit of group g holds dword g of the
 * block's 16 rows, rows 0-7 in its first 32 bytes and 8-15 in the second, so
 * each half block is an 8 x 8 dword transpose (unpack 32, unpack 64, then
 * 128-bit lane swaps). Along the way, per row: the sum of (code XOR 0x80)
 * (unsigned, by vpsadbw; the row sum is that less 128 per byte summed) and
 * the unsigned maximum of |code| over the block: its wide flag (|-128| reads
 * as 128: wide, as the scalar's q < -64), and 128 only where a code is -128
 * (no other code has that magnitude). The last
 * columns (k % 32) go through a zero-padded copy, counted as such.
 * Bit-identical with the scalar packer (tested). */
AI void transpose8_store(__m256i r[8], int8_t *dst)
{
    __m256i t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int q = 0; q < 2; q++) { /* rows 4q..4q+3 */
        u[4 * q + 0] = _mm256_unpacklo_epi64(t[4 * q], t[4 * q + 2]);
        u[4 * q + 1] = _mm256_unpackhi_epi64(t[4 * q], t[4 * q + 2]);
        u[4 * q + 2] = _mm256_unpacklo_epi64(t[4 * q + 1], t[4 * q + 3]);
        u[4 * q + 3] = _mm256_unpackhi_epi64(t[4 * q + 1], t[4 * q + 3]);
    }
    /* u[c], lane L: group c + 4L of rows 4q..4q+3 */
    for (int c = 0; c < 4; c++) {
        _mm256_storeu_si256((__m256i *)(dst + (size_t)c * 64),
                            _mm256_permute2x128_si256(u[c], u[4 + c], 0x20));
        _mm256_storeu_si256((__m256i *)(dst + (size_t)(c + 4) * 64),
                            _mm256_permute2x128_si256(u[c], u[4 + c], 0x31));
    }
}

static int pack_avx2(struct npu_gemm_b *b, const int8_t *src, uint32_t r0, uint32_t r1)
{
    static const int8_t zero[32];
    const size_t bstride = npu_gemm_b_block_bytes(b);
    const uint32_t k = b->k, kf = k & ~31u, rend = r1 == b->n ? b->n16 : r1;
    const __m256i flip = _mm256_set1_epi8((char)0x80), z = _mm256_setzero_si256();
    __m256i bad = z;
    for (uint32_t rb = r0; rb < rend; rb += 16) {
        const uint32_t nv = rb >= b->n ? 0 : b->n - rb < 16 ? b->n - rb : 16;
        int8_t *blk = b->packed + (size_t)(rb / 16) * bstride;
        __m256i mx = z; /* max |code| over the block */
        for (uint32_t h = 0; h < 2; h++) {
            const int8_t *row[8];
            size_t step[8];
            __m256i sum[8];
            for (uint32_t i = 0; i < 8; i++) {
                const int real = 8 * h + i < nv;
                row[i] = real ? src + (size_t)(rb - r0 + 8 * h + i) * k : zero;
                step[i] = real ? 32 : 0;
                sum[i] = z;
            }
            int8_t *dst = blk + 32 * h;
            uint32_t c0 = 0;
            __m256i r[8];
            for (; c0 < kf; c0 += 32) {
                for (int i = 0; i < 8; i++) {
                    r[i] = _mm256_loadu_si256((const __m256i *)row[i]);
                    row[i] += step[i];
                    sum[i] = _mm256_add_epi64(sum[i], _mm256_sad_epu8(_mm256_xor_si256(r[i], flip), z));
                    mx = _mm256_max_epu8(mx, _mm256_abs_epi8(r[i]));
                }
                transpose8_store(r, dst + (size_t)(c0 / 4) * 64);
            }
            if (c0 < k) { /* the last k - c0 columns, zero-padded to 32 */
                int8_t t[8][32];
                memset(t, 0, sizeof t);
                for (int i = 0; i < 8; i++) {
                    if (step[i])
                        memcpy(t[i], row[i], k - c0);
                    r[i] = _mm256_loadu_si256((const __m256i *)t[i]);
                    sum[i] = _mm256_add_epi64(sum[i], _mm256_sad_epu8(_mm256_xor_si256(r[i], flip), z));
                    mx = _mm256_max_epu8(mx, _mm256_abs_epi8(r[i]));
                }
                /* only the groups inside k4 (the rest is the next block's) */
                int8_t o[8][64];
                transpose8_store(r, &o[0][0]);
                for (uint32_t g = 0; g < (k - c0 + 3) / 4; g++)
                    memcpy(dst + (size_t)(c0 / 4 + g) * 64, o[g], 32);
            }
            /* sum of (code + 128) over the padded columns, less 128 each */
            const int64_t cols = (int64_t)kf + (c0 < k ? 32 : 0);
            for (uint32_t i = 0; i < 8; i++) {
                int64_t v[4];
                _mm256_storeu_si256((__m256i *)v, sum[i]);
                b->rowsum[rb + 8 * h + i] = (int32_t)(v[0] + v[1] + v[2] + v[3] - 128 * cols);
            }
        }
        /* any byte of |code| above 64 (unsigned: |-128| is 128) */
        const __m256i over = _mm256_cmpeq_epi8(_mm256_max_epu8(mx, _mm256_set1_epi8(65)), mx);
        b->wide[rb / 16] = (uint8_t)(_mm256_movemask_epi8(over) != 0);
        /* and tiny: no byte of |code| above NPU_GEMM_TINY */
        const __m256i big = _mm256_cmpeq_epi8(
            _mm256_max_epu8(mx, _mm256_set1_epi8(NPU_GEMM_TINY + 1)), mx);
        b->tiny[rb / 16] = (uint8_t)(_mm256_movemask_epi8(big) == 0);
        bad = _mm256_or_si256(bad, _mm256_cmpeq_epi8(mx, flip));
    }
    return _mm256_movemask_epi8(bad) != 0;
}

/* The scalar quantization's math on 8 lanes: rint by vroundps (nearest
 * even), clamp, NaN to 0 (an ordered-compare mask), then the int32 ->
 * int8 narrowing by packs (exact: values are already in [-127, 127]). */
static void quant_avx2(const float *x, size_t n, float inv, int8_t *xq)
{
    const __m256 vi = _mm256_set1_ps(inv), hi = _mm256_set1_ps(127.0f),
                 lo = _mm256_set1_ps(-127.0f);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vi),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m256 ord = _mm256_cmp_ps(v, v, _CMP_ORD_Q);
        v = _mm256_and_ps(_mm256_min_ps(_mm256_max_ps(v, lo), hi), ord);
        __m256i d = _mm256_cvtps_epi32(v);
        __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(d), _mm256_extracti128_si256(d, 1));
        __m128i b8 = _mm_packs_epi16(w, w);
        _mm_storel_epi64((__m128i *)(xq + i), b8);
    }
    for (; i < n; i++) { /* the scalar definition for the tail */
        float v = rintf(x[i] * inv);
        xq[i] = (int8_t)(v >= 127.0f ? 127 : v <= -127.0f ? -127 : v == v ? (int)v : 0);
    }
}

static float absmax_avx2(const float *x, size_t n)
{
    const __m256 big = _mm256_set1_ps(3.40282347e38f);
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 m = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 a = _mm256_and_ps(_mm256_loadu_ps(x + i), absmask);
        const __m256 fin = _mm256_cmp_ps(a, big, _CMP_LE_OQ);
        m = _mm256_max_ps(m, _mm256_and_ps(a, fin)); /* non-finite lanes count as 0 */
    }
    float t[8], r = 0.0f;
    _mm256_storeu_ps(t, m);
    for (int q = 0; q < 8; q++)
        r = t[q] > r ? t[q] : r;
    for (; i < n; i++) {
        float a = fabsf(x[i]);
        if (a > r && a <= 3.40282347e38f)
            r = a;
    }
    return r;
}

const struct npu_kernel_ops npu_ops_avx2 = {prep_avx2,   gemm_avx2, pack_avx2, quant_avx2,
                                            absmax_avx2, 1,         tile_names, UINT32_MAX};

/* Peak of this kernel's fastest inner step, as the kernel runs it: the
 * narrow step (maddubs of unsigned activations and codes within +-64, madd,
 * add; 5-bit weights take it) for 2 activation rows x 3 weight vectors, 6
 * accumulator chains, 32 multiply-adds per step. The wide step (with
 * vpsignb, for codes beyond +-64) is slower, so a kernel on 8-bit weights
 * stays below this. The rows and weights are made opaque to the compiler
 * every iteration: with loop-invariant operands it computed one
 * sign/maddubs/madd per iteration for all chains (the same value) and only
 * the additions per chain, which overstated the peak. */
#define PEAK_STEP(acc, u, w) acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, w), ones))

uint64_t npu_peak_avx2(uint64_t iters)
{
    /* the rows already unsigned (the kernel's a XOR 0x80 is one instruction
     * per row and 4 steps); 6 accumulators, 2 rows, 3 weights and the ones
     * in 12 registers, so that nothing is spilled */
    __m256i u0 = _mm256_set1_epi8((char)131), u1 = _mm256_set1_epi8((char)121);
    __m256i w0 = _mm256_set1_epi8(5), w1 = _mm256_set1_epi8(-9), w2 = _mm256_set1_epi8(11),
            ones = _mm256_set1_epi16(1);
    __m256i c0 = _mm256_set1_epi32(0), c1 = _mm256_set1_epi32(1), c2 = _mm256_set1_epi32(2),
            c3 = _mm256_set1_epi32(3), c4 = _mm256_set1_epi32(4), c5 = _mm256_set1_epi32(5);
    for (uint64_t it = 0; it < iters; it++) {
        __asm__ volatile("" : "+x"(u0), "+x"(u1), "+x"(w0), "+x"(w1), "+x"(w2));
        PEAK_STEP(c0, u0, w0);
        PEAK_STEP(c1, u0, w1);
        PEAK_STEP(c2, u0, w2);
        PEAK_STEP(c3, u1, w0);
        PEAK_STEP(c4, u1, w1);
        PEAK_STEP(c5, u1, w2);
    }
    __m256i s = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(c0, c1), _mm256_add_epi32(c2, c3)),
                                 _mm256_add_epi32(c4, c5));
    int32_t v[8];
    _mm256_storeu_si256((__m256i *)v, s);
    return (uint64_t)((uint32_t)v[0] + (uint32_t)v[7]); /* wraps: no signed overflow */
}

/* Peak of the tiny step (codes within +-NPU_GEMM_TINY), as tile2_tiny runs
 * it: per 4 groups, maddubs into int16 sums added in int16, then one madd
 * and one add into int32; 2 rows x 2 weight vectors, 4 int16 and 4 int32
 * chains, 16 maddubs (512 multiply-adds) per iteration. Rows and weights
 * are made opaque every group, as in npu_peak_avx2. */
#define TINY_GROUP(first)                                                                  \
    do {                                                                                   \
        __asm__ volatile("" : "+x"(u0), "+x"(u1), "+x"(w0), "+x"(w1));                     \
        const __m256i p0 = _mm256_maddubs_epi16(u0, w0), p1 = _mm256_maddubs_epi16(u0, w1),  \
                      p2 = _mm256_maddubs_epi16(u1, w0), p3 = _mm256_maddubs_epi16(u1, w1);  \
        t0 = first ? p0 : _mm256_add_epi16(t0, p0);                                        \
        t1 = first ? p1 : _mm256_add_epi16(t1, p1);                                        \
        t2 = first ? p2 : _mm256_add_epi16(t2, p2);                                        \
        t3 = first ? p3 : _mm256_add_epi16(t3, p3);                                        \
    } while (0)

uint64_t npu_peak_avx2_tiny(uint64_t iters)
{
    __m256i u0 = _mm256_set1_epi8((char)131), u1 = _mm256_set1_epi8((char)121);
    __m256i w0 = _mm256_set1_epi8(5), w1 = _mm256_set1_epi8(-9), ones = _mm256_set1_epi16(1);
    __m256i c0 = _mm256_set1_epi32(0), c1 = _mm256_set1_epi32(1), c2 = _mm256_set1_epi32(2),
            c3 = _mm256_set1_epi32(3);
    __m256i t0, t1, t2, t3;
    for (uint64_t it = 0; it < iters; it++) {
        TINY_GROUP(1);
        TINY_GROUP(0);
        TINY_GROUP(0);
        TINY_GROUP(0);
        c0 = _mm256_add_epi32(c0, _mm256_madd_epi16(t0, ones));
        c1 = _mm256_add_epi32(c1, _mm256_madd_epi16(t1, ones));
        c2 = _mm256_add_epi32(c2, _mm256_madd_epi16(t2, ones));
        c3 = _mm256_add_epi32(c3, _mm256_madd_epi16(t3, ones));
    }
    __m256i s = _mm256_add_epi32(_mm256_add_epi32(c0, c1), _mm256_add_epi32(c2, c3));
    int32_t v[8];
    _mm256_storeu_si256((__m256i *)v, s);
    return (uint64_t)((uint32_t)v[0] + (uint32_t)v[7]); /* wraps: no signed overflow */
}

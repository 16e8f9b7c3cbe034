/* npu_gemm_avx512vnni.c: int8 GEMM with AVX-512 VNNI, bit-exact with
 * npu_gemm_scalar.c (contract in npu_gemm_internal.h).
 *
 * vpdpbusd multiplies unsigned bytes by signed bytes, four at a time into
 * each 32-bit lane. Activations a in [-127, 127] are offset to a + 128 in
 * [1, 255] (a XOR 0x80) when they are staged, and 128 * rowsum(B[r]) (the
 * rowsum computed when the weights were prepared) is subtracted at the end:
 * sum (a + 128) b - 128 sum b = sum a b, exactly, in int32 (|sum| stays far
 * below 2^31 for k < 2^16, and wrap-around would cancel anyway).
 *
 * Weights are packed as [n/16][k/4][16][4]: one 64-byte zmm holds four k
 * values of 16 output channels, which one vpdpbusd consumes against a
 * broadcast of four activation bytes of one row. A register tile is R rows x
 * NB blocks of 16 channels with R * NB = 24 accumulators (6x64, 8x48, 12x32);
 * the staged activations are [m/R][k/4][R][4] so the tile's broadcasts walk one
 * pointer. Loop order: a panel of NB blocks (NB * 16 * k bytes, meant to stay
 * in L2) is the outer loop, every row tile passes over it; a graph picks the
 * tiling whose panel and row stream suit its shape (npu_graph.c). */
#include <immintrin.h>
#include <string.h>

#include "npu_gemm_internal.h"
#include "npu_store_avx512.h"

#define AI static inline __attribute__((always_inline))

struct tiling {
    int rows, blocks;
};
static const struct tiling tilings[] = {{6, 4}, {8, 3}, {12, 2}};
static const char *const tile_names[] = {"6x64", "8x48", "12x32"};
#define NTILES ((int)(sizeof tilings / sizeof tilings[0]))

/* Stage A: XOR 0x80, k padded with zero bytes (their weights are zero), R-row
 * interleave (the layout npu_prep_vnni_ref defines; bit for bit the same
 * bytes, test_npu_prep). Rows beyond m in the last tile are never read.
 *
 * Row k-groups one at a time (a 4-byte load, XOR and store each) cost the
 * NPU thread ~9% of its GEMM time in a 512-token prefill on the Zen 5 of
 * docs/BENCHMARKS.md (zc22): a graph stages a chunk's activations again for
 * each linear (each has its own activation scale, so its own codes), and a
 * CPU worker's stolen piece for every piece. So four rows (two for the
 * 6-row tiling) go together, 64 bytes of each: their 16 groups transposed in
 * registers (the four rows' dwords of one group side by side: a 4 x 4 dword
 * transpose per 128-bit lane) and stored 16 (8) bytes at a time, at the
 * group's place in the tile. The k bytes past the last whole 64 and rows
 * past the last whole unit take the per-group loop (npu_prep_row_groups). */

/* Four rows (src, lda apart; dst: the first one's group 0), bytes [0, kv). */
static void prep_rows4(const uint8_t *src, size_t lda, uint8_t *dst, uint32_t kv, size_t step)
{
    const __m512i x80 = _mm512_set1_epi8((char)0x80);
    for (uint32_t j = 0; j < kv; j += 64) {
        const __m512i r0 = _mm512_xor_si512(_mm512_loadu_si512(src + j), x80);
        const __m512i r1 = _mm512_xor_si512(_mm512_loadu_si512(src + lda + j), x80);
        const __m512i r2 = _mm512_xor_si512(_mm512_loadu_si512(src + 2 * lda + j), x80);
        const __m512i r3 = _mm512_xor_si512(_mm512_loadu_si512(src + 3 * lda + j), x80);
        const __m512i t0 = _mm512_unpacklo_epi32(r0, r1), t1 = _mm512_unpackhi_epi32(r0, r1);
        const __m512i t2 = _mm512_unpacklo_epi32(r2, r3), t3 = _mm512_unpackhi_epi32(r2, r3);
        /* u[c], lane L: group 4L + c of rows 0..3 */
        const __m512i u[4] = {_mm512_unpacklo_epi64(t0, t2), _mm512_unpackhi_epi64(t0, t2),
                              _mm512_unpacklo_epi64(t1, t3), _mm512_unpackhi_epi64(t1, t3)};
        uint8_t *d = dst + (size_t)(j / 4) * step;
        for (int c = 0; c < 4; c++) {
            _mm_storeu_si128((__m128i *)(d + (size_t)c * step), _mm512_castsi512_si128(u[c]));
            _mm_storeu_si128((__m128i *)(d + (size_t)(4 + c) * step),
                             _mm512_extracti32x4_epi32(u[c], 1));
            _mm_storeu_si128((__m128i *)(d + (size_t)(8 + c) * step),
                             _mm512_extracti32x4_epi32(u[c], 2));
            _mm_storeu_si128((__m128i *)(d + (size_t)(12 + c) * step),
                             _mm512_extracti32x4_epi32(u[c], 3));
        }
    }
}

/* Two rows, as prep_rows4: 8 bytes (the two rows' dwords) per group. */
static void prep_rows2(const uint8_t *src, size_t lda, uint8_t *dst, uint32_t kv, size_t step)
{
    const __m512i x80 = _mm512_set1_epi8((char)0x80);
    for (uint32_t j = 0; j < kv; j += 64) {
        const __m512i r0 = _mm512_xor_si512(_mm512_loadu_si512(src + j), x80);
        const __m512i r1 = _mm512_xor_si512(_mm512_loadu_si512(src + lda + j), x80);
        /* u[h], lane L: groups 4L + 2h (low 8 bytes) and 4L + 2h + 1 */
        const __m512i u[2] = {_mm512_unpacklo_epi32(r0, r1), _mm512_unpackhi_epi32(r0, r1)};
        uint8_t *d = dst + (size_t)(j / 4) * step;
        for (int h = 0; h < 2; h++)
            for (int L = 0; L < 4; L++) {
                const __m128i v = L == 0   ? _mm512_castsi512_si128(u[h])
                                  : L == 1 ? _mm512_extracti32x4_epi32(u[h], 1)
                                  : L == 2 ? _mm512_extracti32x4_epi32(u[h], 2)
                                           : _mm512_extracti32x4_epi32(u[h], 3);
                _mm_storel_epi64((__m128i *)(d + (size_t)(4 * L + 2 * h) * step), v);
                _mm_storeh_pd((double *)(d + (size_t)(4 * L + 2 * h + 1) * step),
                              _mm_castsi128_pd(v));
            }
    }
}

static void prep_vnni(const int8_t *a, size_t lda_in, uint32_t m, uint32_t k, uint32_t k4,
                      int tile, uint8_t *out)
{
    const uint32_t R = (uint32_t)tilings[tile].rows;
    const size_t step = (size_t)R * 4;
    const uint32_t U = R % 4 == 0 ? 4 : 2; /* R: 6, 8, 12; a unit stays in one tile */
    const uint32_t kv = k / 64 * 64;
    const uint8_t *src = (const uint8_t *)a;
    uint32_t i = 0;
    for (; kv && i + U <= m; i += U) {
        const uint8_t *s = src + (size_t)i * lda_in;
        uint8_t *d = out + npu_gemm_a_off(i, 0, k4, R);
        if (U == 4)
            prep_rows4(s, lda_in, d, kv, step);
        else
            prep_rows2(s, lda_in, d, kv, step);
        for (uint32_t u = 0; u < U; u++)
            npu_prep_row_groups(s + (size_t)u * lda_in, d + 4 * u, kv, k, k4, step);
    }
    for (; i < m; i++)
        npu_prep_row_groups(src + (size_t)i * lda_in, out + npu_gemm_a_off(i, 0, k4, R), 0, k, k4,
                            step);
}

/* Row i, channels c0..c0+15: the accumulator minus the +128 correction. */
AI void store16(__m512i acc, const struct npu_gemm_args *g, uint32_t i, uint32_t c0)
{
    npu_avx512_store16(
        _mm512_sub_epi32(acc, _mm512_slli_epi32(_mm512_loadu_si512(g->b->rowsum + c0), 7)), g,
        i, c0);
}

/* MR rows (of a tile laid out with LR rows) x NB blocks. a points at the
 * tile's first row (group 0), bp at block 0 of the panel. After inlining with
 * constant MR, LR, NB the loops unroll and acc lives in registers. */
AI void tile(const int MR, const int LR, const int NB, const uint8_t *a, const int8_t *bp,
             size_t bstride, const struct npu_gemm_args *g, uint32_t i0, uint32_t c0)
{
    const uint32_t groups = g->b->k4 / 4;
    __m512i acc[12][4];
#pragma GCC unroll 12
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int j = 0; j < NB; j++)
            acc[i][j] = _mm512_setzero_si512();
    for (uint32_t q = 0; q < groups; q++) {
        __m512i w[4];
#pragma GCC unroll 4
        for (int j = 0; j < NB; j++)
            w[j] = _mm512_load_si512(bp + (size_t)j * bstride + 64 * (size_t)q);
        const uint8_t *aq = a + (size_t)q * LR * 4;
#pragma GCC unroll 12
        for (int i = 0; i < MR; i++) {
            int32_t t;
            memcpy(&t, aq + 4 * i, 4);
            const __m512i av = _mm512_set1_epi32(t);
#pragma GCC unroll 4
            for (int j = 0; j < NB; j++)
                acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], av, w[j]);
        }
    }
#pragma GCC unroll 12
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int j = 0; j < NB; j++)
            store16(acc[i][j], g, i0 + (uint32_t)i, c0 + 16 * (uint32_t)j);
}

/* One panel (NB blocks, or fewer at the end of the range: one block at a
 * time) against every row of A, for a tiling with LR rows. Rows left over
 * after the full tiles go through tiles of 8, 4, 2, 1 rows. */
AI void panel(const int LR, const int NB, int nb, const int8_t *bp, size_t bstride,
              const struct npu_gemm_args *g, uint32_t c0)
{
    const uint32_t k4 = g->b->k4;
    const uint32_t mfull = g->m / (uint32_t)LR * (uint32_t)LR;
    if (nb == NB) {
        for (uint32_t i = 0; i < mfull; i += (uint32_t)LR)
            tile(LR, LR, NB, g->a + (size_t)i * k4, bp, bstride, g, i, c0);
    } else {
        for (int j = 0; j < nb; j++)
            for (uint32_t i = 0; i < mfull; i += (uint32_t)LR)
                tile(LR, LR, 1, g->a + (size_t)i * k4, bp + (size_t)j * bstride, bstride, g, i,
                     c0 + 16 * (uint32_t)j);
    }
    /* the last, partial row tile: rows mfull..m-1, at offsets within it */
    uint32_t i = mfull;
    const uint8_t *at = g->a + (size_t)mfull * k4;
    while (i < g->m) {
        uint32_t left = g->m - i, off = i - mfull;
        const uint8_t *ai = at + 4 * (size_t)off;
        for (int j = 0; j < nb; j += (nb == NB ? NB : 1)) {
            const int8_t *bj = bp + (size_t)j * bstride;
            uint32_t cj = c0 + 16 * (uint32_t)j;
            if (nb == NB) {
                if (left >= 8 && LR > 8)
                    tile(8, LR, NB, ai, bj, bstride, g, i, cj);
                else if (left >= 4)
                    tile(4, LR, NB, ai, bj, bstride, g, i, cj);
                else if (left >= 2)
                    tile(2, LR, NB, ai, bj, bstride, g, i, cj);
                else
                    tile(1, LR, NB, ai, bj, bstride, g, i, cj);
            } else {
                if (left >= 8 && LR > 8)
                    tile(8, LR, 1, ai, bj, bstride, g, i, cj);
                else if (left >= 4)
                    tile(4, LR, 1, ai, bj, bstride, g, i, cj);
                else if (left >= 2)
                    tile(2, LR, 1, ai, bj, bstride, g, i, cj);
                else
                    tile(1, LR, 1, ai, bj, bstride, g, i, cj);
            }
        }
        i += left >= 8 && LR > 8 ? 8 : left >= 4 ? 4 : left >= 2 ? 2 : 1;
    }
}

AI void gemm_tiled(const int LR, const int NB, const struct npu_gemm_args *g)
{
    const size_t bstride = npu_gemm_b_block_bytes(g->b);
    const uint32_t blk0 = g->r0 / 16, blk1 = (g->r1 + 15) / 16;
    for (uint32_t bl = blk0; bl < blk1; bl += (uint32_t)NB) {
        int nb = blk1 - bl < (uint32_t)NB ? (int)(blk1 - bl) : NB;
        panel(LR, NB, nb, g->b->packed + (size_t)bl * bstride, bstride, g, bl * 16);
    }
}

static void gemm_vnni(const struct npu_gemm_args *g)
{
    if (g->m == 0 || g->r1 <= g->r0)
        return;
    switch (g->tile) {
    case 1:
        gemm_tiled(8, 3, g);
        break;
    case 2:
        gemm_tiled(12, 2, g);
        break;
    default:
        gemm_tiled(6, 4, g);
        break;
    }
}

/* Packing 16 rows x 64 bytes at a time: each row is one zmm of 16 dwords
 * (4-byte k groups), and the packed unit of group g is dword g of the 16 rows,
 * so the block is a 16 x 16 dword transpose (unpack 32, unpack 64, then two
 * rounds of 128-bit lane shuffles). Row sums come from vpdpbusd against
 * bytes of 1 on the transposed units (lane i of every unit is row i's 4
 * bytes, so an accumulator holds the 16 rows' sums in its lanes: the
 * integer sums are exact in any order; a register per row, as before,
 * spilled the transpose to the stack; four accumulators, one per unit
 * column c, added at the block's end: one chained accumulator made the 16
 * vpdpbusd of a 64-byte step wait on each other's latency), and the block's
 * wide and tiny flags from its largest |code| (vpabsb, -128 read as 128
 * unsigned, so wide, as the definition says), kept in the same pass: the
 * scalar definition's separate pass over the codes was 9% of a 512-token
 * cold start's samples. -128 from the same largest |code|: a byte of 128
 * there is a -128 in its lane (every other code's |code| is at most 127),
 * one compare per block instead of one per row. Bit-identical with the
 * scalar packer (tested, wide, tiny and the -128 report included). */
int npu_pack_avx512vnni(struct npu_gemm_b *b, const int8_t *src, uint32_t r0, uint32_t r1)
{
    const size_t bstride = npu_gemm_b_block_bytes(b);
    const uint32_t k = b->k, rend = r1 == b->n ? b->n16 : r1;
    const __m512i ones = _mm512_set1_epi8(1), m128 = _mm512_set1_epi8(-128);
    __mmask64 bad = 0;
    for (uint32_t rb = r0; rb < rend; rb += 16) {
        const uint32_t nv = rb >= b->n ? 0 : b->n - rb < 16 ? b->n - rb : 16;
        int8_t *dst = b->packed + (size_t)(rb / 16) * bstride;
        __m512i sum[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(),
                          _mm512_setzero_si512()};
        __m512i amax = _mm512_setzero_si512();
        for (uint32_t c0 = 0; c0 < k; c0 += 64) {
            const uint32_t cnt = k - c0 < 64 ? k - c0 : 64;
            const __mmask64 mk = cnt == 64 ? ~(__mmask64)0 : (((__mmask64)1 << cnt) - 1);
            __m512i r[16], a[16], t[16];
            for (uint32_t i = 0; i < 16; i++) {
                r[i] = i < nv ? _mm512_maskz_loadu_epi8(mk, src + (size_t)(rb - r0 + i) * k + c0)
                              : _mm512_setzero_si512();
                amax = _mm512_max_epu8(amax, _mm512_abs_epi8(r[i]));
            }
            for (int i = 0; i < 16; i += 2) {
                a[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
                a[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
            }
            /* t[4q + c], lane L: column 4L + c of rows 4q..4q+3 */
            for (int q = 0; q < 4; q++) {
                t[4 * q + 0] = _mm512_unpacklo_epi64(a[4 * q], a[4 * q + 2]);
                t[4 * q + 1] = _mm512_unpackhi_epi64(a[4 * q], a[4 * q + 2]);
                t[4 * q + 2] = _mm512_unpacklo_epi64(a[4 * q + 1], a[4 * q + 3]);
                t[4 * q + 3] = _mm512_unpackhi_epi64(a[4 * q + 1], a[4 * q + 3]);
            }
            const uint32_t groups = (cnt + 3) / 4;
            int8_t *d0 = dst + (size_t)(c0 / 4) * 64;
            for (int c = 0; c < 4; c++) {
                __m512i u0 = _mm512_shuffle_i32x4(t[c], t[4 + c], 0x44);
                __m512i u1 = _mm512_shuffle_i32x4(t[c], t[4 + c], 0xEE);
                __m512i v0 = _mm512_shuffle_i32x4(t[8 + c], t[12 + c], 0x44);
                __m512i v1 = _mm512_shuffle_i32x4(t[8 + c], t[12 + c], 0xEE);
                const __m512i o[4] = {_mm512_shuffle_i32x4(u0, v0, 0x88),
                                      _mm512_shuffle_i32x4(u0, v0, 0xDD),
                                      _mm512_shuffle_i32x4(u1, v1, 0x88),
                                      _mm512_shuffle_i32x4(u1, v1, 0xDD)};
                for (uint32_t L = 0; L < 4; L++) { /* column 4L + c */
                    sum[c] = _mm512_dpbusd_epi32(sum[c], ones, o[L]); /* zero past k */
                    if (4 * L + (uint32_t)c < groups)
                        _mm512_store_si512(d0 + (size_t)(4 * L + (uint32_t)c) * 64, o[L]);
                }
            }
        }
        _mm512_storeu_si512(b->rowsum + rb, _mm512_add_epi32(_mm512_add_epi32(sum[0], sum[1]),
                                                             _mm512_add_epi32(sum[2], sum[3])));
        bad |= _mm512_cmpeq_epi8_mask(amax, m128);
        if (nv) { /* blocks with rows (those npu_pack_wide_scalar defines) */
            b->wide[rb / 16] = (uint8_t)(_mm512_cmpgt_epu8_mask(amax, _mm512_set1_epi8(64)) != 0);
            b->tiny[rb / 16] =
                (uint8_t)(_mm512_cmpgt_epu8_mask(amax, _mm512_set1_epi8(NPU_GEMM_TINY)) == 0);
        }
    }
    return bad != 0;
}

/* rint by vrndscaleps (nearest even, as rintf in the default mode), clamp,
 * NaN (unordered with itself) to 0, then vpmovdb: the scalar definition. */
void npu_quant_avx512(const float *x, size_t n, float inv, int8_t *xq)
{
    const __m512 vi = _mm512_set1_ps(inv), hi = _mm512_set1_ps(127.0f),
                 lo = _mm512_set1_ps(-127.0f);
    for (size_t i = 0; i < n; i += 16) {
        const __mmask16 k = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), vi);
        v = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __mmask16 ord = _mm512_cmp_ps_mask(v, v, _CMP_ORD_Q);
        v = _mm512_maskz_mov_ps(ord, _mm512_min_ps(_mm512_max_ps(v, lo), hi));
        _mm512_mask_cvtepi32_storeu_epi8(xq + i, k, _mm512_cvtps_epi32(v));
    }
}

float npu_absmax_avx512(const float *x, size_t n)
{
    const __m512 big = _mm512_set1_ps(3.40282347e38f);
    __m512 m = _mm512_setzero_ps();
    for (size_t i = 0; i < n; i += 16) {
        const __mmask16 k = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        const __m512 a = _mm512_abs_ps(_mm512_maskz_loadu_ps(k, x + i));
        const __mmask16 fin = _mm512_cmp_ps_mask(a, big, _CMP_LE_OQ); /* not NaN, not inf */
        m = _mm512_mask_max_ps(m, fin, m, a);
    }
    return _mm512_reduce_max_ps(m);
}

const struct npu_kernel_ops npu_ops_avx512vnni = {
    prep_vnni,  gemm_vnni, npu_pack_avx512vnni, npu_quant_avx512, npu_absmax_avx512, NTILES,
    tile_names, UINT32_MAX};

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
    /* summed as unsigned: the chains wrap on long runs, and the header's
     * _mm512_reduce_add_epi32 adds in int (UBSan: signed overflow) */
    uint32_t lanes[16], sum = 0;
    _mm512_storeu_si512(lanes, s);
    for (int i = 0; i < 16; i++)
        sum += lanes[i];
    return sum;
}

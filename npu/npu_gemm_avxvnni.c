/* npu_gemm_avxvnni.c: int8 GEMM with AVX-VNNI (the VEX-encoded vpdpbusd of
 * Alder Lake / Zen 5 and later), bit-exact with npu_gemm_scalar.c (contract in
 * npu_gemm_internal.h). The method of the AVX-512 VNNI kernel (activations
 * staged as a XOR 0x80 = a + 128, 128 * rowsum(B[r]) subtracted at the end)
 * on ymm: 8 channels x 4 k per register, a 64-byte group of the packed
 * weights is two ymm. Register tile: 3 rows x 32 channels (12 accumulators,
 * 16 ymm registers in all). */
#include <immintrin.h>
#include <string.h>

#include "npu_gemm_internal.h"
#include "npu_store_avx2.h"

/* tests/npu/test_npu_avxvnni.c compiles this file again with
 * NPU_AVXVNNI_EVEX defined: the same instruction in its EVEX encoding
 * (AVX512-VL VNNI, identical semantics), so the kernel's logic is tested on
 * CPUs that lack AVX-VNNI. */
#ifdef NPU_AVXVNNI_EVEX
#define DPBUSD256 _mm256_dpbusd_epi32
#define NPU_OPS_AVXVNNI npu_ops_avxvnni_evex
#else
#define DPBUSD256 _mm256_dpbusd_avx_epi32
#define NPU_OPS_AVXVNNI npu_ops_avxvnni
#endif

#define AI static inline __attribute__((always_inline))
#define LR 3 /* rows per tile */
#define NB 2 /* 16-channel blocks per tile */

static const char *const tile_names[] = {"3x32"};

/* Stage A as a XOR 0x80, k padded with zeros (their weights are zero),
 * LR-row interleave. */
static void prep_avxvnni(const int8_t *a, size_t lda_in, uint32_t m, uint32_t k, uint32_t k4,
                      int tile, uint8_t *out)
{
    const size_t step = (size_t)LR * 4;
    for (uint32_t i = 0; i < m; i++)
        npu_prep_row_groups((const uint8_t *)a + (size_t)i * lda_in,
                            out + npu_gemm_a_off(i, 0, k4, LR), 0, k, k4, step);
}

/* Row i, channels c0..c0+7, minus the correction, kept inside [r0, r1). */
AI void store8(__m256i v, const struct npu_gemm_args *g, uint32_t i, uint32_t c0)
{
    v = _mm256_sub_epi32(
        v, _mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)(g->b->rowsum + c0)), 7));
    npu_avx2_store8(v, g, i, c0);
}

/* MR rows (of an LR-row tile) x nbk blocks (2 ymm each). */
AI void tile(const int MR, const int NBK, const uint8_t *a, const int8_t *bp, size_t bstride,
             const struct npu_gemm_args *g, uint32_t i0, uint32_t c0)
{
    const uint32_t groups = g->b->k4 / 4;
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
#pragma GCC unroll 4
            for (int j = 0; j < 2 * NBK; j++)
                acc[i][j] = DPBUSD256(acc[i][j], av, w[j]);
        }
    }
#pragma GCC unroll 3
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int j = 0; j < 2 * NBK; j++)
            store8(acc[i][j], g, i0 + (uint32_t)i, c0 + 8 * (uint32_t)j);
}

static void gemm_avxvnni(const struct npu_gemm_args *g)
{
    if (g->m == 0 || g->r1 <= g->r0)
        return;
    const uint32_t k4 = g->b->k4;
    const size_t bstride = npu_gemm_b_block_bytes(g->b);
    const uint32_t blk0 = g->r0 / 16, blk1 = (g->r1 + 15) / 16;
    const uint32_t mfull = g->m / LR * LR;
    for (uint32_t bl = blk0; bl < blk1; bl += NB) {
        const int8_t *bp = g->b->packed + (size_t)bl * bstride;
        const uint32_t c0 = bl * 16;
        if (blk1 - bl >= NB) {
            for (uint32_t i = 0; i < mfull; i += LR)
                tile(LR, NB, g->a + (size_t)i * k4, bp, bstride, g, i, c0);
            if (g->m - mfull == 2)
                tile(2, NB, g->a + (size_t)mfull * k4, bp, bstride, g, mfull, c0);
            else if (g->m - mfull == 1)
                tile(1, NB, g->a + (size_t)mfull * k4, bp, bstride, g, mfull, c0);
        } else { /* one block left */
            for (uint32_t i = 0; i < mfull; i += LR)
                tile(LR, 1, g->a + (size_t)i * k4, bp, bstride, g, i, c0);
            if (g->m - mfull == 2)
                tile(2, 1, g->a + (size_t)mfull * k4, bp, bstride, g, mfull, c0);
            else if (g->m - mfull == 1)
                tile(1, 1, g->a + (size_t)mfull * k4, bp, bstride, g, mfull, c0);
        }
    }
}

const struct npu_kernel_ops NPU_OPS_AVXVNNI = {prep_avxvnni, gemm_avxvnni, NULL, NULL, NULL,
                                               1,            tile_names,
                                               UINT32_MAX};

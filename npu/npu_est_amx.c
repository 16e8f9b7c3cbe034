/* npu_est_amx.c: the attention estimate's int8 GEMM on AMX (npu_est.h),
 * bit-exact with npu_gemm_scalar.c (contract in npu_gemm_internal.h).
 *
 * TDPBSSD multiplies a 16-row x 64-byte tile of signed int8 activations by a
 * B tile of 16 groups of 4 k values x 16 channels (64 bytes a group: the
 * channels' 4 bytes side by side) into 16 x 16 int32 sums, exact at every
 * step (signed x signed, no offset, no saturation: any int8 codes). The
 * prepared weights' layout, [n16/16][k4/4][16][4] (npu_gemm_b), is already
 * that B tile: for k4 a multiple of 64, the tile of block bl and k chunk kc is
 * the 1 KiB at packed + bl * bstride + kc * 1024, rows 64 bytes apart. So the
 * attention's K mirror needs no new layout. A is staged row-major with k and
 * m padded by zeros (npu_est_amx_prep), so every A tile load is whole.
 *
 * Blocking: per 16-row tile (A in tmm4), pairs of 16-channel blocks (B in
 * tmm6-7), two pairs in flight (tmm0-1, tmm2-3): a pair's tiles are stored
 * after the next pair's multiplies are issued (stored at once, the stores
 * waited on TDPBSSD's latency: 3.5x slower at 4K keys). Each int32 tile goes
 * to a 1 KiB buffer on the stack, then to the output: y = (act_scale *
 * scale[r]) * (float)acc, the contract's two float products, 16 channels a
 * vector (whole 16-channel blocks, any rows), or the scalar loop (channel
 * edges, int32 output).
 *
 * Detection (npu_est_amx_available): sl_cpu_features' amx (CPUID's amx-tile
 * and amx-int8, the OS's XTILECFG/XTILEDATA state in XCR0, and the process
 * granted the tile data state), as for the NPU's AMX GEMM; SLUICE_SIMD
 * forcing a lower level turns it off. */
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "npu_est.h"

#define AI static inline __attribute__((always_inline))

int npu_est_amx_available(void)
{
    return sl_cpu_features()->amx;
}

void npu_est_amx_prep(const int8_t *a, uint32_t m, uint32_t k, uint32_t k4, uint8_t *out)
{
    uint32_t m16 = (m + 15) & ~15u;
    for (uint32_t i = 0; i < m; i++) {
        memcpy(out + (size_t)i * k4, a + (size_t)i * k, k);
        memset(out + (size_t)i * k4 + k, 0, k4 - k);
    }
    memset(out + (size_t)m * k4, 0, (size_t)(m16 - m) * k4);
}

/* The int32 tile at t (row stride ld ints) of rows [0, nrow) and channels
 * [0, ncol) of block channel c0 to the output at row i0, channel c0 + j. */
static void put(const struct npu_gemm_args *g, const int32_t *t, size_t ld, uint32_t i0,
                uint32_t nrow, uint32_t c0, uint32_t j0, uint32_t j1)
{
    for (uint32_t i = 0; i < nrow; i++)
        for (uint32_t j = j0; j < j1; j++) {
            uint32_t r = c0 + j;
            int32_t acc = t[(size_t)i * ld + j];
            if (g->c)
                g->c[(size_t)(i0 + i) * g->ldc + (r - g->r0)] = acc;
            else
                g->y[(size_t)(i0 + i) * g->ldy + (r - g->r0)] =
                    (g->act_scale * g->scale[r]) * (float)acc;
        }
}

/* nrow (<= 16) rows of 16 int32 at t (64 bytes apart) to p (row stride ld
 * floats) as floats times sc. */
AI void convert16(float *p, size_t ld, const int32_t *t, __m512 sc, uint32_t nrow)
{
    for (uint32_t i = 0; i < nrow; i++)
        _mm512_storeu_ps(p + (size_t)i * ld,
                         _mm512_mul_ps(sc, _mm512_cvtepi32_ps(_mm512_load_si512(t + 16 * i))));
}

/* Stores the finished tile T (row block i0, 16-channel block at c0) through
 * the 1 KiB buffer (stored straight into y, rows a power of two apart
 * shared one cache set: 4x slower at 4K keys) and converts it. */
#define STORE_TILE(T, i0, c0)                                                                      \
    do {                                                                                           \
        uint32_t nrow_ = m - (i0) < 16 ? m - (i0) : 16;                                            \
        uint32_t j0_ = (c0) < g->r0 ? g->r0 - (c0) : 0;                                            \
        uint32_t j1_ = g->r1 - (c0) < 16 ? g->r1 - (c0) : 16;                                      \
        _tile_stored(T, buf, 64);                                                                  \
        if (j0_ == 0 && j1_ == 16 && !g->c)                                                        \
            convert16(g->y + (size_t)(i0) * g->ldy + ((c0) - g->r0), g->ldy, buf,                  \
                      _mm512_mul_ps(_mm512_set1_ps(g->act_scale),                                  \
                                    _mm512_loadu_ps(g->scale + (c0))),                             \
                      nrow_);                                                                      \
        else                                                                                       \
            put(g, buf, 16, i0, nrow_, c0, j0_, j1_);                                              \
    } while (0)

/* The products of the row tile at a (rows k4 apart) and the two blocks at
 * b0 (b1 when two) into tiles C0 and C1 (A in tmm4: loaded once by the
 * caller when there is one k chunk, else per chunk here). */
#define COMPUTE(C0, C1, a, b0, b1, two)                                                            \
    do {                                                                                           \
        _tile_zero(C0);                                                                            \
        _tile_zero(C1);                                                                            \
        for (uint32_t q = 0; q < kc; q++) {                                                        \
            if (kc > 1)                                                                            \
                _tile_loadd(4, (a) + 64 * (size_t)q, k4);                                          \
            _tile_loadd(6, (b0) + 1024 * (size_t)q, 64);                                           \
            _tile_dpbssd(C0, 4, 6);                                                                \
            if (two) {                                                                             \
                _tile_loadd(7, (b1) + 1024 * (size_t)q, 64);                                       \
                _tile_dpbssd(C1, 4, 7);                                                            \
            }                                                                                      \
        }                                                                                          \
    } while (0)

#define STORE(C0, C1, i0, c0, two)                                                                 \
    do {                                                                                           \
        STORE_TILE(C0, i0, c0);                                                                    \
        if (two)                                                                                   \
            STORE_TILE(C1, i0, (c0) + 16);                                                         \
    } while (0)

void npu_est_gemm_amx(const struct npu_gemm_args *g)
{
    if (g->m == 0 || g->r1 <= g->r0)
        return;
    const struct npu_gemm_b *b = g->b;
    const uint32_t k4 = b->k4, kc = k4 / 64, m = g->m;
    const size_t bstride = npu_gemm_b_block_bytes(b);
    const uint32_t blk0 = g->r0 / 16, blk1 = (g->r1 + 15) / 16;
    const uint32_t mt = (m + 15) / 16; /* row tiles (the staging's zero rows fill the last) */
    int32_t buf[16 * 16] __attribute__((aligned(64)));
    struct sl_amx_tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.colsb[t] = 64;
        cfg.rows[t] = 16;
    }
    _tile_loadconfig(&cfg);
    /* per row tile, pairs of blocks, two pairs in flight: a pair's products
     * (tmm0-1, tmm2-3 alternately) are computed before the previous pair's
     * tiles are stored, so the stores do not wait on the multiplies just issued */
    for (uint32_t it = 0; it < mt; it++) {
        const uint8_t *a = g->a + (size_t)it * 16 * k4;
        const uint32_t i0 = it * 16;
        if (kc == 1)
            _tile_loadd(4, a, k4);
        uint32_t bl = blk0;
        int pend = 0; /* the previous pair, in tmm2-3, is not stored yet */
        uint32_t pc0 = 0;
        int ptwo = 0;
        while (bl < blk1) {
            /* pair into tmm0-1 */
            int two = blk1 - bl >= 2;
            const int8_t *b0 = b->packed + (size_t)bl * bstride;
            COMPUTE(0, 1, a, b0, b0 + bstride, two);
            if (pend)
                STORE(2, 3, i0, pc0, ptwo);
            pc0 = bl * 16;
            ptwo = two;
            bl += two ? 2 : 1;
            if (bl >= blk1) {
                STORE(0, 1, i0, pc0, ptwo);
                pend = 0;
                break;
            }
            /* pair into tmm2-3 */
            two = blk1 - bl >= 2;
            b0 = b->packed + (size_t)bl * bstride;
            COMPUTE(2, 3, a, b0, b0 + bstride, two);
            STORE(0, 1, i0, pc0, ptwo);
            pc0 = bl * 16;
            ptwo = two;
            pend = 1;
            bl += two ? 2 : 1;
        }
        if (pend)
            STORE(2, 3, i0, pc0, ptwo);
    }
    _tile_release();
}

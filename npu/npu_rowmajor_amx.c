/* npu_rowmajor_amx.c: the row-major few-rows linear (npu_rowmajor.c) on the
 * AMX tile unit. TDPBSSD computes C [M][N] += A [M][64 bytes] x B [16][N x
 * 4 bytes] with B holding 16 groups of 4 inputs for N columns. Taking the
 * WEIGHTS as A (16 output channels x 64 inputs: 16 rows of the row-major
 * weights, a row stride k apart, loaded as they lie) and the activations as
 * B (staged as [k / 4][m][4]: 16 groups of all m rows per step, m x 4 bytes
 * a row) gives C = the transposed output, 16 channels x m rows, exact int32
 * (signed x signed, no offset): no packing of the weights at all. Up to
 * four channel blocks (64 channels) per pass share each step's B tile; the C
 * tiles are stored and written out transposed with the scalar formula
 * (act * scale[r]) * (float)acc, so the floats are the reference's. */
#include <immintrin.h>
#include <string.h>

#include "common.h"
#include "npu_internal.h"

/* tmm0..3: C (16 channels x m rows, int32); tmm4..6: A (weights); tmm7: B. */
static void configure(uint32_t m)
{
    struct sl_amx_tilecfg cfg __attribute__((aligned(64)));
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = 16;
        cfg.colsb[t] = (uint16_t)(t >= 4 && t < 7 ? 64 : m * 4);
    }
    _tile_loadconfig(&cfg);
}

static void write_out(const int32_t (*c)[16], uint32_t m, const float *scale, float act,
                      uint32_t r0, float *y, size_t ldy)
{
    for (uint32_t ch = 0; ch < 16; ch++) {
        const float s = act * scale[r0 + ch];
        for (uint32_t i = 0; i < m; i++)
            y[(size_t)i * ldy + r0 + ch] = s * (float)c[ch][i];
    }
}

#define AI static inline __attribute__((always_inline))

/* NB channel blocks (1..4) from channel r: C tiles 0..NB-1, each step's A
 * tiles rotating through tmm4..6 (so a load need not wait for the product
 * that read the same tile just before), one B tile for all of them. Several
 * blocks per pass also keep several independent product chains going (one
 * block alone waits on TDPBSSD's latency every step). */
AI void pass(const int NB, const int8_t *q, const float *scale, uint32_t r, uint32_t k,
             const uint8_t *b, size_t bstep, uint32_t m, float act, float *y, size_t ldy)
{
    int32_t c[4][16][16] __attribute__((aligned(64)));
    const int8_t *a = q + (size_t)r * k;
    const size_t blk = (size_t)16 * k;
    _tile_zero(0);
    if (NB > 1)
        _tile_zero(1);
    if (NB > 2)
        _tile_zero(2);
    if (NB > 3)
        _tile_zero(3);
    for (uint32_t s = 0; s < k / 64; s++) {
        const int8_t *as = a + (size_t)s * 64;
        _tile_loadd(7, b + s * bstep, m * 4);
        _tile_loadd(4, as, k);
        _tile_dpbssd(0, 4, 7);
        if (NB > 1) {
            _tile_loadd(5, as + blk, k);
            _tile_dpbssd(1, 5, 7);
        }
        if (NB > 2) {
            _tile_loadd(6, as + 2 * blk, k);
            _tile_dpbssd(2, 6, 7);
        }
        if (NB > 3) {
            _tile_loadd(4, as + 3 * blk, k);
            _tile_dpbssd(3, 4, 7);
        }
    }
    _tile_stored(0, c[0], 64);
    if (NB > 1)
        _tile_stored(1, c[1], 64);
    if (NB > 2)
        _tile_stored(2, c[2], 64);
    if (NB > 3)
        _tile_stored(3, c[3], 64);
    for (int j = 0; j < NB; j++)
        write_out((const int32_t(*)[16])c[j], m, scale, act, r + 16 * (uint32_t)j, y, ldy);
}

void npu_rowmajor_amx(const int8_t *q, const float *scale, uint32_t n, uint32_t k,
                      const void *stage, uint32_t m, float act, float *y, size_t ldy)
{
    const size_t bstep = (size_t)16 * m * 4; /* one step's 16 groups of m rows */
    const uint8_t *b = stage;
    configure(m);
    for (uint32_t r = 0; r < n;) {
        const uint32_t left = (n - r) / 16;
        if (left >= 4)
            pass(4, q, scale, r, k, b, bstep, m, act, y, ldy);
        else if (left == 3)
            pass(3, q, scale, r, k, b, bstep, m, act, y, ldy);
        else if (left == 2)
            pass(2, q, scale, r, k, b, bstep, m, act, y, ldy);
        else
            pass(1, q, scale, r, k, b, bstep, m, act, y, ldy);
        r += 16 * (left >= 4 ? 4 : left);
    }
    _tile_release();
}

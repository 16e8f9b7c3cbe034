/* npu_gemm_amx.c: int8 GEMM on the AMX tile unit (TDPBSSD), bit-exact with
 * npu_gemm_scalar.c (contract in npu_gemm_internal.h).
 *
 * TDPBSSD multiplies a tile of signed bytes A [16 rows][64 bytes] by a tile
 * B [16 rows][64 bytes] holding 16 groups of 4 k values for 16 columns, and
 * adds into C [16][16] int32: C[i][n] += sum_q sum_t A[i][4q + t] B[q][4n + t],
 * exact (signed x signed, no offset, no rowsum correction). The packed
 * weights [n16/16][k4/4][16][4] are that B layout already: 16 consecutive k
 * groups of one 16-channel block are one B tile, rows 64 bytes apart.
 *
 * Staging (prep_amx): the activations' own signed bytes as A tiles, 16 rows
 * x 64 bytes each stored contiguously ([m16/16][k64/64][16][64]), so a tile
 * load is one 1 KiB stream; k padded with zeros to k64, rows m..m16-1 zero.
 * When k4 is not a multiple of 64, the B tile of the last k step comes from
 * a copy of the block's last groups padded with zero rows (the packed
 * weights hold the next block there).
 *
 * Register blocking: four C tiles (2 row tiles x 2 channel blocks = 32 x 32),
 * two A and two B tiles per k step; the panel of two blocks is the outer
 * loop and every row pair passes over it, as the VNNI kernel's panels. The
 * tiles are configured (LDTILECFG) at the start of every call on the calling
 * thread and released at its end, so any thread may run the kernel and no
 * tile state outlives a call. With m < 16 the A and C tiles have m rows.
 *
 * The OS must grant the tile data state to the process first
 * (arch_prctl(ARCH_REQ_XCOMP_PERM)): sl_cpu_features asks once, and its amx
 * is 0 when refused; then the kernel is unavailable and the VNNI kernel is
 * the best. */
#include <immintrin.h>
#include <string.h>

#include "common.h"
#include "npu_gemm_internal.h"
#include "npu_store_avx512.h"

#define AI static inline __attribute__((always_inline))

struct tilecfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

/* tmm0..3: C (row tile r, block j at 2r + j); tmm4, 5: A; tmm6, 7: B. */
static void configure(uint32_t mr)
{
    struct tilecfg cfg __attribute__((aligned(64)));
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.colsb[t] = 64;
        cfg.rows[t] = (uint8_t)(t >= 6 ? 16 : mr);
    }
    _tile_loadconfig(&cfg);
}

static const char *const tile_names[] = {"32x32", "32x32k"};

static void prep_amx(const int8_t *a, size_t lda_in, uint32_t m, uint32_t k, uint32_t k4,
                     int tile, uint8_t *out)
{
    (void)tile;
    const uint32_t k64 = (k4 + 63) & ~63u, m16 = (m + 15) & ~15u, kt = k64 / 64;
    for (uint32_t i = 0; i < m16; i++) {
        const int8_t *src = i < m ? a + (size_t)i * lda_in : a;
        uint8_t *dst = out + (size_t)(i / 16) * 16 * k64 + (size_t)(i % 16) * 64;
        for (uint32_t t = 0; t < kt; t++, dst += 1024) {
            const uint32_t j = t * 64, len = i >= m || j >= k ? 0 : k - j < 64 ? k - j : 64;
            __m512i v = _mm512_setzero_si512();
            if (len == 64)
                v = _mm512_loadu_si512(src + j);
            else if (len)
                v = _mm512_maskz_loadu_epi8(((__mmask64)1 << len) - 1, src + j);
            _mm512_storeu_si512(dst, v);
        }
    }
}


/* NR row tiles (1, 2) x NB blocks (1, 2) over k steps [q0, q1): a at the
 * first row tile's first A tile (the next row tile astride further), b at
 * block 0 (the next block bstride further); tail: the zero-padded copy of the
 * last partial step, taken after step q1 - 1 (NULL: none); cin: the C tiles
 * to continue from (NULL: zero). The C tiles go to cout[2r + j]. */
AI void block(const int NR, const int NB, const uint8_t *a, size_t astride, const int8_t *b,
              size_t bstride, uint32_t q0, uint32_t q1, const int8_t *tail,
              int32_t (*cin)[16][16], int32_t (*cout)[16][16])
{
    if (cin) {
        _tile_loadd(0, cin[0], 64);
        if (NB > 1)
            _tile_loadd(1, cin[1], 64);
        if (NR > 1)
            _tile_loadd(2, cin[2], 64);
        if (NR > 1 && NB > 1)
            _tile_loadd(3, cin[3], 64);
    } else {
        _tile_zero(0);
        if (NB > 1)
            _tile_zero(1);
        if (NR > 1)
            _tile_zero(2);
        if (NR > 1 && NB > 1)
            _tile_zero(3);
    }
    const uint8_t *a1 = a + astride;
    for (uint32_t q = q0; q < q1; q++) {
        _tile_loadd(6, b + (size_t)q * 1024, 64);
        _tile_loadd(4, a + (size_t)q * 1024, 64);
        _tile_dpbssd(0, 4, 6);
        if (NB > 1) {
            _tile_loadd(7, b + bstride + (size_t)q * 1024, 64);
            _tile_dpbssd(1, 4, 7);
        }
        if (NR > 1) {
            _tile_loadd(5, a1 + (size_t)q * 1024, 64);
            _tile_dpbssd(2, 5, 6);
            if (NB > 1)
                _tile_dpbssd(3, 5, 7);
        }
    }
    if (tail) {
        const size_t q = q1;
        _tile_loadd(6, tail, 64);
        _tile_loadd(4, a + q * 1024, 64);
        _tile_dpbssd(0, 4, 6);
        if (NB > 1) {
            _tile_loadd(7, tail + 1024, 64);
            _tile_dpbssd(1, 4, 7);
        }
        if (NR > 1) {
            _tile_loadd(5, a1 + q * 1024, 64);
            _tile_dpbssd(2, 5, 6);
            if (NB > 1)
                _tile_dpbssd(3, 5, 7);
        }
    }
    _tile_stored(0, cout[0], 64);
    if (NB > 1)
        _tile_stored(1, cout[1], 64);
    if (NR > 1)
        _tile_stored(2, cout[2], 64);
    if (NR > 1 && NB > 1)
        _tile_stored(3, cout[3], 64);
}

/* Tiling 1 keeps the panel's B tiles in L1: k in chunks of KCHUNK steps
 * (2 blocks x KCHUNK KiB), every row pair passing over one chunk before the
 * next, its C tiles parked in memory between chunks (4 KiB per row pair;
 * without memory for them, tiling 0). The device times both on each graph's
 * shape and keeps the faster (npu_graph.c). */
#define KCHUNK 16u

static void gemm_amx(const struct npu_gemm_args *g)
{
    if (g->m == 0 || g->r1 <= g->r0)
        return;
    const struct npu_gemm_b *b = g->b;
    const uint32_t k4 = b->k4, groups = k4 / 4, ksteps = groups / 16, krem = groups % 16;
    const size_t bstride = npu_gemm_b_block_bytes(b);
    const size_t astride = (size_t)16 * ((k4 + 63) & ~63u); /* bytes of one row tile */
    const uint32_t m = g->m, mr = m < 16 ? m : 16, mt = (m + 15) / 16;
    const uint32_t blk0 = g->r0 / 16, blk1 = (g->r1 + 15) / 16;
    int32_t cbuf[4][16][16] __attribute__((aligned(64)));
    int8_t tail[2][16][64] __attribute__((aligned(64)));
    /* tiling 1: the parked C tiles of every row pair (none needed with one chunk) */
    const uint32_t kc = g->tile == 1 && ksteps > KCHUNK ? KCHUNK : ksteps;
    int32_t(*park)[4][16][16] = NULL;
    if (kc < ksteps) {
        park = sl_alloc_aligned(sizeof *park * ((mt + 1) / 2), 64);
        if (!park) { /* no memory: one chunk */
            gemm_amx(&(struct npu_gemm_args){.b = g->b, .a = g->a, .m = g->m, .r0 = g->r0,
                                                    .r1 = g->r1, .c = g->c, .ldc = g->ldc,
                                                    .y = g->y, .ldy = g->ldy,
                                                    .act_scale = g->act_scale,
                                                    .scale = g->scale, .tile = 0});
            return;
        }
    }
    if (krem)
        memset(tail, 0, sizeof tail);
    configure(mr);
    for (uint32_t bl = blk0; bl < blk1; bl += 2) {
        const int nb = blk1 - bl >= 2 ? 2 : 1;
        const int8_t *bp = b->packed + (size_t)bl * bstride;
        if (krem)
            for (int j = 0; j < nb; j++)
                memcpy(tail[j], bp + (size_t)j * bstride + (size_t)ksteps * 1024, (size_t)krem * 64);
        const int8_t *tp = krem ? &tail[0][0][0] : NULL;
        for (uint32_t q0 = 0;; q0 += kc) {
            const uint32_t q1 = ksteps - q0 > kc ? q0 + kc : ksteps;
            const int last = q1 == ksteps;
            for (uint32_t it = 0; it < mt; it += 2) {
                const int nr = mt - it >= 2 ? 2 : 1;
                const uint8_t *a = g->a + (size_t)it * astride;
                int32_t(*cin)[16][16] = q0 ? park[it / 2] : NULL;
                int32_t(*cout)[16][16] = last ? cbuf : park[it / 2];
                const int8_t *t = last ? tp : NULL;
                if (nr == 2 && nb == 2)
                    block(2, 2, a, astride, bp, bstride, q0, q1, t, cin, cout);
                else if (nr == 2)
                    block(2, 1, a, astride, bp, bstride, q0, q1, t, cin, cout);
                else if (nb == 2)
                    block(1, 2, a, astride, bp, bstride, q0, q1, t, cin, cout);
                else
                    block(1, 1, a, astride, bp, bstride, q0, q1, t, cin, cout);
                if (!last)
                    continue;
                for (int r = 0; r < nr; r++)
                    for (int j = 0; j < nb; j++)
                        for (uint32_t i = 0; i < 16; i++) {
                            const uint32_t row = (it + (uint32_t)r) * 16 + i;
                            if (row >= m)
                                break;
                            npu_avx512_store16(_mm512_load_si512(cbuf[2 * r + j][i]), g, row,
                                    (bl + (uint32_t)j) * 16);
                        }
            }
            if (last)
                break;
        }
    }
    _tile_release();
    sl_free_aligned(park);
}

const struct npu_kernel_ops npu_ops_amx = {
    prep_amx, gemm_amx, npu_pack_avx512vnni, npu_quant_avx512, npu_absmax_avx512, 2, tile_names};

/* Peak: four independent TDPBSSD chains on tiles loaded once (no memory
 * traffic in the loop), 16 x 16 x 64 multiply-adds each. */
uint64_t npu_peak_amx(uint64_t iters)
{
    int8_t src[16][64] __attribute__((aligned(64)));
    int32_t out[16][16] __attribute__((aligned(64)));
    memset(src, 3, sizeof src);
    configure(16);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, src, 64);
    _tile_loadd(5, src, 64);
    _tile_loadd(6, src, 64);
    _tile_loadd(7, src, 64);
    for (uint64_t it = 0; it < iters; it++) {
        _tile_dpbssd(0, 4, 6);
        _tile_dpbssd(1, 4, 7);
        _tile_dpbssd(2, 5, 6);
        _tile_dpbssd(3, 5, 7);
    }
    _tile_stored(0, out, 64);
    _tile_release();
    return (uint64_t)(uint32_t)out[0][0];
}

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
 * weights hold the next block there). With k a multiple of 64 a caller may
 * skip the copy (npu_gemm_args.xq, npu_gemm_direct): the tile loads read 16
 * rows of the activations themselves, a row stride apart, and only a
 * partial last row tile is staged. With the activations in cache as fast
 * as staged tiles (a scratch loop of the prefill's 256 x 512-channel jobs:
 * 1.7-1.9 TOPS either way); from L3 5-8% slower than copying first, but a
 * prefill chunk's input is read by many pieces and mostly cached: in the
 * pipeline the kernel's time stayed the same and the copy per piece is gone
 * (docs/BENCHMARKS.md, twelfth session, a22).
 *
 * Register blocking: four C tiles (2 row tiles x 2 channel blocks = 32 x 32),
 * two A and two B tiles per k step. Memory blocking: rows in blocks whose
 * staged activations fit L2 (A_BUDGET); within a row block every panel of
 * two weight blocks passes over all its row pairs (the panel read from
 * memory once, then from L2), while the next panel is prefetched into L2 a
 * few lines per k step. A finished 32 x 32 block is converted and written
 * during the next block's k steps (struct drain), and prefill outputs are
 * streamed past the cache (NT_BYTES). The tiles are configured (LDTILECFG)
 * at the start of every call on the calling thread and released at its end,
 * so any thread may run the kernel and no tile state outlives a call. With
 * m < 16 the A and C tiles have m rows.
 *
 * Where the time goes (m = 512, tinyllama's k and n, this Xeon; docs/
 * BENCHMARKS.md, eleventh session, y22a): with both operands streamed from L2
 * the 2x2 step runs at about 73% of the register-only peak (L2 delivers
 * ~46 bytes a cycle to the tile loads, the step wants 64); 85% needs one
 * operand in L1, which only the k-chunked tiling 1 gives, at the cost of
 * parking the C tiles.
 *
 * The OS must grant the tile data state to the process first
 * (arch_prctl(ARCH_REQ_XCOMP_PERM)): sl_cpu_features asks once, and its amx
 * is 0 when refused; then the kernel is unavailable and the VNNI kernel is
 * the best. */
#include <assert.h>
#include <immintrin.h>
#include <string.h>

#include "common.h"
#include "npu_gemm_internal.h"
#include "npu_store_avx512.h"

#define AI static inline __attribute__((always_inline))

/* tmm0..3: C (row tile r, block j at 2r + j); tmm4, 5: A; tmm6, 7: B. */
static void configure(uint32_t mr)
{
    struct sl_amx_tilecfg cfg __attribute__((aligned(64)));
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


/* C tiles waiting to be written out (store16): the 16 rows of tiles
 * [2r + j] for r < nr, j < nb, of row tile it and block bl, item u = tile *
 * 16 + row; written a few per k step of the next block (drain_step), so the
 * tile unit is not idle while they are converted and stored. */
struct drain {
    int32_t (*c)[16][16];
    const struct npu_gemm_args *g;
    uint32_t it, bl, u, per;
    int nr, nb, nt;
};

AI void store16(__m512i v, const struct npu_gemm_args *g, uint32_t i, uint32_t c0, int nt);

/* An output added to y (npu_gemm_args.add) reads y's line first: without
 * a prefetch each read waited on memory in the drain (the rows are a row
 * stride apart, no hardware prefetcher follows them): 256 x 2048 o/down-like
 * jobs in 512-channel pieces took 5% more CPU than streaming the output and
 * adding it after. So every line a block's drain adds to is prefetched into
 * L2 when the drain is set up (at most 64 lines; they come during the next
 * block's k steps), then written with an ordinary store (the line is in
 * cache; the next reader, a norm, finds it there), not streamed: ~10% less
 * CPU than streaming the output and adding it after (median 1.49 vs 1.66 ms
 * per 2048 channels, lower in 18 of 21 rounds, one process, load 15;
 * prefetching 16 or 32 items ahead as they drain did no better, the fused
 * output streamed was 5-10% slower than stored). */
AI void drain_pf(const struct drain *d)
{
    for (uint32_t u = 0; u < 64; u++) {
        const uint32_t x = u / 16, i = u % 16, r = x / 2, j = x % 2;
        const uint32_t row = (d->it + r) * 16 + i, c0 = (d->bl + j) * 16;
        if ((int)r >= d->nr || (int)j >= d->nb || row >= d->g->m) {
            u |= 15; /* the rest of this tile: none */
            continue;
        }
        /* the block's channels inside [r0, r1): first and last line */
        const uint32_t lo = c0 > d->g->r0 ? c0 : d->g->r0;
        const uint32_t hi = c0 + 16 < d->g->r1 ? c0 + 16 : d->g->r1;
        if (lo < hi) {
            const float *yr = d->g->y + (size_t)row * d->g->ldy;
            _mm_prefetch((const char *)(yr + (lo - d->g->r0)), _MM_HINT_T1);
            _mm_prefetch((const char *)(yr + (hi - 1 - d->g->r0)), _MM_HINT_T1);
        }
    }
}

/* Writes up to n more items of d (all of them with n = 64). */
AI void drain_step(struct drain *d, uint32_t n)
{
    for (; n && d->u < 64; d->u++) {
        const uint32_t x = d->u / 16, i = d->u % 16, r = x / 2, j = x % 2;
        const uint32_t row = (d->it + r) * 16 + i;
        if ((int)r >= d->nr || (int)j >= d->nb || row >= d->g->m) {
            d->u |= 15; /* the rest of this tile: none */
            continue;
        }
        store16(_mm512_load_si512(d->c[x][i]), d->g, row, (d->bl + j) * 16, d->nt);
        n--;
    }
}

/* Where row tile it's A tiles are: k step q's tile at p + q * step, its
 * rows ld bytes apart. Staged: 1 KiB tiles one after another (step 1024, ld
 * 64); straight from the activations (npu_gemm_args.xq): 64 bytes further
 * along the same 16 rows per step (step 64, ld the row stride). */
struct arow {
    const uint8_t *p;
    size_t step, ld;
};

AI struct arow arow_of(const struct npu_gemm_args *g, uint32_t it, uint32_t direct,
                       size_t astride)
{
    if (it < direct)
        return (struct arow){(const uint8_t *)g->xq + (size_t)it * 16 * g->lda, 64, g->lda};
    return (struct arow){g->a + (size_t)(it - direct) * astride, 1024, 64};
}

/* NR row tiles (1, 2) x NB blocks (1, 2) over k steps [q0, q1): ar[r] the
 * A tiles of row tile r (arow), b at
 * block 0 (the next block bstride further); tail: the zero-padded copy of the
 * last partial step, taken after step q1 - 1 (NULL: none); cin: the C tiles
 * to continue from (NULL: zero). The C tiles go to cout[2r + j]. pf, pfl:
 * pfl cache lines from pf on are prefetched into L2 at each k step (the next
 * panel's weights, npu_gemm_amx's prefetch; pfl 0: none). */
AI void block(const int NR, const int NB, const struct arow *ar, const int8_t *b,
              size_t bstride, uint32_t q0, uint32_t q1, const int8_t *tail,
              int32_t (*cin)[16][16], int32_t (*cout)[16][16], const int8_t *pf, uint32_t pfl,
              struct drain *dr)
{
    const uint8_t *a = ar[0].p, *a1 = ar[1].p;
    const size_t s0 = ar[0].step, s1 = ar[1].step, ld0 = ar[0].ld, ld1 = ar[1].ld;
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
    for (uint32_t q = q0; q < q1; q++) {
        for (uint32_t l = 0; l < pfl; l++, pf += 64)
            _mm_prefetch((const char *)pf, _MM_HINT_T1);
        if (dr->c)
            drain_step(dr, dr->per);
        _tile_loadd(6, b + (size_t)q * 1024, 64);
        _tile_loadd(4, a + q * s0, ld0);
        _tile_dpbssd(0, 4, 6);
        if (NB > 1) {
            _tile_loadd(7, b + bstride + (size_t)q * 1024, 64);
            _tile_dpbssd(1, 4, 7);
        }
        if (NR > 1) {
            _tile_loadd(5, a1 + q * s1, ld1);
            _tile_dpbssd(2, 5, 6);
            if (NB > 1)
                _tile_dpbssd(3, 5, 7);
        }
    }
    if (tail) {
        const size_t q = q1;
        _tile_loadd(6, tail, 64);
        _tile_loadd(4, a + q * s0, ld0);
        _tile_dpbssd(0, 4, 6);
        if (NB > 1) {
            _tile_loadd(7, tail + 1024, 64);
            _tile_dpbssd(1, 4, 7);
        }
        if (NR > 1) {
            _tile_loadd(5, a1 + q * s1, ld1);
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
 * without memory for them, tiling 0). The device times both only on graphs
 * of at most 16 rows (probe_max_m); larger ones take tiling 0: the
 * prefill's jobs (256 rows, 512-channel pieces, float outputs streamed) ran
 * it 13-15% faster at down (k = 5632) and level (within 2%) or faster at
 * q,o, k,v and gate,up, and the
 * probe's one timed run per tiling had picked tiling 1 for one of the five
 * prefill graphs in about half the runs (docs/BENCHMARKS.md, thirteenth
 * session, p22). */
#define KCHUNK 16u
/* Memory blocking. The staged activations of one row block (at most
 * A_BUDGET bytes, whole row pairs) stay in L2 while every panel of two
 * weight blocks passes over them, so the activations come from L2 and each
 * weight panel from memory once per row block (a panel is reused by every
 * row pair of the block from L2). Without it, k = 5632 x 512 rows (2.8 MiB of
 * activations) missed L2 on every panel. */
#define A_BUDGET (1u << 20)
/* Fewer row tiles than RB_MIN in a block (k over ~8K: llama3-8b's down, k =
 * 14336, fits 64 rows) would read every weight panel from memory once per
 * block, 8 times at m = 512 (down at m = 512 ran at 0.6-0.8x of the unblocked
 * loop); such shapes keep one block of all rows, the activations then coming
 * from L3 for each panel. */
#define RB_MIN 8u
/* Outputs of more than 16 rows and at least NT_BYTES (m x channels x 4) are
 * written with non-temporal stores (whole, aligned 16-channel rows). A
 * block's 32 output rows are a row stride apart (8 KiB for n = 2048, 22 KiB
 * for 5632: the same L1 set), so ordinary stores and their reads for
 * ownership evicted the tiles' lines and pushed the activations out of L2:
 * 512-channel jobs of 256 rows (the prefill's) ran 12% faster streamed at k
 * = 2048, q,o at m = 512 went from 1.8 to 2.4 TOPS. Decode and verification
 * (m <= 16) keep their small outputs in cache for the reader. */
#define NT_BYTES (64u << 10)

/* Row i, channels c0..c0+15 of the int32 tile row v (npu_avx512_store16's
 * contract); nt: streamed when the 16 channels are inside [r0, r1) and the
 * destination 64-byte aligned, and not added to y (drain_pf). */
AI void store16(__m512i v, const struct npu_gemm_args *g, uint32_t i, uint32_t c0, int nt)
{
    if (nt && !g->add && c0 >= g->r0 && c0 + 16 <= g->r1) {
        if (g->c) {
            int32_t *dst = g->c + (size_t)i * g->ldc + (c0 - g->r0);
            if (((uintptr_t)dst & 63) == 0) {
                _mm512_stream_si512((void *)dst, v);
                return;
            }
        } else {
            float *dst = g->y + (size_t)i * g->ldy + (c0 - g->r0);
            if (((uintptr_t)dst & 63) == 0) {
                __m512 sc = _mm512_mul_ps(_mm512_set1_ps(g->act_scale),
                                          _mm512_loadu_ps(g->scale + c0));
                _mm512_stream_ps(dst, _mm512_mul_ps(sc, _mm512_cvtepi32_ps(v)));
                return;
            }
        }
    }
    npu_avx512_store16(v, g, i, c0);
}

static size_t a_budget = A_BUDGET, nt_bytes = NT_BYTES;
static uint32_t rb_min = RB_MIN;

void npu_amx_blocking(size_t budget, size_t nt, uint32_t min_tiles)
{
    a_budget = budget ? budget : A_BUDGET;
    nt_bytes = nt ? nt : NT_BYTES;
    rb_min = min_tiles ? min_tiles : RB_MIN;
}

static void gemm_amx(const struct npu_gemm_args *g)
{
    if (g->m == 0 || g->r1 <= g->r0)
        return;
    const struct npu_gemm_b *b = g->b;
    const uint32_t k4 = b->k4, groups = k4 / 4, ksteps = groups / 16, krem = groups % 16;
    const size_t bstride = npu_gemm_b_block_bytes(b);
    const size_t astride = (size_t)16 * ((k4 + 63) & ~63u); /* bytes of one row tile */
    const uint32_t m = g->m, mr = m < 16 ? m : 16, mt = (m + 15) / 16;
    /* row tiles read straight from xq: every whole one (all m rows when m <
     * 16: the tiles have m rows then); the rest, a partial last tile, staged
     * at a */
    assert(!g->xq || (b->k % 64 == 0 && g->lda >= b->k)); /* npu_gemm_direct's contract */
    const uint32_t direct = !g->xq ? 0 : m < 16 ? 1 : m / 16;
    const uint32_t blk0 = g->r0 / 16, blk1 = (g->r1 + 15) / 16;
    /* row tiles per row block: whole pairs within A_BUDGET; all of them when
     * that is fewer than RB_MIN (a block of one pair would read every weight
     * panel mt / 2 times), and so when not even one pair fits */
    uint32_t rbt = (uint32_t)(a_budget / (2 * astride)) * 2;
    if (rbt < rb_min || rbt < 2)
        rbt = (mt + 1) & ~1u;
    const int nt = m > 16 && (uint64_t)m * (g->r1 - g->r0) * 4 >= nt_bytes;
    int32_t cbuf[2][4][16][16] __attribute__((aligned(64)));
    int cur = 0;
    struct drain dr = {.c = NULL, .g = g, .nt = nt};
    int8_t tail[2][16][64] __attribute__((aligned(64)));
    /* tiling 1: the parked C tiles of every row pair of a row block (none
     * needed with one chunk) */
    const uint32_t kc = g->tile == 1 && ksteps > KCHUNK ? KCHUNK : ksteps;
    int32_t(*park)[4][16][16] = NULL;
    if (kc < ksteps) {
        const uint32_t pairs = ((mt < rbt ? mt : rbt) + 1) / 2;
        park = sl_alloc_aligned(sizeof *park * pairs, 64);
        if (!park) { /* no memory: one chunk */
            gemm_amx(&(struct npu_gemm_args){.b = g->b, .a = g->a, .m = g->m, .r0 = g->r0,
                                                    .r1 = g->r1, .c = g->c, .ldc = g->ldc,
                                                    .y = g->y, .ldy = g->ldy, .add = g->add,
                                                    .act_scale = g->act_scale,
                                                    .scale = g->scale, .tile = 0,
                                                    .xq = g->xq, .lda = g->lda});
            return;
        }
    }
    if (krem)
        memset(tail, 0, sizeof tail);
    configure(mr);
    for (uint32_t rb = 0; rb < mt; rb += rbt) {
        const uint32_t rbe = mt - rb > rbt ? rb + rbt : mt;
        /* the next panel's weights, prefetched into L2 over this panel's k
         * steps (lines per step, rounded up): with several row pairs, where
         * one panel's steps outnumber its lines' share, and with one row
         * tile (m <= 16: a decode step on AMX, a draft tree's verification),
         * where the panel's two weight streams come straight from memory and
         * the tile loads alone keep too few lines in flight (one thread
         * streaming 22 copies of a linear, m = 8, GB/s by the min: gate
         * 14.0 without, 14.6 with; q,o 13.7 -> 14.5; down 14.4 -> 14.5;
         * docs/BENCHMARKS.md, fourteenth session, v18) */
        const uint32_t pairs = (rbe - rb + 1) / 2;
        const uint32_t panel_lines = (uint32_t)(2 * bstride / 64);
        const uint32_t steps = pairs * (ksteps + (krem != 0));
        const uint32_t pfl =
            (pairs > 1 || mt == 1) && steps ? (panel_lines + steps - 1) / steps : 0;
        for (uint32_t bl = blk0; bl < blk1; bl += 2) {
            const int nb = blk1 - bl >= 2 ? 2 : 1;
            const int8_t *bp = b->packed + (size_t)bl * bstride;
            /* prefetch window: the next panel (none after the last) */
            const int8_t *pf = bp + 2 * bstride;
            const uint32_t npf = bl + 2 < blk1 ? (uint32_t)((blk1 - bl - 2 >= 2 ? 2 : 1) *
                                                            bstride / 64) : 0;
            uint32_t pf_done = 0;
            if (krem)
                for (int j = 0; j < nb; j++)
                    memcpy(tail[j], bp + (size_t)j * bstride + (size_t)ksteps * 1024,
                           (size_t)krem * 64);
            const int8_t *tp = krem ? &tail[0][0][0] : NULL;
            for (uint32_t q0 = 0;; q0 += kc) {
                const uint32_t q1 = ksteps - q0 > kc ? q0 + kc : ksteps;
                const int last = q1 == ksteps;
                for (uint32_t it = rb; it < rbe; it += 2) {
                    const int nr = rbe - it >= 2 ? 2 : 1;
                    struct arow ar[2];
                    ar[0] = arow_of(g, it, direct, astride);
                    ar[1] = nr == 2 ? arow_of(g, it + 1, direct, astride) : ar[0];
                    int32_t(*cin)[16][16] = q0 ? park[(it - rb) / 2] : NULL;
                    int32_t(*cout)[16][16] = last ? cbuf[cur] : park[(it - rb) / 2];
                    const int8_t *t = last ? tp : NULL;
                    uint32_t l = pfl;
                    if (pf_done + l * (q1 - q0) > npf)
                        l = 0;
                    const int8_t *p = pf + (size_t)pf_done * 64;
                    pf_done += l * (q1 - q0);
                    if (nr == 2 && nb == 2)
                        block(2, 2, ar, bp, bstride, q0, q1, t, cin, cout, p, l, &dr);
                    else if (nr == 2)
                        block(2, 1, ar, bp, bstride, q0, q1, t, cin, cout, p, l, &dr);
                    else if (nb == 2)
                        block(1, 2, ar, bp, bstride, q0, q1, t, cin, cout, p, l, &dr);
                    else
                        block(1, 1, ar, bp, bstride, q0, q1, t, cin, cout, p, l, &dr);
                    if (dr.c)
                        drain_step(&dr, 64);
                    if (!last) {
                        dr.c = NULL;
                        continue;
                    }
                    /* written during the next block's steps (or below); a block of
                     * one row tile at once (m <= 16: deferred, k,v's 2048 x 256 at
                     * m = 4 took 10 us instead of 6) */
                    dr = (struct drain){.c = cbuf[cur], .g = g, .it = it, .bl = bl, .u = 0,
                                        .per = (64 + q1 - q0 - 1) / (q1 - q0 ? q1 - q0 : 1),
                                        .nr = nr, .nb = nb, .nt = nt};
                    cur ^= 1;
                    if (g->add && !g->c)
                        drain_pf(&dr);
                    if (nr == 1) {
                        drain_step(&dr, 64);
                        dr.c = NULL;
                    }
                }
                if (last)
                    break;
            }
        }
    }
    if (dr.c)
        drain_step(&dr, 64);
    _tile_release();
    if (nt)
        _mm_sfence(); /* the streamed stores before whatever publishes the output */
    sl_free_aligned(park);
}

const struct npu_kernel_ops npu_ops_amx = {
    prep_amx,         gemm_amx, npu_pack_avx512vnni, npu_quant_avx512, npu_absmax_avx512, 2,
    tile_names,       16};

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

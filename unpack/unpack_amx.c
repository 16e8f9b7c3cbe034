/* unpack_amx.c: a few activation rows' dot products straight from adaptive
 * packed rows on the AMX tile unit (unpack_tensor_dot_tiles, unpack.h).
 *
 * A pass takes up to 32 output channels (two blocks of 16). Each half of a
 * 512-weight group (4 stripes of 64) is unpacked in registers for every
 * channel of the pass (unpack_avx512_inl.h's code(): the UNSIGNED codes u =
 * q + off, as the VNNI dot kernels build them) and stored into a piece in
 * L1, [32 channels][256]; 16 rows of a piece (256 bytes apart) x 64 inputs
 * are the A operand of TDPBUSD (u8 weights x s8 activations), the
 * activations staged once per call as B ([k / 4][m][4]: 16 groups of 4
 * inputs for all m rows a step, unpack.c), C = a block's 16 channels x m
 * rows of int32. Two pieces alternate: while one half is unpacked, the 4
 * steps of the previous one are issued, so the tile unit works beside the
 * vector unit and never loads bytes whose stores may still be in flight.
 * Each step goes in 4 parts, one after every 2 channels (its tile loads,
 * block 0's TDPBUSD, block 1's A load, its TDPBUSD), so each TDPBUSD
 * issues about 2 channels' unpacking after the tile loads it reads (whole
 * steps every 8 channels were
 * 2-3% slower in a microbenchmark at 6-16 rows). Even and odd steps use
 * their own A, B and C tiles (independent chains). The sums of both C
 * tiles, less off(b) * sum(x) per channel (x's sums from the stage), are
 * the exact integer sum_c q[c] x[c] that every dot kernel gives: TDPBUSD
 * adds without saturation, modulo 2^32, and the true sum fits an int32.
 *
 * No function call per group: the pass's channels are taken in runs of one
 * width (counting sort), each run's specialized unpacker picked by a switch
 * once per run and half. Memory: a pass reads 32 rows at once (32 streams
 * the hardware prefetchers follow poorly), but the rows lie one after
 * another, so each group prefetches into L2, in order, as many bytes of the
 * NEXT pass as it reads of this one (one sequential stream a pass ahead),
 * and each channel's next group into L1. Passes go upwards, or downwards
 * (unpack_tensor_dot_tiles_down: the back end of infer's shared split,
 * whose next chunk lies below), the next pass then the one below, and
 * the last one's prefetch is the first pass of the caller's next chunk.
 * The tail group (cols % 512 != 0, stripes S < 64 bytes) goes contiguously
 * into a piece of its own with byte-masked stores, and its steps cover the
 * rounded-up tail; the stage's zero activations there cancel whatever the
 * piece holds beyond the tail. */
#include <immintrin.h>
#include <string.h>

#include "common.h"
#include "unpack_avx512_inl.h"
#include "unpack_internal.h"

/* tmm0..3: C (blocks 0 and 1 of even steps, then of odd steps); tmm4,
 * tmm5: A (even, odd steps); tmm6, tmm7: B (even, odd steps). */
static void configure(uint32_t m)
{
    struct sl_amx_tilecfg cfg __attribute__((aligned(64)));
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = 16;
        cfg.colsb[t] = (uint16_t)(t == 4 || t == 5 ? 64 : m * 4);
    }
    _tile_loadconfig(&cfg);
}

/* The unsigned codes of the tail group of t (1..511) weights: dst[0, t). */
AI void tail_b(const uint8_t *src, uint32_t t, int8_t *dst, const uint32_t b)
{
    const uint32_t S = (t + 7) / 8;
    const __mmask64 lm = first_bytes(S);
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        uint32_t n = t > k * S ? t - k * S : 0;
        _mm512_mask_storeu_epi8(dst + k * S, first_bytes(n < S ? n : S), code(src, S, k, b, 1, lm));
    }
}

#define CASES(CALL)                                                                                \
    switch (b) {                                                                                   \
    case 1:                                                                                        \
        CALL(1);                                                                                   \
        break;                                                                                     \
    case 2:                                                                                        \
        CALL(2);                                                                                   \
        break;                                                                                     \
    case 3:                                                                                        \
        CALL(3);                                                                                   \
        break;                                                                                     \
    case 4:                                                                                        \
        CALL(4);                                                                                   \
        break;                                                                                     \
    case 5:                                                                                        \
        CALL(5);                                                                                   \
        break;                                                                                     \
    case 6:                                                                                        \
        CALL(6);                                                                                   \
        break;                                                                                     \
    case 7:                                                                                        \
        CALL(7);                                                                                   \
        break;                                                                                     \
    default:                                                                                       \
        CALL(8);                                                                                   \
        break;                                                                                     \
    }

static void tail(const uint8_t *src, uint32_t b, uint32_t t, int8_t *dst)
{
#define T(B) tail_b(src, t, dst, (B))
    CASES(T)
#undef T
}

#define PASS 32                        /* channels */
#define HALF (FORMAT_PACKED_GROUP / 2) /* a channel's bytes in a piece */

/* The unsigned codes of half H (stripes 4H..4H+3) of a full group of a
 * b-bit row at src into dst[256]; with the first half, the b lines at pf
 * (the next pass's bytes) prefetched into L2. */
AI void half_b(const uint8_t *src, int8_t *dst, const uint8_t *pf, const uint32_t b, const int H)
{
    if (H == 0) {
#pragma GCC unroll 8
        for (uint32_t o = 0; o < b * 64; o += 64) {
            __builtin_prefetch(pf + o, 0, 2);
            __builtin_prefetch(src + b * 64 + o, 0, 3);
        }
    }
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++)
        _mm512_store_si512((void *)(dst + 64 * k), code(src, 64, 4 * H + k, b, 0, 0));
}

/* Part p (0..3) of step s = h / 4 (p = h % 4) of a piece whose channels
 * lie ld bytes apart: its 64 inputs from column 64 * s (block j's rows from
 * 16 * j) against the stage's B tile at b; even steps into C tiles 0 and 1,
 * odd ones into 2 and 3, each with its own A and B tiles. Part 0 loads the
 * B tile and block 0's A tile, 1 is block 0's TDPBUSD, 2 loads block 1's A
 * tile, 3 is its TDPBUSD (2 and 3 nothing with one block). The tile
 * registers are immediates, hence the macro. */
#define STEP_PART(TB, TA, C0, C1)                                                                  \
    do {                                                                                           \
        if (p == 0) {                                                                              \
            _tile_loadd(TB, bs, m * 4);                                                            \
            _tile_loadd(TA, a, ld);                                                                \
        } else if (p == 1) {                                                                       \
            _tile_dpbusd(C0, TA, TB);                                                              \
        } else if (p == 2) {                                                                       \
            _tile_loadd(TA, a + 16 * ld, ld);                                                      \
        } else {                                                                                   \
            _tile_dpbusd(C1, TA, TB);                                                              \
        }                                                                                          \
    } while (0)
AI void step_part(const int8_t *piece, size_t ld, const uint8_t *b, uint32_t m, uint32_t h,
                  uint32_t nb)
{
    const uint32_t s = h / 4, p = h % 4;
    const int8_t *a = piece + 64 * s;
    const uint8_t *bs = b + (size_t)s * 64 * m;
    if (p >= 2 && nb < 2)
        return;
    if (s & 1)
        STEP_PART(7, 5, 2, 3);
    else
        STEP_PART(6, 4, 0, 1);
}
#undef STEP_PART

/* Step s whole: its four parts in order. */
AI void step(const int8_t *piece, size_t ld, const uint8_t *b, uint32_t m, uint32_t s, uint32_t nb)
{
#pragma GCC unroll 4
    for (uint32_t p = 0; p < 4; p++)
        step_part(piece, ld, b, m, 4 * s + p, nb);
}

/* The unpacking of one half of group g for the pass's channels, in runs of
 * one width, the previous half's 4 steps (at prev, B at bp) in 16 parts,
 * one after every 2 channels; H constant. */
#define HALF_PASS(H)                                                                               \
    do {                                                                                           \
        int8_t(*cur)[HALF] = piece[(2 * g + (H)) & 1];                                             \
        uint32_t s = 0;                                                                            \
        for (uint32_t j = 0, n = 0; j < nruns; j++) {                                              \
            const uint32_t b = run_b[j], end = run_end[j];                                         \
            CASES(RUN##H)                                                                          \
        }                                                                                          \
        for (; prev && s < 16; s++)                                                                \
            step_part(prev, HALF, bp, m, s, nb);                                                   \
        prev = cur[0];                                                                             \
        bp = bst + ((size_t)g * FORMAT_PACKED_GROUP + (H)*HALF) * m;                               \
    } while (0)
#define RUN_BODY(B, H)                                                                             \
    for (; n < end; n++) {                                                                         \
        const uint32_t ch = order[n];                                                              \
        half_b(src[ch], cur[ch], pf, (B), (H));                                                    \
        if ((H) == 0) {                                                                            \
            pf += (B)*64 < pf_left ? (B)*64 : 0;                                                   \
            pf_left -= (B)*64 < pf_left ? (B)*64 : 0;                                              \
        } else {                                                                                   \
            src[ch] += (size_t)(B)*64;                                                             \
        }                                                                                          \
        if ((n & 1) == 1 && prev && s < 16)                                                        \
            step_part(prev, HALF, bp, m, s++, nb);                                                 \
    }
#define RUN0(B) RUN_BODY(B, 0)
#define RUN1(B) RUN_BODY(B, 1)

void unpack_adaptive_dot_tiles_amx(const struct unpack_tensor *u, uint32_t r0, uint32_t r1,
                                   const struct unpack_tiles_stage *st, int32_t *acc, size_t ldacc,
                                   int down)
{
    const uint32_t m = st->m, cols = u->layout.cols;
    const uint32_t full = cols / FORMAT_PACKED_GROUP, t = cols - full * FORMAT_PACKED_GROUP;
    const uint8_t *bst = (const uint8_t *)st + UNPACK_TILES_STAGE_HDR;
    int8_t piece[2][PASS][HALF] __attribute__((aligned(64)));
    int32_t c[4][16][16] __attribute__((aligned(64)));
    configure(m);
    /* ch * 16: where channel ch's row starts in a stored C tile, in ints */
    const __m512i rows16 =
        _mm512_set_epi32(240, 224, 208, 192, 176, 160, 144, 128, 112, 96, 80, 64, 48, 32, 16, 0);
    for (uint32_t done = 0; done < r1 - r0;) {
        /* nc = min(32, left) channels: upwards [r0 + done, + nc), downwards
         * [r1 - done - nc, r1 - done); the partial pass (nc < 32) comes last
         * either way: at the top of the range upwards, at r0 downwards */
        const uint32_t left = r1 - r0 - done, nc = left < PASS ? left : PASS, nb = (nc + 15) / 16;
        const uint32_t rb = down ? r1 - done - nc : r0 + done;
        done += nc;
        const uint8_t *src[PASS];
        uint32_t bw[PASS], count[9] = {0};
        for (uint32_t ch = 0; ch < nc; ch++) {
            src[ch] = u->layout.data + u->row_off[rb + ch];
            bw[ch] = format_packed_width(u->layout.widths, rb + ch);
            count[bw[ch]]++;
        }
        /* the pass's channels ordered by width (counting sort): runs of
         * one width, so that the unpacker's switch runs once per run and
         * half group, and its jumps repeat from one to the next */
        uint32_t order[PASS], run_b[8], run_end[8], nruns = 0, at[9];
        for (uint32_t b = 1, n = 0; b <= 8; b++) {
            at[b] = n;
            if (count[b]) {
                run_b[nruns] = b;
                run_end[nruns++] = n + count[b];
            }
            n += count[b];
        }
        for (uint32_t ch = 0; ch < nc; ch++)
            order[at[bw[ch]]++] = ch;
        /* the rows lie one after another: the next pass's bytes are
         * prefetched in order, as many per group and channel as are read,
         * so one sequential stream runs a pass ahead of the pass's 32 */
        const uint8_t *pf, *pf_end = u->layout.data + u->layout.data_len;
        if (down) { /* the pass below (the rows below r0 after the last) */
            pf = u->layout.data + u->row_off[rb > PASS ? rb - PASS : 0];
            pf_end = u->layout.data + u->row_off[rb];
        } else {
            pf = u->layout.data +
                 (rb + nc < u->layout.rows ? u->row_off[rb + nc] : u->layout.data_len);
        }
        uint64_t pf_left = (uint64_t)(pf_end - pf);
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        const int8_t *prev = NULL; /* the half whose steps are pending */
        const uint8_t *bp = NULL;
        for (uint32_t g = 0; g < full; g++) {
            HALF_PASS(0);
            HALF_PASS(1);
        }
        for (uint32_t s = 0; prev && s < 4; s++)
            step(prev, HALF, bp, m, s, nb);
        if (t) { /* the tail group, contiguous in a piece of its own */
            int8_t tl[PASS][FORMAT_PACKED_GROUP] __attribute__((aligned(64)));
            for (uint32_t ch = 0; ch < nc; ch++)
                tail(src[ch], bw[ch], t, tl[ch]);
            const uint8_t *bt = bst + (size_t)full * FORMAT_PACKED_GROUP * m;
            for (uint32_t s = 0; s < (t + 63) / 64; s++)
                step(tl[0], FORMAT_PACKED_GROUP, bt, m, s, nb);
        }
        _tile_stored(0, c[0], 64);
        _tile_stored(2, c[2], 64);
        if (nb > 1) {
            _tile_stored(1, c[1], 64);
            _tile_stored(3, c[3], 64);
        }
        /* block j's 16 channels of row i at once: column i of its C tiles
         * (gathered: channel ch's sums lie 16 ints apart), the same
         * modulo-2^32 sum and product as a scalar loop; 16 * 8 elements
         * one at a time were ~9% of a 2048-column tensor's time */
        for (uint32_t j = 0; j < nb; j++) {
            const uint32_t n16 = nc - 16 * j < 16 ? nc - 16 * j : 16;
            const __mmask16 km = (__mmask16)((1u << n16) - 1);
            int32_t offs[16] __attribute__((aligned(64))) = {0};
            for (uint32_t k = 0; k < n16; k++)
                offs[k] = UNPACK_DOT_OFF(bw[16 * j + k]);
            const __m512i offv = _mm512_load_si512((const void *)offs);
            for (uint32_t i = 0; i < m; i++) {
                const __m512i col = _mm512_add_epi32(rows16, _mm512_set1_epi32((int)i));
                const __m512i sum = _mm512_add_epi32(_mm512_i32gather_epi32(col, c[j], 4),
                                                     _mm512_i32gather_epi32(col, c[j + 2], 4));
                const __m512i corr = _mm512_mullo_epi32(offv, _mm512_set1_epi32(st->xsum[i]));
                _mm512_mask_storeu_epi32(acc + i * ldacc + (rb - r0) + 16 * j, km,
                                         _mm512_sub_epi32(sum, corr));
            }
        }
    }
    _tile_release();
}

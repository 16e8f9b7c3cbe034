/* unpack_avx512.c: AVX-512 (F+BW) unpackers, bit-exact with unpack_scalar.c.
 *
 * Adaptive (EdgeFlow 4.2): with R = 512 a block is 64 bytes = one zmm, and
 * byte i of a block maps to weight i of each of its stripes, so one load,
 * a shift, an AND and an OR per plane give 64 consecutive int8 weights. x86
 * has no 8-bit shifts: 16-bit shifts are used and the per-byte mask drops
 * the bits that crossed from the neighbouring byte. The width is constant
 * inside each specialized group function, so all shifts are immediates. */
#include <immintrin.h>
#include <string.h>

#include "unpack_internal.h"

#define AI static inline __attribute__((always_inline))

static const uint8_t planes[9][4] = {
    {0}, {1, 0}, {2, 0}, {2, 1, 0}, {4, 0}, {4, 1, 0}, {4, 2, 0}, {4, 2, 1, 0}, {4, 4, 0},
};

/* code -> int8: b = 1: 2u - 1; else min(u, 2^b - 2) - (2^(b-1) - 1) */
AI __m512i finish(__m512i u, const uint32_t b)
{
    if (b == 1)
        return _mm512_sub_epi8(_mm512_add_epi8(u, u), _mm512_set1_epi8(1));
    u = _mm512_min_epu8(u, _mm512_set1_epi8((char)((1u << b) - 2)));
    return _mm512_sub_epi8(u, _mm512_set1_epi8((char)((1 << (b - 1)) - 1)));
}

AI __m512i field(__m512i v, const int sh, const int w)
{
    __m512i x = sh ? _mm512_srli_epi16(v, sh) : v;
    return _mm512_and_si512(x, _mm512_set1_epi8((char)((1 << w) - 1)));
}

/* One full group (512 weights, b blocks of 64 bytes). */
AI void adaptive_group(const uint8_t *src, int8_t *dst, const uint32_t b)
{
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) {
        __m512i u = _mm512_setzero_si512();
        const uint8_t *blk = src;
#pragma GCC unroll 4
        for (int p = 0; p < 3; p++) {
            const int w = planes[b][p];
            if (!w)
                break;
            const int per = 8 / w;
            __m512i v = _mm512_loadu_si512(blk + (k / per) * 64);
            __m512i bits = field(v, 8 - w * (k % per + 1), w);
            u = _mm512_or_si512(_mm512_slli_epi16(u, w), bits);
            blk += w * 64;
        }
        _mm512_storeu_si512(dst + k * 64, finish(u, b));
    }
}

#define DEFINE_ADAPTIVE(B)                                                                    \
    static void adaptive_groups_##B(const uint8_t *src, uint32_t n, int8_t *dst)            \
    {                                                                                        \
        for (uint32_t g = 0; g < n; g++)                                                     \
            adaptive_group(src + (size_t)g * (B) * 64, dst + (size_t)g * 512, (B));         \
    }
DEFINE_ADAPTIVE(1)
DEFINE_ADAPTIVE(2)
DEFINE_ADAPTIVE(3)
DEFINE_ADAPTIVE(4)
DEFINE_ADAPTIVE(5)
DEFINE_ADAPTIVE(6)
DEFINE_ADAPTIVE(7)
DEFINE_ADAPTIVE(8)

static void (*const adaptive_groups[9])(const uint8_t *, uint32_t, int8_t *) = {
    NULL,              adaptive_groups_1, adaptive_groups_2, adaptive_groups_3, adaptive_groups_4,
    adaptive_groups_5, adaptive_groups_6, adaptive_groups_7, adaptive_groups_8,
};

static void adaptive_row(const uint8_t *src, uint32_t cols, uint32_t b, int8_t *dst)
{
    uint32_t full = cols / 512;
    adaptive_groups[b](src, full, dst);
    uint32_t t = cols - full * 512;
    if (t)
        unpack_adaptive_group_scalar(src + (size_t)full * b * 64, (uint32_t)sl_align_up(t, 8), t,
                                     b, dst + (size_t)full * 512);
}

/* ---- int4int8 (padded baseline) ------------------------------------------------------ */

static void int4int8_row(const uint8_t *src, uint32_t cols, uint32_t b, int8_t *dst)
{
    uint32_t j = 0;
    if (b > 4) {
        const __m512i lo = _mm512_set1_epi8(-127);
        for (; j + 64 <= cols; j += 64)
            _mm512_storeu_si512(dst + j, _mm512_max_epi8(_mm512_loadu_si512(src + j), lo));
    } else {
        const __m512i m = _mm512_set1_epi8(0x0f), eight = _mm512_set1_epi8(8);
        const __m512i lo7 = _mm512_set1_epi8(-7);
        /* unpacklo/hi interleave within 128-bit lanes; reorder the lanes */
        const __m512i i0 = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0);
        const __m512i i1 = _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4);
        for (; j + 128 <= cols; j += 128) {
            __m512i v = _mm512_loadu_si512(src + j / 2);
            __m512i l = _mm512_and_si512(v, m);
            __m512i h = _mm512_and_si512(_mm512_srli_epi16(v, 4), m);
            l = _mm512_max_epi8(_mm512_sub_epi8(_mm512_xor_si512(l, eight), eight), lo7);
            h = _mm512_max_epi8(_mm512_sub_epi8(_mm512_xor_si512(h, eight), eight), lo7);
            __m512i a = _mm512_unpacklo_epi8(l, h), c = _mm512_unpackhi_epi8(l, h);
            _mm512_storeu_si512(dst + j, _mm512_permutex2var_epi64(a, i0, c));
            _mm512_storeu_si512(dst + j + 64, _mm512_permutex2var_epi64(a, i1, c));
        }
    }
    unpack_int4int8_tail_scalar(src, cols, b, j, dst);
}

/* ---- bitplane (K-quant-like baseline) -------------------------------------------------
 * 64 weights at a time: each plane's bits for them are 8w contiguous bytes,
 * spread to one weight per byte: 1-bit planes through a mask register
 * (vpmovm2b), 2- and 4-bit planes by zero-extending bytes to dwords/words and
 * shifting copies into place. */

AI __m512i spread(const uint8_t *p, const int w)
{
    if (w == 1) {
        uint64_t m;
        memcpy(&m, p, 8);
        return _mm512_and_si512(_mm512_movm_epi8((__mmask64)m), _mm512_set1_epi8(1));
    }
    if (w == 2) {
        __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
        __m512i t = _mm512_or_si512(_mm512_or_si512(d, _mm512_slli_epi32(d, 6)),
                                    _mm512_or_si512(_mm512_slli_epi32(d, 12),
                                                    _mm512_slli_epi32(d, 18)));
        return _mm512_and_si512(t, _mm512_set1_epi32(0x03030303));
    }
    __m512i d = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_and_si512(_mm512_or_si512(d, _mm512_slli_epi16(d, 4)),
                            _mm512_set1_epi16(0x0f0f));
}

AI void bitplane_run(const uint8_t *src, uint32_t cols, int8_t *dst, const uint32_t b,
                     uint32_t *done)
{
    uint32_t padded = (uint32_t)sl_align_up(cols, 8);
    uint32_t j = 0;
    for (; j + 64 <= cols; j += 64) {
        __m512i u = _mm512_setzero_si512();
        const uint8_t *plane = src;
#pragma GCC unroll 4
        for (int p = 0; p < 3; p++) {
            const int w = planes[b][p];
            if (!w)
                break;
            u = _mm512_or_si512(_mm512_slli_epi16(u, w), spread(plane + (size_t)j * w / 8, w));
            plane += (size_t)padded * w / 8;
        }
        _mm512_storeu_si512(dst + j, finish(u, b));
    }
    *done = j;
}

#define DEFINE_BITPLANE(B)                                                                   \
    static uint32_t bitplane_##B(const uint8_t *src, uint32_t cols, int8_t *dst)             \
    {                                                                                        \
        uint32_t done;                                                                       \
        bitplane_run(src, cols, dst, (B), &done);                                            \
        return done;                                                                         \
    }
DEFINE_BITPLANE(1)
DEFINE_BITPLANE(2)
DEFINE_BITPLANE(3)
DEFINE_BITPLANE(4)
DEFINE_BITPLANE(5)
DEFINE_BITPLANE(6)
DEFINE_BITPLANE(7)
DEFINE_BITPLANE(8)

static uint32_t (*const bitplanes[9])(const uint8_t *, uint32_t, int8_t *) = {
    NULL, bitplane_1, bitplane_2, bitplane_3, bitplane_4,
    bitplane_5, bitplane_6, bitplane_7, bitplane_8,
};

static void bitplane_row(const uint8_t *src, uint32_t cols, uint32_t b, int8_t *dst)
{
    uint32_t done = bitplanes[b](src, cols, dst);
    unpack_bitplane_tail_scalar(src, cols, b, done, dst);
}

const struct unpack_kernels unpack_kernels_avx512 = {adaptive_row, int4int8_row, bitplane_row};

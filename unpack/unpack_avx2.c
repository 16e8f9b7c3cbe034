/* unpack_avx2.c: AVX2 unpackers, bit-exact with unpack_scalar.c. Same
 * structure as unpack_avx512.c; a 64-byte adaptive block is two ymm halves,
 * and byte i of a block still maps to weight i of each stripe, so each half
 * yields 32 consecutive weights. */
#include <immintrin.h>
#include <string.h>

#include "unpack_internal.h"

#define AI static inline __attribute__((always_inline))

static const uint8_t planes[9][4] = {
    {0}, {1, 0}, {2, 0}, {2, 1, 0}, {4, 0}, {4, 1, 0}, {4, 2, 0}, {4, 2, 1, 0}, {4, 4, 0},
};

AI __m256i finish(__m256i u, const uint32_t b)
{
    if (b == 1)
        return _mm256_sub_epi8(_mm256_add_epi8(u, u), _mm256_set1_epi8(1));
    u = _mm256_min_epu8(u, _mm256_set1_epi8((char)((1u << b) - 2)));
    return _mm256_sub_epi8(u, _mm256_set1_epi8((char)((1 << (b - 1)) - 1)));
}

AI __m256i field(__m256i v, const int sh, const int w)
{
    __m256i x = sh ? _mm256_srli_epi16(v, sh) : v;
    return _mm256_and_si256(x, _mm256_set1_epi8((char)((1 << w) - 1)));
}

AI void adaptive_group(const uint8_t *src, int8_t *dst, const uint32_t b)
{
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            __m256i u = _mm256_setzero_si256();
            const uint8_t *blk = src + h * 32;
#pragma GCC unroll 4
            for (int p = 0; p < 3; p++) {
                const int w = planes[b][p];
                if (!w)
                    break;
                const int per = 8 / w;
                __m256i v = _mm256_loadu_si256((const __m256i *)(blk + (k / per) * 64));
                u = _mm256_or_si256(_mm256_slli_epi16(u, w), field(v, 8 - w * (k % per + 1), w));
                blk += w * 64;
            }
            _mm256_storeu_si256((__m256i *)(dst + k * 64 + h * 32), finish(u, b));
        }
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

static void int4int8_row(const uint8_t *src, uint32_t cols, uint32_t b, int8_t *dst)
{
    uint32_t j = 0;
    if (b > 4) {
        const __m256i lo = _mm256_set1_epi8(-127);
        for (; j + 32 <= cols; j += 32)
            _mm256_storeu_si256((__m256i *)(dst + j),
                                _mm256_max_epi8(_mm256_loadu_si256((const __m256i *)(src + j)), lo));
    } else {
        const __m256i m = _mm256_set1_epi8(0x0f), eight = _mm256_set1_epi8(8);
        const __m256i lo7 = _mm256_set1_epi8(-7);
        for (; j + 64 <= cols; j += 64) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(src + j / 2));
            __m256i l = _mm256_and_si256(v, m);
            __m256i h = _mm256_and_si256(_mm256_srli_epi16(v, 4), m);
            l = _mm256_max_epi8(_mm256_sub_epi8(_mm256_xor_si256(l, eight), eight), lo7);
            h = _mm256_max_epi8(_mm256_sub_epi8(_mm256_xor_si256(h, eight), eight), lo7);
            __m256i a = _mm256_unpacklo_epi8(l, h), c = _mm256_unpackhi_epi8(l, h);
            _mm256_storeu_si256((__m256i *)(dst + j), _mm256_permute2x128_si256(a, c, 0x20));
            _mm256_storeu_si256((__m256i *)(dst + j + 32), _mm256_permute2x128_si256(a, c, 0x31));
        }
    }
    unpack_int4int8_tail_scalar(src, cols, b, j, dst);
}

/* 32 weights of one bitplane plane, one per byte. */
AI __m256i spread(const uint8_t *p, const int w)
{
    if (w == 1) {
        uint32_t m;
        memcpy(&m, p, 4);
        /* byte i of the 4 replicated into bytes 8i..8i+7, then one bit each */
        const __m256i idx = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2,
                                             2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
        const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
        __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)m), idx);
        v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
        return _mm256_and_si256(v, _mm256_set1_epi8(1));
    }
    if (w == 2) {
        __m256i d = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
        __m256i t = _mm256_or_si256(_mm256_or_si256(d, _mm256_slli_epi32(d, 6)),
                                    _mm256_or_si256(_mm256_slli_epi32(d, 12),
                                                    _mm256_slli_epi32(d, 18)));
        return _mm256_and_si256(t, _mm256_set1_epi32(0x03030303));
    }
    __m256i d = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p));
    return _mm256_and_si256(_mm256_or_si256(d, _mm256_slli_epi16(d, 4)),
                            _mm256_set1_epi16(0x0f0f));
}

AI uint32_t bitplane_run(const uint8_t *src, uint32_t cols, int8_t *dst, const uint32_t b)
{
    uint32_t padded = (uint32_t)sl_align_up(cols, 8);
    uint32_t j = 0;
    for (; j + 32 <= cols; j += 32) {
        __m256i u = _mm256_setzero_si256();
        const uint8_t *plane = src;
#pragma GCC unroll 4
        for (int p = 0; p < 3; p++) {
            const int w = planes[b][p];
            if (!w)
                break;
            u = _mm256_or_si256(_mm256_slli_epi16(u, w), spread(plane + (size_t)j * w / 8, w));
            plane += (size_t)padded * w / 8;
        }
        _mm256_storeu_si256((__m256i *)(dst + j), finish(u, b));
    }
    return j;
}

#define DEFINE_BITPLANE(B)                                                                   \
    static uint32_t bitplane_##B(const uint8_t *src, uint32_t cols, int8_t *dst)             \
    {                                                                                        \
        return bitplane_run(src, cols, dst, (B));                                            \
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

const struct unpack_kernels unpack_kernels_avx2 = {adaptive_row, int4int8_row, bitplane_row};

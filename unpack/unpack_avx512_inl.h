/* unpack_avx512_inl.h: the AVX-512 (F+BW) pieces that build an adaptive
 * stripe's 64 codes in a register (unpack_avx512.c describes the method),
 * shared by the AVX-512 row and dot kernels (unpack_avx512.c) and the AMX
 * one (unpack_amx.c); included only by files compiled with AVX-512 flags. */
#ifndef SLUICE_UNPACK_AVX512_INL_H
#define SLUICE_UNPACK_AVX512_INL_H

#include <immintrin.h>

#include "unpack_internal.h"

#define AI static inline __attribute__((always_inline))

static const uint8_t planes[9][4] = {
    {0}, {1, 0}, {2, 0}, {2, 1, 0}, {4, 0}, {4, 1, 0}, {4, 2, 0}, {4, 2, 1, 0}, {4, 4, 0},
};

/* Bits [sh, sh+w) of every byte of v moved to [pos, pos+w), the rest zero.
 * Right shift by sh-pos: the bits entering a byte from its upper neighbour
 * land in [8-(sh-pos), 8), above pos+w since sh+w <= 8. Left shift by
 * pos-sh: they land in [0, pos-sh), below pos. */
AI __m512i field(__m512i v, const int sh, const int pos, const int w)
{
    __m512i x = sh > pos   ? _mm512_srli_epi16(v, (unsigned)(sh - pos))
                : sh < pos ? _mm512_slli_epi16(v, (unsigned)(pos - sh))
                           : v;
    return _mm512_and_si512(x, _mm512_set1_epi8((char)(((1 << w) - 1) << pos)));
}

/* The unsigned codes u = q + UNPACK_DOT_OFF(b) of stripe k of an adaptive
 * group whose blocks start S bytes apart at src: 64 weights (or the S < 64
 * of a tail group, lm masking the loads). b = 1 puts the sign bit at bit 1
 * (u = 0 or 2) so that 2u - 1 is one subtraction; b >= 2 clamps the code to
 * 2^b - 2. */
AI __m512i code(const uint8_t *src, const size_t S, const int k, const uint32_t b, const int masked,
                const __mmask64 lm)
{
    __m512i u = _mm512_setzero_si512();
    int pos = (int)b + (b == 1);
    const uint8_t *blk = src;
#pragma GCC unroll 4
    for (int p = 0; p < 3; p++) {
        const int w = planes[b][p];
        if (!w)
            break;
        const int per = 8 / w;
        pos -= w;
        const uint8_t *at = blk + (size_t)(k / per) * S;
        __m512i v = masked ? _mm512_maskz_loadu_epi8(lm, at) : _mm512_loadu_si512(at);
        u = _mm512_or_si512(u, field(v, 8 - w * (k % per + 1), pos, w));
        blk += (size_t)w * S;
    }
    if (b == 1)
        return u;
    return _mm512_min_epu8(u, _mm512_set1_epi8((char)((1u << b) - 2)));
}

/* A mask of the first n (0..64) bytes. */
AI __mmask64 first_bytes(uint32_t n)
{
    return n >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << n) - 1;
}

#endif

/* unpack_avx2.c: AVX2 unpackers, bit-exact with unpack_scalar.c. Same
 * structure as unpack_avx512.c. A 64-byte adaptive block is two ymm halves;
 * bytes i..i+31 of a block belong to weights i..i+31 of each stripe, so each
 * half still yields 32 consecutive weights (EdgeFlow 4.2, R = 512). 16-bit
 * shifts plus per-byte masks stand in for the missing 8-bit shifts. */
#include <immintrin.h>
#include <string.h>

#include "unpack_internal.h"

#define AI static inline __attribute__((always_inline))

static const uint8_t planes[9][4] = {
    {0}, {1, 0}, {2, 0}, {2, 1, 0}, {4, 0}, {4, 1, 0}, {4, 2, 0}, {4, 2, 1, 0}, {4, 4, 0},
};

/* Bits [sh, sh+w) of every byte moved to [pos, pos+w); see unpack_avx512.c. */
AI __m256i field(__m256i v, const int sh, const int pos, const int w)
{
    __m256i x = sh > pos ? _mm256_srli_epi16(v, sh - pos)
              : sh < pos ? _mm256_slli_epi16(v, pos - sh)
                         : v;
    return _mm256_and_si256(x, _mm256_set1_epi8((char)(((1 << w) - 1) << pos)));
}

/* The unsigned codes of 32 weights of stripe k of a group whose blocks
 * start S bytes apart: u = q + UNPACK_DOT_OFF(b), in [0, 2^b - 2] (b = 1:
 * the bit at bit 1, so 0 or 2, and q = u - 1). */
AI __m256i code(const uint8_t *src, const size_t S, const int k, const uint32_t b)
{
    __m256i u = _mm256_setzero_si256();
    int pos = (int)b + (b == 1);
    const uint8_t *blk = src;
#pragma GCC unroll 4
    for (int p = 0; p < 3; p++) {
        const int w = planes[b][p];
        if (!w)
            break;
        const int per = 8 / w;
        pos -= w;
        __m256i v = _mm256_loadu_si256((const __m256i *)(blk + (size_t)(k / per) * S));
        u = _mm256_or_si256(u, field(v, 8 - w * (k % per + 1), pos, w));
        blk += (size_t)w * S;
    }
    if (b == 1)
        return u;
    return _mm256_min_epu8(u, _mm256_set1_epi8((char)((1u << b) - 2)));
}

/* 32 int8 weights of stripe k of a group whose blocks start S bytes apart. */
AI __m256i stripe(const uint8_t *src, const size_t S, const int k, const uint32_t b)
{
    return _mm256_sub_epi8(code(src, S, k, b), _mm256_set1_epi8((char)UNPACK_DOT_OFF(b)));
}

/* A row's tail group of t < 512 weights (S = round_up(t, 8) / 8 < 64 bytes
 * per block) into out[0..t). Without byte-masked loads, its b*S bytes are
 * copied into a padded buffer (so no load leaves the row) and whole vectors
 * computed stripe after stripe into out (each stripe's overhang is
 * overwritten by the next stripe; out holds TAIL_OUT bytes). */
#define TAIL_OUT (8 * 64 + 32)
AI void tail_group(const uint8_t *src, uint32_t t, const uint32_t b, int8_t *out)
{
    uint32_t S = (t + 7) / 8;
    uint8_t in[8 * 64 + 32];
    memcpy(in, src, (size_t)b * S);
    memset(in + (size_t)b * S, 0, 32);
    for (int k = 0; k < 8; k++)
        for (uint32_t c = 0; c < S; c += 32)
            _mm256_storeu_si256((__m256i *)(out + k * S + c), stripe(in + c, S, k, b));
}

/* A full-vector store; non-temporal (dst 32-byte aligned) when streaming. */
AI void store(int8_t *dst, __m256i v, const int nt)
{
    if (nt)
        _mm256_stream_si256((__m256i *)dst, v);
    else
        _mm256_storeu_si256((__m256i *)dst, v);
}

AI void adaptive_row_b(const uint8_t *src, uint32_t cols, int8_t *dst, const uint32_t b,
                      const int nt)
{
    uint32_t full = cols / 512;
    for (uint32_t g = 0; g < full; g++, src += b * 64, dst += 512) {
        unpack_adaptive_prefetch(src, b);
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            store(dst + k * 64, stripe(src, 64, k, b), nt);
            store(dst + k * 64 + 32, stripe(src + 32, 64, k, b), nt);
        }
    }
    uint32_t t = cols - full * 512;
    if (t) {
        int8_t out[TAIL_OUT];
        tail_group(src, t, b, out);
        memcpy(dst, out, t);
    }
}

#define DEFINE_ADAPTIVE(B)                                                                    \
    static void adaptive_row_##B(const uint8_t *src, uint32_t cols, int8_t *dst)             \
    {                                                                                        \
        adaptive_row_b(src, cols, dst, (B), 0);                                              \
    }                                                                                        \
    static void adaptive_row_nt_##B(const uint8_t *src, uint32_t cols, int8_t *dst)          \
    {                                                                                        \
        adaptive_row_b(src, cols, dst, (B), 1);                                              \
    }
DEFINE_ADAPTIVE(1)
DEFINE_ADAPTIVE(2)
DEFINE_ADAPTIVE(3)
DEFINE_ADAPTIVE(4)
DEFINE_ADAPTIVE(5)
DEFINE_ADAPTIVE(6)
DEFINE_ADAPTIVE(7)
DEFINE_ADAPTIVE(8)

typedef void row_b_fn(const uint8_t *, uint32_t, int8_t *);

static row_b_fn *const adaptive_rows[2][9] = {
    {NULL, adaptive_row_1, adaptive_row_2, adaptive_row_3, adaptive_row_4, adaptive_row_5,
     adaptive_row_6, adaptive_row_7, adaptive_row_8},
    {NULL, adaptive_row_nt_1, adaptive_row_nt_2, adaptive_row_nt_3, adaptive_row_nt_4,
     adaptive_row_nt_5, adaptive_row_nt_6, adaptive_row_nt_7, adaptive_row_nt_8},
};

static void adaptive_row(const uint8_t *src, uint32_t cols, uint32_t b, int8_t *dst, int stream)
{
    adaptive_rows[stream != 0][b](src, cols, dst);
}

/* ---- block multipliers (header version 2) ------------------------------------------------
 * 32 int8 values times one multiplier m in 1..4 (a 32-weight block): v m =
 * v + v [(m - 1) & 1] + 2v [(m - 1) & 2], with the bracketed masks
 * broadcast; every partial sum lies between 0 and v m, |v m| <= 127, so no
 * add wraps. */
static const uint8_t mult_mask[2][5][32] __attribute__((aligned(32))) = {
#define MM(x) {x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x}
    {MM(0), MM(0), MM(0xff), MM(0), MM(0xff)},    /* (m - 1) & 1 */
    {MM(0), MM(0), MM(0), MM(0xff), MM(0xff)},    /* (m - 1) & 2 */
#undef MM
};

AI __m256i mul_block(__m256i v, uint32_t m)
{
    __m256i a = _mm256_load_si256((const __m256i *)mult_mask[0][m]);
    __m256i c = _mm256_load_si256((const __m256i *)mult_mask[1][m]);
    __m256i r = _mm256_add_epi8(v, _mm256_and_si256(v, a));
    return _mm256_add_epi8(r, _mm256_and_si256(_mm256_add_epi8(v, v), c));
}

/* Widths up to 5 by table, mult_lut[b - 1][m] (the same 16 bytes in both
 * lanes, as pshufb indexes each lane with the low 4 bits):
 * - b <= 4: entry u (the unsigned code, 0..14; 0 or 2 at b = 1) holds
 *   (u - UNPACK_DOT_OFF(b)) m, the int8 value times m, straight from the
 *   code (0 past the largest code);
 * - b = 5: entry i holds i m, looked up with |v| (<= 15) of the int8 value v,
 *   then given v's sign. */
#define LUT_MAX(b) ((b) == 1 ? 2 : (1 << (b)) - 2)
#define LUT_V(b, m, u) ((u) <= LUT_MAX(b) ? ((u) - UNPACK_DOT_OFF(b)) * (m) : 0)
#define LUT_16(b, m)                                                                         \
    LUT_V(b, m, 0), LUT_V(b, m, 1), LUT_V(b, m, 2), LUT_V(b, m, 3), LUT_V(b, m, 4),          \
        LUT_V(b, m, 5), LUT_V(b, m, 6), LUT_V(b, m, 7), LUT_V(b, m, 8), LUT_V(b, m, 9),      \
        LUT_V(b, m, 10), LUT_V(b, m, 11), LUT_V(b, m, 12), LUT_V(b, m, 13), LUT_V(b, m, 14), \
        LUT_V(b, m, 15)
#define LUT_B(b)                                                                             \
    {{LUT_16(b, 0), LUT_16(b, 0)}, {LUT_16(b, 1), LUT_16(b, 1)}, {LUT_16(b, 2), LUT_16(b, 2)}, \
     {LUT_16(b, 3), LUT_16(b, 3)}, {LUT_16(b, 4), LUT_16(b, 4)}}
#define LUT_I(m)                                                                             \
    0, (m), 2 * (m), 3 * (m), 4 * (m), 5 * (m), 6 * (m), 7 * (m), 8 * (m), 9 * (m), 10 * (m), \
        11 * (m), 12 * (m), 13 * (m), 14 * (m), 15 * (m)
static const int8_t mult_lut[5][5][32] __attribute__((aligned(32))) = {
    LUT_B(1), LUT_B(2), LUT_B(3), LUT_B(4),
    {{LUT_I(0), LUT_I(0)}, {LUT_I(1), LUT_I(1)}, {LUT_I(2), LUT_I(2)}, {LUT_I(3), LUT_I(3)},
     {LUT_I(4), LUT_I(4)}}};
#undef LUT_I
#undef LUT_B
#undef LUT_16
#undef LUT_V
#undef LUT_MAX

/* 32 int8 weights of stripe k times m. */
AI __m256i stripe_mult(const uint8_t *src, const size_t S, const int k, const uint32_t b,
                       uint32_t m)
{
    const __m256i t = _mm256_load_si256((const __m256i *)mult_lut[b <= 5 ? b - 1 : 0][m]);
    if (b <= 4)
        return _mm256_shuffle_epi8(t, code(src, S, k, b));
    __m256i v = stripe(src, S, k, b);
    if (b == 5)
        return _mm256_sign_epi8(_mm256_shuffle_epi8(t, _mm256_abs_epi8(v)), v);
    return mul_block(v, m);
}

void unpack_mult_avx2(int8_t *q, uint32_t n, const uint8_t *m)
{
    uint32_t i = 0;
    for (; i + 32 <= n; i += 32)
        _mm256_storeu_si256((__m256i *)(q + i),
                            mul_block(_mm256_loadu_si256((const __m256i *)(q + i)), m[i / 32]));
    unpack_mult_scalar(q + i, n - i, m + i / 32);
}

/* adaptive_row_b with the multipliers applied before the stores: the
 * 32-weight vectors of a full group are its blocks 2k + h */
AI void adaptive_mult_b(const uint8_t *src, uint32_t cols, int8_t *dst, const uint32_t b,
                        const int nt, const uint8_t *m)
{
    uint32_t full = cols / 512;
    for (uint32_t g = 0; g < full; g++, src += b * 64, dst += 512, m += 16) {
        unpack_adaptive_prefetch(src, b);
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            store(dst + k * 64, stripe_mult(src, 64, k, b, m[2 * k]), nt);
            store(dst + k * 64 + 32, stripe_mult(src + 32, 64, k, b, m[2 * k + 1]), nt);
        }
    }
    uint32_t t = cols - full * 512;
    if (t) { /* the tail group, then its blocks */
        int8_t out[TAIL_OUT];
        tail_group(src, t, b, out);
        unpack_mult_scalar(out, t, m);
        memcpy(dst, out, t);
    }
}

#define DEFINE_MULT(B)                                                                        \
    static void adaptive_mult_##B(const uint8_t *src, uint32_t cols, int8_t *dst, int nt,     \
                                  const uint8_t *m)                                           \
    {                                                                                        \
        if (nt)                                                                              \
            adaptive_mult_b(src, cols, dst, (B), 1, m);                                      \
        else                                                                                 \
            adaptive_mult_b(src, cols, dst, (B), 0, m);                                      \
    }
DEFINE_MULT(1)
DEFINE_MULT(2)
DEFINE_MULT(3)
DEFINE_MULT(4)
DEFINE_MULT(5)
DEFINE_MULT(6)
DEFINE_MULT(7)
DEFINE_MULT(8)

/* adaptive_mult_b with the multipliers as stored: a full group's 16 blocks
 * are one 32-bit word (block j at bits 2j, value m - 1), clamped to mx;
 * the tail group's decoded one by one. */
AI void adaptive_mult_raw_b(const uint8_t *src, uint32_t cols, int8_t *dst, const uint32_t b,
                            const int nt, const uint8_t *mr)
{
    const uint32_t mx = format_packed_mult_max(b);
    uint32_t full = cols / 512;
    for (uint32_t g = 0; g < full; g++, src += b * 64, dst += 512, mr += 4) {
        unpack_adaptive_prefetch(src, b);
        uint32_t w;
        memcpy(&w, mr, 4); /* x86: the stored bytes in order */
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            uint32_t m0 = (w >> (4 * k) & 3) + 1, m1 = (w >> (4 * k + 2) & 3) + 1;
            if (mx < 4) {
                m0 = m0 < mx ? m0 : mx;
                m1 = m1 < mx ? m1 : mx;
            }
            store(dst + k * 64, stripe_mult(src, 64, k, b, m0), nt);
            store(dst + k * 64 + 32, stripe_mult(src + 32, 64, k, b, m1), nt);
        }
    }
    uint32_t t = cols - full * 512;
    if (t) { /* the tail group, then its blocks */
        uint8_t m[16];
        for (uint32_t j = 0; j < (t + 31) / 32; j++) {
            uint32_t v = (mr[j / 4] >> (2 * (j % 4)) & 3) + 1;
            m[j] = (uint8_t)(v < mx ? v : mx);
        }
        int8_t out[TAIL_OUT];
        tail_group(src, t, b, out);
        unpack_mult_scalar(out, t, m);
        memcpy(dst, out, t);
    }
}

#define DEFINE_MULT_RAW(B)                                                                    \
    static void adaptive_mult_raw_##B(const uint8_t *src, uint32_t cols, int8_t *dst, int nt, \
                                      const uint8_t *mr)                                      \
    {                                                                                        \
        if (nt)                                                                              \
            adaptive_mult_raw_b(src, cols, dst, (B), 1, mr);                                 \
        else                                                                                 \
            adaptive_mult_raw_b(src, cols, dst, (B), 0, mr);                                 \
    }
DEFINE_MULT_RAW(1)
DEFINE_MULT_RAW(2)
DEFINE_MULT_RAW(3)
DEFINE_MULT_RAW(4)
DEFINE_MULT_RAW(5)
DEFINE_MULT_RAW(6)
DEFINE_MULT_RAW(7)

void unpack_adaptive_mult_raw_avx2(const uint8_t *src, uint32_t cols, uint32_t b, int8_t *dst,
                                   int stream, const uint8_t *mr)
{
    static void (*const fns[8])(const uint8_t *, uint32_t, int8_t *, int, const uint8_t *) = {
        NULL, adaptive_mult_raw_1, adaptive_mult_raw_2, adaptive_mult_raw_3,
        adaptive_mult_raw_4, adaptive_mult_raw_5, adaptive_mult_raw_6, adaptive_mult_raw_7};
    if (b == 8) /* multipliers clamped to 1: the plain row */
        adaptive_rows[stream != 0][8](src, cols, dst);
    else
        fns[b](src, cols, dst, stream != 0, mr);
}

void unpack_adaptive_mult_avx2(const uint8_t *src, uint32_t cols, uint32_t b, int8_t *dst,
                               int stream, const uint8_t *m)
{
    static void (*const fns[9])(const uint8_t *, uint32_t, int8_t *, int, const uint8_t *) = {
        NULL, adaptive_mult_1, adaptive_mult_2, adaptive_mult_3, adaptive_mult_4,
        adaptive_mult_5, adaptive_mult_6, adaptive_mult_7, adaptive_mult_8};
    fns[b](src, cols, dst, stream != 0, m);
}

/* ---- dot products straight from the packed row (decode) -------------------------------
 * Per 32 weights: the unsigned codes (code()) times x with pmaddubsw (u8 x
 * s8, pairs added into int16: at most 2 * 126 * 128 < 2^15 for b <= 7, so no
 * saturation), pmaddwd with ones into int32 lanes; the offset comes off
 * once per row with xsum_full. b = 8 codes reach 254 and would saturate:
 * those rows multiply the signed codes widened to int16 (pmaddwd). int32
 * lanes wrap; the result is exact modulo 2^32 and fits an int32. */
AI int32_t hsum8(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* Lane masks: 32 bytes at tail_mask + 32 - n keep the first n lanes. */
static const int8_t tail_mask[64] = {-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                     -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                     -1, -1, -1, -1, -1, -1};

/* Stripes whose pmaddubsw results add up in int16 without passing 2^15: a
 * pair sum is at most 2 * c * 128 for the largest code c (2^b - 2, 3 for b
 * = 1): 7680 for b <= 5 (4 of them: 30720), 15872 for b = 6 (2), 32256 for
 * b = 7 (1). Divides 8 (the stripes of a group). */
#define DOT_PRESUM(b) ((b) <= 5 ? 4 : (b) == 6 ? 2 : 1)

AI int32_t adaptive_dot_b(const uint8_t *src, uint32_t cols, const int8_t *x,
                          const struct unpack_dot_args *a, const uint32_t b)
{
    const uint32_t full = cols / 512;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc0 = _mm256_setzero_si256(), acc1 = _mm256_setzero_si256();
    for (uint32_t g = 0; g < full; g++, src += b * 64, x += 512) {
        unpack_adaptive_prefetch(src, b);
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            __m256i x0 = _mm256_loadu_si256((const __m256i *)(x + k * 64));
            __m256i x1 = _mm256_loadu_si256((const __m256i *)(x + k * 64 + 32));
            if (b == 8) {
                __m256i q0 = stripe(src, 64, k, b), q1 = stripe(src + 32, 64, k, b);
#define WIDE(q, xv, h)                                                                        \
    _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, h)),                   \
                      _mm256_cvtepi8_epi16(_mm256_extracti128_si256(xv, h)))
                acc0 = _mm256_add_epi32(acc0, _mm256_add_epi32(WIDE(q0, x0, 0), WIDE(q0, x0, 1)));
                acc1 = _mm256_add_epi32(acc1, _mm256_add_epi32(WIDE(q1, x1, 0), WIDE(q1, x1, 1)));
#undef WIDE
            } else if (k % DOT_PRESUM(b) == 0) {
                /* DOT_PRESUM(b) stripes' pair sums added in int16 lanes
                 * before one pmaddwd: exact (no lane passes 2^15), so the
                 * same int32 sums with fewer widening steps */
                __m256i p0 = _mm256_maddubs_epi16(code(src, 64, k, b), x0);
                __m256i p1 = _mm256_maddubs_epi16(code(src + 32, 64, k, b), x1);
                for (int j = 1; j < DOT_PRESUM(b); j++) {
                    const int8_t *xj = x + (k + j) * 64;
                    p0 = _mm256_add_epi16(
                        p0, _mm256_maddubs_epi16(code(src, 64, k + j, b),
                                                 _mm256_loadu_si256((const __m256i *)xj)));
                    p1 = _mm256_add_epi16(
                        p1, _mm256_maddubs_epi16(code(src + 32, 64, k + j, b),
                                                 _mm256_loadu_si256((const __m256i *)(xj + 32))));
                }
                acc0 = _mm256_add_epi32(acc0, _mm256_madd_epi16(p0, ones));
                acc1 = _mm256_add_epi32(acc1, _mm256_madd_epi16(p1, ones));
            }
        }
    }
    uint32_t t = cols - full * 512;
    int32_t xsum = a->xsum_full;
    if (t && b != 8 && a->overread) {
        /* The tail group (S < 64 bytes per block) straight from the row: a
         * 32-byte load may run past the stripe (at most 32 bytes past the
         * row, which the caller allows); those lanes are masked off through
         * x, and x's tail comes zero-padded, so the padding weights add 0. */
        const uint32_t S = (t + 7) / 8;
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++)
            for (uint32_t c = 0; c < S; c += 32) {
                uint32_t n = S - c < 32 ? S - c : 32;
                __m256i m = _mm256_loadu_si256((const __m256i *)(tail_mask + 32 - n));
                __m256i xv = _mm256_and_si256(
                    _mm256_loadu_si256((const __m256i *)(a->xtail + k * S + c)), m);
                __m256i p = _mm256_maddubs_epi16(code(src + c, S, k, b), xv);
                acc0 = _mm256_add_epi32(acc0, _mm256_madd_epi16(p, ones));
            }
        xsum = a->xsum_all;
        t = 0;
    }
    uint32_t s = (uint32_t)hsum8(_mm256_add_epi32(acc0, acc1));
    if (b != 8)
        s -= (uint32_t)UNPACK_DOT_OFF(b) * (uint32_t)xsum;
    if (t) {
        int8_t q[FORMAT_PACKED_GROUP];
        adaptive_row_b(src, t, q, b, 0);
        s += (uint32_t)unpack_dot_i8(q, x, t);
    }
    return (int32_t)s;
}

#define DEFINE_DOT(B)                                                                         \
    static int32_t adaptive_dot_##B(const uint8_t *src, uint32_t cols, const int8_t *x,       \
                                    const struct unpack_dot_args *a)                          \
    {                                                                                         \
        return adaptive_dot_b(src, cols, x, a, (B));                                          \
    }
DEFINE_DOT(1)
DEFINE_DOT(2)
DEFINE_DOT(3)
DEFINE_DOT(4)
DEFINE_DOT(5)
DEFINE_DOT(6)
DEFINE_DOT(7)
DEFINE_DOT(8)

typedef int32_t dot_b_fn(const uint8_t *, uint32_t, const int8_t *,
                         const struct unpack_dot_args *);

static dot_b_fn *const adaptive_dots[9] = {
    NULL,           adaptive_dot_1, adaptive_dot_2, adaptive_dot_3, adaptive_dot_4,
    adaptive_dot_5, adaptive_dot_6, adaptive_dot_7, adaptive_dot_8,
};

static int32_t adaptive_dot(const uint8_t *src, uint32_t cols, uint32_t b, const int8_t *x,
                            const struct unpack_dot_args *a)
{
    return adaptive_dots[b](src, cols, x, a);
}

/* ---- int4int8 (padded baseline) ------------------------------------------------------ */

AI void int4int8_row_nt(const uint8_t *src, uint32_t cols, uint32_t b, int8_t *dst,
                        const int nt)
{
    uint32_t j = 0;
    if (b > 4) {
        const __m256i lo = _mm256_set1_epi8(-127);
        for (; j + 128 <= cols; j += 128) {
#pragma GCC unroll 2
            for (int i = 0; i < 2; i++)
                _mm_prefetch((const char *)src + j + UNPACK_PREFETCH_INT4INT8 + 64 * i,
                             _MM_HINT_T0);
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++)
                store(dst + j + 32 * i,
                      _mm256_max_epi8(_mm256_loadu_si256((const __m256i *)(src + j + 32 * i)), lo),
                      nt);
        }
        for (; j + 32 <= cols; j += 32)
            store(dst + j, _mm256_max_epi8(_mm256_loadu_si256((const __m256i *)(src + j)), lo), nt);
    } else {
        const __m256i m = _mm256_set1_epi8(0x0f), eight = _mm256_set1_epi8(8);
        const __m256i lo7 = _mm256_set1_epi8(-7);
        for (; j + 64 <= cols; j += 64) {
            if ((j & 127) == 0) /* one 64-byte line per 128 weights */
                _mm_prefetch((const char *)src + (j + UNPACK_PREFETCH_INT4INT8) / 2, _MM_HINT_T0);
            __m256i v = _mm256_loadu_si256((const __m256i *)(src + j / 2));
            __m256i l = _mm256_and_si256(v, m);
            __m256i h = _mm256_and_si256(_mm256_srli_epi16(v, 4), m);
            l = _mm256_max_epi8(_mm256_sub_epi8(_mm256_xor_si256(l, eight), eight), lo7);
            h = _mm256_max_epi8(_mm256_sub_epi8(_mm256_xor_si256(h, eight), eight), lo7);
            __m256i a = _mm256_unpacklo_epi8(l, h), c = _mm256_unpackhi_epi8(l, h);
            store(dst + j, _mm256_permute2x128_si256(a, c, 0x20), nt);
            store(dst + j + 32, _mm256_permute2x128_si256(a, c, 0x31), nt);
        }
    }
    unpack_int4int8_tail_scalar(src, cols, b, j, dst);
}

static void int4int8_row(const uint8_t *src, uint32_t cols, uint32_t b, int8_t *dst, int stream)
{
    if (stream)
        int4int8_row_nt(src, cols, b, dst, 1);
    else
        int4int8_row_nt(src, cols, b, dst, 0);
}

/* ---- bitplane (K-quant-like baseline) -------------------------------------------------
 * 32 weights at a time, each plane spread to one weightlet per byte as
 * llama.cpp's AVX2 K-quant code does: a 1-bit plane by replicating each byte
 * 8 times (vpshufb) and testing one bit per byte (the bytes_from_bits_32
 * idiom; the 0/-1 result is subtracted under the code), 2- and 4-bit planes
 * by zero extension and shifted copies. */
AI __m256i spread(const uint8_t *p, const int w)
{
    if (w == 1) {
        uint32_t m;
        memcpy(&m, p, 4);
        const __m256i idx = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2,
                                             2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
        const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
        __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)m), idx);
        return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit); /* -1 where set */
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

/* The 32 int8 weights [j, j + 32) of a bitplane row. */
AI void bitplane_32(const uint8_t *src, size_t padded, uint32_t j, int8_t *dst, const uint32_t b,
                    const int nt)
{
    __m256i u = _mm256_setzero_si256();
    const uint8_t *plane = src;
#pragma GCC unroll 4
    for (int p = 0; p < 3; p++) {
        const int w = planes[b][p];
        if (!w)
            break;
        __m256i s = spread(plane + (size_t)j * w / 8, w);
        if (w == 1) /* the last plane: u = 2u + bit, with bit as 0 / -1 */
            u = _mm256_sub_epi8(_mm256_add_epi8(u, u), s);
        else
            u = p ? _mm256_or_si256(_mm256_slli_epi16(u, w), s) : s;
        plane += padded * w / 8;
    }
    if (b == 1)
        u = _mm256_sub_epi8(_mm256_add_epi8(u, u), _mm256_set1_epi8(1));
    else
        u = _mm256_sub_epi8(_mm256_min_epu8(u, _mm256_set1_epi8((char)((1u << b) - 2))),
                            _mm256_set1_epi8((char)((1 << (b - 1)) - 1)));
    store(dst + j, u, nt);
}

AI void bitplane_row_b(const uint8_t *src, uint32_t cols, int8_t *dst, const uint32_t b,
                      const int nt)
{
    const size_t padded = (size_t)sl_align_up(cols, 8);
    uint32_t j = 0;
    for (; j + 512 <= cols; j += 512) {
        unpack_bitplane_prefetch(src, padded, j, planes[b]);
#pragma GCC unroll 16
        for (uint32_t i = 0; i < 512; i += 32)
            bitplane_32(src, padded, j + i, dst, b, nt);
    }
    for (; j + 32 <= cols; j += 32)
        bitplane_32(src, padded, j, dst, b, nt);
    unpack_bitplane_tail_scalar(src, cols, b, j, dst);
}

#define DEFINE_BITPLANE(B)                                                                   \
    static void bitplane_row_##B(const uint8_t *src, uint32_t cols, int8_t *dst)             \
    {                                                                                        \
        bitplane_row_b(src, cols, dst, (B), 0);                                              \
    }                                                                                        \
    static void bitplane_row_nt_##B(const uint8_t *src, uint32_t cols, int8_t *dst)          \
    {                                                                                        \
        bitplane_row_b(src, cols, dst, (B), 1);                                              \
    }
DEFINE_BITPLANE(1)
DEFINE_BITPLANE(2)
DEFINE_BITPLANE(3)
DEFINE_BITPLANE(4)
DEFINE_BITPLANE(5)
DEFINE_BITPLANE(6)
DEFINE_BITPLANE(7)
DEFINE_BITPLANE(8)

static row_b_fn *const bitplane_rows[2][9] = {
    {NULL, bitplane_row_1, bitplane_row_2, bitplane_row_3, bitplane_row_4, bitplane_row_5,
     bitplane_row_6, bitplane_row_7, bitplane_row_8},
    {NULL, bitplane_row_nt_1, bitplane_row_nt_2, bitplane_row_nt_3, bitplane_row_nt_4,
     bitplane_row_nt_5, bitplane_row_nt_6, bitplane_row_nt_7, bitplane_row_nt_8},
};

static void bitplane_row(const uint8_t *src, uint32_t cols, uint32_t b, int8_t *dst, int stream)
{
    bitplane_rows[stream != 0][b](src, cols, dst);
}

/* ---- row sums: (q ^ 0x80) = q + 128 unsigned; vpsadbw adds 8 bytes per lane ---------- */
static int32_t sum(const int8_t *q, uint32_t n)
{
    __m256i acc = _mm256_setzero_si256();
    const __m256i flip = _mm256_set1_epi8((char)0x80), z = _mm256_setzero_si256();
    uint32_t i = 0;
    for (; i + 32 <= n; i += 32)
        acc = _mm256_add_epi64(
            acc, _mm256_sad_epu8(
                     _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(q + i)), flip), z));
    __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
    int64_t s = _mm_cvtsi128_si64(s2) + _mm_extract_epi64(s2, 1) - 128 * (int64_t)i;
    for (; i < n; i++)
        s += q[i];
    return (int32_t)s;
}

const struct unpack_kernels unpack_kernels_avx2 = {
    adaptive_row, int4int8_row, bitplane_row, sum, adaptive_dot, unpack_mult_avx2,
    unpack_adaptive_mult_avx2, unpack_adaptive_mult_raw_avx2};

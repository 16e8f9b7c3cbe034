/* unpack_avx512.c: AVX-512 (F+BW) unpackers, bit-exact with unpack_scalar.c.
 *
 * Adaptive (EdgeFlow 4.2): with R = 512 a block is 64 bytes, one zmm, and
 * byte i of a block belongs to weight i of each of its stripes, so per stripe
 * one load, one shift and one AND per weightlet plane, an OR, and the code to
 * int8 conversion give 64 consecutive int8 weights. Each plane's field is
 * shifted straight to its place in the code (no shift of the partial code).
 * x86 has no 8-bit shifts: 16-bit shifts are used, and the per-byte AND
 * drops the bits that crossed over from the neighbouring byte (the field
 * and the crossed bits never overlap: see field()). Kernels are specialized
 * per width (all shifts and masks immediates); the tail group of a row
 * whose length is not a multiple of 512 uses the same code with byte-masked
 * loads and stores. */
#include <assert.h>
#include <immintrin.h>
#include <string.h>

#include "unpack_avx512_inl.h"
#include "unpack_internal.h"

/* The int8 weights of stripe k (the codes less their offset). */
AI __m512i stripe(const uint8_t *src, const size_t S, const int k, const uint32_t b,
                  const int masked, const __mmask64 lm)
{
    return _mm512_sub_epi8(code(src, S, k, b, masked, lm),
                           _mm512_set1_epi8((char)UNPACK_DOT_OFF(b)));
}

/* A full-vector store; non-temporal (dst 64-byte aligned) when streaming. */
AI void store(int8_t *dst, __m512i v, const int nt)
{
    if (nt)
        _mm512_stream_si512((void *)dst, v);
    else
        _mm512_storeu_si512(dst, v);
}

AI void adaptive_row_b(const uint8_t *src, uint32_t cols, int8_t *dst, const uint32_t b,
                      const int nt)
{
    uint32_t full = cols / 512;
    for (uint32_t g = 0; g < full; g++, src += b * 64, dst += 512) {
        unpack_adaptive_prefetch(src, b);
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++)
            store(dst + k * 64, stripe(src, 64, k, b, 0, 0), nt);
    }
    uint32_t t = cols - full * 512;
    if (t) { /* tail group: 8 stripes of S = round_up(t, 8) / 8 < 64 bytes */
        uint32_t S = (t + 7) / 8; /* 1..64 */
        __mmask64 lm = first_bytes(S);
        for (int k = 0; k < 8; k++) {
            uint32_t n = t > k * S ? t - k * S : 0; /* valid weights of stripe k */
            _mm512_mask_storeu_epi8(dst + k * S, first_bytes(n < S ? n : S),
                                    stripe(src, S, k, b, 1, lm));
        }
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

/* ---- dot products straight from the packed row (decode) -------------------------------
 * Per 64 weights: the unsigned codes (code()) times x with vpdpbusd (u8 x
 * s8, four products added into each int32 lane, wrapping, no saturation:
 * exact modulo 2^32), the offset removed once per row with xsum_all; the
 * tail group the same way with byte-masked loads. Compiled for VNNI, which
 * the dispatch (unpack.c) checks. */
#define VNNI __attribute__((target("avx512vnni"))) /* gcc and clang alike */
AI VNNI int32_t adaptive_dot_b(const uint8_t *src, uint32_t cols, const int8_t *x,
                               const struct unpack_dot_args *a, const uint32_t b, const int far)
{
    const uint32_t full = cols / 512;
    __m512i acc0 = _mm512_setzero_si512(), acc1 = _mm512_setzero_si512();
    for (uint32_t g = 0; g < full; g++, src += b * 64, x += 512) {
        unpack_adaptive_prefetch(src, b);
        if (far)
            unpack_adaptive_prefetch_far(src, b);
#pragma GCC unroll 8
        for (int k = 0; k < 8; k += 2) {
            acc0 = _mm512_dpbusd_epi32(acc0, code(src, 64, k, b, 0, 0),
                                       _mm512_loadu_si512(x + k * 64));
            acc1 = _mm512_dpbusd_epi32(acc1, code(src, 64, k + 1, b, 0, 0),
                                       _mm512_loadu_si512(x + k * 64 + 64));
        }
    }
    uint32_t t = cols - full * 512;
    if (t) { /* the tail group: byte-masked loads of the row and of x's valid weights */
        const uint32_t S = (t + 7) / 8;
        const __mmask64 lm = first_bytes(S);
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            uint32_t n = t > k * S ? t - k * S : 0;
            __m512i xv = _mm512_maskz_loadu_epi8(first_bytes(n < S ? n : S), x + k * S);
            acc0 = _mm512_dpbusd_epi32(acc0, code(src, S, k, b, 1, lm), xv);
        }
    }
    uint32_t s = (uint32_t)_mm512_reduce_add_epi32(_mm512_add_epi32(acc0, acc1));
    return (int32_t)(s - (uint32_t)UNPACK_DOT_OFF(b) * (uint32_t)a->xsum_all);
}

#define DEFINE_DOT(B)                                                                              \
    static VNNI int32_t adaptive_dot_##B(const uint8_t *src, uint32_t cols, const int8_t *x,       \
                                         const struct unpack_dot_args *a)                          \
    {                                                                                              \
        return adaptive_dot_b(src, cols, x, a, (B), 1);                                            \
    }                                                                                              \
    static VNNI int32_t adaptive_dot_near_##B(const uint8_t *src, uint32_t cols, const int8_t *x,  \
                                              const struct unpack_dot_args *a)                     \
    {                                                                                              \
        return adaptive_dot_b(src, cols, x, a, (B), 0);                                            \
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

/* [0]: the near prefetch only; [1]: with the far one (unpack_dot_far_prefetch) */
static dot_b_fn *const adaptive_dots[2][9] = {
    {NULL, adaptive_dot_near_1, adaptive_dot_near_2, adaptive_dot_near_3, adaptive_dot_near_4,
     adaptive_dot_near_5, adaptive_dot_near_6, adaptive_dot_near_7, adaptive_dot_near_8},
    {NULL, adaptive_dot_1, adaptive_dot_2, adaptive_dot_3, adaptive_dot_4, adaptive_dot_5,
     adaptive_dot_6, adaptive_dot_7, adaptive_dot_8},
};

static int32_t adaptive_dot(const uint8_t *src, uint32_t cols, uint32_t b, const int8_t *x,
                            const struct unpack_dot_args *a)
{
    return adaptive_dots[unpack_dot_far_prefetch()][b](src, cols, x, a);
}

/* The lane sums of M = 4, 8 or 16 accumulators into s[0..M), as
 * _mm512_reduce_add_epi32 of each (the same integers modulo 2^32: wrapping
 * adds in another order), by a transposing tree: pairs of accumulators
 * interleaved by 32 then 64 bits and added put four rows' partial sums in
 * every 128-bit lane, then lanes of different vectors are added across.
 * About 3 operations a row instead of 8 (at 2048 inputs the 8-row kernel's
 * reductions were a tenth of its vector operations). */
AI void sums_m(const __m512i *acc, const uint32_t M, uint32_t *s)
{
    __m512i p[8], q[4];
#pragma GCC unroll 8
    for (uint32_t j = 0; j < M / 2; j++) /* lane: rows 2j, 2j+1, 2j, 2j+1 */
        p[j] = _mm512_add_epi32(_mm512_unpacklo_epi32(acc[2 * j], acc[2 * j + 1]),
                                _mm512_unpackhi_epi32(acc[2 * j], acc[2 * j + 1]));
#pragma GCC unroll 4
    for (uint32_t j = 0; j < M / 4; j++) /* lane: rows 4j .. 4j+3 */
        q[j] = _mm512_add_epi32(_mm512_unpacklo_epi64(p[2 * j], p[2 * j + 1]),
                                _mm512_unpackhi_epi64(p[2 * j], p[2 * j + 1]));
    if (M == 4) {
        __m256i h = _mm256_add_epi32(_mm512_castsi512_si256(q[0]),
                                     _mm512_extracti64x4_epi64(q[0], 1));
        __m128i r = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
        _mm_storeu_si128((__m128i *)s, r);
        return;
    }
    /* lanes [A0 A1 B0 B1] + [A2 A3 B2 B3]: rows 4j..4j+3 of q[j] (A) and of
     * q[j + 1] (B), two partial sums each */
    __m512i t[2];
#pragma GCC unroll 2
    for (uint32_t j = 0; j < M / 8; j++)
        t[j] = _mm512_add_epi32(_mm512_shuffle_i32x4(q[2 * j], q[2 * j + 1], 0x44),
                                _mm512_shuffle_i32x4(q[2 * j], q[2 * j + 1], 0xEE));
    if (M == 8) {
        __m256i r = _mm256_add_epi32(
            _mm512_castsi512_si256(_mm512_shuffle_i32x4(t[0], t[0], 0x08)), /* A0 B0 */
            _mm512_castsi512_si256(_mm512_shuffle_i32x4(t[0], t[0], 0x0D))); /* A1 B1 */
        _mm256_storeu_si256((__m256i *)s, r);
        return;
    }
    /* M = 16: [A0 B0 C0 D0] + [A1 B1 C1 D1] */
    _mm512_storeu_si512(s, _mm512_add_epi32(_mm512_shuffle_i32x4(t[0], t[1], 0x88),
                                            _mm512_shuffle_i32x4(t[0], t[1], 0xDD)));
}

/* The same for M activation rows at once (M = 2, 4, 8 or 16; a draft
 * tree's verification): each stripe's codes are built once and multiplied
 * with every row's activations (M accumulators, one per row), so the row's
 * packed bytes are read and unpacked once for all M rows instead of M
 * times. x: M rows `cols` apart; a[i]: row i's sums; out[i * ldo] = row i's
 * sum, the same integer adaptive_dot gives. */
AI VNNI void adaptive_dot_m_b(const uint8_t *src, uint32_t cols, const int8_t *x,
                              const struct unpack_dot_args *a, int32_t *out, size_t ldo,
                              const uint32_t b, const uint32_t M, const int far)
{
    const uint32_t full = cols / 512;
    __m512i acc[16];
#pragma GCC unroll 16
    for (uint32_t i = 0; i < M; i++)
        acc[i] = _mm512_setzero_si512();
    const int8_t *xg = x;
    for (uint32_t g = 0; g < full; g++, src += b * 64, xg += 512) {
        unpack_adaptive_prefetch(src, b);
        if (far)
            unpack_adaptive_prefetch_far(src, b);
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {
            const __m512i c = code(src, 64, k, b, 0, 0);
#pragma GCC unroll 16
            for (uint32_t i = 0; i < M; i++)
                acc[i] = _mm512_dpbusd_epi32(
                    acc[i], c, _mm512_loadu_si512(xg + (size_t)i * cols + k * 64));
        }
    }
    uint32_t t = cols - full * 512;
    if (t) { /* the tail group, as adaptive_dot_b */
        const uint32_t S = (t + 7) / 8;
        const __mmask64 lm = first_bytes(S);
        for (int k = 0; k < 8; k++) {
            uint32_t n = t > k * S ? t - k * S : 0;
            const __mmask64 xm = first_bytes(n < S ? n : S);
            const __m512i c = code(src, S, k, b, 1, lm);
#pragma GCC unroll 16
            for (uint32_t i = 0; i < M; i++)
                acc[i] = _mm512_dpbusd_epi32(
                    acc[i], c, _mm512_maskz_loadu_epi8(xm, xg + (size_t)i * cols + k * S));
        }
    }
    if (M == 2) {
#pragma GCC unroll 2
        for (uint32_t i = 0; i < M; i++) {
            uint32_t s = (uint32_t)_mm512_reduce_add_epi32(acc[i]);
            out[i * ldo] = (int32_t)(s - (uint32_t)UNPACK_DOT_OFF(b) * (uint32_t)a[i].xsum_all);
        }
        return;
    }
    uint32_t s[16];
    sums_m(acc, M, s);
#pragma GCC unroll 16
    for (uint32_t i = 0; i < M; i++)
        out[i * ldo] = (int32_t)(s[i] - (uint32_t)UNPACK_DOT_OFF(b) * (uint32_t)a[i].xsum_all);
}

#define DEFINE_DOT_M(B, M)                                                                    \
    static VNNI void adaptive_dot_m##M##_##B(const uint8_t *src, uint32_t cols,               \
                                             const int8_t *x, const struct unpack_dot_args *a,  \
                                             int32_t *out, size_t ldo)                          \
    {                                                                                         \
        adaptive_dot_m_b(src, cols, x, a, out, ldo, (B), (M), 1);                             \
    }                                                                                         \
    static VNNI void adaptive_dot_near_m##M##_##B(const uint8_t *src, uint32_t cols,          \
                                                  const int8_t *x,                            \
                                                  const struct unpack_dot_args *a,            \
                                                  int32_t *out, size_t ldo)                   \
    {                                                                                         \
        adaptive_dot_m_b(src, cols, x, a, out, ldo, (B), (M), 0);                             \
    }
#define DEFINE_DOT_MS(B)                                                                      \
    DEFINE_DOT_M(B, 2)                                                                        \
    DEFINE_DOT_M(B, 4)                                                                        \
    DEFINE_DOT_M(B, 8)                                                                        \
    DEFINE_DOT_M(B, 16)
DEFINE_DOT_MS(1)
DEFINE_DOT_MS(2)
DEFINE_DOT_MS(3)
DEFINE_DOT_MS(4)
DEFINE_DOT_MS(5)
DEFINE_DOT_MS(6)
DEFINE_DOT_MS(7)
DEFINE_DOT_MS(8)

typedef void dot_m_fn(const uint8_t *, uint32_t, const int8_t *, const struct unpack_dot_args *,
                      int32_t *, size_t);

/* [0]: the near prefetch only; [1]: with the far one, as adaptive_dots */
#define DOT_MS(P, B)                                                                          \
    {adaptive_dot_##P##m2_##B, adaptive_dot_##P##m4_##B, adaptive_dot_##P##m8_##B,            \
     adaptive_dot_##P##m16_##B}
#define DOT_MS_ALL(P)                                                                         \
    {{NULL}, DOT_MS(P, 1), DOT_MS(P, 2), DOT_MS(P, 3), DOT_MS(P, 4),                          \
     DOT_MS(P, 5), DOT_MS(P, 6), DOT_MS(P, 7), DOT_MS(P, 8)}
static dot_m_fn *const adaptive_dots_m[2][9][4] = {DOT_MS_ALL(near_), DOT_MS_ALL()};

void unpack_adaptive_dot_m_avx512(const uint8_t *src, uint32_t cols, uint32_t b, const int8_t *x,
                                  uint32_t m, const struct unpack_dot_args *a, int32_t *out,
                                  size_t ldo)
{
    assert(m == 2 || m == 4 || m == 8 || m == 16); /* dot_block's blocks */
    int j = m == 2 ? 0 : m == 4 ? 1 : m == 8 ? 2 : 3;
    adaptive_dots_m[unpack_dot_far_prefetch()][b][j](src, cols, x, a, out, ldo);
}

/* ---- int4int8 (padded baseline) ------------------------------------------------------ */

AI void int4int8_row_nt(const uint8_t *src, uint32_t cols, uint32_t b, int8_t *dst,
                        const int nt)
{
    uint32_t j = 0;
    if (b > 4) {
        const __m512i lo = _mm512_set1_epi8(-127);
        for (; j + 256 <= cols; j += 256) {
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                _mm_prefetch((const char *)src + j + UNPACK_PREFETCH_INT4INT8 + 64 * i,
                             _MM_HINT_T0);
                store(dst + j + 64 * i, _mm512_max_epi8(_mm512_loadu_si512(src + j + 64 * i), lo),
                      nt);
            }
        }
        for (; j + 64 <= cols; j += 64)
            store(dst + j, _mm512_max_epi8(_mm512_loadu_si512(src + j), lo), nt);
    } else {
        /* nibbles sign-extended as (x ^ 8) - 8; unpacklo/hi interleave within
         * 128-bit lanes, the permutes put the lanes back in order */
        const __m512i m = _mm512_set1_epi8(0x0f), eight = _mm512_set1_epi8(8);
        const __m512i lo7 = _mm512_set1_epi8(-7);
        const __m512i i0 = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0);
        const __m512i i1 = _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4);
        for (; j + 128 <= cols; j += 128) {
            _mm_prefetch((const char *)src + (j + UNPACK_PREFETCH_INT4INT8) / 2, _MM_HINT_T0);
            __m512i v = _mm512_loadu_si512(src + j / 2);
            __m512i l = _mm512_and_si512(v, m);
            __m512i h = _mm512_and_si512(_mm512_srli_epi16(v, 4), m);
            l = _mm512_max_epi8(_mm512_sub_epi8(_mm512_xor_si512(l, eight), eight), lo7);
            h = _mm512_max_epi8(_mm512_sub_epi8(_mm512_xor_si512(h, eight), eight), lo7);
            __m512i a = _mm512_unpacklo_epi8(l, h), c = _mm512_unpackhi_epi8(l, h);
            store(dst + j, _mm512_permutex2var_epi64(a, i0, c), nt);
            store(dst + j + 64, _mm512_permutex2var_epi64(a, i1, c), nt);
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
 * 64 weights at a time; each plane's weightlets for them are 8w contiguous
 * bytes, spread to one weightlet per byte the way llama.cpp's AVX-512 code
 * expands K-quant planes: a 1-bit plane is a mask register (one masked add
 * puts it under the code), a 4-bit plane is zero-extended bytes to words and
 * a shifted copy, a 2-bit plane bytes to dwords and three shifted copies. */

AI __m512i spread(const uint8_t *p, const int w)
{
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

/* The 64 int8 weights [j, j + 64) of a bitplane row. */
AI void bitplane_64(const uint8_t *src, size_t padded, uint32_t j, int8_t *dst, const uint32_t b,
                    const int nt)
{
    __m512i u = _mm512_setzero_si512();
    const uint8_t *plane = src;
#pragma GCC unroll 4
    for (int p = 0; p < 3; p++) {
        const int w = planes[b][p];
        if (!w)
            break;
        const uint8_t *at = plane + (size_t)j * w / 8;
        if (w == 1) {
            uint64_t m;
            memcpy(&m, at, 8);
            u = _mm512_add_epi8(u, u);
            u = _mm512_mask_add_epi8(u, (__mmask64)m, u, _mm512_set1_epi8(1));
        } else {
            u = p ? _mm512_or_si512(_mm512_slli_epi16(u, (unsigned)w), spread(at, w))
                  : spread(at, w);
        }
        plane += padded * w / 8;
    }
    if (b == 1)
        u = _mm512_sub_epi8(_mm512_add_epi8(u, u), _mm512_set1_epi8(1));
    else
        u = _mm512_sub_epi8(_mm512_min_epu8(u, _mm512_set1_epi8((char)((1u << b) - 2))),
                            _mm512_set1_epi8((char)((1 << (b - 1)) - 1)));
    store(dst + j, u, nt);
}

AI void bitplane_row_b(const uint8_t *src, uint32_t cols, int8_t *dst, const uint32_t b,
                      const int nt)
{
    const size_t padded = (size_t)sl_align_up(cols, 8);
    uint32_t j = 0;
    for (; j + 512 <= cols; j += 512) {
        unpack_bitplane_prefetch(src, padded, j, planes[b]);
#pragma GCC unroll 8
        for (uint32_t i = 0; i < 512; i += 64)
            bitplane_64(src, padded, j + i, dst, b, nt);
    }
    for (; j + 64 <= cols; j += 64)
        bitplane_64(src, padded, j, dst, b, nt);
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

/* ---- row sums (the vpdpbusd correction) -----------------------------------------------
 * (q ^ 0x80) is q + 128 as an unsigned byte; vpsadbw against zero adds
 * eight of them into each 64-bit lane. */
static int32_t sum(const int8_t *q, uint32_t n)
{
    __m512i acc = _mm512_setzero_si512();
    const __m512i flip = _mm512_set1_epi8((char)0x80), z = _mm512_setzero_si512();
    uint32_t i = 0;
    for (; i + 64 <= n; i += 64)
        acc = _mm512_add_epi64(acc, _mm512_sad_epu8(_mm512_xor_si512(_mm512_loadu_si512(q + i),
                                                                     flip),
                                                    z));
    int64_t s = _mm512_reduce_add_epi64(acc) - 128 * (int64_t)i;
    for (; i < n; i++)
        s += q[i];
    return (int32_t)s;
}

/* adaptive_dot needs VNNI: unpack.c hands it out only where the CPU has it */
const struct unpack_kernels unpack_kernels_avx512 = {adaptive_row, int4int8_row, bitplane_row,
                                                     sum, adaptive_dot, unpack_mult_avx2,
                                                     unpack_adaptive_mult_avx2,
                                                     unpack_adaptive_mult_raw_avx2};

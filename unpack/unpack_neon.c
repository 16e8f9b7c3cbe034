/* unpack_neon.c: AArch64 NEON (ASIMD) unpackers, bit-exact with
 * unpack_scalar.c. NEON has byte shifts, so a 16-byte quarter of a 64-byte
 * adaptive block gives 16 consecutive weights of a stripe with one shift
 * (and, unless the field is the top of the byte, one AND) per weightlet plane
 * (EdgeFlow 4.2, R = 512: the paper's 128-bit case is four quarters of our
 * block). Kernels are specialized per width; shifts use USHL with a constant
 * register count (negative = right), hoisted out of the loops. */
#include <arm_neon.h>
#include <string.h>

#include "unpack_internal.h"

#define AI static inline __attribute__((always_inline))

static const uint8_t planes[9][4] = {
    {0}, {1, 0}, {2, 0}, {2, 1, 0}, {4, 0}, {4, 1, 0}, {4, 2, 0}, {4, 2, 1, 0}, {4, 4, 0},
};

/* Bits [sh, sh+w) of every byte moved to [pos, pos+w), the rest zero. */
AI uint8x16_t field(uint8x16_t v, const int sh, const int pos, const int w)
{
    uint8x16_t x = sh != pos ? vshlq_u8(v, vdupq_n_s8((int8_t)(pos - sh))) : v;
    if (sh + w == 8 && pos == 0) /* top of the byte shifted to the bottom: nothing else */
        return x;
    return vandq_u8(x, vdupq_n_u8((uint8_t)(((1 << w) - 1) << pos)));
}

/* 16 int8 weights of stripe k of a group whose blocks start S bytes apart. */
AI int8x16_t stripe(const uint8_t *src, const size_t S, const int k, const uint32_t b)
{
    uint8x16_t u = vdupq_n_u8(0);
    int pos = (int)b + (b == 1);
    const uint8_t *blk = src;
#pragma GCC unroll 4
    for (int p = 0; p < 3; p++) {
        const int w = planes[b][p];
        if (!w)
            break;
        const int per = 8 / w;
        pos -= w;
        uint8x16_t v = vld1q_u8(blk + (size_t)(k / per) * S);
        u = vorrq_u8(u, field(v, 8 - w * (k % per + 1), pos, w));
        blk += (size_t)w * S;
    }
    if (b == 1)
        return vreinterpretq_s8_u8(vsubq_u8(u, vdupq_n_u8(1)));
    u = vminq_u8(u, vdupq_n_u8((uint8_t)((1u << b) - 2)));
    return vreinterpretq_s8_u8(vsubq_u8(u, vdupq_n_u8((uint8_t)((1 << (b - 1)) - 1))));
}

AI void adaptive_row_b(const uint8_t *src, uint32_t cols, int8_t *dst, const uint32_t b)
{
    uint32_t full = cols / 512;
    for (uint32_t g = 0; g < full; g++, src += b * 64, dst += 512) {
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++)
#pragma GCC unroll 4
            for (int c = 0; c < 64; c += 16)
                vst1q_s8(dst + k * 64 + c, stripe(src + c, 64, k, b));
    }
    uint32_t t = cols - full * 512;
    if (t) { /* tail group through padded buffers; see unpack_avx2.c */
        uint32_t S = (t + 7) / 8;
        uint8_t in[8 * 64 + 16];
        int8_t out[8 * 64 + 16];
        memcpy(in, src, (size_t)b * S);
        memset(in + (size_t)b * S, 0, 16);
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++)
            for (uint32_t c = 0; c < S; c += 16)
                vst1q_s8(out + k * S + c, stripe(in + c, S, k, b));
        memcpy(dst, out, t);
    }
}

#define DEFINE_ADAPTIVE(B)                                                                    \
    static void adaptive_row_##B(const uint8_t *src, uint32_t cols, int8_t *dst)             \
    {                                                                                        \
        adaptive_row_b(src, cols, dst, (B));                                                 \
    }
DEFINE_ADAPTIVE(1)
DEFINE_ADAPTIVE(2)
DEFINE_ADAPTIVE(3)
DEFINE_ADAPTIVE(4)
DEFINE_ADAPTIVE(5)
DEFINE_ADAPTIVE(6)
DEFINE_ADAPTIVE(7)
DEFINE_ADAPTIVE(8)

static void (*const adaptive_rows[9])(const uint8_t *, uint32_t, int8_t *) = {
    NULL,           adaptive_row_1, adaptive_row_2, adaptive_row_3, adaptive_row_4,
    adaptive_row_5, adaptive_row_6, adaptive_row_7, adaptive_row_8,
};

static void adaptive_row(const uint8_t *src, uint32_t cols, uint32_t b, int8_t *dst,
                         int stream)
{
    adaptive_rows[b](src, cols, dst);
}

/* ---- block multipliers (header version 2) ------------------------------------------------
 * 16 int8 values times their block's multiplier m in 1..4 with one MUL
 * (|v m| <= 127: the product fits, nothing wraps), a 32-weight block being
 * two quarters. */
static void mult(int8_t *q, uint32_t n, const uint8_t *m)
{
    uint32_t i = 0;
    for (; i + 32 <= n; i += 32) {
        int8x16_t f = vdupq_n_s8((int8_t)m[i / 32]);
        vst1q_s8(q + i, vmulq_s8(vld1q_s8(q + i), f));
        vst1q_s8(q + i + 16, vmulq_s8(vld1q_s8(q + i + 16), f));
    }
    unpack_mult_scalar(q + i, n - i, m + i / 32);
}

/* adaptive_row_b with each quarter stripe multiplied before its store:
 * quarter c of stripe k holds weights 64 k + c .. +15, block 2 k + c / 32. */
AI void adaptive_mult_b(const uint8_t *src, uint32_t cols, int8_t *dst, const uint32_t b,
                        const uint8_t *m)
{
    uint32_t full = cols / 512;
    for (uint32_t g = 0; g < full; g++, src += b * 64, dst += 512, m += 16) {
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++)
#pragma GCC unroll 4
            for (int c = 0; c < 64; c += 16)
                vst1q_s8(dst + k * 64 + c, vmulq_s8(stripe(src + c, 64, k, b),
                                                    vdupq_n_s8((int8_t)m[2 * k + c / 32])));
    }
    uint32_t t = cols - full * 512;
    if (t) { /* the tail group, then its blocks */
        adaptive_row_b(src, t, dst, b);
        unpack_mult_scalar(dst, t, m);
    }
}

#define DEFINE_MULT(B)                                                                        \
    static void adaptive_mult_##B(const uint8_t *src, uint32_t cols, int8_t *dst,            \
                                  const uint8_t *m)                                           \
    {                                                                                        \
        adaptive_mult_b(src, cols, dst, (B), m);                                             \
    }
DEFINE_MULT(1)
DEFINE_MULT(2)
DEFINE_MULT(3)
DEFINE_MULT(4)
DEFINE_MULT(5)
DEFINE_MULT(6)
DEFINE_MULT(7)
DEFINE_MULT(8)

static void adaptive_mult(const uint8_t *src, uint32_t cols, uint32_t b, int8_t *dst, int stream,
                          const uint8_t *m)
{
    static void (*const fns[9])(const uint8_t *, uint32_t, int8_t *, const uint8_t *) = {
        NULL, adaptive_mult_1, adaptive_mult_2, adaptive_mult_3, adaptive_mult_4,
        adaptive_mult_5, adaptive_mult_6, adaptive_mult_7, adaptive_mult_8};
    fns[b](src, cols, dst, m);
}

/* ---- dot products straight from the packed row (decode) -------------------------------
 * Per 16 weights: the int8 weights of a quarter stripe (stripe()) times x,
 * widening multiplies into int16 pairs (at most 2 * 127 * 128 < 2^15) and
 * pairwise widening adds into int32 lanes; the tail group is unpacked and
 * multiplied as bytes. */
AI int32_t adaptive_dot_b(const uint8_t *src, uint32_t cols, const int8_t *x, const uint32_t b)
{
    const uint32_t full = cols / 512;
    int32x4_t acc0 = vdupq_n_s32(0), acc1 = vdupq_n_s32(0);
    for (uint32_t g = 0; g < full; g++, src += b * 64, x += 512) {
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++)
#pragma GCC unroll 4
            for (int c = 0; c < 64; c += 32) {
                int8x16_t q0 = stripe(src + c, 64, k, b), q1 = stripe(src + c + 16, 64, k, b);
                int8x16_t x0 = vld1q_s8(x + k * 64 + c), x1 = vld1q_s8(x + k * 64 + c + 16);
                int16x8_t p0 = vmlal_high_s8(vmull_s8(vget_low_s8(q0), vget_low_s8(x0)), q0, x0);
                int16x8_t p1 = vmlal_high_s8(vmull_s8(vget_low_s8(q1), vget_low_s8(x1)), q1, x1);
                acc0 = vpadalq_s16(acc0, p0);
                acc1 = vpadalq_s16(acc1, p1);
            }
    }
    int32_t s = vaddvq_s32(vaddq_s32(acc0, acc1));
    uint32_t t = cols - full * 512;
    if (t) {
        int8_t q[FORMAT_PACKED_GROUP];
        adaptive_row_b(src, t, q, b);
        s += unpack_dot_i8(q, x, t);
    }
    return s;
}

#define DEFINE_DOT(B)                                                                         \
    static int32_t adaptive_dot_##B(const uint8_t *src, uint32_t cols, const int8_t *x)       \
    {                                                                                         \
        return adaptive_dot_b(src, cols, x, (B));                                             \
    }
DEFINE_DOT(1)
DEFINE_DOT(2)
DEFINE_DOT(3)
DEFINE_DOT(4)
DEFINE_DOT(5)
DEFINE_DOT(6)
DEFINE_DOT(7)
DEFINE_DOT(8)

static int32_t (*const adaptive_dots[9])(const uint8_t *, uint32_t, const int8_t *) = {
    NULL,           adaptive_dot_1, adaptive_dot_2, adaptive_dot_3, adaptive_dot_4,
    adaptive_dot_5, adaptive_dot_6, adaptive_dot_7, adaptive_dot_8,
};

static int32_t adaptive_dot(const uint8_t *src, uint32_t cols, uint32_t b, const int8_t *x,
                            const struct unpack_dot_args *a)
{
    return adaptive_dots[b](src, cols, x);
}

/* ---- int4int8 (padded baseline) ------------------------------------------------------ */

static void int4int8_row(const uint8_t *src, uint32_t cols, uint32_t b, int8_t *dst,
                         int stream)
{
    uint32_t j = 0;
    if (b > 4) {
        for (; j + 16 <= cols; j += 16)
            vst1q_s8(dst + j, vmaxq_s8(vld1q_s8((const int8_t *)src + j), vdupq_n_s8(-127)));
    } else {
        for (; j + 32 <= cols; j += 32) {
            int8x16_t v = vld1q_s8((const int8_t *)src + j / 2);
            /* sign-extend the nibbles: low = (v << 4) >> 4, high = v >> 4 */
            int8x16_t l = vshrq_n_s8(vshlq_n_s8(v, 4), 4);
            int8x16_t hgh = vshrq_n_s8(v, 4);
            l = vmaxq_s8(l, vdupq_n_s8(-7));
            hgh = vmaxq_s8(hgh, vdupq_n_s8(-7));
            int8x16x2_t z = vzipq_s8(l, hgh);
            vst1q_s8(dst + j, z.val[0]);
            vst1q_s8(dst + j + 16, z.val[1]);
        }
    }
    unpack_int4int8_tail_scalar(src, cols, b, j, dst);
}

/* ---- bitplane (K-quant-like baseline) -------------------------------------------------
 * 16 weights at a time, each plane spread to one weightlet per byte with the
 * table lookups and bit tests llama.cpp's NEON K-quant code uses: a 1-bit
 * plane's two bytes duplicated and tested bit by bit (vtst), 2- and 4-bit
 * planes by a byte table lookup (vqtbl1q) and per-byte variable shifts. */
AI uint8x16_t spread(const uint8_t *p, const int w)
{
    if (w == 1) {
        static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
        uint8x16_t v = vcombine_u8(vdup_n_u8(p[0]), vdup_n_u8(p[1]));
        return vandq_u8(vtstq_u8(v, vld1q_u8(bit)), vdupq_n_u8(1));
    }
    if (w == 2) {
        static const uint8_t idx[16] = {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3};
        static const int8_t sh[16] = {0, -2, -4, -6, 0, -2, -4, -6, 0, -2, -4, -6, 0, -2, -4, -6};
        uint32_t x;
        memcpy(&x, p, 4);
        uint8x16_t v = vqtbl1q_u8(vreinterpretq_u8_u32(vdupq_n_u32(x)), vld1q_u8(idx));
        return vandq_u8(vshlq_u8(v, vld1q_s8(sh)), vdupq_n_u8(3));
    }
    static const uint8_t idx4[16] = {0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7};
    static const int8_t sh4[16] = {0, -4, 0, -4, 0, -4, 0, -4, 0, -4, 0, -4, 0, -4, 0, -4};
    uint8x16_t v = vqtbl1q_u8(vcombine_u8(vld1_u8(p), vdup_n_u8(0)), vld1q_u8(idx4));
    return vandq_u8(vshlq_u8(v, vld1q_s8(sh4)), vdupq_n_u8(15));
}

AI void bitplane_row_b(const uint8_t *src, uint32_t cols, int8_t *dst, const uint32_t b)
{
    const size_t padded = (size_t)sl_align_up(cols, 8);
    uint32_t j = 0;
    for (; j + 16 <= cols; j += 16) {
        uint8x16_t u = vdupq_n_u8(0);
        const uint8_t *plane = src;
#pragma GCC unroll 4
        for (int p = 0; p < 3; p++) {
            const int w = planes[b][p];
            if (!w)
                break;
            uint8x16_t s = spread(plane + (size_t)j * w / 8, w);
            u = p ? vorrq_u8(vshlq_u8(u, vdupq_n_s8((int8_t)w)), s) : s;
            plane += padded * w / 8;
        }
        int8x16_t q;
        if (b == 1)
            q = vreinterpretq_s8_u8(vsubq_u8(vaddq_u8(u, u), vdupq_n_u8(1)));
        else
            q = vreinterpretq_s8_u8(vsubq_u8(vminq_u8(u, vdupq_n_u8((uint8_t)((1u << b) - 2))),
                                             vdupq_n_u8((uint8_t)((1 << (b - 1)) - 1))));
        vst1q_s8(dst + j, q);
    }
    unpack_bitplane_tail_scalar(src, cols, b, j, dst);
}

#define DEFINE_BITPLANE(B)                                                                   \
    static void bitplane_row_##B(const uint8_t *src, uint32_t cols, int8_t *dst)             \
    {                                                                                        \
        bitplane_row_b(src, cols, dst, (B));                                                 \
    }
DEFINE_BITPLANE(1)
DEFINE_BITPLANE(2)
DEFINE_BITPLANE(3)
DEFINE_BITPLANE(4)
DEFINE_BITPLANE(5)
DEFINE_BITPLANE(6)
DEFINE_BITPLANE(7)
DEFINE_BITPLANE(8)

static void (*const bitplane_rows[9])(const uint8_t *, uint32_t, int8_t *) = {
    NULL,           bitplane_row_1, bitplane_row_2, bitplane_row_3, bitplane_row_4,
    bitplane_row_5, bitplane_row_6, bitplane_row_7, bitplane_row_8,
};

static void bitplane_row(const uint8_t *src, uint32_t cols, uint32_t b, int8_t *dst,
                         int stream)
{
    bitplane_rows[b](src, cols, dst);
}

/* ---- row sums: pairwise widening adds into int32 lanes ------------------------------- */
static int32_t sum(const int8_t *q, uint32_t n)
{
    int32x4_t acc = vdupq_n_s32(0);
    uint32_t i = 0;
    for (; i + 16 <= n; i += 16)
        acc = vpadalq_s16(acc, vpaddlq_s8(vld1q_s8(q + i)));
    int32_t s = vaddvq_s32(acc);
    for (; i < n; i++)
        s += q[i];
    return s;
}

const struct unpack_kernels unpack_kernels_neon = {adaptive_row, int4int8_row, bitplane_row, sum,
                                                   adaptive_dot, mult, adaptive_mult, NULL};

/* unpack_neon.c: AArch64 NEON unpackers, bit-exact with unpack_scalar.c.
 * NEON has byte shifts, so a 16-byte quarter of a 64-byte adaptive block
 * gives 16 consecutive weights per stripe with one shift and one AND per
 * plane (EdgeFlow 4.2). Shifts use vshlq_u8 with a register count (negative
 * = right), which needs no compile-time immediates. */
#include <arm_neon.h>
#include <string.h>

#include "unpack_internal.h"

#define AI static inline __attribute__((always_inline))

static const uint8_t planes[9][4] = {
    {0}, {1, 0}, {2, 0}, {2, 1, 0}, {4, 0}, {4, 1, 0}, {4, 2, 0}, {4, 2, 1, 0}, {4, 4, 0},
};

AI int8x16_t finish(uint8x16_t u, const uint32_t b)
{
    if (b == 1)
        return vreinterpretq_s8_u8(vsubq_u8(vaddq_u8(u, u), vdupq_n_u8(1)));
    u = vminq_u8(u, vdupq_n_u8((uint8_t)((1u << b) - 2)));
    return vreinterpretq_s8_u8(vsubq_u8(u, vdupq_n_u8((uint8_t)((1 << (b - 1)) - 1))));
}

AI uint8x16_t shr(uint8x16_t v, int n)
{
    return vshlq_u8(v, vdupq_n_s8((int8_t)-n));
}

AI uint8x16_t shl(uint8x16_t v, int n)
{
    return vshlq_u8(v, vdupq_n_s8((int8_t)n));
}

AI void adaptive_group(const uint8_t *src, int8_t *dst, const uint32_t b)
{
    for (int h = 0; h < 4; h++) {
        for (int k = 0; k < 8; k++) {
            uint8x16_t u = vdupq_n_u8(0);
            const uint8_t *blk = src + h * 16;
            for (int p = 0; p < 3; p++) {
                const int w = planes[b][p];
                if (!w)
                    break;
                const int per = 8 / w;
                uint8x16_t v = vld1q_u8(blk + (k / per) * 64);
                uint8x16_t bits =
                    vandq_u8(shr(v, 8 - w * (k % per + 1)), vdupq_n_u8((uint8_t)((1 << w) - 1)));
                u = vorrq_u8(shl(u, w), bits);
                blk += w * 64;
            }
            vst1q_s8(dst + k * 64 + h * 16, finish(u, b));
        }
    }
}

static void adaptive_row(const uint8_t *src, uint32_t cols, uint32_t b, int8_t *dst)
{
    uint32_t full = cols / 512;
    for (uint32_t g = 0; g < full; g++)
        adaptive_group(src + (size_t)g * b * 64, dst + (size_t)g * 512, b);
    uint32_t t = cols - full * 512;
    if (t)
        unpack_adaptive_group_scalar(src + (size_t)full * b * 64, (uint32_t)sl_align_up(t, 8), t,
                                     b, dst + (size_t)full * 512);
}

static void int4int8_row(const uint8_t *src, uint32_t cols, uint32_t b, int8_t *dst)
{
    uint32_t j = 0;
    if (b > 4) {
        for (; j + 16 <= cols; j += 16)
            vst1q_s8(dst + j, vmaxq_s8(vld1q_s8((const int8_t *)src + j), vdupq_n_s8(-127)));
    } else {
        for (; j + 32 <= cols; j += 32) {
            int8x16_t v = vld1q_s8((const int8_t *)src + j / 2);
            /* sign-extend the nibbles with shifts: low = (v << 4) >> 4, high = v >> 4 */
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

/* 16 weights of one bitplane plane, one per byte. */
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
        uint8_t tmp[16] = {0};
        memcpy(tmp, p, 4);
        uint8x16_t v = vqtbl1q_u8(vld1q_u8(tmp), vld1q_u8(idx));
        return vandq_u8(vshlq_u8(v, vld1q_s8(sh)), vdupq_n_u8(3));
    }
    static const uint8_t idx4[16] = {0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7};
    static const int8_t sh4[16] = {0, -4, 0, -4, 0, -4, 0, -4, 0, -4, 0, -4, 0, -4, 0, -4};
    uint8_t tmp[16] = {0};
    memcpy(tmp, p, 8);
    uint8x16_t v = vqtbl1q_u8(vld1q_u8(tmp), vld1q_u8(idx4));
    return vandq_u8(vshlq_u8(v, vld1q_s8(sh4)), vdupq_n_u8(15));
}

static void bitplane_row(const uint8_t *src, uint32_t cols, uint32_t b, int8_t *dst)
{
    uint32_t padded = (uint32_t)sl_align_up(cols, 8);
    uint32_t j = 0;
    for (; j + 16 <= cols; j += 16) {
        uint8x16_t u = vdupq_n_u8(0);
        const uint8_t *plane = src;
        for (int p = 0; p < 3; p++) {
            const int w = planes[b][p];
            if (!w)
                break;
            u = vorrq_u8(shl(u, w), spread(plane + (size_t)j * w / 8, w));
            plane += (size_t)padded * w / 8;
        }
        vst1q_s8(dst + j, finish(u, b));
    }
    unpack_bitplane_tail_scalar(src, cols, b, j, dst);
}

const struct unpack_kernels unpack_kernels_neon = {adaptive_row, int4int8_row, bitplane_row};

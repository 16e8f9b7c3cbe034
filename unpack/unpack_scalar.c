/* unpack_scalar.c: the reference unpackers; the specification of every
 * packed layout (docs/FORMAT-packed.md). */
#include <string.h>

#include "unpack_internal.h"

const uint8_t unpack_planes[9][4] = {
    {0}, {1, 0}, {2, 0}, {2, 1, 0}, {4, 0}, {4, 1, 0}, {4, 2, 0}, {4, 2, 1, 0}, {4, 4, 0},
};

/* EdgeFlow 4.2: a group of rg weights is b blocks of S = rg/8 bytes; a w-bit
 * plane takes w blocks; byte i of its block j holds, for each of the 8/w
 * stripes l of that block, the w bits of weight (j*8/w + l)*S + i at bit
 * offset 8 - w(l+1). The code is the planes' bits concatenated, first plane
 * most significant. */
void unpack_adaptive_group_scalar(const uint8_t *src, uint32_t rg, uint32_t valid, uint32_t b,
                                  int8_t *dst)
{
    uint32_t S = rg / 8;
    for (uint32_t j = 0; j < valid; j++) {
        uint32_t k = j / S, i = j % S; /* stripe, byte within the block */
        uint32_t u = 0;
        const uint8_t *blk = src;
        for (const uint8_t *w = unpack_planes[b]; *w; w++) {
            uint32_t per = 8 / *w;
            uint8_t byte = blk[(k / per) * S + i];
            uint32_t bits = (byte >> (8 - *w * (k % per + 1))) & ((1u << *w) - 1);
            u = (u << *w) | bits;
            blk += (size_t)*w * S;
        }
        dst[j] = unpack_code_value(u, b);
    }
}

static void adaptive_row(const uint8_t *src, uint32_t cols, uint32_t b, int8_t *dst)
{
    const uint32_t R = FORMAT_PACKED_GROUP;
    for (uint32_t g0 = 0; g0 < cols; g0 += R) {
        uint32_t valid = cols - g0 >= R ? R : cols - g0;
        uint32_t rg = (uint32_t)sl_align_up(valid, 8);
        unpack_adaptive_group_scalar(src, rg, valid, b, dst + g0);
        src += (size_t)b * (rg / 8);
    }
}

/* Bitplane: plane after plane, weight j's w bits at bit j*w of the plane. */
void unpack_bitplane_tail_scalar(const uint8_t *src, uint32_t cols, uint32_t b, uint32_t j0,
                                 int8_t *dst)
{
    uint32_t padded = (uint32_t)sl_align_up(cols, 8);
    for (uint32_t j = j0; j < cols; j++) {
        uint32_t u = 0;
        const uint8_t *plane = src;
        for (const uint8_t *w = unpack_planes[b]; *w; w++) {
            uint32_t bit = j * *w;
            u = (u << *w) | ((plane[bit / 8] >> (bit % 8)) & ((1u << *w) - 1));
            plane += padded * *w / 8;
        }
        dst[j] = unpack_code_value(u, b);
    }
}

static void bitplane_row(const uint8_t *src, uint32_t cols, uint32_t b, int8_t *dst)
{
    unpack_bitplane_tail_scalar(src, cols, b, 0, dst);
}

/* Int4int8: b <= 4: two's complement nibbles, weight 2i low; clamped to
 * [-7, 7]. b > 4: int8, clamped to [-127, 127]. */
void unpack_int4int8_tail_scalar(const uint8_t *src, uint32_t cols, uint32_t b, uint32_t j0,
                                 int8_t *dst)
{
    for (uint32_t j = j0; j < cols; j++) {
        int v;
        if (b <= 4) {
            v = (src[j / 2] >> (4 * (j % 2))) & 0xf;
            v = v >= 8 ? v - 16 : v;
            v = v < -7 ? -7 : v;
        } else {
            v = (int8_t)src[j];
            v = v < -127 ? -127 : v;
        }
        dst[j] = (int8_t)v;
    }
}

static void int4int8_row(const uint8_t *src, uint32_t cols, uint32_t b, int8_t *dst)
{
    unpack_int4int8_tail_scalar(src, cols, b, 0, dst);
}

const struct unpack_kernels unpack_kernels_scalar = {adaptive_row, int4int8_row, bitplane_row};

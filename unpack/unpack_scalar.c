/* unpack_scalar.c: the reference unpackers, and so the specification of the
 * code layout of every packed encoding (docs/FORMAT-packed.md). Written for
 * clarity over speed; the SIMD kernels must agree with them bit for bit. */
#include <string.h>

#include "unpack_internal.h"

const uint8_t unpack_planes[9][4] = {
    {0}, {1, 0}, {2, 0}, {2, 1, 0}, {4, 0}, {4, 1, 0}, {4, 2, 0}, {4, 2, 1, 0}, {4, 4, 0},
};

/* ---- adaptive (EdgeFlow 4.2) ----------------------------------------------------------
 * A group of 8S weights (S = R/8 = 64 for a full group, round_up(t, 8)/8 for
 * the tail group of t weights) is b blocks of S bytes. Stripe k is weights
 * [kS, (k+1)S). A w-bit weightlet plane takes w consecutive blocks; block j
 * of the plane holds the 8/w stripes k = j(8/w) + l, l = 0..8/w-1, and its
 * byte i holds the w bits of weight kS + i at bit offset 8 - w(l+1) (stripe
 * l = 0 in the top bits): the stripes are interleaved with stride 8/w. The
 * code is the planes' weightlets concatenated, first plane most significant. */
static void adaptive_group(const uint8_t *src, uint32_t S, uint32_t valid, uint32_t b,
                           int8_t *dst)
{
    uint8_t u[FORMAT_PACKED_GROUP] = {0}; /* codes of the group's 8S weights */
    const uint8_t *blk = src;
    for (const uint8_t *pw = unpack_planes[b]; *pw; pw++) {
        uint32_t w = *pw, per = 8 / w, mask = (1u << w) - 1;
        for (uint32_t j = 0; j < w; j++, blk += S) {
            for (uint32_t l = 0; l < per; l++) {
                uint32_t k = j * per + l, shift = 8 - w * (l + 1);
                for (uint32_t i = 0; i < S; i++)
                    u[k * S + i] = (uint8_t)((u[k * S + i] << w) | ((blk[i] >> shift) & mask));
            }
        }
    }
    for (uint32_t j = 0; j < valid; j++)
        dst[j] = unpack_code_value(u[j], b);
}

static void adaptive_row(const uint8_t *src, uint32_t cols, uint32_t b, int8_t *dst,
                         int stream)
{
    const uint32_t R = FORMAT_PACKED_GROUP;
    for (uint32_t g0 = 0; g0 < cols; g0 += R) {
        uint32_t valid = cols - g0 >= R ? R : cols - g0;
        uint32_t S = (uint32_t)sl_align_up(valid, 8) / 8;
        adaptive_group(src, S, valid, b, dst + g0);
        src += (size_t)b * S;
    }
}

/* ---- bitplane (K-quant-like baseline) -------------------------------------------------
 * The planes one after the other, each over round_up(cols, 8) weights
 * (round_up(cols, 8) * w / 8 bytes); in a w-bit plane weight j's weightlet is
 * at bit offset (j*w) % 8 of byte (j*w) / 8, least significant first. */
void unpack_bitplane_tail_scalar(const uint8_t *src, uint32_t cols, uint32_t b, uint32_t j0,
                                 int8_t *dst)
{
    uint64_t padded = sl_align_up(cols, 8);
    for (uint32_t j = j0; j < cols; j++) {
        uint32_t u = 0;
        const uint8_t *plane = src;
        for (const uint8_t *pw = unpack_planes[b]; *pw; pw++) {
            uint32_t w = *pw;
            uint64_t bit = (uint64_t)j * w;
            u = (u << w) | ((plane[bit / 8] >> (bit % 8)) & ((1u << w) - 1));
            plane += padded * w / 8;
        }
        dst[j] = unpack_code_value(u, b);
    }
}

static void bitplane_row(const uint8_t *src, uint32_t cols, uint32_t b, int8_t *dst,
                         int stream)
{
    unpack_bitplane_tail_scalar(src, cols, b, 0, dst);
}

/* ---- int4int8 (padded baseline) -------------------------------------------------------
 * b <= 4: 4-bit two's complement nibbles, weight 2i in the low nibble of
 * byte i, decoded as max(v, -7); b >= 5: int8, decoded as max(v, -127). */
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

static void int4int8_row(const uint8_t *src, uint32_t cols, uint32_t b, int8_t *dst,
                         int stream)
{
    unpack_int4int8_tail_scalar(src, cols, b, 0, dst);
}

static int32_t sum(const int8_t *q, uint32_t n)
{
    int32_t s = 0;
    for (uint32_t i = 0; i < n; i++)
        s += q[i];
    return s;
}

/* The dot product of an adaptive row with int8 activations, the
 * specification of every dot kernel: the row's codes (as adaptive_row gives
 * them) times x, summed exactly (64-bit; the result fits an int32 for the
 * rows unpack_tensor_dot accepts). a is not needed here. */
static int32_t adaptive_dot(const uint8_t *src, uint32_t cols, uint32_t b, const int8_t *x,
                            const struct unpack_dot_args *a)
{
    const uint32_t R = FORMAT_PACKED_GROUP;
    int8_t q[FORMAT_PACKED_GROUP];
    int64_t acc = 0;
    for (uint32_t g0 = 0; g0 < cols; g0 += R) {
        uint32_t valid = cols - g0 >= R ? R : cols - g0;
        uint32_t S = (uint32_t)sl_align_up(valid, 8) / 8;
        adaptive_group(src, S, valid, b, q);
        for (uint32_t j = 0; j < valid; j++)
            acc += (int64_t)q[j] * x[g0 + j];
        src += (size_t)b * S;
    }
    return (int32_t)acc;
}

/* ---- block multipliers (header version 2) ----------------------------------------------- */
void unpack_mult_scalar(int8_t *q, uint32_t n, const uint8_t *m)
{
    for (uint32_t i = 0; i < n; i++)
        q[i] = (int8_t)(q[i] * m[i / FORMAT_PACKED_MULT_BLOCK]);
}

const struct unpack_kernels unpack_kernels_scalar = {
    adaptive_row, int4int8_row, bitplane_row, sum, adaptive_dot, unpack_mult_scalar, NULL, NULL};

/* unpack_col.c: one column of a packed tensor (unpack_tensor_col in
 * unpack.h): every row's code at one input channel, decoded element by
 * element from the layouts unpack_scalar.c specifies (docs/FORMAT-packed.md),
 * block multipliers applied as unpack_mult_scalar does. For the shadow
 * outlier term with packed residency, which needs single weight columns
 * where no int8 copy is kept. Scalar: a column is rows elements, each a few
 * byte reads. */
#include <errno.h>

#include "unpack_internal.h"

/* Code of weight c of an adaptive row of `cols` weights and width b: its
 * group (full groups are b * 64 bytes), stripe k and byte i, then each
 * weightlet plane's w bits of block j = k / (8 / w), at bit 8 - w (l + 1)
 * for stripe l = k % (8 / w) of that block. */
static int8_t adaptive_at(const uint8_t *src, uint32_t cols, uint32_t b, uint32_t c)
{
    const uint32_t R = FORMAT_PACKED_GROUP;
    uint32_t g0 = c / R * R, valid = cols - g0 >= R ? R : cols - g0;
    uint32_t S = (uint32_t)sl_align_up(valid, 8) / 8, p = c - g0, k = p / S, i = p % S;
    const uint8_t *blk = src + (size_t)(g0 / R) * b * (R / 8);
    uint32_t u = 0;
    for (const uint8_t *pw = unpack_planes[b]; *pw; pw++) {
        uint32_t w = *pw, per = 8 / w, j = k / per, l = k % per;
        u = (u << w) | ((blk[(size_t)j * S + i] >> (8 - w * (l + 1))) & ((1u << w) - 1));
        blk += (size_t)w * S;
    }
    return unpack_code_value(u, b);
}

/* Bitplane: the planes one after the other over round_up(cols, 8) weights,
 * weight c's weightlet at bit (c w) % 8 of byte (c w) / 8 of each. */
static int8_t bitplane_at(const uint8_t *src, uint32_t cols, uint32_t b, uint32_t c)
{
    uint64_t padded = sl_align_up(cols, 8);
    uint32_t u = 0;
    for (const uint8_t *pw = unpack_planes[b]; *pw; pw++) {
        uint32_t w = *pw;
        uint64_t bit = (uint64_t)c * w;
        u = (u << w) | ((src[bit / 8] >> (bit % 8)) & ((1u << w) - 1));
        src += padded * w / 8;
    }
    return unpack_code_value(u, b);
}

/* int4int8: nibbles (weight 2i low in byte i) at max(v, -7), or int8 at
 * max(v, -127). */
static int8_t int4int8_at(const uint8_t *src, uint32_t b, uint32_t c)
{
    int v;
    if (b <= 4) {
        v = (src[c / 2] >> (4 * (c % 2))) & 0xf;
        v = v >= 8 ? v - 16 : v;
        return (int8_t)(v < -7 ? -7 : v);
    }
    v = (int8_t)src[c];
    return (int8_t)(v < -127 ? -127 : v);
}

int unpack_tensor_col_rows(const struct unpack_tensor *u, uint32_t c, uint32_t r0, uint32_t r1,
                           int8_t *out)
{
    const struct format_packed_layout *lay = &u->layout;
    if (c >= lay->cols || r0 > r1 || r1 > lay->rows)
        return -EINVAL;
    uint32_t nb = format_packed_mult_blocks(lay->cols);
    for (uint32_t r = r0; r < r1; r++) {
        const uint8_t *src = lay->data + u->row_off[r];
        uint32_t b = format_packed_width(lay->widths, r);
        int8_t q;
        switch (lay->encoding) {
        case FORMAT_ENC_ADAPTIVE:
            q = adaptive_at(src, lay->cols, b, c);
            break;
        case FORMAT_ENC_BITPLANE:
            q = bitplane_at(src, lay->cols, b, c);
            break;
        case FORMAT_ENC_INT4INT8:
            q = int4int8_at(src, b, c);
            break;
        default:
            return -EINVAL;
        }
        if (lay->mult) {
            uint32_t m = format_packed_mult(lay->mult, nb, r, c / FORMAT_PACKED_MULT_BLOCK);
            uint32_t mx = format_packed_mult_max(b);
            q = (int8_t)(q * (int)(m < mx ? m : mx));
        }
        out[r] = q;
    }
    return 0;
}

int unpack_tensor_col(const struct unpack_tensor *u, uint32_t c, int8_t *out)
{
    return unpack_tensor_col_rows(u, c, 0, u->layout.rows, out);
}

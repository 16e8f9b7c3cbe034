/* quantizer_pack.c: int8 codes + per-row widths + scales -> the bytes of a
 * packed tensor (docs/FORMAT-packed.md). The unpack module's scalar kernels
 * are the inverse and the specification of the code layout. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quantizer.h"

/* Weightlet widths of a b-bit code, most significant first (EdgeFlow 4.2). */
static const uint8_t planes[9][4] = {
    {0}, {1, 0}, {2, 0}, {2, 1, 0}, {4, 0}, {4, 1, 0}, {4, 2, 0}, {4, 2, 1, 0}, {4, 4, 0},
};

static int in_grid(int q, uint32_t b)
{
    if (b == 1)
        return q == -1 || q == 1;
    int m = (1 << (b - 1)) - 1;
    return q >= -m && q <= m;
}

/* Unsigned code of q under width b. */
static uint32_t code_of(int q, uint32_t b)
{
    if (b == 1)
        return q > 0;
    return (uint32_t)(q + (1 << (b - 1)) - 1);
}

/* Adaptive (EdgeFlow 4.2): groups of R = 512 weights (the tail group
 * round_up(t, 8)), S = group/8 bytes per block; a w-bit plane takes w blocks;
 * byte i of block j of a w-bit plane holds stripes k = j(8/w) + l at bit
 * offset 8 - w(l+1), stripe k being the group's weights [kS, (k+1)S). */
static void pack_row_adaptive(const int8_t *q, uint32_t cols, uint32_t b, uint8_t *out)
{
    const uint32_t R = FORMAT_PACKED_GROUP;
    uint8_t u[FORMAT_PACKED_GROUP];
    for (uint32_t g0 = 0; g0 < cols; g0 += R) {
        uint32_t valid = cols - g0 >= R ? R : cols - g0;
        uint32_t S = (uint32_t)sl_align_up(valid, 8) / 8;
        for (uint32_t j = 0; j < 8 * S; j++) /* codes; padding weights are zero */
            u[j] = j < valid ? (uint8_t)code_of(q[g0 + j], b) : 0;
        uint32_t below = b; /* code bits below the current plane */
        for (const uint8_t *pw = planes[b]; *pw; pw++) {
            uint32_t w = *pw, per = 8 / w, mask = (1u << w) - 1;
            below -= w;
            for (uint32_t blk = 0; blk < w; blk++, out += S)
                for (uint32_t i = 0; i < S; i++) {
                    uint32_t byte = 0;
                    for (uint32_t l = 0; l < per; l++)
                        byte |= ((u[(blk * per + l) * S + i] >> below) & mask) << (8 - w * (l + 1));
                    out[i] = (uint8_t)byte;
                }
        }
    }
}

/* Bitplane: each plane stored sequentially over round_up(cols, 8) weights,
 * weight j's w bits at bit j*w (least significant first). */
static void pack_row_bitplane(const int8_t *q, uint32_t cols, uint32_t b, uint8_t *out)
{
    size_t padded = (size_t)sl_align_up(cols, 8);
    uint32_t below = b;
    for (const uint8_t *pw = planes[b]; *pw; pw++) {
        uint32_t w = *pw, per = 8 / w, mask = (1u << w) - 1;
        below -= w;
        for (size_t byte = 0; byte < padded * w / 8; byte++) {
            uint32_t v = 0;
            for (uint32_t l = 0; l < per; l++) {
                size_t j = byte * per + l;
                if (j < cols)
                    v |= ((code_of(q[j], b) >> below) & mask) << (w * l);
            }
            out[byte] = (uint8_t)v;
        }
        out += padded * w / 8;
    }
}

/* Int4int8: b <= 4 as two's complement nibbles (even weight in the low
 * nibble), otherwise plain int8. */
static void pack_row_int4int8(const int8_t *q, uint32_t cols, uint32_t b, uint8_t *out)
{
    if (b > 4) {
        memcpy(out, q, cols);
        return;
    }
    memset(out, 0, (cols + 1) / 2);
    for (uint32_t j = 0; j < cols; j++)
        out[j / 2] |= (uint8_t)((q[j] & 0xf) << (4 * (j % 2)));
}

int quantizer_pack(uint32_t encoding, const int8_t *q, const uint8_t *widths, const float *scales,
                   uint32_t rows, uint32_t cols, void **out, uint64_t *out_len,
                   struct sl_err *err)
{
    return quantizer_pack_mult(encoding, q, widths, scales, rows, cols, NULL, out, out_len, err);
}

int quantizer_pack_mult(uint32_t encoding, const int8_t *q, const uint8_t *widths,
                        const float *scales, uint32_t rows, uint32_t cols, const uint8_t *mult,
                        void **out, uint64_t *out_len, struct sl_err *err)
{
    uint32_t nb = format_packed_mult_blocks(cols);
    if (mult && encoding != FORMAT_ENC_ADAPTIVE) {
        sl_err_set(err, "pack: block multipliers need the adaptive encoding");
        return -EINVAL;
    }
    for (uint64_t i = 0; mult && i < (uint64_t)rows * nb; i++)
        if (mult[i] < 1 || mult[i] > 4) {
            sl_err_set(err, "pack: multiplier %u of row %" PRIu64 ", block %" PRIu64
                            " (must be 1..4)", mult[i], i / nb, i % nb);
            return -EINVAL;
        }
    const char *magic;
    switch (encoding) {
    case FORMAT_ENC_ADAPTIVE:
        magic = "SLAD";
        break;
    case FORMAT_ENC_INT4INT8:
        magic = "SL48";
        break;
    case FORMAT_ENC_BITPLANE:
        magic = "SLBP";
        break;
    default:
        sl_err_set(err, "pack: encoding %u is not packed", encoding);
        return -EINVAL;
    }
    if (rows == 0 || cols == 0) {
        sl_err_set(err, "pack: empty tensor (%u x %u)", rows, cols);
        return -EINVAL;
    }
    uint64_t data = 0;
    for (uint32_t r = 0; r < rows; r++) {
        if (widths[r] < 1 || widths[r] > 8) {
            sl_err_set(err, "pack: row %u has width %u (1..8)", r, widths[r]);
            return -EINVAL;
        }
        if (!isfinite(scales[r]) || scales[r] < 0) {
            sl_err_set(err, "pack: row %u has scale %g (finite, >= 0)", r, (double)scales[r]);
            return -EINVAL;
        }
        /* branch-free scan of the row (vectorizes); find the culprit only on failure */
        const int8_t *qr = q + (size_t)r * cols;
        int m = widths[r] == 1 ? 1 : (1 << (widths[r] - 1)) - 1, zero_bad = widths[r] == 1;
        int bad = 0;
        for (uint32_t c = 0; c < cols; c++)
            bad |= (qr[c] < -m) | (qr[c] > m) | (zero_bad & (qr[c] == 0));
        for (uint32_t c = 0; bad && c < cols; c++) {
            if (!in_grid(qr[c], widths[r])) {
                sl_err_set(err, "pack: code %d at row %u, column %u is outside the %u-bit grid",
                           qr[c], r, c, widths[r]);
                return -EINVAL;
            }
        }
        data += format_packed_row_bytes(encoding, widths[r], cols);
    }
    uint64_t prefix = format_packed_prefix_bytes_mult(rows, cols, mult != NULL);
    uint8_t *p = calloc(1, prefix + data);
    if (!p) {
        sl_err_set(err, "pack: out of memory (%" PRIu64 " bytes)", prefix + data);
        return -ENOMEM;
    }
    memcpy(p, magic, 4);
    sl_store_le32(p + 4, mult ? 2 : 1);
    sl_store_le32(p + 20, mult ? FORMAT_PACKED_MULT_BLOCK : 0);
    sl_store_le32(p + 8, rows);
    sl_store_le32(p + 12, cols);
    sl_store_le32(p + 16, encoding == FORMAT_ENC_ADAPTIVE ? FORMAT_PACKED_GROUP : 0);
    sl_store_le64(p + 24, data);
    uint8_t *wbits = p + FORMAT_PACKED_HEADER;
    for (uint32_t r = 0; r < rows; r++) {
        uint64_t bit = (uint64_t)r * 3;
        uint32_t v = (uint32_t)(widths[r] - 1) << (bit % 8);
        wbits[bit / 8] |= (uint8_t)v;
        wbits[bit / 8 + 1] |= (uint8_t)(v >> 8);
    }
    uint8_t *sc = p + sl_align_up(FORMAT_PACKED_HEADER + (rows * 3 + 7) / 8 + 1, 64);
    for (uint32_t r = 0; r < rows; r++)
        sl_store_lef32(sc + 4 * r, scales[r]);
    uint8_t *mb = p + format_packed_prefix_bytes(rows); /* 2 bits each, m - 1 */
    for (uint64_t i = 0; mult && i < (uint64_t)rows * nb; i++)
        mb[2 * i / 8] |= (uint8_t)((mult[i] - 1) << (2 * i % 8));
    uint8_t *o = p + prefix;
    for (uint32_t r = 0; r < rows; r++) {
        const int8_t *qr = q + (size_t)r * cols;
        if (encoding == FORMAT_ENC_ADAPTIVE)
            pack_row_adaptive(qr, cols, widths[r], o);
        else if (encoding == FORMAT_ENC_BITPLANE)
            pack_row_bitplane(qr, cols, widths[r], o);
        else
            pack_row_int4int8(qr, cols, widths[r], o);
        o += format_packed_row_bytes(encoding, widths[r], cols);
    }
    *out = p;
    *out_len = prefix + data;
    return 0;
}

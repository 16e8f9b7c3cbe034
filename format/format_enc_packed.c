/* format_enc_packed.c: byte layout of the packed encodings (adaptive,
 * int4int8, bitplane; docs/FORMAT-packed.md): sizes, header parsing and
 * validation. How codes sit inside a row is the unpack module's business
 * (its scalar kernels are the specification); here only lengths matter. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "format_enc_packed.h"
#include "format_internal.h"

static const char *const magics[FORMAT_ENC_COUNT] = {
    [FORMAT_ENC_ADAPTIVE] = "SLAD",
    [FORMAT_ENC_INT4INT8] = "SL48",
    [FORMAT_ENC_BITPLANE] = "SLBP",
};

static const char *const names[FORMAT_ENC_COUNT] = {
    [FORMAT_ENC_ADAPTIVE] = "adaptive",
    [FORMAT_ENC_INT4INT8] = "int4int8",
    [FORMAT_ENC_BITPLANE] = "bitplane",
};

static int is_packed(uint32_t e)
{
    return e == FORMAT_ENC_ADAPTIVE || e == FORMAT_ENC_INT4INT8 || e == FORMAT_ENC_BITPLANE;
}

uint64_t format_packed_row_bytes(uint32_t encoding, uint32_t width, uint64_t cols)
{
    switch (encoding) {
    case FORMAT_ENC_ADAPTIVE:
    case FORMAT_ENC_BITPLANE:
        /* b bits per weight over the row padded to 8 weights (the adaptive
         * tail group is round_up(t, 8) weights; bitplane planes end on a byte) */
        return (uint64_t)width * (sl_align_up(cols, 8) / 8);
    case FORMAT_ENC_INT4INT8:
        return width <= 4 ? (cols + 1) / 2 : cols;
    default:
        return 0;
    }
}

/* The 3-bit width array: ceil(3 rows / 8) bytes plus one spare byte, so that
 * format_packed_width may always load two bytes. */
static uint64_t widths_bytes(uint64_t rows)
{
    return (rows * 3 + 7) / 8 + 1;
}

static uint64_t scales_offset(uint64_t rows)
{
    return sl_align_up(FORMAT_PACKED_HEADER + widths_bytes(rows), 64);
}

uint64_t format_packed_prefix_bytes(uint64_t rows)
{
    return sl_align_up(scales_offset(rows) + 4 * rows, 64);
}

static uint64_t mult_bytes(uint64_t rows, uint64_t cols)
{
    return (2 * rows * format_packed_mult_blocks(cols) + 7) / 8;
}

uint64_t format_packed_prefix_bytes_mult(uint64_t rows, uint64_t cols, int mult)
{
    uint64_t p = format_packed_prefix_bytes(rows);
    return mult ? p + sl_align_up(mult_bytes(rows, cols), 64) : p;
}

static int all_zero(const uint8_t *p, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++)
        if (p[i])
            return 0;
    return 1;
}

int format_packed_parse(uint32_t encoding, const void *data, uint64_t len, uint64_t rows,
                        uint64_t cols, struct format_packed_layout *out, struct sl_err *err)
{
    const uint8_t *p = data;
    if (!is_packed(encoding)) {
        sl_err_set(err, "encoding %u is not a packed encoding", encoding);
        return -EINVAL;
    }
    const char *name = names[encoding];
    if (rows == 0 || cols == 0 || rows > UINT32_MAX || cols > UINT32_MAX) {
        sl_err_set(err, "%s tensor of %" PRIu64 " x %" PRIu64 " (rows and cols must be 1..2^32-1)",
                   name, rows, cols);
        return -EINVAL;
    }
    uint64_t prefix = format_packed_prefix_bytes(rows), prefix1 = prefix;
    if (len >= FORMAT_PACKED_HEADER && sl_load_le32(p + 4) == 2 &&
        encoding == FORMAT_ENC_ADAPTIVE && sl_load_le32(p + 20) == FORMAT_PACKED_MULT_BLOCK &&
        rows <= UINT32_MAX && cols <= UINT32_MAX) /* version 2: multipliers after the scales */
        prefix = format_packed_prefix_bytes_mult(rows, cols, 1);
    if (len < prefix) {
        sl_err_set(err, "%s tensor is %" PRIu64 " bytes, shorter than its header, widths and "
                        "scales (%" PRIu64 " bytes for %" PRIu64 " rows)",
                   name, len, prefix, rows);
        return -EINVAL;
    }
    if (memcmp(p, magics[encoding], 4) != 0) {
        sl_err_set(err, "%s tensor has bad magic %02x%02x%02x%02x (expected '%s')", name, p[0],
                   p[1], p[2], p[3], magics[encoding]);
        return -EINVAL;
    }
    uint32_t version = sl_load_le32(p + 4), r = sl_load_le32(p + 8), c = sl_load_le32(p + 12);
    uint32_t group = sl_load_le32(p + 16), reserved = sl_load_le32(p + 20);
    uint64_t data_len = sl_load_le64(p + 24);
    uint32_t want_group = encoding == FORMAT_ENC_ADAPTIVE ? FORMAT_PACKED_GROUP : 0;
    if (version == 2 && encoding == FORMAT_ENC_ADAPTIVE && r == rows && c == cols &&
        group == want_group && reserved != FORMAT_PACKED_MULT_BLOCK) {
        sl_err_set(err, "%s tensor header version 2: multiplier block %u (must be %u)", name,
                   reserved, FORMAT_PACKED_MULT_BLOCK);
        return -EINVAL;
    }
    if (!(version == 1 || (version == 2 && encoding == FORMAT_ENC_ADAPTIVE)) || r != rows ||
        c != cols || group != want_group || (version == 1 && reserved != 0)) {
        sl_err_set(err, "%s tensor header (version %u, %u x %u, group %u, reserved %u) does not "
                        "match version 1 (or 2: adaptive with block multipliers), %" PRIu64
                        " x %" PRIu64 ", group %u, reserved 0",
                   name, version, r, c, group, reserved, rows, cols, want_group);
        return -EINVAL;
    }
    const uint8_t *mult = version == 2 ? p + prefix1 : NULL;
    if (mult) { /* every 2-bit value is a multiplier: only the padding to check */
        uint64_t bits = 2 * rows * format_packed_mult_blocks(cols), full = bits / 8;
        if ((bits % 8 && (mult[full] >> (bits % 8)) != 0) ||
            !all_zero(mult + (bits + 7) / 8, prefix - prefix1 - (bits + 7) / 8)) {
            sl_err_set(err, "%s tensor: nonzero bits after the block multipliers", name);
            return -EINVAL;
        }
    }
    /* widths: the bits past 3 rows, the spare byte and the padding up to the
     * scales are zero, so that a corrupted width array is caught even where
     * the lengths happen to agree */
    const uint8_t *widths = p + FORMAT_PACKED_HEADER;
    uint64_t wbits = rows * 3, wfull = wbits / 8;
    if ((wbits % 8 && (widths[wfull] >> (wbits % 8)) != 0) ||
        !all_zero(widths + (wbits + 7) / 8, scales_offset(rows) - FORMAT_PACKED_HEADER -
                                                 (wbits + 7) / 8)) {
        sl_err_set(err, "%s tensor: nonzero bits after the %" PRIu64 " row widths", name, rows);
        return -EINVAL;
    }
    uint64_t sum = 0;
    for (uint64_t i = 0; i < rows; i++) {
        uint64_t rb = format_packed_row_bytes(encoding, format_packed_width(widths, (uint32_t)i),
                                              cols);
        if (sl_add_u64(sum, rb, &sum) < 0) {
            sl_err_set(err, "%s tensor: code bytes overflow 64 bits", name);
            return -EINVAL;
        }
    }
    if (data_len != sum || len - prefix != sum) {
        sl_err_set(err, "%s tensor holds %" PRIu64 " code bytes and its header says %" PRIu64
                        ", but its row widths need %" PRIu64,
                   name, len - prefix, data_len, sum);
        return -EINVAL;
    }
    const uint8_t *scales = p + scales_offset(rows);
    for (uint64_t i = 0; i < rows; i++) {
        float s = sl_load_lef32(scales + 4 * i);
        if (!isfinite(s) || s < 0) {
            sl_err_set(err, "%s tensor: scale of row %" PRIu64 " is %g (must be finite, >= 0)",
                       name, i, (double)s);
            return -EINVAL;
        }
    }
    if (!all_zero(scales + 4 * rows, prefix1 - scales_offset(rows) - 4 * rows)) {
        sl_err_set(err, "%s tensor: nonzero padding after the scales", name);
        return -EINVAL;
    }
    if (out) {
        out->encoding = encoding;
        out->rows = (uint32_t)rows;
        out->cols = (uint32_t)cols;
        out->group = group;
        out->widths = widths;
        out->scales = scales;
        out->data = p + prefix;
        out->data_len = data_len;
        out->mult = mult;
        out->mult_block = mult ? FORMAT_PACKED_MULT_BLOCK : 0;
    }
    return 0;
}

int format_enc_adaptive_validate(const void *data, uint64_t len, uint64_t rows, uint64_t cols,
                                 struct sl_err *err)
{
    return format_packed_parse(FORMAT_ENC_ADAPTIVE, data, len, rows, cols, NULL, err);
}

int format_enc_int4int8_validate(const void *data, uint64_t len, uint64_t rows, uint64_t cols,
                                 struct sl_err *err)
{
    return format_packed_parse(FORMAT_ENC_INT4INT8, data, len, rows, cols, NULL, err);
}

int format_enc_bitplane_validate(const void *data, uint64_t len, uint64_t rows, uint64_t cols,
                                 struct sl_err *err)
{
    return format_packed_parse(FORMAT_ENC_BITPLANE, data, len, rows, cols, NULL, err);
}

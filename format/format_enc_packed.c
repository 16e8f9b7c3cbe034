/* format_enc_packed.c: byte layout of the packed encodings (adaptive,
 * int4int8, bitplane): sizes, header parsing and validation. The code layout
 * inside a row is the unpack module's business; here only lengths matter. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "format_internal.h"

static const char *const magics[FORMAT_ENC_COUNT] = {
    [FORMAT_ENC_ADAPTIVE] = "SLAD",
    [FORMAT_ENC_INT4INT8] = "SL48",
    [FORMAT_ENC_BITPLANE] = "SLBP",
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
        /* b planes of one bit per weight, the row padded to 8 weights (the
         * adaptive tail group is round_up(t, 8) weights) */
        return (uint64_t)width * (sl_align_up(cols, 8) / 8);
    case FORMAT_ENC_INT4INT8:
        return width <= 4 ? (cols + 1) / 2 : cols;
    default:
        return 0;
    }
}

static uint64_t widths_bytes(uint64_t rows)
{
    return (rows * 3 + 7) / 8 + 1; /* one spare byte for two-byte reads */
}

static uint64_t scales_offset(uint64_t rows)
{
    return sl_align_up(FORMAT_PACKED_HEADER + widths_bytes(rows), 64);
}

uint64_t format_packed_prefix_bytes(uint64_t rows)
{
    return sl_align_up(scales_offset(rows) + 4 * rows, 64);
}

int format_packed_parse(uint32_t encoding, const void *data, uint64_t len, uint64_t rows,
                        uint64_t cols, struct format_packed_layout *out, struct sl_err *err)
{
    const uint8_t *p = data;
    if (!is_packed(encoding)) {
        sl_err_set(err, "encoding %u is not a packed encoding", encoding);
        return -EINVAL;
    }
    if (rows == 0 || cols == 0 || rows > UINT32_MAX || cols > UINT32_MAX) {
        sl_err_set(err, "packed tensor of %" PRIu64 " x %" PRIu64, rows, cols);
        return -EINVAL;
    }
    uint64_t prefix = format_packed_prefix_bytes(rows);
    if (len < prefix) {
        sl_err_set(err, "packed tensor is %" PRIu64 " bytes, shorter than its header, widths "
                        "and scales (%" PRIu64 ")", len, prefix);
        return -EINVAL;
    }
    if (memcmp(p, magics[encoding], 4) != 0) {
        sl_err_set(err, "packed tensor has bad magic (expected '%s')", magics[encoding]);
        return -EINVAL;
    }
    uint32_t version = sl_load_le32(p + 4), r = sl_load_le32(p + 8), c = sl_load_le32(p + 12);
    uint32_t group = sl_load_le32(p + 16), reserved = sl_load_le32(p + 20);
    uint64_t data_len = sl_load_le64(p + 24);
    uint32_t want_group = encoding == FORMAT_ENC_ADAPTIVE ? FORMAT_PACKED_GROUP : 0;
    if (version != 1 || r != rows || c != cols || group != want_group || reserved != 0) {
        sl_err_set(err, "packed tensor header (version %u, %u x %u, group %u) does not match "
                        "version 1, %" PRIu64 " x %" PRIu64 ", group %u",
                   version, r, c, group, rows, cols, want_group);
        return -EINVAL;
    }
    const uint8_t *widths = p + FORMAT_PACKED_HEADER;
    uint64_t sum = 0;
    for (uint64_t i = 0; i < rows; i++)
        sum += format_packed_row_bytes(encoding, format_packed_width(widths, (uint32_t)i), cols);
    if (data_len != sum || len - prefix != sum) {
        sl_err_set(err, "packed tensor holds %" PRIu64 " code bytes (header says %" PRIu64
                        "), its widths need %" PRIu64, len - prefix, data_len, sum);
        return -EINVAL;
    }
    const uint8_t *scales = p + scales_offset(rows);
    for (uint64_t i = 0; i < rows; i++) {
        float s = sl_load_lef32(scales + 4 * i);
        if (!isfinite(s) || s < 0) {
            sl_err_set(err, "packed tensor: scale of row %" PRIu64 " is %g", i, (double)s);
            return -EINVAL;
        }
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
    }
    return 0;
}

int fmt_packed_validate_adaptive(const void *d, uint64_t len, uint64_t rows, uint64_t cols,
                                 struct sl_err *err)
{
    return format_packed_parse(FORMAT_ENC_ADAPTIVE, d, len, rows, cols, NULL, err);
}

int fmt_packed_validate_int4int8(const void *d, uint64_t len, uint64_t rows, uint64_t cols,
                                 struct sl_err *err)
{
    return format_packed_parse(FORMAT_ENC_INT4INT8, d, len, rows, cols, NULL, err);
}

int fmt_packed_validate_bitplane(const void *d, uint64_t len, uint64_t rows, uint64_t cols,
                                 struct sl_err *err)
{
    return format_packed_parse(FORMAT_ENC_BITPLANE, d, len, rows, cols, NULL, err);
}

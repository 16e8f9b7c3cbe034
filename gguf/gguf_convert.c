/* gguf_convert.c: a tensor's GGUF bytes from its verified container bytes.
 *   quantized -> Q8_0  row r: cols/32 blocks {fp16(scale[r]), 32 int8 codes}
 *   quantized -> F16   row r: fp16(scale[r] * code) per weight (F32: unrounded)
 *   1-D float -> F32   decoded (F16/BF16 widen exactly)
 *   2-D float -> same  copied
 * Any output range [a, b) is computed from the rows it covers only. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "gguf_internal.h"
#include "unpack.h"

static int is_packed(uint32_t enc)
{
    return enc == FORMAT_ENC_ADAPTIVE || enc == FORMAT_ENC_INT4INT8 || enc == FORMAT_ENC_BITPLANE;
}

int gv_parse(struct gv_tensor *t, const uint8_t *p, struct sl_err *err)
{
    if (t->enc == FORMAT_ENC_Q8_CHANNEL) {
        t->scales_off = 0;
        t->data_off = sl_align_up(t->rows * 4, 64);
        if (t->data_off + t->rows * t->cols > t->src_len) {
            sl_err_set(err, "tensor '%s': q8 data shorter than its shape", t->pub.name);
            return -EINVAL;
        }
        return 0;
    }
    if (!is_packed(t->enc))
        return 0;
    struct unpack_tensor u;
    int ret = unpack_tensor_init(&u, t->enc, p, t->src_len, t->rows, t->cols, err);
    if (ret < 0)
        return ret;
    t->widths_off = (uint64_t)(u.layout.widths - p);
    t->scales_off = (uint64_t)(u.layout.scales - p);
    t->mult_off = u.layout.mult ? (uint64_t)(u.layout.mult - p) : 0; /* 0: none */
    t->data_off = (uint64_t)(u.layout.data - p);
    t->data_len = u.layout.data_len;
    t->group = u.layout.group;
    t->row_off = u.row_off; /* kept: freed with the view */
    return 0;
}

/* Element-wise decode of a 1-D float tensor to F32 bytes [a, b). */
static void convert_1d(const struct gv_tensor *t, const uint8_t *p, uint64_t a, uint64_t b,
                       uint8_t *dst)
{
    for (uint64_t k = a / 4; k * 4 < b; k++) {
        float f = t->enc == FORMAT_ENC_F32   ? sl_load_lef32(p + 4 * k)
                  : t->enc == FORMAT_ENC_F16 ? sl_f16_to_f32(sl_load_le16(p + 2 * k))
                                             : sl_bf16_to_f32(sl_load_le16(p + 2 * k));
        uint8_t e[4];
        sl_store_lef32(e, f);
        uint64_t lo = k * 4 < a ? a - k * 4 : 0, hi = k * 4 + 4 > b ? b - k * 4 : 4;
        memcpy(dst + (k * 4 + lo - a), e + lo, hi - lo);
    }
}

/* Row r of a quantized tensor in its output type, into out (row_bytes). */
static int convert_row(const struct gv_tensor *t, const uint8_t *p, uint64_t r, uint8_t *out,
                       const struct gv_scratch *s, struct sl_err *err)
{
    float scale = sl_load_lef32(p + t->scales_off + 4 * r);
    if (!isfinite(scale) || scale < 0) {
        sl_err_set(err, "tensor '%s' row %" PRIu64 ": scale %g is not finite and >= 0", t->pub.name,
                   r, (double)scale);
        return -EINVAL;
    }
    const int8_t *q;
    if (t->enc == FORMAT_ENC_Q8_CHANNEL) {
        q = (const int8_t *)(p + t->data_off + r * t->cols);
    } else {
        struct unpack_tensor u = {
            .layout = {.encoding = t->enc,
                       .rows = (uint32_t)t->rows,
                       .cols = (uint32_t)t->cols,
                       .group = t->group,
                       .widths = p + t->widths_off,
                       .scales = p + t->scales_off,
                       .mult = t->mult_off ? p + t->mult_off : NULL,
                       .mult_block = t->mult_off ? FORMAT_PACKED_MULT_BLOCK : 0,
                       .data = p + t->data_off,
                       .data_len = t->data_len},
            .row_off = t->row_off,
        };
        int ret =
            unpack_tensor_rows(&u, unpack_kernel_best(), (uint32_t)r, (uint32_t)r + 1, s->q, NULL);
        if (ret < 0) {
            sl_err_set(err, "tensor '%s' row %" PRIu64 ": cannot unpack", t->pub.name, r);
            return ret;
        }
        q = s->q;
    }
    if (t->pub.type == GGUF_GGML_Q8_0) {
        uint16_t h = sl_f32_to_f16(scale);
        if ((h & 0x7c00) == 0x7c00) {
            sl_err_set(err,
                       "tensor '%s' row %" PRIu64 ": scale %g exceeds fp16 (Q8_0 cannot "
                       "hold it; -o gguf=f16 may)",
                       t->pub.name, r, (double)scale);
            return -ERANGE;
        }
        for (uint64_t k = 0; k < t->cols / 32; k++) {
            sl_store_le16(out + 34 * k, h);
            memcpy(out + 34 * k + 2, q + 32 * k, 32);
        }
        return 0;
    }
    if (t->pub.type == GGUF_GGML_F32) {
        for (uint64_t c = 0; c < t->cols; c++)
            sl_store_lef32(out + 4 * c, scale * (float)q[c]);
        return 0;
    }
    if (t->cols > 256) {
        /* a long row rounds each code's value once (the same function, so
         * the same bits; -x rounds to -(x rounded)), and checks afterwards */
        uint16_t lut[256];
        for (int k = 0; k <= 128; k++) {
            uint16_t h = sl_f32_to_f16(scale * (float)k);
            if (k < 128)
                lut[128 + k] = h;
            if (k > 0)
                lut[128 - k] = (uint16_t)(h | 0x8000);
        }
        unsigned bad = 0;
        const uint64_t cols = t->cols;
        for (uint64_t c = 0; c < cols; c++) {
            uint16_t h = lut[q[c] + 128];
            bad |= (h & 0x7c00) == 0x7c00;
            sl_store_le16(out + 2 * c, h);
        }
        for (uint64_t c = 0; bad && c < cols; c++)
            if ((lut[q[c] + 128] & 0x7c00) == 0x7c00) {
                sl_err_set(err, "tensor '%s' row %" PRIu64 ": weight %g exceeds fp16",
                           t->pub.name, r, (double)(scale * (float)q[c]));
                return -ERANGE;
            }
        return 0;
    }
    for (uint64_t c = 0; c < t->cols; c++) {
        uint16_t h = sl_f32_to_f16(scale * (float)q[c]);
        if ((h & 0x7c00) == 0x7c00) {
            sl_err_set(err, "tensor '%s' row %" PRIu64 ": weight %g exceeds fp16", t->pub.name, r,
                       (double)(scale * (float)q[c]));
            return -ERANGE;
        }
        sl_store_le16(out + 2 * c, h);
    }
    return 0;
}

int gv_convert(const struct gv_tensor *t, const uint8_t *p, uint64_t a, uint64_t b, uint8_t *dst,
               const struct gv_scratch *s, struct sl_err *err)
{
    if (t->pub.n_dims == 1) {
        convert_1d(t, p, a, b, dst);
        return 0;
    }
    if (!format_encoding_traits(t->enc)->quantized) {
        memcpy(dst, p + a, b - a);
        return 0;
    }
    uint64_t rb = t->row_bytes;
    for (uint64_t r = a / rb; r * rb < b; r++) {
        uint64_t start = r * rb;
        if (start >= a && start + rb <= b) {
            int ret = convert_row(t, p, r, dst + (start - a), s, err);
            if (ret < 0)
                return ret;
            continue;
        }
        int ret = convert_row(t, p, r, s->row, s, err);
        if (ret < 0)
            return ret;
        uint64_t lo = start < a ? a - start : 0, hi = start + rb > b ? b - start : rb;
        memcpy(dst + (start + lo - a), s->row + lo, hi - lo);
    }
    return 0;
}

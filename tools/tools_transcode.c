/* tools_transcode.c: see tools_transcode.h. */
#include "tools_transcode.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "format.h"
#include "quantizer.h"
#include "tools_rewrite.h"
#include "unpack.h"

static int one_tensor(const struct format_reader *r, uint32_t i, uint32_t encoding,
                      struct format_writer *w, struct sl_err *err)
{
    const struct format_tensor_info *t = format_reader_tensor(r, i);
    if (!format_encoding_traits(t->encoding)->quantized || t->encoding == encoding)
        return tools_rewrite_tensor(r, i, w, err);
    void *raw = malloc(t->length);
    if (!raw) {
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    int ret = format_reader_read_tensor(r, i, raw, t->length, err);
    if (ret < 0) {
        free(raw);
        return ret;
    }
    struct format_tensor_desc d;
    tools_rewrite_desc(t, &d);
    uint32_t rows = (uint32_t)t->shape[0], cols = (uint32_t)t->shape[1];
    int8_t *q = malloc((size_t)rows * cols);
    float *sc = malloc(sizeof(float) * rows);
    uint8_t *widths = malloc(rows);
    void *out = NULL;
    uint64_t out_len = 0;
    ret = q && sc && widths ? unpack_tensor_int8(t, raw, q, sc, err) : -ENOMEM;
    if (ret == 0) {
        struct format_packed_layout lay;
        if (format_packed_parse(t->encoding, raw, t->length, rows, cols, &lay, NULL) == 0)
            for (uint32_t k = 0; k < rows; k++)
                widths[k] = (uint8_t)format_packed_width(lay.widths, k);
        else
            memset(widths, 8, rows);
    }
    if (ret == 0 && encoding == FORMAT_ENC_Q8_CHANNEL) {
        uint64_t soff = sl_align_up((uint64_t)rows * 4, 64);
        out_len = soff + (uint64_t)rows * cols;
        out = calloc(1, out_len);
        if (!out) {
            ret = -ENOMEM;
        } else {
            for (uint32_t k = 0; k < rows; k++)
                sl_store_lef32((uint8_t *)out + 4 * k, sc[k]);
            memcpy((uint8_t *)out + soff, q, (size_t)rows * cols);
            memset(d.bits_hist, 0, sizeof d.bits_hist);
            d.bits_hist[8] = rows;
        }
    } else if (ret == 0) {
        ret = quantizer_pack(encoding, q, widths, sc, rows, cols, &out, &out_len, err);
    }
    if (ret == 0) {
        d.encoding = encoding;
        ret = format_writer_add_tensor(w, &d, out, out_len, err);
    }
    free(out);
    free(q);
    free(sc);
    free(widths);
    free(raw);
    return ret;
}

int tools_transcode(const char *src, const char *dst, uint32_t encoding, struct sl_err *err)
{
    struct format_reader *r;
    struct format_writer *w;
    int ret = tools_rewrite_begin(src, dst, NULL, &r, &w, err);
    if (ret < 0)
        return ret;
    const char *name = format_encoding_traits(encoding)->name;
    ret = format_writer_set_meta(w, "quant.storage", name, strlen(name), err);
    for (uint32_t i = 0; ret == 0 && i < format_reader_n_tensors(r); i++)
        ret = one_tensor(r, i, encoding, w, err);
    return tools_rewrite_end(r, w, ret, err);
}

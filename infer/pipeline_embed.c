/* pipeline_embed.c: the embedding. The prompt's rows are read ahead of the
 * stream with a few small reads (the first layer needs them at once), and
 * the untied embedding, needed only for decoding, after the first token.
 * Calls pipeline_weights.c, the format reader and the unpacker. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pipeline.h"
#include "unpack.h"

/* len bytes at off of fd, retrying short reads. 0 or -EIO. */
int pl_pread_full(int fd, void *buf, uint64_t len, uint64_t off)
{
    uint8_t *b = buf;
    while (len) {
        ssize_t k = pread(fd, b, (size_t)len, (off_t)off);
        if (k <= 0) {
            if (k < 0 && errno == EINTR)
                continue;
            return -EIO;
        }
        b += k;
        len -= (uint64_t)k;
        off += (uint64_t)k;
    }
    return 0;
}

/* One row of a packed tensor from its code bytes: wrapped in a one-row
 * tensor (the prefix of docs/FORMAT-packed.md) and unpacked through the
 * public API, so the row is validated and decoded like any tensor. */
static int unpack_one_row(uint32_t encoding, const uint8_t *row, uint64_t row_bytes,
                          uint32_t cols, uint32_t width, float scale, int8_t *dst)
{
    uint64_t prefix = format_packed_prefix_bytes(1);
    uint8_t *b = sl_calloc(1, prefix + row_bytes);
    if (!b)
        return -ENOMEM;
    memcpy(b, encoding == FORMAT_ENC_ADAPTIVE ? "SLAD" : encoding == FORMAT_ENC_INT4INT8 ? "SL48"
                                                                                        : "SLBP",
           4);
    sl_store_le32(b + 4, 1);
    sl_store_le32(b + 8, 1);
    sl_store_le32(b + 12, cols);
    sl_store_le32(b + 16, encoding == FORMAT_ENC_ADAPTIVE ? FORMAT_PACKED_GROUP : 0);
    sl_store_le64(b + 24, row_bytes);
    b[FORMAT_PACKED_HEADER] = (uint8_t)(width - 1);
    sl_store_lef32(b + sl_align_up(FORMAT_PACKED_HEADER + 2, 64), scale);
    memcpy(b + prefix, row, row_bytes);
    struct unpack_tensor u;
    int ret = unpack_tensor_init(&u, encoding, b, prefix + row_bytes, 1, cols, NULL);
    if (ret == 0) {
        ret = unpack_tensor_rows(&u, unpack_kernel_best(), 0, 1, dst, NULL);
        unpack_tensor_fini(&u);
    }
    free(b);
    return ret;
}

/* x[n][D] = the embedding rows of the prompt, read with a few small reads.
 * These bytes are covered by their slice's checksum when the slice is read
 * whole: with the head slice (tied), before the first token is returned; or
 * after it (untied embedding, read last for decoding). */
int pl_embed_rows(struct pl *p, float *x, struct sl_err *err)
{
    const struct format_config *c = p->c;
    int ti = format_reader_find(p->r, -1, FORMAT_ROLE_TOK_EMBD);
    const struct format_tensor_info *t = format_reader_tensor(p->r, (uint32_t)ti);
    int fd = format_reader_fd(p->r);
    const char *path = format_reader_path(p->r);
    uint32_t D = c->dim, rows = c->vocab_size;
    uint32_t n = 0;
    for (uint32_t ch = 0; ch < p->n_chunks; ch++)
        n += p->cb[ch].n;
    int8_t *q = sl_malloc(D);
    uint8_t *raw = sl_malloc((size_t)D * 4 + 64);
    uint8_t *prefix = NULL;
    uint64_t *row_off = NULL;
    int ret = q && raw ? 0 : -ENOMEM;
    if (ret == 0 && format_encoding_traits(t->encoding)->quantized &&
        t->encoding != FORMAT_ENC_Q8_CHANNEL) {
        uint64_t plen = format_packed_prefix_bytes(rows);
        prefix = sl_malloc(plen);
        row_off = sl_malloc(sizeof(uint64_t) * rows);
        ret = prefix && row_off ? pl_pread_full(fd, prefix, plen, t->offset) : -ENOMEM;
        struct format_packed_layout lay;
        /* the prefix alone: parse its header and widths, not the codes */
        if (ret == 0 && (memcmp(prefix, "SL", 2) != 0 || sl_load_le32(prefix + 8) != rows ||
                         sl_load_le32(prefix + 12) != D))
            ret = -EINVAL;
        (void)lay;
        uint64_t off = 0;
        for (uint32_t r = 0; ret == 0 && r < rows; r++) {
            row_off[r] = off;
            off += format_packed_row_bytes(t->encoding,
                                           format_packed_width(prefix + FORMAT_PACKED_HEADER, r), D);
        }
        if (ret == 0 && off + plen != t->length)
            ret = -EINVAL;
    }
    for (uint32_t i = 0; ret == 0 && i < n; i++) {
        uint32_t tok = (uint32_t)p->tokens[i];
        if (tok >= rows) {
            sl_err_set(err, "token id %u outside the vocabulary of %u", tok, rows);
            ret = -EINVAL;
            break;
        }
        float *xi = x + (size_t)i * D;
        if (!format_encoding_traits(t->encoding)->quantized) {
            uint64_t esz = t->encoding == FORMAT_ENC_F32 ? 4 : 2;
            ret = pl_pread_full(fd, raw, D * esz, t->offset + (uint64_t)tok * D * esz);
            if (ret == 0)
                format_decode_float(t->encoding, raw, xi, D);
        } else if (t->encoding == FORMAT_ENC_Q8_CHANNEL) {
            uint8_t s4[4];
            ret = pl_pread_full(fd, s4, 4, t->offset + 4 * (uint64_t)tok);
            if (ret == 0)
                ret = pl_pread_full(fd, q, D,
                                 t->offset + sl_align_up((uint64_t)rows * 4, 64) + (uint64_t)tok * D);
            float s = sl_load_lef32(s4);
            for (uint32_t j = 0; ret == 0 && j < D; j++)
                xi[j] = s * (float)q[j];
        } else {
            uint32_t width = format_packed_width(prefix + FORMAT_PACKED_HEADER, tok);
            uint64_t rb = format_packed_row_bytes(t->encoding, width, D);
            uint64_t scoff = sl_align_up(FORMAT_PACKED_HEADER + ((uint64_t)rows * 3 + 7) / 8 + 1, 64);
            ret = pl_pread_full(fd, raw, rb,
                             t->offset + format_packed_prefix_bytes(rows) + row_off[tok]);
            float s = sl_load_lef32(prefix + scoff + 4 * (uint64_t)tok);
            if (ret == 0)
                ret = unpack_one_row(t->encoding, raw, rb, D, width, s, q);
            for (uint32_t j = 0; ret == 0 && j < D; j++)
                xi[j] = s * (float)q[j];
        }
    }
    if (ret < 0 && !err->msg[0])
        sl_err_set(err, "%s: cannot read the embedding rows of the prompt (%s)", path,
                   strerror(-ret));
    free(q);
    free(raw);
    free(prefix);
    free(row_off);
    return ret;
}

/* The untied embedding (for decoding): read, verified, unpacked to rows. */
int pl_embed_finish(struct pl *p, struct sl_err *err)
{
    const struct format_reader *r = p->r;
    int ret = 0;
    for (uint32_t i = 0; i < format_reader_n_slices(r) && ret == 0; i++) {
        const struct format_slice_info *s = format_reader_slice(r, i);
        if (s->kind != FORMAT_SLICE_EMBED)
            continue;
        const uint8_t *data = p->slice_data[i];
        struct loader_slice sl = {0};
        if (p->ls) {
            ret = loader_stream_next(p->ls, &sl, err);
            if (ret <= 0)
                return ret < 0 ? ret : -EIO;
            data = sl.data;
            p->bytes_read += sl.length;
        }
        ret = format_slice_verify(r, i, data, err);
        const struct format_tensor_info *t = format_reader_tensor(r, s->first_tensor);
        if (ret == 0) {
            if (format_encoding_traits(t->encoding)->quantized) {
                ret = pl_weights_keep_packed(&p->m->embed, t, data + (t->offset - s->offset), err);
            } else {
                ret = infer_linear_init(&p->m->embed, t, data + (t->offset - s->offset), 0,
                                        p->m->force_dynamic_act, err);
            }
        }
        if (p->ls)
            loader_stream_release(p->ls, &sl);
    }
    return ret;
}

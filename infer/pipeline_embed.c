/* pipeline_embed.c: the embedding. The prompt's rows are read ahead of the
 * stream with a few small reads (the first layer needs them at once), and
 * the untied embedding, needed only for decoding, after the first token.
 * Calls pipeline_weights.c, the format reader and the unpacker. */
#include <errno.h>
#include <fcntl.h>
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

/* Where token tok's row of a q8 tensor lies (FORMAT.md: rows float32
 * scales, then the int8 rows from the next 64-byte boundary). */
static uint64_t q8_row_offset(uint32_t rows, uint32_t cols, uint32_t tok)
{
    return sl_align_up((uint64_t)rows * 4, 64) + (uint64_t)tok * cols;
}

/* The embedding rows of the prompt, read before the stream's reads: a
 * packed table's prefix first (header, widths and scales, parsed and
 * checked by the format module), then one range per prompt token (two for
 * q8: its scale and its row). These bytes are covered by their slice's
 * checksum when the slice is read whole: with the head slice (tied), before
 * the first token is returned; or after it (untied embedding, read last for
 * decoding).
 *
 * Ask: the prefix read (the rows' places depend on it), then the rows'
 * pages asked for (POSIX_FADV_WILLNEED: their reads are issued from this
 * thread now, ahead of the stream's, which the caller starts next) without
 * waiting for them: the disk goes on from the rows to the first layer's
 * slice with no gap, where it used to wait idle for the rows' round trip
 * before the stream began. */
int pl_embed_rows_ask(struct pl *p, struct pl_embed_rows *e, struct sl_err *err)
{
    const struct format_config *c = p->c;
    int ti = format_reader_find(p->r, -1, FORMAT_ROLE_TOK_EMBD);
    const struct format_tensor_info *t = format_reader_tensor(p->r, (uint32_t)ti);
    int fd = format_reader_fd(p->r);
    uint32_t D = c->dim, rows = c->vocab_size, n = 0;
    for (uint32_t ch = 0; ch < p->n_chunks; ch++)
        n += p->cb[ch].n;
    for (uint32_t i = 0; i < n; i++)
        if ((uint32_t)p->tokens[i] >= rows) {
            sl_err_set(err, "token id %d outside the vocabulary of %u", p->tokens[i], rows);
            return -EINVAL;
        }
    int q8 = t->encoding == FORMAT_ENC_Q8_CHANNEL;
    int packed = format_encoding_traits(t->encoding)->quantized && !q8;
    uint64_t esz = t->encoding == FORMAT_ENC_F32 ? 4 : 2;
    /* each token's bytes: a float row, a q8 row, or at most an 8-bit packed row */
    uint64_t stride = sl_align_up(packed ? format_packed_row_bytes(t->encoding, 8, D)
                                         : q8 ? D : D * esz, 64);
    uint32_t nreq = q8 ? 2 * n : n;
    e->n = n;
    e->nreq = nreq;
    e->q8 = q8;
    e->packed = packed;
    e->data = sl_malloc(stride * n + (q8 ? 4ull * n : 0));
    e->offs = sl_malloc(sizeof *e->offs * nreq);
    e->lens = sl_malloc(sizeof *e->lens * nreq);
    e->bufs = sl_malloc(sizeof *e->bufs * nreq);
    e->q = sl_malloc(D);
    int ret = e->data && e->offs && e->lens && e->bufs && e->q ? 0 : -ENOMEM;
    if (ret == 0 && packed) {
        /* the longest prefix: with block multipliers (header version 2) */
        uint64_t plen = format_packed_prefix_bytes_mult(rows, D, 1);
        plen = plen < t->length ? plen : t->length;
        e->prefix = sl_malloc(plen);
        e->row_off = sl_malloc(sizeof *e->row_off * rows);
        ret = e->prefix && e->row_off ? 0 : -ENOMEM;
        /* through the random-advised file as the rows below: through the
         * model's own, this 0.65 MB read (TinyLlama's) was read ahead to 4 MB,
         * 3.3 MB that nothing asked for before the first weight byte
         * (docs/BENCHMARKS.md, fifteenth session, f22) */
        if (ret == 0)
            ret = loader_read_batch_random(fd, &t->offset, &plen, (void *const *)&e->prefix, 1,
                                           err);
        /* the prefix holds everything the parser reads (it checks the code
         * bytes' total against the tensor's length without reading them) */
        if (ret == 0)
            ret = format_packed_parse(t->encoding, e->prefix, t->length, rows, D, &e->lay, err);
        for (uint64_t r = 0, off = ret == 0 ? (uint64_t)(e->lay.data - e->prefix) : 0;
             ret == 0 && r < rows; r++) {
            e->row_off[r] = off;
            off += format_packed_row_bytes(t->encoding, format_packed_width(e->lay.widths,
                                                                            (uint32_t)r), D);
        }
    }
    for (uint32_t i = 0; ret == 0 && i < n; i++) {
        uint32_t tok = (uint32_t)p->tokens[i];
        e->bufs[i] = e->data + stride * i;
        if (packed) {
            e->offs[i] = t->offset + e->row_off[tok];
            e->lens[i] = format_packed_row_bytes(t->encoding,
                                                 format_packed_width(e->lay.widths, tok), D);
        } else if (q8) {
            e->offs[i] = t->offset + q8_row_offset(rows, D, tok);
            e->lens[i] = D;
            e->offs[n + i] = t->offset + 4ull * tok; /* its scale */
            e->lens[n + i] = 4;
            e->bufs[n + i] = e->data + stride * n + 4ull * i;
        } else {
            e->offs[i] = t->offset + (uint64_t)tok * D * esz;
            e->lens[i] = D * esz;
        }
    }
    /* advice: the rows' pages and nothing more (WILLNEED reads the range as
     * given, whatever the file's read-ahead); the read below works without */
    for (uint32_t i = 0; ret == 0 && i < nreq; i++)
        (void)posix_fadvise(fd, (off_t)e->offs[i], (off_t)e->lens[i], POSIX_FADV_WILLNEED);
    if (ret < 0 && !err->msg[0])
        sl_err_set(err, "%s: cannot read the embedding rows of the prompt (%s)",
                   format_reader_path(p->r), strerror(-ret));
    return ret;
}

/* x[n][D] from the rows ask asked for (waiting for the pages still in flight). */
int pl_embed_rows_read(struct pl *p, struct pl_embed_rows *e, float *x, struct sl_err *err)
{
    int ti = format_reader_find(p->r, -1, FORMAT_ROLE_TOK_EMBD);
    const struct format_tensor_info *t = format_reader_tensor(p->r, (uint32_t)ti);
    uint32_t D = p->c->dim, n = e->n;
    /* the rows through an open file of their own, advised random: through
     * the model's, a read of a row that missed the cache (its asked pages
     * dropped again) also read ahead (up to the device's read-ahead size),
     * bytes no task needs that a throttled disk (flashrun) charges at its
     * rate before the first slice can come */
    int ret = loader_read_batch_random(format_reader_fd(p->r), e->offs, e->lens,
                                       (void *const *)e->bufs, e->nreq, err);
    for (uint32_t i = 0; ret == 0 && i < n; i++) {
        uint32_t tok = (uint32_t)p->tokens[i];
        float *xi = x + (size_t)i * D;
        const uint8_t *row = e->bufs[i];
        float s;
        if (!e->packed && !e->q8) {
            format_decode_float(t->encoding, row, xi, D);
            continue;
        }
        if (e->packed) {
            ret = unpack_row(t->encoding, unpack_kernel_best(), row, D,
                             format_packed_width(e->lay.widths, tok), e->q);
            if (ret == 0)
                ret = unpack_row_mult(&e->lay, tok, format_packed_width(e->lay.widths, tok),
                                      e->q);
            s = sl_load_lef32(e->lay.scales + 4ull * tok);
        } else {
            memcpy(e->q, row, D);
            s = sl_load_lef32((const uint8_t *)e->bufs[n + i]);
        }
        for (uint32_t j = 0; ret == 0 && j < D; j++)
            xi[j] = s * (float)e->q[j];
    }
    if (ret < 0 && !err->msg[0])
        sl_err_set(err, "%s: cannot read the embedding rows of the prompt (%s)",
                   format_reader_path(p->r), strerror(-ret));
    else if (ret < 0)
        sl_err_prefix(err, "%s: the embedding rows of the prompt", format_reader_path(p->r));
    return ret;
}

void pl_embed_rows_free(struct pl_embed_rows *e)
{
    free(e->q);
    free(e->data);
    free(e->offs);
    free(e->lens);
    free(e->bufs);
    free(e->prefix);
    free(e->row_off);
    memset(e, 0, sizeof *e);
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
        struct loader_stream *ls = p->ls;
        if (ls && p->m->slices) {
            /* read in place: a stream of its own, opened only now */
            struct loader_request q = {.path = format_reader_path(r), .fd = -1,
                                       .offset = s->offset, .length = s->length, .tag = i,
                                       .dest = (uint8_t *)p->m->slices + s->offset};
            struct loader_opts lo = {.queue_depth = p->o->queue_depth};
            if ((ret = loader_stream_open(&q, 1, &lo, &ls, err)) < 0)
                return ret;
        }
        if (!ls && p->m->slices_mapped) {
            if ((ret = pl_map_populate(p, i, err)) < 0)
                return ret;
            data = (const uint8_t *)p->m->slices + s->offset;
            p->bytes_read += s->length;
        }
        if (ls) {
            ret = loader_stream_next(ls, &sl, err);
            if (ret <= 0) {
                if (ls != p->ls)
                    loader_stream_close(ls);
                return ret < 0 ? ret : -EIO;
            }
            data = sl.data;
            p->bytes_read += sl.length;
        }
        ret = format_slice_verify(r, i, data, err);
        const struct format_tensor_info *t = format_reader_tensor(r, s->first_tensor);
        if (ret == 0) {
            if (format_encoding_traits(t->encoding)->quantized) {
                ret = pl_weights_keep_packed(&p->m->embed, t, data + (t->offset - s->offset),
                                             p->m->slices != NULL, err);
            } else {
                ret = infer_linear_init(&p->m->embed, t, data + (t->offset - s->offset), 0,
                                        p->m->force_dynamic_act, err);
            }
        }
        if (ls)
            loader_stream_release(ls, &sl);
        if (ls != p->ls)
            loader_stream_close(ls);
    }
    return ret;
}

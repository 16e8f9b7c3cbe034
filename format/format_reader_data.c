/* format_reader_data.c: what an open container answers (format.h): its
 * index, metadata and tokenizer, and its tensors and slices read, checksummed
 * and validated. Opening is format_reader.c. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "format_reader_internal.h"

const char *format_reader_path(const struct format_reader *r) { return r->path; }
int format_reader_fd(const struct format_reader *r) { return r->fd; }
uint64_t format_reader_file_size(const struct format_reader *r) { return r->size; }
uint32_t format_reader_version(const struct format_reader *r) { return r->version; }
const struct format_config *format_reader_config(const struct format_reader *r) { return &r->cfg; }
const struct format_tokenizer *format_reader_tokenizer(const struct format_reader *r)
{
    return &r->tok;
}
uint32_t format_reader_n_tensors(const struct format_reader *r) { return r->n_tensors; }
uint32_t format_reader_n_slices(const struct format_reader *r) { return r->n_slices; }
uint32_t format_reader_meta_count(const struct format_reader *r) { return r->n_kv; }

const struct format_tensor_info *format_reader_tensor(const struct format_reader *r, uint32_t i)
{
    return i < r->n_tensors ? &r->tensors[i] : NULL;
}

const struct format_slice_info *format_reader_slice(const struct format_reader *r, uint32_t i)
{
    return i < r->n_slices ? &r->slices[i] : NULL;
}

const char *format_reader_meta_key(const struct format_reader *r, uint32_t i)
{
    return i < r->n_kv ? r->kv[i].key : NULL;
}

int format_reader_meta_get(const struct format_reader *r, const char *key, const void **value,
                           size_t *len)
{
    for (uint32_t i = 0; i < r->n_kv; i++) {
        if (!strcmp(r->kv[i].key, key)) {
            if (value)
                *value = r->kv[i].val;
            if (len)
                *len = r->kv[i].len;
            return 0;
        }
    }
    return -ENOENT;
}

int format_reader_find(const struct format_reader *r, int32_t layer, uint32_t role)
{
    if (role == FORMAT_ROLE_CLASSIFIER && r->cfg.tied_embedding)
        role = FORMAT_ROLE_TOK_EMBD;
    for (uint32_t i = 0; i < r->n_tensors; i++)
        if (r->tensors[i].role == role && r->tensors[i].layer == layer)
            return (int)i;
    return -ENOENT;
}

int format_reader_find_name(const struct format_reader *r, const char *name)
{
    for (uint32_t i = 0; i < r->n_tensors; i++)
        if (!strcmp(r->tensors[i].name, name))
            return (int)i;
    return -ENOENT;
}

static int read_checked(const struct format_reader *r, uint64_t off, uint64_t len, void *buf,
                        uint64_t buflen, uint64_t want_sum, const char *kind, const char *name,
                        struct sl_err *err)
{
    if (buflen < len) {
        sl_err_set(err, "%s: buffer of %" PRIu64 " bytes for %s '%s' of %" PRIu64, r->path,
                   buflen, kind, name, len);
        return -EINVAL;
    }
    int ret = fmt_pread_all(r->fd, buf, len, off);
    if (ret < 0) {
        sl_err_set(err, "%s: reading %s '%s' at offset %" PRIu64 ": %s", r->path, kind, name, off,
                   ret == -ENODATA ? "file is truncated" : strerror(-ret));
        return -EIO;
    }
    uint64_t sum = format_checksum(buf, (size_t)len);
    if (sum != want_sum) {
        sl_err_set(err, "%s: checksum mismatch in %s '%s' (stored %016" PRIx64 ", computed %016"
                        PRIx64 "): the data is corrupt", r->path, kind, name, want_sum, sum);
        return -EIO;
    }
    return 0;
}

static void slice_name(const struct format_reader *r, uint32_t i, char *buf, size_t n)
{
    const struct format_slice_info *s = &r->slices[i];
    if (s->kind == FORMAT_SLICE_LAYER)
        snprintf(buf, n, "layer %d", s->layer);
    else
        snprintf(buf, n, "%s", s->kind == FORMAT_SLICE_EMBED ? "embedding" : "head");
}

int format_tensor_validate(const struct format_reader *r, uint32_t i, const void *data,
                           struct sl_err *err)
{
    if (i >= r->n_tensors) {
        sl_err_set(err, "%s: no tensor %u", r->path, i);
        return -EINVAL;
    }
    const struct format_tensor_info *t = &r->tensors[i];
    const struct format_encoding_traits *tr = format_encoding_traits(t->encoding);
    if (!tr) { /* refused at open; kept for a reader built without it */
        sl_err_set(err, "%s: tensor '%s' has unknown encoding %u", r->path, t->name, t->encoding);
        return -EINVAL;
    }
    if (!tr->validate)
        return 0; /* float: the length, checked at open, says it all */
    uint64_t rows = t->shape[0], cols = t->n_dims >= 2 ? t->shape[1] : 1;
    int ret = tr->validate(data, t->length, rows, cols, err);
    if (ret < 0)
        sl_err_prefix(err, "%s: tensor '%s' (%s)", r->path, t->name, tr->name);
    return ret;
}

int format_slice_validate(const struct format_reader *r, uint32_t i, const void *data,
                          struct sl_err *err)
{
    if (i >= r->n_slices) {
        sl_err_set(err, "%s: no slice %u", r->path, i);
        return -EINVAL;
    }
    const struct format_slice_info *s = &r->slices[i];
    for (uint32_t k = 0; k < s->n_tensors; k++) {
        const struct format_tensor_info *t = &r->tensors[s->first_tensor + k];
        /* open checked that every tensor lies inside its slice */
        int ret = format_tensor_validate(r, s->first_tensor + k,
                                         (const uint8_t *)data + (t->offset - s->offset), err);
        if (ret < 0)
            return ret;
    }
    return 0;
}

int format_reader_read_tensor(const struct format_reader *r, uint32_t i, void *buf, uint64_t len,
                              struct sl_err *err)
{
    if (i >= r->n_tensors) {
        sl_err_set(err, "%s: no tensor %u", r->path, i);
        return -EINVAL;
    }
    const struct format_tensor_info *t = &r->tensors[i];
    int ret = read_checked(r, t->offset, t->length, buf, len, t->checksum, "tensor", t->name, err);
    return ret < 0 ? ret : format_tensor_validate(r, i, buf, err);
}

int format_reader_read_slice(const struct format_reader *r, uint32_t i, void *buf, uint64_t len,
                             struct sl_err *err)
{
    if (i >= r->n_slices) {
        sl_err_set(err, "%s: no slice %u", r->path, i);
        return -EINVAL;
    }
    char name[32];
    slice_name(r, i, name, sizeof name);
    const struct format_slice_info *s = &r->slices[i];
    int ret = read_checked(r, s->offset, s->length, buf, len, s->checksum, "slice", name, err);
    return ret < 0 ? ret : format_slice_validate(r, i, buf, err);
}

int format_slice_verify(const struct format_reader *r, uint32_t i, const void *data,
                        struct sl_err *err)
{
    uint64_t sum = i < r->n_slices ? format_checksum(data, (size_t)r->slices[i].length) : 0;
    return format_slice_verify_sum(r, i, data, sum, err); /* which names a bad index */
}

int format_slice_verify_sum(const struct format_reader *r, uint32_t i, const void *data,
                            uint64_t sum, struct sl_err *err)
{
    if (i >= r->n_slices) {
        sl_err_set(err, "%s: no slice %u", r->path, i);
        return -EINVAL;
    }
    const struct format_slice_info *s = &r->slices[i];
    if (sum != s->checksum) {
        char name[32];
        slice_name(r, i, name, sizeof name);
        sl_err_set(err, "%s: checksum mismatch in slice '%s' (stored %016" PRIx64 ", computed %016"
                        PRIx64 "): the data is corrupt", r->path, name, s->checksum, sum);
        return -EIO;
    }
    return format_slice_validate(r, i, data, err);
}

int format_tensor_verify(const struct format_reader *r, uint32_t i, const void *data,
                         struct sl_err *err)
{
    if (i >= r->n_tensors) {
        sl_err_set(err, "%s: no tensor %u", r->path, i);
        return -EINVAL;
    }
    const struct format_tensor_info *t = &r->tensors[i];
    uint64_t sum = format_checksum(data, (size_t)t->length);
    if (sum != t->checksum) {
        sl_err_set(err, "%s: checksum mismatch in tensor '%s' (stored %016" PRIx64 ", computed %016"
                        PRIx64 "): the data is corrupt", r->path, t->name, t->checksum, sum);
        return -EIO;
    }
    return format_tensor_validate(r, i, data, err);
}

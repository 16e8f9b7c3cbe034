/* tools_rewrite.c: see tools_rewrite.h. */
#include "tools_rewrite.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int tools_rewrite_begin(const char *src, const char *dst, const char *drop,
                        struct format_reader **r, struct format_writer **w, struct sl_err *err)
{
    *w = NULL;
    int ret = format_reader_open(src, r, err);
    if (ret < 0)
        return ret;
    ret = format_writer_create(dst, w, err);
    if (ret == 0)
        ret = format_writer_set_config(*w, format_reader_config(*r), err);
    if (ret == 0)
        ret = format_writer_set_tokenizer(*w, format_reader_tokenizer(*r), err);
    for (uint32_t i = 0; ret == 0 && i < format_reader_meta_count(*r); i++) {
        const char *k = format_reader_meta_key(*r, i);
        const void *v;
        size_t len;
        if (drop && !strncmp(k, drop, strlen(drop)))
            continue;
        ret = format_reader_meta_get(*r, k, &v, &len);
        if (ret < 0)
            sl_err_set(err, "%s: metadata key %s cannot be read", src, k);
        else
            ret = format_writer_set_meta(*w, k, v, len, err);
    }
    if (ret < 0) {
        format_writer_destroy(*w);
        format_reader_close(*r);
        *w = NULL;
        *r = NULL;
    }
    return ret;
}

void tools_rewrite_desc(const struct format_tensor_info *t, struct format_tensor_desc *d)
{
    *d = (struct format_tensor_desc){.name = t->name,
                                     .layer = t->layer,
                                     .role = t->role,
                                     .encoding = t->encoding,
                                     .n_dims = t->n_dims,
                                     .act_scale = t->act_scale};
    memcpy(d->shape, t->shape, sizeof d->shape);
    memcpy(d->bits_hist, t->bits_hist, sizeof d->bits_hist);
}

int tools_rewrite_tensor(const struct format_reader *r, uint32_t i, struct format_writer *w,
                         struct sl_err *err)
{
    const struct format_tensor_info *t = format_reader_tensor(r, i);
    void *raw = malloc(t->length ? t->length : 1);
    if (!raw) {
        sl_err_set(err, "out of memory for tensor %s", t->name);
        return -ENOMEM;
    }
    int ret = format_reader_read_tensor(r, i, raw, t->length, err);
    if (ret == 0) {
        struct format_tensor_desc d;
        tools_rewrite_desc(t, &d);
        ret = format_writer_add_tensor(w, &d, raw, t->length, err);
    }
    free(raw);
    return ret;
}

int tools_rewrite_end(struct format_reader *r, struct format_writer *w, int ret, struct sl_err *err)
{
    if (ret == 0)
        ret = format_writer_finish(w, err);
    format_writer_destroy(w);
    format_reader_close(r);
    return ret;
}

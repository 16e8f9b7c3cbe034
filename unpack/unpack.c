/* unpack.c: whole-tensor unpacking and dispatch. */
#include <errno.h>
#include <string.h>

#include "unpack.h"

static int unpack_q8(const struct format_tensor_info *t, const uint8_t *p, int8_t *q,
                     float *scale, struct sl_err *err)
{
    uint64_t rows = t->shape[0], cols = t->shape[1];
    for (uint64_t r = 0; r < rows; r++)
        scale[r] = sl_load_lef32(p + 4 * r);
    memcpy(q, p + sl_align_up(rows * 4, 64), rows * cols);
    (void)err;
    return 0;
}

int unpack_tensor_int8(const struct format_tensor_info *t, const void *data, int8_t *q_out,
                       float *scale_out, struct sl_err *err)
{
    const struct format_encoding_traits *tr = format_encoding_traits(t->encoding);
    if (!tr || !tr->quantized || t->n_dims != 2) {
        sl_err_set(err, "tensor '%s' (%s) is not a quantized matrix", t->name,
                   tr ? tr->name : "unknown encoding");
        return -EINVAL;
    }
    if (tr->size && tr->size(t->shape[0], t->shape[1]) != t->length) {
        sl_err_set(err, "tensor '%s' has %llu bytes, its shape needs %llu", t->name,
                   (unsigned long long)t->length,
                   (unsigned long long)tr->size(t->shape[0], t->shape[1]));
        return -EINVAL;
    }
    if (tr->validate) {
        int ret = tr->validate(data, t->length, t->shape[0], t->shape[1], err);
        if (ret < 0)
            return ret;
    }
    switch (t->encoding) {
    case FORMAT_ENC_Q8_CHANNEL:
        return unpack_q8(t, data, q_out, scale_out, err);
    default:
        sl_err_set(err, "tensor '%s': encoding %s cannot be unpacked by this build", t->name,
                   tr->name);
        return -EINVAL;
    }
}

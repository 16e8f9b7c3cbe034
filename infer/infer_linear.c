/* infer_linear.c: linear layers, float or int8, and their forward pass. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "infer_internal.h"
#include "npu.h"
#include "unpack.h"

int infer_linear_init(struct infer_linear *lin, const struct format_tensor_info *t,
                      const void *data, int borrow, int force_dynamic_act, struct sl_err *err)
{
    memset(lin, 0, sizeof *lin);
    lin->rows = (uint32_t)t->shape[0];
    lin->cols = (uint32_t)(t->n_dims == 2 ? t->shape[1] : 1);
    size_t n = (size_t)lin->rows * lin->cols;
    const struct format_encoding_traits *tr = format_encoding_traits(t->encoding);
    if (!tr->quantized) {
        /* F16 and BF16 stay 16-bit; all three are little-endian in the
         * container as in memory on the targets this builds for, so they can
         * be used where they lie (FORMAT_TENSOR_ALIGN keeps them aligned) */
        int half = t->encoding == FORMAT_ENC_F16 || t->encoding == FORMAT_ENC_BF16;
        lin->wtype = t->encoding == FORMAT_ENC_F16    ? INFER_W_F16
                     : t->encoding == FORMAT_ENC_BF16 ? INFER_W_BF16
                                                      : INFER_W_F32;
        if (borrow && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__) {
            lin->w = (void *)(uintptr_t)data;
            lin->w_borrowed = 1;
            return 0;
        }
        lin->w = sl_alloc_aligned(n * (half ? 2 : sizeof(float)), 64);
        if (!lin->w) {
            sl_err_set(err, "out of memory for tensor '%s'", t->name);
            return -ENOMEM;
        }
        if (half)
            memcpy(lin->w, data, n * 2);
        else if (format_decode_float(t->encoding, data, lin->w, n) < 0) {
            sl_err_set(err, "tensor '%s' has encoding %u, not a float", t->name, t->encoding);
            infer_linear_fini(lin);
            return -EINVAL;
        }
        return 0;
    }
    lin->q = sl_alloc_aligned(n, 64);
    lin->scale = malloc(sizeof(float) * lin->rows);
    if (!lin->q || !lin->scale) {
        infer_linear_fini(lin);
        sl_err_set(err, "out of memory for tensor '%s'", t->name);
        return -ENOMEM;
    }
    int ret = unpack_tensor_int8(t, data, lin->q, lin->scale, err);
    if (ret < 0) {
        sl_err_prefix(err, "tensor '%s'", t->name);
        infer_linear_fini(lin);
        return ret;
    }
    lin->act_scale = force_dynamic_act ? 0.0f : t->act_scale;
    if (!(lin->act_scale >= 0) || !isfinite(lin->act_scale)) {
        sl_err_set(err, "tensor '%s' has activation scale %g", t->name, (double)lin->act_scale);
        infer_linear_fini(lin);
        return -EINVAL;
    }
    ret = npu_weights_create(lin->q, lin->scale, lin->rows, lin->cols, &lin->npu);
    if (ret < 0) {
        sl_err_set(err, "tensor '%s': cannot prepare int8 weights (%s)", t->name, strerror(-ret));
        infer_linear_fini(lin);
        return ret;
    }
    return 0;
}

void infer_linear_fini(struct infer_linear *lin)
{
    if (!lin->w_borrowed)
        sl_free_aligned(lin->w);
    sl_free_aligned(lin->q);
    free(lin->scale);
    npu_weights_destroy(lin->npu);
    if (lin->upk) {
        unpack_tensor_fini(lin->upk);
        free(lin->upk);
    }
    sl_free_aligned(lin->packed);
    memset(lin, 0, sizeof *lin);
}

void infer_op_linear_int8(float *y, const float *x, const struct infer_linear *lin, uint32_t n,
                          int8_t *xq)
{
    size_t len = (size_t)n * lin->cols;
    float s = lin->act_scale > 0 ? lin->act_scale : npu_act_scale_dynamic(x, len);
    npu_quantize_act(x, len, s, xq);
    npu_linear_s8(lin->npu, xq, n, s, y);
}

void infer_linear_forward(const struct infer_model *m, int layer, uint32_t role,
                          const struct infer_linear *lin, float *y, const float *x, uint32_t n,
                          int8_t *xq)
{
    if (lin->w)
        infer_op_matmul(y, x, lin->w, lin->wtype, n, lin->rows, lin->cols, 0, lin->rows);
    else
        infer_op_linear_int8(y, x, lin, n, xq);
    if (m->observe)
        m->observe(m->observe_ctx, layer, role, x, n, lin->cols, y, lin->rows);
}

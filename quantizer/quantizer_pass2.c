/* quantizer_pass2.c: the quantization driver's second pass: each tensor in
 * execution order, the scalings folded, widths allocated (or the global
 * ones taken), quantized (GPTQ, block multipliers when asked), packed, its
 * static activation scale and shadow calibration, written. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "quantizer_driver.h"

/* The smoothing scales dividing a linear's input, or NULL. */
static const float *smoothing_of(const struct qctx *q, int layer, uint32_t role)
{
    if (layer >= 0) {
        int g = role <= FORMAT_ROLE_WV     ? G_QKV
                : role == FORMAT_ROLE_WO   ? G_O
                : role <= FORMAT_ROLE_W_UP ? G_GU
                                           : G_DOWN;
        return q->s[(size_t)layer * G_N + g];
    }
    return role == FORMAT_ROLE_CLASSIFIER ? q->s_cls : NULL;
}

/* Static activation scale of a linear's input after smoothing (0: dynamic)
 * into *out; -EINVAL (q->err set) when its statistics cannot give one. */
static int act_scale(const struct qctx *q, int layer, uint32_t role, float *out)
{
    *out = 0.0f;
    if (q->o->act_dynamic)
        return 0;
    if (role == FORMAT_ROLE_TOK_EMBD && !q->c->tied_embedding)
        return 0; /* only looked up */
    const struct quantizer_calib_slot *sl = qd_input_slot(q, layer, role);
    if (!sl)
        return 0; /* no calibration for it: dynamic */
    return quantizer_act_scale(layer, role, sl->in_max, smoothing_of(q, layer, role), sl->in_cols,
                               out, q->err);
}

/* Shadow outlier calibration of a decoder linear (static scale act > 0):
 * records its entry and replaces *act by the bulk scale where shadowed. */
static int shadow_linear(struct qctx *q, int layer, uint32_t role, const int8_t *codes,
                         uint32_t rows, uint32_t cols, float *act)
{
    const struct quantizer_calib_slot *sl = qd_input_slot(q, layer, role);
    if (!q->o->shadow || !(*act > 0) || !sl)
        return 0;
    if (layer < 0) /* the classifier (a tied embedding serving as one) */
        role = FORMAT_ROLE_CLASSIFIER;
    if (q->n_sh == q->cap_sh) {
        uint32_t cap = q->cap_sh ? 2 * q->cap_sh : 64;
        struct format_shadow_linear *a = realloc(q->sh, sizeof *a * cap);
        if (!a)
            goto oom;
        q->sh = a;
        q->cap_sh = cap;
    }
    struct quantizer_shadow_in in = {.opts = q->o, .layer = layer, .role = role, .rows = rows,
                                     .cols = cols, .x = sl->sample, .n_sample = sl->n_sample,
                                     .s = smoothing_of(q, layer, role), .act_max = *act,
                                     .codes = codes};
    if (quantizer_shadow_calibrate(&in, &q->sh[q->n_sh], act) < 0)
        goto oom;
    q->n_sh++;
    return 0;
oom:
    sl_err_set(q->err, "out of memory calibrating shadow execution of layer %d %s", layer,
               format_role_name(role));
    return -ENOMEM;
}

/* ---- pass 2: one tensor -------------------------------------------------------------------- */

static int emit_float(struct qctx *q, struct format_writer *w, int layer, uint32_t role,
                      const float *v, uint32_t n_dims, uint32_t rows, uint32_t cols)
{
    char name[FORMAT_NAME_MAX];
    format_tensor_name(layer, role, name, sizeof name);
    uint64_t n = (uint64_t)rows * cols;
    uint8_t *buf = malloc(n * 4);
    if (!buf) {
        sl_err_set(q->err, "out of memory writing '%s'", name);
        return -ENOMEM;
    }
    for (uint64_t i = 0; i < n; i++)
        sl_store_lef32(buf + 4 * i, v[i]);
    struct format_tensor_desc d = {.name = name,
                                   .layer = layer,
                                   .role = role,
                                   .encoding = FORMAT_ENC_F32,
                                   .n_dims = n_dims,
                                   .shape = {n_dims == 2 ? rows : n, cols}};
    if (n_dims == 1)
        d.shape[1] = 0;
    int ret = format_writer_add_tensor(w, &d, buf, n * 4, q->err);
    free(buf);
    return ret;
}

static int emit_linear(struct qctx *q, struct format_writer *w, int layer, uint32_t role,
                       const float *wf)
{
    uint32_t rows, cols;
    qd_shape_of(q->c, role, &rows, &cols);
    struct quantizer_report *rep = q->rep;
    rep->weights += (uint64_t)rows * cols;
    if (q->encoding == FORMAT_ENC_F32) {
        if (q->o->budget == QUANTIZER_BUDGET_GLOBAL)
            q->next_channel += rows;
        return emit_float(q, w, layer, role, wf, 2, rows, cols);
    }
    uint8_t *widths = malloc(rows);
    int8_t *codes = malloc((size_t)rows * cols);
    float *scales = malloc(sizeof(float) * rows), *tmp = malloc(sizeof(float) * cols);
    float *cw = NULL;
    void *bytes = NULL;
    uint64_t len = 0;
    int8_t *npu = NULL; /* block multipliers: the int8 values the NPU sees */
    uint8_t *mult = NULL;
    int ret = -ENOMEM;
    if (!widths || !codes || !scales || !tmp) {
        sl_err_set(q->err, "out of memory quantizing layer %d %s", layer, format_role_name(role));
        goto out;
    }
    if (q->widths) { /* global allocation (pass 1) */
        memcpy(widths, q->widths + q->next_channel, rows);
        q->next_channel += rows;
    } else {
        cw = qd_cmpq_weights(q, layer, role, rows);
        struct quantizer_tensor_rule r = qd_rule_for(q, cw);
        ret = quantizer_tensor_widths(wf, rows, cols, NULL, &r, widths);
        if (ret < 0) {
            sl_err_set(q->err, "bit allocation failed for layer %d %s (%s)", layer,
                       format_role_name(role), strerror(-ret));
            goto out;
        }
    }
    quantizer_tensor_quantize(wf, rows, cols, NULL, widths, q->clip, codes, scales, tmp);
    if (q->o->block_mult && q->o->gptq && layer >= 0 && qd_input_slot(q, layer, role)) {
        const struct quantizer_calib_slot *sl = qd_input_slot(q, layer, role);
        npu = malloc((size_t)rows * cols);
        mult = malloc((size_t)rows * format_packed_mult_blocks(cols));
        if (!npu || !mult ||
            (ret = quantizer_mult(wf, rows, cols, sl->sample, sl->n_sample,
                                  smoothing_of(q, layer, role), widths, scales, codes, mult,
                                  npu)) < 0) {
            ret = -ENOMEM;
            sl_err_set(q->err, "out of memory rounding layer %d %s with block multipliers",
                       layer, format_role_name(role));
            goto out;
        }
        rep->mult_bytes += (2ull * rows * format_packed_mult_blocks(cols) + 7) / 8;
    } else if (q->o->gptq && layer >= 0) {
        const struct quantizer_calib_slot *sl = qd_input_slot(q, layer, role);
        /* the weights are folded (W diag(s)): the inputs they see are x / s */
        if (sl && (ret = quantizer_gptq(wf, rows, cols, sl->sample, sl->n_sample,
                                        smoothing_of(q, layer, role), widths, scales,
                                        codes)) < 0) {
            sl_err_set(q->err, "out of memory compensating layer %d %s", layer,
                       format_role_name(role));
            goto out;
        }
    }
    ret = quantizer_pack_mult(q->encoding, codes, widths, scales, rows, cols, mult, &bytes, &len,
                              q->err);
    if (ret < 0)
        goto out;
    float act;
    if ((ret = act_scale(q, layer, role, &act)) < 0 ||
        (ret = shadow_linear(q, layer, role, npu ? npu : codes, rows, cols, &act)) < 0)
        goto out;
    char name[FORMAT_NAME_MAX];
    format_tensor_name(layer, role, name, sizeof name);
    struct format_tensor_desc d = {.name = name,
                                   .layer = layer,
                                   .role = role,
                                   .encoding = q->encoding,
                                   .n_dims = 2,
                                   .shape = {rows, cols},
                                   .act_scale = act};
    for (uint32_t r = 0; r < rows; r++) {
        d.bits_hist[widths[r]]++;
        rep->hist[role][widths[r]]++;
    }
    rep->code_bytes += len;
    ret = format_writer_add_tensor(w, &d, bytes, len, q->err);
out:
    free(bytes);
    free(npu);
    free(mult);
    free(cw);
    free(widths);
    free(codes);
    free(scales);
    free(tmp);
    return ret;
}

int qd_pass2(struct qctx *q, struct format_writer *w)
{
    const struct format_config *c = q->c;
    int ret;
    q->next_channel = 0;
    if (!c->tied_embedding) {
        float *emb;
        if ((ret = qd_read_f32(q, -1, FORMAT_ROLE_TOK_EMBD, &emb)) < 0)
            return ret;
        ret = emit_linear(q, w, -1, FORMAT_ROLE_TOK_EMBD, emb);
        free(emb);
        if (ret < 0)
            return ret;
    }
    for (uint32_t li = 0; li < c->n_layers; li++) {
        struct qd_layer l;
        if ((ret = qd_layer_load(q, (int)li, &l)) < 0)
            return ret;
        qd_fold_layer(c, &l, q->s + (size_t)li * G_N);
        for (uint32_t r = FORMAT_ROLE_ATTN_NORM; ret == 0 && r <= FORMAT_ROLE_W_DOWN; r++) {
            if (r == FORMAT_ROLE_ATTN_NORM || r == FORMAT_ROLE_FFN_NORM)
                ret = emit_float(q, w, (int)li, r, l.t[r], 1, c->dim, 1);
            else
                ret = emit_linear(q, w, (int)li, r, l.t[r]);
        }
        qd_layer_free(&l);
        if (ret < 0)
            return ret;
        qd_progress(q, "quantizing", li + 1, c->n_layers + 1);
    }
    float *cls = NULL, *onorm = NULL;
    uint32_t cls_role = c->tied_embedding ? FORMAT_ROLE_TOK_EMBD : FORMAT_ROLE_CLASSIFIER;
    ret = qd_read_f32(q, -1, cls_role, &cls);
    if (ret == 0)
        ret = qd_read_f32(q, -1, FORMAT_ROLE_OUT_NORM, &onorm);
    if (ret == 0) {
        qd_fold_classifier(q, cls, onorm);
        ret = emit_float(q, w, -1, FORMAT_ROLE_OUT_NORM, onorm, 1, c->dim, 1);
    }
    if (ret == 0)
        ret = emit_linear(q, w, -1, cls_role, cls);
    free(cls);
    free(onorm);
    qd_progress(q, "quantizing", c->n_layers + 1, c->n_layers + 1);
    return ret;
}

/* quantizer_source.c: what the quantization driver reads: the float
 * tensors of the source container, the calibration slots of a linear's
 * input and output, each role's shape, the per-tensor rule of the method,
 * and one layer's float tensors at a time. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quantizer_driver.h"

void qd_progress(struct qctx *q, const char *what, uint64_t done, uint64_t total)
{
    if (q->o->progress)
        q->o->progress(q->o->progress_ctx, what, done, total);
}

int qd_read_f32(struct qctx *q, int layer, uint32_t role, float **out)
{
    *out = NULL;
    int i = format_reader_find(q->src, layer, role);
    if (i < 0) {
        sl_err_set(q->err, "%s: no %s tensor in layer %d", format_reader_path(q->src),
                   format_role_name(role), layer);
        return -EINVAL;
    }
    const struct format_tensor_info *t = format_reader_tensor(q->src, (uint32_t)i);
    if (format_encoding_traits(t->encoding)->quantized) {
        sl_err_set(q->err, "%s: tensor '%s' is already quantized (%s); quantize a float model",
                   format_reader_path(q->src), t->name, format_encoding_traits(t->encoding)->name);
        return -EINVAL;
    }
    uint64_t n = format_tensor_numel(t);
    void *raw = malloc(t->length ? t->length : 1);
    float *f = malloc(sizeof(float) * (n ? n : 1));
    if (!raw || !f) {
        free(raw);
        free(f);
        sl_err_set(q->err, "%s: out of memory reading '%s'", format_reader_path(q->src), t->name);
        return -ENOMEM;
    }
    int ret = format_reader_read_tensor(q->src, (uint32_t)i, raw, t->length, q->err);
    if (ret == 0)
        ret = format_decode_float(t->encoding, raw, f, n);
    free(raw);
    if (ret < 0) {
        if (!q->err->msg[0])
            sl_err_set(q->err, "%s: cannot decode '%s'", format_reader_path(q->src), t->name);
        free(f);
        return ret;
    }
    *out = f;
    return 0;
}

static const struct quantizer_calib_slot *slot(const struct qctx *q, int layer, uint32_t role)
{
    if (!q->calib) /* no calibration: no smoothing, dynamic activation scales */
        return NULL;
    const struct quantizer_calib_slot *s = quantizer_calib_slot(q->calib, layer, role);
    return s && s->out_max ? s : NULL;
}

/* The slot holding the input statistics of a role's input. */
const struct quantizer_calib_slot *qd_input_slot(const struct qctx *q, int layer, uint32_t role)
{
    uint32_t key = role == FORMAT_ROLE_WK || role == FORMAT_ROLE_WV ? FORMAT_ROLE_WQ
                   : role == FORMAT_ROLE_W_UP                       ? FORMAT_ROLE_W_GATE
                   : role == FORMAT_ROLE_TOK_EMBD                   ? FORMAT_ROLE_CLASSIFIER
                                                                    : role;
    const struct quantizer_calib_slot *s = slot(q, layer, key);
    return s && s->in_max ? s : NULL;
}

/* ---- shapes and rules -------------------------------------------------------------------- */

void qd_shape_of(const struct format_config *c, uint32_t role, uint32_t *rows, uint32_t *cols)
{
    uint32_t nd;
    uint64_t sh[FORMAT_MAX_DIMS] = {0};
    format_role_shape(
        c, role == FORMAT_ROLE_CLASSIFIER && c->tied_embedding ? FORMAT_ROLE_TOK_EMBD : role, &nd,
        sh);
    *rows = (uint32_t)sh[0];
    *cols = nd == 2 ? (uint32_t)sh[1] : 1;
}

int qd_uses_smoothing(enum quantizer_method m)
{
    return m == QUANTIZER_METHOD_EDGEFLOW || m == QUANTIZER_METHOD_SMOOTHQUANT;
}

int qd_uses_allocation(const struct quantizer_opts *o)
{
    return (o->method == QUANTIZER_METHOD_EDGEFLOW || o->method == QUANTIZER_METHOD_CMPQ) &&
           !o->uniform_widths;
}

struct quantizer_tensor_rule qd_rule_for(const struct qctx *q, const float *out_max)
{
    struct quantizer_tensor_rule r = {.bits = q->o->bits, .metric = q->o->metric, .clip = q->clip};
    if (!qd_uses_allocation(q->o))
        r.uniform_bits = (uint8_t)q->o->bits;
    if (q->o->method == QUANTIZER_METHOD_CMPQ)
        r.row_weight = out_max;
    return r;
}

/* cmpq's channel weights S_O^2 (a floor keeps silent channels allocatable). */
float *qd_cmpq_weights(const struct qctx *q, int layer, uint32_t role, uint32_t rows)
{
    if (q->o->method != QUANTIZER_METHOD_CMPQ)
        return NULL;
    const struct quantizer_calib_slot *sl =
        slot(q, layer, role == FORMAT_ROLE_TOK_EMBD ? FORMAT_ROLE_CLASSIFIER : role);
    if (!sl || sl->out_cols != rows || (role == FORMAT_ROLE_TOK_EMBD && !q->c->tied_embedding))
        return NULL;
    float *w = malloc(sizeof(float) * rows);
    if (!w)
        return NULL;
    float mx = 0;
    for (uint32_t r = 0; r < rows; r++)
        mx = fmaxf(mx, sl->out_max[r]);
    for (uint32_t r = 0; r < rows; r++) {
        float v = sl->out_max[r] * sl->out_max[r];
        w[r] = fmaxf(v, 1e-6f * mx * mx + 1e-30f);
    }
    return w;
}

/* ---- one layer's float tensors ------------------------------------------------------------ */

void qd_layer_free(struct qd_layer *l)
{
    for (int r = 0; r < FORMAT_ROLE_COUNT; r++)
        free(l->t[r]);
    memset(l, 0, sizeof *l);
}

int qd_layer_load(struct qctx *q, int layer, struct qd_layer *l)
{
    memset(l, 0, sizeof *l);
    for (uint32_t r = FORMAT_ROLE_ATTN_NORM; r <= FORMAT_ROLE_W_DOWN; r++) {
        int ret = qd_read_f32(q, layer, r, &l->t[r]);
        if (ret < 0) {
            qd_layer_free(l);
            return ret;
        }
    }
    return 0;
}

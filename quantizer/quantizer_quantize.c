/* quantizer_quantize.c: the quantization driver. Two passes over the float
 * source, one layer in memory at a time:
 *   1. smoothing: choose each group's input scaling (EdgeFlow: alpha by grid
 *      search; SmoothQuant: its migration formula; uniform, CMPQ: none) and
 *      record per-channel RE curves of the smoothed weights;
 *   2. allocation (per tensor, or once over the whole model), quantization,
 *      packing, writing (execution order, atomically).
 * Norm weights stay float with the smoothing folded in; every linear layer
 * (and the token embedding) is stored in a packed encoding. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quantizer_import_internal.h"
#include "quantizer_smooth.h"

static const char *const method_names[QUANTIZER_METHOD_COUNT] = {"edgeflow", "uniform",
                                                                 "smoothquant", "cmpq"};

const char *quantizer_method_name(enum quantizer_method m)
{
    return (unsigned)m < QUANTIZER_METHOD_COUNT ? method_names[m] : "unknown";
}

int quantizer_method_parse(const char *s, enum quantizer_method *out)
{
    for (int i = 0; i < QUANTIZER_METHOD_COUNT; i++)
        if (!strcmp(s, method_names[i])) {
            *out = (enum quantizer_method)i;
            return 0;
        }
    return -EINVAL;
}

/* Smoothing groups of a layer. */
enum { G_QKV, G_O, G_GU, G_DOWN, G_N };

struct qctx {
    const struct quantizer_opts *o;
    const struct quantizer_calib *calib;
    struct format_reader *src;
    const struct format_config *c;
    float *s[4097][G_N];      /* per layer, per group: input scaling (NULL: none) */
    float *s_cls;             /* classifier group (untied) */
    double alpha_sum;
    uint32_t alpha_n;
    /* global allocation */
    double *re;               /* [channels][9] */
    double *weight;
    uint64_t *cost;
    uint8_t *widths;
    uint64_t n_channels, next_channel;
    struct sl_err *err;
};

static int read_f32(struct qctx *q, int layer, uint32_t role, float **out)
{
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
    void *raw = malloc(t->length);
    uint64_t n = format_tensor_numel(t);
    *out = malloc(sizeof(float) * n);
    if (!raw || !*out) {
        free(raw);
        free(*out);
        sl_err_set(q->err, "out of memory reading '%s'", t->name);
        return -ENOMEM;
    }
    int ret = format_reader_read_tensor(q->src, (uint32_t)i, raw, t->length, q->err);
    if (ret == 0)
        format_decode_float(t->encoding, raw, *out, n);
    free(raw);
    if (ret < 0) {
        free(*out);
        *out = NULL;
    }
    return ret;
}

static const struct quantizer_calib_slot *slot(struct qctx *q, int layer, uint32_t role)
{
    if (!q->calib) /* no calibration: no smoothing, dynamic activation scales */
        return NULL;
    const struct quantizer_calib_slot *s = quantizer_calib_slot(q->calib, layer, role);
    return s && s->out_max ? s : NULL;
}

/* ---- per-layer tensors -------------------------------------------------------------- */

struct layer_f {
    float *t[FORMAT_ROLE_COUNT];
};

static void layer_free(struct layer_f *l)
{
    for (int r = 0; r < FORMAT_ROLE_COUNT; r++)
        free(l->t[r]);
    memset(l, 0, sizeof *l);
}

static int layer_load(struct qctx *q, int layer, struct layer_f *l)
{
    memset(l, 0, sizeof *l);
    for (uint32_t r = FORMAT_ROLE_ATTN_NORM; r <= FORMAT_ROLE_W_DOWN; r++) {
        int ret = read_f32(q, layer, r, &l->t[r]);
        if (ret < 0) {
            layer_free(l);
            return ret;
        }
    }
    return 0;
}

static uint32_t rows_of(const struct format_config *c, uint32_t role)
{
    uint32_t nd;
    uint64_t sh[2];
    format_role_shape(c, role == FORMAT_ROLE_CLASSIFIER && c->tied_embedding ? FORMAT_ROLE_TOK_EMBD
                                                                             : role,
                      &nd, sh);
    return (uint32_t)sh[0];
}

static uint32_t cols_of(const struct format_config *c, uint32_t role)
{
    uint32_t nd;
    uint64_t sh[2];
    format_role_shape(c, role == FORMAT_ROLE_CLASSIFIER && c->tied_embedding ? FORMAT_ROLE_TOK_EMBD
                                                                             : role,
                      &nd, sh);
    return nd == 2 ? (uint32_t)sh[1] : 1;
}

static int uses_smoothing(enum quantizer_method m)
{
    return m == QUANTIZER_METHOD_EDGEFLOW || m == QUANTIZER_METHOD_SMOOTHQUANT;
}

static struct qs_alloc alloc_for(const struct qctx *q, const float *out_max)
{
    struct qs_alloc a = {.bits = q->o->bits};
    if (q->o->method == QUANTIZER_METHOD_UNIFORM || q->o->method == QUANTIZER_METHOD_SMOOTHQUANT)
        a.uniform_bits = (uint8_t)q->o->bits;
    if (q->o->method == QUANTIZER_METHOD_CMPQ)
        a.out_max = out_max;
    return a;
}

/* S_I of the o projection made common to each kv group: channel (h, d) gets
 * the max over the query heads sharing kv head h / (n_heads / n_kv_heads). */
static float *o_group_max(const struct format_config *c, const float *in_max)
{
    uint32_t hd = c->head_dim, mul = c->n_heads / c->n_kv_heads;
    float *m = malloc(sizeof(float) * c->n_heads * hd);
    if (!m)
        return NULL;
    for (uint32_t kv = 0; kv < c->n_kv_heads; kv++)
        for (uint32_t d = 0; d < hd; d++) {
            float v = 0;
            for (uint32_t k = 0; k < mul; k++)
                v = fmaxf(v, in_max[(kv * mul + k) * hd + d]);
            for (uint32_t k = 0; k < mul; k++)
                m[(kv * mul + k) * hd + d] = v;
        }
    return m;
}

/* Chooses the input scaling of one group; NULL when the method does not
 * smooth or calibration has no inputs for it. */
static int choose_scaling(struct qctx *q, const struct quantizer_calib_slot *sl,
                          const float *in_max, struct qs_member *m, int nm, const float *out_max,
                          float **s_out)
{
    *s_out = NULL;
    if (!uses_smoothing(q->o->method) || !sl || !in_max)
        return 0;
    uint32_t in = m[0].cols;
    float *s = malloc(sizeof(float) * in);
    if (!s) {
        sl_err_set(q->err, "out of memory");
        return -ENOMEM;
    }
    if (q->o->method == QUANTIZER_METHOD_SMOOTHQUANT) {
        qs_smoothquant_scales(in_max, in, m, nm, q->o->alpha >= 0 ? q->o->alpha : 0.5, s);
    } else if (q->o->alpha >= 0) {
        qs_scales(in_max, in, q->o->alpha, s);
        q->alpha_sum += q->o->alpha;
        q->alpha_n++;
    } else {
        struct qs_group g = {.in = in, .in_max = in_max, .x = sl->sample,
                             .n_sample = sl->n_sample, .nm = nm};
        memcpy(g.m, m, sizeof(struct qs_member) * (size_t)nm);
        struct qs_alloc a = alloc_for(q, out_max);
        double alpha = qs_search_alpha(&g, &a, s, NULL);
        q->alpha_sum += alpha;
        q->alpha_n++;
    }
    *s_out = s;
    return 0;
}

/* Folds the layer's group scalings into its float tensors (in place): norm /
 * s, columns * s; o: v rows / s; down: up rows / s. */
static void fold_layer(const struct format_config *c, struct layer_f *l, float *const s[G_N])
{
    uint32_t D = c->dim, F = c->hidden_dim, Q = c->n_heads * c->head_dim;
    uint32_t KV = c->n_kv_heads * c->head_dim, mul = c->n_heads / c->n_kv_heads;
    if (s[G_QKV]) {
        for (uint32_t j = 0; j < D; j++)
            l->t[FORMAT_ROLE_ATTN_NORM][j] /= s[G_QKV][j];
        uint32_t roles[3] = {FORMAT_ROLE_WQ, FORMAT_ROLE_WK, FORMAT_ROLE_WV};
        uint32_t rows[3] = {Q, KV, KV};
        for (int k = 0; k < 3; k++)
            for (uint32_t r = 0; r < rows[k]; r++)
                for (uint32_t j = 0; j < D; j++)
                    l->t[roles[k]][(size_t)r * D + j] *= s[G_QKV][j];
    }
    if (s[G_O]) {
        for (uint32_t r = 0; r < D; r++)
            for (uint32_t j = 0; j < Q; j++)
                l->t[FORMAT_ROLE_WO][(size_t)r * Q + j] *= s[G_O][j];
        for (uint32_t kv = 0; kv < c->n_kv_heads; kv++)
            for (uint32_t d = 0; d < c->head_dim; d++) {
                float sv = s[G_O][(kv * mul) * c->head_dim + d]; /* common to the group */
                float *row = l->t[FORMAT_ROLE_WV] + (size_t)(kv * c->head_dim + d) * D;
                for (uint32_t j = 0; j < D; j++)
                    row[j] /= sv;
            }
    }
    if (s[G_GU]) {
        for (uint32_t j = 0; j < D; j++)
            l->t[FORMAT_ROLE_FFN_NORM][j] /= s[G_GU][j];
        for (uint32_t r = 0; r < F; r++)
            for (uint32_t j = 0; j < D; j++) {
                l->t[FORMAT_ROLE_W_GATE][(size_t)r * D + j] *= s[G_GU][j];
                l->t[FORMAT_ROLE_W_UP][(size_t)r * D + j] *= s[G_GU][j];
            }
    }
    if (s[G_DOWN]) {
        for (uint32_t r = 0; r < D; r++)
            for (uint32_t j = 0; j < F; j++)
                l->t[FORMAT_ROLE_W_DOWN][(size_t)r * F + j] *= s[G_DOWN][j];
        for (uint32_t r = 0; r < F; r++)
            for (uint32_t j = 0; j < D; j++)
                l->t[FORMAT_ROLE_W_UP][(size_t)r * D + j] /= s[G_DOWN][r];
    }
}

/* Pass 1 for one layer: choose the four scalings. */
static int smooth_layer(struct qctx *q, int layer, struct layer_f *l)
{
    const struct format_config *c = q->c;
    uint32_t D = c->dim, F = c->hidden_dim, Q = c->n_heads * c->head_dim;
    uint32_t KV = c->n_kv_heads * c->head_dim;
    const struct quantizer_calib_slot *sq = slot(q, layer, FORMAT_ROLE_WQ);
    const struct quantizer_calib_slot *so = slot(q, layer, FORMAT_ROLE_WO);
    const struct quantizer_calib_slot *sg = slot(q, layer, FORMAT_ROLE_W_GATE);
    const struct quantizer_calib_slot *sd = slot(q, layer, FORMAT_ROLE_W_DOWN);
    struct qs_member qkv[3] = {{l->t[FORMAT_ROLE_WQ], Q, D},
                               {l->t[FORMAT_ROLE_WK], KV, D},
                               {l->t[FORMAT_ROLE_WV], KV, D}};
    struct qs_member o[1] = {{l->t[FORMAT_ROLE_WO], D, Q}};
    struct qs_member gu[2] = {{l->t[FORMAT_ROLE_W_GATE], F, D}, {l->t[FORMAT_ROLE_W_UP], F, D}};
    struct qs_member dn[1] = {{l->t[FORMAT_ROLE_W_DOWN], D, F}};
    float *omax = so && so->in_max ? o_group_max(c, so->in_max) : NULL;
    int ret = choose_scaling(q, sq, sq ? sq->in_max : NULL, qkv, 3, sq ? sq->out_max : NULL,
                             &q->s[layer][G_QKV]);
    if (!ret)
        ret = choose_scaling(q, so, omax, o, 1, so ? so->out_max : NULL, &q->s[layer][G_O]);
    if (!ret)
        ret = choose_scaling(q, sg, sg ? sg->in_max : NULL, gu, 2, sg ? sg->out_max : NULL,
                             &q->s[layer][G_GU]);
    if (!ret)
        ret = choose_scaling(q, sd, sd ? sd->in_max : NULL, dn, 1, sd ? sd->out_max : NULL,
                             &q->s[layer][G_DOWN]);
    free(omax);
    return ret;
}

/* Static activation scale of a linear's input after smoothing. */
static float act_scale(struct qctx *q, int layer, uint32_t role)
{
    if (q->o->act_dynamic)
        return 0.0f;
    uint32_t key = role == FORMAT_ROLE_WK || role == FORMAT_ROLE_WV ? FORMAT_ROLE_WQ
                   : role == FORMAT_ROLE_W_UP                         ? FORMAT_ROLE_W_GATE
                                                                      : role;
    const struct quantizer_calib_slot *sl = slot(q, layer, key);
    if (!sl || !sl->in_max)
        return 0.0f; /* no calibration for it: dynamic */
    const float *s = NULL;
    if (layer >= 0) {
        int g = key == FORMAT_ROLE_WQ ? G_QKV : key == FORMAT_ROLE_WO ? G_O
                : key == FORMAT_ROLE_W_GATE ? G_GU : G_DOWN;
        s = q->s[layer][g];
    } else {
        s = q->s_cls;
    }
    float m = qs_act_max(sl->in_max, s, sl->in_cols);
    return m > 0 ? m / 127.0f : 0.0f;
}

/* ---- allocation bookkeeping --------------------------------------------------------------- */

/* Records a tensor's channels for the global heap (pass 1). */
static void record_channels(struct qctx *q, const float *w, uint32_t rows, uint32_t cols,
                            const float *out_max)
{
    double *re = q->re + q->next_channel * 9;
    qs_channel_stats(w, rows, cols, NULL, re, 1.0);
    double sum = 0;
    if (out_max)
        for (uint32_t r = 0; r < rows; r++)
            sum += (double)out_max[r] * out_max[r];
    for (uint32_t r = 0; r < rows; r++) {
        /* each tensor's mean RE counts equally; cmpq weights by output energy */
        double wt = 1.0 / rows;
        if (out_max && sum > 0)
            wt = ((double)out_max[r] * out_max[r] + 1e-30) / sum;
        q->weight[q->next_channel + r] = wt;
        q->cost[q->next_channel + r] = cols;
    }
    q->next_channel += rows;
}

/* ---- pass 2: one tensor --------------------------------------------------------------------- */

static int emit_linear(struct qctx *q, struct format_writer *w, int layer, uint32_t role,
                       const float *wf, struct quantizer_report *rep)
{
    const struct format_config *c = q->c;
    uint32_t rows = rows_of(c, role), cols = cols_of(c, role);
    uint8_t *widths = malloc(rows);
    int8_t *codes = malloc((size_t)rows * cols);
    float *scales = malloc(sizeof(float) * rows), *tmp = malloc(sizeof(float) * cols);
    void *bytes = NULL;
    uint64_t len = 0;
    int ret = -ENOMEM;
    if (!widths || !codes || !scales || !tmp) {
        sl_err_set(q->err, "out of memory quantizing layer %d %s", layer, format_role_name(role));
        goto out;
    }
    /* the tied embedding is the classifier; an untied one is only looked up */
    uint32_t srole = role == FORMAT_ROLE_TOK_EMBD ? FORMAT_ROLE_CLASSIFIER : role;
    const struct quantizer_calib_slot *sl =
        role == FORMAT_ROLE_TOK_EMBD && !c->tied_embedding ? NULL : slot(q, layer, srole);
    if (q->o->budget == QUANTIZER_BUDGET_GLOBAL) {
        memcpy(widths, q->widths + q->next_channel, rows);
        q->next_channel += rows;
    } else {
        struct qs_alloc a = alloc_for(q, sl ? sl->out_max : NULL);
        ret = qs_widths(wf, rows, cols, NULL, &a, widths);
        if (ret < 0) {
            sl_err_set(q->err, "bit allocation failed for layer %d %s", layer,
                       format_role_name(role));
            goto out;
        }
    }
    /* beta = 1 (W diag(S_O^-1), the factor folded back into the
     * dequantization scale) is the identity for symmetric per-output-channel
     * weights dequantized in float: scale(W_i / S_O,i) * S_O,i = scale(W_i)
     * and the codes are equal. The emulated NPU dequantizes its int32 output
     * per channel, so the output side needs nothing more. */
    qs_quantize(wf, rows, cols, NULL, widths, codes, scales, tmp);
    ret = quantizer_pack(q->o->encoding, codes, widths, scales, rows, cols, &bytes, &len, q->err);
    if (ret < 0)
        goto out;
    char name[FORMAT_NAME_MAX];
    qi_tensor_name(layer, role, name, sizeof name);
    struct format_tensor_desc d = {.name = name, .layer = layer, .role = role,
                                   .encoding = q->o->encoding, .n_dims = 2,
                                   .shape = {rows, cols}};
    if (role != FORMAT_ROLE_TOK_EMBD || c->tied_embedding)
        d.act_scale = act_scale(q, layer, srole);
    for (uint32_t r = 0; r < rows; r++) {
        d.bits_hist[widths[r]]++;
        rep->hist[role][widths[r]]++;
    }
    rep->weights += (uint64_t)rows * cols;
    rep->code_bytes += len;
    ret = format_writer_add_tensor(w, &d, bytes, len, q->err);
out:
    free(bytes);
    free(widths);
    free(codes);
    free(scales);
    free(tmp);
    return ret;
}

static int emit_norm(struct qctx *q, struct format_writer *w, int layer, uint32_t role,
                     const float *v)
{
    char name[FORMAT_NAME_MAX];
    qi_tensor_name(layer, role, name, sizeof name);
    uint32_t n = q->c->dim;
    uint8_t *buf = malloc((size_t)n * 4);
    if (!buf) {
        sl_err_set(q->err, "out of memory");
        return -ENOMEM;
    }
    for (uint32_t i = 0; i < n; i++)
        sl_store_lef32(buf + 4 * i, v[i]);
    struct format_tensor_desc d = {.name = name, .layer = layer, .role = role,
                                   .encoding = FORMAT_ENC_F32, .n_dims = 1, .shape = {n}};
    int ret = format_writer_add_tensor(w, &d, buf, (uint64_t)n * 4, q->err);
    free(buf);
    return ret;
}

/* ---- the two passes ------------------------------------------------------------------------ */

static void progress(struct qctx *q, const char *what, uint64_t done, uint64_t total)
{
    if (q->o->progress)
        q->o->progress(q->o->progress_ctx, what, done, total);
}

/* The classifier group (untied models): smoothing folded into the output norm. */
static int smooth_classifier(struct qctx *q, float *cls, float *out_norm)
{
    const struct format_config *c = q->c;
    if (c->tied_embedding)
        return 0; /* the classifier is the embedding: scaling it would change lookups */
    const struct quantizer_calib_slot *sl = slot(q, -1, FORMAT_ROLE_CLASSIFIER);
    struct qs_member m[1] = {{cls, c->vocab_size, c->dim}};
    int ret = choose_scaling(q, sl, sl ? sl->in_max : NULL, m, 1, sl ? sl->out_max : NULL,
                             &q->s_cls);
    if (ret < 0 || !q->s_cls || !cls)
        return ret;
    return 0;
}

static void fold_classifier(struct qctx *q, float *cls, float *out_norm)
{
    if (!q->s_cls)
        return;
    uint32_t D = q->c->dim;
    for (uint32_t j = 0; j < D; j++)
        out_norm[j] /= q->s_cls[j];
    for (uint32_t r = 0; r < q->c->vocab_size; r++)
        for (uint32_t j = 0; j < D; j++)
            cls[(size_t)r * D + j] *= q->s_cls[j];
}

static int pass1(struct qctx *q)
{
    const struct format_config *c = q->c;
    int ret = 0;
    int global = q->o->budget == QUANTIZER_BUDGET_GLOBAL;
    if (global) {
        uint64_t ch = (uint64_t)c->n_layers * (rows_of(c, FORMAT_ROLE_WQ) + rows_of(c, FORMAT_ROLE_WK) +
                                      rows_of(c, FORMAT_ROLE_WV) + rows_of(c, FORMAT_ROLE_WO) +
                                      rows_of(c, FORMAT_ROLE_W_GATE) +
                                      rows_of(c, FORMAT_ROLE_W_UP) +
                                      rows_of(c, FORMAT_ROLE_W_DOWN)) +
             (c->tied_embedding ? 1 : 2) * (uint64_t)c->vocab_size;
        q->n_channels = ch;
        q->re = malloc(sizeof(double) * 9 * ch);
        q->weight = malloc(sizeof(double) * ch);
        q->cost = malloc(sizeof(uint64_t) * ch);
        q->widths = malloc(ch);
        if (!q->re || !q->weight || !q->cost || !q->widths) {
            sl_err_set(q->err, "out of memory for %" PRIu64 " channels", ch);
            return -ENOMEM;
        }
    }
    float *emb = NULL;
    if (global && !c->tied_embedding) {
        ret = read_f32(q, -1, FORMAT_ROLE_TOK_EMBD, &emb);
        if (ret < 0)
            return ret;
        record_channels(q, emb, c->vocab_size, c->dim, NULL);
        free(emb);
    }
    for (uint32_t li = 0; li < c->n_layers; li++) {
        struct layer_f l;
        ret = layer_load(q, (int)li, &l);
        if (ret < 0)
            return ret;
        ret = smooth_layer(q, (int)li, &l);
        if (ret == 0 && global) {
            fold_layer(c, &l, q->s[li]);
            for (uint32_t r = FORMAT_ROLE_WQ; r <= FORMAT_ROLE_W_DOWN; r++) {
                if (r == FORMAT_ROLE_FFN_NORM)
                    continue;
                const struct quantizer_calib_slot *sl = slot(q, (int)li, r);
                record_channels(q, l.t[r], rows_of(c, r), cols_of(c, r),
                                q->o->method == QUANTIZER_METHOD_CMPQ && sl ? sl->out_max : NULL);
            }
        }
        layer_free(&l);
        if (ret < 0)
            return ret;
        progress(q, "smoothing", li + 1, c->n_layers + 1);
    }
    float *cls = NULL, *onorm = NULL;
    ret = read_f32(q, -1, FORMAT_ROLE_CLASSIFIER, &cls);
    if (ret == 0)
        ret = read_f32(q, -1, FORMAT_ROLE_OUT_NORM, &onorm);
    if (ret == 0)
        ret = smooth_classifier(q, cls, onorm);
    if (ret == 0 && global) {
        fold_classifier(q, cls, onorm);
        const struct quantizer_calib_slot *sl = slot(q, -1, FORMAT_ROLE_CLASSIFIER);
        record_channels(q, cls, c->vocab_size, c->dim,
                        q->o->method == QUANTIZER_METHOD_CMPQ && sl ? sl->out_max : NULL);
    }
    free(cls);
    free(onorm);
    if (ret < 0)
        return ret;
    if (global) {
        if (q->o->method == QUANTIZER_METHOD_UNIFORM ||
            q->o->method == QUANTIZER_METHOD_SMOOTHQUANT) {
            memset(q->widths, (int)q->o->bits, q->n_channels);
        } else {
            ret = quantizer_allocate((uint32_t)q->n_channels, q->re, q->weight, q->cost,
                                     q->o->bits, q->widths);
            if (ret < 0) {
                sl_err_set(q->err, "global bit allocation failed");
                return ret;
            }
        }
    }
    progress(q, "smoothing", c->n_layers + 1, c->n_layers + 1);
    return 0;
}

static int pass2(struct qctx *q, struct format_writer *w, struct quantizer_report *rep)
{
    const struct format_config *c = q->c;
    int ret;
    q->next_channel = 0;
    if (!c->tied_embedding) {
        float *emb;
        ret = read_f32(q, -1, FORMAT_ROLE_TOK_EMBD, &emb);
        if (ret < 0)
            return ret;
        ret = emit_linear(q, w, -1, FORMAT_ROLE_TOK_EMBD, emb, rep);
        free(emb);
        if (ret < 0)
            return ret;
    }
    for (uint32_t li = 0; li < c->n_layers; li++) {
        struct layer_f l;
        ret = layer_load(q, (int)li, &l);
        if (ret < 0)
            return ret;
        fold_layer(c, &l, q->s[li]);
        for (uint32_t r = FORMAT_ROLE_ATTN_NORM; ret == 0 && r <= FORMAT_ROLE_W_DOWN; r++) {
            if (r == FORMAT_ROLE_ATTN_NORM || r == FORMAT_ROLE_FFN_NORM)
                ret = emit_norm(q, w, (int)li, r, l.t[r]);
            else
                ret = emit_linear(q, w, (int)li, r, l.t[r], rep);
        }
        layer_free(&l);
        if (ret < 0)
            return ret;
        progress(q, "quantizing", li + 1, c->n_layers + 1);
    }
    float *cls = NULL, *onorm = NULL;
    ret = read_f32(q, -1, FORMAT_ROLE_CLASSIFIER, &cls);
    if (ret == 0)
        ret = read_f32(q, -1, FORMAT_ROLE_OUT_NORM, &onorm);
    if (ret == 0) {
        fold_classifier(q, cls, onorm);
        ret = emit_norm(q, w, -1, FORMAT_ROLE_OUT_NORM, onorm);
    }
    if (ret == 0)
        ret = emit_linear(q, w, -1,
                          c->tied_embedding ? FORMAT_ROLE_TOK_EMBD : FORMAT_ROLE_CLASSIFIER, cls,
                          rep);
    free(cls);
    free(onorm);
    progress(q, "quantizing", c->n_layers + 1, c->n_layers + 1);
    return ret;
}

static int copy_meta(struct format_reader *src, struct format_writer *w, struct sl_err *err)
{
    for (uint32_t i = 0; i < format_reader_meta_count(src); i++) {
        const char *k = format_reader_meta_key(src, i);
        const void *v;
        size_t len;
        format_reader_meta_get(src, k, &v, &len);
        int ret = format_writer_set_meta(w, k, v, len, err);
        if (ret < 0)
            return ret;
    }
    return 0;
}

static int set_meta_str(struct format_writer *w, const char *k, const char *v, struct sl_err *err)
{
    return format_writer_set_meta(w, k, v, strlen(v), err);
}

int quantizer_quantize(const char *src, const struct quantizer_calib *calib,
                       const struct quantizer_opts *opts, const char *out,
                       struct quantizer_report *rep, struct sl_err *err)
{
    struct quantizer_report dummy;
    if (!rep)
        rep = &dummy;
    memset(rep, 0, sizeof *rep);
    if (!(opts->bits >= 1 && opts->bits <= 8)) {
        sl_err_set(err, "--bits must be within 1..8 (got %g)", opts->bits);
        return -EINVAL;
    }
    if ((opts->method == QUANTIZER_METHOD_UNIFORM || opts->method == QUANTIZER_METHOD_SMOOTHQUANT) &&
        opts->bits != floor(opts->bits)) {
        sl_err_set(err, "method %s stores every channel at the same width: --bits must be an "
                        "integer (got %g)", quantizer_method_name(opts->method), opts->bits);
        return -EINVAL;
    }
    if (opts->encoding != FORMAT_ENC_ADAPTIVE && opts->encoding != FORMAT_ENC_INT4INT8 &&
        opts->encoding != FORMAT_ENC_BITPLANE) {
        sl_err_set(err, "unsupported output encoding %u", opts->encoding);
        return -EINVAL;
    }
    struct qctx *q = calloc(1, sizeof *q);
    if (!q) {
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    q->o = opts;
    q->calib = calib;
    q->err = err;
    struct format_writer *w = NULL;
    int ret = format_reader_open(src, &q->src, err);
    if (ret < 0)
        goto out;
    q->c = format_reader_config(q->src);
    ret = -EINVAL;
    if (q->c->n_layers > 4096) {
        sl_err_set(err, "%s: too many layers", src);
        goto out;
    }
    if (calib && (!quantizer_calib_ok(calib) ||
                  memcmp(&calib->cfg, q->c, sizeof *q->c) != 0)) {
        sl_err_set(err, "%s: the calibration statistics do not belong to this model", src);
        goto out;
    }
    ret = pass1(q);
    if (ret < 0)
        goto out;
    ret = format_writer_create(out, &w, err);
    if (ret == 0)
        ret = format_writer_set_config(w, q->c, err);
    if (ret == 0)
        ret = format_writer_set_tokenizer(w, format_reader_tokenizer(q->src), err);
    if (ret == 0)
        ret = copy_meta(q->src, w, err);
    char buf[64];
    snprintf(buf, sizeof buf, "%g", opts->bits);
    if (ret == 0)
        ret = set_meta_str(w, "quant.method", quantizer_method_name(opts->method), err);
    if (ret == 0)
        ret = set_meta_str(w, "quant.bits", buf, err);
    if (ret == 0)
        ret = set_meta_str(w, "quant.budget",
                           opts->budget == QUANTIZER_BUDGET_GLOBAL ? "global" : "tensor", err);
    if (ret == 0)
        ret = set_meta_str(w, "quant.activations", opts->act_dynamic ? "dynamic" : "static", err);
    rep->mean_alpha = q->alpha_n ? q->alpha_sum / q->alpha_n : 0;
    snprintf(buf, sizeof buf, "%.3f", rep->mean_alpha);
    if (ret == 0 && q->alpha_n)
        ret = set_meta_str(w, "quant.alpha_mean", buf, err);
    if (ret == 0 && calib) {
        snprintf(buf, sizeof buf, "%u", calib->sample_rows);
        ret = set_meta_str(w, "calib.sample_rows", buf, err);
    }
    if (ret < 0)
        goto out;
    ret = pass2(q, w, rep);
    if (ret == 0)
        ret = format_writer_finish(w, err);
    if (ret == 0) {
        struct format_reader *r;
        if (format_reader_open(out, &r, NULL) == 0) {
            rep->file_bytes = format_reader_file_size(r);
            format_reader_close(r);
        }
    }
out:
    format_writer_destroy(w);
    if (q->src)
        for (uint32_t l = 0; l < q->c->n_layers; l++)
            for (int g = 0; g < G_N; g++)
                free(q->s[l][g]);
    free(q->s_cls);
    free(q->re);
    free(q->weight);
    free(q->cost);
    free(q->widths);
    format_reader_close(q->src);
    free(q);
    return ret;
}

/* quantizer_quantize.c: the quantization driver (EdgeFlow 4.1 and the
 * baselines it is compared with). Two passes over the float source, one
 * layer of float weights in memory at a time:
 *   1. smoothing: choose each group's input scaling (edgeflow: alpha by grid
 *      search; smoothquant: its migration formula at alpha 0.5; uniform,
 *      cmpq: none) and, for a global budget, record every channel's RE
 *      curve of the smoothed weights and allocate once over the model;
 *   2. fold the scalings, allocate per tensor (or take the global widths),
 *      quantize, pack, write in execution order (atomically).
 * Norm weights stay float with the smoothing folded in; every linear layer
 * (and the token embedding) is stored in a packed encoding.
 *
 * Methods, precisely:
 *   edgeflow     smoothing s = S_I^alpha per group (alpha searched on
 *                calibration rows), widths by the RE greedy allocation on
 *                W diag(s), static per-tensor activation scales of x / s.
 *   uniform      every channel b bits, no smoothing.
 *   smoothquant  SmoothQuant's s_j = max|X_j|^0.5 / max|W_j|^0.5 per group,
 *                every channel b bits.
 *   cmpq         CMPQ (Chen et al. 2024) allocates precision per *input*
 *                channel by the calibration activation magnitude; as in
 *                EdgeFlow 5.4.1 the allocation is moved to output channels
 *                and its metric replaced by RE: a channel's RE is weighted
 *                by its output activation magnitude S_O^2 (the energy the
 *                channel's error lands on), greedy under the same budget,
 *                no smoothing. CMPQ's non-uniform codebooks and outlier
 *                extraction are not NPU-executable and are left out.
 * All methods share the per-channel quantizer (clipping rule), the packed
 * storage and the activation handling, so they differ only in the above.
 *
 * Embedding: an untied embedding is quantized like a linear layer (same
 * allocation, no activation scale; it is only looked up). A tied embedding is
 * the classifier: quantized with the classifier's static activation scale and
 * never smoothed (scaling its columns would change the lookups; untying it
 * would double its bytes). An untied classifier is smoothed into the output
 * norm like Q/K/V into the attention norm. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quantizer_internal.h"

/* The clipping rule QUANTIZER_CLIP_DEFAULT stands for (measured:
 * docs/BENCHMARKS-accuracy.md). */
#define CLIP_DEFAULT QUANTIZER_CLIP_MSE
/* Output rows per member evaluated in the alpha search (evenly spaced). */
#define SEARCH_ROWS 128

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
    enum quantizer_clip clip; /* resolved */
    uint32_t encoding;        /* resolved */
    const struct quantizer_calib *calib;
    struct format_reader *src;
    const struct format_config *c;
    float **s;     /* [n_layers * G_N] input scalings (NULL: none) */
    double *alpha; /* [n_layers * G_N + 1] chosen alphas (-1: none) */
    float *s_cls;  /* untied classifier's scaling */
    /* global allocation: every quantized channel of the model, in pass-2 order */
    double *re; /* [channels][9] */
    double *weight;
    uint64_t *cost;
    uint8_t *widths;
    uint64_t n_channels, next_channel;
    struct quantizer_report *rep;
    struct sl_err *err;
    /* shadow outlier execution: one entry per calibrated linear */
    struct format_shadow_linear *sh;
    uint32_t n_sh, cap_sh;
};

static void progress(struct qctx *q, const char *what, uint64_t done, uint64_t total)
{
    if (q->o->progress)
        q->o->progress(q->o->progress_ctx, what, done, total);
}

static int read_f32(struct qctx *q, int layer, uint32_t role, float **out)
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
static const struct quantizer_calib_slot *input_slot(const struct qctx *q, int layer, uint32_t role)
{
    uint32_t key = role == FORMAT_ROLE_WK || role == FORMAT_ROLE_WV ? FORMAT_ROLE_WQ
                   : role == FORMAT_ROLE_W_UP                       ? FORMAT_ROLE_W_GATE
                   : role == FORMAT_ROLE_TOK_EMBD                   ? FORMAT_ROLE_CLASSIFIER
                                                                    : role;
    const struct quantizer_calib_slot *s = slot(q, layer, key);
    return s && s->in_max ? s : NULL;
}

/* ---- shapes and rules -------------------------------------------------------------------- */

static void shape_of(const struct format_config *c, uint32_t role, uint32_t *rows, uint32_t *cols)
{
    uint32_t nd;
    uint64_t sh[FORMAT_MAX_DIMS] = {0};
    format_role_shape(
        c, role == FORMAT_ROLE_CLASSIFIER && c->tied_embedding ? FORMAT_ROLE_TOK_EMBD : role, &nd,
        sh);
    *rows = (uint32_t)sh[0];
    *cols = nd == 2 ? (uint32_t)sh[1] : 1;
}

static int uses_smoothing(enum quantizer_method m)
{
    return m == QUANTIZER_METHOD_EDGEFLOW || m == QUANTIZER_METHOD_SMOOTHQUANT;
}

static int uses_allocation(const struct quantizer_opts *o)
{
    return (o->method == QUANTIZER_METHOD_EDGEFLOW || o->method == QUANTIZER_METHOD_CMPQ) &&
           !o->uniform_widths;
}

static struct quantizer_tensor_rule rule_for(const struct qctx *q, const float *out_max)
{
    struct quantizer_tensor_rule r = {.bits = q->o->bits, .metric = q->o->metric, .clip = q->clip};
    if (!uses_allocation(q->o))
        r.uniform_bits = (uint8_t)q->o->bits;
    if (q->o->method == QUANTIZER_METHOD_CMPQ)
        r.row_weight = out_max;
    return r;
}

/* cmpq's channel weights S_O^2 (a floor keeps silent channels allocatable). */
static float *cmpq_weights(const struct qctx *q, int layer, uint32_t role, uint32_t rows)
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

/* ---- smoothing ------------------------------------------------------------------------------ */

/* Chooses one group's input scaling into *s_out (NULL when the method does
 * not smooth or calibration has no inputs for the group). */
static int choose_scaling(struct qctx *q, const struct quantizer_calib_slot *sl,
                          const float *in_max, const float *in_max_fit,
                          const struct quantizer_smooth_member *m, int nm, const float *row_weight,
                          float **s_out, double *alpha_out)
{
    *s_out = NULL;
    *alpha_out = -1;
    if (!uses_smoothing(q->o->method) || !sl || !in_max)
        return 0;
    uint32_t in = m[0].cols;
    float *s = malloc(sizeof(float) * in);
    if (!s) {
        sl_err_set(q->err, "out of memory choosing the smoothing scales");
        return -ENOMEM;
    }
    double alpha;
    if (q->o->method == QUANTIZER_METHOD_SMOOTHQUANT) {
        alpha = q->o->alpha >= 0 ? q->o->alpha : 0.5;
        quantizer_smooth_sq_scales(in_max, in, m, nm, alpha, s);
    } else if (q->o->alpha >= 0) {
        alpha = q->o->alpha;
        quantizer_smooth_scales(in_max, in, alpha, s);
    } else {
        struct quantizer_smooth_group g = {
            .in = in, .in_max = in_max, .x = sl->sample, .n_sample = sl->n_sample, .nm = nm};
        if (!q->o->search_in_sample)
            g.in_max_fit = in_max_fit;
        memcpy(g.m, m, sizeof(*m) * (size_t)nm);
        struct quantizer_tensor_rule r = rule_for(q, row_weight);
        alpha = quantizer_smooth_search(&g, &r, q->o->alpha_steps, SEARCH_ROWS, q->o->alpha_one_se,
                                        s, NULL);
        if (alpha < 0) {
            free(s);
            sl_err_set(q->err, "out of memory in the smoothing search");
            return -ENOMEM;
        }
    }
    *s_out = s;
    *alpha_out = alpha;
    q->rep->groups++;
    q->rep->mean_alpha += alpha;
    q->rep->alpha_hist[(int)lrint(alpha * 10) > 10 ? 10 : (int)lrint(alpha * 10)]++;
    return 0;
}

/* Pass 1 for one layer: the four scalings. */
static int smooth_layer(struct qctx *q, int li, const struct layer_f *l)
{
    const struct format_config *c = q->c;
    uint32_t D = c->dim, F = c->hidden_dim, Q = c->n_heads * c->head_dim;
    uint32_t KV = c->n_kv_heads * c->head_dim;
    const struct quantizer_calib_slot *sq = input_slot(q, li, FORMAT_ROLE_WQ);
    const struct quantizer_calib_slot *so = input_slot(q, li, FORMAT_ROLE_WO);
    const struct quantizer_calib_slot *sg = input_slot(q, li, FORMAT_ROLE_W_GATE);
    const struct quantizer_calib_slot *sd = input_slot(q, li, FORMAT_ROLE_W_DOWN);
    struct quantizer_smooth_member qkv[3] = {
        {l->t[FORMAT_ROLE_WQ], Q, D}, {l->t[FORMAT_ROLE_WK], KV, D}, {l->t[FORMAT_ROLE_WV], KV, D}};
    struct quantizer_smooth_member o[1] = {{l->t[FORMAT_ROLE_WO], D, Q}};
    struct quantizer_smooth_member gu[2] = {{l->t[FORMAT_ROLE_W_GATE], F, D},
                                            {l->t[FORMAT_ROLE_W_UP], F, D}};
    struct quantizer_smooth_member dn[1] = {{l->t[FORMAT_ROLE_W_DOWN], D, F}};
    float *omax = NULL, *ofit = NULL;
    if (so && uses_smoothing(q->o->method)) {
        omax = malloc(sizeof(float) * Q);
        ofit = malloc(sizeof(float) * Q);
        if (!omax || !ofit) {
            free(omax);
            free(ofit);
            sl_err_set(q->err, "out of memory");
            return -ENOMEM;
        }
        quantizer_smooth_o_common(c, so->in_max, omax);
        quantizer_smooth_o_common(c, so->in_max_fit, ofit);
    }
    /* the search's allocation of a multi-member group uses the first member's
     * cmpq weights only when cmpq smooths, which it does not: NULL */
    float **s = q->s + (size_t)li * G_N;
    double *a = q->alpha + (size_t)li * G_N;
    int ret = choose_scaling(q, sq, sq ? sq->in_max : NULL, sq ? sq->in_max_fit : NULL, qkv, 3,
                             NULL, &s[G_QKV], &a[G_QKV]);
    if (!ret)
        ret = choose_scaling(q, so, omax, ofit, o, 1, NULL, &s[G_O], &a[G_O]);
    if (!ret && s[G_O]) {
        /* SmoothQuant's s also depends on W_o's columns: make it common to
         * each kv group too (S_I^alpha of the common maxima already is) */
        memcpy(omax, s[G_O], sizeof(float) * Q);
        quantizer_smooth_o_common(c, omax, s[G_O]);
    }
    if (!ret)
        ret = choose_scaling(q, sg, sg ? sg->in_max : NULL, sg ? sg->in_max_fit : NULL, gu, 2, NULL,
                             &s[G_GU], &a[G_GU]);
    if (!ret)
        ret = choose_scaling(q, sd, sd ? sd->in_max : NULL, sd ? sd->in_max_fit : NULL, dn, 1, NULL,
                             &s[G_DOWN], &a[G_DOWN]);
    free(omax);
    free(ofit);
    return ret;
}

/* Folds a layer's scalings into its float tensors (in place): norm / s and
 * columns * s (Q/K/V, gate/up); O columns * s and V rows / s (s common to a
 * kv group); down columns * s and up rows / s. The float function is
 * unchanged up to rounding. */
static void fold_layer(const struct format_config *c, struct layer_f *l, float *const *s)
{
    uint32_t D = c->dim, F = c->hidden_dim, Q = c->n_heads * c->head_dim;
    uint32_t KV = c->n_kv_heads * c->head_dim, mul = c->n_heads / c->n_kv_heads;
    if (s[G_QKV]) {
        const float *g = s[G_QKV];
        for (uint32_t j = 0; j < D; j++)
            l->t[FORMAT_ROLE_ATTN_NORM][j] /= g[j];
        const uint32_t roles[3] = {FORMAT_ROLE_WQ, FORMAT_ROLE_WK, FORMAT_ROLE_WV};
        const uint32_t rows[3] = {Q, KV, KV};
        for (int k = 0; k < 3; k++)
            for (uint32_t r = 0; r < rows[k]; r++)
                for (uint32_t j = 0; j < D; j++)
                    l->t[roles[k]][(size_t)r * D + j] *= g[j];
    }
    if (s[G_O]) {
        const float *g = s[G_O];
        for (uint32_t r = 0; r < D; r++)
            for (uint32_t j = 0; j < Q; j++)
                l->t[FORMAT_ROLE_WO][(size_t)r * Q + j] *= g[j];
        for (uint32_t kv = 0; kv < c->n_kv_heads; kv++)
            for (uint32_t d = 0; d < c->head_dim; d++) {
                float sv = g[(kv * mul) * c->head_dim + d]; /* common to the kv group */
                float *row = l->t[FORMAT_ROLE_WV] + (size_t)(kv * c->head_dim + d) * D;
                for (uint32_t j = 0; j < D; j++)
                    row[j] /= sv;
            }
    }
    if (s[G_GU]) {
        const float *g = s[G_GU];
        for (uint32_t j = 0; j < D; j++)
            l->t[FORMAT_ROLE_FFN_NORM][j] /= g[j];
        for (uint32_t r = 0; r < F; r++)
            for (uint32_t j = 0; j < D; j++) {
                l->t[FORMAT_ROLE_W_GATE][(size_t)r * D + j] *= g[j];
                l->t[FORMAT_ROLE_W_UP][(size_t)r * D + j] *= g[j];
            }
    }
    if (s[G_DOWN]) {
        const float *g = s[G_DOWN];
        for (uint32_t r = 0; r < D; r++)
            for (uint32_t j = 0; j < F; j++)
                l->t[FORMAT_ROLE_W_DOWN][(size_t)r * F + j] *= g[j];
        for (uint32_t r = 0; r < F; r++)
            for (uint32_t j = 0; j < D; j++)
                l->t[FORMAT_ROLE_W_UP][(size_t)r * D + j] /= g[r];
    }
}

static void fold_classifier(const struct qctx *q, float *cls, float *out_norm)
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
    const struct quantizer_calib_slot *sl = input_slot(q, layer, role);
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
    const struct quantizer_calib_slot *sl = input_slot(q, layer, role);
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

/* ---- global allocation ------------------------------------------------------------------------
 */

/* Records a tensor's channels (pass 1) in pass-2 order. Objective
 * QUANTIZER_GLOBAL_TENSOR_MEAN: sum over tensors of the tensor's mean
 * (cmpq: S_O^2-weighted mean) RE, i.e. every tensor's relative output error
 * counts alike; QUANTIZER_GLOBAL_WEIGHT: every weight's RE counts alike. A
 * bit of a channel costs its cols weights either way. */
static int record_channels(struct qctx *q, int layer, uint32_t role, const float *w)
{
    uint32_t rows, cols;
    shape_of(q->c, role, &rows, &cols);
    double *re = q->re + q->next_channel * 9;
    float *tmp = malloc(sizeof(float) * cols);
    float *cw = cmpq_weights(q, layer, role, rows);
    if (!tmp || quantizer_tensor_re(w, rows, cols, NULL, q->o->metric, q->clip, re, tmp) < 0) {
        free(tmp);
        free(cw);
        sl_err_set(q->err, "out of memory recording layer %d %s", layer, format_role_name(role));
        return -ENOMEM;
    }
    double sum = 0;
    for (uint32_t r = 0; r < rows; r++)
        sum += cw ? cw[r] : 1.0;
    for (uint32_t r = 0; r < rows; r++) {
        double share = (cw ? cw[r] : 1.0) / sum;
        q->weight[q->next_channel + r] =
            q->o->global == QUANTIZER_GLOBAL_WEIGHT ? share * rows * cols : share;
        q->cost[q->next_channel + r] = cols;
    }
    q->next_channel += rows;
    free(tmp);
    free(cw);
    return 0;
}

static uint64_t count_channels(const struct format_config *c)
{
    uint64_t per_layer = 0;
    for (uint32_t r = FORMAT_ROLE_WQ; r <= FORMAT_ROLE_W_DOWN; r++) {
        uint32_t rows, cols;
        if (r == FORMAT_ROLE_FFN_NORM)
            continue;
        shape_of(c, r, &rows, &cols);
        per_layer += rows;
    }
    return per_layer * c->n_layers + (c->tied_embedding ? 1 : 2) * (uint64_t)c->vocab_size;
}

/* ---- pass 1 ------------------------------------------------------------------------------------
 */

static int pass1(struct qctx *q)
{
    const struct format_config *c = q->c;
    int global = q->o->budget == QUANTIZER_BUDGET_GLOBAL && uses_allocation(q->o);
    int ret = 0;
    if (!global && !(uses_smoothing(q->o->method) && q->calib))
        return 0; /* nothing to choose before writing */
    if (global) {
        q->n_channels = count_channels(c);
        if (q->n_channels > UINT32_MAX) {
            sl_err_set(q->err, "%s: too many channels for a global budget",
                       format_reader_path(q->src));
            return -EINVAL;
        }
        q->re = malloc(sizeof(double) * 9 * q->n_channels);
        q->weight = malloc(sizeof(double) * q->n_channels);
        q->cost = malloc(sizeof(uint64_t) * q->n_channels);
        q->widths = malloc(q->n_channels);
        if (!q->re || !q->weight || !q->cost || !q->widths) {
            sl_err_set(q->err, "out of memory for %" PRIu64 " channels", q->n_channels);
            return -ENOMEM;
        }
        if (!c->tied_embedding) {
            float *emb;
            if ((ret = read_f32(q, -1, FORMAT_ROLE_TOK_EMBD, &emb)) < 0)
                return ret;
            ret = record_channels(q, -1, FORMAT_ROLE_TOK_EMBD, emb);
            free(emb);
            if (ret < 0)
                return ret;
        }
    }
    for (uint32_t li = 0; li < c->n_layers; li++) {
        struct layer_f l;
        if ((ret = layer_load(q, (int)li, &l)) < 0)
            return ret;
        ret = smooth_layer(q, (int)li, &l);
        if (ret == 0 && global) {
            fold_layer(c, &l, q->s + (size_t)li * G_N);
            for (uint32_t r = FORMAT_ROLE_WQ; ret == 0 && r <= FORMAT_ROLE_W_DOWN; r++)
                if (r != FORMAT_ROLE_FFN_NORM)
                    ret = record_channels(q, (int)li, r, l.t[r]);
        }
        layer_free(&l);
        if (ret < 0)
            return ret;
        progress(q, global ? "smoothing, statistics" : "smoothing", li + 1, c->n_layers + 1);
    }
    float *cls = NULL, *onorm = NULL;
    ret = read_f32(q, -1, c->tied_embedding ? FORMAT_ROLE_TOK_EMBD : FORMAT_ROLE_CLASSIFIER, &cls);
    if (ret == 0)
        ret = read_f32(q, -1, FORMAT_ROLE_OUT_NORM, &onorm);
    if (ret == 0 && !c->tied_embedding) {
        const struct quantizer_calib_slot *sl = input_slot(q, -1, FORMAT_ROLE_CLASSIFIER);
        struct quantizer_smooth_member m[1] = {{cls, c->vocab_size, c->dim}};
        ret = choose_scaling(q, sl, sl ? sl->in_max : NULL, sl ? sl->in_max_fit : NULL, m, 1, NULL,
                             &q->s_cls, &q->alpha[(size_t)c->n_layers * G_N]);
    }
    if (ret == 0 && global) {
        fold_classifier(q, cls, onorm);
        ret = record_channels(
            q, -1, c->tied_embedding ? FORMAT_ROLE_TOK_EMBD : FORMAT_ROLE_CLASSIFIER, cls);
    }
    free(cls);
    free(onorm);
    if (ret < 0)
        return ret;
    if (global) {
        ret = quantizer_allocate((uint32_t)q->n_channels, q->re, q->weight, q->cost, q->o->bits,
                                 q->widths);
        if (ret < 0) {
            sl_err_set(q->err, "global bit allocation failed (%s)", strerror(-ret));
            return ret;
        }
    }
    progress(q, "smoothing", c->n_layers + 1, c->n_layers + 1);
    return 0;
}

/* ---- pass 2: one tensor -------------------------------------------------------------------------
 */

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
    shape_of(q->c, role, &rows, &cols);
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
        cw = cmpq_weights(q, layer, role, rows);
        struct quantizer_tensor_rule r = rule_for(q, cw);
        ret = quantizer_tensor_widths(wf, rows, cols, NULL, &r, widths);
        if (ret < 0) {
            sl_err_set(q->err, "bit allocation failed for layer %d %s (%s)", layer,
                       format_role_name(role), strerror(-ret));
            goto out;
        }
    }
    quantizer_tensor_quantize(wf, rows, cols, NULL, widths, q->clip, codes, scales, tmp);
    if (q->o->block_mult && q->o->gptq && layer >= 0 && input_slot(q, layer, role)) {
        const struct quantizer_calib_slot *sl = input_slot(q, layer, role);
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
        const struct quantizer_calib_slot *sl = input_slot(q, layer, role);
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

static int pass2(struct qctx *q, struct format_writer *w)
{
    const struct format_config *c = q->c;
    int ret;
    q->next_channel = 0;
    if (!c->tied_embedding) {
        float *emb;
        if ((ret = read_f32(q, -1, FORMAT_ROLE_TOK_EMBD, &emb)) < 0)
            return ret;
        ret = emit_linear(q, w, -1, FORMAT_ROLE_TOK_EMBD, emb);
        free(emb);
        if (ret < 0)
            return ret;
    }
    for (uint32_t li = 0; li < c->n_layers; li++) {
        struct layer_f l;
        if ((ret = layer_load(q, (int)li, &l)) < 0)
            return ret;
        fold_layer(c, &l, q->s + (size_t)li * G_N);
        for (uint32_t r = FORMAT_ROLE_ATTN_NORM; ret == 0 && r <= FORMAT_ROLE_W_DOWN; r++) {
            if (r == FORMAT_ROLE_ATTN_NORM || r == FORMAT_ROLE_FFN_NORM)
                ret = emit_float(q, w, (int)li, r, l.t[r], 1, c->dim, 1);
            else
                ret = emit_linear(q, w, (int)li, r, l.t[r]);
        }
        layer_free(&l);
        if (ret < 0)
            return ret;
        progress(q, "quantizing", li + 1, c->n_layers + 1);
    }
    float *cls = NULL, *onorm = NULL;
    uint32_t cls_role = c->tied_embedding ? FORMAT_ROLE_TOK_EMBD : FORMAT_ROLE_CLASSIFIER;
    ret = read_f32(q, -1, cls_role, &cls);
    if (ret == 0)
        ret = read_f32(q, -1, FORMAT_ROLE_OUT_NORM, &onorm);
    if (ret == 0) {
        fold_classifier(q, cls, onorm);
        ret = emit_float(q, w, -1, FORMAT_ROLE_OUT_NORM, onorm, 1, c->dim, 1);
    }
    if (ret == 0)
        ret = emit_linear(q, w, -1, cls_role, cls);
    free(cls);
    free(onorm);
    progress(q, "quantizing", c->n_layers + 1, c->n_layers + 1);
    return ret;
}

/* ---- metadata
 * ------------------------------------------------------------------------------------- */

static int copy_meta(struct format_reader *src, struct format_writer *w, struct sl_err *err)
{
    for (uint32_t i = 0; i < format_reader_meta_count(src); i++) {
        const char *k = format_reader_meta_key(src, i);
        const void *v;
        size_t len;
        /* a re-quantized source's own results do not describe the output */
        if (!strncmp(k, "quant.", 6) || !strncmp(k, "calib.", 6) || !strncmp(k, "shadow.", 7))
            continue;
        if (format_reader_meta_get(src, k, &v, &len) < 0)
            continue;
        int ret = format_writer_set_meta(w, k, v, len, err);
        if (ret < 0)
            return ret;
    }
    return 0;
}

static int meta(struct format_writer *w, const char *k, struct sl_err *err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int meta(struct format_writer *w, const char *k, struct sl_err *err, const char *fmt, ...)
{
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return format_writer_set_meta(w, k, buf, strlen(buf), err);
}

/* quant.alphas: per layer "qkv,o,gate_up,down" separated by ';' ("-": not
 * smoothed), then ";classifier=a" for an untied classifier. */
static int meta_alphas(const struct qctx *q, struct format_writer *w, struct sl_err *err)
{
    size_t cap = (size_t)q->c->n_layers * G_N * 6 + 32, len = 0;
    char *buf = malloc(cap);
    if (!buf) {
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    for (uint32_t l = 0; l < q->c->n_layers; l++)
        for (int g = 0; g < G_N; g++) {
            double a = q->alpha[(size_t)l * G_N + g];
            char sep = g == G_N - 1 ? ';' : ',';
            len += a < 0 ? (size_t)snprintf(buf + len, cap - len, "-%c", sep)
                         : (size_t)snprintf(buf + len, cap - len, "%.2f%c", a, sep);
        }
    double ac = q->alpha[(size_t)q->c->n_layers * G_N];
    if (ac >= 0)
        len += (size_t)snprintf(buf + len, cap - len, "classifier=%.2f", ac);
    else if (len)
        len--; /* the last ';' */
    int ret = format_writer_set_meta(w, "quant.alphas", buf, len, err);
    free(buf);
    return ret;
}

static int write_meta(const struct qctx *q, struct format_writer *w, struct sl_err *err)
{
    const struct quantizer_opts *o = q->o;
    static const char *const clip_names[] = {"default", "none", "mse"};
    int ret = copy_meta(q->src, w, err);
    if (!ret)
        ret = meta(w, "quant.method", err, "%s", quantizer_method_name(o->method));
    if (!ret)
        ret = meta(w, "quant.bits", err, "%g", o->bits);
    if (!ret)
        ret = meta(w, "quant.budget", err, "%s",
                   o->budget == QUANTIZER_BUDGET_GLOBAL ? "global" : "tensor");
    if (!ret && o->budget_select)
        ret = meta(w, "quant.budget_select", err, "%s", o->budget_select);
    if (!ret && o->budget == QUANTIZER_BUDGET_GLOBAL)
        ret = meta(w, "quant.global_objective", err, "%s",
                   o->global == QUANTIZER_GLOBAL_WEIGHT ? "weight" : "tensor-mean");
    if (!ret && (o->method == QUANTIZER_METHOD_EDGEFLOW || o->method == QUANTIZER_METHOD_CMPQ))
        ret = meta(w, "quant.widths", err, "%s", o->uniform_widths ? "uniform" : "allocated");
    if (!ret)
        ret = meta(w, "quant.metric", err, "%s",
                   o->metric == QUANTIZER_METRIC_EXACT ? "exact" : "proxy");
    if (!ret)
        ret = meta(w, "quant.clip", err, "%s", clip_names[q->clip]);
    if (!ret && o->method == QUANTIZER_METHOD_EDGEFLOW && o->alpha < 0)
        ret = meta(w, "quant.alpha_search", err, "%s, %s",
                   o->search_in_sample ? "in-sample" : "held-out",
                   o->alpha_one_se ? "one standard error" : "least error");
    if (!ret)
        ret = meta(w, "quant.activations", err, "%s",
                   o->act_dynamic || !q->calib ? "dynamic" : "static");
    if (!ret)
        ret = meta(w, "quant.encoding", err, "%s", format_encoding_traits(q->encoding)->name);
    if (!ret && q->rep->groups) {
        ret = meta(w, "quant.alpha_mean", err, "%.3f", q->rep->mean_alpha);
        if (!ret)
            ret = meta_alphas(q, w, err);
    }
    if (!ret && q->calib) {
        ret = meta(w, "calib.tokens", err, "%" PRIu64, quantizer_calib_rows(q->calib));
        if (!ret)
            ret = meta(w, "calib.sample_rows", err, "%u", q->calib->sample_rows);
        if (!ret && o->calib_source)
            ret = meta(w, "calib.source", err, "%s", o->calib_source);
    }
    return ret;
}

/* The shadow calibration (shadow.linears) and its parameters. */
static int write_shadow(const struct qctx *q, struct format_writer *w, struct sl_err *err)
{
    void *buf;
    size_t len;
    if (format_shadow_encode(q->sh, q->n_sh, &buf, &len) < 0) {
        sl_err_set(err, "out of memory writing the shadow metadata");
        return -ENOMEM;
    }
    int ret = format_writer_set_meta(w, FORMAT_SHADOW_META_KEY, buf, len, err);
    free(buf);
    uint32_t on = 0;
    for (uint32_t i = 0; i < q->n_sh; i++)
        on += (q->sh[i].flags & FORMAT_SHADOW_ON) != 0;
    if (!ret)
        ret = meta(w, "shadow.quantile", err, "%g", q->o->shadow_quantile);
    if (!ret)
        ret = meta(w, "shadow.cover", err, "%g", q->o->shadow_cover);
    if (!ret)
        ret = meta(w, "shadow.min_importance", err, "%g", q->o->shadow_min_importance);
    if (!ret)
        ret = meta(w, "shadow.hot_max", err, "%g", q->o->shadow_hot_max);
    if (!ret)
        ret = meta(w, "shadow.linears_on", err, "%u of %u", on, q->n_sh);
    return ret;
}

/* ---- entry
 * ------------------------------------------------------------------------------------------ */

static int check_opts(const struct quantizer_opts *o, struct sl_err *err)
{
    if (!(o->bits >= 1 && o->bits <= 8)) {
        sl_err_set(err, "bits must be within 1..8 (got %g)", o->bits);
        return -EINVAL;
    }
    if ((unsigned)o->method >= QUANTIZER_METHOD_COUNT) {
        sl_err_set(err, "unknown method %d", (int)o->method);
        return -EINVAL;
    }
    if (!uses_allocation(o) && o->bits != floor(o->bits)) {
        sl_err_set(err,
                   "%s stores every channel at the same width: bits must be an integer "
                   "(got %g)",
                   o->uniform_widths ? "uniform_widths" : quantizer_method_name(o->method),
                   o->bits);
        return -EINVAL;
    }
    if (o->alpha > 1 || isnan(o->alpha)) {
        sl_err_set(err, "alpha must be within [0, 1] (got %g)", o->alpha);
        return -EINVAL;
    }
    if (o->encoding != 0 && o->encoding != FORMAT_ENC_ADAPTIVE &&
        o->encoding != FORMAT_ENC_INT4INT8 && o->encoding != FORMAT_ENC_BITPLANE) {
        sl_err_set(err, "unsupported output encoding %u (adaptive, int4int8 or bitplane)",
                   o->encoding);
        return -EINVAL;
    }
    if (o->block_mult && (!o->gptq || (o->encoding != 0 && o->encoding != FORMAT_ENC_ADAPTIVE))) {
        sl_err_set(err, "block multipliers need gptq and the adaptive encoding");
        return -EINVAL;
    }
    if (o->shadow && (o->act_dynamic || o->float_out || !(o->shadow_quantile > 0) ||
                      !(o->shadow_quantile < 1) || !(o->shadow_cover > 0) ||
                      !(o->shadow_cover <= 1) || !(o->shadow_min_importance >= 0) ||
                      !(o->shadow_hot_max >= 0 && o->shadow_hot_max <= 1))) {
        sl_err_set(err,
                   "shadow execution needs static activation scales, quantized weights, a "
                   "quantile in (0, 1), a cover in (0, 1], an importance >= 0 and a hot share "
                   "in [0, 1] (got %g, %g, %g, %g)",
                   o->shadow_quantile, o->shadow_cover, o->shadow_min_importance,
                   o->shadow_hot_max);
        return -EINVAL;
    }
    if ((unsigned)o->budget > QUANTIZER_BUDGET_GLOBAL ||
        (unsigned)o->global > QUANTIZER_GLOBAL_TENSOR_MEAN ||
        (unsigned)o->metric > QUANTIZER_METRIC_EXACT || (unsigned)o->clip > QUANTIZER_CLIP_MSE) {
        sl_err_set(err, "bad quantizer option value");
        return -EINVAL;
    }
    return 0;
}

int quantizer_quantize(const char *src, const struct quantizer_calib *calib,
                       const struct quantizer_opts *opts, const char *out,
                       struct quantizer_report *rep, struct sl_err *err)
{
    struct quantizer_report dummy;
    if (!rep)
        rep = &dummy;
    memset(rep, 0, sizeof *rep);
    int ret = check_opts(opts, err);
    if (ret < 0)
        return ret;
    struct qctx *q = calloc(1, sizeof *q);
    if (!q) {
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    q->o = opts;
    q->clip = opts->clip == QUANTIZER_CLIP_DEFAULT ? CLIP_DEFAULT : opts->clip;
    q->encoding = opts->float_out  ? FORMAT_ENC_F32
                  : opts->encoding ? opts->encoding
                                   : FORMAT_ENC_ADAPTIVE;
    q->calib = calib;
    q->rep = rep;
    q->err = err;
    struct format_writer *w = NULL;
    ret = format_reader_open(src, &q->src, err);
    if (ret < 0)
        goto out;
    q->c = format_reader_config(q->src);
    ret = -EINVAL;
    if (calib && (!quantizer_calib_ok(calib) || memcmp(&calib->cfg, q->c, sizeof *q->c) != 0)) {
        sl_err_set(err, "%s: the calibration statistics do not belong to this model%s", src,
                   calib && !quantizer_calib_ok(calib) ? " (they failed to record)" : "");
        goto out;
    }
    if (calib && (ret = quantizer_calib_check(calib, err)) < 0) {
        sl_err_prefix(err, "%s", src);
        goto out;
    }
    size_t ng = (size_t)q->c->n_layers * G_N;
    q->s = calloc(ng, sizeof *q->s);
    q->alpha = malloc(sizeof(double) * (ng + 1));
    if (!q->s || !q->alpha) {
        sl_err_set(err, "out of memory");
        ret = -ENOMEM;
        goto out;
    }
    for (size_t i = 0; i <= ng; i++)
        q->alpha[i] = -1;
    if ((ret = pass1(q)) < 0)
        goto out;
    if (rep->groups)
        rep->mean_alpha /= rep->groups;
    if ((ret = format_writer_create(out, &w, err)) < 0)
        goto out;
    ret = format_writer_set_config(w, q->c, err);
    if (!ret)
        ret = format_writer_set_tokenizer(w, format_reader_tokenizer(q->src), err);
    if (!ret)
        ret = write_meta(q, w, err);
    if (!ret)
        ret = pass2(q, w);
    if (!ret && opts->shadow)
        ret = write_shadow(q, w, err);
    if (!ret)
        ret = format_writer_finish(w, err);
    if (!ret) {
        struct format_reader *r;
        if (format_reader_open(out, &r, NULL) == 0) {
            rep->file_bytes = format_reader_file_size(r);
            format_reader_close(r);
        }
    }
out:
    format_writer_destroy(w);
    if (q->s)
        for (size_t i = 0; i < (size_t)(q->c ? q->c->n_layers : 0) * G_N; i++)
            free(q->s[i]);
    free(q->s);
    free(q->alpha);
    free(q->s_cls);
    free(q->re);
    free(q->weight);
    free(q->cost);
    free(q->widths);
    format_shadow_free(q->sh, q->n_sh);
    format_reader_close(q->src);
    free(q);
    return ret;
}

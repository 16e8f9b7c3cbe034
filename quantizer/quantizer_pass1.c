/* quantizer_pass1.c: the quantization driver's first pass over the float
 * source (quantizer_quantize.c describes the methods): each smoothing group's
 * input scaling, the folding of the scalings into the float weights, and
 * for a global budget every channel's RE curve and the one allocation over
 * the model. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quantizer_driver.h"

/* Output rows per member evaluated in the alpha search (evenly spaced). */
#define SEARCH_ROWS 128

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
    if (!qd_uses_smoothing(q->o->method) || !sl || !in_max)
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
        struct quantizer_tensor_rule r = qd_rule_for(q, row_weight);
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
static int smooth_layer(struct qctx *q, int li, const struct qd_layer *l)
{
    const struct format_config *c = q->c;
    uint32_t D = c->dim, F = c->hidden_dim, Q = c->n_heads * c->head_dim;
    uint32_t KV = c->n_kv_heads * c->head_dim;
    const struct quantizer_calib_slot *sq = qd_input_slot(q, li, FORMAT_ROLE_WQ);
    const struct quantizer_calib_slot *so = qd_input_slot(q, li, FORMAT_ROLE_WO);
    const struct quantizer_calib_slot *sg = qd_input_slot(q, li, FORMAT_ROLE_W_GATE);
    const struct quantizer_calib_slot *sd = qd_input_slot(q, li, FORMAT_ROLE_W_DOWN);
    struct quantizer_smooth_member qkv[3] = {
        {l->t[FORMAT_ROLE_WQ], Q, D}, {l->t[FORMAT_ROLE_WK], KV, D}, {l->t[FORMAT_ROLE_WV], KV, D}};
    struct quantizer_smooth_member o[1] = {{l->t[FORMAT_ROLE_WO], D, Q}};
    struct quantizer_smooth_member gu[2] = {{l->t[FORMAT_ROLE_W_GATE], F, D},
                                            {l->t[FORMAT_ROLE_W_UP], F, D}};
    struct quantizer_smooth_member dn[1] = {{l->t[FORMAT_ROLE_W_DOWN], D, F}};
    float *omax = NULL, *ofit = NULL;
    if (so && qd_uses_smoothing(q->o->method)) {
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
void qd_fold_layer(const struct format_config *c, struct qd_layer *l, float *const *s)
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

void qd_fold_classifier(const struct qctx *q, float *cls, float *out_norm)
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

/* ---- global allocation --------------------------------------------------------------------- */

/* Records a tensor's channels (pass 1) in pass-2 order. Objective
 * QUANTIZER_GLOBAL_TENSOR_MEAN: sum over tensors of the tensor's mean
 * (cmpq: S_O^2-weighted mean) RE, i.e. every tensor's relative output error
 * counts alike; QUANTIZER_GLOBAL_WEIGHT: every weight's RE counts alike. A
 * bit of a channel costs its cols weights either way. */
static int record_channels(struct qctx *q, int layer, uint32_t role, const float *w)
{
    uint32_t rows, cols;
    qd_shape_of(q->c, role, &rows, &cols);
    double *re = q->re + q->next_channel * 9;
    float *tmp = malloc(sizeof(float) * cols);
    float *cw = qd_cmpq_weights(q, layer, role, rows);
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
        qd_shape_of(c, r, &rows, &cols);
        per_layer += rows;
    }
    return per_layer * c->n_layers + (c->tied_embedding ? 1 : 2) * (uint64_t)c->vocab_size;
}

/* ---- pass 1 -------------------------------------------------------------------------------- */

int qd_pass1(struct qctx *q)
{
    const struct format_config *c = q->c;
    int global = q->o->budget == QUANTIZER_BUDGET_GLOBAL && qd_uses_allocation(q->o);
    int ret = 0;
    if (!global && !(qd_uses_smoothing(q->o->method) && q->calib))
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
            if ((ret = qd_read_f32(q, -1, FORMAT_ROLE_TOK_EMBD, &emb)) < 0)
                return ret;
            ret = record_channels(q, -1, FORMAT_ROLE_TOK_EMBD, emb);
            free(emb);
            if (ret < 0)
                return ret;
        }
    }
    for (uint32_t li = 0; li < c->n_layers; li++) {
        struct qd_layer l;
        if ((ret = qd_layer_load(q, (int)li, &l)) < 0)
            return ret;
        ret = smooth_layer(q, (int)li, &l);
        if (ret == 0 && global) {
            qd_fold_layer(c, &l, q->s + (size_t)li * G_N);
            for (uint32_t r = FORMAT_ROLE_WQ; ret == 0 && r <= FORMAT_ROLE_W_DOWN; r++)
                if (r != FORMAT_ROLE_FFN_NORM)
                    ret = record_channels(q, (int)li, r, l.t[r]);
        }
        qd_layer_free(&l);
        if (ret < 0)
            return ret;
        qd_progress(q, global ? "smoothing, statistics" : "smoothing", li + 1, c->n_layers + 1);
    }
    float *cls = NULL, *onorm = NULL;
    ret =
        qd_read_f32(q, -1, c->tied_embedding ? FORMAT_ROLE_TOK_EMBD : FORMAT_ROLE_CLASSIFIER, &cls);
    if (ret == 0)
        ret = qd_read_f32(q, -1, FORMAT_ROLE_OUT_NORM, &onorm);
    if (ret == 0 && !c->tied_embedding) {
        const struct quantizer_calib_slot *sl = qd_input_slot(q, -1, FORMAT_ROLE_CLASSIFIER);
        struct quantizer_smooth_member m[1] = {{cls, c->vocab_size, c->dim}};
        ret = choose_scaling(q, sl, sl ? sl->in_max : NULL, sl ? sl->in_max_fit : NULL, m, 1, NULL,
                             &q->s_cls, &q->alpha[(size_t)c->n_layers * G_N]);
    }
    if (ret == 0 && global) {
        qd_fold_classifier(q, cls, onorm);
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
    qd_progress(q, "smoothing", c->n_layers + 1, c->n_layers + 1);
    return 0;
}

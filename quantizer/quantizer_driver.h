/* quantizer_driver.h: the state and the pieces the quantization driver's
 * files share (quantizer_quantize.c: options and the two passes in order;
 * quantizer_source.c: the float source, calibration slots and per-tensor
 * rules; quantizer_pass1.c: smoothing choice, folding and the global
 * allocation's statistics; quantizer_pass2.c: each tensor quantized and
 * written; quantizer_meta.c: the output's metadata). Private to those files. */
#ifndef SLUICE_QUANTIZER_DRIVER_H
#define SLUICE_QUANTIZER_DRIVER_H

#include "quantizer_internal.h"

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

/* ---- the float source, calibration, rules (quantizer_source.c) ---------------------------- */

void qd_progress(struct qctx *q, const char *what, uint64_t done, uint64_t total);
/* A float tensor of the source, decoded to f32 (malloc'd into *out). 0, or
 * -EINVAL / -ENOMEM with q->err set. */
int qd_read_f32(struct qctx *q, int layer, uint32_t role, float **out);
/* The calibration slot holding the input statistics of a role's input
 * (Q for K and V, gate for up, the classifier for a tied embedding), or NULL. */
const struct quantizer_calib_slot *qd_input_slot(const struct qctx *q, int layer, uint32_t role);
/* rows x cols of a role (a tied classifier: the embedding's). */
void qd_shape_of(const struct format_config *c, uint32_t role, uint32_t *rows, uint32_t *cols);
int qd_uses_smoothing(enum quantizer_method m);
int qd_uses_allocation(const struct quantizer_opts *o);
struct quantizer_tensor_rule qd_rule_for(const struct qctx *q, const float *out_max);
/* cmpq's channel weights (malloc'd), or NULL for the other methods. */
float *qd_cmpq_weights(const struct qctx *q, int layer, uint32_t role, uint32_t rows);

/* One layer's float tensors. */
struct qd_layer {
    float *t[FORMAT_ROLE_COUNT];
};
int qd_layer_load(struct qctx *q, int layer, struct qd_layer *l);
void qd_layer_free(struct qd_layer *l);

/* ---- pass 1 (quantizer_pass1.c) ----------------------------------------------------------- */

/* Chooses every group's scaling (q->s, q->alpha, q->s_cls) and, for a global
 * budget, allocates the widths of every channel (q->widths). */
int qd_pass1(struct qctx *q);
/* Folds a layer's scalings s[G_N] into its float tensors, in place. */
void qd_fold_layer(const struct format_config *c, struct qd_layer *l, float *const *s);
/* Folds the untied classifier's scaling into it and the output norm. */
void qd_fold_classifier(const struct qctx *q, float *cls, float *out_norm);

/* ---- pass 2 (quantizer_pass2.c) ----------------------------------------------------------- */

/* Every tensor in execution order, folded, quantized and written to w. */
int qd_pass2(struct qctx *q, struct format_writer *w);

/* ---- metadata (quantizer_meta.c) ---------------------------------------------------------- */

int qd_write_meta(const struct qctx *q, struct format_writer *w, struct sl_err *err);
int qd_write_shadow(const struct qctx *q, struct format_writer *w, struct sl_err *err);

#endif

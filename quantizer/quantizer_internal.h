/* quantizer_internal.h: calibration records, the per-channel quantizer and
 * the smoothing helpers shared by the quantization files of the quantizer
 * (quantizer_calib.c, quantizer_alloc.c, quantizer_smooth.c, the driver's
 * files of quantizer_driver.h). Not a public API: the tests include it to
 * reach the pieces one at a time. */
#ifndef SLUICE_QUANTIZER_INTERNAL_H
#define SLUICE_QUANTIZER_INTERNAL_H

#include "quantizer.h"

/* ---- calibration (quantizer_calib.c) ------------------------------------------------- */

/* Statistics of one linear layer. Layers that read the same input (Q/K/V;
 * gate/up) keep the input side (in_max, sample) under the first of them (Q,
 * gate) only; every layer keeps its output maxima. */
struct quantizer_calib_slot {
    uint32_t in_cols, out_cols;
    float *in_max;      /* [in_cols] S_I: max |x| per input channel (NULL for K, V, up) */
    float *in_max_fit;  /* [in_cols] the same over the even input rows only */
    float *out_max;     /* [out_cols] S_O: max |y| per output channel */
    float *sample;      /* [sample_rows][in_cols] odd input rows (reservoir sample) */
    uint32_t n_sample;  /* rows of sample filled */
    uint64_t rows_seen; /* input rows observed */
};

struct quantizer_calib {
    struct format_config cfg;
    uint32_t sample_rows;
    uint32_t n_slots;
    struct quantizer_calib_slot *slots; /* [layer * FORMAT_ROLE_COUNT + role], classifier last */
    uint64_t rng;
    int failed;
};

/* The slot of a linear layer (layer -1 with FORMAT_ROLE_CLASSIFIER for the
 * classifier), or NULL for anything else. */
const struct quantizer_calib_slot *quantizer_calib_slot(const struct quantizer_calib *c, int layer,
                                                        uint32_t role);
/* 0 if every recorded statistic (in_max, in_max_fit, out_max) is finite and
 * non-negative; else -EINVAL with a message naming the layer, the role, the
 * channel and the value (the float model's activations overflowed or went
 * NaN on the calibration text). The observer keeps a NaN once seen. */
int quantizer_calib_check(const struct quantizer_calib *c, struct sl_err *err);

/* ---- one tensor: statistics, widths, codes (quantizer_alloc.c) -------------------------- */

/* How a tensor is quantized. */
struct quantizer_tensor_rule {
    double bits;             /* average budget of the tensor */
    uint8_t uniform_bits;    /* > 0: every row gets this width (uniform, smoothquant) */
    const float *row_weight; /* cmpq: RE of row r weighted by row_weight[r]; NULL: 1 */
    enum quantizer_metric metric;
    enum quantizer_clip clip; /* resolved: QUANTIZER_CLIP_NONE or _MSE */
};

/* Scale of one row under the rule's clipping. */
float quantizer_row_scale(const float *w, uint32_t n, uint32_t b, enum quantizer_clip clip);

/* re[r*9 + b], b = 1..8 (re[r*9] = 0), of the rows of W diag(s) (s NULL: W),
 * by the metric (the exact one with the clipping rule's scales). tmp: [cols]
 * scratch. Returns 0 or -ENOMEM. */
int quantizer_tensor_re(const float *w, uint32_t rows, uint32_t cols, const float *s,
                        enum quantizer_metric metric, enum quantizer_clip clip, double *re,
                        float *tmp);

/* Widths of the rows of W diag(s) under the rule (per-tensor budget).
 * Returns 0 or -ENOMEM. */
int quantizer_tensor_widths(const float *w, uint32_t rows, uint32_t cols, const float *s,
                            const struct quantizer_tensor_rule *rule, uint8_t *widths);

/* Codes q[rows][cols] and scales[rows] of W diag(s) with the given widths.
 * tmp: [cols] scratch. */
void quantizer_tensor_quantize(const float *w, uint32_t rows, uint32_t cols, const float *s,
                               const uint8_t *widths, enum quantizer_clip clip, int8_t *q,
                               float *scales, float *tmp);

/* ---- smoothing (quantizer_smooth.c) -------------------------------------------------- */

/* A layer reading the group's input. */
struct quantizer_smooth_member {
    const float *w;      /* [rows][cols] float weights before smoothing */
    uint32_t rows, cols; /* cols = the group's input width */
};

/* A smoothing group: the linear layers reading one input x (Q/K/V; O;
 * gate/up; down; an untied classifier). */
struct quantizer_smooth_group {
    uint32_t in;             /* input width */
    const float *in_max;     /* [in] S_I (for O: made common within kv groups) */
    const float *in_max_fit; /* [in] S_I of the rows that exclude x, or NULL */
    const float *x;          /* [n_sample][in] calibration input rows */
    uint32_t n_sample;
    struct quantizer_smooth_member m[3];
    int nm;
};

/* EdgeFlow 4.1: s = S_I^alpha (channels with S_I = 0 keep 1). */
void quantizer_smooth_scales(const float *in_max, uint32_t n, double alpha, float *s);
/* SmoothQuant: s_j = max|X_j|^alpha / max_k |W_kj|^(1 - alpha) over the
 * group's members. */
void quantizer_smooth_sq_scales(const float *in_max, uint32_t n,
                                const struct quantizer_smooth_member *m, int nm, double alpha,
                                float *s);
/* max_j in_max[j] / s[j]: the smoothed input's per-tensor max |x|. */
float quantizer_smooth_act_max(const float *in_max, const float *s, uint32_t n);
/* The static activation scale (docs/FORMAT.md act_scale) of the input of
 * layer `layer` (-1: embedding, classifier) role `role` from its statistics:
 * max_j in_max[j] / s[j] (s NULL: 1) / 127, or 0 (dynamic) when every channel
 * is 0. Returns 0 with *out set, or -EINVAL, *out untouched, with a message
 * naming the layer, the role, the channel and the value when a quotient is
 * NaN, infinite or negative (a broken statistic or smoothing scale): such a
 * value is never turned into a scale, nor into 0. */
int quantizer_act_scale(int layer, uint32_t role, const float *in_max, const float *s, uint32_t n,
                        float *out, struct sl_err *err);
/* "layer 3 wq", or the role alone for layer -1 ("classifier"), into buf[n]. */
void quantizer_layer_name(int layer, uint32_t role, char *buf, size_t n);
/* The relative output error sum_members ||y_q - y||^2 / ||y||^2 of the group
 * on its calibration rows when its input is divided by s and its weights
 * multiplied by s, quantized exactly as the final model will be: weights by
 * the rule (widths, clipping), activations per tensor with the static scale
 * max_j (S_I,j / s_j) / 127, S_I being in_max_fit when given (the rows x
 * then test scales they did not set) else in_max. At most max_rows output
 * rows per member are evaluated (evenly spaced; 0 = all). INFINITY when out
 * of memory. */
double quantizer_smooth_error(const struct quantizer_smooth_group *g, const float *s,
                              const struct quantizer_tensor_rule *rule, uint32_t max_rows);
/* Folds of the calibration rows (row i in fold i % FOLDS) for the search's
 * standard errors. */
#define QUANTIZER_SMOOTH_FOLDS 8

/* Grid search of alpha in {0, 1/steps, ..., 1} over quantizer_smooth_error
 * with s = S^alpha (S = in_max_fit when given, else in_max). one_se = 0: the
 * alpha of least error (the smallest on ties); 1: the smallest alpha whose
 * error exceeds the least by at most one standard error of the difference
 * (paired over QUANTIZER_SMOOTH_FOLDS folds of the rows): no smoothing the
 * noise of the estimate cannot tell from none. Writes s = in_max^alpha into
 * s_out, the chosen alpha's error into *err_out (if not NULL), returns alpha
 * (-1 when out of memory). */
double quantizer_smooth_search(const struct quantizer_smooth_group *g,
                               const struct quantizer_tensor_rule *rule, uint32_t steps,
                               uint32_t max_rows, int one_se, float *s_out, double *err_out);

/* GQA: S_I of the O projection made common to each kv group: channel (h, d)
 * gets the max over the query heads sharing head h's kv head, so that the
 * scaling can be folded into the rows of W_v. out: [n_heads * head_dim]. */
void quantizer_smooth_o_common(const struct format_config *c, const float *in_max, float *out);

/* ---- shadow outlier execution (quantizer_shadow.c) ------------------------------------ */

struct quantizer_shadow_in {
    const struct quantizer_opts *opts; /* shadow_quantile, shadow_cover, shadow_min_importance */
    int layer;
    uint32_t role, rows, cols;
    const float *x;      /* [n_sample][cols] calibration input rows (before smoothing) */
    uint32_t n_sample;
    const float *s;      /* [cols] smoothing scales (x / s is the input), or NULL */
    float act_max;       /* the maximum-based activation scale */
    const int8_t *codes; /* [rows][cols] the weight codes as unpacked */
};
/* Fills e (its hot and w malloc'ed, or NULL) and the activation scale to
 * store in *act_out: the bulk scale when shadowed (e->flags
 * FORMAT_SHADOW_ON), else act_max (pruned, or nothing beyond the bulk).
 * 0 or -ENOMEM. */
int quantizer_shadow_calibrate(const struct quantizer_shadow_in *in, struct format_shadow_linear *e,
                               float *act_out);

/* ---- error compensation (quantizer_gptq.c) ---------------------------------------------- */

/* Re-rounds the codes q [rows][cols] of W (the weights as quantized, the
 * smoothing folded in) on each row's grid (widths, scales fixed; rows of
 * width 1 untouched) with GPTQ's error compensation, the Hessian from the
 * n_sample calibration input rows x [n_sample][cols] divided by s (the
 * smoothing; NULL: none), the input W sees. 0 (also when H is singular: q
 * unchanged) or -ENOMEM. */
int quantizer_gptq(const float *w, uint32_t rows, uint32_t cols, const float *x,
                   uint32_t n_sample, const float *s, const uint8_t *widths, const float *scales,
                   int8_t *q);

/* The same loop on any grid: rd->round(ctx, r, j, wr, code, deq) rounds
 * weight j of row r (wr: the row's weights with the compensation so far;
 * columns > j not yet rounded) to *code, whose dequantized value is *deq,
 * and returns 0; or returns 1 to leave the row's code at j as it is. */
struct quantizer_rounder {
    int (*round)(void *ctx, uint32_t r, uint32_t j, const float *wr, int8_t *code,
                 double *deq);
    void *ctx;
};
int quantizer_gptq_with(const float *w, uint32_t rows, uint32_t cols, const float *x,
                        uint32_t n_sample, const float *s, const struct quantizer_rounder *rd,
                        int8_t *q);

/* ---- block multipliers (quantizer_mult.c) -------------------------------------------- */

/* Rounds W [rows][cols] with a multiplier in 1..format_packed_mult_max(b)
 * per block of FORMAT_PACKED_MULT_BLOCK weights of each row (b >= 2) and
 * GPTQ's compensation on the n_sample calibration rows x (divided by s):
 * q gets the codes on each row's uniform grid, mult [rows][blocks] the
 * multipliers (1 for rows of width 1), npu the int8 values q * m the NPU
 * sees, scales the rows' scales (max|w| / (lim M)). 0 or -ENOMEM. */
int quantizer_mult(const float *w, uint32_t rows, uint32_t cols, const float *x,
                   uint32_t n_sample, const float *s, const uint8_t *widths, float *scales,
                   int8_t *q, uint8_t *mult, int8_t *npu);

#endif

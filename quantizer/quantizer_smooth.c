/* quantizer_smooth.c: NPU-aware smoothing (EdgeFlow 4.1) and the SmoothQuant
 * baseline's migration.
 *
 * A smoothing group is the set of linear layers reading one input x (Q/K/V;
 * O; gate/up; down; an untied classifier). With per-input-channel activation
 * maxima S_I, s = S_I^alpha; the layers' weights become W' = W diag(s)
 * (columns scaled) and their input x' = x diag(s)^-1, folded into whatever
 * produces x (quantizer_pass1.c): the RMSNorm weight (Q/K/V, gate/up,
 * classifier), the rows of W_up (down: h = silu(gate) * up is linear in up's
 * rows) or the rows of W_v (O: the attention output is linear in v; with GQA
 * every query head of a kv group reads the same v channel, so s is common to
 * the group: quantizer_smooth_o_common). The float function is unchanged;
 * the quantized one sees a flatter activation (per-tensor scale) and weights
 * whose columns carry the activation's magnitude, so the input-unaware RE
 * allocation becomes input-aware (the paper's argument).
 *
 * The output side, W' diag(S_O^-beta) with beta = 1, needs no code here: the
 * emulated NPU dequantizes its int32 accumulators per output channel in
 * float, and symmetric per-output-channel quantization is invariant under a
 * positive row scaling (scale(W_i / S_O,i) * S_O,i = scale(W_i), same codes),
 * so dividing by S_O and folding S_O back into the dequantization scale
 * gives bit-identical codes and scales. It would matter on a device that
 * requantizes matmul outputs per tensor, which this one does not do. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quantizer_internal.h"

void quantizer_smooth_scales(const float *in_max, uint32_t n, double alpha, float *s)
{
    for (uint32_t c = 0; c < n; c++) {
        double m = in_max[c];
        double v = m > 0 && alpha > 0 ? pow(m, alpha) : 1.0;
        s[c] = v > 1e-12 && isfinite(v) ? (float)v : 1.0f;
    }
}

void quantizer_smooth_sq_scales(const float *in_max, uint32_t n,
                                const struct quantizer_smooth_member *m, int nm, double alpha,
                                float *s)
{
    for (uint32_t c = 0; c < n; c++) {
        double wmax = 0;
        for (int k = 0; k < nm; k++)
            for (uint32_t r = 0; r < m[k].rows; r++) {
                double v = fabs((double)m[k].w[(size_t)r * m[k].cols + c]);
                wmax = v > wmax ? v : wmax;
            }
        double v = in_max[c] > 0 && wmax > 0 ? pow(in_max[c], alpha) / pow(wmax, 1 - alpha) : 1;
        s[c] = v > 1e-12 && isfinite(v) ? (float)v : 1.0f;
    }
}

float quantizer_smooth_act_max(const float *in_max, const float *s, uint32_t n)
{
    float m = 0;
    for (uint32_t c = 0; c < n; c++) {
        float v = in_max[c] / (s ? s[c] : 1.0f);
        m = v > m ? v : m;
    }
    return m;
}

void quantizer_layer_name(int layer, uint32_t role, char *buf, size_t n)
{
    if (layer < 0)
        snprintf(buf, n, "%s", format_role_name(role));
    else
        snprintf(buf, n, "layer %d %s", layer, format_role_name(role));
}

int quantizer_act_scale(int layer, uint32_t role, const float *in_max, const float *s, uint32_t n,
                        float *out, struct sl_err *err)
{
    float m = 0;
    for (uint32_t c = 0; c < n; c++) {
        float d = s ? s[c] : 1.0f, v = in_max[c] / d;
        if (!(v >= 0) || !isfinite(v)) { /* NaN fails v >= 0 */
            char where[64];
            quantizer_layer_name(layer, role, where, sizeof where);
            sl_err_set(err,
                       "%s: input channel %u has calibration maximum %g and smoothing scale %g, "
                       "giving activation maximum %g; a static activation scale must be positive "
                       "and finite",
                       where, c, (double)in_max[c], (double)d, (double)v);
            return -EINVAL;
        }
        m = v > m ? v : m;
    }
    *out = m / 127.0f; /* finite and >= 0; 0: the input was always 0, scale it dynamically */
    return 0;
}

void quantizer_smooth_o_common(const struct format_config *c, const float *in_max, float *out)
{
    uint32_t hd = c->head_dim, mul = c->n_heads / c->n_kv_heads;
    for (uint32_t kv = 0; kv < c->n_kv_heads; kv++)
        for (uint32_t d = 0; d < hd; d++) {
            float v = 0;
            for (uint32_t k = 0; k < mul; k++)
                v = fmaxf(v, in_max[(kv * mul + k) * hd + d]);
            for (uint32_t k = 0; k < mul; k++)
                out[(kv * mul + k) * hd + d] = v;
        }
}

/* The rows of a member the search evaluates: every step-th. */
static uint32_t row_step(const struct quantizer_smooth_member *m, uint32_t max_rows)
{
    return max_rows && m->rows > max_rows ? m->rows / max_rows : 1;
}

/* int8 dot products with int32 accumulation (|sum| <= 127^2 in < 2^31 for
 * the widths here), in blocks of 32 with a fixed trip count in a function of
 * their own: GCC's -O2 cost model vectorizes that (an open-ended or nested
 * loop it leaves scalar, 4x slower here). */
static int32_t dot32_s8(const int8_t *a, const int8_t *b)
{
    int32_t t = 0;
    for (uint32_t j = 0; j < 32; j++)
        t += (int16_t)a[j] * (int16_t)b[j];
    return t;
}

static int32_t dot_s8(const int8_t *a, const int8_t *b, uint32_t n)
{
    int32_t acc = 0;
    uint32_t i = 0;
    for (; i + 32 <= n; i += 32)
        acc += dot32_s8(a + i, b + i);
    for (; i < n; i++)
        acc += (int16_t)a[i] * (int16_t)b[i];
    return acc;
}

/* Float outputs of the evaluated rows: ref[i][k] = x_i . W_(k step). */
static double *member_ref(const struct quantizer_smooth_group *g,
                          const struct quantizer_smooth_member *m, uint32_t step, uint32_t *nr)
{
    const uint32_t n = g->n_sample, in = g->in;
    *nr = (m->rows + step - 1) / step;
    double *ref = malloc(sizeof(double) * ((size_t)n * *nr + 1));
    if (!ref)
        return NULL;
    for (uint32_t k = 0; k < *nr; k++) {
        const float *wr = m->w + (size_t)k * step * m->cols;
        for (uint32_t i = 0; i < n; i++) {
            const float *xi = g->x + (size_t)i * in;
            double acc = 0;
            for (uint32_t c = 0; c < in; c++)
                acc += (double)xi[c] * wr[c];
            ref[(size_t)i * *nr + k] = acc;
        }
    }
    return ref;
}

/* Relative output error of one member; xq are the group's quantized rows,
 * ref the member's float outputs. Also adds the error of each fold of the
 * rows (row i in fold i % FOLDS) to fold[]. */
static double member_error(const struct quantizer_smooth_group *g,
                           const struct quantizer_smooth_member *m, const float *s,
                           const int8_t *xq, float sx, const struct quantizer_tensor_rule *rule,
                           uint32_t step, const double *ref, uint32_t nr, float *tmp, int8_t *q,
                           uint8_t *widths, double *fold)
{
    const uint32_t n = g->n_sample, in = g->in;
    if (quantizer_tensor_widths(m->w, m->rows, m->cols, s, rule, widths) < 0)
        return INFINITY;
    double num[QUANTIZER_SMOOTH_FOLDS] = {0}, den[QUANTIZER_SMOOTH_FOLDS] = {0};
    for (uint32_t k = 0; k < nr; k++) {
        uint32_t r = k * step;
        const float *wr = m->w + (size_t)r * m->cols;
        for (uint32_t c = 0; c < in; c++)
            tmp[c] = wr[c] * s[c];
        float sc = quantizer_row_scale(tmp, in, widths[r], rule->clip);
        quantizer_channel_quantize(tmp, in, widths[r], sc, q);
        for (uint32_t i = 0; i < n; i++) {
            double y = (double)sx * sc * dot_s8(xq + (size_t)i * in, q, in);
            double f = ref[(size_t)i * nr + k];
            num[i % QUANTIZER_SMOOTH_FOLDS] += (y - f) * (y - f);
            den[i % QUANTIZER_SMOOTH_FOLDS] += f * f;
        }
    }
    double tn = 0, td = 0;
    for (int f = 0; f < QUANTIZER_SMOOTH_FOLDS; f++) {
        tn += num[f];
        td += den[f];
        fold[f] += den[f] > 0 ? num[f] / den[f] : 0;
    }
    return td > 0 ? tn / td : 0;
}

/* The search's state for one group: the members' float outputs. */
struct smooth_eval {
    double *ref[3];
    uint32_t nr[3], step[3];
};

static void smooth_eval_fini(struct smooth_eval *e)
{
    for (int k = 0; k < 3; k++)
        free(e->ref[k]);
}

static int smooth_eval_init(struct smooth_eval *e, const struct quantizer_smooth_group *g,
                            uint32_t max_rows)
{
    memset(e, 0, sizeof *e);
    for (int k = 0; k < g->nm; k++) {
        e->step[k] = row_step(&g->m[k], max_rows);
        if (!(e->ref[k] = member_ref(g, &g->m[k], e->step[k], &e->nr[k]))) {
            smooth_eval_fini(e);
            return -ENOMEM;
        }
    }
    return 0;
}

/* The maxima the searched scales and the static activation scale come from. */
static const float *fit_max(const struct quantizer_smooth_group *g)
{
    return g->in_max_fit ? g->in_max_fit : g->in_max;
}

static double smooth_eval_error(const struct smooth_eval *e, const struct quantizer_smooth_group *g,
                                const float *s, const struct quantizer_tensor_rule *rule,
                                double *fold)
{
    const uint32_t n = g->n_sample, in = g->in;
    for (int f = 0; f < QUANTIZER_SMOOTH_FOLDS; f++)
        fold[f] = 0;
    if (n == 0)
        return 0;
    float act_max = quantizer_smooth_act_max(fit_max(g), s, in);
    float sx = act_max > 0 ? act_max / 127.0f : 1.0f;
    uint32_t rows = 0;
    for (int k = 0; k < g->nm; k++)
        rows = g->m[k].rows > rows ? g->m[k].rows : rows;
    int8_t *xq = malloc((size_t)n * in), *q = malloc(in);
    float *tmp = malloc(sizeof(float) * in);
    uint8_t *widths = malloc(rows);
    double err = INFINITY;
    if (!xq || !q || !tmp || !widths)
        goto out;
    /* the NPU's activation quantization: per tensor, static, symmetric */
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t c = 0; c < in; c++) {
            float v = rintf(g->x[(size_t)i * in + c] / s[c] / sx);
            xq[(size_t)i * in + c] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
        }
    err = 0;
    for (int k = 0; k < g->nm; k++)
        err += member_error(g, &g->m[k], s, xq, sx, rule, e->step[k], e->ref[k], e->nr[k], tmp, q,
                            widths, fold);
out:
    free(xq);
    free(q);
    free(tmp);
    free(widths);
    return err;
}

double quantizer_smooth_error(const struct quantizer_smooth_group *g, const float *s,
                              const struct quantizer_tensor_rule *rule, uint32_t max_rows)
{
    struct smooth_eval e;
    double fold[QUANTIZER_SMOOTH_FOLDS];
    if (g->n_sample == 0)
        return 0;
    if (smooth_eval_init(&e, g, max_rows) < 0)
        return INFINITY;
    double err = smooth_eval_error(&e, g, s, rule, fold);
    smooth_eval_fini(&e);
    return err;
}

double quantizer_smooth_search(const struct quantizer_smooth_group *g,
                               const struct quantizer_tensor_rule *rule, uint32_t steps,
                               uint32_t max_rows, int one_se, float *s_out, double *err_out)
{
    struct smooth_eval ev;
    if (steps == 0)
        steps = 10;
    float *s = malloc(sizeof(float) * g->in);
    double *err = malloc(sizeof(double) * (steps + 1));
    double *fold = malloc(sizeof(double) * (steps + 1) * QUANTIZER_SMOOTH_FOLDS);
    if (!s || !err || !fold || smooth_eval_init(&ev, g, max_rows) < 0) {
        free(s);
        free(err);
        free(fold);
        return -1;
    }
    uint32_t best = 0;
    for (uint32_t k = 0; k <= steps; k++) {
        quantizer_smooth_scales(fit_max(g), g->in, (double)k / steps, s);
        err[k] = smooth_eval_error(&ev, g, s, rule, fold + (size_t)k * QUANTIZER_SMOOTH_FOLDS);
        if (isinf(err[k])) {
            best = UINT32_MAX;
            break;
        }
        if (err[k] < err[best])
            best = k;
    }
    smooth_eval_fini(&ev);
    double alpha = -1;
    if (best != UINT32_MAX) {
        uint32_t pick = best;
        if (one_se) {
            /* the one-standard-error rule (Breiman et al., CART 3.4.3): the
             * least smoothing whose error is within one standard error of the
             * best, the error differences paired by fold */
            for (uint32_t k = 0; k < best; k++) {
                const double *a = fold + (size_t)k * QUANTIZER_SMOOTH_FOLDS;
                const double *b = fold + (size_t)best * QUANTIZER_SMOOTH_FOLDS;
                double mu = 0, var = 0;
                for (int f = 0; f < QUANTIZER_SMOOTH_FOLDS; f++)
                    mu += (a[f] - b[f]) / QUANTIZER_SMOOTH_FOLDS;
                for (int f = 0; f < QUANTIZER_SMOOTH_FOLDS; f++)
                    var += (a[f] - b[f] - mu) * (a[f] - b[f] - mu);
                double se = sqrt(var / (QUANTIZER_SMOOTH_FOLDS - 1) / QUANTIZER_SMOOTH_FOLDS);
                if (mu <= se) {
                    pick = k;
                    break;
                }
            }
        }
        alpha = (double)pick / steps;
        if (err_out)
            *err_out = err[pick];
        quantizer_smooth_scales(g->in_max, g->in, alpha, s_out);
    }
    free(s);
    free(err);
    free(fold);
    return alpha;
}

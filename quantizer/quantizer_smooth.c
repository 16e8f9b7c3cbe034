/* quantizer_smooth.c: NPU-aware smoothing (EdgeFlow 4.1) and the SmoothQuant
 * baseline's migration.
 *
 * A smoothing group is the set of linear layers reading one input x (Q/K/V;
 * O; gate/up; down; an untied classifier). With per-input-channel activation
 * maxima S_I, s = S_I^alpha; the layers' weights become W' = W diag(s)
 * (columns scaled) and their input x' = x diag(s)^-1, folded into whatever
 * produces x (quantizer_quantize.c): the RMSNorm weight (Q/K/V, gate/up,
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

/* Relative output error of one member; xq are the group's quantized rows. */
static double member_error(const struct quantizer_smooth_group *g,
                           const struct quantizer_smooth_member *m, const float *s,
                           const int8_t *xq, float sx, const struct quantizer_tensor_rule *rule,
                           uint32_t max_rows, float *tmp, int8_t *q, uint8_t *widths)
{
    const uint32_t n = g->n_sample, in = g->in;
    if (quantizer_tensor_widths(m->w, m->rows, m->cols, s, rule, widths) < 0)
        return INFINITY;
    uint32_t step = max_rows && m->rows > max_rows ? m->rows / max_rows : 1;
    double num = 0, den = 0;
    for (uint32_t r = 0; r < m->rows; r += step) {
        const float *wr = m->w + (size_t)r * m->cols;
        for (uint32_t c = 0; c < in; c++)
            tmp[c] = wr[c] * s[c];
        float sc = quantizer_row_scale(tmp, in, widths[r], rule->clip);
        quantizer_channel_quantize(tmp, in, widths[r], sc, q);
        for (uint32_t i = 0; i < n; i++) {
            const float *xi = g->x + (size_t)i * in;
            const int8_t *xqi = xq + (size_t)i * in;
            double ref = 0;
            int64_t acc = 0;
            for (uint32_t c = 0; c < in; c++) {
                ref += (double)xi[c] * wr[c];
                acc += (int32_t)xqi[c] * q[c];
            }
            double y = (double)sx * sc * (double)acc;
            num += (y - ref) * (y - ref);
            den += ref * ref;
        }
    }
    return den > 0 ? num / den : 0;
}

double quantizer_smooth_error(const struct quantizer_smooth_group *g, const float *s,
                              const struct quantizer_tensor_rule *rule, uint32_t max_rows)
{
    const uint32_t n = g->n_sample, in = g->in;
    if (n == 0)
        return 0;
    float act_max = quantizer_smooth_act_max(g->in_max, s, in);
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
    for (size_t i = 0; i < (size_t)n * in; i++) {
        float v = rintf(g->x[i] / s[i % in] / sx);
        xq[i] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
    }
    err = 0;
    for (int k = 0; k < g->nm; k++)
        err += member_error(g, &g->m[k], s, xq, sx, rule, max_rows, tmp, q, widths);
out:
    free(xq);
    free(q);
    free(tmp);
    free(widths);
    return err;
}

double quantizer_smooth_search(const struct quantizer_smooth_group *g,
                               const struct quantizer_tensor_rule *rule, uint32_t steps,
                               uint32_t max_rows, float *s_out, double *err_out)
{
    double best_a = 0, best_e = INFINITY;
    float *s = malloc(sizeof(float) * g->in);
    if (!s)
        return -1;
    if (steps == 0)
        steps = 10;
    for (uint32_t k = 0; k <= steps; k++) {
        double a = (double)k / steps;
        quantizer_smooth_scales(g->in_max, g->in, a, s);
        double e = quantizer_smooth_error(g, s, rule, max_rows);
        if (isinf(e)) {
            free(s);
            return -1;
        }
        if (e < best_e) {
            best_e = e;
            best_a = a;
        }
    }
    free(s);
    quantizer_smooth_scales(g->in_max, g->in, best_a, s_out);
    if (err_out)
        *err_out = best_e;
    return best_a;
}

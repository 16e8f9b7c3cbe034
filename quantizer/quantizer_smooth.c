/* quantizer_smooth.c: NPU-aware smoothing (EdgeFlow 4.1) and the
 * SmoothQuant baseline's migration.
 *
 * A smoothing group is a set of linear layers reading one input x (Q/K/V;
 * gate/up; o; down; the classifier). With per-input-channel activation maxima
 * S_I, s = S_I^alpha; the layers' weights become W' = W diag(s) (columns
 * scaled) and their input x' = x / s, which is folded into whatever produces
 * x: the RMSNorm weight (Q/K/V, gate/up, classifier), the rows of W_up (down:
 * h = silu(gate) * up is linear in up's rows) or the rows of W_v (o: the
 * attention output is linear in v; with GQA every query head of a kv group
 * reads the same v channel, so s is made common to the group by taking the
 * maximum over its heads). The float function is unchanged; the quantized
 * one sees a flatter activation (per-tensor quantization) and weights whose
 * columns carry the activation's scale (so the input-unaware RE allocation
 * becomes input-aware). alpha is chosen per group by a grid search on [0, 1]
 * minimizing the relative output error on calibration rows, each candidate
 * quantized exactly as the final model will be (weights with the method's
 * bit allocation, activations with the static per-tensor scale). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quantizer_smooth.h"

void qs_scales(const float *in_max, uint32_t n, double alpha, float *s)
{
    for (uint32_t c = 0; c < n; c++) {
        double m = in_max[c];
        s[c] = m > 0 && alpha > 0 ? (float)pow(m, alpha) : 1.0f;
        if (!(s[c] > 1e-12f) || !isfinite(s[c]))
            s[c] = 1.0f;
    }
}

void qs_smoothquant_scales(const float *in_max, uint32_t n, const struct qs_member *m, int nm,
                           double alpha, float *s)
{
    /* SmoothQuant: s_j = max|X_j|^alpha / max|W_j|^(1 - alpha) */
    for (uint32_t c = 0; c < n; c++) {
        double wmax = 0;
        for (int k = 0; k < nm; k++)
            for (uint32_t r = 0; r < m[k].rows; r++) {
                double v = fabs((double)m[k].w[(size_t)r * m[k].cols + c]);
                if (v > wmax)
                    wmax = v;
            }
        double v = in_max[c] > 0 && wmax > 0 ? pow(in_max[c], alpha) / pow(wmax, 1 - alpha) : 1;
        s[c] = v > 1e-12 && isfinite(v) ? (float)v : 1.0f;
    }
}

float qs_act_max(const float *in_max, const float *s, uint32_t n)
{
    float m = 0;
    for (uint32_t c = 0; c < n; c++) {
        float v = in_max[c] / (s ? s[c] : 1.0f);
        if (v > m)
            m = v;
    }
    return m;
}

void qs_channel_stats(const float *w, uint32_t rows, uint32_t cols, const float *s, double *re,
                      double weight_scale)
{
    for (uint32_t r = 0; r < rows; r++) {
        const float *wr = w + (size_t)r * cols;
        double mx = 0, ss = 0;
        for (uint32_t c = 0; c < cols; c++) {
            double v = (double)wr[c] * (s ? s[c] : 1.0f);
            ss += v * v;
            if (fabs(v) > mx)
                mx = fabs(v);
        }
        double ms = ss / cols;
        re[(size_t)r * 9] = 0;
        for (uint32_t b = 1; b <= 8; b++)
            re[(size_t)r * 9 + b] = weight_scale * quantizer_re_proxy(mx, ms, b);
    }
}

/* Quantizes W diag(s) with the given widths; q [rows][cols], scale [rows]. */
void qs_quantize(const float *w, uint32_t rows, uint32_t cols, const float *s,
                 const uint8_t *widths, int8_t *q, float *scale, float *tmp)
{
    for (uint32_t r = 0; r < rows; r++) {
        const float *wr = w + (size_t)r * cols;
        for (uint32_t c = 0; c < cols; c++)
            tmp[c] = wr[c] * (s ? s[c] : 1.0f);
        scale[r] = quantizer_channel_scale(tmp, cols, widths[r]);
        quantizer_channel_quantize(tmp, cols, widths[r], scale[r], q + (size_t)r * cols);
    }
}

int qs_widths(const float *w, uint32_t rows, uint32_t cols, const float *s,
              const struct qs_alloc *a, uint8_t *widths)
{
    if (a->uniform_bits) {
        memset(widths, a->uniform_bits, rows);
        return 0;
    }
    double *re = malloc(sizeof(double) * 9 * rows);
    double *wt = NULL;
    if (!re)
        return -ENOMEM;
    qs_channel_stats(w, rows, cols, s, re, 1.0);
    if (a->out_max) { /* cmpq: weight channels by their output magnitude */
        wt = malloc(sizeof(double) * rows);
        if (!wt) {
            free(re);
            return -ENOMEM;
        }
        for (uint32_t r = 0; r < rows; r++)
            wt[r] = (double)a->out_max[r] * a->out_max[r] + 1e-30;
    }
    int ret = quantizer_allocate(rows, re, wt, NULL, a->bits, widths);
    free(re);
    free(wt);
    return ret;
}

/* Relative output error of the quantized group for input scaling s. */
double qs_group_error(const struct qs_group *g, const float *s, const struct qs_alloc *alloc)
{
    uint32_t n = g->n_sample, in = g->in;
    if (n == 0)
        return 0;
    float act_max = qs_act_max(g->in_max, s, in);
    float sx = act_max > 0 ? act_max / 127.0f : 1.0f;
    int8_t *xq = malloc((size_t)n * in);
    float *tmp = malloc(sizeof(float) * in);
    double err = 0;
    if (!xq || !tmp) {
        free(xq);
        free(tmp);
        return INFINITY;
    }
    for (uint32_t i = 0; i < (size_t)n * in; i++) {
        float v = rintf(g->x[i] / s[i % in] / sx);
        xq[i] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
    }
    for (int k = 0; k < g->nm; k++) {
        const struct qs_member *m = &g->m[k];
        uint8_t *widths = malloc(m->rows);
        int8_t *q = malloc((size_t)m->cols);
        if (!widths || !q || qs_widths(m->w, m->rows, m->cols, s, alloc, widths) < 0) {
            free(widths);
            free(q);
            err = INFINITY;
            break;
        }
        double num = 0, den = 0;
        /* a deterministic sample of output rows keeps the search cheap */
        uint32_t step = m->rows > 128 ? m->rows / 128 : 1;
        for (uint32_t r = 0; r < m->rows; r += step) {
            const float *wr = m->w + (size_t)r * m->cols;
            for (uint32_t c = 0; c < m->cols; c++)
                tmp[c] = wr[c] * s[c];
            float sc = quantizer_channel_scale(tmp, m->cols, widths[r]);
            quantizer_channel_quantize(tmp, m->cols, widths[r], sc, q);
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
        err += den > 0 ? num / den : 0;
        free(widths);
        free(q);
    }
    free(xq);
    free(tmp);
    return err;
}

double qs_search_alpha(const struct qs_group *g, const struct qs_alloc *alloc, float *s_out,
                       double *err_out)
{
    double best_a = 0, best_e = INFINITY;
    float *s = malloc(sizeof(float) * g->in);
    if (!s)
        return 0;
    for (int k = 0; k <= 10; k++) {
        double a = k / 10.0;
        qs_scales(g->in_max, g->in, a, s);
        double e = qs_group_error(g, s, alloc);
        if (e < best_e) {
            best_e = e;
            best_a = a;
        }
    }
    qs_scales(g->in_max, g->in, best_a, s_out);
    if (err_out)
        *err_out = best_e;
    free(s);
    return best_a;
}

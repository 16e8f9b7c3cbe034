/* quantizer_alloc.c: per-channel symmetric quantization, the relative-error
 * metric and the greedy bit allocation (EdgeFlow 4.1, Appendix A). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quantizer_internal.h"

/* ---- one channel ------------------------------------------------------------------------ */

/* RE(W_i, B) = (max|W_i|)^2 / (2^(2B) E[W_i^2]): the cosine distance of a
 * quantized channel under the uniform-rounding model, up to a constant. */
double quantizer_re_proxy(double max_abs, double mean_sq, uint32_t bits)
{
    if (!(mean_sq > 0))
        return 0;
    return max_abs * max_abs / (ldexp(1.0, 2 * (int)bits) * mean_sq);
}

static int grid_max(uint32_t b)
{
    return b <= 1 ? 1 : (1 << (b - 1)) - 1;
}

static double mean_abs(const float *w, uint32_t n)
{
    double m = 0;
    for (uint32_t i = 0; i < n; i++)
        m += fabs((double)w[i]);
    return n ? m / n : 0;
}

static double max_abs(const float *w, uint32_t n)
{
    double m = 0;
    for (uint32_t i = 0; i < n; i++)
        if (fabs((double)w[i]) > m)
            m = fabs((double)w[i]);
    return m;
}

float quantizer_channel_scale(const float *w, uint32_t n, uint32_t b)
{
    if (b == 1) /* sign x mean|w| minimizes sum (w - s sign(w))^2 over s */
        return (float)mean_abs(w, n);
    return (float)(max_abs(w, n) / grid_max(b));
}

void quantizer_channel_quantize(const float *w, uint32_t n, uint32_t b, float scale, int8_t *q)
{
    if (b == 1) {
        for (uint32_t i = 0; i < n; i++)
            q[i] = w[i] >= 0 ? 1 : -1;
        return;
    }
    const double g = grid_max(b);
    for (uint32_t i = 0; i < n; i++) {
        double v = scale > 0 ? rint((double)w[i] / scale) : 0;
        v = v > g ? g : v < -g ? -g : v;
        q[i] = (int8_t)v;
    }
}

/* sum (w - scale q(w))^2 with the b-bit grid (b >= 2). */
static double sq_error(const float *w, uint32_t n, uint32_t b, double scale)
{
    const double g = grid_max(b), inv = scale > 0 ? 1.0 / scale : 0;
    double e = 0;
    for (uint32_t i = 0; i < n; i++) {
        double v = rint((double)w[i] * inv);
        v = v > g ? g : v < -g ? -g : v;
        double d = (double)w[i] - v * scale;
        e += d * d;
    }
    return e;
}

float quantizer_channel_scale_mse(const float *w, uint32_t n, uint32_t b)
{
    if (b == 1)
        return (float)mean_abs(w, n);
    const double top = max_abs(w, n) / grid_max(b);
    if (!(top > 0))
        return 0;
    /* Coarse grid of clipping ratios, then a finer one around the best: the
     * error is not convex in the ratio (rounding), so a bracketing search
     * could stop in a local dip; 13 evaluations of the row. */
    double best_r = 1, best_e = sq_error(w, n, b, top);
    for (int k = 1; k <= 10; k++) {
        double r = 1 - 0.05 * k, e = sq_error(w, n, b, top * r);
        if (e < best_e)
            best_e = e, best_r = r;
    }
    const double c = best_r;
    for (int k = -2; k <= 2; k++) {
        double r = c + 0.0125 * k;
        if (k == 0 || r > 1 || r < 0.4)
            continue;
        double e = sq_error(w, n, b, top * r);
        if (e < best_e)
            best_e = e, best_r = r;
    }
    return (float)(top * best_r);
}

float quantizer_row_scale(const float *w, uint32_t n, uint32_t b, enum quantizer_clip clip)
{
    return clip == QUANTIZER_CLIP_MSE ? quantizer_channel_scale_mse(w, n, b)
                                      : quantizer_channel_scale(w, n, b);
}

/* 1 - cos(w, scale q) with the clipping rule's scale; q: [n] scratch. */
static double re_exact_with(const float *w, uint32_t n, uint32_t b, enum quantizer_clip clip,
                            int8_t *q)
{
    float s = quantizer_row_scale(w, n, b, clip);
    quantizer_channel_quantize(w, n, b, s, q);
    double dot = 0, ww = 0, qq = 0;
    for (uint32_t i = 0; i < n; i++) {
        double d = (double)s * q[i];
        dot += (double)w[i] * d;
        ww += (double)w[i] * w[i];
        qq += d * d;
    }
    if (ww == 0)
        return 0;
    if (qq == 0)
        return 1;
    double r = 1 - dot / sqrt(ww * qq);
    return r > 0 ? r : 0;
}

double quantizer_re_exact(const float *w, uint32_t n, uint32_t b)
{
    int8_t *q = malloc(n ? n : 1);
    if (!q)
        return NAN;
    double r = re_exact_with(w, n, b, QUANTIZER_CLIP_NONE, q);
    free(q);
    return r;
}

/* ---- one tensor --------------------------------------------------------------------------- */

int quantizer_tensor_re(const float *w, uint32_t rows, uint32_t cols, const float *s,
                        enum quantizer_metric metric, enum quantizer_clip clip, double *re,
                        float *tmp)
{
    int8_t *q = NULL; /* the exact metric's codes */
    if (metric == QUANTIZER_METRIC_EXACT && !(q = malloc(cols ? cols : 1)))
        return -ENOMEM;
    for (uint32_t r = 0; r < rows; r++) {
        const float *wr = w + (size_t)r * cols;
        double mx = 0, ss = 0;
        for (uint32_t c = 0; c < cols; c++) {
            float v = s ? wr[c] * s[c] : wr[c];
            tmp[c] = v;
            ss += (double)v * v;
            if (fabs((double)v) > mx)
                mx = fabs((double)v);
        }
        double *rr = re + (size_t)r * 9;
        rr[0] = 0;
        for (uint32_t b = 1; b <= 8; b++)
            rr[b] = q ? re_exact_with(tmp, cols, b, clip, q) : quantizer_re_proxy(mx, ss / cols, b);
    }
    free(q);
    return 0;
}

int quantizer_tensor_widths(const float *w, uint32_t rows, uint32_t cols, const float *s,
                            const struct quantizer_tensor_rule *rule, uint8_t *widths)
{
    if (rule->uniform_bits) {
        memset(widths, rule->uniform_bits, rows);
        return 0;
    }
    double *re = malloc(sizeof(double) * 9 * rows);
    double *wt = rule->row_weight ? malloc(sizeof(double) * rows) : NULL;
    float *tmp = malloc(sizeof(float) * cols);
    int ret = -ENOMEM;
    if (!re || !tmp || (rule->row_weight && !wt))
        goto out;
    ret = quantizer_tensor_re(w, rows, cols, s, rule->metric, rule->clip, re, tmp);
    if (ret < 0)
        goto out;
    if (wt)
        for (uint32_t r = 0; r < rows; r++)
            wt[r] = (double)rule->row_weight[r];
    ret = quantizer_allocate(rows, re, wt, NULL, rule->bits, widths);
out:
    free(re);
    free(wt);
    free(tmp);
    return ret;
}

void quantizer_tensor_quantize(const float *w, uint32_t rows, uint32_t cols, const float *s,
                               const uint8_t *widths, enum quantizer_clip clip, int8_t *q,
                               float *scales, float *tmp)
{
    for (uint32_t r = 0; r < rows; r++) {
        const float *wr = w + (size_t)r * cols;
        for (uint32_t c = 0; c < cols; c++)
            tmp[c] = s ? wr[c] * s[c] : wr[c];
        scales[r] = quantizer_row_scale(tmp, cols, widths[r], clip);
        quantizer_channel_quantize(tmp, cols, widths[r], scales[r], q + (size_t)r * cols);
    }
}

/* ---- greedy allocation (Algorithm 1) -------------------------------------------------------- */

struct heap_item {
    double key; /* weighted gain per bit-cost of the channel's next bit */
    uint32_t ch;
};

static int above(const struct heap_item *a, const struct heap_item *b)
{
    return a->key > b->key || (a->key == b->key && a->ch < b->ch);
}

static void sift_down(struct heap_item *h, size_t n, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && above(&h[l], &h[m]))
            m = l;
        if (r < n && above(&h[r], &h[m]))
            m = r;
        if (m == i)
            return;
        struct heap_item t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

/* The best next step of channel c from width b: k more bits (k * cost within
 * the budget left) with the largest RE reduction per bit, weighted, per
 * weight; *k_out = 0 when no step fits. For curves whose gains decrease with
 * B (the closed form) the best step is always k = 1, which is Algorithm 1;
 * for others (the exact metric: with the max scale 2 bits are worse than a
 * 1-bit sign quantizer) it is a step along the curve's lower convex hull, so
 * a channel is not stuck behind a bit that by itself makes things worse. */
static double step_key(const double *re, const double *weight, const uint64_t *cost, uint32_t c,
                       uint32_t b, double budget, uint32_t *k_out)
{
    const double *r = re + (size_t)c * 9;
    const double cc = (double)(cost ? cost[c] : 1);
    double best = -INFINITY;
    *k_out = 0;
    for (uint32_t k = 1; b + k <= 8 && k * cc <= budget; k++) {
        double g = (r[b] - r[b + k]) / k;
        if (g > best) {
            best = g;
            *k_out = k;
        }
    }
    return best * (weight ? weight[c] : 1.0) / cc;
}

int quantizer_allocate(uint32_t n, const double *re, const double *weight, const uint64_t *cost,
                       double avg_bits, uint8_t *widths)
{
    if (!(avg_bits >= 1.0) || avg_bits > 8.0)
        return -EINVAL;
    if (n == 0)
        return 0;
    double total = 0;
    for (uint32_t c = 0; c < n; c++)
        total += (double)(cost ? cost[c] : 1);
    /* bits beyond the first, in weights x bits; a relative epsilon absorbs
     * the rounding of avg_bits * total (4.5 * 7 channels is 31.5 exactly, but
     * 4.1 * 10 is 40.999999...) */
    double budget = (avg_bits - 1.0) * total;
    budget += 1e-9 * (budget + 1);
    struct heap_item *h = malloc(sizeof *h * n);
    if (!h)
        return -ENOMEM;
    size_t hn = 0;
    uint32_t k;
    for (uint32_t c = 0; c < n; c++) {
        widths[c] = 1;
        double key = step_key(re, weight, cost, c, 1, budget, &k);
        if (k)
            h[hn++] = (struct heap_item){key, c};
    }
    for (size_t i = hn / 2; i-- > 0;)
        sift_down(h, hn, i);
    while (hn > 0) {
        uint32_t c = h[0].ch;
        /* the key may be stale: a longer step may no longer fit the budget */
        double key = step_key(re, weight, cost, c, widths[c], budget, &k);
        if (k == 0) {
            h[0] = h[--hn]; /* nothing fits any more; a cheaper channel's bit might */
        } else if (key < h[0].key) {
            h[0].key = key; /* re-queue with the step that fits */
        } else {
            budget -= (double)k * (double)(cost ? cost[c] : 1);
            widths[c] = (uint8_t)(widths[c] + k);
            h[0].key = step_key(re, weight, cost, c, widths[c], budget, &k);
            if (k == 0)
                h[0] = h[--hn];
        }
        if (hn)
            sift_down(h, hn, 0);
    }
    free(h);
    return 0;
}

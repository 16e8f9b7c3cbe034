/* quantizer_alloc.c: the relative-error metric and greedy bit allocation
 * (EdgeFlow 4.1, Appendix A), plus per-channel symmetric quantization. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quantizer.h"

/* RE(W_i, B) = (max|W_i|)^2 / (2^(2B) E[W_i^2]): the cosine distance of a
 * uniformly quantized channel under the uniform-rounding model. */
double quantizer_re_proxy(double max_abs, double mean_sq, uint32_t bits)
{
    if (mean_sq <= 0)
        return 0;
    return max_abs * max_abs / (ldexp(1.0, 2 * (int)bits) * mean_sq);
}

static int grid_max(uint32_t b)
{
    return b == 1 ? 1 : (1 << (b - 1)) - 1;
}

float quantizer_channel_scale(const float *w, uint32_t n, uint32_t b)
{
    double m = 0;
    if (b == 1) { /* sign x mean|w| minimizes the L2 error of a sign quantizer */
        for (uint32_t i = 0; i < n; i++)
            m += fabs((double)w[i]);
        return (float)(m / n);
    }
    for (uint32_t i = 0; i < n; i++)
        if (fabs((double)w[i]) > m)
            m = fabs((double)w[i]);
    return (float)(m / grid_max(b));
}

void quantizer_channel_quantize(const float *w, uint32_t n, uint32_t b, float scale, int8_t *q)
{
    int g = grid_max(b);
    for (uint32_t i = 0; i < n; i++) {
        if (b == 1) {
            q[i] = w[i] >= 0 ? 1 : -1;
            continue;
        }
        double v = scale > 0 ? rint((double)w[i] / scale) : 0;
        v = v > g ? g : v < -g ? -g : v;
        q[i] = (int8_t)v;
    }
}

double quantizer_re_exact(const float *w, uint32_t n, uint32_t b)
{
    int8_t *q = malloc(n);
    if (!q)
        return NAN;
    float s = quantizer_channel_scale(w, n, b);
    quantizer_channel_quantize(w, n, b, s, q);
    double dot = 0, ww = 0, qq = 0;
    for (uint32_t i = 0; i < n; i++) {
        double d = (double)s * q[i];
        dot += w[i] * d;
        ww += (double)w[i] * w[i];
        qq += d * d;
    }
    free(q);
    if (ww == 0 || qq == 0)
        return ww == 0 ? 0 : 1;
    return 1 - dot / sqrt(ww * qq);
}

/* ---- greedy allocation ---------------------------------------------------------------- */

struct heap_item {
    double key;        /* gain per bit-cost of the next bit */
    uint32_t ch;
};

static void sift_down(struct heap_item *h, size_t n, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && (h[l].key > h[m].key || (h[l].key == h[m].key && h[l].ch < h[m].ch)))
            m = l;
        if (r < n && (h[r].key > h[m].key || (h[r].key == h[m].key && h[r].ch < h[m].ch)))
            m = r;
        if (m == i)
            return;
        struct heap_item t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

/* The key of giving channel c its next bit: the RE reduction, weighted, per
 * weight the bit costs. */
static double gain_key(const double *re, const double *weight, const uint64_t *cost, uint32_t c,
                       uint32_t b)
{
    double g = re[(size_t)c * 9 + b] - re[(size_t)c * 9 + b + 1];
    return g * (weight ? weight[c] : 1.0) / (double)(cost ? cost[c] : 1);
}

int quantizer_allocate(uint32_t n, const double *re, const double *weight, const uint64_t *cost,
                       double avg_bits, uint8_t *widths)
{
    if (n == 0)
        return 0;
    if (!(avg_bits >= 1.0) || avg_bits > 8.0)
        return -EINVAL;
    uint64_t total = 0;
    for (uint32_t c = 0; c < n; c++)
        total += cost ? cost[c] : 1;
    /* budget in bit-weights: everything starts at 1 bit */
    double budget = avg_bits * (double)total - (double)total;
    struct heap_item *h = malloc(sizeof *h * n);
    if (!h)
        return -ENOMEM;
    size_t hn = 0;
    for (uint32_t c = 0; c < n; c++) {
        widths[c] = 1;
        h[hn++] = (struct heap_item){gain_key(re, weight, cost, c, 1), c};
    }
    for (size_t i = hn / 2; i-- > 0;)
        sift_down(h, hn, i);
    while (hn > 0) {
        uint32_t c = h[0].ch;
        double cc = (double)(cost ? cost[c] : 1);
        if (cc > budget + 1e-9) {
            /* this channel's next bit does not fit; a cheaper channel's might */
            h[0] = h[--hn];
            sift_down(h, hn, 0);
            continue;
        }
        budget -= cc;
        widths[c]++;
        if (widths[c] < 8) {
            h[0].key = gain_key(re, weight, cost, c, widths[c]);
        } else {
            h[0] = h[--hn];
        }
        sift_down(h, hn, 0);
    }
    free(h);
    return 0;
}

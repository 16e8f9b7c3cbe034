/* quantizer_table.c: a non-uniform code-to-int8 table per tensor (packed
 * header version 2, docs/FORMAT-packed.md). The rows of the tensor's most
 * common width T keep T-bit codes, but a code decodes to one of 2^T - 1
 * int8 levels in [-127, 127] fitted to the weights by Lloyd's algorithm
 * (1-D k-means), each weight weighted by the diagonal of the layer's
 * Hessian E[x_c^2] (the inputs it sees) times its row's scale squared, so
 * that the fit minimizes the same output error GPTQ does, column by column
 * without the cross terms. Those rows' scales become max|w| / 127; the
 * codes are then rounded with GPTQ's compensation (quantizer_gptq_with),
 * the table's rows to the nearest level, the other rows on their own
 * uniform grids. The NPU still sees per-channel int8 and scales. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quantizer_internal.h"

#define LLOYD_ITERS 25

static int cmp_int(const void *a, const void *b)
{
    return *(const int *)a - *(const int *)b;
}

/* Index of the level nearest t among the k sorted levels lev (ties: the
 * lower one). */
static int nearest(const int *lev, int k, double t)
{
    int lo = 0, hi = k - 1;
    while (lo < hi) { /* first level >= t */
        int mid = (lo + hi) / 2;
        if (lev[mid] < t)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo > 0 && t - lev[lo - 1] <= lev[lo] - t)
        lo--;
    return lo;
}

/* Weighted Lloyd of the n values t (weights wt) into k sorted integer
 * levels in [-127, 127], from the uniform grid. */
static int lloyd(const float *t, const double *wt, size_t n, int k, int *lev)
{
    double *sw = malloc(sizeof(double) * k), *st = malloc(sizeof(double) * k);
    if (!sw || !st) {
        free(sw);
        free(st);
        return -ENOMEM;
    }
    for (int i = 0; i < k; i++)
        lev[i] = (int)lrint(-127.0 + 254.0 * i / (k - 1));
    for (int it = 0; it < LLOYD_ITERS; it++) {
        memset(sw, 0, sizeof(double) * k);
        memset(st, 0, sizeof(double) * k);
        for (size_t i = 0; i < n; i++) {
            int a = nearest(lev, k, t[i]);
            sw[a] += wt[i];
            st[a] += wt[i] * t[i];
        }
        int changed = 0;
        for (int i = 0; i < k; i++) {
            if (!(sw[i] > 0))
                continue; /* an empty level stays where it is */
            long v = lrint(st[i] / sw[i]);
            v = v > 127 ? 127 : v < -127 ? -127 : v;
            changed |= v != lev[i];
            lev[i] = (int)v;
        }
        qsort(lev, (size_t)k, sizeof(int), cmp_int);
        if (!changed)
            break;
    }
    free(sw);
    free(st);
    return 0;
}

struct table_grid {
    const uint8_t *widths;
    const float *scales;
    const int *lev;
    int k, off;
    uint32_t T;
};

static int table_round(void *ctx, uint32_t r, uint32_t j, const float *wr, int8_t *code,
                       double *deq)
{
    const struct table_grid *g = ctx;
    uint32_t b = g->widths[r];
    float sc = g->scales[r];
    if (b < 2 || !(sc > 0))
        return 1;
    if (b == g->T) {
        int i = nearest(g->lev, g->k, (double)wr[j] / sc);
        *code = (int8_t)(i - g->off);
        *deq = (double)g->lev[i] * sc;
        return 0;
    }
    int lim = (1 << (b - 1)) - 1;
    float v = rintf(wr[j] / sc);
    int c = v > (float)lim ? lim : v < (float)-lim ? -lim : (int)v;
    *code = (int8_t)c;
    *deq = (double)c * sc;
    return 0;
}

int quantizer_table(const float *w, uint32_t rows, uint32_t cols, const float *x,
                    uint32_t n_sample, const float *s, const uint8_t *widths, float *scales,
                    int8_t *q, int8_t *npu, int8_t table[255], uint32_t *table_bits)
{
    *table_bits = 0;
    uint32_t count[9] = {0}, T = 0;
    for (uint32_t r = 0; r < rows; r++)
        count[widths[r]]++;
    for (uint32_t b = 2; b <= 8; b++)
        if (count[b] > (T ? count[T] : 0))
            T = b;
    if (n_sample == 0 || T == 0)
        return 0; /* no calibration or no multi-bit row: no table */
    int k = (1 << T) - 1, off = (1 << (T - 1)) - 1;
    size_t n = (size_t)count[T] * cols;
    double *hd = calloc(cols, sizeof(double)), *wt = malloc(sizeof(double) * n);
    float *t = malloc(sizeof(float) * n);
    int *lev = malloc(sizeof(int) * k);
    int ret = hd && wt && t && lev ? 0 : -ENOMEM;
    if (ret < 0)
        goto out;
    for (uint32_t i = 0; i < n_sample; i++)
        for (uint32_t c = 0; c < cols; c++) {
            double v = (double)x[(size_t)i * cols + c] / (s ? s[c] : 1.0);
            hd[c] += v * v;
        }
    double mean = 0;
    for (uint32_t c = 0; c < cols; c++)
        mean += hd[c] / cols;
    for (uint32_t c = 0; c < cols; c++) /* GPTQ's damping; dead inputs count a little */
        hd[c] += 0.01 * mean + 1e-30;
    size_t i = 0;
    for (uint32_t r = 0; r < rows; r++) {
        if (widths[r] != T)
            continue;
        const float *wr = w + (size_t)r * cols;
        float mx = 0;
        for (uint32_t c = 0; c < cols; c++)
            mx = fmaxf(mx, fabsf(wr[c]));
        scales[r] = mx / 127.0f;
        double sc = scales[r] > 0 ? scales[r] : 1.0;
        for (uint32_t c = 0; c < cols; c++, i++) {
            t[i] = (float)(wr[c] / sc);
            wt[i] = hd[c] * sc * sc;
        }
    }
    if ((ret = lloyd(t, wt, n, k, lev)) < 0)
        goto out;
    struct table_grid g = {widths, scales, lev, k, off, T};
    struct quantizer_rounder rd = {table_round, &g};
    for (uint32_t r = 0; r < rows; r++) /* round-to-nearest first (kept if H is singular) */
        for (uint32_t c = 0; c < cols; c++) {
            double deq;
            table_round(&g, r, c, w + (size_t)r * cols, q + (size_t)r * cols + c, &deq);
        }
    if ((ret = quantizer_gptq_with(w, rows, cols, x, n_sample, s, &rd, q)) < 0)
        goto out;
    for (int j = 0; j < k; j++)
        table[j] = (int8_t)lev[j];
    *table_bits = T;
    for (uint32_t r = 0; r < rows; r++)
        for (uint32_t c = 0; c < cols; c++) {
            size_t e = (size_t)r * cols + c;
            npu[e] = widths[r] == T ? table[q[e] + off] : q[e];
        }
out:
    free(hd);
    free(wt);
    free(t);
    free(lev);
    return ret;
}

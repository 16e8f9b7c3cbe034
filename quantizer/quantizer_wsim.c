/* quantizer_wsim.c: simulation of two weight grids beyond a uniform grid
 * per channel (issue 16, item 2), for measuring them at equal bytes before
 * building either into the container format:
 *   - table: a non-uniform code-to-int8 table, 2^b int8 levels fitted to the
 *     weights by Lloyd's algorithm (k-means), weighted by the diagonal of
 *     the layer's Hessian (E[x_c^2], the inputs the weights see), per output
 *     channel (row) or one per tensor;
 *   - mult: small integer multipliers m in 1..M per block of G weights of a
 *     row folded into the int8 values (code * m), so that the NPU still sees
 *     per-channel int8 and a per-channel scale.
 * Both round with GPTQ's error compensation (quantizer_gptq_with). The
 * output is the int8 values the NPU would see (written by the caller as
 * 8-bit rows) and the bits the table or the multipliers would add. */
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

/* Index of the level nearest t among the k sorted levels lev. */
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

/* Weighted Lloyd (1-D k-means) of the n values t with weights wt into the
 * k sorted integer levels lev in [-127, 127], from a uniform start. */
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

struct wsim_ctx {
    enum quantizer_wsim kind;
    uint32_t cols, block, mult;
    const uint8_t *widths; /* the rows' code widths b */
    const float *scales;   /* per row */
    const int *lev;        /* table: [rows or 1][k] sorted levels */
    int k, per_row;
    const double *hd;      /* [cols] Hessian diagonal */
    uint8_t *m;            /* mult: [rows][blocks] the current multipliers */
};

static int wsim_round(void *vc, uint32_t r, uint32_t j, const float *wr, int8_t *code,
                      double *deq)
{
    const struct wsim_ctx *c = vc;
    float sc = c->scales[r];
    if (!(sc > 0) || c->widths[r] < 2)
        return 1;
    if (c->kind != QUANTIZER_WSIM_MULT) {
        const int *lev = c->lev + (c->per_row ? (size_t)r * c->k : 0);
        int v = lev[nearest(lev, c->k, (double)wr[j] / sc)];
        *code = (int8_t)v;
        *deq = (double)v * sc;
        return 0;
    }
    uint32_t nb = (c->cols + c->block - 1) / c->block, bi = j / c->block;
    int lim = (1 << (c->widths[r] - 1)) - 1;
    int M = (int)c->mult;
    if (M * lim > 127)
        M = 127 / lim;
    uint8_t *mp = c->m + (size_t)r * nb + bi;
    if (j % c->block == 0) { /* the block's multiplier, on the compensated weights */
        uint32_t j1 = j + c->block < c->cols ? j + c->block : c->cols;
        double best = INFINITY;
        for (int m = 1; m <= M; m++) {
            double e = 0, s = (double)sc * m;
            for (uint32_t i = j; i < j1; i++) {
                double v = rint(wr[i] / s);
                v = v > lim ? lim : v < -lim ? -lim : v;
                double d = wr[i] - v * s;
                e += c->hd[i] * d * d;
            }
            if (e < best) {
                best = e;
                *mp = (uint8_t)m;
            }
        }
    }
    int m = *mp;
    double v = rint(wr[j] / ((double)sc * m));
    v = v > lim ? lim : v < -lim ? -lim : v;
    *code = (int8_t)(v * m);
    *deq = (double)*code * sc;
    return 0;
}

int quantizer_wsim(const struct quantizer_opts *o, const float *w, uint32_t rows, uint32_t cols,
                   const float *x, uint32_t n_sample, const float *s, uint8_t *widths,
                   float *scales, int8_t *q, uint64_t *extra_bits)
{
    *extra_bits = 0;
    if (n_sample == 0)
        return 0;
    uint8_t b = widths[0];
    for (uint32_t r = 1; r < rows; r++)
        if (widths[r] > b)
            b = widths[r];
    int k = 1 << b;
    int per_row = o->wsim == QUANTIZER_WSIM_TABLE_ROW;
    uint32_t nb = (cols + o->wsim_block - 1) / o->wsim_block;
    double *hd = calloc(cols, sizeof(double));
    int *lev = NULL;
    uint8_t *m = NULL;
    float *t = NULL;
    double *wt = NULL;
    int ret = -ENOMEM;
    if (!hd)
        goto out;
    for (uint32_t i = 0; i < n_sample; i++)
        for (uint32_t c = 0; c < cols; c++) {
            double v = (double)x[(size_t)i * cols + c] / (s ? s[c] : 1.0);
            hd[c] += v * v;
        }
    double mean = 0;
    for (uint32_t c = 0; c < cols; c++)
        mean += hd[c] / cols;
    for (uint32_t c = 0; c < cols; c++) /* as GPTQ's damping */
        hd[c] += 0.01 * mean + 1e-30;
    /* every row's scale: its max over the int8 range the grid uses */
    for (uint32_t r = 0; r < rows; r++) {
        float mx = 0;
        for (uint32_t c = 0; c < cols; c++)
            mx = fmaxf(mx, fabsf(w[(size_t)r * cols + c]));
        int lim = (1 << (widths[r] - 1)) - 1;
        int M = (int)o->wsim_mult;
        if (M * lim > 127)
            M = 127 / lim;
        double range = o->wsim == QUANTIZER_WSIM_MULT ? (double)lim * M : 127.0;
        scales[r] = widths[r] >= 2 ? (float)(mx / range) : scales[r];
    }
    if (o->wsim == QUANTIZER_WSIM_MULT) {
        if (!(m = calloc((size_t)rows * nb, 1)))
            goto out;
        uint32_t mb = 0;
        while ((1u << mb) < o->wsim_mult)
            mb++;
        *extra_bits = (uint64_t)rows * nb * mb;
    } else {
        size_t n = per_row ? cols : (size_t)rows * cols;
        lev = malloc(sizeof(int) * (size_t)k * (per_row ? rows : 1));
        t = malloc(sizeof(float) * n);
        wt = malloc(sizeof(double) * n);
        if (!lev || !t || !wt)
            goto out;
        for (uint32_t r0 = 0; r0 < rows; r0 += per_row ? 1 : rows) {
            uint32_t r1 = per_row ? r0 + 1 : rows;
            size_t i = 0;
            for (uint32_t r = r0; r < r1; r++)
                for (uint32_t c = 0; c < cols; c++, i++) {
                    double sc = scales[r] > 0 ? scales[r] : 1.0;
                    t[i] = (float)(w[(size_t)r * cols + c] / sc);
                    wt[i] = hd[c] * sc * sc;
                }
            if ((ret = lloyd(t, wt, i, k, lev + (per_row ? (size_t)r0 * k : 0))) < 0)
                goto out;
        }
        *extra_bits = (uint64_t)k * 8 * (per_row ? rows : 1);
    }
    struct wsim_ctx c = {.kind = o->wsim, .cols = cols, .block = o->wsim_block,
                         .mult = o->wsim_mult, .widths = widths, .scales = scales,
                         .lev = lev, .k = k, .per_row = per_row, .hd = hd, .m = m};
    struct quantizer_rounder rd = {wsim_round, &c};
    /* round-to-nearest on the new grid first (kept if H is singular) */
    for (uint32_t r = 0; r < rows; r++) {
        const float *wr = w + (size_t)r * cols;
        for (uint32_t j = 0; j < cols; j++) {
            double deq;
            wsim_round(&c, r, j, wr, q + (size_t)r * cols + j, &deq);
        }
    }
    ret = quantizer_gptq_with(w, rows, cols, x, n_sample, s, &rd, q);
    for (uint32_t r = 0; ret == 0 && r < rows; r++)
        if (widths[r] >= 2)
            widths[r] = 8;
out:
    free(hd);
    free(lev);
    free(m);
    free(t);
    free(wt);
    return ret;
}

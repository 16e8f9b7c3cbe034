/* quantizer_gptq.c: weight rounding with error compensation in the manner
 * of GPTQ (Frantar et al. 2023): the columns of W [rows][cols] are rounded
 * one at a time on each row's fixed grid (its width and scale, as chosen for
 * round-to-nearest), and each column's rounding error is spread over the
 * columns not yet rounded through the inverse Hessian of the layer's
 * calibration inputs, H = X^T X / n (+ 1% of its mean diagonal), which
 * minimizes the output error ||X W^T - X Q^T||^2 column by column. The codes
 * stay on the same grids (the packed format, the unpacker and the NPU see
 * nothing new). O(rows cols^2 + cols^3). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quantizer_internal.h"

/* In-place Cholesky of the SPD matrix a [n][n] (lower triangle, L L^T);
 * -EDOM when not positive definite. */
static int cholesky(double *a, uint32_t n)
{
    for (uint32_t j = 0; j < n; j++) {
        double d = a[(size_t)j * n + j];
        for (uint32_t k = 0; k < j; k++)
            d -= a[(size_t)j * n + k] * a[(size_t)j * n + k];
        if (!(d > 0))
            return -EDOM;
        d = sqrt(d);
        a[(size_t)j * n + j] = d;
        for (uint32_t i = j + 1; i < n; i++) {
            double v = a[(size_t)i * n + j];
            for (uint32_t k = 0; k < j; k++)
                v -= a[(size_t)i * n + k] * a[(size_t)j * n + k];
            a[(size_t)i * n + j] = v / d;
        }
    }
    return 0;
}

/* U [n][n] upper triangular with H^-1 = U^T U, from H [n][n] (destroyed). */
static int inverse_chol_upper(double *h, uint32_t n, double *u)
{
    int ret = cholesky(h, n); /* H = L L^T */
    if (ret < 0)
        return ret;
    /* Linv = L^-1 (lower), into u */
    memset(u, 0, sizeof(double) * n * n);
    for (uint32_t j = 0; j < n; j++) {
        u[(size_t)j * n + j] = 1.0 / h[(size_t)j * n + j];
        for (uint32_t i = j + 1; i < n; i++) {
            double v = 0;
            for (uint32_t k = j; k < i; k++)
                v -= h[(size_t)i * n + k] * u[(size_t)k * n + j];
            u[(size_t)i * n + j] = v / h[(size_t)i * n + i];
        }
    }
    /* H^-1 = Linv^T Linv, into h */
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t j = 0; j <= i; j++) {
            double v = 0;
            for (uint32_t k = i; k < n; k++)
                v += u[(size_t)k * n + i] * u[(size_t)k * n + j];
            h[(size_t)i * n + j] = v;
            h[(size_t)j * n + i] = v;
        }
    ret = cholesky(h, n); /* H^-1 = M M^T, M lower; U = M^T */
    if (ret < 0)
        return ret;
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t j = 0; j < n; j++)
            u[(size_t)i * n + j] = j >= i ? h[(size_t)j * n + i] : 0.0;
    return 0;
}

/* The uniform grid of quantizer_gptq: row r's width and scale. */
struct uniform_grid {
    const uint8_t *widths;
    const float *scales;
};

static int uniform_round(void *ctx, uint32_t r, uint32_t j, const float *wr, int8_t *code,
                         double *deq)
{
    const struct uniform_grid *g = ctx;
    uint32_t b = g->widths[r];
    if (b < 2 || !(g->scales[r] > 0))
        return 1; /* sign rows and empty rows keep their codes */
    int lim = (1 << (b - 1)) - 1;
    float v = rintf(wr[j] / g->scales[r]);
    int c = v > (float)lim ? lim : v < (float)-lim ? -lim : (int)v;
    *code = (int8_t)c;
    *deq = (double)c * g->scales[r];
    return 0;
}

int quantizer_gptq_with(const float *w, uint32_t rows, uint32_t cols, const float *x,
                        uint32_t n_sample, const float *s, const struct quantizer_rounder *rd,
                        int8_t *q)
{
    if (n_sample == 0)
        return 0; /* no calibration rows: the caller's codes stay */
    size_t nn = (size_t)cols * cols;
    double *h = calloc(nn, sizeof(double)), *u = malloc(sizeof(double) * nn);
    float *wk = malloc(sizeof(float) * (size_t)rows * cols);
    double *xr = malloc(sizeof(double) * cols);
    int ret = h && u && wk && xr ? 0 : -ENOMEM;
    for (uint32_t i = 0; ret == 0 && i < n_sample; i++) {
        for (uint32_t c = 0; c < cols; c++)
            xr[c] = (double)x[(size_t)i * cols + c] / (s ? s[c] : 1.0);
        for (uint32_t a = 0; a < cols; a++) {
            if (xr[a] == 0)
                continue;
            double *ha = h + (size_t)a * cols;
            for (uint32_t b = 0; b <= a; b++)
                ha[b] += xr[a] * xr[b];
        }
    }
    if (ret == 0) {
        double mean = 0;
        for (uint32_t a = 0; a < cols; a++) {
            for (uint32_t b = 0; b < a; b++)
                h[(size_t)b * cols + a] = h[(size_t)a * cols + b];
            mean += h[(size_t)a * cols + a];
        }
        mean /= cols;
        for (uint32_t a = 0; a < cols; a++) /* dead inputs: any value does */
            h[(size_t)a * cols + a] += h[(size_t)a * cols + a] > 0 ? 0.01 * mean : 1.0;
        if (!(mean > 0))
            ret = -EDOM;
    }
    if (ret == 0)
        ret = inverse_chol_upper(h, cols, u);
    if (ret == 0) {
        for (uint32_t r = 0; r < rows; r++)
            for (uint32_t c = 0; c < cols; c++)
                wk[(size_t)r * cols + c] = w[(size_t)r * cols + c];
        for (uint32_t j = 0; j < cols; j++) {
            double d = u[(size_t)j * cols + j];
            const double *uj = u + (size_t)j * cols;
            for (uint32_t r = 0; r < rows; r++) {
                float *wr = wk + (size_t)r * cols;
                int8_t code;
                double deq;
                if (rd->round(rd->ctx, r, j, wr, &code, &deq))
                    continue;
                q[(size_t)r * cols + j] = code;
                double e = ((double)wr[j] - deq) / d;
                for (uint32_t k = j + 1; k < cols; k++)
                    wr[k] -= (float)(e * uj[k]);
            }
        }
    }
    free(h);
    free(u);
    free(wk);
    free(xr);
    return ret == -EDOM ? 0 : ret; /* a singular H: the caller's codes stay */
}

int quantizer_gptq(const float *w, uint32_t rows, uint32_t cols, const float *x,
                   uint32_t n_sample, const float *s, const uint8_t *widths, const float *scales,
                   int8_t *q)
{
    struct uniform_grid g = {widths, scales};
    struct quantizer_rounder rd = {uniform_round, &g};
    return quantizer_gptq_with(w, rows, cols, x, n_sample, s, &rd, q);
}

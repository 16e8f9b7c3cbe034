/* quantizer_wsim.c: simulation of small integer multipliers per block of a
 * row folded into the unpacked int8 values (issue 16, item 2), for measuring
 * them at equal bytes before building them into the container format: a
 * b-bit row's int8 values are code * m, m in 1..M chosen per block of G
 * weights (M * (2^(b-1) - 1) <= 127, so M is 1 at 8 bits), so that the NPU
 * still sees per-channel int8 and a per-channel scale (max|w| / (lim M)).
 * Each block's m is the one of least Hessian-weighted error for the block's
 * weights as GPTQ has compensated them when it reaches the block
 * (quantizer_gptq_with). The output is the int8 values the NPU would see
 * (written by the caller as 8-bit rows) and the bits the multipliers would
 * add (ceil(log2 M) per block). (Code tables, the other grid of item 2, are
 * built for real: quantizer_table.c.) */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quantizer_internal.h"

struct wsim_ctx {
    uint32_t cols, block, mult;
    const uint8_t *widths; /* the rows' code widths b */
    const float *scales;   /* per row */
    const double *hd;      /* [cols] Hessian diagonal */
    uint8_t *m;            /* [rows][blocks] the current multipliers */
};

static int row_mult(uint32_t mult, uint32_t b)
{
    int lim = (1 << (b - 1)) - 1, M = (int)mult;
    return M * lim > 127 ? 127 / lim : M;
}

static int wsim_round(void *vc, uint32_t r, uint32_t j, const float *wr, int8_t *code,
                      double *deq)
{
    const struct wsim_ctx *c = vc;
    float sc = c->scales[r];
    if (!(sc > 0) || c->widths[r] < 2)
        return 1;
    uint32_t nb = (c->cols + c->block - 1) / c->block, bi = j / c->block;
    int lim = (1 << (c->widths[r] - 1)) - 1, M = row_mult(c->mult, c->widths[r]);
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
    uint32_t nb = (cols + o->wsim_block - 1) / o->wsim_block;
    double *hd = calloc(cols, sizeof(double));
    uint8_t *m = calloc((size_t)rows * nb, 1);
    int ret = -ENOMEM;
    if (!hd || !m)
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
    for (uint32_t r = 0; r < rows; r++) { /* every row's scale: its max over lim * M */
        if (widths[r] < 2)
            continue;
        float mx = 0;
        for (uint32_t c = 0; c < cols; c++)
            mx = fmaxf(mx, fabsf(w[(size_t)r * cols + c]));
        int M = row_mult(o->wsim_mult, widths[r]);
        scales[r] = (float)(mx / ((double)((1 << (widths[r] - 1)) - 1) * M));
        uint32_t mb = 0;
        while ((1 << mb) < M)
            mb++;
        *extra_bits += (uint64_t)nb * mb;
    }
    struct wsim_ctx c = {.cols = cols, .block = o->wsim_block, .mult = o->wsim_mult,
                         .widths = widths, .scales = scales, .hd = hd, .m = m};
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
    free(m);
    return ret;
}

/* quantizer_mult.c: small integer multipliers per block of a row (packed
 * header version 2, docs/FORMAT-packed.md). A b-bit row keeps its b-bit
 * codes v on the uniform grid, and each block of 32 weights gets a
 * multiplier m in 1..M (M = format_packed_mult_max(b): 4 up to 5 bits, 2 at
 * 7, 1 at 8) folded into the unpacked int8 values v m, so the NPU still sees
 * per-output-channel int8 with one scale, max|w| / (lim M): in effect a 2-bit
 * scale per block that costs the NPU nothing. Rounding is GPTQ's
 * (quantizer_gptq_with); each block's m is the one of least Hessian-weighted
 * (diagonal, E[x_c^2]) error for the block's weights as GPTQ has compensated
 * them when it reaches the block. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quantizer_internal.h"

struct mult_grid {
    uint32_t cols, nb;
    const uint8_t *widths;
    const float *scales;
    const double *hd; /* [cols] Hessian diagonal */
    uint8_t *m;       /* [rows][nb] */
};

static int mult_round(void *vc, uint32_t r, uint32_t j, const float *wr, int8_t *code,
                      double *deq)
{
    const struct mult_grid *g = vc;
    float sc = g->scales[r];
    uint32_t b = g->widths[r];
    if (!(sc > 0) || b < 2)
        return 1; /* sign rows and empty rows keep their codes, multiplier 1 */
    const uint32_t B = FORMAT_PACKED_MULT_BLOCK;
    int lim = (1 << (b - 1)) - 1, M = (int)format_packed_mult_max(b);
    uint8_t *mp = g->m + (size_t)r * g->nb + j / B;
    if (j % B == 0) { /* the block's multiplier, on the compensated weights */
        uint32_t j1 = j + B < g->cols ? j + B : g->cols;
        double best = INFINITY;
        for (int m = 1; m <= M; m++) {
            double e = 0, s = (double)sc * m;
            for (uint32_t i = j; i < j1; i++) {
                double v = rint(wr[i] / s);
                v = v > lim ? lim : v < -lim ? -lim : v;
                double d = wr[i] - v * s;
                e += g->hd[i] * d * d;
            }
            if (e < best) {
                best = e;
                *mp = (uint8_t)m;
            }
        }
    }
    double v = rint(wr[j] / ((double)sc * *mp));
    v = v > lim ? lim : v < -lim ? -lim : v;
    *code = (int8_t)v;
    *deq = v * *mp * (double)sc;
    return 0;
}

int quantizer_mult(const float *w, uint32_t rows, uint32_t cols, const float *x,
                   uint32_t n_sample, const float *s, const uint8_t *widths, float *scales,
                   int8_t *q, uint8_t *mult, int8_t *npu)
{
    uint32_t nb = format_packed_mult_blocks(cols);
    memset(mult, 1, (size_t)rows * nb);
    double *hd = calloc(cols, sizeof(double));
    if (!hd)
        return -ENOMEM;
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
    for (uint32_t r = 0; r < rows; r++) { /* every row's scale: its max over lim M */
        if (widths[r] < 2)
            continue;
        float mx = 0;
        for (uint32_t c = 0; c < cols; c++)
            mx = fmaxf(mx, fabsf(w[(size_t)r * cols + c]));
        scales[r] = (float)(mx / ((double)((1 << (widths[r] - 1)) - 1) *
                                  format_packed_mult_max(widths[r])));
    }
    struct mult_grid g = {cols, nb, widths, scales, hd, mult};
    struct quantizer_rounder rd = {mult_round, &g};
    for (uint32_t r = 0; r < rows; r++) /* round-to-nearest first (kept if H is singular) */
        for (uint32_t c = 0; c < cols; c++) {
            double deq;
            mult_round(&g, r, c, w + (size_t)r * cols, q + (size_t)r * cols + c, &deq);
        }
    int ret = n_sample ? quantizer_gptq_with(w, rows, cols, x, n_sample, s, &rd, q) : 0;
    for (uint32_t r = 0; ret == 0 && r < rows; r++)
        for (uint32_t c = 0; c < cols; c++) {
            size_t e = (size_t)r * cols + c;
            npu[e] = (int8_t)(q[e] * mult[(size_t)r * nb + c / FORMAT_PACKED_MULT_BLOCK]);
        }
    free(hd);
    return ret;
}

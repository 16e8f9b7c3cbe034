/* quantizer_smooth.h: smoothing groups and the alpha search (internal; see
 * quantizer_smooth.c). */
#ifndef SLUICE_QUANTIZER_SMOOTH_H
#define SLUICE_QUANTIZER_SMOOTH_H

#include "quantizer_internal.h"

struct qs_member {
    const float *w;            /* [rows][cols] float weights, before smoothing */
    uint32_t rows, cols;
};

struct qs_group {
    uint32_t in;               /* input width */
    const float *in_max;       /* [in] S_I (made common within kv groups for o) */
    const float *x;            /* [n_sample][in] calibration input rows */
    uint32_t n_sample;
    struct qs_member m[3];
    int nm;
};

/* How a tensor's widths are chosen while searching and quantizing. */
struct qs_alloc {
    double bits;               /* average budget (per tensor) */
    uint8_t uniform_bits;      /* > 0: every row gets this width */
    const float *out_max;      /* cmpq: S_O weights the channels; NULL otherwise */
};

void qs_scales(const float *in_max, uint32_t n, double alpha, float *s);
void qs_smoothquant_scales(const float *in_max, uint32_t n, const struct qs_member *m, int nm,
                           double alpha, float *s);
float qs_act_max(const float *in_max, const float *s, uint32_t n);
/* re[r*9 + b] for b = 1..8 of W diag(s) (times weight_scale). */
void qs_channel_stats(const float *w, uint32_t rows, uint32_t cols, const float *s, double *re,
                      double weight_scale);
int qs_widths(const float *w, uint32_t rows, uint32_t cols, const float *s,
              const struct qs_alloc *a, uint8_t *widths);
void qs_quantize(const float *w, uint32_t rows, uint32_t cols, const float *s,
                 const uint8_t *widths, int8_t *q, float *scale, float *tmp);
double qs_group_error(const struct qs_group *g, const float *s, const struct qs_alloc *alloc);
/* Grid search alpha in {0, 0.1, ..., 1}; writes the chosen s. */
double qs_search_alpha(const struct qs_group *g, const struct qs_alloc *alloc, float *s_out,
                       double *err_out);

#endif

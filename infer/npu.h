/* npu.h: the emulated NPU's int8 math (internal to the infer module).
 *
 * Weights are prepared once (npu_weights_create) into the layout the GEMM
 * kernels want, with the per-channel correction vpdpbusd needs; activations
 * are quantized per tensor; y = act_scale * scale[r] * acc (in that order,
 * so every kernel gives identical floats).
 *
 *   struct npu_weights *w;
 *   npu_weights_create(q, scale, rows, cols, &w);
 *   float s = npu_act_scale_dynamic(x, m * cols);
 *   npu_quantize_act(x, m * cols, s, xq);
 *   npu_linear_s8(w, xq, m, s, y);           // y[m][rows]
 */
#ifndef SLUICE_NPU_H
#define SLUICE_NPU_H

#include <stddef.h>
#include <stdint.h>

struct npu_weights;

/* Copies and prepares int8 codes q[rows][cols] (|q| <= 127) and per-row
 * scales. Returns 0, -EINVAL or -ENOMEM. */
int npu_weights_create(const int8_t *q, const float *scale, uint32_t rows, uint32_t cols,
                       struct npu_weights **out);
void npu_weights_destroy(struct npu_weights *w);
uint32_t npu_weights_rows(const struct npu_weights *w);
uint32_t npu_weights_cols(const struct npu_weights *w);

/* xq[i] = clamp(rint(x[i] * (1/s)), -127, 127) (round to nearest even). A
 * non-positive or non-finite s quantizes everything to 0. */
void npu_quantize_act(const float *x, size_t n, float s, int8_t *xq);

/* max|x| / 127, or 1 when x is all zero (never 0, never NaN for finite x). */
float npu_act_scale_dynamic(const float *x, size_t n);

/* y[i][r] = (act_scale * scale[r]) * acc[i][r] for r in [r0, r1), where
 * acc = sum_c xq[i][c] * q[r][c] (int32). ldy is y's row stride. */
void npu_linear_s8_range(const struct npu_weights *w, const int8_t *xq, uint32_t m,
                         float act_scale, float *y, size_t ldy, uint32_t r0, uint32_t r1);

/* All output rows, y[m][rows]. */
void npu_linear_s8(const struct npu_weights *w, const int8_t *xq, uint32_t m, float act_scale,
                   float *y);

#endif

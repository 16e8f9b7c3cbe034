/* npu_linear.c: prepared int8 weights, activation quantization and the
 * quantized linear built on the dispatched GEMM kernels (npu_gemm.c). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "npu.h"
#include "npu_gemm.h"

struct npu_weights {
    uint32_t rows, cols;
    float *scale;              /* [rows] */
    struct npu_gemm_b *b;      /* kernel layout */
};

int npu_weights_create(const int8_t *q, const float *scale, uint32_t rows, uint32_t cols,
                       struct npu_weights **out)
{
    if (!rows || !cols)
        return -EINVAL;
    struct npu_weights *w = calloc(1, sizeof *w);
    if (!w)
        return -ENOMEM;
    w->rows = rows;
    w->cols = cols;
    w->scale = malloc(sizeof(float) * rows);
    int ret = w->scale ? npu_gemm_b_create(q, rows, cols, &w->b) : -ENOMEM;
    if (ret < 0) {
        npu_weights_destroy(w);
        return ret;
    }
    memcpy(w->scale, scale, sizeof(float) * rows);
    *out = w;
    return 0;
}

int npu_weights_alloc(uint32_t rows, uint32_t cols, struct npu_weights **out)
{
    if (!rows || !cols)
        return -EINVAL;
    struct npu_weights *w = calloc(1, sizeof *w);
    if (!w)
        return -ENOMEM;
    w->rows = rows;
    w->cols = cols;
    w->scale = malloc(sizeof(float) * rows);
    int ret = w->scale ? npu_gemm_b_alloc(rows, cols, &w->b) : -ENOMEM;
    if (ret < 0) {
        npu_weights_destroy(w);
        return ret;
    }
    *out = w;
    return 0;
}

void npu_weights_fill(struct npu_weights *w, uint32_t r0, uint32_t n, const int8_t *q,
                      const float *scale)
{
    npu_gemm_b_fill(w->b, r0, n, q);
    memcpy(w->scale + r0, scale, sizeof(float) * n);
}

void npu_weights_row(const struct npu_weights *w, uint32_t r, int8_t *out)
{
    npu_gemm_b_row(w->b, r, out);
}

float npu_weights_scale(const struct npu_weights *w, uint32_t r)
{
    return w->scale[r];
}

void npu_weights_destroy(struct npu_weights *w)
{
    if (!w)
        return;
    npu_gemm_b_destroy(w->b);
    free(w->scale);
    free(w);
}

uint32_t npu_weights_rows(const struct npu_weights *w) { return w->rows; }
uint32_t npu_weights_cols(const struct npu_weights *w) { return w->cols; }

void npu_quantize_act(const float *x, size_t n, float s, int8_t *xq)
{
    if (!(s > 0) || !isfinite(s)) {
        memset(xq, 0, n);
        return;
    }
    float inv = 1.0f / s;
    for (size_t i = 0; i < n; i++) {
        float v = rintf(x[i] * inv);
        v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
        xq[i] = (int8_t)v; /* NaN input: v is NaN, clamps fail; handled below */
        if (v != v)
            xq[i] = 0;
    }
}

float npu_act_scale_dynamic(const float *x, size_t n)
{
    float m = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        if (a > m)
            m = a;
    }
    return m > 0 && isfinite(m) ? m / 127.0f : 1.0f;
}

void npu_linear_s8_range(const struct npu_weights *w, const int8_t *xq, uint32_t m,
                         float act_scale, float *y, size_t ldy, uint32_t r0, uint32_t r1)
{
    /* acc tiles of up to 64 rows x the range; dequantized as they complete */
    enum { TM = 64 };
    uint32_t width = r1 - r0;
    int32_t *acc = malloc(sizeof(int32_t) * TM * (width ? width : 1));
    if (!acc) {
        /* no memory for the tile: fall back to one row at a time */
        int32_t one;
        for (uint32_t i = 0; i < m; i++)
            for (uint32_t r = r0; r < r1; r++) {
                npu_gemm_s8(w->b, xq + (size_t)i * w->cols, 1, r, r + 1, &one, 1);
                y[(size_t)i * ldy + r] = (act_scale * w->scale[r]) * (float)one;
            }
        return;
    }
    for (uint32_t i0 = 0; i0 < m; i0 += TM) {
        uint32_t mm = m - i0 < TM ? m - i0 : TM;
        npu_gemm_s8(w->b, xq + (size_t)i0 * w->cols, mm, r0, r1, acc, width);
        for (uint32_t i = 0; i < mm; i++) {
            float *yi = y + (size_t)(i0 + i) * ldy;
            const int32_t *ai = acc + (size_t)i * width;
            for (uint32_t r = r0; r < r1; r++)
                yi[r] = (act_scale * w->scale[r]) * (float)ai[r - r0];
        }
    }
    free(acc);
}

void npu_linear_s8(const struct npu_weights *w, const int8_t *xq, uint32_t m, float act_scale,
                   float *y)
{
    npu_linear_s8_range(w, xq, m, act_scale, y, w->rows, 0, w->rows);
}

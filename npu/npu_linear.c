/* npu_linear.c: prepared int8 weights, activation quantization and the
 * quantized linear on the calling thread, built on the dispatched GEMM
 * kernels (npu_gemm.c). Contracts in npu.h. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

#include "common.h"
#include "npu_internal.h"

int npu_weights_alloc(uint32_t rows, uint32_t cols, struct npu_weights **out)
{
    *out = NULL;
    if (!rows || !cols)
        return -EINVAL;
    struct npu_weights *w = calloc(1, sizeof *w);
    if (!w)
        return -ENOMEM;
    w->rows = rows;
    w->cols = cols;
    w->cap_rows = rows;
    w->scale = malloc(sizeof(float) * rows);
    int ret = w->scale ? npu_gemm_b_alloc(rows, cols, &w->b) : -ENOMEM;
    if (ret < 0) {
        npu_weights_destroy(w);
        return ret;
    }
    *out = w;
    return 0;
}

int npu_weights_reshape(struct npu_weights *w, uint32_t rows, uint32_t cols)
{
    if (!w)
        return -EINVAL;
    if (!rows || !cols || rows > UINT32_MAX - 15 || cols > UINT32_MAX - 3)
        return -EINVAL;
    if ((size_t)((rows + 15) & ~15u) * ((cols + 3) & ~3u) > w->b->cap_bytes)
        return -ENOSPC;
    if (rows > w->cap_rows) { /* grown first: a failure after it leaves w as it was */
        float *s = realloc(w->scale, sizeof(float) * rows);
        if (!s)
            return -ENOMEM;
        w->scale = s;
        w->cap_rows = rows;
    }
    int ret = npu_gemm_b_reshape(w->b, rows, cols);
    if (ret < 0)
        return ret;
    w->rows = rows;
    w->cols = cols;
    return 0;
}

size_t npu_weights_capacity(const struct npu_weights *w)
{
    return w->b->cap_bytes;
}

int npu_weights_fill(struct npu_weights *w, uint32_t r0, uint32_t n, const int8_t *q,
                     const float *scale)
{
    if (!w || !q || !scale || n == 0 || r0 > w->rows || n > w->rows - r0)
        return -EINVAL;
    int ret = npu_gemm_b_set_rows(w->b, q, r0, r0 + n);
    if (ret == -EINVAL)
        return ret;
    memcpy(w->scale + r0, scale, sizeof(float) * n);
    return ret;
}

void npu_weights_row(const struct npu_weights *w, uint32_t r, int8_t *out)
{
    for (uint32_t j = 0; j < w->cols; j += 4) {
        const int8_t *src = w->b->packed + ((size_t)(r / 16) * (w->b->k4 / 4) + j / 4) * 64 +
                            (r % 16) * 4;
        memcpy(out + j, src, w->cols - j < 4 ? w->cols - j : 4);
    }
}

float npu_weights_scale(const struct npu_weights *w, uint32_t r) { return w->scale[r]; }

void npu_weights_col(const struct npu_weights *w, uint32_t c, int8_t *out)
{
    const int8_t *src = w->b->packed + (size_t)(c / 4) * 64 + c % 4;
    size_t block = (size_t)(w->b->k4 / 4) * 64; /* one block of 16 rows */
    for (uint32_t r = 0; r < w->rows; r += 16, src += block) {
        uint32_t m = w->rows - r < 16 ? w->rows - r : 16;
        for (uint32_t i = 0; i < m; i++)
            out[r + i] = src[i * 4];
    }
}

void npu_weights_gather_cols(const struct npu_weights *w, const uint32_t *c, uint32_t n,
                             int8_t *out)
{
    if (!n)
        return;
    const int8_t *blk = w->b->packed;
    size_t block = (size_t)(w->b->k4 / 4) * 64; /* one block of 16 rows */
    /* the lines are scattered (latency-bound): each read is prefetched
     * PF reads ahead, across the end of a block into the next */
    enum { PF = 16 };
    uint32_t pk = 0;
    const int8_t *pb = blk;
    for (uint32_t j = 0; j < PF; j++) {
        __builtin_prefetch(pb + (size_t)(c[pk] / 4) * 64);
        if (++pk == n) {
            pk = 0;
            pb += block;
        }
    }
    for (uint32_t r = 0; r < w->rows; r += 16, blk += block) {
        uint32_t m = w->rows - r < 16 ? w->rows - r : 16;
        for (uint32_t k = 0; k < n; k++) {
            if (pb < w->b->packed + (size_t)(w->b->n16 / 16) * block)
                __builtin_prefetch(pb + (size_t)(c[pk] / 4) * 64);
            if (++pk == n) {
                pk = 0;
                pb += block;
            }
            const int8_t *src = blk + (size_t)(c[k] / 4) * 64 + c[k] % 4;
            int8_t *dst = out + (size_t)k * w->rows + r;
            for (uint32_t i = 0; i < m; i++)
                dst[i] = src[i * 4];
        }
    }
}

const float *npu_weights_scales(const struct npu_weights *w) { return w->scale; }

const int8_t *npu_weights_packed(const struct npu_weights *w, size_t *block_bytes)
{
    *block_bytes = npu_gemm_b_block_bytes(w->b);
    return w->b->packed;
}

int npu_weights_create(const int8_t *q, const float *scale, uint32_t rows, uint32_t cols,
                       struct npu_weights **out)
{
    *out = NULL;
    if (!q || !scale)
        return -EINVAL;
    struct npu_weights *w;
    int ret = npu_weights_alloc(rows, cols, &w);
    if (ret < 0)
        return ret;
    ret = npu_weights_fill(w, 0, rows, q, scale);
    if (ret < 0) {
        npu_weights_destroy(w);
        return ret;
    }
    *out = w;
    return 0;
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

size_t npu_weights_storage(const struct npu_weights *w)
{
    return (size_t)w->b->n16 * w->b->k4;
}

int npu_weights_prefault(struct npu_weights *w, size_t off, size_t len)
{
    size_t total = npu_weights_storage(w);
    if (off >= total)
        return 0;
    if (len > total - off)
        len = total - off;
    /* whole pages inside the range: the first and last may be shared with
     * neighbouring allocations (harmless either way: populating does not
     * change contents) */
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = ((uintptr_t)w->b->packed + off) & ~(page - 1);
    uintptr_t hi = (uintptr_t)w->b->packed + off + len;
    if (madvise((void *)lo, hi - lo, MADV_POPULATE_WRITE) == 0)
        return 0;
    return -errno;
}

size_t npu_weights_bytes(const struct npu_weights *w)
{
    return sizeof *w + sizeof(float) * w->rows + sizeof *w->b + (size_t)w->b->n16 * w->b->k4 +
           sizeof(int32_t) * w->b->n16;
}

/* The quantizer and max-abs of the best kernel that has them (the AVX-VNNI
 * file leaves them to AVX2). */
static const struct npu_kernel_ops *quant_ops(void)
{
    const struct npu_kernel_ops *ops = npu_kernel_ops(npu_kernel_best());
    if (!ops->quant && npu_kernel_available(NPU_KERNEL_AVX2))
        ops = npu_kernel_ops(NPU_KERNEL_AVX2);
    return ops->quant ? ops : &npu_ops_scalar;
}

void npu_quantize_act(const float *x, size_t n, float s, int8_t *xq)
{
    if (!(s > 0) || !isfinite(s)) {
        memset(xq, 0, n);
        return;
    }
    quant_ops()->quant(x, n, 1.0f / s, xq);
}

float npu_act_scale_dynamic(const float *x, size_t n)
{
    float m = quant_ops()->absmax(x, n);
    if (m == 0.0f)
        return 1.0f;
    float s = m / 127.0f;
    return s > NPU_ACT_SCALE_MIN ? s : NPU_ACT_SCALE_MIN;
}

/* Without memory for the staging copy: the scalar definition, element by
 * element, straight from xq and the packed weights. */
static void linear_direct(const struct npu_weights *w, const int8_t *xq, uint32_t m,
                          float act_scale, float *y, size_t ldy, uint32_t r0, uint32_t r1)
{
    for (uint32_t i = 0; i < m; i++)
        for (uint32_t r = r0; r < r1; r++) {
            int32_t acc = 0;
            for (uint32_t j = 0; j < w->cols; j++)
                acc += (int32_t)xq[(size_t)i * w->cols + j] * npu_gemm_b_at(w->b, r, j);
            float s = act_scale * w->scale[r];
            y[(size_t)i * ldy + r] = s * (float)acc;
        }
}

void npu_linear_s8_range(const struct npu_weights *w, const int8_t *xq, uint32_t m,
                         float act_scale, float *y, size_t ldy, uint32_t r0, uint32_t r1)
{
    if (m == 0 || r1 <= r0)
        return;
    uint8_t *stage = sl_alloc_aligned(npu_stage_bytes(m, w->cols), 64);
    if (!stage) {
        linear_direct(w, xq, m, act_scale, y, ldy, r0, r1);
        return;
    }
    npu_stage_act(xq, m, w->cols, stage);
    npu_linear_s8_staged(w, stage, m, act_scale, y, ldy, r0, r1);
    sl_free_aligned(stage);
}

size_t npu_stage_bytes(uint32_t m, uint32_t cols)
{
    return npu_gemm_prep_bytes((cols + 3) & ~3u, m);
}

void npu_stage_act(const int8_t *xq, uint32_t m, uint32_t cols, void *stage)
{
    npu_kernel_ops(npu_kernel_for_rows(m))->prep(xq, cols, m, cols, (cols + 3) & ~3u, 0, stage);
}

void npu_linear_s8_staged(const struct npu_weights *w, const void *stage, uint32_t m,
                          float act_scale, float *y, size_t ldy, uint32_t r0, uint32_t r1)
{
    if (m == 0 || r1 <= r0)
        return;
    struct npu_gemm_args g = {.b = w->b,
                              .a = stage,
                              .m = m,
                              .r0 = r0,
                              .r1 = r1,
                              .y = y + r0,
                              .ldy = ldy,
                              .act_scale = act_scale,
                              .scale = w->scale};
    npu_kernel_ops(npu_kernel_for_rows(m))->gemm(&g);
}

void npu_linear_s8(const struct npu_weights *w, const int8_t *xq, uint32_t m, float act_scale,
                   float *y)
{
    npu_linear_s8_range(w, xq, m, act_scale, y, w->rows, 0, w->rows);
}

/* npu_rowmajor.c: a few rows' int8 linear on weights in plain row-major
 * order ([n][k], as unpacking packed codes yields them), without packing
 * them into the GEMM's layout first (npu_weights_fill): the packed
 * residency's verification unpacks each tile of output channels once for
 * all of a draft tree's rows, and packing the tile cost as much CPU as the
 * unpacking itself (docs/BENCHMARKS.md, fourteenth session, v18). The
 * scalar definition below is the specification; the AMX kernel
 * (npu_rowmajor_amx.c) matches it bit for bit. Contracts in npu.h. */
#include <errno.h>
#include <string.h>

#include "npu_internal.h"

#ifndef SLUICE_KERNELS_AMX
#define SLUICE_KERNELS_AMX 0
#endif

size_t npu_rowmajor_stage_bytes(uint32_t m, uint32_t k)
{
    return (size_t)m * k + 64;
}

void npu_rowmajor_stage(const int8_t *xq, uint32_t m, uint32_t k, void *stage)
{
    /* group g (4 inputs) of every row, one after another: [k / 4][m][4] */
    int8_t *out = stage;
    for (uint32_t g = 0; g < k / 4; g++)
        for (uint32_t i = 0; i < m; i++)
            memcpy(out + ((size_t)g * m + i) * 4, xq + (size_t)i * k + 4 * (size_t)g, 4);
}

int npu_rowmajor_takes(uint32_t m, uint32_t n, uint32_t k)
{
    return SLUICE_KERNELS_AMX && npu_kernel_available(NPU_KERNEL_AMX) && m >= 1 &&
           m <= NPU_ROWMAJOR_ROWS_MAX && n % 16 == 0 && n > 0 && k % 64 == 0 && k > 0;
}

void npu_linear_s8_rowmajor_ref(const int8_t *q, const float *scale, uint32_t n, uint32_t k,
                                const int8_t *xq, uint32_t m, float act, float *y, size_t ldy)
{
    for (uint32_t i = 0; i < m; i++)
        for (uint32_t r = 0; r < n; r++) {
            int32_t acc = 0;
            for (uint32_t j = 0; j < k; j++)
                acc += (int32_t)xq[(size_t)i * k + j] * q[(size_t)r * k + j];
            const float s = act * scale[r];
            y[(size_t)i * ldy + r] = s * (float)acc;
        }
}

int npu_linear_s8_rowmajor(const int8_t *q, const float *scale, uint32_t n, uint32_t k,
                           const void *stage, uint32_t m, float act, float *y, size_t ldy)
{
    if (!npu_rowmajor_takes(m, n, k))
        return -EINVAL;
#if SLUICE_KERNELS_AMX
    npu_rowmajor_amx(q, scale, n, k, stage, m, act, y, ldy);
    return 0;
#else
    (void)q, (void)scale, (void)stage, (void)act, (void)y, (void)ldy;
    return -EINVAL;
#endif
}

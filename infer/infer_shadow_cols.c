/* infer_shadow_cols.c: the shadow term's product read in place from the
 * NPU's packed weights, block by block (contract in infer_internal.h). The
 * scalar kernel is the reference; infer_shadow_avx2.c has the AVX2 one. */
#include <string.h>

#include "infer_internal.h"
#include "infer_matmul.h"

#ifndef SLUICE_KERNELS_X86
#define SLUICE_KERNELS_X86 0
#endif

void infer_shadow_cols_scalar(const struct infer_shadow_cols *k, uint32_t b0, uint32_t b1)
{
    for (uint32_t b = b0; b < b1; b++) {
        uint32_t r0 = b * 16, m = k->rows - r0 < 16 ? k->rows - r0 : 16;
        const int8_t *blk = k->packed + (size_t)b * k->block;
        memset(k->acc, 0, sizeof(float) * 16 * k->nt);
        for (uint32_t d = 0; d < k->nd; d++) {
            float w[16];
            uint32_t c = k->col[d];
            if (k->hot[d])
                for (uint32_t i = 0; i < m; i++)
                    w[i] = (float)k->hot[d][r0 + i];
            else
                for (uint32_t i = 0; i < m; i++)
                    w[i] = (float)blk[(size_t)(c / 4) * 64 + 4 * i + c % 4];
            for (uint32_t j = k->start[d]; j < k->start[d + 1]; j++) {
                float *a = k->acc + (size_t)k->tok[j] * 16, e = k->ex[j];
                for (uint32_t i = 0; i < m; i++)
                    a[i] += e * w[i];
            }
        }
        for (uint32_t t = 0; t < k->nt; t++) {
            const float *a = k->acc + (size_t)t * 16;
            float *o = k->out[t] + r0;
            if (k->store)
                for (uint32_t i = 0; i < m; i++)
                    o[i] = a[i] * (k->s * k->scale[r0 + i]);
            else
                for (uint32_t i = 0; i < m; i++)
                    o[i] += a[i] * (k->s * k->scale[r0 + i]);
        }
    }
}

void infer_shadow_cols(const struct infer_shadow_cols *k)
{
#if SLUICE_KERNELS_X86
    switch (infer_matmul_kernel_used()) {
    case INFER_MATMUL_AVX512: /* AVX-512 machines have AVX2 */
    case INFER_MATMUL_AVX2:
        infer_shadow_cols_avx2(k);
        return;
    default:
        break;
    }
#endif
    infer_shadow_cols_scalar(k, k->b0, k->b1);
}

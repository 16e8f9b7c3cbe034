/* npu_gemm_scalar.c: the reference int8 GEMM (the specification every SIMD
 * kernel must match bit for bit; the contract is in npu_gemm_internal.h). */
#include <string.h>

#include "npu_gemm_internal.h"

/* Plain copy with k padded to k4 by zeros: the 1-row tiling's layout is
 * [m][k4] (no offset: the scalar kernel multiplies signed bytes). */
static void prep_scalar(const int8_t *a, size_t lda_in, uint32_t m, uint32_t k, uint32_t k4,
                        int tile, uint8_t *out)
{
    for (uint32_t i = 0; i < m; i++) {
        memcpy(out + (size_t)i * k4, a + (size_t)i * lda_in, k);
        memset(out + (size_t)i * k4 + k, 0, k4 - k);
    }
}

static void gemm_scalar(const struct npu_gemm_args *g)
{
    const struct npu_gemm_b *b = g->b;
    for (uint32_t i = 0; i < g->m; i++) {
        const int8_t *ai = (const int8_t *)g->a + (size_t)i * b->k4;
        for (uint32_t r = g->r0; r < g->r1; r++) {
            int32_t acc = 0;
            for (uint32_t j = 0; j < b->k; j++)
                acc += (int32_t)ai[j] * (int32_t)npu_gemm_b_at(b, r, j);
            if (g->c) {
                g->c[(size_t)i * g->ldc + (r - g->r0)] = acc;
            } else {
                float s = g->act_scale * g->scale[r];
                g->y[(size_t)i * g->ldy + (r - g->r0)] = s * (float)acc;
            }
        }
    }
}

static const char *const tile_names[] = {"1x1"};

const struct npu_kernel_ops npu_ops_scalar = {prep_scalar, gemm_scalar, 1, tile_names};

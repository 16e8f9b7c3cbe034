/* npu_est.c: the plain C half of the narrow-activation GEMM (npu_est.h):
 * which pre-sum applies, the staging, the weight check and the kernel's
 * scalar twin. Built without the AVX2 flags, so that these run on any CPU
 * (the graphs call them only where the AVX2 kernel runs; the tests call
 * them everywhere). */
#include "npu_est.h"

int npu_est_presum(uint32_t amax)
{
    return amax <= 31 ? 4 : amax <= 63 ? 2 : 0;
}

int npu_est_prep(const int8_t *a, uint32_t m, uint32_t k, uint32_t k4, int P, uint8_t *out)
{
    const int off = npu_est_offset(P), bound = off - 1;
    int bad = 0;
    for (uint32_t i = 0; i < m; i++) {
        const int8_t *src = a + (size_t)i * k;
        uint8_t *dst = out + (size_t)i * k4;
        for (uint32_t j = 0; j < k; j++) {
            int v = src[j];
            bad |= v > bound || v < -bound;
            dst[j] = (uint8_t)(v + off);
        }
        for (uint32_t j = k; j < k4; j++)
            dst[j] = 0; /* the weights are zero there */
    }
    return bad ? -1 : 0;
}

int npu_est_blocks_ok(const struct npu_gemm_b *b, uint32_t r0, uint32_t r1)
{
    for (uint32_t bl = r0 / 16; bl < (r1 + 15) / 16; bl++)
        if (b->wide[bl])
            return 0;
    return 1;
}

static int16_t sat16(int32_t v)
{
    return (int16_t)(v > 32767 ? 32767 : v < -32768 ? -32768 : v);
}

void npu_est_gemm_ref(const struct npu_gemm_args *g, int P)
{
    const struct npu_gemm_b *b = g->b;
    const uint32_t k4 = b->k4, groups = k4 / 4, gp = groups / (uint32_t)P * (uint32_t)P;
    const int32_t off = npu_est_offset(P);
    for (uint32_t i = 0; i < g->m; i++) {
        const uint8_t *u = g->a + (size_t)i * k4;
        for (uint32_t r = g->r0; r < g->r1; r++) {
            int32_t acc = 0;
            for (uint32_t q = 0; q < groups;) {
                const uint32_t cn = q < gp ? (uint32_t)P : 1;
                int16_t t[2] = {0, 0}; /* the int16 lanes of the channel's dword */
                for (uint32_t e = 0; e < cn; e++)
                    for (int h = 0; h < 2; h++) {
                        uint32_t j = 4 * (q + e) + 2 * (uint32_t)h;
                        int32_t p = (int32_t)u[j] * npu_gemm_b_at(b, r, j) +
                                    (int32_t)u[j + 1] * npu_gemm_b_at(b, r, j + 1);
                        t[h] = (int16_t)(uint16_t)((uint32_t)(uint16_t)t[h] +
                                                   (uint32_t)(uint16_t)sat16(p));
                    }
                acc += (int32_t)t[0] + (int32_t)t[1];
                q += cn;
            }
            acc -= off * b->rowsum[r];
            if (g->c)
                g->c[(size_t)i * g->ldc + (r - g->r0)] = acc;
            else
                g->y[(size_t)i * g->ldy + (r - g->r0)] = (g->act_scale * g->scale[r]) * (float)acc;
        }
    }
}

/* npu_gemm_scalar.c: the reference int8 GEMM (the specification every SIMD
 * kernel must match bit for bit; the contract is in npu_gemm_internal.h). */
#include <float.h>
#include <math.h>
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

/* The vpdpbusd kernels' staging (npu_gemm_internal.h, step 1), defined one
 * byte at a time: row i's k-group gq at npu_gemm_a_off(i, gq, k4, R), each
 * byte XOR 0x80, the bytes from k to k4 zero. Rows past m are not written.
 * The reference for npu_gemm_avx512vnni.c's prep (test_npu_prep). */
void npu_prep_vnni_ref(const int8_t *a, size_t lda_in, uint32_t m, uint32_t k, uint32_t k4,
                       uint32_t R, uint8_t *out)
{
    for (uint32_t i = 0; i < m; i++)
        for (uint32_t j = 0; j < k4; j++)
            out[npu_gemm_a_off(i, j / 4, k4, R) + j % 4] =
                j < k ? (uint8_t)((uint8_t)a[(size_t)i * lda_in + j] ^ 0x80) : 0;
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
                float s = g->act_scale * g->scale[r], f = s * (float)acc;
                float *dst = g->y + (size_t)i * g->ldy + (r - g->r0);
                *dst = g->add ? *dst + f : f;
            }
        }
    }
}

void npu_pack_wide_scalar(struct npu_gemm_b *b, const int8_t *src, uint32_t r0, uint32_t r1)
{
    for (uint32_t r = r0; r < r1; r += 16) {
        const int8_t *q = src + (size_t)(r - r0) * b->k;
        size_t len = (size_t)((r1 - r < 16) ? r1 - r : 16) * b->k;
        int big = 0, small = 1;
        for (size_t i = 0; i < len; i++) {
            big |= q[i] > 64 || q[i] < -64;
            small &= q[i] <= NPU_GEMM_TINY && q[i] >= -NPU_GEMM_TINY;
        }
        b->wide[r / 16] = (uint8_t)big;
        b->tiny[r / 16] = (uint8_t)small;
    }
}

/* The packed layout (npu_gemm_internal.h): one pass per row, its 4-byte
 * groups to stride 64 within the block; the row sum and the -128 check ride
 * along; wide by its definition. */
static int pack_scalar(struct npu_gemm_b *b, const int8_t *src, uint32_t r0, uint32_t r1)
{
    npu_pack_wide_scalar(b, src, r0, r1);
    const size_t bstride = npu_gemm_b_block_bytes(b);
    const uint32_t k = b->k, kf = k & ~3u;
    const uint32_t rend = r1 == b->n ? b->n16 : r1;
    int bad = 0;
    for (uint32_t r = r0; r < rend; r++) {
        int8_t *dst = b->packed + (size_t)(r / 16) * bstride + (r % 16) * 4;
        if (r >= b->n) { /* padding rows of the last block */
            for (uint32_t g = 0; g < b->k4 / 4; g++)
                memset(dst + (size_t)g * 64, 0, 4);
            b->rowsum[r] = 0;
            continue;
        }
        const int8_t *row = src + (size_t)(r - r0) * k;
        int32_t sum = 0;
        int8_t mn = 0;
        for (uint32_t c = 0; c < k; c++) {
            sum += row[c];
            mn = row[c] < mn ? row[c] : mn;
        }
        bad |= mn == INT8_MIN;
        b->rowsum[r] = sum;
        for (uint32_t c = 0; c < kf; c += 4)
            memcpy(dst + (size_t)(c / 4) * 64, row + c, 4);
        if (kf < b->k4) {
            int8_t t[4] = {0, 0, 0, 0};
            memcpy(t, row + kf, k - kf);
            memcpy(dst + (size_t)(kf / 4) * 64, t, 4);
        }
    }
    return bad;
}

static void quant_scalar(const float *x, size_t n, float inv, int8_t *xq)
{
    for (size_t i = 0; i < n; i++) {
        float v = rintf(x[i] * inv);
        /* written so that a NaN fails both comparisons and lands on 0 */
        xq[i] = (int8_t)(v >= 127.0f ? 127 : v <= -127.0f ? -127 : v == v ? (int)v : 0);
    }
}

static float absmax_scalar(const float *x, size_t n)
{
    float m = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        if (a > m && a <= FLT_MAX) /* finite only */
            m = a;
    }
    return m;
}

/* int16 helpers of the few-rows reference: maddubs' saturating pair sum,
 * and a wrapping add (vpaddw), in defined C */
static int16_t sat16(int32_t v) { return (int16_t)(v > 32767 ? 32767 : v < -32768 ? -32768 : v); }
static int16_t wrap16(int32_t v) { return (int16_t)(uint16_t)(uint32_t)v; }

/* The few-rows kernel's steps (npu_gemm_rows_avx2.c), one channel at a
 * time: a + 128 from the signed 3-row staging; per group two int16 pair sums
 * (bytes 0-1, 2-3); four groups (rounds aligned to multiples of 4 groups)
 * added in int16; each round's two lanes into int32; then - 128 rowsum. */
void npu_gemm_rows_ref(const struct npu_gemm_args *g, uint32_t bl, int nb)
{
    const struct npu_gemm_b *b = g->b;
    const uint32_t groups = b->k4 / 4;
    for (uint32_t i = 0; i < g->m; i++)
        for (uint32_t r = bl * 16; r < (bl + (uint32_t)nb) * 16; r++) {
            int32_t acc = 0;
            for (uint32_t q0 = 0; q0 < groups; q0 += 4) {
                int16_t lane[2] = {0, 0};
                for (uint32_t q = q0; q < q0 + 4 && q < groups; q++) {
                    const uint8_t *aq = g->a + npu_gemm_a_off(i, q, b->k4, 3);
                    for (int h = 0; h < 2; h++) {
                        int32_t u0 = (aq[2 * h] ^ 0x80), u1 = (aq[2 * h + 1] ^ 0x80);
                        int32_t p = u0 * npu_gemm_b_at(b, r, 4 * q + 2 * (uint32_t)h) +
                                    u1 * npu_gemm_b_at(b, r, 4 * q + 2 * (uint32_t)h + 1);
                        lane[h] = wrap16(lane[h] + sat16(p));
                    }
                }
                acc += (int32_t)lane[0] + lane[1];
            }
            acc -= b->rowsum[r] * 128;
            if (r < g->r0 || r >= g->r1)
                continue;
            if (g->c) {
                g->c[(size_t)i * g->ldc + (r - g->r0)] = acc;
            } else {
                float s = g->act_scale * g->scale[r], f = s * (float)acc;
                float *dst = g->y + (size_t)i * g->ldy + (r - g->r0);
                *dst = g->add ? *dst + f : f;
            }
        }
}

static const char *const tile_names[] = {"1x1"};

const struct npu_kernel_ops npu_ops_scalar = {prep_scalar,  gemm_scalar,   pack_scalar,
                                              quant_scalar, absmax_scalar, 1,
                                              tile_names,   UINT32_MAX};

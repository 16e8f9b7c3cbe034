/* infer_matmul.c: cache blocking and kernel dispatch for the float matmuls,
 * and the scalar reference kernels. */
#include <math.h>
#include <stddef.h>

#include "common.h"
#include "infer_internal.h"
#include "infer_matmul.h"

#ifndef SLUICE_KERNELS_X86
#define SLUICE_KERNELS_X86 0
#endif

static inline float w_at(const void *w, size_t i, uint32_t wt)
{
    switch (wt) {
    case INFER_W_F16:
        return sl_f16_to_f32(((const uint16_t *)w)[i]);
    case INFER_W_BF16:
        return sl_bf16_to_f32(((const uint16_t *)w)[i]);
    default:
        return ((const float *)w)[i];
    }
}

/* Dot product with 8 independent partial sums (a fixed order, so the result
 * does not depend on the compiler). */
static float dot_f32(const float *a, const void *b, uint32_t wt, uint32_t n)
{
    float acc[8] = {0};
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            acc[j] += a[i + j] * w_at(b, i + j, wt);
    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < n; i++)
        s += a[i] * w_at(b, i, wt);
    return s;
}

void infer_matmul_tile_scalar(float *y, size_t ldy, const float *x, size_t ldx, uint32_t mr,
                              const void *w, size_t ldw, uint32_t nr, uint32_t cols, uint32_t wt)
{
    size_t esz = wt == INFER_W_F32 ? 4 : 2;
    for (uint32_t i = 0; i < mr; i++)
        for (uint32_t r = 0; r < nr; r++)
            y[i * ldy + r] = dot_f32(x + i * ldx, (const char *)w + r * ldw * esz, wt, cols);
}

void infer_matmul_nn_scalar(float *y, size_t ldy, const float *p, size_t ldp, uint32_t mr,
                            const float *v, size_t ldv, uint32_t T, uint32_t cols, int add)
{
    for (uint32_t i = 0; i < mr; i++) {
        float *yi = y + i * ldy;
        for (uint32_t c = 0; c < cols && !add; c++)
            yi[c] = 0.0f;
        for (uint32_t t = 0; t < T; t++) {
            float a = p[i * ldp + t];
            const float *vt = v + t * ldv;
            for (uint32_t c = 0; c < cols; c++)
                yi[c] += a * vt[c];
        }
    }
}

static const char *const kernel_names[INFER_MATMUL_COUNT] = {"scalar", "avx2", "avx512"};

const char *infer_matmul_kernel_name(enum infer_matmul_kernel k)
{
    return (unsigned)k < INFER_MATMUL_COUNT ? kernel_names[k] : "unknown";
}

int infer_matmul_kernel_available(enum infer_matmul_kernel k)
{
    const struct sl_cpu_features *f = sl_cpu_features();
    switch (k) {
    case INFER_MATMUL_SCALAR:
        return 1;
    case INFER_MATMUL_AVX2:
        return SLUICE_KERNELS_X86 && f->avx2;
    case INFER_MATMUL_AVX512:
        return SLUICE_KERNELS_X86 && f->avx512;
    default:
        return 0;
    }
}

enum infer_matmul_kernel infer_matmul_kernel_best(void)
{
    if (infer_matmul_kernel_available(INFER_MATMUL_AVX512))
        return INFER_MATMUL_AVX512;
    if (infer_matmul_kernel_available(INFER_MATMUL_AVX2))
        return INFER_MATMUL_AVX2;
    return INFER_MATMUL_SCALAR;
}

static enum infer_matmul_kernel best_kernel = INFER_MATMUL_COUNT;

enum infer_matmul_kernel infer_matmul_kernel_used(void)
{
    enum infer_matmul_kernel k = __atomic_load_n(&best_kernel, __ATOMIC_RELAXED);
    if (k == INFER_MATMUL_COUNT) {
        k = infer_matmul_kernel_best(); /* every thread computes the same value */
        __atomic_store_n(&best_kernel, k, __ATOMIC_RELAXED);
    }
    return k;
}

static infer_matmul_tile_fn *tile_fn(enum infer_matmul_kernel k)
{
    if (!infer_matmul_kernel_available(k))
        return infer_matmul_tile_scalar;
    switch (k) {
#if SLUICE_KERNELS_X86
    case INFER_MATMUL_AVX2:
        return infer_matmul_tile_avx2;
    case INFER_MATMUL_AVX512:
        return infer_matmul_tile_avx512;
#endif
    default:
        return infer_matmul_tile_scalar;
    }
}

static infer_matmul_nn_fn *nn_fn(enum infer_matmul_kernel k)
{
    if (!infer_matmul_kernel_available(k))
        return infer_matmul_nn_scalar;
    switch (k) {
#if SLUICE_KERNELS_X86
    case INFER_MATMUL_AVX2:
        return infer_matmul_nn_avx2;
    case INFER_MATMUL_AVX512:
        return infer_matmul_nn_avx512;
#endif
    default:
        return infer_matmul_nn_scalar;
    }
}

void infer_matmul_nt(enum infer_matmul_kernel k, float *y, size_t ldy, const float *x, size_t ldx,
                     const void *w, uint32_t wt, size_t ldw, uint32_t n, uint32_t cols, uint32_t r0,
                     uint32_t r1)
{
    infer_matmul_tile_fn *tile = tile_fn(k);
    size_t esz = wt == INFER_W_F32 ? 4 : 2;
#if SLUICE_KERNELS_X86
    /* One to a few rows (a decode step, a draft tree): each weight read once
     * for all, prefetched; the same bits as the tile below. */
    if (tile == infer_matmul_tile_avx2 && wt == INFER_W_F32 && n >= 1 &&
        n <= INFER_MATMUL_ROWS_MAX) {
        infer_matmul_rows_avx2(y, ldy, x, ldx, n, w, ldw, cols, r0, r1);
        return;
    }
    if (tile == infer_matmul_tile_avx512 && wt == INFER_W_F32 && n >= 1 &&
        n <= INFER_MATMUL_ROWS_MAX) {
        infer_matmul_rows_avx512(y, ldy, x, ldx, n, w, ldw, cols, r0, r1);
        return;
    }
#endif
    /* A block of w rows (about 128 KiB, so it stays in L2) meets every x row
     * before the next block is read: w crosses the memory bus once per call.
     * Within the block, tiles of 4 x rows by 4 w rows reuse each loaded
     * vector 4 times. */
    uint32_t nb = (uint32_t)((128u << 10) / ((size_t)cols * esz + 1));
    nb = nb < INFER_MATMUL_NR ? INFER_MATMUL_NR : nb - nb % INFER_MATMUL_NR;
    for (uint32_t rb = r0; rb < r1; rb += nb) {
        uint32_t re = r1 - rb < nb ? r1 : rb + nb;
        for (uint32_t i = 0; i < n; i += INFER_MATMUL_MR) {
            uint32_t mr = n - i < INFER_MATMUL_MR ? n - i : INFER_MATMUL_MR;
            for (uint32_t r = rb; r < re; r += INFER_MATMUL_NR) {
                uint32_t nr = re - r < INFER_MATMUL_NR ? re - r : INFER_MATMUL_NR;
                tile(y + i * ldy + r, ldy, x + i * ldx, ldx, mr, (const char *)w + r * ldw * esz,
                     ldw, nr, cols, wt);
            }
        }
    }
}

static void nn_blocks(enum infer_matmul_kernel k, float *y, size_t ldy, const float *p, size_t ldp,
                      const float *v, size_t ldv, uint32_t n, uint32_t T, uint32_t cols, int add)
{
    infer_matmul_nn_fn *nn = nn_fn(k);
    uint32_t mr_max = INFER_MATMUL_MR;
#if SLUICE_KERNELS_X86
    if (nn == infer_matmul_nn_avx512)
        mr_max = INFER_MATMUL_NN_ROWS_AVX512;
#endif
    /* Keys in blocks of about 32 KiB of values, each block met by every
     * row before the next is read: the values cross the memory bus once per
     * call instead of once per few rows (the sums resume from y: the same
     * bits as one pass). */
    uint32_t tb = (uint32_t)((32u << 10) / ((size_t)cols * sizeof(float) + 1));
    tb = tb < 16 ? 16 : tb;
    if (n <= mr_max)
        tb = T; /* one pass of the rows: nothing to share */
    for (uint32_t t0 = 0; t0 < T || t0 == 0; t0 += tb) {
        uint32_t nt = T - t0 < tb ? T - t0 : tb;
        for (uint32_t i = 0; i < n; i += mr_max) {
            uint32_t mr = n - i < mr_max ? n - i : mr_max;
            nn(y + i * ldy, ldy, p + i * ldp + t0, ldp, mr, v + (size_t)t0 * ldv, ldv, nt, cols,
               add || t0 > 0);
        }
        if (nt == 0)
            break;
    }
}

void infer_matmul_nn(enum infer_matmul_kernel k, float *y, size_t ldy, const float *p, size_t ldp,
                     const float *v, size_t ldv, uint32_t n, uint32_t T, uint32_t cols)
{
    nn_blocks(k, y, ldy, p, ldp, v, ldv, n, T, cols, 0);
}

void infer_matmul_nn_resume(enum infer_matmul_kernel k, float *y, size_t ldy, const float *p,
                            size_t ldp, const float *v, size_t ldv, uint32_t n, uint32_t T,
                            uint32_t cols)
{
    nn_blocks(k, y, ldy, p, ldp, v, ldv, n, T, cols, 1);
}

void infer_matmul_linear_kernel(enum infer_matmul_kernel k, float *y, const float *x, const void *w,
                                uint32_t wt, uint32_t n, uint32_t rows, uint32_t cols, uint32_t r0,
                                uint32_t r1)
{
    infer_matmul_nt(k, y, rows, x, cols, w, wt, cols, n, cols, r0, r1);
}

void infer_op_matmul(float *y, const float *x, const void *w, enum infer_wtype wt, uint32_t n,
                     uint32_t rows, uint32_t cols, uint32_t r0, uint32_t r1)
{
    infer_matmul_linear_kernel(infer_matmul_kernel_used(), y, x, w, wt, n, rows, cols, r0, r1);
}

void infer_op_matmul_f32(float *y, const float *x, const float *w, uint32_t n, uint32_t rows,
                         uint32_t cols)
{
    infer_op_matmul(y, x, w, INFER_W_F32, n, rows, cols, 0, rows);
}

/* ---- exp for softmax ------------------------------------------------------------------------- */

static float exp_one(float x)
{
    if (x != x)
        return x;
    if (x < INFER_EXP_LO)
        return 0.0f;
    if (x > INFER_EXP_HI)
        return INFINITY;
    float n = rintf(x * INFER_EXP_LOG2E);
    float r = fmaf(n, -INFER_EXP_LN2_HI, x);
    r = fmaf(n, INFER_EXP_LN2_LO, r);
    float p = INFER_EXP_P5;
    p = fmaf(p, r, INFER_EXP_P4);
    p = fmaf(p, r, INFER_EXP_P3);
    p = fmaf(p, r, INFER_EXP_P2);
    p = fmaf(p, r, INFER_EXP_P1);
    p = fmaf(p, r, INFER_EXP_P0);
    float e = fmaf(p, r * r, r) + 1.0f;
    union {
        uint32_t u;
        float f;
    } two = {.u = (uint32_t)((int32_t)n + 127) << 23};
    return e * two.f;
}

float infer_exp_sum_scalar(float *a, uint32_t n, float sub)
{
    float acc[16] = {0};
    for (uint32_t t = 0; t < n; t++) {
        a[t] = exp_one(a[t] - sub);
        acc[t & 15] += a[t];
    }
    for (uint32_t w = 8; w >= 1; w /= 2)
        for (uint32_t i = 0; i < w; i++)
            acc[i] += acc[i + w];
    return acc[0];
}

float infer_div_max_reduce16(float m[16])
{
    for (uint32_t w = 8; w >= 1; w /= 2)
        for (uint32_t i = 0; i < w; i++)
            if (m[i + w] > m[i])
                m[i] = m[i + w];
    return m[0];
}

float infer_div_max_scalar(float *a, uint32_t n, float d)
{
    float m[16];
    for (uint32_t i = 0; i < 16; i++)
        m[i] = -INFINITY;
    for (uint32_t t = 0; t < n; t++) {
        a[t] = a[t] / d;
        if (a[t] > m[t & 15])
            m[t & 15] = a[t];
    }
    return infer_div_max_reduce16(m);
}

/* A softmax step's kernel for k: the scalar definition where k is not
 * available (or not built: the x86 kernels exist only on x86). */
typedef float softmax_step_fn(float *a, uint32_t n, float x);
#if SLUICE_KERNELS_X86
#define X86_STEPS(avx2, avx512) avx2, avx512
#else
#define X86_STEPS(avx2, avx512) NULL, NULL
#endif
static softmax_step_fn *softmax_step(enum infer_matmul_kernel k, softmax_step_fn *scalar,
                                     softmax_step_fn *avx2, softmax_step_fn *avx512)
{
    if (infer_matmul_kernel_available(k) && k == INFER_MATMUL_AVX2 && avx2)
        return avx2;
    if (infer_matmul_kernel_available(k) && k == INFER_MATMUL_AVX512 && avx512)
        return avx512;
    return scalar;
}

float infer_div_max(enum infer_matmul_kernel k, float *a, uint32_t n, float d)
{
    return softmax_step(k, infer_div_max_scalar,
                        X86_STEPS(infer_div_max_avx2, infer_div_max_avx512))(a, n, d);
}

float infer_exp_sum(enum infer_matmul_kernel k, float *a, uint32_t n, float sub)
{
    return softmax_step(k, infer_exp_sum_scalar,
                        X86_STEPS(infer_exp_sum_avx2, infer_exp_sum_avx512))(a, n, sub);
}

void infer_softmax_scaled(enum infer_matmul_kernel k, float *a, uint32_t n, float sq)
{
    infer_softmax_after_max(k, a, n, infer_div_max(k, a, n, sq));
}

void infer_softmax_after_max(enum infer_matmul_kernel k, float *a, uint32_t n, float maxv)
{
    float sum = infer_exp_sum(k, a, n, maxv);
    (void)infer_div_max(k, a, n, sum);
}

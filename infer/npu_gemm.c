/* npu_gemm.c: weight preparation and kernel dispatch. The scalar kernel is
 * the specification; the SIMD kernels (npu_gemm_<isa>.c) must match it bit
 * for bit. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "npu_gemm.h"
#include "npu_gemm_internal.h"

#ifndef SLUICE_KERNELS_X86
#define SLUICE_KERNELS_X86 0
#endif

static const char *const names[NPU_KERNEL_COUNT] = {"scalar", "avx2", "avx512vnni", "avxvnni"};

const char *npu_kernel_name(enum npu_kernel k)
{
    return (unsigned)k < NPU_KERNEL_COUNT ? names[k] : "unknown";
}

int npu_kernel_available(enum npu_kernel k)
{
    const struct sl_cpu_features *f = sl_cpu_features();
    switch (k) {
    case NPU_KERNEL_SCALAR:
        return 1;
    case NPU_KERNEL_AVX2:
        return SLUICE_KERNELS_X86 && f->avx2;
    case NPU_KERNEL_AVX512VNNI:
        return SLUICE_KERNELS_X86 && f->avx512vnni;
    case NPU_KERNEL_AVXVNNI:
        return SLUICE_KERNELS_X86 && f->avxvnni;
    default:
        return 0;
    }
}

enum npu_kernel npu_kernel_best(void)
{
    if (npu_kernel_available(NPU_KERNEL_AVX512VNNI))
        return NPU_KERNEL_AVX512VNNI;
    if (npu_kernel_available(NPU_KERNEL_AVXVNNI))
        return NPU_KERNEL_AVXVNNI;
    if (npu_kernel_available(NPU_KERNEL_AVX2))
        return NPU_KERNEL_AVX2;
    return NPU_KERNEL_SCALAR;
}

int npu_gemm_b_create(const int8_t *src, uint32_t n, uint32_t k, struct npu_gemm_b **out)
{
    struct npu_gemm_b *b = calloc(1, sizeof *b);
    if (!b)
        return -ENOMEM;
    b->n = n;
    b->k = k;
    b->k4 = (k + 3) & ~3u;
    b->n16 = (n + 15) & ~15u;
    b->rowsum = calloc(b->n16, sizeof(int32_t));
    b->rows = sl_alloc_aligned((size_t)n * k, 64);
    b->packed = sl_alloc_aligned((size_t)b->n16 * b->k4, 64);
    if (!b->rowsum || !b->rows || !b->packed) {
        npu_gemm_b_destroy(b);
        return -ENOMEM;
    }
    memcpy(b->rows, src, (size_t)n * k);
    /* Packed layout for the 16-column VNNI tiles: for each block of 16 output
     * rows and each group of 4 k-values, 64 bytes: [row 0: k0..k3][row 1:
     * k0..k3]...[row 15: k0..k3]; zero beyond n and k. */
    memset(b->packed, 0, (size_t)b->n16 * b->k4);
    for (uint32_t r = 0; r < n; r++) {
        int32_t sum = 0;
        for (uint32_t c = 0; c < k; c++) {
            int8_t v = src[(size_t)r * k + c];
            sum += v;
            size_t off = ((size_t)(r / 16) * (b->k4 / 4) + c / 4) * 64 + (r % 16) * 4 + c % 4;
            b->packed[off] = v;
        }
        b->rowsum[r] = sum;
    }
    *out = b;
    return 0;
}

void npu_gemm_b_destroy(struct npu_gemm_b *b)
{
    if (!b)
        return;
    free(b->rowsum);
    sl_free_aligned(b->rows);
    sl_free_aligned(b->packed);
    free(b);
}

void npu_gemm_s8_kernel(enum npu_kernel kern, const struct npu_gemm_b *b, const int8_t *a,
                        uint32_t m, uint32_t r0, uint32_t r1, int32_t *c, size_t ldc)
{
    if (!npu_kernel_available(kern))
        kern = NPU_KERNEL_SCALAR;
    switch (kern) {
#if SLUICE_KERNELS_X86
    case NPU_KERNEL_AVX2:
        npu_gemm_avx2(b, a, m, r0, r1, c, ldc);
        return;
    case NPU_KERNEL_AVX512VNNI:
        npu_gemm_avx512vnni(b, a, m, r0, r1, c, ldc);
        return;
    case NPU_KERNEL_AVXVNNI:
        npu_gemm_avxvnni(b, a, m, r0, r1, c, ldc);
        return;
#endif
    default:
        npu_gemm_scalar(b, a, m, r0, r1, c, ldc);
    }
}

void npu_gemm_s8(const struct npu_gemm_b *b, const int8_t *a, uint32_t m, uint32_t r0,
                 uint32_t r1, int32_t *c, size_t ldc)
{
    static enum npu_kernel best = NPU_KERNEL_COUNT;
    if (best == NPU_KERNEL_COUNT)
        best = npu_kernel_best(); /* benign race: every thread computes the same value */
    npu_gemm_s8_kernel(best, b, a, m, r0, r1, c, ldc);
}

double npu_gemm_peak_gops(enum npu_kernel k, double seconds)
{
    if (!npu_kernel_available(k))
        return 0;
    uint64_t (*loop)(uint64_t) = NULL;
    double macs_per_iter = 0;
    switch (k) {
#if SLUICE_KERNELS_X86
    case NPU_KERNEL_AVX512VNNI:
        loop = npu_peak_avx512vnni, macs_per_iter = 16 * 64;
        break;
    case NPU_KERNEL_AVX2:
        loop = npu_peak_avx2, macs_per_iter = 12 * 32;
        break;
#endif
    default:
        return 0;
    }
    volatile uint64_t sink = loop(1000); /* warm up (clock ramps, AVX-512 license) */
    uint64_t iters = 1 << 16;
    double best = 0;
    uint64_t t_end = sl_now_ns() + (uint64_t)(seconds * 1e9);
    while (sl_now_ns() < t_end) {
        uint64_t t0 = sl_now_ns();
        sink += loop(iters);
        uint64_t dt = sl_now_ns() - t0;
        double gops = 2.0 * macs_per_iter * (double)iters / (double)dt;
        if (gops > best)
            best = gops;
        if (dt < 20000000)
            iters *= 2;
    }
    (void)sink;
    return best;
}

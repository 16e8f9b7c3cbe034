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

int npu_gemm_b_alloc(uint32_t n, uint32_t k, struct npu_gemm_b **out)
{
    struct npu_gemm_b *b = calloc(1, sizeof *b);
    if (!b)
        return -ENOMEM;
    b->n = n;
    b->k = k;
    b->k4 = (k + 3) & ~3u;
    b->n16 = (n + 15) & ~15u;
    b->rowsum = calloc(b->n16, sizeof(int32_t));
    b->packed = sl_alloc_aligned((size_t)b->n16 * b->k4, 64);
    if (!b->rowsum || !b->packed) {
        npu_gemm_b_destroy(b);
        return -ENOMEM;
    }
    /* zero the padding of the last block and of each row's last k group */
    if (b->n16 != n || b->k4 != k)
        memset(b->packed, 0, (size_t)b->n16 * b->k4);
    *out = b;
    return 0;
}

/* Packed layout for the 16-channel VNNI tiles: for each block of 16 output
 * rows and each group of 4 k-values, 64 bytes [row 0: k0..k3] ... [row 15:
 * k0..k3]; zero beyond n and k. Row r of `src` is row r0 + r. A row's 4-byte
 * groups land 64 bytes apart: copied as 32-bit words. */
void npu_gemm_b_fill(struct npu_gemm_b *b, uint32_t r0, uint32_t nrows, const int8_t *src)
{
    uint32_t kg = b->k / 4, kgroups = b->k4 / 4;
    for (uint32_t i = 0; i < nrows; i++) {
        uint32_t r = r0 + i;
        const int8_t *row = src + (size_t)i * b->k;
        int8_t *dst = b->packed + (size_t)(r / 16) * kgroups * 64 + (r % 16) * 4;
        int32_t sum = 0;
        for (uint32_t g = 0; g < kg; g++) {
            uint32_t w;
            memcpy(&w, row + 4 * g, 4);
            memcpy(dst + (size_t)g * 64, &w, 4);
        }
        for (uint32_t c = 4 * kg; c < b->k; c++)
            dst[(size_t)kg * 64 + (c - 4 * kg)] = row[c];
        for (uint32_t c = 0; c < b->k; c++)
            sum += row[c];
        b->rowsum[r] = sum;
    }
}

int npu_gemm_b_create(const int8_t *src, uint32_t n, uint32_t k, struct npu_gemm_b **out)
{
    int ret = npu_gemm_b_alloc(n, k, out);
    if (ret == 0)
        npu_gemm_b_fill(*out, 0, n, src);
    return ret;
}

void npu_gemm_b_row(const struct npu_gemm_b *b, uint32_t r, int8_t *out)
{
    for (uint32_t c = 0; c < b->k; c++)
        out[c] = npu_gemm_b_at(b, r, c);
}

void npu_gemm_b_destroy(struct npu_gemm_b *b)
{
    if (!b)
        return;
    free(b->rowsum);
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

/* npu_gemm.h: int8 GEMM kernels of the emulated NPU (internal).
 *
 * C[i][r - r0] = sum_k A[i][k] * B[r][k] for rows r in [r0, r1), int32,
 * bit-exact across kernels. A: int8 activations [m][k], row-major, |a| <= 127.
 * B: int8 weights [n][k] (|b| <= 127), prepared once by npu_gemm_b_create
 * into each kernel's layout (and the +128 correction of vpdpbusd). */
#ifndef SLUICE_NPU_GEMM_H
#define SLUICE_NPU_GEMM_H

#include <stddef.h>
#include <stdint.h>

struct npu_gemm_b;

enum npu_kernel {
    NPU_KERNEL_SCALAR = 0,
    NPU_KERNEL_AVX2,
    NPU_KERNEL_AVX512VNNI,
    NPU_KERNEL_AVXVNNI,
    NPU_KERNEL_COUNT
};

const char *npu_kernel_name(enum npu_kernel k);
/* 1 if this CPU (and SLUICE_SIMD) allows the kernel. */
int npu_kernel_available(enum npu_kernel k);
/* The kernel npu_gemm_s8 uses. */
enum npu_kernel npu_kernel_best(void);

int npu_gemm_b_create(const int8_t *b, uint32_t n, uint32_t k, struct npu_gemm_b **out);
void npu_gemm_b_destroy(struct npu_gemm_b *b);

/* With the best kernel, or a chosen one (tests, benchmark). ldc: C's row
 * stride in elements. */
void npu_gemm_s8(const struct npu_gemm_b *b, const int8_t *a, uint32_t m, uint32_t r0,
                 uint32_t r1, int32_t *c, size_t ldc);
void npu_gemm_s8_kernel(enum npu_kernel kern, const struct npu_gemm_b *b, const int8_t *a,
                        uint32_t m, uint32_t r0, uint32_t r1, int32_t *c, size_t ldc);

#endif

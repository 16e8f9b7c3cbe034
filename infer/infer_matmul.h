/* infer_matmul.h: the float matmul kernels behind infer_op_matmul_f32
 * (internal to the infer module). y = x W^T with x [n][cols] and W
 * [rows][cols] both row-major, so every output is a dot product of two
 * contiguous rows.
 *
 * A kernel computes one tile: mr (1..4) input rows against nr (1..4) weight
 * rows, y[i][r] for i < mr, r < nr, y's row stride ldy. infer_matmul.c does
 * the cache blocking around the tiles and picks the kernel once by CPU
 * features (SLUICE_SIMD lowers it). The scalar kernel is the reference; the
 * SIMD kernels sum in a different order (and with FMA), so they agree with
 * it within float rounding, not bit for bit (test_infer_ops checks the
 * bound). */
#ifndef SLUICE_INFER_MATMUL_H
#define SLUICE_INFER_MATMUL_H

#include <stddef.h>
#include <stdint.h>

#define INFER_MATMUL_MR 4
#define INFER_MATMUL_NR 4

enum infer_matmul_kernel {
    INFER_MATMUL_SCALAR = 0,
    INFER_MATMUL_AVX2 = 1,
    INFER_MATMUL_AVX512 = 2,
    INFER_MATMUL_COUNT
};

typedef void infer_matmul_tile_fn(float *y, size_t ldy, const float *x, uint32_t mr,
                                  const float *w, uint32_t nr, uint32_t cols);

infer_matmul_tile_fn infer_matmul_tile_scalar;
infer_matmul_tile_fn infer_matmul_tile_avx2;
infer_matmul_tile_fn infer_matmul_tile_avx512;

const char *infer_matmul_kernel_name(enum infer_matmul_kernel k);
int infer_matmul_kernel_available(enum infer_matmul_kernel k);
enum infer_matmul_kernel infer_matmul_kernel_best(void);

/* y[i][r] (row stride rows) for i < n and r in [r0, r1), with kernel k (the
 * scalar one if k is unavailable). */
void infer_matmul_f32_kernel(enum infer_matmul_kernel k, float *y, const float *x,
                             const float *w, uint32_t n, uint32_t rows, uint32_t cols,
                             uint32_t r0, uint32_t r1);

#endif

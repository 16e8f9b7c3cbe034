/* unpack_internal.h: per-row kernels of each instruction set. A row kernel
 * unpacks one row of `cols` weights stored with width `b` to int8. The
 * scalar kernels are the specification; SIMD files provide tables whose
 * entries must be bit-exact with them. The build defines SLUICE_KERNELS_X86
 * or SLUICE_KERNELS_ARM64 (CMake) for the files it compiles for the target;
 * whether the running CPU may use them is decided at run time. */
#ifndef SLUICE_UNPACK_INTERNAL_H
#define SLUICE_UNPACK_INTERNAL_H

#include "unpack.h"

typedef void unpack_row_fn(const uint8_t *src, uint32_t cols, uint32_t b, int8_t *dst);

struct unpack_kernels {
    unpack_row_fn *adaptive;
    unpack_row_fn *int4int8;
    unpack_row_fn *bitplane;
};

extern const struct unpack_kernels unpack_kernels_scalar;
extern const struct unpack_kernels unpack_kernels_avx2;
extern const struct unpack_kernels unpack_kernels_avx512;
extern const struct unpack_kernels unpack_kernels_neon;

/* Weightlet widths of a b-bit code, most significant first, 0-terminated. */
extern const uint8_t unpack_planes[9][4];

/* Scalar pieces the SIMD kernels reuse for tails: one adaptive group of rg
 * weights (rg a multiple of 8) of which the first `valid` are written; the
 * bitplane weights [j0, cols) of a row; the int4int8 weights [j0, cols). */
void unpack_adaptive_group_scalar(const uint8_t *src, uint32_t rg, uint32_t valid, uint32_t b,
                                  int8_t *dst);
void unpack_bitplane_tail_scalar(const uint8_t *src, uint32_t cols, uint32_t b, uint32_t j0,
                                 int8_t *dst);
void unpack_int4int8_tail_scalar(const uint8_t *src, uint32_t cols, uint32_t b, uint32_t j0,
                                 int8_t *dst);

/* The int8 value of an unsigned code u of width b (adaptive and bitplane):
 * b = 1: 2u - 1; else min(u, 2^b - 2) - (2^(b-1) - 1). */
static inline int8_t unpack_code_value(uint32_t u, uint32_t b)
{
    if (b == 1)
        return (int8_t)(2 * (int)u - 1);
    uint32_t top = (1u << b) - 2;
    return (int8_t)((int)(u < top ? u : top) - ((1 << (b - 1)) - 1));
}

#endif

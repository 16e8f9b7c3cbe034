/*
 * unpack.h: quantized weight tensors to int8 codes and per-row scales.
 *
 *   int8_t *q = malloc(rows * cols); float *scale = malloc(rows * sizeof(float));
 *   if (unpack_tensor_int8(info, bytes, q, scale, &err) < 0) ...
 *
 * Encodings: q8 (a copy), and the packed adaptive, int4int8 and bitplane
 * layouts of docs/FORMAT-packed.md. The scalar unpacker of each encoding is
 * its specification; SIMD variants (AVX2, AVX-512, NEON) are bit-exact with
 * it and chosen at run time (SLUICE_SIMD forces a lower level). Every tensor
 * is validated before it is touched: corrupt bytes give an error, never a
 * crash. Thread-safe: no shared state.
 */
#ifndef SLUICE_UNPACK_H
#define SLUICE_UNPACK_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "format.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Unpacks a whole quantized tensor: q_out [rows][cols], scale_out [rows].
 * -EINVAL with a message for a float encoding or malformed bytes. */
int unpack_tensor_int8(const struct format_tensor_info *t, const void *data, int8_t *q_out,
                       float *scale_out, struct sl_err *err);

/* ---- kernels ------------------------------------------------------------------ */

enum unpack_kernel {
    UNPACK_KERNEL_SCALAR = 0,
    UNPACK_KERNEL_AVX2,
    UNPACK_KERNEL_AVX512,
    UNPACK_KERNEL_NEON,
    UNPACK_KERNEL_COUNT
};

const char *unpack_kernel_name(enum unpack_kernel k);
/* 1 if compiled in and allowed by the CPU (and SLUICE_SIMD). */
int unpack_kernel_available(enum unpack_kernel k);
/* The fastest available kernel (what unpack_tensor_int8 uses). */
enum unpack_kernel unpack_kernel_best(void);

/* ---- row-level access to a packed tensor --------------------------------------- */

/* A validated view of a packed tensor (caller-owned; init/fini). The bytes
 * must stay valid while the view is used. */
struct unpack_tensor {
    struct format_packed_layout layout;
    uint64_t *row_off;         /* byte offset of each row's codes in layout.data */
};

int unpack_tensor_init(struct unpack_tensor *u, uint32_t encoding, const void *data,
                       uint64_t len, uint64_t rows, uint64_t cols, struct sl_err *err);
void unpack_tensor_fini(struct unpack_tensor *u);

/* Width (1..8) and dequantization scale of a row. */
uint32_t unpack_tensor_width(const struct unpack_tensor *u, uint32_t row);
float unpack_tensor_scale(const struct unpack_tensor *u, uint32_t row);

/* Unpacks rows [r0, r1) into q[(r - r0) * cols ...] with the given kernel
 * (which must be available). Safe to call concurrently on disjoint ranges. */
void unpack_tensor_rows(const struct unpack_tensor *u, enum unpack_kernel k, uint32_t r0,
                        uint32_t r1, int8_t *q);

/* One row of a packed tensor from its code bytes alone (e.g. a few embedding
 * rows read ahead of the whole tensor): src holds
 * format_packed_row_bytes(encoding, width, cols) bytes; dst receives cols
 * int8 codes. encoding: FORMAT_ENC_ADAPTIVE, _INT4INT8 or _BITPLANE. */
void unpack_row(uint32_t encoding, enum unpack_kernel k, const void *src, uint32_t cols,
                uint32_t width, int8_t *dst);

#ifdef __cplusplus
}
#endif

#endif

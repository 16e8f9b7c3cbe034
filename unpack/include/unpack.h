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

#ifdef __cplusplus
}
#endif

#endif

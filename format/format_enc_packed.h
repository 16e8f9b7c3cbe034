/* format_enc_packed.h: the packed encodings' entries of the encoding traits
 * table (format_common.c), implemented in format_enc_packed.c. Private to the
 * format module; other modules use format_encoding_traits() and the
 * format_packed_* functions of format.h.
 *
 * Each validator checks that `len` bytes at `data` are a well-formed packed
 * tensor of rows x cols in its encoding (docs/FORMAT-packed.md): magic,
 * version, shape and group fields, zero reserved fields and padding, the
 * exact length implied by the per-row widths, finite non-negative scales. It
 * reads at most `len` bytes and never scans the codes (every code byte
 * decodes to a defined int8). Returns 0, or -EINVAL with err filled (without
 * the file name, which the caller prefixes). */
#ifndef SLUICE_FORMAT_ENC_PACKED_H
#define SLUICE_FORMAT_ENC_PACKED_H

#include <stdint.h>

#include "common.h"

int format_enc_adaptive_validate(const void *data, uint64_t len, uint64_t rows, uint64_t cols,
                                 struct sl_err *err);
int format_enc_int4int8_validate(const void *data, uint64_t len, uint64_t rows, uint64_t cols,
                                 struct sl_err *err);
int format_enc_bitplane_validate(const void *data, uint64_t len, uint64_t rows, uint64_t cols,
                                 struct sl_err *err);

#endif

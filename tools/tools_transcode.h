/* tools_transcode.h: re-stores a quantized container's codes in another
 * encoding (same widths, codes and scales, so the same model numerically):
 * the benchmark's INT8 and INT4/INT8-padded variants of an adaptive model. */
#ifndef SLUICE_TOOLS_TRANSCODE_H
#define SLUICE_TOOLS_TRANSCODE_H

#include <stdint.h>

#include "common.h"

/* encoding: FORMAT_ENC_Q8_CHANNEL, _INT4INT8, _ADAPTIVE or _BITPLANE. Float
 * tensors are copied. Written atomically. */
int tools_transcode(const char *src, const char *dst, uint32_t encoding, struct sl_err *err);

#endif

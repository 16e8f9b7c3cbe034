/* tools_calib.h: text to token chunks, and calibration of a float model
 * through the runtime's observer into the quantizer's statistics. */
#ifndef SLUICE_TOOLS_CALIB_H
#define SLUICE_TOOLS_CALIB_H

#include "infer.h"
#include "quantizer.h"
#include "tools_util.h"

/* Reads a UTF-8 text file and tokenizes it as one stream (no BOS). */
int tools_tokenize_file(const struct infer_tokenizer *tk, const char *path, int **ids, uint32_t *n,
                        struct sl_err *err);

/* Runs the float model in `container` over up to max_tokens tokens of the
 * text at `text_path` (NULL: deterministic random tokens), layer by layer
 * (one layer resident at a time), in chunks of at most min(context, 512)
 * tokens that start with BOS, recording statistics for the quantizer
 * (sample_rows input rows per linear kept for the smoothing search).
 * *used and *chunks receive the tokens (BOS included) and chunks run. */
int tools_calibrate(const char *container, const char *text_path, uint32_t max_tokens,
                    uint32_t sample_rows, struct quantizer_calib **out, uint32_t *used,
                    uint32_t *chunks, struct tools_progress *prog, struct sl_err *err);

#endif

/* fs_testmodel.h: a small random container for the fs tests, written with
 * the format writer: untied embedding and classifier, n_layers layers whose
 * linear weights cycle through every quantized encoding (adaptive, int4int8,
 * bitplane, q8) with random per-row widths 1..8, float norms. Deterministic
 * for a seed. */
#ifndef SLUICE_FS_TESTMODEL_H
#define SLUICE_FS_TESTMODEL_H

#include <stdint.h>

#include "common.h"

int fs_test_model_write(const char *path, uint64_t seed, uint32_t n_layers, uint32_t dim,
                        struct sl_err *err);

#endif

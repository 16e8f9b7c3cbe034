/* quantizer_internal.h: calibration records and the smoothing helpers shared
 * by the files of the quantizer. */
#ifndef SLUICE_QUANTIZER_INTERNAL_H
#define SLUICE_QUANTIZER_INTERNAL_H

#include "quantizer.h"

struct quantizer_calib_slot {
    uint32_t in_cols, out_cols;
    float *in_max;        /* [in_cols] S_I (NULL for K, V, up: see Q, gate) */
    float *out_max;       /* [out_cols] S_O */
    float *sample;        /* [sample_rows][in_cols] input rows */
    uint32_t n_sample;
    uint64_t rows_seen;
};

struct quantizer_calib {
    struct format_config cfg;
    uint32_t sample_rows;
    uint32_t n_slots;
    struct quantizer_calib_slot *slots; /* [layer * FORMAT_ROLE_COUNT + role], classifier last */
    uint64_t rng;
    int failed;
};

const struct quantizer_calib_slot *quantizer_calib_slot(const struct quantizer_calib *c,
                                                        int layer, uint32_t role);

#endif

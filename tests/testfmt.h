/* testfmt.h: container helpers shared by the tests that read what an
 * importer or the quantizer wrote (sluice_testformat: testutil plus the
 * container reader). */
#ifndef SLUICE_TESTFMT_H
#define SLUICE_TESTFMT_H

#include <stdint.h>

#include "format.h"

/* The float tensor (layer, role) of r decoded to floats (malloc'd); its
 * element count in *n, its index entry in *info when info is not NULL. The
 * test fails when there is no such tensor, it cannot be read (checksum) or
 * its encoding is not a float one. */
float *test_tensor_f32(struct format_reader *r, int layer, uint32_t role, uint64_t *n,
                       const struct format_tensor_info **info);

#endif

/* container_edit.h: tiny containers for tests and the committed corpus, and
 * edits of a container image that keep every checksum valid (resealed), so a
 * test reaches the checks behind the checksums. */
#ifndef SLUICE_TEST_CONTAINER_EDIT_H
#define SLUICE_TEST_CONTAINER_EDIT_H

#include <stddef.h>
#include <stdint.h>

#include "format.h"

/* Writes a 1-layer model (dim 32) that `sluice run` can load, its linear
 * layers in `encoding` (f32, q8, adaptive, int4int8 or bitplane), the rest
 * f32. Deterministic. 0, or -1 with a message on stderr. */
int ce_write_model(const char *path, uint32_t encoding);

/* Index entry of the tensor named `name` in a container image, or -1. */
long ce_find_tensor(const uint8_t *buf, size_t len, const char *name);
/* The tensor's bytes inside the image, and their length. */
uint8_t *ce_tensor_bytes(uint8_t *buf, long tensor, uint64_t *len);
/* After an edit of tensor `tensor`'s bytes or index entry: recomputes its
 * checksum, its slice's, the index's and the header's. */
void ce_reseal(uint8_t *buf, long tensor);

#endif

/* gen_internal.h: what the writers in gen_models.c (the model, llama2.c),
 * gen_gguf.c and gen_safetensors.c share: element storage and a growable
 * byte buffer. */
#ifndef SLUICE_TEST_GEN_INTERNAL_H
#define SLUICE_TEST_GEN_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "gen_models.h"

/* Bytes of n elements of type t. */
uint64_t gen_type_bytes(enum gen_type t, uint64_t n);
/* Stores n floats as type t (n a multiple of 32 for Q8_0). */
void gen_store(enum gen_type t, const float *x, uint64_t n, uint8_t *out);

/* A growable byte buffer: a failed allocation sets oom, later writes do
 * nothing and bflush fails. */
struct buf {
    uint8_t *p;
    size_t len, cap;
    int oom;
};

/* n zeroed bytes appended; NULL once out of memory. */
uint8_t *bgrow(struct buf *b, size_t n);
void bput(struct buf *b, const void *p, size_t n);
void bu32(struct buf *b, uint32_t v);
void bu64(struct buf *b, uint64_t v);
void bu8(struct buf *b, uint8_t v);
void bu16(struct buf *b, uint16_t v);
void bf32(struct buf *b, float v);
void bpad(struct buf *b, size_t align); /* zeros up to a multiple of align */
/* Writes the buffer to path and empties it: 0, or -1 (out of memory before,
 * or the write failed). */
int bflush(struct buf *b, const char *path);

#endif

/* gguf_internal.h: the pieces of the GGUF view.
 *   gguf_layout.c   options, the header bytes (metadata, tokenizer, tensor
 *                   infos) and the placement of every tensor
 *   gguf_convert.c  one tensor's output bytes from its verified container bytes
 *   gguf_view.c     reads of any range: extents, the chunk cache, statistics
 *   gguf_source.c   the file source (pread + checksum) and writing a file */
#ifndef SLUICE_GGUF_INTERNAL_H
#define SLUICE_GGUF_INTERNAL_H

#include <pthread.h>

#include "gguf.h"

struct gv_tensor {
    struct gguf_view_tensor pub;
    uint32_t slice;
    uint64_t src_off;        /* the tensor's offset inside its slice */
    uint64_t src_len;
    uint32_t enc;            /* container encoding */
    uint64_t rows, cols;     /* 1-D: rows = n, cols = 1 */
    uint64_t row_bytes;      /* output bytes per row (1-D: the whole tensor) */
    /* packed encodings, parsed once from verified bytes (under the view's lock
     * for the flag; the fields are written before `parsed` is set) */
    int parsed;
    uint64_t widths_off, scales_off, data_off, data_len;
    uint64_t mult_off; /* packed header version 2: the block multipliers; 0: none */
    uint32_t group;
    uint64_t *row_off;
};

struct gv_chunk {
    uint8_t *buf;
    int state;               /* 0 idle, 1 converting, 2 ready */
    uint32_t pins;
    uint64_t tick;
    int read;                /* a reader has copied from it since it was converted */
};

struct gguf_view {
    const struct format_reader *r;
    struct gguf_view_opts o;
    uint8_t *head;           /* header bytes, padded to the alignment */
    uint64_t head_len;
    struct gv_tensor *t;
    uint32_t n;
    uint64_t size;
    uint64_t cmax, rbmax;    /* scratch a read needs: longest row, largest output row */
    pthread_mutex_t mu;
    pthread_cond_t changed;
    struct gv_chunk *chunks; /* one per GGUF_VIEW_CHUNK of the file */
    uint64_t n_chunks, tick;
    /* chunk buffers: slots of one mapping in huge pages, reused after an
     * eviction (no fresh pages to fault and zero); NULL: malloc each */
    uint8_t *arena;
    uint64_t arena_map, arena_len; /* the mapping's start offset and length */
    uint32_t *free_slots;
    uint32_t n_slots, n_free, n_fresh;
    struct gguf_view_stats stats;
};

/* gguf_layout.c */
int gv_layout(struct gguf_view *v, struct sl_err *err);

/* gguf_convert.c: scratch for one conversion (cols int8 + one output row). */
struct gv_scratch {
    int8_t *q;
    uint8_t *row;
};
/* Parses a packed tensor (row offsets) from its verified bytes p; allocates. */
int gv_parse(struct gv_tensor *t, const uint8_t *p, struct sl_err *err);
/* Output bytes [a, b) of tensor t (offsets within its data) from its verified
 * bytes p into dst. No locks, no allocation. */
int gv_convert(const struct gv_tensor *t, const uint8_t *p, uint64_t a, uint64_t b,
               uint8_t *dst, const struct gv_scratch *s, struct sl_err *err);

#endif

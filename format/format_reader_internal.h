/* format_reader_internal.h: the open container (struct format_reader) as
 * format_reader.c fills it and format_reader_data.c reads from it. */
#ifndef SLUICE_FORMAT_READER_INTERNAL_H
#define SLUICE_FORMAT_READER_INTERNAL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "format_internal.h"

struct meta_kv {
    const char *key;        /* points into r->meta (NUL added by copying) */
    const uint8_t *val;
    size_t len;
};

struct format_reader {
    atomic_uint holders;    /* format_reader_ref adds one, format_reader_close drops one */
    char *path;
    int fd;
    uint64_t size;
    uint32_t version;
    struct format_config cfg;

    uint8_t *meta;          /* decompressed metadata block */
    uint64_t meta_len;
    char *keybuf;           /* NUL-terminated copies of the keys */

    struct format_tokenizer tok;
    float *tok_scores;
    uint32_t *tok_lens;
    const char **tok_strs;

    struct meta_kv *kv;
    uint32_t n_kv;

    struct format_tensor_info *tensors;
    uint32_t n_tensors;
    struct format_slice_info *slices;
    uint32_t n_slices;
};

/* pread until len bytes are in: 0, -errno, or -ENODATA at the end of the file
 * (the file is shorter than it claims). */
int fmt_pread_all(int fd, void *buf, uint64_t len, uint64_t off);

#endif

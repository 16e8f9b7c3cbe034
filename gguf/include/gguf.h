/*
 * gguf.h: a container seen as a GGUF v3 file (llama architecture), computed
 * on demand: the bytes of any range [off, off + len) of the virtual file are
 * produced from the container's verified slices, so `sluice mount` can serve
 * it as model.gguf and `sluice export --gguf` can write it, through this one
 * code path. Layout and conversions: docs/FORMAT.md ("The GGUF view").
 *
 *   struct gguf_view_opts o;
 *   gguf_view_opts_init(&o);                 // Q8_0, alignment 32, no cache
 *   struct gguf_view *v;
 *   gguf_view_create(reader, &o, &v, &err);  // header and layout, no data read
 *   struct gguf_source src;                  // where verified slice bytes come from
 *   gguf_file_source_create(reader, &src, &err);   // (export; the mount has its own)
 *   ssize_t n = gguf_view_read(v, &src, buf, len, off, &err);
 *   gguf_file_source_destroy(&src);
 *   gguf_view_destroy(v);
 *
 * Quantized tensors (q8 and the packed encodings) appear as Q8_0: each row's
 * int8 codes, with the row's float32 scale rounded to fp16 as every 32-block's
 * scale (exact up to that rounding), or as F16 (scale * code rounded to fp16)
 * with o.qtype (or F32), or, with Q8_0 asked, for rows whose length is not a multiple of 32 (Q8_0
 * cannot hold them). 1-D tensors (norms) appear as F32; 2-D float tensors keep their type (F32, F16
 * or BF16: exact). Tensors are in container order (embedding, layers, head), so a sequential reader
 * streams the container front to back.
 *
 * Integrity: a byte is computed only from bytes that passed their slice's
 * checksum (the source's job); a failed slice, or a scale that fp16 cannot
 * hold, gives -EIO for every range that needs it, never wrong bytes.
 *
 * Threads: gguf_view_read may run on any number of threads at once (the
 * source must allow it too); the cache makes a chunk converted once while it
 * stays cached, even when several readers ask for it together (a small read
 * of a chunk not converted yet converts just its own range meanwhile).
 */
#ifndef SLUICE_GGUF_H
#define SLUICE_GGUF_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common.h"
#include "format.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ggml tensor types the view writes (ggml.h's numbering). */
enum gguf_ggml_type {
    GGUF_GGML_F32 = 0,
    GGUF_GGML_F16 = 1,
    GGUF_GGML_Q8_0 = 8,
    GGUF_GGML_BF16 = 30,
};

#define GGUF_VIEW_CHUNK (1u << 20) /* cache granularity: 1 MiB of the virtual file */
/* A read of at most this many bytes that finds its chunk not converted yet
 * converts just its own range (the first page a reader asks for, the last
 * page glibc's fseek to the end reads) instead of waiting for the whole
 * chunk; larger reads convert and cache the chunk. */
#define GGUF_VIEW_SMALL_READ (64u << 10)

struct gguf_view_opts {
    uint32_t qtype;       /* quantized tensors as GGUF_GGML_Q8_0 (default), _F16 (scale *
                             code rounded to fp16) or _F32 (scale * code, exact in float:
                             a reference for measuring the other two) */
    uint32_t alignment;   /* general.alignment: power of two, 8..65536 (default 32) */
    uint64_t cache_bytes; /* converted chunks kept in memory; 0: no cache (each read
                             converts exactly its range) */
};

void gguf_view_opts_init(struct gguf_view_opts *o);

/* Verified slice bytes, pinned while in use. acquire pins slice i's whole
 * verified bytes (*data) and returns 0 or -errno (-EIO: checksum failure or
 * read error; err says why); release unpins. `guard` (optional) runs fn(arg), the pure
 * conversion over pinned bytes, e.g. turning SIGBUS into -EIO. */
struct gguf_source {
    void *ctx;
    int (*acquire)(void *ctx, uint32_t slice, const uint8_t **data, void **token,
                   struct sl_err *err);
    void (*release)(void *ctx, uint32_t slice, void *token);
    int (*guard)(void *ctx, int (*fn)(void *), void *arg);
};

/* What the view says about one of its tensors. */
struct gguf_view_tensor {
    char name[FORMAT_NAME_MAX]; /* llama.cpp's name ("blk.0.attn_q.weight") */
    uint32_t type;              /* enum gguf_ggml_type */
    uint32_t n_dims;
    uint64_t ne[2];   /* ggml order: ne[0] = columns (the row length) */
    uint64_t offset;  /* absolute, in the virtual file */
    uint64_t size;    /* bytes */
    uint32_t tensor;  /* the container's tensor index */
    int f16_fallback; /* 1: quantized, Q8_0 asked, rows not a multiple of 32 */
};

struct gguf_view;

/* Lays the file out from the container's index, config and tokenizer (no
 * tensor data is read). -EINVAL with a sentence for a container the view
 * cannot express (an architecture or RoPE layout GGUF's llama has no name
 * for, a bad option), -ENOMEM. The reader must outlive the view. */
int gguf_view_create(const struct format_reader *r, const struct gguf_view_opts *o,
                     struct gguf_view **out, struct sl_err *err);
void gguf_view_destroy(struct gguf_view *v); /* NULL ok */

uint64_t gguf_view_size(const struct gguf_view *v);
/* Bytes before the first tensor's data (header, metadata, tensor infos, padding). */
uint64_t gguf_view_header_size(const struct gguf_view *v);
uint32_t gguf_view_n_tensors(const struct gguf_view *v);
const struct gguf_view_tensor *gguf_view_tensor(const struct gguf_view *v, uint32_t i);

/* Fills buf with bytes [off, off + len) of the file, clipped at its end;
 * returns the count (0 at or past the end) or -errno: -EIO (a slice failed
 * its checksum or could not be read, a tensor is malformed, a scale or value
 * exceeds fp16), -ENOMEM. err (may be NULL) says why. A range inside the
 * header is copied from memory (no slice is needed). */
ssize_t gguf_view_read(struct gguf_view *v, const struct gguf_source *src, void *buf, size_t len,
                       uint64_t off, struct sl_err *err);

/* Converts the cache chunk holding offset `off` ahead of its readers (a
 * prefetch): 0 when it is cached now or another thread is converting it,
 * -ENOSPC when the cache has no room short of evicting a chunk no reader has
 * read yet (nothing is evicted then), -EINVAL without a cache or past the
 * end, or the conversion's -errno (nothing cached; the readers of that range
 * get the error themselves). push (optional) is handed the bytes of a chunk
 * this call converted, [start, start + len) of the file, while they are
 * pinned (the mount puts them in the kernel's page cache); when it returns 0
 * the chunk counts as read (first to be evicted). */
int gguf_view_warm(struct gguf_view *v, const struct gguf_source *src, uint64_t off,
                   int (*push)(void *ctx, uint64_t start, const void *data, size_t len),
                   void *ctx, struct sl_err *err);

struct gguf_view_stats {
    uint64_t budget;   /* cache_bytes */
    uint64_t resident; /* bytes of converted chunks held now */
    uint64_t hits;     /* chunk lookups served from the cache */
    uint64_t misses;   /* chunk lookups that converted */
    uint64_t waits;    /* lookups that waited for another reader's conversion */
    uint64_t warmed;   /* chunks converted ahead of readers (gguf_view_warm) */
    uint64_t pushed;   /* of those, chunks handed to its push */
    uint64_t direct;   /* lookups converted without the cache (small reads of a
                          chunk not converted yet; no room) */
    uint64_t evictions;
    uint64_t bytes_converted; /* bytes of tensor data computed (cached or not) */
    uint64_t errors;          /* reads that failed */
};
void gguf_view_get_stats(struct gguf_view *v, struct gguf_view_stats *out);

/* A source that reads slices from the container (pread + checksum), for
 * export and tests: keeps the last slice read; thread-safe. */
int gguf_file_source_create(const struct format_reader *r, struct gguf_source *out,
                            struct sl_err *err);
void gguf_file_source_destroy(struct gguf_source *src);

/* Writes the whole view to `path` atomically (PATH.tmp.XXXXXX, fsync, rename;
 * nothing at `path` on failure), reading in chunks through gguf_view_read.
 * progress (optional) is called after each chunk with bytes done and total. */
int gguf_view_write_file(struct gguf_view *v, const struct gguf_source *src, const char *path,
                         void (*progress)(void *ctx, uint64_t done, uint64_t total), void *ctx,
                         struct sl_err *err);

#ifdef __cplusplus
}
#endif

#endif

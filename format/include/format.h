/*
 * format.h: the .sluice container, version 1 (byte layout in docs/FORMAT.md).
 *
 * One file per model: a 4 KiB header, then the data slices in execution order
 * (the embedding slice, one slice per layer, the head slice), each 4 KiB
 * aligned and padded so that a layer is one O_DIRECT read, then the metadata
 * (config, tokenizer, key-value pairs; zstd-compressed) and the tensor and
 * slice index. Every tensor and every slice carries an XXH3-64 checksum.
 *
 * Writing (streams: tensors are appended as they are added, in slice order):
 *
 *   struct format_writer *w;
 *   format_writer_create("m.sluice", &w, &err);
 *   format_writer_set_config(w, &cfg);
 *   format_writer_set_tokenizer(w, &tok, &err);
 *   format_writer_set_meta(w, "quant.method", "edgeflow", 8, &err);
 *   for each tensor in execution order:
 *       format_writer_add_tensor(w, &desc, bytes, len, &err);
 *   format_writer_finish(w, &err);   // temp file, fsync, rename
 *   format_writer_destroy(w);        // removes the temp file if unfinished
 *
 * Reading:
 *
 *   struct format_reader *r;
 *   format_reader_open("m.sluice", &r, &err);
 *   const struct format_config *c = format_reader_config(r);
 *   int i = format_reader_find(r, 0, FORMAT_ROLE_WQ);
 *   const struct format_tensor_info *t = format_reader_tensor(r, i);
 *   format_reader_read_tensor(r, i, buf, t->length, &err);  // checksum verified
 *   format_reader_close(r);
 *
 * Threads: a reader is immutable after open; every const accessor and the
 * read functions (pread-based) may be called from any thread. A writer is
 * used by one thread.
 */
#ifndef SLUICE_FORMAT_H
#define SLUICE_FORMAT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The versions. Version 2 adds the shadow outlier metadata
 * (shadow.linears): a container with it has activation scales that cover
 * the bulk, not the maximum, and expects the clipped excess to be computed
 * on the CPU. Version 3 adds packed adaptive tensors of header version 2
 * (integer multipliers per block of a row, docs/FORMAT-packed.md). The
 * writer writes 3 when a tensor has them, else 2 (FORMAT_VERSION_PLAIN), so
 * that containers without them still load in version-2 readers. A reader
 * accepts versions FORMAT_VERSION_MIN..FORMAT_VERSION. */
#define FORMAT_VERSION 3
#define FORMAT_VERSION_PLAIN 2
#define FORMAT_VERSION_MIN 1
#define FORMAT_ALIGN 4096        /* slice alignment and padding */
#define FORMAT_TENSOR_ALIGN 64   /* tensor alignment inside a slice */
#define FORMAT_NAME_MAX 64       /* tensor names, NUL included */
#define FORMAT_MAX_DIMS 4
#define FORMAT_MAX_BITS 8        /* adaptive channel widths are 1..8 */

/* ---- model configuration ---------------------------------------------------- */

enum format_arch {
    FORMAT_ARCH_LLAMA = 1, /* RMSNorm, RoPE, GQA attention, SwiGLU FFN */
};

/* RoPE convention of the stored q/k weights. Importers convert to
 * FORMAT_ROPE_INTERLEAVED (llama2.c / GGUF: rotate pairs (2i, 2i+1) within a
 * head); Hugging Face checkpoints (rotate-half, pairs (i, i + head_dim/2)) are
 * permuted on import. */
enum format_rope {
    FORMAT_ROPE_INTERLEAVED = 0,
};

struct format_config {
    uint32_t arch;          /* enum format_arch */
    uint32_t dim;           /* model width */
    uint32_t hidden_dim;    /* FFN width */
    uint32_t n_layers;
    uint32_t n_heads;
    uint32_t n_kv_heads;    /* < n_heads: grouped-query attention */
    uint32_t head_dim;      /* dim / n_heads */
    uint32_t vocab_size;
    uint32_t seq_len;       /* maximum context */
    uint32_t tied_embedding;/* 1: the classifier is the token embedding */
    uint32_t rope_layout;   /* enum format_rope */
    uint32_t bos_id;
    uint32_t eos_id;
    float rope_theta;       /* 10000 for Llama 2 */
    float norm_eps;         /* RMSNorm epsilon (1e-5 for llama2.c) */
};

/* Checks the fields against each other (non-zero sizes, dim = n_heads *
 * head_dim, n_heads % n_kv_heads == 0, even head_dim, ids < vocab, limits that
 * keep every size product inside 64 bits). `what` names the file in errors. */
int format_config_validate(const struct format_config *cfg, const char *what,
                           struct sl_err *err);

/* Expected shape of a tensor role under a config: *n_dims (1 or 2) and
 * shape[0..1] (rows, cols). -EINVAL for a role that cannot appear (the
 * classifier of a tied model). */
int format_role_shape(const struct format_config *cfg, uint32_t role, uint32_t *n_dims,
                      uint64_t shape[2]);

/* ---- tokenizer -------------------------------------------------------------- */

/* llama2.c-style vocabulary: a byte string and a merge score per token.
 * Token strings may contain any byte (including NUL); lengths are explicit. */
struct format_tokenizer {
    uint32_t n_tokens;
    uint32_t max_token_len;
    const float *scores;          /* [n_tokens] */
    const uint32_t *lens;         /* [n_tokens] */
    const char *const *tokens;    /* [n_tokens], tokens[i] has lens[i] bytes */
};

/* ---- tensors ------------------------------------------------------------------ */

/* What a tensor is in the model. Within a layer the roles are listed in
 * execution order; the writer requires that order. */
enum format_role {
    FORMAT_ROLE_TOK_EMBD = 0,   /* [vocab][dim], layer -1 */
    FORMAT_ROLE_ATTN_NORM,      /* [dim] */
    FORMAT_ROLE_WQ,             /* [n_heads*head_dim][dim] */
    FORMAT_ROLE_WK,             /* [n_kv_heads*head_dim][dim] */
    FORMAT_ROLE_WV,             /* [n_kv_heads*head_dim][dim] */
    FORMAT_ROLE_WO,             /* [dim][n_heads*head_dim] */
    FORMAT_ROLE_FFN_NORM,       /* [dim] */
    FORMAT_ROLE_W_GATE,         /* [hidden][dim]  (llama2.c w1) */
    FORMAT_ROLE_W_UP,           /* [hidden][dim]  (llama2.c w3) */
    FORMAT_ROLE_W_DOWN,         /* [dim][hidden]  (llama2.c w2) */
    FORMAT_ROLE_OUT_NORM,       /* [dim], layer -1 */
    FORMAT_ROLE_CLASSIFIER,     /* [vocab][dim], layer -1; absent when tied */
    FORMAT_ROLE_COUNT
};

/* Short names ("wq", "attn_norm", ...), for manifests and tables. */
const char *format_role_name(enum format_role role);
/* The tensor name a container gives (layer, role), GGUF style
 * ("blk.3.attn_q.weight"; layer -1: "output_norm.weight"), into buf[n]
 * (FORMAT_NAME_MAX is enough). */
void format_tensor_name(int layer, enum format_role role, char *buf, size_t n);
/* 1 for the linear weights the quantizer and the NPU deal with (Q, K, V, O,
 * gate, up, down, classifier), else 0. */
int format_role_is_linear(enum format_role role);
/* 1 if s may be stored as a tensor's act_scale: exactly 0 (no static scale:
 * the runtime scales each input dynamically) or positive and finite; else 0
 * (NaN, infinities, negatives). The one rule the quantizer, the writer, the
 * reader and the runtime apply (docs/FORMAT.md "Tensor entry"). */
int format_act_scale_valid(float s);

/* Encodings. Facts about each live in one table (format_encoding_traits). A
 * weight matrix is [rows][cols]: rows are output channels, cols the inputs. */
enum format_encoding {
    FORMAT_ENC_F32 = 0,
    FORMAT_ENC_F16 = 1,
    FORMAT_ENC_BF16 = 2,
    /* INT8 per output channel: float32 scale[rows], zero padding to a 64-byte
     * boundary, then int8 q[rows][cols]; w = scale[r] * q[r][c], q in
     * [-127, 127]. */
    FORMAT_ENC_Q8_CHANNEL = 3,
    /* Reserved for the packed adaptive encoding (EdgeFlow 4.2) and the
     * baselines it is compared with; layouts in docs/FORMAT.md. */
    FORMAT_ENC_ADAPTIVE = 4,
    FORMAT_ENC_INT4INT8 = 5,
    FORMAT_ENC_BITPLANE = 6,
    FORMAT_ENC_COUNT
};

struct format_encoding_traits {
    const char *name;     /* "f32", "f16", "bf16", "q8", "adaptive", ... */
    int quantized;        /* 1: integer codes with per-channel scales */
    /* Exact byte length of a rows x cols tensor, or 0 where the length depends
     * on the contents (then `validate` decides). */
    uint64_t (*size)(uint64_t rows, uint64_t cols);
    /* Checks that `len` bytes are a well-formed tensor of this shape (header
     * fields, lengths, code ranges); NULL where `size` says it all. Fills
     * err (without the file name) and returns -EINVAL when not. */
    int (*validate)(const void *data, uint64_t len, uint64_t rows, uint64_t cols,
                    struct sl_err *err);
};

/* The q8 encoding's validate for rows [r0, r1) of a rows x cols tensor
 * (scales finite and >= 0, codes -127..127): a reader of a row range checks
 * what it reads. */
int format_q8_validate_rows(const void *data, uint64_t rows, uint64_t cols, uint64_t r0,
                            uint64_t r1, struct sl_err *err);

/* NULL for an unknown encoding. The packed layouts (adaptive, int4int8,
 * bitplane) are implemented in format/format_enc_packed.c. */
const struct format_encoding_traits *format_encoding_traits(uint32_t encoding);

/* ---- packed encodings (adaptive, int4int8, bitplane; docs/FORMAT-packed.md) ----
 *
 * A packed tensor is a 32-byte header, the per-row bit widths as a packed
 * 3-bit array (row r: bits [3r, 3r+3) little-endian, value = width - 1), the
 * per-row float32 scales, then the rows' code bytes back to back. Sections
 * start at 64-byte offsets from the tensor's start. */

#define FORMAT_PACKED_GROUP 512      /* adaptive: weights per group (R) */
#define FORMAT_PACKED_HEADER 32

struct format_packed_layout {
    uint32_t encoding;
    uint32_t rows, cols;
    uint32_t group;                  /* adaptive: R; others: 0 */
    const uint8_t *widths;           /* 3-bit packed */
    const uint8_t *scales;           /* rows little-endian float32 */
    const uint8_t *data;             /* row 0's codes */
    uint64_t data_len;
    /* header version 2 (adaptive only): per block of mult_block weights of a
     * row a multiplier m in 1..4 (2 bits; format_packed_mult) folded into the
     * row's int8 values; NULL, 0: version 1, none */
    const uint8_t *mult;
    uint32_t mult_block;
};

#define FORMAT_PACKED_MULT_BLOCK 32 /* weights per multiplier (header version 2) */

/* Blocks of a row of cols weights, and the multiplier (1..4) of block k of
 * row r of a version 2 tensor: 2 bits at bit 2 (r * blocks + k) of the
 * array, least significant first, holding m - 1. */
static inline uint32_t format_packed_mult_blocks(uint64_t cols)
{
    return (uint32_t)((cols + FORMAT_PACKED_MULT_BLOCK - 1) / FORMAT_PACKED_MULT_BLOCK);
}
static inline uint32_t format_packed_mult(const uint8_t *mult, uint32_t blocks, uint32_t r,
                                          uint32_t k)
{
    uint64_t bit = 2 * ((uint64_t)r * blocks + k);
    return ((mult[bit / 8] >> (bit % 8)) & 3) + 1;
}
/* The largest multiplier a b-bit row may use: its int8 values code * m stay
 * within [-127, 127] (larger stored ones decode as it). */
static inline uint32_t format_packed_mult_max(uint32_t b)
{
    uint32_t lim = b == 1 ? 1 : (1u << (b - 1)) - 1, m = 127 / lim;
    return m < 4 ? m : 4;
}

/* Width of row r (1..8). */
static inline uint32_t format_packed_width(const uint8_t *widths, uint32_t r)
{
    uint64_t bit = (uint64_t)r * 3;
    uint32_t v = widths[bit / 8] | ((uint32_t)widths[bit / 8 + 1] << 8);
    return ((v >> (bit % 8)) & 7) + 1;
}

/* Bytes of one row's codes for a width, and bytes before the codes (header,
 * widths, scales, each 64-byte aligned; the widths array has one spare byte so
 * format_packed_width may read two bytes). */
uint64_t format_packed_row_bytes(uint32_t encoding, uint32_t width, uint64_t cols);
uint64_t format_packed_prefix_bytes(uint64_t rows);
/* The same for a header version 2 tensor (block multipliers after the
 * scales); mult 0: version 1, as format_packed_prefix_bytes. */
uint64_t format_packed_prefix_bytes_mult(uint64_t rows, uint64_t cols, int mult);

/* Parses and validates a packed tensor of rows x cols: magic, header fields,
 * and the exact length implied by the widths. Fills *out with views into
 * data. Does not scan the codes (every code maps to a defined int8). */
int format_packed_parse(uint32_t encoding, const void *data, uint64_t len, uint64_t rows,
                        uint64_t cols, struct format_packed_layout *out, struct sl_err *err);

/* What the writer is told about a tensor. */
struct format_tensor_desc {
    const char *name;           /* unique, < FORMAT_NAME_MAX bytes */
    int32_t layer;              /* 0..n_layers-1, or -1 */
    uint32_t role;              /* enum format_role */
    uint32_t encoding;          /* enum format_encoding */
    uint32_t n_dims;            /* 1 or 2 */
    uint64_t shape[FORMAT_MAX_DIMS]; /* shape[0] = rows; 1-D tensors: shape[0] = n */
    float act_scale;            /* static per-tensor input activation scale, 0 = none */
    uint32_t bits_hist[FORMAT_MAX_BITS + 1]; /* channels per width 1..8 ([0] unused);
                                                all zero for float encodings */
};

/* What the reader knows of a tensor (everything in the index). */
struct format_tensor_info {
    char name[FORMAT_NAME_MAX];
    int32_t layer;
    uint32_t role;
    uint32_t encoding;
    uint32_t n_dims;
    uint64_t shape[FORMAT_MAX_DIMS];
    uint64_t offset;            /* absolute, in the container */
    uint64_t length;            /* bytes */
    uint64_t checksum;          /* XXH3-64 of those bytes */
    float act_scale;            /* 0 or positive and finite (checked at open) */
    uint32_t bits_hist[FORMAT_MAX_BITS + 1];
    uint32_t slice;             /* index of the slice that holds it */
};

/* ---- slices -------------------------------------------------------------------- */

enum format_slice_kind {
    FORMAT_SLICE_EMBED = 0,  /* token embedding (untied models) */
    FORMAT_SLICE_LAYER = 1,  /* all tensors of one transformer layer */
    FORMAT_SLICE_HEAD = 2,   /* final norm + classifier (+ the embedding if tied) */
};

struct format_slice_info {
    uint32_t kind;           /* enum format_slice_kind */
    int32_t layer;           /* layer index for FORMAT_SLICE_LAYER, else -1 */
    uint64_t offset;         /* multiple of FORMAT_ALIGN */
    uint64_t length;         /* multiple of FORMAT_ALIGN, padding zero-filled */
    uint64_t checksum;       /* XXH3-64 of all `length` bytes */
    uint32_t first_tensor;   /* tensors of a slice are consecutive in the index */
    uint32_t n_tensors;
};

/* ---- writer -------------------------------------------------------------------- */

struct format_writer;

/* Creates `path`.tmp.XXXXXX next to `path`; nothing appears at `path` until
 * format_writer_finish succeeds. */
int format_writer_create(const char *path, struct format_writer **out, struct sl_err *err);

/* Must precede the first tensor. Validated by format_config_validate. */
int format_writer_set_config(struct format_writer *w, const struct format_config *cfg,
                             struct sl_err *err);

/* Copies the vocabulary. */
int format_writer_set_tokenizer(struct format_writer *w, const struct format_tokenizer *tok,
                                struct sl_err *err);

/* Adds or replaces a key-value pair (value: any bytes; keys < 256 bytes).
 * Conventions for keys are in docs/FORMAT.md ("quant.*", "calib.*", "source.*"). */
int format_writer_set_meta(struct format_writer *w, const char *key, const void *value,
                           size_t len, struct sl_err *err);

/* Appends one tensor. Order: the embedding (untied), then for each layer its
 * tensors in role order, then the output norm, the classifier (untied) or the
 * embedding (tied). Shapes are checked against the config and the encoding's
 * size/validate. The bytes are written to the temp file before returning
 * (memory stays bounded whatever the model size). */
int format_writer_add_tensor(struct format_writer *w, const struct format_tensor_desc *desc,
                             const void *data, uint64_t len, struct sl_err *err);

/* Checks that every tensor the config needs is present, writes metadata, index
 * and header, fsyncs, renames onto `path` and fsyncs the directory. */
int format_writer_finish(struct format_writer *w, struct sl_err *err);

/* Frees the writer; if finish did not succeed, removes the temp file. NULL ok. */
void format_writer_destroy(struct format_writer *w);

/* ---- reader -------------------------------------------------------------------- */

struct format_reader;

/* Opens and validates a container: magic, version, header checksum, bounds of
 * every section, offset and length (overflow-safe), the metadata checksum,
 * config, tokenizer, index consistency (tensors inside their slices, slices
 * inside the file, no overlaps, shapes matching the config and encoding).
 * Tensor data checksums are verified when tensors or slices are read. */
int format_reader_open(const char *path, struct format_reader **out, struct sl_err *err);
/* Closes r for one holder: the opener, or one that format_reader_ref added;
 * the last close frees it. NULL ok. */
void format_reader_close(struct format_reader *r);
/* Another holder of an open reader (r itself), so that one open container
 * serves several owners (the cold start's tool, session and model) without
 * reading and decompressing its index again; each holder closes it once.
 * Holders may be on different threads: after open a reader is read-only
 * (data reads are pread; advice on its fd applies to every holder). */
struct format_reader *format_reader_ref(struct format_reader *r);
/* Readers this process has opened so far (each one header, metadata and
 * index read, decompressed and validated): tests count the opens a caller
 * makes; a reference is not an open. */
uint64_t format_reader_opens(void);

const char *format_reader_path(const struct format_reader *r);
int format_reader_fd(const struct format_reader *r);       /* O_RDONLY, owned by r */
uint64_t format_reader_file_size(const struct format_reader *r);
const struct format_config *format_reader_config(const struct format_reader *r);
const struct format_tokenizer *format_reader_tokenizer(const struct format_reader *r);

uint32_t format_reader_n_tensors(const struct format_reader *r);
const struct format_tensor_info *format_reader_tensor(const struct format_reader *r, uint32_t i);
/* Index of the tensor with this layer and role, or -ENOENT. For a tied model,
 * FORMAT_ROLE_CLASSIFIER finds the embedding. */
int format_reader_find(const struct format_reader *r, int32_t layer, uint32_t role);
int format_reader_find_name(const struct format_reader *r, const char *name);

uint32_t format_reader_n_slices(const struct format_reader *r);
const struct format_slice_info *format_reader_slice(const struct format_reader *r, uint32_t i);

/* Metadata: number of keys, the i-th key, and lookup (-ENOENT if absent). */
uint32_t format_reader_meta_count(const struct format_reader *r);
const char *format_reader_meta_key(const struct format_reader *r, uint32_t i);
int format_reader_meta_get(const struct format_reader *r, const char *key, const void **value,
                           size_t *len);
/* The container's version (FORMAT_VERSION_MIN..FORMAT_VERSION). */
uint32_t format_reader_version(const struct format_reader *r);

/* ---- shadow outlier execution: the `shadow.linears` metadata value ------------------
 * (docs/FORMAT.md, version 2). One entry per linear layer the quantizer
 * calibrated for it: the tensor's act_scale is then the bulk scale, act_max
 * the maximum-based one; hot[n_hot] are the input channels holding most
 * calibration outliers (ascending) and w[k * rows + r] the int8 code of row
 * r, hot channel k (the unpacked tensor's, input-major). */
#define FORMAT_SHADOW_META_KEY "shadow.linears"
enum { FORMAT_SHADOW_ON = 1 }; /* flags: shadow executed (else pruned: act_scale = act_max) */
struct format_shadow_linear {
    int32_t layer;
    uint32_t role;
    uint32_t flags;
    float act_max;    /* max-based activation scale (max|x| / 127 after smoothing) */
    float importance; /* largest calibration outlier / the bulk scale (llm.npu 3.3) */
    float calib_rate; /* share of calibration activations beyond the bulk scale's range */
    uint32_t rows, cols, n_hot;
    uint32_t *hot;
    int8_t *w;
};
/* Serializes n entries into *out (malloc'ed, *out_len bytes). 0 or -ENOMEM. */
int format_shadow_encode(const struct format_shadow_linear *e, uint32_t n, void **out,
                         size_t *out_len);
/* Parses and validates a value against cfg (every entry names a linear of
 * the model with its shape, hot channels ascend below cols, no code -128,
 * no duplicate, no trailing byte). *out: malloc'ed, free with
 * format_shadow_free. 0, -EINVAL (err names the entry) or -ENOMEM. */
int format_shadow_parse(const struct format_config *cfg, const void *data, size_t len,
                        struct format_shadow_linear **out, uint32_t *n, struct sl_err *err);
void format_shadow_free(struct format_shadow_linear *e, uint32_t n);

/* Reads a tensor (`len` >= its length) or a whole slice, verifies its
 * checksum and validates it (format_tensor_validate); -EIO with a message
 * naming the file, the tensor or slice and the expected and actual checksums
 * on mismatch, -EIO on a short read, -EINVAL for a malformed tensor. */
int format_reader_read_tensor(const struct format_reader *r, uint32_t i, void *buf,
                              uint64_t len, struct sl_err *err);
int format_reader_read_slice(const struct format_reader *r, uint32_t i, void *buf,
                             uint64_t len, struct sl_err *err);

/* ---- checksums ------------------------------------------------------------------ */

uint64_t format_checksum(const void *data, size_t len);   /* XXH3-64, seed 0 (AVX-512 where there) */

/* format_checksum in pieces: the bytes given to format_hash_update, in
 * order, hash to what format_checksum gives for all of them at once, however
 * they are split (for hashing a slice piece by piece as its pages arrive).
 * format_hash_new: NULL when out of memory; reset to start over. */
struct format_hash;
struct format_hash *format_hash_new(void);
void format_hash_reset(struct format_hash *h);
void format_hash_update(struct format_hash *h, const void *data, size_t len);
uint64_t format_hash_digest(const struct format_hash *h);
void format_hash_free(struct format_hash *h);

/* Verifies bytes that were read by someone else (the loader, the FUSE layer):
 * the checksum (-EIO with a message naming the file and the slice or tensor),
 * then format_slice_validate / format_tensor_validate. */
int format_slice_verify(const struct format_reader *r, uint32_t slice, const void *data,
                        struct sl_err *err);
int format_tensor_verify(const struct format_reader *r, uint32_t tensor, const void *data,
                         struct sl_err *err);
/* format_slice_verify where the caller hashed the slice's bytes itself
 * (format_hash): `sum` is compared with the stored checksum (the same error),
 * then the slice is validated. */
int format_slice_verify_sum(const struct format_reader *r, uint32_t slice, const void *data,
                            uint64_t sum, struct sl_err *err);

/* The one structural validator of tensor bytes (the encoding's `validate`:
 * packed headers, widths and exact length; q8 scales and code range), with
 * the file and tensor named in the message (-EINVAL). Everything that reads
 * tensor data goes through it (inspect, run, mount, the loader: the read and
 * verify functions above call it after the checksum), so they never disagree
 * about a container. Slice: every tensor of slice `slice`, data = its bytes. */
int format_tensor_validate(const struct format_reader *r, uint32_t tensor, const void *data,
                           struct sl_err *err);
int format_slice_validate(const struct format_reader *r, uint32_t slice, const void *data,
                          struct sl_err *err);

/* ---- convenience ---------------------------------------------------------------- */

/* rows * cols of a tensor (1-D: shape[0]); the number of weights. */
uint64_t format_tensor_numel(const struct format_tensor_info *t);

/* Converts an F32/F16/BF16 tensor's bytes to float32 (n = numel). Returns
 * -EINVAL for other encodings. */
int format_decode_float(uint32_t encoding, const void *src, float *dst, uint64_t n);

#ifdef __cplusplus
}
#endif

#endif /* SLUICE_FORMAT_H */

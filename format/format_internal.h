/* format_internal.h: byte layout of container version 1, shared by the reader
 * and the writer. docs/FORMAT.md is the normative description; the offsets
 * here must match it. */
#ifndef SLUICE_FORMAT_INTERNAL_H
#define SLUICE_FORMAT_INTERNAL_H

#include "format.h"

/* "SLUICE", then 0x1A 0x0A as PNG does: catches text-mode transfers. */
#define FMT_MAGIC "SLUICE\x1a\n"
#define FMT_MAGIC_LEN 8
#define FMT_HEADER_SIZE 4096u

/* Header fields (byte offsets). */
enum {
    FMT_H_MAGIC = 0,          /* 8 bytes */
    FMT_H_VERSION = 8,        /* u32 */
    FMT_H_HEADER_SIZE = 12,   /* u32, 4096 */
    FMT_H_FILE_SIZE = 16,     /* u64 */
    FMT_H_DATA_OFFSET = 24,   /* u64, 4096 */
    FMT_H_DATA_LENGTH = 32,   /* u64, multiple of 4096 */
    FMT_H_META_OFFSET = 40,   /* u64 */
    FMT_H_META_LENGTH = 48,   /* u64: stored (maybe compressed) bytes */
    FMT_H_META_RAW = 56,      /* u64: bytes after decompression */
    FMT_H_META_COMP = 64,     /* u32: 0 none, 1 zstd */
    FMT_H_N_TENSORS = 68,     /* u32 */
    FMT_H_N_SLICES = 72,      /* u32 */
    FMT_H_FLAGS = 76,         /* u32, 0 */
    FMT_H_INDEX_OFFSET = 80,  /* u64 */
    FMT_H_INDEX_LENGTH = 88,  /* u64 */
    FMT_H_META_SUM = 96,      /* u64: XXH3-64 of the stored metadata bytes */
    FMT_H_INDEX_SUM = 104,    /* u64: XXH3-64 of the index bytes */
    FMT_H_CONFIG = 128,       /* struct format_config, 64 bytes (see below) */
    FMT_H_CHECKSUM = 4088,    /* u64: XXH3-64 of header bytes [0, 4088) */
};

/* Config block at FMT_H_CONFIG: 13 u32 then 2 f32, in the order of struct
 * format_config, then 4 reserved zero bytes. */
#define FMT_CONFIG_SIZE 64

enum { FMT_META_NONE = 0, FMT_META_ZSTD = 1 };

/* Tensor index entry (192 bytes). */
enum {
    FMT_T_NAME = 0,        /* 64 bytes, NUL-terminated, NUL-padded */
    FMT_T_LAYER = 64,      /* i32 */
    FMT_T_ROLE = 68,       /* u32 */
    FMT_T_ENCODING = 72,   /* u32 */
    FMT_T_NDIMS = 76,      /* u32 */
    FMT_T_SHAPE = 80,      /* 4 x u64 */
    FMT_T_OFFSET = 112,    /* u64 */
    FMT_T_LENGTH = 120,    /* u64 */
    FMT_T_CHECKSUM = 128,  /* u64 */
    FMT_T_ACT_SCALE = 136, /* f32 */
    FMT_T_SLICE = 140,     /* u32 */
    FMT_T_BITS_HIST = 144, /* 9 x u32 */
    FMT_T_SIZE = 192,      /* bytes 180..191 reserved, zero */
};

/* Slice table entry (48 bytes). */
enum {
    FMT_S_KIND = 0,        /* u32 */
    FMT_S_LAYER = 4,       /* i32 */
    FMT_S_OFFSET = 8,      /* u64 */
    FMT_S_LENGTH = 16,     /* u64 */
    FMT_S_CHECKSUM = 24,   /* u64 */
    FMT_S_FIRST = 32,      /* u32 */
    FMT_S_COUNT = 36,      /* u32 */
    FMT_S_SIZE = 48,       /* bytes 40..47 reserved, zero */
};

/* Upper bounds that keep a corrupt file from asking for absurd allocations. */
#define FMT_MAX_META_RAW (1ull << 30)
#define FMT_MAX_TENSORS (1u << 20)
#define FMT_MAX_SLICES (1u << 16)
#define FMT_MAX_KEY 255u

/* Serialization of the config block; parse validates nothing (the caller runs
 * format_config_validate). */
void fmt_config_store(uint8_t *p, const struct format_config *c);
void fmt_config_load(const uint8_t *p, struct format_config *c);

/* The slice a tensor belongs to, and its rank in execution order inside that
 * slice (strictly increasing within a slice). */
uint32_t fmt_tensor_slice_kind(const struct format_config *c, int32_t layer, uint32_t role);
int fmt_exec_rank(uint32_t role);

/* format_checksum's two ways: the system's libxxhash (the reference, and the
 * way without AVX-512 or where SLUICE_SIMD asks for less) and the same XXH3-64
 * compiled for AVX-512 (format_checksum_avx512.c, x86 only; call only where
 * sl_cpu_features()->avx512). The same value for every input. */
uint64_t fmt_checksum_portable(const void *data, size_t len);
uint64_t fmt_checksum_avx512(const void *data, size_t len);
/* format_hash's AVX-512 way (the same XXH3 streaming state, compiled for
 * AVX-512; call only where sl_cpu_features()->avx512): NULL when out of memory */
void *fmt_hash_avx512_new(void);
void fmt_hash_avx512_reset(void *st);
void fmt_hash_avx512_update(void *st, const void *data, size_t len);
uint64_t fmt_hash_avx512_digest(const void *st);
void fmt_hash_avx512_free(void *st);

/* Checks a tensor description against the config and its encoding (not the
 * bytes), and its act_scale against format_act_scale_valid(); `what` names
 * the file. */
int fmt_check_tensor_meta(const struct format_config *c, const char *name, int32_t layer,
                          uint32_t role, uint32_t encoding, uint32_t n_dims, const uint64_t *shape,
                          uint64_t length, float act_scale, const char *what, struct sl_err *err);

/* Validators of the packed encodings, for the traits table. */
#include "format_enc_packed.h"

#endif

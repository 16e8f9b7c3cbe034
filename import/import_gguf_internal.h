/* import_gguf_internal.h: what the files of the GGUF importer share
 * (import_gguf.c: opening, the header and tensor infos; import_gguf_cur.c:
 * the bounds-checked cursor over the mapped file; import_gguf_meta.c: the
 * metadata, vocabulary and hyperparameters; import_gguf_tensors.c: the
 * tensors' names, types, shapes and tiling). */
#ifndef SLUICE_IMPORT_GGUF_INTERNAL_H
#define SLUICE_IMPORT_GGUF_INTERNAL_H

#include "import_internal.h"

enum {
    GGUF_U8 = 0,
    GGUF_I8,
    GGUF_U16,
    GGUF_I16,
    GGUF_U32,
    GGUF_I32,
    GGUF_F32,
    GGUF_BOOL,
    GGUF_STRING,
    GGUF_ARRAY,
    GGUF_U64,
    GGUF_I64,
    GGUF_F64,
    GGUF_NTYPES
};

enum {
    GGML_F32 = 0,
    GGML_F16 = 1,
    GGML_Q8_0 = 8,
    GGML_Q4_K = 12,
    GGML_Q5_K = 13,
    GGML_Q6_K = 14,
    GGML_BF16 = 30
};

/* A cursor over the mapped file: every read is checked against end; the
 * first failure sets bad and the error, and later reads fail at once. */
struct qg_cur {
    const uint8_t *p, *end;
    const char *path;
    struct sl_err *err;
    int bad;
};

int qg_need(struct qg_cur *c, uint64_t n, const char *what);
uint32_t qg_rd32(struct qg_cur *c, const char *what);
uint64_t qg_rd64(struct qg_cur *c, const char *what);
/* A string as (pointer, length) into the file. */
const char *qg_rdstr(struct qg_cur *c, uint64_t *len, const char *what);
/* Skips a value of the type (arrays nested at most 4 deep). 0 or -1. */
int qg_skip_value(struct qg_cur *c, uint32_t type, int depth);
/* An integer (any GGUF integer type) or a float (F32, F64): 0, -1 (the
 * cursor failed), 1 (the value is not of that kind; nothing read). */
int qg_rd_int(struct qg_cur *c, uint32_t type, uint64_t *v);
int qg_rd_float(struct qg_cur *c, uint32_t type, double *v);
/* The key (k, n) is want. */
int qg_key_is(const char *k, uint64_t n, const char *want);

struct gguf_tensor {
    const char *name;
    uint64_t name_len;
    uint32_t n_dims;
    uint64_t ne[4];
    uint32_t type;
    uint64_t offset;
};

struct gguf {
    struct qi_source src;
    const uint8_t *data;
    uint64_t size;
    struct gguf_tensor *tensors;
    uint64_t n_tensors;
    const uint8_t *tensor_data;
    uint64_t tensor_data_len;
    int dedup_classifier; /* output.weight equals token_embd.weight: store once (tied) */
};

int qg_read_meta(struct qg_cur *c, struct qi_source *s, uint64_t n_kv, uint64_t *align_out);

const struct gguf_tensor *qg_find_tensor(const struct gguf *g, const char *name);
/* The view of a tensor info as rows x cols of the config, its type, shape
 * and bounds checked. */
int qg_tensor_view(struct gguf *g, const struct gguf_tensor *gt, struct qi_tensor *t, uint64_t rows,
                   uint64_t cols, const char *name, struct sl_err *err);
/* Every tensor must be one the model uses, appear once, and be there. */
int qg_check_tensor_names(const struct gguf *g, struct sl_err *err);
int qg_check_tiling(struct gguf *g, uint64_t align, struct sl_err *err);
/* The qi_source hooks. */
int qg_tensor(struct qi_source *s, int layer, uint32_t role, struct qi_tensor *t,
              struct sl_err *err);
void qg_destroy(struct qi_source *s);

#endif

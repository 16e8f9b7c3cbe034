/* import_gguf.c: GGUF v2/v3 files of the llama architecture (the
 * layout of ggml-org/ggml docs/gguf.md): metadata key-value pairs, tensor
 * infos, aligned tensor data. Tensor types F32, F16, BF16, Q8_0 and the
 * K-quants Q4_K, Q5_K, Q6_K (dequantized exactly: import_kquant.c). Every
 * length and offset is checked against the mapped file before use. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

struct cur {
    const uint8_t *p, *end;
    const char *path;
    struct sl_err *err;
    int bad;
};

static int need(struct cur *c, uint64_t n, const char *what)
{
    if (c->bad)
        return -1;
    if ((uint64_t)(c->end - c->p) < n) {
        sl_err_set(c->err, "%s: truncated GGUF file (while reading %s)", c->path, what);
        c->bad = 1;
        return -1;
    }
    return 0;
}

static uint32_t rd32(struct cur *c, const char *what)
{
    if (need(c, 4, what))
        return 0;
    uint32_t v = sl_load_le32(c->p);
    c->p += 4;
    return v;
}

static uint64_t rd64(struct cur *c, const char *what)
{
    if (need(c, 8, what))
        return 0;
    uint64_t v = sl_load_le64(c->p);
    c->p += 8;
    return v;
}

/* A string as (pointer, length) into the file. */
static const char *rdstr(struct cur *c, uint64_t *len, const char *what)
{
    uint64_t n = rd64(c, what);
    if (need(c, n, what))
        return NULL;
    const char *s = (const char *)c->p;
    c->p += n;
    *len = n;
    return s;
}

static uint64_t scalar_size(uint32_t t)
{
    static const uint8_t sz[GGUF_NTYPES] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return t < GGUF_NTYPES ? sz[t] : 0;
}

static int skip_value(struct cur *c, uint32_t type, int depth)
{
    if (type == GGUF_STRING) {
        uint64_t n;
        return rdstr(c, &n, "a string value") ? 0 : -1;
    }
    if (type == GGUF_ARRAY) {
        if (depth > 4) {
            sl_err_set(c->err, "%s: GGUF arrays nested too deeply", c->path);
            return -1;
        }
        uint32_t et = rd32(c, "an array type");
        uint64_t n = rd64(c, "an array length");
        if (c->bad)
            return -1;
        uint64_t es = scalar_size(et);
        if (es) {
            if (n > UINT64_MAX / es) {
                sl_err_set(c->err, "%s: truncated GGUF file (an array of %" PRIu64 " values)",
                           c->path, n);
                return c->bad = 1, -1;
            }
            if (need(c, n * es, "an array"))
                return -1;
            c->p += n * es;
            return 0;
        }
        for (uint64_t i = 0; i < n; i++)
            if (skip_value(c, et, depth + 1))
                return -1;
        return 0;
    }
    uint64_t s = scalar_size(type);
    if (!s) {
        sl_err_set(c->err, "%s: unknown GGUF value type %u", c->path, type);
        return c->bad = 1, -1;
    }
    if (need(c, s, "a value"))
        return -1;
    c->p += s;
    return 0;
}

/* Reads an integer of any GGUF integer type. */
static int rd_int(struct cur *c, uint32_t type, uint64_t *v)
{
    switch (type) {
    case GGUF_U8:
    case GGUF_I8:
    case GGUF_BOOL:
        if (need(c, 1, "an integer"))
            return -1;
        *v = type == GGUF_I8 ? (uint64_t)(int64_t)(int8_t)c->p[0] : c->p[0];
        c->p += 1;
        return 0;
    case GGUF_U16:
    case GGUF_I16:
        if (need(c, 2, "an integer"))
            return -1;
        *v = sl_load_le16(c->p);
        c->p += 2;
        return 0;
    case GGUF_U32:
    case GGUF_I32:
        *v = rd32(c, "an integer");
        return c->bad ? -1 : 0;
    case GGUF_U64:
    case GGUF_I64:
        *v = rd64(c, "an integer");
        return c->bad ? -1 : 0;
    default:
        return 1; /* not an integer */
    }
}

static int rd_float(struct cur *c, uint32_t type, double *v)
{
    if (type == GGUF_F32) {
        if (need(c, 4, "a float"))
            return -1;
        *v = sl_load_lef32(c->p);
        c->p += 4;
        return 0;
    }
    if (type == GGUF_F64) {
        uint64_t u = rd64(c, "a float");
        memcpy(v, &u, 8);
        return c->bad ? -1 : 0;
    }
    return 1;
}

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

static int key_is(const char *k, uint64_t n, const char *want)
{
    return strlen(want) == n && !memcmp(k, want, n);
}

static const struct gguf_tensor *find_tensor(const struct gguf *g, const char *name)
{
    size_t n = strlen(name);
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (g->tensors[i].name_len == n && !memcmp(g->tensors[i].name, name, n))
            return &g->tensors[i];
    return NULL;
}

static int tensor_view(struct gguf *g, const struct gguf_tensor *gt, struct qi_tensor *t,
                       uint64_t rows, uint64_t cols, const char *name, struct sl_err *err)
{
    const char *path = g->src.path;
    switch (gt->type) {
    case GGML_F32:
        t->type = QI_F32;
        break;
    case GGML_F16:
        t->type = QI_F16;
        break;
    case GGML_BF16:
        t->type = QI_BF16;
        break;
    case GGML_Q8_0:
        t->type = QI_Q8_0;
        break;
    case GGML_Q4_K:
        t->type = QI_Q4_K;
        break;
    case GGML_Q5_K:
        t->type = QI_Q5_K;
        break;
    case GGML_Q6_K:
        t->type = QI_Q6_K;
        break;
    default:
        sl_err_set(err,
                   "%s: tensor '%s' has ggml type %u; supported: F32 (0), F16 (1), Q8_0 (8), "
                   "Q4_K (12), Q5_K (13), Q6_K (14), BF16 (30)",
                   path, name, gt->type);
        return -EINVAL;
    }
    /* ggml order: ne[0] is the fastest dimension (columns) */
    int ok = cols == 1 ? (gt->n_dims == 1 && gt->ne[0] == rows)
                       : (gt->n_dims == 2 && gt->ne[0] == cols && gt->ne[1] == rows);
    if (!ok) {
        sl_err_set(err,
                   "%s: tensor '%s' has shape [%" PRIu64 ", %" PRIu64 "] (ggml order), the "
                   "config implies [%" PRIu64 ", %" PRIu64 "]",
                   path, name, gt->ne[0], gt->n_dims > 1 ? gt->ne[1] : 1, cols, rows);
        return -EINVAL;
    }
    /* blocks run along ne[0]: the row length (a 1-D tensor's length) */
    uint64_t ne0 = cols == 1 ? rows : cols;
    if (qi_type_is_block(t->type) && ne0 % qi_block_weights(t->type)) {
        sl_err_set(
            err, "%s: %s tensor '%s' has rows of %" PRIu64 " values, not a multiple of %" PRIu64,
            path, t->type == QI_Q8_0 ? "Q8_0" : "K-quant", name, ne0, qi_block_weights(t->type));
        return -EINVAL;
    }
    uint64_t bytes = qi_type_bytes(t->type, rows * cols);
    if (gt->offset > g->tensor_data_len || bytes > g->tensor_data_len - gt->offset) {
        sl_err_set(err,
                   "%s: tensor '%s' [%" PRIu64 ", +%" PRIu64 ") lies outside the data "
                   "section (%" PRIu64 " bytes): truncated file?",
                   path, name, gt->offset, bytes, g->tensor_data_len);
        return -EINVAL;
    }
    t->data = g->tensor_data + gt->offset;
    t->len = bytes;
    t->rows = rows;
    t->cols = cols;
    t->hf_rope_heads = 0;
    return 0;
}

/* Slot of a tensor name among those of a plain Llama model of n_layers
 * layers: 9 per layer, then token_embd, output_norm, output; -1 for any other
 * name (biases, rope_freqs.weight, ...: they change what the model computes,
 * so they are refused rather than dropped). */
static int64_t name_slot(const char *name, uint64_t len, uint32_t n_layers)
{
    static const char *const glob[3] = {"token_embd.weight", "output_norm.weight",
                                        "output.weight"};
    for (int i = 0; i < 3; i++)
        if (key_is(name, len, glob[i]))
            return (int64_t)n_layers * 9 + i;
    if (len < 5 || memcmp(name, "blk.", 4))
        return -1;
    uint64_t k = 4, layer = 0;
    while (k < len && name[k] >= '0' && name[k] <= '9' && k < 14)
        layer = layer * 10 + (uint64_t)(name[k++] - '0');
    if (k == 4 || k >= len || name[k] != '.' || layer >= n_layers || (name[4] == '0' && k > 5))
        return -1;
    k++;
    for (uint32_t r = 0; r < 9; r++) {
        char want[64];
        format_tensor_name(-1, FORMAT_ROLE_ATTN_NORM + r, want, sizeof want);
        if (key_is(name + k, len - k, want))
            return (int64_t)layer * 9 + r;
    }
    return -1;
}

/* Every tensor must be one the model uses, appear once, and be there. */
static int check_tensor_names(const struct gguf *g, struct sl_err *err)
{
    uint32_t L = g->src.cfg.n_layers;
    uint8_t *seen = calloc((size_t)L * 9 + 3, 1);
    if (!seen) {
        sl_err_set(err, "%s: out of memory", g->src.path);
        return -ENOMEM;
    }
    int ret = 0;
    for (uint64_t i = 0; i < g->n_tensors && !ret; i++) {
        const struct gguf_tensor *t = &g->tensors[i];
        int64_t slot = name_slot(t->name, t->name_len, L);
        int nl = (int)(t->name_len > 64 ? 64 : t->name_len);
        if (slot < 0) {
            sl_err_set(err,
                       "%s: tensor '%.*s' is not part of a %u-layer Llama model (biases, "
                       "rope_freqs and other extras are not supported)",
                       g->src.path, nl, t->name, L);
            ret = -EINVAL;
        } else if (seen[slot]++) {
            sl_err_set(err, "%s: tensor '%.*s' appears twice", g->src.path, nl, t->name);
            ret = -EINVAL;
        }
    }
    /* every tensor the model needs (output.weight is optional: tied) */
    for (uint64_t slot = 0; slot < (uint64_t)L * 9 + 2 && !ret; slot++) {
        if (seen[slot])
            continue;
        char name[FORMAT_NAME_MAX];
        if (slot < (uint64_t)L * 9)
            format_tensor_name((int)(slot / 9), FORMAT_ROLE_ATTN_NORM + (uint32_t)(slot % 9), name,
                               sizeof name);
        else
            format_tensor_name(-1, slot == (uint64_t)L * 9 ? FORMAT_ROLE_TOK_EMBD
                                                           : FORMAT_ROLE_OUT_NORM,
                               name, sizeof name);
        sl_err_set(err, "%s: tensor '%s' is missing", g->src.path, name);
        ret = -EINVAL;
    }
    free(seen);
    return ret;
}

static int shape_of(const struct format_config *c, uint32_t role, uint64_t *rows, uint64_t *cols)
{
    uint32_t nd;
    uint64_t sh[2];
    if (format_role_shape(c, role, &nd, sh) < 0)
        return -EINVAL;
    *rows = sh[0];
    *cols = nd == 2 ? sh[1] : 1;
    return 0;
}

static int by_offset(const void *x, const void *y)
{
    const struct gguf_tensor *const *p = x, *const *q = y;
    return (*p)->offset < (*q)->offset ? -1 : (*p)->offset > (*q)->offset;
}

/* The tensors tile the data section exactly: each one's byte size from its
 * type and dimensions (overflow-checked), sorted by offset the first at 0 and
 * each next one at the previous end rounded up to the alignment, the last
 * ending in the section's final alignment unit (no gap, no overlap, nothing
 * past the end, nothing left over). Before any tensor is read. */
static int check_tiling(struct gguf *g, uint64_t align, struct sl_err *err)
{
    const char *path = g->src.path;
    uint32_t L = g->src.cfg.n_layers;
    const struct gguf_tensor **order = calloc(g->n_tensors ? g->n_tensors : 1, sizeof *order);
    uint64_t *ends = calloc(g->n_tensors ? g->n_tensors : 1, sizeof *ends);
    int ret = -EINVAL;
    if (!order || !ends) {
        sl_err_set(err, "%s: out of memory", path);
        ret = -ENOMEM;
        goto out;
    }
    for (uint64_t i = 0; i < g->n_tensors; i++)
        order[i] = &g->tensors[i];
    qsort(order, g->n_tensors, sizeof *order, by_offset);
    /* each tensor alone first: type, shape against the config, bounds */
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const struct gguf_tensor *t = order[i];
        char name[FORMAT_NAME_MAX];
        snprintf(name, sizeof name, "%.*s", (int)(t->name_len > 64 ? 64 : t->name_len), t->name);
        int64_t slot = name_slot(t->name, t->name_len, L);
        uint32_t role = slot < (int64_t)L * 9       ? FORMAT_ROLE_ATTN_NORM + (uint32_t)(slot % 9)
                        : slot == (int64_t)L * 9 + 1 ? FORMAT_ROLE_OUT_NORM
                                                     : FORMAT_ROLE_TOK_EMBD;
        uint64_t rows, cols;
        struct qi_tensor view;
        if (slot < 0 || shape_of(&g->src.cfg, role, &rows, &cols) < 0 ||
            tensor_view(g, t, &view, rows, cols, name, err) < 0)
            goto out;
        ends[i] = t->offset + view.len; /* inside the section: no overflow */
    }
    /* then together: each at the previous end, aligned */
    uint64_t next = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const struct gguf_tensor *t = order[i];
        int nl = (int)(t->name_len > 64 ? 64 : t->name_len);
        if (t->offset != next) {
            if (i == 0)
                sl_err_set(err,
                           "%s: the data section does not start with a tensor ('%.*s' is at "
                           "%" PRIu64 ")",
                           path, nl, t->name, t->offset);
            else
                sl_err_set(err,
                           "%s: tensor '%.*s' is at %" PRIu64 " but the one before it ends at "
                           "%" PRIu64 " (%s): the tensors must tile the data section",
                           path, nl, t->name, t->offset, ends[i - 1],
                           t->offset > next ? "a gap" : "an overlap");
            goto out;
        }
        next = sl_align_up(ends[i], align);
    }
    uint64_t last = g->n_tensors ? ends[g->n_tensors - 1] : 0;
    if (g->tensor_data_len > sl_align_up(last, align)) {
        sl_err_set(err,
                   "%s: %" PRIu64 " bytes after the last tensor (which ends at %" PRIu64
                   " of the data section): the tensors must tile it",
                   path, g->tensor_data_len - last, last);
        goto out;
    }
    ret = 0;
out:
    free(order);
    free(ends);
    return ret;
}

static int gguf_tensor(struct qi_source *s, int layer, uint32_t role, struct qi_tensor *t,
                       struct sl_err *err)
{
    struct gguf *g = s->priv;
    char name[FORMAT_NAME_MAX];
    uint32_t lookup = role;
    if (role == FORMAT_ROLE_TOK_EMBD || (role == FORMAT_ROLE_CLASSIFIER && g->dedup_classifier))
        lookup = FORMAT_ROLE_TOK_EMBD;
    format_tensor_name(layer, lookup, name, sizeof name);
    const struct gguf_tensor *gt = find_tensor(g, name);
    if (!gt) {
        sl_err_set(err, "%s: tensor '%s' is missing", s->path, name);
        return -EINVAL;
    }
    uint64_t rows, cols;
    if (shape_of(&s->cfg, role == FORMAT_ROLE_CLASSIFIER ? FORMAT_ROLE_TOK_EMBD : role, &rows,
                 &cols) < 0) {
        sl_err_set(err, "%s: no shape for '%s'", s->path, name);
        return -EINVAL;
    }
    return tensor_view(g, gt, t, rows, cols, name, err);
}

static void gguf_destroy(struct qi_source *s)
{
    struct gguf *g = s->priv;
    qi_unmap(g->data, g->size);
    import_vocab_free(&s->vocab);
    free(g->tensors);
    free(g);
}

/* Copies the vocabulary arrays (tokens as strings, scores as f32). */
static int read_vocab_tokens(struct cur *c, struct qi_source *s, struct sl_err *err)
{
    uint32_t et = rd32(c, "the token array type");
    uint64_t n = rd64(c, "the token count");
    if (c->bad)
        return -EINVAL;
    if (et != GGUF_STRING || n == 0 || n > (1u << 24)) {
        sl_err_set(err, "%s: tokenizer.ggml.tokens is not a list of 1..16M strings", s->path);
        return -EINVAL;
    }
    if (n > (uint64_t)(c->end - c->p) / 8) { /* each string has an 8-byte length */
        sl_err_set(err, "%s: %" PRIu64 " tokens do not fit in the rest of the file", s->path, n);
        return -EINVAL;
    }
    struct import_vocab *v = &s->vocab;
    import_vocab_free(v);
    if (qi_vocab_alloc(v, n) < 0) {
        sl_err_set(err, "%s: out of memory", s->path);
        return -ENOMEM;
    }
    for (uint64_t i = 0; i < n; i++) {
        uint64_t len;
        const char *str = rdstr(c, &len, "a token");
        if (!str)
            return -EINVAL;
        if (len > 65535) {
            sl_err_set(err, "%s: token %" PRIu64 " is %" PRIu64 " bytes long", s->path, i, len);
            return -EINVAL;
        }
        char *d = malloc(len + 1);
        if (!d) {
            sl_err_set(err, "%s: out of memory", s->path);
            return -ENOMEM;
        }
        /* SentencePiece marks spaces with U+2581; llama2.c vocabularies use ' '. */
        uint64_t k = 0;
        for (uint64_t j = 0; j < len; j++) {
            if (j + 2 < len && (uint8_t)str[j] == 0xe2 && (uint8_t)str[j + 1] == 0x96 &&
                (uint8_t)str[j + 2] == 0x81) {
                d[k++] = ' ';
                j += 2;
            } else {
                d[k++] = str[j];
            }
        }
        d[k] = 0;
        v->strs[i] = d;
        v->lens[i] = (uint32_t)k;
    }
    return 0;
}

/* The scores array at c (its type and count first); after the tokens. */
static int read_vocab_scores(struct cur *c, struct qi_source *s, struct sl_err *err)
{
    uint32_t et = rd32(c, "the score array type");
    uint64_t n = rd64(c, "the score count");
    if (c->bad)
        return -EINVAL;
    if (et != GGUF_F32 || n > (1u << 24) || need(c, n * 4, "the scores")) {
        sl_err_set(err, "%s: tokenizer.ggml.scores is not a list of f32", s->path);
        return -EINVAL;
    }
    if (n != s->vocab.tok.n_tokens) {
        sl_err_set(err, "%s: %" PRIu64 " token scores for %u tokens", s->path, n,
                   s->vocab.tok.n_tokens);
        return -EINVAL;
    }
    for (uint64_t i = 0; i < n; i++)
        s->vocab.scores[i] = sl_load_lef32(c->p + 4 * i);
    c->p += n * 4;
    return 0;
}

int qi_open_gguf(const char *path, const struct import_opts *o, struct qi_source **out,
                 struct sl_err *err)
{
    (void)o;
    struct gguf *g = qi_source_new(sizeof *g, path, "gguf", gguf_tensor, gguf_destroy, err);
    if (!g)
        return -ENOMEM;
    struct qi_source *s = &g->src;
    int ret = qi_map_file(path, &g->data, &g->size, err);
    if (ret < 0) {
        free(g);
        return ret;
    }
    ret = -EINVAL;
    struct cur c = {g->data, g->data + g->size, path, err, 0};
    if (g->size < 4 || memcmp(g->data, "GGUF", 4)) {
        sl_err_set(err, "%s: not a GGUF file (bad magic)", path);
        goto fail;
    }
    c.p += 4;
    uint32_t version = rd32(&c, "the version");
    if (c.bad)
        goto fail;
    if (version != 2 && version != 3) {
        sl_err_set(err, "%s: GGUF version %u; supported: 2 and 3", path, version);
        goto fail;
    }
    uint64_t n_tensors = rd64(&c, "the tensor count");
    uint64_t n_kv = rd64(&c, "the key-value count");
    if (c.bad)
        goto fail;
    if (n_tensors > (1u << 20) || n_kv > (1u << 20)) {
        sl_err_set(err, "%s: implausible GGUF counts (%" PRIu64 " tensors, %" PRIu64 " keys)", path,
                   n_tensors, n_kv);
        goto fail;
    }
    uint64_t dim = 0, hidden = 0, layers = 0, heads = 0, kv_heads = 0, ctx = 0, align = 32;
    uint64_t bos = 1, eos = 2;
    double theta = 10000.0, eps = 1e-5;
    uint64_t rope_dims = 0, key_len = 0, value_len = 0; /* 0: absent (= head size) */
    const uint8_t *scores_at = NULL;
    int have_arch = 0, have_kvh = 0;
    for (uint64_t i = 0; i < n_kv; i++) {
        uint64_t kl;
        const char *k = rdstr(&c, &kl, "a metadata key");
        uint32_t type = rd32(&c, "a metadata type");
        if (!k || c.bad)
            goto fail;
        uint64_t *ip = NULL;
        double *fp = NULL;
        if (key_is(k, kl, "general.architecture")) {
            uint64_t vl;
            const char *v = type == GGUF_STRING ? rdstr(&c, &vl, "the architecture") : NULL;
            if (!v) {
                if (!c.bad)
                    sl_err_set(err, "%s: general.architecture is not a string", path);
                goto fail;
            }
            if (vl != 5 || memcmp(v, "llama", 5)) {
                sl_err_set(err, "%s: architecture '%.*s' is not supported (only llama)", path,
                           (int)(vl > 64 ? 64 : vl), v);
                goto fail;
            }
            have_arch = 1;
            continue;
        }
        if (key_is(k, kl, "tokenizer.ggml.tokens") && type == GGUF_ARRAY) {
            ret = read_vocab_tokens(&c, s, err);
            if (ret < 0)
                goto fail;
            ret = -EINVAL;
            continue;
        }
        if (key_is(k, kl, "tokenizer.chat_template") && type == GGUF_STRING) {
            /* kept as metadata for the chat (sluice chat, sluice serve) */
            s->chat_template = rdstr(&c, &s->chat_template_len, "the chat template");
            if (!s->chat_template)
                goto fail;
            continue;
        }
        if (key_is(k, kl, "tokenizer.ggml.scores") && type == GGUF_ARRAY) {
            scores_at = c.p; /* read once the tokens are known (keys come in any order) */
            if (skip_value(&c, type, 0))
                goto fail;
            continue;
        }
        if (key_is(k, kl, "tokenizer.ggml.model") || key_is(k, kl, "llama.rope.scaling.type")) {
            /* strings whose other values change what the model computes */
            int tokm = key_is(k, kl, "tokenizer.ggml.model");
            uint64_t vl;
            const char *v = type == GGUF_STRING ? rdstr(&c, &vl, "a metadata string") : NULL;
            if (!v) {
                if (!c.bad)
                    sl_err_set(err, "%s: metadata '%.*s' is not a string", path, (int)kl, k);
                goto fail;
            }
            const char *ok = tokm ? "llama" : "none";
            if (vl != strlen(ok) || memcmp(v, ok, vl)) {
                sl_err_set(err,
                           tokm ? "%s: tokenizer.ggml.model '%.*s' is not supported (only "
                                  "'llama', the SentencePiece vocabulary with merge scores)"
                                : "%s: llama.rope.scaling.type '%.*s' is not supported (only "
                                  "'none')",
                           path, (int)(vl > 64 ? 64 : vl), v);
                goto fail;
            }
            continue;
        }
        if (key_is(k, kl, "llama.embedding_length"))
            ip = &dim;
        else if (key_is(k, kl, "llama.feed_forward_length"))
            ip = &hidden;
        else if (key_is(k, kl, "llama.block_count"))
            ip = &layers;
        else if (key_is(k, kl, "llama.attention.head_count"))
            ip = &heads;
        else if (key_is(k, kl, "llama.attention.head_count_kv"))
            ip = &kv_heads, have_kvh = 1;
        else if (key_is(k, kl, "llama.context_length"))
            ip = &ctx;
        else if (key_is(k, kl, "llama.rope.dimension_count"))
            ip = &rope_dims;
        else if (key_is(k, kl, "llama.attention.key_length"))
            ip = &key_len;
        else if (key_is(k, kl, "llama.attention.value_length"))
            ip = &value_len;
        else if (key_is(k, kl, "general.alignment"))
            ip = &align;
        else if (key_is(k, kl, "tokenizer.ggml.bos_token_id"))
            ip = &bos;
        else if (key_is(k, kl, "tokenizer.ggml.eos_token_id"))
            ip = &eos;
        else if (key_is(k, kl, "llama.rope.freq_base"))
            fp = &theta;
        else if (key_is(k, kl, "llama.attention.layer_norm_rms_epsilon"))
            fp = &eps;
        if (ip) {
            int r = rd_int(&c, type, ip);
            if (r < 0)
                goto fail;
            if (r > 0) {
                sl_err_set(err, "%s: metadata '%.*s' is not an integer", path, (int)kl, k);
                goto fail;
            }
        } else if (fp) {
            int r = rd_float(&c, type, fp);
            if (r < 0)
                goto fail;
            if (r > 0) {
                sl_err_set(err, "%s: metadata '%.*s' is not a float", path, (int)kl, k);
                goto fail;
            }
        } else if (skip_value(&c, type, 0)) {
            goto fail;
        }
    }
    if (!have_arch) {
        sl_err_set(err, "%s: no general.architecture key", path);
        goto fail;
    }
    if (!s->vocab.tok.n_tokens) {
        sl_err_set(err, "%s: no vocabulary (tokenizer.ggml.tokens)", path);
        goto fail;
    }
    if (scores_at) {
        struct cur sc = {scores_at, g->data + g->size, path, err, 0};
        ret = read_vocab_scores(&sc, s, err);
        if (ret < 0)
            goto fail;
        ret = -EINVAL;
    }
    if (!have_kvh)
        kv_heads = heads;
    if (!dim || !hidden || !layers || !heads || !kv_heads || !ctx || dim > UINT32_MAX ||
        hidden > UINT32_MAX || layers > UINT32_MAX || heads > UINT32_MAX || kv_heads > UINT32_MAX ||
        ctx > UINT32_MAX || dim % heads) {
        sl_err_set(err,
                   "%s: missing or inconsistent llama.* hyperparameters (dim %" PRIu64
                   ", ffn %" PRIu64 ", layers %" PRIu64 ", heads %" PRIu64 "/%" PRIu64 ")",
                   path, dim, hidden, layers, heads, kv_heads);
        goto fail;
    }
    /* the container's head size is dim / heads, rotated whole */
    const struct {
        const char *key;
        uint64_t v;
    } hd_keys[] = {{"llama.rope.dimension_count", rope_dims},
                   {"llama.attention.key_length", key_len},
                   {"llama.attention.value_length", value_len}};
    for (size_t i = 0; i < sizeof hd_keys / sizeof hd_keys[0]; i++) {
        if (hd_keys[i].v && hd_keys[i].v != dim / heads) {
            sl_err_set(err,
                       "%s: %s is %" PRIu64 ", the head size is %" PRIu64
                       " (partial rotary or odd head sizes are not supported)",
                       path, hd_keys[i].key, hd_keys[i].v, dim / heads);
            goto fail;
        }
    }
    if (align == 0 || (align & (align - 1)) || align > 65536) {
        sl_err_set(err, "%s: general.alignment %" PRIu64 " is not a power of two", path, align);
        goto fail;
    }
    /* a tensor's info is at least 28 bytes: the header cannot make us
     * allocate more than the file's size warrants */
    if (n_tensors > (uint64_t)(c.end - c.p) / 28) {
        sl_err_set(err, "%s: %" PRIu64 " tensors do not fit in the rest of the file", path,
                   n_tensors);
        goto fail;
    }
    g->tensors = calloc(n_tensors ? n_tensors : 1, sizeof *g->tensors);
    if (!g->tensors) {
        sl_err_set(err, "%s: out of memory", path);
        goto fail;
    }
    g->n_tensors = n_tensors;
    for (uint64_t i = 0; i < n_tensors; i++) {
        struct gguf_tensor *t = &g->tensors[i];
        t->name = rdstr(&c, &t->name_len, "a tensor name");
        t->n_dims = rd32(&c, "tensor dimensions");
        if (c.bad)
            goto fail;
        if (t->n_dims == 0 || t->n_dims > 4) {
            sl_err_set(err, "%s: tensor '%.*s' has %u dimensions", path,
                       (int)(t->name_len > 64 ? 64 : t->name_len), t->name, t->n_dims);
            goto fail;
        }
        for (uint32_t d = 0; d < t->n_dims; d++)
            t->ne[d] = rd64(&c, "a tensor dimension");
        t->type = rd32(&c, "a tensor type");
        t->offset = rd64(&c, "a tensor offset");
        if (c.bad)
            goto fail;
        if (t->offset % align) {
            sl_err_set(err, "%s: tensor '%.*s' offset %" PRIu64 " is not aligned to %" PRIu64, path,
                       (int)(t->name_len > 64 ? 64 : t->name_len), t->name, t->offset, align);
            goto fail;
        }
    }
    uint64_t data_off = sl_align_up((uint64_t)(c.p - g->data), align);
    if (data_off > g->size) {
        sl_err_set(err, "%s: truncated GGUF file (no tensor data)", path);
        goto fail;
    }
    g->tensor_data = g->data + data_off;
    g->tensor_data_len = g->size - data_off;

    struct format_config *cfg = &s->cfg;
    *cfg = (struct format_config){.arch = FORMAT_ARCH_LLAMA,
                                  .dim = (uint32_t)dim,
                                  .hidden_dim = (uint32_t)hidden,
                                  .n_layers = (uint32_t)layers,
                                  .n_heads = (uint32_t)heads,
                                  .n_kv_heads = (uint32_t)kv_heads,
                                  .head_dim = (uint32_t)(dim / heads),
                                  .vocab_size = s->vocab.tok.n_tokens,
                                  .seq_len = (uint32_t)ctx,
                                  .rope_layout = FORMAT_ROPE_INTERLEAVED,
                                  .bos_id = (uint32_t)bos,
                                  .eos_id = (uint32_t)eos,
                                  .rope_theta = (float)theta,
                                  .norm_eps = (float)eps};
    qi_vocab_publish(&s->vocab);
    /* Tied when there is no classifier, or when it is a byte-identical copy of
     * the embedding (llama.cpp's llama2.c converter writes both). */
    const struct gguf_tensor *emb = find_tensor(g, "token_embd.weight");
    const struct gguf_tensor *cls = find_tensor(g, "output.weight");
    if (!emb) {
        sl_err_set(err, "%s: tensor 'token_embd.weight' is missing", path);
        goto fail;
    }
    cfg->tied_embedding = cls == NULL;
    ret = format_config_validate(cfg, path, err);
    if (ret == 0)
        ret = check_tensor_names(g, err);
    if (ret == 0)
        ret = check_tiling(g, align, err);
    if (ret < 0)
        goto fail;
    ret = -EINVAL;
    if (cls) {
        struct qi_tensor a, b;
        uint64_t rows = cfg->vocab_size, cols = cfg->dim;
        if (tensor_view(g, emb, &a, rows, cols, "token_embd.weight", err) < 0 ||
            tensor_view(g, cls, &b, rows, cols, "output.weight", err) < 0)
            goto fail;
        if (a.type == b.type && a.len == b.len && !memcmp(a.data, b.data, a.len)) {
            cfg->tied_embedding = 1;
            g->dedup_classifier = 1;
        }
    }
    *out = s;
    return 0;
fail:
    gguf_destroy(s);
    return ret;
}

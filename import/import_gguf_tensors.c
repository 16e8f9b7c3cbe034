/* import_gguf_tensors.c: the GGUF importer's tensors: the lookup by name,
 * the view of one (type, shape against the config, bounds), the names a
 * plain Llama model has (each once, none missing), and the tiling of the
 * data section (no gap, no overlap, nothing left over). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "import_gguf_internal.h"

const struct gguf_tensor *qg_find_tensor(const struct gguf *g, const char *name)
{
    size_t n = strlen(name);
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (g->tensors[i].name_len == n && !memcmp(g->tensors[i].name, name, n))
            return &g->tensors[i];
    return NULL;
}

int qg_tensor_view(struct gguf *g, const struct gguf_tensor *gt, struct qi_tensor *t, uint64_t rows,
                   uint64_t cols, const char *name, struct sl_err *err)
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
    static const char *const glob[3] = {"token_embd.weight", "output_norm.weight", "output.weight"};
    for (int i = 0; i < 3; i++)
        if (qg_key_is(name, len, glob[i]))
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
        if (qg_key_is(name + k, len - k, want))
            return (int64_t)layer * 9 + r;
    }
    return -1;
}

/* Every tensor must be one the model uses, appear once, and be there. */
int qg_check_tensor_names(const struct gguf *g, struct sl_err *err)
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
            format_tensor_name(
                -1, slot == (uint64_t)L * 9 ? FORMAT_ROLE_TOK_EMBD : FORMAT_ROLE_OUT_NORM, name,
                sizeof name);
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
int qg_check_tiling(struct gguf *g, uint64_t align, struct sl_err *err)
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
        uint32_t role = slot < (int64_t)L * 9        ? FORMAT_ROLE_ATTN_NORM + (uint32_t)(slot % 9)
                        : slot == (int64_t)L * 9 + 1 ? FORMAT_ROLE_OUT_NORM
                                                     : FORMAT_ROLE_TOK_EMBD;
        uint64_t rows, cols;
        struct qi_tensor view;
        if (slot < 0 || shape_of(&g->src.cfg, role, &rows, &cols) < 0 ||
            qg_tensor_view(g, t, &view, rows, cols, name, err) < 0)
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

int qg_tensor(struct qi_source *s, int layer, uint32_t role, struct qi_tensor *t,
              struct sl_err *err)
{
    struct gguf *g = s->priv;
    char name[FORMAT_NAME_MAX];
    uint32_t lookup = role;
    if (role == FORMAT_ROLE_TOK_EMBD || (role == FORMAT_ROLE_CLASSIFIER && g->dedup_classifier))
        lookup = FORMAT_ROLE_TOK_EMBD;
    format_tensor_name(layer, lookup, name, sizeof name);
    const struct gguf_tensor *gt = qg_find_tensor(g, name);
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
    return qg_tensor_view(g, gt, t, rows, cols, name, err);
}

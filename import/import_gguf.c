/* import_gguf.c: GGUF v2/v3 files of the llama architecture (the
 * layout of ggml-org/ggml docs/gguf.md): metadata key-value pairs, tensor
 * infos, aligned tensor data. Tensor types F32, F16, BF16, Q8_0 and the
 * K-quants Q4_K, Q5_K, Q6_K (dequantized exactly: import_kquant.c). Every
 * length and offset is checked against the mapped file before use. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "import_gguf_internal.h"

void qg_destroy(struct qi_source *s)
{
    struct gguf *g = s->priv;
    qi_unmap(g->data, g->size);
    import_vocab_free(&s->vocab);
    free(g->tensors);
    free(g);
}

int qi_open_gguf(const char *path, const struct import_opts *o, struct qi_source **out,
                 struct sl_err *err)
{
    (void)o;
    struct gguf *g = qi_source_new(sizeof *g, path, "gguf", qg_tensor, qg_destroy, err);
    if (!g)
        return -ENOMEM;
    struct qi_source *s = &g->src;
    int ret = qi_map_file(path, &g->data, &g->size, err);
    if (ret < 0) {
        free(g);
        return ret;
    }
    ret = -EINVAL;
    struct qg_cur c = {g->data, g->data + g->size, path, err, 0};
    if (g->size < 4 || memcmp(g->data, "GGUF", 4)) {
        sl_err_set(err, "%s: not a GGUF file (bad magic)", path);
        goto fail;
    }
    c.p += 4;
    uint32_t version = qg_rd32(&c, "the version");
    if (c.bad)
        goto fail;
    if (version != 2 && version != 3) {
        sl_err_set(err, "%s: GGUF version %u; supported: 2 and 3", path, version);
        goto fail;
    }
    uint64_t n_tensors = qg_rd64(&c, "the tensor count");
    uint64_t n_kv = qg_rd64(&c, "the key-value count");
    if (c.bad)
        goto fail;
    if (n_tensors > (1u << 20) || n_kv > (1u << 20)) {
        sl_err_set(err, "%s: implausible GGUF counts (%" PRIu64 " tensors, %" PRIu64 " keys)", path,
                   n_tensors, n_kv);
        goto fail;
    }
    uint64_t align;
    ret = qg_read_meta(&c, s, n_kv, &align);
    if (ret < 0)
        goto fail;
    ret = -EINVAL;
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
        t->name = qg_rdstr(&c, &t->name_len, "a tensor name");
        t->n_dims = qg_rd32(&c, "tensor dimensions");
        if (c.bad)
            goto fail;
        if (t->n_dims == 0 || t->n_dims > 4) {
            sl_err_set(err, "%s: tensor '%.*s' has %u dimensions", path,
                       (int)(t->name_len > 64 ? 64 : t->name_len), t->name, t->n_dims);
            goto fail;
        }
        for (uint32_t d = 0; d < t->n_dims; d++)
            t->ne[d] = qg_rd64(&c, "a tensor dimension");
        t->type = qg_rd32(&c, "a tensor type");
        t->offset = qg_rd64(&c, "a tensor offset");
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
    /* Tied when there is no classifier, or when it is a byte-identical copy of
     * the embedding (llama.cpp's llama2.c converter writes both). */
    const struct gguf_tensor *emb = qg_find_tensor(g, "token_embd.weight");
    const struct gguf_tensor *cls = qg_find_tensor(g, "output.weight");
    if (!emb) {
        sl_err_set(err, "%s: tensor 'token_embd.weight' is missing", path);
        goto fail;
    }
    cfg->tied_embedding = cls == NULL;
    ret = format_config_validate(cfg, path, err);
    if (ret == 0)
        ret = qg_check_tensor_names(g, err);
    if (ret == 0)
        ret = qg_check_tiling(g, align, err);
    if (ret < 0)
        goto fail;
    ret = -EINVAL;
    if (cls) {
        struct qi_tensor a, b;
        uint64_t rows = cfg->vocab_size, cols = cfg->dim;
        if (qg_tensor_view(g, emb, &a, rows, cols, "token_embd.weight", err) < 0 ||
            qg_tensor_view(g, cls, &b, rows, cols, "output.weight", err) < 0)
            goto fail;
        if (a.type == b.type && a.len == b.len && !memcmp(a.data, b.data, a.len)) {
            cfg->tied_embedding = 1;
            g->dedup_classifier = 1;
        }
    }
    *out = s;
    return 0;
fail:
    qg_destroy(s);
    return ret;
}

/* import_llama2c.c: llama2.c legacy float32 checkpoints and their
 * separate tokenizer files.
 *
 * Checkpoint: 7 x int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads,
 * vocab_size, seq_len; a negative vocab_size means the classifier is stored
 * separately at the end), then float32 arrays: token_embedding [vocab][dim],
 * rms_att [L][dim], wq [L][q][dim], wk [L][kv][dim], wv [L][kv][dim],
 * wo [L][dim][q], rms_ffn [L][dim], w1 [L][hidden][dim], w2 [L][dim][hidden],
 * w3 [L][hidden][dim], rms_final [dim], freq_cis_real [seq][hd/2],
 * freq_cis_imag [seq][hd/2], then wcls [vocab][dim] if separate. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "import_internal.h"

/* ---- tokenizer file ---------------------------------------------------------------- */

void import_vocab_free(struct import_vocab *v)
{
    if (v->strs)
        for (uint32_t i = 0; i < v->tok.n_tokens; i++)
            free(v->strs[i]);
    free(v->strs);
    free(v->scores);
    free(v->lens);
    memset(v, 0, sizeof *v);
}

int qi_vocab_alloc(struct import_vocab *v, uint64_t n)
{
    memset(v, 0, sizeof *v);
    v->strs = calloc(n, sizeof(char *));
    v->lens = calloc(n, sizeof(uint32_t));
    v->scores = calloc(n, sizeof(float));
    if (!v->strs || !v->lens || !v->scores) {
        import_vocab_free(v);
        return -ENOMEM;
    }
    v->tok.n_tokens = (uint32_t)n;
    return 0;
}

void qi_vocab_publish(struct import_vocab *v)
{
    v->tok.max_token_len = 0;
    for (uint32_t i = 0; i < v->tok.n_tokens; i++)
        if (v->lens[i] > v->tok.max_token_len)
            v->tok.max_token_len = v->lens[i];
    v->tok.scores = v->scores;
    v->tok.lens = v->lens;
    v->tok.tokens = (const char *const *)v->strs;
}

int import_vocab_load_llama2c(const char *path, uint32_t n, struct import_vocab *v,
                              struct sl_err *err)
{
    const uint8_t *data;
    uint64_t size;
    memset(v, 0, sizeof *v);
    int ret = qi_map_file(path, &data, &size, err);
    if (ret < 0)
        return ret;
    ret = -EINVAL;
    if (size < 4) {
        sl_err_set(err, "%s: tokenizer file is truncated (%" PRIu64 " bytes)", path, size);
        goto out;
    }
    int32_t maxlen = (int32_t)sl_load_le32(data);
    if (maxlen <= 0 || maxlen > 65535) {
        sl_err_set(err, "%s: not a llama2.c tokenizer (max token length %d)", path, maxlen);
        goto out;
    }
    if (n > (size - 4) / 8) { /* each token: a score and a length, 8 bytes at least */
        sl_err_set(err,
                   "%s: is truncated: %" PRIu64 " bytes cannot hold the %u tokens the model "
                   "expects",
                   path, size, n);
        goto out;
    }
    if (qi_vocab_alloc(v, n) < 0) {
        sl_err_set(err, "%s: out of memory", path);
        ret = -ENOMEM;
        goto out;
    }
    uint64_t off = 4;
    for (uint32_t i = 0; i < n; i++) {
        if (size - off < 8) {
            sl_err_set(err, "%s: truncated at token %u of %u (the model has %u tokens)", path, i, n,
                       n);
            goto out;
        }
        v->scores[i] = sl_load_lef32(data + off);
        int32_t len = (int32_t)sl_load_le32(data + off + 4);
        off += 8;
        if (len < 0 || len > maxlen || (uint64_t)len > size - off) {
            sl_err_set(err, "%s: token %u has length %d (max %d, %" PRIu64 " bytes left)", path, i,
                       len, maxlen, size - off);
            goto out;
        }
        const char *p = (const char *)data + off;
        int32_t raw = len;
        /* llama2.c's exporter wraps the control tokens in newlines ("\n<s>\n");
         * store them bare, as GGUF and SentencePiece name them. */
        if (len >= 3 && p[0] == '\n' && p[len - 1] == '\n' && p[1] == '<' && p[len - 2] == '>') {
            p++;
            len -= 2;
        }
        v->strs[i] = malloc((size_t)len + 1);
        if (!v->strs[i]) {
            sl_err_set(err, "%s: out of memory", path);
            ret = -ENOMEM;
            goto out;
        }
        memcpy(v->strs[i], p, (size_t)len);
        v->strs[i][len] = 0;
        v->lens[i] = (uint32_t)len;
        off += (uint64_t)raw;
    }
    if (off != size) {
        sl_err_set(err,
                   "%s: %" PRIu64 " bytes after the %u tokens the model expects (wrong "
                   "tokenizer for this model?)",
                   path, size - off, n);
        goto out;
    }
    qi_vocab_publish(v);
    ret = 0;
out:
    if (ret < 0)
        import_vocab_free(v);
    qi_unmap(data, size);
    return ret;
}

/* ---- checkpoint -------------------------------------------------------------------- */

struct l2c {
    struct qi_source src;
    const uint8_t *data;
    uint64_t size;
    uint64_t off[FORMAT_ROLE_COUNT]; /* byte offset of each role's array (all layers) */
};

static int l2c_tensor(struct qi_source *s, int layer, uint32_t role, struct qi_tensor *t,
                      struct sl_err *err)
{
    struct l2c *m = s->priv;
    const struct format_config *c = &s->cfg;
    uint64_t q = (uint64_t)c->n_heads * c->head_dim, kv = (uint64_t)c->n_kv_heads * c->head_dim;
    uint64_t rows, cols;
    switch (role) {
    case FORMAT_ROLE_TOK_EMBD:
    case FORMAT_ROLE_CLASSIFIER:
        rows = c->vocab_size, cols = c->dim;
        break;
    case FORMAT_ROLE_ATTN_NORM:
    case FORMAT_ROLE_FFN_NORM:
    case FORMAT_ROLE_OUT_NORM:
        rows = c->dim, cols = 1;
        break;
    case FORMAT_ROLE_WQ:
        rows = q, cols = c->dim;
        break;
    case FORMAT_ROLE_WK:
    case FORMAT_ROLE_WV:
        rows = kv, cols = c->dim;
        break;
    case FORMAT_ROLE_WO:
        rows = c->dim, cols = q;
        break;
    case FORMAT_ROLE_W_GATE:
    case FORMAT_ROLE_W_UP:
        rows = c->hidden_dim, cols = c->dim;
        break;
    case FORMAT_ROLE_W_DOWN:
        rows = c->dim, cols = c->hidden_dim;
        break;
    default:
        sl_err_set(err, "%s: no tensor for role %u", s->path, role);
        return -EINVAL;
    }
    uint64_t bytes = rows * cols * 4;
    t->data = m->data + m->off[role] + (layer >= 0 ? (uint64_t)layer * bytes : 0);
    t->len = bytes;
    t->type = QI_F32;
    t->rows = rows;
    t->cols = cols;
    t->hf_rope_heads = 0;
    return 0;
}

static void l2c_destroy(struct qi_source *s)
{
    struct l2c *m = s->priv;
    qi_unmap(m->data, m->size);
    import_vocab_free(&s->vocab);
    free(m);
}

int qi_open_llama2c(const char *path, const struct import_opts *o, struct qi_source **out,
                    struct sl_err *err)
{
    struct l2c *m = qi_source_new(sizeof *m, path, "llama2c", l2c_tensor, l2c_destroy, err);
    if (!m)
        return -ENOMEM;
    struct qi_source *s = &m->src;
    int ret = qi_map_file(path, &m->data, &m->size, err);
    if (ret < 0) {
        free(m);
        return ret;
    }
    ret = -EINVAL;
    if (m->size < 28) {
        sl_err_set(err, "%s: truncated llama2.c checkpoint (%" PRIu64 " bytes)", path, m->size);
        goto fail;
    }
    int32_t h[7];
    for (int i = 0; i < 7; i++)
        h[i] = (int32_t)sl_load_le32(m->data + 4 * i);
    if (h[0] <= 0 || h[1] <= 0 || h[2] <= 0 || h[3] <= 0 || h[4] <= 0 || h[5] == 0 || h[6] <= 0 ||
        h[5] == INT32_MIN || h[0] % h[3] != 0) {
        sl_err_set(err, "%s: not a llama2.c checkpoint (header %d %d %d %d %d %d %d)", path, h[0],
                   h[1], h[2], h[3], h[4], h[5], h[6]);
        goto fail;
    }
    struct format_config *c = &s->cfg;
    *c = (struct format_config){.arch = FORMAT_ARCH_LLAMA,
                                .dim = (uint32_t)h[0],
                                .hidden_dim = (uint32_t)h[1],
                                .n_layers = (uint32_t)h[2],
                                .n_heads = (uint32_t)h[3],
                                .n_kv_heads = (uint32_t)h[4],
                                .head_dim = (uint32_t)(h[0] / h[3]),
                                .vocab_size = (uint32_t)(h[5] < 0 ? -h[5] : h[5]),
                                .seq_len = (uint32_t)h[6],
                                .tied_embedding = h[5] > 0,
                                .rope_layout = FORMAT_ROPE_INTERLEAVED,
                                .bos_id = 1,
                                .eos_id = 2,
                                .rope_theta = 10000.0f,
                                .norm_eps = 1e-5f};
    if (c->vocab_size < 3) {
        sl_err_set(err, "%s: vocabulary of %u tokens", path, c->vocab_size);
        goto fail;
    }
    ret = format_config_validate(c, path, err);
    if (ret < 0)
        goto fail;
    ret = -EINVAL;
    /* Sizes in floats (the validated config keeps every product inside 64 bits). */
    uint64_t D = c->dim, F = c->hidden_dim, L = c->n_layers, V = c->vocab_size;
    uint64_t Q = (uint64_t)c->n_heads * c->head_dim, KV = (uint64_t)c->n_kv_heads * c->head_dim;
    uint64_t S = c->seq_len, HD = c->head_dim;
    uint64_t pos = 28;
    struct {
        uint32_t role;
        uint64_t floats;
    } layout[] = {
        {FORMAT_ROLE_TOK_EMBD, V * D},   {FORMAT_ROLE_ATTN_NORM, L * D},
        {FORMAT_ROLE_WQ, L * Q * D},     {FORMAT_ROLE_WK, L * KV * D},
        {FORMAT_ROLE_WV, L * KV * D},    {FORMAT_ROLE_WO, L * D * Q},
        {FORMAT_ROLE_FFN_NORM, L * D},   {FORMAT_ROLE_W_GATE, L * F * D},
        {FORMAT_ROLE_W_DOWN, L * D * F}, {FORMAT_ROLE_W_UP, L * F * D},
        {FORMAT_ROLE_OUT_NORM, D},       {FORMAT_ROLE_COUNT, S * HD}, /* freq_cis, skipped */
    };
    for (size_t i = 0; i < sizeof layout / sizeof layout[0]; i++) {
        if (layout[i].role < FORMAT_ROLE_COUNT)
            m->off[layout[i].role] = pos;
        pos += layout[i].floats * 4;
    }
    if (!c->tied_embedding) {
        m->off[FORMAT_ROLE_CLASSIFIER] = pos;
        pos += V * D * 4;
    }
    if (pos != m->size) {
        sl_err_set(err, "%s: the header implies %" PRIu64 " bytes, the file has %" PRIu64 " (%s)",
                   path, pos, m->size, m->size < pos ? "truncated" : "trailing data");
        goto fail;
    }
    if (!o->tokenizer) {
        sl_err_set(err, "%s: a llama2.c checkpoint needs its tokenizer file (--tokenizer)", path);
        goto fail;
    }
    ret = import_vocab_load_llama2c(o->tokenizer, c->vocab_size, &s->vocab, err);
    if (ret < 0)
        goto fail;
    *out = s;
    return 0;
fail:
    l2c_destroy(s);
    return ret;
}

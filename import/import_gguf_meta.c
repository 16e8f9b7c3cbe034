/* import_gguf_meta.c: the GGUF importer's metadata: the key-value pairs in
 * any order, the SentencePiece vocabulary (tokens, scores), the chat
 * template, and the llama hyperparameters with their checks (only what the
 * container can run as it is: no partial rotary, no RoPE scaling). */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "import_gguf_internal.h"

/* Copies the vocabulary arrays (tokens as strings, scores as f32). */
static int read_vocab_tokens(struct qg_cur *c, struct qi_source *s, struct sl_err *err)
{
    uint32_t et = qg_rd32(c, "the token array type");
    uint64_t n = qg_rd64(c, "the token count");
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
        const char *str = qg_rdstr(c, &len, "a token");
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
static int read_vocab_scores(struct qg_cur *c, struct qi_source *s, struct sl_err *err)
{
    uint32_t et = qg_rd32(c, "the score array type");
    uint64_t n = qg_rd64(c, "the score count");
    if (c->bad)
        return -EINVAL;
    if (et != GGUF_F32 || n > (1u << 24) || qg_need(c, n * 4, "the scores")) {
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

/* Reads the n_kv metadata pairs at c: the vocabulary into s->vocab, the
 * chat template, and the llama hyperparameters, checked, into s->cfg (all
 * but tied_embedding, which the tensors decide); the tensor data alignment
 * into *align_out. 0, or a negative errno with the error set. */
int qg_read_meta(struct qg_cur *c, struct qi_source *s, uint64_t n_kv, uint64_t *align_out)
{
    const char *path = s->path;
    struct sl_err *err = c->err;
    int ret = -EINVAL;
    uint64_t dim = 0, hidden = 0, layers = 0, heads = 0, kv_heads = 0, ctx = 0, align = 32;
    uint64_t bos = 1, eos = 2;
    double theta = 10000.0, eps = 1e-5;
    uint64_t rope_dims = 0, key_len = 0, value_len = 0; /* 0: absent (= head size) */
    const uint8_t *scores_at = NULL;
    int have_arch = 0, have_kvh = 0;
    for (uint64_t i = 0; i < n_kv; i++) {
        uint64_t kl;
        const char *k = qg_rdstr(c, &kl, "a metadata key");
        uint32_t type = qg_rd32(c, "a metadata type");
        if (!k || c->bad)
            goto fail;
        uint64_t *ip = NULL;
        double *fp = NULL;
        if (qg_key_is(k, kl, "general.architecture")) {
            uint64_t vl;
            const char *v = type == GGUF_STRING ? qg_rdstr(c, &vl, "the architecture") : NULL;
            if (!v) {
                if (!c->bad)
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
        if (qg_key_is(k, kl, "tokenizer.ggml.tokens") && type == GGUF_ARRAY) {
            ret = read_vocab_tokens(c, s, err);
            if (ret < 0)
                goto fail;
            ret = -EINVAL;
            continue;
        }
        if (qg_key_is(k, kl, "tokenizer.chat_template") && type == GGUF_STRING) {
            /* kept as metadata for the chat (sluice chat, sluice serve) */
            s->chat_template = qg_rdstr(c, &s->chat_template_len, "the chat template");
            if (!s->chat_template)
                goto fail;
            continue;
        }
        if (qg_key_is(k, kl, "tokenizer.ggml.scores") && type == GGUF_ARRAY) {
            scores_at = c->p; /* read once the tokens are known (keys come in any order) */
            if (qg_skip_value(c, type, 0))
                goto fail;
            continue;
        }
        if (qg_key_is(k, kl, "tokenizer.ggml.model") ||
            qg_key_is(k, kl, "llama.rope.scaling.type")) {
            /* strings whose other values change what the model computes */
            int tokm = qg_key_is(k, kl, "tokenizer.ggml.model");
            uint64_t vl;
            const char *v = type == GGUF_STRING ? qg_rdstr(c, &vl, "a metadata string") : NULL;
            if (!v) {
                if (!c->bad)
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
        if (qg_key_is(k, kl, "llama.embedding_length"))
            ip = &dim;
        else if (qg_key_is(k, kl, "llama.feed_forward_length"))
            ip = &hidden;
        else if (qg_key_is(k, kl, "llama.block_count"))
            ip = &layers;
        else if (qg_key_is(k, kl, "llama.attention.head_count"))
            ip = &heads;
        else if (qg_key_is(k, kl, "llama.attention.head_count_kv"))
            ip = &kv_heads, have_kvh = 1;
        else if (qg_key_is(k, kl, "llama.context_length"))
            ip = &ctx;
        else if (qg_key_is(k, kl, "llama.rope.dimension_count"))
            ip = &rope_dims;
        else if (qg_key_is(k, kl, "llama.attention.key_length"))
            ip = &key_len;
        else if (qg_key_is(k, kl, "llama.attention.value_length"))
            ip = &value_len;
        else if (qg_key_is(k, kl, "general.alignment"))
            ip = &align;
        else if (qg_key_is(k, kl, "tokenizer.ggml.bos_token_id"))
            ip = &bos;
        else if (qg_key_is(k, kl, "tokenizer.ggml.eos_token_id"))
            ip = &eos;
        else if (qg_key_is(k, kl, "llama.rope.freq_base"))
            fp = &theta;
        else if (qg_key_is(k, kl, "llama.attention.layer_norm_rms_epsilon"))
            fp = &eps;
        if (ip) {
            int r = qg_rd_int(c, type, ip);
            if (r < 0)
                goto fail;
            if (r > 0) {
                sl_err_set(err, "%s: metadata '%.*s' is not an integer", path, (int)kl, k);
                goto fail;
            }
        } else if (fp) {
            int r = qg_rd_float(c, type, fp);
            if (r < 0)
                goto fail;
            if (r > 0) {
                sl_err_set(err, "%s: metadata '%.*s' is not a float", path, (int)kl, k);
                goto fail;
            }
        } else if (qg_skip_value(c, type, 0)) {
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
        struct qg_cur sc = {scores_at, c->end, path, err, 0};
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
    *align_out = align;
    return 0;
fail:
    return ret;
}

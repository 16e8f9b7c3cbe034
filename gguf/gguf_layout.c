/* gguf_layout.c: the GGUF header (ggml docs/gguf.md, version 3): magic,
 * version, counts, the metadata key-value pairs (llama hyperparameters and the
 * SentencePiece vocabulary, both from the container), the tensor infos, and
 * the placement of each tensor's data at general.alignment. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf_internal.h"

enum { T_U32 = 4, T_I32 = 5, T_F32 = 6, T_BOOL = 7, T_STR = 8, T_ARR = 9 };
enum { TOK_NORMAL = 1, TOK_UNKNOWN = 2, TOK_CONTROL = 3, TOK_BYTE = 6 };

void gguf_view_opts_init(struct gguf_view_opts *o)
{
    memset(o, 0, sizeof *o);
    o->alignment = 32;
    o->qtype = GGUF_GGML_Q8_0;
}

/* A growing byte buffer; `bad` latches an allocation failure. */
struct buf {
    uint8_t *p;
    uint64_t len, cap;
    int bad;
};

static uint8_t *grow(struct buf *b, uint64_t n)
{
    if (b->bad)
        return NULL;
    if (b->len + n > b->cap) {
        uint64_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n)
            cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p) {
            b->bad = 1;
            return NULL;
        }
        b->p = p;
        b->cap = cap;
    }
    uint8_t *at = b->p + b->len;
    b->len += n;
    return at;
}

static void put32(struct buf *b, uint32_t v)
{
    uint8_t *p = grow(b, 4);
    if (p)
        sl_store_le32(p, v);
}

static void put64(struct buf *b, uint64_t v)
{
    uint8_t *p = grow(b, 8);
    if (p)
        sl_store_le64(p, v);
}

static void putf32(struct buf *b, float v)
{
    uint8_t *p = grow(b, 4);
    if (p)
        sl_store_lef32(p, v);
}

static void putstr(struct buf *b, const char *s, uint64_t n)
{
    put64(b, n);
    uint8_t *p = grow(b, n);
    if (p && n)
        memcpy(p, s, n);
}

static void key(struct buf *b, const char *k, uint32_t type)
{
    putstr(b, k, strlen(k));
    put32(b, type);
}

static void kv_u32(struct buf *b, const char *k, uint32_t v)
{
    key(b, k, T_U32);
    put32(b, v);
}

static void kv_f32(struct buf *b, const char *k, float v)
{
    key(b, k, T_F32);
    putf32(b, v);
}

static void kv_str(struct buf *b, const char *k, const char *v)
{
    key(b, k, T_STR);
    putstr(b, v, strlen(v));
}

static void kv_bool(struct buf *b, const char *k, int v)
{
    key(b, k, T_BOOL);
    uint8_t *p = grow(b, 1);
    if (p)
        *p = (uint8_t) !!v;
}

/* "<0xAB>": a byte-fallback token. */
static int is_byte_token(const char *s, uint32_t n)
{
    static const char hex[] = "0123456789ABCDEF";
    return n == 6 && !memcmp(s, "<0x", 3) && s[5] == '>' && memchr(hex, s[3], 16) &&
           memchr(hex, s[4], 16);
}

static uint32_t token_type(const struct format_config *c, uint32_t id, const char *s, uint32_t n)
{
    if (id == c->bos_id || id == c->eos_id)
        return TOK_CONTROL;
    if (n == 5 && !memcmp(s, "<unk>", 5))
        return TOK_UNKNOWN;
    if (n == 0)
        return TOK_CONTROL;
    return is_byte_token(s, n) ? TOK_BYTE : TOK_NORMAL;
}

/* The vocabulary as llama.cpp's SentencePiece ("llama") tokenizer reads it:
 * spaces as U+2581, BOS and EOS named <s> and </s> (llama2.c vocabularies
 * store "\n<s>\n"; control tokens are never printed), types by the rules of
 * llama.cpp's llama2.c converter. */
static void put_vocab(struct buf *b, const struct format_config *c,
                      const struct format_tokenizer *t, int64_t *unk)
{
    key(b, "tokenizer.ggml.tokens", T_ARR);
    put32(b, T_STR);
    put64(b, t->n_tokens);
    *unk = -1;
    for (uint32_t i = 0; i < t->n_tokens; i++) {
        const char *s = t->tokens[i];
        uint32_t n = t->lens[i];
        if (i == c->bos_id || i == c->eos_id) {
            const char *name = i == c->bos_id ? "<s>" : "</s>";
            putstr(b, name, strlen(name));
            continue;
        }
        if (*unk < 0 && n == 5 && !memcmp(s, "<unk>", 5))
            *unk = i;
        uint64_t spaces = 0;
        for (uint32_t k = 0; k < n; k++)
            spaces += s[k] == ' ';
        put64(b, n + 2 * spaces);
        uint8_t *p = grow(b, n + 2 * spaces);
        if (!p)
            continue;
        for (uint32_t k = 0; k < n; k++) {
            if (s[k] == ' ') {
                *p++ = 0xe2, *p++ = 0x96, *p++ = 0x81;
            } else {
                *p++ = (uint8_t)s[k];
            }
        }
    }
    key(b, "tokenizer.ggml.scores", T_ARR);
    put32(b, T_F32);
    put64(b, t->n_tokens);
    for (uint32_t i = 0; i < t->n_tokens; i++)
        putf32(b, t->scores[i]);
    key(b, "tokenizer.ggml.token_type", T_ARR);
    put32(b, T_I32);
    put64(b, t->n_tokens);
    for (uint32_t i = 0; i < t->n_tokens; i++)
        put32(b, token_type(c, i, t->tokens[i], t->lens[i]));
}

/* The output type and row bytes of a container tensor. */
static void place(struct gguf_view *v, struct gv_tensor *t)
{
    const struct format_encoding_traits *tr = format_encoding_traits(t->enc);
    struct gguf_view_tensor *p = &t->pub;
    if (p->n_dims == 1) {
        p->type = GGUF_GGML_F32;
        t->row_bytes = 4 * t->rows;
    } else if (tr->quantized) {
        int q8 = v->o.qtype == GGUF_GGML_Q8_0 && t->cols % 32 == 0;
        p->f16_fallback = v->o.qtype == GGUF_GGML_Q8_0 && !q8;
        p->type = q8 ? GGUF_GGML_Q8_0 : v->o.qtype == GGUF_GGML_F32 ? GGUF_GGML_F32 : GGUF_GGML_F16;
        t->row_bytes = q8                         ? t->cols / 32 * 34
                       : p->type == GGUF_GGML_F32 ? 4 * t->cols
                                                  : 2 * t->cols;
    } else {
        p->type = t->enc == FORMAT_ENC_F16    ? GGUF_GGML_F16
                  : t->enc == FORMAT_ENC_BF16 ? GGUF_GGML_BF16
                                              : GGUF_GGML_F32;
        t->row_bytes = (p->type == GGUF_GGML_F32 ? 4 : 2) * t->cols;
    }
    p->size = p->n_dims == 1 ? t->row_bytes : t->row_bytes * t->rows;
}

static const char *basename_of(const char *path, char *buf, size_t n)
{
    const char *s = strrchr(path, '/');
    s = s ? s + 1 : path;
    snprintf(buf, n, "%s", s);
    char *dot = strrchr(buf, '.');
    if (dot && dot != buf)
        *dot = 0;
    return buf;
}

int gv_layout(struct gguf_view *v, struct sl_err *err)
{
    const struct format_reader *r = v->r;
    const struct format_config *c = format_reader_config(r);
    const char *path = format_reader_path(r);
    if (c->arch != FORMAT_ARCH_LLAMA || c->rope_layout != FORMAT_ROPE_INTERLEAVED) {
        sl_err_set(err,
                   "%s: the GGUF view knows only the llama architecture with interleaved "
                   "RoPE (arch %u, rope_layout %u)",
                   path, c->arch, c->rope_layout);
        return -EINVAL;
    }
    v->n = format_reader_n_tensors(r);
    v->t = calloc(v->n ? v->n : 1, sizeof *v->t);
    if (!v->t)
        goto nomem;
    for (uint32_t i = 0; i < v->n; i++) {
        const struct format_tensor_info *ti = format_reader_tensor(r, i);
        const struct format_slice_info *si = format_reader_slice(r, ti->slice);
        struct gv_tensor *t = &v->t[i];
        uint32_t role = ti->role == FORMAT_ROLE_CLASSIFIER && c->tied_embedding
                            ? FORMAT_ROLE_TOK_EMBD
                            : ti->role;
        format_tensor_name(ti->layer, role, t->pub.name, sizeof t->pub.name);
        t->pub.tensor = i;
        t->pub.n_dims = ti->n_dims;
        t->slice = ti->slice;
        t->src_off = ti->offset - si->offset;
        t->src_len = ti->length;
        t->enc = ti->encoding;
        t->rows = ti->shape[0];
        t->cols = ti->n_dims == 2 ? ti->shape[1] : 1;
        t->pub.ne[0] = ti->n_dims == 2 ? t->cols : t->rows;
        t->pub.ne[1] = ti->n_dims == 2 ? t->rows : 1;
        if (!format_encoding_traits(t->enc) || ti->n_dims < 1 || ti->n_dims > 2) {
            sl_err_set(err, "%s: tensor '%s' has an encoding or shape the GGUF view cannot hold",
                       path, ti->name);
            return -EINVAL;
        }
        place(v, t);
    }

    /* the header: twice the same writer would do; one pass with offsets
     * patched in once the header's length is known */
    struct buf b = {0};
    char name[256];
    int64_t unk;
    const struct format_tokenizer *tok = format_reader_tokenizer(r);
    uint64_t n_kv = 0;
    grow(&b, 4);
    if (!b.bad)
        memcpy(b.p, "GGUF", 4);
    put32(&b, 3);
    put64(&b, v->n);
    uint64_t n_kv_at = b.len;
    put64(&b, 0);
    kv_str(&b, "general.architecture", "llama"), n_kv++;
    kv_str(&b, "general.name", basename_of(path, name, sizeof name)), n_kv++;
    kv_u32(&b, "general.alignment", v->o.alignment), n_kv++;
    kv_u32(&b, "llama.context_length", c->seq_len), n_kv++;
    kv_u32(&b, "llama.embedding_length", c->dim), n_kv++;
    kv_u32(&b, "llama.block_count", c->n_layers), n_kv++;
    kv_u32(&b, "llama.feed_forward_length", c->hidden_dim), n_kv++;
    kv_u32(&b, "llama.attention.head_count", c->n_heads), n_kv++;
    kv_u32(&b, "llama.attention.head_count_kv", c->n_kv_heads), n_kv++;
    kv_u32(&b, "llama.rope.dimension_count", c->head_dim), n_kv++;
    kv_f32(&b, "llama.rope.freq_base", c->rope_theta), n_kv++;
    kv_f32(&b, "llama.attention.layer_norm_rms_epsilon", c->norm_eps), n_kv++;
    kv_u32(&b, "llama.vocab_size", c->vocab_size), n_kv++;
    kv_str(&b, "tokenizer.ggml.model", "llama"), n_kv++;
    put_vocab(&b, c, tok, &unk), n_kv += 3;
    kv_u32(&b, "tokenizer.ggml.bos_token_id", c->bos_id), n_kv++;
    kv_u32(&b, "tokenizer.ggml.eos_token_id", c->eos_id), n_kv++;
    if (unk >= 0)
        kv_u32(&b, "tokenizer.ggml.unknown_token_id", (uint32_t)unk), n_kv++;
    kv_bool(&b, "tokenizer.ggml.add_bos_token", 1), n_kv++;
    kv_bool(&b, "tokenizer.ggml.add_eos_token", 0), n_kv++;
    uint64_t *off_at = calloc(v->n ? v->n : 1, sizeof *off_at);
    if (!off_at)
        b.bad = 1;
    for (uint32_t i = 0; i < v->n && !b.bad; i++) {
        const struct gguf_view_tensor *p = &v->t[i].pub;
        putstr(&b, p->name, strlen(p->name));
        put32(&b, p->n_dims);
        for (uint32_t d = 0; d < p->n_dims; d++)
            put64(&b, p->ne[d]);
        put32(&b, p->type);
        off_at[i] = b.len;
        put64(&b, 0);
    }
    uint64_t hdr = b.len, data_start = sl_align_up(hdr, v->o.alignment);
    uint8_t *pad = grow(&b, data_start - hdr);
    if (pad)
        memset(pad, 0, data_start - hdr);
    if (b.bad) {
        free(off_at);
        free(b.p);
        goto nomem;
    }
    uint64_t pos = 0;
    for (uint32_t i = 0; i < v->n; i++) {
        v->t[i].pub.offset = data_start + pos;
        sl_store_le64(b.p + off_at[i], pos);
        pos = sl_align_up(pos + v->t[i].pub.size, v->o.alignment);
    }
    free(off_at);
    sl_store_le64(b.p + n_kv_at, n_kv);
    v->head = b.p;
    v->head_len = data_start;
    /* the last tensor is padded too, as llama.cpp's own writer does */
    v->size = data_start + pos;
    return 0;
nomem:
    sl_err_set(err, "%s: out of memory laying out the GGUF view", path);
    return -ENOMEM;
}

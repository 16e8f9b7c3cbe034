/* gen_gguf.c: the GGUF writer of the test models (gen_models.h), from ggml
 * docs/gguf.md. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "gen_internal.h"

/* ---- GGUF ----------------------------------------------------------------------------------- */

enum {
    KV_U8 = 0,
    KV_I8,
    KV_U16,
    KV_I16,
    KV_U32,
    KV_I32,
    KV_F32,
    KV_BOOL,
    KV_STR,
    KV_ARR,
    KV_U64,
    KV_I64,
    KV_F64
};

static void gstr(struct buf *b, const char *s, size_t n)
{
    bu64(b, n);
    bput(b, s, n);
}

static void gkey(struct buf *b, const char *k, uint32_t type)
{
    gstr(b, k, strlen(k));
    bu32(b, type);
}

static void gkv_u32(struct buf *b, const char *k, uint32_t v)
{
    gkey(b, k, KV_U32);
    bu32(b, v);
}

static void gkv_str(struct buf *b, const char *k, const char *v)
{
    gkey(b, k, KV_STR);
    gstr(b, v, strlen(v));
}

static const char *gguf_role_name(uint32_t role)
{
    switch (role) {
    case FORMAT_ROLE_TOK_EMBD:
        return "token_embd";
    case FORMAT_ROLE_ATTN_NORM:
        return "attn_norm";
    case FORMAT_ROLE_WQ:
        return "attn_q";
    case FORMAT_ROLE_WK:
        return "attn_k";
    case FORMAT_ROLE_WV:
        return "attn_v";
    case FORMAT_ROLE_WO:
        return "attn_output";
    case FORMAT_ROLE_FFN_NORM:
        return "ffn_norm";
    case FORMAT_ROLE_W_GATE:
        return "ffn_gate";
    case FORMAT_ROLE_W_UP:
        return "ffn_up";
    case FORMAT_ROLE_W_DOWN:
        return "ffn_down";
    case FORMAT_ROLE_OUT_NORM:
        return "output_norm";
    default:
        return "output";
    }
}

static void gen_gguf_scores(struct buf *b, const struct gen_model *m)
{
    gkey(b, "tokenizer.ggml.scores", KV_ARR);
    bu32(b, KV_F32);
    bu64(b, m->cfg.vocab_size);
    for (uint32_t i = 0; i < m->cfg.vocab_size; i++)
        bf32(b, m->scores[i]);
}

int gen_write_gguf(const struct gen_model *m, const char *path, const struct gen_gguf_opts *o)
{
    const struct format_config *c = &m->cfg;
    uint32_t align = o->alignment ? o->alignment : 32;
    static const uint32_t ggml_type[] = {
        [GEN_F32] = 0, [GEN_F16] = 1, [GEN_BF16] = 30, [GEN_Q8_0] = 8};
    /* tensors in llama.cpp's order: embedding, output norm, output, then blocks */
    size_t order[GEN_MAX_TENSORS + 1], nt = 0;
    int emb = gen_model_find(m, -1, FORMAT_ROLE_TOK_EMBD);
    order[nt++] = (size_t)emb;
    order[nt++] = (size_t)gen_model_find(m, -1, FORMAT_ROLE_OUT_NORM);
    int cls = gen_model_find(m, -1, FORMAT_ROLE_CLASSIFIER);
    if (cls >= 0)
        order[nt++] = (size_t)cls;
    else if (o->output_copy)
        order[nt++] = (size_t)emb | (1ull << 60); /* marker: the copy named output.weight */
    for (size_t i = 0; i < m->n; i++)
        if (m->layer[i] >= 0)
            order[nt++] = i;

    struct buf b = {0};
    bput(&b, "GGUF", 4);
    bu32(&b, o->version ? o->version : 3);
    bu64(&b, nt);
    bu64(&b, 29 + (o->alignment ? 1 : 0) + (o->extra_key ? 1 : 0)); /* the keys below */
    if (o->extra_key)
        gkv_str(&b, o->extra_key, o->extra_val);
    gkv_str(&b, "general.architecture", o->arch ? o->arch : "llama");
    gkv_str(&b, "general.name", "gen model \xe2\x96\x81 test");
    if (o->alignment)
        gkv_u32(&b, "general.alignment", o->alignment);
    gkv_u32(&b, "llama.context_length", c->seq_len);
    gkey(&b, "llama.embedding_length", KV_U64); /* any integer type is accepted */
    bu64(&b, c->dim);
    gkey(&b, "llama.block_count", KV_I32);
    bu32(&b, c->n_layers);
    gkey(&b, "llama.feed_forward_length", KV_U16);
    bu16(&b, (uint16_t)c->hidden_dim);
    gkv_u32(&b, "llama.rope.dimension_count", c->head_dim);
    gkv_u32(&b, "llama.attention.head_count", c->n_heads);
    gkv_u32(&b, "llama.attention.head_count_kv", c->n_kv_heads);
    gkey(&b, "llama.attention.layer_norm_rms_epsilon", KV_F32);
    bf32(&b, c->norm_eps);
    gkey(&b, "llama.rope.freq_base", KV_F64);
    double th = c->rope_theta;
    uint64_t thu;
    memcpy(&thu, &th, 8);
    bu64(&b, thu);
    gkv_str(&b, "tokenizer.ggml.model", "llama");
    if (o->scores_first)
        gen_gguf_scores(&b, m);
    /* tokens with SentencePiece's U+2581 for spaces, control tokens bare */
    gkey(&b, "tokenizer.ggml.tokens", KV_ARR);
    bu32(&b, KV_STR);
    bu64(&b, c->vocab_size);
    for (uint32_t i = 0; i < c->vocab_size; i++) {
        char t[128];
        size_t k = 0;
        for (uint32_t j = 0; j < m->lens[i]; j++) {
            if (m->strs[i][j] == ' ') {
                memcpy(t + k, "\xe2\x96\x81", 3);
                k += 3;
            } else {
                t[k++] = m->strs[i][j];
            }
        }
        gstr(&b, t, k);
    }
    if (!o->scores_first)
        gen_gguf_scores(&b, m);
    gkey(&b, "tokenizer.ggml.token_type", KV_ARR);
    bu32(&b, KV_I32);
    bu64(&b, c->vocab_size);
    for (uint32_t i = 0; i < c->vocab_size; i++)
        bu32(&b, i < 3 ? 3 : i < 259 ? 6 : 1);
    gkv_u32(&b, "tokenizer.ggml.bos_token_id", c->bos_id);
    gkv_u32(&b, "tokenizer.ggml.eos_token_id", c->eos_id);
    /* one key of every other value type, arrays of arrays included */
    gkey(&b, "test.u8", KV_U8);
    bu8(&b, 200);
    gkey(&b, "test.i8", KV_I8);
    bu8(&b, 0x80);
    gkey(&b, "test.u16", KV_U16);
    bgrow(&b, 2);
    gkey(&b, "test.i16", KV_I16);
    bgrow(&b, 2);
    gkey(&b, "test.i32", KV_I32);
    bu32(&b, (uint32_t)-5);
    gkey(&b, "test.bool", KV_BOOL);
    bu8(&b, 1);
    gkey(&b, "test.u64", KV_U64);
    bu64(&b, UINT64_MAX);
    gkey(&b, "test.i64", KV_I64);
    bu64(&b, (uint64_t)-1);
    gkey(&b, "test.f64", KV_F64);
    bu64(&b, 0x400921fb54442d18ull);
    gkey(&b, "test.strings", KV_ARR);
    bu32(&b, KV_STR);
    bu64(&b, 3);
    gstr(&b, "", 0);
    gstr(&b, "two", 3);
    gstr(&b, "three", 5);
    gkey(&b, "test.nested", KV_ARR); /* [[u16 x 2], [], [u16 x 1]] */
    bu32(&b, KV_ARR);
    bu64(&b, 3);
    bu32(&b, KV_U16);
    bu64(&b, 2);
    bgrow(&b, 4);
    bu32(&b, KV_U16);
    bu64(&b, 0);
    bu32(&b, KV_U16);
    bu64(&b, 1);
    bgrow(&b, 2);
    gkey(&b, "test.empty", KV_ARR);
    bu32(&b, KV_F64);
    bu64(&b, 0);

    /* tensor infos */
    uint64_t off = 0, offs[GEN_MAX_TENSORS + 1];
    enum gen_type types[GEN_MAX_TENSORS + 1];
    for (size_t k = 0; k < nt; k++) {
        int copy = (order[k] >> 60) != 0;
        size_t i = order[k] & 0xffffffffu;
        char name[64];
        if (copy)
            snprintf(name, sizeof name, "output.weight");
        else if (m->layer[i] >= 0)
            snprintf(name, sizeof name, "blk.%d.%s.weight", m->layer[i],
                     gguf_role_name(m->role[i]));
        else
            snprintf(name, sizeof name, "%s.weight", gguf_role_name(m->role[i]));
        types[k] = m->cols[i] == 1 ? o->norms : o->weights;
        gstr(&b, name, strlen(name));
        bu32(&b, m->cols[i] == 1 ? 1 : 2);
        bu64(&b, m->cols[i] == 1 ? m->rows[i] : m->cols[i]); /* ne[0]: the fastest */
        if (m->cols[i] != 1)
            bu64(&b, m->rows[i]);
        bu32(&b, ggml_type[types[k]]);
        bu64(&b, off);
        offs[k] = off;
        off = sl_align_up(off + gen_type_bytes(types[k], m->rows[i] * m->cols[i]), align);
    }
    bpad(&b, align);
    size_t data_start = b.len;
    for (size_t k = 0; k < nt; k++) {
        size_t i = order[k] & 0xffffffffu;
        uint64_t n = m->rows[i] * m->cols[i];
        while (b.len < data_start + offs[k] && !b.oom)
            bgrow(&b, 1);
        uint8_t *d = bgrow(&b, gen_type_bytes(types[k], n));
        if (d)
            gen_store(types[k], m->data[i], n, d);
    }
    bpad(&b, align);
    return bflush(&b, path);
}

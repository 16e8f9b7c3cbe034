/* gen_models.c: writers of a small random model in the llama2.c, GGUF and
 * safetensors formats (see gen_models.h). Written from the format
 * descriptions (llama2.c run.c's layout, ggml docs/gguf.md, the safetensors
 * README), not from the importers, so the tests compare two readings. */
#include "gen_models.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

/* ---- randomness and the model ------------------------------------------------------- */

static uint64_t sm64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float uni(uint64_t *s) /* [-1, 1) */
{
    return (float)(sm64(s) >> 40) / 8388608.0f - 1.0f;
}

static const uint32_t layer_roles[9] = {
    FORMAT_ROLE_ATTN_NORM, FORMAT_ROLE_WQ,     FORMAT_ROLE_WK,   FORMAT_ROLE_WV,     FORMAT_ROLE_WO,
    FORMAT_ROLE_FFN_NORM,  FORMAT_ROLE_W_GATE, FORMAT_ROLE_W_UP, FORMAT_ROLE_W_DOWN,
};

static int add_tensor(struct gen_model *m, int layer, uint32_t role, uint64_t *s)
{
    const struct format_config *c = &m->cfg;
    uint64_t q = (uint64_t)c->n_heads * c->head_dim, kv = (uint64_t)c->n_kv_heads * c->head_dim;
    uint64_t rows, cols;
    switch (role) {
    case FORMAT_ROLE_TOK_EMBD:
    case FORMAT_ROLE_CLASSIFIER:
        rows = c->vocab_size, cols = c->dim;
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
        rows = c->dim, cols = 1;
        break; /* norms */
    }
    size_t i = m->n++;
    m->layer[i] = layer;
    m->role[i] = role;
    m->rows[i] = rows;
    m->cols[i] = cols;
    m->data[i] = malloc(sizeof(float) * rows * cols);
    if (!m->data[i])
        return -1;
    for (uint64_t k = 0; k < rows * cols; k++) {
        /* varied magnitudes per row, so F16/BF16/Q8_0 storage rounds differently */
        float rowscale = cols == 1 ? 1.0f : ldexpf(1.0f, (int)((k / cols) % 7) - 4);
        m->data[i][k] = cols == 1 ? 1.0f + 0.25f * uni(s) : rowscale * uni(s);
    }
    return 0;
}

int gen_model_create(struct gen_model *m, int tied, uint64_t seed)
{
    memset(m, 0, sizeof *m);
    m->cfg = (struct format_config){.arch = FORMAT_ARCH_LLAMA,
                                    .dim = 64,
                                    .hidden_dim = 96,
                                    .n_layers = 2,
                                    .n_heads = 4,
                                    .n_kv_heads = 2,
                                    .head_dim = 16,
                                    .vocab_size = 300,
                                    .seq_len = 32,
                                    .tied_embedding = tied ? 1 : 0,
                                    .rope_layout = FORMAT_ROPE_INTERLEAVED,
                                    .bos_id = 1,
                                    .eos_id = 2,
                                    .rope_theta = 500000.0f,
                                    .norm_eps = 1e-6f};
    uint64_t s = seed;
    const struct format_config *c = &m->cfg;
    if (!tied && add_tensor(m, -1, FORMAT_ROLE_TOK_EMBD, &s))
        goto fail;
    for (uint32_t l = 0; l < c->n_layers; l++)
        for (int r = 0; r < 9; r++)
            if (add_tensor(m, (int)l, layer_roles[r], &s))
                goto fail;
    if (add_tensor(m, -1, FORMAT_ROLE_OUT_NORM, &s) ||
        add_tensor(m, -1, tied ? FORMAT_ROLE_TOK_EMBD : FORMAT_ROLE_CLASSIFIER, &s))
        goto fail;
    uint32_t n = c->vocab_size;
    m->strs = calloc(n, sizeof(char *));
    m->lens = calloc(n, sizeof(uint32_t));
    m->scores = calloc(n, sizeof(float));
    if (!m->strs || !m->lens || !m->scores)
        goto fail;
    for (uint32_t i = 0; i < n; i++) {
        char buf[32];
        if (i == 0)
            snprintf(buf, sizeof buf, "<unk>");
        else if (i == 1)
            snprintf(buf, sizeof buf, "<s>");
        else if (i == 2)
            snprintf(buf, sizeof buf, "</s>");
        else if (i < 259)
            snprintf(buf, sizeof buf, "<0x%02X>", i - 3);
        else /* distinct pieces, some with spaces inside and at the start */
            snprintf(buf, sizeof buf, "%s%c%c%s", i % 2 ? " " : "", 'a' + (char)(i % 26),
                     'a' + (char)(i / 26 % 26), i % 5 == 0 ? " x" : "");
        m->strs[i] = strdup(buf);
        if (!m->strs[i])
            goto fail;
        m->lens[i] = (uint32_t)strlen(buf);
        m->scores[i] = i < 259 ? 0.0f : -(float)(i - 259) * 0.5f;
    }
    return 0;
fail:
    gen_model_destroy(m);
    errno = ENOMEM;
    return -1;
}

void gen_model_destroy(struct gen_model *m)
{
    for (size_t i = 0; i < m->n; i++)
        free(m->data[i]);
    if (m->strs)
        for (uint32_t i = 0; i < m->cfg.vocab_size; i++)
            free(m->strs[i]);
    free(m->strs);
    free(m->lens);
    free(m->scores);
    memset(m, 0, sizeof *m);
}

int gen_model_find(const struct gen_model *m, int layer, uint32_t role)
{
    for (size_t i = 0; i < m->n; i++)
        if (m->layer[i] == layer && m->role[i] == role)
            return (int)i;
    return -1;
}

/* ---- element storage ---------------------------------------------------------------- */

static uint64_t type_bytes(enum gen_type t, uint64_t n)
{
    return t == GEN_F32 ? 4 * n : t == GEN_Q8_0 ? n / 32 * 34 : 2 * n;
}

/* Q8_0 as ggml's reference quantizer: d = max|x| / 127, q = round(x / d). */
static void q8_0_block(const float *x, uint8_t *out)
{
    float amax = 0;
    for (int j = 0; j < 32; j++)
        amax = fmaxf(amax, fabsf(x[j]));
    float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
    sl_store_le16(out, sl_f32_to_f16(d));
    for (int j = 0; j < 32; j++)
        out[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
}

/* Stores n floats as type t (n a multiple of 32 for Q8_0). */
static void store(enum gen_type t, const float *x, uint64_t n, uint8_t *out)
{
    for (uint64_t k = 0; k < n; k++) {
        if (t == GEN_F32)
            sl_store_lef32(out + 4 * k, x[k]);
        else if (t == GEN_F16)
            sl_store_le16(out + 2 * k, sl_f32_to_f16(x[k]));
        else if (t == GEN_BF16)
            sl_store_le16(out + 2 * k, sl_f32_to_bf16(x[k]));
    }
    if (t == GEN_Q8_0)
        for (uint64_t b = 0; b < n / 32; b++)
            q8_0_block(x + 32 * b, out + 34 * b);
}

static void load(enum gen_type t, const uint8_t *in, uint64_t n, float *x)
{
    for (uint64_t k = 0; k < n; k++) {
        if (t == GEN_F32)
            x[k] = sl_load_lef32(in + 4 * k);
        else if (t == GEN_F16)
            x[k] = sl_f16_to_f32(sl_load_le16(in + 2 * k));
        else if (t == GEN_BF16)
            x[k] = sl_bf16_to_f32(sl_load_le16(in + 2 * k));
        else
            x[k] = sl_f16_to_f32(sl_load_le16(in + 34 * (k / 32))) *
                   (float)(int8_t)in[34 * (k / 32) + 2 + k % 32];
    }
}

void gen_expected(const struct gen_model *m, size_t i, enum gen_type type, float *out)
{
    uint64_t n = m->rows[i] * m->cols[i];
    uint8_t *tmp = malloc(type_bytes(type, n) + 1);
    if (!tmp)
        abort();
    store(type, m->data[i], n, tmp);
    load(type, tmp, n, out);
    free(tmp);
}

/* ---- a growable byte buffer ------------------------------------------------------------ */

struct buf {
    uint8_t *p;
    size_t len, cap;
    int oom;
};

static uint8_t *bgrow(struct buf *b, size_t n)
{
    if (b->oom)
        return NULL;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n)
            cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return NULL;
        }
        b->p = p;
        b->cap = cap;
    }
    uint8_t *r = b->p + b->len;
    memset(r, 0, n);
    b->len += n;
    return r;
}

static void bput(struct buf *b, const void *p, size_t n)
{
    uint8_t *d = bgrow(b, n);
    if (d && n)
        memcpy(d, p, n);
}

static void bu32(struct buf *b, uint32_t v)
{
    uint8_t *d = bgrow(b, 4);
    if (d)
        sl_store_le32(d, v);
}

static void bu64(struct buf *b, uint64_t v)
{
    uint8_t *d = bgrow(b, 8);
    if (d)
        sl_store_le64(d, v);
}

static void bu8(struct buf *b, uint8_t v)
{
    uint8_t *d = bgrow(b, 1);
    if (d)
        *d = v;
}

static void bu16(struct buf *b, uint16_t v)
{
    uint8_t *d = bgrow(b, 2);
    if (d)
        sl_store_le16(d, v);
}

static void bf32(struct buf *b, float v)
{
    uint8_t *d = bgrow(b, 4);
    if (d)
        sl_store_lef32(d, v);
}

static void bpad(struct buf *b, size_t align)
{
    while (b->len % align)
        bgrow(b, 1);
}

int gen_write_file(const char *path, const void *p, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    int ok = fwrite(p, 1, len, f) == len;
    ok &= fclose(f) == 0;
    return ok ? 0 : -1;
}

static int bflush(struct buf *b, const char *path)
{
    int ret = b->oom ? -1 : gen_write_file(path, b->p, b->len);
    free(b->p);
    memset(b, 0, sizeof *b);
    return ret;
}

/* ---- llama2.c ----------------------------------------------------------------------------- */

int gen_write_llama2c(const struct gen_model *m, const char *ckpt, const char *tok)
{
    const struct format_config *c = &m->cfg;
    struct buf b = {0};
    int32_t h[7] = {(int32_t)c->dim,
                    (int32_t)c->hidden_dim,
                    (int32_t)c->n_layers,
                    (int32_t)c->n_heads,
                    (int32_t)c->n_kv_heads,
                    c->tied_embedding ? (int32_t)c->vocab_size : -(int32_t)c->vocab_size,
                    (int32_t)c->seq_len};
    for (int i = 0; i < 7; i++)
        bu32(&b, (uint32_t)h[i]);
    /* run.c's order: embedding, then each kind for all layers, w1 w2 w3 */
    static const uint32_t order[] = {
        FORMAT_ROLE_ATTN_NORM, FORMAT_ROLE_WQ,     FORMAT_ROLE_WK,
        FORMAT_ROLE_WV,        FORMAT_ROLE_WO,     FORMAT_ROLE_FFN_NORM,
        FORMAT_ROLE_W_GATE,    FORMAT_ROLE_W_DOWN, FORMAT_ROLE_W_UP};
    int e = gen_model_find(m, -1, FORMAT_ROLE_TOK_EMBD);
    for (uint64_t k = 0; k < m->rows[e] * m->cols[e]; k++)
        bf32(&b, m->data[e][k]);
    for (size_t r = 0; r < sizeof order / sizeof order[0]; r++)
        for (uint32_t l = 0; l < c->n_layers; l++) {
            int i = gen_model_find(m, (int)l, order[r]);
            for (uint64_t k = 0; k < m->rows[i] * m->cols[i]; k++)
                bf32(&b, m->data[i][k]);
        }
    int on = gen_model_find(m, -1, FORMAT_ROLE_OUT_NORM);
    for (uint64_t k = 0; k < c->dim; k++)
        bf32(&b, m->data[on][k]);
    for (uint64_t k = 0; k < (uint64_t)c->seq_len * c->head_dim; k++) /* freq_cis real, imag */
        bf32(&b, (float)k);
    if (!c->tied_embedding) {
        int w = gen_model_find(m, -1, FORMAT_ROLE_CLASSIFIER);
        for (uint64_t k = 0; k < m->rows[w] * m->cols[w]; k++)
            bf32(&b, m->data[w][k]);
    }
    if (bflush(&b, ckpt))
        return -1;
    uint32_t maxlen = 0;
    for (uint32_t i = 0; i < c->vocab_size; i++)
        maxlen = m->lens[i] + 2 > maxlen ? m->lens[i] + 2 : maxlen;
    bu32(&b, maxlen);
    for (uint32_t i = 0; i < c->vocab_size; i++) {
        bf32(&b, m->scores[i]);
        if (i == 1 || i == 2) { /* export.py writes BOS/EOS as "\n<s>\n" */
            bu32(&b, m->lens[i] + 2);
            bput(&b, "\n", 1);
            bput(&b, m->strs[i], m->lens[i]);
            bput(&b, "\n", 1);
        } else {
            bu32(&b, m->lens[i]);
            bput(&b, m->strs[i], m->lens[i]);
        }
    }
    return bflush(&b, tok);
}

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
        off = sl_align_up(off + type_bytes(types[k], m->rows[i] * m->cols[i]), align);
    }
    bpad(&b, align);
    size_t data_start = b.len;
    for (size_t k = 0; k < nt; k++) {
        size_t i = order[k] & 0xffffffffu;
        uint64_t n = m->rows[i] * m->cols[i];
        while (b.len < data_start + offs[k] && !b.oom)
            bgrow(&b, 1);
        uint8_t *d = bgrow(&b, type_bytes(types[k], n));
        if (d)
            store(types[k], m->data[i], n, d);
    }
    bpad(&b, align);
    return bflush(&b, path);
}

/* ---- safetensors --------------------------------------------------------------------------- */

static void hf_tensor_name(const struct gen_model *m, size_t i, char *buf, size_t n)
{
    static const char *const names[FORMAT_ROLE_COUNT] = {
        [FORMAT_ROLE_TOK_EMBD] = "model.embed_tokens.weight",
        [FORMAT_ROLE_ATTN_NORM] = "input_layernorm.weight",
        [FORMAT_ROLE_WQ] = "self_attn.q_proj.weight",
        [FORMAT_ROLE_WK] = "self_attn.k_proj.weight",
        [FORMAT_ROLE_WV] = "self_attn.v_proj.weight",
        [FORMAT_ROLE_WO] = "self_attn.o_proj.weight",
        [FORMAT_ROLE_FFN_NORM] = "post_attention_layernorm.weight",
        [FORMAT_ROLE_W_GATE] = "mlp.gate_proj.weight",
        [FORMAT_ROLE_W_UP] = "mlp.up_proj.weight",
        [FORMAT_ROLE_W_DOWN] = "mlp.down_proj.weight",
        [FORMAT_ROLE_OUT_NORM] = "model.norm.weight",
        [FORMAT_ROLE_CLASSIFIER] = "lm_head.weight",
    };
    if (m->layer[i] >= 0)
        snprintf(buf, n, "model.layers.%d.%s", m->layer[i], names[m->role[i]]);
    else
        snprintf(buf, n, "%s", names[m->role[i]]);
}

/* HF conversion of q/k (convert_llama_weights_to_hf.py's permute): HF row
 * h*hd + p*hd/2 + i holds interleaved row h*hd + 2i + p. */
static void to_rotate_half(const float *in, float *out, uint64_t rows, uint64_t cols,
                           uint32_t heads)
{
    uint64_t hd = rows / heads;
    for (uint64_t r = 0; r < rows; r++) {
        uint64_t h = r / hd, w = r % hd, p = w / (hd / 2), i = w % (hd / 2);
        memcpy(out + r * cols, in + (h * hd + 2 * i + p) * cols, sizeof(float) * cols);
    }
}

int gen_write_safetensors(const struct gen_model *m, const char *dir, const struct gen_st_opts *o)
{
    const struct format_config *c = &m->cfg;
    static const char *const dt[] = {[GEN_F32] = "F32", [GEN_F16] = "F16", [GEN_BF16] = "BF16"};
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char eos[32];
    snprintf(eos, sizeof eos, o->eos_list ? "[%u, 7]" : "%u", c->eos_id);
    char cfg[2048];
    int n =
        snprintf(cfg, sizeof cfg,
                 "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"model_type\": \"llama\",\n"
                 "  \"hidden_size\": %u,\n  \"intermediate_size\": %u,\n"
                 "  \"num_hidden_layers\": %u,\n  \"num_attention_heads\": %u,\n"
                 "  \"num_key_value_heads\": %u,\n  \"vocab_size\": %u,\n"
                 "  \"max_position_embeddings\": %u,\n  \"rms_norm_eps\": %.9g,\n"
                 "  \"rope_theta\": %.9g,\n  \"rope_scaling\": null,\n"
                 "  \"hidden_act\": \"silu\",\n  \"tie_word_embeddings\": %s,\n"
                 "  \"bos_token_id\": %u,\n  \"eos_token_id\": %s,\n"
                 "  \"torch_dtype\": \"float32\"\n}\n",
                 c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads, c->vocab_size,
                 c->seq_len, (double)c->norm_eps, (double)c->rope_theta,
                 c->tied_embedding ? "true" : "false", c->bos_id, eos);
    if (gen_write_file(path, cfg, (size_t)n))
        return -1;
    int shards = o->n_shards > 1 ? o->n_shards : 1;
    struct buf idx = {0};
    const char *head = "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {";
    bput(&idx, head, strlen(head));
    int first_idx = 1;
    for (int s = 0; s < shards; s++) {
        struct buf hdr = {0}, body = {0};
        bput(&hdr, "{\"__metadata__\": {\"format\": \"pt\"}", 33);
        char fname[128];
        if (shards == 1)
            snprintf(fname, sizeof fname, "model.safetensors");
        else
            snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", s + 1, shards);
        /* shard s holds tensors s, s + shards, ... in reverse order within the file */
        for (size_t k = m->n; k-- > 0;) {
            if ((int)(k % (size_t)shards) != s)
                continue;
            char name[128], ent[512];
            hf_tensor_name(m, k, name, sizeof name);
            uint64_t rows = m->rows[k], cols = m->cols[k], ne = rows * cols;
            float *src = m->data[k], *perm = NULL;
            if (m->role[k] == FORMAT_ROLE_WQ || m->role[k] == FORMAT_ROLE_WK) {
                perm = malloc(sizeof(float) * ne);
                if (!perm)
                    return -1;
                to_rotate_half(src, perm, rows, cols,
                               m->role[k] == FORMAT_ROLE_WQ ? c->n_heads : c->n_kv_heads);
                src = perm;
            }
            uint64_t a = body.len, bytes = type_bytes(o->dtype, ne);
            uint8_t *d = bgrow(&body, bytes);
            if (d)
                store(o->dtype, src, ne, d);
            free(perm);
            int len = cols == 1 ? snprintf(ent, sizeof ent,
                                           ", \"%s\": {\"dtype\": \"%s\", \"shape\": [%llu], "
                                           "\"data_offsets\": [%llu, %llu]}",
                                           name, dt[o->dtype], (unsigned long long)rows,
                                           (unsigned long long)a, (unsigned long long)(a + bytes))
                                : snprintf(ent, sizeof ent,
                                           ", \"%s\": {\"dtype\": \"%s\", \"shape\": [%llu, %llu], "
                                           "\"data_offsets\": [%llu, %llu]}",
                                           name, dt[o->dtype], (unsigned long long)rows,
                                           (unsigned long long)cols, (unsigned long long)a,
                                           (unsigned long long)(a + bytes));
            bput(&hdr, ent, (size_t)len);
            len = snprintf(ent, sizeof ent, "%s\"%s\": \"%s\"", first_idx ? "" : ", ", name, fname);
            bput(&idx, ent, (size_t)len);
            first_idx = 0;
        }
        bput(&hdr, "}", 1);
        while (hdr.len % 8 && !hdr.oom) /* the header is padded with spaces to 8 bytes */
            bput(&hdr, " ", 1);
        struct buf file = {0};
        bu64(&file, hdr.len);
        bput(&file, hdr.p, hdr.len);
        bput(&file, body.p, body.len);
        int bad = hdr.oom || body.oom;
        free(hdr.p);
        free(body.p);
        snprintf(path, sizeof path, "%s/%s", dir, fname);
        if (bflush(&file, path) || bad) {
            free(idx.p);
            return -1;
        }
    }
    bput(&idx, "}}\n", 3);
    if (shards == 1) {
        free(idx.p);
        return 0;
    }
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    return bflush(&idx, path);
}

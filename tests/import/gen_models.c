/* gen_models.c: writers of a small random model in the llama2.c, GGUF and
 * safetensors formats (see gen_models.h). Written from the format
 * descriptions (llama2.c run.c's layout, ggml docs/gguf.md, the safetensors
 * README), not from the importers, so the tests compare two readings. This
 * file: the model, element storage, the byte buffer and llama2.c; GGUF is
 * gen_gguf.c, safetensors gen_safetensors.c. */
#include "gen_internal.h"

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

uint64_t gen_type_bytes(enum gen_type t, uint64_t n)
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
void gen_store(enum gen_type t, const float *x, uint64_t n, uint8_t *out)
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
    uint8_t *tmp = malloc(gen_type_bytes(type, n) + 1);
    if (!tmp)
        abort();
    gen_store(type, m->data[i], n, tmp);
    load(type, tmp, n, out);
    free(tmp);
}

/* ---- a growable byte buffer ------------------------------------------------------------ */

uint8_t *bgrow(struct buf *b, size_t n)
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

void bput(struct buf *b, const void *p, size_t n)
{
    uint8_t *d = bgrow(b, n);
    if (d && n)
        memcpy(d, p, n);
}

void bu32(struct buf *b, uint32_t v)
{
    uint8_t *d = bgrow(b, 4);
    if (d)
        sl_store_le32(d, v);
}

void bu64(struct buf *b, uint64_t v)
{
    uint8_t *d = bgrow(b, 8);
    if (d)
        sl_store_le64(d, v);
}

void bu8(struct buf *b, uint8_t v)
{
    uint8_t *d = bgrow(b, 1);
    if (d)
        *d = v;
}

void bu16(struct buf *b, uint16_t v)
{
    uint8_t *d = bgrow(b, 2);
    if (d)
        sl_store_le16(d, v);
}

void bf32(struct buf *b, float v)
{
    uint8_t *d = bgrow(b, 4);
    if (d)
        sl_store_lef32(d, v);
}

void bpad(struct buf *b, size_t align)
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

int bflush(struct buf *b, const char *path)
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

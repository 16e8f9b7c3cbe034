/* format_common.c: roles, encodings, config checks and checksums, shared by
 * the reader and the writer. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "format_internal.h"

/* ---- roles ----------------------------------------------------------------- */

static const char *const role_names[FORMAT_ROLE_COUNT] = {
    [FORMAT_ROLE_TOK_EMBD] = "tok_embd",   [FORMAT_ROLE_ATTN_NORM] = "attn_norm",
    [FORMAT_ROLE_WQ] = "wq",               [FORMAT_ROLE_WK] = "wk",
    [FORMAT_ROLE_WV] = "wv",               [FORMAT_ROLE_WO] = "wo",
    [FORMAT_ROLE_FFN_NORM] = "ffn_norm",   [FORMAT_ROLE_W_GATE] = "w_gate",
    [FORMAT_ROLE_W_UP] = "w_up",           [FORMAT_ROLE_W_DOWN] = "w_down",
    [FORMAT_ROLE_OUT_NORM] = "out_norm",   [FORMAT_ROLE_CLASSIFIER] = "classifier",
};

const char *format_role_name(enum format_role role)
{
    return (unsigned)role < FORMAT_ROLE_COUNT ? role_names[role] : "unknown";
}

void format_tensor_name(int layer, enum format_role role, char *buf, size_t n)
{
    static const char *const names[FORMAT_ROLE_COUNT] = {
        [FORMAT_ROLE_TOK_EMBD] = "token_embd",
        [FORMAT_ROLE_ATTN_NORM] = "attn_norm",
        [FORMAT_ROLE_WQ] = "attn_q",
        [FORMAT_ROLE_WK] = "attn_k",
        [FORMAT_ROLE_WV] = "attn_v",
        [FORMAT_ROLE_WO] = "attn_output",
        [FORMAT_ROLE_FFN_NORM] = "ffn_norm",
        [FORMAT_ROLE_W_GATE] = "ffn_gate",
        [FORMAT_ROLE_W_UP] = "ffn_up",
        [FORMAT_ROLE_W_DOWN] = "ffn_down",
        [FORMAT_ROLE_OUT_NORM] = "output_norm",
        [FORMAT_ROLE_CLASSIFIER] = "output",
    };
    if (layer >= 0)
        snprintf(buf, n, "blk.%d.%s.weight", layer, names[role]);
    else
        snprintf(buf, n, "%s.weight", names[role]);
}

int format_role_is_linear(enum format_role role)
{
    switch (role) {
    case FORMAT_ROLE_WQ:
    case FORMAT_ROLE_WK:
    case FORMAT_ROLE_WV:
    case FORMAT_ROLE_WO:
    case FORMAT_ROLE_W_GATE:
    case FORMAT_ROLE_W_UP:
    case FORMAT_ROLE_W_DOWN:
    case FORMAT_ROLE_CLASSIFIER:
        return 1;
    default:
        return 0;
    }
}

static int role_is_layer(uint32_t role)
{
    return role >= FORMAT_ROLE_ATTN_NORM && role <= FORMAT_ROLE_W_DOWN;
}

uint32_t fmt_tensor_slice_kind(const struct format_config *c, int32_t layer, uint32_t role)
{
    if (layer >= 0)
        return FORMAT_SLICE_LAYER;
    if (role == FORMAT_ROLE_TOK_EMBD && !c->tied_embedding)
        return FORMAT_SLICE_EMBED;
    return FORMAT_SLICE_HEAD;
}

int fmt_exec_rank(uint32_t role)
{
    /* Inside the head slice the final norm runs before the classifier, which
     * in a tied model is the embedding tensor. */
    switch (role) {
    case FORMAT_ROLE_OUT_NORM:
        return 100;
    case FORMAT_ROLE_CLASSIFIER:
    case FORMAT_ROLE_TOK_EMBD:
        return role == FORMAT_ROLE_TOK_EMBD ? 101 : 102;
    default:
        return (int)role;
    }
}

/* ---- encodings ---------------------------------------------------------------- */

static uint64_t size_f32(uint64_t rows, uint64_t cols)
{
    uint64_t n;
    if (sl_mul_u64(rows, cols, &n) || sl_mul_u64(n, 4, &n))
        return 0;
    return n;
}

static uint64_t size_16(uint64_t rows, uint64_t cols)
{
    uint64_t n;
    if (sl_mul_u64(rows, cols, &n) || sl_mul_u64(n, 2, &n))
        return 0;
    return n;
}

static uint64_t size_q8(uint64_t rows, uint64_t cols)
{
    uint64_t n, s;
    if (sl_mul_u64(rows, cols, &n) || sl_mul_u64(rows, 4, &s))
        return 0;
    s = sl_align_up(s, 64);
    if (sl_add_u64(s, n, &n))
        return 0;
    return n;
}

int format_q8_validate_rows(const void *data, uint64_t rows, uint64_t cols, uint64_t r0,
                            uint64_t r1, struct sl_err *err)
{
    const uint8_t *p = data;
    for (uint64_t r = r0; r < r1; r++) {
        float s = sl_load_lef32(p + 4 * r);
        if (!isfinite(s) || s < 0) {
            sl_err_set(err, "q8 tensor: scale of row %" PRIu64 " is %g", r, (double)s);
            return -EINVAL;
        }
    }
    /* memchr: the scan runs on every verified read, at memory speed */
    const uint8_t *q = p + sl_align_up(rows * 4, 64);
    const uint8_t *bad = memchr(q + r0 * cols, 0x80, (size_t)((r1 - r0) * cols));
    if (bad) {
        sl_err_set(err, "q8 tensor: code -128 at row %" PRIu64 " (codes are -127..127)",
                   (uint64_t)(bad - q) / cols);
        return -EINVAL;
    }
    return 0;
}

static int validate_q8(const void *data, uint64_t len, uint64_t rows, uint64_t cols,
                       struct sl_err *err)
{
    (void)len;
    return format_q8_validate_rows(data, rows, cols, 0, rows, err);
}

static const struct format_encoding_traits enc_traits[FORMAT_ENC_COUNT] = {
    [FORMAT_ENC_F32] = {"f32", 0, size_f32, NULL},
    [FORMAT_ENC_F16] = {"f16", 0, size_16, NULL},
    [FORMAT_ENC_BF16] = {"bf16", 0, size_16, NULL},
    [FORMAT_ENC_Q8_CHANNEL] = {"q8", 1, size_q8, validate_q8},
    [FORMAT_ENC_ADAPTIVE] = {"adaptive", 1, NULL, format_enc_adaptive_validate},
    [FORMAT_ENC_INT4INT8] = {"int4int8", 1, NULL, format_enc_int4int8_validate},
    [FORMAT_ENC_BITPLANE] = {"bitplane", 1, NULL, format_enc_bitplane_validate},
};

const struct format_encoding_traits *format_encoding_traits(uint32_t encoding)
{
    if (encoding >= FORMAT_ENC_COUNT)
        return NULL;
    const struct format_encoding_traits *t = &enc_traits[encoding];
    if (!t->size && !t->validate)
        return NULL; /* layout not built into this version */
    return t;
}

/* ---- config ------------------------------------------------------------------ */

int format_config_validate(const struct format_config *c, const char *what,
                           struct sl_err *err)
{
    if (c->arch != FORMAT_ARCH_LLAMA) {
        sl_err_set(err, "%s: unsupported architecture %u (only llama, 1)", what, c->arch);
        return -EINVAL;
    }
#define NEED(cond, ...)                                                                    \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            sl_err_set(err, __VA_ARGS__);                                                  \
            return -EINVAL;                                                                \
        }                                                                                  \
    } while (0)
    const uint32_t lim = 1u << 20; /* 1M: far above any real width; keeps products in 64 bits */
    NEED(c->dim > 0 && c->dim <= lim, "%s: bad model width dim=%u", what, c->dim);
    NEED(c->hidden_dim > 0 && c->hidden_dim <= lim, "%s: bad FFN width hidden_dim=%u", what,
         c->hidden_dim);
    NEED(c->n_layers > 0 && c->n_layers <= 4096, "%s: bad layer count %u", what, c->n_layers);
    NEED(c->n_heads > 0 && c->n_heads <= 4096, "%s: bad head count %u", what, c->n_heads);
    NEED(c->n_kv_heads > 0 && c->n_kv_heads <= c->n_heads && c->n_heads % c->n_kv_heads == 0,
         "%s: %u kv heads do not divide %u heads", what, c->n_kv_heads, c->n_heads);
    NEED(c->head_dim > 0 && c->head_dim % 2 == 0 && c->head_dim <= 4096,
         "%s: bad head_dim %u (must be even)", what, c->head_dim);
    NEED((uint64_t)c->head_dim * c->n_heads == c->dim,
         "%s: dim %u is not n_heads %u x head_dim %u", what, c->dim, c->n_heads, c->head_dim);
    NEED(c->vocab_size > 0 && c->vocab_size <= (1u << 24), "%s: bad vocab_size %u", what,
         c->vocab_size);
    NEED(c->seq_len > 0 && c->seq_len <= (1u << 24), "%s: bad seq_len %u", what, c->seq_len);
    NEED(c->tied_embedding <= 1, "%s: bad tied_embedding flag %u", what, c->tied_embedding);
    NEED(c->rope_layout == FORMAT_ROPE_INTERLEAVED, "%s: unknown RoPE layout %u", what,
         c->rope_layout);
    NEED(c->bos_id < c->vocab_size && c->eos_id < c->vocab_size,
         "%s: BOS %u / EOS %u outside the vocabulary of %u", what, c->bos_id, c->eos_id,
         c->vocab_size);
    NEED(isfinite(c->rope_theta) && c->rope_theta > 0, "%s: bad rope_theta %g", what,
         (double)c->rope_theta);
    NEED(isfinite(c->norm_eps) && c->norm_eps > 0 && c->norm_eps < 1, "%s: bad norm_eps %g",
         what, (double)c->norm_eps);
#undef NEED
    return 0;
}

void fmt_config_store(uint8_t *p, const struct format_config *c)
{
    const uint32_t u[13] = {c->arch,       c->dim,        c->hidden_dim, c->n_layers,
                            c->n_heads,    c->n_kv_heads, c->head_dim,   c->vocab_size,
                            c->seq_len,    c->tied_embedding, c->rope_layout, c->bos_id,
                            c->eos_id};
    memset(p, 0, FMT_CONFIG_SIZE);
    for (int i = 0; i < 13; i++)
        sl_store_le32(p + 4 * i, u[i]);
    sl_store_lef32(p + 52, c->rope_theta);
    sl_store_lef32(p + 56, c->norm_eps);
}

void fmt_config_load(const uint8_t *p, struct format_config *c)
{
    uint32_t *u[13] = {&c->arch,    &c->dim,        &c->hidden_dim, &c->n_layers, &c->n_heads,
                       &c->n_kv_heads, &c->head_dim, &c->vocab_size, &c->seq_len,
                       &c->tied_embedding, &c->rope_layout, &c->bos_id, &c->eos_id};
    for (int i = 0; i < 13; i++)
        *u[i] = sl_load_le32(p + 4 * i);
    c->rope_theta = sl_load_lef32(p + 52);
    c->norm_eps = sl_load_lef32(p + 56);
}

int format_role_shape(const struct format_config *c, uint32_t role, uint32_t *n_dims,
                   uint64_t shape[2])
{
    uint64_t q = (uint64_t)c->n_heads * c->head_dim;
    uint64_t kv = (uint64_t)c->n_kv_heads * c->head_dim;
    *n_dims = 2;
    switch (role) {
    case FORMAT_ROLE_TOK_EMBD:
        shape[0] = c->vocab_size, shape[1] = c->dim;
        return 0;
    case FORMAT_ROLE_CLASSIFIER:
        if (c->tied_embedding)
            return -EINVAL;
        shape[0] = c->vocab_size, shape[1] = c->dim;
        return 0;
    case FORMAT_ROLE_ATTN_NORM:
    case FORMAT_ROLE_FFN_NORM:
    case FORMAT_ROLE_OUT_NORM:
        *n_dims = 1;
        shape[0] = c->dim, shape[1] = 0;
        return 0;
    case FORMAT_ROLE_WQ:
        shape[0] = q, shape[1] = c->dim;
        return 0;
    case FORMAT_ROLE_WK:
    case FORMAT_ROLE_WV:
        shape[0] = kv, shape[1] = c->dim;
        return 0;
    case FORMAT_ROLE_WO:
        shape[0] = c->dim, shape[1] = q;
        return 0;
    case FORMAT_ROLE_W_GATE:
    case FORMAT_ROLE_W_UP:
        shape[0] = c->hidden_dim, shape[1] = c->dim;
        return 0;
    case FORMAT_ROLE_W_DOWN:
        shape[0] = c->dim, shape[1] = c->hidden_dim;
        return 0;
    default:
        return -EINVAL;
    }
}

int format_act_scale_valid(float s)
{
    return s == 0.0f || (s > 0.0f && isfinite(s));
}

int fmt_check_tensor_meta(const struct format_config *c, const char *name, int32_t layer,
                          uint32_t role, uint32_t encoding, uint32_t n_dims, const uint64_t *shape,
                          uint64_t length, float act_scale, const char *what, struct sl_err *err)
{
    if (role >= FORMAT_ROLE_COUNT) {
        sl_err_set(err, "%s: tensor '%s' has unknown role %u", what, name, role);
        return -EINVAL;
    }
    if (role_is_layer(role) ? (layer < 0 || (uint32_t)layer >= c->n_layers) : layer != -1) {
        sl_err_set(err, "%s: tensor '%s' (%s) has layer %d, outside the model's %u layers", what,
                   name, format_role_name(role), layer, c->n_layers);
        return -EINVAL;
    }
    uint32_t nd;
    uint64_t want[2];
    if (format_role_shape(c, role, &nd, want) < 0) {
        sl_err_set(err, "%s: tensor '%s': a tied model has no separate classifier", what, name);
        return -EINVAL;
    }
    if (n_dims != nd || shape[0] != want[0] || (nd == 2 && shape[1] != want[1])) {
        sl_err_set(err,
                   "%s: tensor '%s' (%s) has shape [%" PRIu64 ", %" PRIu64 "] (%u dims), the "
                   "config implies [%" PRIu64 ", %" PRIu64 "] (%u dims)",
                   what, name, format_role_name(role), shape[0], n_dims > 1 ? shape[1] : 0,
                   n_dims, want[0], want[1], nd);
        return -EINVAL;
    }
    for (uint32_t i = n_dims; i < FORMAT_MAX_DIMS; i++) {
        if (shape[i] != 0) {
            sl_err_set(err, "%s: tensor '%s' has a non-zero unused dimension", what, name);
            return -EINVAL;
        }
    }
    const struct format_encoding_traits *t = format_encoding_traits(encoding);
    if (!t) {
        sl_err_set(err, "%s: tensor '%s' uses encoding %u, which this build does not support",
                   what, name, encoding);
        return -EINVAL;
    }
    if (nd == 1 && t->quantized) {
        sl_err_set(err, "%s: tensor '%s' (%s) must be stored as float, not %s", what, name,
                   format_role_name(role), t->name);
        return -EINVAL;
    }
    uint64_t rows = shape[0], cols = nd == 2 ? shape[1] : 1;
    if (t->size) {
        uint64_t expect = t->size(rows, cols);
        if (expect == 0 || expect != length) {
            sl_err_set(err, "%s: tensor '%s' is %" PRIu64 " bytes, %s [%" PRIu64 ", %" PRIu64
                            "] needs %" PRIu64,
                       what, name, length, t->name, rows, cols, expect);
            return -EINVAL;
        }
    } else if (length == 0) {
        sl_err_set(err, "%s: tensor '%s' is empty", what, name);
        return -EINVAL;
    }
    if (!format_act_scale_valid(act_scale)) {
        /* never fall back to dynamic scaling: the value is a broken calibration */
        sl_err_set(err,
                   "%s: tensor '%s' has activation scale %g; it must be positive and finite, "
                   "or 0 for dynamic scaling",
                   what, name, (double)act_scale);
        return -EINVAL;
    }
    return 0;
}

/* ---- checksums and helpers ------------------------------------------------------ */

uint64_t fmt_checksum_portable(const void *data, size_t len)
{
    return XXH3_64bits(data, len);
}

uint64_t format_checksum(const void *data, size_t len)
{
#if SLUICE_KERNELS_X86
    if (sl_cpu_features()->avx512)
        return fmt_checksum_avx512(data, len);
#endif
    return fmt_checksum_portable(data, len);
}

/* format_hash: one state of whichever way format_checksum takes, chosen at
 * creation (the two ways' states are not interchangeable) */
struct format_hash {
    int avx512;
    void *st;
};

struct format_hash *format_hash_new(void)
{
    struct format_hash *h = sl_malloc(sizeof *h);
    if (!h)
        return NULL;
    h->avx512 = 0;
#if SLUICE_KERNELS_X86
    h->avx512 = sl_cpu_features()->avx512;
    if (h->avx512)
        h->st = fmt_hash_avx512_new();
    else
#endif
    {
        h->st = XXH3_createState();
        if (h->st)
            (void)XXH3_64bits_reset(h->st);
    }
    if (!h->st) {
        free(h);
        return NULL;
    }
    return h;
}

void format_hash_reset(struct format_hash *h)
{
#if SLUICE_KERNELS_X86
    if (h->avx512) {
        fmt_hash_avx512_reset(h->st);
        return;
    }
#endif
    (void)XXH3_64bits_reset(h->st);
}

void format_hash_update(struct format_hash *h, const void *data, size_t len)
{
#if SLUICE_KERNELS_X86
    if (h->avx512) {
        fmt_hash_avx512_update(h->st, data, len);
        return;
    }
#endif
    (void)XXH3_64bits_update(h->st, data, len); /* fails only for NULL data, never passed */
}

uint64_t format_hash_digest(const struct format_hash *h)
{
#if SLUICE_KERNELS_X86
    if (h->avx512)
        return fmt_hash_avx512_digest(h->st);
#endif
    return XXH3_64bits_digest(h->st);
}

void format_hash_free(struct format_hash *h)
{
    if (!h)
        return;
#if SLUICE_KERNELS_X86
    if (h->avx512)
        fmt_hash_avx512_free(h->st);
    else
#endif
        (void)XXH3_freeState(h->st);
    free(h);
}

uint64_t format_tensor_numel(const struct format_tensor_info *t)
{
    return t->n_dims >= 2 ? t->shape[0] * t->shape[1] : t->shape[0];
}

int format_decode_float(uint32_t encoding, const void *src, float *dst, uint64_t n)
{
    const uint8_t *p = src;
    switch (encoding) {
    case FORMAT_ENC_F32:
        for (uint64_t i = 0; i < n; i++)
            dst[i] = sl_load_lef32(p + 4 * i);
        return 0;
    case FORMAT_ENC_F16:
        for (uint64_t i = 0; i < n; i++)
            dst[i] = sl_f16_to_f32(sl_load_le16(p + 2 * i));
        return 0;
    case FORMAT_ENC_BF16:
        for (uint64_t i = 0; i < n; i++)
            dst[i] = sl_bf16_to_f32(sl_load_le16(p + 2 * i));
        return 0;
    default:
        return -EINVAL;
    }
}

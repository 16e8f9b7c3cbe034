/* infer_ops.c: the CPU operators of a Llama layer, in float (llama2.c's run.c
 * math, batched over rows). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "infer_internal.h"
#include "infer_matmul.h"
#include "npu.h"
#include "unpack.h"

/* one row's sum of squares, element by element (a product, then a sum) */
float infer_rmsnorm_ss_scalar(const float *xr, uint32_t d)
{
    float ss = 0.0f;
    for (uint32_t j = 0; j < d; j++)
        ss += xr[j] * xr[j];
    return ss;
}

void infer_rmsnorm_scalar(float *out, const float *x, const float *w, uint32_t n, uint32_t d,
                          float eps)
{
    for (uint32_t r = 0; r < n; r++) {
        const float *xr = x + (size_t)r * d;
        float *o = out + (size_t)r * d;
        float ss = infer_rmsnorm_ss_scalar(xr, d);
        ss /= (float)d;
        ss += eps;
        ss = 1.0f / sqrtf(ss);
        for (uint32_t j = 0; j < d; j++)
            o[j] = w[j] * (ss * xr[j]);
    }
}

void infer_op_rmsnorm(float *out, const float *x, const float *w, uint32_t n, uint32_t d, float eps)
{
#if SLUICE_KERNELS_X86
    enum infer_matmul_kernel k = infer_matmul_kernel_used();
    if (k == INFER_MATMUL_AVX512 && infer_matmul_kernel_available(k)) {
        infer_rmsnorm_avx512(out, x, w, n, d, eps); /* the same bits, 16 rows at a time */
        return;
    }
#endif
    infer_rmsnorm_scalar(out, x, w, n, d, eps);
}

void infer_rope_pairs_scalar(float *xh, const float *cos_tab, const float *sin_tab, uint32_t half)
{
    for (uint32_t j = 0; j < half; j++) {
        float v0 = xh[2 * j], v1 = xh[2 * j + 1];
        xh[2 * j] = v0 * cos_tab[j] - v1 * sin_tab[j];
        xh[2 * j + 1] = v0 * sin_tab[j] + v1 * cos_tab[j];
    }
}

/* freq of pair i = theta^(-2i / head_dim), computed as run.c does */
static void rope_freqs(float *freq_tab, uint32_t half, uint32_t head_dim, float theta)
{
    for (uint32_t i = 0; i < half; i++)
        freq_tab[i] = 1.0f / powf(theta, (float)(2 * i) / (float)head_dim);
}

/* one rotation per pair and position (the same for every head) */
static void rope_row_table(float *cos_tab, float *sin_tab, const float *freq_tab, uint32_t half,
                           uint32_t position)
{
    float pos = (float)position;
    for (uint32_t j = 0; j < half; j++) {
        float val = pos * freq_tab[j];
        cos_tab[j] = cosf(val);
        sin_tab[j] = sinf(val);
    }
}

/* heads [h0, h1) of one row with its tables */
static void rope_row(float *xr, uint32_t head_dim, uint32_t h0, uint32_t h1, const float *cos_tab,
                     const float *sin_tab, int avx512)
{
    uint32_t half = head_dim / 2;
#if SLUICE_KERNELS_X86
    if (avx512) { /* the same products and sums, 8 pairs at a time */
        for (uint32_t h = h0; h < h1; h++)
            infer_rope_pairs_avx512(xr + (size_t)h * head_dim, cos_tab, sin_tab, half);
        return;
    }
#endif
    (void)avx512;
    for (uint32_t h = h0; h < h1; h++)
        infer_rope_pairs_scalar(xr + (size_t)h * head_dim, cos_tab, sin_tab, half);
}

static int rope_avx512(void)
{
#if SLUICE_KERNELS_X86
    enum infer_matmul_kernel k = infer_matmul_kernel_used();
    return k == INFER_MATMUL_AVX512 && infer_matmul_kernel_available(k);
#else
    return 0;
#endif
}

int infer_rope_table_init(struct infer_rope_table *t, const uint32_t *pos, uint32_t n,
                          uint32_t head_dim, float theta)
{
    memset(t, 0, sizeof *t);
    uint32_t half = head_dim / 2;
    if (half > 512)
        return 0; /* no table: wide heads compute per use (infer_op_rope_heads) */
    float freq_tab[512];
    rope_freqs(freq_tab, half, head_dim, theta);
    size_t len = (size_t)n * half;
    t->cos = sl_malloc(sizeof(float) * (len ? len : 1));
    t->sin = sl_malloc(sizeof(float) * (len ? len : 1));
    if (!t->cos || !t->sin) {
        infer_rope_table_fini(t);
        return -ENOMEM;
    }
    for (uint32_t r = 0; r < n; r++)
        rope_row_table(t->cos + (size_t)r * half, t->sin + (size_t)r * half, freq_tab, half,
                       pos[r]);
    t->n = n;
    t->half = half;
    return 0;
}

void infer_rope_table_fini(struct infer_rope_table *t)
{
    free(t->cos);
    free(t->sin);
    memset(t, 0, sizeof *t);
}

void infer_op_rope_table(float *x, uint32_t n, uint32_t n_heads, uint32_t head_dim, uint32_t h0,
                         uint32_t h1, const struct infer_rope_table *t, uint32_t r0)
{
    int avx512 = rope_avx512();
    size_t width = (size_t)n_heads * head_dim;
    for (uint32_t r = 0; r < n; r++)
        rope_row(x + r * width, head_dim, h0, h1, t->cos + (size_t)(r0 + r) * t->half,
                 t->sin + (size_t)(r0 + r) * t->half, avx512);
}

void infer_op_rope_heads(float *x, uint32_t n, uint32_t n_heads, uint32_t head_dim, uint32_t h0,
                         uint32_t h1, uint32_t pos0, float theta)
{
    /* the frequency table is shared by every head and row (heads wider than
     * 1024 compute it per use) */
    float freq_tab[512];
    uint32_t half = head_dim / 2;
    int tab = half <= 512;
    if (tab)
        rope_freqs(freq_tab, half, head_dim, theta);
    uint32_t width = n_heads * head_dim;
    float cos_tab[512], sin_tab[512];
    int avx512 = rope_avx512();
    for (uint32_t r = 0; tab && r < n; r++) {
        rope_row_table(cos_tab, sin_tab, freq_tab, half, pos0 + r);
        rope_row(x + (size_t)r * width, head_dim, h0, h1, cos_tab, sin_tab, avx512);
    }
    for (uint32_t r = 0; !tab && r < n; r++) {
        float pos = (float)(pos0 + r);
        float *xr = x + (size_t)r * width;
        for (uint32_t i = h0 * head_dim; i < h1 * head_dim; i += 2) {
            uint32_t hd = i % head_dim;
            float freq = 1.0f / powf(theta, (float)hd / (float)head_dim);
            float val = pos * freq;
            float fcr = cosf(val), fci = sinf(val);
            float v0 = xr[i], v1 = xr[i + 1];
            xr[i] = v0 * fcr - v1 * fci;
            xr[i + 1] = v0 * fci + v1 * fcr;
        }
    }
}

void infer_op_rope(float *x, uint32_t n, uint32_t n_heads, uint32_t head_dim, uint32_t pos0,
                   float theta)
{
    infer_op_rope_heads(x, n, n_heads, head_dim, 0, n_heads, pos0, theta);
}

void infer_op_rope_rows(float *x, uint32_t n, uint32_t n_heads, uint32_t head_dim, uint32_t h0,
                        uint32_t h1, const uint32_t *pos, float theta)
{
    /* runs of consecutive positions in one call: one frequency table each */
    size_t width = (size_t)n_heads * head_dim;
    for (uint32_t r0 = 0, r1; r0 < n; r0 = r1) {
        for (r1 = r0 + 1; r1 < n && pos[r1] == pos[r1 - 1] + 1; r1++)
            ;
        infer_op_rope_heads(x + r0 * width, r1 - r0, n_heads, head_dim, h0, h1, pos[r0], theta);
    }
}

/* Keys transposed for group_rows_kt (its heap buffer): at most this many floats
 * (a 64-wide head's INFER_ATT_GROUP_T keys, 192 KiB). */
#define ATT_KT_FLOATS (64u * INFER_ATT_GROUP_T)
/* Fewer grouped rows than this keep the row loop: transposing the keys
 * costs about what 2 rows' scores cost (decoding's one row would pay it
 * every step). */
#define ATT_KT_MIN_ROWS 16u

/* infer_op_attention's grouped rows [0, ng) with the scores taken against
 * the keys transposed (infer_attn_scores_kt_avx512: the same bits as the
 * row loop's infer_matmul_nt and the softmax's first step, without the
 * horizontal sums), a kv group at a time; returns the rows done: ng, or 0
 * where it does not apply (not the AVX-512 kernel, few rows, a head size
 * it does not take, more keys than the buffer holds). */
static uint32_t group_rows_kt(float *out, const float *q, const float *key_cache,
                              const float *value_cache, uint32_t ng, uint32_t pos0,
                              const struct format_config *c, uint32_t h0, uint32_t h1, float *att)
{
#if SLUICE_KERNELS_X86
    enum infer_matmul_kernel k = infer_matmul_kernel_used();
    uint32_t hs = c->head_dim, kv_mul = c->n_heads / c->n_kv_heads;
    size_t qdim = (size_t)c->n_heads * hs, kv_dim = (size_t)c->n_kv_heads * hs;
    uint32_t ldt = (pos0 + ng + 15) & ~15u;
    if (k != INFER_MATMUL_AVX512 || !infer_matmul_kernel_available(k) || ng < ATT_KT_MIN_ROWS ||
        !INFER_ATT_KT_HS(hs) || (size_t)hs * ldt > ATT_KT_FLOATS)
        return 0;
    /* on the heap, not the stack: a worker's stack need not hold 192 KiB
     * (and a frame that large, set up in every call's prologue, jumped past
     * the guard page); without memory the row loop does it, same bits */
    float *kt = sl_alloc_aligned((size_t)hs * ldt * sizeof(float), 64);
    if (!kt)
        return 0;
    float maxv[INFER_ATT_ROWS];
    float sq = sqrtf((float)hs);
    for (uint32_t g = h0 / kv_mul; g < h1 / kv_mul; g++) {
        const float *vh = value_cache + (size_t)g * hs;
        infer_keys_transpose(kt, ldt, key_cache + (size_t)g * hs, kv_dim, pos0 + ng, hs);
        for (uint32_t r = 0; r < ng; r++) {
            uint32_t T = pos0 + r + 1;
            size_t off = (size_t)r * qdim + (size_t)g * kv_mul * hs;
            infer_attn_scores_kt_avx512(att, T, q + off, hs, kv_mul, kt, ldt, T, hs, sq, maxv);
            for (uint32_t i = 0; i < kv_mul; i++)
                infer_softmax_after_max(k, att + (size_t)i * T, T, maxv[i]);
            infer_matmul_nn(k, out + off, hs, att, T, vh, kv_dim, kv_mul, T, hs);
        }
    }
    sl_free_aligned(kt);
    return ng;
#else
    (void)out, (void)q, (void)key_cache, (void)value_cache, (void)ng, (void)pos0, (void)c;
    (void)h0, (void)h1, (void)att;
    return 0;
#endif
}

void infer_op_attention(float *out, const float *q, const float *key_cache,
                        const float *value_cache, uint32_t n, uint32_t pos0,
                        const struct format_config *c, uint32_t h0, uint32_t h1, float *att)
{
    uint32_t hs = c->head_dim;
    uint32_t qdim = c->n_heads * hs, kv_dim = c->n_kv_heads * hs;
    uint32_t kv_mul = c->n_heads / c->n_kv_heads;
    float sq = sqrtf((float)hs);
    enum infer_matmul_kernel k = infer_matmul_kernel_used();
    if (kv_mul > 1 && kv_mul <= INFER_ATT_ROWS && h0 % kv_mul == 0 && h1 % kv_mul == 0) {
        /* grouped-query attention, a row at a time (decoding's one row, and
         * a prefill's rows while they see at most INFER_ATT_GROUP_T keys):
         * the query heads of a kv head as the rows of one product, each key
         * and value row read once per group, not once per head, and over
         * exactly the keys the row sees (a block of rows scores keys past
         * its first rows, then masks them); every score and output is
         * computed exactly as one head alone (the kernels' sums do not depend
         * on the rows around, and the zeros a mask adds do not change a sum).
         * Past INFER_ATT_GROUP_T keys the blocks below are faster: a block's
         * 16 rows share each key block from L1, a row's group only 8 */
        uint32_t ng = n == 1                         ? 1
                      : pos0 >= INFER_ATT_GROUP_T    ? 0
                      : n < INFER_ATT_GROUP_T - pos0 ? n
                                                     : INFER_ATT_GROUP_T - pos0;
        for (uint32_t r = group_rows_kt(out, q, key_cache, value_cache, ng, pos0, c, h0, h1, att);
             r < ng; r++) {
            uint32_t T = pos0 + r + 1;
            for (uint32_t g = h0 / kv_mul; g < h1 / kv_mul; g++) {
                const float *kh = key_cache + (size_t)g * hs, *vh = value_cache + (size_t)g * hs;
                size_t off = (size_t)r * qdim + (size_t)g * kv_mul * hs;
                infer_matmul_nt(k, att, T, q + off, hs, kh, INFER_W_F32, kv_dim, kv_mul, hs, 0, T);
                for (uint32_t i = 0; i < kv_mul; i++)
                    infer_softmax_scaled(k, att + (size_t)i * T, T, sq);
                infer_matmul_nn(k, out + off, hs, att, T, vh, kv_dim, kv_mul, T, hs);
            }
        }
        /* the rest in blocks (a row's bits do not depend on its block) */
        q += (size_t)ng * qdim;
        out += (size_t)ng * qdim;
        pos0 += ng;
        n -= ng;
    }
    for (uint32_t h = h0; h < h1; h++) {
        const float *kh = key_cache + (size_t)(h / kv_mul) * hs;   /* [t][kv_dim] */
        const float *vh = value_cache + (size_t)(h / kv_mul) * hs; /* [t][kv_dim] */
        for (uint32_t b0 = 0; b0 < n; b0 += INFER_ATT_ROWS) {
            uint32_t nb = n - b0 < INFER_ATT_ROWS ? n - b0 : INFER_ATT_ROWS;
            uint32_t T = pos0 + b0 + nb; /* keys the block's last row sees */
            const float *qb = q + (size_t)b0 * qdim + (size_t)h * hs;
            /* att[i][t] = q_i . k_t for the block's rows i and t < T */
            infer_matmul_nt(k, att, T, qb, qdim, kh, INFER_W_F32, kv_dim, nb, hs, 0, T);
            for (uint32_t i = 0; i < nb; i++) {
                /* row i is at position pos0 + b0 + i and sees keys 0..that */
                float *a = att + (size_t)i * T;
                uint32_t len = pos0 + b0 + i + 1;
                infer_softmax_scaled(k, a, len, sq); /* run.c normalizes, then weights v */
                if (T > len)                         /* causal mask: adds exact zeros below */
                    memset(a + len, 0, sizeof(float) * (T - len));
            }
            /* out_i = sum_t att[i][t] v_t */
            infer_matmul_nn(k, out + (size_t)b0 * qdim + (size_t)h * hs, qdim, att, T, vh, kv_dim,
                            nb, T, hs);
        }
    }
}

void infer_op_swiglu(float *h, const float *g, const float *u, size_t n)
{
    /* silu(g) = g / (1 + exp(-g)), with the softmax's exp (one definition,
     * the same bits on every kernel), in blocks that stay in L1 */
    enum infer_matmul_kernel k = infer_matmul_kernel_used();
#if SLUICE_KERNELS_X86
    if (k == INFER_MATMUL_AVX512 && infer_matmul_kernel_available(k)) {
        infer_swiglu_avx512(h, g, u, n); /* the same arithmetic in one pass */
        return;
    }
#endif
    float e[256];
    for (size_t i0 = 0; i0 < n; i0 += 256) {
        uint32_t nb = n - i0 < 256 ? (uint32_t)(n - i0) : 256;
        for (uint32_t j = 0; j < nb; j++)
            e[j] = -g[i0 + j];
        (void)infer_exp_sum(k, e, nb, 0.0f);
        for (uint32_t j = 0; j < nb; j++) {
            float val = g[i0 + j];
            val *= 1.0f / (1.0f + e[j]);
            h[i0 + j] = val * u[i0 + j];
        }
    }
}

void infer_op_add(float *x, const float *y, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] += y[i];
}

int infer_op_embed(const struct infer_model *m, const int *tokens, uint32_t n, float *x,
                   struct sl_err *err)
{
    const struct infer_linear *e = &m->embed;
    uint32_t d = m->cfg.dim;
    for (uint32_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || (uint32_t)tokens[i] >= m->cfg.vocab_size) {
            sl_err_set(err, "token id %d outside the vocabulary of %u", tokens[i],
                       m->cfg.vocab_size);
            return -EINVAL;
        }
        size_t row = (size_t)tokens[i];
        float *xi = x + (size_t)i * d;
        if (e->w && e->wtype == INFER_W_F32) {
            memcpy(xi, (const float *)e->w + row * d, d * sizeof(float));
        } else if (e->w) {
            const uint16_t *h = (const uint16_t *)e->w + row * d;
            for (uint32_t j = 0; j < d; j++)
                xi[j] = e->wtype == INFER_W_F16 ? sl_f16_to_f32(h[j]) : sl_bf16_to_f32(h[j]);
        } else if (e->q) {
            const int8_t *q = e->q + row * d;
            float s = e->scale[row];
            for (uint32_t j = 0; j < d; j++)
                xi[j] = s * (float)q[j];
        } else if (e->upk || e->npu) {
            /* packed (a row unpacked on demand) or the NPU's copy (tied) */
            int8_t buf[4096], *q = d <= sizeof buf ? buf : malloc(d);
            if (!q) {
                sl_err_set(err, "out of memory");
                return -ENOMEM;
            }
            float s;
            if (e->upk) {
                if (unpack_tensor_rows(e->upk, unpack_kernel_best(), (uint32_t)row,
                                       (uint32_t)row + 1, q, NULL) < 0) {
                    if (q != buf)
                        free(q);
                    sl_err_set(err, "out of memory unpacking an embedding row");
                    return -ENOMEM;
                }
                s = unpack_tensor_scale(e->upk, (uint32_t)row);
            } else {
                npu_weights_row(e->npu, (uint32_t)row, q);
                s = npu_weights_scale(e->npu, (uint32_t)row);
            }
            for (uint32_t j = 0; j < d; j++)
                xi[j] = s * (float)q[j];
            if (q != buf)
                free(q);
        } else {
            sl_err_set(err, "the embedding has no weights");
            return -EINVAL;
        }
    }
    return 0;
}

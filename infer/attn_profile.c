/* attn_profile.c: sparse attention's offline profile (shadowAttn 3.2-3.3):
 * head and layer importance as the loss increase when their attention
 * output is zeroed (an attention implementation wrapping the dense one),
 * the mean per-call Q and K scales, per-op costs for the plan, and the
 * attn.* metadata keys that store them (docs/FORMAT.md). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn_sparse.h"
#include "infer_internal.h"
#include "npu.h"

/* dense attention with heads [z0, z1) of layer zl zeroed; records scales */
struct mask {
    struct infer_attention attn;
    int zl;
    uint32_t z0, z1;
    int record;
    double *qsum, *ksum; /* [L * H], [L * KV] */
    uint64_t *qn, *kn;
};

static int mask_run(const struct infer_attention *a, const struct format_config *c,
                    const struct infer_kv *kv, uint32_t layer, const struct infer_attn_rows *rows,
                    const float *q, uint32_t h0, uint32_t h1, float *out, float *scratch)
{
    struct mask *mk = a->ctx;
    int ret = infer_attention_dense.run(&infer_attention_dense, c, kv, layer, rows, q, h0, h1, out,
                                        scratch);
    uint32_t hd = c->head_dim, H = c->n_heads, KV = c->n_kv_heads, kv_mul = H / KV;
    size_t qdim = (size_t)H * hd, kv_dim = (size_t)KV * hd;
    if (mk->record)
        for (uint32_t h = h0; h < h1; h++) {
            float mx = 0.0f;
            for (uint32_t i = 0; i < rows->n; i++)
                for (uint32_t j = 0; j < hd; j++)
                    mx = fmaxf(mx, fabsf(q[i * qdim + (size_t)h * hd + j]));
            mk->qsum[(size_t)layer * H + h] += mx / 127.0f;
            mk->qn[(size_t)layer * H + h]++;
            if (h % kv_mul == 0) {
                const float *k = infer_kv_keys(kv, layer) + (size_t)(h / kv_mul) * hd;
                float km = 0.0f;
                for (uint32_t t = rows->base; t < rows->base + rows->n; t++)
                    for (uint32_t j = 0; j < hd; j++)
                        km = fmaxf(km, fabsf(k[t * kv_dim + j]));
                mk->ksum[(size_t)layer * KV + h / kv_mul] += km / 127.0f;
                mk->kn[(size_t)layer * KV + h / kv_mul]++;
            }
        }
    if ((int)layer == mk->zl)
        for (uint32_t h = h0 > mk->z0 ? h0 : mk->z0; h < h1 && h < mk->z1; h++)
            for (uint32_t i = 0; i < rows->n; i++)
                memset(out + i * qdim + (size_t)h * hd, 0, sizeof(float) * hd);
    return ret;
}

/* mean next-token loss over the chunks */
static int chunk_loss(struct infer_model *m, struct infer_state *st, const int *tok, uint32_t n,
                      uint32_t ctx, float *lg, double *loss, struct sl_err *err)
{
    const struct format_config *c = infer_model_config(m);
    uint32_t V = c->vocab_size;
    double sum = 0;
    uint64_t cnt = 0;
    int *buf = sl_malloc(sizeof(int) * ctx);
    if (!buf)
        return -ENOMEM;
    for (uint32_t k = 0; k + ctx <= n; k += ctx) {
        memcpy(buf, tok + k, sizeof(int) * ctx);
        buf[0] = (int)c->bos_id;
        int ret = infer_forward(m, st, buf, ctx, 0, lg, INFER_LOGITS_ALL, err);
        if (ret < 0) {
            free(buf);
            return ret;
        }
        for (uint32_t j = 0; j + 1 < ctx; j++) {
            const float *l = lg + (size_t)j * V;
            float mx = l[0];
            for (uint32_t v = 1; v < V; v++)
                mx = l[v] > mx ? l[v] : mx;
            double z = 0;
            for (uint32_t v = 0; v < V; v++)
                z += exp((double)l[v] - mx);
            sum += log(z) + mx - l[buf[j + 1]];
            cnt++;
        }
    }
    free(buf);
    *loss = cnt ? sum / (double)cnt : 0;
    return 0;
}

/* ns per unit of the three pipeline stages on this machine */
static void measure_costs(struct infer_attn_profile *p, uint32_t hd)
{
    enum { T = 2048, M = 64 };
    int8_t *kq = sl_calloc((size_t)T * hd, 1), *xq = sl_calloc((size_t)M * hd, 1);
    float *sc = sl_malloc(sizeof(float) * T), *y = sl_malloc(sizeof(float) * (size_t)M * T);
    float *kf = sl_malloc(sizeof(float) * (size_t)T * hd * 2);
    uint32_t *idx = sl_malloc(sizeof(uint32_t) * T * 3);
    struct npu_weights *w = NULL;
    if (!kq || !xq || !sc || !y || !kf || !idx)
        goto out;
    uint32_t r = 12345;
    for (size_t i = 0; i < (size_t)T * hd; i++) {
        r = r * 1103515245u + 12345u;
        kq[i] = (int8_t)((int)(r >> 16) % 127);
        kf[i] = kf[i + (size_t)T * hd] = (float)kq[i] / 64.0f;
    }
    for (uint32_t t = 0; t < T; t++)
        sc[t] = 0.01f;
    if (npu_weights_create(kq, sc, T, hd, &w) < 0)
        goto out;
    uint64_t t0 = sl_now_ns();
    for (int it = 0; it < 4; it++)
        npu_linear_s8(w, xq, M, 0.01f, y);
    p->cost_est = (float)((double)(sl_now_ns() - t0) / (4.0 * M * T * hd));
    for (uint32_t t = 0; t < T; t++)
        y[t] = kf[t * hd];
    t0 = sl_now_ns();
    for (int it = 0; it < 16; it++)
        attn_topk(y, T, T / 5, idx, idx + T);
    p->cost_topk = (float)((double)(sl_now_ns() - t0) / (16.0 * T));
    for (uint32_t t = 0; t < T / 5; t++)
        idx[t] = t * 5;
    float out[512], *gather = sl_malloc(sizeof(float) * T * hd);
    if (!gather || hd > 512)
        goto out;
    t0 = sl_now_ns();
    for (int it = 0; it < 16; it++)
        infer_attn_list(out, kf, kf, kf + (size_t)T * hd, hd, hd, idx, T / 5, y, gather);
    free(gather);
    p->cost_qkv = (float)((double)(sl_now_ns() - t0) / (16.0 * (T / 5) * hd));
out:
    npu_weights_destroy(w);
    free(kq);
    free(xq);
    free(sc);
    free(y);
    free(kf);
    free(idx);
}

static struct infer_attn_profile *profile_alloc(uint32_t L, uint32_t H, uint32_t KV)
{
    struct infer_attn_profile *p = sl_calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->n_layers = L;
    p->n_heads = H;
    p->n_kv_heads = KV;
    p->head_imp = sl_calloc((size_t)L * H, sizeof(float));
    p->layer_imp = sl_calloc(L, sizeof(float));
    p->q_scale = sl_calloc((size_t)L * H, sizeof(float));
    p->k_scale = sl_calloc((size_t)L * KV, sizeof(float));
    p->keep_ratio = sl_calloc((size_t)L * H, sizeof(float));
    if (!p->head_imp || !p->layer_imp || !p->q_scale || !p->k_scale || !p->keep_ratio) {
        infer_attn_profile_destroy(p);
        return NULL;
    }
    return p;
}

void infer_attn_profile_destroy(struct infer_attn_profile *p)
{
    if (!p)
        return;
    free(p->head_imp);
    free(p->layer_imp);
    free(p->q_scale);
    free(p->k_scale);
    free(p->keep_ratio);
    free(p);
}

int infer_attn_profile_run(struct infer_model *m, const int *tokens, uint32_t n,
                           const struct infer_attn_profile_opts *o,
                           struct infer_attn_profile **out, struct sl_err *err)
{
    const struct format_config *c = infer_model_config(m);
    struct infer_attn_profile_opts d = {0};
    if (o)
        d = *o;
    uint32_t ctx = d.chunk_tokens ? d.chunk_tokens : (c->seq_len < 1024 ? c->seq_len : 1024);
    uint32_t maxt = d.max_tokens ? d.max_tokens : 4096, chunk = d.batch ? d.batch : 256;
    if (ctx < 2 || ctx > c->seq_len) {
        sl_err_set(err, "attention profile: a chunk of %u tokens does not fit the context of %u",
                   ctx, c->seq_len);
        return -EINVAL;
    }
    if (n > maxt)
        n = maxt;
    if (n < ctx) {
        sl_err_set(err, "attention profile: %u calibration tokens, fewer than one chunk of %u", n,
                   ctx);
        return -EINVAL;
    }
    n = n / ctx * ctx;
    uint32_t L = c->n_layers, H = c->n_heads, KV = c->n_kv_heads;
    struct infer_attn_profile *p = profile_alloc(L, H, KV);
    struct mask mk = {.attn = {.name = "profile", .run = mask_run}, .zl = -1};
    mk.attn.ctx = &mk;
    mk.qsum = sl_calloc((size_t)L * H, sizeof(double));
    mk.ksum = sl_calloc((size_t)L * KV, sizeof(double));
    mk.qn = sl_calloc((size_t)L * H, sizeof(uint64_t));
    mk.kn = sl_calloc((size_t)L * KV, sizeof(uint64_t));
    float *lg = sl_malloc(sizeof(float) * (size_t)ctx * c->vocab_size);
    struct infer_state *st = NULL;
    int ret = -ENOMEM;
    if (!p || !mk.qsum || !mk.ksum || !mk.qn || !mk.kn || !lg) {
        sl_err_set(err, "attention profile: out of memory");
        goto fail;
    }
    if ((ret = infer_state_create(m, chunk, &st, err)) < 0)
        goto fail;
    infer_state_set_attention(st, &mk.attn);
    uint32_t total = 1 + L * H + L, done = 0;
    double base;
    mk.record = 1;
    if ((ret = chunk_loss(m, st, tokens, n, ctx, lg, &base, err)) < 0)
        goto fail;
    mk.record = 0;
    if (d.progress)
        d.progress(d.ctx, ++done, total);
    for (uint32_t l = 0; l < L; l++) {
        for (uint32_t h = 0; h <= H; h++) {
            /* h < H: one head; h == H: the whole layer */
            mk.zl = (int)l;
            mk.z0 = h < H ? h : 0;
            mk.z1 = h < H ? h + 1 : H;
            double loss;
            if ((ret = chunk_loss(m, st, tokens, n, ctx, lg, &loss, err)) < 0)
                goto fail;
            if (h < H)
                p->head_imp[(size_t)l * H + h] = (float)(loss - base);
            else
                p->layer_imp[l] = (float)(loss - base);
            if (d.progress)
                d.progress(d.ctx, ++done, total);
        }
    }
    for (size_t i = 0; i < (size_t)L * H; i++)
        p->q_scale[i] = mk.qn[i] ? (float)(mk.qsum[i] / (double)mk.qn[i]) : 1.0f;
    for (size_t i = 0; i < (size_t)L * KV; i++)
        p->k_scale[i] = mk.kn[i] ? (float)(mk.ksum[i] / (double)mk.kn[i]) : 1.0f;
    p->loss = base;
    p->calib_tokens = n;
    p->keep = d.keep > 0 && d.keep <= 1 ? (float)d.keep : 0.2f;
    p->buckets = d.buckets ? d.buckets : 9;
    p->step = d.step > 0 ? d.step : 0.5f;
    attn_ratios(p->head_imp, p->layer_imp, L, H, p->keep, 0.0, p->keep_ratio);
    measure_costs(p, c->head_dim);
    *out = p;
    p = NULL;
    ret = 0;
fail:
    infer_state_destroy(st);
    infer_attn_profile_destroy(p);
    free(mk.qsum);
    free(mk.ksum);
    free(mk.qn);
    free(mk.kn);
    free(lg);
    return ret;
}

/* ---- the attn.* keys: little-endian binary arrays ---- */

static int put_f32(int (*set)(void *, const char *, const void *, size_t), void *ctx,
                   const char *key, const float *v, size_t n)
{
    uint8_t *b = sl_malloc(4 * (n ? n : 1));
    if (!b)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++)
        sl_store_lef32(b + 4 * i, v[i]);
    int ret = set(ctx, key, b, 4 * n);
    free(b);
    return ret;
}

int infer_attn_profile_write(const struct infer_attn_profile *p,
                             int (*set)(void *ctx, const char *key, const void *v, size_t len),
                             void *ctx)
{
    size_t LH = (size_t)p->n_layers * p->n_heads;
    uint8_t shape[12], u[4], dl[8];
    sl_store_le32(shape, p->n_layers);
    sl_store_le32(shape + 4, p->n_heads);
    sl_store_le32(shape + 8, p->n_kv_heads);
    float one[3] = {p->keep, p->step, 0};
    float cost[3] = {p->cost_est, p->cost_topk, p->cost_qkv};
    double loss = p->loss;
    uint64_t lb;
    memcpy(&lb, &loss, 8);
    sl_store_le64(dl, lb);
    int ret;
    if ((ret = set(ctx, "attn.version", "1", 1)) < 0 ||
        (ret = set(ctx, "attn.shape", shape, 12)) < 0 ||
        (ret = put_f32(set, ctx, "attn.head_imp", p->head_imp, LH)) < 0 ||
        (ret = put_f32(set, ctx, "attn.layer_imp", p->layer_imp, p->n_layers)) < 0 ||
        (ret = put_f32(set, ctx, "attn.q_scale", p->q_scale, LH)) < 0 ||
        (ret = put_f32(set, ctx, "attn.k_scale", p->k_scale, (size_t)p->n_layers * p->n_kv_heads)) < 0 ||
        (ret = put_f32(set, ctx, "attn.keep", &one[0], 1)) < 0 ||
        (ret = put_f32(set, ctx, "attn.keep_ratio", p->keep_ratio, LH)) < 0 ||
        (ret = put_f32(set, ctx, "attn.bucket_step", &one[1], 1)) < 0 ||
        (ret = put_f32(set, ctx, "attn.cost", cost, 3)) < 0 || (ret = set(ctx, "attn.loss", dl, 8)) < 0)
        return ret;
    sl_store_le32(u, p->buckets);
    if ((ret = set(ctx, "attn.buckets", u, 4)) < 0)
        return ret;
    sl_store_le32(u, p->calib_tokens);
    return set(ctx, "attn.calib_tokens", u, 4);
}

static int get(const struct format_reader *r, const char *key, size_t want, const uint8_t **v,
               struct sl_err *err)
{
    const void *val;
    size_t len;
    if (format_reader_meta_get(r, key, &val, &len) < 0) {
        sl_err_set(err, "%s: the attention profile has no %s", format_reader_path(r), key);
        return -EINVAL;
    }
    if (len != want) {
        sl_err_set(err, "%s: %s is %zu bytes, %zu expected", format_reader_path(r), key, len,
                   want);
        return -EINVAL;
    }
    *v = val;
    return 0;
}

static int get_f32(const struct format_reader *r, const char *key, float *out, size_t n,
                   int positive, struct sl_err *err)
{
    const uint8_t *v;
    int ret = get(r, key, 4 * n, &v, err);
    for (size_t i = 0; ret == 0 && i < n; i++) {
        out[i] = sl_load_lef32(v + 4 * i);
        if (!isfinite(out[i]) || (positive && !(out[i] > 0))) {
            sl_err_set(err, "%s: %s[%zu] = %g is not %s", format_reader_path(r), key, i,
                       (double)out[i], positive ? "positive and finite" : "finite");
            ret = -EINVAL;
        }
    }
    return ret;
}

int infer_attn_profile_read(const struct format_reader *r, struct infer_attn_profile **out,
                            struct sl_err *err)
{
    const void *val;
    size_t len;
    if (format_reader_meta_get(r, "attn.version", &val, &len) < 0) {
        sl_err_set(err, "%s has no attention profile (sluice profile-attn writes one)",
                   format_reader_path(r));
        return -ENOENT;
    }
    if (len != 1 || *(const char *)val != '1') {
        sl_err_set(err, "%s: attention profile version %.*s is not supported (1 is)",
                   format_reader_path(r), (int)(len < 16 ? len : 16), (const char *)val);
        return -EINVAL;
    }
    const uint8_t *v;
    int ret = get(r, "attn.shape", 12, &v, err);
    if (ret < 0)
        return ret;
    const struct format_config *c = format_reader_config(r);
    uint32_t L = sl_load_le32(v), H = sl_load_le32(v + 4), KV = sl_load_le32(v + 8);
    if (L != c->n_layers || H != c->n_heads || KV != c->n_kv_heads) {
        sl_err_set(err, "%s: the attention profile is of %u layers x %u heads (%u kv), the "
                   "model has %u x %u (%u)", format_reader_path(r), L, H, KV, c->n_layers,
                   c->n_heads, c->n_kv_heads);
        return -EINVAL;
    }
    struct infer_attn_profile *p = profile_alloc(L, H, KV);
    if (!p) {
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    size_t LH = (size_t)L * H;
    float one, cost[3];
    if ((ret = get_f32(r, "attn.head_imp", p->head_imp, LH, 0, err)) < 0 ||
        (ret = get_f32(r, "attn.layer_imp", p->layer_imp, L, 0, err)) < 0 ||
        (ret = get_f32(r, "attn.q_scale", p->q_scale, LH, 1, err)) < 0 ||
        (ret = get_f32(r, "attn.k_scale", p->k_scale, (size_t)L * KV, 1, err)) < 0 ||
        (ret = get_f32(r, "attn.keep_ratio", p->keep_ratio, LH, 1, err)) < 0 ||
        (ret = get_f32(r, "attn.keep", &p->keep, 1, 1, err)) < 0 ||
        (ret = get_f32(r, "attn.bucket_step", &one, 1, 1, err)) < 0 ||
        (ret = get_f32(r, "attn.cost", cost, 3, 0, err)) < 0 ||
        (ret = get(r, "attn.buckets", 4, &v, err)) < 0)
        goto fail;
    p->step = one;
    p->buckets = sl_load_le32(v);
    if (p->buckets == 0 || p->buckets > 64) {
        sl_err_set(err, "%s: attn.buckets = %u is not in 1..64", format_reader_path(r),
                   p->buckets);
        ret = -EINVAL;
        goto fail;
    }
    p->cost_est = cost[0];
    p->cost_topk = cost[1];
    p->cost_qkv = cost[2];
    if (get(r, "attn.calib_tokens", 4, &v, err) == 0)
        p->calib_tokens = sl_load_le32(v);
    if (get(r, "attn.loss", 8, &v, err) == 0) {
        uint64_t b = sl_load_le64(v);
        memcpy(&p->loss, &b, 8);
    }
    err->msg[0] = 0;
    *out = p;
    return 0;
fail:
    infer_attn_profile_destroy(p);
    return ret;
}

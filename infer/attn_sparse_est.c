/* attn_sparse_est.c: sparse attention's estimate side (infer_attn_sparse.c
 * has the design): the int8 keys of each layer and kv head prepared as the
 * NPU's weights of a key-length bucket, the Q scales that pick each head's
 * bucket, and a launch's job started and finished (on the device thread or
 * inline). attn_sparse_estimate: the same path for one head, for tests. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "attn_sparse_int.h"

/* The host copy of a slot's codes and scales holds at least L rows. */
static int mirror_reserve(struct kslot *ks, uint32_t L, uint32_t hd)
{
    if (ks->cap >= L)
        return 0;
    int8_t *q = sl_realloc(ks->codes, (size_t)L * hd);
    if (!q)
        return -ENOMEM;
    ks->codes = q;
    float *sc = sl_realloc(ks->sc, (size_t)L * sizeof *sc);
    if (!sc)
        return -ENOMEM;
    ks->sc = sc;
    ks->cap = L;
    return 0;
}

/* K weights of (layer, g) covering slots [0, T), from the cache. Only the
 * slots from min(filled, base) on are quantized; those before are the host
 * copy's, which refills the weights when T outgrows them: a 4K prefill in
 * 256-row chunks grows them every chunk, and requantizing every key each
 * time quantized each key ~8 times (attn_quantize_key_q, 2.4% of the
 * sparse warm 4K prefill; the same codes, so the same bits). */
int attn_sparse_prepare_keys(struct infer_sparse *sp, const struct infer_kv *kv, uint32_t layer,
                             uint32_t g, uint32_t base, uint32_t T, struct sl_err *err)
{
    const struct format_config *c = &sp->cfg;
    uint32_t hd = c->head_dim, KV = c->n_kv_heads;
    size_t kv_dim = (size_t)KV * hd;
    struct kslot *ks = &sp->ks[(size_t)layer * KV + g];
    uint32_t keep = ks->filled < base ? ks->filled : base; /* host codes still right */
    uint32_t from = keep & ~15u;                           /* weights rows to refill */
    if (!ks->w || ks->L < T) {
        uint32_t L = (T + KEY_BUCKET - 1) / KEY_BUCKET * KEY_BUCKET;
        struct npu_weights *w;
        if (mirror_reserve(ks, L, hd) < 0 || npu_weights_alloc(L, hd, &w) < 0) {
            sl_err_set(err, "sparse attention: out of memory for %u int8 keys", L);
            return -ENOMEM;
        }
        npu_weights_destroy(ks->w);
        ks->w = w;
        ks->L = L;
        ks->filled = 0;
        from = 0;
    }
    uint32_t to = (T + 15) & ~15u;
    if (to > ks->L)
        to = ks->L;
    if (from >= to)
        return 0;
    /* from the float keys (post-RoPE), codes within +-ATTN_EST_QMAX: the
     * cache's int8 mirror (+-127) would need the kernels' wide step; the
     * slots [T, to) and every padding slot: codes 0, scale 0 (computed and
     * discarded, as a static graph would) */
    const float *kf = infer_kv_keys(kv, layer);
    for (uint32_t t = keep; t < T; t++)
        ks->sc[t] = attn_quantize_key_q(kf + t * kv_dim + (size_t)g * hd, hd, ATTN_EST_QMAX,
                                        ks->codes + (size_t)t * hd);
    uint32_t pad = T > keep ? T : keep;
    uint32_t end = from == 0 ? ks->L : to; /* a new block: its padding too */
    if (end > pad) { /* only what is copied below: a new block zeroes the rest */
        memset(ks->codes + (size_t)pad * hd, 0, (size_t)(end - pad) * hd);
        memset(ks->sc + pad, 0, (size_t)(end - pad) * sizeof *ks->sc);
    }
    int ret = npu_weights_fill(ks->w, from, end - from, ks->codes + (size_t)from * hd, ks->sc + from);
    if (ret < 0) {
        sl_err_set(err, "sparse attention: cannot prepare the int8 keys of layer %u", layer);
        return ret;
    }
    ks->filled = T;
    return 0;
}

int attn_sparse_start_launch(struct infer_sparse *sp, struct launch *la, const struct npu_graph *gr,
                             const struct npu_weights *w, uint32_t nr, size_t ldy,
                             struct sl_err *err)
{
    memset(&la->job, 0, sizeof la->job);
    la->job.graph = gr;
    la->job.w = w;
    la->job.a_type = NPU_DTYPE_INT8;
    la->job.xq = la->xq;
    la->job.rows = la->cnt * nr;
    la->job.act_scale = la->scale;
    la->job.a_max = ATTN_EST_QQ;
    la->job.y = la->y;
    la->job.ldy = ldy;
    la->ticket = NULL;
    if (sp->o.inline_npu)
        return 0;
    return npu_device_submit(sp->dev, &la->job, &la->ticket, err);
}

int attn_sparse_finish_launch(struct launch *la, struct sl_err *err)
{
    int ret = la->ticket ? npu_ticket_wait(la->ticket) : npu_graph_run(la->job.graph, &la->job,
                                                                         NULL, err);
    la->ticket = NULL;
    if (ret < 0 && !err->msg[0])
        sl_err_set(err, "sparse attention: the NPU estimate failed (%d)", ret);
    return ret;
}

/* Q scale of head h over the call's rows: max|q| / 127 (1 when all zero) */
float attn_sparse_head_scale(const float *q, uint32_t n, size_t qdim, uint32_t hd, uint32_t h)
{
    float mx = 0.0f;
    for (uint32_t i = 0; i < n; i++) {
        const float *qh = q + (size_t)i * qdim + (size_t)h * hd;
        for (uint32_t j = 0; j < hd; j++)
            mx = isfinite(qh[j]) && fabsf(qh[j]) > mx ? fabsf(qh[j]) : mx;
    }
    return mx > 0.0f ? mx / 127.0f : 1.0f;
}

/* the largest Q scale of heads [a0, a1) (the shared selection's bucket) */
float attn_sparse_group_scale(const float *q, uint32_t n, size_t qdim, uint32_t hd, uint32_t a0,
                              uint32_t a1)
{
    float s = 0.0f;
    for (uint32_t h = a0; h < a1; h++) {
        float v = attn_sparse_head_scale(q, n, qdim, hd, h);
        s = v > s ? v : s;
    }
    return s;
}

/* The centre of kv head g's bucket grid: the geometric mean of its heads'
 * profiled mean Q scales (without a profile, of their first call's), so
 * that heads in one bucket share its scale and can share a launch. */
float attn_sparse_group_center(struct infer_sparse *sp, uint32_t layer, uint32_t g, const float *q,
                               uint32_t n)
{
    const struct format_config *c = &sp->cfg;
    uint32_t H = c->n_heads, kv_mul = H / c->n_kv_heads, hd = c->head_dim;
    double lg = 0;
    pthread_mutex_lock(&sp->lock);
    for (uint32_t h = g * kv_mul; h < (g + 1) * kv_mul; h++) {
        float *mean = &sp->qmean[(size_t)layer * H + h];
        if (!(*mean > 0.0f))
            *mean = attn_sparse_head_scale(q, n, (size_t)H * hd, hd, h);
        lg += log((double)*mean);
    }
    pthread_mutex_unlock(&sp->lock);
    return (float)exp(lg / kv_mul);
}

int attn_sparse_estimate(struct infer_sparse *sp, const struct infer_kv *kv, uint32_t layer,
                         const float *q, uint32_t n, uint32_t base, uint32_t h, float *est,
                         uint32_t *L, float *qscale, struct sl_err *err)
{
    const struct format_config *c = &sp->cfg;
    uint32_t hd = c->head_dim, H = c->n_heads, kv_mul = H / c->n_kv_heads, g = h / kv_mul;
    size_t qdim = (size_t)H * hd;
    float s = sp->o.select_group
                  ? attn_sparse_group_scale(q, n, qdim, hd, g * kv_mul, (g + 1) * kv_mul)
                  : attn_sparse_head_scale(q, n, qdim, hd, h);
    float mu = attn_sparse_group_center(sp, layer, g, q, n);
    struct launch la = {.g = g, .cnt = 1};
    la.scale = attn_q_code_scale(attn_bucket_scale(mu, sp->step, sp->buckets,
                                                   attn_bucket_pick(mu, sp->step, sp->buckets, s)));
    int ret = attn_sparse_prepare_keys(sp, kv, layer, g, base, base + n, err);
    if (ret < 0)
        return ret;
    struct kslot *ks = &sp->ks[(size_t)layer * c->n_kv_heads + g];
    la.xq = sl_malloc((size_t)n * hd);
    if (!la.xq)
        return -ENOMEM;
    for (uint32_t i = 0; i < n; i++)
        attn_quantize_q(q + i * qdim + (size_t)h * hd, hd, la.scale, la.xq + (size_t)i * hd);
    la.y = est;
    const struct npu_graph *gr;
    uint32_t m = kv_mul * pow2ceil(n);
    ret = npu_device_graph(sp->dev, m > NPU_GRAPH_MAX_M ? NPU_GRAPH_MAX_M : m, hd, ks->L, &gr, err);
    if (ret == 0)
        ret = attn_sparse_start_launch(sp, &la, gr, ks->w, n, 0, err);
    if (ret == 0)
        ret = attn_sparse_finish_launch(&la, err);
    free(la.xq);
    *L = ks->L;
    *qscale = la.scale;
    return ret;
}

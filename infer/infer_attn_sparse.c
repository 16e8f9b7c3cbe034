/* infer_attn_sparse.c: sparse attention with NPU-estimated scores
 * (shadowAttn 3.2-3.4) behind the attention interface (infer.h).
 *
 * Per call (query rows of one layer, heads [h0, h1)):
 * 1. Q scale per head (max|q| / 127 over the call's rows) picks a bucket of
 *    the head's grid around its profiled mean; Q is quantized with the
 *    bucket's scale (static, as a compiled NPU graph's constant) to 7-bit
 *    codes (+-63, attn_quantize_q: the emulated NPU's AVX2 kernel then adds
 *    two groups' products in int16 before widening, npu_job.a_max; recall
 *    0.9860 vs 0.9910 with 8 bits on kjv6L-1k at keep 0.2, 0.9915 vs 0.9945
 *    at 0.45, KL and top-1 unchanged; 6 bits, four groups, dropped it to
 *    0.9845 at 0.45).
 * 2. K: the keys of every slot quantized to codes within +-ATTN_EST_QMAX
 *    (64: 7 bits; the KV cache's int8 rule with max|k| / 64 as the scale,
 *    one per slot and kv head) prepared as the NPU's weights of a key-length
 *    bucket (slots rounded up to KEY_BUCKET, padding codes 0), refilled
 *    from the first slot that changed. Codes within +-64 take the int8
 *    kernels' narrow step (no sign step per product; ~1.3x faster than
 *    the cache's +-127 mirror) at the same accuracy on kjv6L-1k (recall
 *    0.9910 vs 0.9925, KL and top-1 unchanged at keep 0.2; 5 bits, +-16,
 *    dropped the recall to 0.978). K's scale is fixed per slot and head
 *    rather than bucketed: the graphs dequantize per output channel (=
 *    slot) natively, and requantizing the cache per bucket would cost
 *    O(T * head_dim) per head and call, as much as a decode step's whole
 *    estimate. So the buckets vary Q only.
 * 3. Launches: the heads of one kv head that share a bucket are stacked
 *    into one int8 job on the graph (kv_mul * rows, head_dim, L); launches
 *    are ordered by Algorithm 1 on the per-op costs and run on the device
 *    two ahead of the CPU, which picks each head's keys (sinks, recent
 *    window, top of the rest by the estimate, causal) and runs the dense
 *    kernel's exact float softmax.V over them (infer_attn_list). With the
 *    estimates inline (on the calling thread), each launch's graph runs per
 *    head just before that head's rows pick their keys: a launch's
 *    estimates (kv_mul * rows * L floats, 2.2 MB at 4K) left the L2 cache
 *    before the top-k read them; one head's (278 KB) are still there. The
 *    same graphs and bits. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_sparse.h"
#include "infer_internal.h"
#include "npu.h"

#define KEY_BUCKET 256u
/* Estimate rows are L + YPAD floats apart: at L floats (a multiple of 256)
 * the 16 rows a kernel writes at once shared one L1 set; the AMX estimate
 * of 16 rows x 4K keys took 1.7x as long (VNNI 1.7x too). */
#define YPAD 16u
#define AHEAD 2 /* launches in flight on the device */
#define SCRATCH_SLOTS 4

struct kslot {
    struct npu_weights *w; /* [L][head_dim] int8 keys of one layer and kv head */
    uint32_t L, filled;
};

struct infer_sparse {
    struct infer_attention attn;
    char name[64]; /* "sparse keep 0.20" (traces) */
    struct format_config cfg;
    struct infer_sparse_opts o;
    double *ratio; /* [L * H] */
    float *qmean;  /* [L * H]; 0 until known */
    uint32_t buckets;
    float step;
    double c_est, c_topk, c_qkv;
    struct kslot *ks; /* [L * KV] */
    struct npu_device *dev;
    int own_dev;
    pthread_mutex_t lock;
    pthread_mutex_t slock[SCRATCH_SLOTS]; /* the cached scratch blocks: one per concurrent call */
    void *sbuf[SCRATCH_SLOTS];
    size_t scap[SCRATCH_SLOTS];
    struct infer_sparse_stats st;
    double recall_sum, mass_sum;
    uint64_t recall_n, mass_n;
};

struct launch {
    uint32_t g;        /* kv head */
    uint32_t bucket;
    uint32_t cnt;      /* heads */
    uint32_t i0, nr;   /* its rows of the call: [i0, i0 + nr) */
    uint32_t head[ATTN_PLAN_MAX];
    float scale;
    int8_t *xq;        /* [cnt * n][hd] */
    float *y;          /* [cnt * nr][L] */
    struct npu_job job;
    struct npu_ticket *ticket;
};

static uint32_t pow2ceil(uint32_t v)
{
    uint32_t p = 1;
    while (p < v)
        p <<= 1;
    return p;
}

/* K weights of (layer, g) covering slots [0, T), from the cache. */
static int prepare_keys(struct infer_sparse *sp, const struct infer_kv *kv, uint32_t layer,
                        uint32_t g, uint32_t base, uint32_t T, struct sl_err *err)
{
    const struct format_config *c = &sp->cfg;
    uint32_t hd = c->head_dim, KV = c->n_kv_heads;
    size_t kv_dim = (size_t)KV * hd;
    struct kslot *ks = &sp->ks[(size_t)layer * KV + g];
    if (!ks->w || ks->L < T) {
        uint32_t L = (T + KEY_BUCKET - 1) / KEY_BUCKET * KEY_BUCKET;
        struct npu_weights *w;
        if (npu_weights_alloc(L, hd, &w) < 0) {
            sl_err_set(err, "sparse attention: out of memory for %u int8 keys", L);
            return -ENOMEM;
        }
        npu_weights_destroy(ks->w);
        ks->w = w;
        ks->L = L;
        ks->filled = 0;
        /* padding slots: codes 0 (computed and discarded, as a static graph would) */
        int8_t *z = sl_calloc((size_t)16 * hd, 1);
        float zs[16] = {0};
        if (!z) {
            sl_err_set(err, "sparse attention: out of memory");
            return -ENOMEM;
        }
        for (uint32_t r = 0; r < L; r += 16)
            npu_weights_fill(w, r, L - r < 16 ? L - r : 16, z, zs);
        free(z);
    }
    uint32_t from = ks->filled < base ? ks->filled : base;
    from &= ~15u;
    uint32_t to = (T + 15) & ~15u;
    if (to > ks->L)
        to = ks->L;
    if (from >= to)
        return 0;
    int8_t *codes = sl_calloc((size_t)(to - from) * hd, 1);
    float *sc = sl_calloc(to - from, sizeof(float));
    if (!codes || !sc) {
        free(codes);
        free(sc);
        sl_err_set(err, "sparse attention: out of memory");
        return -ENOMEM;
    }
    /* from the float keys (post-RoPE), codes within +-ATTN_EST_QMAX: the
     * cache's int8 mirror (+-127) would need the kernels' wide step */
    const float *kf = infer_kv_keys(kv, layer);
    for (uint32_t t = from; t < T; t++)
        sc[t - from] = attn_quantize_key_q(kf + t * kv_dim + (size_t)g * hd, hd, ATTN_EST_QMAX,
                                           codes + (size_t)(t - from) * hd);
    int ret = npu_weights_fill(ks->w, from, to - from, codes, sc);
    free(codes);
    free(sc);
    if (ret < 0) {
        sl_err_set(err, "sparse attention: cannot prepare the int8 keys of layer %u", layer);
        return ret;
    }
    ks->filled = T;
    return 0;
}

static int start_launch(struct infer_sparse *sp, struct launch *la, const struct npu_graph *gr,
                        const struct npu_weights *w, uint32_t nr, size_t ldy, struct sl_err *err)
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

static int finish_launch(struct launch *la, struct sl_err *err)
{
    int ret = la->ticket ? npu_ticket_wait(la->ticket) : npu_graph_run(la->job.graph, &la->job,
                                                                         NULL, err);
    la->ticket = NULL;
    if (ret < 0 && !err->msg[0])
        sl_err_set(err, "sparse attention: the NPU estimate failed (%d)", ret);
    return ret;
}

/* measure: float scores of the visible keys; recall of the estimate's
 * top-k and the float mass of the kept keys */
static void measure_row(const float *qh, const float *kh, size_t kv_dim, uint32_t hd,
                        const float *est, uint32_t visible, uint32_t k, const uint32_t *sel,
                        uint32_t nsel, float *fs, uint32_t *i1, uint32_t *i2, uint32_t *work,
                        double *recall, double *mass)
{
    for (uint32_t t = 0; t < visible; t++) {
        float d = 0;
        for (uint32_t j = 0; j < hd; j++)
            d += qh[j] * kh[t * kv_dim + j];
        fs[t] = d / sqrtf((float)hd);
    }
    attn_topk(fs, visible, k, i1, work);
    attn_topk(est, visible, k, i2, work);
    uint32_t hit = 0;
    for (uint32_t a = 0, b = 0; a < k && b < k;) {
        if (i1[a] == i2[b]) {
            hit++;
            a++;
            b++;
        } else if (i1[a] < i2[b]) {
            a++;
        } else {
            b++;
        }
    }
    *recall = k ? (double)hit / k : 1.0;
    float mx = -INFINITY;
    for (uint32_t t = 0; t < visible; t++)
        mx = fs[t] > mx ? fs[t] : mx;
    double tot = 0, kept = 0;
    for (uint32_t t = 0; t < visible; t++)
        tot += exp((double)fs[t] - mx);
    for (uint32_t j = 0; j < nsel; j++)
        kept += exp((double)fs[sel[j]] - mx);
    *mass = kept / tot;
}

struct call_stats {
    uint64_t row_heads, visible, kept, launches, total_ns, wait_ns, topk_ns, qkv_ns;
    double recall, mass;
    uint64_t recall_n;
};

/* Pairs per block (rows of a launch's heads): their keys and values are
 * walked in blocks of KEY_TILE slots together (attn_sel_rows). */
#define PAIRS 128u
/* the fewest rows per launch (per head) whose inline estimates run per head */
#define SPLIT_ROWS 8u
#define KEY_TILE 256u
/* inline estimates: the most bytes of one head's estimates run at once
 * (llama3-8b's 32 rows per head at 4K, 557 KB, did not stay in L2 until
 * their rows picked their keys; tinyllama's 16, 278 KB, did) */
#ifndef EST_PIECE_BYTES
#define EST_PIECE_BYTES (320u << 10)
#endif

/* The scratch of attend_launch. */
struct attend_buf {
    uint32_t *sel;  /* [PAIRS][T] */
    float *a;       /* [PAIRS][T] */
    uint32_t *work; /* [2 T] */
    uint32_t *cur;  /* [PAIRS] */
    float *gather, *fs;
    uint32_t *i1, *i2;
    /* inline estimates per head (NULL: per launch): the graph of one head's
     * rows and its output [rows][L] */
    const struct npu_graph *gsub;
    float *ysub;
    uint8_t *stage; /* gsub's staging (npu_graph_info scratch_bytes), the call's */
};

/* The shared selection: per row, one list for the launch's heads (the call's
 * heads of kv head l->g, consecutive: one bucket), from their combined
 * estimates; the heads attend it together. Their keep: the mean of their
 * ratios. */
static void attend_group(struct infer_sparse *sp, uint32_t layer,
                         const struct infer_attn_rows *rows, const float *q,
                         const struct launch *l, size_t ld, float *out, uint32_t h0, float *hint,
                         const float *kh, const float *vh, size_t kv_dim,
                         const struct attend_buf *b, struct call_stats *cs)
{
    const struct format_config *c = &sp->cfg;
    uint32_t hd = c->head_dim, H = c->n_heads, G = l->cnt, ha = l->head[0];
    size_t qdim = (size_t)H * hd;
    uint32_t sinks = sp->o.sinks == UINT32_MAX ? 0 : sp->o.sinks;
    uint32_t window = sp->o.window == UINT32_MAX ? 0 : sp->o.window;
    double r = 0;
    for (uint32_t j = 0; j < G; j++) {
        r += sp->ratio[(size_t)layer * H + l->head[j]];
        ha = l->head[j] < ha ? l->head[j] : ha;
    }
    r /= G;
    /* rows in blocks of PAIRS / G (their G heads each: PAIRS pairs), whose
     * keys and values attn_group_rows_blk walks together */
    uint32_t rb = PAIRS / G ? PAIRS / G : 1, T = rows->base + rows->n;
    struct attn_group_row w[PAIRS];
    for (uint32_t i0 = l->i0; i0 < l->i0 + l->nr; i0 += rb) {
        uint32_t i1 = l->i0 + l->nr - i0 < rb ? l->i0 + l->nr : i0 + rb;
        uint64_t t0 = sl_now_ns();
        for (uint32_t i = i0; i < i1; i++) {
            uint32_t visible = rows->base + i + 1, k = attn_keep_count(r, visible);
            const float *e = l->y + (size_t)(i - l->i0) * ld;
            uint32_t *sel = b->sel + (size_t)(i - i0) * T;
            attn_group_combine(e, (size_t)l->nr * ld, G, visible, b->fs);
            uint32_t ns = attn_select_row_hint(b->fs, visible, k, sinks, window, sel, b->work,
                                               &hint[ha - h0]);
            w[i - i0] = (struct attn_group_row){.q = q + (size_t)i * qdim + (size_t)ha * hd,
                                                .out = out + (size_t)i * qdim + (size_t)ha * hd,
                                                .list = sel, .len = ns,
                                                .s = b->a + (size_t)(i - i0) * G * T};
            cs->row_heads += G;
            cs->visible += (uint64_t)G * visible;
            cs->kept += (uint64_t)G * ns;
            if (sp->o.measure)
                for (uint32_t j = 0; j < G; j++) {
                    double rc, ms;
                    measure_row(q + (size_t)i * qdim + (size_t)l->head[j] * hd, kh, kv_dim, hd,
                                e + (size_t)j * l->nr * ld, visible, k, sel, ns, b->fs, b->i1,
                                b->i2, b->work, &rc, &ms);
                    cs->recall += rc;
                    cs->mass += ms;
                    cs->recall_n++;
                }
        }
        uint64_t t1 = sl_now_ns();
        attn_group_rows_blk(i1 - i0, w, G, hd, hd, hd, kh, vh, kv_dim, KEY_TILE, rows->base + i1,
                            b->cur, b->gather);
        cs->topk_ns += t1 - t0;
        cs->qkv_ns += sl_now_ns() - t1;
    }
}

/* Top-k and softmax.V for every row of every head of a finished launch
 * (kv head l->g's keys and values at kh, vh, rows kv_dim apart),
 * PAIRS (row, head) pairs at a time: each pair's keys picked (the previous
 * row's threshold the guess for the next: hint[h - h0], carried across
 * launches), then the block's exact softmax.V. */
static int attend_launch(struct infer_sparse *sp, uint32_t layer,
                         const struct infer_attn_rows *rows, const float *q,
                         const struct launch *l, size_t ld, float *out, uint32_t h0, float *hint,
                         const float *kh, const float *vh, size_t kv_dim,
                         const struct attend_buf *b, struct call_stats *cs, struct sl_err *err)
{
    const struct format_config *c = &sp->cfg;
    uint32_t hd = c->head_dim, H = c->n_heads, kv_mul = H / c->n_kv_heads;
    uint32_t n = rows->n, T = rows->base + n;
    size_t qdim = (size_t)H * hd;
    uint32_t sinks = sp->o.sinks == UINT32_MAX ? 0 : sp->o.sinks;
    uint32_t window = sp->o.window == UINT32_MAX ? 0 : sp->o.window;
    uint32_t rb = PAIRS / l->cnt ? PAIRS / l->cnt : 1; /* rows per block */
    uint32_t end = l->i0 + l->nr;
    struct attn_sel_pair pr[PAIRS];
    (void)kv_mul;
    (void)n;
    if (sp->o.select_group) {
        attend_group(sp, layer, rows, q, l, ld, out, h0, hint, kh, vh, kv_dim, b, cs);
        return 0;
    }
    for (uint32_t i0 = l->i0; i0 < end; i0 += rb) {
        uint32_t i1 = end - i0 < rb ? end : i0 + rb, np = 0, tmax = rows->base + i1;
        uint64_t t0 = sl_now_ns();
        for (uint32_t j = 0; j < l->cnt; j++) {
            uint32_t h = l->head[j];
            double r = sp->ratio[(size_t)layer * H + h];
            /* the estimates of head j's rows: the launch's, or (b->ysub) run
             * here for this head alone, so that they are still in the
             * caches when its rows pick their keys */
            const float *yj = l->y + (size_t)j * l->nr * ld;
            uint32_t ybase = l->i0; /* the row yj's first row holds */
            /* inline: the head's rows in pieces whose estimates stay in L2
             * (pieces of equal size, each at most EST_PIECE_BYTES of them) */
            uint32_t piece = i1 - i0;
            if (b->ysub) {
                uint32_t most = (uint32_t)(EST_PIECE_BYTES / (sizeof(float) * ld));
                most = most ? most : 1;
                uint32_t cnt = (piece + most - 1) / most;
                piece = (piece + cnt - 1) / cnt;
            }
            for (uint32_t p0 = i0; p0 < i1; p0 += piece) {
                uint32_t p1 = i1 - p0 < piece ? i1 : p0 + piece;
                if (b->ysub) {
                    uint64_t w0 = sl_now_ns();
                    struct npu_job job = l->job;
                    job.graph = b->gsub;
                    job.xq = l->xq + ((size_t)j * l->nr + (p0 - l->i0)) * hd;
                    job.rows = p1 - p0;
                    job.y = b->ysub;
                    int ret = npu_graph_run(b->gsub, &job, b->stage, err);
                    if (ret < 0) {
                        if (!err->msg[0])
                            sl_err_set(err, "sparse attention: the NPU estimate failed (%d)", ret);
                        return ret;
                    }
                    yj = b->ysub;
                    ybase = p0;
                    uint64_t dw = sl_now_ns() - w0;
                    t0 += dw; /* estimate time, not top-k time */
                    cs->wait_ns += dw;
                }
                for (uint32_t i = p0; i < p1; i++, np++) {
                    uint32_t visible = rows->base + i + 1;
                    uint32_t k = attn_keep_count(r, visible);
                    const float *e = yj + (size_t)(i - ybase) * ld;
                    uint32_t *sel = b->sel + (size_t)np * T;
                    uint32_t ns = attn_select_row_hint(e, visible, k, sinks, window, sel, b->work,
                                                       &hint[h - h0]);
                    const float *qh = q + (size_t)i * qdim + (size_t)h * hd;
                    pr[np] = (struct attn_sel_pair){.q = qh, .list = sel, .len = ns,
                                                    .a = b->a + (size_t)np * T,
                                                    .out = out + (size_t)i * qdim + (size_t)h * hd};
                    cs->row_heads++;
                    cs->visible += visible;
                    cs->kept += ns;
                    if (sp->o.measure) {
                        double rc, ms;
                        measure_row(qh, kh, kv_dim, hd, e, visible, k, sel, ns, b->fs, b->i1, b->i2,
                                    b->work, &rc, &ms);
                        cs->recall += rc;
                        cs->mass += ms;
                        cs->recall_n++;
                    }
                }
            }
        }
        uint64_t t1 = sl_now_ns();
        attn_sel_rows(np, pr, kh, vh, kv_dim, hd, KEY_TILE, tmax, b->cur, b->gather);
        cs->topk_ns += t1 - t0;
        cs->qkv_ns += sl_now_ns() - t1;
    }
    return 0;
}

/* One block for a call's big buffers: one of the instance's cached ones
 * that no other call holds (concurrent calls, e.g. the pipeline's kv-head
 * tasks on two threads, each find one; a decode step then touches no fresh
 * pages), else a block of the call's own. */
static void *scratch_get(struct infer_sparse *sp, size_t bytes, int *cached)
{
    for (int i = 0; i < SCRATCH_SLOTS; i++) {
        if (pthread_mutex_trylock(&sp->slock[i]) != 0)
            continue;
        if (sp->scap[i] < bytes) {
            free(sp->sbuf[i]);
            size_t want = bytes + bytes / 2; /* the cache grows a slot per step */
            sp->sbuf[i] = sl_malloc(want);
            sp->scap[i] = sp->sbuf[i] ? want : 0;
        }
        if (sp->sbuf[i]) {
            *cached = i + 1;
            return sp->sbuf[i];
        }
        pthread_mutex_unlock(&sp->slock[i]);
        break;
    }
    *cached = 0;
    return sl_malloc(bytes);
}

static void scratch_put(struct infer_sparse *sp, void *p, int cached)
{
    if (cached)
        pthread_mutex_unlock(&sp->slock[cached - 1]);
    else
        free(p);
}

static size_t up64(size_t x)
{
    return (x + 63) & ~(size_t)63;
}

/* Q scale of head h over the call's rows: max|q| / 127 (1 when all zero) */
static float head_scale(const float *q, uint32_t n, size_t qdim, uint32_t hd, uint32_t h)
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
static float group_scale(const float *q, uint32_t n, size_t qdim, uint32_t hd, uint32_t a0,
                         uint32_t a1)
{
    float s = 0.0f;
    for (uint32_t h = a0; h < a1; h++) {
        float v = head_scale(q, n, qdim, hd, h);
        s = v > s ? v : s;
    }
    return s;
}

/* The centre of kv head g's bucket grid: the geometric mean of its heads'
 * profiled mean Q scales (without a profile, of their first call's), so
 * that heads in one bucket share its scale and can share a launch. */
static float group_center(struct infer_sparse *sp, uint32_t layer, uint32_t g, const float *q,
                          uint32_t n)
{
    const struct format_config *c = &sp->cfg;
    uint32_t H = c->n_heads, kv_mul = H / c->n_kv_heads, hd = c->head_dim;
    double lg = 0;
    pthread_mutex_lock(&sp->lock);
    for (uint32_t h = g * kv_mul; h < (g + 1) * kv_mul; h++) {
        float *mean = &sp->qmean[(size_t)layer * H + h];
        if (!(*mean > 0.0f))
            *mean = head_scale(q, n, (size_t)H * hd, hd, h);
        lg += log((double)*mean);
    }
    pthread_mutex_unlock(&sp->lock);
    return (float)exp(lg / kv_mul);
}

static int sparse_run(const struct infer_attention *at, const struct format_config *c,
                      const struct infer_kv *kv, uint32_t layer, const struct infer_attn_rows *rows,
                      const float *q, uint32_t h0, uint32_t h1, float *out, float *scratch)
{
    struct infer_sparse *sp = at->ctx;
    uint32_t n = rows->n, T = rows->base + n;
    uint32_t H = c->n_heads, KV = c->n_kv_heads, hd = c->head_dim, kv_mul = H / KV;
    size_t qdim = (size_t)H * hd;
    if (rows->parent || rows->sel || T < sp->o.min_keys || n == 0 || kv_mul * n > NPU_GRAPH_MAX_M ||
        (sp->o.max_rows && n > sp->o.max_rows)) {
        pthread_mutex_lock(&sp->lock);
        sp->st.calls++;
        sp->st.dense_calls++;
        pthread_mutex_unlock(&sp->lock);
        return infer_attention_dense.run(&infer_attention_dense, c, kv, layer, rows, q, h0, h1, out,
                                         scratch);
    }
    struct sl_err err = {{0}};
    int ret = 0;
    uint64_t t_start = sl_now_ns();
    struct call_stats cs = {0};
    /* launches: per kv head, its heads in [h0, h1) grouped by bucket */
    uint32_t nh = h1 - h0;
    struct launch *la = sl_calloc(nh, sizeof *la), *jobs = NULL;
    float *hint = NULL;
    uint32_t *bucket = sl_calloc(nh, sizeof *bucket);
    float *qs = sl_calloc(nh, sizeof *qs);
    if (!la || !bucket || !qs) {
        ret = -ENOMEM;
        goto out;
    }
    for (uint32_t h = h0; h < h1; h++) {
        float s = head_scale(q, n, qdim, hd, h);
        if (sp->o.select_group) /* one bucket for the call's heads of the kv head */
            s = group_scale(q, n, qdim, hd, h / kv_mul * kv_mul > h0 ? h / kv_mul * kv_mul : h0,
                            (h / kv_mul + 1) * kv_mul < h1 ? (h / kv_mul + 1) * kv_mul : h1);
        float mu = group_center(sp, layer, h / kv_mul, q, n);
        bucket[h - h0] = attn_bucket_pick(mu, sp->step, sp->buckets, s);
        qs[h - h0] = attn_bucket_scale(mu, sp->step, sp->buckets, bucket[h - h0]);
    }
    uint32_t nl = 0;
    for (uint32_t g = h0 / kv_mul; g * kv_mul < h1; g++) {
        uint32_t a0 = g * kv_mul > h0 ? g * kv_mul : h0, a1 = (g + 1) * kv_mul < h1 ? (g + 1) * kv_mul : h1;
        uint32_t first = nl;
        for (uint32_t h = a0; h < a1; h++) {
            uint32_t j = first;
            while (j < nl && la[j].bucket != bucket[h - h0])
                j++;
            if (j == nl) {
                la[nl].g = g;
                la[nl].bucket = bucket[h - h0];
                la[nl].scale = attn_q_code_scale(qs[h - h0]);
                nl++;
            }
            la[j].head[la[j].cnt++] = h;
        }
        if ((ret = prepare_keys(sp, kv, layer, g, rows->base, T, &err)) < 0)
            goto out;
    }
    /* the plan (Algorithm 1) over the per-op costs */
    uint32_t *order = sl_calloc(nl ? nl : 1, sizeof *order);
    if (!order) {
        ret = -ENOMEM;
        goto out;
    }
    for (uint32_t i = 0; i < nl; i++)
        order[i] = i;
    if (!sp->o.no_plan && nl > 1 && nl <= ATTN_PLAN_MAX * 8 && nh <= 4096) {
        double *tn = sl_calloc(nl, sizeof *tn), *tk = sl_calloc(nh, sizeof *tk);
        double *tq = sl_calloc(nh, sizeof *tq);
        uint32_t *cnt = sl_calloc(nl, sizeof *cnt);
        uint32_t(*hl)[ATTN_PLAN_MAX] = sl_calloc(nl, sizeof *hl);
        if (tn && tk && tq && cnt && hl) {
            double vis = (double)n * rows->base + (double)n * (n + 1) / 2;
            for (uint32_t i = 0; i < nl; i++) {
                uint32_t L = sp->ks[(size_t)layer * KV + la[i].g].L;
                tn[i] = sp->c_est * la[i].cnt * n * (double)hd * L;
                cnt[i] = la[i].cnt;
                for (uint32_t j = 0; j < la[i].cnt; j++)
                    hl[i][j] = la[i].head[j] - h0;
            }
            for (uint32_t h = h0; h < h1; h++) {
                tk[h - h0] = sp->c_topk * vis;
                tq[h - h0] = sp->c_qkv * vis * sp->ratio[(size_t)layer * H + h] * hd;
            }
            attn_plan(nl, tn, cnt, hl, tk, tq, order);
            for (uint32_t i = 0; i < nl; i++)
                for (uint32_t j = 0; j < la[i].cnt; j++)
                    la[i].head[j] = hl[i][j] + h0;
        }
        free(tn);
        free(tk);
        free(tq);
        free(cnt);
        free(hl);
    }
    /* the launches, in the plan's order, split into jobs of rc rows: a job's
     * estimates (rows x L floats) stay in the caches until the CPU reads
     * them, and its rows are one block of PAIRS pairs for the CPU side */
    uint32_t rc = PAIRS / kv_mul ? PAIRS / kv_mul : 1;
    if (rc > n)
        rc = n;
    uint32_t per = (n + rc - 1) / rc, nj = nl * per;
    jobs = sl_calloc(nj ? nj : 1, sizeof *jobs);
    hint = sl_calloc(nh, sizeof *hint);
    if (!jobs || !hint) {
        free(order);
        ret = -ENOMEM;
        goto out;
    }
    for (uint32_t h = 0; h < nh; h++)
        hint[h] = NAN;
    for (uint32_t i = 0; i < nl; i++)
        for (uint32_t ch = 0; ch < per; ch++) {
            struct launch *jb = &jobs[i * per + ch];
            *jb = la[order[i]];
            jb->i0 = ch * rc;
            jb->nr = n - jb->i0 < rc ? n - jb->i0 : rc;
        }
    free(order);
    uint32_t m = kv_mul * pow2ceil(rc);
    if (m > NPU_GRAPH_MAX_M)
        m = NPU_GRAPH_MAX_M;
    uint32_t maxL = 0;
    for (uint32_t i = 0; i < nl; i++) {
        uint32_t L = sp->ks[(size_t)layer * KV + la[i].g].L;
        maxL = L > maxL ? L : maxL;
    }
    float *ybuf[AHEAD];
    int8_t *xbuf[AHEAD];
    size_t yb = up64(sizeof(float) * (size_t)kv_mul * rc * (maxL + YPAD)), xb = up64((size_t)kv_mul * rc * hd);
    size_t pb = up64(sizeof(float) * (size_t)PAIRS * T); /* sel or a */
    size_t sb = up64(sizeof(uint32_t) * ((size_t)T * 4 + PAIRS)), ab = up64(sizeof(float) * T);
    size_t gb = up64(sizeof(float) * (size_t)(T > KEY_TILE ? T : KEY_TILE) * hd);
    /* with many pairs per kv head, its keys and values are copied once per
     * call into consecutive rows (cache rows are kv_dim apart: at a stride
     * of a power of two they share few cache sets), which every job of the
     * kv head then reads in place: the same values, the same bits */
    uint32_t g0 = h0 / kv_mul, ngk = (h1 - 1) / kv_mul + 1 - g0;
    /* 64 pairs keep about 13 T rows: the copy (2 T) pays; the copies made
     * are one bit each of a 32-bit mask, so more kv heads go uncopied */
    int pack_kv = n * kv_mul >= 64 && ngk <= 32;
    size_t kvb = pack_kv ? up64(sizeof(float) * 2 * (size_t)T * hd) : 0;
    int cached;
    uint8_t *blk = scratch_get(sp, AHEAD * (yb + xb) + 2 * pb + sb + ab + gb + ngk * kvb, &cached);
    if (!blk) {
        ret = -ENOMEM;
        goto out;
    }
    for (int b = 0; b < AHEAD; b++) {
        ybuf[b] = (float *)(blk + b * yb);
        xbuf[b] = (int8_t *)(blk + AHEAD * yb + b * xb);
    }
    uint8_t *rest = blk + AHEAD * (yb + xb);
    struct attend_buf ab_ = {.sel = (uint32_t *)rest, .a = (float *)(rest + pb)};
    uint32_t *u = (uint32_t *)(rest + 2 * pb);
    ab_.work = u;
    ab_.i1 = u + 2 * (size_t)T;
    ab_.i2 = u + 3 * (size_t)T;
    ab_.cur = u + 4 * (size_t)T;
    ab_.fs = (float *)(rest + 2 * pb + sb);
    ab_.gather = (float *)(rest + 2 * pb + sb + ab);
    float *kvpack = (float *)(rest + 2 * pb + sb + ab + gb); /* [ngk][2][T][hd] */
    uint32_t packed = 0; /* bit g - g0: kv head g's copy is made (ngk <= 32 when packing) */
    uint32_t started = 0;
    uint8_t *stage = NULL; /* inline estimates' staging, grown to the largest graph's */
    size_t stage_cap = 0;
    /* inline estimates: per head of a launch, just before its rows pick
     * their keys (a launch's estimates, kv_mul * rc rows of L floats, would
     * have left the caches by then) */
    /* (with a few rows per launch, decode, the K codes read once per head
     * would cost more than the estimates' trip through L3) */
    int split = sp->o.inline_npu && !sp->o.select_group && rc >= SPLIT_ROWS;
    uint32_t msub = pow2ceil(rc) < NPU_GRAPH_MAX_M ? pow2ceil(rc) : NPU_GRAPH_MAX_M;
    for (uint32_t done = 0; done < nj && ret == 0; done++) {
        /* keep AHEAD jobs in flight */
        while (started < nj && started < done + AHEAD) {
            struct launch *l = &jobs[started];
            l->xq = xbuf[started % AHEAD];
            l->y = ybuf[started % AHEAD];
            for (uint32_t j = 0; j < l->cnt; j++)
                for (uint32_t i = 0; i < l->nr; i++)
                    attn_quantize_q(q + (size_t)(l->i0 + i) * qdim + (size_t)l->head[j] * hd, hd,
                                    l->scale, l->xq + ((size_t)j * l->nr + i) * hd);
            struct kslot *ks = &sp->ks[(size_t)layer * KV + l->g];
            const struct npu_graph *gr;
            ret = npu_device_graph(sp->dev, m, hd, ks->L, &gr, &err);
            if (ret == 0)
                ret = start_launch(sp, l, gr, ks->w, l->nr, ks->L + YPAD, &err);
            if (ret < 0)
                break;
            started++;
            cs.launches++;
        }
        if (ret < 0)
            break;
        struct launch *l = &jobs[done];
        uint32_t L = sp->ks[(size_t)layer * KV + l->g].L;
        ab_.gsub = NULL;
        ab_.ysub = NULL;
        if (split) { /* each head's rows estimated as attend_launch reaches them */
            if ((ret = npu_device_graph(sp->dev, msub, hd, L, &ab_.gsub, &err)) < 0)
                break;
            struct npu_graph_info gi;
            npu_graph_info(ab_.gsub, &gi);
            if (gi.scratch_bytes > stage_cap) { /* one staging for the call's pieces */
                sl_free_aligned(stage);
                stage_cap = 0;
                if (!(stage = sl_alloc_aligned(gi.scratch_bytes, 64))) {
                    sl_err_set(&err, "sparse attention: out of memory for %zu bytes of staging",
                               gi.scratch_bytes);
                    ret = -ENOMEM;
                    break;
                }
                stage_cap = gi.scratch_bytes;
            }
            ab_.stage = stage;
            ab_.ysub = l->y;
        } else {
            uint64_t t0 = sl_now_ns();
            if ((ret = finish_launch(l, &err)) < 0)
                break;
            cs.wait_ns += sl_now_ns() - t0;
        }
        const float *kh = infer_kv_keys(kv, layer) + (size_t)l->g * hd;
        const float *vh = infer_kv_values(kv, layer) + (size_t)l->g * hd;
        size_t ld = (size_t)KV * hd;
        if (pack_kv) {
            float *pk = kvpack + (size_t)(l->g - g0) * 2 * T * hd, *pv = pk + (size_t)T * hd;
            if (!(packed >> (l->g - g0) & 1)) {
                for (uint32_t t = 0; t < T; t++) {
                    memcpy(pk + (size_t)t * hd, kh + (size_t)t * ld, sizeof(float) * hd);
                    memcpy(pv + (size_t)t * hd, vh + (size_t)t * ld, sizeof(float) * hd);
                }
                packed |= 1u << (l->g - g0);
            }
            kh = pk;
            vh = pv;
            ld = hd;
        }
        if ((ret = attend_launch(sp, layer, rows, q, l, L + YPAD, out, h0, hint, kh, vh, ld, &ab_, &cs,
                                 &err)) < 0)
            break;
    }
    /* on an error, let every submitted job finish before freeing its buffers */
    for (uint32_t i = 0; i < nj; i++)
        if (jobs[i].ticket)
            (void)npu_ticket_wait(jobs[i].ticket);
    scratch_put(sp, blk, cached);
    sl_free_aligned(stage);
out:
    cs.total_ns = sl_now_ns() - t_start;
    pthread_mutex_lock(&sp->lock);
    sp->st.calls++;
    sp->st.row_heads += cs.row_heads;
    sp->st.keys_visible += cs.visible;
    sp->st.keys_kept += cs.kept;
    sp->st.launches += cs.launches;
    sp->st.total_ns += cs.total_ns;
    sp->st.wait_ns += cs.wait_ns;
    sp->st.topk_ns += cs.topk_ns;
    sp->st.qkv_ns += cs.qkv_ns;
    sp->recall_sum += cs.recall;
    sp->mass_sum += cs.mass;
    sp->recall_n += cs.recall_n;
    sp->mass_n += cs.recall_n;
    pthread_mutex_unlock(&sp->lock);
    free(la);
    free(jobs);
    free(hint);
    free(bucket);
    free(qs);
    return ret;
}

int infer_sparse_create(const struct format_config *c, const struct infer_attn_profile *p,
                        const struct infer_sparse_opts *o, struct infer_sparse **out,
                        struct sl_err *err)
{
    struct infer_sparse_opts d = {.keep = 0.2, .sinks = 4, .window = 16};
    if (o) {
        d = *o;
        if (d.keep == 0)
            d.keep = 0.2;
    }
    if (!(d.floor_share >= 0 && d.floor_share <= 1)) {
        sl_err_set(err, "sparse attention: the floor share %g is not in [0, 1]", d.floor_share);
        return -EINVAL;
    }
    if (!(d.keep > 0 && d.keep <= 1)) {
        sl_err_set(err, "sparse attention: the keep ratio %g is not in (0, 1]", d.keep);
        return -EINVAL;
    }
    if (c->n_kv_heads == 0 || c->n_heads % c->n_kv_heads || c->n_heads / c->n_kv_heads > ATTN_PLAN_MAX) {
        sl_err_set(err, "sparse attention: %u heads over %u kv heads is not supported",
                   c->n_heads, c->n_kv_heads);
        return -EINVAL;
    }
    if (p && (p->n_layers != c->n_layers || p->n_heads != c->n_heads ||
              p->n_kv_heads != c->n_kv_heads)) {
        sl_err_set(err,
                   "sparse attention: the profile is of %u layers x %u heads (%u kv), the model "
                   "has %u x %u (%u)",
                   p->n_layers, p->n_heads, p->n_kv_heads, c->n_layers, c->n_heads, c->n_kv_heads);
        return -EINVAL;
    }
    struct infer_sparse *sp = sl_calloc(1, sizeof *sp);
    size_t N = (size_t)c->n_layers * c->n_heads;
    if (!sp || !(sp->ratio = sl_calloc(N, sizeof(double))) ||
        !(sp->qmean = sl_calloc(N, sizeof(float))) ||
        !(sp->ks = sl_calloc((size_t)c->n_layers * c->n_kv_heads, sizeof *sp->ks))) {
        infer_sparse_destroy(sp);
        sl_err_set(err, "sparse attention: out of memory");
        return -ENOMEM;
    }
    pthread_mutex_init(&sp->lock, NULL);
    for (int i = 0; i < SCRATCH_SLOTS; i++)
        pthread_mutex_init(&sp->slock[i], NULL);
    sp->cfg = *c;
    sp->o = d;
    snprintf(sp->name, sizeof sp->name, "sparse keep %.2f%s", d.keep, d.uniform ? " uniform" : "");
    sp->attn = (struct infer_attention){.name = sp->name, .run = sparse_run, .ctx = sp};
    sp->buckets = p && p->buckets ? p->buckets : 9;
    sp->step = p && p->step > 0 ? p->step : 0.5f;
    float *fr = sl_malloc(N * sizeof(float));
    if (!fr) {
        infer_sparse_destroy(sp);
        sl_err_set(err, "sparse attention: out of memory");
        return -ENOMEM;
    }
    int by_imp = p && !d.uniform && d.floor_share < 1;
    attn_ratios(by_imp ? p->head_imp : NULL, by_imp ? p->layer_imp : NULL, c->n_layers,
                c->n_heads, d.keep, d.floor_share, fr);
    for (size_t i = 0; i < N; i++) /* uniform: the ratio itself, not its float */
        sp->ratio[i] = by_imp ? (double)fr[i] : d.keep;
    free(fr);
    if (p)
        memcpy(sp->qmean, p->q_scale, N * sizeof(float));
    /* per-op costs (ns): the profile's, else typical of an AVX2 core */
    sp->c_est = p && p->cost_est > 0 ? p->cost_est : 0.05;
    sp->c_topk = p && p->cost_topk > 0 ? p->cost_topk : 2.0;
    sp->c_qkv = p && p->cost_qkv > 0 ? p->cost_qkv : 0.5;
    if (d.device) {
        sp->dev = d.device;
    } else {
        struct npu_device_config dc;
        npu_device_config_init(&dc);
        dc.max_graphs = 1024;
        int ret = npu_device_create_config(&dc, &sp->dev, err);
        if (ret < 0) {
            infer_sparse_destroy(sp);
            return ret;
        }
        sp->own_dev = 1;
    }
    *out = sp;
    return 0;
}

void infer_sparse_destroy(struct infer_sparse *sp)
{
    if (!sp)
        return;
    if (sp->own_dev)
        npu_device_destroy(sp->dev);
    if (sp->ks)
        for (size_t i = 0; i < (size_t)sp->cfg.n_layers * sp->cfg.n_kv_heads; i++)
            npu_weights_destroy(sp->ks[i].w);
    if (sp->ratio) { /* the mutexes were initialized */
        pthread_mutex_destroy(&sp->lock);
        for (int i = 0; i < SCRATCH_SLOTS; i++)
            pthread_mutex_destroy(&sp->slock[i]);
    }
    for (int i = 0; i < SCRATCH_SLOTS; i++)
        free(sp->sbuf[i]);
    free(sp->ks);
    free(sp->ratio);
    free(sp->qmean);
    free(sp);
}

const struct infer_attention *infer_sparse_attention(struct infer_sparse *sp)
{
    return &sp->attn;
}

void infer_sparse_stats(struct infer_sparse *sp, struct infer_sparse_stats *st)
{
    pthread_mutex_lock(&sp->lock);
    *st = sp->st;
    st->recall = sp->recall_n ? sp->recall_sum / (double)sp->recall_n : 0;
    st->mass = sp->mass_n ? sp->mass_sum / (double)sp->mass_n : 0;
    pthread_mutex_unlock(&sp->lock);
}

void infer_sparse_stats_reset(struct infer_sparse *sp)
{
    pthread_mutex_lock(&sp->lock);
    memset(&sp->st, 0, sizeof sp->st);
    sp->recall_sum = sp->mass_sum = 0;
    sp->recall_n = sp->mass_n = 0;
    pthread_mutex_unlock(&sp->lock);
}

int attn_sparse_estimate(struct infer_sparse *sp, const struct infer_kv *kv, uint32_t layer,
                         const float *q, uint32_t n, uint32_t base, uint32_t h, float *est,
                         uint32_t *L, float *qscale, struct sl_err *err)
{
    const struct format_config *c = &sp->cfg;
    uint32_t hd = c->head_dim, H = c->n_heads, kv_mul = H / c->n_kv_heads, g = h / kv_mul;
    size_t qdim = (size_t)H * hd;
    float s = sp->o.select_group ? group_scale(q, n, qdim, hd, g * kv_mul, (g + 1) * kv_mul)
                                 : head_scale(q, n, qdim, hd, h);
    float mu = group_center(sp, layer, g, q, n);
    struct launch la = {.g = g, .cnt = 1};
    la.scale = attn_q_code_scale(attn_bucket_scale(mu, sp->step, sp->buckets,
                                                   attn_bucket_pick(mu, sp->step, sp->buckets, s)));
    int ret = prepare_keys(sp, kv, layer, g, base, base + n, err);
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
        ret = start_launch(sp, &la, gr, ks->w, n, 0, err);
    if (ret == 0)
        ret = finish_launch(&la, err);
    free(la.xq);
    *L = ks->L;
    *qscale = la.scale;
    return ret;
}

/* attn_sparse_run.c: one call of sparse attention (infer_attn_sparse.c has
 * the design): heads grouped into launches by bucket, ordered by the plan
 * (Algorithm 1), split into jobs of a block of rows, kept AHEAD jobs in
 * flight on the device (or run inline per head), each finished job's rows
 * attended by attn_sparse_attend; the call's scratch from the instance's
 * cached blocks; calls it does not cover run dense. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "attn_sparse_int.h"

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

int attn_sparse_run(const struct infer_attention *at, const struct format_config *c,
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
        float s = attn_sparse_head_scale(q, n, qdim, hd, h);
        if (sp->o.select_group) /* one bucket for the call's heads of the kv head */
            s = attn_sparse_group_scale(
                q, n, qdim, hd, h / kv_mul * kv_mul > h0 ? h / kv_mul * kv_mul : h0,
                (h / kv_mul + 1) * kv_mul < h1 ? (h / kv_mul + 1) * kv_mul : h1);
        float mu = attn_sparse_group_center(sp, layer, h / kv_mul, q, n);
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
        if ((ret = attn_sparse_prepare_keys(sp, kv, layer, g, rows->base, T, &err)) < 0)
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
    hint = sl_calloc((size_t)nh * ATTN_HINT, sizeof *hint);
    if (!jobs || !hint) {
        free(order);
        ret = -ENOMEM;
        goto out;
    }
    for (uint32_t h = 0; h < nh * ATTN_HINT; h++)
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
    size_t tile = attn_key_tile(hd);
    size_t gb = up64(sizeof(float) * (T > tile ? T : tile) * hd);
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
                ret = attn_sparse_start_launch(sp, l, gr, ks->w, l->nr, ks->L + YPAD, &err);
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
            if ((ret = attn_sparse_finish_launch(l, &err)) < 0)
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
        if ((ret = attn_sparse_attend(sp, layer, rows, q, l, L + YPAD, out, h0, hint, kh, vh, ld,
                                      &ab_, &cs, &err)) < 0)
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

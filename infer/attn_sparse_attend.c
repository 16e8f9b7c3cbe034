/* attn_sparse_attend.c: sparse attention's CPU side for one finished launch
 * (infer_attn_sparse.c has the design): per (row, head) pair the keys it
 * keeps (sinks, recent window, top of the rest by the estimate, the previous
 * row's threshold the first guess), then the exact float softmax.V over a
 * block of pairs (attn_sel_rows); for the shared selection one list per row
 * for the kv head's heads (attn_group_rows_blk); with `measure`, the
 * recall of the estimate's top-k and the float mass kept. */
#include <math.h>
#include <stdint.h>

#include "attn_sparse_int.h"

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
    float sq = sqrtf((float)hd);
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
            attn_group_combine(e, (size_t)l->nr * ld, G, visible, sq, b->fs);
            uint32_t ns = attn_select_row_hint(b->fs, visible, k, sinks, window, sel, b->work,
                                               &hint[(ha - h0) * ATTN_HINT]);
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
        attn_group_rows_blk(i1 - i0, w, G, hd, hd, hd, kh, vh, kv_dim, attn_key_tile(hd),
                            rows->base + i1, b->cur, b->gather);
        cs->topk_ns += t1 - t0;
        cs->qkv_ns += sl_now_ns() - t1;
    }
}

/* Row blocks (sp->o.row_block = R): head h's rows [p0, p1) (estimates e0,
 * rows ld apart, the first of them row p0's) in blocks of R rows, each
 * block one list: the top of the rows' estimates combined as the shared
 * selection combines heads (attn_group_combine: the largest of the rows'
 * estimated log-probabilities) over the keys its first row sees, the
 * sinks and recent window of that row, then the block's own newest keys
 * (row m attends the list's first ns + m slots: a prefix, in order). The
 * count is centred: ns + m averages the rows' keep counts over the block.
 * Fills w[*nw...] (pair slots from *np: lists, weights) and lens. */
static void select_blocks(struct infer_sparse *sp, uint32_t layer,
                          const struct infer_attn_rows *rows, const float *q, uint32_t h,
                          uint32_t p0, uint32_t p1, const float *e0, size_t ld, float *out,
                          float *hint, const float *kh, size_t kv_dim, const struct attend_buf *b,
                          struct attn_group_row *w, uint32_t *nw, uint32_t *np, uint32_t *lens,
                          struct call_stats *cs)
{
    const struct format_config *c = &sp->cfg;
    uint32_t hd = c->head_dim, H = c->n_heads, R = sp->o.row_block, T = rows->base + rows->n;
    size_t qdim = (size_t)H * hd;
    uint32_t sinks = sp->o.sinks == UINT32_MAX ? 0 : sp->o.sinks;
    uint32_t window = sp->o.window == UINT32_MAX ? 0 : sp->o.window;
    double r = sp->ratio[(size_t)layer * H + h];
    float sq = sqrtf((float)hd);
    for (uint32_t a = p0; a < p1; a += R) {
        uint32_t m = p1 - a < R ? p1 - a : R, v0 = rows->base + a + 1, mid = (m - 1) / 2;
        const float *e = e0 + (size_t)(a - p0) * ld;
        uint32_t *sel = b->sel + (size_t)*np * T;
        uint32_t k = attn_keep_count(r, v0 + mid);
        k = k > mid ? k - mid : 1;
        k = k < v0 ? k : v0;
        /* a block of one row (a decode step, a chunk's last row): its own
         * estimates, as a list per row ranks them (the combine would only
         * shift them by its log-sum-exp) */
        const float *rank = e;
        float *guess = NULL; /* the hint is on the combined scale: not for this one */
        if (m > 1) {
            attn_group_combine(e, ld, m, v0, sq, b->fs);
            rank = b->fs;
            guess = hint;
        }
        uint32_t ns = attn_select_row_hint(rank, v0, k, sinks, window, sel, b->work, guess);
        for (uint32_t j = 1; j < m; j++) {
            sel[ns + j - 1] = v0 + j - 1;
            lens[*np + j] = ns + j;
        }
        lens[*np] = ns;
        w[(*nw)++] = (struct attn_group_row){.q = q + (size_t)a * qdim + (size_t)h * hd,
                                             .out = out + (size_t)a * qdim + (size_t)h * hd,
                                             .list = sel, .len = ns + m - 1,
                                             .s = b->a + (size_t)*np * T, .m = m,
                                             .lens = lens + *np};
        for (uint32_t j = 0; j < m; j++) {
            cs->row_heads++;
            cs->visible += v0 + j;
            cs->kept += ns + j;
            if (sp->o.measure) {
                double rc, ms;
                measure_row(q + (size_t)(a + j) * qdim + (size_t)h * hd, kh, kv_dim, hd,
                            e + (size_t)j * ld, v0 + j, attn_keep_count(r, v0 + j), sel, ns + j,
                            b->fs, b->i1, b->i2, b->work, &rc, &ms);
                cs->recall += rc;
                cs->mass += ms;
                cs->recall_n++;
            }
        }
        *np += m;
    }
}

/* Top-k and softmax.V for every row of every head of a finished launch
 * (kv head l->g's keys and values at kh, vh, rows kv_dim apart),
 * PAIRS (row, head) pairs at a time: each pair's keys picked (the previous
 * row's threshold the guess for the next: hint[(h - h0) * ATTN_HINT], carried across
 * launches), then the block's exact softmax.V. */
int attn_sparse_attend(struct infer_sparse *sp, uint32_t layer, const struct infer_attn_rows *rows,
                       const float *q, const struct launch *l, size_t ld, float *out, uint32_t h0,
                       float *hint, const float *kh, const float *vh, size_t kv_dim,
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
    struct attn_group_row wr[PAIRS];
    uint32_t lens[PAIRS], R = sp->o.row_block > 1 ? sp->o.row_block : 1;
    (void)kv_mul;
    (void)n;
    if (sp->o.select_group) {
        attend_group(sp, layer, rows, q, l, ld, out, h0, hint, kh, vh, kv_dim, b, cs);
        return 0;
    }
    for (uint32_t i0 = l->i0; i0 < end; i0 += rb) {
        uint32_t i1 = end - i0 < rb ? end : i0 + rb, np = 0, nw = 0, tmax = rows->base + i1;
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
                    /* only the keys the piece's rows see (its last row: base
                     * + p1 of them), in whole 16-key blocks: a prefill's
                     * pieces skipped ~a half chunk of the bucket's L */
                    uint32_t L = (uint32_t)ld - YPAD, see = (rows->base + p1 + 15) & ~15u;
                    job.r0 = 0;
                    job.r1 = see < L ? see : 0; /* 0: all L */
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
                if (R > 1) {
                    select_blocks(sp, layer, rows, q, h, p0, p1, yj + (size_t)(p0 - ybase) * ld, ld,
                                  out, &hint[(h - h0) * ATTN_HINT], kh, kv_dim, b, wr, &nw, &np,
                                  lens, cs);
                    continue;
                }
                for (uint32_t i = p0; i < p1; i++, np++) {
                    uint32_t visible = rows->base + i + 1;
                    uint32_t k = attn_keep_count(r, visible);
                    const float *e = yj + (size_t)(i - ybase) * ld;
                    uint32_t *sel = b->sel + (size_t)np * T;
                    uint32_t ns = attn_select_row_hint(e, visible, k, sinks, window, sel, b->work,
                                                       &hint[(h - h0) * ATTN_HINT]);
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
        if (R > 1)
            attn_group_rows_blk(nw, wr, R, qdim, qdim, hd, kh, vh, kv_dim, attn_key_tile(hd),
                                tmax, b->cur, b->gather);
        else
            attn_sel_rows(np, pr, kh, vh, kv_dim, hd, attn_key_tile(hd), tmax, b->cur,
                          b->gather);
        cs->topk_ns += t1 - t0;
        cs->qkv_ns += sl_now_ns() - t1;
    }
    return 0;
}

/* spec_session.c: speculative generation on a session (infer.h
 * infer_spec_*): per round, draft a tree under the pending token from the
 * sources' n-gram indexes and the reused segment, verify it in one
 * infer_forward_batch (tree mask: parents; positions: depth), keep the
 * accepted path's KV slots (infer_kv_commit) and emit its tokens. With no
 * draft the round is a plain one-row step. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "infer_internal.h"
#include "spec_internal.h"

#define MATCHES_PER_ORDER 4 /* candidates taken per n-gram order and source */
/* matches gathered per order and source, the best MATCHES_PER_ORDER taken
 * (spec_select: longest extent first); 4-64 priced within +-0.01 */
#define MATCHES_GATHERED 16

struct infer_spec {
    struct infer_session *s;
    struct infer_model *m;
    struct infer_state *st;
    struct infer_spec_opts o;
    uint32_t vocab, n_prompt;
    uint32_t n_fed; /* context tokens in the cache (the index holds them and no more) */
    struct spec_index src[SPEC_SRC_REUSE]; /* context, history, calibrated */
    struct spec_reuse reuse;
    int calibrated;
    float *logits; /* [SPEC_MAX_ROWS][vocab] */
    float *probs;  /* [vocab] */
    struct spec_tree tree;
    uint32_t path[SPEC_MAX_ROWS], np; /* the last verification's accepted rows */
    struct infer_spec_stats stats;
    /* the cost model: per source, match order and first/later token, the
     * estimated acceptance (moving averages of what verification found);
     * the price of a verification in one-row steps (spec_cost.c), one for
     * each way it can run (where), cost: the way of this round's (on) */
    float acc[SPEC_SRC_COUNT][SPEC_MAX_ORDER + 1][2];
    struct spec_where where;
    struct spec_cost *cost;
    uint32_t on;
    /* the session state's device thread at create (NULL: none); a
     * verification on the calling thread alone detaches it for that forward */
    struct npu_device *dev0;
    /* the last tree the cost model skipped, followed along the tokens
     * produced after its root (shadow_at: the row they reached) */
    struct spec_tree shadow;
    uint32_t shadow_at;
    int shadow_on;
};

#define ACC_RATE 0.1f /* moving-average weight of one observation */

static int calibrate(struct infer_spec *sp, struct sl_err *err);

int infer_spec_exact(const struct infer_model *m)
{
    for (uint32_t l = 0; l < m->cfg.n_layers; l++) {
        const struct infer_layer *w = &m->layers[l];
        const struct infer_linear *lin[] = {&w->wq,     &w->wk,   &w->wv,    &w->wo,
                                            &w->w_gate, &w->w_up, &w->w_down};
        for (size_t i = 0; i < sizeof lin / sizeof lin[0]; i++)
            if (!lin[i]->w && !(lin[i]->act_scale > 0))
                return 0;
    }
    return m->cls->w || m->cls->act_scale > 0;
}

void infer_spec_destroy(struct infer_spec *sp)
{
    if (!sp)
        return;
    for (int i = 0; i < SPEC_SRC_REUSE; i++)
        spec_index_free(&sp->src[i]);
    free(sp->logits);
    free(sp->probs);
    free(sp);
}

int infer_spec_create(struct infer_session *s, const int *context, uint32_t n,
                      const struct infer_spec_opts *o, struct infer_spec **out, struct sl_err *err)
{
    struct infer_spec *sp = calloc(1, sizeof *sp);
    if (!sp) {
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    sp->s = s;
    sp->m = infer_session_model(s);
    sp->st = infer_session_state(s);
    sp->vocab = sp->m->cfg.vocab_size;
    sp->o = o ? *o : (struct infer_spec_opts){0};
    if (sp->o.max_rows == 0)
        sp->o.max_rows = 8;
    if (sp->o.min_match == 0)
        sp->o.min_match = 2;
    if (sp->o.reuse_threshold == 0)
        sp->o.reuse_threshold = 16;
    if (sp->o.calib_breadth == 0)
        sp->o.calib_breadth = 2;
    if (sp->o.calib_depth == 0)
        sp->o.calib_depth = 4;
    if (!(sp->o.calib_min_p > 0))
        sp->o.calib_min_p = 0.2f;
    sp->dev0 = sp->st->dev;
    spec_where_init(&sp->where, sp->o.row_cost, sp->dev0 != NULL);
    for (int i = 0; i < 2; i++)
        if (sp->where.c[i].fixed && sp->o.verify_cost > 0)
            sp->where.c[i].beta = sp->o.verify_cost;
    sp->cost = &sp->where.c[0];
    for (int src = 0; src < SPEC_SRC_COUNT; src++)
        for (int g = 0; g <= SPEC_MAX_ORDER; g++) {
            /* priors: longer matches are likelier; a token after an accepted
             * one likelier still (the text is being quoted) */
            sp->acc[src][g][0] = 0.15f + 0.12f * (float)g;
            sp->acc[src][g][1] = 0.5f + 0.08f * (float)g;
        }
    if ((sp->o.max_rows != 4 && sp->o.max_rows != 8 && sp->o.max_rows != 16) ||
        sp->o.min_match > SPEC_MAX_ORDER) {
        sl_err_set(err,
                   "speculative decoding wants 4, 8 or 16 rows (not %u) and a minimum "
                   "match of 1..%d tokens (not %u)",
                   sp->o.max_rows, SPEC_MAX_ORDER, sp->o.min_match);
        infer_spec_destroy(sp);
        return -EINVAL;
    }
    sp->logits = malloc(sizeof(float) * sp->vocab * SPEC_MAX_ROWS);
    sp->probs = malloc(sizeof(float) * sp->vocab);
    int ret = sp->logits && sp->probs ? 0 : -ENOMEM;
    for (int i = 0; ret == 0 && i < SPEC_SRC_REUSE; i++)
        ret = spec_index_init(&sp->src[i], i == SPEC_SRC_CONTEXT ? sp->m->cfg.seq_len : 4096);
    if (ret == 0)
        ret = spec_index_append(&sp->src[SPEC_SRC_CONTEXT], context, n);
    if (ret == 0 && sp->o.history)
        ret = spec_index_append(&sp->src[SPEC_SRC_HISTORY], sp->o.history, sp->o.n_history);
    if (ret < 0) {
        sl_err_set(err, "out of memory for the draft index");
        infer_spec_destroy(sp);
        return ret;
    }
    sp->n_prompt = n;
    sp->n_fed = n;
    /* the prefill's logits: calibrated now (the array need not outlive this call) */
    if (sp->o.calibrate && sp->o.prompt_logits && (ret = calibrate(sp, err)) < 0) {
        infer_spec_destroy(sp);
        return ret;
    }
    sp->o.prompt_logits = NULL;
    *out = sp;
    return 0;
}

/* ---- drafting ---- */

struct collect {
    struct infer_spec *sp;
    const int *stop;
    uint32_t n_stop, depth, max_rows, order;
    enum spec_src src;
};

static int is_stop(const int *stop, uint32_t n_stop, int t)
{
    for (uint32_t i = 0; i < n_stop; i++)
        if (t == stop[i])
            return 1;
    return 0;
}

/* A match ending at `end`: what follows it, up to depth tokens, before a
 * separator or a stop token, goes into the tree. Stops once it is full. */
static int on_match(void *ctx, const struct spec_index *ix, uint32_t end)
{
    struct collect *c = ctx;
    struct spec_tree *t = &c->sp->tree;
    uint32_t k = 0;
    int cand[SPEC_MAX_ROWS];
    while (k < c->depth && end + 1 + k < ix->n) {
        int tok = ix->tok[end + 1 + k];
        if (tok < 0 || is_stop(c->stop, c->n_stop, tok))
            break;
        cand[k++] = tok;
    }
    if (k) {
        const float *a = c->sp->acc[c->src][c->order];
        spec_tree_add_p(t, cand, k, c->max_rows, c->src, c->order, a[0], a[1], c->sp->cost->alpha);
    }
    return t->n >= c->max_rows;
}

/* The draft tree under root for the context in the context index (root is
 * its last token), drafts at most depth deep, within max_rows. */
static void draft(struct infer_spec *sp, int root, uint32_t pos, uint32_t depth, uint32_t max_rows,
                  const int *stop, uint32_t n_stop)
{
    struct spec_tree *t = &sp->tree;
    spec_tree_reset(t, root, pos);
    if (depth == 0 || max_rows < 2)
        return;
    const struct spec_index *cx = &sp->src[SPEC_SRC_CONTEXT];
    struct collect c = {.sp = sp,
                        .stop = stop,
                        .n_stop = n_stop,
                        .depth = depth < SPEC_MAX_ROWS - 1 ? depth : SPEC_MAX_ROWS - 1,
                        .max_rows = max_rows};
    /* per source, the match ends drafted from at a longer order (the same
     * match again at a shorter one would take a candidate's place) */
    uint32_t used[SPEC_SRC_REUSE][SPEC_MAX_ORDER * MATCHES_PER_ORDER], n_used[SPEC_SRC_REUSE] = {0};
    /* longest match first; within an order the context, the calibrated
     * sequences, then history; the reused segment fills what the 2-grams
     * leave before the weaker matches */
    static const enum spec_src order[] = {SPEC_SRC_CONTEXT, SPEC_SRC_CALIB, SPEC_SRC_HISTORY};
    for (uint32_t g = SPEC_MAX_ORDER; g >= 1 && t->n < max_rows; g--) {
        if (g == 1 && !sp->o.no_reuse) {
            const int *seg;
            uint32_t ns = spec_reuse_offer(&sp->reuse, root, sp->o.reuse_threshold, &seg);
            const float *a = sp->acc[SPEC_SRC_REUSE][0];
            if (ns)
                spec_tree_add_p(t, seg, ns < c.depth ? ns : c.depth, max_rows, SPEC_SRC_REUSE, 0,
                                a[0], a[1], sp->cost->alpha);
        }
        for (size_t k = 0; k < sizeof order / sizeof order[0] && t->n < max_rows; k++) {
            enum spec_src src = order[k];
            /* below the minimum match only calibrated sequences, and the
             * context's 1-grams when nothing longer drafted anything (the
             * cost model prices them by their measured acceptance) */
            if (g < sp->o.min_match && src != SPEC_SRC_CALIB &&
                !(g == 1 && src == SPEC_SRC_CONTEXT && t->n == 1))
                continue;
            struct spec_cand cand[MATCHES_PER_ORDER];
            uint32_t nc = spec_select(&sp->src[src], cx->tok, cx->n, g, MATCHES_GATHERED,
                                      MATCHES_PER_ORDER, used[src], n_used[src], cand);
            c.src = src;
            c.order = g;
            for (uint32_t i = 0; i < nc && t->n < max_rows; i++) {
                used[src][n_used[src]++] = cand[i].end;
                on_match(&c, &sp->src[src], cand[i].end);
            }
        }
    }
}

/* ---- a round ---- */

static int argmax_row(const float *x, uint32_t n)
{
    int best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[best])
            best = (int)i;
    return best;
}

/* Draft reuse after a rejection below row `at` (next: the model's token
 * there): the rejected child with the deepest chain, followed to its leaf,
 * against the model's argmax at each of its rows' parents (eq. 3). */
static void reuse_after(struct infer_spec *sp, uint32_t at, int next)
{
    const struct spec_tree *t = &sp->tree;
    uint32_t best = 0, best_d = 0;
    for (uint32_t r = at + 1; r < t->n; r++) {
        if (t->parent[r] != (int32_t)at)
            continue;
        uint32_t leaf = r, d = 1;
        for (uint32_t q = r + 1; q < t->n; q++)
            if (t->parent[q] == (int32_t)leaf) { /* first child: rows are added depth first */
                leaf = q;
                d++;
            }
        if (d > best_d) {
            best_d = d;
            best = r;
        }
    }
    if (best_d < 2)
        return;
    int x[SPEC_MAX_ROWS], y[SPEC_MAX_ROWS];
    uint32_t nx = 0;
    for (uint32_t r = best, prev = at;;) {
        x[nx] = t->tok[r];
        y[nx] = prev == at ? next : argmax_row(sp->logits + (size_t)prev * sp->vocab, sp->vocab);
        nx++;
        uint32_t child = 0;
        for (uint32_t q = r + 1; q < t->n && !child; q++)
            if (t->parent[q] == (int32_t)r)
                child = q;
        if (!child)
            break;
        prev = r;
        r = child;
    }
    spec_reuse_update(&sp->reuse, x, y, nx, 0);
}

/* What the round says about the cost model: every row whose parent was
 * accepted was a test of its source's acceptance; the time of n rows
 * against a one-row step, of alpha. */
static void learn(struct infer_spec *sp, const uint32_t *path, uint32_t np, double dt)
{
    const struct spec_tree *t = &sp->tree;
    uint8_t on[SPEC_MAX_ROWS] = {0};
    for (uint32_t i = 0; i < np; i++)
        on[path[i]] = 1;
    for (uint32_t r = 1; r < t->n; r++) {
        if (!on[t->parent[r]])
            continue;
        float *a = &sp->acc[t->src[r]][t->order[r]][t->later[r]];
        *a += ACC_RATE * ((on[r] ? 1.0f : 0.0f) - *a);
    }
    spec_where_verify(&sp->where, sp->on, t->n, dt);
}

/* A skipped tree still tests its rows, for free: the tokens produced after
 * its root show which rows a verification would have accepted. Each token
 * tests the children of the row reached so far (as learn() tests the rows
 * whose parent was accepted) and moves to the matching child; the shadow
 * ends at a mismatch or a leaf. Without it, a price that skips every tree
 * leaves the acceptance estimates where they were when it rose: trees of a
 * source that has turned good are never verified again. */
static void shadow_feed(struct infer_spec *sp, int tok)
{
    if (!sp->shadow_on)
        return;
    const struct spec_tree *t = &sp->shadow;
    uint32_t hit = 0;
    for (uint32_t r = sp->shadow_at + 1; r < t->n; r++) {
        if (t->parent[r] != (int32_t)sp->shadow_at)
            continue;
        float *a = &sp->acc[t->src[r]][t->order[r]][t->later[r]];
        int on = t->tok[r] == tok;
        *a += ACC_RATE * ((on ? 1.0f : 0.0f) - *a);
        if (on)
            hit = r;
    }
    sp->shadow_at = hit;
    sp->shadow_on = hit != 0;
}

/* One verification of the tree (root = the pending token, already in the
 * context index): commits the accepted path; *acc: its draft tokens,
 * *next the token after them. */
static int verify(struct infer_spec *sp, int *acc, uint32_t *n_acc, int *next, struct sl_err *err)
{
    struct spec_tree *t = &sp->tree;
    struct infer_kv *kv = infer_state_kv(sp->st);
    uint32_t base = infer_kv_len(kv), rows[SPEC_MAX_ROWS], path[SPEC_MAX_ROWS];
    for (uint32_t i = 0; i < t->n; i++)
        rows[i] = i;
    struct infer_batch b = {.n = t->n,
                            .tokens = t->tok,
                            .pos = t->pos,
                            .parent = t->parent,
                            .logits_rows = rows,
                            .n_logits = t->n};
    /* on the calling thread alone: no device for this forward (the same
     * rows' results either way: the split only divides output channels) */
    if (sp->st->dev != sp->dev0) {
        sl_err_set(err, "speculative decoding: the session's device thread was left detached");
        return -EFAULT;
    }
    if (sp->on == 1)
        sp->st->dev = NULL;
    const uint32_t alone = sp->dev0 && !sp->st->dev; /* what the forward runs with */
    uint64_t t0 = sl_now_ns(), jobs = sp->st->npu_jobs;
    int ret = infer_forward_batch(sp->m, sp->st, &b, sp->logits, err);
    sp->st->dev = sp->dev0;
    if (ret < 0)
        return ret;
    uint32_t np;
    ret = spec_accept(t, sp->logits, sp->vocab,
                      sp->o.sampler ? sp->o.sampler : infer_session_sampler(sp->s), sp->probs, path,
                      &np, next);
    memcpy(sp->path, path, sizeof path);
    sp->np = ret == 0 ? np : 0;
    uint32_t slots[SPEC_MAX_ROWS];
    for (uint32_t i = 0; ret == 0 && i < np; i++)
        slots[i] = base + path[i];
    if (ret == 0)
        ret = infer_kv_commit(kv, base, slots, np);
    if (ret < 0) {
        infer_kv_truncate(kv, base);
        sl_err_set(err, "draft verification failed (%d)", ret);
        return ret;
    }
    double dt = (double)(sl_now_ns() - t0) / 1e9;
    uint32_t last = path[np - 1];
    infer_session_after_verify(sp->s, sp->logits + (size_t)last * sp->vocab, *next, np, dt,
                               sp->st->npu_jobs - jobs);
    sp->stats.rounds++;
    sp->stats.alone += alone;
    sp->stats.verify_s += dt;
    sp->stats.drafted += t->n - 1;
    sp->stats.shapes[t->n <= 4 ? 0 : t->n <= 8 ? 1 : 2]++;
    for (uint32_t r = 1; r < t->n; r++) {
        if (t->src[r] == SPEC_SRC_REUSE)
            sp->stats.reuse_drafted++;
        if (t->src[r] == SPEC_SRC_CALIB)
            sp->stats.calib_drafted++;
        if (t->src[r] == SPEC_SRC_HISTORY)
            sp->stats.history_drafted++;
    }
    for (uint32_t i = 1; i < np; i++) {
        acc[i - 1] = t->tok[path[i]];
        sp->stats.accepted++;
        if (t->src[path[i]] == SPEC_SRC_REUSE)
            sp->stats.reuse_accepted++;
        if (t->src[path[i]] == SPEC_SRC_CALIB)
            sp->stats.calib_accepted++;
        if (t->src[path[i]] == SPEC_SRC_HISTORY)
            sp->stats.history_accepted++;
    }
    *n_acc = np - 1;
    learn(sp, path, np, dt);
    if (sp->o.on_round)
        sp->o.on_round(sp->o.round_ctx, t0, sl_now_ns(), t->n, np - 1);
    if (!sp->o.no_reuse)
        reuse_after(sp, last, *next);
    return 0;
}

static int calibrate(struct infer_spec *sp, struct sl_err *err)
{
    struct spec_calib_opts co = {
        .breadth = sp->o.calib_breadth, .depth = sp->o.calib_depth, .min_p = sp->o.calib_min_p};
    uint64_t t0 = sl_now_ns();
    int ret = sp->o.prompt_logits
                  ? spec_calibrate_logits(sp->src[SPEC_SRC_CONTEXT].tok, sp->n_prompt,
                                          sp->o.prompt_logits, sp->vocab, &co,
                                          &sp->src[SPEC_SRC_CALIB], &sp->stats.calib_seqs, err)
                  : spec_calibrate(sp->m, sp->src[SPEC_SRC_CONTEXT].tok, sp->n_prompt, &co,
                                   &sp->src[SPEC_SRC_CALIB], &sp->stats.calib_seqs, err);
    sp->stats.calib_s += (double)(sl_now_ns() - t0) / 1e9;
    sp->calibrated = 1;
    return ret;
}

int infer_spec_round(struct infer_spec *sp, int token, uint32_t depth, const int *stop,
                     uint32_t n_stop, int *acc, uint32_t *n_acc, int *next, struct sl_err *err)
{
    struct infer_kv *kv = infer_state_kv(sp->st);
    uint32_t len = infer_kv_len(kv), cap = infer_kv_capacity(kv);
    int ret;
    *n_acc = 0;
    *next = -1;
    if (len >= cap) {
        sl_err_set(err, "the context is full: no room for the token");
        return -EINVAL;
    }
    if (sp->o.calibrate && !sp->calibrated && (ret = calibrate(sp, err)) < 0)
        return ret;
    if ((ret = spec_index_append(&sp->src[SPEC_SRC_CONTEXT], &token, 1)) < 0) {
        sl_err_set(err, "out of memory for the draft index");
        return ret;
    }
    sp->n_fed = sp->src[SPEC_SRC_CONTEXT].n;
    sp->stats.tokens++;
    shadow_feed(sp, token);
    uint64_t t0 = sl_now_ns();
    uint32_t rows = sp->o.max_rows;
    if (rows > sp->st->max_batch)
        rows = sp->st->max_batch;
    if (rows > cap - len)
        rows = cap - len;
    /* the tree is drafted and judged at the cheaper way's price (the
     * typical tree's size: 4 rows); where a tree worth verifying runs is
     * decided after (spec_where_pick: the warm-up's turns, the probes of the
     * dearer way). Judged at the way picked, a dear probe would prune every
     * tree, so no verification would end it and the cheaper way would never
     * run again (the review of zs18 saw the last 82-97% of 1,000-token
     * generations stuck so) */
    uint32_t r4 = rows < 4 ? rows : 4;
    sp->cost = &sp->where.c[spec_where_cheaper(&sp->where, r4)];
    draft(sp, token, len, depth, rows, stop, n_stop);
    /* a tree expected to bring fewer tokens than a verification costs in
     * one-row steps (1 + beta + alpha (n - 1)) is not worth verifying: a
     * one-row step instead (the greedy rows above price each row at alpha
     * alone) */
    if (sp->tree.n > 1 && !spec_cost_worth(sp->cost, sp->tree.sum_p, sp->tree.n)) {
        if (!sp->shadow_on) {
            sp->shadow = sp->tree;
            sp->shadow_at = 0;
            sp->shadow_on = 1;
        }
        spec_tree_reset(&sp->tree, token, len);
        sp->stats.skipped++;
        spec_cost_skipped(sp->cost);
    }
    sp->stats.draft_s += (double)(sl_now_ns() - t0) / 1e9;
    if (sp->tree.n == 1) {
        t0 = sl_now_ns();
        if ((ret = infer_session_step(sp->s, token, err)) < 0)
            return ret;
        double dt = (double)(sl_now_ns() - t0) / 1e9;
        sp->stats.plain_steps++;
        sp->stats.plain_s += dt;
        spec_where_step(&sp->where, dt);
        return 0;
    }
    sp->shadow_on = 0; /* the verification tests its own rows (learn) */
    sp->on = spec_where_pick(&sp->where, r4);
    if ((ret = verify(sp, acc, n_acc, next, err)) < 0)
        return ret;
    /* the accepted drafts are context now */
    if ((ret = spec_index_append(&sp->src[SPEC_SRC_CONTEXT], acc, *n_acc)) < 0) {
        sl_err_set(err, "out of memory for the draft index");
        return ret;
    }
    sp->stats.tokens += *n_acc;
    sp->n_fed = sp->src[SPEC_SRC_CONTEXT].n;
    return 0;
}

/* The round's accepted drafts were taken up to acc[i], which ends the
 * generation there: plain decoding would not have run it; drop it and what
 * follows; the logits are its parent's, and it is the token kept for a
 * next call, as plain decoding leaves it. */
static void cut_after(struct infer_spec *sp, uint32_t len, uint32_t i, uint32_t n_acc, int tok)
{
    sp->stats.tokens -= n_acc - i;
    sp->n_fed -= n_acc - i;
    spec_index_truncate(&sp->src[SPEC_SRC_CONTEXT], sp->n_fed);
    infer_kv_truncate(infer_state_kv(sp->st), len + 1 + i);
    infer_session_after_verify(sp->s, sp->logits + (size_t)sp->path[i] * sp->vocab, tok, 0, 0, 0);
}

int infer_spec_generate(struct infer_spec *sp, uint32_t max_tokens, const int *stop,
                        uint32_t n_stop, infer_token_fn on_token, void *ctx, uint32_t *n_out,
                        struct sl_err *err)
{
    struct infer_kv *kv = infer_state_kv(sp->st);
    uint32_t taken = 0;
    int ret = 0, tok, acc[SPEC_MAX_ROWS];
    if (sp->o.sampler) {
        sl_err_set(err, "infer_spec_generate samples with the session's sampler");
        return -EINVAL;
    }
    while (taken < max_tokens) {
        if ((ret = infer_session_take_next(sp->s, &tok)) < 0) {
            sl_err_set(err, "nothing to sample from: run a prompt first");
            break;
        }
        taken++;
        if (is_stop(stop, n_stop, tok) || (on_token && on_token(ctx, tok)))
            break;
        uint32_t len = infer_kv_len(kv), n_acc;
        if (len >= infer_kv_capacity(kv))
            break; /* the context is full: this token cannot be fed back */
        int next;
        if ((ret = infer_spec_round(sp, tok, max_tokens - taken, stop, n_stop, acc, &n_acc, &next,
                                    err)) < 0)
            break;
        int stopped = 0;
        for (uint32_t i = 0; i < n_acc && !stopped; i++) {
            taken++;
            if ((on_token && on_token(ctx, acc[i]))) {
                cut_after(sp, len, i, n_acc, acc[i]);
                stopped = 1;
            }
        }
        if (stopped)
            break;
    }
    if (n_out)
        *n_out = taken;
    return ret;
}

void infer_spec_stats(const struct infer_spec *sp, struct infer_spec_stats *st)
{
    *st = sp->stats;
}

const int *infer_spec_generated(const struct infer_spec *sp, uint32_t *n)
{
    *n = sp->n_fed > sp->n_prompt ? sp->n_fed - sp->n_prompt : 0;
    return sp->src[SPEC_SRC_CONTEXT].tok + sp->n_prompt;
}

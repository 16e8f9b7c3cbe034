/* spec_calib.c: in-context distribution calibration (sd.npu 3.3). The
 * prefill's logits of every context position say what the model expects
 * after each context token; where that differs from the context's own next
 * token, the model's likely wording is added as a draft source: sample the
 * likely successors (top `breadth` with p >= min_p), then search where the
 * successor occurs in the context and continue from that occurrence's
 * logits, depth first, to `depth` tokens.
 *
 * The cold start computes the logits of the last position only: either the
 * context runs again here through a scratch state (spec_calibrate: chunks
 * of CALIB_ROWS rows, every row's logits; the caller schedules this after
 * the first token, and its time counts in decoding), or the prefill kept
 * every position's logits (infer_session_prefill_logits: the classifier over
 * every row, counted in the prefill) and spec_calibrate_logits reads them. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "spec_internal.h"

#define CALIB_ROWS 64
#define CALIB_MAX_BREADTH 4
#define CALIB_MAX_DEPTH 8

struct calib {
    const int *ctx;
    uint32_t n, breadth, depth;
    int *succ; /* [n][breadth] likely successors of position i (-1: none) */
    float *succ_p;
    struct spec_index *out;
    uint32_t seqs;
    uint32_t pre; /* tokens of the current sequence up to its context token */
};

/* Top `b` tokens of softmax(logits) with p >= min_p, into tok/p (-1 pads):
 * the top b by logit (the earlier token first on a tie), then their
 * probabilities from one pass of expf for the normalizer (a row of the
 * prefill's logits costs a vocabulary's expf, not two exps in double). */
static void top_succ(const float *lg, uint32_t vocab, uint32_t b, float min_p, int *tok, float *p)
{
    float top[CALIB_MAX_BREADTH];
    for (uint32_t k = 0; k < b; k++) {
        tok[k] = -1;
        p[k] = 0;
        top[k] = -INFINITY;
    }
    float mx = lg[0];
    for (uint32_t i = 0; i < vocab; i++) {
        float v = lg[i];
        mx = v > mx ? v : mx;
        if (!(v > top[b - 1]))
            continue;
        uint32_t k = b - 1;
        while (k > 0 && top[k - 1] < v) {
            top[k] = top[k - 1];
            tok[k] = tok[k - 1];
            k--;
        }
        top[k] = v;
        tok[k] = (int)i;
    }
    double sum = 0; /* in double: over a large vocabulary a float sum drifts */
    for (uint32_t i = 0; i < vocab; i++)
        sum += expf(lg[i] - mx);
    for (uint32_t k = 0; k < b; k++) {
        float pk = tok[k] >= 0 ? (float)(expf(top[k] - mx) / sum) : 0;
        if (pk < min_p) { /* and every later one: they are no likelier */
            for (; k < b; k++)
                tok[k] = -1, p[k] = 0;
            break;
        }
        p[k] = pk;
    }
}

/* Where token t occurs in the context: the first occurrence after `from`,
 * else the latest before it; -1 if nowhere. */
static int64_t occurrence(const struct calib *c, int t, uint32_t from)
{
    for (uint32_t j = from + 1; j + 1 < c->n; j++)
        if (c->ctx[j] == t)
            return j;
    for (uint32_t j = from + 1; j-- > 0;)
        if (c->ctx[j] == t && j + 1 < c->n)
            return j;
    return -1;
}

/* Depth-first: seq[0..len) so far ends with a token whose logits are at
 * context position `at`. Emits every leaf path. */
static int dfs(struct calib *c, int *seq, uint32_t len, uint32_t at)
{
    int grown = 0;
    uint32_t d = len - c->pre + 1; /* tokens from the context token on */
    if (d < c->depth) {
        for (uint32_t k = 0; k < c->breadth; k++) {
            int s = c->succ[(size_t)at * c->breadth + k];
            if (s < 0)
                break;
            seq[len] = s;
            int64_t j = occurrence(c, s, at);
            int ret;
            if (j < 0 || d + 1 >= c->depth) {
                seq[len + 1] = -1;
                ret = spec_index_append(c->out, seq, len + 2);
                c->seqs++;
            } else {
                ret = dfs(c, seq, len + 1, (uint32_t)j);
            }
            if (ret < 0)
                return ret;
            grown = 1;
        }
    }
    if (!grown && d >= 2) {
        seq[len] = -1;
        c->seqs++;
        return spec_index_append(c->out, seq, len + 1);
    }
    return 0;
}

/* The context positions' successors are in c->succ: the walks. */
static int calib_walk(struct calib *c, struct sl_err *err)
{
    int seq[CALIB_MAX_DEPTH + 3], ret = 0;
    const int *ctx = c->ctx;
    for (uint32_t i = 0; ret == 0 && i + 1 < c->n; i++) {
        /* only where the model's expectation differs from the context */
        int top = c->succ[(size_t)i * c->breadth];
        if (top < 0 || top == ctx[i + 1] || ctx[i] < 0)
            continue;
        /* the token before it too, so that 2-gram lookups find the sequence */
        c->pre = i > 0 ? 2 : 1;
        if (i > 0)
            seq[0] = ctx[i - 1];
        seq[c->pre - 1] = ctx[i];
        ret = dfs(c, seq, c->pre, i);
        if (ret < 0)
            sl_err_set(err, "out of memory for calibrated drafts");
    }
    return ret;
}

static void calib_init(struct calib *c, const int *ctx, uint32_t n, const struct spec_calib_opts *o,
                       struct spec_index *out)
{
    *c = (struct calib){.ctx = ctx,
                        .n = n,
                        .out = out,
                        .breadth = o->breadth < 1                   ? 1
                                   : o->breadth > CALIB_MAX_BREADTH ? CALIB_MAX_BREADTH
                                                                    : o->breadth,
                        .depth = o->depth < 2                 ? 2
                                 : o->depth > CALIB_MAX_DEPTH ? CALIB_MAX_DEPTH
                                                              : o->depth};
    c->succ = malloc(sizeof(int) * n * c->breadth);
    c->succ_p = malloc(sizeof(float) * n * c->breadth);
}

int spec_calibrate(struct infer_model *m, const int *ctx, uint32_t n,
                   const struct spec_calib_opts *o, struct spec_index *out, uint32_t *n_seqs,
                   struct sl_err *err)
{
    *n_seqs = 0;
    if (n < 2)
        return 0;
    const struct format_config *cfg = infer_model_config(m);
    uint32_t V = cfg->vocab_size;
    struct calib c;
    calib_init(&c, ctx, n, o, out);
    struct infer_state *st = NULL;
    float *logits = malloc(sizeof(float) * V * CALIB_ROWS);
    uint32_t *rows = malloc(sizeof(uint32_t) * CALIB_ROWS);
    int ret = logits && rows && c.succ && c.succ_p ? 0 : -ENOMEM;
    if (ret < 0)
        sl_err_set(err, "out of memory for calibration");
    if (ret == 0)
        ret = infer_state_create(m, CALIB_ROWS, &st, err);
    for (uint32_t i = 0; i < CALIB_ROWS; i++)
        if (rows)
            rows[i] = i;
    for (uint32_t done = 0; ret == 0 && done < n; done += CALIB_ROWS) {
        uint32_t nb = n - done < CALIB_ROWS ? n - done : CALIB_ROWS;
        struct infer_batch b = {.n = nb, .tokens = ctx + done, .logits_rows = rows, .n_logits = nb};
        ret = infer_forward_batch(m, st, &b, logits, err);
        for (uint32_t r = 0; ret == 0 && r < nb; r++)
            top_succ(logits + (size_t)r * V, V, c.breadth, o->min_p,
                     c.succ + (size_t)(done + r) * c.breadth,
                     c.succ_p + (size_t)(done + r) * c.breadth);
    }
    if (ret == 0)
        ret = calib_walk(&c, err);
    *n_seqs = c.seqs;
    infer_state_destroy(st);
    free(logits);
    free(rows);
    free(c.succ);
    free(c.succ_p);
    return ret;
}

int spec_calibrate_logits(const int *ctx, uint32_t n, const float *logits, uint32_t vocab,
                          const struct spec_calib_opts *o, struct spec_index *out,
                          uint32_t *n_seqs, struct sl_err *err)
{
    *n_seqs = 0;
    if (n < 2)
        return 0;
    struct calib c;
    calib_init(&c, ctx, n, o, out);
    int ret = c.succ && c.succ_p ? 0 : -ENOMEM;
    if (ret < 0)
        sl_err_set(err, "out of memory for calibration");
    for (uint32_t r = 0; ret == 0 && r < n; r++)
        top_succ(logits + (size_t)r * vocab, vocab, c.breadth, o->min_p,
                 c.succ + (size_t)r * c.breadth, c.succ_p + (size_t)r * c.breadth);
    if (ret == 0)
        ret = calib_walk(&c, err);
    *n_seqs = c.seqs;
    free(c.succ);
    free(c.succ_p);
    return ret;
}

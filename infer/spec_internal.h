/* spec_internal.h: the pieces of retrieval-based speculative decoding
 * (sd.npu 3.2-3.4) behind infer_spec_* (infer.h): an n-gram index over
 * token sources, the draft tree, acceptance, calibration and draft reuse.
 * Token value -1 in a source separates segments (no n-gram crosses it). */
#ifndef SLUICE_SPEC_INTERNAL_H
#define SLUICE_SPEC_INTERNAL_H

#include <stdint.h>

#include "infer.h"

/* ---- n-gram index (spec_index.c) --------------------------------------------------- */

#define SPEC_MAX_ORDER 4 /* longest n-gram indexed */

/* An append-only token array with, for every order g in 1..SPEC_MAX_ORDER,
 * hash chains of the positions where each g-gram ends (newest first). */
struct spec_index {
    int *tok;
    uint32_t n, cap;
    uint32_t *next[SPEC_MAX_ORDER]; /* [cap]: previous end of the same hash, +1 (0: none) */
    uint32_t *head[SPEC_MAX_ORDER]; /* [nbuckets] */
    uint32_t mask;                  /* nbuckets - 1 */
};

int spec_index_init(struct spec_index *ix, uint32_t cap_hint);
void spec_index_free(struct spec_index *ix);
/* Appends tokens (-1 separates segments); -ENOMEM. */
int spec_index_append(struct spec_index *ix, const int *t, uint32_t n);
/* Drops the tokens from position n on (n <= ix->n), as if they had never
 * been appended. */
void spec_index_truncate(struct spec_index *ix, uint32_t n);

/* Calls fn(ctx, end) for each position `end` where the last g tokens of
 * q[0..nq) occur as tok[end-g+1..end] (newest first) until fn returns
 * nonzero; at most `limit` calls. */
typedef int (*spec_match_fn)(void *ctx, const struct spec_index *ix, uint32_t end);
void spec_index_match(const struct spec_index *ix, const int *q, uint32_t nq, uint32_t g,
                      uint32_t limit, spec_match_fn fn, void *ctx);

/* ---- choosing among matches (spec_select.c) --------------------------------------- */

#define SPEC_MAX_EXTENT 32 /* how far back a match's agreement is measured */
#define SPEC_MAX_GATHER 64 /* matches gathered per order and source */

struct spec_cand {
    uint32_t end; /* where the match ends in the index */
    uint32_t ext; /* its extent: how many tokens back it agrees with the context (>= g) */
};

/* How many tokens back, up to SPEC_MAX_EXTENT, tok[..end] agrees with
 * q[..nq) (stopping at a separator). */
uint32_t spec_match_extent(const struct spec_index *ix, uint32_t end, const int *q, uint32_t nq);
/* The best `take` of up to `gather` matches of q's last g tokens (newest
 * first) into out[]: those with a token after them and not in used[],
 * longest extent first, newest first within one. Returns how many. */
uint32_t spec_select(const struct spec_index *ix, const int *q, uint32_t nq, uint32_t g,
                     uint32_t gather, uint32_t take, const uint32_t *used, uint32_t n_used,
                     struct spec_cand *out);

/* ---- draft tree (spec_tree.c) ----------------------------------------------------- */

#define SPEC_MAX_ROWS INFER_SPEC_MAX_ROWS /* the largest verification shape */

/* Row 0 is the token to run next (the root, not a draft); rows 1.. are
 * drafts, each after parent[i] < i. */
struct spec_tree {
    uint32_t n;
    int tok[SPEC_MAX_ROWS];
    int32_t parent[SPEC_MAX_ROWS];
    uint32_t pos[SPEC_MAX_ROWS];
    uint8_t depth[SPEC_MAX_ROWS];
    uint8_t src[SPEC_MAX_ROWS];   /* enum spec_src of the candidate that added the row */
    uint8_t order[SPEC_MAX_ROWS]; /* the n-gram order of its match (0: not a match) */
    uint8_t later[SPEC_MAX_ROWS]; /* 1: not its candidate's first token */
    float p[SPEC_MAX_ROWS];       /* estimated probability that the row is accepted */
    float sum_p;                  /* over rows 1.. */
};

enum spec_src {
    SPEC_SRC_CONTEXT = 0,
    SPEC_SRC_HISTORY,
    SPEC_SRC_CALIB,
    SPEC_SRC_REUSE,
    SPEC_SRC_COUNT
};

/* Adds a candidate continuation of the root: tokens c[0..n) (c[0] a child
 * of the root), merged with the rows already there, while rows remain
 * (max_rows). Returns the number of new rows. */
uint32_t spec_tree_add(struct spec_tree *t, const int *c, uint32_t n, uint32_t max_rows,
                       enum spec_src src);
/* The same with a cost model: a new row's acceptance probability is its
 * parent's times a_first (its candidate's first token) or a_next (a later
 * one: acceptance given the previous token's) times what its
 * parent's earlier children leave; the row is added only while it raises
 * the expected tokens per unit of forward time, (1 + sum p) / (1 + alpha
 * (rows - 1)), alpha being the cost of one more row relative to a one-row
 * step: p > alpha x that rate. */
uint32_t spec_tree_add_p(struct spec_tree *t, const int *c, uint32_t n, uint32_t max_rows,
                         enum spec_src src, uint32_t order, float a_first, float a_next,
                         float alpha);
/* Row 0 = token at position pos0, nothing else. */
void spec_tree_reset(struct spec_tree *t, int root, uint32_t pos0);

/* ---- acceptance (spec_accept.c) --------------------------------------------------- */

/* Walks the tree from the root with its rows' logits [n][vocab]. Greedy
 * (temperature 0): a child is taken when its token is the argmax. Sampling:
 * at every row, the children are tried in row order, each accepted with
 * probability p(token) under the sampler's distribution (a draft is a point
 * mass, so min(1, p/q) = p), p losing that token (renormalized) after a
 * rejection; when none is accepted the next token is drawn from what is left
 * (the recursive rejection rule: the output distribution is p's). path[0..*np)
 * receives the accepted rows (path[0] = 0), *next the token after them.
 * probs: [vocab] scratch. Returns 0 or -errno. */
int spec_accept(const struct spec_tree *t, const float *logits, uint32_t vocab,
                struct infer_sampler *smp, float *probs, uint32_t *path, uint32_t *np, int *next);

/* ---- draft reuse (spec_reuse.c, paper 3.4 eq. 3) --------------------------------- */

#define SPEC_REUSE_MAX 16 /* tokens of a kept segment */

struct spec_reuse {
    int seg[SPEC_REUSE_MAX];
    uint32_t n;       /* 0: none kept */
    uint32_t rounds;  /* rounds it has been offered */
    uint32_t offered; /* draft tokens it contributed so far */
};

/* After a verification: the draft path x[0..nx) (the deepest path through
 * the first rejected row) against the model's tokens y[0..nx) at its rows
 * (y[i] = the model's choice after x[0..i)), rejected at e (x[e] != y[e]):
 * keeps the longest run x[a..b] with x[i] == y[i] for every i in [a, b],
 * a > e (eq. 3), replacing a previous segment. */
void spec_reuse_update(struct spec_reuse *r, const int *x, const int *y, uint32_t nx, uint32_t e);
/* The candidate to offer after `last` (the root token): the segment after
 * the last occurrence of `last` in it, else the whole segment. Drops the
 * segment once it has been offered for a round and its offered tokens pass
 * `threshold`. Returns its length (0: none). */
uint32_t spec_reuse_offer(struct spec_reuse *r, int last, uint32_t threshold, const int **c);

/* ---- calibration (spec_calib.c, paper 3.3) --------------------------------------- */

/* Runs the context through a scratch state with every position's logits,
 * and appends to out the calibrated sequences: for every context token
 * whose likely successors (top `breadth`, p >= min_p) differ from the
 * context's own next token, a depth-first walk: the token, a successor,
 * then the successors of that token's latest occurrence in the context
 * (before the position searched from, else anywhere), to `depth` tokens,
 * each sequence followed by -1. Returns 0 or -errno with err. */
struct spec_calib_opts {
    uint32_t breadth, depth;
    float min_p;
};
int spec_calibrate(struct infer_model *m, const int *ctx, uint32_t n,
                   const struct spec_calib_opts *o, struct spec_index *out, uint32_t *n_seqs,
                   struct sl_err *err);
/* The same from the prefill's logits of every context position,
 * logits[n][vocab] (no forward pass). */
int spec_calibrate_logits(const int *ctx, uint32_t n, const float *logits, uint32_t vocab,
                          const struct spec_calib_opts *o, struct spec_index *out,
                          uint32_t *n_seqs, struct sl_err *err);

/* ---- the verification's price (spec_cost.c) ------------------------------------- */

/* A verification of n rows costs 1 + beta + alpha (n - 1) one-row steps:
 * fixed (row_cost given: alpha = it, beta = verify_cost) or fitted to measured times,
 * each counted, after the first few, for at most 1.25x what the model
 * expects (a busy machine's bursts only add time). */
struct spec_cost {
    int fixed;
    float alpha, beta, t1; /* t1: a one-row step's time (s), 0 before the first */
    uint32_t n1, nv;       /* one-row steps and verifications seen (up to a few) */
    double fit_w, fit_x, fit_y, fit_xx, fit_xy;
};

void spec_cost_init(struct spec_cost *c, float row_cost);
/* A one-row step took dt seconds. */
void spec_cost_step(struct spec_cost *c, double dt);
/* A verification of `rows` rows (the root included) took dt seconds. */
void spec_cost_verify(struct spec_cost *c, uint32_t rows, double dt);
/* 1 when a tree of `rows` rows expected to bring `gain` draft tokens is
 * worth its verification against a one-row step. */
int spec_cost_worth(const struct spec_cost *c, float gain, uint32_t rows);
/* A drafted tree was judged not worth it: a fixed cost fitted above the
 * prior moves back toward it. */
void spec_cost_skipped(struct spec_cost *c);

/* Where a verification runs (spec_cost.c): c[0] prices it split with the
 * session's NPU device thread, c[1] on the calling thread alone; both see
 * every one-row step. */
struct spec_where {
    struct spec_cost c[2];
    uint32_t n[2];    /* verifications timed each way */
    uint32_t picks;   /* verifications in all */
    int have_device;  /* 0: the session has no device thread (always c[0]) */
};

void spec_where_init(struct spec_where *w, float row_cost, int have_device);
/* The way to run a verification of `rows` rows: 0 (split) or 1 (alone):
 * each way's first few in turn, then the cheaper by its price, the other
 * every few verifications (its price follows the host). With a fixed price
 * or no device: 0. */
uint32_t spec_where_pick(struct spec_where *w, uint32_t rows);
/* The way whose price at `rows` rows is lower (0 without a device or at a
 * fixed price): the price drafts are judged at. */
uint32_t spec_where_cheaper(const struct spec_where *w, uint32_t rows);
/* A one-row step took dt seconds (both prices). */
void spec_where_step(struct spec_where *w, double dt);
/* A verification of `rows` rows, run the way `on`, took dt seconds. */
void spec_where_verify(struct spec_where *w, uint32_t on, uint32_t rows, double dt);

#endif /* SLUICE_SPEC_INTERNAL_H */

/* attn_sparse.h: the pieces of sparse attention (shadowAttn 3.2-3.4) that
 * the files of the infer module share and the tests check one by one:
 * top-k selection, the keys a row keeps, eq. 3's per-head ratios, the Q
 * scale buckets, the scalar specification of the NPU's Q.K estimate, and
 * the head-group plan (Algorithm 1). infer.h has the public interface. */
#ifndef SLUICE_ATTN_SPARSE_H
#define SLUICE_ATTN_SPARSE_H

#include <stddef.h>
#include <stdint.h>

#include "infer.h"

/* The k largest of score[0..n) (ties: the lower index wins), their indices
 * written ascending to idx[0..k). k <= n. work: 2 * n uint32_t. Runs in
 * O(n): a radix select on the floats' order-preserving keys. */
void attn_topk(const float *score, uint32_t n, uint32_t k, uint32_t *idx, uint32_t *work);

/* How many of `visible` keys (slots 0..visible-1) a row of a head with keep
 * ratio r attends: ceil(r * visible), at least 1, at most visible. */
uint32_t attn_keep_count(double r, uint32_t visible);

/* The slots one row keeps, ascending, into sel (k of them, k from
 * attn_keep_count): the first min(sinks, k) slots, the last min(window,
 * k - sinks) visible slots, and the top of the rest by est[0..visible)
 * (the sinks and the window count inside k, so k is the real keep). work:
 * 2 * visible uint32_t. Returns k. */
uint32_t attn_select_row(const float *est, uint32_t visible, uint32_t k, uint32_t sinks,
                         uint32_t window, uint32_t *sel, uint32_t *work);

/* Eq. 3 of the paper with the project's guards: weight w_i = max(headImp_i,
 * eps) * max(layerImp_j, eps), eps = 1e-3 of the largest positive value of
 * each (head-removal losses may be negative, and the paper's clamp of
 * points over 1e-3 would flatten every head of a small model). Every head
 * first gets floor_share * keep (0: the paper's eq. 3 alone), and the rest
 * of the budget keep * N goes by the weights: ratio_i = min(1, floor_share *
 * keep + c * w_i), c such that the ratios average keep (a ratio over 1 is
 * capped and its excess handed to the others in proportion to their
 * weights). Without importances (head_imp NULL): every head keep. ratio:
 * [n_layers * n_heads]. */
void attn_ratios(const float *head_imp, const float *layer_imp, uint32_t n_layers,
                 uint32_t n_heads, double keep, double floor_share, float *ratio);

/* Bucket b's Q scale: mean * step^(b - (buckets - 1) / 2) (a multiplicative
 * grid around the profiled mean), and the bucket whose scale is nearest to
 * s in squared error. */
float attn_bucket_scale(float mean, float step, uint32_t buckets, uint32_t b);
uint32_t attn_bucket_pick(float mean, float step, uint32_t buckets, float s);

/* The NPU's Q.K estimate, scalar specification: est[i][t] = (qs * ks[t]) *
 * (float)sum_d q8[i][d] * k8[t][d] for rows i < m and keys t < T (q8 rows of
 * hd codes, k8 rows of stride ldk), est row stride ld. The device computes
 * exactly this (npu.h: y = (act_scale * scale[r]) * acc). */
void attn_estimate_ref(const int8_t *q8, uint32_t m, uint32_t hd, float qs, const int8_t *k8,
                       size_t ldk, const float *ks, uint32_t T, float *est, size_t ld);

/* The int8 key of one slot and head: q = rint(k / s), s = max|k| / 127 (1
 * when all zero), the KV cache mirror's rule (infer_kv.c). */
float attn_quantize_key(const float *k, uint32_t hd, int8_t *q);

/* Algorithm 1 (the pipeline plan): launches (fused heads) in NPU order and
 * the CPU order of their heads, greedily minimizing the finish time of the
 * three-stage pipeline estimate -> top-k -> softmax.V. n launches with
 * their NPU times t_npu[i] and per-head CPU times t_topk[h], t_qkv[h] of
 * their heads head[i][0..cnt[i]) (head ids < 64 within a call). Writes the
 * launch order to order[0..n) and each launch's head order in place; returns
 * the planned finish time. */
#define ATTN_PLAN_MAX 64
double attn_plan(uint32_t n, const double *t_npu, const uint32_t *cnt,
                 uint32_t head[][ATTN_PLAN_MAX], const double *t_topk, const double *t_qkv,
                 uint32_t *order);



/* Tests: the estimate sparse attention computes for head h's rows q [n][Q]
 * at slots base.. of a layer (the cache holds slots [0, base + n)), on its
 * NPU path (its bucket's Q scale, the int8 keys it prepares, the graph of
 * the key-length bucket): est [n][*L] (room for n * (base + n + 255) floats;
 * *L the bucket), *qscale the Q scale used. */
struct infer_sparse;
int attn_sparse_estimate(struct infer_sparse *sp, const struct infer_kv *kv, uint32_t layer,
                         const float *q, uint32_t n, uint32_t base, uint32_t h, float *est,
                         uint32_t *L, float *qscale, struct sl_err *err);
#endif

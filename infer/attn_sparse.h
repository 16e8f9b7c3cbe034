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
 * written ascending to idx[0..k) (idx: room for n, used as scratch). k <=
 * n. work: 2 * n uint32_t. Runs in O(n): a threshold found by counting
 * passes, then a selection among the scores above it (a radix select on
 * the floats' order-preserving keys where scores are not finite). */
void attn_topk(const float *score, uint32_t n, uint32_t k, uint32_t *idx, uint32_t *work);

/* attn_topk with a threshold guess *hint (NULL or not finite: none, and a
 * threshold sampled from the row is the guess): when at least k scores are
 * >= the guess, the top-k is found among those alone (one
 * vector compare pass over n storing the candidates, then counting passes
 * over the candidates' scores for the k-th largest, and one compaction);
 * else the same from a threshold sampled from the row when that is lower;
 * else through a threshold refined by counting passes from the guess, else
 * the general path. The same result in every case (but for signed zeros:
 * below about 64 keys -0 and +0 tie, the general path puts -0 below +0). On
 * return hint[0] holds a guess for a similar row (the next query row of a
 * head: about 1.25 k + 16 of its scores are expected above it), or NaN.
 * hint: ATTN_HINT floats, best all NaN before a head's first row (any value
 * is safe: a bad guess costs passes, not results): hint[1] is the
 * score width per candidate near the k-th largest (the row's (tau - th) /
 * (m - k)), from which the counting passes take their first guess (at a 4K
 * prefill they were 5.8 a row from the candidates' range). */
#define ATTN_HINT 2
void attn_topk_hint(const float *score, uint32_t n, uint32_t k, uint32_t *idx, uint32_t *work,
                    float *hint);

/* The indices i < n with s[i] >= th, ascending, plus base (the caller's
 * offset of s: its slot numbers at no extra pass), into idx (room for n),
 * and their scores in the same order into val (room for n; NULL: not
 * written); returns their count, *nan = whether any s[i] is NaN. The AVX2
 * and AVX-512 kernels (attn_topk_avx512.c) and the scalar twin give the same
 * result; so for the three below. */
uint32_t attn_above(const float *s, uint32_t n, float th, uint32_t base, uint32_t *idx,
                    float *val, int *nan);
uint32_t attn_above_scalar(const float *s, uint32_t n, float th, uint32_t base, uint32_t *idx,
                           float *val, int *nan);
uint32_t attn_above_avx2(const float *s, uint32_t n, float th, uint32_t base, uint32_t *idx,
                         float *val, int *nan);
uint32_t attn_above_avx512(const float *s, uint32_t n, float th, uint32_t base, uint32_t *idx,
                           float *val, int *nan);
/* The entries idx[j] (j < m) whose val[j] >= th, in order, into out (room
 * for m; out may be idx); returns their count. The AVX2 kernel and its
 * scalar twin give the same result. */
uint32_t attn_keep_above(const uint32_t *idx, const float *val, uint32_t m, float th,
                         uint32_t *out);
uint32_t attn_keep_above_scalar(const uint32_t *idx, const float *val, uint32_t m, float th,
                                uint32_t *out);
uint32_t attn_keep_above_avx2(const uint32_t *idx, const float *val, uint32_t m, float th,
                              uint32_t *out);
uint32_t attn_keep_above_avx512(const uint32_t *idx, const float *val, uint32_t m, float th,
                                uint32_t *out);
/* How many s[i] (i < n) are >= th; and the smallest and largest of s (NaN
 * ignored; +INFINITY and -INFINITY when n is 0), *nan = whether any is NaN.
 * AVX2 kernels and scalar twins, the same results. */
uint32_t attn_count(const float *s, uint32_t n, float th);
uint32_t attn_count_scalar(const float *s, uint32_t n, float th);
uint32_t attn_count_avx2(const float *s, uint32_t n, float th);
uint32_t attn_count_avx512(const float *s, uint32_t n, float th);
void attn_range(const float *s, uint32_t n, float *lo, float *hi, int *nan);
void attn_range_scalar(const float *s, uint32_t n, float *lo, float *hi, int *nan);
void attn_range_avx2(const float *s, uint32_t n, float *lo, float *hi, int *nan);
void attn_range_avx512(const float *s, uint32_t n, float *lo, float *hi, int *nan);

/* One query row qh of one head over the slots list[0..len) (ascending, len
 * >= 1), their keys and values read in place from kh and vh (rows of stride
 * kv_dim), into out[hs]; a: len floats, gather: len * hs floats (used only
 * by the fallback). The bits are those of infer_attn_list (so keep 1 equals
 * dense attention): with the AVX2 matmul kernel and hs % 8 == 0,
 * attn_sel_row_avx2 without gathering; else infer_attn_list itself.
 * attn_sel_row_ref is the AVX2 kernel's scalar twin (fmaf in its lanes and
 * order: the same bits). */
void attn_sel_row(float *out, const float *qh, const float *kh, const float *vh, size_t kv_dim,
                  uint32_t hs, const uint32_t *list, uint32_t len, float *a, float *gather);
void attn_sel_row_ref(float *out, const float *qh, const float *kh, const float *vh,
                      size_t kv_dim, uint32_t hs, const uint32_t *list, uint32_t len, float *a);
void attn_sel_row_avx2(float *out, const float *qh, const float *kh, const float *vh,
                       size_t kv_dim, uint32_t hs, const uint32_t *list, uint32_t len, float *a);
/* The same with the AVX-512 matmul kernel's bits (hs % 16 == 0; attn_sel_avx512.c)
 * and its scalar twin (16-lane fmaf chains folded as _mm512_reduce_add_ps). */
void attn_sel_row_avx512(float *out, const float *qh, const float *kh, const float *vh,
                         size_t kv_dim, uint32_t hs, const uint32_t *list, uint32_t len, float *a);
void attn_sel_row_ref16(float *out, const float *qh, const float *kh, const float *vh,
                        size_t kv_dim, uint32_t hs, const uint32_t *list, uint32_t len, float *a);

/* Several (query row, head) pairs of one kv head at once: pair r's query
 * q[hs], its slots list[0..len) (ascending, len >= 1, all < T), a: len
 * floats of scratch, out[hs]. The same bits as attn_sel_row on each pair;
 * the AVX2 kernel walks the keys in blocks of kb slots for all pairs, so a
 * block's keys and values are read from memory once for the R pairs (the
 * keys gathered once per head group: with 16 pairs or more, each block is
 * copied into consecutive rows first, unless they are already: kv_dim ==
 * hs). cur: R uint32_t; gather: at least
 * max(kb, max len) * hs floats (the block copy, and the fallback's). */
struct attn_sel_pair {
    const float *q;
    const uint32_t *list;
    uint32_t len;
    float *a, *out;
};
void attn_sel_rows(uint32_t R, const struct attn_sel_pair *p, const float *kh, const float *vh,
                   size_t kv_dim, uint32_t hs, uint32_t kb, uint32_t T, uint32_t *cur,
                   float *gather);
/* pack: kb * hs floats (a block's keys, then its values, copied into
 * consecutive rows once for all pairs), or NULL (read in place). */
void attn_sel_rows_avx2(uint32_t R, const struct attn_sel_pair *p, const float *kh,
                        const float *vh, size_t kv_dim, uint32_t hs, uint32_t kb, uint32_t T,
                        uint32_t *cur, float *pack);
void attn_sel_rows_avx512(uint32_t R, const struct attn_sel_pair *p, const float *kh,
                          const float *vh, size_t kv_dim, uint32_t hs, uint32_t kb, uint32_t T,
                          uint32_t *cur, float *pack);

/* The shared selection (infer_sparse_opts.select_group): G heads' estimates
 * (rows est + j * ld, j < G) folded into one score per slot t < visible,
 * each head's estimate less its softmax's log-denominator (in estimate
 * units): c[t] = max_j (est_j[t] - off_j), off_j = m_j + sq * log S_j, m_j =
 * max_t est_j[t], S_j = sum_t exp((est_j[t] - m_j) / sq) (sq: the softmax's
 * sqrt(head_dim)) by attn_group_exp2_sum_scalar(est_j, visible, k, m_j * k),
 * k = ATTN_EXP2_LOG2E / sq; off_j = m_j where that is not finite. So c[t] /
 * sq is about the largest of the heads' log-probabilities of slot t: a head
 * whose estimate is flat (many keys near its maximum, each of little mass)
 * no longer fills the list with them. */
void attn_group_combine(const float *est, size_t ld, uint32_t G, uint32_t visible, float sq,
                        float *c);
/* Its scalar definition and the AVX-512 and AVX2 (with FMA) kernels (the
 * same bits, NaN and signed zeros included). */
void attn_group_combine_scalar(const float *est, size_t ld, uint32_t G, uint32_t visible,
                               float sq, float *c);
void attn_group_combine_avx512(const float *est, size_t ld, uint32_t G, uint32_t visible,
                               float sq, float *c);
void attn_group_combine_avx2(const float *est, size_t ld, uint32_t G, uint32_t visible, float sq,
                             float *c);
/* The sum of 2^x_t over t < n, x_t = fmaf(e[t], k, -mk) clamped to [-126, 0]
 * (NaN: -126), each term 2^floor(x) * p(x - floor(x)), p a cubic for 2^f on
 * [0, 1) (relative error 1.5e-4: the sum only sets a head's offset), into
 * lane t mod 16, the lanes folded pairwise (lane i + lane i + 8, then + 4,
 * + 2, + 1). The AVX-512 kernel (attn_group_avx512.c) gives the same bits. */
float attn_group_exp2_sum_scalar(const float *e, uint32_t n, float k, float mk);
#define ATTN_EXP2_LOG2E 1.44269504088896341f
#define ATTN_EXP2_C0 1.0f
#define ATTN_EXP2_C1 0.6960656421638072f
#define ATTN_EXP2_C2 0.224494337302845f
#define ATTN_EXP2_C3 0.07944023841053369f

/* G query heads (rows q + j * ldq, outputs out + j * ldo, j < G) of one kv
 * head over one shared list of slots (ascending, len >= 1; keys and values
 * read from kh, vh, rows kv_dim apart): each head's output has the bits of
 * infer_attn_list for that head and list; the keys and values are gathered
 * once for the G heads. s: G * len floats, gather: len * hs floats. */
void attn_group_rows(float *out, size_t ldo, const float *q, size_t ldq, uint32_t G, uint32_t hs,
                     const float *kh, const float *vh, size_t kv_dim, const uint32_t *list,
                     uint32_t len, float *s, float *gather);
/* Its AVX2 kernel (hs % 8 == 0; the AVX2 matmul kernel's bits: attn_group_rows
 * takes it when that is the dense kernel), reading the keys and values in
 * place, and the kernel's scalar twin (attn_sel_row_ref per head: the same
 * bits). s: G * len floats. */
void attn_group_rows_avx2(float *out, size_t ldo, const float *q, size_t ldq, uint32_t G,
                          uint32_t hs, const float *kh, const float *vh, size_t kv_dim,
                          const uint32_t *list, uint32_t len, float *s);
void attn_group_rows_ref(float *out, size_t ldo, const float *q, size_t ldq, uint32_t G,
                         uint32_t hs, const float *kh, const float *vh, size_t kv_dim,
                         const uint32_t *list, uint32_t len, float *s);
/* The same with the AVX-512 matmul kernel's bits (hs % 16 == 0;
 * attn_group_avx512.c: each key and value row loaded once for several heads)
 * and its twin (attn_sel_row_ref16 per head). */
void attn_group_rows_avx512(float *out, size_t ldo, const float *q, size_t ldq, uint32_t G,
                            uint32_t hs, const float *kh, const float *vh, size_t kv_dim,
                            const uint32_t *list, uint32_t len, float *s);
void attn_group_rows_ref16(float *out, size_t ldo, const float *q, size_t ldq, uint32_t G,
                           uint32_t hs, const float *kh, const float *vh, size_t kv_dim,
                           const uint32_t *list, uint32_t len, float *s);
/* attn_group_rows for R rows, each with its own list: row r's G query heads
 * at w[r].q + h * ldq, outputs w[r].out + h * ldo, its list w[r].list[0..len)
 * (ascending, len >= 1, all < T), scratch w[r].s (G * len floats). The same
 * bits per row as attn_group_rows; the AVX-512 kernel walks the keys in
 * blocks of kb slots for all R rows (cur: R uint32_t), elsewhere one row at
 * a time (gather: as attn_group_rows's). */
struct attn_group_row {
    const float *q;
    float *out;
    const uint32_t *list;
    uint32_t len;
    float *s;
    /* row blocks (infer_sparse_opts.row_block): m members instead of G (0:
     * G), member h attending the list's first lens[h] slots (NULL: all
     * len; each 1..len): its bits are attn_group_rows's for that prefix */
    uint32_t m;
    const uint32_t *lens;
};
void attn_group_rows_blk(uint32_t R, const struct attn_group_row *w, uint32_t G, size_t ldq,
                         size_t ldo, uint32_t hs, const float *kh, const float *vh, size_t kv_dim,
                         uint32_t kb, uint32_t T, uint32_t *cur, float *gather);
void attn_group_rows_blk_avx512(uint32_t R, const struct attn_group_row *w, uint32_t G,
                                size_t ldq, size_t ldo, uint32_t hs, const float *kh,
                                const float *vh, size_t kv_dim, uint32_t kb, uint32_t T,
                                uint32_t *cur);

/* How many of `visible` keys (slots 0..visible-1) a row of a head with keep
 * ratio r attends: ceil(r * visible), at least 1, at most visible. */
uint32_t attn_keep_count(double r, uint32_t visible);

/* The slots one row keeps, ascending, into sel (k of them, k from
 * attn_keep_count): the last w = min(window, k) visible slots (the recent
 * window; its last slot is the row itself), the first min(sinks, k - w)
 * slots, and the top of the rest by est[0..visible) (the sinks and the
 * window count inside k, so k is the real keep; when k is small the row
 * and its neighbours go before the sinks). work:
 * 2 * visible uint32_t. Returns k. */
uint32_t attn_select_row(const float *est, uint32_t visible, uint32_t k, uint32_t sinks,
                         uint32_t window, uint32_t *sel, uint32_t *work);
/* The same with attn_topk_hint's threshold guesses (hint: ATTN_HINT floats)
 * for the top of the rest. */
uint32_t attn_select_row_hint(const float *est, uint32_t visible, uint32_t k, uint32_t sinks,
                              uint32_t window, uint32_t *sel, uint32_t *work, float *hint);

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
/* The same rule with codes within +-qmax (1..127): s = max|k| / qmax. */
float attn_quantize_key_q(const float *k, uint32_t hd, int qmax, int8_t *q);

/* The codes of the keys the estimate reads: within +-ATTN_EST_QMAX. */
#ifndef ATTN_EST_QMAX
#define ATTN_EST_QMAX 64
#endif

/* The codes of the queries the estimate reads: within +-ATTN_EST_QQ (63: 7
 * bits; the emulated NPU's AVX2 kernel then adds two groups' products in
 * int16 before widening, npu_job.a_max). A bucket's scale s (of max|q| /
 * 127 units, as profiled) becomes the code scale attn_q_code_scale(s) =
 * s * 127 / ATTN_EST_QQ. */
#ifndef ATTN_EST_QQ
#define ATTN_EST_QQ 63
#endif
float attn_q_code_scale(float bucket_scale);
/* q = clamp(rint(x / s), -ATTN_EST_QQ, ATTN_EST_QQ) (npu_quantize_act, then
 * the clamp), hd values. */
void attn_quantize_q(const float *x, uint32_t hd, float s, int8_t *q);

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

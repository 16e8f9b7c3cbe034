/* attn_group_avx512.c: the shared selection (--select group: one key list
 * per kv head and query row, attended by the kv head's G query heads) with
 * AVX-512F, the bits of infer_attn_list per head under the AVX-512 matmul
 * kernels (attn_sparse.h; the scalar twins are attn_group_rows_ref16 and
 * attn_group_combine_scalar in attn_group.c): the heads' estimates folded
 * into one score per slot, and the exact stage with each key and value row
 * loaded once for several heads. The dot, fold and values chain are
 * attn_sel_avx512.c's (attn_avx512_inl.h). */
#include <immintrin.h>
#include <math.h>

#include "attn_avx512_inl.h"
#include "attn_sparse.h"
#include "infer_matmul.h"

/* One step of attn_group_exp2_sum_scalar's sum, 16 lanes (those of mt):
 * fmadd, max then min (a NaN gives the second operand, -126, as the scalar
 * compare does), roundscale down, the cubic by fmadd, scalef (exact: the
 * terms are normal), added into the lanes' sums. */
static inline __attribute__((always_inline)) __m512 exp2_add(__m512 acc, __mmask16 mt, __m512 e,
                                                             __m512 kv, __m512 nmk)
{
    const __m512 lo = _mm512_set1_ps(-126.0f), zero = _mm512_setzero_ps();
    const __m512 c0 = _mm512_set1_ps(ATTN_EXP2_C0), c1 = _mm512_set1_ps(ATTN_EXP2_C1);
    const __m512 c2 = _mm512_set1_ps(ATTN_EXP2_C2), c3 = _mm512_set1_ps(ATTN_EXP2_C3);
    __m512 x = _mm512_fmadd_ps(e, kv, nmk);
    x = _mm512_min_ps(_mm512_max_ps(x, lo), zero);
    __m512 fl = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(x, fl);
    __m512 p = _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_fmadd_ps(c3, f, c2), f, c1), f, c0);
    return _mm512_mask_add_ps(acc, mt, acc, _mm512_scalef_ps(p, fl));
}

/* One pass over the slots [0, nv) (nv a multiple of 16) for up to three
 * rows of attn_group_combine at three stages (the flags constants): M, the
 * row at em's maximum lane by lane (*mv: _mm512_max_ps(e, m) is the scalar
 * e > m ? e : m, a NaN never taken); X, the exp2 sum of the row at ex
 * (*acc, the steps and lanes of attn_group_exp2_sum_scalar's vector form;
 * nmk: minus its maximum times k); C,
 * c[t] = e[t] - off for the row at ec (C 1: the first row) or the larger of
 * that and c[t] (C 2: d > c ? d : c). Each value's steps are those of a pass
 * per stage, so the bits: one pass where there were three per row (the
 * maximum's pass, the first to read a row from L2, ran at its loads;
 * here it and the c pass go under the exp2 sum's arithmetic). */
static inline __attribute__((always_inline)) void
comb_pass(const int M, const int X, const int C, uint32_t nv, const float *em, __m512 *mv,
          const float *ex, __m512 kv, __m512 nmk, __m512 *acc, const float *ec, __m512 ms,
          float *c)
{
    __m512 m = *mv, a = *acc;
    for (uint32_t t = 0; t < nv; t += 16) {
        if (M)
            m = _mm512_max_ps(_mm512_loadu_ps(em + t), m);
        if (X)
            a = exp2_add(a, (__mmask16)0xffff, _mm512_loadu_ps(ex + t), kv, nmk);
        if (C) {
            __m512 d = _mm512_sub_ps(_mm512_loadu_ps(ec + t), ms);
            _mm512_storeu_ps(c + t, C == 1 ? d : _mm512_max_ps(d, _mm512_loadu_ps(c + t)));
        }
    }
    *mv = m;
    *acc = a;
}

/* attn_group_combine with 16 lanes, the rows pipelined: step s takes row s's
 * maximum, row s - 1's exp2 sum (its maximum known) and row s - 2's share
 * of c (its offset known) in one pass over the whole 16-lane steps
 * (comb_pass), then each stage's tail as the pass per stage had it: the
 * maximum's lanes folded in order, then its scalar tail, and where it is a
 * zero (whose sign the order of a +0/-0 tie decides) the scalar loop's own
 * order; the exp2 sum's masked last step, its lanes folded as the scalar
 * twin folds them; c's scalar tail. The tails run in the order c, sum,
 * maximum: c's reads the offset that the sum then replaces (off), the sum
 * reads the maximum that the maximum's tail then replaces (mx). The same
 * bits as attn_group_combine_scalar. */
void attn_group_combine_avx512(const float *est, size_t ld, uint32_t G, uint32_t visible,
                               float sq, float *c)
{
    const float k = ATTN_EXP2_LOG2E / sq;
    const __m512 kv = _mm512_set1_ps(k);
    const uint32_t nv = visible & ~15u;
    if (G == 0)
        return; /* no rows: c untouched, as the scalar twin leaves it */
    float mx = 0.0f, off = 0.0f; /* row s - 1's maximum, row s - 2's offset */
    for (uint32_t s = 0; s < G + 2; s++) {
        const int M = s < G, X = s >= 1 && s <= G, C = s >= 2 ? (s == 2 ? 1 : 2) : 0;
        const float *em = M ? est + (size_t)s * ld : est; /* (in bounds where unused) */
        const float *ex = X ? est + (size_t)(s - 1) * ld : est;
        const float *ec = C ? est + (size_t)(s - 2) * ld : est;
        __m512 mv = _mm512_set1_ps(-INFINITY), acc = _mm512_setzero_ps();
        const __m512 nmk = _mm512_set1_ps(-(mx * k)), ms = _mm512_set1_ps(off);
        switch (M << 3 | X << 2 | C) {
        case 8: comb_pass(1, 0, 0, nv, em, &mv, ex, kv, nmk, &acc, ec, ms, c); break;
        case 12: comb_pass(1, 1, 0, nv, em, &mv, ex, kv, nmk, &acc, ec, ms, c); break;
        case 13: comb_pass(1, 1, 1, nv, em, &mv, ex, kv, nmk, &acc, ec, ms, c); break;
        case 14: comb_pass(1, 1, 2, nv, em, &mv, ex, kv, nmk, &acc, ec, ms, c); break;
        case 4: comb_pass(0, 1, 0, nv, em, &mv, ex, kv, nmk, &acc, ec, ms, c); break;
        case 5: comb_pass(0, 1, 1, nv, em, &mv, ex, kv, nmk, &acc, ec, ms, c); break;
        case 6: comb_pass(0, 1, 2, nv, em, &mv, ex, kv, nmk, &acc, ec, ms, c); break;
        case 1: comb_pass(0, 0, 1, nv, em, &mv, ex, kv, nmk, &acc, ec, ms, c); break;
        default: comb_pass(0, 0, 2, nv, em, &mv, ex, kv, nmk, &acc, ec, ms, c); break;
        }
        if (C) { /* row s - 2 done */
            for (uint32_t t = nv; t < visible; t++) {
                float d = ec[t] - off;
                c[t] = C == 1 ? d : d > c[t] ? d : c[t];
            }
        }
        if (X) { /* row s - 1's sum: the masked last step, the lanes folded */
            if (nv < visible) {
                __mmask16 mt = (__mmask16)((1u << (visible - nv)) - 1);
                acc = exp2_add(acc, mt, _mm512_maskz_loadu_ps(mt, ex + nv), kv, nmk);
            }
            float l[16];
            _mm512_storeu_ps(l, acc);
            for (int w = 8; w >= 1; w /= 2)
                for (int i = 0; i < w; i++)
                    l[i] += l[i + w];
            off = mx + logf(l[0]) * sq;
            if (!isfinite(off))
                off = mx;
        }
        if (M) { /* row s's maximum */
            float l[16], m = -INFINITY;
            _mm512_storeu_ps(l, mv);
            for (int i = 0; i < 16; i++)
                m = l[i] > m ? l[i] : m;
            for (uint32_t t = nv; t < visible; t++)
                m = em[t] > m ? em[t] : m;
            if (m == 0.0f) { /* +0 or -0: the scalar order's */
                m = -INFINITY;
                for (uint32_t t = 0; t < visible; t++)
                    m = em[t] > m ? em[t] : m;
            }
            mx = m;
        }
    }
}

/* attn_group_rows_avx512's values: NH heads (outputs out + h * ldo, weights
 * a + h * len) over the shared list's slots [j0, j1), NC * 16 columns: each
 * value row loaded once for the NH heads, each head's column a FMA chain in
 * list order resumed from out (the same chain as values_t) */
#define VALUES_HEADS(NAME, NH, NC)                                                                \
    static void NAME(float *out, size_t ldo, const float *a, uint32_t len, const float *vh,       \
                     size_t ld, const uint32_t *list, uint32_t j0, uint32_t j1, int pf)           \
    {                                                                                             \
        __m512 acc[NH][NC];                                                                       \
        for (int h = 0; h < NH; h++)                                                              \
            for (int i = 0; i < NC; i++)                                                          \
                acc[h][i] = _mm512_loadu_ps(out + (size_t)h * ldo + 16 * i);                     \
        for (uint32_t j = j0; j < j1; j++) {                                                      \
            if (pf && j + AHEAD < j1)                                                             \
                prefetch_row(vh + (size_t)list[j + AHEAD] * ld, 16 * NC);                         \
            const float *v = vh + (size_t)list[j] * ld;                                           \
            __m512 x[NC];                                                                         \
            for (int i = 0; i < NC; i++)                                                          \
                x[i] = _mm512_loadu_ps(v + 16 * i);                                               \
            for (int h = 0; h < NH; h++) {                                                        \
                __m512 p = _mm512_set1_ps(a[(size_t)h * len + j]);                                \
                for (int i = 0; i < NC; i++)                                                      \
                    acc[h][i] = _mm512_fmadd_ps(p, x[i], acc[h][i]);                              \
            }                                                                                     \
        }                                                                                         \
        for (int h = 0; h < NH; h++)                                                              \
            for (int i = 0; i < NC; i++)                                                          \
                _mm512_storeu_ps(out + (size_t)h * ldo + 16 * i, acc[h][i]);                     \
    }
VALUES_HEADS(values_h4_64, 4, 4)
VALUES_HEADS(values_h2_128, 2, 8)
#undef VALUES_HEADS

/* G query heads of one kv head over one shared list (attn_group_rows; the
 * shared selection), keys and values read in place (rows kv_dim apart),
 * the list walked in chunks of GROUP_CHUNK slots: the first head's scores
 * prefetch the chunk's key rows, the other heads find them in L1; every
 * score scores_t's (the AVX-512 dense kernel's dot and fold); each head's
 * softmax by the kernel's steps; then the values chunk by chunk, each row
 * loaded once for 4 heads (head size 64) or 2 (128), else per head by
 * values_t. Every head gets attn_sel_row_avx512's bits (its twin:
 * attn_group_rows_ref16). s: G * len floats. */
#define GROUP_CHUNK 64u
void attn_group_rows_avx512(float *out, size_t ldo, const float *q, size_t ldq, uint32_t G,
                            uint32_t hs, const float *kh, const float *vh, size_t kv_dim,
                            const uint32_t *list, uint32_t len, float *s)
{
    for (uint32_t j0 = 0; j0 < len; j0 += GROUP_CHUNK) {
        uint32_t n = len - j0 < GROUP_CHUNK ? len - j0 : GROUP_CHUNK;
        for (uint32_t h = 0; h < G; h++) {
            float *a = s + (size_t)h * len + j0;
            const float *qh = q + (size_t)h * ldq;
            if (h == 0)
                scores_t(0, 1, a, qh, kh, kv_dim, hs, list + j0, n, 0);
            else if (hs == 64)
                scores_t(64, 0, a, qh, kh, kv_dim, hs, list + j0, n, 0);
            else if (hs == 128)
                scores_t(128, 0, a, qh, kh, kv_dim, hs, list + j0, n, 0);
            else
                scores_t(0, 0, a, qh, kh, kv_dim, hs, list + j0, n, 0);
        }
    }
    for (uint32_t h = 0; h < G; h++) {
        float *a = s + (size_t)h * len;
        float maxv = infer_div_max_avx512(a, len, sqrtf((float)hs));
        float sum = infer_exp_sum_avx512(a, len, maxv);
        (void)infer_div_max_avx512(a, len, sum);
        for (uint32_t c = 0; c < hs; c++)
            out[(size_t)h * ldo + c] = 0.0f;
    }
    for (uint32_t j0 = 0; j0 < len; j0 += GROUP_CHUNK) {
        uint32_t j1 = len - j0 < GROUP_CHUNK ? len : j0 + GROUP_CHUNK;
        uint32_t h = 0;
        if (hs == 64)
            for (; h + 4 <= G; h += 4)
                values_h4_64(out + (size_t)h * ldo, ldo, s + (size_t)h * len, len, vh, kv_dim,
                             list, j0, j1, h == 0);
        else if (hs == 128)
            for (; h + 2 <= G; h += 2)
                values_h2_128(out + (size_t)h * ldo, ldo, s + (size_t)h * len, len, vh, kv_dim,
                              list, j0, j1, h == 0);
        for (; h < G; h++)
            values_hs(out + (size_t)h * ldo, s + (size_t)h * len, vh, kv_dim, hs, list, j0, j1,
                      0);
    }
}

/* a member's scores over list[0..n) (keys in place, rows ld apart), sixteen
 * keys a step (one hsum16_16 fold for the sixteen: the fold, not the FMAs,
 * was the cost of 8-key steps at head size 64), the head size a constant
 * where it is 64 or 128: scores_t's bits */
static void scores_16(float *a, const float *q, const float *kh, size_t ld, uint32_t hs,
                      const uint32_t *list, uint32_t n)
{
    if (hs == 64)
        scores_t(64, 0, a, q, kh, ld, hs, list, n, 0);
    else if (hs == 128)
        scores_t(128, 0, a, q, kh, ld, hs, list, n, 0);
    else
        scores_t(0, 0, a, q, kh, ld, hs, list, n, 0);
}

/* NM (2 or 4) members' scores over the same slots list[0..n) (keys in
 * place, rows ld apart): 16 / NM keys a step for all of them, each key row
 * loaded once for the NM, the sixteen dots (lanes i * KE .. i * KE + KE - 1:
 * member i's) folded by one hsum16_16: each dot's chain and fold are
 * scores_t's, so its bits. A tail of half a step (KE / 2) or more keys runs
 * as a step whose last keys repeat its last key (only its own lanes
 * stored); a shorter one one key at a time by scores_t. The head size a
 * constant where it is 64 or 128 (HS). */
static inline __attribute__((always_inline)) void
scores_members_t(const uint32_t HS, const uint32_t NM, float *const *a, const float *const *q,
                 const float *kh, size_t ld, uint32_t hs, const uint32_t *list, uint32_t n)
{
    if (HS)
        hs = HS;
    const uint32_t KE = 16 / NM, PAD = KE / 2;
    uint32_t j = 0;
    for (; j + PAD <= n; j += KE) {
        uint32_t m = n - j < KE ? n - j : KE;
        const float *k[8];
        __m512 acc[16];
        for (uint32_t e = 0; e < KE; e++)
            k[e] = kh + (size_t)list[j + (e < m ? e : m - 1)] * ld;
        for (int i = 0; i < 16; i++)
            acc[i] = _mm512_setzero_ps();
        for (uint32_t c = 0; c < hs; c += 16) {
            __m512 qv[4];
            for (uint32_t i = 0; i < NM; i++)
                qv[i] = _mm512_loadu_ps(q[i] + c);
#pragma GCC unroll 8
            for (uint32_t e = 0; e < KE; e++) {
                __m512 x = _mm512_loadu_ps(k[e] + c);
#pragma GCC unroll 4
                for (uint32_t i = 0; i < NM; i++)
                    acc[i * KE + e] = _mm512_fmadd_ps(qv[i], x, acc[i * KE + e]);
            }
        }
        __m512 r = hsum16_16(acc);
        const __mmask8 mk = (__mmask8)((1u << m) - 1);
        if (NM == 2) {
            _mm256_mask_storeu_ps(a[0] + j, mk, _mm512_castps512_ps256(r));
            _mm256_mask_storeu_ps(a[1] + j, mk, _mm512_extractf32x8_ps(r, 1));
        } else {
            _mm_mask_storeu_ps(a[0] + j, mk, _mm512_castps512_ps128(r));
            _mm_mask_storeu_ps(a[1] + j, mk, _mm512_extractf32x4_ps(r, 1));
            _mm_mask_storeu_ps(a[2] + j, mk, _mm512_extractf32x4_ps(r, 2));
            _mm_mask_storeu_ps(a[3] + j, mk, _mm512_extractf32x4_ps(r, 3));
        }
    }
    for (uint32_t i = 0; j < n && i < NM; i++)
        scores_t(HS, 0, a[i] + j, q[i], kh, ld, hs, list + j, n - j, 0);
}

/* inlined into the row-block kernel (its six forms double that code, past
 * the 32 KiB L1 instruction cache; out of line measured slower: bench attn
 * tinyllama 4K rows 4 keep 0.2, 7 alternated pairs, x2.52 inlined against
 * x2.42 noinline median) */
static void scores_members(uint32_t NM, float *const *a, const float *const *q, const float *kh,
                           size_t ld, uint32_t hs, const uint32_t *list, uint32_t n)
{
    if (NM == 4 && hs == 64)
        scores_members_t(64, 4, a, q, kh, ld, hs, list, n);
    else if (NM == 4 && hs == 128)
        scores_members_t(128, 4, a, q, kh, ld, hs, list, n);
    else if (NM == 4)
        scores_members_t(0, 4, a, q, kh, ld, hs, list, n);
    else if (hs == 64)
        scores_members_t(64, 2, a, q, kh, ld, hs, list, n);
    else if (hs == 128)
        scores_members_t(128, 2, a, q, kh, ld, hs, list, n);
    else
        scores_members_t(0, 2, a, q, kh, ld, hs, list, n);
}

/* values over [j0, e) of the list for NH members at once (values_h4_64 or
 * values_h2_128: vf) where every member attends all of it, then each
 * member's own part of the block (its prefix: lens) by values_hs: each
 * column's chain in list order, as one member at a time */
typedef void values_fn(float *out, size_t ldo, const float *a, uint32_t len, const float *vh,
                       size_t ld, const uint32_t *list, uint32_t j0, uint32_t j1, int pf);
static inline __attribute__((always_inline)) void
values_members(values_fn *vf, uint32_t NH, const struct attn_group_row *w, uint32_t h,
               size_t ldo, uint32_t hs, const float *vh, size_t kv_dim, uint32_t j0, uint32_t e)
{
    uint32_t len = w->len, me = e;
    for (uint32_t i = 0; w->lens && i < NH; i++)
        me = w->lens[h + i] < me ? w->lens[h + i] : me;
    me = me > j0 ? me : j0;
    if (me > j0)
        vf(w->out + (size_t)h * ldo, ldo, w->s + (size_t)h * len, len, vh, kv_dim, w->list, j0,
           me, 0);
    for (uint32_t i = 0; me < e && i < NH; i++) {
        uint32_t b = w->lens[h + i] < e ? w->lens[h + i] : e;
        if (b > me)
            values_hs(w->out + (size_t)(h + i) * ldo, w->s + (size_t)(h + i) * len, vh, kv_dim,
                      hs, w->list, me, b, 0);
    }
}

/* attn_group_rows_avx512 for R rows at once (each its own shared list),
 * walking the keys in blocks of kb slots for all of them as
 * attn_sel_rows_avx512 does, so that a block's key and value rows are read
 * from memory once for the R rows (one row at a time read ~20% of a kv
 * head's rows per row: from L3 at 4K keys). The same bits per head as
 * attn_group_rows_avx512 (each dot and fold, softmax, and each column's
 * chain in list order, resumed block by block). The scores of a list's
 * members (its heads, or a row block's rows) four at a time, then two
 * (scores_members: each key row loaded and its address found once for
 * them; the exact stage 0.77-0.94 of the time before in k17's
 * microbenchmark, docs/BENCHMARKS.md, seventeenth session, k17). cur: R
 * uint32_t. */
void attn_group_rows_blk_avx512(uint32_t R, const struct attn_group_row *w, uint32_t G,
                                size_t ldq, size_t ldo, uint32_t hs, const float *kh,
                                const float *vh, size_t kv_dim, uint32_t kb, uint32_t T,
                                uint32_t *cur)
{
    struct blk_ends ends; /* the scores pass's block ends for the values pass */
    blk_ends_init(&ends, R, T, kb);
    for (uint32_t r = 0; r < R; r++)
        cur[r] = 0;
    for (uint32_t t0 = 0, bk = 0; t0 < T; t0 += kb, bk++) {
        uint32_t t1 = T - t0 < kb ? T : t0 + kb;
        for (uint32_t r = 0; r < R; r++) {
            uint32_t j = cur[r], e = blk_ends_find(&ends, bk, r, w[r].list, j, w[r].len, t1);
            uint32_t gm = w[r].m ? w[r].m : G, h = 0;
            float *s0 = w[r].s + j;
            for (uint32_t nm = 4; nm >= 2; nm /= 2) /* members four, then two, at a time */
                for (; h + nm <= gm && e > j; h += nm) {
                    float *a[4];
                    const float *qm[4];
                    for (uint32_t i = 0; i < nm; i++) {
                        a[i] = s0 + (size_t)(h + i) * w[r].len;
                        qm[i] = w[r].q + (size_t)(h + i) * ldq;
                    }
                    scores_members(nm, a, qm, kh, kv_dim, hs, w[r].list + j, e - j);
                }
            for (; h < gm && e > j; h++)
                scores_16(s0 + (size_t)h * w[r].len, w[r].q + (size_t)h * ldq, kh, kv_dim, hs,
                          w[r].list + j, e - j);
            cur[r] = e;
        }
    }
    for (uint32_t r = 0; r < R; r++) {
        uint32_t gm = w[r].m ? w[r].m : G;
        for (uint32_t h = 0; h < gm; h++) {
            float *a = w[r].s + (size_t)h * w[r].len;
            uint32_t n = w[r].lens ? w[r].lens[h] : w[r].len;
            float maxv = infer_div_max_avx512(a, n, sqrtf((float)hs));
            float sum = infer_exp_sum_avx512(a, n, maxv);
            (void)infer_div_max_avx512(a, n, sum);
            for (uint32_t c = 0; c < hs; c++)
                w[r].out[(size_t)h * ldo + c] = 0.0f;
        }
        cur[r] = 0;
    }
    for (uint32_t t0 = 0, bk = 0; t0 < T; t0 += kb, bk++) {
        uint32_t t1 = T - t0 < kb ? T : t0 + kb;
        for (uint32_t r = 0; r < R; r++) {
            const uint32_t *list = w[r].list;
            uint32_t len = w[r].len, j0 = cur[r], h = 0;
            uint32_t e = blk_ends_get(&ends, bk, r, list, j0, len, t1);
            uint32_t gm = w[r].m ? w[r].m : G;
            cur[r] = e;
            if (e == j0)
                continue;
            if (hs == 64)
                for (; h + 4 <= gm; h += 4)
                    values_members(values_h4_64, 4, &w[r], h, ldo, hs, vh, kv_dim, j0, e);
            else if (hs == 128)
                for (; h + 2 <= gm; h += 2)
                    values_members(values_h2_128, 2, &w[r], h, ldo, hs, vh, kv_dim, j0, e);
            for (; h < gm; h++) {
                uint32_t b = w[r].lens && w[r].lens[h] < e ? w[r].lens[h] : e;
                if (b > j0)
                    values_hs(w[r].out + (size_t)h * ldo, w[r].s + (size_t)h * len, vh, kv_dim,
                              hs, list, j0, b, 0);
            }
        }
    }
}

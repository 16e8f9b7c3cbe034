/* attn_topk.c: top-k selection over estimated scores and the keys a row of
 * sparse attention keeps (sinks, recent window, top of the rest). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn_sparse.h"

/* order-preserving unsigned key of a float: larger float, larger key */
static inline uint32_t fkey(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* the general path: a radix select on the keys (any floats, NaN included) */
static void topk_radix(const float *score, uint32_t n, uint32_t k, uint32_t *idx, uint32_t *work)
{
    /* the k-th largest key tau, 11 + 11 + 10 bits at a time; need = how many
     * of the keys equal to tau's prefix still have to be taken */
    uint32_t *cand = work, *next = work + n;
    uint32_t nc = 0, need = k, prefix = 0, pmask = 0;
    static const int shift[3] = {21, 10, 0};
    static const uint32_t bits[3] = {11, 11, 10};
    for (int pass = 0; pass < 3; pass++) {
        uint32_t hist[2048];
        uint32_t nb = 1u << bits[pass], bm = nb - 1;
        memset(hist, 0, sizeof(uint32_t) * nb);
        if (pass == 0) {
            for (uint32_t i = 0; i < n; i++)
                hist[fkey(score[i]) >> shift[0]]++;
        } else {
            for (uint32_t j = 0; j < nc; j++)
                hist[(fkey(score[cand[j]]) >> shift[pass]) & bm]++;
        }
        uint32_t b = nb, acc = 0;
        while (b > 0 && acc + hist[b - 1] < need)
            acc += hist[--b];
        b--; /* the bin holding the need-th largest */
        need -= acc;
        prefix |= b << shift[pass];
        pmask |= bm << shift[pass];
        if (pass == 2)
            break;
        /* the candidates of that bin, for the next bits */
        uint32_t m = 0;
        if (pass == 0) {
            for (uint32_t i = 0; i < n; i++)
                if ((fkey(score[i]) & pmask) == prefix)
                    next[m++] = i;
        } else {
            for (uint32_t j = 0; j < nc; j++)
                if ((fkey(score[cand[j]]) & pmask) == prefix)
                    next[m++] = cand[j];
        }
        uint32_t *t = cand;
        cand = next;
        next = t;
        nc = m;
        if (nc == need) { /* every candidate is taken: tau is the smallest of them */
            uint32_t lo = UINT32_MAX;
            for (uint32_t j = 0; j < nc; j++) {
                uint32_t key = fkey(score[cand[j]]);
                lo = key < lo ? key : lo;
            }
            prefix = lo;
            need = 0;
            for (uint32_t j = 0; j < nc; j++)
                need += fkey(score[cand[j]]) == lo;
            break;
        }
    }
    /* keys above tau, and the first `need` equal to it, in index order */
    uint32_t tau = prefix, o = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t key = fkey(score[i]);
        if (key > tau || (key == tau && need && need--))
            idx[o++] = i;
    }
}

static int cmp_desc(const void *a, const void *b)
{
    const float *x = a, *y = b; /* (value, index as float bits) pairs */
    if (x[0] != y[0])
        return x[0] > y[0] ? -1 : 1;
    uint32_t i, j;
    memcpy(&i, &x[1], 4);
    memcpy(&j, &y[1], 4);
    return i < j ? -1 : i > j;
}

/* The fast path for finite scores: 256 bins linear in value between the
 * minimum and maximum (monotone: a larger score never falls in a lower
 * bin), the bin holding the k-th largest sorted exactly. */
#define BINS 256
static void topk_binned(const float *score, uint32_t n, uint32_t k, uint32_t *idx,
                        uint32_t *work)
{
    float lo = score[0], hi = score[0];
    for (uint32_t i = 1; i < n; i++) {
        lo = score[i] < lo ? score[i] : lo;
        hi = score[i] > hi ? score[i] : hi;
    }
    float scale = (float)(BINS - 1) / (hi - lo);
    if (!isfinite(lo) || !isfinite(hi) || !(hi > lo) || !isfinite(scale) || n < 64) {
        topk_radix(score, n, k, idx, work);
        return;
    }
    uint32_t hist[BINS] = {0};
    uint8_t *bin = (uint8_t *)work; /* n bytes */
    for (uint32_t i = 0; i < n; i++) {
        float f = (score[i] - lo) * scale;
        uint32_t b = f >= (float)(BINS - 1) ? BINS - 1 : (uint32_t)f;
        bin[i] = (uint8_t)b;
        hist[b]++;
    }
    uint32_t b = BINS, acc = 0;
    while (b > 0 && acc + hist[b - 1] < k)
        acc += hist[--b];
    b--;
    uint32_t need = k - acc, nc = hist[b];
    /* the candidates of bin b as (value, index) pairs, after the bytes */
    float *cand = (float *)(work + (n + 3) / 4);
    if ((size_t)nc * 2 > 2 * (size_t)n - (n + 3) / 4) {
        topk_radix(score, n, k, idx, work);
        return;
    }
    uint32_t m = 0;
    for (uint32_t i = 0; i < n; i++)
        if (bin[i] == b) {
            cand[2 * m] = score[i];
            memcpy(&cand[2 * m + 1], &i, 4);
            m++;
        }
    qsort(cand, m, 2 * sizeof(float), cmp_desc);
    float tau = cand[2 * (need - 1)];
    uint32_t eq = 0;
    for (uint32_t j = 0; j < need; j++)
        eq += cand[2 * j] == tau;
    uint32_t o = 0;
    for (uint32_t i = 0; i < n; i++)
        if (score[i] > tau || (score[i] == tau && eq && eq--))
            idx[o++] = i;
}

/* v[kth] becomes the value at position kth of v sorted descending, with
 * v[0..kth) >= v[kth] >= v(kth..n) (Hoare quickselect, median of three;
 * no NaN in v). */
static void nth_desc(float *v, uint32_t n, uint32_t kth)
{
    int64_t lo = 0, hi = (int64_t)n - 1;
    while (hi > lo) {
        float a = v[lo], b = v[lo + (hi - lo) / 2], c = v[hi];
        float p = a > b ? (b > c ? b : (a > c ? c : a)) : (a > c ? a : (b > c ? c : b));
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (v[i] > p)
                i++;
            while (v[j] < p)
                j--;
            if (i <= j) {
                float t = v[i];
                v[i++] = v[j];
                v[j--] = t;
            }
        }
        /* [lo, j] >= p >= [i, hi], and (j, i) == p */
        if ((int64_t)kth <= j)
            hi = j;
        else if ((int64_t)kth >= i)
            lo = i;
        else
            return;
    }
}

/* A float strictly between lo and hi (lo < hi, both finite) at the share
 * frac of the way, computed in double so that a span wider than the float
 * range (hi - lo overflowing to infinity) still gives a point inside; the
 * midpoint when frac's point rounds onto an end; NaN only when lo and hi are
 * adjacent floats. */
static float between(float lo, float hi, double frac)
{
    if (nextafterf(lo, hi) == hi)
        return NAN;
    float t = NAN;
    if (frac > 0 && frac < 1)
        t = (float)((double)lo + ((double)hi - (double)lo) * frac);
    if (!(t > lo && t < hi))
        t = (float)((double)lo * 0.5 + (double)hi * 0.5);
    if (!(t > lo && t < hi))
        t = nextafterf(lo, hi);
    return t;
}

/* The k-th largest of v[0..m) (1 <= k <= m, no NaN) by counting passes
 * over v (8 lanes, no stores): regula falsi on the counts between lo,
 * which keeps at least k, and hi, which keeps fewer (the Illinois rule
 * against a stuck end). Stops when exactly k values are >= lo (then those
 * are the top k, whatever their order: *exact = 1) or when lo and hi are
 * adjacent floats (the k-th largest is lo, tied: *exact = 0). Returns lo,
 * or NaN when 64 passes did not get there (the caller's general path).
 * Every v[j] >= th (lo starts there); the first passes at the guess g and,
 * when that keeps more than k, one width w per surplus value above it (the
 * previous row's width per candidate) make the bracket; the candidates'
 * maximum (a range pass) is its top only when they do not. */
static float kth_count(const float *v, uint32_t m, uint32_t k, float th, float g, float w,
                       int *exact)
{
    *exact = 0;
    if (k == m) { /* every candidate (all >= th) */
        *exact = 1;
        return th;
    }
    /* lo = th keeps all m >= k; hi: a first guess g above th that keeps
     * fewer than k (one pass), else above the candidates' maximum */
    float lo = th, hi = NAN;
    double clo = m, chi = 0;
    uint32_t nlo = m;
    if (isfinite(g) && g > th) {
        uint32_t c = attn_count(v, m, g);
        if (c == k) {
            *exact = 1;
            return g;
        }
        if (c > k) {
            lo = g;
            clo = nlo = c;
            /* one more step of the width: usually past the k-th largest */
            float g2 = g + ((float)(c - k) + 0.5f) * w;
            if (isfinite(g2) && g2 > g) {
                c = attn_count(v, m, g2);
                if (c == k) {
                    *exact = 1;
                    return g2;
                }
                if (c > k) {
                    lo = g2;
                    clo = nlo = c;
                } else {
                    hi = g2;
                    chi = c;
                }
            }
        } else {
            hi = g;
            chi = c;
        }
    }
    if (hi != hi) {
        float mn, mx;
        int nan;
        attn_range(v, m, &mn, &mx, &nan);
        if (nan || !isfinite(mn) || !isfinite(mx))
            return NAN;
        hi = nextafterf(mx, INFINITY);
        if (!isfinite(hi))
            return NAN;
    }
    int side = 0;
    for (int it = 0; it < 64; it++) {
        float t = between(lo, hi, (clo - k) / (clo - chi));
        if (t != t)
            return lo; /* adjacent: lo is the k-th largest, tied */
        uint32_t c = attn_count(v, m, t);
        if (c >= k) {
            lo = t;
            clo = nlo = c;
            if (nlo == k) {
                *exact = 1;
                return lo;
            }
            if (side == 1)
                chi = (chi + k) / 2;
            side = 1;
        } else {
            hi = t;
            chi = c;
            if (side == -1)
                clo = (clo + k) / 2;
            side = -1;
        }
    }
    return NAN;
}


/* The exact top-k through a threshold th (no NaN in score): the scores >=
 * th are the candidates (one vector pass, indices ascending); with fewer
 * than k of them returns -1 (nothing written). Else the k-th largest of
 * them by counting passes over their values (kth_count; a quickselect when
 * that does not converge), ties at it: the lowest indices; returns 0 and,
 * when next is not NULL, next[0] = a threshold about slack above the k-th
 * rank (interpolated between th and the k-th largest: the guess for a
 * similar row) and next[1] the width per candidate between them, from
 * which (when next is not NULL and next[1] finite) the first counting
 * pass's guess comes: m - k candidates above th. The indices written are
 * base + i (the caller's slot numbers, from the candidates' pass). work:
 * 2 * n uint32_t. */
static int topk_at(const float *score, uint32_t n, uint32_t k, float th, uint32_t base,
                   uint32_t *idx, uint32_t *work, float *next)
{
    int nan, exact;
    uint32_t *cidx = work;
    float *cval = (float *)(work + n); /* the candidates' scores, in index order */
    uint32_t m = attn_above(score, n, th, base, cidx, cval, &nan);
    if (nan || m < k)
        return -1;
    float w0 = next ? next[1] : NAN;
    float g = isfinite(w0) ? th + ((float)(m - k) + 0.5f) * w0 : NAN;
    float tau = kth_count(cval, m, k, th, g, w0, &exact);
    if (next) {
        float slack = (float)(k / 4 + 16);
        float w = m > k && isfinite(tau) ? (tau - th) / (float)(m - k) : NAN;
        next[0] = !isfinite(tau) ? NAN : m > k ? tau - w * slack : th;
        next[1] = isfinite(w) && w > 0 ? w : NAN;
    }
    if (exact) { /* exactly k candidates >= tau: they are the top k */
        (void)attn_keep_above(cidx, cval, m, tau, idx);
        return 0;
    }
    if (!isfinite(tau)) {
        nth_desc(cval, m, k - 1); /* reorders cval: the scores are read again below */
        tau = cval[k - 1];
        for (uint32_t j = 0; j < m; j++)
            cval[j] = score[cidx[j] - base];
    }
    /* every candidate >= tau, then the last of those equal to tau dropped
     * while there are more than k */
    uint32_t o = attn_keep_above(cidx, cval, m, tau, idx);
    if (o > k) {
        uint32_t drop = o - k, w = o;
        for (uint32_t j = o; j-- > 0 && drop;)
            if (score[idx[j] - base] == tau) {
                idx[j] = UINT32_MAX;
                drop--;
            }
        o = 0;
        for (uint32_t j = 0; j < w; j++)
            if (idx[j] != UINT32_MAX)
                idx[o++] = idx[j];
    }
    return 0;
}

/* A threshold with k to k + k/32 + 4 scores at or above it, found by
 * counting passes (8 lanes, no stores) from a first guess g (NaN: none):
 * regula falsi on the counts between a threshold known to keep at least k
 * and one known to keep fewer (the Illinois rule against a stuck end), from
 * the range of the scores. Returns NaN on a NaN score or a range that is
 * not finite (the callers' general path), else th and *cnt. */
static float refine_threshold(const float *score, uint32_t n, uint32_t k, float g, uint32_t *cnt)
{
    float mn, mx;
    int nan;
    attn_range(score, n, &mn, &mx, &nan);
    if (nan || !isfinite(mn) || !isfinite(mx))
        return NAN;
    /* lo keeps >= k (the minimum keeps all), hi keeps < k (above the maximum: none) */
    float lo = mn, hi = nextafterf(mx, INFINITY);
    double clo = n, chi = 0;
    uint32_t nlo = n; /* lo's true count (clo may be pulled in) */
    if (!isfinite(hi))
        return NAN;
    uint32_t slack = k / 32 + 4;
    double target = k + slack / 2.0;
    int side = 0; /* the end moved last: 1 lo, -1 hi */
    float t = isfinite(g) && g > lo && g < hi ? g : between(lo, hi, (n - target) / n);
    for (int it = 0; it < 24 && nlo - k > slack; it++) {
        if (!(t > lo && t < hi)) {
            t = between(lo, hi, 0.5);
            if (t != t)
                break; /* adjacent floats: lo is the answer */
        }
        uint32_t c = attn_count(score, n, t);
        if (c >= k) {
            lo = t;
            clo = nlo = c;
            if (side == 1)
                chi = (chi + target) / 2; /* Illinois: pull the stale end in */
            side = 1;
        } else {
            hi = t;
            chi = c;
            if (side == -1)
                clo = (clo + target) / 2;
            side = -1;
        }
        t = between(lo, hi, (clo - target) / (clo - chi));
    }
    *cnt = nlo;
    return lo;
}

/* A threshold sampled from the scores: a sample's order statistic a little
 * below the k-th largest's expected rank (so about 1.3 k candidates); NaN
 * when the sample cannot tell. */
static float sampled_threshold(const float *score, uint32_t n, uint32_t k)
{
    enum { SAMPLE = 64 };
    if (n < 8 * SAMPLE || k > n / 2)
        return NAN;
    float smp[SAMPLE];
    uint32_t stride = n / SAMPLE;
    for (uint32_t j = 0; j < SAMPLE; j++)
        smp[j] = score[(size_t)j * stride + stride / 2];
    uint32_t want = (uint32_t)((double)k * 1.3 * SAMPLE / n) + 2; /* sample ranks above */
    if (want >= SAMPLE)
        return NAN;
    for (uint32_t j = 0; j < SAMPLE; j++)
        if (smp[j] != smp[j])
            return NAN;
    /* the want-th largest of the sample (a quickselect: O(SAMPLE)) */
    nth_desc(smp, SAMPLE, want - 1);
    return smp[want - 1];
}

/* attn_topk_hint with the indices written as base + i: the threshold
 * paths put base in with the candidates' indices (select_row's sinks offset,
 * which a pass over the kept indices added, ~1% of a 4K sparse prefill),
 * the rare general paths add it after */
static void topk_hint_base(const float *score, uint32_t n, uint32_t k, uint32_t base,
                           uint32_t *idx, uint32_t *work, float *hint)
{
    if (k == 0 || k >= n) {
        for (uint32_t i = 0; i < k && i < n; i++)
            idx[i] = base + i;
        return;
    }
    float g = hint && isfinite(hint[0]) ? hint[0] : NAN;
    float next[ATTN_HINT] = {NAN, hint ? hint[1] : NAN};
    if (!isfinite(g))
        g = sampled_threshold(score, n, k);
    /* the guess itself: one pass when at least k scores are >= it */
    int done = isfinite(g) && n >= 64 && topk_at(score, n, k, g, base, idx, work, next) == 0;
    if (!done && isfinite(g) && n >= 64) {
        /* the hint kept fewer than k (the previous row's scores sat higher):
         * the row's own sampled guess when it is lower, one more pass where
         * the refinement below takes a range pass and several counting
         * passes over the row (rows like bench attn's at 4K: a quarter of
         * the hints miss, this second guess finds the top k in ~98% of
         * those, the top-k ~1.05x faster) */
        float g2 = sampled_threshold(score, n, k);
        if (isfinite(g2) && g2 < g)
            done = topk_at(score, n, k, g2, base, idx, work, next) == 0;
    }
    if (!done) {
        uint32_t cnt = 0;
        float th = n >= 64 ? refine_threshold(score, n, k, g, &cnt) : NAN;
        next[0] = NAN;
        done = isfinite(th) && cnt >= k && topk_at(score, n, k, th, base, idx, work, next) == 0;
    }
    if (hint) {
        hint[0] = next[0];
        hint[1] = next[1];
    }
    if (!done) {
        topk_binned(score, n, k, idx, work);
        if (base)
            for (uint32_t j = 0; j < k; j++)
                idx[j] += base;
    }
}

void attn_topk_hint(const float *score, uint32_t n, uint32_t k, uint32_t *idx, uint32_t *work,
                    float *hint)
{
    topk_hint_base(score, n, k, 0, idx, work, hint);
}

void attn_topk(const float *score, uint32_t n, uint32_t k, uint32_t *idx, uint32_t *work)
{
    attn_topk_hint(score, n, k, idx, work, NULL);
}

uint32_t attn_keep_count(double r, uint32_t visible)
{
    if (visible == 0)
        return 0;
    double k = ceil(r * (double)visible - 1e-9);
    if (!(k >= 1.0))
        return 1;
    return k >= (double)visible ? visible : (uint32_t)k;
}

uint32_t attn_select_row(const float *est, uint32_t visible, uint32_t k, uint32_t sinks,
                         uint32_t window, uint32_t *sel, uint32_t *work)
{
    return attn_select_row_hint(est, visible, k, sinks, window, sel, work, NULL);
}

uint32_t attn_select_row_hint(const float *est, uint32_t visible, uint32_t k, uint32_t sinks,
                              uint32_t window, uint32_t *sel, uint32_t *work, float *hint)
{
    if (k >= visible) {
        for (uint32_t t = 0; t < visible; t++)
            sel[t] = t;
        return visible;
    }
    /* priority when k is small: the recent window (the row itself is its
     * last slot) first, then the sinks, then the top of the rest */
    uint32_t w = window < k ? window : k;
    uint32_t s = sinks < k - w ? sinks : k - w;
    uint32_t rest = k - s - w, mid = visible - s - w;
    for (uint32_t t = 0; t < s; t++)
        sel[t] = t;
    uint32_t *top = sel + s, *win = sel + s + rest;
    topk_hint_base(est + s, mid, rest, s, top, work, hint);
    for (uint32_t j = 0; j < w; j++)
        win[j] = visible - w + j;
    return k;
}

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

/* Top-k through a threshold sampled from the scores: every score above it
 * is a candidate (one compare pass, indices in order), and the exact top-k
 * of the candidates is the top-k of all when there are at least k of them
 * (else the binned path on everything). work: 2 * n uint32_t. */
void attn_topk(const float *score, uint32_t n, uint32_t k, uint32_t *idx, uint32_t *work)
{
    if (k == 0)
        return;
    if (k >= n) {
        for (uint32_t i = 0; i < n; i++)
            idx[i] = i;
        return;
    }
    enum { SAMPLE = 64 };
    if (n < 8 * SAMPLE || k > n / 2) {
        topk_binned(score, n, k, idx, work);
        return;
    }
    /* the threshold: a sample's order statistic a little below the k-th
     * largest's expected rank (so about 1.3 k candidates) */
    float smp[SAMPLE];
    uint32_t stride = n / SAMPLE;
    for (uint32_t j = 0; j < SAMPLE; j++)
        smp[j] = score[(size_t)j * stride + stride / 2];
    uint32_t want = (uint32_t)((double)k * 1.3 * SAMPLE / n) + 2; /* sample ranks above */
    if (want >= SAMPLE) {
        topk_binned(score, n, k, idx, work);
        return;
    }
    /* the want-th largest of the sample by partial selection sort */
    for (uint32_t a = 0; a < want; a++)
        for (uint32_t b = a + 1; b < SAMPLE; b++)
            if (smp[b] > smp[a]) {
                float t = smp[a];
                smp[a] = smp[b];
                smp[b] = t;
            }
    float th = smp[want - 1];
    if (!isfinite(th)) {
        topk_binned(score, n, k, idx, work);
        return;
    }
    /* candidates >= th, in index order: cidx, and their scores */
    uint32_t *cidx = work, m = 0;
    float *cval = (float *)(work + n);
    for (uint32_t i = 0; i < n; i++) {
        cidx[m] = i;
        m += score[i] >= th;
    }
    if (m < k || 3 * (size_t)m > n) { /* too few, or no room for the rest: all of them */
        topk_binned(score, n, k, idx, work);
        return;
    }
    for (uint32_t j = 0; j < m; j++)
        cval[j] = score[cidx[j]];
    /* the top-k of the candidates (ascending positions among them), mapped
     * back: positions ascend with indices; work past cval for the binned path */
    uint32_t *pos = idx, *w2 = (uint32_t *)(cval + m); /* 2 m of the n - m left */
    topk_binned(cval, m, k, pos, w2);
    for (uint32_t j = 0; j < k; j++)
        idx[j] = cidx[pos[j]];
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
    if (k >= visible) {
        for (uint32_t t = 0; t < visible; t++)
            sel[t] = t;
        return visible;
    }
    uint32_t s = sinks < k ? sinks : k;
    uint32_t w = window < k - s ? window : k - s;
    uint32_t rest = k - s - w, mid = visible - s - w;
    for (uint32_t t = 0; t < s; t++)
        sel[t] = t;
    attn_topk(est + s, mid, rest, sel + s, work);
    for (uint32_t j = 0; j < rest; j++)
        sel[s + j] += s;
    for (uint32_t j = 0; j < w; j++)
        sel[s + rest + j] = visible - w + j;
    return k;
}

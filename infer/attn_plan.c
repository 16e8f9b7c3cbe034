/* attn_plan.c: the decisions of sparse attention that are arithmetic on
 * profiled numbers: eq. 3's per-head keep ratios, the Q scale buckets, the
 * scalar specification of the Q.K estimate, and the head-wise pipeline's
 * greedy plan (Algorithm 1). */
#include <math.h>
#include <string.h>

#include "attn_sparse.h"
#include "npu.h"

static float floor_of(const float *v, uint32_t n)
{
    float mx = 0.0f;
    for (uint32_t i = 0; i < n; i++)
        mx = v[i] > mx ? v[i] : mx;
    return mx > 0.0f ? 1e-3f * mx : 1e-6f;
}

void attn_ratios(const float *head_imp, const float *layer_imp, uint32_t n_layers,
                 uint32_t n_heads, double keep, double floor_share, float *ratio)
{
    uint32_t N = n_layers * n_heads;
    if (keep > 1.0)
        keep = 1.0;
    if (!head_imp || !layer_imp || keep >= 1.0) {
        for (uint32_t i = 0; i < N; i++)
            ratio[i] = (float)keep;
        return;
    }
    float eh = floor_of(head_imp, N), el = floor_of(layer_imp, n_layers);
#define W(i)                                                                                  \
    ((double)(head_imp[i] > eh ? head_imp[i] : eh) *                                         \
     (layer_imp[(i) / n_heads] > el ? layer_imp[(i) / n_heads] : el))
    /* water-filling: ratio_i = min(1, c * w_i) with c such that the ratios
     * sum to keep * N (capped heads keep everything, the others share the
     * rest in proportion to their weights); the sum grows with c: bisection */
    double wsum = 0.0, wmin = INFINITY;
    for (uint32_t i = 0; i < N; i++) {
        wsum += W(i);
        wmin = W(i) < wmin ? W(i) : wmin;
    }
    double base = floor_share * keep, budget = keep * N;
    double lo = (budget - base * N) / wsum, hi = 1.0 / wmin;
    for (int it = 0; it < 200 && hi > lo; it++) {
        double c = 0.5 * (lo + hi), tot = 0.0;
        for (uint32_t i = 0; i < N; i++)
            tot += fmin(1.0, base + c * W(i));
        if (tot < budget)
            lo = c;
        else
            hi = c;
    }
    for (uint32_t i = 0; i < N; i++)
        ratio[i] = (float)fmin(1.0, base + lo * W(i));
#undef W
}

float attn_bucket_scale(float mean, float step, uint32_t buckets, uint32_t b)
{
    int e = (int)b - (int)(buckets - 1) / 2;
    return mean * powf(step, (float)e);
}

uint32_t attn_bucket_pick(float mean, float step, uint32_t buckets, float s)
{
    uint32_t best = 0;
    float bd = INFINITY;
    for (uint32_t b = 0; b < buckets; b++) {
        float d = attn_bucket_scale(mean, step, buckets, b) - s;
        if (d * d < bd) {
            bd = d * d;
            best = b;
        }
    }
    return best;
}

void attn_estimate_ref(const int8_t *q8, uint32_t m, uint32_t hd, float qs, const int8_t *k8,
                       size_t ldk, const float *ks, uint32_t T, float *est, size_t ld)
{
    for (uint32_t i = 0; i < m; i++)
        for (uint32_t t = 0; t < T; t++) {
            int32_t acc = 0;
            for (uint32_t d = 0; d < hd; d++)
                acc += (int32_t)q8[(size_t)i * hd + d] * k8[(size_t)t * ldk + d];
            est[(size_t)i * ld + t] = (qs * ks[t]) * (float)acc;
        }
}

float attn_quantize_key_q(const float *k, uint32_t hd, int qmax, int8_t *q)
{
    float amax = 0.0f, lim = (float)qmax;
    for (uint32_t j = 0; j < hd; j++)
        amax = fabsf(k[j]) > amax ? fabsf(k[j]) : amax;
    float s = amax > 0.0f && isfinite(amax) ? amax / lim : 1.0f;
    float inv = 1.0f / s;
    for (uint32_t j = 0; j < hd; j++) {
        float r = rintf(k[j] * inv);
        q[j] = (int8_t)(r > lim ? qmax : r < -lim ? -qmax : r);
    }
    return s;
}

float attn_quantize_key(const float *k, uint32_t hd, int8_t *q)
{
    return attn_quantize_key_q(k, hd, 127, q);
}

/* Algorithm 1's C/GPUPlan: orders the heads of one launch on the CPU after
 * the NPU finished it at t_npu; updates t_topk, t_qkv. */
static void cpu_plan(double t_npu, double *t_topk, double *t_qkv, uint32_t cnt, uint32_t *head,
                     const double *topk, const double *qkv)
{
    for (uint32_t step = 0; step < cnt; step++) {
        double best = INFINITY;
        uint32_t bi = step;
        for (uint32_t j = step; j < cnt; j++) {
            double tk = fmax(t_npu, *t_topk) + topk[head[j]];
            double tq = fmax(*t_qkv, tk) + qkv[head[j]];
            if (tq < best) {
                best = tq;
                bi = j;
            }
        }
        uint32_t h = head[bi];
        head[bi] = head[step];
        head[step] = h;
        *t_topk = fmax(t_npu, *t_topk) + topk[h];
        *t_qkv = fmax(*t_qkv, *t_topk) + qkv[h];
    }
}

double attn_plan(uint32_t n, const double *t_npu, const uint32_t *cnt,
                 uint32_t head[][ATTN_PLAN_MAX], const double *t_topk, const double *t_qkv,
                 uint32_t *order)
{
    double tn = 0, tk = 0, tq = 0;
    unsigned char used[ATTN_PLAN_MAX * 8] = {0};
    for (uint32_t step = 0; step < n; step++) {
        double best = INFINITY;
        uint32_t bi = UINT32_MAX;
        for (uint32_t i = 0; i < n; i++) {
            if (used[i])
                continue;
            uint32_t tmp[ATTN_PLAN_MAX];
            memcpy(tmp, head[i], sizeof(uint32_t) * cnt[i]);
            double k2 = tk, q2 = tq;
            cpu_plan(tn + t_npu[i], &k2, &q2, cnt[i], tmp, t_topk, t_qkv);
            if (q2 < best) {
                best = q2;
                bi = i;
            }
        }
        used[bi] = 1;
        order[step] = bi;
        tn += t_npu[bi];
        cpu_plan(tn, &tk, &tq, cnt[bi], head[bi], t_topk, t_qkv);
    }
    return tq;
}

float attn_q_code_scale(float bucket_scale)
{
    return bucket_scale * (127.0f / (float)ATTN_EST_QQ);
}

void attn_quantize_q(const float *x, uint32_t hd, float s, int8_t *q)
{
    npu_quantize_act(x, hd, s, q);
    for (uint32_t d = 0; d < hd; d++)
        q[d] = q[d] > ATTN_EST_QQ ? ATTN_EST_QQ : q[d] < -ATTN_EST_QQ ? -ATTN_EST_QQ : q[d];
}

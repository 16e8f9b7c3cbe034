/* infer_sampler.c: greedy, temperature, top-k and top-p (nucleus) sampling
 * with a seeded xorshift generator (llama2.c's run.c rules, plus top-k).
 * With both top-k and top-p, the candidates are the k most likely tokens cut
 * further to the smallest prefix whose probability (under the full softmax)
 * exceeds top_p; the pick is proportional within the candidates. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "infer.h"

struct prob_index {
    float prob;
    int index;
};

struct infer_sampler {
    uint32_t vocab;
    struct infer_sampler_params p;
    uint64_t rng;
    struct prob_index *buf;
};

int infer_sampler_create(uint32_t vocab, const struct infer_sampler_params *p,
                         struct infer_sampler **out)
{
    if (vocab == 0 || !(p->temperature >= 0) || !(p->top_p >= 0))
        return -EINVAL;
    struct infer_sampler *s = calloc(1, sizeof *s);
    if (!s)
        return -ENOMEM;
    s->buf = malloc(sizeof *s->buf * vocab);
    if (!s->buf) {
        free(s);
        return -ENOMEM;
    }
    s->vocab = vocab;
    s->p = *p;
    s->rng = p->seed ? p->seed : 0x9e3779b97f4a7c15ull; /* xorshift must not start at 0 */
    *out = s;
    return 0;
}

void infer_sampler_destroy(struct infer_sampler *s)
{
    if (!s)
        return;
    free(s->buf);
    free(s);
}

static uint32_t random_u32(uint64_t *state)
{
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return (uint32_t)((*state * 0x2545F4914F6CDD1Dull) >> 32);
}

static float random_f32(uint64_t *state)
{
    return (float)(random_u32(state) >> 8) / 16777216.0f; /* [0, 1) */
}

static int argmax(const float *x, uint32_t n)
{
    int best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[best])
            best = (int)i;
    return best;
}

static void softmax(float *x, uint32_t n)
{
    float maxv = x[argmax(x, n)];
    float sum = 0.0f;
    for (uint32_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - maxv);
        sum += x[i];
    }
    for (uint32_t i = 0; i < n; i++)
        x[i] /= sum;
}

static int cmp_desc(const void *a, const void *b)
{
    const struct prob_index *x = a, *y = b;
    if (x->prob > y->prob)
        return -1;
    if (x->prob < y->prob)
        return 1;
    return x->index - y->index; /* stable across libc qsort implementations */
}

int infer_sampler_sample(struct infer_sampler *s, float *logits)
{
    uint32_t n = s->vocab;
    if (s->p.temperature == 0.0f)
        return argmax(logits, n);
    for (uint32_t i = 0; i < n; i++)
        logits[i] /= s->p.temperature;
    softmax(logits, n);
    float coin = random_f32(&s->rng);
    int use_topp = s->p.top_p > 0 && s->p.top_p < 1;
    int use_topk = s->p.top_k > 0 && s->p.top_k < n;
    if (!use_topp && !use_topk) {
        float cdf = 0.0f;
        for (uint32_t i = 0; i < n; i++) {
            cdf += logits[i];
            if (coin < cdf)
                return (int)i;
        }
        return (int)n - 1; /* rounding */
    }
    /* sort the candidates by probability, keep the top k and/or the smallest
     * prefix whose mass exceeds top_p, renormalize, and sample from it */
    uint32_t m = 0;
    float cutoff = use_topp ? (1.0f - s->p.top_p) / (float)(n - 1) : 0.0f;
    for (uint32_t i = 0; i < n; i++)
        if (logits[i] >= cutoff)
            s->buf[m++] = (struct prob_index){logits[i], (int)i};
    if (m == 0) {
        /* a near-uniform distribution with a small top_p can leave every
         * probability under the cutoff: the most likely token is the nucleus */
        return argmax(logits, n);
    }
    qsort(s->buf, m, sizeof *s->buf, cmp_desc);
    uint32_t keep = m;
    if (use_topk && keep > s->p.top_k)
        keep = s->p.top_k;
    float mass = 0.0f;
    if (use_topp) {
        for (uint32_t i = 0; i < keep; i++) {
            mass += s->buf[i].prob;
            if (mass > s->p.top_p) {
                keep = i + 1;
                break;
            }
        }
    }
    mass = 0.0f;
    for (uint32_t i = 0; i < keep; i++)
        mass += s->buf[i].prob;
    float r = coin * mass, cdf = 0.0f;
    for (uint32_t i = 0; i < keep; i++) {
        cdf += s->buf[i].prob;
        if (r < cdf)
            return s->buf[i].index;
    }
    return s->buf[keep - 1].index;
}

int infer_sampler_probs(struct infer_sampler *s, const float *logits, float *probs)
{
    uint32_t n = s->vocab;
    if (s->p.temperature == 0.0f) {
        memset(probs, 0, sizeof(float) * n);
        probs[argmax(logits, n)] = 1.0f;
        return 0;
    }
    for (uint32_t i = 0; i < n; i++)
        probs[i] = logits[i] / s->p.temperature;
    softmax(probs, n);
    int use_topp = s->p.top_p > 0 && s->p.top_p < 1;
    int use_topk = s->p.top_k > 0 && s->p.top_k < n;
    if (!use_topp && !use_topk)
        return 0;
    /* the candidates infer_sampler_sample keeps, renormalized; the rest 0 */
    uint32_t m = 0;
    float cutoff = use_topp ? (1.0f - s->p.top_p) / (float)(n - 1) : 0.0f;
    for (uint32_t i = 0; i < n; i++)
        if (probs[i] >= cutoff)
            s->buf[m++] = (struct prob_index){probs[i], (int)i};
    if (m == 0) {
        int best = argmax(probs, n);
        memset(probs, 0, sizeof(float) * n);
        probs[best] = 1.0f;
        return 0;
    }
    qsort(s->buf, m, sizeof *s->buf, cmp_desc);
    uint32_t keep = m;
    if (use_topk && keep > s->p.top_k)
        keep = s->p.top_k;
    if (use_topp) {
        float mass = 0.0f;
        for (uint32_t i = 0; i < keep; i++) {
            mass += s->buf[i].prob;
            if (mass > s->p.top_p) {
                keep = i + 1;
                break;
            }
        }
    }
    float mass = 0.0f;
    for (uint32_t i = 0; i < keep; i++)
        mass += s->buf[i].prob;
    memset(probs, 0, sizeof(float) * n);
    for (uint32_t i = 0; i < keep; i++)
        probs[s->buf[i].index] = s->buf[i].prob / mass;
    return 0;
}

float infer_sampler_uniform(struct infer_sampler *s)
{
    return random_f32(&s->rng);
}

int infer_sampler_is_greedy(const struct infer_sampler *s)
{
    return s->p.temperature == 0.0f;
}

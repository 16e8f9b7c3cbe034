/* spec_accept.c: which rows of a verified draft tree are kept. Greedy: the
 * path of children whose token is the model's argmax (the tokens plain
 * decoding would pick, so the text is the same). Sampling: the
 * multi-candidate recursive rejection rule (SpecInfer; sd.npu's drafts are
 * retrieved, i.e. point masses): at a row with target distribution p, the
 * children c1..ck are tried in order, ci accepted with probability p(ci)
 * (min(1, p/q) with q = 1), and after a rejection p loses ci and is
 * renormalized; if all are rejected the token is drawn from the rest. The
 * token emitted at every row is then distributed exactly as p (a per-path
 * min(1, p/q) over whole paths would bias it). */
#include <errno.h>
#include <string.h>

#include "spec_internal.h"

static int argmax(const float *x, uint32_t n)
{
    int best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[best])
            best = (int)i;
    return best; /* the first of equal maxima, as the sampler's greedy rule */
}

/* Draws from p[vocab] (mass `mass`, not necessarily 1). */
static int draw(struct infer_sampler *smp, const float *p, uint32_t vocab, float mass)
{
    float r = infer_sampler_uniform(smp) * mass, cdf = 0.0f;
    int last = -1;
    for (uint32_t i = 0; i < vocab; i++) {
        if (p[i] <= 0.0f)
            continue;
        cdf += p[i];
        last = (int)i;
        if (r < cdf)
            return (int)i;
    }
    return last; /* rounding */
}

int spec_accept(const struct spec_tree *t, const float *logits, uint32_t vocab,
                struct infer_sampler *smp, float *probs, uint32_t *path, uint32_t *np, int *next)
{
    int greedy = infer_sampler_is_greedy(smp);
    uint32_t at = 0;
    *np = 0;
    path[(*np)++] = 0;
    for (;;) {
        const float *lg = logits + (size_t)at * vocab;
        uint32_t taken = 0;
        if (greedy) {
            int y = argmax(lg, vocab);
            for (uint32_t r = at + 1; r < t->n && !taken; r++)
                if (t->parent[r] == (int32_t)at && t->tok[r] == y)
                    taken = r;
            if (!taken) {
                *next = y;
                return 0;
            }
        } else {
            int ret = infer_sampler_probs(smp, lg, probs);
            if (ret < 0)
                return ret;
            float mass = 1.0f;
            for (uint32_t r = at + 1; r < t->n && !taken; r++) {
                if (t->parent[r] != (int32_t)at)
                    continue;
                float pc = probs[t->tok[r]];
                if (pc <= 0.0f)
                    continue; /* cannot be accepted; p is unchanged */
                if (infer_sampler_uniform(smp) * mass < pc) {
                    taken = r;
                } else {
                    mass -= pc;
                    probs[t->tok[r]] = 0.0f;
                }
            }
            if (!taken) {
                if (!(mass > 0.0f)) { /* rounding left nothing: renormalize what is */
                    mass = 0.0f;
                    for (uint32_t i = 0; i < vocab; i++)
                        mass += probs[i];
                }
                int y = mass > 0.0f ? draw(smp, probs, vocab, mass) : -1;
                if (y < 0)
                    return -EDOM;
                *next = y;
                return 0;
            }
        }
        path[(*np)++] = taken;
        at = taken;
    }
}

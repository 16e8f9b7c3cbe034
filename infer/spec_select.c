/* spec_select.c: choosing among an index's matches of the context's last g
 * tokens. A match whose agreement with the context runs further back than
 * g tokens (its extent) is likelier to continue as the context will: the
 * matches are gathered (up to `gather`, newest first), those with nothing
 * after them or already drafted from are dropped, and the best `take` are
 * kept, longest extent first, newest first within an extent. */
#include "spec_internal.h"

struct gathering {
    struct spec_cand *c;
    uint32_t n, cap;
    const uint32_t *used;
    uint32_t n_used;
};

static int gather_one(void *ctx, const struct spec_index *ix, uint32_t end)
{
    struct gathering *g = ctx;
    if (end + 1 >= ix->n || ix->tok[end + 1] < 0)
        return 0; /* nothing follows: the context's own tail, or a segment's end */
    for (uint32_t i = 0; i < g->n_used; i++)
        if (g->used[i] == end)
            return 0;
    g->c[g->n++] = (struct spec_cand){.end = end};
    return g->n >= g->cap;
}

uint32_t spec_match_extent(const struct spec_index *ix, uint32_t end, const int *q, uint32_t nq)
{
    uint32_t e = 0;
    while (e < SPEC_MAX_EXTENT && e <= end && e < nq && q[nq - 1 - e] >= 0 &&
           ix->tok[end - e] == q[nq - 1 - e])
        e++;
    return e;
}

uint32_t spec_select(const struct spec_index *ix, const int *q, uint32_t nq, uint32_t g,
                     uint32_t gather, uint32_t take, const uint32_t *used, uint32_t n_used,
                     struct spec_cand *out)
{
    struct spec_cand c[SPEC_MAX_GATHER];
    if (gather > SPEC_MAX_GATHER)
        gather = SPEC_MAX_GATHER;
    struct gathering gs = {.c = c, .cap = gather, .used = used, .n_used = n_used};
    if (gather == 0 || take == 0)
        return 0;
    spec_index_match(ix, q, nq, g, UINT32_MAX, gather_one, &gs);
    for (uint32_t i = 0; i < gs.n; i++)
        c[i].ext = spec_match_extent(ix, c[i].end, q, nq);
    /* insertion sort, stable: the index gives them newest first */
    for (uint32_t i = 1; i < gs.n; i++) {
        struct spec_cand x = c[i];
        uint32_t j = i;
        while (j > 0 && c[j - 1].ext < x.ext) {
            c[j] = c[j - 1];
            j--;
        }
        c[j] = x;
    }
    uint32_t n = gs.n < take ? gs.n : take;
    for (uint32_t i = 0; i < n; i++)
        out[i] = c[i];
    return n;
}

/* spec_tree.c: the draft tree (a trie of candidate continuations under the
 * root token) and draft reuse (paper 3.4). Candidates arrive best first
 * (longest match first); each adds the rows its path lacks while the
 * verification shape has room, so shared prefixes cost one row. */
#include <string.h>

#include "spec_internal.h"

void spec_tree_reset(struct spec_tree *t, int root, uint32_t pos0)
{
    t->n = 1;
    t->tok[0] = root;
    t->parent[0] = -1;
    t->pos[0] = pos0;
    t->depth[0] = 0;
    t->src[0] = SPEC_SRC_CONTEXT;
    t->order[0] = 0;
    t->p[0] = 1.0f;
    t->sum_p = 0.0f;
}

uint32_t spec_tree_add(struct spec_tree *t, const int *c, uint32_t n, uint32_t max_rows,
                       enum spec_src src)
{
    return spec_tree_add_p(t, c, n, max_rows, src, 0, 1.0f, 1.0f, 0.0f);
}

uint32_t spec_tree_add_p(struct spec_tree *t, const int *c, uint32_t n, uint32_t max_rows,
                         enum spec_src src, uint32_t order, float a_first, float a_next,
                         float alpha)
{
    if (max_rows > SPEC_MAX_ROWS)
        max_rows = SPEC_MAX_ROWS;
    uint32_t at = 0, added = 0;
    for (uint32_t k = 0; k < n; k++) {
        if (c[k] < 0)
            break;
        uint32_t child = 0;
        for (uint32_t r = at + 1; r < t->n; r++)
            if (t->parent[r] == (int32_t)at && t->tok[r] == c[k]) {
                child = r;
                break;
            }
        if (!child) {
            if (t->n >= max_rows)
                break;
            float left = t->p[at];
            for (uint32_t r = at + 1; r < t->n; r++)
                if (t->parent[r] == (int32_t)at)
                    left -= t->p[r];
            float p = (left > 0 ? left : 0) * (k == 0 ? a_first : a_next);
            float rate = (1.0f + t->sum_p) / (1.0f + alpha * (float)(t->n - 1));
            if (alpha > 0 && p <= alpha * rate)
                break; /* costs more than it is expected to bring */
            child = t->n++;
            t->p[child] = p;
            t->sum_p += p;
            t->order[child] = (uint8_t)order;
            t->later[child] = k > 0;
            t->tok[child] = c[k];
            t->parent[child] = (int32_t)at;
            t->pos[child] = t->pos[at] + 1;
            t->depth[child] = (uint8_t)(t->depth[at] + 1);
            t->src[child] = (uint8_t)src;
            added++;
        }
        at = child;
    }
    return added;
}

void spec_reuse_update(struct spec_reuse *r, const int *x, const int *y, uint32_t nx, uint32_t e)
{
    uint32_t best_a = 0, best_n = 0;
    for (uint32_t i = e + 1; i < nx;) {
        if (x[i] != y[i]) {
            i++;
            continue;
        }
        uint32_t a = i;
        while (i < nx && x[i] == y[i])
            i++;
        if (i - a > best_n) {
            best_n = i - a;
            best_a = a;
        }
    }
    if (best_n == 0)
        return; /* the redundant case: nothing to keep (a previous segment stays) */
    if (best_n > SPEC_REUSE_MAX)
        best_n = SPEC_REUSE_MAX;
    memcpy(r->seg, x + best_a, sizeof(int) * best_n);
    r->n = best_n;
    r->rounds = 0;
    r->offered = 0;
}

uint32_t spec_reuse_offer(struct spec_reuse *r, int last, uint32_t threshold, const int **c)
{
    if (r->n == 0)
        return 0;
    if (r->rounds >= 1 && r->offered > threshold) {
        r->n = 0; /* kept its round, and past the length threshold: dropped */
        return 0;
    }
    uint32_t from = 0;
    for (uint32_t i = r->n; i-- > 0;)
        if (r->seg[i] == last) {
            from = i + 1;
            break;
        }
    if (from >= r->n) {
        r->n = 0; /* the whole segment was taken */
        return 0;
    }
    r->rounds++;
    r->offered += r->n - from;
    *c = r->seg + from;
    return r->n - from;
}

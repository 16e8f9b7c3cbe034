/* spec_index.c: an append-only token array indexed by its n-grams (orders
 * 1..SPEC_MAX_ORDER): per order, a hash table of chains through every
 * position where an n-gram of that order ends, newest first. Retrieval asks
 * where the context's last g tokens occurred before; what follows there is
 * a draft. -1 separates segments: no n-gram spans it. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "spec_internal.h"

static uint32_t gram_hash(const int *t, uint32_t g)
{
    uint64_t h = 0x9e3779b97f4a7c15ull ^ g;
    for (uint32_t i = 0; i < g; i++) {
        h ^= (uint32_t)t[i];
        h *= 0xff51afd7ed558ccdull;
        h ^= h >> 29;
    }
    return (uint32_t)(h >> 32);
}

/* 1 with its bucket if a g-gram ends at position i (no separator in it). */
static int gram_bucket(const struct spec_index *ix, uint32_t i, uint32_t g, uint32_t *bucket)
{
    if (i + 1 < g)
        return 0;
    const int *w = ix->tok + i + 1 - g;
    for (uint32_t j = 0; j < g; j++)
        if (w[j] < 0)
            return 0;
    *bucket = gram_hash(w, g) & ix->mask;
    return 1;
}

int spec_index_init(struct spec_index *ix, uint32_t cap_hint)
{
    memset(ix, 0, sizeof *ix);
    uint32_t buckets = 1024;
    while (buckets < cap_hint && buckets < (1u << 20))
        buckets <<= 1;
    ix->mask = buckets - 1;
    for (int g = 0; g < SPEC_MAX_ORDER; g++) {
        ix->head[g] = calloc(buckets, sizeof(uint32_t));
        if (!ix->head[g]) {
            spec_index_free(ix);
            return -ENOMEM;
        }
    }
    return 0;
}

void spec_index_free(struct spec_index *ix)
{
    free(ix->tok);
    for (int g = 0; g < SPEC_MAX_ORDER; g++) {
        free(ix->next[g]);
        free(ix->head[g]);
    }
    memset(ix, 0, sizeof *ix);
}

static int grow(struct spec_index *ix, uint32_t need)
{
    if (need <= ix->cap)
        return 0;
    uint32_t cap = ix->cap ? ix->cap : 256;
    while (cap < need) {
        if (cap > UINT32_MAX / 2)
            return -ENOMEM;
        cap *= 2;
    }
    int *t = realloc(ix->tok, sizeof(int) * cap);
    if (!t)
        return -ENOMEM;
    ix->tok = t;
    for (int g = 0; g < SPEC_MAX_ORDER; g++) {
        uint32_t *nx = realloc(ix->next[g], sizeof(uint32_t) * cap);
        if (!nx)
            return -ENOMEM;
        ix->next[g] = nx;
    }
    ix->cap = cap;
    return 0;
}

int spec_index_append(struct spec_index *ix, const int *t, uint32_t n)
{
    if (n > UINT32_MAX - ix->n || grow(ix, ix->n + n) < 0)
        return -ENOMEM;
    for (uint32_t k = 0; k < n; k++) {
        uint32_t i = ix->n++;
        ix->tok[i] = t[k];
        for (uint32_t g = 1; g <= SPEC_MAX_ORDER; g++) {
            uint32_t b;
            ix->next[g - 1][i] = 0;
            if (!gram_bucket(ix, i, g, &b))
                continue;
            ix->next[g - 1][i] = ix->head[g - 1][b];
            ix->head[g - 1][b] = i + 1;
        }
    }
    return 0;
}

void spec_index_truncate(struct spec_index *ix, uint32_t n)
{
    /* newest first: each dropped position heads its chain when it goes,
     * so the head falls back to the position appended before it */
    while (ix->n > n) {
        uint32_t i = --ix->n;
        for (uint32_t g = 1; g <= SPEC_MAX_ORDER; g++) {
            uint32_t b;
            if (gram_bucket(ix, i, g, &b) && ix->head[g - 1][b] == i + 1)
                ix->head[g - 1][b] = ix->next[g - 1][i];
        }
    }
}

void spec_index_match(const struct spec_index *ix, const int *q, uint32_t nq, uint32_t g,
                      uint32_t limit, spec_match_fn fn, void *ctx)
{
    if (g == 0 || g > SPEC_MAX_ORDER || g > nq)
        return;
    const int *w = q + nq - g;
    for (uint32_t j = 0; j < g; j++)
        if (w[j] < 0)
            return;
    uint32_t b = gram_hash(w, g) & ix->mask;
    uint32_t calls = 0, steps = 0;
    for (uint32_t e = ix->head[g - 1][b]; e && calls < limit && steps < 4096;
         e = ix->next[g - 1][e - 1], steps++) {
        uint32_t end = e - 1;
        if (memcmp(ix->tok + end + 1 - g, w, sizeof(int) * g) != 0)
            continue; /* a hash collision */
        calls++;
        if (fn(ctx, ix, end))
            return;
    }
}

/* topk_ref.c: the sorting top-k of topk_ref.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>

#include <cmocka.h>

#include "topk_ref.h"

struct pair {
    float v;
    uint32_t i;
};

static int cmp_pair(const void *a, const void *b)
{
    const struct pair *x = a, *y = b;
    if (x->v != y->v)
        return x->v > y->v ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i;
}

int topk_ref_cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

void topk_ref_sort(const float *s, uint32_t n, uint32_t k, uint32_t *out)
{
    struct pair *p = malloc(sizeof *p * (n ? n : 1));
    assert_non_null(p);
    for (uint32_t i = 0; i < n; i++)
        p[i] = (struct pair){s[i], i};
    qsort(p, n, sizeof *p, cmp_pair);
    for (uint32_t j = 0; j < k; j++)
        out[j] = p[j].i;
    qsort(out, k, sizeof *out, topk_ref_cmp_u32);
    free(p);
}

/* tools_stats.c: see tools_stats.h. */
#include "tools_stats.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* A sorted copy of v[0..n), n > 0, ascending (NaNs are not expected); NULL
 * when out of memory. */
static double *sorted_copy(const double *v, size_t n)
{
    if (n > SIZE_MAX / sizeof *v)
        return NULL;
    double *s = malloc(n * sizeof *v);
    if (!s)
        return NULL;
    memcpy(s, v, n * sizeof *v);
    qsort(s, n, sizeof *s, cmp_double);
    return s;
}

int tools_stats_compute(const double *v, size_t n, struct tools_stats *st)
{
    memset(st, 0, sizeof *st);
    if (n == 0)
        return 0;
    double *s = sorted_copy(v, n);
    if (!s)
        return -ENOMEM;
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += s[i];
    st->n = n;
    st->min = s[0];
    st->max = s[n - 1];
    st->median = s[n / 2];
    st->mean = sum / (double)n;
    free(s);
    return 0;
}

int tools_stats_percentile(const double *v, size_t n, double p, double *out)
{
    *out = 0;
    if (!(p >= 0 && p <= 1))
        return -EINVAL;
    if (n == 0)
        return 0;
    double *s = sorted_copy(v, n);
    if (!s)
        return -ENOMEM;
    *out = s[(size_t)((double)(n - 1) * p)];
    free(s);
    return 0;
}

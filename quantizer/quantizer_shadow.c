/* quantizer_shadow.c: calibration of shadow outlier execution (llm.npu 3.3)
 * for one linear layer, after smoothing: on the calibration sample of its
 * input (divided by the smoothing scales), the activation scale that covers
 * the bulk (the shadow_quantile-th quantile of |x|, / 127), the outliers it
 * leaves (|x| / s > 127) per input channel, the hot channels (the fewest,
 * most frequent first, that hold shadow_cover of the outliers, at most
 * shadow_hot_max of the channels: their columns are stored), and the
 * layer's importance (the largest activation over the bulk scale, the
 * paper's measure). A linear below shadow_min_importance is pruned: it keeps
 * its maximum-based scale and no shadow work. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quantizer_internal.h"

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

struct chan_count {
    uint64_t n;
    uint32_t c;
};

static int cmp_count_desc(const void *a, const void *b)
{
    const struct chan_count *x = a, *y = b;
    if (x->n != y->n)
        return x->n > y->n ? -1 : 1;
    return x->c < y->c ? -1 : x->c > y->c;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

int quantizer_shadow_calibrate(const struct quantizer_shadow_in *in, struct format_shadow_linear *e,
                               float *act_out)
{
    const struct quantizer_opts *o = in->opts;
    uint32_t rows = in->rows, cols = in->cols, ns = in->n_sample;
    memset(e, 0, sizeof *e);
    e->layer = in->layer;
    e->role = in->role;
    e->rows = rows;
    e->cols = cols;
    e->act_max = in->act_max;
    *act_out = in->act_max;
    size_t n = (size_t)ns * cols;
    if (!(in->act_max > 0) || n == 0)
        return 0; /* dynamic or no sample: nothing to calibrate, pruned */
    float *a = malloc(sizeof(float) * n);
    struct chan_count *cnt = calloc(cols, sizeof *cnt);
    if (!a || !cnt) {
        free(a);
        free(cnt);
        return -ENOMEM;
    }
    float amax = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t c = (uint32_t)(i % cols);
        float v = fabsf(in->x[i] / (in->s ? in->s[c] : 1.0f));
        a[i] = v;
        amax = v > amax ? v : amax;
    }
    qsort(a, n, sizeof(float), cmp_float);
    size_t k = (size_t)floor(o->shadow_quantile * (double)(n - 1));
    float bulk = a[k] / 127.0f;
    free(a);
    /* the largest activation: the calibration maximum (all rows seen) */
    float top = in->act_max * 127.0f > amax ? in->act_max * 127.0f : amax;
    if (!(bulk > 0) || bulk >= in->act_max) {
        free(cnt);
        return 0; /* nothing beyond the bulk: no shadow */
    }
    uint64_t total = 0;
    for (uint32_t c = 0; c < cols; c++)
        cnt[c].c = c;
    for (size_t i = 0; i < n; i++) {
        uint32_t c = (uint32_t)(i % cols);
        float v = in->x[i] / (in->s ? in->s[c] : 1.0f);
        float q = v * (1.0f / bulk);
        if (q > 127.0f || q < -127.0f) {
            cnt[c].n++;
            total++;
        }
    }
    e->importance = top / (bulk * 127.0f);
    e->calib_rate = (float)((double)total / (double)n);
    if (e->importance < o->shadow_min_importance || total == 0) {
        free(cnt);
        return 0; /* pruned: keeps the maximum-based scale */
    }
    qsort(cnt, cols, sizeof *cnt, cmp_count_desc);
    uint32_t nh = 0;
    uint64_t covered = 0;
    uint32_t cap = o->shadow_hot_max > 0 ? (uint32_t)ceil(o->shadow_hot_max * cols) : cols;
    while (nh < cap && cnt[nh].n > 0 && (double)covered < o->shadow_cover * (double)total)
        covered += cnt[nh++].n;
    e->hot = malloc(sizeof(uint32_t) * (nh ? nh : 1));
    e->w = malloc((size_t)rows * nh + 1);
    if (!e->hot || !e->w) {
        free(cnt);
        free(e->hot);
        free(e->w);
        e->hot = NULL;
        e->w = NULL;
        return -ENOMEM;
    }
    for (uint32_t j = 0; j < nh; j++)
        e->hot[j] = cnt[j].c;
    free(cnt);
    qsort(e->hot, nh, sizeof(uint32_t), cmp_u32);
    for (uint32_t j = 0; j < nh; j++)
        for (uint32_t r = 0; r < rows; r++)
            e->w[(size_t)j * rows + r] = in->codes[(size_t)r * cols + e->hot[j]];
    e->n_hot = nh;
    e->flags = FORMAT_SHADOW_ON;
    *act_out = bulk;
    return 0;
}

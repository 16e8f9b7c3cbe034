/* format_shadow.c: the `shadow.linears` metadata value (docs/FORMAT.md,
 * "Shadow outlier execution"): per linear layer its shadow calibration and
 * the int8 codes of its hot input channels, input-major. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "format.h"

#define ENTRY_FIXED 36 /* layer, role, flags, act_max, importance, rate, rows, cols, n_hot */

static uint64_t entry_bytes(uint64_t rows, uint64_t n_hot)
{
    uint64_t b = ENTRY_FIXED + 4 * n_hot + rows * n_hot;
    return (b + 3) & ~(uint64_t)3;
}

int format_shadow_encode(const struct format_shadow_linear *e, uint32_t n, void **out,
                         size_t *out_len)
{
    uint64_t len = 4;
    for (uint32_t i = 0; i < n; i++)
        len += entry_bytes(e[i].rows, e[i].n_hot);
    uint8_t *b = calloc(1, (size_t)len);
    if (!b)
        return -ENOMEM;
    uint8_t *p = b;
    sl_store_le32(p, n);
    p += 4;
    for (uint32_t i = 0; i < n; i++) {
        const struct format_shadow_linear *s = &e[i];
        uint8_t *start = p;
        sl_store_le32(p, (uint32_t)s->layer);
        sl_store_le32(p + 4, s->role);
        sl_store_le32(p + 8, s->flags);
        sl_store_lef32(p + 12, s->act_max);
        sl_store_lef32(p + 16, s->importance);
        sl_store_lef32(p + 20, s->calib_rate);
        sl_store_le32(p + 24, s->rows);
        sl_store_le32(p + 28, s->cols);
        sl_store_le32(p + 32, s->n_hot);
        p += ENTRY_FIXED;
        for (uint32_t k = 0; k < s->n_hot; k++, p += 4)
            sl_store_le32(p, s->hot[k]);
        if (s->n_hot) /* a pruned entry has no columns (and w may be NULL) */
            memcpy(p, s->w, (size_t)s->rows * s->n_hot);
        p = start + entry_bytes(s->rows, s->n_hot);
    }
    *out = b;
    *out_len = (size_t)len;
    return 0;
}

void format_shadow_free(struct format_shadow_linear *e, uint32_t n)
{
    for (uint32_t i = 0; e && i < n; i++) {
        free(e[i].hot);
        free(e[i].w);
    }
    free(e);
}

/* One entry at p (avail bytes) into *s (its arrays allocated); the bytes
 * it took in *used. */
static int parse_one(const struct format_config *cfg, const uint8_t *p, uint64_t avail,
                     uint32_t i, struct format_shadow_linear *s, uint64_t *used,
                     struct sl_err *err)
{
    if (avail < ENTRY_FIXED) {
        sl_err_set(err, "shadow.linears: entry %u is truncated", i);
        return -EINVAL;
    }
    s->layer = (int32_t)sl_load_le32(p);
    s->role = sl_load_le32(p + 4);
    s->flags = sl_load_le32(p + 8);
    s->act_max = sl_load_lef32(p + 12);
    s->importance = sl_load_lef32(p + 16);
    s->calib_rate = sl_load_lef32(p + 20);
    s->rows = sl_load_le32(p + 24);
    s->cols = sl_load_le32(p + 28);
    s->n_hot = sl_load_le32(p + 32);
    uint32_t nd;
    uint64_t shape[2] = {0, 0};
    uint32_t role = s->role == FORMAT_ROLE_CLASSIFIER && cfg->tied_embedding ? FORMAT_ROLE_TOK_EMBD
                                                                             : s->role;
    int ok_role = s->role < FORMAT_ROLE_COUNT && format_role_is_linear((enum format_role)s->role) &&
                  format_role_shape(cfg, role, &nd, shape) == 0;
    int ok_layer = s->role == FORMAT_ROLE_CLASSIFIER ? s->layer == -1
                                                     : s->layer >= 0 &&
                                                           (uint32_t)s->layer < cfg->n_layers;
    if (!ok_role || !ok_layer || shape[0] != s->rows || shape[1] != s->cols) {
        sl_err_set(err,
                   "shadow.linears: entry %u (layer %d, role %u, %u x %u) names no linear layer "
                   "of this model",
                   i, s->layer, s->role, s->rows, s->cols);
        return -EINVAL;
    }
    if (s->n_hot > s->cols || (s->flags & ~(uint32_t)FORMAT_SHADOW_ON) ||
        !format_act_scale_valid(s->act_max) || !(s->importance >= 0) ||
        !isfinite(s->importance) || !(s->calib_rate >= 0 && s->calib_rate <= 1)) {
        sl_err_set(err,
                   "shadow.linears: entry %u (layer %d %s) has %u hot channels of %u, flags %u, "
                   "scale %g, importance %g, outlier rate %g: out of range",
                   i, s->layer, format_role_name((enum format_role)s->role), s->n_hot, s->cols,
                   s->flags, (double)s->act_max, (double)s->importance, (double)s->calib_rate);
        return -EINVAL;
    }
    uint64_t need = entry_bytes(s->rows, s->n_hot);
    if (need > avail) {
        sl_err_set(err, "shadow.linears: entry %u is truncated (%" PRIu64 " bytes of %" PRIu64 ")",
                   i, avail, need);
        return -EINVAL;
    }
    s->hot = malloc(sizeof(uint32_t) * (s->n_hot ? s->n_hot : 1));
    s->w = malloc((size_t)s->rows * s->n_hot + 1);
    if (!s->hot || !s->w)
        return -ENOMEM;
    const uint8_t *h = p + ENTRY_FIXED;
    for (uint32_t k = 0; k < s->n_hot; k++) {
        s->hot[k] = sl_load_le32(h + 4 * k);
        if (s->hot[k] >= s->cols || (k && s->hot[k] <= s->hot[k - 1])) {
            sl_err_set(err,
                       "shadow.linears: entry %u: hot channel %u is %u (channels must ascend "
                       "below %u)",
                       i, k, s->hot[k], s->cols);
            return -EINVAL;
        }
    }
    const int8_t *w = (const int8_t *)(h + 4 * (uint64_t)s->n_hot);
    for (uint64_t k = 0; k < (uint64_t)s->rows * s->n_hot; k++)
        if (w[k] == -128) {
            sl_err_set(err, "shadow.linears: entry %u holds the code -128", i);
            return -EINVAL;
        }
    memcpy(s->w, w, (size_t)s->rows * s->n_hot);
    *used = need;
    return 0;
}

int format_shadow_parse(const struct format_config *cfg, const void *data, size_t len,
                        struct format_shadow_linear **out, uint32_t *n, struct sl_err *err)
{
    const uint8_t *p = data;
    *out = NULL;
    *n = 0;
    if (len < 4) {
        sl_err_set(err, "shadow.linears: %zu bytes, too short for its count", len);
        return -EINVAL;
    }
    uint32_t count = sl_load_le32(p);
    uint32_t max = (cfg->n_layers + 1) * FORMAT_ROLE_COUNT;
    if (count > max) {
        sl_err_set(err, "shadow.linears: %u entries, more than the model's %u linear layers", count,
                   max);
        return -EINVAL;
    }
    struct format_shadow_linear *e = calloc(count ? count : 1, sizeof *e);
    if (!e)
        return -ENOMEM;
    uint64_t off = 4;
    int ret = 0;
    for (uint32_t i = 0; i < count && ret == 0; i++) {
        uint64_t used = 0;
        ret = parse_one(cfg, p + off, len - off, i, &e[i], &used, err);
        if (ret == -ENOMEM)
            sl_err_set(err, "shadow.linears: out of memory");
        off += used;
        for (uint32_t j = 0; ret == 0 && j < i; j++)
            if (e[j].layer == e[i].layer && e[j].role == e[i].role) {
                sl_err_set(err, "shadow.linears: layer %d %s appears twice", e[i].layer,
                           format_role_name((enum format_role)e[i].role));
                ret = -EINVAL;
            }
    }
    if (ret == 0 && off != len) {
        sl_err_set(err, "shadow.linears: %zu trailing bytes", (size_t)(len - off));
        ret = -EINVAL;
    }
    if (ret < 0) {
        format_shadow_free(e, count);
        return ret;
    }
    *out = e;
    *n = count;
    return 0;
}

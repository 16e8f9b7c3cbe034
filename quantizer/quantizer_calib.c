/* quantizer_calib.c: calibration statistics of every linear layer, fed by
 * the runtime's observer (the tool wires it; the quantizer does not link the
 * runtime): per input channel max|x| (S_I), per output channel max|y| (S_O),
 * and a bounded, deterministic reservoir sample of input rows for the
 * smoothing search. Layers that share an input (Q/K/V; gate/up) are recorded
 * once, under the first of them.
 *
 * Held-out sample: the input rows are split by parity (of their index in the
 * calibration stream). in_max covers all rows; in_max_fit only the even ones;
 * the sample is drawn from the odd ones only. The smoothing search can then
 * fit its scales on in_max_fit and measure the error on rows that did not set
 * them, as the final model meets text that did not set its static scales. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quantizer_internal.h"

static int slot_of(const struct format_config *c, int layer, uint32_t role)
{
    if (role == FORMAT_ROLE_CLASSIFIER)
        return (int)c->n_layers * FORMAT_ROLE_COUNT;
    if (layer < 0 || (uint32_t)layer >= c->n_layers || !format_role_is_linear(role))
        return -1;
    return layer * FORMAT_ROLE_COUNT + (int)role;
}

int quantizer_calib_create(const struct format_config *cfg, uint32_t sample_rows,
                           struct quantizer_calib **out)
{
    if (!cfg || !out || cfg->n_layers == 0 || cfg->n_layers > 4096)
        return -EINVAL;
    struct quantizer_calib *c = calloc(1, sizeof *c);
    if (!c)
        return -ENOMEM;
    c->cfg = *cfg;
    c->sample_rows = sample_rows;
    c->n_slots = cfg->n_layers * FORMAT_ROLE_COUNT + 1;
    c->slots = calloc(c->n_slots, sizeof *c->slots);
    if (!c->slots) {
        free(c);
        return -ENOMEM;
    }
    c->rng = 0x5eed5eed5eed5eedull;
    *out = c;
    return 0;
}

void quantizer_calib_destroy(struct quantizer_calib *c)
{
    if (!c)
        return;
    for (uint32_t i = 0; i < c->n_slots; i++) {
        free(c->slots[i].in_max);
        free(c->slots[i].in_max_fit);
        free(c->slots[i].out_max);
        free(c->slots[i].sample);
    }
    free(c->slots);
    free(c);
}

const struct quantizer_calib_slot *quantizer_calib_slot(const struct quantizer_calib *c, int layer,
                                                        uint32_t role)
{
    int s = slot_of(&c->cfg, layer, role);
    return s < 0 ? NULL : &c->slots[s];
}

static uint64_t next_rand(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* max(m, |v|), keeping a NaN once seen (fmaxf would drop it) so that
 * quantizer_calib_check reports it instead of the statistics hiding it. */
static float stat_max(float m, float v)
{
    float a = fabsf(v);
    return isnan(m) ? m : (a > m || isnan(a)) ? a : m;
}

static int slot_init(struct quantizer_calib *c, struct quantizer_calib_slot *sl, int keep_inputs,
                     uint32_t in_cols, uint32_t out_cols)
{
    sl->in_cols = in_cols;
    sl->out_cols = out_cols;
    sl->out_max = calloc(out_cols, sizeof(float));
    if (!sl->out_max)
        return -ENOMEM;
    if (!keep_inputs)
        return 0;
    sl->in_max = calloc(in_cols, sizeof(float));
    sl->in_max_fit = calloc(in_cols, sizeof(float));
    sl->sample = calloc((size_t)c->sample_rows * in_cols + 1, sizeof(float));
    return sl->in_max && sl->in_max_fit && sl->sample ? 0 : -ENOMEM;
}

void quantizer_calib_observe(void *ctx, int layer, uint32_t role, const float *x, uint32_t rows,
                             uint32_t in_cols, const float *y, uint32_t out_cols)
{
    struct quantizer_calib *c = ctx;
    int s = slot_of(&c->cfg, layer, role);
    if (s < 0 || c->failed)
        return;
    struct quantizer_calib_slot *sl = &c->slots[s];
    /* Only the first role of a shared-input group keeps the input statistics
     * and samples (Q/K/V see one input, gate/up another); every role keeps
     * its output maxima. */
    int keep_inputs =
        !(role == FORMAT_ROLE_WK || role == FORMAT_ROLE_WV || role == FORMAT_ROLE_W_UP);
    if (!sl->out_max && slot_init(c, sl, keep_inputs, in_cols, out_cols) < 0) {
        c->failed = 1;
        return;
    }
    if (sl->in_cols != in_cols || sl->out_cols != out_cols) {
        c->failed = 1;
        return;
    }
    for (uint32_t r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * in_cols;
        const float *yr = y + (size_t)r * out_cols;
        for (uint32_t j = 0; j < out_cols; j++)
            sl->out_max[j] = stat_max(sl->out_max[j], yr[j]);
        if (!keep_inputs)
            continue;
        for (uint32_t j = 0; j < in_cols; j++)
            sl->in_max[j] = stat_max(sl->in_max[j], xr[j]);
        uint64_t row = sl->rows_seen++;
        if (row % 2 == 0) { /* fitting half */
            for (uint32_t j = 0; j < in_cols; j++)
                sl->in_max_fit[j] = stat_max(sl->in_max_fit[j], xr[j]);
            continue;
        }
        /* held-out half: reservoir sampling (Algorithm R) */
        uint64_t seen = row / 2;
        uint64_t slot = seen < c->sample_rows ? seen : next_rand(&c->rng) % (seen + 1);
        if (slot < c->sample_rows) {
            memcpy(sl->sample + slot * in_cols, xr, sizeof(float) * in_cols);
            if (seen < c->sample_rows)
                sl->n_sample++;
        }
    }
}

/* -EINVAL naming the slot's layer and role if v[0..n) holds a NaN, an
 * infinity or a negative number. */
static int check_stats(const struct quantizer_calib *c, uint32_t slot, const char *what,
                       const float *v, uint32_t n, struct sl_err *err)
{
    for (uint32_t j = 0; v && j < n; j++) {
        if (v[j] >= 0 && isfinite(v[j]))
            continue;
        int layer = slot == c->n_slots - 1 ? -1 : (int)(slot / FORMAT_ROLE_COUNT);
        uint32_t role = layer < 0 ? FORMAT_ROLE_CLASSIFIER : slot % FORMAT_ROLE_COUNT;
        char where[64];
        quantizer_layer_name(layer, role, where, sizeof where);
        sl_err_set(err,
                   "calibration statistics of %s: %s channel %u has maximum %g; the float "
                   "model's activations are not finite on the calibration text",
                   where, what, j, (double)v[j]);
        return -EINVAL;
    }
    return 0;
}

int quantizer_calib_check(const struct quantizer_calib *c, struct sl_err *err)
{
    for (uint32_t i = 0; i < c->n_slots; i++) {
        const struct quantizer_calib_slot *sl = &c->slots[i];
        int ret = check_stats(c, i, "input", sl->in_max, sl->in_cols, err);
        if (ret == 0)
            ret = check_stats(c, i, "input", sl->in_max_fit, sl->in_cols, err);
        if (ret == 0)
            ret = check_stats(c, i, "output", sl->out_max, sl->out_cols, err);
        if (ret < 0)
            return ret;
    }
    return 0;
}

int quantizer_calib_ok(const struct quantizer_calib *c)
{
    return !c->failed;
}

uint64_t quantizer_calib_rows(const struct quantizer_calib *c)
{
    const struct quantizer_calib_slot *s = quantizer_calib_slot(c, 0, FORMAT_ROLE_WQ);
    return s ? s->rows_seen : 0;
}

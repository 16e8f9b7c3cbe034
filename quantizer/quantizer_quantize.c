/* quantizer_quantize.c: the quantization driver (EdgeFlow 4.1 and the
 * baselines it is compared with). Two passes over the float source, one
 * layer of float weights in memory at a time:
 *   1. smoothing: choose each group's input scaling (edgeflow: alpha by grid
 *      search; smoothquant: its migration formula at alpha 0.5; uniform,
 *      cmpq: none) and, for a global budget, record every channel's RE
 *      curve of the smoothed weights and allocate once over the model;
 *   2. fold the scalings, allocate per tensor (or take the global widths),
 *      quantize, pack, write in execution order (atomically).
 * Norm weights stay float with the smoothing folded in; every linear layer
 * (and the token embedding) is stored in a packed encoding.
 *
 * Methods, precisely:
 *   edgeflow     smoothing s = S_I^alpha per group (alpha searched on
 *                calibration rows), widths by the RE greedy allocation on
 *                W diag(s), static per-tensor activation scales of x / s.
 *   uniform      every channel b bits, no smoothing.
 *   smoothquant  SmoothQuant's s_j = max|X_j|^0.5 / max|W_j|^0.5 per group,
 *                every channel b bits.
 *   cmpq         CMPQ (Chen et al. 2024) allocates precision per *input*
 *                channel by the calibration activation magnitude; as in
 *                EdgeFlow 5.4.1 the allocation is moved to output channels
 *                and its metric replaced by RE: a channel's RE is weighted
 *                by its output activation magnitude S_O^2 (the energy the
 *                channel's error lands on), greedy under the same budget,
 *                no smoothing. CMPQ's non-uniform codebooks and outlier
 *                extraction are not NPU-executable and are left out.
 * All methods share the per-channel quantizer (clipping rule), the packed
 * storage and the activation handling, so they differ only in the above.
 *
 * Embedding: an untied embedding is quantized like a linear layer (same
 * allocation, no activation scale; it is only looked up). A tied embedding is
 * the classifier: quantized with the classifier's static activation scale and
 * never smoothed (scaling its columns would change the lookups; untying it
 * would double its bytes). An untied classifier is smoothed into the output
 * norm like Q/K/V into the attention norm. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quantizer_driver.h"

/* The clipping rule QUANTIZER_CLIP_DEFAULT stands for (measured:
 * docs/BENCHMARKS-accuracy.md). */
#define CLIP_DEFAULT QUANTIZER_CLIP_MSE

static const char *const method_names[QUANTIZER_METHOD_COUNT] = {"edgeflow", "uniform",
                                                                 "smoothquant", "cmpq"};

const char *quantizer_method_name(enum quantizer_method m)
{
    return (unsigned)m < QUANTIZER_METHOD_COUNT ? method_names[m] : "unknown";
}

int quantizer_method_parse(const char *s, enum quantizer_method *out)
{
    for (int i = 0; i < QUANTIZER_METHOD_COUNT; i++)
        if (!strcmp(s, method_names[i])) {
            *out = (enum quantizer_method)i;
            return 0;
        }
    return -EINVAL;
}

/* ---- entry --------------------------------------------------------------------------------- */

static int check_opts(const struct quantizer_opts *o, struct sl_err *err)
{
    if (!(o->bits >= 1 && o->bits <= 8)) {
        sl_err_set(err, "bits must be within 1..8 (got %g)", o->bits);
        return -EINVAL;
    }
    if ((unsigned)o->method >= QUANTIZER_METHOD_COUNT) {
        sl_err_set(err, "unknown method %d", (int)o->method);
        return -EINVAL;
    }
    if (!qd_uses_allocation(o) && o->bits != floor(o->bits)) {
        sl_err_set(err,
                   "%s stores every channel at the same width: bits must be an integer "
                   "(got %g)",
                   o->uniform_widths ? "uniform_widths" : quantizer_method_name(o->method),
                   o->bits);
        return -EINVAL;
    }
    if (o->alpha > 1 || isnan(o->alpha)) {
        sl_err_set(err, "alpha must be within [0, 1] (got %g)", o->alpha);
        return -EINVAL;
    }
    if (o->encoding != 0 && o->encoding != FORMAT_ENC_ADAPTIVE &&
        o->encoding != FORMAT_ENC_INT4INT8 && o->encoding != FORMAT_ENC_BITPLANE) {
        sl_err_set(err, "unsupported output encoding %u (adaptive, int4int8 or bitplane)",
                   o->encoding);
        return -EINVAL;
    }
    if (o->block_mult && (!o->gptq || (o->encoding != 0 && o->encoding != FORMAT_ENC_ADAPTIVE))) {
        sl_err_set(err, "block multipliers need gptq and the adaptive encoding");
        return -EINVAL;
    }
    if (o->shadow && (o->act_dynamic || o->float_out || !(o->shadow_quantile > 0) ||
                      !(o->shadow_quantile < 1) || !(o->shadow_cover > 0) ||
                      !(o->shadow_cover <= 1) || !(o->shadow_min_importance >= 0) ||
                      !(o->shadow_hot_max >= 0 && o->shadow_hot_max <= 1))) {
        sl_err_set(err,
                   "shadow execution needs static activation scales, quantized weights, a "
                   "quantile in (0, 1), a cover in (0, 1], an importance >= 0 and a hot share "
                   "in [0, 1] (got %g, %g, %g, %g)",
                   o->shadow_quantile, o->shadow_cover, o->shadow_min_importance,
                   o->shadow_hot_max);
        return -EINVAL;
    }
    if ((unsigned)o->budget > QUANTIZER_BUDGET_GLOBAL ||
        (unsigned)o->global > QUANTIZER_GLOBAL_TENSOR_MEAN ||
        (unsigned)o->metric > QUANTIZER_METRIC_EXACT || (unsigned)o->clip > QUANTIZER_CLIP_MSE) {
        sl_err_set(err, "bad quantizer option value");
        return -EINVAL;
    }
    return 0;
}

int quantizer_quantize(const char *src, const struct quantizer_calib *calib,
                       const struct quantizer_opts *opts, const char *out,
                       struct quantizer_report *rep, struct sl_err *err)
{
    struct quantizer_report dummy;
    if (!rep)
        rep = &dummy;
    memset(rep, 0, sizeof *rep);
    int ret = check_opts(opts, err);
    if (ret < 0)
        return ret;
    struct qctx *q = calloc(1, sizeof *q);
    if (!q) {
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    q->o = opts;
    q->clip = opts->clip == QUANTIZER_CLIP_DEFAULT ? CLIP_DEFAULT : opts->clip;
    q->encoding = opts->float_out  ? FORMAT_ENC_F32
                  : opts->encoding ? opts->encoding
                                   : FORMAT_ENC_ADAPTIVE;
    q->calib = calib;
    q->rep = rep;
    q->err = err;
    struct format_writer *w = NULL;
    ret = format_reader_open(src, &q->src, err);
    if (ret < 0)
        goto out;
    q->c = format_reader_config(q->src);
    ret = -EINVAL;
    if (calib && (!quantizer_calib_ok(calib) || memcmp(&calib->cfg, q->c, sizeof *q->c) != 0)) {
        sl_err_set(err, "%s: the calibration statistics do not belong to this model%s", src,
                   calib && !quantizer_calib_ok(calib) ? " (they failed to record)" : "");
        goto out;
    }
    if (calib && (ret = quantizer_calib_check(calib, err)) < 0) {
        sl_err_prefix(err, "%s", src);
        goto out;
    }
    size_t ng = (size_t)q->c->n_layers * G_N;
    q->s = calloc(ng, sizeof *q->s);
    q->alpha = malloc(sizeof(double) * (ng + 1));
    if (!q->s || !q->alpha) {
        sl_err_set(err, "out of memory");
        ret = -ENOMEM;
        goto out;
    }
    for (size_t i = 0; i <= ng; i++)
        q->alpha[i] = -1;
    if ((ret = qd_pass1(q)) < 0)
        goto out;
    if (rep->groups)
        rep->mean_alpha /= rep->groups;
    if ((ret = format_writer_create(out, &w, err)) < 0)
        goto out;
    ret = format_writer_set_config(w, q->c, err);
    if (!ret)
        ret = format_writer_set_tokenizer(w, format_reader_tokenizer(q->src), err);
    if (!ret)
        ret = qd_write_meta(q, w, err);
    if (!ret)
        ret = qd_pass2(q, w);
    if (!ret && opts->shadow)
        ret = qd_write_shadow(q, w, err);
    if (!ret)
        ret = format_writer_finish(w, err);
    if (!ret) {
        struct format_reader *r;
        if (format_reader_open(out, &r, NULL) == 0) {
            rep->file_bytes = format_reader_file_size(r);
            format_reader_close(r);
        }
    }
out:
    format_writer_destroy(w);
    if (q->s)
        for (size_t i = 0; i < (size_t)(q->c ? q->c->n_layers : 0) * G_N; i++)
            free(q->s[i]);
    free(q->s);
    free(q->alpha);
    free(q->s_cls);
    free(q->re);
    free(q->weight);
    free(q->cost);
    free(q->widths);
    format_shadow_free(q->sh, q->n_sh);
    format_reader_close(q->src);
    free(q);
    return ret;
}

/* quantizer_meta.c: the quantized container's metadata: the source's own
 * keys (less its quantization results), how it was quantized (quant.*),
 * the calibration (calib.*) and the shadow execution's calibration
 * (shadow.*). */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quantizer_driver.h"

/* ---- metadata ------------------------------------------------------------------------------ */

static int copy_meta(struct format_reader *src, struct format_writer *w, struct sl_err *err)
{
    for (uint32_t i = 0; i < format_reader_meta_count(src); i++) {
        const char *k = format_reader_meta_key(src, i);
        const void *v;
        size_t len;
        /* a re-quantized source's own results do not describe the output */
        if (!strncmp(k, "quant.", 6) || !strncmp(k, "calib.", 6) || !strncmp(k, "shadow.", 7))
            continue;
        if (format_reader_meta_get(src, k, &v, &len) < 0)
            continue;
        int ret = format_writer_set_meta(w, k, v, len, err);
        if (ret < 0)
            return ret;
    }
    return 0;
}

static int meta(struct format_writer *w, const char *k, struct sl_err *err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int meta(struct format_writer *w, const char *k, struct sl_err *err, const char *fmt, ...)
{
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return format_writer_set_meta(w, k, buf, strlen(buf), err);
}

/* quant.alphas: per layer "qkv,o,gate_up,down" separated by ';' ("-": not
 * smoothed), then ";classifier=a" for an untied classifier. */
static int meta_alphas(const struct qctx *q, struct format_writer *w, struct sl_err *err)
{
    size_t cap = (size_t)q->c->n_layers * G_N * 6 + 32, len = 0;
    char *buf = malloc(cap);
    if (!buf) {
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    for (uint32_t l = 0; l < q->c->n_layers; l++)
        for (int g = 0; g < G_N; g++) {
            double a = q->alpha[(size_t)l * G_N + g];
            char sep = g == G_N - 1 ? ';' : ',';
            len += a < 0 ? (size_t)snprintf(buf + len, cap - len, "-%c", sep)
                         : (size_t)snprintf(buf + len, cap - len, "%.2f%c", a, sep);
        }
    double ac = q->alpha[(size_t)q->c->n_layers * G_N];
    if (ac >= 0)
        len += (size_t)snprintf(buf + len, cap - len, "classifier=%.2f", ac);
    else if (len)
        len--; /* the last ';' */
    int ret = format_writer_set_meta(w, "quant.alphas", buf, len, err);
    free(buf);
    return ret;
}

int qd_write_meta(const struct qctx *q, struct format_writer *w, struct sl_err *err)
{
    const struct quantizer_opts *o = q->o;
    static const char *const clip_names[] = {"default", "none", "mse"};
    int ret = copy_meta(q->src, w, err);
    if (!ret)
        ret = meta(w, "quant.method", err, "%s", quantizer_method_name(o->method));
    if (!ret)
        ret = meta(w, "quant.bits", err, "%g", o->bits);
    if (!ret)
        ret = meta(w, "quant.budget", err, "%s",
                   o->budget == QUANTIZER_BUDGET_GLOBAL ? "global" : "tensor");
    if (!ret && o->budget_select)
        ret = meta(w, "quant.budget_select", err, "%s", o->budget_select);
    if (!ret && o->budget == QUANTIZER_BUDGET_GLOBAL)
        ret = meta(w, "quant.global_objective", err, "%s",
                   o->global == QUANTIZER_GLOBAL_WEIGHT ? "weight" : "tensor-mean");
    if (!ret && (o->method == QUANTIZER_METHOD_EDGEFLOW || o->method == QUANTIZER_METHOD_CMPQ))
        ret = meta(w, "quant.widths", err, "%s", o->uniform_widths ? "uniform" : "allocated");
    if (!ret)
        ret = meta(w, "quant.metric", err, "%s",
                   o->metric == QUANTIZER_METRIC_EXACT ? "exact" : "proxy");
    if (!ret)
        ret = meta(w, "quant.clip", err, "%s", clip_names[q->clip]);
    if (!ret && o->method == QUANTIZER_METHOD_EDGEFLOW && o->alpha < 0)
        ret = meta(w, "quant.alpha_search", err, "%s, %s",
                   o->search_in_sample ? "in-sample" : "held-out",
                   o->alpha_one_se ? "one standard error" : "least error");
    if (!ret)
        ret = meta(w, "quant.activations", err, "%s",
                   o->act_dynamic || !q->calib ? "dynamic" : "static");
    if (!ret)
        ret = meta(w, "quant.encoding", err, "%s", format_encoding_traits(q->encoding)->name);
    if (!ret && q->rep->groups) {
        ret = meta(w, "quant.alpha_mean", err, "%.3f", q->rep->mean_alpha);
        if (!ret)
            ret = meta_alphas(q, w, err);
    }
    if (!ret && q->calib) {
        ret = meta(w, "calib.tokens", err, "%" PRIu64, quantizer_calib_rows(q->calib));
        if (!ret)
            ret = meta(w, "calib.sample_rows", err, "%u", q->calib->sample_rows);
        if (!ret && o->calib_source)
            ret = meta(w, "calib.source", err, "%s", o->calib_source);
    }
    return ret;
}

/* The shadow calibration (shadow.linears) and its parameters. */
int qd_write_shadow(const struct qctx *q, struct format_writer *w, struct sl_err *err)
{
    void *buf;
    size_t len;
    if (format_shadow_encode(q->sh, q->n_sh, &buf, &len) < 0) {
        sl_err_set(err, "out of memory writing the shadow metadata");
        return -ENOMEM;
    }
    int ret = format_writer_set_meta(w, FORMAT_SHADOW_META_KEY, buf, len, err);
    free(buf);
    uint32_t on = 0;
    for (uint32_t i = 0; i < q->n_sh; i++)
        on += (q->sh[i].flags & FORMAT_SHADOW_ON) != 0;
    if (!ret)
        ret = meta(w, "shadow.quantile", err, "%g", q->o->shadow_quantile);
    if (!ret)
        ret = meta(w, "shadow.cover", err, "%g", q->o->shadow_cover);
    if (!ret)
        ret = meta(w, "shadow.min_importance", err, "%g", q->o->shadow_min_importance);
    if (!ret)
        ret = meta(w, "shadow.hot_max", err, "%g", q->o->shadow_hot_max);
    if (!ret)
        ret = meta(w, "shadow.linears_on", err, "%u of %u", on, q->n_sh);
    return ret;
}

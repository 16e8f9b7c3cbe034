/* tools_calib.c: see tools_calib.h. */
#include "tools_calib.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools_stats.h"

int tools_tokenize_file(const struct infer_tokenizer *tk, const char *path, int **ids, uint32_t *n,
                        struct sl_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        int e = errno;
        sl_err_set(err, "%s: cannot open: %s", path, strerror(e));
        return -e;
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    size_t k;
    while (buf && (k = fread(buf + len, 1, cap - len, f)) > 0) {
        len += k;
        if (len == cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) {
                free(buf);
                buf = NULL;
            }
            buf = nb;
        }
    }
    int rerr = ferror(f);
    fclose(f);
    if (!buf || rerr) {
        free(buf);
        sl_err_set(err, "%s: cannot read", path);
        return -EIO;
    }
    int ret = infer_tokenizer_encode_stream(tk, buf, len, ids, n);
    free(buf);
    if (ret < 0)
        sl_err_set(err, "%s: cannot tokenize (%s)", path, strerror(-ret));
    else if (*n == 0) {
        free(*ids);
        *ids = NULL;
        sl_err_set(err, "%s: no text", path);
        ret = -EINVAL;
    }
    return ret;
}

/* The calibration tokens: the text at text_path tokenized as one stream (no
 * BOS), or n_random deterministic random tokens when text_path is NULL. */
static int calib_ids(const struct infer_tokenizer *tk, const struct format_config *c,
                     const char *text_path, uint32_t n_random, int **ids, uint32_t *n,
                     struct sl_err *err)
{
    if (text_path)
        return tools_tokenize_file(tk, text_path, ids, n, err);
    *n = n_random;
    *ids = malloc(sizeof(int) * (n_random ? n_random : 1));
    if (!*ids) {
        sl_err_set(err, "out of memory for %u calibration tokens", n_random);
        return -ENOMEM;
    }
    uint64_t s = 0x2545f4914f6cdd1dull;
    for (uint32_t i = 0; i < n_random; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        (*ids)[i] = 3 + (int)(s % (c->vocab_size > 3 ? c->vocab_size - 3 : 1));
    }
    return 0;
}

/* Called with each chunk's logits[len][vocab] after the layers ran. */
typedef int (*head_fn)(void *ctx, uint32_t k, const int *tokens, uint32_t len, const float *logits,
                       struct sl_err *err);

/* Runs `m` (loaded lazily) over stream[0..total) cut into chunks of `chunk`
 * tokens (the last may be shorter), layer by layer: one layer's weights
 * resident at a time, every chunk through a layer before the next layer is
 * read. Each chunk starts at position 0 (its own sequence). */
static int layerwise(struct infer_model *m, const int *stream, uint32_t total, uint32_t chunk,
                     head_fn head, void *head_ctx, struct tools_progress *prog, const char *what,
                     struct sl_err *err)
{
    const struct format_config *c = infer_model_config(m);
    struct infer_state *st = NULL;
    float *x = malloc(sizeof(float) * (size_t)total * c->dim);
    float *logits = malloc(sizeof(float) * (size_t)chunk * c->vocab_size);
    int ret = x && logits ? infer_state_create(m, chunk, &st, err) : -ENOMEM;
    if (ret == -ENOMEM)
        sl_err_set(err, "out of memory for %u tokens of activations", total);
    if (ret == 0)
        ret = infer_model_load_layer(m, -1, err);
    if (ret == 0)
        ret = infer_embed(m, stream, total, x, err);
    for (uint32_t l = 0; ret == 0 && l < c->n_layers; l++) {
        ret = infer_model_load_layer(m, (int)l, err);
        /* chunk by chunk: each chunk's keys and values for this layer are
         * written and read before the next chunk overwrites them */
        for (uint32_t off = 0; ret == 0 && off < total; off += chunk) {
            uint32_t len = total - off < chunk ? total - off : chunk;
            ret = infer_layer_forward(m, st, (int)l, x + (size_t)off * c->dim, len, 0, err);
        }
        infer_model_release_layer(m, (int)l);
        if (prog)
            tools_progress_cb(prog, what, l + 1, c->n_layers + 1);
    }
    for (uint32_t off = 0, k = 0; ret == 0 && off < total; off += chunk, k++) {
        uint32_t len = total - off < chunk ? total - off : chunk;
        ret = infer_head_forward(m, st, x + (size_t)off * c->dim, len, logits, err);
        if (ret == 0 && head)
            ret = head(head_ctx, k, stream + off, len, logits, err);
    }
    if (ret == 0 && prog)
        tools_progress_cb(prog, what, c->n_layers + 1, c->n_layers + 1);
    free(x);
    free(logits);
    infer_state_destroy(st);
    return ret;
}

/* lazy, and read rather than mapped: one layer of weights in memory at a
 * time (a mapping keeps every touched page of the file resident) */
static int load_lazy(const char *container, struct infer_model **m, struct sl_err *err)
{
    struct infer_load_opts lo = {.lazy = 1, .no_mmap = 1};
    return infer_model_load(container, &lo, m, err);
}

int tools_calibrate(const char *container, const char *text_path, uint32_t max_tokens,
                    uint32_t sample_rows, struct quantizer_calib **out, uint32_t *used,
                    uint32_t *chunks, int **ids_out, uint32_t *n_ids,
                    struct tools_progress *prog, struct sl_err *err)
{
    struct infer_model *m = NULL;
    struct infer_tokenizer *tk = NULL;
    struct quantizer_calib *calib = NULL;
    int *ids = NULL, *stream = NULL;
    uint32_t n = 0;
    int ret = load_lazy(container, &m, err);
    if (ret < 0)
        return ret;
    const struct format_config *c = infer_model_config(m);
    ret = infer_tokenizer_create(format_reader_tokenizer(infer_model_reader(m)), c, &tk, err);
    if (ret == 0)
        ret = calib_ids(tk, c, text_path, max_tokens, &ids, &n, err);
    if (ret < 0)
        goto out;
    /* chunks of at most chunk_len tokens, each starting with BOS */
    uint32_t chunk = c->seq_len < 512 ? c->seq_len : 512;
    uint32_t body = chunk - 1, total = 0;
    uint32_t n_chunks = 0;
    stream = malloc(sizeof(int) * ((size_t)max_tokens + max_tokens / (body ? body : 1) + 2));
    if (!stream) {
        ret = -ENOMEM;
        sl_err_set(err, "out of memory for calibration");
        goto out;
    }
    for (uint32_t i = 0; i < n && total < max_tokens;) {
        uint32_t take = n - i < body ? n - i : body;
        if (total + take + 1 > max_tokens)
            take = max_tokens - total - 1;
        if (take == 0)
            break;
        stream[total++] = (int)c->bos_id;
        memcpy(stream + total, ids + i, sizeof(int) * take);
        total += take;
        i += take;
        n_chunks++;
    }
    *used = total;
    *chunks = n_chunks;
    ret = quantizer_calib_create(c, sample_rows, &calib);
    if (ret < 0 || !calib) {
        sl_err_set(err, "out of memory for calibration");
        ret = -ENOMEM;
        goto out;
    }
    infer_model_set_observer(m, quantizer_calib_observe, calib);
    ret = layerwise(m, stream, total, chunk, NULL, NULL, prog, "calibration", err);
    if (ret < 0)
        goto out;
    if (!quantizer_calib_ok(calib)) {
        sl_err_set(err, "out of memory recording calibration statistics");
        ret = -ENOMEM;
        goto out;
    }
    *out = calib;
    calib = NULL;
    if (ids_out) {
        *ids_out = ids;
        *n_ids = n;
        ids = NULL;
    }
    ret = 0;
out:
    quantizer_calib_destroy(calib);
    free(ids);
    free(stream);
    infer_tokenizer_destroy(tk);
    infer_model_destroy(m);
    return ret;
}

/* ---- KL divergence, llama-perplexity --kl-divergence's way ------------------------------ */

/* log-softmax of logits[n] into out (double) */
static void log_softmax(const float *l, uint32_t n, double *out)
{
    double m = l[0];
    for (uint32_t i = 1; i < n; i++)
        m = l[i] > m ? l[i] : m;
    double s = 0;
    for (uint32_t i = 0; i < n; i++)
        s += exp((double)l[i] - m);
    double ls = log(s) + m;
    for (uint32_t i = 0; i < n; i++)
        out[i] = (double)l[i] - ls;
}

int tools_kl_init(struct tools_kl *a, uint32_t vocab)
{
    memset(a, 0, sizeof *a);
    a->vocab = vocab;
    a->lp = malloc(sizeof(double) * vocab);
    a->lp_ref = malloc(sizeof(double) * vocab);
    return a->lp && a->lp_ref ? 0 : -ENOMEM;
}

int tools_kl_add(struct tools_kl *a, const float *lm, const float *lr, int next)
{
    if (a->scored == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 4096;
        double *k = realloc(a->kls, sizeof(double) * cap);
        if (!k)
            return -ENOMEM;
        a->kls = k;
        a->cap = cap;
    }
    uint32_t V = a->vocab;
    log_softmax(lm, V, a->lp);
    log_softmax(lr, V, a->lp_ref);
    a->nll -= a->lp[next];
    a->nll_ref -= a->lp_ref[next];
    double kl = 0;
    uint32_t am = 0, ar = 0;
    for (uint32_t v = 0; v < V; v++) {
        kl += exp(a->lp_ref[v]) * (a->lp_ref[v] - a->lp[v]);
        if (lm[v] > lm[am])
            am = v;
        if (lr[v] > lr[ar])
            ar = v;
    }
    a->kls[a->scored] = kl > 0 ? kl : 0;
    a->kl_sum += a->kls[a->scored];
    a->agree += am == ar;
    a->scored++;
    return 0;
}

void tools_kl_finish(struct tools_kl *a, struct tools_kl_result *r)
{
    memset(r, 0, sizeof *r);
    uint64_t n = a->scored;
    r->tokens = n;
    if (!n)
        return;
    double mean = a->kl_sum / (double)n, var = 0;
    for (uint64_t i = 0; i < n; i++)
        var += (a->kls[i] - mean) * (a->kls[i] - mean);
    r->kl_mean = mean;
    /* standard error of the mean, as llama-perplexity prints it (tokens of
     * a text are not independent: read it as a lower bound) */
    r->kl_se = n > 1 ? sqrt(var / (double)(n - 1) / (double)n) : 0;
    r->ppl = exp(a->nll / (double)n);
    r->ppl_ref = exp(a->nll_ref / (double)n);
    r->top1 = (double)a->agree / (double)n;
    if (tools_stats_percentile(a->kls, n, 0.99, &r->kl_p99) < 0)
        r->kl_p99 = NAN; /* out of memory: reported as unknown, not as 0 */
}

void tools_kl_free(struct tools_kl *a)
{
    free(a->kls);
    free(a->lp);
    free(a->lp_ref);
    memset(a, 0, sizeof *a);
}

/* ---- scoring a model against its float source on stored logits ------------------------- */

struct tools_kl_ref {
    uint32_t ctx, chunks, vocab;
    int *stream;   /* chunks x ctx tokens, each chunk's first replaced by BOS */
    float *logits; /* the reference's logits of every scored position */
};

static uint32_t first_scored(uint32_t ctx) { return ctx / 2; }
static uint32_t scored_per_chunk(uint32_t ctx) { return ctx - 1 - first_scored(ctx); }

static int keep_ref(void *ctx, uint32_t k, const int *tokens, uint32_t len, const float *logits,
                    struct sl_err *err)
{
    (void)tokens, (void)len, (void)err;
    struct tools_kl_ref *r = ctx;
    size_t per = scored_per_chunk(r->ctx), V = r->vocab;
    memcpy(r->logits + (size_t)k * per * V, logits + (size_t)first_scored(r->ctx) * V,
           sizeof(float) * per * V);
    return 0;
}

int tools_kl_ref_create(const char *ref, const int *ids, uint32_t n, uint32_t max_tokens,
                        struct tools_kl_ref **out, struct tools_progress *prog, struct sl_err *err)
{
    struct infer_model *m = NULL;
    int ret = load_lazy(ref, &m, err);
    if (ret < 0)
        return ret;
    const struct format_config *c = infer_model_config(m);
    struct tools_kl_ref *r = calloc(1, sizeof *r);
    if (!r) {
        infer_model_destroy(m);
        return -ENOMEM;
    }
    r->ctx = c->seq_len < 512 ? c->seq_len : 512;
    r->vocab = c->vocab_size;
    uint32_t use = n < max_tokens ? n : max_tokens;
    r->chunks = r->ctx >= 4 ? use / r->ctx : 0;
    if (!r->chunks) {
        sl_err_set(err, "%u calibration tokens are fewer than one chunk of %u", use, r->ctx);
        ret = -EINVAL;
        goto out;
    }
    size_t total = (size_t)r->chunks * r->ctx;
    r->stream = malloc(sizeof(int) * total);
    r->logits = malloc(sizeof(float) * r->chunks * scored_per_chunk(r->ctx) * r->vocab);
    if (!r->stream || !r->logits) {
        sl_err_set(err, "out of memory for the reference logits of %u chunks", r->chunks);
        ret = -ENOMEM;
        goto out;
    }
    memcpy(r->stream, ids, sizeof(int) * total);
    for (uint32_t k = 0; k < r->chunks; k++)
        r->stream[(size_t)k * r->ctx] = (int)c->bos_id;
    ret = layerwise(m, r->stream, (uint32_t)total, r->ctx, keep_ref, r, prog, "reference", err);
out:
    infer_model_destroy(m);
    if (ret < 0)
        tools_kl_ref_destroy(r);
    else
        *out = r;
    return ret;
}

void tools_kl_ref_destroy(struct tools_kl_ref *r)
{
    if (!r)
        return;
    free(r->stream);
    free(r->logits);
    free(r);
}

uint32_t tools_kl_ref_chunks(const struct tools_kl_ref *r) { return r->chunks; }
uint32_t tools_kl_ref_ctx(const struct tools_kl_ref *r) { return r->ctx; }

struct score_ctx {
    const struct tools_kl_ref *ref;
    struct tools_kl acc;
};

static int score_chunk(void *ctx, uint32_t k, const int *tokens, uint32_t len, const float *logits,
                       struct sl_err *err)
{
    struct score_ctx *s = ctx;
    const struct tools_kl_ref *r = s->ref;
    size_t V = r->vocab, per = scored_per_chunk(r->ctx);
    const float *lr = r->logits + (size_t)k * per * V;
    for (uint32_t j = first_scored(r->ctx); j + 1 < len; j++, lr += V)
        if (tools_kl_add(&s->acc, logits + (size_t)j * V, lr, tokens[j + 1]) < 0) {
            sl_err_set(err, "out of memory scoring");
            return -ENOMEM;
        }
    return 0;
}

int tools_kl_score(const char *model, const struct tools_kl_ref *ref, struct tools_kl_result *res,
                   struct tools_progress *prog, struct sl_err *err)
{
    struct infer_model *m = NULL;
    int ret = load_lazy(model, &m, err);
    if (ret < 0)
        return ret;
    const struct format_config *c = infer_model_config(m);
    struct score_ctx s = {.ref = ref};
    /* a shadow container's bulk scales expect their shadow execution */
    ret = infer_model_shadow_enable(m, err);
    if (ret == -ENOENT) {
        if (err)
            memset(err, 0, sizeof *err);
        ret = 0;
    }
    if (ret < 0) {
        /* err names the problem */
    } else if (c->vocab_size != ref->vocab || c->seq_len < ref->ctx) {
        sl_err_set(err, "%s: vocabulary or context differs from the reference's", model);
        ret = -EINVAL;
    } else if (tools_kl_init(&s.acc, ref->vocab) < 0) {
        sl_err_set(err, "out of memory scoring");
        ret = -ENOMEM;
    } else {
        ret = layerwise(m, ref->stream, ref->chunks * ref->ctx, ref->ctx, score_chunk, &s, prog,
                        "score", err);
    }
    if (ret == 0)
        tools_kl_finish(&s.acc, res);
    tools_kl_free(&s.acc);
    infer_model_destroy(m);
    return ret;
}

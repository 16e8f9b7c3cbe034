/* tools_calib.c: see tools_calib.h. */
#include "tools_calib.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
        sl_err_set(err, "%s: no text", path);
        ret = -EINVAL;
    }
    return ret;
}

int tools_calibrate(const char *container, const char *text_path, uint32_t max_tokens,
                    uint32_t sample_rows, struct quantizer_calib **out, uint32_t *used,
                    uint32_t *chunks, struct tools_progress *prog, struct sl_err *err)
{
    /* lazy, and read rather than mapped: one layer of weights in memory at a
     * time (a mapping keeps every touched page of the file resident) */
    struct infer_load_opts lo = {.lazy = 1, .no_mmap = 1};
    struct infer_model *m = NULL;
    struct infer_state *st = NULL;
    struct infer_tokenizer *tk = NULL;
    struct quantizer_calib *calib = NULL;
    int *ids = NULL, *stream = NULL;
    float *x = NULL, *logits = NULL;
    uint32_t n = 0;
    int ret = infer_model_load(container, &lo, &m, err);
    if (ret < 0)
        return ret;
    const struct format_config *c = infer_model_config(m);
    ret = infer_tokenizer_create(format_reader_tokenizer(infer_model_reader(m)), c, &tk, err);
    if (ret < 0)
        goto out;
    if (text_path) {
        ret = tools_tokenize_file(tk, text_path, &ids, &n, err);
        if (ret < 0)
            goto out;
    } else {
        n = max_tokens;
        ids = malloc(sizeof(int) * n);
        if (!ids) {
            ret = -ENOMEM;
            goto out;
        }
        uint64_t s = 0x2545f4914f6cdd1dull;
        for (uint32_t i = 0; i < n; i++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            ids[i] = 3 + (int)(s % (c->vocab_size > 3 ? c->vocab_size - 3 : 1));
        }
    }
    /* chunks of at most chunk_len tokens, each starting with BOS */
    uint32_t chunk = c->seq_len < 512 ? c->seq_len : 512;
    uint32_t body = chunk - 1, total = 0;
    uint32_t n_chunks = 0;
    stream = malloc(sizeof(int) * ((size_t)max_tokens + max_tokens / (body ? body : 1) + 2));
    if (!stream) {
        ret = -ENOMEM;
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
    if (ret == 0)
        ret = infer_state_create(m, chunk, &st, err);
    x = malloc(sizeof(float) * (size_t)total * c->dim);
    logits = malloc(sizeof(float) * (size_t)chunk * c->vocab_size);
    if (ret < 0 || !calib || !x || !logits) {
        sl_err_set(err, "out of memory for calibration");
        ret = -ENOMEM;
        goto out;
    }
    infer_model_set_observer(m, quantizer_calib_observe, calib);
    ret = infer_model_load_layer(m, -1, err);
    if (ret < 0)
        goto out;
    ret = infer_embed(m, stream, total, x, err);
    if (ret < 0)
        goto out;
    for (uint32_t l = 0; l < c->n_layers; l++) {
        ret = infer_model_load_layer(m, (int)l, err);
        if (ret < 0)
            goto out;
        /* chunk by chunk: each chunk's keys and values for this layer are
         * written and read before the next chunk overwrites them */
        for (uint32_t off = 0; off < total;) {
            uint32_t len = total - off;
            uint32_t next = off + 1;
            while (next < total && (uint32_t)stream[next] != c->bos_id)
                next++;
            len = next - off;
            ret = infer_layer_forward(m, st, (int)l, x + (size_t)off * c->dim, len, 0, err);
            if (ret < 0)
                goto out;
            off = next;
        }
        infer_model_release_layer(m, (int)l);
        if (prog)
            tools_progress_cb(prog, "calibration", l + 1, c->n_layers + 1);
    }
    for (uint32_t off = 0; off < total; off += chunk) {
        uint32_t len = total - off < chunk ? total - off : chunk;
        ret = infer_head_forward(m, st, x + (size_t)off * c->dim, len, logits, err);
        if (ret < 0)
            goto out;
    }
    if (!quantizer_calib_ok(calib)) {
        sl_err_set(err, "out of memory recording calibration statistics");
        ret = -ENOMEM;
        goto out;
    }
    *out = calib;
    calib = NULL;
    ret = 0;
out:
    quantizer_calib_destroy(calib);
    free(ids);
    free(stream);
    free(x);
    free(logits);
    infer_state_destroy(st);
    infer_tokenizer_destroy(tk);
    infer_model_destroy(m);
    return ret;
}

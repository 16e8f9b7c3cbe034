/* fs_testmodel.c: see fs_testmodel.h. */
#include "fs_testmodel.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format.h"
#include "quantizer.h"
#include "testutil.h"

static const uint32_t linear_enc[4] = {FORMAT_ENC_ADAPTIVE, FORMAT_ENC_INT4INT8,
                                       FORMAT_ENC_BITPLANE, FORMAT_ENC_Q8_CHANNEL};

/* Random codes on each row's grid, packed (or laid out as q8). */
static int quantized_bytes(struct test_rng *g, uint32_t enc, uint32_t rows, uint32_t cols,
                           void **out, uint64_t *len, uint32_t hist[FORMAT_MAX_BITS + 1],
                           struct sl_err *err)
{
    int8_t *q = malloc((size_t)rows * cols);
    uint8_t *w = malloc(rows);
    float *sc = malloc(sizeof(float) * rows);
    int ret = -ENOMEM;
    if (!q || !w || !sc)
        goto out;
    memset(hist, 0, sizeof(uint32_t) * (FORMAT_MAX_BITS + 1));
    for (uint32_t r = 0; r < rows; r++) {
        uint32_t b = enc == FORMAT_ENC_Q8_CHANNEL ? 8 : 1 + test_rng_below(g, 8);
        w[r] = (uint8_t)b;
        hist[b]++;
        sc[r] = 0.001f + test_rng_float(g) * 0.05f;
        int lim = b == 1 ? 1 : (1 << (b - 1)) - 1;
        for (uint32_t c = 0; c < cols; c++) {
            int v = (int)test_rng_below(g, (uint32_t)(2 * lim + 1)) - lim;
            if (b == 1 && v == 0)
                v = 1;
            q[(size_t)r * cols + c] = (int8_t)v;
        }
    }
    if (enc != FORMAT_ENC_Q8_CHANNEL) {
        ret = quantizer_pack(enc, q, w, sc, rows, cols, out, len, err);
        goto out;
    }
    uint64_t pre = sl_align_up((uint64_t)rows * 4, 64);
    *len = pre + (uint64_t)rows * cols;
    uint8_t *p = calloc(1, *len);
    if (!p)
        goto out;
    for (uint32_t r = 0; r < rows; r++)
        sl_store_lef32(p + 4 * r, sc[r]);
    memcpy(p + pre, q, (size_t)rows * cols);
    *out = p;
    ret = 0;
out:
    if (ret == -ENOMEM && !err->msg[0])
        sl_err_set(err, "out of memory");
    free(q);
    free(w);
    free(sc);
    return ret;
}

static int add(struct format_writer *wr, struct test_rng *g, const struct format_config *cfg,
               int32_t layer, uint32_t role, uint32_t enc, struct sl_err *err)
{
    struct format_tensor_desc d;
    memset(&d, 0, sizeof d);
    char name[64];
    if (layer < 0)
        snprintf(name, sizeof name, "%s.weight", format_role_name(role));
    else
        snprintf(name, sizeof name, "blk.%d.%s.weight", layer, format_role_name(role));
    d.name = name;
    d.layer = layer;
    d.role = role;
    d.encoding = enc;
    uint64_t shape[2];
    int ret = format_role_shape(cfg, role, &d.n_dims, shape);
    if (ret < 0) {
        sl_err_set(err, "no shape for role %u", role);
        return ret;
    }
    d.shape[0] = shape[0];
    d.shape[1] = d.n_dims == 2 ? shape[1] : 0;
    void *bytes = NULL;
    uint64_t len = 0;
    if (enc == FORMAT_ENC_F32) {
        len = 4 * shape[0];
        bytes = malloc(len);
        if (!bytes)
            return -ENOMEM;
        for (uint64_t i = 0; i < shape[0]; i++)
            sl_store_lef32((uint8_t *)bytes + 4 * i, 0.5f + test_rng_float(g));
    } else {
        ret = quantized_bytes(g, enc, (uint32_t)shape[0], (uint32_t)shape[1], &bytes, &len,
                              d.bits_hist, err);
        if (ret < 0)
            return ret;
    }
    ret = format_writer_add_tensor(wr, &d, bytes, len, err);
    free(bytes);
    return ret;
}

int fs_test_model_write(const char *path, uint64_t seed, uint32_t n_layers, uint32_t dim,
                        struct sl_err *err)
{
    struct format_config cfg = {
        .arch = FORMAT_ARCH_LLAMA,
        .dim = dim,
        .hidden_dim = dim * 5 / 2,
        .n_layers = n_layers,
        .n_heads = 4,
        .n_kv_heads = 2,
        .head_dim = dim / 4,
        .vocab_size = 300,
        .seq_len = 64,
        .tied_embedding = 0,
        .rope_layout = FORMAT_ROPE_INTERLEAVED,
        .bos_id = 1,
        .eos_id = 2,
        .rope_theta = 10000.0f,
        .norm_eps = 1e-5f,
    };
    struct test_rng g;
    test_rng_init(&g, seed);
    /* vocabulary: "<i>" strings with random scores, some bytes nonprintable */
    uint32_t n = cfg.vocab_size;
    float *scores = malloc(sizeof(float) * n);
    uint32_t *lens = malloc(sizeof(uint32_t) * n);
    char **toks = calloc(n, sizeof *toks);
    struct format_writer *w = NULL;
    int ret = -ENOMEM;
    if (!scores || !lens || !toks)
        goto out;
    uint32_t maxlen = 0;
    for (uint32_t i = 0; i < n; i++) {
        toks[i] = malloc(16);
        if (!toks[i])
            goto out;
        lens[i] = (uint32_t)snprintf(toks[i], 16, "<%u>", i);
        if (i % 7 == 0)
            toks[i][0] = (char)(i & 0xff);
        scores[i] = -(float)i * 0.25f;
        if (lens[i] > maxlen)
            maxlen = lens[i];
    }
    struct format_tokenizer tok = {n, maxlen, scores, lens, (const char *const *)toks};
    if ((ret = format_writer_create(path, &w, err)) < 0 ||
        (ret = format_writer_set_config(w, &cfg, err)) < 0 ||
        (ret = format_writer_set_tokenizer(w, &tok, err)) < 0 ||
        (ret = add(w, &g, &cfg, -1, FORMAT_ROLE_TOK_EMBD, FORMAT_ENC_ADAPTIVE, err)) < 0)
        goto out;
    uint32_t k = 0;
    for (uint32_t l = 0; l < n_layers; l++) {
        for (uint32_t role = FORMAT_ROLE_ATTN_NORM; role <= FORMAT_ROLE_W_DOWN; role++) {
            uint32_t enc = format_role_is_linear((enum format_role)role) ? linear_enc[k++ % 4]
                                                                         : FORMAT_ENC_F32;
            if ((ret = add(w, &g, &cfg, (int32_t)l, role, enc, err)) < 0)
                goto out;
        }
    }
    if ((ret = add(w, &g, &cfg, -1, FORMAT_ROLE_OUT_NORM, FORMAT_ENC_F32, err)) < 0 ||
        (ret = add(w, &g, &cfg, -1, FORMAT_ROLE_CLASSIFIER, FORMAT_ENC_BITPLANE, err)) < 0)
        goto out;
    ret = format_writer_finish(w, err);
out:
    if (ret == -ENOMEM && !err->msg[0])
        sl_err_set(err, "out of memory");
    format_writer_destroy(w);
    for (uint32_t i = 0; toks && i < n; i++)
        free(toks[i]);
    free(toks);
    free(lens);
    free(scores);
    return ret;
}

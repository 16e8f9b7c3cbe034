/* gen_models.h: one small random Llama model written in every source format
 * the importers read (llama2.c checkpoint + tokenizer file, GGUF, Hugging
 * Face safetensors + config.json, single or sharded), independently of the
 * importers' code, for the self-contained importer tests and the importer
 * fuzz target.
 *
 * The model's tensors are kept as floats in the container convention
 * (rows = output channels, interleaved RoPE rows); each writer stores them in
 * the requested element type, and gen_expected() gives the floats an exact
 * importer must produce from that storage. Functions return 0 or -1 (with
 * errno set by the failing call); no printing. */
#ifndef SLUICE_TEST_GEN_MODELS_H
#define SLUICE_TEST_GEN_MODELS_H

#include <stddef.h>
#include <stdint.h>

#include "format.h"

/* element types of the stored weights */
enum gen_type { GEN_F32 = 0, GEN_F16, GEN_BF16, GEN_Q8_0 };

#define GEN_MAX_TENSORS 128

struct gen_model {
    struct format_config cfg;
    size_t n; /* tensors, in container (execution) order */
    int layer[GEN_MAX_TENSORS];
    uint32_t role[GEN_MAX_TENSORS];
    uint64_t rows[GEN_MAX_TENSORS], cols[GEN_MAX_TENSORS]; /* cols 1: a norm */
    float *data[GEN_MAX_TENSORS];
    /* vocabulary as the container stores it: spaces as ' ', control tokens bare */
    char **strs;
    uint32_t *lens;
    float *scores;
};

/* A small model: dim 64, hidden 96, 2 layers, 4 heads, 2 kv heads, vocab
 * 300 (<unk> <s> </s>, 256 byte tokens, pieces with spaces), seq 32,
 * theta 500000, eps 1e-6; tied or not. Values are a pure function of seed. */
int gen_model_create(struct gen_model *m, int tied, uint64_t seed);
void gen_model_destroy(struct gen_model *m);

/* Index of (layer, role) in m, or -1. */
int gen_model_find(const struct gen_model *m, int layer, uint32_t role);

/* Tensor i as an importer must return it after storage as `type`. */
void gen_expected(const struct gen_model *m, size_t i, enum gen_type type, float *out);

/* llama2.c: float32 checkpoint (negative vocab when untied) and the
 * tokenizer file ("\n<s>\n"-wrapped control tokens as llama2.c exports). */
int gen_write_llama2c(const struct gen_model *m, const char *ckpt, const char *tok);

struct gen_gguf_opts {
    uint32_t version;      /* 0: 3 */
    enum gen_type weights; /* type of the 2-D tensors */
    enum gen_type norms;   /* type of the norms (GEN_F32 by default, as llama.cpp) */
    uint32_t alignment;    /* 0: 32, no general.alignment key */
    int output_copy;       /* tied models: also write output.weight (a copy) */
    const char *arch;      /* NULL: "llama" */
    const char *extra_key; /* non-NULL: one more string key-value pair (extra_val) */
    const char *extra_val;
    int scores_first;      /* write tokenizer.ggml.scores before tokenizer.ggml.tokens */
};
int gen_write_gguf(const struct gen_model *m, const char *path, const struct gen_gguf_opts *o);

struct gen_st_opts {
    enum gen_type dtype; /* F32, F16 or BF16 */
    int n_shards;        /* 0/1: model.safetensors; > 1: index + shards */
    int eos_list;        /* eos_token_id written as a list */
};
/* Writes config.json and the tensors into dir (which must exist); q/k rows in
 * the rotate-half order of Hugging Face conversions. */
int gen_write_safetensors(const struct gen_model *m, const char *dir, const struct gen_st_opts *o);

/* Writes `len` bytes to path. */
int gen_write_file(const char *path, const void *p, size_t len);

#endif

/*
 * import.h: the start of the data flow: importers of trained models and
 * synthetic models, each written as a float container (format.h).
 *
 *   struct import_opts o = {.tokenizer = "tok.bin"};
 *   struct sl_err err;
 *   if (import_model("model.bin", &o, "model.sluice", &err) < 0)
 *       fprintf(stderr, "%s\n", err.msg);
 *
 * Importers read llama2.c checkpoints, GGUF v3 and Hugging Face safetensors
 * (+ config.json) and write a float container (format.h) without holding the
 * model in memory: the source is mapped read-only and tensors are converted
 * and written one at a time. Library code: no printing; progress goes through
 * the optional callback.
 */
#ifndef SLUICE_IMPORT_H
#define SLUICE_IMPORT_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "format.h"

#ifdef __cplusplus
extern "C" {
#endif

enum import_source {
    IMPORT_SRC_UNKNOWN = 0,
    IMPORT_SRC_SLUICE,      /* already a container */
    IMPORT_SRC_LLAMA2C,     /* llama2.c legacy float32 checkpoint (needs a tokenizer) */
    IMPORT_SRC_GGUF,        /* GGUF v2/v3, llama architecture */
    IMPORT_SRC_SAFETENSORS, /* directory or file with config.json beside it */
};

const char *import_source_name(enum import_source s);

/* Called after each tensor: bytes of source weights done so far, total. */
typedef void (*import_progress_fn)(void *ctx, const char *what, uint64_t done,
                                   uint64_t total);

struct import_opts {
    const char *tokenizer;      /* llama2.c tokenizer file; required for llama2.c and
                                   safetensors sources, ignored for GGUF */
    int dtype;                  /* -1: keep the source precision (Q8_0 and K-quants
                                   become f32);
                                   else FORMAT_ENC_F32, _F16 or _BF16 */
    uint32_t seq_len;           /* 0: from the source; else overrides the context length */
    import_progress_fn progress;
    void *progress_ctx;
};

/* Identifies `src` by its contents (GGUF magic, container magic, a plausible
 * llama2.c header (import_model then requires the exact size it implies),
 * a directory with config.json or a .safetensors file). Returns 0 and sets
 * *out, or a negative errno with a message naming the file. */
int import_source_detect(const char *src, enum import_source *out, struct sl_err *err);

/* Converts `src` into a container at `out_path` (written atomically). Every
 * bad input (truncated file, bad magic, unsupported version, architecture or
 * tensor type, shapes inconsistent with the config, anything a plain Llama
 * does not have and the runtime would silently ignore: biases, rope scaling,
 * partial rotary, extra tensors, a GGUF vocabulary other than SentencePiece
 * "llama") is an error naming the file and the problem; nothing is left at
 * `out_path` then. Tensors are written in execution order with GGUF-style
 * names; Hugging Face q/k rows are permuted to the interleaved RoPE layout.
 * Metadata: source.format ("llama2c", "gguf", "safetensors"), source.path. */
int import_model(const char *src, const struct import_opts *opts, const char *out_path,
                 struct sl_err *err);

/* Reads a llama2.c tokenizer file (int32 max_token_length, then per token:
 * f32 score, i32 length, bytes) with exactly `n_tokens` tokens. The result
 * owns its memory; free with import_vocab_free. */
struct import_vocab {
    struct format_tokenizer tok;    /* views into the arrays below */
    float *scores;
    uint32_t *lens;
    char **strs;
};
int import_vocab_load_llama2c(const char *path, uint32_t n_tokens, struct import_vocab *out,
                              struct sl_err *err);
void import_vocab_free(struct import_vocab *v);

/* ---- synthetic models ------------------------------------------------------- */

struct import_synth_shape {
    const char *name;           /* "tiny", "tinyllama-1.1b", "llama3-8b", ... */
    const char *description;
    struct format_config cfg;
};

/* The built-in shapes; *n receives their count. */
const struct import_synth_shape *import_synth_shapes(size_t *n);

/* Writes a deterministic random model of the named shape, stored as F16, with
 * trained-model-like statistics (see import_synth.c). The same shape and
 * seed give byte-identical files. Streams tensor by tensor (memory: the
 * largest tensor); rows are generated on the online CPUs (at most 16, or
 * $SLUICE_SYNTH_THREADS), which does not change the bytes. */
int import_synth(const char *shape, uint64_t seed, const char *out_path,
                 import_progress_fn progress, void *progress_ctx, struct sl_err *err);

#ifdef __cplusplus
}
#endif

#endif /* SLUICE_IMPORT_H */

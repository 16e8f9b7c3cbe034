/* import_internal.h: what every importer provides to the common
 * writing path in import_model.c. */
#ifndef SLUICE_IMPORT_INTERNAL_H
#define SLUICE_IMPORT_INTERNAL_H

#include "import.h"

/* Source element types the writer path converts from. */
enum qi_type {
    QI_F32 = 0,
    QI_F16,
    QI_BF16,
    QI_Q8_0, /* GGUF Q8_0: blocks of 32 int8 with an f16 scale (34 bytes) */
    QI_Q4_K, /* GGUF K-quants: blocks of 256 weights (import_kquant.c) */
    QI_Q5_K,
    QI_Q6_K,
};

/* Block types (Q8_0, K-quants): weights and bytes per block, and the exact
 * float values of n weights (n a multiple of the block) at src. */
int qi_type_is_block(enum qi_type t);
uint64_t qi_block_weights(enum qi_type t);
uint64_t qi_block_bytes(enum qi_type t);
void qi_dequant(enum qi_type t, const uint8_t *src, float *dst, uint64_t n);

/* A view of one source tensor in the mapped file. */
struct qi_tensor {
    const uint8_t *data;
    uint64_t len; /* bytes, checked against rows x cols x type */
    enum qi_type type;
    uint64_t rows, cols;    /* container convention: rows = output channels; 1-D: cols = 1 */
    uint32_t hf_rope_heads; /* > 0: rows are in Hugging Face rotate-half order for this many
                               heads and are permuted to the interleaved layout */
};

struct qi_source {
    const char *path;
    const char *format; /* "llama2c", "gguf", "safetensors" */
    struct format_config cfg;
    struct import_vocab vocab;
    /* a GGUF's tokenizer.chat_template (a view into the source), or NULL */
    const char *chat_template;
    uint64_t chat_template_len;
    /* Finds the tensor of (layer, role); -1 layer for the global ones. The
     * view stays valid until destroy. */
    int (*tensor)(struct qi_source *s, int layer, uint32_t role, struct qi_tensor *t,
                  struct sl_err *err);
    void (*destroy)(struct qi_source *s);
    void *priv;
};

/* An importer's state: `size` bytes, zeroed, whose first member is its
 * struct qi_source, given the path, format name and hooks, and priv pointing
 * back at the state. NULL, reported as out of memory, when it cannot be
 * allocated. */
void *qi_source_new(size_t size, const char *path, const char *format,
                    int (*tensor)(struct qi_source *s, int layer, uint32_t role,
                                  struct qi_tensor *t, struct sl_err *err),
                    void (*destroy)(struct qi_source *s), struct sl_err *err);

int qi_open_llama2c(const char *path, const struct import_opts *o, struct qi_source **out,
                    struct sl_err *err);
int qi_open_gguf(const char *path, const struct import_opts *o, struct qi_source **out,
                 struct sl_err *err);
int qi_open_safetensors(const char *path, const struct import_opts *o, struct qi_source **out,
                        struct sl_err *err);

/* Empties v and allocates its arrays for n tokens (no strings yet, lengths
 * and scores 0), with tok.n_tokens = n. 0, or -ENOMEM with v empty. */
int qi_vocab_alloc(struct import_vocab *v, uint64_t n);
/* Once the arrays are filled: points v->tok at them and sets its
 * max_token_len. */
void qi_vocab_publish(struct import_vocab *v);

/* Maps a whole file read-only (MAP_PRIVATE); an empty file maps to NULL with
 * size 0. */
int qi_map_file(const char *path, const uint8_t **data, uint64_t *size, struct sl_err *err);
void qi_unmap(const uint8_t *data, uint64_t size);

/* Element size of a type in bytes per weight (Q8_0: per block of 32). */
uint64_t qi_type_bytes(enum qi_type t, uint64_t n_elems);

/* Tensors of a model in container (execution) order: how many, and the i-th. */
size_t qi_order_count(const struct format_config *c);
void qi_order_at(const struct format_config *c, size_t i, int *layer, uint32_t *role);

#endif

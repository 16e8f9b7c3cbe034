/* tok_ref.h: what the tokenizer tests compare the library with: vocabularies
 * (synthetic, or llama2.c tokenizer files), the reference encoder (run.c's
 * quadratic merge loop) and random texts over a vocabulary. */
#ifndef SLUICE_TEST_TOK_REF_H
#define SLUICE_TEST_TOK_REF_H

#include <stddef.h>
#include <stdint.h>

#include "infer.h"
#include "testutil.h"

struct vocab {
    const char *name;
    uint32_t n, cap;
    char **strs;
    uint32_t *lens;
    float *scores;
    struct format_tokenizer tok;
    struct format_config cfg;
};

/* A random vocabulary in llama2.c's layout: control, byte, character and
 * merge tokens (tok_ref.c says which scores and why). */
void tok_vocab_synth(struct vocab *v, struct test_rng *rng);
/* A llama2.c tokenizer file: int32 max_token_length, then per token a
 * float32 score, an int32 length and the bytes. BOS 1, EOS 2. */
int tok_vocab_load(struct vocab *v, const char *path, const char *name);
void tok_vocab_free(struct vocab *v);

struct ref {
    const struct vocab *v;
    uint32_t *sorted; /* ids by their bytes */
    int byte_id[256];
};

void tok_ref_init(struct ref *r, const struct vocab *v);
void tok_ref_fini(struct ref *r);
/* infer_tokenizer_encode's contract: BOS, then the text as one piece. */
size_t tok_ref_encode(const struct ref *r, int add_bos, const char *s, size_t len, int *out);
/* infer_tokenizer_encode_stream's: the text cut before every space, each
 * piece merged alone, the dummy space on the first. */
size_t tok_ref_stream(const struct ref *r, const char *s, size_t len, int *out);

/* len bytes (no NUL) mixing the vocabulary's pieces (control and <0xXX>
 * spellings included), ASCII, spaces, UTF-8 code points of 2-4 bytes, stray
 * continuation or lead bytes and control bytes; NUL-terminated. */
void tok_random_text(struct test_rng *rng, const struct vocab *v, char *o, size_t len);

#endif

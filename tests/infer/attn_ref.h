/* attn_ref.h: the sparse-attention tests' shared set-up: a small model
 * shape, a random int8-mirrored KV cache, random queries, and one call of
 * an attention implementation over a call's rows (test_attn_sparse,
 * test_attn_rows). */
#ifndef SLUICE_TEST_ATTN_REF_H
#define SLUICE_TEST_ATTN_REF_H

#include <stdint.h>

#include "format.h"
#include "infer.h"
#include "testutil.h"

/* H query heads and KV kv heads of hd, seq_len seq; two layers. */
struct format_config attn_ref_shape(uint32_t H, uint32_t KV, uint32_t hd, uint32_t seq);
/* A cache of T slots (int8 K mirror) with normal keys (every 7th value x3)
 * and values. */
struct infer_kv *attn_ref_cache(struct test_rng *rng, const struct format_config *c, uint32_t T);
/* n query rows of normal values x 0.4, those of each 96 columns' first 32
 * also x lift. */
float *attn_ref_q(struct test_rng *rng, const struct format_config *c, uint32_t n, float lift);
/* a->run over n rows after base slots, every head, layer `layer`, into out. */
void attn_ref_run(const struct infer_attention *a, const struct format_config *c,
                  const struct infer_kv *kv, uint32_t layer, uint32_t n, uint32_t base,
                  const float *q, float *out);
/* Sparse attention made with o (keep 1) over the T-slot cache kv equals
 * dense bit for bit on 37 rows and on one (queries attn_ref_q's with
 * lift), and ran the sparse path with every visible key kept. */
void attn_ref_keep_all(struct test_rng *rng, const struct format_config *c,
                       const struct infer_kv *kv, uint32_t T, const struct infer_sparse_opts *o,
                       float lift);

#endif

/* attn_ref.c: the shared set-up of attn_ref.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>

#include <cmocka.h>

#include "attn_ref.h"

struct format_config attn_ref_shape(uint32_t H, uint32_t KV, uint32_t hd, uint32_t seq)
{
    return (struct format_config){.dim = H * hd, .hidden_dim = 64, .n_layers = 2, .n_heads = H,
                                  .n_kv_heads = KV, .head_dim = hd, .vocab_size = 32,
                                  .seq_len = seq, .rope_theta = 10000, .norm_eps = 1e-5f};
}

struct infer_kv *attn_ref_cache(struct test_rng *rng, const struct format_config *c, uint32_t T)
{
    size_t kv_dim = (size_t)c->n_kv_heads * c->head_dim;
    float *k = malloc(sizeof(float) * T * kv_dim), *v = malloc(sizeof(float) * T * kv_dim);
    assert_true(k && v);
    for (size_t i = 0; i < T * kv_dim; i++) {
        k[i] = test_rng_normal(rng) * (i % 7 == 0 ? 3.0f : 1.0f);
        v[i] = test_rng_normal(rng);
    }
    struct infer_kv *kv;
    struct sl_err err;
    assert_int_equal(infer_kv_create(c, 0, INFER_KV_K8, &kv, &err), 0);
    assert_int_equal(infer_kv_append(kv, k, v, T), 0);
    free(k);
    free(v);
    return kv;
}

float *attn_ref_q(struct test_rng *rng, const struct format_config *c, uint32_t n, float lift)
{
    size_t qdim = (size_t)c->n_heads * c->head_dim;
    float *q = malloc(sizeof(float) * n * qdim);
    assert_non_null(q);
    for (size_t i = 0; i < n * qdim; i++)
        q[i] = test_rng_normal(rng) * 0.4f * (i % 96 < 32 ? lift : 1.0f);
    return q;
}

void attn_ref_run(const struct infer_attention *a, const struct format_config *c,
                  const struct infer_kv *kv, uint32_t layer, uint32_t n, uint32_t base,
                  const float *q, float *out)
{
    struct infer_attn_rows rows = {.n = n, .base = base};
    float *scratch = malloc(sizeof(float) * 16 * (base + n));
    assert_non_null(scratch);
    assert_int_equal(a->run(a, c, kv, layer, &rows, q, 0, c->n_heads, out, scratch), 0);
    free(scratch);
}

void attn_ref_keep_all(struct test_rng *rng, const struct format_config *c,
                       const struct infer_kv *kv, uint32_t T, const struct infer_sparse_opts *o,
                       float lift)
{
    size_t qdim = (size_t)c->n_heads * c->head_dim;
    struct infer_sparse *sp;
    struct sl_err err;
    assert_int_equal(infer_sparse_create(c, NULL, o, &sp, &err), 0);
    uint32_t ns[2] = {37, 1};
    for (int j = 0; j < 2; j++) {
        uint32_t n = ns[j], base = T - n;
        float *q = attn_ref_q(rng, c, n, lift), *od = malloc(sizeof(float) * n * qdim),
              *os = malloc(sizeof(float) * n * qdim);
        assert_true(od && os);
        attn_ref_run(&infer_attention_dense, c, kv, 1, n, base, q, od);
        attn_ref_run(infer_sparse_attention(sp), c, kv, 1, n, base, q, os);
        assert_memory_equal(od, os, sizeof(float) * n * qdim);
        free(q);
        free(od);
        free(os);
    }
    struct infer_sparse_stats st;
    infer_sparse_stats(sp, &st);
    assert_int_equal(st.dense_calls, 0); /* the sparse path ran */
    assert_true(st.launches > 0 && st.keys_kept == st.keys_visible);
    infer_sparse_destroy(sp);
}

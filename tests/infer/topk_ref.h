/* topk_ref.h: the reference top-k the sparse-attention tests compare with:
 * a plain sort, shared by test_attn_sparse and test_attn_sel. */
#ifndef SLUICE_TEST_TOPK_REF_H
#define SLUICE_TEST_TOPK_REF_H

#include <stdint.h>

/* qsort comparator of uint32_t, ascending */
int topk_ref_cmp_u32(const void *a, const void *b);

/* The indices of the k largest of s[0..n) (ties: the lower index), in
 * ascending order, by sorting; fails the test if memory runs out. */
void topk_ref_sort(const float *s, uint32_t n, uint32_t k, uint32_t *out);

#endif

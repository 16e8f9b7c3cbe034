/* infer_shadow_internal.h: the shadow (struct infer_shadow) as
 * infer_shadow.c builds it and infer_shadow_term.c runs the term over it. */
#ifndef SLUICE_INFER_SHADOW_INTERNAL_H
#define SLUICE_INFER_SHADOW_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "infer_internal.h"

#define SHADOW_CACHE 64                      /* past the gather: cold columns a call keeps */
#define SHADOW_GATHER_MAX ((size_t)32 << 20) /* default gather_max */

struct shadow_lin {
    const struct format_shadow_linear *e; /* NULL: not described */
    int32_t *slot;                        /* [cols] hot column index, -1: cold */
};

/* One caller's scratch for term_fused, grown on demand (a buffer is
 * replaced, not kept, when a call needs more) and kept between calls in the
 * shadow's pool: one set per term running at once (the calling thread and
 * the device thread run pieces of one matmul's term concurrently; the
 * pipeline's CPU workers too), so after the first calls a term allocates
 * nothing. */
struct shadow_scratch {
    struct shadow_scratch *next; /* in the pool */
    uint32_t *start, *dcol;      /* [cap_cols] */
    const int8_t **hotp;         /* [cap_cols] */
    uint32_t *tok;               /* [cap_ne] */
    float *ex;                   /* [cap_ne] */
    float **out;                 /* [cap_nt] */
    float *acc;                  /* [cap_nt][16 * INFER_SHADOW_COLS_GROUP], aligned */
    int8_t *cols_own;            /* [cap_own] */
    size_t cap_cols, cap_ne, cap_nt, cap_own;
};

struct infer_shadow {
    struct infer_model *m;
    struct format_shadow_linear *e;
    uint32_t n, enabled;
    struct shadow_lin *lin; /* [(n_layers + 1) * FORMAT_ROLE_COUNT], classifier last */
    size_t bytes;
    size_t gather_max; /* bytes of columns a call gathers in one pass */
    int fused;         /* 1: the weights read in place (term_fused) */
    pthread_mutex_t pool_lock;
    struct shadow_scratch *pool; /* the sets no call holds now */
    uint32_t pool_sets;          /* sets made (held by calls or in the pool) */
    /* statistics, added to by concurrent terms (atomics) */
    uint64_t calls, elements, clipped, token_rows, cols_hot, cols_cold;
};

struct shadow_lin *shd_lin_of(const struct infer_shadow *sh, int layer, uint32_t role);
/* A set from the pool, or a new empty one; NULL: out of memory. */
struct shadow_scratch *shd_scratch_take(struct infer_shadow *sh);
void shd_scratch_give(struct infer_shadow *sh, struct shadow_scratch *x);
/* x's buffers for a call of `cols` columns, ne elements, nt token rows.
 * -ENOMEM leaves x usable (what grew is kept, with true capacities). */
int shd_scratch_grow(struct shadow_scratch *x, uint32_t cols, uint32_t ne, uint32_t nt);

/* A buffer of at least n elements of size el in place of old (its contents
 * not kept), whose capacity is cap: old itself when it is large enough, else
 * a new one of n + n / 4 (old freed). *got: the capacity of what is
 * returned; NULL (out of memory): old is kept, *got = cap. */
void *shd_scratch_fit(void *old, size_t cap, size_t n, size_t el, int aligned, size_t *got);
/* x->field fitted to n elements (shd_scratch_fit, got its capacity) while
 * ret is 0; ret = -ENOMEM when that fails. */
#define SCRATCH_FIT(x, field, cap, n, aligned, got, ret)                                           \
    do {                                                                                           \
        if ((ret) == 0) {                                                                          \
            void *q_ =                                                                             \
                shd_scratch_fit((x)->field, (cap), (n), sizeof *(x)->field, (aligned), &(got));    \
            if (q_)                                                                                \
                (x)->field = q_;                                                                   \
            else if ((n) > (cap)) /* NULL with nothing asked of a new set is no failure */         \
                (ret) = -ENOMEM;                                                                   \
        }                                                                                          \
    } while (0)

#endif

/* pipeline_acts.c: the prefill's activation memory. A chunk's own memory is
 * its residual stream x and the down projection d that the next layer's
 * norm adds to it (and the head's last row); everything else a layer
 * computes for a chunk (normed inputs, Q/K/V, attention, O, gate, up, the
 * quantized inputs of the linears) lives in an activation set, scratch held
 * by one (layer, chunk) from its PL_NORM to its last task and then reused.
 * Sets are admitted in the order (layer, chunk), so at most n_sets
 * (layer, chunk)s compute at once: with a long prompt the activations no
 * longer grow with the number of chunks.
 *
 * No deadlock: the earliest unfinished (layer, chunk) U in that order holds a
 * set (everything before it is done and gave its set back), and it waits
 * only for (layer, earlier chunk)s and (earlier layer, its chunk), all done,
 * and for its layer's weights. With packed residency's pool those are
 * admitted in layer order; U's layer can be held up only by storage of its
 * own layer whose matmuls for later chunks wait for sets. So sets are
 * limited only where the pool's budget holds a whole layer (or there is no
 * pool); otherwise every chunk gets one (as many sets as chunks).
 *
 * Inside a set, buffers whose lives do not overlap share memory (the graph's
 * edges decide; see pipeline_graph.c), per row of the chunk:
 *   G: q, k, v, att (the attention's inputs and output), later g;
 *   U: xb and the quantized Q/K/V/O inputs, later o, later u;
 *   A: the quantized gate/up inputs; DQ: the quantized down input;
 *   B: gate/up's normed input, only where a gate or up takes floats
 *      (otherwise it is o's memory in U, as infer_forward does: nothing reads
 *      it once gate and up have their int8 inputs and, with a linear term,
 *      their clipped elements, found by PL_FFN_NORM).
 * Attention pieces write att and the O input while other Q/K/V pieces still
 * read xb and their inputs, SwiGLU pieces write the down input while other
 * gate/up pieces read theirs: those never share. The arithmetic is
 * unchanged, so the logits are bit-identical whatever the number of sets.
 *
 * A down projection adds each computed piece to x at once (pl_mm_residual;
 * with a linear term its shadow task, after adding the term), so its output
 * d is scratch of the set too (U).
 *
 * Large buffers are mapped (not malloc'd): freed, they leave the process at
 * once. Lock held in pl_acts_waits/done/unpark; calls no other pipeline
 * file. */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "pipeline.h"

#define AL(x) sl_align_up((x), 4096)

/* Mapped with transparent huge pages advised on its whole 2 MiB ranges (as
 * the NPU's weight storage is): faulting in a 2 MiB page costs a fraction of
 * its 512 small ones (pipeline_prefault.c does it ahead). Advice only. */
static void *map(size_t len)
{
    void *m = mmap(NULL, len ? len : 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
    if (m == MAP_FAILED)
        return NULL;
    const uintptr_t huge = (uintptr_t)2 << 20;
    uintptr_t lo = ((uintptr_t)m + huge - 1) & ~(huge - 1), hi = ((uintptr_t)m + len) & ~(huge - 1);
    if (hi > lo)
        (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
    return m;
}

static void unmap(void *m, size_t len)
{
    if (m)
        munmap(m, len ? len : 4096);
}

int pl_acts_rows(struct pl *p, uint32_t n)
{
    const struct format_config *c = p->c;
    uint32_t chunk = p->o->chunk;
    size_t D = c->dim;
    p->n_chunks = (n + chunk - 1) / chunk;
    p->cb = sl_calloc(p->n_chunks, sizeof *p->cb);
    if (!p->cb)
        return -ENOMEM;
    p->act_x_len = AL(sizeof(float) * n * D);
    p->act_x = map(p->act_x_len);
    if (!p->act_x)
        return -ENOMEM;
    for (uint32_t ch = 0; ch < p->n_chunks; ch++) {
        struct chunkbuf *b = &p->cb[ch];
        b->pos0 = ch * chunk;
        b->n = n - b->pos0 < chunk ? n - b->pos0 : chunk;
        b->x = p->act_x + (size_t)b->pos0 * D;
        for (int k = 0; k < FORMAT_ROLE_COUNT; k++) {
            pthread_mutex_init(&b->clips[k].mu, NULL);
            b->clips[k].layer = INT_MIN;
        }
        b->clips_init = 1;
        b->xh = sl_malloc(sizeof(float) * D);
        b->xq[FORMAT_ROLE_CLASSIFIER] = sl_alloc_aligned(D, 64);
        if (!b->xh || !b->xq[FORMAT_ROLE_CLASSIFIER])
            return -ENOMEM;
    }
    return 0;
}

/* The set's layout for chunks of R rows. */
static void layout(struct pl *p, size_t R, int need_b)
{
    const struct format_config *c = p->c;
    size_t D = c->dim, Q = (size_t)c->n_heads * c->head_dim;
    size_t KV = (size_t)c->n_kv_heads * c->head_dim, F = c->hidden_dim;
    /* G: q, k, v, att | g */
    size_t g = AL(4 * R * Q) + 2 * AL(4 * R * KV) + AL(4 * R * Q);
    if (AL(4 * R * F) > g)
        g = AL(4 * R * F);
    /* U: xb, xq Q/K/V/O | o | u */
    size_t u = AL(4 * R * D) + 3 * AL(R * D) + AL(R * Q);
    if (AL(4 * R * F) > u)
        u = AL(4 * R * F);
    p->set_u = g;
    p->set_a = g + u;
    p->set_dq = p->set_a + 2 * AL(R * D);
    p->set_b = p->set_dq + AL(R * F);
    p->set_bytes = p->set_b + (need_b ? AL(4 * R * D) : 0);
}

/* The largest layer's int8 storage in the pool (0: no pool). */
static size_t pool_layer_max(const struct pl *p)
{
    size_t best = 0, cur = 0;
    for (uint32_t i = 0; i < p->n_acq; i++) {
        if (i && p->acq[i].layer != p->acq[i - 1].layer)
            cur = 0;
        cur += p->acq[i].bytes;
        best = cur > best ? cur : best;
    }
    return best;
}

int pl_acts_init(struct pl *p, uint32_t sets)
{
    uint32_t L = p->c->n_layers, nc = p->n_chunks;
    int need_b = 0;
    for (uint32_t l = 1; l <= L; l++)
        need_b |= !p->lin_info[l][FORMAT_ROLE_W_GATE].int8 || !p->lin_info[l][FORMAT_ROLE_W_UP].int8;
    layout(p, p->cb[0].n, need_b);
    uint32_t s = sets ? sets : PL_ACT_SETS;
    if (s > nc || (p->n_acq && pool_layer_max(p) > p->int8_budget))
        s = nc;
    p->n_cl = L * nc;
    p->cl_set = sl_malloc(sizeof *p->cl_set * (p->n_cl ? p->n_cl : 1));
    p->cl_left = sl_calloc(p->n_cl ? p->n_cl : 1, sizeof *p->cl_left);
    p->cl_norm = sl_calloc(p->n_cl ? p->n_cl : 1, sizeof *p->cl_norm);
    p->cl_parked = sl_calloc(p->n_cl ? p->n_cl : 1, 1);
    p->set_free = sl_malloc(sizeof *p->set_free * s);
    if (!p->cl_set || !p->cl_left || !p->cl_norm || !p->cl_parked || !p->set_free)
        return -ENOMEM;
    p->set_len = AL(p->set_bytes * s);
    p->set_mem = map(p->set_len);
    if (!p->set_mem)
        return -ENOMEM;
    p->n_sets = s;
    for (uint32_t i = 0; i < s; i++)
        p->set_free[i] = s - 1 - i; /* set 0 first */
    p->n_free = s;
    for (uint32_t i = 0; i < p->n_cl; i++)
        p->cl_set[i] = -1;
    for (uint32_t i = 0; i < p->n_tasks; i++) {
        const struct task *t = &p->tasks[i];
        if (t->layer < 0 || t->op == PL_VERIFY || t->op == PL_UNPACK || t->op == PL_HEAD)
            continue;
        size_t k = (size_t)t->layer * nc + t->chunk;
        p->cl_left[k]++;
        if (t->op == PL_NORM)
            p->cl_norm[k] = i;
    }
    p->cl_next = 0;
    while (pl_acts_unpark(p) != UINT32_MAX) /* nothing parked yet: admits only */
        ;
    return 0;
}

static int uses_set(const struct task *t)
{
    return t->layer >= 0 && t->op != PL_VERIFY && t->op != PL_UNPACK && t->op != PL_HEAD;
}

int pl_acts_waits(struct pl *p, uint32_t ti)
{
    const struct task *t = &p->tasks[ti];
    if (t->op != PL_NORM || !p->cl_set)
        return 0;
    size_t k = (size_t)t->layer * p->n_chunks + t->chunk;
    if (p->cl_set[k] >= 0)
        return 0;
    p->cl_parked[k] = 1;
    return 1;
}

int pl_acts_done(struct pl *p, const struct task *t)
{
    if (!p->cl_left || !uses_set(t))
        return 0;
    size_t k = (size_t)t->layer * p->n_chunks + t->chunk;
    if (--p->cl_left[k] > 0)
        return 0;
    p->set_free[p->n_free++] = (uint32_t)p->cl_set[k];
    return 1;
}

uint32_t pl_acts_unpark(struct pl *p)
{
    while (p->cl_next < p->n_cl && p->n_free)
        p->cl_set[p->cl_next++] = (int32_t)p->set_free[--p->n_free];
    for (uint32_t k = 0; k < p->cl_next; k++)
        if (p->cl_parked[k]) {
            p->cl_parked[k] = 0;
            return p->cl_norm[k];
        }
    return UINT32_MAX;
}

void pl_acts_bind(struct pl *p, uint32_t chunk, int layer)
{
    const struct format_config *c = p->c;
    size_t R = p->cb[0].n, D = c->dim, Q = (size_t)c->n_heads * c->head_dim;
    size_t KV = (size_t)c->n_kv_heads * c->head_dim;
    struct chunkbuf *b = &p->cb[chunk];
    uint8_t *s = p->set_mem + (size_t)p->cl_set[(size_t)layer * p->n_chunks + chunk] *
                                  p->set_bytes;
    uint8_t *u = s + p->set_u, *a = s + p->set_a;
    b->q = (float *)s;
    b->k = (float *)(s + AL(4 * R * Q));
    b->v = (float *)(s + AL(4 * R * Q) + AL(4 * R * KV));
    b->att = (float *)(s + AL(4 * R * Q) + 2 * AL(4 * R * KV));
    b->g = (float *)s;
    b->xb = (float *)u;
    b->o = (float *)u;
    b->u = (float *)u;
    b->xq[FORMAT_ROLE_WQ] = (int8_t *)(u + AL(4 * R * D));
    b->xq[FORMAT_ROLE_WK] = (int8_t *)(u + AL(4 * R * D) + AL(R * D));
    b->xq[FORMAT_ROLE_WV] = (int8_t *)(u + AL(4 * R * D) + 2 * AL(R * D));
    b->xq[FORMAT_ROLE_WO] = (int8_t *)(u + AL(4 * R * D) + 3 * AL(R * D));
    b->xq[FORMAT_ROLE_W_GATE] = (int8_t *)a;
    b->xq[FORMAT_ROLE_W_UP] = (int8_t *)(a + AL(R * D));
    b->xq[FORMAT_ROLE_W_DOWN] = (int8_t *)(s + p->set_dq);
    b->xf = p->set_bytes > p->set_b ? (float *)(s + p->set_b) : b->o;
    /* d: U's (u is dead once every SwiGLU piece is done, and each down piece
     * adds its channels to x at once: pl_mm_residual, or with a linear term
     * its shadow task after the term) */
    b->d = (float *)u;
}

void pl_acts_fini(struct pl *p)
{
    for (uint32_t ch = 0; p->cb && ch < p->n_chunks; ch++) {
        struct chunkbuf *b = &p->cb[ch];
        free(b->xh);
        sl_free_aligned(b->xq[FORMAT_ROLE_CLASSIFIER]);
        for (int k = 0; b->clips_init && k < FORMAT_ROLE_COUNT; k++) {
            pthread_mutex_destroy(&b->clips[k].mu);
            infer_clipbuf_free(&b->clips[k].buf);
        }
    }
    free(p->cb);
    p->cb = NULL;
    unmap(p->act_x, p->act_x_len);
    unmap(p->set_mem, p->set_len);
    p->act_x = NULL;
    p->set_mem = NULL;
    free(p->cl_set);
    free(p->cl_left);
    free(p->cl_norm);
    free(p->cl_parked);
    free(p->set_free);
    p->cl_set = NULL;
    p->cl_left = NULL;
    p->cl_norm = NULL;
    p->cl_parked = NULL;
    p->set_free = NULL;
}

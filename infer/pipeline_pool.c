/* pipeline_pool.c: packed residency's bounded int8 memory. With packed
 * residency the int8 copies of the layers' linears exist only for the
 * prefill's matmuls, so they come from a pool: a linear is admitted (its
 * NPU weight storage taken from the pool, or allocated) in execution order
 * (layer, then the order of its matmuls) while the storage in use stays
 * within a budget, and its storage goes back to the pool the moment its last
 * matmul is done, for a later linear of the same shape. So the int8 copies
 * of the whole model never coexist (the peak RSS stays near the packed
 * size), and after the first layers the unpacking fills memory that is
 * already faulted in: no page zeroing. A linear takes a free storage of its
 * own shape, else the smallest free one that holds it (npu_weights_reshape),
 * and only then fresh memory; the budget counts the storages' bytes. The
 * default budget, max(48 MiB, 4 x the largest linear), keeps linears after
 * the one computing admitted (unpacked ahead) on shapes whose linears pass
 * 48 MiB (llama3-8b's FFN matrices: 58.7 MB each); with 48 MiB there, each
 * was admitted alone, its unpacking serialized with the matmuls before and
 * after it, and its memory fresh every time (another shape's storage was
 * freed for it). Admission in execution order cannot
 * deadlock: the earliest linear not admitted waits only for linears before
 * it, whose matmuls need nothing after it, and with nothing in use it is
 * admitted whatever its size.
 *
 * Calls pipeline_graph.c only; the queue (pipeline_queue.c) parks the
 * unpacking tasks of linears not admitted yet and hands them on after
 * pl_pool_admit. Lock held everywhere except init and fini. */
#include <errno.h>
#include <stdlib.h>

#include "pipeline.h"

/* the roles of a layer in the order of their matmuls */
static int exec_rank(uint32_t role)
{
    static const uint8_t order[] = {FORMAT_ROLE_WQ, FORMAT_ROLE_WK, FORMAT_ROLE_WV,
                                    FORMAT_ROLE_WO, FORMAT_ROLE_W_GATE, FORMAT_ROLE_W_UP,
                                    FORMAT_ROLE_W_DOWN};
    for (int i = 0; i < (int)sizeof order; i++)
        if (order[i] == role)
            return i;
    return (int)sizeof order;
}

static size_t lin_index(const struct pl *p, int layer, uint32_t role)
{
    (void)p;
    return (size_t)(layer + 1) * FORMAT_ROLE_COUNT + role;
}

static size_t weight_bytes(uint32_t rows, uint32_t cols)
{
    /* npu_gemm_b's layout: rows to 16, columns to 4 (npu_weights_capacity of
     * a fresh storage; its scales and row sums, 8 bytes a row, not counted) */
    return (size_t)((rows + 15) & ~15u) * ((cols + 3) & ~3u);
}

int pl_pool_add(struct pl *p, int layer, uint32_t role, uint32_t rows, uint32_t cols)
{
    if (!p->lin_acq) {
        size_t n = (size_t)(p->c->n_layers + 1) * FORMAT_ROLE_COUNT;
        p->lin_acq = sl_malloc(sizeof *p->lin_acq * n);
        p->lin_mm = sl_calloc(n, sizeof *p->lin_mm);
        if (!p->lin_acq || !p->lin_mm)
            return -ENOMEM;
        for (size_t i = 0; i < n; i++)
            p->lin_acq[i] = -1;
    }
    if (p->n_acq == p->cap_acq) {
        uint32_t cap = p->cap_acq ? 2 * p->cap_acq : 64;
        struct pl_acq *a = sl_realloc(p->acq, sizeof *a * cap);
        if (!a)
            return -ENOMEM;
        p->acq = a;
        p->cap_acq = cap;
    }
    p->acq[p->n_acq++] = (struct pl_acq){.layer = layer, .role = (uint8_t)role, .rows = rows,
                                         .cols = cols, .bytes = weight_bytes(rows, cols)};
    return 0;
}

static int acq_cmp(const void *a, const void *b)
{
    const struct pl_acq *x = a, *y = b;
    if (x->layer != y->layer)
        return x->layer < y->layer ? -1 : 1;
    return exec_rank(x->role) - exec_rank(y->role);
}

int pl_pool_init(struct pl *p, size_t budget)
{
    if (!p->n_acq)
        return 0;
    qsort(p->acq, p->n_acq, sizeof *p->acq, acq_cmp);
    for (uint32_t i = 0; i < p->n_acq; i++)
        p->lin_acq[lin_index(p, p->acq[i].layer, p->acq[i].role)] = (int32_t)i;
    for (uint32_t i = 0; i < p->n_tasks; i++) {
        const struct task *t = &p->tasks[i];
        if (t->op == PL_MM)
            p->lin_mm[lin_index(p, t->layer, t->role)]++;
    }
    if (!budget) {
        size_t big = 0;
        for (uint32_t i = 0; i < p->n_acq; i++)
            big = p->acq[i].bytes > big ? p->acq[i].bytes : big;
        budget = (size_t)PL_INT8_BUDGET_MB << 20;
        if (big > budget / PL_INT8_BUDGET_LINEARS)
            budget = big * PL_INT8_BUDGET_LINEARS;
    }
    p->int8_budget = budget;
    p->cap_pool = p->n_acq;
    p->pool = sl_calloc(p->cap_pool, sizeof *p->pool);
    p->parked = sl_malloc(sizeof *p->parked * (p->cap_tasks ? p->cap_tasks : 1));
    return p->pool && p->parked ? 0 : -ENOMEM;
}

int pl_pool_waits(const struct pl *p, const struct task *t)
{
    if (!p->n_acq || t->op != PL_UNPACK)
        return 0;
    int32_t a = p->lin_acq[lin_index(p, t->layer, t->role)];
    return a >= 0 && (uint32_t)a >= p->acq_next;
}

/* The free storage for a: one of its shape, else the smallest that holds
 * it; its index, or -1. */
static int pool_find(const struct pl *p, const struct pl_acq *a)
{
    int best = -1;
    for (uint32_t i = 0; i < p->n_pool; i++) {
        const struct npu_weights *w = p->pool[i];
        if (npu_weights_rows(w) == a->rows && npu_weights_cols(w) == a->cols)
            return (int)i;
        size_t cap = npu_weights_capacity(w);
        if (cap >= a->bytes && (best < 0 || cap < npu_weights_capacity(p->pool[best])))
            best = (int)i;
    }
    return best;
}

/* The smallest free storage destroyed (there is one). */
static void pool_drop_smallest(struct pl *p)
{
    uint32_t s = 0;
    for (uint32_t i = 1; i < p->n_pool; i++)
        if (npu_weights_capacity(p->pool[i]) < npu_weights_capacity(p->pool[s]))
            s = i;
    struct npu_weights *o = p->pool[s];
    p->pool[s] = p->pool[--p->n_pool];
    p->int8_alloc -= npu_weights_capacity(o);
    npu_weights_destroy(o);
}

int pl_pool_admit(struct pl *p)
{
    while (p->acq_next < p->n_acq) {
        struct pl_acq *a = &p->acq[p->acq_next];
        int i = pool_find(p, a);
        size_t cost = i >= 0 ? npu_weights_capacity(p->pool[i]) : a->bytes;
        if (p->int8_used && p->int8_used + cost > p->int8_budget)
            return 0;
        struct npu_weights *w = NULL;
        if (i >= 0) {
            w = p->pool[i];
            int ret = npu_weights_reshape(w, a->rows, a->cols); /* same shape: no change */
            if (ret < 0)
                return ret; /* -ENOMEM (its scales); w stays in the pool */
            p->pool[i] = p->pool[--p->n_pool];
            p->int8_reused += a->bytes;
        } else {
            /* a new one: free storage (all too small for it) goes first
             * where the total would pass the budget */
            while (p->n_pool && p->int8_alloc + a->bytes > p->int8_budget)
                pool_drop_smallest(p);
            int ret = npu_weights_alloc(a->rows, a->cols, &w);
            if (ret < 0)
                return ret;
            p->int8_alloc += a->bytes;
            p->int8_fresh += a->bytes;
        }
        pl_graph_linear(p, a->layer, a->role)->npu = w;
        a->cost = cost;
        p->int8_used += cost;
        if (p->int8_alloc > p->int8_peak)
            p->int8_peak = p->int8_alloc;
        p->acq_next++;
    }
    /* every linear admitted: free storage has no later user; freed now, the
     * end of the prefill (the KV cache at its fullest) does not hold it */
    while (p->n_pool)
        pool_drop_smallest(p);
    return 0;
}

int pl_pool_mm_done(struct pl *p, const struct task *t)
{
    if (!p->n_acq)
        return 0;
    size_t li = lin_index(p, t->layer, t->role);
    if (p->lin_acq[li] < 0 || --p->lin_mm[li] > 0)
        return 0;
    struct infer_linear *lin = pl_graph_linear(p, t->layer, t->role);
    p->int8_used -= p->acq[p->lin_acq[li]].cost;
    if (p->acq_next == p->n_acq) { /* nothing left to admit: freed (pl_pool_admit) */
        p->int8_alloc -= npu_weights_capacity(lin->npu);
        if (p->unmap) /* not taken yet (each completion takes its own): free it here */
            npu_weights_destroy(p->unmap);
        p->unmap = lin->npu; /* freed by the completing thread once it unlocks */
        lin->npu = NULL;
        return 0;
    }
    p->pool[p->n_pool++] = lin->npu; /* n_pool < n_acq: one slot per linear */
    lin->npu = NULL;
    return 1;
}

struct npu_weights *pl_pool_take_unmap(struct pl *p)
{
    struct npu_weights *w = p->unmap;
    p->unmap = NULL;
    return w;
}

void pl_pool_fini(struct pl *p)
{
    npu_weights_destroy(p->unmap);
    p->unmap = NULL;
    for (uint32_t i = 0; i < p->n_pool; i++)
        npu_weights_destroy(p->pool[i]);
    p->n_pool = 0;
    free(p->pool);
    free(p->parked);
    free(p->acq);
    free(p->lin_acq);
    free(p->lin_mm);
    p->pool = NULL;
    p->parked = NULL;
    p->acq = NULL;
    p->lin_acq = NULL;
    p->lin_mm = NULL;
}

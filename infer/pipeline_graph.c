/* pipeline_graph.c: the prefill as a task graph. Every
 * (layer, chunk) of the prompt contributes the operators of Appendix B
 * (pipeline.h, enum pl_op); each slice a VERIFY task and the unpacking of its
 * tensors, in the pieces of their matmuls where the policy splits them.
 * Edges are collected as pairs and turned into CSR successor lists; the
 * keys and estimates come from pipeline_cost.c. Calls pipeline_weights.c
 * (the storage of split weights is prepared here) and pipeline_cost.c. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline.h"

static const char *const op_names[PL_OP_COUNT] = {"verify",    "unpack",   "norm",
                                                  "matmul",    "attention", "ffn_norm",
                                                  "swiglu",    "head",      "shadow"};
static const char *const policy_names[INFER_POLICY_COUNT] = {
    "full", "sequential", "layer_overlap", "llmnpu", "sequential_granular"};

const char *infer_policy_name(enum infer_policy p)
{
    return (unsigned)p < INFER_POLICY_COUNT ? policy_names[p] : "unknown";
}

const char *pl_op_name(uint32_t op)
{
    return op < PL_OP_COUNT ? op_names[op] : "unknown";
}

int infer_policy_parse(const char *s, enum infer_policy *out)
{
    for (int i = 0; i < INFER_POLICY_COUNT; i++)
        if (!strcmp(s, policy_names[i])) {
            *out = (enum infer_policy)i;
            return 0;
        }
    return -EINVAL;
}

/* A growable array one element fuller: items reallocated to twice *cap
 * elements of `size` bytes (`first` when empty); NULL when out of memory
 * (items untouched). */
static void *grown(void *items, uint32_t *cap, size_t size, uint32_t first)
{
    uint32_t c = *cap ? 2 * *cap : first;
    void *a = sl_realloc(items, size * c);
    if (a)
        *cap = c;
    return a;
}

/* A new task; its index, or -ENOMEM. */
static int add_task(struct pl *p, uint8_t op, uint8_t dev, int layer, uint32_t chunk)
{
    if (p->n_tasks == p->cap_tasks) {
        struct task *t = grown(p->tasks, &p->cap_tasks, sizeof *t, 1024);
        if (!t)
            return -ENOMEM;
        p->tasks = t;
    }
    struct task *t = &p->tasks[p->n_tasks];
    memset(t, 0, sizeof *t);
    t->op = op;
    t->dev = dev;
    t->layer = (int16_t)layer;
    t->chunk = chunk;
    t->tensor = -1;
    t->executor = -1;
    return (int)p->n_tasks++;
}

/* Task `to` waits for task `from`. 0, -ENOMEM, or -EINVAL for a task that
 * does not exist (a layer without a slice). */
static int add_edge(struct pl *p, int from, int to)
{
    if (from < 0 || to < 0)
        return -EINVAL;
    if (p->n_edges == p->cap_edges) {
        uint32_t cap = p->cap_edges ? 2 * p->cap_edges : 4096;
        uint32_t *a = sl_realloc(p->edge_from, sizeof *a * cap), *b;
        if (!a)
            return -ENOMEM;
        p->edge_from = a;
        b = sl_realloc(p->edge_to, sizeof *b * cap);
        if (!b)
            return -ENOMEM;
        p->edge_to = b;
        p->cap_edges = cap;
    }
    p->edge_from[p->n_edges] = (uint32_t)from;
    p->edge_to[p->n_edges] = (uint32_t)to;
    p->n_edges++;
    p->tasks[to].deps++;
    return 0;
}

/* Edges to `to` from each of the n tasks at `first`, in order. */
static int add_edges_from(struct pl *p, int first, int n, int to)
{
    for (int k = 0; k < n; k++) {
        int ret = add_edge(p, first + k, to);
        if (ret < 0)
            return ret;
    }
    return 0;
}

/* Edges from `from` to each of the n tasks at `first`, in order. */
static int add_edges_to(struct pl *p, int from, int first, int n)
{
    for (int j = 0; j < n; j++) {
        int ret = add_edge(p, from, first + j);
        if (ret < 0)
            return ret;
    }
    return 0;
}

/* The collected edges as CSR successor lists (p->edges, succ_off, n_succ). */
static int finish_edges(struct pl *p)
{
    p->edges = sl_malloc(sizeof(uint32_t) * (p->n_edges ? p->n_edges : 1));
    uint32_t *cnt = sl_calloc(p->n_tasks + 1, sizeof(uint32_t));
    if (!p->edges || !cnt) {
        free(cnt);
        return -ENOMEM;
    }
    for (uint32_t e = 0; e < p->n_edges; e++)
        cnt[p->edge_from[e]]++;
    uint32_t off = 0;
    for (uint32_t i = 0; i < p->n_tasks; i++) {
        p->tasks[i].succ_off = off;
        off += cnt[i];
        cnt[i] = p->tasks[i].succ_off;
    }
    for (uint32_t e = 0; e < p->n_edges; e++)
        p->edges[cnt[p->edge_from[e]]++] = p->edge_to[e];
    for (uint32_t i = 0; i < p->n_tasks; i++)
        p->tasks[i].n_succ = cnt[i] - p->tasks[i].succ_off;
    free(cnt);
    return 0;
}

struct infer_linear *pl_graph_linear(const struct pl *p, int layer, uint32_t role)
{
    /* layer -1: the classifier (the embedding itself when tied) */
    return infer_model_linear(p->m, layer, layer < 0 ? FORMAT_ROLE_CLASSIFIER : role);
}

/* Output channels per piece of a linear with `rows` outputs: full and
 * sequential_granular split each matmul, and the unpacking of its quantized weights,
 * into pieces of about `split` channels on 16-channel boundaries (the NPU's
 * weight blocks); the coarse policies keep one piece. */
static uint32_t piece_rows(const struct pl *p, uint32_t rows)
{
    uint32_t split = pl_granular(p->o->policy) ? p->o->split : 0;
    if (!split || split >= rows)
        return rows;
    uint32_t parts = (rows + split - 1) / split;
    uint32_t step = ((rows + parts - 1) / parts + 15) & ~15u;
    return step < rows ? step : rows;
}

/* Matmul tasks of one linear for a chunk, one per piece: the first index in
 * *first, their number in *count. 0 or -ENOMEM. */
static int add_mm(struct pl *p, int layer, uint32_t chunk, uint32_t role, uint32_t rows,
                  int *first, int *count)
{
    uint32_t step = piece_rows(p, rows);
    *first = (int)p->n_tasks;
    *count = 0;
    for (uint32_t r0 = 0; r0 < rows; r0 += step) {
        int t = add_task(p, PL_MM, PL_DEV_NPU, layer, chunk);
        if (t < 0)
            return t;
        p->tasks[t].role = (uint8_t)role;
        p->tasks[t].r0 = r0;
        p->tasks[t].r1 = rows - r0 < step ? rows : r0 + step;
        (*count)++;
    }
    return 0;
}

/* Edges from a linear's unpacking tasks to its matmul pieces: each piece
 * waits for the unpacking of its own channels (all of it for a whole-tensor
 * unpacking task, whose r0 = r1 = 0). */
static int add_weight_edges(struct pl *p, int u_first, int u_n, int mm_first, int mm_n)
{
    for (int j = 0; j < mm_n; j++)
        for (int k = 0; k < u_n; k++) {
            const struct task *u = &p->tasks[u_first + k], *m = &p->tasks[mm_first + j];
            int ret = 0;
            if (u->r1 == u->r0 || (u->r0 < m->r1 && u->r1 > m->r0))
                ret = add_edge(p, u_first + k, mm_first + j);
            if (ret < 0)
                return ret;
        }
    return 0;
}

struct weight_tasks {
    int first, n; /* a linear's unpacking tasks */
};

/* Registers the storage of prepared weights for faulting in ahead (full). */
static int add_prefault(struct pl *p, struct npu_weights *w, int layer)
{
    const size_t step = (size_t)2 << 20;
    if (p->o->policy != INFER_POLICY_FULL || p->o->no_prefault || !w)
        return 0;
    for (size_t off = 0; off < npu_weights_storage(w); off += step) {
        if (p->n_pf == p->cap_pf) {
            struct prefault *a = grown(p->pf, &p->cap_pf, sizeof *a, 256);
            if (!a)
                return -ENOMEM;
            p->pf = a;
        }
        p->pf[p->n_pf++] = (struct prefault){.w = w, .off = off, .len = step, .layer = layer};
    }
    return 0;
}

/* The linear term's tasks of (layer, role) for a chunk where the model's
 * term wants it (lin_info term): one per piece of its matmul (the n tasks at
 * `mm`), after that piece and over its output channels, so that it adds into
 * the piece's output in place while both the output and the weights the NPU
 * has just read are in the cache, and overlaps the NPU's next piece. Their
 * first index and count in *first, *count (0: no term). Consumers get their
 * edges from these like from the matmul's pieces. With packed residency
 * each also waits for the linear's first unpacking task (uw's first, r0 0):
 * that task keeps the packed codes the term then reads (lin->upk), and a
 * later piece's matmul does not wait for it. 0 or a negative errno. */
static int add_shadow(struct pl *p, const struct weight_tasks *uw, int layer, uint32_t chunk,
                      uint32_t role, int mm, int n_mm, int *first, int *count)
{
    *first = (int)p->n_tasks;
    *count = 0;
    if (!p->lin_info[layer + 1][role].term)
        return 0;
    for (int j = 0; j < n_mm; j++) {
        int t = add_task(p, PL_SHADOW, PL_DEV_CPU, layer, chunk);
        if (t < 0)
            return t;
        p->tasks[t].role = (uint8_t)role;
        p->tasks[t].r0 = p->tasks[mm + j].r0;
        p->tasks[t].r1 = p->tasks[mm + j].r1;
        (*count)++;
        int ret = add_edge(p, mm + j, t);
        if (ret == 0 && p->o->resident == INFER_RESIDENT_PACKED && uw->n > 0)
            ret = add_edge(p, uw->first, t);
        if (ret < 0)
            return ret;
    }
    return 0;
}

static int add_overlap_edges(struct pl *p, int first, int n, uint32_t a, uint32_t b, int to)
{
    for (int j = 0; j < n; j++) {
        const struct task *t = &p->tasks[first + j];
        int ret = t->r0 < b && t->r1 > a ? add_edge(p, first + j, to) : 0;
        if (ret < 0)
            return ret;
    }
    return 0;
}

/* Whether the producer of a linear's input may quantize it in column
 * ranges: not with a dynamic scale (the maximum of the whole input). */
static int input_splits(const struct pl *p, int layer, uint32_t role)
{
    return !(p->lin_info[layer + 1][role].int8 && p->lin_info[layer + 1][role].act <= 0);
}

/* Whether (layer, role)'s matmul computes one row in every chunk: the
 * classifier (the head: the last row), and with the last layer trimmed
 * (enum pl_trim, p->trim_last) that layer's O, gate, up and down, which
 * only the last chunk's last row computes (K and V: every row), and Q too
 * where each query row is computed alone (PL_TRIMS_ROWS). Packed
 * residency takes these straight from the packed codes: unpacking a whole
 * tensor into int8 for one row cost more than the product (issue 22: the
 * cold start's tail after the last slice). */
static int one_row_linear(const struct pl *p, int layer, uint32_t role)
{
    if (layer < 0)
        return 1;
    if (!p->trim_last || (uint32_t)layer + 1 != p->c->n_layers)
        return 0;
    return (role == FORMAT_ROLE_WQ && p->trim_last == PL_TRIMS_ROWS) || role == FORMAT_ROLE_WO ||
           role == FORMAT_ROLE_W_GATE || role == FORMAT_ROLE_W_UP || role == FORMAT_ROLE_W_DOWN;
}

/* The tasks of the slices the first token needs: each slice's VERIFY
 * (waiting for its arrival, and in the load-first policies for a barrier
 * after every slice) and the unpacking of its linears, whole or in the
 * pieces of their matmuls (their storage prepared now). Each layer's VERIFY
 * in verify_of_layer[layer] (the head's at [n_layers]), each linear's
 * unpacking tasks in uw. 0 or a negative errno. */
static int add_slice_tasks(struct pl *p, struct weight_tasks (*uw)[FORMAT_ROLE_COUNT],
                           int *verify_of_layer)
{
    const struct format_config *c = p->c;
    const struct format_reader *r = p->r;
    uint32_t ns = format_reader_n_slices(r), L = c->n_layers;
    int all_loaded = -1, ret;
    if (pl_load_first(p->o->policy)) {
        all_loaded = add_task(p, PL_VERIFY, PL_DEV_CPU, -2, 0); /* a barrier: no work of its own */
        if (all_loaded < 0)
            return all_loaded;
        p->tasks[all_loaded].slice = UINT32_MAX;
    }
    for (uint32_t i = 0; i < ns; i++) {
        const struct format_slice_info *s = format_reader_slice(r, i);
        if (s->kind == FORMAT_SLICE_EMBED)
            continue; /* read after the first token */
        int li = s->kind == FORMAT_SLICE_LAYER ? s->layer : (int)L;
        int v = add_task(p, PL_VERIFY, PL_DEV_CPU, s->kind == FORMAT_SLICE_LAYER ? s->layer : -1, 0);
        if (v < 0)
            return v;
        p->tasks[v].slice = i;
        p->tasks[v].deps = 1; /* the slice's arrival */
        p->verify_task[i] = (uint32_t)v;
        p->slice_needed[i] = 1;
        verify_of_layer[li] = v;
        if (all_loaded >= 0 && (ret = add_edge(p, all_loaded, v)) < 0)
            return ret;
        for (uint32_t t = s->first_tensor; t < s->first_tensor + s->n_tensors; t++) {
            const struct format_tensor_info *ti = format_reader_tensor(r, t);
            uint32_t role = ti->role;
            if (ti->n_dims != 2)
                continue; /* norms: decoded by VERIFY */
            if (role == FORMAT_ROLE_TOK_EMBD)
                role = FORMAT_ROLE_CLASSIFIER; /* tied */
            /* quantized weights are unpacked in the pieces of their matmuls
             * (into storage prepared now), so the NPU can start on the first
             * piece while the CPU unpacks the next */
            uint32_t rows = (uint32_t)ti->shape[0];
            uint32_t step = format_encoding_traits(ti->encoding)->quantized ? piece_rows(p, rows)
                                                                            : rows;
            int layer = s->kind == FORMAT_SLICE_LAYER ? s->layer : -1;
            /* packed residency: a layer's linear takes its int8 storage from
             * the pool when admitted (pipeline_pool.c); a linear whose
             * matmul is one row (one_row_linear) runs from its packed bytes
             * with decoding's dot kernel (no int8 at all) */
            int packed = p->o->resident == INFER_RESIDENT_PACKED &&
                         pl_granular(p->o->policy) && ti->encoding != FORMAT_ENC_Q8_CHANNEL &&
                         format_encoding_traits(ti->encoding)->quantized &&
                         !p->lin_info[layer + 1][role].term;
            if (packed) {
                struct infer_linear *lin = pl_graph_linear(p, layer, role);
                int one_row = one_row_linear(p, layer, role);
                ret = pl_weights_prepare(lin, ti, p->m->force_dynamic_act, 0, 0, &p->err);
                if (ret == 0 && !one_row)
                    ret = pl_pool_add(p, layer, role, rows, (uint32_t)ti->shape[1]);
                if (ret < 0)
                    return ret;
                if (one_row) {
                    p->lin_info[layer + 1][role].packed_mm = 1;
                    step = rows; /* one task: keeps the bytes */
                }
            } else if (step < rows) {
                struct infer_linear *lin = pl_graph_linear(p, layer, role);
                ret = pl_weights_prepare(lin, ti, p->m->force_dynamic_act, 0, 1, &p->err);
                if (ret < 0)
                    return ret;
                if ((ret = add_prefault(p, lin->npu, li)) < 0)
                    return ret;
            }
            uw[li][role].first = (int)p->n_tasks;
            uw[li][role].n = 0;
            for (uint32_t r0 = 0; r0 < rows; r0 += step) {
                int u = add_task(p, PL_UNPACK, PL_DEV_CPU, layer, 0);
                if (u < 0)
                    return u;
                if ((ret = add_edge(p, v, u)) < 0)
                    return ret;
                p->tasks[u].slice = i;
                p->tasks[u].tensor = (int32_t)t;
                p->tasks[u].role = (uint8_t)role;
                if (step < rows) { /* a piece; 0, 0: the whole tensor */
                    p->tasks[u].r0 = r0;
                    p->tasks[u].r1 = rows - r0 < step ? rows : r0 + step;
                }
                uw[li][role].n++;
                p->slice_left[i]++;
            }
        }
    }
    return 0;
}

/* How the last layer may compute only what the first token needs (enum
 * pl_trim_mode): the last row's Q, O and FFN give the same bits as that row
 * of the whole chunk's, because each is an int8 matmul with a static
 * activation scale (codes and int32 sums row by row), without a linear
 * term (its clipped elements are found over the chunk). Dense causal
 * attention computes each query row on its own (infer_attn.c):
 * PL_TRIMS_ROWS. Sparse attention (with min_keys 0; infer.h's
 * INFER_ATTN_TRIM_CALLS) keeps its calls of the first and the last chunk
 * whole (PL_TRIMS_CALLS): its buckets come from the call's rows and its
 * first sparse call, the first chunk's, while the chunks between
 * feed only that layer's outputs of their own rows, which nothing reads
 * (keys and values, the cache's, are still stored; sparse attention's int8
 * key mirror quantizes each slot alone, whenever a call first sees it). */
static int trim_allowed(const struct pl *p)
{
    static const uint32_t roles[] = {FORMAT_ROLE_WQ, FORMAT_ROLE_WO, FORMAT_ROLE_W_GATE,
                                     FORMAT_ROLE_W_UP, FORMAT_ROLE_W_DOWN};
    uint32_t L = p->c->n_layers;
    if (p->o->no_trim_last || L == 0)
        return PL_TRIMS_OFF;
    for (size_t k = 0; k < sizeof roles / sizeof roles[0]; k++) {
        uint32_t r = roles[k];
        if (!p->lin_info[L][r].int8 || p->lin_info[L][r].act <= 0 || p->lin_info[L][r].term)
            return PL_TRIMS_OFF;
    }
    /* K and V feed only the cache: a term there is still fine (every row) */
    switch (p->st->attn->trim) { /* enum infer_attn_trim: the attention says */
    case INFER_ATTN_TRIM_ROWS:
        return PL_TRIMS_ROWS;
    case INFER_ATTN_TRIM_CALLS:
        return PL_TRIMS_CALLS;
    default:
        return PL_TRIMS_OFF;
    }
}

/* Attention pieces of one kv head group by query rows (infer_pipeline_opts
 * attn_rows): starts[0..return) the first row of each, starts[return] the
 * chunk's rows. One piece (starts {0, n}) unless the policy is granular,
 * attention dense (each query row computed alone: infer_attn.c), the layer
 * untrimmed and O's input quantized with a static scale (each piece
 * quantizes its rows). Where the cuts fall: pl_attn_split. */
static uint32_t attn_row_pieces(const struct pl *p, uint32_t ch, int layer, uint32_t heads,
                                uint8_t trim, uint32_t starts[PL_ATTN_MAX_PIECES + 1])
{
    const struct chunkbuf *b = &p->cb[ch];
    starts[0] = 0;
    starts[1] = b->n;
    if (!pl_granular(p->o->policy) || trim != PL_TRIM_NONE || p->o->attn_rows == UINT32_MAX ||
        p->st->attn != &infer_attention_dense || !input_splits(p, layer, FORMAT_ROLE_WO))
        return 1;
    /* flops a key: Q.K and P.V, a multiply and an add each, per head */
    return pl_attn_split(b->n, b->pos0, 4.0 * heads * p->c->head_dim, p->o->attn_rows, starts);
}

/* The first piece (q0 == 0) of the attention of kv heads starting r0 among
 * the tasks from `first` on of (layer, chunk): the piece that stores that
 * group's keys and values; -1 if none. */
static int group_first_piece(const struct pl *p, int first, int layer, uint32_t chunk, uint32_t r0)
{
    for (uint32_t i = (uint32_t)first; i < p->n_tasks; i++) {
        const struct task *t = &p->tasks[i];
        if (t->op != PL_ATTN || t->layer != layer || t->chunk != chunk)
            break;
        if (t->r0 == r0 && t->q0 == 0)
            return (int)i;
    }
    return -1;
}

/* The n tasks at `first` compute as `trim` says. */
static void set_trim(struct pl *p, int first, int n, uint8_t trim)
{
    for (int j = 0; j < n; j++)
        p->tasks[first + j].trim = trim;
}

/* Builds the whole prefill graph. Slice order of the stream: layers 0..L-1,
 * the head, and (untied models) the embedding last: it is not needed for the
 * first token (its rows were read ahead). 0 or a negative errno. */
static int build_graph_with(struct pl *p, struct weight_tasks (*uw)[FORMAT_ROLE_COUNT])
{
    const struct format_config *c = p->c;
    uint32_t L = c->n_layers;
    int verify_of_layer[PL_MAX_SLICES + 1], ret;
    for (uint32_t l = 0; l <= L; l++)
        verify_of_layer[l] = -1; /* a layer without a slice: add_edge refuses it */
    if ((ret = add_slice_tasks(p, uw, verify_of_layer)) < 0)
        return ret;
    /* per chunk, per layer: Appendix B */
    uint32_t D = c->dim, Q = c->n_heads * c->head_dim, KV = c->n_kv_heads * c->head_dim;
    uint32_t F = c->hidden_dim;
    int prev_attn[4096];
    for (uint32_t l = 0; l < L; l++)
        prev_attn[l] = -1;
    const uint32_t hd = c->head_dim, mul = c->n_heads / c->n_kv_heads;
    for (uint32_t ch = 0; ch < p->n_chunks; ch++) {
        int prev_down_first = -1, prev_down_n = 0;
        int d_sh = 0, d_sn = 0; /* the previous layer's down projection's shadow tasks */
        for (uint32_t l = 0; l < L; l++) {
            /* the last layer trimmed: a chunk before the last only fills the
             * cache (K, V), the last one computes its last row's output */
            uint8_t trim = !p->trim_last || l + 1 < L ? PL_TRIM_NONE
                           : ch + 1 < p->n_chunks     ? PL_TRIM_KV
                                                      : PL_TRIM_LAST;
            /* Q and attention's queries: PL_TRIMS_CALLS keeps every row of
             * the first and the last chunk (enum pl_trim_mode) */
            uint8_t qtrim = trim != PL_TRIM_NONE && p->trim_last == PL_TRIMS_CALLS &&
                                    (ch == 0 || trim == PL_TRIM_LAST)
                                ? PL_TRIM_NONE
                                : trim;
            int norm = add_task(p, PL_NORM, PL_DEV_CPU, (int)l, ch);
            if (norm < 0)
                return norm;
            p->tasks[norm].trim = qtrim == PL_TRIM_KV ? PL_TRIM_KV : PL_TRIM_NONE;
            if ((ret = add_edge(p, verify_of_layer[l], norm)) < 0 ||
                (ret = add_edges_from(p, prev_down_first, prev_down_n, norm)) < 0 ||
                (ret = add_edges_from(p, d_sh, d_sn, norm)) < 0)
                return ret;
            int qkv_first[3], qkv_n[3], qkv_sh[3], qkv_sn[3];
            uint32_t qkv_roles[3] = {FORMAT_ROLE_WQ, FORMAT_ROLE_WK, FORMAT_ROLE_WV};
            uint32_t qkv_rows[3] = {Q, KV, KV};
            for (int k = 0; k < 3; k++) {
                if (k == 0 && qtrim == PL_TRIM_KV) { /* no queries */
                    qkv_first[k] = qkv_sh[k] = (int)p->n_tasks;
                    qkv_n[k] = qkv_sn[k] = 0;
                    continue;
                }
                ret = add_mm(p, (int)l, ch, qkv_roles[k], qkv_rows[k], &qkv_first[k], &qkv_n[k]);
                if (ret == 0 && k == 0)
                    set_trim(p, qkv_first[k], qkv_n[k], qtrim);
                if (ret < 0 || (ret = add_edges_to(p, norm, qkv_first[k], qkv_n[k])) < 0 ||
                    (ret = add_weight_edges(p, uw[l][qkv_roles[k]].first, uw[l][qkv_roles[k]].n,
                                            qkv_first[k], qkv_n[k])) < 0 ||
                    (ret = add_shadow(p, &uw[l][qkv_roles[k]], (int)l, ch, qkv_roles[k], qkv_first[k], qkv_n[k],
                                      &qkv_sh[k], &qkv_sn[k])) < 0)
                    return ret;
            }
            /* attention in groups of kv heads, one Q piece's worth each where
             * Q is split: a group starts once its own Q/K/V channels are
             * computed, while the NPU computes the next ones */
            uint32_t gk = c->n_kv_heads;
            if (piece_rows(p, Q) < Q && input_splits(p, (int)l, FORMAT_ROLE_WO)) {
                gk = piece_rows(p, Q) / (mul * hd);
                gk = gk < 1 ? 1 : gk > c->n_kv_heads ? c->n_kv_heads : gk;
            }
            int attn_first = (int)p->n_tasks, attn_n = 0;
            for (uint32_t kv0 = 0; kv0 < c->n_kv_heads; kv0 += gk) {
                uint32_t kv1 = c->n_kv_heads - kv0 < gk ? c->n_kv_heads : kv0 + gk;
                /* in pieces of query rows, the first storing the keys and values */
                uint32_t qs[PL_ATTN_MAX_PIECES + 1];
                uint32_t np = attn_row_pieces(p, ch, (int)l, (kv1 - kv0) * mul, qtrim, qs);
                int piece0 = -1;
                for (uint32_t j = 0; j < np; j++, attn_n++) {
                    int attn = add_task(p, PL_ATTN, PL_DEV_CPU, (int)l, ch);
                    if (attn < 0)
                        return attn;
                    p->tasks[attn].trim = qtrim;
                    if (gk < c->n_kv_heads) { /* a group; 0, 0: every head */
                        p->tasks[attn].r0 = kv0;
                        p->tasks[attn].r1 = kv1;
                    }
                    if (np > 1) {
                        p->tasks[attn].q0 = qs[j];
                        p->tasks[attn].q1 = qs[j + 1];
                    }
                    if ((ret = add_overlap_edges(p, qkv_first[0], qkv_n[0], kv0 * mul * hd,
                                                 kv1 * mul * hd, attn)) < 0 ||
                        (ret = add_overlap_edges(p, qkv_sh[0], qkv_sn[0], kv0 * mul * hd,
                                                 kv1 * mul * hd, attn)) < 0)
                        return ret;
                    if (j > 0) { /* the keys and values stored */
                        if ((ret = add_edge(p, piece0, attn)) < 0)
                            return ret;
                        continue;
                    }
                    piece0 = attn;
                    if ((ret = add_overlap_edges(p, qkv_first[1], qkv_n[1], kv0 * hd, kv1 * hd,
                                                 attn)) < 0 ||
                        (ret = add_overlap_edges(p, qkv_first[2], qkv_n[2], kv0 * hd, kv1 * hd,
                                                 attn)) < 0 ||
                        (ret = add_overlap_edges(p, qkv_sh[1], qkv_sn[1], kv0 * hd, kv1 * hd,
                                                 attn)) < 0 ||
                        (ret = add_overlap_edges(p, qkv_sh[2], qkv_sn[2], kv0 * hd, kv1 * hd,
                                                 attn)) < 0)
                        return ret;
                    /* the group's keys/values of earlier chunks first */
                    if (prev_attn[l] >= 0 &&
                        (ret = add_edge(p, group_first_piece(p, prev_attn[l], (int)l, ch - 1,
                                                             p->tasks[attn].r0),
                                        attn)) < 0)
                        return ret;
                }
            }
            prev_attn[l] = attn_first;
            if (trim == PL_TRIM_KV)
                continue; /* the chunk's last layer ends with its keys and values
                           * (PL_TRIMS_CALLS' first chunk: and attention) */
            int o_first, o_n, o_sh, o_sn;
            if ((ret = add_mm(p, (int)l, ch, FORMAT_ROLE_WO, D, &o_first, &o_n)) < 0 ||
                (ret = add_shadow(p, &uw[l][FORMAT_ROLE_WO], (int)l, ch, FORMAT_ROLE_WO, o_first, o_n, &o_sh, &o_sn)) < 0)
                return ret;
            set_trim(p, o_first, o_n, trim);
            for (int j = 0; j < o_n; j++)
                if ((ret = add_edges_from(p, attn_first, attn_n, o_first + j)) < 0)
                    return ret;
            ret = add_weight_edges(p, uw[l][FORMAT_ROLE_WO].first, uw[l][FORMAT_ROLE_WO].n,
                                   o_first, o_n);
            if (ret < 0)
                return ret;
            int fn = add_task(p, PL_FFN_NORM, PL_DEV_CPU, (int)l, ch);
            if (fn < 0)
                return fn;
            p->tasks[fn].trim = trim;
            if ((ret = add_edges_from(p, o_first, o_n, fn)) < 0 ||
                (ret = add_edges_from(p, o_sh, o_sn, fn)) < 0)
                return ret;
            int g_first, g_n, u_first, u_n, g_sh, g_sn, u_sh, u_sn;
            if ((ret = add_mm(p, (int)l, ch, FORMAT_ROLE_W_GATE, F, &g_first, &g_n)) < 0 ||
                (ret = add_mm(p, (int)l, ch, FORMAT_ROLE_W_UP, F, &u_first, &u_n)) < 0 ||
                (ret = add_edges_to(p, fn, g_first, g_n)) < 0 ||
                (ret = add_edges_to(p, fn, u_first, u_n)) < 0 ||
                (ret = add_shadow(p, &uw[l][FORMAT_ROLE_W_GATE], (int)l, ch, FORMAT_ROLE_W_GATE, g_first, g_n, &g_sh, &g_sn)) < 0 ||
                (ret = add_shadow(p, &uw[l][FORMAT_ROLE_W_UP], (int)l, ch, FORMAT_ROLE_W_UP, u_first, u_n, &u_sh, &u_sn)) < 0)
                return ret;
            set_trim(p, g_first, g_n, trim);
            set_trim(p, u_first, u_n, trim);
            /* SwiGLU piece by piece of gate/up where they are split */
            int sw_split = g_n > 1 && g_n == u_n && input_splits(p, (int)l, FORMAT_ROLE_W_DOWN);
            int sw_first = (int)p->n_tasks, sw_n = sw_split ? g_n : 1;
            for (int j = 0; j < sw_n; j++) {
                int sw = add_task(p, PL_SWIGLU, PL_DEV_CPU, (int)l, ch);
                if (sw < 0)
                    return sw;
                p->tasks[sw].trim = trim;
                if (sw_split) {
                    p->tasks[sw].r0 = p->tasks[g_first + j].r0;
                    p->tasks[sw].r1 = p->tasks[g_first + j].r1;
                }
                uint32_t a = sw_split ? p->tasks[sw].r0 : 0, b = sw_split ? p->tasks[sw].r1 : F;
                if ((ret = add_overlap_edges(p, g_first, g_n, a, b, sw)) < 0 ||
                    (ret = add_overlap_edges(p, u_first, u_n, a, b, sw)) < 0 ||
                    (ret = add_overlap_edges(p, g_sh, g_sn, a, b, sw)) < 0 ||
                    (ret = add_overlap_edges(p, u_sh, u_sn, a, b, sw)) < 0)
                    return ret;
            }
            if ((ret = add_weight_edges(p, uw[l][FORMAT_ROLE_W_GATE].first,
                                        uw[l][FORMAT_ROLE_W_GATE].n, g_first, g_n)) < 0 ||
                (ret = add_weight_edges(p, uw[l][FORMAT_ROLE_W_UP].first,
                                        uw[l][FORMAT_ROLE_W_UP].n, u_first, u_n)) < 0)
                return ret;
            int d_first, d_n;
            if ((ret = add_mm(p, (int)l, ch, FORMAT_ROLE_W_DOWN, D, &d_first, &d_n)) < 0 ||
                (ret = add_shadow(p, &uw[l][FORMAT_ROLE_W_DOWN], (int)l, ch, FORMAT_ROLE_W_DOWN, d_first, d_n, &d_sh, &d_sn)) < 0)
                return ret;
            set_trim(p, d_first, d_n, trim);
            for (int j = 0; j < d_n; j++)
                if ((ret = add_edges_from(p, sw_first, sw_n, d_first + j)) < 0)
                    return ret;
            ret = add_weight_edges(p, uw[l][FORMAT_ROLE_W_DOWN].first,
                                   uw[l][FORMAT_ROLE_W_DOWN].n, d_first, d_n);
            if (ret < 0)
                return ret;
            prev_down_first = d_first;
            prev_down_n = d_n;
        }
        if (ch == p->n_chunks - 1) {
            int head = add_task(p, PL_HEAD, PL_DEV_CPU, -1, ch);
            if (head < 0)
                return head;
            int c_first, c_n;
            if ((ret = add_edge(p, verify_of_layer[L], head)) < 0 ||
                (ret = add_edges_from(p, prev_down_first, prev_down_n, head)) < 0 ||
                (ret = add_edges_from(p, d_sh, d_sn, head)) < 0 ||
                (ret = add_mm(p, -1, ch, FORMAT_ROLE_CLASSIFIER, c->vocab_size, &c_first,
                              &c_n)) < 0 ||
                (ret = add_edges_to(p, head, c_first, c_n)) < 0 ||
                (ret = add_weight_edges(p, uw[L][FORMAT_ROLE_CLASSIFIER].first,
                                        uw[L][FORMAT_ROLE_CLASSIFIER].n, c_first, c_n)) < 0)
                return ret;
            /* the classifier's term: after its matmul, like every term */
            int c_sh, c_sn;
            if ((ret = add_shadow(p, &uw[L][FORMAT_ROLE_CLASSIFIER], -1, ch, FORMAT_ROLE_CLASSIFIER, c_first, c_n, &c_sh, &c_sn)) < 0)
                return ret;
        }
    }
    pl_cost_assign(p);
    return finish_edges(p);
}

int pl_graph_build(struct pl *p)
{
    struct weight_tasks(*uw)[FORMAT_ROLE_COUNT] = sl_calloc(p->c->n_layers + 1, sizeof *uw);
    p->trim_last = trim_allowed(p);
    int ret = uw ? build_graph_with(p, uw) : -ENOMEM;
    free(uw);
    return ret;
}

int pl_graph_reserve(struct pl *p, uint32_t extra)
{
    if (p->cap_tasks >= p->n_tasks + extra)
        return 0;
    struct task *t = sl_realloc(p->tasks, sizeof *t * (p->n_tasks + extra));
    if (!t)
        return -ENOMEM;
    p->tasks = t;
    p->cap_tasks = p->n_tasks + extra;
    return 0;
}

/* Cuts matmul `ti` (lock held): its last `tail_rows` output channels become
 * a new task with the same predecessors (all done) and successors (each now
 * waits for one more task). Returns the new task's index, or UINT32_MAX
 * where the reserve of task slots (sized at build time, so tasks never move
 * while running) is spent. */
uint32_t pl_graph_cut(struct pl *p, uint32_t ti, uint32_t tail_rows)
{
    if (p->n_tasks == p->cap_tasks)
        return UINT32_MAX;
    struct task *t = &p->tasks[ti];
    uint32_t rows = t->r1 - t->r0, mid = t->r1 - tail_rows;
    uint32_t ci = p->n_tasks++;
    struct task *c = &p->tasks[ci];
    *c = *t;
    c->r0 = mid;
    c->key = t->key + (mid - t->r0);
    c->est = t->est * tail_rows / rows;
    t->est -= c->est;
    t->r1 = mid;
    for (uint32_t e = 0; e < t->n_succ; e++)
        p->tasks[p->edges[t->succ_off + e]].deps++;
    p->remaining++;
    if (p->mm_left)
        p->mm_left[t->layer + 1]++;
    if (p->lin_mm)
        p->lin_mm[(size_t)(t->layer + 1) * FORMAT_ROLE_COUNT + t->role]++;
    if (p->cl_left && t->layer >= 0) /* one more task holding the activation set */
        p->cl_left[(size_t)t->layer * p->n_chunks + t->chunk]++;
    return ci;
}

/* pipeline.c: the cold-start prefill as a task graph over loading, unpacking
 * and execution (EdgeFlow 4.3 and Appendix B; llm.npu 3.2 and 3.4).
 *
 * Every (layer, chunk) of the prompt contributes the operators of Appendix B:
 * RMSNorm and quantization, the Q/K/V projections, RoPE and attention, the O
 * projection, the residual and second RMSNorm, gate/up, SwiGLU, down. The
 * int8 matmuls go to the emulated NPU (npu.h), everything else to CPU
 * workers. Each layer's slice arrives from the loader (io_uring, in execution
 * order), is checked against its checksum, and each of its tensors is
 * unpacked straight into the NPU's weight layout by CPU tasks (full and
 * sequential_granular: one per matmul piece, so the NPU starts on a tensor's first
 * channels while the CPU unpacks the next); a matmul task waits for its
 * weights and its input. Two ready queues, NPU and CPU:
 *
 *   full           position-guided priority (earlier chunk first, then
 *                  layer, then operator order; a tensor's unpacking ranks
 *                  just before its first chunk's matmul), the
 *                  NPU's matmuls split by output channels, and CPU task
 *                  stealing: an idle CPU worker takes the last NPU task in
 *                  priority order (the top with steal_top, EdgeFlow's rule)
 *                  when the NPU queue holds more than steal_threshold tasks,
 *                  or (steal_ahead) when the NPU's other work is estimated
 *                  to outlast the task, so the CPU finishes it before the
 *                  NPU would have started it, and cutting the task's
 *                  channels in two when it does not (split stealing); the
 *                  NPU dispatching a matmul with nothing else queued on
 *                  either side leaves its second half queued for the CPU
 *                  to steal (a kept tail: a running job cannot be cut);
 *   sequential     llama.cpp's and MNN's way: nothing is unpacked or
 *                  computed until every slice has been read, then coarse
 *                  tasks first come first served (every tensor is converted
 *                  before the first operator runs, as a model load does);
 *   sequential_granular  load everything, then full's scheduler (a
 *                  stronger baseline: the conversion overlaps computing);
 *   layer_overlap  llm.npu-style static coarse pipeline: one NPU task per
 *                  matmul, first come first served, no stealing (loading of
 *                  later layers still overlaps computing of earlier ones);
 *   llmnpu         llm.npu 3.4's out-of-order heuristic: among ready tasks,
 *                  the one whose completion enables the most NPU work (CPU
 *                  side) or the least (NPU side), estimated from operation
 *                  counts; coarse tasks, no stealing.
 *
 * The arithmetic of every operator is exactly that of infer_forward with
 * max_batch = chunk, so the logits are bit-identical to a sequential run of
 * the same quantized model (tested). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pipeline.h"
#include "unpack.h"

enum { DEV_NPU = 0, DEV_CPU = 1 };
#define MAX_CPU_WORKERS 8
#define PL_PREFAULT_TID 99 /* the prefault thread's track in traces */
#define PL_FILL_ROWS 64     /* rows unpacked at once before packing for the NPU */

static const char *const op_names[PL_OP_COUNT] = {"verify", "unpack",   "norm",   "matmul",
                                                  "attention", "ffn_norm", "swiglu", "head"};
static const char *const policy_names[INFER_POLICY_COUNT] = {
    "full", "sequential", "layer_overlap", "llmnpu", "sequential_granular"};

/* Policies that split matmuls into pieces, steal, and rank by position. */
static int granular(enum infer_policy p)
{
    return p == INFER_POLICY_FULL || p == INFER_POLICY_SEQUENTIAL_GRANULAR;
}

/* Policies that compute nothing until every slice is in. */
static int load_first(enum infer_policy p)
{
    return p == INFER_POLICY_SEQUENTIAL || p == INFER_POLICY_SEQUENTIAL_GRANULAR;
}

const char *infer_policy_name(enum infer_policy p)
{
    return (unsigned)p < INFER_POLICY_COUNT ? policy_names[p] : "unknown";
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

struct task {
    uint8_t op, dev;
    uint8_t role;           /* PL_MM, PL_UNPACK: enum format_role */
    int16_t layer;          /* -1: head */
    uint32_t chunk;
    uint32_t r0, r1;        /* PL_MM: output channels; PL_UNPACK: rows (0, 0: all) */
    uint32_t slice;         /* PL_VERIFY, PL_UNPACK */
    int32_t tensor;         /* PL_UNPACK */
    int32_t deps;           /* unfinished predecessors */
    uint32_t succ_off, n_succ;
    uint64_t key;           /* priority: smaller first */
    uint32_t ready_seq;     /* FIFO order for layer_overlap */
    double est;             /* estimated seconds (llmnpu, stealing ahead) */
    int executor;           /* 0: NPU device, 1..: CPU worker; -1: not run */
    uint64_t t_ready, t0, t1; /* ready (all inputs there), started, finished */
    struct npu_job job;
};

/* Activations of one chunk (rows n at positions pos0..). */
struct chunkbuf {
    uint32_t n, pos0;
    float *x, *xb, *q, *k, *v, *att, *o, *g, *u, *d;
    int8_t *xq[FORMAT_ROLE_COUNT]; /* quantized input of each linear */
    float act[FORMAT_ROLE_COUNT];  /* its activation scale */
};

struct queue {
    uint32_t *items;
    uint32_t n, cap;
};

struct pl {
    const struct infer_pipeline_opts *o;
    struct infer_model *m;
    struct infer_state *st;
    uint32_t *positions; /* [n] the prompt's positions (0, 1, ...) */
    const struct format_config *c;
    const struct format_reader *r;
    struct npu_device *dev;
    const struct npu_graph *graph[FORMAT_ROLE_COUNT];

    struct task *tasks;
    uint32_t n_tasks, cap_tasks;
    uint32_t *edges;        /* successors, CSR */
    uint32_t *edge_from, *edge_to;
    uint32_t n_edges, cap_edges;

    uint32_t n_chunks;
    struct chunkbuf *cb;
    const int *tokens;
    float *logits;

    /* slices */
    const uint8_t **slice_data;
    struct loader_slice *slice_sl;
    uint32_t *slice_left;   /* unpack tasks still using the slice */
    uint32_t *verify_task;  /* task index of each slice's VERIFY */
    int *slice_needed;      /* needed for the first token */
    struct loader_stream *ls;

    pthread_mutex_t lock;
    pthread_cond_t cv;
    pthread_cond_t pf_cv;   /* the prefault thread waits here for an idle CPU worker */
    uint32_t idle_workers;  /* CPU workers waiting for work */
    int pf_started;
    pthread_t pf_thread;
    struct queue npu_q, cpu_q;
    uint32_t ready_counter;
    uint32_t remaining;     /* tasks not yet finished */
    int done, stop;
    int error;
    struct sl_err err;

    pthread_t workers[MAX_CPU_WORKERS];
    uint32_t n_workers;
    float *att_scratch[MAX_CPU_WORKERS + 1];
    int8_t *fill_scratch[MAX_CPU_WORKERS + 1]; /* fill_linear's, per CPU worker */
    uint32_t fill_cols;                        /* ... for rows of up to this many */

    /* per (layer + 1, role): int8 weights? and their static activation scale,
     * from the index, so operators need not wait for the unpacking */
    struct {
        int int8;
        float act;
    } (*lin_info)[FORMAT_ROLE_COUNT];

    uint64_t t_start, t_logits, t_loaded;
    uint64_t busy[MAX_CPU_WORKERS + 1]; /* per executor */
    uint32_t running;       /* tasks executing now */
    uint64_t stall_t0;      /* nothing running or ready since then (0: not stalled) */
    uint64_t stall_ns;      /* total of such stalls: every unit waiting on the disk */
    uint64_t unpack_ns;
    /* full: the NPU's weight storage (prepared in build_graph) faulted in
     * ahead by the prefault thread while a CPU worker has nothing else to
     * do, 2 MiB at a time in layer order, skipping layers whose unpacking
     * has begun */
    struct prefault {
        struct npu_weights *w;
        size_t off, len;
        int layer;
        uint64_t t0, t1;    /* the step's span on the prefault track; t1 0: not run */
    } *pf;
    uint32_t n_pf, cap_pf, next_pf;
    int unpack_layer;       /* highest layer whose unpacking began (-1: none) */
    uint64_t prefault_ns;
    uint32_t stolen;
    /* the NPU's running task (UINT32_MAX: none) and its pace: actual seconds
     * per estimated second of the matmuls it finished (the steal-ahead rule) */
    uint32_t npu_running;
    double npu_actual_s, npu_est_s;
    uint32_t splits;        /* NPU matmuls cut by split stealing */
    uint32_t tails;         /* NPU matmuls cut at dispatch to keep a stealable tail */
    uint64_t bytes_read;
    uint64_t load_events[4096];         /* arrival time of each slice */
};

/* ---- graph construction ------------------------------------------------------------ */

/* A growable array one element fuller: items reallocated to twice *cap
 * elements of `size` bytes (`first` when empty); NULL when out of memory
 * (items untouched). */
static void *grown(void *items, uint32_t *cap, size_t size, uint32_t first)
{
    uint32_t c = *cap ? 2 * *cap : first;
    void *a = realloc(items, size * c);
    if (a)
        *cap = c;
    return a;
}

static int add_task(struct pl *p, uint8_t op, uint8_t dev, int layer, uint32_t chunk)
{
    if (p->n_tasks == p->cap_tasks) {
        struct task *t = grown(p->tasks, &p->cap_tasks, sizeof *t, 1024);
        if (!t)
            return -1;
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

static int add_edge(struct pl *p, int from, int to)
{
    if (from < 0 || to < 0)
        return -1;
    if (p->n_edges == p->cap_edges) {
        uint32_t cap = p->cap_edges ? 2 * p->cap_edges : 4096;
        uint32_t *a = realloc(p->edge_from, sizeof *a * cap), *b;
        if (!a)
            return -1;
        p->edge_from = a;
        b = realloc(p->edge_to, sizeof *b * cap);
        if (!b)
            return -1;
        p->edge_to = b;
        p->cap_edges = cap;
    }
    p->edge_from[p->n_edges] = (uint32_t)from;
    p->edge_to[p->n_edges] = (uint32_t)to;
    p->n_edges++;
    p->tasks[to].deps++;
    return 0;
}

static int finish_edges(struct pl *p)
{
    p->edges = malloc(sizeof(uint32_t) * (p->n_edges ? p->n_edges : 1));
    uint32_t *cnt = calloc(p->n_tasks + 1, sizeof(uint32_t));
    if (!p->edges || !cnt) {
        free(cnt);
        return -1;
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

static const struct infer_linear *linear_of(const struct pl *p, int layer, uint32_t role)
{
    if (layer < 0)
        return &p->m->cls;
    const struct infer_layer *l = &p->m->layers[layer];
    switch (role) {
    case FORMAT_ROLE_WQ:
        return &l->wq;
    case FORMAT_ROLE_WK:
        return &l->wk;
    case FORMAT_ROLE_WV:
        return &l->wv;
    case FORMAT_ROLE_WO:
        return &l->wo;
    case FORMAT_ROLE_W_GATE:
        return &l->w_gate;
    case FORMAT_ROLE_W_UP:
        return &l->w_up;
    default:
        return &l->w_down;
    }
}

static uint32_t op_order(uint32_t op, uint32_t role)
{
    /* topological order inside a layer, for tie-breaking */
    switch (op) {
    case PL_NORM:
        return 0;
    case PL_ATTN:
        return 2;
    case PL_FFN_NORM:
        return 4;
    case PL_SWIGLU:
        return 6;
    case PL_HEAD:
        return 8;
    case PL_MM:
        return role <= FORMAT_ROLE_WV ? 1 : role == FORMAT_ROLE_WO ? 3
               : role == FORMAT_ROLE_W_DOWN ? 7 : role == FORMAT_ROLE_CLASSIFIER ? 9 : 5;
    default:
        return 0;
    }
}

/* Output channels per piece of a linear with `rows` outputs: full and
 * sequential_granular split each matmul, and the unpacking of its quantized weights,
 * into pieces of about `split` channels on 16-channel boundaries (the NPU's
 * weight blocks); the coarse policies keep one piece. */
static uint32_t piece_rows(const struct pl *p, uint32_t rows)
{
    uint32_t split = granular(p->o->policy) ? p->o->split : 0;
    if (!split || split >= rows)
        return rows;
    uint32_t parts = (rows + split - 1) / split;
    uint32_t step = ((rows + parts - 1) / parts + 15) & ~15u;
    return step < rows ? step : rows;
}

/* Matmul tasks of one linear for a chunk, one per piece. Returns the first
 * index, *count set. */
static int add_mm(struct pl *p, int layer, uint32_t chunk, uint32_t role, uint32_t rows,
                  int *first, int *count)
{
    uint32_t step = piece_rows(p, rows);
    *first = (int)p->n_tasks;
    *count = 0;
    for (uint32_t r0 = 0; r0 < rows; r0 += step) {
        int t = add_task(p, PL_MM, DEV_NPU, layer, chunk);
        if (t < 0)
            return -1;
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
static void add_weight_edges(struct pl *p, int u_first, int u_n, int mm_first, int mm_n)
{
    for (int j = 0; j < mm_n; j++)
        for (int k = 0; k < u_n; k++) {
            const struct task *u = &p->tasks[u_first + k], *m = &p->tasks[mm_first + j];
            if (u->r1 == u->r0 || (u->r0 < m->r1 && u->r1 > m->r0))
                add_edge(p, u_first + k, mm_first + j);
        }
}

static uint32_t rows_of_role(const struct format_config *c, uint32_t role)
{
    uint32_t nd;
    uint64_t sh[2];
    format_role_shape(c, role == FORMAT_ROLE_CLASSIFIER && c->tied_embedding ? FORMAT_ROLE_TOK_EMBD
                                                                             : role,
                      &nd, sh);
    return (uint32_t)sh[0];
}

/* Builds the whole prefill graph. Slice order of the stream: layers 0..L-1,
 * the head, and (untied models) the embedding last: it is not needed for the
 * first token (its rows were read ahead). */
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
                return -1;
            p->pf = a;
        }
        p->pf[p->n_pf++] = (struct prefault){.w = w, .off = off, .len = step, .layer = layer};
    }
    return 0;
}

/* Edges to task `to` from those of the n tasks at `first` (pieces of a
 * matmul) whose output channels overlap [a, b). */
static void add_overlap_edges(struct pl *p, int first, int n, uint32_t a, uint32_t b, int to)
{
    for (int j = 0; j < n; j++) {
        const struct task *t = &p->tasks[first + j];
        if (t->r0 < b && t->r1 > a)
            add_edge(p, first + j, to);
    }
}

/* Whether the producer of a linear's input may quantize it in column
 * ranges: not with a dynamic scale (the maximum of the whole input). */
static int input_splits(const struct pl *p, int layer, uint32_t role)
{
    return !(p->lin_info[layer + 1][role].int8 && p->lin_info[layer + 1][role].act <= 0);
}

static int prepare_linear(struct infer_linear *lin, const struct format_tensor_info *t,
                          int force_dynamic, int keep_rows, int want_npu, struct sl_err *err);

static int build_graph_with(struct pl *p, struct weight_tasks (*uw)[FORMAT_ROLE_COUNT])
{
    const struct format_config *c = p->c;
    const struct format_reader *r = p->r;
    uint32_t ns = format_reader_n_slices(r), L = c->n_layers;
    int all_loaded = -1;
    if (load_first(p->o->policy)) {
        all_loaded = add_task(p, PL_VERIFY, DEV_CPU, -2, 0); /* a barrier: no work of its own */
        p->tasks[all_loaded].slice = UINT32_MAX;
    }
    int verify_of_layer[4097];
    for (uint32_t i = 0; i < ns; i++) {
        const struct format_slice_info *s = format_reader_slice(r, i);
        if (s->kind == FORMAT_SLICE_EMBED)
            continue; /* read after the first token */
        int li = s->kind == FORMAT_SLICE_LAYER ? s->layer : (int)L;
        int v = add_task(p, PL_VERIFY, DEV_CPU, s->kind == FORMAT_SLICE_LAYER ? s->layer : -1, 0);
        if (v < 0)
            return -1;
        p->tasks[v].slice = i;
        p->tasks[v].deps = 1; /* the slice's arrival */
        p->verify_task[i] = (uint32_t)v;
        p->slice_needed[i] = 1;
        verify_of_layer[li] = v;
        if (all_loaded >= 0 && add_edge(p, all_loaded, v) < 0)
            return -1;
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
            if (step < rows) {
                struct infer_linear *lin = (struct infer_linear *)linear_of(p, layer, role);
                if (prepare_linear(lin, ti, p->m->force_dynamic_act, 0, 1, &p->err) < 0)
                    return -1;
                if (ti->role == FORMAT_ROLE_TOK_EMBD) /* lookups read the NPU's copy */
                    p->m->embed = *lin; /* shared storage; released once */
                if (add_prefault(p, lin->npu, li) < 0)
                    return -1;
            }
            uw[li][role].first = (int)p->n_tasks;
            uw[li][role].n = 0;
            for (uint32_t r0 = 0; r0 < rows; r0 += step) {
                int u = add_task(p, PL_UNPACK, DEV_CPU, layer, 0);
                if (u < 0 || add_edge(p, v, u) < 0)
                    return -1;
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
    /* per chunk, per layer: Appendix B */
    uint32_t D = c->dim, Q = c->n_heads * c->head_dim, KV = c->n_kv_heads * c->head_dim;
    uint32_t F = c->hidden_dim;
    int prev_attn[4096];
    for (uint32_t l = 0; l < L; l++)
        prev_attn[l] = -1;
    const uint32_t hd = c->head_dim, mul = c->n_heads / c->n_kv_heads;
    for (uint32_t ch = 0; ch < p->n_chunks; ch++) {
        int prev_down_first = -1, prev_down_n = 0;
        for (uint32_t l = 0; l < L; l++) {
            int norm = add_task(p, PL_NORM, DEV_CPU, (int)l, ch);
            if (norm < 0 || add_edge(p, verify_of_layer[l], norm) < 0)
                return -1;
            for (int k = 0; k < prev_down_n; k++)
                add_edge(p, prev_down_first + k, norm);
            int qkv_first[3], qkv_n[3];
            uint32_t qkv_roles[3] = {FORMAT_ROLE_WQ, FORMAT_ROLE_WK, FORMAT_ROLE_WV};
            uint32_t qkv_rows[3] = {Q, KV, KV};
            for (int k = 0; k < 3; k++) {
                if (add_mm(p, (int)l, ch, qkv_roles[k], qkv_rows[k], &qkv_first[k], &qkv_n[k]) < 0)
                    return -1;
                for (int j = 0; j < qkv_n[k]; j++)
                    add_edge(p, norm, qkv_first[k] + j);
                add_weight_edges(p, uw[l][qkv_roles[k]].first, uw[l][qkv_roles[k]].n,
                                 qkv_first[k], qkv_n[k]);
            }
            /* attention in groups of kv heads, one Q piece's worth each where
             * Q is split: a group starts once its own Q/K/V channels are
             * computed, while the NPU computes the next ones */
            uint32_t gk = c->n_kv_heads;
            if (qkv_n[0] > 1 && input_splits(p, (int)l, FORMAT_ROLE_WO)) {
                gk = piece_rows(p, Q) / (mul * hd);
                gk = gk < 1 ? 1 : gk > c->n_kv_heads ? c->n_kv_heads : gk;
            }
            int attn_first = (int)p->n_tasks, attn_n = 0;
            for (uint32_t kv0 = 0; kv0 < c->n_kv_heads; kv0 += gk, attn_n++) {
                uint32_t kv1 = c->n_kv_heads - kv0 < gk ? c->n_kv_heads : kv0 + gk;
                int attn = add_task(p, PL_ATTN, DEV_CPU, (int)l, ch);
                if (attn < 0)
                    return -1;
                if (gk < c->n_kv_heads) { /* a group; 0, 0: every head */
                    p->tasks[attn].r0 = kv0;
                    p->tasks[attn].r1 = kv1;
                }
                add_overlap_edges(p, qkv_first[0], qkv_n[0], kv0 * mul * hd, kv1 * mul * hd, attn);
                add_overlap_edges(p, qkv_first[1], qkv_n[1], kv0 * hd, kv1 * hd, attn);
                add_overlap_edges(p, qkv_first[2], qkv_n[2], kv0 * hd, kv1 * hd, attn);
                if (prev_attn[l] >= 0) /* the group's keys/values of earlier chunks first */
                    add_edge(p, prev_attn[l] + attn_n, attn);
            }
            prev_attn[l] = attn_first;
            int o_first, o_n;
            if (add_mm(p, (int)l, ch, FORMAT_ROLE_WO, D, &o_first, &o_n) < 0)
                return -1;
            for (int j = 0; j < o_n; j++)
                for (int a = 0; a < attn_n; a++)
                    add_edge(p, attn_first + a, o_first + j);
            add_weight_edges(p, uw[l][FORMAT_ROLE_WO].first, uw[l][FORMAT_ROLE_WO].n, o_first, o_n);
            int fn = add_task(p, PL_FFN_NORM, DEV_CPU, (int)l, ch);
            if (fn < 0)
                return -1;
            for (int j = 0; j < o_n; j++)
                add_edge(p, o_first + j, fn);
            int g_first, g_n, u_first, u_n;
            if (add_mm(p, (int)l, ch, FORMAT_ROLE_W_GATE, F, &g_first, &g_n) < 0 ||
                add_mm(p, (int)l, ch, FORMAT_ROLE_W_UP, F, &u_first, &u_n) < 0)
                return -1;
            for (int j = 0; j < g_n; j++)
                add_edge(p, fn, g_first + j);
            for (int j = 0; j < u_n; j++)
                add_edge(p, fn, u_first + j);
            /* SwiGLU piece by piece of gate/up where they are split */
            int sw_split = g_n > 1 && g_n == u_n && input_splits(p, (int)l, FORMAT_ROLE_W_DOWN);
            int sw_first = (int)p->n_tasks, sw_n = sw_split ? g_n : 1;
            for (int j = 0; j < sw_n; j++) {
                int sw = add_task(p, PL_SWIGLU, DEV_CPU, (int)l, ch);
                if (sw < 0)
                    return -1;
                if (sw_split) {
                    p->tasks[sw].r0 = p->tasks[g_first + j].r0;
                    p->tasks[sw].r1 = p->tasks[g_first + j].r1;
                }
                uint32_t a = sw_split ? p->tasks[sw].r0 : 0, b = sw_split ? p->tasks[sw].r1 : F;
                add_overlap_edges(p, g_first, g_n, a, b, sw);
                add_overlap_edges(p, u_first, u_n, a, b, sw);
            }
            add_weight_edges(p, uw[l][FORMAT_ROLE_W_GATE].first, uw[l][FORMAT_ROLE_W_GATE].n,
                             g_first, g_n);
            add_weight_edges(p, uw[l][FORMAT_ROLE_W_UP].first, uw[l][FORMAT_ROLE_W_UP].n, u_first,
                             u_n);
            int d_first, d_n;
            if (add_mm(p, (int)l, ch, FORMAT_ROLE_W_DOWN, D, &d_first, &d_n) < 0)
                return -1;
            for (int j = 0; j < d_n; j++)
                for (int k = 0; k < sw_n; k++)
                    add_edge(p, sw_first + k, d_first + j);
            add_weight_edges(p, uw[l][FORMAT_ROLE_W_DOWN].first, uw[l][FORMAT_ROLE_W_DOWN].n,
                             d_first, d_n);
            prev_down_first = d_first;
            prev_down_n = d_n;
        }
        if (ch == p->n_chunks - 1) {
            int head = add_task(p, PL_HEAD, DEV_CPU, -1, ch);
            if (head < 0 || add_edge(p, verify_of_layer[L], head) < 0)
                return -1;
            for (int k = 0; k < prev_down_n; k++)
                add_edge(p, prev_down_first + k, head);
            int c_first, c_n;
            if (add_mm(p, -1, ch, FORMAT_ROLE_CLASSIFIER, c->vocab_size, &c_first, &c_n) < 0)
                return -1;
            for (int j = 0; j < c_n; j++)
                add_edge(p, head, c_first + j);
            add_weight_edges(p, uw[L][FORMAT_ROLE_CLASSIFIER].first,
                             uw[L][FORMAT_ROLE_CLASSIFIER].n, c_first, c_n);
        }
    }
    /* priorities and cost estimates */
    for (uint32_t i = 0; i < p->n_tasks; i++) {
        struct task *t = &p->tasks[i];
        uint64_t layer = t->layer < 0 ? L + 1 : (uint64_t)t->layer;
        if (t->op == PL_VERIFY || t->op == PL_UNPACK) {
            /* weights just before their first use, by the first chunk: a
             * layer's verification after every task of the layer before, each
             * tensor's unpacking after the operators that precede its matmul
             * (so the NPU's next input is computed before weights it needs
             * later are unpacked, and Q/K/V are unpacked before O and the FFN) */
            uint64_t use = (layer + 1) << 44;
            t->key = t->op == PL_VERIFY
                         ? use - 128
                         : use + ((uint64_t)op_order(PL_MM, t->role) << 24) + t->r0 - 64 + t->role;
        } else
            /* layer first, then the chunk's position in the prompt, then the
             * operator's place in the layer (EdgeFlow's position-guided
             * priority inside a layer: an earlier chunk's FFN before a later
             * chunk's Q/K/V; across layers the chunks stay in step, so the
             * last layers still have two chunks' work to overlap) */
            t->key = ((layer + 1) << 44) | ((uint64_t)t->chunk << 28) |
                     ((uint64_t)op_order(t->op, t->role) << 24) | t->r0;
        double rows = p->cb[t->chunk].n;
        if (t->op == PL_MM) {
            const uint32_t cols = t->role == FORMAT_ROLE_WO ? Q
                                  : t->role == FORMAT_ROLE_W_DOWN ? F : D;
            t->est = 2.0 * (t->role == FORMAT_ROLE_CLASSIFIER ? 1 : rows) * cols * (t->r1 - t->r0) /
                     3e11;
        } else if (t->op == PL_ATTN) {
            double ctx = p->cb[t->chunk].pos0 + rows;
            double share = t->r1 > t->r0 ? (double)(t->r1 - t->r0) / c->n_kv_heads : 1.0;
            t->est = 4.0 * rows * ctx * Q * share / 5e10;
        } else if (t->op == PL_UNPACK) {
            t->est = (double)(t->r1 > t->r0 ? t->r1 - t->r0 : rows_of_role(c, t->role)) * D / 1e10;
        } else {
            t->est = rows * (D + F) * 10 / 1e10;
        }
    }
    return finish_edges(p);
}

static int build_graph(struct pl *p)
{
    struct weight_tasks(*uw)[FORMAT_ROLE_COUNT] = calloc(p->c->n_layers + 1, sizeof *uw);
    int ret = uw ? build_graph_with(p, uw) : -1;
    free(uw);
    return ret;
}

/* ---- queues -------------------------------------------------------------------------- */

static int qpush(struct queue *q, uint32_t t)
{
    if (q->n == q->cap) {
        uint32_t *it = grown(q->items, &q->cap, sizeof *it, 256);
        if (!it)
            return -1;
        q->items = it;
    }
    q->items[q->n++] = t;
    return 0;
}

/* llm.npu 3.4: the contribution of running a ready task: the estimated time
 * of the NPU tasks its completion makes ready; positive for CPU tasks (more
 * NPU work unlocked is better), negative for NPU tasks. */
static double contribution(const struct pl *p, uint32_t ti)
{
    const struct task *t = &p->tasks[ti];
    double s = 0;
    for (uint32_t e = 0; e < t->n_succ; e++) {
        const struct task *u = &p->tasks[p->edges[t->succ_off + e]];
        if (u->deps == 1 && u->dev == DEV_NPU)
            s += u->est;
    }
    return t->dev == DEV_CPU ? s : -s;
}

/* Index of the task to run next in q under the policy (lock held). */
static uint32_t qbest(const struct pl *p, const struct queue *q)
{
    uint32_t best = 0;
    for (uint32_t i = 1; i < q->n; i++) {
        const struct task *a = &p->tasks[q->items[i]], *b = &p->tasks[q->items[best]];
        int better;
        switch (p->o->policy) {
        case INFER_POLICY_LAYER_OVERLAP:
        case INFER_POLICY_SEQUENTIAL:
            better = a->ready_seq < b->ready_seq;
            break;
        case INFER_POLICY_LLMNPU: {
            double ca = contribution(p, q->items[i]), cb = contribution(p, q->items[best]);
            better = ca > cb || (ca == cb && a->ready_seq < b->ready_seq);
            break;
        }
        default:
            better = a->key < b->key;
        }
        if (better)
            best = i;
    }
    return best;
}

/* Index of the task the policy would run last (full: the largest key). */
static uint32_t qlast(const struct pl *p, const struct queue *q)
{
    uint32_t last = 0;
    for (uint32_t i = 1; i < q->n; i++)
        if (p->tasks[q->items[i]].key > p->tasks[q->items[last]].key)
            last = i;
    return last;
}

static uint32_t qtake(struct queue *q, uint32_t i)
{
    uint32_t t = q->items[i];
    q->items[i] = q->items[--q->n];
    return t;
}

static uint32_t qpop(const struct pl *p, struct queue *q)
{
    return qtake(q, qbest(p, q));
}

/* Keeps the stall clock (lock held): the pipeline is stalled while no task
 * runs and none is ready, which in a cold start means every unit waits for
 * the disk. Bubbles are idle time outside such stalls: a unit waiting for the
 * other one (or for a dependency) while there was work in the pipeline. */
static void stall_update(struct pl *p)
{
    int stalled = !p->running && !p->npu_q.n && !p->cpu_q.n && !p->done;
    if (stalled && !p->stall_t0) {
        p->stall_t0 = sl_now_ns();
    } else if (!stalled && p->stall_t0) {
        p->stall_ns += sl_now_ns() - p->stall_t0;
        p->stall_t0 = 0;
    }
}

static void make_ready(struct pl *p, uint32_t ti)
{
    struct task *t = &p->tasks[ti];
    t->ready_seq = p->ready_counter++;
    t->t_ready = sl_now_ns();
    const struct infer_linear *lin = t->op == PL_MM ? linear_of(p, t->layer, t->role) : NULL;
    /* float weights cannot go to the NPU (int8 graphs only): CPU */
    if (t->op == PL_MM && lin && !lin->npu)
        t->dev = DEV_CPU;
    if (t->op == PL_VERIFY && t->slice == UINT32_MAX) { /* the sequential barrier */
        t->dev = DEV_CPU;
    }
    qpush(t->dev == DEV_NPU ? &p->npu_q : &p->cpu_q, ti);
    stall_update(p);
    pthread_cond_broadcast(&p->cv);
}

static void fail(struct pl *p, int e, const char *msg)
{
    if (!p->error) {
        p->error = e;
        snprintf(p->err.msg, sizeof p->err.msg, "%s", msg);
    }
    p->stop = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_cond_broadcast(&p->pf_cv);
}

static void release_slice(struct pl *p, uint32_t s);

/* Task ti finished (lock held): successors, slice release, completion. */
static void complete(struct pl *p, uint32_t ti)
{
    struct task *t = &p->tasks[ti];
    for (uint32_t e = 0; e < t->n_succ; e++) {
        uint32_t u = p->edges[t->succ_off + e];
        if (--p->tasks[u].deps == 0)
            make_ready(p, u);
    }
    if (t->op == PL_UNPACK && --p->slice_left[t->slice] == 0)
        release_slice(p, t->slice);
    if (--p->remaining == 0) {
        p->done = 1;
        p->t_logits = sl_now_ns();
        pthread_cond_broadcast(&p->cv);
        pthread_cond_broadcast(&p->pf_cv);
    }
}

/* ---- operators --------------------------------------------------------------------------- */

static void quantize_for(struct pl *p, struct chunkbuf *b, int layer, uint32_t role,
                         const float *x, uint32_t rows, uint32_t cols)
{
    if (!p->lin_info[layer + 1][role].int8)
        return; /* float weights take the float input */
    size_t n = (size_t)rows * cols;
    float act = p->lin_info[layer + 1][role].act;
    float s = act > 0 ? act : npu_act_scale_dynamic(x, n);
    npu_quantize_act(x, n, s, b->xq[role]);
    b->act[role] = s;
}

/* quantize_for of columns [c0, c1) of each row of x [rows][cols] (a piece of
 * the producer; static scales only, see input_splits): the same codes. */
static void quantize_cols(struct pl *p, struct chunkbuf *b, int layer, uint32_t role,
                          const float *x, uint32_t rows, uint32_t cols, uint32_t c0, uint32_t c1)
{
    if (c0 == 0 && c1 == cols) {
        quantize_for(p, b, layer, role, x, rows, cols);
        return;
    }
    if (!p->lin_info[layer + 1][role].int8)
        return;
    float s = p->lin_info[layer + 1][role].act;
    for (uint32_t r = 0; r < rows; r++)
        npu_quantize_act(x + (size_t)r * cols + c0, c1 - c0, s,
                         b->xq[role] + (size_t)r * cols + c0);
    if (c0 == 0) /* one writer; the matmuls read it after every piece */
        b->act[role] = s;
}

static const float *mm_input(struct chunkbuf *b, uint32_t role, uint32_t *cols,
                             const struct format_config *c)
{
    uint32_t D = c->dim;
    switch (role) {
    case FORMAT_ROLE_WO:
        *cols = c->n_heads * c->head_dim;
        return b->att;
    case FORMAT_ROLE_W_DOWN:
        *cols = c->hidden_dim;
        return b->g;
    case FORMAT_ROLE_CLASSIFIER:
        *cols = D;
        return b->xb + (size_t)(b->n - 1) * D;
    default:
        *cols = D;
        return b->xb;
    }
}

static float *mm_output(struct pl *p, struct chunkbuf *b, uint32_t role)
{
    switch (role) {
    case FORMAT_ROLE_WQ:
        return b->q;
    case FORMAT_ROLE_WK:
        return b->k;
    case FORMAT_ROLE_WV:
        return b->v;
    case FORMAT_ROLE_WO:
        return b->o;
    case FORMAT_ROLE_W_GATE:
        return b->g;
    case FORMAT_ROLE_W_UP:
        return b->u;
    case FORMAT_ROLE_W_DOWN:
        return b->d;
    default:
        return p->logits;
    }
}

/* Sets up a quantized linear before its rows are unpacked: the NPU's weight
 * storage (want_npu) and/or plain int8 rows with their scales (keep_rows). */
static int prepare_linear(struct infer_linear *lin, const struct format_tensor_info *t,
                          int force_dynamic, int keep_rows, int want_npu, struct sl_err *err)
{
    uint32_t rows = (uint32_t)t->shape[0], cols = (uint32_t)t->shape[1];
    memset(lin, 0, sizeof *lin);
    lin->rows = rows;
    lin->cols = cols;
    lin->act_scale = force_dynamic ? 0.0f : t->act_scale;
    int ret = want_npu ? npu_weights_alloc(rows, cols, &lin->npu) : 0;
    if (ret < 0) {
        sl_err_set(err, "out of memory for '%s'", t->name);
        return ret;
    }
    if (keep_rows) {
        lin->q = sl_alloc_aligned((size_t)rows * cols, 64);
        lin->scale = malloc(sizeof(float) * rows);
        if (!lin->q || !lin->scale) {
            sl_err_set(err, "out of memory for '%s'", t->name);
            return -ENOMEM;
        }
    }
    return 0;
}

/* Unpacks rows [r0, r1) of a prepared quantized linear from its tensor's
 * bytes, 64 rows at a time, into the NPU's weight layout (the rows never
 * exist whole in row-major form) and/or the kept rows. r0 is a multiple of
 * 16 (the NPU's channel blocks), as is r1 unless it is the last row. */
static int fill_linear(struct infer_linear *lin, const struct format_tensor_info *t,
                       const uint8_t *data, uint32_t r0, uint32_t r1, int8_t *scratch,
                       struct sl_err *err)
{
    const uint32_t rows = lin->rows, cols = lin->cols, B = PL_FILL_ROWS;
    /* a CPU worker's scratch (PL_FILL_ROWS x the widest row): allocating
     * per task would fault fresh pages in every task */
    int8_t *tmp = scratch ? scratch : sl_alloc_aligned((size_t)B * cols, 64);
    float sc[PL_FILL_ROWS];
    int ret = 0;
    if (!tmp) {
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    if (t->encoding == FORMAT_ENC_Q8_CHANNEL) {
        ret = format_q8_validate_rows(data, rows, cols, r0, r1, err);
        const int8_t *codes = (const int8_t *)data + sl_align_up((uint64_t)rows * 4, 64);
        for (uint32_t a = r0; ret == 0 && a < r1; a += B) {
            uint32_t n = r1 - a < B ? r1 - a : B;
            for (uint32_t i = 0; i < n; i++)
                sc[i] = sl_load_lef32(data + 4 * (size_t)(a + i));
            if (lin->npu)
                npu_weights_fill(lin->npu, a, n, codes + (size_t)a * cols, sc);
            if (lin->q) {
                memcpy(lin->q + (size_t)a * cols, codes + (size_t)a * cols, (size_t)n * cols);
                memcpy(lin->scale + a, sc, sizeof(float) * n);
            }
        }
    } else {
        struct unpack_tensor u;
        ret = unpack_tensor_init(&u, t->encoding, data, t->length, rows, cols, err);
        enum unpack_kernel k = unpack_kernel_best();
        for (uint32_t a = r0; ret == 0 && a < r1; a += B) {
            uint32_t n = r1 - a < B ? r1 - a : B;
            ret = unpack_tensor_rows(&u, k, a, a + n, tmp, NULL);
            if (ret < 0) {
                sl_err_set(err, "cannot unpack rows %u..%u", a, a + n);
                break;
            }
            for (uint32_t i = 0; i < n; i++)
                sc[i] = unpack_tensor_scale(&u, a + i);
            if (lin->npu)
                npu_weights_fill(lin->npu, a, n, tmp, sc);
            if (lin->q) {
                memcpy(lin->q + (size_t)a * cols, tmp, (size_t)n * cols);
                memcpy(lin->scale + a, sc, sizeof(float) * n);
            }
        }
        unpack_tensor_fini(&u);
    }
    if (tmp != scratch)
        sl_free_aligned(tmp);
    if (ret < 0)
        sl_err_prefix(err, "tensor '%s'", t->name);
    return ret;
}

/* Unpacks a whole tensor from its slice bytes (a float one is decoded). */
static int unpack_linear(struct infer_linear *lin, const struct format_tensor_info *t,
                         const uint8_t *data, int force_dynamic, int keep_rows, int want_npu,
                         int8_t *scratch, struct sl_err *err)
{
    if (!format_encoding_traits(t->encoding)->quantized) {
        memset(lin, 0, sizeof *lin);
        lin->rows = (uint32_t)t->shape[0];
        lin->cols = (uint32_t)t->shape[1];
        return infer_linear_init(lin, t, data, 0, force_dynamic, err);
    }
    int ret = prepare_linear(lin, t, force_dynamic, keep_rows, want_npu, err);
    return ret < 0 ? ret : fill_linear(lin, t, data, 0, lin->rows, scratch, err);
}

/* The untied embedding is only looked up (a few rows per token): a packed
 * one stays packed in memory and infer_op_embed unpacks the rows it needs;
 * INT8 rows are kept as they are. No NPU copy. */
static int keep_packed(struct infer_linear *lin, const struct format_tensor_info *t,
                       const uint8_t *data, struct sl_err *err)
{
    if (t->encoding == FORMAT_ENC_Q8_CHANNEL)
        return unpack_linear(lin, t, data, 0, 1, 0, NULL, err);
    memset(lin, 0, sizeof *lin);
    lin->rows = (uint32_t)t->shape[0];
    lin->cols = (uint32_t)t->shape[1];
    lin->packed = sl_alloc_aligned(t->length, 64);
    lin->upk = calloc(1, sizeof *lin->upk);
    if (!lin->packed || !lin->upk) {
        infer_linear_fini(lin);
        sl_err_set(err, "out of memory for '%s'", t->name);
        return -ENOMEM;
    }
    memcpy(lin->packed, data, t->length);
    int ret = unpack_tensor_init(lin->upk, t->encoding, lin->packed, t->length, lin->rows,
                                 lin->cols, err);
    if (ret < 0) {
        free(lin->upk);
        lin->upk = NULL;
        infer_linear_fini(lin);
        sl_err_prefix(err, "tensor '%s'", t->name);
    }
    return ret;
}

static int decode_norm(const struct format_reader *r, const struct format_tensor_info *t,
                       const uint8_t *data, float **out)
{
    *out = malloc(sizeof(float) * t->shape[0]);
    if (!*out)
        return -ENOMEM;
    return format_decode_float(t->encoding, data, *out, t->shape[0]);
}

/* Runs task ti on worker `w` (0: the NPU device thread; CPU workers 1..). */
static int run_task(struct pl *p, uint32_t ti, int w, float *att_scratch)
{
    struct task *t = &p->tasks[ti];
    const struct format_config *c = p->c;
    struct sl_err err = {{0}};
    uint32_t D = c->dim, Q = c->n_heads * c->head_dim;
    uint32_t F = c->hidden_dim;
    struct chunkbuf *b = &p->cb[t->chunk];
    int ret = 0;
    switch (t->op) {
    case PL_VERIFY: {
        if (t->slice == UINT32_MAX)
            return 0; /* barrier */
        const struct format_slice_info *s = format_reader_slice(p->r, t->slice);
        const uint8_t *data = p->slice_data[t->slice];
        ret = format_slice_verify(p->r, t->slice, data, &err);
        for (uint32_t k = s->first_tensor; ret == 0 && k < s->first_tensor + s->n_tensors; k++) {
            const struct format_tensor_info *ti2 = format_reader_tensor(p->r, k);
            if (ti2->n_dims != 1)
                continue;
            float **dst = ti2->role == FORMAT_ROLE_ATTN_NORM ? &p->m->layers[ti2->layer].attn_norm
                          : ti2->role == FORMAT_ROLE_FFN_NORM ? &p->m->layers[ti2->layer].ffn_norm
                                                              : &p->m->out_norm;
            ret = decode_norm(p->r, ti2, data + (ti2->offset - s->offset), dst);
            if (ret < 0)
                sl_err_set(&err, "norm '%s' cannot be decoded", ti2->name);
        }
        break;
    }
    case PL_UNPACK: {
        uint64_t t0 = sl_now_ns();
        const struct format_slice_info *s = format_reader_slice(p->r, t->slice);
        const struct format_tensor_info *ti2 = format_reader_tensor(p->r, (uint32_t)t->tensor);
        struct infer_linear *lin = (struct infer_linear *)linear_of(p, t->layer, t->role);
        int tied = ti2->role == FORMAT_ROLE_TOK_EMBD; /* the classifier is the embedding */
        const uint8_t *data = p->slice_data[t->slice] + (ti2->offset - s->offset);
        /* the worker's scratch where its rows fit (fill_linear allocates otherwise) */
        int8_t *scratch = ti2->shape[1] <= p->fill_cols ? p->fill_scratch[w] : NULL;
        if (t->r1 > t->r0) { /* a piece, prepared by build_graph */
            ret = fill_linear(lin, ti2, data, t->r0, t->r1, scratch, &err);
            tied = 0;
        } else {
            ret = unpack_linear(lin, ti2, data, p->m->force_dynamic_act, 0, 1, scratch, &err);
        }
        /* lookups read rows back from the NPU's copy: no second copy */
        if (ret == 0 && tied)
            p->m->embed = *lin; /* shared storage; released once (infer_model_destroy) */
        pthread_mutex_lock(&p->lock);
        p->unpack_ns += sl_now_ns() - t0;
        pthread_mutex_unlock(&p->lock);
        break;
    }
    case PL_NORM: {
        if (t->layer > 0)
            infer_op_add(b->x, b->d, (size_t)b->n * D);
        infer_op_rmsnorm(b->xb, b->x, p->m->layers[t->layer].attn_norm, b->n, D, c->norm_eps);
        quantize_for(p, b, t->layer, FORMAT_ROLE_WQ, b->xb, b->n, D);
        quantize_for(p, b, t->layer, FORMAT_ROLE_WK, b->xb, b->n, D);
        quantize_for(p, b, t->layer, FORMAT_ROLE_WV, b->xb, b->n, D);
        break;
    }
    case PL_ATTN: {
        /* kv heads [kv0, kv1) and their query heads (a group, or all) */
        const uint32_t hd = c->head_dim, mul = c->n_heads / c->n_kv_heads;
        uint32_t kv0 = t->r1 > t->r0 ? t->r0 : 0, kv1 = t->r1 > t->r0 ? t->r1 : c->n_kv_heads;
        struct infer_rows rows = {.n = b->n, .slot0 = b->pos0, .pos = p->positions + b->pos0,
                                  .vis = {.n = b->n, .base = b->pos0}};
        ret = infer_step_attention(p->m, p->st->kv, p->st->attn, t->layer, &rows, b->q, b->k,
                                   b->v, kv0, kv1, b->att, att_scratch);
        if (ret < 0)
            sl_err_set(&err, "attention failed in layer %d", t->layer);
        quantize_cols(p, b, t->layer, FORMAT_ROLE_WO, b->att, b->n, Q, kv0 * mul * hd,
                      kv1 * mul * hd);
        break;
    }
    case PL_FFN_NORM:
        infer_op_add(b->x, b->o, (size_t)b->n * D);
        infer_op_rmsnorm(b->xb, b->x, p->m->layers[t->layer].ffn_norm, b->n, D, c->norm_eps);
        quantize_for(p, b, t->layer, FORMAT_ROLE_W_GATE, b->xb, b->n, D);
        quantize_for(p, b, t->layer, FORMAT_ROLE_W_UP, b->xb, b->n, D);
        break;
    case PL_SWIGLU: {
        uint32_t f0 = t->r1 > t->r0 ? t->r0 : 0, f1 = t->r1 > t->r0 ? t->r1 : F;
        for (uint32_t r = 0; r < b->n; r++) { /* elementwise: the same bits in any pieces */
            float *g = b->g + (size_t)r * F + f0;
            infer_op_swiglu(g, g, b->u + (size_t)r * F + f0, f1 - f0);
        }
        quantize_cols(p, b, t->layer, FORMAT_ROLE_W_DOWN, b->g, b->n, F, f0, f1);
        break;
    }
    case PL_HEAD: {
        /* the first token needs the last row only */
        float *xl = b->x + (size_t)(b->n - 1) * D, *dl = b->d + (size_t)(b->n - 1) * D;
        infer_op_add(xl, dl, D);
        float *xbl = b->xb + (size_t)(b->n - 1) * D;
        infer_op_rmsnorm(xbl, xl, p->m->out_norm, 1, D, c->norm_eps);
        quantize_for(p, b, -1, FORMAT_ROLE_CLASSIFIER, xbl, 1, D);
        break;
    }
    case PL_MM: {
        const struct infer_linear *lin = linear_of(p, t->layer, t->role);
        uint32_t cols;
        const float *x = mm_input(b, t->role, &cols, c);
        float *y = mm_output(p, b, t->role);
        uint32_t rows = t->role == FORMAT_ROLE_CLASSIFIER ? 1 : b->n;
        if (!lin->npu) {
            infer_op_matmul(y, x, lin->w, (enum infer_wtype)lin->wtype, rows, lin->rows, lin->cols,
                            t->r0, t->r1);
            break;
        }
        /* an NPU job on a CPU worker: stolen work, run with the same code as
         * the device (the device thread itself never comes here) */
        ret = npu_job_execute(&t->job);
        t->job.stolen = 1;
        if (ret < 0)
            sl_err_set(&err, "the NPU refused a stolen job (shape or operand mismatch)");
        (void)x;
        (void)y;
        (void)rows;
        break;
    }
    default:
        break;
    }
    if (ret < 0) {
        pthread_mutex_lock(&p->lock);
        fail(p, ret, err.msg[0] ? err.msg : "a pipeline task failed");
        pthread_mutex_unlock(&p->lock);
    }
    return ret;
}

/* Fills an NPU task's job (lock held, when it is dispatched). */
static void prepare_job(struct pl *p, struct task *t)
{
    const struct infer_linear *lin = linear_of(p, t->layer, t->role);
    struct chunkbuf *b = &p->cb[t->chunk];
    uint32_t cols;
    mm_input(b, t->role, &cols, p->c);
    t->job.graph = p->graph[t->role == FORMAT_ROLE_WK ? FORMAT_ROLE_WV : t->role];
    t->job.w = lin->npu;
    t->job.xq = b->xq[t->role];
    t->job.rows = t->role == FORMAT_ROLE_CLASSIFIER ? 1 : b->n;
    t->job.act_scale = b->act[t->role];
    t->job.y = mm_output(p, b, t->role);
    t->job.ldy = lin->rows;
    t->job.r0 = t->r0;
    t->job.r1 = t->r1;
    t->job.user = t;
}

/* ---- executors ---------------------------------------------------------------------------- */

static void keep_tail(struct pl *p, uint32_t ti);

static struct npu_job *npu_next(void *ctx)
{
    struct pl *p = ctx;
    pthread_mutex_lock(&p->lock);
    while (!p->npu_q.n && !p->done && !p->stop)
        pthread_cond_wait(&p->cv, &p->lock);
    struct npu_job *j = NULL;
    if (p->npu_q.n && !p->stop) {
        uint32_t ti = qpop(p, &p->npu_q);
        struct task *t = &p->tasks[ti];
        if (granular(p->o->policy))
            keep_tail(p, ti);
        prepare_job(p, t);
        t->executor = 0;
        t->t0 = sl_now_ns();
        p->running++;
        p->npu_running = ti;
        j = &t->job;
    }
    pthread_mutex_unlock(&p->lock);
    return j;
}

static void npu_done(void *ctx, struct npu_job *j)
{
    struct pl *p = ctx;
    struct task *t = j->user;
    pthread_mutex_lock(&p->lock);
    t->t1 = sl_now_ns();
    p->busy[0] += t->t1 - t->t0;
    p->running--;
    p->npu_running = UINT32_MAX;
    p->npu_actual_s += (double)(t->t1 - t->t0) / 1e9;
    p->npu_est_s += t->est;
    if (j->status < 0) {
        struct sl_err e = {{0}};
        npu_job_validate(j, &e);
        sl_err_prefix(&e, "%s of layer %d, chunk %u", format_role_name(t->role), t->layer,
                      t->chunk);
        fail(p, j->status, e.msg);
    }
    else
        complete(p, (uint32_t)(t - p->tasks));
    stall_update(p);
    pthread_mutex_unlock(&p->lock);
}

struct worker_arg {
    struct pl *p;
    int id;
};

/* The steal-ahead rule (lock held): the NPU's work ahead of its queued task
 * at queue index `last` (the rest of its running task plus every other
 * queued one) in *ahead, that task's own time in *own, both the tasks'
 * estimates scaled by the NPU's pace so far. A CPU worker that takes the
 * task when *ahead >= steal_ahead * *own finishes it before the NPU would
 * have started it. */
static void npu_ahead(const struct pl *p, uint32_t last, double *ahead, double *own)
{
    double pace = p->npu_est_s > 0 ? p->npu_actual_s / p->npu_est_s : 1.0;
    double a = 0;
    for (uint32_t i = 0; i < p->npu_q.n; i++)
        if (i != last)
            a += p->tasks[p->npu_q.items[i]].est;
    a *= pace;
    if (p->npu_running != UINT32_MAX) {
        const struct task *r = &p->tasks[p->npu_running];
        double left = r->est * pace - (double)(sl_now_ns() - r->t0) / 1e9;
        a += left > 0 ? left : 0;
    }
    *ahead = a;
    *own = p->tasks[p->npu_q.items[last]].est * pace;
}

/* Cuts matmul `ti` (lock held): its last `tail_rows` output channels become
 * a new task with the same predecessors (all done) and successors (each now
 * waits for one more task). Returns the new task's index, or UINT32_MAX
 * where the reserve of task slots (sized at build time, so tasks never move
 * while running) is spent. */
static uint32_t cut_task(struct pl *p, uint32_t ti, uint32_t tail_rows)
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
    return ci;
}

/* Split stealing (lock held): the NPU's last queued matmul outlasts the rest
 * of the NPU's work, so taking it whole would leave the NPU waiting for the
 * CPU, and leaving it whole leaves the CPU idle while the NPU works through
 * it. Cut its output channels instead (on 16-channel blocks, both parts at
 * least 32): the NPU keeps the first part in its queue, and the CPU gets the
 * rest, sized so both finish together ((ahead + own) / 2 of work each, at
 * the NPU's pace), by cut_task. Returns the CPU part's index; the whole
 * task's where the NPU's part would be under 32 channels; or UINT32_MAX
 * where the CPU's would be, or no task slot is left. */
static uint32_t steal_split(struct pl *p, uint32_t last, double ahead, double own)
{
    uint32_t ti = p->npu_q.items[last];
    struct task *t = &p->tasks[ti];
    uint32_t rows = t->r1 - t->r0;
    if (t->op != PL_MM || own <= 0)
        return UINT32_MAX;
    double share = (ahead + own) / (2 * own); /* of the task, for the CPU */
    uint32_t cpu_rows = (uint32_t)(share * rows) & ~15u;
    if (cpu_rows < 32)
        return UINT32_MAX;
    /* the NPU's part would be under 32 channels: the NPU's other work is
     * nearly as long as the task, so take it whole (the NPU then waits at
     * most those few channels' time) rather than leave the CPU idle */
    if (rows - cpu_rows < 32)
        return qtake(&p->npu_q, last);
    uint32_t ci = cut_task(p, ti, cpu_rows);
    p->splits += ci != UINT32_MAX;
    return ci;
}

/* Keeping a stealable tail (lock held, the NPU dispatching matmul `ti`):
 * when it is the NPU's last queued task and the CPU has nothing queued, the
 * CPU goes idle while the NPU works through the whole piece, and a running
 * job cannot be cut. Its second half goes back into the NPU's queue instead:
 * a CPU worker that turns idle meanwhile steals it (whole, or cut again so
 * both finish together); otherwise the NPU runs it next, at the cost of one
 * more dispatch (and of staging its activations once more). */
static void keep_tail(struct pl *p, uint32_t ti)
{
    struct task *t = &p->tasks[ti];
    uint32_t rows = t->r1 - t->r0;
    if (p->npu_q.n || p->cpu_q.n || t->op != PL_MM || rows < 64 || p->o->no_steal_split ||
        !(p->o->steal_ahead > 0))
        return;
    uint32_t ci = cut_task(p, ti, (rows / 2) & ~15u);
    if (ci != UINT32_MAX) {
        qpush(&p->npu_q, ci); /* cannot fail: `ti` was just taken from it */
        p->tails++;
        pthread_cond_broadcast(&p->cv);
    }
}

/* The NPU task an idle CPU worker takes (lock held), or UINT32_MAX: with
 * more than steal_threshold queued, the last in priority order (the top with
 * steal_top); otherwise under steal_ahead the last when the NPU's other work
 * outlasts it, or a cut of it (steal_split) when it does not. */
static uint32_t steal(struct pl *p)
{
    if (!p->npu_q.n)
        return UINT32_MAX;
    if (p->npu_q.n > p->o->steal_threshold)
        return p->o->steal_top ? qpop(p, &p->npu_q) : qtake(&p->npu_q, qlast(p, &p->npu_q));
    if (!(p->o->steal_ahead > 0))
        return UINT32_MAX;
    uint32_t last = qlast(p, &p->npu_q);
    double ahead, own;
    npu_ahead(p, last, &ahead, &own);
    if (ahead >= own * p->o->steal_ahead)
        return qtake(&p->npu_q, last);
    return p->o->no_steal_split ? UINT32_MAX : steal_split(p, last, ahead, own);
}

/* The prefault thread (full): while a CPU worker is idle, faults in the
 * weight memory of layers whose unpacking has not begun, a 2 MiB step at a
 * time. It is a thread of its own so that a task turning ready never waits
 * for a step: in a VM a step sometimes takes milliseconds (the host backs
 * the guest's memory lazily), and the worker takes the task at once. At
 * most the step under way then overlaps the work. */
static void *prefault_worker(void *arg)
{
    struct pl *p = arg;
    /* the lowest priority: a worker or the NPU thread that wakes takes the
     * core from it at once (if the kernel refuses, it still only steps while
     * a worker is idle) */
    struct sched_param sp = {0};
    (void)pthread_setschedparam(pthread_self(), SCHED_IDLE, &sp);
    pthread_mutex_lock(&p->lock);
    while (!p->done && !p->stop && p->next_pf < p->n_pf) {
        if (!p->idle_workers) {
            pthread_cond_wait(&p->pf_cv, &p->lock);
            continue;
        }
        struct prefault *f = &p->pf[p->next_pf++];
        if (f->layer <= p->unpack_layer)
            continue; /* its unpacking faults it in itself */
        f->t0 = sl_now_ns();
        pthread_mutex_unlock(&p->lock);
        int r = npu_weights_prefault(f->w, f->off, f->len);
        pthread_mutex_lock(&p->lock);
        f->t1 = sl_now_ns();
        p->prefault_ns += f->t1 - f->t0;
        if (r < 0)
            p->next_pf = p->n_pf; /* the kernel cannot: stop trying */
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

static void *cpu_worker(void *arg)
{
    struct worker_arg *wa = arg;
    struct pl *p = wa->p;
    int id = wa->id;
    int steal_on = granular(p->o->policy);
    pthread_mutex_lock(&p->lock);
    for (;;) {
        uint32_t ti = UINT32_MAX;
        while (!p->done && !p->stop) {
            if (p->cpu_q.n) {
                ti = qpop(p, &p->cpu_q);
                break;
            }
            /* EdgeFlow 4.3: an idle CPU takes an NPU task when the NPU's
             * queue is longer than the threshold (and under steal_ahead) */
            if (steal_on && (ti = steal(p)) != UINT32_MAX) {
                prepare_job(p, &p->tasks[ti]);
                p->stolen++;
                break;
            }
            /* nothing to run: the prefault thread may fault in weight
             * memory the unpacking will fill meanwhile */
            p->idle_workers++;
            if (p->next_pf < p->n_pf)
                pthread_cond_signal(&p->pf_cv);
            pthread_cond_wait(&p->cv, &p->lock);
            p->idle_workers--;
        }
        if (ti == UINT32_MAX)
            break;
        struct task *t = &p->tasks[ti];
        t->executor = id;
        t->t0 = sl_now_ns();
        p->running++;
        if (t->op == PL_UNPACK) {
            int layer = t->layer < 0 ? (int)p->c->n_layers : t->layer;
            p->unpack_layer = layer > p->unpack_layer ? layer : p->unpack_layer;
        }
        pthread_mutex_unlock(&p->lock);
        int ret = run_task(p, ti, id, p->att_scratch[id]);
        pthread_mutex_lock(&p->lock);
        t->t1 = sl_now_ns();
        p->busy[id] += t->t1 - t->t0;
        p->running--;
        if (ret == 0)
            complete(p, ti);
        stall_update(p);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

/* ---- slices --------------------------------------------------------------------------------- */

static void release_slice(struct pl *p, uint32_t s)
{
    if (p->ls && p->slice_sl[s].data)
        loader_stream_release(p->ls, &p->slice_sl[s]);
}

/* A slice arrived (lock held): its VERIFY task loses its last dependency. */
static void arrived(struct pl *p, uint32_t s)
{
    p->load_events[s < 4096 ? s : 4095] = sl_now_ns();
    if (!p->slice_needed[s])
        return;
    struct task *v = &p->tasks[p->verify_task[s]];
    if (--v->deps == 0)
        make_ready(p, p->verify_task[s]);
}

/* ---- embedding rows ahead of the stream -------------------------------------------------- */

static int pread_full(int fd, void *buf, uint64_t len, uint64_t off)
{
    uint8_t *b = buf;
    while (len) {
        ssize_t k = pread(fd, b, (size_t)len, (off_t)off);
        if (k <= 0) {
            if (k < 0 && errno == EINTR)
                continue;
            return -EIO;
        }
        b += k;
        len -= (uint64_t)k;
        off += (uint64_t)k;
    }
    return 0;
}

/* One row of a packed tensor from its code bytes: wrapped in a one-row
 * tensor (the prefix of docs/FORMAT-packed.md) and unpacked through the
 * public API, so the row is validated and decoded like any tensor. */
static int unpack_one_row(uint32_t encoding, const uint8_t *row, uint64_t row_bytes,
                          uint32_t cols, uint32_t width, float scale, int8_t *dst)
{
    uint64_t prefix = format_packed_prefix_bytes(1);
    uint8_t *b = calloc(1, prefix + row_bytes);
    if (!b)
        return -ENOMEM;
    memcpy(b, encoding == FORMAT_ENC_ADAPTIVE ? "SLAD" : encoding == FORMAT_ENC_INT4INT8 ? "SL48"
                                                                                        : "SLBP",
           4);
    sl_store_le32(b + 4, 1);
    sl_store_le32(b + 8, 1);
    sl_store_le32(b + 12, cols);
    sl_store_le32(b + 16, encoding == FORMAT_ENC_ADAPTIVE ? FORMAT_PACKED_GROUP : 0);
    sl_store_le64(b + 24, row_bytes);
    b[FORMAT_PACKED_HEADER] = (uint8_t)(width - 1);
    sl_store_lef32(b + sl_align_up(FORMAT_PACKED_HEADER + 2, 64), scale);
    memcpy(b + prefix, row, row_bytes);
    struct unpack_tensor u;
    int ret = unpack_tensor_init(&u, encoding, b, prefix + row_bytes, 1, cols, NULL);
    if (ret == 0) {
        ret = unpack_tensor_rows(&u, unpack_kernel_best(), 0, 1, dst, NULL);
        unpack_tensor_fini(&u);
    }
    free(b);
    return ret;
}

/* x[n][D] = the embedding rows of the prompt, read with a few small reads.
 * These bytes are covered by their slice's checksum when the slice is read
 * whole: with the head slice (tied), before the first token is returned; or
 * after it (untied embedding, read last for decoding). */
static int embed_rows(struct pl *p, float *x, struct sl_err *err)
{
    const struct format_config *c = p->c;
    int ti = format_reader_find(p->r, -1, FORMAT_ROLE_TOK_EMBD);
    const struct format_tensor_info *t = format_reader_tensor(p->r, (uint32_t)ti);
    int fd = format_reader_fd(p->r);
    const char *path = format_reader_path(p->r);
    uint32_t D = c->dim, rows = c->vocab_size;
    uint32_t n = 0;
    for (uint32_t ch = 0; ch < p->n_chunks; ch++)
        n += p->cb[ch].n;
    int8_t *q = malloc(D);
    uint8_t *raw = malloc((size_t)D * 4 + 64);
    uint8_t *prefix = NULL;
    uint64_t *row_off = NULL;
    int ret = q && raw ? 0 : -ENOMEM;
    if (ret == 0 && format_encoding_traits(t->encoding)->quantized &&
        t->encoding != FORMAT_ENC_Q8_CHANNEL) {
        uint64_t plen = format_packed_prefix_bytes(rows);
        prefix = malloc(plen);
        row_off = malloc(sizeof(uint64_t) * rows);
        ret = prefix && row_off ? pread_full(fd, prefix, plen, t->offset) : -ENOMEM;
        struct format_packed_layout lay;
        /* the prefix alone: parse its header and widths, not the codes */
        if (ret == 0 && (memcmp(prefix, "SL", 2) != 0 || sl_load_le32(prefix + 8) != rows ||
                         sl_load_le32(prefix + 12) != D))
            ret = -EINVAL;
        (void)lay;
        uint64_t off = 0;
        for (uint32_t r = 0; ret == 0 && r < rows; r++) {
            row_off[r] = off;
            off += format_packed_row_bytes(t->encoding,
                                           format_packed_width(prefix + FORMAT_PACKED_HEADER, r), D);
        }
        if (ret == 0 && off + plen != t->length)
            ret = -EINVAL;
    }
    for (uint32_t i = 0; ret == 0 && i < n; i++) {
        uint32_t tok = (uint32_t)p->tokens[i];
        if (tok >= rows) {
            sl_err_set(err, "token id %u outside the vocabulary of %u", tok, rows);
            ret = -EINVAL;
            break;
        }
        float *xi = x + (size_t)i * D;
        if (!format_encoding_traits(t->encoding)->quantized) {
            uint64_t esz = t->encoding == FORMAT_ENC_F32 ? 4 : 2;
            ret = pread_full(fd, raw, D * esz, t->offset + (uint64_t)tok * D * esz);
            if (ret == 0)
                format_decode_float(t->encoding, raw, xi, D);
        } else if (t->encoding == FORMAT_ENC_Q8_CHANNEL) {
            uint8_t s4[4];
            ret = pread_full(fd, s4, 4, t->offset + 4 * (uint64_t)tok);
            if (ret == 0)
                ret = pread_full(fd, q, D,
                                 t->offset + sl_align_up((uint64_t)rows * 4, 64) + (uint64_t)tok * D);
            float s = sl_load_lef32(s4);
            for (uint32_t j = 0; ret == 0 && j < D; j++)
                xi[j] = s * (float)q[j];
        } else {
            uint32_t width = format_packed_width(prefix + FORMAT_PACKED_HEADER, tok);
            uint64_t rb = format_packed_row_bytes(t->encoding, width, D);
            uint64_t scoff = sl_align_up(FORMAT_PACKED_HEADER + ((uint64_t)rows * 3 + 7) / 8 + 1, 64);
            ret = pread_full(fd, raw, rb,
                             t->offset + format_packed_prefix_bytes(rows) + row_off[tok]);
            float s = sl_load_lef32(prefix + scoff + 4 * (uint64_t)tok);
            if (ret == 0)
                ret = unpack_one_row(t->encoding, raw, rb, D, width, s, q);
            for (uint32_t j = 0; ret == 0 && j < D; j++)
                xi[j] = s * (float)q[j];
        }
    }
    if (ret < 0 && !err->msg[0])
        sl_err_set(err, "%s: cannot read the embedding rows of the prompt (%s)", path,
                   strerror(-ret));
    free(q);
    free(raw);
    free(prefix);
    free(row_off);
    return ret;
}

/* ---- trace ---------------------------------------------------------------------------------- */

static int write_trace(struct pl *p, const char *path, struct infer_pipeline_stats *st)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return -errno;
    fprintf(f, "{\"displayTimeUnit\": \"ms\", \"otherData\": {\"policy\": \"%s\", "
               "\"ttft_s\": %.6f, \"stall_s\": %.6f, \"bubble_npu\": %.4f, "
               "\"bubble_cpu\": %.4f, \"idle_npu\": %.4f, \"idle_cpu\": %.4f, \"stolen\": %u},\n"
               "\"traceEvents\": [\n",
            infer_policy_name(p->o->policy), st->ttft_s, st->stall_s, st->bubble_npu,
            st->bubble_cpu, st->idle_npu, st->idle_cpu, st->stolen);
    fprintf(f, "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": 0, "
               "\"args\": {\"name\": \"NPU\"}},\n");
    for (uint32_t w = 1; w <= p->n_workers; w++)
        fprintf(f, "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": %u, "
                   "\"args\": {\"name\": \"CPU %u\"}},\n", w, w);
    if (p->pf_started)
        fprintf(f, "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": %d, "
                   "\"args\": {\"name\": \"prefault\"}},\n", PL_PREFAULT_TID);
    fprintf(f, "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": 100, "
               "\"args\": {\"name\": \"flash\"}}");
    /* B/E pairs, in time order per track */
    for (uint32_t i = 0; i < p->n_tasks; i++) {
        const struct task *t = &p->tasks[i];
        if (t->executor < 0 || (t->op == PL_VERIFY && t->slice == UINT32_MAX))
            continue;
        double b = (double)(t->t0 - p->t_start) / 1e3, e = (double)(t->t1 - p->t_start) / 1e3;
        char name[96];
        if (t->op == PL_MM)
            snprintf(name, sizeof name, "%s L%d C%u [%u,%u)%s", format_role_name(t->role),
                     t->layer, t->chunk, t->r0, t->r1, t->job.stolen ? " stolen" : "");
        else if (t->op == PL_UNPACK && t->r1 > t->r0)
            snprintf(name, sizeof name, "unpack %s L%d [%u,%u)", format_role_name(t->role),
                     t->layer, t->r0, t->r1);
        else if (t->op == PL_VERIFY || t->op == PL_UNPACK)
            snprintf(name, sizeof name, "%s %s L%d", op_names[t->op],
                     t->op == PL_UNPACK ? format_role_name(t->role) : "", t->layer);
        else if ((t->op == PL_ATTN || t->op == PL_SWIGLU) && t->r1 > t->r0)
            snprintf(name, sizeof name, "%s L%d C%u [%u,%u)%s", op_names[t->op], t->layer,
                     t->chunk, t->r0, t->r1, t->op == PL_ATTN ? " kv heads" : "");
        else
            snprintf(name, sizeof name, "%s L%d C%u", op_names[t->op], t->layer, t->chunk);
        /* args: how long the task waited ready for an executor */
        double w = t->t_ready && t->t0 > t->t_ready ? (double)(t->t0 - t->t_ready) / 1e3 : 0;
        fprintf(f, ",\n{\"name\": \"%s\", \"cat\": \"%s\", \"ph\": \"B\", \"pid\": 1, \"tid\": %d, "
                   "\"ts\": %.3f, \"args\": {\"ready_wait_us\": %.3f}},\n{\"name\": \"%s\", "
                   "\"cat\": \"%s\", \"ph\": \"E\", \"pid\": 1, \"tid\": %d, \"ts\": %.3f}",
                name, op_names[t->op], t->executor, b, w, name, op_names[t->op], t->executor, e);
    }
    for (uint32_t i = 0; i < p->n_pf; i++) {
        const struct prefault *pf = &p->pf[i];
        if (!pf->t1)
            continue;
        double b = (double)(pf->t0 - p->t_start) / 1e3, e = (double)(pf->t1 - p->t_start) / 1e3;
        char name[64];
        snprintf(name, sizeof name, "prefault L%d +%zu MiB", pf->layer, pf->off >> 20);
        fprintf(f, ",\n{\"name\": \"%s\", \"cat\": \"prefault\", \"ph\": \"B\", "
                   "\"pid\": 1, \"tid\": %d, \"ts\": %.3f},\n{\"name\": \"%s\", "
                   "\"cat\": \"prefault\", \"ph\": \"E\", \"pid\": 1, \"tid\": %d, \"ts\": %.3f}",
                name, PL_PREFAULT_TID, b, name, PL_PREFAULT_TID, e);
    }
    uint64_t prev = p->t_start;
    for (uint32_t s = 0; s < format_reader_n_slices(p->r) && s < 4096; s++) {
        if (!p->load_events[s] || p->load_events[s] < prev)
            continue;
        fprintf(f, ",\n{\"name\": \"load slice %u\", \"cat\": \"load\", \"ph\": \"B\", \"pid\": 1, "
                   "\"tid\": 100, \"ts\": %.3f},\n{\"name\": \"load slice %u\", \"cat\": \"load\", "
                   "\"ph\": \"E\", \"pid\": 1, \"tid\": 100, \"ts\": %.3f}",
                s, (double)(prev - p->t_start) / 1e3, s,
                (double)(p->load_events[s] - p->t_start) / 1e3);
        prev = p->load_events[s];
    }
    fprintf(f, "\n]}\n");
    int bad = ferror(f);
    bad |= fflush(f) != 0 || fsync(fileno(f)) != 0;
    fclose(f);
    if (bad || rename(tmp, path) < 0) {
        unlink(tmp);
        return -EIO;
    }
    return 0;
}

/* ---- the driver ------------------------------------------------------------------------------ */

static void stats_fill(struct pl *p, struct infer_pipeline_stats *st)
{
    memset(st, 0, sizeof *st);
    uint64_t end = p->t_logits ? p->t_logits : sl_now_ns();
    double span = (double)(end - p->t_start) / 1e9;
    st->ttft_s = span;
    st->span_s = span;
    st->load_s = p->t_loaded ? (double)(p->t_loaded - p->t_start) / 1e9 : 0;
    st->unpack_s = (double)p->unpack_ns / 1e9;
    st->prefault_s = (double)p->prefault_ns / 1e9;
    st->npu_busy_s = (double)p->busy[0] / 1e9;
    uint64_t cpu = 0;
    for (uint32_t w = 1; w <= p->n_workers; w++)
        cpu += p->busy[w];
    st->cpu_busy_s = (double)cpu / 1e9;
    uint64_t stall = p->stall_ns;
    if (p->stall_t0 && end > p->stall_t0)
        stall += end - p->stall_t0;
    st->stall_s = (double)stall / 1e9;
    if (st->stall_s > span)
        st->stall_s = span;
    double work = span - st->stall_s;
    st->bubble_npu = work > 0 ? 1.0 - st->npu_busy_s / work : 0;
    st->bubble_cpu = work > 0 ? 1.0 - st->cpu_busy_s / (work * p->n_workers) : 0;
    st->idle_npu = span > 0 ? 1.0 - st->npu_busy_s / span : 0;
    st->idle_cpu = span > 0 ? 1.0 - st->cpu_busy_s / (span * p->n_workers) : 0;
    double *clampv[] = {&st->bubble_npu, &st->bubble_cpu, &st->idle_npu, &st->idle_cpu};
    for (int i = 0; i < 4; i++)
        if (*clampv[i] < 0)
            *clampv[i] = 0;
    st->bytes_read = p->bytes_read;
    st->tasks = p->n_tasks;
    st->stolen = p->stolen;
    st->splits = p->splits;
    st->tails = p->tails;
    if (p->dev) {
        struct npu_device_stats ds;
        npu_device_stats(p->dev, &ds);
        st->graphs = (uint32_t)ds.graphs_built;
        st->graph_build_s = (double)ds.build_ns / 1e9;
    }
}

static int alloc_chunks(struct pl *p, uint32_t n)
{
    const struct format_config *c = p->c;
    uint32_t chunk = p->o->chunk;
    p->n_chunks = (n + chunk - 1) / chunk;
    p->cb = calloc(p->n_chunks, sizeof *p->cb);
    if (!p->cb)
        return -ENOMEM;
    size_t D = c->dim, Q = (size_t)c->n_heads * c->head_dim, KV = (size_t)c->n_kv_heads * c->head_dim;
    size_t F = c->hidden_dim, W = D > Q ? D : Q;
    for (uint32_t ch = 0; ch < p->n_chunks; ch++) {
        struct chunkbuf *b = &p->cb[ch];
        b->pos0 = ch * chunk;
        b->n = n - b->pos0 < chunk ? n - b->pos0 : chunk;
        size_t r = b->n;
        b->x = malloc(sizeof(float) * r * D);
        b->xb = malloc(sizeof(float) * r * W);
        b->q = malloc(sizeof(float) * r * Q);
        b->k = malloc(sizeof(float) * r * KV);
        b->v = malloc(sizeof(float) * r * KV);
        b->att = malloc(sizeof(float) * r * Q);
        b->o = malloc(sizeof(float) * r * D);
        b->g = malloc(sizeof(float) * r * F);
        b->u = malloc(sizeof(float) * r * F);
        b->d = malloc(sizeof(float) * r * D);
        if (!b->x || !b->xb || !b->q || !b->k || !b->v || !b->att || !b->o || !b->g || !b->u ||
            !b->d)
            return -ENOMEM;
        uint32_t roles[8] = {FORMAT_ROLE_WQ,     FORMAT_ROLE_WK,   FORMAT_ROLE_WV,
                             FORMAT_ROLE_WO,     FORMAT_ROLE_W_GATE, FORMAT_ROLE_W_UP,
                             FORMAT_ROLE_W_DOWN, FORMAT_ROLE_CLASSIFIER};
        size_t width[8] = {D, D, D, Q, D, D, F, D};
        for (int k = 0; k < 8; k++) {
            b->xq[roles[k]] = sl_alloc_aligned(r * width[k], 64);
            if (!b->xq[roles[k]])
                return -ENOMEM;
        }
    }
    return 0;
}

static void free_chunks(struct pl *p)
{
    for (uint32_t ch = 0; p->cb && ch < p->n_chunks; ch++) {
        struct chunkbuf *b = &p->cb[ch];
        free(b->x);
        free(b->xb);
        free(b->q);
        free(b->k);
        free(b->v);
        free(b->att);
        free(b->o);
        free(b->g);
        free(b->u);
        free(b->d);
        for (int k = 0; k < FORMAT_ROLE_COUNT; k++)
            sl_free_aligned(b->xq[k]);
    }
    free(p->cb);
}

/* Opens the loader stream: reading starts at once, on the loader's thread,
 * while the caller prepares everything else. */
static int open_stream(struct pl *p, struct sl_err *err)
{
    const struct format_reader *r = p->r;
    uint32_t ns = format_reader_n_slices(r);
    const char *path = format_reader_path(r);
    struct loader_request *reqs = calloc(ns, sizeof *reqs);
    if (!reqs)
        return -ENOMEM;
    uint32_t k = 0;
    for (int pass = 0; pass < 2; pass++)
        for (uint32_t i = 0; i < ns; i++) {
            const struct format_slice_info *s = format_reader_slice(r, i);
            if ((s->kind == FORMAT_SLICE_EMBED) != pass)
                continue;
            reqs[k++] = (struct loader_request){.path = path, .fd = -1, .offset = s->offset,
                                                .length = s->length, .tag = i};
        }
    struct loader_opts lo = {.queue_depth = p->o->queue_depth, .ring_bytes = p->o->ring_bytes};
    if (load_first(p->o->policy)) /* everything is held until the end */
        lo.ring_bytes = format_reader_file_size(r) + (64u << 20);
    int ret = loader_stream_open(reqs, ns, &lo, &p->ls, err);
    free(reqs);
    return ret;
}

/* Streams the slices in; returns after the last slice the first token needs
 * has arrived (the untied embedding is read later, by finish_embedding). */
static int feed(struct pl *p, void **whole, size_t *whole_len, struct sl_err *err)
{
    const struct format_reader *r = p->r;
    uint32_t ns = format_reader_n_slices(r);
    const char *path = format_reader_path(r);
    if (p->o->load == INFER_LOAD_STREAM) {
        int ret;
        uint32_t needed = 0;
        for (uint32_t i = 0; i < ns; i++)
            needed += p->slice_needed[i];
        for (uint32_t got = 0; got < needed;) {
            struct loader_slice sl;
            ret = loader_stream_next(p->ls, &sl, err);
            if (ret <= 0)
                return ret < 0 ? ret : -EIO;
            uint32_t s = (uint32_t)sl.tag;
            pthread_mutex_lock(&p->lock);
            p->slice_sl[s] = sl;
            p->slice_data[s] = sl.data;
            p->bytes_read += sl.length;
            arrived(p, s);
            int stop = p->stop;
            pthread_mutex_unlock(&p->lock);
            if (stop)
                return 0;
            got++;
        }
        p->t_loaded = sl_now_ns();
        return 0;
    }
    /* read everything first (MNN's way) or map it with MAP_POPULATE (llama.cpp's) */
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        sl_err_set(err, "%s: %s", path, strerror(errno));
        return -errno;
    }
    size_t len = (size_t)format_reader_file_size(r);
    uint8_t *base;
    if (p->o->load == INFER_LOAD_MMAP) {
        base = mmap(NULL, len, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
        if (base == MAP_FAILED)
            base = NULL;
    } else {
        base = sl_alloc_aligned(len, 4096);
        if (base && pread_full(fd, base, len, 0) < 0) {
            sl_free_aligned(base);
            base = NULL;
        }
    }
    close(fd);
    if (!base) {
        sl_err_set(err, "%s: cannot read the container whole", path);
        return -EIO;
    }
    *whole = base;
    *whole_len = len;
    p->bytes_read = len;
    p->t_loaded = sl_now_ns();
    pthread_mutex_lock(&p->lock);
    for (uint32_t i = 0; i < ns; i++) {
        p->slice_data[i] = base + format_reader_slice(r, i)->offset;
        arrived(p, i);
    }
    pthread_mutex_unlock(&p->lock);
    return 0;
}

/* The untied embedding (for decoding): read, verified, unpacked to rows. */
static int finish_embedding(struct pl *p, struct sl_err *err)
{
    const struct format_reader *r = p->r;
    int ret = 0;
    for (uint32_t i = 0; i < format_reader_n_slices(r) && ret == 0; i++) {
        const struct format_slice_info *s = format_reader_slice(r, i);
        if (s->kind != FORMAT_SLICE_EMBED)
            continue;
        const uint8_t *data = p->slice_data[i];
        struct loader_slice sl = {0};
        if (p->ls) {
            ret = loader_stream_next(p->ls, &sl, err);
            if (ret <= 0)
                return ret < 0 ? ret : -EIO;
            data = sl.data;
            p->bytes_read += sl.length;
        }
        ret = format_slice_verify(r, i, data, err);
        const struct format_tensor_info *t = format_reader_tensor(r, s->first_tensor);
        if (ret == 0) {
            if (format_encoding_traits(t->encoding)->quantized) {
                ret = keep_packed(&p->m->embed, t, data + (t->offset - s->offset), err);
            } else {
                ret = infer_linear_init(&p->m->embed, t, data + (t->offset - s->offset), 0,
                                        p->m->force_dynamic_act, err);
            }
        }
        if (p->ls)
            loader_stream_release(p->ls, &sl);
    }
    return ret;
}

int infer_pipeline_prefill(const char *path, const int *tokens, uint32_t n,
                           const struct infer_pipeline_opts *opts, struct infer_model **model,
                           struct infer_state **state, float *logits,
                           struct infer_pipeline_stats *stats, struct sl_err *err)
{
    struct infer_pipeline_opts o = opts ? *opts : (struct infer_pipeline_opts){0};
    if (!o.chunk)
        o.chunk = 256;
    if (!opts) {
        o.steal_threshold = 5;
        o.steal_ahead = 1.0;
    }
    if (!o.split)
        o.split = 512;
    if (!o.cpu_workers)
        o.cpu_workers = 1;
    if (o.cpu_workers > MAX_CPU_WORKERS)
        o.cpu_workers = MAX_CPU_WORKERS;
    if (!o.ring_bytes)
        o.ring_bytes = 64ull << 20;
    struct pl *p = calloc(1, sizeof *p);
    if (!p) {
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    p->npu_running = UINT32_MAX;
    p->o = &o;
    p->t_start = sl_now_ns();
    p->stall_t0 = p->t_start; /* nothing can run before the first slice */
    p->unpack_layer = -1;
    p->tokens = tokens;
    p->logits = logits;
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->cv, NULL);
    pthread_cond_init(&p->pf_cv, NULL);
    void *whole = NULL;
    size_t whole_len = 0;
    struct worker_arg wargs[MAX_CPU_WORKERS + 1];
    int dev_started = 0;
    struct infer_load_opts lo = {.lazy = 1, .no_mmap = 1};
    int ret = infer_model_load(path, &lo, &p->m, err);
    if (ret < 0)
        goto out;
    p->c = infer_model_config(p->m);
    p->r = infer_model_reader(p->m);
    const struct format_config *c = p->c;
    ret = -EINVAL;
    if (n == 0 || n > c->seq_len) {
        sl_err_set(err, "a prompt of %u tokens does not fit the context of %u", n, c->seq_len);
        goto out;
    }
    if (c->n_layers > 4096 || format_reader_n_slices(p->r) > 4096) {
        sl_err_set(err, "too many layers for the pipeline");
        goto out;
    }
    ret = -ENOMEM;
    uint32_t ns = format_reader_n_slices(p->r);
    p->slice_data = calloc(ns, sizeof *p->slice_data);
    p->slice_sl = calloc(ns, sizeof *p->slice_sl);
    p->slice_left = calloc(ns, sizeof *p->slice_left);
    p->verify_task = calloc(ns, sizeof *p->verify_task);
    p->slice_needed = calloc(ns, sizeof *p->slice_needed);
    if (!p->slice_data || !p->slice_sl || !p->slice_left || !p->verify_task || !p->slice_needed ||
        alloc_chunks(p, n) < 0) {
        sl_err_set(err, "out of memory for the pipeline's buffers");
        goto out;
    }
    /* the disk starts now; everything below overlaps with the first reads */
    if (o.load == INFER_LOAD_STREAM) {
        ret = open_stream(p, err);
        if (ret < 0)
            goto out;
    }
    ret = infer_state_create(p->m, o.chunk, &p->st, err);
    if (ret < 0)
        goto out;
    /* the prompt fills the cache's first n slots, positions 0..n-1 */
    p->positions = malloc(sizeof *p->positions * n);
    if (!p->positions) {
        ret = -ENOMEM;
        sl_err_set(err, "out of memory");
        goto out;
    }
    for (uint32_t i = 0; i < n; i++)
        p->positions[i] = i;
    ret = infer_kv_reserve(infer_state_kv(p->st), n, p->positions, 0);
    if (ret < 0) {
        sl_err_set(err, "a prompt of %u tokens does not fit the KV cache", n);
        goto out;
    }
    p->lin_info = calloc(c->n_layers + 1, sizeof *p->lin_info);
    if (!p->lin_info) {
        ret = -ENOMEM;
        goto out;
    }
    for (uint32_t i = 0; i < format_reader_n_tensors(p->r); i++) {
        const struct format_tensor_info *t = format_reader_tensor(p->r, i);
        uint32_t role = t->role == FORMAT_ROLE_TOK_EMBD ? FORMAT_ROLE_CLASSIFIER : t->role;
        if (!format_role_is_linear(role) || (t->role == FORMAT_ROLE_TOK_EMBD && !c->tied_embedding))
            continue;
        p->lin_info[t->layer + 1][role].int8 = format_encoding_traits(t->encoding)->quantized;
        p->lin_info[t->layer + 1][role].act = p->m->force_dynamic_act ? 0.0f : t->act_scale;
    }
    if (build_graph(p) < 0) {
        ret = -ENOMEM;
        sl_err_set(err, "out of memory building the task graph");
        goto out;
    }
    /* slots for split stealing's tasks, reserved now: running tasks are
     * used through pointers, so the array must not move later */
    uint32_t reserve = granular(o.policy) && !o.no_steal_split ? p->n_tasks / 4 + 64 : 0;
    if (p->cap_tasks < p->n_tasks + reserve) {
        struct task *t = realloc(p->tasks, sizeof *t * (p->n_tasks + reserve));
        if (!t) {
            ret = -ENOMEM;
            sl_err_set(err, "out of memory building the task graph");
            goto out;
        }
        p->tasks = t;
        p->cap_tasks = p->n_tasks + reserve;
    }
    p->remaining = p->n_tasks;
    /* the prompt's embedding rows, ahead of the stream */
    float *x0 = malloc(sizeof(float) * (size_t)n * c->dim);
    if (!x0) {
        ret = -ENOMEM;
        goto out;
    }
    ret = embed_rows(p, x0, err);
    for (uint32_t ch = 0; ret == 0 && ch < p->n_chunks; ch++)
        memcpy(p->cb[ch].x, x0 + (size_t)p->cb[ch].pos0 * c->dim,
               sizeof(float) * p->cb[ch].n * c->dim);
    free(x0);
    if (ret < 0)
        goto out;
    /* the NPU's graphs: one per matmul shape, shared by every chunk and layer */
    if (o.device) {
        p->dev = o.device; /* the caller's (a session's): it stays running */
    } else {
        ret = npu_device_create(&p->dev);
        if (ret < 0) {
            sl_err_set(err, "cannot start the NPU device");
            goto out;
        }
    }
    {
        uint32_t D = c->dim, Q = c->n_heads * c->head_dim, KV = c->n_kv_heads * c->head_dim;
        uint32_t F = c->hidden_dim;
        struct {
            uint32_t role, k, nout;
        } shapes[] = {{FORMAT_ROLE_WQ, D, Q},      {FORMAT_ROLE_WV, D, KV},
                      {FORMAT_ROLE_WO, Q, D},      {FORMAT_ROLE_W_GATE, D, F},
                      {FORMAT_ROLE_W_UP, D, F},    {FORMAT_ROLE_W_DOWN, F, D},
                      {FORMAT_ROLE_CLASSIFIER, D, c->vocab_size}};
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
            ret = npu_device_graph(p->dev, o.chunk, shapes[i].k, shapes[i].nout,
                                   &p->graph[shapes[i].role], err);
            if (ret < 0)
                goto out;
        }
    }
    /* executors: the NPU device thread and the CPU workers */
    p->n_workers = o.cpu_workers;
    uint32_t fill_cols = c->dim > c->hidden_dim ? c->dim : c->hidden_dim;
    if (c->n_heads * c->head_dim > fill_cols)
        fill_cols = c->n_heads * c->head_dim;
    p->fill_cols = fill_cols;
    for (uint32_t w = 0; w <= p->n_workers; w++) {
        p->att_scratch[w] = malloc(sizeof(float) * INFER_ATT_ROWS * c->seq_len);
        p->fill_scratch[w] = w ? sl_alloc_aligned((size_t)PL_FILL_ROWS * fill_cols, 64) : NULL;
        if (!p->att_scratch[w] || (w && !p->fill_scratch[w])) {
            ret = -ENOMEM;
            goto out;
        }
    }
    ret = npu_device_start(p->dev, npu_next, npu_done, p);
    if (ret < 0) {
        sl_err_set(err, "cannot start the NPU device thread");
        goto out;
    }
    dev_started = 1;
    uint32_t started = 0;
    for (uint32_t w = 1; w <= p->n_workers; w++) {
        wargs[w] = (struct worker_arg){p, (int)w};
        if (pthread_create(&p->workers[w - 1], NULL, cpu_worker, &wargs[w]) != 0)
            break;
        started++;
    }
    p->n_workers = started;
    if (!started) {
        ret = -EAGAIN;
        sl_err_set(err, "cannot start a CPU worker");
        pthread_mutex_lock(&p->lock);
        p->stop = 1;
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->lock);
        goto join;
    }
    /* without it the work is the same: the unpacking faults its memory */
    if (p->n_pf && pthread_create(&p->pf_thread, NULL, prefault_worker, p) == 0)
        p->pf_started = 1;
    pthread_mutex_lock(&p->lock);
    /* tasks without dependencies (the sequential barrier waits for the load) */
    for (uint32_t i = 0; i < p->n_tasks; i++)
        if (p->tasks[i].deps == 0 && !(p->tasks[i].op == PL_VERIFY &&
                                       p->tasks[i].slice == UINT32_MAX))
            make_ready(p, i);
    pthread_mutex_unlock(&p->lock);
    ret = feed(p, &whole, &whole_len, err);
    pthread_mutex_lock(&p->lock);
    if (ret < 0)
        fail(p, ret, err->msg);
    if (load_first(o.policy) && !p->stop) /* everything is in: compute */
        make_ready(p, 0);
    while (!p->done && !p->stop)
        pthread_cond_wait(&p->cv, &p->lock);
    if (p->error) {
        ret = p->error;
        *err = p->err;
    }
    pthread_cond_broadcast(&p->cv);
    pthread_cond_broadcast(&p->pf_cv);
    pthread_mutex_unlock(&p->lock);
join:
    for (uint32_t w = 0; w < p->n_workers; w++)
        pthread_join(p->workers[w], NULL);
    if (p->pf_started)
        pthread_join(p->pf_thread, NULL);
    if (dev_started)
        npu_device_join(p->dev);
    if (ret < 0)
        goto out;
    if (stats)
        stats_fill(p, stats);
    if (o.first_logits)
        o.first_logits(o.ctx, logits);
    /* decoding needs the (untied) embedding: read after the first token */
    ret = finish_embedding(p, err);
    if (ret < 0)
        goto out;
    p->m->globals_loaded = 1;
    for (uint32_t l = 0; l < c->n_layers; l++)
        p->m->layers[l].loaded = 1;
    if (o.trace_path) {
        struct infer_pipeline_stats tmp;
        stats_fill(p, &tmp);
        if (write_trace(p, o.trace_path, &tmp) < 0) {
            sl_err_set(err, "%s: cannot write the trace", o.trace_path);
            ret = -EIO;
            goto out;
        }
    }
    *model = p->m;
    *state = p->st;
    p->m = NULL;
    p->st = NULL;
out:
    loader_stream_close(p->ls);
    if (whole) {
        if (o.load == INFER_LOAD_MMAP)
            munmap(whole, whole_len);
        else
            sl_free_aligned(whole);
    }
    if (!o.device)
        npu_device_destroy(p->dev);
    for (uint32_t w = 0; w <= MAX_CPU_WORKERS; w++) {
        free(p->att_scratch[w]);
        sl_free_aligned(p->fill_scratch[w]);
    }
    free_chunks(p);
    infer_state_destroy(p->st);
    infer_model_destroy(p->m);
    free(p->tasks);
    free(p->pf);
    free(p->edges);
    free(p->edge_from);
    free(p->edge_to);
    free(p->slice_data);
    free(p->slice_sl);
    free(p->slice_left);
    free(p->verify_task);
    free(p->slice_needed);
    free(p->lin_info);
    free(p->positions);
    free(p->npu_q.items);
    free(p->cpu_q.items);
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->cv);
    pthread_cond_destroy(&p->pf_cv);
    free(p);
    return ret;
}

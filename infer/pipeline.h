/* pipeline.h: the cold-start prefill pipeline (EdgeFlow 4.3, Appendix B;
 * llm.npu 3.2, 3.4), the shared types of its files. Internal to the infer
 * module; the public entry points are in infer.h (infer_pipeline_*).
 *
 * The files, in call order: each calls only files above it, never one below
 * (no cycle among them):
 *
 *   pipeline_weights.c  weight preparation: storage for a linear, its rows
 *                       unpacked into the NPU's layout, norms decoded (knows
 *                       nothing of struct pl)
 *   pipeline_cost.c     the cost model: each task's priority key and
 *                       estimated time
 *   pipeline_graph.c    the task graph: tasks, edges (CSR), the storage of
 *                       split weights; cutting a matmul in two
 *   pipeline_pool.c     packed residency: the layers' int8 copies from a
 *                       bounded pool, admitted in execution order
 *   pipeline_acts.c     the chunks' activation memory: sets of scratch
 *                       admitted per (layer, chunk) in execution order
 *   pipeline_queue.c    ready queues and priorities, completion (successors,
 *                       slice release, failure), the stealing rules
 *   pipeline_ops.c      the CPU operators of one task (run_task) and the
 *                       NPU job of a matmul
 *   pipeline_exec.c     executors: the NPU device's source and completion,
 *                       CPU workers (with stealing), the prefault thread
 *   pipeline_embed.c    the prompt's embedding rows ahead of the stream, the
 *                       untied embedding after the first token
 *   pipeline_trace.c    statistics and the Chrome trace
 *   pipeline.c          the driver: infer_pipeline_prefill
 *
 * Where the single file's functions called in a circle, the loop is cut: the
 * weights' preparation, which graph building needs, lives below the graph;
 * completion releases a finished slice through the loader itself, not
 * through the driver; executors call the queue and the stealing rules,
 * which never call back.
 *
 * Threads: the driver (feeding slices), the NPU device thread (pl_npu_next,
 * pl_npu_done), CPU workers (pl_cpu_worker) and the prefault thread share one
 * struct pl under p->lock. Functions marked "lock held" expect it held. */
#ifndef SLUICE_PIPELINE_H
#define SLUICE_PIPELINE_H

#include <limits.h>
#include <pthread.h>

#include "infer_internal.h"
#include "loader.h"
#include "npu.h"

/* Operators of one (chunk, layer), in topological order (Appendix B: the
 * int8 matmuls on the NPU, everything else on the CPU). */
enum pl_op {
    PL_VERIFY = 0,  /* CPU: a slice's checksum, then its norms decoded */
    PL_UNPACK,      /* CPU: one tensor unpacked into the NPU's weight layout */
    PL_NORM,        /* CPU: (x += down of the previous layer), RMSNorm, quantize for Q/K/V */
    PL_MM,          /* NPU (CPU for float weights): a column range of one linear */
    PL_ATTN,        /* CPU: RoPE, store K/V, causal attention, quantize for O */
    PL_FFN_NORM,    /* CPU: x += o, RMSNorm, quantize for gate/up */
    PL_SWIGLU,      /* CPU: silu(gate) * up, quantize for down */
    PL_HEAD,        /* CPU: x += down, final RMSNorm of the last row, quantize */
    PL_SHADOW,      /* CPU: a linear's term (shadow outliers) on a piece of its
                       output channels, added to that matmul piece's output
                       after it and before its consumers */
    PL_OP_COUNT
};

enum { PL_DEV_NPU = 0, PL_DEV_CPU = 1 };
#define PL_MAX_CPU_WORKERS INFER_PIPELINE_MAX_CPU_WORKERS
#define PL_PREFAULT_TID 99 /* the prefault thread's track in traces */
#define PL_HASH_TID 101    /* mapped slices: read -> arrived (the driver's last hash) */
#define PL_SETUP_TID 98    /* the driver's setup before the stream: open, embedding rows */
#define PL_FILL_ROWS 64     /* rows unpacked at once before packing for the NPU */
#define PL_MAX_SLICES 4096  /* slices (and layers) a container may have here */
#define PL_INT8_BUDGET_MB 48 /* packed residency: int8 weight storage in use at once, */
#define PL_INT8_BUDGET_LINEARS 4 /* or this many of the largest linear where more */
#define PL_ACT_SETS 2       /* activation sets: (layer, chunk)s computing at once */
#define PL_ATTN_PIECE_FLOP 24e6 /* attention pieces by query rows: work of one (default) */
#define PL_ATTN_MAX_PIECES 64   /* ... and at most this many per kv head group and chunk */

/* The last layer computes only what the first token needs (pl_graph_build,
 * p->trim_last): every chunk's keys and values for the cache, but queries,
 * attention output, O and the FFN of the prompt's last row only. */
enum pl_trim {
    PL_TRIM_NONE = 0,
    PL_TRIM_KV,   /* a chunk before the last: norm without Q's input, attention
                     only ropes and stores its keys and values */
    PL_TRIM_LAST, /* the last chunk: Q, attention's queries, O, FFN of its
                     last row only (norm and K/V: every row) */
};

/* How the last layer is trimmed (p->trim_last; trim_allowed in
 * pipeline_graph.c). PL_TRIMS_ROWS: dense attention computes each query row
 * alone, so the chunks before the last only store keys and values
 * (PL_TRIM_KV) and the last computes its last row (PL_TRIM_LAST).
 * Attention whose calls depend on each other (INFER_ATTN_TRIM_CALLS; sparse
 * with min_keys 0: each head's Q scale, hence its bucket, is taken over the
 * call's rows, and without a profile the bucket grid's centre over its
 * first sparse call's, the first chunk's) keeps the calls a row's output
 * and later calls depend on:
 * PL_TRIMS_CALLS runs Q and attention over every row of the first and the
 * last chunk (the first then skips O and the FFN), the chunks between only
 * store keys and values, and the last chunk's O and FFN compute its last
 * row. */
enum pl_trim_mode {
    PL_TRIMS_OFF = 0,
    PL_TRIMS_ROWS,
    PL_TRIMS_CALLS,
};

struct task {
    uint8_t op, dev;
    uint8_t role;           /* PL_MM, PL_UNPACK, PL_SHADOW: enum format_role */
    uint8_t trim;           /* enum pl_trim */
    int16_t layer;          /* -1: head */
    uint32_t chunk;
    uint32_t r0, r1;        /* PL_MM: output channels; PL_UNPACK: rows (0, 0: all) */
    uint32_t q0, q1;        /* PL_ATTN: the chunk's query rows [q0, q1) (0, 0: all; the
                               piece with q0 == 0 ropes and stores the keys and values) */
    uint32_t slice;         /* PL_VERIFY, PL_UNPACK */
    int32_t tensor;         /* PL_UNPACK */
    int32_t deps;           /* unfinished predecessors */
    uint32_t succ_off, n_succ;
    uint64_t key;           /* priority: smaller first */
    uint32_t ready_seq;     /* FIFO order for layer_overlap */
    double est;             /* estimated seconds (llmnpu, stealing ahead) */
    int executor;           /* 0: NPU device, 1..: CPU worker; -1: not run */
    uint64_t t_ready, t0, t1; /* ready (all inputs there), started, finished */
    uint64_t cpu_ns;          /* the executing thread's CPU time in it (traced runs only) */
    struct npu_job job;
};

/* Activations of one chunk (rows n at positions pos0..). Only x (the
 * residual stream), the head's row and, where the down projection has a
 * linear term, d (added with the term by the next layer's norm) are the
 * chunk's own; the others (and d without a term) point into the
 * activation set (pipeline_acts.c) of the (layer, chunk) running, set by its
 * PL_NORM (pl_acts_bind). */
struct chunkbuf {
    uint32_t n, pos0;
    float *x, *d;
    float *xb, *xf;             /* normed input of Q/K/V; of gate/up */
    float *q, *k, *v, *att, *o, *g, *u;
    float *xh;                  /* the head's normed last row (D) */
    int8_t *xq[FORMAT_ROLE_COUNT]; /* quantized input of each linear (the classifier's: own) */
    float act[FORMAT_ROLE_COUNT];  /* its activation scale */
    /* the clipped elements of a linear's input (PL_SHADOW), found by the
     * first of its pieces to run, read by the others */
    struct pl_clips {
        pthread_mutex_t mu;
        int layer; /* of the list; INT_MIN: none yet */
        int ret;   /* infer_find_clipped_q's */
        struct infer_clipbuf buf;
        struct infer_clipped clip;
    } clips[FORMAT_ROLE_COUNT];
    int clips_init; /* the mutexes are initialized */
};

/* A ready queue: task indices in no order (the policy picks by scanning).
 * Sized before the run to the task capacity, so a push never allocates. */
struct queue {
    uint32_t *items;
    uint32_t n, cap;
};

/* full: the NPU's weight storage (prepared in pl_graph_build) faulted in
 * ahead by the prefault thread while a CPU worker has nothing else to do,
 * 2 MiB at a time in layer order, skipping layers whose unpacking has begun;
 * before it the activation memory and the pool's first storages
 * (pipeline_prefault.c: w NULL, the step is addr + off) */
struct prefault {
    struct npu_weights *w;
    uint8_t *addr; /* w NULL: a region (pl_prefault_region) */
    size_t off, len;
    int layer;     /* PL_PF_ACTS: activation memory, never skipped */
    uint64_t t0, t1;    /* the step's span on the prefault track; t1 0: not run */
};

/* The prompt's embedding rows between pl_embed_rows_ask and _read
 * (pipeline_embed.c). */
struct pl_embed_rows {
    uint32_t n, nreq;
    int q8, packed;
    uint8_t *prefix, *data;
    uint64_t *row_off, *offs, *lens;
    void **bufs;
    int8_t *q;
    struct format_packed_layout lay; /* points into prefix */
};

struct pl {
    const struct infer_pipeline_opts *o;
    struct infer_model *m;
    struct infer_state *st;
    uint32_t *positions; /* [n] the prompt's positions (0, 1, ...) */
    struct infer_rope_table rope; /* their rotations, computed once (attention pieces) */
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
    uint64_t ra_end;        /* mapped slices: read-ahead advised up to here (pipeline_map.c) */
    uint8_t *slice_ok;      /* mapped slices: 1 where the driver verified it (VERIFY skips the hash) */

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

    pthread_t workers[PL_MAX_CPU_WORKERS];
    uint32_t n_workers;
    float *att_scratch[PL_MAX_CPU_WORKERS + 1];
    int8_t *fill_scratch[PL_MAX_CPU_WORKERS + 1]; /* pl_weights_fill's, per CPU worker */
    uint32_t fill_cols;                           /* ... for rows of up to this many */
    /* stolen NPU jobs' staging, per CPU worker, and the stage_key it holds;
     * a (layer, chunk, role)'s key is stage_key0 + its index (pl_prepare_job) */
    uint8_t *steal_stage[PL_MAX_CPU_WORKERS + 1];
    uint64_t steal_held[PL_MAX_CPU_WORKERS + 1];
    uint64_t stage_key0;

    /* per (layer + 1, role): int8 weights? and their static activation scale,
     * from the index, so operators need not wait for the unpacking */
    struct {
        int int8;
        float act;
        int term; /* the model's linear term wants it: PL_SHADOW tasks per chunk */
        int packed_mm; /* packed residency, one-row matmuls (the classifier, the trimmed
                          last layer's Q, O and FFN): straight from the packed codes on
                          the CPU workers, never unpacked (pl_graph_build) */
    } (*lin_info)[FORMAT_ROLE_COUNT];

    uint64_t t_start, t_logits, t_loaded;
    /* the setup before the first weight read (traces): the model opened (its
     * reader's hold taken or the container opened), the prompt's embedding
     * rows asked for, the stream opened (its first reads issued), the graph
     * and the executors' memory set up and the rows read */
    uint64_t t_opened, t_asked, t_streaming, t_embedded;
    struct pl_embed_rows embed_rows; /* between pl_embed_rows_ask and _read */
    uint64_t busy[PL_MAX_CPU_WORKERS + 1]; /* per executor */
    uint32_t running;       /* tasks executing now */
    uint64_t stall_t0;      /* nothing running or ready since then (0: not stalled) */
    uint64_t stall_ns;      /* total of such stalls: every unit waiting on the disk */
    uint64_t unpack_ns;
    struct prefault *pf;
    uint32_t n_pf, cap_pf, next_pf;
    int unpack_layer;       /* highest layer whose unpacking began (-1: none) */
    uint64_t prefault_ns;
    uint32_t stolen;
    /* the NPU's running task (UINT32_MAX: none) and its pace: actual seconds
     * per estimated second of the matmuls it finished (the steal-ahead rule) */
    uint32_t npu_running;
    double npu_actual_s, npu_est_s;
    uint64_t npu_idle_t0;   /* when the NPU last finished a task (0: none yet) */
    uint32_t npu_late;      /* NPU tasks taken by CPU workers under the late rule */
    uint32_t splits;        /* NPU matmuls cut by split stealing */
    uint32_t tails;         /* NPU matmuls cut at dispatch to keep a stealable tail */
    uint64_t bytes_read;
    uint64_t load_events[PL_MAX_SLICES]; /* arrival time of each slice */
    uint64_t read_events[PL_MAX_SLICES]; /* mapped slices: all of its pages in (its
                                          * last piece's hash and the checks follow) */

    /* packed residency: a layer's int8 copies are freed once its last
     * matmul is done (its packed bytes serve decoding), by a reclaim thread
     * at idle priority, so that the int8 weights of all layers never exist
     * at once */
    uint32_t *mm_left;      /* [n_layers + 1] unfinished matmuls (layer + 1; 0: head) */
    struct npu_weights **drop; /* taken off their linears, to be freed */
    uint32_t n_drop, cap_drop;
    /* no_decode with mapped slices: layers (+ 1) whose last matmul is done,
     * for the reclaim thread to drop their slices' page table entries
     * (pl_map_release): tearing down 5 GB of them at exit took 64-72 ms
     * after the first token on the llama3-8b shape */
    uint32_t *rel_layer;
    uint32_t n_rel;
    int drop_end;           /* the reclaim thread ends when the queue is empty */
    int drop_started;
    pthread_t drop_thread;
    pthread_cond_t drop_cv;

    /* packed residency, split matmuls: the layers' int8 copies from a bounded
     * pool (pipeline_pool.c), admitted in execution order */
    struct pl_acq *acq;     /* linears to admit, in execution order */
    uint32_t n_acq, cap_acq, acq_next;
    int32_t *lin_acq;       /* [(layer + 1) * FORMAT_ROLE_COUNT + role]: index in acq, or -1 */
    uint32_t *lin_mm;       /* same index: the linear's unfinished matmuls */
    size_t int8_used, int8_budget, int8_alloc, int8_peak;
    uint64_t int8_fresh, int8_reused; /* bytes of linears given fresh / recycled storage */
    struct npu_weights **pool; /* free storage */
    uint32_t n_pool, cap_pool;
    struct npu_weights *unmap; /* storage no longer needed, freed by whoever
                                * completed its matmul once it has unlocked */
    uint32_t *parked;       /* unpacking tasks whose linear is not admitted yet */
    uint32_t n_parked;
    int trim_last;          /* how the last layer is trimmed (enum pl_trim_mode) */

    /* the chunks' activations (pipeline_acts.c): x of every row (d too where
     * a down projection has a linear term), and n_sets sets of scratch, each
     * held by one (layer, chunk) from its norm to its last task, admitted in
     * the order (layer, chunk) */
    float *act_x;           /* [n][D], mapped */
    size_t act_x_len;
    uint8_t *set_mem;       /* n_sets x set_bytes, mapped */
    size_t set_bytes, set_len;
    size_t set_u, set_a, set_dq, set_b; /* offsets in a set (G at 0) */
    uint32_t n_sets, n_free;
    uint32_t *set_free;
    int32_t *cl_set;        /* [layer * n_chunks + chunk]: its set, or -1 */
    uint32_t *cl_left;      /* its unfinished tasks that use the set */
    uint32_t *cl_norm;      /* its PL_NORM task */
    uint8_t *cl_parked;     /* that task is ready and waits for a set */
    uint32_t cl_next, n_cl; /* the next (layer, chunk) to admit; how many */
};

struct pl_acq {
    int layer;
    uint8_t role;
    uint32_t rows, cols;
    size_t bytes;           /* its storage's bytes (weight_bytes) */
    size_t cost;            /* the bytes of the storage it got, counted in int8_used */
};

/* Policies that split matmuls into pieces, steal, and rank by position. */
static inline int pl_granular(enum infer_policy p)
{
    return p == INFER_POLICY_FULL || p == INFER_POLICY_SEQUENTIAL_GRANULAR;
}

/* Policies that compute nothing until every slice is in. */
static inline int pl_load_first(enum infer_policy p)
{
    return p == INFER_POLICY_SEQUENTIAL || p == INFER_POLICY_SEQUENTIAL_GRANULAR;
}

/* ---- pipeline_weights.c: weight preparation ------------------------------------------
 * Any thread; each call touches only the linear it is given. All return 0 or
 * a negative errno with err filled; a linear left half-made is released by
 * infer_linear_fini (the model's destroy). */

/* Keeps a quantized linear's packed bytes (lin->packed, lin->upk) for
 * decoding from packed weights: data itself with borrow (it stays: the
 * model's slices), else a copy; q8 and float tensors: nothing. Touches no
 * other field of lin. */
int pl_weights_keep_bytes(struct infer_linear *lin, const struct format_tensor_info *t,
                          const uint8_t *data, int borrow, struct sl_err *err);
/* Sets up a quantized linear before its rows are unpacked: the NPU's weight
 * storage (want_npu) and/or plain int8 rows with their scales (keep_rows). */
int pl_weights_prepare(struct infer_linear *lin, const struct format_tensor_info *t,
                       int force_dynamic, int keep_rows, int want_npu, struct sl_err *err);

/* Unpacks rows [r0, r1) of a prepared quantized linear from its tensor's
 * bytes. r0 is a multiple of 16 (the NPU's channel blocks), as is r1 unless
 * it is the last row. scratch: PL_FILL_ROWS x cols bytes, or NULL (then
 * allocated per call). */
int pl_weights_fill(struct infer_linear *lin, const struct format_tensor_info *t,
                    const uint8_t *data, uint32_t r0, uint32_t r1, int8_t *scratch,
                    struct sl_err *err);

/* Prepares and fills a whole tensor from its slice bytes (a float one is
 * decoded). */
int pl_weights_unpack(struct infer_linear *lin, const struct format_tensor_info *t,
                      const uint8_t *data, int force_dynamic, int keep_rows, int want_npu,
                      int8_t *scratch, struct sl_err *err);

/* The untied embedding, kept packed (rows unpacked per lookup; data itself
 * with borrow, as pl_weights_keep_bytes) or, INT8, as rows; no NPU copy. */
int pl_weights_keep_packed(struct infer_linear *lin, const struct format_tensor_info *t,
                           const uint8_t *data, int borrow, struct sl_err *err);

/* A norm vector decoded into a new array at *out (the caller frees it, also
 * on failure when *out is set). */
int pl_weights_decode_norm(const struct format_tensor_info *t, const uint8_t *data, float **out);

/* ---- pipeline_cost.c: the cost model ---------------------------------------------------- */

/* Sets every task's key (priority: smaller first) and est (seconds), from
 * its operator, layer, chunk and channels. */
void pl_cost_assign(struct pl *p);

/* ---- pipeline_graph.c: the task graph --------------------------------------------------- */

/* Cuts the prefill attention of a chunk of n query rows (the first at
 * position pos0; per_key flops for each key a row attends) into pieces:
 * starts[0..return) the first row of each, starts[return] == n. Cuts fall on
 * multiples of INFER_ATT_ROWS; want > 0: pieces of at most about `want`
 * rows, made equal; want 0: about PL_ATTN_PIECE_FLOP of work each. At most
 * PL_ATTN_MAX_PIECES; one piece ({0, n}) for n <= INFER_ATT_ROWS or want >= n. */
uint32_t pl_attn_split(uint32_t n, uint32_t pos0, double per_key, uint32_t want,
                       uint32_t starts[PL_ATTN_MAX_PIECES + 1]);
/* Keys attended by query rows [0, r) of a chunk whose first row sits at
 * pos0 (causal: row i sees pos0 + i + 1 keys). */
double pl_attn_rows_work(double pos0, double r);

/* Builds the whole prefill graph (tasks, CSR successors, priorities,
 * estimates) and prepares the storage of split weights (into p->m). Needs
 * p->o, m, c, r, cb, n_chunks, lin_info, verify_task, slice_needed,
 * slice_left. Returns 0, -ENOMEM, or -EINVAL for a container the pipeline
 * cannot order (p->err filled where a weight could not be prepared). */
int pl_graph_build(struct pl *p);

/* Makes room for `extra` more tasks (split stealing's, cut while running:
 * the array must not move then). 0 or -ENOMEM. */
int pl_graph_reserve(struct pl *p, uint32_t extra);

/* The linear of (layer, role); layer -1: the classifier. */
struct infer_linear *pl_graph_linear(const struct pl *p, int layer, uint32_t role);

/* Cuts matmul `ti` (lock held): its last `tail_rows` output channels become
 * a new task with the same predecessors (all done) and successors (each now
 * waits for one more task). Returns the new task's index, or UINT32_MAX
 * where the reserve of task slots is spent. */
uint32_t pl_graph_cut(struct pl *p, uint32_t ti, uint32_t tail_rows);

const char *pl_op_name(uint32_t op);

/* ---- pipeline_pool.c: packed residency's bounded int8 memory ---------------------------- */

/* A linear whose int8 storage comes from the pool (graph building). */
int pl_pool_add(struct pl *p, int layer, uint32_t role, uint32_t rows, uint32_t cols);
/* After the graph and its reserve: execution order, matmul counts; no
 * admission yet (budget 0: max(PL_INT8_BUDGET_MB MiB, PL_INT8_BUDGET_LINEARS
 * x the largest linear)). 0 or -ENOMEM. */
int pl_pool_init(struct pl *p, size_t budget);
/* Lock held: 1 if task t unpacks a linear not admitted yet (it must wait). */
int pl_pool_waits(const struct pl *p, const struct task *t);
/* Lock held: admits linears in order while the budget allows. 0 or -ENOMEM. */
int pl_pool_admit(struct pl *p);
/* Lock held: matmul t finished; 1 if its linear's storage went back to the
 * pool (call pl_pool_admit). */
int pl_pool_mm_done(struct pl *p, const struct task *t);
/* Lock held: the storage a completion left to free (NULL if none); the
 * caller frees it with npu_weights_destroy after unlocking, so that
 * unmapping it does not hold the other units at the lock. */
struct npu_weights *pl_pool_take_unmap(struct pl *p);
/* Frees the pool (every linear's storage must be back, or owned by its
 * linear). */
void pl_pool_fini(struct pl *p);

/* ---- pipeline_acts.c: the chunks' activation memory ------------------------------------- */

/* The chunks and x of n rows (chunk pointers into it): before the graph.
 * 0 or -ENOMEM. */
int pl_acts_rows(struct pl *p, uint32_t n);
/* After the graph, its reserve and the pool: the sets (sets: how many at
 * most, 0: PL_ACT_SETS; one per chunk, whatever sets says, where the pool
 * could not hold a layer: see the file), the first admitted. 0 or -ENOMEM. */
int pl_acts_init(struct pl *p, uint32_t sets);
/* Lock held: 1 if task t is the norm of a (layer, chunk) without a set yet
 * (it is parked: pl_acts_unpark hands it back). */
int pl_acts_waits(struct pl *p, uint32_t ti);
/* Lock held: task t finished; 1 if its set went back (call pl_acts_unpark). */
int pl_acts_done(struct pl *p, const struct task *t);
/* Lock held: admits in order while sets are free; returns a parked norm
 * now admitted (call again until UINT32_MAX). */
uint32_t pl_acts_unpark(struct pl *p);
/* The running norm of (layer, chunk): points the chunk's buffers into its set. */
void pl_acts_bind(struct pl *p, uint32_t chunk, int layer);
/* Frees everything (idempotent). */
void pl_acts_fini(struct pl *p);

/* ---- pipeline_queue.c: ready queues, completion, stealing (lock held) ------------------ */

/* Sizes both queues to the task capacity (after pl_graph_reserve), so that
 * no push allocates while the graph runs. 0 or -ENOMEM. */
int pl_queue_init(struct pl *p);
void pl_queue_fini(struct pl *p);

/* Takes the task to run next from q (not empty) under the policy. */
uint32_t pl_queue_pop(const struct pl *p, struct queue *q);

/* A CPU worker's next task from p->cpu_q (not empty): while the NPU has
 * nothing queued and attention is next by key (granular policies), the
 * best-keyed task whose completion makes NPU work ready first; otherwise
 * pl_queue_pop's. */
uint32_t pl_queue_pop_cpu(struct pl *p);

/* Task ti lost its last dependency: into its device's queue, executors
 * woken. 0, or a negative errno after pl_fail (the run is stopping, every
 * thread woken: the caller need do nothing more). */
int pl_make_ready(struct pl *p, uint32_t ti);

/* Task ti finished: its successors, its slice's release, the run's end.
 * 0, or a negative errno after pl_fail, as pl_make_ready. */
int pl_complete(struct pl *p, uint32_t ti);

/* Stops the run with error e (the first error wins) and wakes every thread. */
void pl_fail(struct pl *p, int e, const char *msg);

/* Keeps the stall clock (see p->stall_t0). */
void pl_stall_update(struct pl *p);

/* The stealing rules (EdgeFlow 4.3 and ours), as pure functions of the
 * queue state and the time now_ns (injected: tests drive them on a
 * synthetic queue): what an idle CPU worker does about the NPU's queue. */
enum pl_steal_how {
    PL_STEAL_NONE = 0,
    PL_STEAL_WHOLE, /* take the task at npu_q.items[at] */
    PL_STEAL_CUT,   /* cut its last `rows` channels into a new task, take that */
};
struct pl_steal {
    enum pl_steal_how how;
    uint32_t at;   /* index in p->npu_q */
    uint32_t rows; /* PL_STEAL_CUT */
};
struct pl_steal pl_steal_decide(const struct pl *p, uint64_t now_ns);

/* The late rule: the emulated NPU is a thread, and on cores shared with
 * other processes it can wait for a core while the CPU workers idle (in
 * traces of loaded machines, 1-52 ms with a 32-channel piece queued, which
 * no other rule lets a worker take). When nothing runs on the NPU, the time
 * (sl_now_ns's clock) from which the CPU takes its best queued task whole:
 * PL_NPU_LATE_NS after that task turned ready and after the NPU last
 * finished; 0 where the rule does not apply (the NPU running or its queue
 * empty, no steal-ahead). */
#define PL_NPU_LATE_NS 1000000ull
uint64_t pl_npu_late_at(const struct pl *p);

/* The steal-ahead estimate: the NPU's work ahead of its queued task at
 * queue index `last` (the rest of its running task at now_ns plus every
 * other queued one) in *ahead, that task's own time in *own, both the
 * tasks' estimates scaled by the NPU's pace so far (actual seconds per
 * estimated second of the matmuls it finished). */
void pl_npu_ahead(const struct pl *p, uint32_t last, uint64_t now_ns, double *ahead,
                  double *own);

/* Applies pl_steal_decide (a cut through pl_graph_cut): the index of the
 * task the worker takes, or UINT32_MAX. */
uint32_t pl_steal(struct pl *p, uint64_t now_ns);

/* The tail rule: the channels of matmul ti (the NPU dispatching it, already
 * out of the queue) to leave queued as a stealable tail, or 0. Pure. */
uint32_t pl_tail_rows(const struct pl *p, uint32_t ti);

/* Applies pl_tail_rows. 0, or a negative errno after pl_fail. */
int pl_keep_tail(struct pl *p, uint32_t ti);

/* ---- pipeline_ops.c: what a task computes --------------------------------------------- */

/* Runs task ti on worker w (0: the NPU device thread; CPU workers 1..), lock
 * not held. 0, or a negative errno after pl_fail. */
int pl_run_task(struct pl *p, uint32_t ti, int w, float *att_scratch);

/* 1 when matmul t's output channels go to the chunk's residual stream x
 * as soon as they are computed (an o or down projection without a linear
 * term: x += o, x += d, the forward's elementwise sums): an NPU job adds
 * them in its output write (npu_job.add), other paths after it. */
int pl_mm_adds_residual(const struct pl *p, const struct task *t);
/* After matmul t computed its channels (lock not held): where
 * pl_mm_adds_residual and the job did not add them itself (fused 0), adds
 * them to the chunk's residual stream. */
void pl_mm_residual(struct pl *p, const struct task *t, int fused);

/* Fills an NPU task's job (lock held, when it is dispatched or stolen). */
void pl_prepare_job(struct pl *p, struct task *t);

/* ---- pipeline_exec.c: executors -------------------------------------------------------- */

/* The NPU device thread's source and completion (npu_device_start). */
struct npu_job *pl_npu_next(void *ctx);
void pl_npu_done(void *ctx, struct npu_job *j);

struct pl_worker_arg {
    struct pl *p;
    int id; /* 1.. */
};
void *pl_cpu_worker(void *arg);      /* arg: struct pl_worker_arg */
void *pl_prefault_worker(void *arg); /* arg: struct pl */
/* pipeline_prefault.c: the activation memory and the pool's storages admitted
 * at setup put first in the prefault thread's list (full, no_prefault 0);
 * 0 or -ENOMEM. A step of a region: its whole pages faulted in writable, 0 or
 * -errno (nothing changes in its contents either way). */
#define PL_PF_ACTS INT_MAX
int pl_prefault_early(struct pl *p);
int pl_prefault_region(uint8_t *addr, size_t len);
void *pl_reclaim_worker(void *arg);  /* arg: struct pl; packed residency */

/* ---- pipeline_embed.c: the embedding ------------------------------------------------------ */

int pl_pread_full(int fd, void *buf, uint64_t len, uint64_t off);

/* x[n][D] = the embedding rows of the prompt, read with a few small reads,
 * in two steps around the stream's start: ask reads the table's prefix and
 * asks for the rows' pages (their reads queued ahead of the stream's on the
 * disk, not waited for); read waits for them and decodes x. free: what ask
 * kept (after read, or after a failure in between; zeroed state ok). */
int pl_embed_rows_ask(struct pl *p, struct pl_embed_rows *e, struct sl_err *err);
int pl_embed_rows_read(struct pl *p, struct pl_embed_rows *e, float *x, struct sl_err *err);
void pl_embed_rows_free(struct pl_embed_rows *e);

/* The untied embedding (for decoding): read, verified, unpacked to rows. */
int pl_embed_finish(struct pl *p, struct sl_err *err);

/* pipeline.c: slice s is in (lock held); 0, or -errno after pl_fail */
int pl_arrived(struct pl *p, uint32_t s);
/* pipeline_map.c: packed residency's slices mapped from the page cache.
 * pl_map_open maps the container into p->m->slices (0, or -errno: read them
 * with O_DIRECT instead); pl_map_feed (the driver) reads ahead, populates the
 * needed slices in file order and marks each arrived; pl_map_populate reads
 * and maps one slice (-EIO where a page cannot be read). */
int pl_map_open(struct pl *p);
int pl_map_feed(struct pl *p, struct sl_err *err);
int pl_map_populate(struct pl *p, uint32_t s, struct sl_err *err);
void pl_map_release(struct pl *p, int layer);

/* ---- pipeline_trace.c: statistics and trace ------------------------------------------------ */

void pl_stats_fill(struct pl *p, struct infer_pipeline_stats *st);
/* The calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID), ns; 0 where
 * unavailable. Read around a task only when the run writes a trace. */
uint64_t pl_thread_cpu_ns(void);
int pl_trace_write(struct pl *p, const char *path, const struct infer_pipeline_stats *st);

#endif

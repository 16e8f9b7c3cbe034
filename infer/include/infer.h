/*
 * infer.h: the model runtime (Llama family), tokenizer and sampler.
 *
 *   struct infer_model *m;
 *   infer_model_load("m.sluice", NULL, &m, &err);          // every layer resident
 *   struct infer_state *s;
 *   infer_state_create(m, 256, &s, &err);                   // KV cache, 256-row batches
 *   struct infer_tokenizer *tk;
 *   infer_tokenizer_create(format_reader_tokenizer(infer_model_reader(m)),
 *                          infer_model_config(m), &tk, &err);
 *   int ids[512]; uint32_t n;
 *   infer_tokenizer_encode(tk, "Hello", 1, ids, 512, &n);   // BOS + prompt
 *   float *logits = malloc(vocab * sizeof(float));
 *   infer_forward(m, s, ids, n, 0, logits, INFER_LOGITS_LAST, &err);   // prefill
 *   int next = infer_sampler_sample(sampler, logits);
 *   infer_forward(m, s, &next, 1, n, logits, INFER_LOGITS_LAST, &err); // decode
 *
 * The forward pass reads like llama2.c's run.c, batched over rows; its CPU
 * operators (RMSNorm, RoPE, attention over the KV cache, SwiGLU, residual
 * add, float matmul, int8 linear) are separate functions in
 * infer_internal.h for the pipeline scheduler inside this module. Logits do
 * not depend on how a sequence is split into forward calls or batches (bit
 * for bit, float and static-scale int8 weights).
 *
 * Weights: float tensors (F32/F16/BF16) run in float; quantized linear
 * weights (q8 and the packed encodings) are unpacked to int8 with per-row
 * scales and run as int8 x int8 -> int32 matmuls with per-tensor activation
 * quantization (the emulated NPU's math, npu.h).
 *
 * Threads: a loaded model is read-only and may be shared by forward passes
 * on several threads (each with its own state); loading or releasing layers
 * and setting the observer are not synchronized with them. A state belongs
 * to one sequence and one thread at a time. The observer is called on the
 * thread running the forward pass.
 */
#ifndef SLUICE_INFER_H
#define SLUICE_INFER_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "format.h"

#ifdef __cplusplus
extern "C" {
#endif

struct infer_model;
struct infer_state;
struct npu_device;

struct infer_load_opts {
    int lazy;              /* 1: load no layer now (infer_model_load_layer later) */
    int force_dynamic_act; /* 1: ignore static activation scales (dynamic per call) */
    int no_mmap;           /* 1: read tensors into private memory instead of using
                              float weights in place in a read-only mapping */
    struct format_reader *reader; /* an open reader of path (the model then holds it too,
                              format_reader_ref, and closes its hold when destroyed;
                              the caller still closes its own), or NULL: open path */
};

/* Opens and validates a container and (unless lazy) loads every tensor,
 * verifying checksums. Float weights (F32/F16/BF16) are used in place in a
 * read-only mapping of the file (F16/BF16 stay 16-bit), so they cost page
 * cache rather than private memory; quantized weights are unpacked to int8.
 * The file must not change while the model is open. */
int infer_model_load(const char *path, const struct infer_load_opts *opts, struct infer_model **out,
                     struct sl_err *err);
void infer_model_destroy(struct infer_model *m);

const struct format_config *infer_model_config(const struct infer_model *m);
const struct format_reader *infer_model_reader(const struct infer_model *m);
int infer_model_is_quantized(const struct infer_model *m); /* any int8 linear */

/* Lazy loading for layer-by-layer work (calibration of big models): load
 * layer l (0..n_layers-1), or the globals with l = -1 (embedding, final norm,
 * classifier), and release them again. */
int infer_model_load_layer(struct infer_model *m, int layer, struct sl_err *err);
void infer_model_release_layer(struct infer_model *m, int layer);

/* Calibration hook: called for every linear layer (role from enum
 * format_role, layer -1 for the classifier) with its float input rows
 * x[rows][in_cols] and float output rows y[rows][out_cols], in execution
 * order. NULL fn removes it. */
typedef void (*infer_observe_fn)(void *ctx, int layer, uint32_t role, const float *x, uint32_t rows,
                                 uint32_t in_cols, const float *y, uint32_t out_cols);
void infer_model_set_observer(struct infer_model *m, infer_observe_fn fn, void *ctx);

/* A sequence: KV cache for the model's seq_len positions and scratch for up
 * to max_batch rows per forward call. */
int infer_state_create(const struct infer_model *m, uint32_t max_batch, struct infer_state **out,
                       struct sl_err *err);
void infer_state_destroy(struct infer_state *s);

enum infer_logits_mode {
    INFER_LOGITS_NONE = 0, /* no classifier (e.g. calibration of the layers only) */
    INFER_LOGITS_LAST = 1, /* logits[vocab] for the last row only (first token) */
    INFER_LOGITS_ALL = 2,  /* logits[n][vocab] for every row (evaluation); an int8
                              classifier with dynamic activation scales runs a row at
                              a time, so each row's logits are the ones that row gets
                              alone (as with INFER_LOGITS_LAST) */
};

/* Runs tokens[0..n) at positions pos..pos+n-1 (n may exceed max_batch: it is
 * processed in batches) as a chain written at cache slots pos.. (the cache
 * is first cut to pos, or extended to it: skipped slots keep what they
 * held). pos + n must not exceed seq_len. infer_forward_batch below with
 * mode's logits rows. Returns 0 or a negative errno with a message. */
int infer_forward(struct infer_model *m, struct infer_state *s, const int *tokens, uint32_t n,
                  uint32_t pos, float *logits, enum infer_logits_mode mode, struct sl_err *err);

/* Layer-granular pieces of the same computation, for layer-by-layer
 * calibration: embed n tokens into x[n][dim]; run one layer in place on
 * x (positions pos..); final norm + classifier of x's rows. */
int infer_embed(const struct infer_model *m, const int *tokens, uint32_t n, float *x,
                struct sl_err *err);
int infer_layer_forward(struct infer_model *m, struct infer_state *s, int layer, float *x,
                        uint32_t n, uint32_t pos, struct sl_err *err);
int infer_head_forward(struct infer_model *m, struct infer_state *s, const float *x, uint32_t n,
                       float *logits, struct sl_err *err);

/* ---- the KV cache ----------------------------------------------------------------------
 *
 * Keys (after RoPE) and values of every layer for up to `capacity` slots,
 * [layer][slot][n_kv_heads * head_dim] floats, and the position of each slot.
 * A forward call appends its rows at slots len..len+n-1 (len grows by n);
 * rows of a draft tree occupy slots in the order they were given, and after
 * verification infer_kv_commit keeps the accepted ones (moved down to be
 * contiguous) or infer_kv_truncate drops them. With INFER_KV_K8 an int8
 * mirror of K is kept in step (per slot and KV head: q = rint(k / s), s =
 * max|k| / 127 of that head's row). (The sparse estimate no longer reads it:
 * it codes the float keys within +-64 itself, attn_quantize_key_q.)
 *
 * A cache belongs to one sequence and one thread at a time. */

struct infer_kv;

enum { INFER_KV_K8 = 1 };

/* capacity 0: the model's seq_len. Returns 0, -EINVAL (capacity over
 * seq_len) or -ENOMEM, with a sentence. */
int infer_kv_create(const struct format_config *c, uint32_t capacity, unsigned flags,
                    struct infer_kv **out, struct sl_err *err);
void infer_kv_destroy(struct infer_kv *kv);
uint32_t infer_kv_len(const struct infer_kv *kv);
uint32_t infer_kv_capacity(const struct infer_kv *kv);
/* The position slot s (< len) was written at. */
uint32_t infer_kv_pos(const struct infer_kv *kv, uint32_t slot);
/* Drops every slot >= n. -EINVAL when n > len. */
int infer_kv_truncate(struct infer_kv *kv, uint32_t n);
/* Keeps slots[0..n) (strictly increasing, each in [base, len)) as slots
 * base..base+n-1 of every layer, in that order, and drops the rest after
 * base: the accepted path of a verified draft tree. -EINVAL on a bad list
 * (nothing changed). */
int infer_kv_commit(struct infer_kv *kv, uint32_t base, const uint32_t *slots, uint32_t n);
/* Read access: layer l's keys or values [capacity][kv_dim] (slots < len are
 * valid), and with INFER_KV_K8 the int8 keys [capacity][kv_dim] and their
 * scales [capacity][n_kv_heads]; NULL without the mirror. */
const float *infer_kv_keys(const struct infer_kv *kv, uint32_t layer);
const float *infer_kv_values(const struct infer_kv *kv, uint32_t layer);
const int8_t *infer_kv_keys_i8(const struct infer_kv *kv, uint32_t layer);
const float *infer_kv_keys_i8_scale(const struct infer_kv *kv, uint32_t layer);
/* Appends n slots (positions len, len + 1, ...) holding keys and values k, v
 * [n][kv_dim] in every layer (and their int8 mirror): attention benchmarks
 * and tests. -ENOSPC when they do not fit. */
int infer_kv_append(struct infer_kv *kv, const float *k, const float *v, uint32_t n);

/* The KV cache of a state (every state owns one, of capacity seq_len). */
struct infer_kv *infer_state_kv(struct infer_state *s);

/* ---- the batched forward ---------------------------------------------------------------
 *
 * One forward pass serves every shape: decode is one row, prefill a chunk,
 * draft verification a tree. Row i gets KV slot len + i (len before the
 * call); it attends to every slot below len and, among this call's rows, to
 * itself and its ancestors: with parent NULL the rows are a chain (row i's
 * parent is i - 1: causal), else parent[i] < i is the row it follows (-1:
 * it follows the cache directly). Positions: pos NULL gives the chain len,
 * len + 1, ...; else pos[i] (RoPE uses it; a tree row's position is
 * usually its parent's + 1).
 *
 * Logits: for the n_logits rows listed in logits_rows (ascending), into
 * logits[n_logits][vocab]. A chain may be longer than max_batch (processed
 * in batches, slots and positions continuing); a tree must fit one batch.
 * On an error the cache is truncated back to where it was. */
struct infer_batch {
    uint32_t n;
    const int *tokens;          /* [n] */
    const uint32_t *pos;        /* [n] or NULL */
    const int32_t *parent;      /* [n] or NULL */
    const uint32_t *logits_rows; /* [n_logits] or NULL */
    uint32_t n_logits;
};

int infer_forward_batch(struct infer_model *m, struct infer_state *s, const struct infer_batch *b,
                        float *logits, struct sl_err *err);

/* ---- several sequences in one step (continuous batching; infer_multi.c) -----------------
 *
 * One forward pass over the rows of several sequences of one model, each with
 * its own state: sequence i appends tokens[0..n) as a chain after its own KV
 * cache (a decode step is one row, a prompt chunk several), at its own
 * positions. Embedding, norms, residuals and the linear layers run once over
 * all the rows (one float GEMM, or one int8 GEMM on the step's NPU device and
 * the calling thread); RoPE, the cache write and attention run per sequence
 * over its own cache with its state's attention. Each sequence's cache and
 * logits (of its last row) are bit-identical to infer_forward_batch of its
 * rows alone (for an int8 linear with a dynamic activation scale, each
 * sequence's rows are their own call, as the scale is one per call). The
 * step object holds the scratch for max_rows rows in all and the NPU device;
 * the states must belong to sequences of the step's model, one entry each.
 * On an error no cache keeps any row of the call. Used by one thread at a
 * time. */
struct infer_multi;
struct infer_multi_opts {
    uint32_t max_rows;        /* rows of one step, all sequences together (0: 256) */
    int no_npu;               /* 1: int8 matmuls on the calling thread only */
    double npu_share;         /* the device's share of a small int8 batch (0: 0.5) */
    uint64_t npu_min_weights; /* smaller int8 matmuls stay on the calling thread (0: 1 Mi);
                               * dense attention splits its heads with the device
                               * thread from 256 Ki query-key products (or this) */
};
int infer_multi_create(struct infer_model *m, const struct infer_multi_opts *o,
                       struct infer_multi **out, struct sl_err *err);
void infer_multi_destroy(struct infer_multi *mb);
uint32_t infer_multi_max_rows(const struct infer_multi *mb);
/* parts of matmuls and attention the device thread ran */
uint64_t infer_multi_npu_jobs(const struct infer_multi *mb);
/* parts handed to the device thread: those it ran, and those the calling
 * thread took back before it started them (float and attention parts on a
 * busy machine; int8 parts are always waited for) */
uint64_t infer_multi_dev_calls(const struct infer_multi *mb);
struct infer_model *infer_multi_model(const struct infer_multi *mb);
struct infer_seq {
    struct infer_state *s; /* its KV cache (the rows go after its len) and attention */
    const int *tokens;     /* [n], n >= 1 */
    uint32_t n;
    float *logits;         /* [vocab] of the last row, or NULL */
};
/* 0, or -EINVAL (no rows, a state twice, past a context, more than max_rows
 * rows: nothing run), or the forward pass's errors. */
int infer_forward_multi(struct infer_multi *mb, const struct infer_seq *seqs, uint32_t k,
                        struct sl_err *err);

/* ---- attention behind one interface -------------------------------------------------
 *
 * The forward pass calls one attention implementation per state (dense by
 * default). A call covers query rows q [n][n_heads * head_dim] (RoPE
 * applied) of one layer and heads [h0, h1), writes those heads' columns of
 * out [n][n_heads * head_dim], and reads the cache, whose slots
 * [0, rows->base + n) are written. `rows` says what each row sees
 * (infer_batch's rules) and may carry a key selection. scratch holds
 * INFER_ATT_ROWS * (rows->base + n) floats. Returns 0 or a negative errno. */
struct infer_attn_rows {
    uint32_t n;
    uint32_t base;         /* slots every row sees: [0, base) */
    const int32_t *parent; /* NULL: a chain; else the tree of infer_batch */
    /* Optional key selection (sparse attention): for query row i and head h,
     * only the slots sel[(i * n_heads + h) * sel_stride ..] (n_sel[i * n_heads
     * + h] of them, ascending, each visible to the row) are attended. NULL:
     * every visible slot. */
    const uint32_t *sel;
    const uint32_t *n_sel;
    uint32_t sel_stride;
    /* Optional scratch for a tree's rows (parent set, no selection) shared by
     * the threads that run disjoint kv heads of one call: the dense attention's
     * scores, gathered values and queries and transposed keys, tree_floats
     * floats (infer_attn_tree_floats; the forward pass sizes
     * it; NULL or too few: the attention allocates its own per call). */
    float *tree_scratch;
    size_t tree_floats;
};

/* What a prefill may leave out of its last layer, whose outputs only the
 * first token reads (the pipeline's trim; keys and values are always
 * stored): */
enum infer_attn_trim {
    INFER_ATTN_TRIM_NONE = 0, /* nothing: every call whole (the default) */
    INFER_ATTN_TRIM_ROWS,     /* each query row is computed alone: the last row */
    INFER_ATTN_TRIM_CALLS,    /* a call's rows depend on each other, and later calls on
                                 the first: the first and the last chunk's calls whole,
                                 the chunks between store keys and values only */
};

struct infer_attention {
    const char *name;
    int (*run)(const struct infer_attention *a, const struct format_config *c,
               const struct infer_kv *kv, uint32_t layer, const struct infer_attn_rows *rows,
               const float *q, uint32_t h0, uint32_t h1, float *out, float *scratch);
    void *ctx;
    int trim; /* enum infer_attn_trim */
};

/* Dense attention: exact float softmax(Q K^T / sqrt(d)) V over every
 * visible slot (or over the selected ones). A chain's rows are bit-identical
 * whatever batch they are part of. */
extern const struct infer_attention infer_attention_dense;
/* Sets the state's attention (NULL: dense). The struct must outlive s. */
void infer_state_set_attention(struct infer_state *s, const struct infer_attention *a);

/* ---- sparse attention (shadowAttn 3.2-3.4) ---------------------------------------------
 *
 * An attention implementation (the interface above) that estimates Q.K in
 * int8 on the emulated NPU (a static graph per key-length bucket; Q
 * quantized per head and call with the scale of its bucket, a multiplicative
 * grid around the geometric mean of its kv head's heads' profiled mean
 * scales, so heads in one bucket share the scale; K from the cache's int8
 * rule, one scale per slot and kv head, the graphs' per-channel scales:
 * buckets vary Q only), keeps per head
 * and query row the first `sinks` slots, the last `window` and the top of
 * the rest by the estimate (ceil(ratio * visible) keys in all, ratio from
 * eq. 3 of the offline importances), and runs the dense kernel's exact
 * softmax.V over them (its key-selection path). Heads sharing a kv head and
 * a bucket go in one NPU launch; launches run on the device while the
 * calling thread selects and attends the heads of the launches already
 * done, in the order of the paper's greedy plan (Algorithm 1). Draft trees
 * and calls with fewer than min_keys visible keys run dense.
 *
 * The offline profile lives in the container's metadata (attn.* keys,
 * docs/FORMAT.md), written by `sluice profile-attn`. */
struct infer_attn_profile {
    uint32_t n_layers, n_heads, n_kv_heads;
    float *head_imp;     /* [n_layers * n_heads] loss increase (nats/token), head zeroed */
    float *layer_imp;    /* [n_layers] loss increase, the layer's attention zeroed */
    float *q_scale;      /* [n_layers * n_heads] mean per-call Q scale (max|q| / 127) */
    float *k_scale;      /* [n_layers * n_kv_heads] mean per-call K scale */
    float keep;          /* the global ratio keep_ratio was made for */
    float *keep_ratio;   /* [n_layers * n_heads] eq. 3 at keep */
    uint32_t buckets;    /* Q scale buckets (default 9) */
    float step;          /* their multiplicative step sigma (default 0.5) */
    uint32_t calib_tokens;
    double loss;         /* calibration loss of the unchanged model */
    /* per-op costs on the profiling machine (the plan's inputs, ns): NPU
     * estimate per int8 multiply-add, top-k per key, softmax.V per kept key
     * and head dimension */
    float cost_est, cost_topk, cost_qkv;
};

struct infer_attn_profile_opts {
    uint32_t chunk_tokens; /* tokens per calibration chunk (0: min(seq_len, 1024)) */
    uint32_t max_tokens;  /* calibration tokens used (0: 4096) */
    uint32_t batch;       /* rows per forward call, as prefill runs (0: 256) */
    double keep;          /* global ratio for the stored per-head ratios (0: 0.2) */
    uint32_t buckets;     /* 0: 9 */
    float step;           /* 0: 0.5 */
    /* progress: called after each forward pass (done of total) */
    void (*progress)(void *ctx, uint32_t done, uint32_t total);
    void *ctx;
};

/* Profiles m on tokens[0..n) (calibration text, one stream): the loss with
 * each head's attention output zeroed, then each layer's, the unchanged
 * loss, the mean Q and K scales, and the per-op costs. */
int infer_attn_profile_run(struct infer_model *m, const int *tokens, uint32_t n,
                           const struct infer_attn_profile_opts *o,
                           struct infer_attn_profile **out, struct sl_err *err);
/* Reads the attn.* keys of a container: -ENOENT when it has none, -EINVAL
 * (a key of the wrong size or value, named) or -ENOMEM. */
int infer_attn_profile_read(const struct format_reader *r, struct infer_attn_profile **out,
                            struct sl_err *err);
/* Calls set(ctx, key, value, len) for every attn.* key (the writer's
 * format_writer_set_meta). Stops at the first error. */
int infer_attn_profile_write(const struct infer_attn_profile *p,
                             int (*set)(void *ctx, const char *key, const void *v, size_t len),
                             void *ctx);
void infer_attn_profile_destroy(struct infer_attn_profile *p);

struct infer_sparse_opts {
    double keep;       /* global keep ratio in (0, 1] (0: 0.2) */
    uint32_t sinks;    /* first slots always kept (0: none; 4 with opts NULL) */
    uint32_t window;   /* most recent slots always kept (0: none; 16 with opts NULL) */
    uint32_t min_keys; /* calls whose rows see fewer keys run dense (default 0) */
    uint32_t max_rows; /* calls of more rows run dense (0: no limit; 1: decode steps only) */
    int uniform;       /* 1: every head keeps `keep` (no importances) */
    double floor_share; /* 0..1: every head keeps at least this share of `keep`, the rest
                           goes by eq. 3 (0: eq. 3 alone, the paper) */
    int measure;       /* 1: recall and kept attention mass against float scores (slow) */
    int inline_npu;    /* 1: estimates on the calling thread (bit-identical results) */
    int no_plan;       /* 1: launches in head order instead of Algorithm 1's */
    int select_group;  /* 1: one key list per query row and kv head, shared by its query
                          heads (GQA): the top of max_h(estimate_h - its row max), one
                          Q bucket per kv head (its heads' largest scale); 0: per head */
    uint32_t row_block; /* per head, 2..16: blocks of this many adjacent query
                           rows share one key list (the top of the rows' combined estimates
                           over the first row's keys, then the block's own newest keys); the
                           AVX-512 exact stage (head size a multiple of 16) reads each key
                           and value once for the block, the other kernels once per row;
                           0 or 1: a list per row. Not with select_group */
    struct npu_device *device; /* NULL: one of its own */
};

struct infer_sparse;

/* Sparse attention for models of config c. p: the profile (NULL: uniform
 * ratios, and each head's Q bucket grid centred on its first call's
 * scale). Returns 0, -EINVAL (a bad option or a profile of another shape)
 * or -ENOMEM, with a sentence. Thread-safe for concurrent calls on disjoint
 * heads of a layer (the pipeline's attention tasks). An instance keeps the
 * int8 keys of the cache it serves (refilled from the first slot a call
 * rewrites, so truncation and rewinds are fine): one instance per state.
 * The keys are the float keys quantized by the mirror's rule with codes
 * within +-64 (7 bits: the int8 kernels' narrow step), one scale per slot
 * and kv head. */
int infer_sparse_create(const struct format_config *c, const struct infer_attn_profile *p,
                        const struct infer_sparse_opts *o, struct infer_sparse **out,
                        struct sl_err *err);
void infer_sparse_destroy(struct infer_sparse *sp);
const struct infer_attention *infer_sparse_attention(struct infer_sparse *sp);

struct infer_sparse_stats {
    uint64_t calls, dense_calls;  /* dense: trees and short contexts */
    uint64_t row_heads;           /* (row, head) pairs attended sparsely */
    uint64_t keys_visible, keys_kept;
    uint64_t launches;            /* NPU jobs */
    double recall;                /* measure: mean share of the float Q.K top-k found by the
                                     int8 estimate's top-k (same k, no sinks or window) */
    double mass;                  /* measure: mean float attention mass the kept keys hold */
    uint64_t total_ns, wait_ns, topk_ns, qkv_ns; /* calls, waiting on the NPU, selecting,
                                                    softmax.V (measure excluded) */
};
void infer_sparse_stats(struct infer_sparse *sp, struct infer_sparse_stats *st);
void infer_sparse_stats_reset(struct infer_sparse *sp);

/* ---- the linear path's seam ------------------------------------------------------------
 *
 * An int8 linear quantizes its input per tensor (x / s rounded, clipped to
 * [-127, 127]); what the clip cut off is reported to an added term: for
 * every clipped element (row, col), excess = x / s - clip(x / s). A term
 * function may add its own CPU work to the NPU's dequantized output y
 * [n][rows] (shadow outlier execution, llm.npu 3.3). Called on the thread of
 * the forward pass, after the matmul, for int8 linears only. */
struct infer_clipped {
    uint32_t n;             /* clipped elements */
    const uint32_t *row;    /* [n] */
    const uint32_t *col;    /* [n] */
    const float *excess;    /* [n] */
    float act_scale;        /* s */
    int store;              /* 1: the term must store its output into every element of
                               the rows of y with a clipped element (y's other rows left
                               alone) instead of adding to them: the same bits as adding
                               it to rows of -0.0f, without initializing them (for a
                               caller's scratch rows; a term must honor it); 0 (what
                               a zeroed struct and infer_find_clipped say): it adds */
    uint32_t r0, r1;        /* r1 > 0: only output channels [r0, r1) of each row (the
                               pipeline's piece of a matmul; the others left alone);
                               0, 0 (a zeroed struct): all of them */
};
typedef int (*infer_linear_term_fn)(void *ctx, int layer, uint32_t role,
                                    const struct infer_clipped *clip, float *y, uint32_t n,
                                    uint32_t rows);
void infer_model_set_linear_term(struct infer_model *m, infer_linear_term_fn fn, void *ctx);
/* Optional: which int8 linears the term wants (1) or ignores (0; their clips
 * are then not even collected). NULL (the default): every one. The
 * prefill pipeline (infer_pipeline_prefill) runs the term of a wanted
 * linear as CPU tasks, one after each piece of the NPU's matmul, adding into
 * that piece's output channels of y in place (clip->r0, r1): a term must
 * touch only those channels, add to each element one value computed without
 * reading y (so the bits equal one call over all channels), and be safe to
 * call from several threads at once, for different linears and for
 * disjoint channel ranges of one linear. */
typedef int (*infer_linear_term_wants_fn)(void *ctx, int layer, uint32_t role);
void infer_model_set_linear_term_filter(struct infer_model *m, infer_linear_term_wants_fn fn);

/* ---- shadow outlier execution (llm.npu 3.3) ----------------------------------------------
 *
 * A version 2 container's shadow.linears (format.h) gives some linears an
 * activation scale that covers the bulk of their inputs; what the clip cuts
 * off (x / s beyond +-127) is multiplied on the CPU by the same int8
 * weights and scales the NPU uses, exactly: y = s scale[r] (sum_c xq[c]
 * W[r][c] + sum_clipped excess W[r][c]). Hot input channels' weight columns
 * are resident (input-major, one contiguous read each); any other column is
 * gathered from the NPU's weight copy on demand. Plugs into the linear term
 * seam (infer_shadow_attach). */
struct infer_shadow;
struct infer_shadow_stats {
    uint64_t calls;      /* term calls of shadowed linears */
    uint64_t elements;   /* activations those linears quantized */
    uint64_t clipped;    /* ... beyond the bulk scale's range: outliers */
    uint64_t token_rows; /* input rows with at least one outlier */
    uint64_t cols_hot;   /* weight rows touched (input channels' columns read), one per
                            outlier: resident, contiguous */
    uint64_t cols_cold;  /* columns gathered from the NPU's copy: once per distinct
                            non-resident channel of a call (one pass over its blocks) */
};
/* Reads the model's shadow.linears: -ENOENT (err says so) when the
 * container has none; -EINVAL for a malformed one; -ENOMEM. The model must
 * outlive the object. */
int infer_shadow_create(struct infer_model *m, struct infer_shadow **out, struct sl_err *err);
void infer_shadow_destroy(struct infer_shadow *sh);
/* Creates the model's shadow (owned by the model, destroyed with it) and
 * attaches it: 0, -ENOENT when the container has none (err says so), or
 * infer_shadow_create's errors. Idempotent. */
int infer_model_shadow_enable(struct infer_model *m, struct sl_err *err);
/* The model's own shadow, or NULL. */
const struct infer_shadow *infer_model_shadow(const struct infer_model *m);
/* Installs sh as the model's linear term and filter (NULL removes them). */
void infer_shadow_attach(struct infer_model *m, struct infer_shadow *sh);
/* Linears described, of which shadowed (not pruned); the resident bytes
 * (hot columns and tables). */
uint32_t infer_shadow_linears(const struct infer_shadow *sh, uint32_t *enabled);
size_t infer_shadow_bytes(const struct infer_shadow *sh);
void infer_shadow_get_stats(const struct infer_shadow *sh, struct infer_shadow_stats *st);
/* The term and filter themselves (ctx: the struct infer_shadow). */
int infer_shadow_term(void *ctx, int layer, uint32_t role, const struct infer_clipped *clip,
                      float *y, uint32_t n, uint32_t rows);
int infer_shadow_wants(void *ctx, int layer, uint32_t role);

/* ---- tokenizer (llama2.c-style byte-pair encoding) ---------------------------------- */

struct infer_tokenizer;

/* Indexes a vocabulary (bos_id and eos_id from cfg). The tokenizer borrows
 * tok's strings and scores: keep their owner (the reader, or the model that
 * holds it) alive until infer_tokenizer_destroy. Returns 0, -EINVAL (an
 * empty vocabulary, a token of 2 GiB or more) or -ENOMEM, filling err. */
int infer_tokenizer_create(const struct format_tokenizer *tok, const struct format_config *cfg,
                           struct infer_tokenizer **out, struct sl_err *err);
void infer_tokenizer_destroy(struct infer_tokenizer *t);

/* Encodes UTF-8 text of any length: optional BOS, a dummy-prefix space,
 * byte fallback (<0xXX>) for bytes without a token, then byte-pair merges by
 * highest score, the leftmost pair first among equal scores (llama2.c's
 * run.c, token for token), in O(n log n) for n bytes. Working storage
 * (about 72 bytes a byte of text) is allocated and freed by the call.
 * Returns 0 with the *n tokens in tokens[0..*n); -ENOSPC when the result is
 * more than max tokens, with *n set to the count needed and the first max
 * in tokens (max = 0 counts; tokens may then be NULL); -ENOMEM. A tokenizer
 * may encode on several threads at once. */
int infer_tokenizer_encode(const struct infer_tokenizer *t, const char *text, int add_bos,
                           int *tokens, uint32_t max, uint32_t *n);

/* Encodes a long text as one token stream (no BOS; one dummy-prefix space at
 * the start): the text is cut before every space and each piece is merged on
 * its own, which is what SentencePiece's default split_by_whitespace
 * training guarantees its vocabulary never crosses, so the result equals
 * infer_tokenizer_encode's for such a vocabulary, with working storage sized
 * by the longest piece. *tokens is malloc'ed. Returns 0, -ENOMEM, or
 * -EOVERFLOW for 4 GiB of text or more. For evaluation and calibration text. */
int infer_tokenizer_encode_stream(const struct infer_tokenizer *t, const char *text, size_t len,
                                  int **tokens, uint32_t *n);

/* The bytes a token prints as, following llama2.c's run.c: the leading
 * space of a piece after BOS is dropped, <0xXX> pieces become the raw byte.
 * *len receives the byte count (pieces may contain NUL). */
const char *infer_tokenizer_decode(const struct infer_tokenizer *t, int prev, int token,
                                   size_t *len);

/* run.c's safe_printf rule: 1 if a piece should be printed (not a lone
 * non-printable, non-whitespace byte). */
int infer_piece_printable(const char *piece, size_t len);

uint32_t infer_tokenizer_vocab_size(const struct infer_tokenizer *t);

/* ---- sampler -------------------------------------------------------------------------- */

struct infer_sampler_params {
    float temperature; /* 0: greedy */
    float top_p;       /* 0 or >= 1: off */
    uint32_t top_k;    /* 0: off */
    uint64_t seed;
};

struct infer_sampler;

int infer_sampler_create(uint32_t vocab, const struct infer_sampler_params *p,
                         struct infer_sampler **out);
void infer_sampler_destroy(struct infer_sampler *s);
/* Picks the next token from logits[vocab] (modified in place). Deterministic
 * for a seed. */
int infer_sampler_sample(struct infer_sampler *s, float *logits);
/* The distribution infer_sampler_sample draws from, into probs[vocab]:
 * temperature, softmax, the top-k/top-p candidates renormalized (0 for the
 * rest); greedy: 1 at the argmax. For speculative acceptance. */
int infer_sampler_probs(struct infer_sampler *s, const float *logits, float *probs);
/* A uniform draw in [0, 1) from the sampler's generator. */
float infer_sampler_uniform(struct infer_sampler *s);
int infer_sampler_is_greedy(const struct infer_sampler *s);

/* ---- the cold-start pipeline (pipeline.c) ------------------------------------------
 *
 *   struct infer_pipeline_opts po = {.policy = INFER_POLICY_FULL};
 *   struct infer_model *m; struct infer_state *s;
 *   infer_pipeline_prefill("m.sluice", ids, n, &po, &m, &s, logits, &stats, &err);
 *   // logits of the last prompt position; m fully loaded, s holds the KV cache
 *   // of the prompt: decode with infer_forward(m, s, &tok, 1, n, ...)
 *
 * Streams the container's slices (io_uring), verifies and unpacks each layer's
 * weights into the NPU layout as they arrive, and runs the prefill in chunks
 * as a task graph on the emulated NPU and CPU workers (EdgeFlow 4.3). The
 * logits are bit-identical to infer_forward on the same model with
 * max_batch = chunk. */

enum infer_policy {
    INFER_POLICY_FULL = 0,      /* EdgeFlow: fine-grained tasks, position-guided priority,
                                   CPU task stealing */
    INFER_POLICY_SEQUENTIAL,    /* load everything, then unpack and compute in graph order
                                   (llama.cpp's and MNN's way): coarse tasks, FIFO */
    INFER_POLICY_LAYER_OVERLAP, /* llm.npu-style static coarse pipeline: layer-level overlap,
                                   one NPU task per matmul, FIFO, no stealing */
    INFER_POLICY_LLMNPU,        /* llm.npu 3.4 out-of-order subgraph heuristic */
    INFER_POLICY_SEQUENTIAL_GRANULAR, /* load everything, then compute with full's
                                         scheduler (a stronger baseline) */
    INFER_POLICY_COUNT
};

enum infer_load {
    INFER_LOAD_STREAM = 0, /* the loader: io_uring, O_DIRECT, slice by slice */
    INFER_LOAD_READ,       /* read() the whole container first (MNN's way) */
    INFER_LOAD_MMAP,       /* mmap it with MAP_POPULATE first (llama.cpp's way) */
};

#define INFER_PIPELINE_MAX_CPU_WORKERS 8

/* What a cold-started model keeps resident for decoding (`--resident`). The
 * prefill computes from int8 weights in the NPU's layout, except, with
 * PACKED, the one-row products (the classifier's, and the trimmed last
 * layer's Q, O, gate, up, down), which read the packed codes directly; with
 * PACKED the pipeline also keeps each quantized linear's packed bytes
 * (adaptive, bitplane, int4int8; q8 tensors stay int8), and the session
 * frees the int8 copies before its first decode step: decode reads the
 * packed codes and unpacks them in registers (unpack_tensor_dot, the same
 * int32 sums and scales, so bit-identical logits), and the weights take
 * their packed size in memory. */
enum infer_resident {
    INFER_RESIDENT_INT8 = 0,
    INFER_RESIDENT_PACKED,
    /* PACKED where the model's int8 linear weights are larger than this
     * machine's last-level cache (decode then streams them from memory, and
     * reading 5/8 of the bytes wins), INT8 where they fit (unpacking then
     * costs more than the bytes it saves); docs/BENCHMARKS.md, issue 22 */
    INFER_RESIDENT_AUTO,
};
const char *infer_resident_name(enum infer_resident r);
int infer_resident_parse(const char *s, enum infer_resident *out); /* 0 or -EINVAL */
/* AUTO resolved for the container r (INT8 and PACKED are returned as
 * they are); the cache size from sysconf (L3, else L2; 0 known: 32 MiB).
 * AUTO is INT8 for a container with shadow outlier metadata unless
 * no_shadow: the shadow term reads weight columns, from the int8 copies, or
 * with PACKED decoded one by one from the packed codes (the same bits, a
 * slower decode). */
enum infer_resident infer_resident_resolve(enum infer_resident res, const struct format_reader *r,
                                           int no_shadow);

struct infer_pipeline_opts {
    enum infer_policy policy;
    enum infer_load load;
    uint32_t chunk;            /* prefill chunk rows, the NPU graphs' m (default 256) */
    uint32_t steal_threshold;  /* NPU queue length above which an idle CPU steals (5) */
    int steal_top;             /* steal the NPU queue's top task (the paper's rule) instead
                                * of its last in priority order (default: measured
                                * faster, docs/BENCHMARKS.md) */
    double steal_ahead;        /* > 0: an idle CPU also steals the NPU's last task when the
                                * NPU's other work (the rest of its running task and
                                * every other queued one) is at least this many times
                                * that task's estimated time; 0: off (1 with opts NULL
                                * and in sluice run) */
    int no_steal_split;        /* with steal_ahead: never cut a matmul the NPU's other work
                                * does not outlast (its rest to the CPU), nor leave the
                                * second half of one the NPU dispatches queued (tails) */
    uint32_t split;            /* output channels per NPU task in full/sequential (512) */
    int no_shadow;             /* 1: no shadow outlier execution even where the container
                                * calibrated it (infer_model_shadow_enable; ablation) */
    int no_prefault;           /* full: no prefault thread faulting the activation memory
                                * and the NPU's weight memory in ahead while a CPU worker
                                * is idle (ablation) */
    uint32_t cpu_workers;      /* CPU worker threads (0, the default: one per core
                                * the process may run on, sl_cpu_count; the NPU
                                * has its own thread besides),
                                * at most INFER_PIPELINE_MAX_CPU_WORKERS (more are
                                * taken as that many) */
    uint64_t ring_bytes;       /* loader buffer memory (default 64 MiB) */
    uint32_t queue_depth;      /* loader reads in flight (default 16) */
    const char *trace_path;    /* Chrome trace JSON of every task and load, or NULL */
    struct npu_device *device; /* the emulated NPU to run on (npu.h; left running, its
                                * graphs kept), or NULL: one of the pipeline's own */
    enum infer_resident resident; /* PACKED: keep the packed bytes too (above); the
                                * slices are read in place (no loader ring, no copy) and,
                                * with split matmuls (full, sequential_granular), the
                                * layers' int8 copies come from a bounded pool: */
    uint64_t int8_budget;      /* ... int8 weight storage in use at once (0: the default,
                                * max(48 MiB, 4 x the largest linear's); a linear is
                                * admitted alone whatever its size) */
    int slices_read;           /* packed residency: the slices read with O_DIRECT into
                                * memory of the model's own (which the kernel zeroes
                                * first) instead of mapped from the page cache (default
                                * where the file maps; ablation) */
    uint32_t hash_step;        /* mapped slices: bytes of a slice hashed at a time, each
                                * piece as soon as its pages are read (0: 2 MiB; rounded
                                * up to 4 KiB); the slice counts as arrived once all of
                                * it matched its checksum */
    uint32_t act_sets;         /* (layer, chunk)s computing at once, each with its set of
                                * activation scratch (default 2; as many as chunks where
                                * the int8 budget cannot hold a layer): with a long
                                * prompt the activations do not grow with its chunks */
    uint32_t attn_rows;        /* full and sequential_granular, dense attention, O's input
                                * with a static scale: at most about this many query rows per
                                * attention piece of a kv head group (cut at multiples of
                                * 16, pieces made equal), so a CPU worker turns to
                                * other ready work between pieces; 0: pieces of about 24
                                * MFLOP (a few ms) each, equal in work; UINT32_MAX: the
                                * chunk's rows in one piece (ablation). The same logits */
    int no_trim_last;          /* 1: the last layer computes every row (ablation). Else,
                                * where its Q, O and FFN linears are int8 with static
                                * activation scales and no linear term, it computes every
                                * row's keys and values but O and the FFN of the last row
                                * only, and queries of the last row with dense attention
                                * (other attention: every row of the first and the last
                                * chunk, none of the chunks between); the first token
                                * needs nothing else; the same logits */
    int no_decode;             /* 1: the caller decodes nothing after the first token (sluice
                                * run -n 0 or 1): what only decoding needs (an untied
                                * embedding, read after the first token) is not read, so
                                * the process can end at once; a decode step then fails */
    const struct infer_attention *attn; /* the state's attention (NULL: dense); a sparse
                                * one must not use `device` (its jobs would wait behind
                                * the pipeline's) */
    void (*first_logits)(void *ctx, const float *logits); /* as soon as they exist */
    void *ctx;
    struct format_reader *reader; /* the container already open (of path; the model holds
                                * it too, infer_load_opts.reader), so that its index is
                                * not read and decompressed again; NULL: the pipeline
                                * opens path. The session's cold start passes its own */
};

struct infer_pipeline_stats {
    double ttft_s;             /* pipeline start to the first token's logits */
    double load_s;             /* start to the arrival of the last slice it needed */
    double unpack_s;           /* CPU time unpacking weights */
    double prefault_s;         /* full: the prefault thread's time faulting weight memory in
                                * ahead, at idle priority while a CPU worker was idle
                                * (counted neither as busy nor as stall) */
    double npu_busy_s;         /* the NPU device thread executing jobs */
    double cpu_busy_s;         /* CPU workers running tasks (stolen NPU work included) */
    double span_s;
    double stall_s;            /* no task running or ready anywhere: all waiting on the disk */
    double bubble_npu;         /* 1 - npu_busy / (span - stall): idle while there was work */
    double bubble_cpu;         /* 1 - cpu_busy / ((span - stall) x workers) */
    double idle_npu;           /* 1 - npu_busy / span: idle for any reason */
    double idle_cpu;           /* 1 - cpu_busy / (span x workers) */
    double graph_build_s;
    uint64_t bytes_read;       /* before the first token */
    uint32_t tasks, stolen, graphs;
    uint32_t splits;           /* NPU matmuls cut in two by split stealing (in stolen) */
    uint32_t tails;            /* NPU matmuls cut in two at dispatch, the second half left
                                * queued for an idle CPU to steal (full) */
    double shadow_s;           /* CPU time of the shadow outlier tasks (in cpu_busy_s) */
    uint64_t int8_pool_bytes;  /* packed residency: the most int8 weight storage the pool
                                * held at once (0: no pool) */
    uint64_t int8_pool_fresh;  /* ... bytes of linears it gave fresh memory (zeroed by the
                                * kernel when first touched), and bytes of linears it */
    uint64_t int8_pool_reused; /* gave a recycled storage (already faulted in) */
    uint32_t act_sets;         /* activation sets (see act_sets above) */
    uint64_t act_bytes;        /* the chunks' activation memory: x and d of every row
                                * plus the sets */
};

/* Every option at its default (what opts = NULL means): full, stream, chunk
 * 256, steal threshold 5, steal ahead 1, split 512, a CPU worker per core, a 64 MiB
 * ring, 16 reads in flight, no trace, no callback, a device of its own. A
 * zeroed struct is not the defaults: start from this and change fields. */
void infer_pipeline_opts_init(struct infer_pipeline_opts *o);

const char *infer_policy_name(enum infer_policy p);
int infer_policy_parse(const char *s, enum infer_policy *out);

int infer_pipeline_prefill(const char *path, const int *tokens, uint32_t n,
                           const struct infer_pipeline_opts *opts, struct infer_model **model,
                           struct infer_state **state, float *logits,
                           struct infer_pipeline_stats *stats, struct sl_err *err);

/* ---- the session --------------------------------------------------------------------
 *
 * A session is one conversation with a model: it owns a state (the KV
 * cache and scratch), a sampler, statistics and the emulated NPU device
 * (npu.h) that runs its int8 matmuls for prefill and decode alike, and it
 * either owns its model (a cold start) or borrows one that several sessions
 * share (weights are read-only; each session has its own cache).
 *
 *   struct infer_session *s;
 *   infer_session_cold_start("m.sluice", ids, n, &so, &po, &s, &pst, &err);
 *   // or: infer_session_create(model, &so, &s, &err); infer_session_prefill(s, ids, n, &err);
 *   int tok;
 *   while (infer_session_sample(s, &tok) == 0 && tok != eos && more)
 *       infer_session_step(s, tok, &err);            // logits of the next position
 *   infer_session_destroy(s);
 *
 * A session is used by one thread at a time. */

struct infer_session;

struct infer_session_opts {
    uint32_t max_batch;                  /* rows per forward call (0: 256) */
    struct infer_sampler_params sampler; /* greedy when zeroed */
    int no_npu;                          /* 1: int8 matmuls on the calling thread only */
    /* Decode rows go to the NPU device thread and the calling thread
     * together: the NPU takes this share of each int8 matmul's output
     * channels (0: 0.5; the results are bit-identical for any share). */
    double npu_share;
    /* int8 matmuls of fewer weights than this stay on the calling thread (a
     * hand-off costs a thread wake-up; 0: 1 Mi weights); packed residency's
     * decode rows split from 2^18 weights when this is larger */
    uint64_t npu_min_weights;
    /* Cold start only: called the moment the prompt's logits exist, before
     * the pipeline reads what only decoding needs (the time to first token).
     * Only infer_session_logits and infer_session_sample may be called on s
     * there (the model is not the session's yet). NULL: none. */
    void (*first_logits)(void *ctx, struct infer_session *s);
    void *ctx;
};

struct infer_session_stats {
    uint32_t prompt_tokens;   /* through prefill (cold start included) */
    uint32_t decoded;         /* tokens through infer_session_step */
    double prefill_s;         /* forward time of the prompt */
    double decode_s;          /* forward time of the steps */
    uint64_t npu_jobs;        /* int8 matmuls the NPU device thread took part in: a
                               * graph job, or chunks of a few-rows matmul (one the
                               * calling thread took back whole is not counted) */
};

/* A session over a loaded model it does not own (m must outlive it). */
int infer_session_create(struct infer_model *m, const struct infer_session_opts *o,
                         struct infer_session **out, struct sl_err *err);
/* A cold start: the prompt tokens[0..n) through the cold-start pipeline
 * (infer_pipeline_prefill, its NPU device then kept for decode); the
 * session owns the model. The prompt's last logits are the session's.
 * The container is opened once: po->reader where the caller has it open
 * (a tool that read its tokenizer; the model holds it too), else path. */
int infer_session_cold_start(const char *path, const int *tokens, uint32_t n,
                             const struct infer_session_opts *so,
                             const struct infer_pipeline_opts *po, struct infer_session **out,
                             struct infer_pipeline_stats *pst, struct sl_err *err);
void infer_session_destroy(struct infer_session *s);

struct infer_model *infer_session_model(struct infer_session *s);
struct infer_state *infer_session_state(struct infer_session *s);
/* Tokens in the cache (the context so far). */
uint32_t infer_session_len(const struct infer_session *s);
/* Appends tokens to the context; the logits of the last one become the
 * session's. -EINVAL past the context length (nothing appended). */
int infer_session_prefill(struct infer_session *s, const int *tokens, uint32_t n,
                          struct sl_err *err);
/* The same, keeping every position's logits in all[n][vocab] (the classifier
 * over every row: for in-context calibration, infer_spec_opts.prompt_logits;
 * its cost is the prefill's). */
int infer_session_prefill_logits(struct infer_session *s, const int *tokens, uint32_t n,
                                 float *all, struct sl_err *err);
/* One decode step: token at the next position. */
int infer_session_step(struct infer_session *s, int token, struct sl_err *err);
/* The logits [vocab] of the last position run (valid until the next call). */
const float *infer_session_logits(const struct infer_session *s);
/* Samples the next token from the logits (the session's sampler) and keeps
 * it as the session's next token until a step or prefill runs. */
int infer_session_sample(struct infer_session *s, int *token);
/* Forgets the context after its first n tokens. */
int infer_session_rewind(struct infer_session *s, uint32_t n, struct sl_err *err);
/* Generation: takes the next token (the one infer_session_sample kept, else
 * a new sample), calls on_token(ctx, token) (nonzero stops), steps it, and
 * again, until max_tokens were taken, a token of stop[0..n_stop) comes
 * (counted, not passed on, not run), or the context is full (the last token
 * is passed on but cannot be run). *n_out: tokens taken. */
typedef int (*infer_token_fn)(void *ctx, int token);
int infer_session_generate(struct infer_session *s, uint32_t max_tokens, const int *stop,
                           uint32_t n_stop, infer_token_fn on_token, void *ctx, uint32_t *n_out,
                           struct sl_err *err);
void infer_session_stats(const struct infer_session *s, struct infer_session_stats *st);
/* Several sessions of one model advance in one forward pass
 * (infer_forward_multi): entry i appends tokens[0..n) to session s, as
 * infer_session_prefill (step 0) or infer_session_step (step 1, n = 1) would,
 * and leaves the same logits and cache, bit for bit (its statistics count
 * the rows, the step's time shared out by rows). The
 * sessions must share mb's model; a session at most once. 0 or -errno with
 * err filled (then no session keeps any of the rows). */
struct infer_session_rows {
    struct infer_session *s;
    const int *tokens;
    uint32_t n;
    int step;
};
int infer_session_run_multi(struct infer_multi *mb, const struct infer_session_rows *r,
                            uint32_t k, struct sl_err *err);

/* ---- speculative decoding (spec_*.c; sd.npu 3.2-3.4) ---------------------------------
 *
 * Retrieval drafts verified in one batched forward: after each token the
 * last 1..4 tokens of the context are looked up in an n-gram index over the
 * prompt and everything generated, earlier generations (history) and
 * calibrated sequences; what followed them becomes a draft tree (longest
 * match first, shared prefixes merged) of at most max_rows rows with the
 * pending token as its root (the NPU's 4/8/16-row graph shapes). One
 * infer_forward_batch runs the tree with its mask; the longest path the
 * model agrees with is kept (infer_kv_commit) and the rest dropped. Greedy
 * text is identical to infer_session_generate's, token for token (tree rows
 * equal plain decoding bit for bit: float weights or static activation
 * scales); with sampling the recursive rejection rule keeps the output
 * distribution the sampler's.
 *
 *   infer_spec_create(sess, prompt, n_prompt, &so, &sp, &err);
 *   infer_spec_generate(sp, max, stop, n_stop, on_token, ctx, &n, &err);
 *   infer_spec_stats(sp, &sst); infer_spec_destroy(sp); */

struct infer_spec;

struct infer_spec_opts {
    uint32_t max_rows;   /* verification rows, root included: 4, 8 or 16 (0: 8) */
    uint32_t min_match;  /* shortest n-gram that retrieves from context and history,
                            1..4 (0: 2); the context's 1-grams still draft when
                            nothing longer did */
    int no_reuse;        /* 1: no draft reuse (paper 3.4) */
    uint32_t reuse_threshold; /* a reused segment is dropped once it has drafted more
                                 than this many tokens (0: 16) */
    int calibrate;       /* 1: in-context calibration (paper 3.3) after the first token */
    uint32_t calib_breadth, calib_depth; /* 0: 2 and 4 */
    float calib_min_p;   /* 0: 0.2 */
    const float *prompt_logits; /* with calibrate: the prefill's logits of every context
                                   position, [n][vocab] (infer_session_prefill_logits):
                                   calibration reads them in infer_spec_create instead
                                   of its own pass over the context; NULL: that pass,
                                   after the first token */
    float row_cost;      /* the time of one more verification row relative to a
                            one-row step, for the cost model that sizes the tree
                            (0: fitted as it runs, with a verification's fixed
                            cost beside it; set: that price, and verify_cost) */
    float verify_cost;   /* with row_cost set: a verification's fixed cost in one-row
                            steps beside it (0: none); a fixed price makes the drafts
                            and so the tokens per forward independent of the
                            machine's load (bench spec --row-cost A --verify-fixed B) */
    const int *history;  /* earlier generations (-1 separates them), or NULL */
    uint32_t n_history;
    /* called after every verification (for a trace): its start and end
     * (sl_now_ns), rows and accepted drafts; NULL: none */
    void (*on_round)(void *ctx, uint64_t t0_ns, uint64_t t1_ns, uint32_t rows,
                     uint32_t accepted);
    void *round_ctx;
    /* the sampler of infer_spec_round's acceptance rule (a caller that samples
     * with its own, e.g. per request); NULL: the session's. infer_spec_generate
     * wants NULL (it samples with the session's) */
    struct infer_sampler *sampler;
};

#define INFER_SPEC_MAX_ROWS 16 /* the largest verification shape */

struct infer_spec_stats {
    uint32_t rounds;       /* verification forwards */
    uint32_t plain_steps;  /* one-row steps (no draft found) */
    uint32_t drafted;      /* draft rows verified */
    uint32_t accepted;     /* draft tokens accepted */
    uint32_t reuse_drafted, reuse_accepted; /* of those, from reused segments */
    uint32_t calib_drafted, calib_accepted; /* from calibrated sequences */
    uint32_t history_drafted, history_accepted; /* from the history store (the rest of
                                                 * drafted/accepted: the context's) */
    uint32_t calib_seqs;   /* calibrated sequences added */
    uint32_t shapes[3];    /* rounds with 4, 8 and 16-row graphs */
    uint32_t tokens;       /* tokens produced (emitted) */
    double draft_s, verify_s, plain_s, calib_s;
    uint32_t skipped;      /* of plain_steps: a draft was found but the cost model
                            * judged it not worth a verification */
    uint32_t alone;        /* of rounds: run on the calling thread alone (the
                            * cost model found it cheaper than the split with
                            * the session's NPU device thread, or probed it) */
};

int infer_spec_create(struct infer_session *s, const int *context, uint32_t n,
                      const struct infer_spec_opts *o, struct infer_spec **out,
                      struct sl_err *err);
void infer_spec_destroy(struct infer_spec *sp);
/* infer_session_generate's contract, speculatively. */
int infer_spec_generate(struct infer_spec *sp, uint32_t max_tokens, const int *stop,
                        uint32_t n_stop, infer_token_fn on_token, void *ctx, uint32_t *n_out,
                        struct sl_err *err);
/* One round of infer_spec_generate, for a caller that takes the tokens
 * itself (a server streaming a reply): `token` was just taken and is fed
 * back now (the cache holds the context before it and has room for it).
 * Drafts at most `depth` tokens after it (none of stop[0..n_stop)) and
 * verifies them with it in one forward, or runs it alone when there is no
 * draft. acc[0..*n_acc) (acc has room for INFER_SPEC_MAX_ROWS - 1) are the
 * drafts accepted, in the cache after `token`; *next is the token after
 * them, chosen by the acceptance rule (not run), or -1 after a plain step:
 * then sample the session's logits as usual. The session's logits are
 * those of the last token in the cache either way. 0 or -errno with err. */
int infer_spec_round(struct infer_spec *sp, int token, uint32_t depth, const int *stop,
                     uint32_t n_stop, int *acc, uint32_t *n_acc, int *next, struct sl_err *err);
void infer_spec_stats(const struct infer_spec *sp, struct infer_spec_stats *st);
/* The tokens generated so far (for the history store). */
const int *infer_spec_generated(const struct infer_spec *sp, uint32_t *n);
/* 1 when greedy verification is exact for the model: every linear float or
 * with a static activation scale (dynamic scales make rows affect each
 * other). */
int infer_spec_exact(const struct infer_model *m);

/* A bounded on-disk history of earlier generations, one file per task kind
 * and model (DIR/KIND-TAG.hist; KIND of [A-Za-z0-9_-], 1..64 characters):
 * at most max_tokens tokens, the oldest generations dropped first, rewritten
 * atomically (temporary file + rename). */
struct infer_spec_store;
int infer_spec_store_open(const char *dir, const char *kind, uint64_t model_tag,
                          uint32_t max_tokens, struct infer_spec_store **out, struct sl_err *err);
void infer_spec_store_close(struct infer_spec_store *h);
/* Its tokens, generations separated by -1. */
const int *infer_spec_store_tokens(const struct infer_spec_store *h, uint32_t *n);
int infer_spec_store_add(struct infer_spec_store *h, const int *tokens, uint32_t n,
                         struct sl_err *err);
/* Frees the int8 (NPU layout) copy of every linear of m that also holds
 * its packed bytes (a cold start with INFER_RESIDENT_PACKED): from then on
 * its matmuls read the packed codes. A session that cold-started with
 * PACKED calls it itself before its first step or prefill; returns the
 * bytes freed. Not while m is in use by another thread. */
size_t infer_model_drop_int8(struct infer_model *m);
/* Does now what s's first step or prefill would do: frees the int8 copies
 * of a cold start with INFER_RESIDENT_PACKED (infer_model_drop_int8) and
 * returns the bytes freed (0 for any other session). For a caller that
 * shares s's model with other sessions: call it before any of them runs,
 * since the model must not be in use by another thread when it is dropped. */
size_t infer_session_drop_int8(struct infer_session *s);
/* Bytes of weight memory m holds now: int8 (NPU layout) and packed. */
void infer_model_weight_bytes(const struct infer_model *m, size_t *int8_bytes,
                              size_t *packed_bytes);

#ifdef __cplusplus
}
#endif

#endif /* SLUICE_INFER_H */

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

struct infer_load_opts {
    int lazy;              /* 1: load no layer now (infer_model_load_layer later) */
    int force_dynamic_act; /* 1: ignore static activation scales (dynamic per call) */
    int no_mmap;           /* 1: read tensors into private memory instead of using
                              float weights in place in a read-only mapping */
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
    INFER_LOGITS_ALL = 2,  /* logits[n][vocab] for every row (evaluation) */
};

/* Runs tokens[0..n) at positions pos..pos+n-1 (n may exceed max_batch: it is
 * processed in batches), appending to the KV cache. pos + n must not exceed
 * seq_len. Returns 0 or a negative errno with a message. */
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
    int no_prefault;           /* full: no prefault thread faulting the NPU's weight memory
                                * in ahead while a CPU worker is idle (ablation) */
    uint32_t cpu_workers;      /* CPU worker threads (default 1; the NPU has its own) */
    uint64_t ring_bytes;       /* loader buffer memory (default 64 MiB) */
    uint32_t queue_depth;      /* loader reads in flight (default 16) */
    const char *trace_path;    /* Chrome trace JSON of every task and load, or NULL */
    void (*first_logits)(void *ctx, const float *logits); /* as soon as they exist */
    void *ctx;
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
};

const char *infer_policy_name(enum infer_policy p);
int infer_policy_parse(const char *s, enum infer_policy *out);

int infer_pipeline_prefill(const char *path, const int *tokens, uint32_t n,
                           const struct infer_pipeline_opts *opts, struct infer_model **model,
                           struct infer_state **state, float *logits,
                           struct infer_pipeline_stats *stats, struct sl_err *err);

#ifdef __cplusplus
}
#endif

#endif /* SLUICE_INFER_H */

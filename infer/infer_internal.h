/* infer_internal.h: the model structs and CPU operators shared by the files
 * of the infer module (runtime, pipeline). Shapes in comments: n = rows of a
 * batch (tokens), D = dim, Q = n_heads * head_dim, KV = n_kv_heads *
 * head_dim, F = hidden_dim, V = vocab. */
#ifndef SLUICE_INFER_INTERNAL_H
#define SLUICE_INFER_INTERNAL_H

#include <pthread.h>

#include "infer.h"
#include "infer_matmul.h"

struct npu_weights;

/* One linear layer y = x W^T: W is [rows][cols] (rows = output channels). */
struct infer_linear {
    uint32_t rows, cols;
    void *w;                 /* float weights [rows][cols] of type wtype, or NULL */
    uint32_t wtype;          /* enum infer_wtype */
    int w_borrowed;          /* w points into the model's mapping: not freed */
    int8_t *q;               /* int8 codes [rows][cols], or NULL */
    float *scale;            /* per-row dequantization scales [rows] (int8 only) */
    float act_scale;         /* static per-tensor input scale; 0 = dynamic */
    struct npu_weights *npu; /* prepared for the GEMM kernels (int8 only) */
    /* a packed tensor kept packed (the embedding: only looked up, a row is
     * unpacked per token): its bytes (owned) and row index, or NULL */
    uint8_t *packed;
    struct unpack_tensor *upk;
    int packed_borrowed;     /* packed points into the model's slices: not freed */
};

struct infer_layer {
    int loaded;
    float *attn_norm;           /* [D] */
    struct infer_linear wq;     /* [Q][D] */
    struct infer_linear wk;     /* [KV][D] */
    struct infer_linear wv;     /* [KV][D] */
    struct infer_linear wo;     /* [D][Q] */
    float *ffn_norm;            /* [D] */
    struct infer_linear w_gate; /* [F][D] */
    struct infer_linear w_up;   /* [F][D] */
    struct infer_linear w_down; /* [D][F] */
};

struct infer_model {
    struct format_reader *reader;
    struct format_config cfg;
    int force_dynamic_act;
    int globals_loaded;
    struct infer_linear embed; /* token embedding [V][D] (float or int8 rows) */
    float *out_norm;           /* [D] */
    struct infer_linear cls_own; /* an untied classifier's weights */
    struct infer_linear *cls;  /* the classifier [V][D]: &embed when tied, else &cls_own */
    struct infer_layer *layers;
    infer_observe_fn observe;
    void *observe_ctx;
    infer_linear_term_fn term; /* the linear path's added CPU term, or NULL */
    void *term_ctx;
    infer_linear_term_wants_fn term_wants; /* NULL: every int8 linear */
    struct infer_shadow *shadow; /* owned (infer_model_shadow_enable), or NULL */
    void *map; /* the container mapped read-only, or NULL */
    size_t map_len;
    void *io_buf; /* tensor read buffer when not mapped */
    size_t io_cap;
    /* packed residency: the container's slices, read in place by the
     * cold start (at their file offsets); packed linears point into it */
    void *slices;
    size_t slices_mapped; /* nonzero: slices maps the container read-only
                           * (this many bytes, munmap), else sl_alloc_aligned */
};

/* The KV cache (infer.h): [layer][slot][kv_dim] keys and values. */
struct infer_kv {
    uint32_t n_layers, n_kv_heads, head_dim, kv_dim;
    uint32_t cap, len;
    float *k, *v;      /* [layer][slot][kv_dim], on a cache line (in k_mem, v_mem) */
    void *k_mem, *v_mem;
    uint32_t *pos;     /* [cap] position of each slot */
    int8_t *k8;        /* INFER_KV_K8: int8 keys [layer][slot][kv_dim], or NULL */
    float *k8_scale;   /* [layer][slot][n_kv_heads] */
};

/* Appends n slots (positions pos[i], or pos0 + i when pos is NULL): -ENOSPC
 * when they do not fit. Their contents are written layer by layer. */
int infer_kv_reserve(struct infer_kv *kv, uint32_t n, const uint32_t *pos, uint32_t pos0);
/* Stores rows k, v [n][kv_dim] (heads [kv0, kv1) of each) of one layer at
 * slots slot0.., and their int8 mirror when the cache keeps one. */
void infer_kv_write(struct infer_kv *kv, uint32_t layer, uint32_t slot0, uint32_t n,
                    const float *k, const float *v, uint32_t kv0, uint32_t kv1);

struct npu_device;

struct infer_state {
    uint32_t max_batch;
    struct infer_kv *kv;
    const struct infer_attention *attn;
    struct npu_device *dev; /* int8 matmuls of small batches go here too (a session's) */
    double npu_share;       /* of the output channels, on dev */
    uint64_t npu_min_weights; /* smaller matmuls stay on the calling thread */
    int split_work;         /* a multi-sequence step's (infer_multi.c): the threshold counts
                               rows x weights, and float matmuls are split with dev too */
    uint64_t npu_jobs;
    /* scratch, max_batch rows each */
    float *x;       /* [n][D] residual stream */
    float *xb;      /* [n][max(D, Q)] */
    float *q;       /* [n][Q] */
    float *k;       /* [n][KV] */
    float *v;       /* [n][KV] */
    float *att_out; /* [n][Q] */
    float *att;     /* [INFER_ATT_ROWS][seq_len] attention scores */
    float *att_dev; /* the same for the device thread's heads (allocated when first split) */
    float *tree;    /* a draft tree's attention scores and values (infer_attn_tree), grown */
    size_t tree_cap; /* floats */
    float *hb;      /* [n][F] */
    float *hb2;     /* [n][F] */
    int8_t *xq;     /* [n][max(D, Q, F)] quantized activations */
    uint32_t *pos;  /* [max_batch] positions of a batch's rows */
    /* what the activation quantizer clipped (only with a linear term) */
    uint32_t *clip_row, *clip_col;
    float *clip_excess;
    size_t clip_cap;
    /* int32 sums of packed matmuls (infer_resident.c), grown as needed */
    int32_t *acc;
    size_t acc_cap;
    /* a packed group's activations past the first linear's (own scales), grown */
    int8_t *xq_group;
    size_t xq_group_cap;
    /* a few rows' int8 activations staged for the GEMM (linear_s8_few), grown */
    void *stage;
    size_t stage_cap;
    /* packed matmuls of a few rows (infer_resident_rows.c): the calling
     * thread's and the device thread's tile scratch, made when first used */
    struct infer_rows_tile *rows_tile[2];
    /* a few rows' activations staged once per packed linear for the AMX
     * tile kernel (unpack_tensor_dot_tiles), shared by both threads, grown */
    void *tiles_stage;
    size_t tiles_stage_cap;
};

/* *buf grown to at least need bytes, 64-byte aligned (its contents not
 * kept; a scratch grown once, not an allocation per call): 0, or -ENOMEM
 * with *buf and *cap as they were. infer_linear.c. */
int infer_reserve_aligned(void **buf, size_t *cap, size_t need);

/* Output channels [r0, r1) of a packed linear (lin->upk) for n activation
 * rows xq [n][cols], into y [n][rows] (y[i * rows + r]): the codes unpacked
 * once per call, a tile at a time, and multiplied by the NPU's GEMM, with
 * the same bits as unpack_tensor_dot's path (infer_resident_rows.c). *t:
 * the caller's tile scratch, made on first use. 0, -ENOMEM, or -ERANGE (a
 * code of -128, which the NPU's layout cannot hold: use the row path). */
struct infer_rows_tile;
int infer_packed_rows(struct infer_rows_tile **t, const struct infer_linear *lin,
                      const int8_t *xq, uint32_t n, float act, float *y, uint32_t r0,
                      uint32_t r1);
void infer_rows_tile_free(struct infer_rows_tile *t);
/* Tests: output channels per tile (a multiple of 16; 0: the default, about
 * 192 KiB of codes), process-wide. A tile set here also makes a few rows
 * take this tile path where unpack_tensor_dot would unpack once for all
 * rows (unpack_dot_multirow), so that both paths are tested there. */
void infer_packed_rows_set_tile(uint32_t channels);
/* From this many rows, a packed linear unpacks its codes once for all rows
 * rather than once per row (infer_packed_rows_take says how). */
#define PACKED_ROWS_MIN 4
/* Whether n activation rows of packed tensor u take infer_packed_rows (n of
 * PACKED_ROWS_MIN or more where unpack_tensor_dot unpacks each row again for
 * every activation row, more than 8 where it does not, or a tile was set
 * above) rather than unpack_tensor_dot. */
int infer_packed_rows_take(const struct unpack_tensor *u, uint32_t n);
/* Whether n activation rows of packed tensor u take unpack_tensor_dot_tiles
 * (AMX: unpacked in registers into tiles, multiplied in L1) rather than
 * either of the above: where it takes u and n is a count it is measured
 * faster at (infer_resident_rows.c), unless a tile was set for the tests. */
int infer_packed_tiles_take(const struct unpack_tensor *u, uint32_t n);

/* The rows of one forward call: n rows at KV slots slot0.., positions
 * pos[n], visibility vis (infer.h struct infer_attn_rows; vis.base =
 * slot0). */
struct infer_rows {
    uint32_t n;
    uint32_t slot0;
    const uint32_t *pos;
    struct infer_attn_rows vis;
};

/* ---- loading ---------------------------------------------------------------------- */

/* Fills a linear from a tensor's bytes (float or quantized). With borrow,
 * F32/F16/BF16 weights are used in place (data must outlive the linear);
 * otherwise they are copied. */
int infer_linear_init(struct infer_linear *lin, const struct format_tensor_info *t,
                      const void *data, int borrow, int force_dynamic_act, struct sl_err *err);
void infer_linear_fini(struct infer_linear *lin);

/* ---- CPU operators (infer_ops.c) ----------------------------------------------------
 * Pure functions of their arguments: safe to call from any thread on
 * disjoint outputs. */

/* out[r] = x[r] / rms(x[r]) * w, for n rows of length d. out may alias x. */
void infer_op_rmsnorm(float *out, const float *x, const float *w, uint32_t n, uint32_t d,
                      float eps);

/* Rotates interleaved pairs (2i, 2i+1) of each head of n rows, row r at
 * position pos0 + r: x is [n][n_heads * head_dim]. The _heads form rotates
 * heads h0..h1-1 only (the same bits as the whole). */
void infer_op_rope_heads(float *x, uint32_t n, uint32_t n_heads, uint32_t head_dim, uint32_t h0,
                         uint32_t h1, uint32_t pos0, float theta);
void infer_op_rope(float *x, uint32_t n, uint32_t n_heads, uint32_t head_dim, uint32_t pos0,
                   float theta);

/* Causal attention of n query rows at positions pos0.. over the cache rows
 * 0..pos0+n-1 of one layer (all of them written before the call), for heads
 * [h0, h1): q [n][Q] (RoPE applied), key/value cache [seq_len][KV], out
 * [n][Q] (only the columns of heads h0..h1-1 written). att is scratch of
 * INFER_ATT_ROWS * (pos0 + n) floats. Rows are processed in blocks of
 * INFER_ATT_ROWS, or a row at a time for a kv group's heads together
 * (INFER_ATT_GROUP_T): scores Q K^T and probabilities times V go through the
 * matmul kernels; a row's result does not depend on n or on the blocking. */
#define INFER_ATT_ROWS 16
/* Grouped-query heads (h0, h1 on kv group bounds, at most INFER_ATT_ROWS
 * query heads a kv head) take their rows one at a time, a group's heads as
 * the rows of one product over exactly the keys the row sees, while a row
 * sees at most this many keys (and always for a single row); the rows past
 * it go in blocks (docs/BENCHMARKS.md, thirteenth session, w22). */
#define INFER_ATT_GROUP_T 768u

/* Rows list[0..len) of src (row stride ld floats) copied to dst as len
 * consecutive rows of hs, with the rows ahead prefetched (scattered keys and
 * values miss the caches). */
void infer_gather_rows(float *dst, const float *src, size_t ld, uint32_t hs,
                       const uint32_t *list, uint32_t len);
/* One query row qh of one head over the key slots list[0..len) (ascending)
 * of kh, vh (row stride kv_dim), into out[hs]: the dense attention's
 * key-selection path (infer_attn.c), whose bits a chain row's blocked
 * kernel gives when the list is every visible slot. a: len floats;
 * gather: len * hs floats. */
void infer_attn_list(float *out, const float *qh, const float *kh, const float *vh, size_t kv_dim,
                     uint32_t hs, const uint32_t *list, uint32_t len, float *a, float *gather);
/* Dense attention of a tree's rows (rows->parent set, no selection) for the
 * query heads [h0, h1), into out [n][Q]: the bits infer_attn_list gives each
 * row over its visible slots (attn_tree.c). Its scores, gathered values,
 * gathered queries (and value sums) and, with the AVX-512 kernel, each kv
 * head's transposed keys go in rows->tree_scratch when that holds
 * infer_attn_tree_floats(c, n, base + n) floats (each head's and kv head's
 * at fixed places, so threads running disjoint kv heads share it), else in
 * memory of its own for the call. 0 or -ENOMEM. */
int infer_attn_tree(const struct format_config *c, const float *kc, const float *vc,
                    const struct infer_attn_rows *rows, const float *q, uint32_t h0, uint32_t h1,
                    float *out);
size_t infer_attn_tree_floats(const struct format_config *c, uint32_t n, uint32_t T);
void infer_op_attention(float *out, const float *q, const float *key_cache,
                        const float *value_cache, uint32_t n, uint32_t pos0,
                        const struct format_config *c, uint32_t h0, uint32_t h1, float *att);

/* h[i] = silu(g[i]) * u[i] for n elements (in place into g allowed). */
void infer_op_swiglu(float *h, const float *g, const float *u, size_t n);

/* x[i] += y[i] */
void infer_op_add(float *x, const float *y, size_t n);

/* y[i][r] = x[i] . W[r] for i < n and output columns r in [r0, r1) (y has
 * row stride rows, so workers can split one matmul by output columns): x
 * [n][cols] float, W [rows][cols] of element type wt (infer_matmul.c:
 * cache-blocked, AVX-512/AVX2/scalar by CPU). */
void infer_op_matmul(float *y, const float *x, const void *w, enum infer_wtype wt, uint32_t n,
                     uint32_t rows, uint32_t cols, uint32_t r0, uint32_t r1);
/* y[n][rows] = x[n][cols] W^T for float32 W. */
void infer_op_matmul_f32(float *y, const float *x, const float *w, uint32_t n, uint32_t rows,
                         uint32_t cols);

/* The int8 path of a linear, all output rows: quantize x [n][cols] per
 * tensor with s (lin->act_scale, or dynamic: max|x| / 127 over all n rows),
 * int32 GEMM on the emulated NPU's kernels (npu.h), dequantize: y[i][r] = s *
 * scale[r] * acc. xq is scratch [n][cols]. The one place the int8 kernels
 * are called from the forward pass. */
void infer_op_linear_int8(float *y, const float *x, const struct infer_linear *lin, uint32_t n,
                          int8_t *xq);


/* Copies embedding rows (dequantized) for n tokens into x[n][D]. */
int infer_op_embed(const struct infer_model *m, const int *tokens, uint32_t n, float *x,
                   struct sl_err *err);


/* Rotates the rows of x [n][n_heads * head_dim], heads [h0, h1), row r at
 * position pos[r] (the same bits as infer_op_rope_heads for consecutive
 * positions). */
void infer_op_rope_rows(float *x, uint32_t n, uint32_t n_heads, uint32_t head_dim, uint32_t h0,
                        uint32_t h1, const uint32_t *pos, float theta);

/* The rotations of n rows at positions pos[r], computed once (exactly as
 * infer_op_rope_heads computes them per call) for a run whose rows are
 * rotated many times (the pipeline: every layer, every kv head's piece).
 * No table (cos NULL) where head_dim / 2 > 512. */
struct infer_rope_table {
    float *cos, *sin; /* [n][half] */
    uint32_t n, half;
};
int infer_rope_table_init(struct infer_rope_table *t, const uint32_t *pos, uint32_t n,
                          uint32_t head_dim, float theta);
void infer_rope_table_fini(struct infer_rope_table *t);
/* infer_op_rope_rows for the table's rows r0..r0+n-1: the same bits */
void infer_op_rope_table(float *x, uint32_t n, uint32_t n_heads, uint32_t head_dim, uint32_t h0,
                         uint32_t h1, const struct infer_rope_table *t, uint32_t r0);

/* ---- the per-operator steps of a layer (infer_steps.c) ----------------------------
 * One definition of each CPU step, used by the batched forward
 * (infer_forward.c) and by the cold-start pipeline's tasks (pipeline*.c),
 * which run them on chunks and on head or column ranges. The int8 matmuls
 * between them are the linear path's (infer_linear_exec, or NPU jobs). */

/* xb = rmsnorm(x) with the layer's attention norm. */
void infer_step_attn_norm(const struct infer_model *m, int layer, float *xb, const float *x,
                          uint32_t n);
/* RoPE on q's query heads and k's heads for KV heads [kv0, kv1), K and V
 * stored in the cache at the rows' slots, then attention of those query
 * heads into out [n][Q]. */
int infer_step_attention(const struct infer_model *m, struct infer_kv *kv,
                         const struct infer_attention *attn, int layer, const struct infer_rows *r,
                         float *q, float *k, const float *v, uint32_t kv0, uint32_t kv1, float *out,
                         float *scratch);
/* x += o (the attention's output projection; o NULL: already added, as the
 * pipeline's fused o projection does); xb = rmsnorm(x) with the FFN norm. */
void infer_step_ffn_norm(const struct infer_model *m, int layer, float *x, const float *o,
                         float *xb, uint32_t n);
/* g = silu(g) * u for columns [f0, f1) of n rows of F. */
void infer_step_swiglu(float *g, const float *u, uint32_t n, uint32_t F, uint32_t f0, uint32_t f1);
/* x += d (the FFN's down projection) for n rows of D. */
void infer_step_residual(float *x, const float *d, uint32_t n, uint32_t D);
/* xb = rmsnorm(x) with the final norm. */
void infer_step_head_norm(const struct infer_model *m, float *xb, const float *x, uint32_t n);

/* One layer over n rows of x [n][D] in place, the steps above in
 * infer_forward's order, with the two places where one sequence and several
 * (infer_multi.c) differ as hooks: a linear over the rows (y from x, s's
 * buffers) and attention (s->q, k, v into s->att_out). */
struct infer_layer_hooks {
    int (*linear)(void *ctx, int layer, uint32_t role, const struct infer_linear *lin, float *y,
                  const float *x, struct sl_err *err);
    int (*attention)(void *ctx, int layer, struct sl_err *err);
    void *ctx;
    /* optional: count linears of the same input x at once (roles[j],
     * lins[j] into ys[j]), as `linear` one after the other would give */
    int (*linears)(void *ctx, int layer, uint32_t count, const uint32_t *roles,
                   const struct infer_linear *const *lins, float *const *ys, const float *x,
                   struct sl_err *err);
};
int infer_layer_run(struct infer_model *m, struct infer_state *s, int layer, float *x,
                    uint32_t n, const struct infer_layer_hooks *h, struct sl_err *err);

/* The linear path: y [n][rows] = x [n][cols] W^T for any linear, float or
 * int8 (quantize, GEMM on the NPU device and the calling thread together
 * when the state has a device and the batch is small, dequantize, the added
 * CPU term of what the quantizer clipped), then the observer. Returns 0 or
 * a negative errno (a refused NPU job, out of memory for the term). */
int infer_linear_exec(const struct infer_model *m, struct infer_state *s, int layer,
                      uint32_t role, const struct infer_linear *lin, float *y, const float *x,
                      uint32_t n, struct sl_err *err);
/* count (at most INFER_PACKED_GROUP_MAX) linears of one input x, as
 * infer_linear_exec one after the other gives them: packed ones of a decode
 * step in one split (infer_linear_packed_group) when no linear term or
 * observer is attached, else one by one. */
int infer_linear_exec_group(const struct infer_model *m, struct infer_state *s, int layer,
                            uint32_t count, const uint32_t *roles,
                            const struct infer_linear *const *lins, float *const *ys,
                            const float *x, uint32_t n, struct sl_err *err);

/* The size of a linear's matmul against the state's npu_min_weights: its
 * weights, times the rows n for a multi-sequence step's state. */
uint64_t infer_split_work(const struct infer_state *s, const struct infer_linear *lin,
                          uint32_t n);

/* y [n][rows] of an int8 linear kept packed (lin->npu NULL, lin->upk set):
 * the int32 sums straight from the packed codes (unpack_tensor_dot), the
 * state's device taking the first npu_share of the output channels as for
 * int8 from 4 rows; for rows of one sequence that a dot kernel or the tile
 * kernel takes (1-3; 4-8 with the multi-row dot kernel where the tile
 * kernel does not take them, i.e. 4-5 on AMX; 6-16 with the tile kernel on
 * AMX; infer_packed_shares) from 2^18 weights, or
 * npu_min_weights if smaller, the device thread and the calling thread take
 * chunks from the two ends of the channels (infer_resident.c), whatever the
 * share; dequantized as npu_linear_s8 does: bit-identical
 * to the int8 path. 0, -ENOMEM or a refused device call. */
int infer_linear_packed(struct infer_state *s, const struct infer_linear *lin, const int8_t *xq,
                        uint32_t n, float act, float *y, struct sl_err *err);

/* Several packed linears of one input in one split (decode: a layer's q, k
 * and v, or gate and up): the device thread and the calling thread take
 * chunks from the two ends of their joint channel range, so they meet once
 * per group; each linear j gets xq[j] quantized with act[j] and writes y[j],
 * the same bits as infer_linear_packed one by one. Every linear must pass
 * infer_packed_shares (else -EINVAL). 0, -EINVAL, -ENOMEM or a refused
 * device call. */
#define INFER_PACKED_GROUP_MAX 3
int infer_packed_shares(const struct infer_state *s, const struct infer_linear *lin, uint32_t n);
/* Tests: channels per chunk of the shared range (0: the default, about
 * 64 KiB of codes), process-wide. */
void infer_packed_shared_set_chunk(uint32_t channels);
int infer_linear_packed_group(struct infer_state *s, uint32_t count,
                              const struct infer_linear *const *lins, const int8_t *const *xq,
                              const float *act, float *const *y, uint32_t n, struct sl_err *err);

/* xq = quantize(x, s) like npu_quantize_act, and every element whose x / s
 * the clip cut off recorded in c (grown as needed): -ENOMEM. */
int infer_quantize_clipped(struct infer_state *st, const float *x, uint32_t n, uint32_t cols,
                           float s, int8_t *xq, struct infer_clipped *c);

/* ---- the session's hooks for speculative decoding (spec_session.c) ---- */

struct infer_sampler *infer_session_sampler(struct infer_session *s);
/* The token infer_session_sample kept, else a new sample. */
int infer_session_take_next(struct infer_session *s, int *token);
/* After a verified round: logits [vocab] of the last committed row become
 * the session's; next >= 0 is kept as the next token (drawn by the
 * acceptance rule), -1 leaves the logits to be sampled; steps tokens were
 * run in secs. */
void infer_session_after_verify(struct infer_session *s, const float *logits, int next,
                                uint32_t steps, double secs, uint64_t npu_jobs);
/* Growable storage of clipped elements. */
struct infer_clipbuf {
    uint32_t *row, *col;
    float *excess;
    size_t cap;
};
/* Every element of x [n][cols] whose x / s the int8 quantizer clips, in
 * row-major order, recorded in c (pointing into b, grown as needed), exactly
 * as infer_quantize_clipped finds them: -ENOMEM. */
/* The offset of the first block of 8 elements of x [len] with one whose
 * x * inv is beyond [-127, 127] (the quantizer's clip), or len rounded down
 * to 8 when none is: how infer_find_clipped skips. The AVX2 kernel equals
 * the scalar one (test_shadow). */
size_t infer_clip_next_scalar(const float *x, size_t len, float inv);
size_t infer_clip_next_avx2(const float *x, size_t len, float inv);
int infer_find_clipped(struct infer_clipbuf *b, const float *x, uint32_t n, uint32_t cols,
                       float s, struct infer_clipped *c);
/* infer_find_clipped's result (the same elements, order and excesses), found
 * from xq, the codes npu_quantize_act(x, n * cols, s) gave: a clipped
 * element's code is -127 or 127, so only those are tested, and the rest is
 * skipped 32 codes a step (a quarter of the floats' bytes, and the codes
 * were read by the matmul just before). */
int infer_find_clipped_q(struct infer_clipbuf *b, const float *x, const int8_t *xq, uint32_t n,
                         uint32_t cols, float s, struct infer_clipped *c);
/* The offset of the first block of 32 codes of xq [len] with a -127 or 127,
 * or len rounded down to 32 when none has one: how infer_find_clipped_q
 * skips. The AVX2 kernel equals the scalar one (test_shadow). */
size_t infer_clip_next_q_scalar(const int8_t *xq, size_t len);
size_t infer_clip_next_q_avx2(const int8_t *xq, size_t len);
void infer_clipbuf_free(struct infer_clipbuf *b);
/* Whether the model's term wants (layer, role). */
int infer_term_wants(const struct infer_model *m, int layer, uint32_t role);
/* The linear of (layer, role); layer -1: the classifier. NULL for others. */
struct infer_linear *infer_model_linear(struct infer_model *m, int layer, uint32_t role);

/* The shadow term's inner loop (infer_shadow.c): acc[i] += e * (float)w[i]
 * for i < n, a multiply then an add per element. The SIMD kernels equal the
 * scalar one bit for bit (test_shadow); infer_shadow_axpy_s8 picks the best
 * (infer_matmul_kernel_used). */
void infer_shadow_axpy_s8_scalar(float *acc, float e, const int8_t *w, uint32_t n);
void infer_shadow_axpy_s8_avx2(float *acc, float e, const int8_t *w, uint32_t n);
void infer_shadow_axpy_s8_avx512(float *acc, float e, const int8_t *w, uint32_t n);
void infer_shadow_axpy_s8(float *acc, float e, const int8_t *w, uint32_t n);
/* Bytes of non-resident weight columns a term call gathers in one pass over
 * the NPU's blocks (default 32 MiB); the rest it reads one column at a time
 * (tests: both paths give the same bits). */
void infer_shadow_set_gather_max(struct infer_shadow *sh, size_t bytes);
/* 1 (the default): the term reads the weights in place, block by block
 * (infer_shadow_cols); 0: it gathers whole columns first, then adds them
 * row by row (the earlier path, kept as the reference: both give the same
 * bits, test_shadow). */
void infer_shadow_set_fused(struct infer_shadow *sh, int on);
/* The term's scratch sets (term_fused): how many were made, and in
 * *pooled (may be NULL) how many no call holds now. At most one per term
 * call running at once; freed by infer_shadow_destroy. */
uint32_t infer_shadow_scratch_sets(struct infer_shadow *sh, uint32_t *pooled);

/* The shadow term's product read in place from the NPU's packed weights
 * (npu_weights_packed), 16 output rows at a time: for each block of 16 rows,
 * every clipped column's 16 codes are read once (one 64-byte line, or the
 * resident hot copy) and multiplied into the block's accumulators of every
 * token row that clipped it; then the token rows' 16 outputs are written.
 * For token t and output o it computes, in float, acc = +0 then
 * acc += ex[j] * (float)W[o][col[d]] for its elements in ascending column
 * order (a multiply then an add), then out[t][o] = acc * (s * scale[o])
 * (store) or out[t][o] += that: the row-by-row term's bits when each token
 * row's elements are in ascending column order. */
struct infer_shadow_cols {
    uint32_t nd;                /* distinct clipped columns */
    const uint32_t *col;        /* [nd] ascending */
    const int8_t *const *hot;   /* [nd] the resident column ([rows] codes) or NULL */
    const uint32_t *start;      /* [nd + 1] column d's elements: [start[d], start[d + 1]) */
    const uint32_t *tok;        /* [elements] token row index, < nt */
    const float *ex;            /* [elements] the clipped excess */
    uint32_t nt;                /* token rows */
    float *const *out;          /* [nt] output rows, [rows] each */
    const int8_t *packed;       /* npu_weights_packed */
    size_t block;               /* its block bytes */
    uint32_t rows;
    uint32_t b0, b1;            /* the blocks of 16 rows computed: [b0, b1) (infer_shadow_cols) */
    const float *scale;         /* [rows] */
    float s;                    /* activation scale */
    int store;
    float *acc;                 /* [nt * 16 * INFER_SHADOW_COLS_GROUP] scratch */
};
#define INFER_SHADOW_COLS_GROUP 4 /* blocks of 16 rows the AVX2 kernel takes at a time */
/* Blocks [b0, b1) of 16 rows (the last one may be partial). */
void infer_shadow_cols_scalar(const struct infer_shadow_cols *k, uint32_t b0, uint32_t b1);
void infer_shadow_cols_avx2(const struct infer_shadow_cols *k);
/* Blocks [k->b0, k->b1), with the best kernel (infer_matmul_kernel_used);
 * the AVX2 kernel computes the same blocks. */
void infer_shadow_cols(const struct infer_shadow_cols *k);

#endif

/* npu.h: the emulated NPU (EdgeFlow 4.3, llm.npu 3.2): its int8 GEMM
 * kernels, prepared weights and the quantized linear, and the device that
 * runs static graphs on its own thread. Used by the runtime's int8 linear and
 * the cold-start pipeline's scheduler (infer/), and by the GEMM benchmark.
 *
 * Three layers:
 *
 * 1. The raw GEMM kernels (benchmarks, tests): int32 results, one kernel and
 *    register tiling chosen by the caller or the best this CPU has.
 *
 *      struct npu_gemm_b *b;
 *      npu_gemm_b_create(wq, n, k, &b);                    // int8 [n][k]
 *      npu_gemm_s8(b, a, m, 0, n, c, n);                    // c[m][n] int32
 *      npu_gemm_b_destroy(b);
 *
 * 2. int8 math on the calling thread. Weights are prepared once
 *    (npu_weights_create, or npu_weights_alloc + npu_weights_fill as rows are
 *    unpacked) into the layout the GEMM kernels want, with the
 *    per-channel correction vpdpbusd needs; activations are quantized per
 *    tensor; y = (act_scale * scale[r]) * (float)acc, in that order, so every
 *    kernel and every path (linear, device, stolen job) gives identical floats.
 *
 *      struct npu_weights *w;
 *      npu_weights_create(q, scale, rows, cols, &w);
 *      float s = npu_act_scale_dynamic(x, m * cols);
 *      npu_quantize_act(x, m * cols, s, xq);
 *      npu_linear_s8(w, xq, m, s, y);           // y[m][rows]
 *
 * 3. The device (EdgeFlow 4.3, llm.npu 3.2): an object with its own worker
 *    thread that executes only prebuilt static graphs, each an int8 x int8 ->
 *    int32 matmul of a fixed shape (m chunk rows, k inputs, n outputs) with a
 *    per-tensor activation scale and per-output-channel weight scales,
 *    dequantized to float. Anything else is refused (negative errno and an
 *    sl_err sentence). Building a graph costs real work (validation, kernel
 *    and register tiling chosen by timing the candidates on the shape, a
 *    self-check against the scalar reference, staging buffers allocated and
 *    touched) and happens once per shape; the graphs of the linear layers are
 *    shared by every chunk of every prompt (chunk-sharing, llm.npu 3.2), so a
 *    prompt of any length runs on a handful of graphs. The last, shorter chunk
 *    of a prompt runs on the same graph with job.rows < m: only its rows are
 *    computed, unless the device was configured with pad_rows (then the zero
 *    rows are computed too and discarded, as a static-shape NPU would).
 *
 *      struct npu_device *dev;
 *      npu_device_create(&dev);
 *      const struct npu_graph *g;
 *      struct npu_graph_desc d = NPU_GRAPH_DESC_INT8(256, 2048, 2048);
 *      npu_graph_build(dev, &d, &g, &err);                  // once per shape
 *      struct npu_job job = {.graph = g, .w = w, .a_type = NPU_DTYPE_INT8,
 *                            .xq = xq, .rows = 200, .act_scale = s, .y = y};
 *      // rows 200 < m: the prompt's last chunk; r0 = r1 = 0: every channel
 *      struct npu_ticket *t;
 *      npu_device_submit(dev, &job, &t, &err);              // queued
 *      int status = npu_ticket_wait(t);                     // 0 when done
 *      npu_device_destroy(dev);
 *
 *    Jobs reach the worker two ways: submitted one at a time by any thread
 *    (npu_device_submit returns at once with a ticket; the caller does other
 *    work, then npu_ticket_wait), or pulled from a scheduler's own priority
 *    queue (npu_device_start / npu_device_join), with npu_job_execute for a
 *    CPU worker that steals from that queue. Statistics (busy, idle, jobs)
 *    give the NPU's bubble rate.
 *
 * Threads: everything here may be called from any thread. Weights and graphs
 * are immutable once prepared/built and may be used by many threads at once
 * (npu_weights_fill on disjoint 16-row-aligned ranges may run concurrently,
 * and must finish before the weights are used).
 */
#ifndef SLUICE_NPU_H
#define SLUICE_NPU_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the int8 GEMM kernels (benchmarks, tests) -------------------------------------
 *
 * C[i][r - r0] = sum_k A[i][k] * B[r][k] for rows r in [r0, r1), int32,
 * bit-exact across kernels and tilings. A: int8 activations [m][k],
 * row-major, |a| <= 127. B: int8 weights [n][k] (|b| <= 127), prepared once
 * by npu_gemm_b_create into the kernels' layout (with the +128 correction of
 * vpdpbusd). */

struct npu_gemm_b;

enum npu_kernel {
    NPU_KERNEL_SCALAR = 0,
    NPU_KERNEL_AVX2,
    NPU_KERNEL_AVX512VNNI,
    NPU_KERNEL_AVXVNNI,
    NPU_KERNEL_AMX, /* AMX tiles (TDPBSSD), where the CPU and the OS allow them */
    NPU_KERNEL_COUNT
};

const char *npu_kernel_name(enum npu_kernel k);
/* 1 if this CPU (and SLUICE_SIMD) allows the kernel. */
int npu_kernel_available(enum npu_kernel k);
/* The fastest kernel this CPU has (for large row counts). */
enum npu_kernel npu_kernel_best(void);
/* The kernel npu_gemm_s8 and the linear path (npu_stage_act,
 * npu_linear_s8_staged) use for m rows: npu_kernel_best, except AMX below
 * NPU_AMX_MIN_ROWS rows, where the AVX-512 VNNI kernel is faster (a tile
 * pass costs 16 rows whatever m is, and a decode step's one-row matmuls ran
 * at 0.6-0.8x of VNNI's tokens/s on AMX). Same results either way (every
 * kernel is bit-exact). */
#define NPU_AMX_MIN_ROWS 4
enum npu_kernel npu_kernel_for_rows(uint32_t m);
/* Register tilings of a kernel (at least 1; the NPU device times them on
 * each graph's shape) and their names, "6x64" = rows x output channels. */
int npu_kernel_tiles(enum npu_kernel k);
const char *npu_kernel_tile_name(enum npu_kernel k, int tile);

/* Returns 0, -EINVAL (a zero dimension, NULL), -ERANGE (a code of -128) or
 * -ENOMEM. */
int npu_gemm_b_create(const int8_t *b, uint32_t n, uint32_t k, struct npu_gemm_b **out);
void npu_gemm_b_destroy(struct npu_gemm_b *b);

/* With the best kernel, or a chosen one and tiling (tests, benchmark; an
 * unavailable kernel falls back to scalar, a tiling out of range to 0).
 * ldc: C's row stride in elements. */
void npu_gemm_s8(const struct npu_gemm_b *b, const int8_t *a, uint32_t m, uint32_t r0, uint32_t r1,
                 int32_t *c, size_t ldc);
void npu_gemm_s8_kernel(enum npu_kernel kern, const struct npu_gemm_b *b, const int8_t *a,
                        uint32_t m, uint32_t r0, uint32_t r1, int32_t *c, size_t ldc);
void npu_gemm_s8_tile(enum npu_kernel kern, int tile, const struct npu_gemm_b *b,
                      const int8_t *a, uint32_t m, uint32_t r0, uint32_t r1, int32_t *c,
                      size_t ldc);

/* Measured peak of the machine's int8 multiply-add units on one core, in
 * GOPS (2 ops per multiply-add), from a register-only loop of the kernel's
 * instruction (TDPBSSD on four tile chains for AMX, vpdpbusd for the VNNI
 * kernels; the AVX2 kernel's fastest step, maddubs/madd/add for codes
 * within +-64), run for about `seconds`.
 * 0 when unavailable. */
double npu_gemm_peak_gops(enum npu_kernel k, double seconds);
/* The highest of those peaks over the kernels this CPU has (each measured
 * for `seconds`), and which kernel has it (*which may be NULL); 0 and
 * scalar when no kernel has a peak loop. */
double npu_gemm_peak_best(double seconds, enum npu_kernel *which);
/* The same for the kernel's tiny step, which the kernel takes on 16-channel
 * blocks whose codes are all within +-16 (AVX2: four maddubs added in int16
 * before one madd); 0 for a kernel without one (scalar, the VNNI kernels). */
double npu_gemm_peak_tiny_gops(enum npu_kernel k, double seconds);
/* How many of the rows (output channels) of int8 codes q[rows][cols] kernel k
 * computes with its tiny step (those of its 16-row blocks with every code
 * within +-16; 0 for a kernel without one). */
uint32_t npu_gemm_tiny_rows(enum npu_kernel k, const int8_t *q, uint32_t rows, uint32_t cols);

/* ---- prepared weights and the quantized linear ---------------------------------- */

struct npu_weights;

/* Copies and prepares int8 codes q[rows][cols] (row r = output channel r,
 * codes in [-127, 127]) and per-row scales (weight = scale[r] * q[r][c]).
 * Returns 0, -EINVAL (zero or too large a dimension, NULL pointers), -ERANGE
 * (a code of -128) or -ENOMEM. The caller keeps q and scale. */
int npu_weights_create(const int8_t *q, const float *scale, uint32_t rows, uint32_t cols,
                       struct npu_weights **out);
/* Incremental preparation, as a tensor is unpacked: allocate, then fill rows
 * [r0, r0 + n) from q [n][cols] and scale [n] (pointers to the range's first
 * row). r0 must be a multiple of 16 and r0 + n a multiple of 16 or rows, so
 * concurrent fills of disjoint ranges never share a 16-channel block; every
 * row must be filled before the weights are used. npu_weights_fill returns 0,
 * -EINVAL (a bad range; nothing written) or -ERANGE (a code of -128: the
 * weights must not be used). */
int npu_weights_alloc(uint32_t rows, uint32_t cols, struct npu_weights **out);
int npu_weights_fill(struct npu_weights *w, uint32_t r0, uint32_t n, const int8_t *q,
                     const float *scale);
void npu_weights_destroy(struct npu_weights *w); /* NULL is fine */
/* Reuses w's memory for a rows x cols matrix: afterwards w is as
 * npu_weights_alloc(rows, cols) leaves one (every row must be filled before
 * use), without fresh memory. Returns 0, -EINVAL (NULL, a zero or too large
 * dimension), -ENOSPC (rows x cols does not fit w's storage) or -ENOMEM (the
 * scales could not grow); w is unchanged on failure. npu_weights_capacity:
 * the bytes of packed storage w's memory holds (npu_weights_storage of the
 * shape it was allocated for). */
int npu_weights_reshape(struct npu_weights *w, uint32_t rows, uint32_t cols);
size_t npu_weights_capacity(const struct npu_weights *w);
uint32_t npu_weights_rows(const struct npu_weights *w);
uint32_t npu_weights_cols(const struct npu_weights *w);
/* Row r's codes (cols bytes, read back from the packed layout) and scale. */
void npu_weights_row(const struct npu_weights *w, uint32_t r, int8_t *out);
float npu_weights_scale(const struct npu_weights *w, uint32_t r);
/* Column c's codes of rows [0, rows) into out[rows] (an input channel, as
 * the shadow outlier term reads it: 16 rows per 64-byte block), and the
 * per-row scales array [rows]. */
void npu_weights_col(const struct npu_weights *w, uint32_t c, int8_t *out);
/* Columns c[0..n) (ascending, below cols) into out[k * rows + r], in one
 * pass over the blocks of 16 rows (each block's lines read once for all
 * the columns: the same bytes as n npu_weights_col calls, far fewer pages
 * and cache misses). */
void npu_weights_gather_cols(const struct npu_weights *w, const uint32_t *c, uint32_t n,
                             int8_t *out);
const float *npu_weights_scales(const struct npu_weights *w);
/* The packed codes, for readers that walk them in place (the shadow term):
 * blocks of 16 rows, *block_bytes each; in block b, column c's codes of rows
 * 16 b + i (i < 16) are at byte (c / 4) * 64 + 4 i + c % 4 (zero past the
 * last row). Read only. */
const int8_t *npu_weights_packed(const struct npu_weights *w, size_t *block_bytes);
/* Bytes of memory the prepared weights hold. */
size_t npu_weights_bytes(const struct npu_weights *w);
/* Bytes of the packed weight storage that npu_weights_fill writes, and
 * faulting in bytes [off, off + len) of it ahead of the fill (contents
 * unchanged, so it may run beside a fill of the same rows): a cold start
 * moves the page faults of fresh memory off its critical path. Returns 0,
 * or -errno where the kernel cannot (MADV_POPULATE_WRITE needs Linux 5.14;
 * nothing is changed then). */
size_t npu_weights_storage(const struct npu_weights *w);
int npu_weights_prefault(struct npu_weights *w, size_t off, size_t len);

/* xq[i] = clamp(rint(x[i] / s), -127, 127) with rint rounding half to even
 * (the default rounding mode; computed as rintf(x[i] * (1 / s))). A NaN x[i]
 * gives 0, +-inf the clamp bound. An s that is not positive and finite (0,
 * negative, NaN, inf) quantizes everything to 0. */
void npu_quantize_act(const float *x, size_t n, float s, int8_t *xq);

/* max|x| / 127 over the finite elements, never below NPU_ACT_SCALE_MIN (so
 * never 0 or NaN; 1 when nothing is finite or everything is 0). */
#define NPU_ACT_SCALE_MIN 1e-30f
float npu_act_scale_dynamic(const float *x, size_t n);

/* y[i * ldy + r] = (act_scale * scale[r]) * (float)acc[i][r] for rows i < m
 * and output channels r in [r0, r1) only, acc[i][r] = sum_c xq[i][c] q[r][c]
 * (int32, exact), xq [m][cols]. So a CPU worker and the NPU can split one
 * matmul, and a layer's matmul can start on the channels already prepared.
 * Uses the best kernel this CPU has (npu_kernel_best). */
void npu_linear_s8_range(const struct npu_weights *w, const int8_t *xq, uint32_t m,
                         float act_scale, float *y, size_t ldy, uint32_t r0, uint32_t r1);

/* The same with the activations staged once for several calls (one linear
 * cut into channel tiles whose weights are refilled in between, each tile's
 * weights of the same cols): npu_stage_bytes(m, cols) bytes, 64-byte
 * aligned, filled by npu_stage_act from xq [m][cols], then any number of
 * npu_linear_s8_staged on weights of that many cols. Same results as
 * npu_linear_s8_range. */
size_t npu_stage_bytes(uint32_t m, uint32_t cols);
void npu_stage_act(const int8_t *xq, uint32_t m, uint32_t cols, void *stage);
void npu_linear_s8_staged(const struct npu_weights *w, const void *stage, uint32_t m,
                          float act_scale, float *y, size_t ldy, uint32_t r0, uint32_t r1);

/* All output channels: y[m][rows]. */
void npu_linear_s8(const struct npu_weights *w, const int8_t *xq, uint32_t m, float act_scale,
                   float *y);

/* ---- the device ------------------------------------------------------------------ */

enum npu_dtype {
    NPU_DTYPE_INT8 = 0,
    NPU_DTYPE_INT32,
    NPU_DTYPE_F16,
    NPU_DTYPE_BF16,
    NPU_DTYPE_F32,
};
const char *npu_dtype_name(enum npu_dtype t);

/* A static graph's shape and element types. The device builds only
 * a_type = w_type = NPU_DTYPE_INT8 with y_type = NPU_DTYPE_F32. */
struct npu_graph_desc {
    uint32_t m;            /* chunk rows (the most rows one job may carry), 1..NPU_GRAPH_MAX_M */
    uint32_t k;            /* input channels, 1..NPU_GRAPH_MAX_K */
    uint32_t n;            /* output channels, 1..NPU_GRAPH_MAX_N */
    enum npu_dtype a_type; /* activations */
    enum npu_dtype w_type; /* weights */
    enum npu_dtype y_type; /* output */
};
#define NPU_GRAPH_MAX_M 8192u
#define NPU_GRAPH_MAX_K (1u << 17) /* 128 * 127 * k must fit an int32 (the correction) */
#define NPU_GRAPH_MAX_N (1u << 20)
#define NPU_GRAPH_DESC_INT8(m_, k_, n_)                                                       \
    ((struct npu_graph_desc){.m = (m_), .k = (k_), .n = (n_), .a_type = NPU_DTYPE_INT8,       \
                             .w_type = NPU_DTYPE_INT8, .y_type = NPU_DTYPE_F32})

struct npu_device_config {
    int kernel;          /* enum npu_kernel to use (one this CPU has), or -1: the best */
    int tile;            /* register tiling index of that kernel, or -1: timed at build
                            (graphs of more rows than the kernel's probe_max_m: tiling 0,
                            untimed; AMX past 16 rows) */
    int pad_rows;        /* 1: a short job computes all m rows of its graph */
    uint32_t max_graphs; /* graphs one device may hold (memory bound) */
};
/* kernel -1, tile -1, pad_rows 0, max_graphs 64. */
void npu_device_config_init(struct npu_device_config *cfg);

struct npu_device;
struct npu_graph;
struct npu_ticket;

/* Starts a device with the default configuration and its worker thread.
 * Returns 0, -ENOMEM or a pthread error (negated). */
int npu_device_create(struct npu_device **out);
/* The same with a configuration (NULL: defaults). -EINVAL when it names a
 * kernel this CPU lacks or a tiling the kernel does not have; err says why. */
int npu_device_create_config(const struct npu_device_config *cfg, struct npu_device **out,
                             struct sl_err *err);

/* Stops the device: the job running finishes; submitted jobs not started
 * are not run but completed with -ECANCELED (their tickets wake up); then
 * the worker is joined and the graphs freed. Tickets stay valid until
 * waited on. A job source (npu_device_start) must have ended first
 * (npu_device_join). No call may use dev or its graphs afterwards, and none
 * may be in progress on another thread. NULL is fine. */
void npu_device_destroy(struct npu_device *dev);

/* The graph for desc: built now on the calling thread when the device has
 * none of this shape, else the one built before (a cheap lookup; graphs are
 * never rebuilt). The graph belongs to the device and lives until
 * npu_device_destroy. Returns 0, -ENOTSUP (types other than int8 x int8 ->
 * f32), -EINVAL (a dimension out of range), -ENOSPC (max_graphs reached),
 * -ENOMEM, or -EIO (the kernel failed its self-check), with a sentence.
 *
 * Graphs are keyed by (m, k, n): one linear's prefill (m = chunk), decode
 * (m = 1) and draft verification (m = 4, 8, 16) graphs are five graphs, and
 * the default max_graphs (64) holds those five for 12 shapes of (k, n). The
 * tiling is timed per m, up to the kernel's probe_max_m rows (AMX: 16; past
 * it tiling 0, untimed) (with fewer rows than a register tile the tilings
 * differ only in panel width, and the best one changes with m), on a probe
 * of m x k x 96 (m <= 16: 192) multiply-adds, so the cost grows with m:
 * measured on an AVX-512 VNNI core for k x n = 2048 x 2048 (5632 x 2048),
 * m = 256 costs 1.4 ms (5-6 ms), m = 1 0.2 ms (0.6 ms), and m = 4, 8 and 16
 * together 1 ms (3 ms). One device lock covers the registry, so a lookup
 * waits while another thread builds: keep the graphs a loop uses. */
int npu_graph_build(struct npu_device *dev, const struct npu_graph_desc *desc,
                    const struct npu_graph **out, struct sl_err *err);
/* npu_graph_build of NPU_GRAPH_DESC_INT8(m, k, n). */
int npu_device_graph(struct npu_device *dev, uint32_t m, uint32_t k, uint32_t n,
                     const struct npu_graph **out, struct sl_err *err);
/* The graph of this int8 shape if it was built, else NULL (never builds). */
const struct npu_graph *npu_graph_find(struct npu_device *dev, uint32_t m, uint32_t k, uint32_t n);

struct npu_graph_info {
    struct npu_graph_desc desc;
    enum npu_kernel kernel;
    int tile;
    const char *tile_name;  /* "6x64": rows x output channels per register tile */
    int tilings_timed;      /* how many tilings the build timed to choose it (0: none) */
    uint64_t build_ns;      /* what building it cost, on the building thread */
    size_t scratch_bytes;   /* staging npu_graph_run needs */
};
void npu_graph_info(const struct npu_graph *g, struct npu_graph_info *info);

/* One matmul job: y[i * ldy + r] = (act_scale * scale[r]) * acc[i][r] for i <
 * rows and r in [r0, r1). The memory xq, w and y point to must stay valid
 * and untouched (y) until the job completes. Zero-initialize, then set the
 * inputs. */
struct npu_job {
    const struct npu_graph *graph;
    const struct npu_weights *w; /* prepared weights of shape [graph n][graph k] */
    enum npu_dtype a_type;       /* element type of xq: must be NPU_DTYPE_INT8 (0) */
    const int8_t *xq;            /* activations [rows][k], row stride k */
    uint32_t rows;               /* 1..graph m (a prompt's last chunk may be shorter) */
    uint32_t r0, r1;             /* output channels [r0, r1); r1 = 0: all (r0 must be 0) */
    float act_scale;             /* positive and finite */
    float *y;                    /* output, row stride ldy */
    size_t ldy;                  /* 0: graph n */
    /* 1: each output is added to what y holds, y = y + (act_scale *
     * scale[r]) * (float)acc, the product rounded, then the sum (the bits of
     * writing the output and adding it to y after: a residual add fused into
     * the output write); not with a_max */
    int add;
    void *user;                  /* the caller's */
    /* 0, or a key from npu_stage_keys naming the job's activations: jobs with
     * one key have the same graph, rows and xq contents (a chunk's input of
     * one linear, cut into channel ranges). Whoever runs them stages the
     * activations into the kernel's layout once and reuses them while its
     * staging holds that key: the device per graph, npu_graph_run_cached per
     * caller's buffer. */
    uint64_t stage_key;
    /* 0, or the bound the caller quantized xq within: 63 or 31 let the AVX2
     * kernel add two or four groups' products in int16 before widening
     * (npu_est_avx2.c; weights within +-64), checked as the activations are
     * staged (a larger code: the usual kernel); the same outputs */
    uint32_t a_max;
    /* filled by whoever runs the job */
    int status;                  /* 0, or the negative errno it was refused with */
    int stolen;                  /* 1 when it ran off the device's worker */
    uint64_t t_start, t_end;     /* sl_now_ns() around the computation */
};

/* The checks the device applies to a job (against job->graph): 0, or -ENOENT
 * (no graph), -EINVAL (missing or mismatched prepared weights, rows out of
 * 1..m, a bad channel range or stride, missing buffers, a bad scale, add
 * with a_max),
 * -ENOTSUP (a non-int8 operand), with a sentence. */
int npu_job_validate(const struct npu_job *job, struct sl_err *err);

/* Checks the job, queues a copy of it for the device's worker and returns
 * at once: the calling thread may compute something else meanwhile. *ticket
 * receives the ticket to wait on; npu_ticket_wait must be called exactly
 * once (it frees the ticket). Jobs submitted by one thread run in the order
 * submitted. Returns 0, or without queueing (and *ticket NULL): the errors of
 * npu_job_validate, -EINVAL (ticket NULL), -ENOENT for a graph of another
 * device, -ESHUTDOWN (device stopping), -ENOMEM; err says which. The job's
 * own status, stolen and times are not filled: the status comes back from
 * npu_ticket_wait. */
int npu_device_submit(struct npu_device *dev, const struct npu_job *job,
                      struct npu_ticket **ticket, struct sl_err *err);

/* Host work on the device's thread: queues fn(ctx) behind the jobs
 * submitted so far (same FIFO, same ticket), for the work the device's
 * thread does beside its static graphs that an int8 graph cannot express:
 * decoding straight from packed weights (infer/), whose codes are unpacked
 * in registers. Counted as busy time and as a job in the statistics.
 * npu_ticket_wait returns fn's return value (or -ECANCELED when the device
 * stopped first). Returns 0, -EINVAL (fn or ticket NULL), -ESHUTDOWN,
 * -ENOMEM. */
typedef int (*npu_call_fn)(void *ctx);
int npu_device_call(struct npu_device *dev, npu_call_fn fn, void *ctx,
                    struct npu_ticket **ticket, struct sl_err *err);

/* Waits until the submitted job has run (status 0) or was cancelled by
 * npu_device_destroy (-ECANCELED), frees the ticket and returns the status.
 * Any thread may wait, once. */
int npu_ticket_wait(struct npu_ticket *t);

/* For work the caller can finish itself (a call whose function takes its
 * pieces from a shared counter): if the device's thread has not taken t
 * yet, removes it from the queue, frees it and returns -ECANCELED (it never
 * runs: a busy machine that has not scheduled the thread costs no wait);
 * else waits and returns as npu_ticket_wait. Called once, instead of
 * npu_ticket_wait. */
int npu_ticket_revoke(struct npu_device *dev, struct npu_ticket *t);

/* Submit and wait: 0, the error of submit, or -ECANCELED. */
int npu_device_run(struct npu_device *dev, const struct npu_job *job, struct sl_err *err);

/* Pull mode, for a scheduler that keeps its own NPU queue (priorities): the
 * worker calls next(ctx) for each job (next may block; NULL ends the pull
 * mode), validates and runs it, sets job->status, t_start, t_end, and calls
 * done(ctx, job) (also for a refused job, with its negative status; the
 * sentence comes from npu_job_validate). next and done run on the worker.
 * Returns 0, -EINVAL (next or done NULL), -EBUSY when a source is already
 * attached, -ESHUTDOWN when the device is stopping.
 *
 * Submitted jobs and a source share the worker: before each call to next
 * the worker runs every job submitted so far, so they run between pulled
 * jobs, ahead of the next one. While next blocks, a submitted job waits for
 * it to return: a thread whose progress the source waits for must not wait
 * on a ticket of the same device meanwhile (it would deadlock), and a
 * source that may block long delays submitted work by as much. */
typedef struct npu_job *(*npu_source_fn)(void *ctx);
typedef void (*npu_done_fn)(void *ctx, struct npu_job *job);
int npu_device_start(struct npu_device *dev, npu_source_fn next, npu_done_fn done, void *ctx);
/* Waits until the pull mode has ended (next returned NULL, its last job done). */
void npu_device_join(struct npu_device *dev);

/* A job's computation on the calling thread (task stealing from a
 * scheduler's own queue), without any device: checks the job as the device
 * does, runs it with its graph's kernel and tiling (bit-identical to the
 * device), sets status, stolen = 1, t_start, t_end; returns the status. The
 * staging is allocated for the call; npu_graph_run takes the caller's. */
int npu_job_execute(struct npu_job *job);
/* The same with scratch: NULL (allocated for the call) or
 * npu_graph_info().scratch_bytes bytes the caller owns (one per thread);
 * err gets the sentence of a refusal. */
int npu_graph_run(const struct npu_graph *g, struct npu_job *job, void *scratch,
                  struct sl_err *err);

/* n fresh staging keys (npu_job.stage_key): [first, first + n), returned;
 * never 0 and never handed out twice in the process. Any thread. */
uint64_t npu_stage_keys(uint64_t n);

/* npu_graph_run with staging kept between calls: scratch (not NULL) of at
 * least npu_graph_info().scratch_bytes holds the staged activations of the
 * job whose key *held names (0: nothing; the caller sets it to 0 with fresh
 * scratch and keeps it with the scratch). A job with a nonzero stage_key
 * equal to *held reuses them instead of staging; afterwards *held is the
 * key of what the scratch holds. Same results as npu_graph_run. */
int npu_graph_run_cached(const struct npu_graph *g, struct npu_job *job, void *scratch,
                         uint64_t *held, struct sl_err *err);

struct npu_device_stats {
    uint64_t start_ns;       /* sl_now_ns() at npu_device_create */
    uint64_t uptime_ns;      /* since then */
    uint64_t busy_ns;        /* the worker computing jobs (including the one now running) */
    uint64_t idle_ns;        /* uptime - busy: the NPU's bubbles */
    uint64_t jobs;           /* run on the device's worker (submitted and pulled) */
    uint64_t jobs_cancelled; /* submitted and dropped by destroy */
    uint64_t jobs_revoked;   /* taken back by npu_ticket_revoke before they ran */
    uint64_t jobs_refused;   /* submissions and pulled jobs refused */
    uint64_t ops;            /* 2 * rows * k * channels of the jobs run on the worker */
    uint64_t graphs_built;
    uint64_t build_ns;       /* all graph builds together */
};
/* A consistent snapshot. Bubble rate over a window: difference two snapshots,
 * idle / (busy + idle). */
void npu_device_stats(struct npu_device *dev, struct npu_device_stats *st);

/* A few rows' int8 linear on row-major weights q [n][k] (per-channel scale
 * [n]), without preparing them (npu_weights_fill): y[i * ldy + r] = (act *
 * scale[r]) * (float)sum_j xq[i][j] q[r][j], for rows i < m and channels r <
 * n: the same floats as npu_linear_s8 on the same weights. The activations
 * xq [m][k] are staged once by npu_rowmajor_stage into stage (at least
 * npu_rowmajor_stage_bytes(m, k) bytes, 64-byte aligned), then any number
 * of calls on weights of k inputs. Only where npu_rowmajor_takes(m, n, k):
 * an AMX CPU, 1 <= m <= NPU_ROWMAJOR_ROWS_MAX, n a multiple of 16, k of 64;
 * else -EINVAL and nothing written (the caller takes another path).
 * npu_linear_s8_rowmajor_ref is the definition, from xq itself (tests). */
#define NPU_ROWMAJOR_ROWS_MAX 16
int npu_rowmajor_takes(uint32_t m, uint32_t n, uint32_t k);
size_t npu_rowmajor_stage_bytes(uint32_t m, uint32_t k);
void npu_rowmajor_stage(const int8_t *xq, uint32_t m, uint32_t k, void *stage);
int npu_linear_s8_rowmajor(const int8_t *q, const float *scale, uint32_t n, uint32_t k,
                           const void *stage, uint32_t m, float act, float *y, size_t ldy);
void npu_linear_s8_rowmajor_ref(const int8_t *q, const float *scale, uint32_t n, uint32_t k,
                                const int8_t *xq, uint32_t m, float act, float *y, size_t ldy);

#ifdef __cplusplus
}
#endif

#endif /* SLUICE_NPU_H */

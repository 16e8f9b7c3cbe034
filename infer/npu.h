/* npu.h: the emulated NPU's int8 math (internal to the infer module).
 *
 * Weights are prepared once (npu_weights_create) into the layout the GEMM
 * kernels want, with the per-channel correction vpdpbusd needs; activations
 * are quantized per tensor; y = act_scale * scale[r] * acc (in that order,
 * so every kernel gives identical floats).
 *
 *   struct npu_weights *w;
 *   npu_weights_create(q, scale, rows, cols, &w);
 *   float s = npu_act_scale_dynamic(x, m * cols);
 *   npu_quantize_act(x, m * cols, s, xq);
 *   npu_linear_s8(w, xq, m, s, y);           // y[m][rows]
 */
#ifndef SLUICE_NPU_H
#define SLUICE_NPU_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"

struct npu_weights;

/* Copies and prepares int8 codes q[rows][cols] (|q| <= 127) and per-row
 * scales. Returns 0, -EINVAL or -ENOMEM. */
int npu_weights_create(const int8_t *q, const float *scale, uint32_t rows, uint32_t cols,
                       struct npu_weights **out);
void npu_weights_destroy(struct npu_weights *w);
uint32_t npu_weights_rows(const struct npu_weights *w);
uint32_t npu_weights_cols(const struct npu_weights *w);

/* xq[i] = clamp(rint(x[i] * (1/s)), -127, 127) (round to nearest even). A
 * non-positive or non-finite s quantizes everything to 0. */
void npu_quantize_act(const float *x, size_t n, float s, int8_t *xq);

/* max|x| / 127, or 1 when x is all zero (never 0, never NaN for finite x). */
float npu_act_scale_dynamic(const float *x, size_t n);

/* y[i][r] = (act_scale * scale[r]) * acc[i][r] for r in [r0, r1), where
 * acc = sum_c xq[i][c] * q[r][c] (int32). ldy is y's row stride. */
void npu_linear_s8_range(const struct npu_weights *w, const int8_t *xq, uint32_t m,
                         float act_scale, float *y, size_t ldy, uint32_t r0, uint32_t r1);

/* All output rows, y[m][rows]. */
void npu_linear_s8(const struct npu_weights *w, const int8_t *xq, uint32_t m, float act_scale,
                   float *y);

/* Incremental preparation (as a layer is unpacked): allocate, then fill rows
 * [r0, r0 + n) from row-major codes, and set the scales. */
int npu_weights_alloc(uint32_t rows, uint32_t cols, struct npu_weights **out);
void npu_weights_fill(struct npu_weights *w, uint32_t r0, uint32_t n, const int8_t *q,
                      const float *scale);
/* Row r's codes (row-major, cols bytes) and scale. */
void npu_weights_row(const struct npu_weights *w, uint32_t r, int8_t *out);
float npu_weights_scale(const struct npu_weights *w, uint32_t r);

/* ---- the emulated NPU device (EdgeFlow 4.3, llm.npu 3.2) -------------------------
 *
 * A device with its own worker thread that executes only prebuilt static
 * graphs: an int8 x int8 -> int32 matmul of a fixed chunk shape (m rows, k
 * inputs, n outputs) with a per-tensor activation scale and per-output-channel
 * weight scales, dequantized to float. A graph is built once per shape (its
 * cost: validating the shape, choosing the kernel and tiling, allocating and
 * touching its staging buffers, a warm-up run) and shared by every chunk and
 * every layer with that shape (chunk-sharing, llm.npu 3.2). A job may fill
 * fewer than m rows (the last chunk of a prompt): the static graph is sized
 * for m, and rows past the job's count are not computed. Anything else (no
 * graph, a shape mismatch, rows > m, an output range outside n) is refused.
 *
 * Jobs come from a source function (the pipeline's NPU queue) or from the
 * device's own FIFO (npu_device_submit). npu_job_execute runs a validated job
 * on the calling thread with the same code: a CPU worker stealing NPU work
 * gets bit-identical results. */

struct npu_graph {
    uint32_t m, k, n;
    int kernel;                /* enum npu_kernel chosen at build time */
    uint64_t build_ns;         /* what building cost */
    int32_t *staging;          /* m x n accumulators, touched at build time */
};

struct npu_job {
    const struct npu_graph *graph;
    const struct npu_weights *w;
    const int8_t *xq;          /* [rows][k] */
    uint32_t rows;             /* <= graph->m */
    float act_scale;
    float *y;                  /* y[i * ldy + r] for r in [r0, r1) */
    size_t ldy;
    uint32_t r0, r1;
    /* filled by the executor */
    int status;
    int stolen;                /* 1 if a CPU worker ran it */
    uint64_t t_start, t_end;
    void *user;                /* the scheduler's */
};

struct npu_device;

struct npu_device_stats {
    uint64_t jobs, graphs_built;
    uint64_t build_ns;         /* total graph building */
    uint64_t busy_ns;          /* executing jobs on the device thread */
    uint64_t start_ns;         /* when the worker started */
};

/* Creates a device (no thread yet: attach a source or submit). */
int npu_device_create(struct npu_device **out);
/* Stops the worker (after the job it is running), frees graphs. NULL ok. */
void npu_device_destroy(struct npu_device *d);

/* Looks up or builds the graph of shape (m, k, n). */
int npu_device_graph(struct npu_device *d, uint32_t m, uint32_t k, uint32_t n,
                     const struct npu_graph **out, struct sl_err *err);

/* -EINVAL with a reason unless the job fits its graph and weights. */
int npu_job_validate(const struct npu_job *j, struct sl_err *err);
/* Validates and runs the job on the calling thread; returns its status. */
int npu_job_execute(struct npu_job *j);

/* Starts the device thread on a job source: next() blocks for the next job
 * (NULL: stop), done() is told of each completion (status in the job). */
typedef struct npu_job *(*npu_source_fn)(void *ctx);
typedef void (*npu_done_fn)(void *ctx, struct npu_job *j);
int npu_device_start(struct npu_device *d, npu_source_fn next, npu_done_fn done, void *ctx);
/* Waits for the device thread to return (after next() returned NULL). */
void npu_device_join(struct npu_device *d);

/* The device's own FIFO: submit and wait (starts the thread on first use). */
int npu_device_run(struct npu_device *d, struct npu_job *j, struct sl_err *err);

void npu_device_stats(const struct npu_device *d, struct npu_device_stats *out);

#endif

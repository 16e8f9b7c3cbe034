/* npu_internal.h: what npu_linear.c, npu_graph.c and npu_device.c share
 * (private to the NPU files). */
#ifndef SLUICE_NPU_INTERNAL_H
#define SLUICE_NPU_INTERNAL_H

#include "npu.h"
#include "npu_gemm_internal.h"

struct npu_weights {
    uint32_t rows, cols;
    uint32_t cap_rows;     /* scale's length (npu_weights_reshape) */
    float *scale;          /* [rows] per-channel dequantization scales */
    struct npu_gemm_b *b;  /* packed codes and the vpdpbusd correction */
};

/* A built graph: immutable after npu_graph_create except the contents of
 * stage, which only the owning device's worker touches. */
struct npu_graph {
    const struct npu_device *dev;  /* owner (for the "graph of another device" check) */
    struct npu_graph_desc desc;
    enum npu_kernel kernel;
    const struct npu_kernel_ops *ops;
    int tile;
    int pad_rows;
    int amx_est;                   /* estimate jobs (npu_job.a_max) run on AMX (npu_est.h) */
    uint32_t k4;
    size_t scratch_bytes;          /* staging for m rows */
    uint8_t *stage;                /* the device worker's staging, touched at build */
    uint64_t *held;                /* the stage_key of the job staged there (0: none) */
    uint64_t build_ns;
    int tilings_timed; /* npu_graph_info */
};

/* Builds a graph for a validated desc (npu_graph.c); the device's registry
 * decides whether one is needed. */
int npu_graph_create(const struct npu_device *dev, const struct npu_device_config *cfg,
                     const struct npu_graph_desc *desc, struct npu_graph **out,
                     struct sl_err *err);
void npu_graph_destroy(struct npu_graph *g);
/* -ENOTSUP / -EINVAL with a sentence when desc is not a buildable graph. */
int npu_graph_desc_check(const struct npu_graph_desc *desc, struct sl_err *err);
/* The job checks of npu_device_submit against graph g. */
int npu_job_check(const struct npu_graph *g, const struct npu_job *job, struct sl_err *err);
/* Runs a checked job on stage (scratch_bytes: the graph's own for the
 * device's worker, the caller's elsewhere); sets t_start and t_end. held
 * (or NULL): the stage_key of what stage holds, reused when the job's key
 * (nonzero) is that one, and updated. */
void npu_graph_exec(const struct npu_graph *g, struct npu_job *job, uint8_t *stage,
                    uint64_t *held);
/* The end of the channel range a checked job computes (r1 = 0 means n). */
static inline uint32_t npu_job_r1(const struct npu_graph *g, const struct npu_job *job)
{
    return job->r1 ? job->r1 : g->desc.n;
}

/* The AMX kernel of npu_linear_s8_rowmajor (npu_rowmajor_amx.c; its
 * contract, with npu_rowmajor_takes true). */
void npu_rowmajor_amx(const int8_t *q, const float *scale, uint32_t n, uint32_t k,
                      const void *stage, uint32_t m, float act, float *y, size_t ldy);

#endif

/* pipeline.h: the cold-start prefill pipeline (EdgeFlow 4.3, Appendix B;
 * llm.npu 3.2, 3.4). Internal to the infer module; the public entry points
 * are in infer.h (infer_pipeline_*). */
#ifndef SLUICE_PIPELINE_H
#define SLUICE_PIPELINE_H

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
    PL_OP_COUNT
};

#endif

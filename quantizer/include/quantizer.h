/*
 * quantizer.h: between the importers (import.h) and the container the
 * runtime reads: packing and quantization of a float container (the worked
 * example opens the quantization section). Library code: no printing;
 * progress goes through the optional callback.
 */
#ifndef SLUICE_QUANTIZER_H
#define SLUICE_QUANTIZER_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "format.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Called after each tensor: bytes of weights done so far, total. */
typedef void (*quantizer_progress_fn)(void *ctx, const char *what, uint64_t done,
                                      uint64_t total);

/* ==== packing ============================================================== */

/* Packs int8 codes q[rows][cols] with per-row widths (1..8; each code inside
 * its width's grid: [-(2^(b-1)-1), 2^(b-1)-1], b = 1: -1 or +1) and per-row
 * scales (finite, >= 0) into the bytes of a packed encoding
 * (FORMAT_ENC_ADAPTIVE, _INT4INT8 or _BITPLANE; docs/FORMAT-packed.md), a
 * tensor that format_packed_parse accepts and the unpack module turns back
 * into exactly q. *out (malloc'ed, the caller frees it) holds *out_len bytes.
 * -EINVAL (err names the row and column) for another encoding, an empty
 * shape, a width outside 1..8, a code off its grid or a bad scale; -ENOMEM. */
int quantizer_pack(uint32_t encoding, const int8_t *q, const uint8_t *widths, const float *scales,
                   uint32_t rows, uint32_t cols, void **out, uint64_t *out_len,
                   struct sl_err *err);
/* The same with block multipliers (header version 2, adaptive only):
 * mult [rows][format_packed_mult_blocks(cols)] in 1..4 (NULL: quantizer_pack);
 * the unpacker gives q * min(m, format_packed_mult_max(width)). */
int quantizer_pack_mult(uint32_t encoding, const int8_t *q, const uint8_t *widths,
                        const float *scales, uint32_t rows, uint32_t cols, const uint8_t *mult,
                        void **out, uint64_t *out_len, struct sl_err *err);

/* ==== quantization (EdgeFlow 4.1) =========================================== */

/*
 *   struct quantizer_calib *cal;
 *   quantizer_calib_create(cfg, 256, &cal);
 *   infer_model_set_observer(m, quantizer_calib_observe, cal); // tools wire it
 *   ... run the float model over the calibration text ...
 *   struct quantizer_opts o = {.method = QUANTIZER_METHOD_EDGEFLOW, .bits = 5.0,
 *                              .alpha = -1, .encoding = FORMAT_ENC_ADAPTIVE};
 *   quantizer_quantize("float.sluice", cal, &o, "q.sluice", &report, &err);
 *
 * Weights: one width 1..8 and one scale per output channel (row), symmetric:
 * for b >= 2 codes on [-(2^(b-1)-1), 2^(b-1)-1] with scale max|w| / (2^(b-1)-1)
 * (or the MSE-best clipped max, QUANTIZER_CLIP_MSE); b = 1 is sign(w) x
 * mean|w| (mean|w| is the L2-optimal scale of a sign quantizer).
 */

/* Relative error of a channel quantized to `bits` (the paper's closed form,
 * EdgeFlow 4.1 / Appendix A): (max|W_i|)^2 / (2^(2 bits) E[W_i^2]); 0 for
 * an all-zero channel. It is a proxy: the exact cosine distance of a b >= 3
 * channel is about c_b times it, c_b = 4^b / (24 (2^(b-1)-1)^2) (0.30 at 3
 * bits, 0.17 at 8), since the paper drops the 1/12 of uniform rounding and
 * uses 2^B levels where the symmetric grid has 2^B - 1. */
double quantizer_re_proxy(double max_abs, double mean_sq, uint32_t bits);
/* The exact cosine distance 1 - cos(W_i, dequant(quant(W_i))) with the
 * max-based scale (quantizer_channel_scale); NAN when out of memory. */
double quantizer_re_exact(const float *w, uint32_t n, uint32_t bits);

/* Scale of a channel: max|w| / (2^(b-1) - 1) for b >= 2, mean|w| for b = 1. */
float quantizer_channel_scale(const float *w, uint32_t n, uint32_t b);
/* Scale minimizing sum (w - scale q(w))^2 over clipped maxima r max|w|,
 * r in {1, 0.95, ..., 0.5} refined by 0.0125 around the best; b = 1: mean|w|. */
float quantizer_channel_scale_mse(const float *w, uint32_t n, uint32_t b);
/* q = clamp(rint(w / scale)) on the b-bit grid; b = 1: +1 for w >= 0, else -1;
 * scale 0: codes 0 (b >= 2). */
void quantizer_channel_quantize(const float *w, uint32_t n, uint32_t b, float scale, int8_t *q);

/* Greedy bit allocation (EdgeFlow Algorithm 1): every channel starts at 1
 * bit; the channel whose next bit buys the largest weighted RE reduction per
 * weight, (re[c*9 + b] - re[c*9 + b + 1]) * weight[c] / cost[c], gets it
 * (ties: the lower channel index), until the budget avg_bits * sum(cost) is
 * spent; a channel whose next bit no longer fits leaves the heap (a cheaper
 * one's may still fit); widths <= 8. re is [n][9] (index 1..8 used); weight
 * NULL = 1; cost NULL = 1. With unit costs and gains that decrease with B
 * (the closed-form RE) the result minimizes sum weight[c] re[c][B_c] exactly;
 * with costs it is the greedy knapsack answer. O(n log n) plus O(log n) per
 * bit. Returns 0, -EINVAL (avg_bits outside [1, 8]) or -ENOMEM. */
int quantizer_allocate(uint32_t n, const double *re, const double *weight, const uint64_t *cost,
                       double avg_bits, uint8_t *widths);

/* Calibration statistics, gathered through the runtime's observer: per
 * linear layer max|x| per input channel (S_I), max|y| per output channel
 * (S_O), and a deterministic reservoir sample of up to sample_rows input rows
 * (for the smoothing search). Memory: sample_rows x (the inputs of Q, O,
 * gate, down per layer, and the classifier) floats (256 rows of llama3-8b:
 * about 0.9 GB). */
struct quantizer_calib;
int quantizer_calib_create(const struct format_config *cfg, uint32_t sample_rows,
                           struct quantizer_calib **out);
void quantizer_calib_destroy(struct quantizer_calib *c);
/* Matches infer_observe_fn; ctx is the quantizer_calib. Calls for other
 * roles are ignored; an allocation failure or an inconsistent shape marks
 * the statistics failed (quantizer_calib_ok). Not thread-safe. */
void quantizer_calib_observe(void *ctx, int layer, uint32_t role, const float *x, uint32_t rows,
                             uint32_t in_cols, const float *y, uint32_t out_cols);
int quantizer_calib_ok(const struct quantizer_calib *c); /* 0 after a failure */
/* Input rows recorded at layer 0 (the calibration tokens). */
uint64_t quantizer_calib_rows(const struct quantizer_calib *c);

enum quantizer_method {
    QUANTIZER_METHOD_EDGEFLOW = 0, /* NPU-aware smoothing + RE greedy allocation */
    QUANTIZER_METHOD_UNIFORM,      /* per-channel INT-b, no smoothing */
    QUANTIZER_METHOD_SMOOTHQUANT,  /* SmoothQuant migration (alpha 0.5), INT-b */
    QUANTIZER_METHOD_CMPQ,         /* RE greedy allocation weighted by S_O^2, no smoothing */
    QUANTIZER_METHOD_COUNT
};
const char *quantizer_method_name(enum quantizer_method m);
int quantizer_method_parse(const char *s, enum quantizer_method *out);

enum quantizer_budget {
    QUANTIZER_BUDGET_TENSOR = 0, /* avg bits per tensor (the paper's) */
    QUANTIZER_BUDGET_GLOBAL = 1, /* avg bits over all quantized weights of the model
                                    (`sluice quantize --budget auto`, its default, writes
                                    both and keeps the one of lower KL on the calibration
                                    text: docs/BENCHMARKS-accuracy.md) */
};

/* Global budget objective: what one channel's RE is worth against another
 * tensor's (docs/BENCHMARKS-accuracy.md). */
enum quantizer_global {
    QUANTIZER_GLOBAL_WEIGHT = 0,  /* sum over weights of their channel's RE (default) */
    QUANTIZER_GLOBAL_TENSOR_MEAN, /* sum over tensors of the tensor's mean RE */
};

enum quantizer_metric {
    QUANTIZER_METRIC_PROXY = 0,  /* the closed form (default) */
    QUANTIZER_METRIC_EXACT,      /* quantize, dequantize, 1 - cos: 8 quantizations per row */
};

enum quantizer_clip {
    QUANTIZER_CLIP_DEFAULT = 0,  /* the measured default: _MSE (docs/BENCHMARKS-accuracy.md) */
    QUANTIZER_CLIP_NONE,         /* scale from max|w| (the paper's quantizer) */
    QUANTIZER_CLIP_MSE,          /* quantizer_channel_scale_mse, for every method alike */
};

struct quantizer_opts {
    enum quantizer_method method;
    double bits;                 /* average bits per weight, 1..8 (integer for uniform/smoothquant) */
    enum quantizer_budget budget;
    enum quantizer_global global;
    enum quantizer_metric metric;
    enum quantizer_clip clip;
    int act_dynamic;             /* 1: no static activation scales (act_scale 0) */
    int uniform_widths;          /* 1: edgeflow/cmpq without the allocation, every channel
                                    at bits (ablation; bits must be an integer) */
    double alpha;                /* < 0: grid search (edgeflow; smoothquant: 0.5); else fixed */
    uint32_t alpha_steps;        /* grid {0, 1/steps, ..., 1}; 0 = 10 */
    int search_in_sample;        /* 1: the search's error on rows that also set its scales;
                                    0: on held-out calibration rows (quantizer_calib.c) */
    int alpha_one_se;            /* 0: the alpha of least search error (default); 1: the
                                    least alpha within one standard error of it
                                    (quantizer_internal.h) */
    uint32_t encoding;           /* FORMAT_ENC_ADAPTIVE (0: adaptive too), _INT4INT8, _BITPLANE */
    int float_out;               /* 1: write the smoothed model unquantized (F32 linear
                                    weights, no activation scales): tests, analysis */
    const char *calib_source;    /* recorded as calib.source; NULL: not recorded */
    const char *budget_select;   /* how the budget was chosen (sluice quantize --budget
                                    auto), recorded as quant.budget_select; NULL: not */
    /* shadow outlier execution (llm.npu 3.3; static scales only): 1 writes a
     * version 2 container whose decoder linears' activation scales cover the
     * shadow_quantile of |x| (after smoothing), with hot channels covering
     * shadow_cover of the calibration outliers, and linears whose importance
     * (max|x| over the bulk scale) is below shadow_min_importance pruned */
    int shadow;
    double shadow_quantile;       /* in (0, 1), e.g. 0.999 */
    double shadow_cover;          /* in (0, 1], e.g. 0.8 */
    double shadow_min_importance; /* >= 0; 0 prunes nothing */
    double shadow_hot_max;        /* hot channels at most this share of a linear's inputs,
                                     in [0, 1] (0: no limit) */
    int gptq;                     /* 1: decoder linears' codes rounded with GPTQ's error
                                     compensation on the calibration rows (same grids) */
    /* experiment (quantizer_wsim.c): a simulated grid for the decoder
     * linears with GPTQ, written as the 8-bit int8 values the NPU would see;
     * the report's sim_bytes is the size the real format would have */
    int block_mult;               /* 1 (with gptq): the decoder linears with calibration
                                     rows get a multiplier 1..4 per block of 32 weights
                                     of a row folded into their int8 values
                                     (quantizer_mult.c; packed header version 2, a
                                     version 3 container; adaptive only) */
    quantizer_progress_fn progress;
    void *progress_ctx;
};

struct quantizer_report {
    uint64_t file_bytes;
    uint64_t weights;            /* quantized weights (linear layers and embedding) */
    uint64_t code_bytes;         /* their packed bytes (codes, widths, scales) */
    uint64_t mult_bytes;         /* of code_bytes: the block multipliers' */
    uint32_t hist[FORMAT_ROLE_COUNT][FORMAT_MAX_BITS + 1]; /* channels per width per role */
    double mean_alpha;           /* mean chosen alpha over smoothing groups (edgeflow) */
    uint32_t alpha_hist[11];     /* groups per alpha decile (round(10 alpha)) */
    uint32_t groups;             /* smoothing groups */
};

/* Quantizes the float container `src` with calibration `calib` (NULL: no
 * smoothing, dynamic activation scales) into `out` (written atomically):
 * linear weights and the embedding packed per the method; norms stay float
 * with the smoothing folded in. Two passes over src, one layer of float
 * weights in memory at a time. Records quant.* and calib.* metadata. */
int quantizer_quantize(const char *src, const struct quantizer_calib *calib,
                       const struct quantizer_opts *opts, const char *out,
                       struct quantizer_report *rep, struct sl_err *err);

#ifdef __cplusplus
}
#endif

#endif /* SLUICE_QUANTIZER_H */

/* tools_calib.h: text to token chunks, and calibration of a float model
 * through the runtime's observer into the quantizer's statistics. */
#ifndef SLUICE_TOOLS_CALIB_H
#define SLUICE_TOOLS_CALIB_H

#include "infer.h"
#include "quantizer.h"
#include "tools_util.h"

/* Reads a UTF-8 text file and tokenizes it as one stream (no BOS). */
int tools_tokenize_file(const struct infer_tokenizer *tk, const char *path, int **ids, uint32_t *n,
                        struct sl_err *err);

/* Runs the float model in `container` over up to max_tokens tokens of the
 * text at `text_path` (NULL: deterministic random tokens), layer by layer
 * (one layer resident at a time), in chunks of at most min(context, 512)
 * tokens that start with BOS, recording statistics for the quantizer
 * (sample_rows input rows per linear kept for the smoothing search).
 * *used and *chunks receive the tokens (BOS included) and chunks run.
 * With ids non-NULL, *ids (malloc'd) and *n_ids receive the tokens as read:
 * the whole text as one stream without BOS, or the random tokens. */
int tools_calibrate(const char *container, const char *text_path, uint32_t max_tokens,
                    uint32_t sample_rows, struct quantizer_calib **out, uint32_t *used,
                    uint32_t *chunks, int **ids, uint32_t *n_ids, struct tools_progress *prog,
                    struct sl_err *err);

/* KL divergence of a model's next-token distributions from a reference's,
 * position by position, in double precision (llama-perplexity
 * --kl-divergence): KL(P_ref || P_model), both perplexities, top-1
 * agreement of the two models' most likely tokens. */
struct tools_kl {
    uint32_t vocab;
    double nll, nll_ref, kl_sum;
    uint64_t scored, agree;
    double *kls; /* every scored position's KL, in order */
    size_t cap;
    double *lp, *lp_ref; /* scratch */
};
struct tools_kl_result {
    double ppl, ppl_ref, kl_mean, kl_se, kl_p99, top1;
    uint64_t tokens;
};
int tools_kl_init(struct tools_kl *a, uint32_t vocab);
/* One position: the model's and the reference's logits, the true next token. */
int tools_kl_add(struct tools_kl *a, const float *lm, const float *lr, int next);
void tools_kl_finish(struct tools_kl *a, struct tools_kl_result *r);
void tools_kl_free(struct tools_kl *a);

/* The reference (float) model's logits over ids[0..min(n, max_tokens)) cut
 * into chunks of ctx = min(context, 512) tokens whose first token is
 * replaced by BOS, for the second half of each chunk: exactly the positions
 * `sluice eval --text` scores. Runs layer by layer (one layer resident). */
struct tools_kl_ref;
int tools_kl_ref_create(const char *ref, const int *ids, uint32_t n, uint32_t max_tokens,
                        struct tools_kl_ref **out, struct tools_progress *prog, struct sl_err *err);
void tools_kl_ref_destroy(struct tools_kl_ref *r);
uint32_t tools_kl_ref_chunks(const struct tools_kl_ref *r);
uint32_t tools_kl_ref_ctx(const struct tools_kl_ref *r);
/* Scores the container `model` against the stored reference (layer by layer):
 * the numbers `sluice eval model --ref REF --text T --max-chunks K` gives. */
int tools_kl_score(const char *model, const struct tools_kl_ref *ref, struct tools_kl_result *res,
                   struct tools_progress *prog, struct sl_err *err);

#endif

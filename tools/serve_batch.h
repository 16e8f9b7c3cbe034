/* serve_batch.h: continuous batching for the server. The sessions that are
 * generating hand each forward step they need (a decode token, or a
 * prompt) to one scheduler, which runs the steps handed in together as one
 * forward pass over all their rows (infer_session_run_multi: the linear
 * layers once over every row, attention per session over its own cache),
 * so 16 clients cost one pass over the weights a token, not 16. Sessions
 * join and leave between steps; a prompt runs in chunks of `chunk` rows
 * (cut where infer_session_prefill cuts it) beside the decode rows of the
 * others. Each session's logits are those it would get alone, bit for bit
 * (infer.h), so batching changes no answer.
 *
 * No thread of its own: a caller that finds a lane free (no step of its
 * running) and no other caller gathering leads the next step on it. It
 * waits until its share of the sessions has handed steps in (of those that
 * joined and are not in a running step: all of them with one lane, half of
 * them with two free lanes, so one half's step runs while the other half
 * sends its tokens and the two cores both work), or SERVE_BATCH_GATHER_US
 * after the oldest was handed in (a client slow to read is not waited for
 * longer), runs the step for everyone it took, and wakes them; a caller
 * whose step was run returns. Lanes run their steps at once on their
 * leaders' threads over the one shared model (disjoint sessions). */
#ifndef SLUICE_SERVE_BATCH_H
#define SLUICE_SERVE_BATCH_H

#include <stdint.h>

#include "common.h"
#include "infer.h"

#define SERVE_BATCH_GATHER_US 2000
#define SERVE_BATCH_MAX_LANES 8

struct serve_batch;

/* parallel: sessions that may hand steps in at once; chunk: prompt rows
 * per step (the sessions' max_batch); lanes: steps that may run at once,
 * on the threads of their leaders (1..SERVE_BATCH_MAX_LANES; each its own
 * scratch); npu_share 0: matmuls on the leading thread alone, else each
 * lane's device thread takes that share. */
int serve_batch_create(struct infer_model *m, uint32_t parallel, uint32_t chunk, uint32_t lanes,
                       double npu_share, struct serve_batch **out, struct sl_err *err);
void serve_batch_destroy(struct serve_batch *b);

/* A session starts or stops generating: the gather waits for the steps of
 * the sessions that joined. */
void serve_batch_join(struct serve_batch *b);
void serve_batch_leave(struct serve_batch *b);

/* Appends tokens[0..n) to s within the coming steps (step 1: a decode
 * token, n = 1; 0: a prompt, any length within the context) and returns
 * once they ran, with s's logits those of the last. 0 or -errno with err
 * filled (then s keeps none of the step's rows: a prompt may have kept its
 * earlier chunks). */
int serve_batch_run(struct serve_batch *b, struct infer_session *s, const int *tokens, uint32_t n,
                    int step, struct sl_err *err);

struct serve_batch_stats {
    uint64_t steps;       /* forward passes run */
    uint64_t rows;        /* rows in them */
    uint64_t multi_steps; /* passes of more than one session */
};
void serve_batch_stats(struct serve_batch *b, struct serve_batch_stats *st);

#endif

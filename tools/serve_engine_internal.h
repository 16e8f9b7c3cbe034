/* serve_engine_internal.h: the engine's state as serve_engine.c (slots,
 * queue, cold start) and serve_gen.c (generation over a slot) share it. */
#ifndef SLUICE_SERVE_ENGINE_INTERNAL_H
#define SLUICE_SERVE_ENGINE_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include "serve_engine.h"

struct serve_slot {
    struct infer_session *s;
    int *hist;       /* the tokens in the session's KV cache */
    uint32_t n_hist;
    int busy;
    int cold_pending; /* the cold start still runs: first_logits are the prompt's */
    int joined;       /* hands its steps to the batch (serve_batch_join) */
    float *first_logits;
};

enum { ENGINE_EMPTY = 0, ENGINE_LOADING, ENGINE_READY };

struct serve_engine {
    struct serve_engine_opts o;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct format_reader *r;
    struct format_config cfg;
    struct infer_tokenizer *tk;
    char *chat_template;
    int opened, state;
    struct serve_slot *slots;
    struct serve_batch *batch; /* continuous batching over the sessions (NULL: each alone) */
    uint32_t n_slots, waiting, active;
    uint64_t bytes_streamed;
    double cold_ttft_s;
    /* the cold start's thread: it hands over the prompt's logits the moment
     * they exist and goes on finishing the model (serve_engine_settle) */
    pthread_t cold_thread;
    int cold_first, cold_done, cold_ret;
    /* a request waits for the cold start's first token: the pipeline's
     * thread holds on in its first-logits callback until the token is taken
     * (first_taken), as `sluice run` prints it there, so the rest of the
     * cold start does not compete with sending it (at most COLD_HOLD_MS) */
    int cold_hold, first_taken;
    struct sl_err cold_err;
    const int *cold_tokens;
    uint32_t cold_n;
    uint64_t cold_t0, cold_t_first;
    struct infer_pipeline_stats cold_pst;
};

/* tokens[0..n) appended to the slot's session: a step of the batch, or on
 * this thread alone. */
int se_engine_run(struct serve_engine *e, struct serve_slot *sl, const int *tokens, uint32_t n,
                  int step, struct sl_err *err);
/* The cold start's first token was taken: its pipeline goes on. */
void se_first_taken(struct serve_engine *e);

#endif

/* serve_engine.h: the server's model, its pool of sessions and the bounded
 * queue in front of it, and generation one token at a time: a client of
 * the session seam (infer.h), shared by `sluice serve` and `sluice chat`.
 *
 * The model is loaded once through the cold-start pipeline
 * (infer_session_cold_start): at start-up with a one-token prompt (BOS), or
 * with --lazy by the first request's own prompt, whose time to first token
 * is then the cold start's. The other sessions (--parallel N in all) are
 * opened on that model (infer_session_create) and share its weights; each
 * has its own KV cache and keeps the tokens it holds, so a request that
 * continues a previous conversation prefills only what is new. Their
 * prompts and decode steps run batched across sessions (serve_batch.h),
 * unless no_batch.
 *
 * Threads: every function may be called from any thread; a slot is used by
 * the thread that acquired it until it releases it. */
#ifndef SLUICE_SERVE_ENGINE_H
#define SLUICE_SERVE_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "infer.h"
#include "serve_req.h"
#include "tools_spec.h"

struct serve_engine_opts {
    const char *path;      /* the .sluice container */
    uint32_t parallel;     /* sessions (>= 1) */
    uint32_t queue;        /* requests that may wait for a session; more get 429 */
    int lazy;              /* 1: nothing read until the first request */
    double npu_share;      /* decode: the NPU thread's share (0: the calling thread only) */
    int no_batch;          /* 1: each session runs its own forward passes (no continuous
                              batching across sessions: serve_batch.h) */
    uint32_t batch_lanes;  /* batched steps that may run at once (0: 1) */
    /* speculative decoding of every reply when spec.on (serve_gen_init):
     * greedy text is the same token for token (a tree's rows equal one-row
     * steps, batched or alone, bit for bit), with sampling the same
     * distribution (the acceptance rule, with the request's sampler); a
     * model with dynamic activation scales decodes plainly (spec_r.off_why).
     * The history options (history_dir) are not used here. */
    struct tools_spec spec;
    struct infer_pipeline_opts pipeline;
};

/* Counters the engine keeps (read with serve_engine_counters). */
struct serve_engine_counters {
    uint32_t active;         /* sessions generating */
    uint32_t sessions;       /* sessions open */
    uint32_t waiting;        /* requests in the queue */
    uint64_t bytes_streamed; /* bytes the cold start read from storage */
    double cold_ttft_s;      /* the cold start's time to first token (0: not yet) */
    int loaded;
    /* continuous batching (serve_batch.h): forward passes, their rows, and
     * the passes that served more than one session */
    uint64_t batch_steps, batch_rows, batch_multi;
};

struct serve_engine;
struct serve_slot;

int serve_engine_create(const struct serve_engine_opts *o, struct serve_engine **out,
                        struct sl_err *err);
void serve_engine_destroy(struct serve_engine *e);

/* The container's config and tokenizer (opened on first use: a few KiB).
 * Returns 0 or -errno with err filled. */
int serve_engine_open(struct serve_engine *e, struct sl_err *err);
const struct format_config *serve_engine_config(const struct serve_engine *e);
const struct infer_tokenizer *serve_engine_tokenizer(const struct serve_engine *e);
/* The GGUF chat template the container kept in its metadata, or NULL. */
const char *serve_engine_chat_template(const struct serve_engine *e);

void serve_engine_counters(struct serve_engine *e, struct serve_engine_counters *c);

/* Returns nonzero when the client is gone (polled while waiting). */
typedef int (*serve_cancel_fn)(void *ctx);

/* Waits for a free session, then makes its context tokens[0..n) with the
 * logits of the last one ready to sample. On the first request of a lazy
 * engine this is the cold start (*cold = 1, *ttft_s its time to the
 * prompt's logits). Returns 0 with *slot; -EBUSY when the queue is full;
 * -ECANCELED when cancel said so while waiting; -EINVAL past the context;
 * else -errno with err filled. */
int serve_engine_acquire(struct serve_engine *e, const int *tokens, uint32_t n,
                         serve_cancel_fn cancel, void *cctx, struct serve_slot **slot, int *cold,
                         double *ttft_s, struct sl_err *err);
void serve_engine_release(struct serve_engine *e, struct serve_slot *slot);

/* A cold start hands its slot over when the prompt's logits exist, before
 * the pipeline has finished (the first token need not wait for it); this
 * waits for the rest (a no-op otherwise) and opens the other sessions.
 * serve_gen_next and serve_engine_release call it. 0 or -errno. */
int serve_engine_settle(struct serve_engine *e, struct serve_slot *slot, struct sl_err *err);
/* The logits the slot's next token is sampled from. */
const float *serve_engine_logits(const struct serve_slot *slot);

/* Generation on an acquired slot, one token per call. */
enum serve_finish { SERVE_MORE = 0, SERVE_STOP, SERVE_LENGTH };

struct serve_gen {
    struct serve_engine *e;
    struct serve_slot *slot;
    struct infer_sampler *sampler;
    float *logits;           /* a copy: the sampler rewrites it */
    uint32_t max_tokens, taken;
    char *const *stop;
    uint32_t n_stop;
    int prev;                /* the token before the next one (for decoding pieces) */
    int pending;             /* the last token taken, run at the next call (-1: none) */
    char *text;              /* the reply so far */
    size_t len, cap, sent;   /* text[0..sent) was handed out by serve_gen_take */
    enum serve_finish finish;
    /* speculative decoding (serve_gen_spec): the pending token is fed back
     * with a draft tree in one forward on this session alone (it leaves the
     * batch: a tree is not a batched step's one row); the drafts accepted
     * and the token after them queue[q_at..q_n) are taken by the next calls,
     * the first q_ran of queue already in the cache */
    const struct tools_spec *spec;
    struct infer_spec *sp;
    struct tools_spec_result spec_r; /* on, off_why and the statistics */
    int queue[INFER_SPEC_MAX_ROWS];
    uint32_t q_n, q_at, q_ran;
    uint32_t ahead;          /* tokens in the cache past where plain decoding would be */
    int pending_ran;         /* the pending token is in the cache already */
};

/* max_tokens: tokens to take at most; prev: the prompt's last token.
 * Speculative when the engine's spec.on. */
int serve_gen_init(struct serve_gen *g, struct serve_engine *e, struct serve_slot *slot,
                   const struct infer_sampler_params *p, uint32_t max_tokens, char *const *stop,
                   uint32_t n_stop, int prev, struct sl_err *err);
/* The statistics so far (r->rounds is not filled). */
void serve_gen_spec_result(const struct serve_gen *g, struct tools_spec_result *r);
/* Runs the previous token (if any), samples the next, appends its text and
 * checks the stops (the token is run at the next call, so its text can be
 * sent first; the last one is never run). Returns 0 (g->finish says whether
 * the reply ended) or -errno with err filled. */
int serve_gen_next(struct serve_gen *g, struct sl_err *err);
/* What may be sent now (everything once finished): text[*from..*from+*n). */
void serve_gen_take(struct serve_gen *g, size_t *from, size_t *n);
void serve_gen_free(struct serve_gen *g);

#endif

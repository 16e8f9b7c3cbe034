/* sluice_run.c: `sluice run MODEL [-p PROMPT] [-n N] ...`: generate text.
 *
 * cmd_run is four steps: parse the options, resolve MODEL to a container
 * (importing other formats to a temporary one), generate, report. The prompt
 * goes through the cold-start pipeline (infer_pipeline_prefill: weights
 * streamed from storage, unpacked and executed layer by layer as they
 * arrive); then, as llama2.c's run.c generate() does, tokens are sampled,
 * printed and fed back one at a time. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "import.h"
#include "infer.h"
#include "sluice.h"
#include "tools_spec.h"
#include "tools_attn.h"
#include "tools_shadow.h"
#include "tools_util.h"

/* --resident's default: auto (infer.h): packed where the model's int8
 * weights are larger than the last-level cache (TinyLlama shape: packed
 * decodes faster and the cold start holds about the packed size), int8
 * where they fit in it (kjv6L: int8 decodes about 8x faster);
 * docs/BENCHMARKS.md, issue 22. */
#define RUN_RESIDENT_DEFAULT "auto"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: sluice run MODEL [-p PROMPT] [-n N] [--temp T] [--top-k K] [--top-p P]\n"
            "                  [--seed S] [--tokenizer FILE] [--json] [pipeline options]\n\n"
            "Generates text: prints the prompt and its continuation to stdout as tokens arrive,\n"
            "and statistics (time to first token from main(), or from the execve when started\n"
            "by `sluice bench coldstart` (SLUICE_EXEC_NS), prefill and decode\n"
            "tokens/s, peak RSS) to stderr; --json prints one JSON object on stdout instead.\n"
            "MODEL is a .sluice container, or a model `sluice import` reads (llama2.c .bin\n"
            "with --tokenizer, GGUF, a safetensors file or directory), imported to a\n"
            "temporary container first ($TMPDIR or /tmp, removed afterwards).\n"
            "  -p PROMPT        prompt text (default: empty, generation starts from BOS)\n"
            "  -n N             tokens to generate after the prompt (default 256; 0: the\n"
            "                   prompt only); generation also stops at the context length\n"
            "                   (said on stderr when -n asks for more) or when the model\n"
            "                   emits BOS or EOS (not printed); with -n 0 or 1 nothing that\n"
            "                   only decoding needs is read, so the process ends at once\n"
            "  --temp T         temperature, 0..1e6, 0 = greedy (default 0)\n"
            "  --top-k K        sample from the K most likely tokens (default 0 = off; K at\n"
            "                   least the vocabulary is off too)\n"
            "  --top-p P        nucleus sampling, 0..1 (default 0.9 when --temp > 0, 0 = off)\n"
            "  --seed S         random seed (default 42); a seed gives the same text\n"
            "  --tokenizer FILE llama2.c tokenizer, for llama2.c and safetensors sources\n"
            "  --json           one JSON object: text, token counts and the statistics\n"
            "The prompt runs through the cold-start pipeline (weights streamed with io_uring,\n"
            "unpacked and executed on the emulated NPU and CPU workers as they arrive):\n"
            "  --policy P       full (default), sequential, layer_overlap, llmnpu,\n"
            "                   sequential_granular (docs/ARCHITECTURE.md)\n"
            "  --load L         stream (io_uring, default), read (read() everything first),\n"
            "                   mmap (mmap with MAP_POPULATE first)\n"
            "  --chunk N        prefill chunk rows, 1..65536 (default 256)\n"
            "  --cpu-workers N  CPU worker threads beside the NPU thread, 1..8 (default:\n"
            "                   one per core the process may run on, at most 8)\n"
            "  --steal-threshold N  full, sequential_granular: an idle CPU worker takes\n"
            "                   the NPU's last task in priority order when its queue holds\n"
            "                   more than N (default 5)\n"
            "  --steal-ahead F  full, sequential_granular: the idle CPU worker also takes\n"
            "                   that task when the NPU's other work (its running task's\n"
            "                   rest and every other queued task, estimated) is at least F\n"
            "                   times the task's own, so it finishes before the NPU would\n"
            "                   have started it (0..1e6, default 1; 0: the threshold rule\n"
            "                   alone); when it would not, the CPU cuts the task's\n"
            "                   channels so both finish together and takes the second part\n"
            "  --no-steal-split never cut a task (ablation)\n"
            "  --steal-top      steal the NPU queue's top task instead (EdgeFlow's rule)\n"
            "  --no-shadow      no shadow outlier execution even where the container has\n"
            "                   it (sluice quantize --shadow; ablation: its bulk activation\n"
            "                   scales then clip)\n"
            "  --no-prefault    full: no prefault thread (it faults the activation memory,\n"
            "                   then the weights' memory in ahead, at idle priority, while\n"
            "                   a CPU worker has nothing else to do)\n"
            "  --hash-step N    packed residency's mapped slices (not --resident int8, not\n"
            "                   slices read with O_DIRECT): N bytes of a slice hashed at a\n"
            "                   time, each piece once its pages are read (N >= 4096, rounded\n"
            "                   up to 4 KiB; default 2 MiB; ablation: a step above the\n"
            "                   largest slice hashes each whole slice after its last byte)\n"
            "  --split N        full, sequential_granular: about N output channels per NPU\n"
            "                   matmul task and per unpacking task (pieces of 16-channel\n"
            "                   blocks; default 512)\n"
            "  --npu-share F    decode: the share of each int8 matmul's output channels the\n"
            "                   NPU device thread computes while the calling thread does the\n"
            "                   rest (0 <= F < 1, default 0.5; 0: the calling thread\n"
            "                   alone; the text is the same for any share); packed\n"
            "                   residency's one-row steps split in chunks as each\n"
            "                   thread is free, whatever F > 0\n"
            "  --resident R     decode weights: int8 (the NPU layout the prefill used),\n"
            "                   packed (the container's packed codes, read in place and\n"
            "                   unpacked in registers per step; the prefill's int8 copies\n"
            "                   come from a bounded pool of recycled memory, so the process\n"
            "                   holds about the packed size), or auto (default): packed\n"
            "                   where the model's int8 weights are larger than this\n"
            "                   machine's last-level cache, int8 where they fit in it (there\n"
            "                   int8 decodes several times faster: docs/BENCHMARKS.md,\n"
            "                   issue 22), and int8 for a container with shadow outlier\n"
            "                   metadata (its term reads weight columns: with packed they\n"
            "                   are decoded from the packed codes, a slower decode); the\n"
            "                   text is the same\n"
            "  --trace FILE     write a Chrome trace (open in Perfetto) of every task\n"
            "  --prompt-tokens N  a synthetic prompt of N tokens (benchmarks) instead of -p;\n"
            "                   at most the context length (said on stderr when more)\n"
            "Attention (prefill and decode; the trace names it):\n" TOOLS_ATTN_HELP);
    tools_spec_usage(f);
    tools_spec_usage_history(f);
}

/* --chunk's limit: a chunk's scratch grows with its rows, and no model here
 * has a context this long */
#define RUN_MAX_CHUNK 65536

struct run_opts {
    const char *model;
    const char *prompt;
    const char *tokenizer;
    uint32_t n_gen;
    int n_set;              /* -n was given: say so when the context cuts it short */
    uint32_t prompt_tokens; /* > 0: a synthetic prompt of this many tokens */
    struct infer_sampler_params sampler;
    struct infer_pipeline_opts pipeline;
    double npu_share; /* decode: the NPU thread's share of each int8 matmul */
    int json;
    struct tools_spec spec;
    struct tools_attn attn;
};

struct run_stats {
    uint32_t prompt_tokens, generated;
    double ttft_s;    /* main() (or the bench's execve) -> first generated token */
    double prefill_s; /* the prompt's forward pass */
    double decode_s;  /* first generated token -> last */
    struct infer_pipeline_stats pipeline;
    struct infer_session_stats session;
    struct tools_spec_result spec;
    struct tools_shadow_snap shadow; /* after the prefill */
};

/* The printed text, kept for --json. */
struct text_buf {
    char *s;
    size_t len, cap;
};

/* 0, 1 for --help (printed), -1 on a usage error (printed). */
static int run_parse(int argc, char **argv, struct run_opts *o)
{
    static const char *const loads[] = {"stream", "read", "mmap"}; /* enum infer_load */
    double temp = 0.0, top_p = -1;
    uint64_t seed = 42;
    int load = INFER_LOAD_STREAM;
    const char *policy;
    *o = (struct run_opts){.prompt = "", .n_gen = 256, .npu_share = 0.5, .attn = TOOLS_ATTN_DEFAULTS};
    infer_pipeline_opts_init(&o->pipeline);
    infer_resident_parse(RUN_RESIDENT_DEFAULT, &o->pipeline.resident);
    struct tools_args a = {"sluice run", usage, argc, argv, 0};
    for (a.i = 1; a.i < argc; a.i++) {
        const char *s = argv[a.i];
        int bad = 0, sp;
        if ((sp = tools_spec_arg_history(&a, s, &o->spec)) != 0) {
            bad = sp < 0;
        } else if (tools_args_help(&a)) {
            return 1;
        } else if (!strcmp(s, "-p")) {
            bad = tools_args_value(&a, &o->prompt);
        } else if (!strcmp(s, "-n")) {
            bad = tools_args_u32(&a, 0, UINT32_MAX, &o->n_gen);
            o->n_set = 1;
        } else if (!strcmp(s, "--temp")) {
            bad = tools_args_double(&a, 0, 1e6, 0, &temp);
        } else if (!strcmp(s, "--top-p")) {
            bad = tools_args_double(&a, 0, 1, 0, &top_p);
        } else if (!strcmp(s, "--top-k")) {
            bad = tools_args_u32(&a, 0, UINT32_MAX, &o->sampler.top_k);
        } else if (!strcmp(s, "--seed")) {
            bad = tools_args_u64(&a, 0, UINT64_MAX, &seed);
        } else if (!strcmp(s, "--tokenizer")) {
            bad = tools_args_value(&a, &o->tokenizer);
        } else if (!strcmp(s, "--json")) {
            o->json = 1;
        } else if (!strcmp(s, "--policy")) {
            bad = tools_args_value(&a, &policy);
            if (!bad && infer_policy_parse(policy, &o->pipeline.policy) < 0) {
                fprintf(stderr, "sluice run: --policy wants full, sequential, layer_overlap, "
                                "llmnpu or sequential_granular, not '%s'\n", policy);
                bad = 1;
            }
        } else if (!strcmp(s, "--load")) {
            bad = tools_args_choice(&a, loads, 3, &load);
            o->pipeline.load = (enum infer_load)load;
        } else if (!strcmp(s, "--chunk")) {
            bad = tools_args_u32(&a, 1, RUN_MAX_CHUNK, &o->pipeline.chunk);
        } else if (!strcmp(s, "--cpu-workers")) {
            bad = tools_args_u32(&a, 1, INFER_PIPELINE_MAX_CPU_WORKERS, &o->pipeline.cpu_workers);
        } else if (!strcmp(s, "--steal-threshold")) {
            bad = tools_args_u32(&a, 0, UINT32_MAX, &o->pipeline.steal_threshold);
        } else if (!strcmp(s, "--steal-ahead")) {
            bad = tools_args_double(&a, 0, 1e6, 0, &o->pipeline.steal_ahead);
        } else if (!strcmp(s, "--no-steal-split")) {
            o->pipeline.no_steal_split = 1;
        } else if (!strcmp(s, "--no-shadow")) {
            o->pipeline.no_shadow = 1;
        } else if (!strcmp(s, "--no-prefault")) {
            o->pipeline.no_prefault = 1;
        } else if (!strcmp(s, "--hash-step")) {
            bad = tools_args_u32(&a, 4096, UINT32_MAX, &o->pipeline.hash_step);
        } else if (!strcmp(s, "--steal-top")) {
            o->pipeline.steal_top = 1;
        } else if (!strcmp(s, "--split")) {
            bad = tools_args_u32(&a, 1, UINT32_MAX, &o->pipeline.split);
        } else if (!strcmp(s, "--npu-share")) {
            bad = tools_args_double(&a, 0, 1, TOOLS_ARGS_BELOW_MAX, &o->npu_share);
        } else if (!strcmp(s, "--resident")) {
            static const char *const res[] = {"int8", "packed", "auto"}; /* enum infer_resident */
            int r = 0;
            bad = tools_args_choice(&a, res, 3, &r);
            o->pipeline.resident = (enum infer_resident)r;
        } else if (!strcmp(s, "--trace")) {
            bad = tools_args_value(&a, &o->pipeline.trace_path);
        } else if (!strcmp(s, "--prompt-tokens")) {
            bad = tools_args_u32(&a, 1, UINT32_MAX, &o->prompt_tokens);
        } else if (!strcmp(s, "--attn") || !strcmp(s, "--keep") || !strcmp(s, "--keep-uniform") ||
                   !strcmp(s, "--keep-floor") || !strcmp(s, "--sinks") || !strcmp(s, "--window") ||
                   !strcmp(s, "--select") || !strcmp(s, "--estimate") || !strcmp(s, "--rows")) {
            bad = tools_attn_arg(&a, &o->attn) < 0;
        } else {
            bad = tools_args_operand(&a, &o->model);
        }
        if (bad)
            return -1;
    }
    if (tools_args_need(&a, o->model, "MODEL") < 0)
        return -1;
    o->pipeline.no_decode = o->n_gen <= 1; /* the first token comes from the prefill */
    o->sampler.temperature = (float)temp;
    o->sampler.top_p = (float)(top_p < 0 ? (temp > 0 ? 0.9 : 0.0) : top_p);
    o->sampler.seed = seed;
    return 0;
}

/* *path = the container to load: MODEL itself, or `tmp` after importing it
 * there (the caller unlinks tmp when tmp[0] is set). */
static int run_resolve_model(const struct run_opts *o, char *tmp, size_t tmp_len, const char **path,
                             struct sl_err *err)
{
    enum import_source kind;
    int ret = import_source_detect(o->model, &kind, err);
    if (ret < 0)
        return ret;
    *path = o->model;
    if (kind == IMPORT_SRC_SLUICE)
        return 0;
    const char *dir = getenv("TMPDIR") && getenv("TMPDIR")[0] ? getenv("TMPDIR") : "/tmp";
    snprintf(tmp, tmp_len, "%s/sluice-run-%d.sluice", dir, (int)getpid());
    struct tools_progress prog;
    tools_progress_init(&prog, "import");
    struct import_opts io = {.tokenizer = o->tokenizer,
                             .dtype = -1,
                             .progress = o->json ? NULL : tools_progress_cb,
                             .progress_ctx = &prog};
    ret = import_model(o->model, &io, tmp, err);
    tools_progress_end(&prog);
    if (ret < 0) {
        tmp[0] = 0; /* the importer leaves nothing behind */
        return ret;
    }
    *path = tmp;
    return 0;
}

static int text_append(struct text_buf *t, const char *s, size_t n)
{
    if (t->len + n + 1 > t->cap) {
        size_t cap = (t->len + n + 1) * 2;
        char *p = realloc(t->s, cap);
        if (!p)
            return -ENOMEM;
        t->s = p;
        t->cap = cap;
    }
    memcpy(t->s + t->len, s, n);
    t->len += n;
    t->s[t->len] = 0;
    return 0;
}

/* Prints (unless json) and keeps the piece of `token` after `prev`, with
 * run.c's rules (leading space after BOS dropped, raw bytes, only printable
 * pieces): to stdout, flushed when `flush` (generated text streams; the
 * prompt's pieces go in one write), and to the text. A write error shows in
 * stdout's error flag, which main checks at the end. */
static int emit_piece(const struct infer_tokenizer *tk, int prev, int token, int json,
                      struct text_buf *text, int flush)
{
    size_t len;
    const char *piece = infer_tokenizer_decode(tk, prev, token, &len);
    if (!infer_piece_printable(piece, len))
        return 0;
    if (!json) {
        fwrite(piece, 1, len, stdout);
        if (flush)
            fflush(stdout);
    }
    return text_append(text, piece, len);
}

static int emit(const struct infer_tokenizer *tk, int prev, int token, int json,
                struct text_buf *text)
{
    return emit_piece(tk, prev, token, json, text, 1);
}

/* The first token is sampled (and printed) the moment the prefill's logits
 * exist, before the pipeline goes on to read what only decoding needs (an
 * untied embedding): that moment is the time to first token. */
struct first_token {
    const struct infer_tokenizer *tk;
    struct text_buf *text;
    int prev, json, stop_a, stop_b;
    int token, sampled, printed, ret;
    uint64_t t;
};

static void on_first_logits(void *ctx, struct infer_session *s)
{
    struct first_token *f = ctx;
    f->ret = infer_session_sample(s, &f->token);
    if (f->ret < 0)
        return;
    f->t = sl_now_ns();
    f->sampled = 1;
    if (f->token != f->stop_a && f->token != f->stop_b) {
        f->ret = emit(f->tk, f->prev, f->token, f->json, f->text);
        f->printed = 1;
    }
}

/* Generation's per-token callback: prints the pieces (the first was printed
 * when it was sampled). */
struct gen_out {
    struct first_token *first;
    int prev, ret;
    uint32_t taken, max; /* max: -n; its last token is not run (nothing reads its logits) */
    uint64_t t_first;
};

static int on_token(void *ctx, int token)
{
    struct gen_out *g = ctx;
    if (g->taken++ == 0) {
        g->t_first = g->first->sampled ? g->first->t : sl_now_ns();
        if (g->first->printed) {
            g->prev = token;
            return g->taken == g->max;
        }
    }
    g->ret = emit(g->first->tk, g->prev, token, g->first->json, g->first->text);
    g->prev = token;
    return g->ret < 0 || g->taken == g->max;
}

static int run_generate(const char *path, const struct run_opts *o, struct text_buf *text,
                        struct run_stats *st, struct sl_err *err)
{
    struct infer_session *sess = NULL;
    struct infer_tokenizer *tk = NULL;
    int *tokens = NULL;
    struct format_reader *r = NULL;
    struct infer_sparse *sparse = NULL;
    int profiled;
    /* opened once: the tokenizer's, then the cold start's (po.reader) */
    int ret = format_reader_open(path, &r, err);
    if (ret < 0 || (ret = tools_attn_create(&o->attn, r, 0, &sparse, &profiled, err)) < 0)
        goto fail;
    struct infer_pipeline_opts po = o->pipeline;
    po.attn = sparse ? infer_sparse_attention(sparse) : NULL;
    po.reader = r;
    struct format_config cfg = *format_reader_config(r);
    const struct format_config *c = &cfg;
    ret = infer_tokenizer_create(format_reader_tokenizer(r), c, &tk, err);
    if (ret < 0)
        goto fail;
    tokens = malloc(sizeof(int) * c->seq_len);
    if (!tokens) {
        ret = -ENOMEM;
        goto fail;
    }
    uint32_t n_prompt;
    if (o->prompt_tokens) { /* a deterministic synthetic prompt */
        n_prompt = o->prompt_tokens < c->seq_len ? o->prompt_tokens : c->seq_len;
        if (n_prompt < o->prompt_tokens)
            fprintf(stderr, "sluice run: --prompt-tokens %u: the context is %u tokens; using %u\n",
                    o->prompt_tokens, c->seq_len, n_prompt);
        tokens[0] = (int)c->bos_id;
        for (uint32_t i = 1; i < n_prompt; i++)
            tokens[i] = 3 + (int)((i * 2654435761u) % (c->vocab_size > 3 ? c->vocab_size - 3 : 1));
        ret = 0;
    } else {
        ret = infer_tokenizer_encode(tk, o->prompt, 1, tokens, c->seq_len, &n_prompt);
    }
    if (ret < 0) {
        if (ret == -ENOSPC)
            sl_err_set(err, "the prompt is %u tokens, longer than the context of %u tokens",
                       n_prompt, c->seq_len);
        else
            sl_err_set(err, "cannot encode the prompt (%s)", strerror(-ret));
        goto fail;
    }
    st->prompt_tokens = n_prompt;
    /* generation takes one token more than the context holds: the last is not run */
    uint32_t room = c->seq_len - n_prompt + 1;
    if (o->n_set && o->n_gen > room)
        fprintf(stderr,
                "sluice run: -n %u: the context of %u tokens leaves room for %u after the "
                "%u-token prompt; generating at most %u\n",
                o->n_gen, c->seq_len, room, n_prompt, room);
    /* the prompt, as run.c prints it: each token's piece after its predecessor */
    for (uint32_t i = 1; i < n_prompt; i++)
        if ((ret = emit_piece(tk, tokens[i - 1], tokens[i], o->json, text, 0)) < 0)
            goto fail;
    /* one write for the whole prompt, not one a piece: before the cold start,
     * each was a system call (and, into a pipe, a wake-up of its reader) */
    if (!o->json)
        fflush(stdout);

    uint64_t t0 = sl_now_ns();
    struct first_token first = {.tk = tk, .text = text, .prev = tokens[n_prompt - 1],
                                .json = o->json, .stop_a = (int)c->bos_id,
                                .stop_b = (int)c->eos_id};
    struct infer_session_opts so = {.max_batch = o->pipeline.chunk ? o->pipeline.chunk : 256,
                                    .sampler = o->sampler,
                                    .npu_share = o->npu_share,
                                    .no_npu = o->npu_share == 0};
    if (o->n_gen > 0) {
        so.first_logits = on_first_logits;
        so.ctx = &first;
    }
    ret = infer_session_cold_start(path, tokens, n_prompt, &so, &po, &sess,
                                   &st->pipeline, err);
    if (ret == 0 && first.ret < 0)
        ret = first.ret;
    if (ret < 0)
        goto fail;
    st->prefill_s = (double)((first.sampled ? first.t : sl_now_ns()) - t0) / 1e9;
    tools_shadow_snap(infer_session_model(sess), &st->shadow);
    /* run.c stops at BOS; EOS ends a sequence too */
    const int stop[2] = {(int)c->bos_id, (int)c->eos_id};
    struct gen_out g = {.first = &first, .prev = tokens[n_prompt - 1], .max = o->n_gen};
    struct tools_spec spec = o->spec;
    spec.trace = o->pipeline.trace_path != NULL;
    ret = tools_spec_generate(&spec, sess, tokens, n_prompt, o->n_gen, stop, 2, on_token, &g,
                              &st->generated, &st->spec, err);
    if (ret == 0 && g.ret < 0)
        ret = g.ret;
    if (ret < 0)
        goto fail;
    uint64_t t_end = sl_now_ns();
    uint64_t t_first = g.taken ? g.t_first : first.sampled ? first.t : 0;
    if (t_first) {
        st->ttft_s = (double)(t_first - sluice_start_ns()) / 1e9;
        st->decode_s = (double)(t_end - t_first) / 1e9;
    }
    infer_session_stats(sess, &st->session);
    if (o->pipeline.trace_path && st->spec.on)
        ret = tools_spec_trace(o->pipeline.trace_path, t0, &st->spec, err);
    else
        ret = 0;
fail:
    if (ret == -ENOMEM && !err->msg[0])
        sl_err_set(err, "out of memory");
    free(tokens);
    infer_tokenizer_destroy(tk);
    infer_session_destroy(sess);
    infer_sparse_destroy(sparse);
    format_reader_close(r);
    return ret;
}

static int run_report(const struct run_opts *o, const struct text_buf *text,
                      const struct run_stats *st)
{
    double prefill_tps = st->prefill_s > 0 ? st->prompt_tokens / st->prefill_s : 0;
    /* the first generated token comes from the prefill; the rest are decode steps */
    double decode_tps =
        st->decode_s > 0 && st->generated > 1 ? (st->generated - 1) / st->decode_s : 0;
    if (!o->json) {
        printf("\n");
        fflush(stdout); /* the text's line ends before the statistics on stderr */
        fprintf(stderr,
                "ttft %.3f s (from process start), prefill %u tokens at %.1f tok/s, decode %u "
                "tokens at %.1f tok/s, peak RSS %.1f MiB\n",
                st->ttft_s, st->prompt_tokens, prefill_tps, st->generated, decode_tps,
                sl_peak_rss_mb());
        tools_spec_print(stderr, &st->spec);
        return 0;
    }
    cJSON *j = cJSON_CreateObject();
    if (!j)
        return -ENOMEM;
    cJSON_AddStringToObject(j, "text", text->s ? text->s : "");
    cJSON_AddNumberToObject(j, "prompt_tokens", st->prompt_tokens);
    cJSON_AddNumberToObject(j, "generated_tokens", st->generated);
    cJSON_AddNumberToObject(j, "ttft_s", st->ttft_s);
    cJSON_AddNumberToObject(j, "prefill_s", st->prefill_s);
    cJSON_AddNumberToObject(j, "prefill_tokens_per_s", prefill_tps);
    cJSON_AddNumberToObject(j, "decode_tokens_per_s", decode_tps);
    cJSON_AddNumberToObject(j, "peak_rss_mb", sl_peak_rss_mb());
    cJSON_AddNumberToObject(j, "decode_npu_jobs", (double)st->session.npu_jobs);
    tools_spec_json(j, &st->spec);
    cJSON_AddStringToObject(j, "attn", tools_attn_name(&o->attn));
    const struct infer_pipeline_stats *ps = &st->pipeline;
    cJSON *pj = cJSON_AddObjectToObject(j, "pipeline");
    cJSON_AddStringToObject(pj, "policy", infer_policy_name(o->pipeline.policy));
    cJSON_AddNumberToObject(pj, "prefill_s", ps->ttft_s);
    cJSON_AddNumberToObject(pj, "load_s", ps->load_s);
    cJSON_AddNumberToObject(pj, "unpack_s", ps->unpack_s);
    cJSON_AddNumberToObject(pj, "prefault_s", ps->prefault_s);
    cJSON_AddNumberToObject(pj, "npu_busy_s", ps->npu_busy_s);
    cJSON_AddNumberToObject(pj, "cpu_busy_s", ps->cpu_busy_s);
    cJSON_AddNumberToObject(pj, "shadow_s", ps->shadow_s);
    tools_shadow_snap_json(&st->shadow, pj); /* the prefill's shadow statistics */
    cJSON_AddNumberToObject(pj, "bubble_npu", ps->bubble_npu);
    cJSON_AddNumberToObject(pj, "bubble_cpu", ps->bubble_cpu);
    cJSON_AddNumberToObject(pj, "stall_s", ps->stall_s);
    cJSON_AddNumberToObject(pj, "idle_npu", ps->idle_npu);
    cJSON_AddNumberToObject(pj, "idle_cpu", ps->idle_cpu);
    cJSON_AddNumberToObject(pj, "graph_build_s", ps->graph_build_s);
    cJSON_AddNumberToObject(pj, "bytes_read", (double)ps->bytes_read);
    cJSON_AddNumberToObject(pj, "tasks", ps->tasks);
    cJSON_AddNumberToObject(pj, "stolen", ps->stolen);
    cJSON_AddNumberToObject(pj, "splits", ps->splits);
    cJSON_AddNumberToObject(pj, "tails", ps->tails);
    cJSON_AddNumberToObject(pj, "int8_pool_mb", (double)ps->int8_pool_bytes / (1 << 20));
    cJSON_AddNumberToObject(pj, "act_sets", ps->act_sets);
    cJSON_AddNumberToObject(pj, "act_mb", (double)ps->act_bytes / (1 << 20));
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!s)
        return -ENOMEM;
    printf("%s\n", s);
    free(s);
    return 0;
}

int cmd_run(int argc, char **argv)
{
    struct run_opts o;
    int ret = run_parse(argc, argv, &o);
    if (ret)
        return ret > 0 ? 0 : 2;
    struct sl_err err = {{0}};
    char tmp[4096] = "";
    const char *path;
    struct text_buf text = {0};
    struct run_stats st = {0};
    ret = run_resolve_model(&o, tmp, sizeof tmp, &path, &err);
    if (ret == 0)
        ret = run_generate(path, &o, &text, &st, &err);
    if (tmp[0])
        unlink(tmp);
    if (ret == 0)
        ret = run_report(&o, &text, &st);
    else if (!o.json && text.len)
        printf("\n"); /* end the partial line */
    free(text.s);
    tools_spec_result_free(&st.spec);
    if (ret < 0) {
        fprintf(stderr, "sluice run: %s\n", err.msg[0] ? err.msg : strerror(-ret));
        return 1;
    }
    /* the text (or the JSON) reached stdout: a full disk or a closed pipe
     * is a failed run, not a silent one */
    if (fflush(stdout) == EOF || ferror(stdout)) {
        fprintf(stderr, "sluice run: cannot write the output to stdout: %s\n",
                errno ? strerror(errno) : "write error");
        return 1;
    }
    return 0;
}

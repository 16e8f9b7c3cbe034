/* sluice_eval.c: `sluice eval MODEL --ref REF --text FILE`: perplexity of both
 * models and the KL divergence of MODEL's next-token distribution from REF's,
 * with llama.cpp's `llama-perplexity --kl-divergence` conventions. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "import.h"
#include "infer.h"
#include "sluice.h"
#include "tools_attn.h"
#include "tools_calib.h"
#include "tools_shadow.h"
#include "tools_util.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: sluice eval MODEL --ref REF --text FILE [--ctx N] [--max-chunks K] [--json]\n"
            "                   [--kl-out FILE] [--tokenizer FILE] [--shadow auto|on|off]\n"
            "                   [attention options]\n\n"
            "Accuracy of MODEL (typically quantized) against REF (typically its float source)\n"
            "on a text, as llama.cpp's llama-perplexity --kl-divergence measures it: the text\n"
            "is tokenized as one stream, cut into chunks of N tokens (default min(context,\n"
            "512)), the first token of each chunk replaced by BOS, and only the second half of\n"
            "each chunk is scored. Reports the perplexity of both, the mean and 99th\n"
            "percentile of KL(P_ref || P_model) per scored token, and how often both models'\n"
            "most likely token agree (top-1). All of it in double precision. --json: one\n"
            "object with ppl, ppl_ref, kl_mean, kl_mean_se (standard error), kl_p99,\n"
            "top1_agreement, tokens, ctx, chunks. Models may also be importable sources\n"
            "(llama2.c .bin with --tokenizer), imported to temporary containers first.\n"
            "--ctx N: at least 4, at most the context length. --max-chunks K evaluates at\n"
            "most the first K chunks (0, the default: all). --kl-out FILE writes the\n"
            "KL divergence of every scored token, one a line in text order (for paired\n"
            "comparisons of two models on the same text).\n"
            "--shadow: MODEL's shadow outlier execution (sluice quantize --shadow): auto\n"
            "(default) where the container has it, on (an error without), off (its bulk\n"
            "activation scales then clip); the report adds its statistics (outlier rate,\n"
            "input rows and weight rows touched; JSON: shadow_*).\n"
            "Attention of MODEL (REF stays dense; MODEL and REF may be the same file):\n"
            TOOLS_ATTN_HELP);
}

static int open_model(const char *path, const char *tokenizer, char *tmp, size_t tmplen,
                      struct infer_model **m, struct sl_err *err)
{
    enum import_source kind;
    int ret = import_source_detect(path, &kind, err);
    if (ret < 0)
        return ret;
    if (kind != IMPORT_SRC_SLUICE) {
        const char *dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
        snprintf(tmp, tmplen, "%s/sluice-eval-%d-%p.sluice", dir, (int)getpid(), (void *)m);
        struct import_opts o = {.tokenizer = tokenizer, .dtype = -1};
        ret = import_model(path, &o, tmp, err);
        if (ret < 0)
            return ret;
        path = tmp;
    }
    return infer_model_load(path, NULL, m, err);
}

int cmd_eval(int argc, char **argv)
{
    const char *model = NULL, *ref = NULL, *text = NULL, *tokenizer = NULL, *kl_out = NULL;
    uint32_t ctx = 0, max_chunks = 0;
    int json = 0, shadow = -1;
    struct tools_attn at = TOOLS_ATTN_DEFAULTS;
    struct infer_sparse *sparse = NULL;
    struct tools_args args = {"sluice eval", usage, argc, argv, 0};
    for (args.i = 1; args.i < argc; args.i++) {
        const char *a = argv[args.i];
        int bad = 0;
        if (tools_args_help(&args)) {
            return 0;
        } else if (!strcmp(a, "--ref")) {
            bad = tools_args_value(&args, &ref);
        } else if (!strcmp(a, "--text")) {
            bad = tools_args_value(&args, &text);
        } else if (!strcmp(a, "--tokenizer")) {
            bad = tools_args_value(&args, &tokenizer);
        } else if (!strcmp(a, "--ctx")) {
            bad = tools_args_u32(&args, 4, UINT32_MAX, &ctx);
        } else if (!strcmp(a, "--max-chunks")) {
            bad = tools_args_u32(&args, 0, UINT32_MAX, &max_chunks);
        } else if (!strcmp(a, "--kl-out")) {
            bad = tools_args_value(&args, &kl_out);
        } else if (!strcmp(a, "--shadow")) {
            const char *v;
            bad = tools_args_value(&args, &v);
            if (!bad && (bad = tools_shadow_parse(v, &shadow) < 0))
                fprintf(stderr, "sluice eval: --shadow wants auto, on or off, not '%s'\n", v);
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--attn") || !strcmp(a, "--keep") || !strcmp(a, "--keep-uniform") ||
                   !strcmp(a, "--keep-floor") || !strcmp(a, "--sinks") || !strcmp(a, "--window") ||
                   !strcmp(a, "--select") || !strcmp(a, "--estimate") || !strcmp(a, "--rows")) {
            bad = tools_attn_arg(&args, &at) < 0;
        } else {
            bad = tools_args_operand(&args, &model);
        }
        if (bad)
            return 2;
    }
    if (!model || !ref || !text) {
        fprintf(stderr, "sluice eval: needs MODEL, --ref REF and --text FILE\n\n");
        usage(stderr);
        return 2;
    }
    struct sl_err err = {{0}};
    char tmp_m[4096] = "", tmp_r[4096] = "";
    struct infer_model *mm = NULL, *mr = NULL;
    struct infer_state *sm = NULL, *sr = NULL;
    struct infer_tokenizer *tk = NULL;
    int *ids = NULL;
    float *lm = NULL, *lr = NULL;
    struct tools_kl acc = {0};
    int status = 1;
    if (open_model(model, tokenizer, tmp_m, sizeof tmp_m, &mm, &err) < 0 ||
        open_model(ref, tokenizer, tmp_r, sizeof tmp_r, &mr, &err) < 0 ||
        tools_shadow_setup(mm, shadow, &err) < 0)
        goto fail;
    const struct format_config *c = infer_model_config(mm), *cr = infer_model_config(mr);
    if (c->vocab_size != cr->vocab_size || c->bos_id != cr->bos_id) {
        sl_err_set(&err, "%s and %s have different vocabularies", model, ref);
        goto fail;
    }
    if (ctx == 0)
        ctx = c->seq_len < 512 ? c->seq_len : 512;
    if (ctx > c->seq_len || ctx > cr->seq_len) {
        sl_err_set(&err, "--ctx %u exceeds the context length (%u)", ctx, c->seq_len);
        goto fail;
    }
    uint32_t n;
    if (infer_tokenizer_create(format_reader_tokenizer(infer_model_reader(mm)), c, &tk, &err) < 0 ||
        tools_tokenize_file(tk, text, &ids, &n, &err) < 0)
        goto fail;
    uint32_t n_chunks = n / ctx;
    if (max_chunks && n_chunks > max_chunks)
        n_chunks = max_chunks;
    if (n_chunks == 0) {
        sl_err_set(&err, "%s: %u tokens, fewer than one chunk of %u", text, n, ctx);
        goto fail;
    }
    uint32_t V = c->vocab_size, first = ctx / 2;
    lm = malloc(sizeof(float) * (size_t)ctx * V);
    lr = malloc(sizeof(float) * (size_t)ctx * V);
    int profiled;
    if (tools_attn_create(&at, infer_model_reader(mm), 1, &sparse, &profiled, &err) < 0)
        goto fail;
    if (sparse && at.sparse == 1 && !profiled && !json && at.floor < 1)
        fprintf(stderr, "sluice eval: %s has no attention profile: every head keeps %g\n", model,
                tools_attn_keep(&at));
    if (!lm || !lr || tools_kl_init(&acc, V) < 0 ||
        infer_state_create(mm, sparse && ctx > 256 ? 256 : ctx, &sm, &err) < 0 ||
        infer_state_create(mr, ctx, &sr, &err) < 0) {
        if (!err.msg[0])
            sl_err_set(&err, "out of memory");
        goto fail;
    }
    if (sparse)
        infer_state_set_attention(sm, infer_sparse_attention(sparse));
    struct tools_progress prog;
    tools_progress_init(&prog, "eval");
    for (uint32_t k = 0; k < n_chunks; k++) {
        int *chunk = ids + (size_t)k * ctx;
        int saved = chunk[0];
        chunk[0] = (int)c->bos_id;
        if (infer_forward(mm, sm, chunk, ctx, 0, lm, INFER_LOGITS_ALL, &err) < 0 ||
            infer_forward(mr, sr, chunk, ctx, 0, lr, INFER_LOGITS_ALL, &err) < 0)
            goto fail;
        for (uint32_t j = first; j + 1 < ctx; j++)
            if (tools_kl_add(&acc, lm + (size_t)j * V, lr + (size_t)j * V, chunk[j + 1]) < 0) {
                sl_err_set(&err, "out of memory");
                goto fail;
            }
        chunk[0] = saved;
        tools_progress_cb(&prog, "chunks", k + 1, n_chunks);
    }
    tools_progress_end(&prog);
    if (kl_out) { /* per-token values in scoring order, for paired comparisons */
        FILE *f = fopen(kl_out, "w");
        int bad = !f;
        for (uint64_t i = 0; !bad && i < acc.scored; i++)
            bad = fprintf(f, "%.17g\n", acc.kls[i]) < 0;
        if (f && fclose(f) != 0)
            bad = 1;
        if (bad) {
            sl_err_set(&err, "%s: cannot write", kl_out);
            goto fail;
        }
    }
    struct tools_kl_result res;
    tools_kl_finish(&acc, &res);
    double ppl = res.ppl, ppl_ref = res.ppl_ref, kl_mean = res.kl_mean, kl_se = res.kl_se;
    double kl_p99 = res.kl_p99, top1 = res.top1;
    uint64_t scored = res.tokens;
    if (json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "ppl", ppl);
        cJSON_AddNumberToObject(o, "ppl_ref", ppl_ref);
        cJSON_AddNumberToObject(o, "kl_mean", kl_mean);
        cJSON_AddNumberToObject(o, "kl_mean_se", kl_se);
        cJSON_AddNumberToObject(o, "kl_p99", kl_p99);
        cJSON_AddNumberToObject(o, "top1_agreement", top1);
        cJSON_AddNumberToObject(o, "tokens", (double)scored);
        cJSON_AddNumberToObject(o, "ctx", ctx);
        cJSON_AddNumberToObject(o, "chunks", n_chunks);
        cJSON_AddStringToObject(o, "attn", sparse ? tools_attn_name(&at) : "dense");
        if (sparse) {
            struct infer_sparse_stats ss;
            infer_sparse_stats(sparse, &ss);
            cJSON_AddNumberToObject(o, "keep", tools_attn_keep(&at));
            cJSON_AddBoolToObject(o, "profiled", profiled);
            cJSON_AddNumberToObject(o, "kept_share",
                                    ss.keys_visible ? (double)ss.keys_kept / ss.keys_visible : 0);
            cJSON_AddNumberToObject(o, "recall", ss.recall);
            cJSON_AddNumberToObject(o, "mass", ss.mass);
        }
        tools_shadow_json(mm, o);
        char *s = cJSON_PrintUnformatted(o);
        printf("%s\n", s);
        free(s);
        cJSON_Delete(o);
    } else {
        printf("%s vs %s on %s: %llu scored tokens (%u chunks of %u)\n", model, ref, text,
               (unsigned long long)scored, n_chunks, ctx);
        printf("perplexity %.4f (ref %.4f)\nKL divergence mean %.6f +- %.6f, p99 %.6f\n"
               "top-1 agreement %.2f%%\n",
               ppl, ppl_ref, kl_mean, kl_se, kl_p99, 100 * top1);
        if (sparse) {
            struct infer_sparse_stats ss;
            infer_sparse_stats(sparse, &ss);
            printf("sparse attention (keep %g, %s): %.2f%% of visible keys kept, top-k recall of "
                   "the int8 estimate %.4f, float attention mass kept %.4f\n",
                   tools_attn_keep(&at), profiled ? "profiled ratios" : "uniform",
                   ss.keys_visible ? 100.0 * (double)ss.keys_kept / ss.keys_visible : 0,
                   ss.recall, ss.mass);
        }
        tools_shadow_print(mm, stdout);
    }
    status = 0;
fail:
    if (status)
        fprintf(stderr, "sluice eval: %s\n", err.msg);
    free(ids);
    free(lm);
    free(lr);
    tools_kl_free(&acc);
    infer_state_destroy(sm);
    infer_sparse_destroy(sparse);
    infer_state_destroy(sr);
    infer_tokenizer_destroy(tk);
    infer_model_destroy(mm);
    infer_model_destroy(mr);
    if (tmp_m[0])
        unlink(tmp_m);
    if (tmp_r[0])
        unlink(tmp_r);
    return status;
}

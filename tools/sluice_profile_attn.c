/* sluice_profile_attn.c: `sluice profile-attn MODEL --text FILE [-o OUT]`:
 * sparse attention's offline profile (shadowAttn 3.2-3.3) into the
 * container's attn.* metadata keys. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format.h"
#include "infer.h"
#include "sluice.h"
#include "tools_calib.h"
#include "tools_rewrite.h"
#include "tools_util.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: sluice profile-attn MODEL --text FILE [-o OUT] [--ctx N] [--max-tokens N]\n"
            "                           [--keep R] [--buckets N] [--step S] [--json]\n\n"
            "Profiles a .sluice container for sparse attention (shadowAttn 3.2-3.3) on\n"
            "calibration text and stores the result in its metadata (attn.* keys,\n"
            "docs/FORMAT.md): per head, the loss increase when the head's attention output is\n"
            "zeroed; per layer, when all its heads are; per head, the mean per-call Q scale\n"
            "(max|q| / 127 over a 256-row prefill call) around which the Q scale buckets are\n"
            "laid (N buckets, a multiplicative step S); per-head keep ratios from one global\n"
            "ratio by the paper's eq. 3; the machine's per-op costs for the pipeline plan.\n"
            "Costs 1 + layers x (heads + 1) forward passes over the calibration tokens.\n"
            "  --text FILE       calibration text (one token stream, cut into chunks)\n"
            "  -o OUT            the container written (default: MODEL, replaced atomically)\n"
            "  --ctx N           tokens per chunk, each starting with BOS (default:\n"
            "                    min(context, 1024))\n"
            "  --max-tokens N    calibration tokens used (default 4096)\n"
            "  --keep R          the global keep ratio of the stored per-head ratios, in\n"
            "                    (0, 1] (default 0.2; `--keep` at run time recomputes them)\n"
            "  --buckets N       Q scale buckets, 1..64 (default 9)\n"
            "  --step S          their multiplicative step, in (0, 1) (default 0.5)\n"
            "  --json            the profile as one JSON object on stdout\n");
}

struct copy_meta {
    struct format_writer *w;
    struct sl_err *err;
};

static int set_meta(void *ctx, const char *key, const void *v, size_t len)
{
    struct copy_meta *c = ctx;
    return format_writer_set_meta(c->w, key, v, len, c->err);
}

/* src's config, tokenizer, metadata (attn.* replaced) and tensors, to dst */
static int write_with_profile(const char *src, const char *dst, const struct infer_attn_profile *p,
                              struct sl_err *err)
{
    struct format_reader *r;
    struct format_writer *w;
    int ret = tools_rewrite_begin(src, dst, "attn.", &r, &w, err);
    if (ret < 0)
        return ret;
    struct copy_meta cm = {w, err};
    ret = infer_attn_profile_write(p, set_meta, &cm);
    for (uint32_t i = 0; ret == 0 && i < format_reader_n_tensors(r); i++)
        ret = tools_rewrite_tensor(r, i, w, err);
    return tools_rewrite_end(r, w, ret, err);
}

static void on_progress(void *ctx, uint32_t done, uint32_t total)
{
    tools_progress_cb(ctx, "forward passes", done, total);
}

static void print_profile(const struct infer_attn_profile *p, int json)
{
    uint32_t L = p->n_layers, H = p->n_heads;
    if (json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "loss", p->loss);
        cJSON_AddNumberToObject(o, "calib_tokens", p->calib_tokens);
        cJSON_AddNumberToObject(o, "keep", p->keep);
        cJSON_AddNumberToObject(o, "buckets", p->buckets);
        cJSON_AddNumberToObject(o, "step", p->step);
        cJSON_AddItemToObject(o, "head_imp", cJSON_CreateFloatArray(p->head_imp, (int)(L * H)));
        cJSON_AddItemToObject(o, "layer_imp", cJSON_CreateFloatArray(p->layer_imp, (int)L));
        cJSON_AddItemToObject(o, "keep_ratio", cJSON_CreateFloatArray(p->keep_ratio, (int)(L * H)));
        cJSON_AddItemToObject(o, "q_scale", cJSON_CreateFloatArray(p->q_scale, (int)(L * H)));
        cJSON_AddItemToObject(o, "k_scale",
                              cJSON_CreateFloatArray(p->k_scale, (int)(L * p->n_kv_heads)));
        float cost[3] = {p->cost_est, p->cost_topk, p->cost_qkv};
        cJSON_AddItemToObject(o, "cost_ns", cJSON_CreateFloatArray(cost, 3));
        char *s = cJSON_PrintUnformatted(o);
        printf("%s\n", s ? s : "{}");
        free(s);
        cJSON_Delete(o);
        return;
    }
    printf("calibration loss %.4f over %u tokens; keep ratios for a global %.2f\n", p->loss,
           p->calib_tokens, (double)p->keep);
    for (uint32_t l = 0; l < L; l++) {
        printf("layer %u: importance %+.4f\n  heads:", l, (double)p->layer_imp[l]);
        for (uint32_t h = 0; h < H; h++)
            printf(" %+.4f", (double)p->head_imp[l * H + h]);
        printf("\n  keep: ");
        for (uint32_t h = 0; h < H; h++)
            printf(" %.3f", (double)p->keep_ratio[l * H + h]);
        printf("\n");
    }
    printf("costs: estimate %.4f ns/MAC, top-k %.3f ns/key, softmax.V %.4f ns/key/dim\n",
           (double)p->cost_est, (double)p->cost_topk, (double)p->cost_qkv);
}

int cmd_profile_attn(int argc, char **argv)
{
    const char *model = NULL, *text = NULL, *outp = NULL;
    struct infer_attn_profile_opts po = {0};
    double keep = 0.2, step = 0.5;
    int json = 0;
    struct tools_args a = {"sluice profile-attn", usage, argc, argv, 0};
    for (a.i = 1; a.i < argc; a.i++) {
        const char *s = argv[a.i];
        int bad = 0;
        if (tools_args_help(&a)) {
            return 0;
        } else if (!strcmp(s, "--text")) {
            bad = tools_args_value(&a, &text);
        } else if (!strcmp(s, "-o")) {
            bad = tools_args_value(&a, &outp);
        } else if (!strcmp(s, "--ctx")) {
            bad = tools_args_u32(&a, 2, UINT32_MAX, &po.chunk_tokens);
        } else if (!strcmp(s, "--max-tokens")) {
            bad = tools_args_u32(&a, 2, UINT32_MAX, &po.max_tokens);
        } else if (!strcmp(s, "--keep")) {
            bad = tools_args_double(&a, 0, 1, TOOLS_ARGS_ABOVE_MIN, &keep);
        } else if (!strcmp(s, "--buckets")) {
            bad = tools_args_u32(&a, 1, 64, &po.buckets);
        } else if (!strcmp(s, "--step")) {
            bad = tools_args_double(&a, 0, 1, TOOLS_ARGS_ABOVE_MIN | TOOLS_ARGS_BELOW_MAX, &step);
        } else if (!strcmp(s, "--json")) {
            json = 1;
        } else {
            bad = tools_args_operand(&a, &model);
        }
        if (bad)
            return 2;
    }
    if (!model || !text) {
        fprintf(stderr, "sluice profile-attn: needs MODEL and --text FILE\n\n");
        usage(stderr);
        return 2;
    }
    po.keep = keep;
    po.step = (float)step;
    struct sl_err err = {{0}};
    struct infer_model *m = NULL;
    struct infer_tokenizer *tk = NULL;
    struct infer_attn_profile *p = NULL;
    int *ids = NULL;
    uint32_t n = 0;
    struct tools_progress prog;
    tools_progress_init(&prog, "profile-attn");
    po.progress = on_progress;
    po.ctx = &prog;
    int ret = infer_model_load(model, NULL, &m, &err);
    if (ret == 0)
        ret = infer_tokenizer_create(format_reader_tokenizer(infer_model_reader(m)),
                                     infer_model_config(m), &tk, &err);
    if (ret == 0)
        ret = tools_tokenize_file(tk, text, &ids, &n, &err);
    if (ret == 0)
        ret = infer_attn_profile_run(m, ids, n, &po, &p, &err);
    tools_progress_end(&prog);
    if (ret == 0)
        ret = write_with_profile(model, outp ? outp : model, p, &err);
    if (ret == 0)
        print_profile(p, json);
    infer_attn_profile_destroy(p);
    free(ids);
    infer_tokenizer_destroy(tk);
    infer_model_destroy(m);
    if (ret < 0) {
        fprintf(stderr, "sluice profile-attn: %s\n", err.msg[0] ? err.msg : strerror(-ret));
        return 1;
    }
    return 0;
}

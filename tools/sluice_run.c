/* sluice_run.c: `sluice run MODEL [-p PROMPT] [-n N] ...`: generate text. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "infer.h"
#include "quantizer.h"
#include "sluice.h"
#include "tools_util.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: sluice run MODEL [-p PROMPT] [-n N] [--temp T] [--top-k K] [--top-p P]\n"
            "                  [--seed S] [--tokenizer FILE] [--json]\n\n"
            "Generates text: prints the prompt and its continuation to stdout as tokens arrive,\n"
            "and statistics (time to first token from process start, prefill and decode\n"
            "tokens/s, peak RSS) to stderr; --json prints one JSON object instead.\n"
            "MODEL is a .sluice container, or a model `sluice import` reads (llama2.c with\n"
            "--tokenizer, GGUF, safetensors), imported to a temporary container first.\n"
            "  -p PROMPT   prompt text (default: empty, generation starts from BOS)\n"
            "  -n N        tokens to generate after the prompt (default 256; stops earlier at\n"
            "              the context length or when the model emits BOS or EOS)\n"
            "  --temp T    temperature, 0 = greedy (default 0)\n"
            "  --top-k K   sample from the K most likely tokens (default 0 = off)\n"
            "  --top-p P   nucleus sampling (default 0.9 when --temp > 0, 0 = off)\n"
            "  --seed S    random seed (default 42)\n");
}

static uint64_t g_start_ns;

__attribute__((constructor)) static void record_start(void)
{
    g_start_ns = sl_now_ns();
}

int cmd_run(int argc, char **argv)
{
    const char *model = NULL, *prompt = "", *tokenizer = NULL;
    uint32_t n_gen = 256;
    double temp = 0.0, top_p = -1;
    uint32_t top_k = 0;
    uint64_t seed = 42;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int bad = 0;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-p") && i + 1 < argc) {
            prompt = argv[++i];
        } else if (!strcmp(a, "-n") && i + 1 < argc) {
            bad = tools_parse_u32(argv[++i], &n_gen);
        } else if (!strcmp(a, "--temp") && i + 1 < argc) {
            bad = tools_parse_double(argv[++i], &temp) || temp < 0;
        } else if (!strcmp(a, "--top-p") && i + 1 < argc) {
            bad = tools_parse_double(argv[++i], &top_p) || top_p < 0 || top_p > 1;
        } else if (!strcmp(a, "--top-k") && i + 1 < argc) {
            bad = tools_parse_u32(argv[++i], &top_k);
        } else if (!strcmp(a, "--seed") && i + 1 < argc) {
            bad = tools_parse_u64(argv[++i], &seed);
        } else if (!strcmp(a, "--tokenizer") && i + 1 < argc) {
            tokenizer = argv[++i];
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (a[0] == '-' || model) {
            usage(stderr);
            return 2;
        } else {
            model = a;
        }
        if (bad) {
            fprintf(stderr, "sluice run: bad value for %s: '%s'\n", a, argv[i]);
            return 2;
        }
    }
    if (!model) {
        usage(stderr);
        return 2;
    }
    if (top_p < 0)
        top_p = temp > 0 ? 0.9 : 0.0;

    struct sl_err err = {{0}};
    int status = 1;
    char tmp[4096] = "";
    enum quantizer_source kind;
    if (quantizer_source_detect(model, &kind, &err) < 0) {
        fprintf(stderr, "sluice run: %s\n", err.msg);
        return 1;
    }
    if (kind != QUANTIZER_SRC_SLUICE) {
        const char *dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
        snprintf(tmp, sizeof tmp, "%s/sluice-run-%d.sluice", dir, (int)getpid());
        struct quantizer_import_opts o = {.tokenizer = tokenizer, .dtype = -1};
        if (quantizer_import(model, &o, tmp, &err) < 0) {
            fprintf(stderr, "sluice run: %s\n", err.msg);
            return 1;
        }
        model = tmp;
    }

    struct infer_model *m = NULL;
    struct infer_state *st = NULL;
    struct infer_tokenizer *tk = NULL;
    struct infer_sampler *sampler = NULL;
    int *tokens = NULL;
    float *logits = NULL;
    char *text = NULL;
    size_t text_len = 0, text_cap = 0;
    if (infer_model_load(model, NULL, &m, &err) < 0)
        goto fail;
    const struct format_config *c = infer_model_config(m);
    if (infer_state_create(m, 256, &st, &err) < 0 ||
        infer_tokenizer_create(format_reader_tokenizer(infer_model_reader(m)), c, &tk, &err) < 0)
        goto fail;
    struct infer_sampler_params sp = {(float)temp, (float)top_p, top_k, seed};
    tokens = malloc(sizeof(int) * (c->seq_len + strlen(prompt) + 8));
    logits = malloc(sizeof(float) * c->vocab_size);
    if (!tokens || !logits || infer_sampler_create(c->vocab_size, &sp, &sampler) < 0) {
        sl_err_set(&err, "out of memory");
        goto fail;
    }
    uint32_t n_prompt;
    if (infer_tokenizer_encode(tk, prompt, 1, tokens, c->seq_len, &n_prompt) < 0) {
        sl_err_set(&err, "the prompt is longer than the context of %u tokens", c->seq_len);
        goto fail;
    }
    /* print the prompt as run.c does: each token's piece after its predecessor */
    for (uint32_t i = 1; i < n_prompt; i++) {
        size_t len;
        const char *piece = infer_tokenizer_decode(tk, tokens[i - 1], tokens[i], &len);
        if (infer_piece_printable(piece, len)) {
            if (!json) {
                fwrite(piece, 1, len, stdout);
            }
            if (text_len + len + 1 > text_cap) {
                text_cap = (text_len + len + 1) * 2;
                text = realloc(text, text_cap);
            }
            memcpy(text + text_len, piece, len);
            text_len += len;
        }
    }
    if (!json)
        fflush(stdout);
    uint64_t t0 = sl_now_ns();
    if (infer_forward(m, st, tokens, n_prompt, 0, logits, INFER_LOGITS_LAST, &err) < 0)
        goto fail;
    uint64_t t_first = 0, t_prefill = sl_now_ns();
    uint32_t pos = n_prompt, generated = 0;
    int prev = tokens[n_prompt - 1];
    while (generated < n_gen) {
        int next = infer_sampler_sample(sampler, logits);
        if (generated == 0)
            t_first = sl_now_ns();
        generated++;
        if ((uint32_t)next == c->bos_id || (uint32_t)next == c->eos_id)
            break;
        size_t len;
        const char *piece = infer_tokenizer_decode(tk, prev, next, &len);
        if (infer_piece_printable(piece, len)) {
            if (!json) {
                fwrite(piece, 1, len, stdout);
                fflush(stdout);
            }
            if (text_len + len + 1 > text_cap) {
                text_cap = (text_len + len + 1) * 2;
                text = realloc(text, text_cap);
            }
            memcpy(text + text_len, piece, len);
            text_len += len;
        }
        prev = next;
        if (pos >= c->seq_len)
            break;
        if (infer_forward(m, st, &next, 1, pos, logits, INFER_LOGITS_LAST, &err) < 0)
            goto fail;
        pos++;
    }
    uint64_t t_end = sl_now_ns();
    double ttft = t_first ? (double)(t_first - g_start_ns) / 1e9 : 0;
    double prefill_s = (double)(t_prefill - t0) / 1e9;
    double decode_s = (double)(t_end - (t_first ? t_first : t_end)) / 1e9;
    double prefill_tps = prefill_s > 0 ? n_prompt / prefill_s : 0;
    double decode_tps = decode_s > 0 && generated > 1 ? (generated - 1) / decode_s : 0;
    if (json) {
        cJSON *o = cJSON_CreateObject();
        if (text)
            text[text_len] = 0;
        cJSON_AddStringToObject(o, "text", text ? text : "");
        cJSON_AddNumberToObject(o, "prompt_tokens", n_prompt);
        cJSON_AddNumberToObject(o, "generated_tokens", generated);
        cJSON_AddNumberToObject(o, "ttft_s", ttft);
        cJSON_AddNumberToObject(o, "prefill_tokens_per_s", prefill_tps);
        cJSON_AddNumberToObject(o, "decode_tokens_per_s", decode_tps);
        cJSON_AddNumberToObject(o, "peak_rss_mb", sl_peak_rss_mb());
        char *s = cJSON_PrintUnformatted(o);
        printf("%s\n", s);
        free(s);
        cJSON_Delete(o);
    } else {
        printf("\n");
        fprintf(stderr,
                "ttft %.3f s (from process start), prefill %u tokens at %.1f tok/s, decode %u "
                "tokens at %.1f tok/s, peak RSS %.1f MiB\n",
                ttft, n_prompt, prefill_tps, generated, decode_tps, sl_peak_rss_mb());
    }
    status = 0;
fail:
    if (status)
        fprintf(stderr, "sluice run: %s\n", err.msg);
    free(text);
    free(tokens);
    free(logits);
    infer_sampler_destroy(sampler);
    infer_tokenizer_destroy(tk);
    infer_state_destroy(st);
    infer_model_destroy(m);
    if (tmp[0])
        unlink(tmp);
    return status;
}

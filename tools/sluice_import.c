/* sluice_import.c: `sluice import SRC [--tokenizer FILE] [--dtype T] -o OUT`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "import.h"
#include "sluice.h"
#include "tools_util.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: sluice import SRC [--tokenizer FILE] [--dtype f32|f16|bf16] [--seq-len N] "
            "-o MODEL.sluice\n\n"
            "Converts a trained Llama-family model into a float .sluice container.\n"
            "SRC is a llama2.c checkpoint (needs --tokenizer, the llama2.c tokenizer file),\n"
            "a GGUF v2/v3 file (F32, F16, BF16, Q8_0, Q4_K, Q5_K or Q6_K tensors; the\n"
            "vocabulary comes from its metadata), or a Hugging Face directory or .safetensors\n"
            "file with config.json beside it (needs --tokenizer). The tensors keep their\n"
            "precision unless --dtype converts them (Q8_0 and K-quants are dequantized exactly\n"
            "to f32). --seq-len overrides the context length the source declares. Only plain\n"
            "Llama models are accepted (GGUF architecture llama with a\n"
            "SentencePiece vocabulary, or LlamaForCausalLM): biases, rope scaling, partial\n"
            "rotary embeddings or extra tensors are refused rather than dropped. The output is\n"
            "written to a temporary file and renamed when complete; progress goes to stderr.\n");
}

int cmd_import(int argc, char **argv)
{
    const char *src = NULL, *out = NULL;
    struct import_opts o = {.dtype = -1};
    static const char *const dtypes[] = {"f32", "f16", "bf16"};
    static const int dtype_ids[] = {FORMAT_ENC_F32, FORMAT_ENC_F16, FORMAT_ENC_BF16};
    struct tools_args args = {"sluice import", usage, argc, argv, 0};
    for (args.i = 1; args.i < argc; args.i++) {
        const char *a = argv[args.i];
        int bad = 0, v = 0;
        if (tools_args_help(&args)) {
            return 0;
        } else if (!strcmp(a, "-o")) {
            bad = tools_args_value(&args, &out);
        } else if (!strcmp(a, "--tokenizer")) {
            bad = tools_args_value(&args, &o.tokenizer);
        } else if (!strcmp(a, "--seq-len")) {
            bad = tools_args_u32(&args, 1, UINT32_MAX, &o.seq_len);
        } else if (!strcmp(a, "--dtype")) {
            bad = tools_args_choice(&args, dtypes, 3, &v);
            o.dtype = dtype_ids[v];
        } else {
            bad = tools_args_operand(&args, &src);
        }
        if (bad)
            return 2;
    }
    if (!src || !out) {
        fprintf(stderr, "sluice import: needs SRC and -o MODEL.sluice\n\n");
        usage(stderr);
        return 2;
    }
    struct tools_progress prog;
    tools_progress_init(&prog, "import");
    o.progress = tools_progress_cb;
    o.progress_ctx = &prog;
    struct sl_err err = {{0}};
    if (import_model(src, &o, out, &err) < 0) {
        tools_progress_end(&prog);
        fprintf(stderr, "sluice import: %s\n", err.msg);
        return 1;
    }
    tools_progress_end(&prog);
    fprintf(stderr, "sluice import: wrote %s\n", out);
    return 0;
}

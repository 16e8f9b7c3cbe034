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
            "a GGUF v2/v3 file (F32, F16, BF16 or Q8_0 tensors; the vocabulary comes from its\n"
            "metadata), or a Hugging Face directory or .safetensors file with config.json beside\n"
            "it (needs --tokenizer). The tensors keep their precision unless --dtype converts\n"
            "them (Q8_0 is stored as f32). --seq-len overrides the context length the source\n"
            "declares. Only plain Llama models are accepted (GGUF architecture llama with a\n"
            "SentencePiece vocabulary, or LlamaForCausalLM): biases, rope scaling, partial\n"
            "rotary embeddings or extra tensors are refused rather than dropped. The output is\n"
            "written to a temporary file and renamed when complete; progress goes to stderr.\n");
}

int cmd_import(int argc, char **argv)
{
    const char *src = NULL, *out = NULL;
    struct import_opts o = {.dtype = -1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-o") && i + 1 < argc) {
            out = argv[++i];
        } else if (!strcmp(a, "--tokenizer") && i + 1 < argc) {
            o.tokenizer = argv[++i];
        } else if (!strcmp(a, "--seq-len") && i + 1 < argc) {
            if (tools_parse_u32(argv[++i], &o.seq_len) || o.seq_len == 0) {
                fprintf(stderr, "sluice import: bad --seq-len '%s'\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(a, "--dtype") && i + 1 < argc) {
            const char *d = argv[++i];
            o.dtype = !strcmp(d, "f32")    ? FORMAT_ENC_F32
                      : !strcmp(d, "f16")  ? FORMAT_ENC_F16
                      : !strcmp(d, "bf16") ? FORMAT_ENC_BF16
                                           : -2;
            if (o.dtype == -2) {
                fprintf(stderr, "sluice import: --dtype must be f32, f16 or bf16\n");
                return 2;
            }
        } else if (a[0] == '-' || src) {
            usage(stderr);
            return 2;
        } else {
            src = a;
        }
    }
    if (!src || !out) {
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

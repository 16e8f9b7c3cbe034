/* sluice_export.c: `sluice export --gguf FILE [--type T] [--alignment N] MODEL`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format.h"
#include "gguf.h"
#include "sluice.h"
#include "tools_util.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: sluice export --gguf FILE [--type q8_0|f16|f32] [--alignment N] "
               "MODEL.sluice\n\n"
               "Writes the container as a GGUF v3 file of the llama architecture that llama.cpp\n"
               "loads: every hyperparameter and the SentencePiece vocabulary (tokens, scores,\n"
               "token types, BOS/EOS) from the container, tensors named as llama.cpp expects\n"
               "(token_embd, blk.N.attn_q, ..., output_norm, output) in container order. These\n"
               "are the very bytes `sluice mount` serves as MOUNT/model.gguf (same code).\n"
               "Quantized tensors become:\n"
               "  q8_0  (default) each row's int8 codes, its float32 scale rounded to fp16 as\n"
               "        every 32-weight block's scale; rows whose length is not a multiple of\n"
               "        32 cannot be Q8_0 and are written as F16 (listed on stderr)\n"
               "  f16   scale * code rounded to fp16\n"
               "  f32   scale * code in float32 (exact; a reference for measurements)\n"
               "Norms are F32; float matrices keep their type (F32, F16, BF16). A scale or\n"
               "weight beyond fp16's range is an error, never a wrong number. --alignment N:\n"
               "general.alignment, a power of two in 8..65536 (default 32). Every slice's\n"
               "checksum is verified as it is read. The file is written to FILE.tmp.XXXXXX and\n"
               "renamed when complete (nothing is left at FILE on failure); progress goes to\n"
               "stderr.\n");
}

static const char *type_name(uint32_t t)
{
    return t == GGUF_GGML_Q8_0   ? "Q8_0"
           : t == GGUF_GGML_F16  ? "F16"
           : t == GGUF_GGML_BF16 ? "BF16"
                                 : "F32";
}

static void progress(void *ctx, uint64_t done, uint64_t total)
{
    tools_progress_cb(ctx, "GGUF bytes", done, total);
}

int cmd_export(int argc, char **argv)
{
    const char *model = NULL, *out = NULL;
    struct gguf_view_opts o;
    gguf_view_opts_init(&o);
    static const char *const types[] = {"q8_0", "f16", "f32"};
    static const uint32_t type_ids[] = {GGUF_GGML_Q8_0, GGUF_GGML_F16, GGUF_GGML_F32};
    struct tools_args args = {"sluice export", usage, argc, argv, 0};
    for (args.i = 1; args.i < argc; args.i++) {
        const char *a = argv[args.i];
        int bad = 0, k = 0;
        if (tools_args_help(&args)) {
            return 0;
        } else if (!strcmp(a, "--gguf")) {
            bad = tools_args_value(&args, &out);
        } else if (!strcmp(a, "--type")) {
            bad = tools_args_choice(&args, types, 3, &k);
            o.qtype = type_ids[k];
        } else if (!strcmp(a, "--alignment")) {
            bad = tools_args_u32(&args, 8, 65536, &o.alignment);
            if (!bad && (o.alignment & (o.alignment - 1))) {
                fprintf(stderr, "sluice export: --alignment wants a power of two, not %u\n",
                        o.alignment);
                bad = -1;
            }
        } else {
            bad = tools_args_operand(&args, &model);
        }
        if (bad)
            return 2;
    }
    if (!model || !out) {
        fprintf(stderr, "sluice export: needs --gguf FILE and MODEL.sluice\n\n");
        usage(stderr);
        return 2;
    }
    struct sl_err err = {{0}};
    struct format_reader *r = NULL;
    struct gguf_view *v = NULL;
    struct gguf_source src = {0};
    int ret = 1;
    if (format_reader_open(model, &r, &err) < 0 || gguf_view_create(r, &o, &v, &err) < 0 ||
        gguf_file_source_create(r, &src, &err) < 0) {
        fprintf(stderr, "sluice export: %s\n", err.msg);
        goto out;
    }
    uint32_t counts[31] = {0};
    for (uint32_t i = 0; i < gguf_view_n_tensors(v); i++) {
        const struct gguf_view_tensor *t = gguf_view_tensor(v, i);
        counts[t->type]++;
        if (t->f16_fallback)
            fprintf(stderr,
                    "sluice export: %s: rows of %llu weights, not a multiple of 32: F16, not "
                    "Q8_0\n",
                    t->name, (unsigned long long)t->ne[0]);
    }
    struct tools_progress prog;
    tools_progress_init(&prog, "export");
    int k = gguf_view_write_file(v, &src, out, progress, &prog, &err);
    tools_progress_end(&prog);
    if (k < 0) {
        fprintf(stderr, "sluice export: %s\n", err.msg);
        goto out;
    }
    fprintf(stderr, "sluice export: wrote %s: %llu bytes, %u tensors (", out,
            (unsigned long long)gguf_view_size(v), gguf_view_n_tensors(v));
    const char *sep = "";
    for (uint32_t t = 0; t < 31; t++)
        if (counts[t]) {
            fprintf(stderr, "%s%u %s", sep, counts[t], type_name(t));
            sep = ", ";
        }
    fprintf(stderr, ")\n");
    ret = 0;
out:
    gguf_file_source_destroy(&src);
    gguf_view_destroy(v);
    format_reader_close(r);
    return ret;
}

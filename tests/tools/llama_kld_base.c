/* llama_kld_base.c: Sluice's logits in the file format of llama.cpp's
 * `llama-perplexity --kl-divergence-base`, so that llama.cpp can measure its
 * own logits against Sluice's (docs/BENCHMARKS.md, issue 20; not a test).
 *
 *   llama-perplexity -m X.gguf -f TEXT -c 256 --kl-divergence-base llama.kld
 *   llama_kld_base MODEL.sluice llama.kld sluice.kld
 *   llama-perplexity -m Y.gguf --kl-divergence-base sluice.kld --kl-divergence
 *
 * The tokens (and the context, vocabulary and chunk count) are taken from a
 * file llama-perplexity wrote, so both sides score the very same tokens; each
 * chunk runs through Sluice's forward pass (infer_forward, all logits) with
 * its first token replaced by BOS, as llama-perplexity does, and the second
 * half of each chunk is written as llama.cpp writes it: per scored position
 * f32 scale and f32 min log-prob (4 u16), then the vocabulary's log-probs as
 * u16 steps of `scale` above the min (floored at max - 16), padded to an even
 * count. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "infer.h"

static int nearest(float f)
{
    return (int)lrintf(f);
}

/* llama.cpp's log_softmax(n_vocab, logits, log_prob, tok) writer. */
static void pack(int V, const float *logits, uint16_t *out)
{
    float mx = logits[0], mn = logits[0];
    for (int i = 1; i < V; i++) {
        mx = fmaxf(mx, logits[i]);
        mn = fminf(mn, logits[i]);
    }
    mn = fmaxf(mn, mx - 16);
    double sum = 0;
    for (int i = 0; i < V; i++)
        sum += expf(logits[i] - mx);
    float lse = (float)log(sum);
    float min_log_prob = mn - mx - lse;
    float scale = (mx - mn) / 65535.f;
    memcpy(out, &scale, 4);
    memcpy(out + 2, &min_log_prob, 4);
    uint16_t *lp = out + 4;
    if (scale) {
        for (int i = 0; i < V; i++)
            lp[i] = logits[i] > mn ? (uint16_t)nearest((logits[i] - mn) / scale) : 0;
    } else {
        memset(lp, 0, (size_t)V * sizeof *lp);
    }
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: llama_kld_base MODEL.sluice LLAMA.kld OUT.kld\n");
        return 2;
    }
    FILE *in = fopen(argv[2], "rb");
    char magic[8];
    uint32_t n_ctx;
    int32_t V, n_chunk;
    if (!in || fread(magic, 1, 8, in) != 8 || memcmp(magic, "_logits_", 8) ||
        fread(&n_ctx, 4, 1, in) != 1 || fread(&V, 4, 1, in) != 1 ||
        fread(&n_chunk, 4, 1, in) != 1 || n_ctx < 4 || n_ctx > 65536 || V < 2 || n_chunk < 1) {
        fprintf(stderr, "llama_kld_base: %s is not a llama-perplexity logits file\n", argv[2]);
        return 1;
    }
    size_t nt = (size_t)n_chunk * n_ctx;
    int *tokens = malloc(nt * sizeof *tokens);
    if (!tokens || fread(tokens, sizeof *tokens, nt, in) != nt) {
        fprintf(stderr, "llama_kld_base: %s: truncated tokens\n", argv[2]);
        return 1;
    }
    fclose(in);
    struct sl_err err = {{0}};
    struct infer_model *m = NULL;
    struct infer_state *s = NULL;
    if (infer_model_load(argv[1], NULL, &m, &err) < 0 ||
        infer_state_create(m, n_ctx, &s, &err) < 0) {
        fprintf(stderr, "llama_kld_base: %s\n", err.msg);
        return 1;
    }
    const struct format_config *c = infer_model_config(m);
    if ((int32_t)c->vocab_size != V) {
        fprintf(stderr, "llama_kld_base: vocabularies differ (%u vs %d)\n", c->vocab_size, V);
        return 1;
    }
    FILE *out = fopen(argv[3], "wb");
    int nv = 2 * ((V + 1) / 2) + 4;
    float *logits = malloc((size_t)n_ctx * V * sizeof *logits);
    uint16_t *lp = malloc((size_t)nv * sizeof *lp);
    if (!out || !logits || !lp) {
        fprintf(stderr, "llama_kld_base: cannot write %s\n", argv[3]);
        return 1;
    }
    fwrite("_logits_", 1, 8, out);
    fwrite(&n_ctx, 4, 1, out);
    fwrite(&V, 4, 1, out);
    fwrite(&n_chunk, 4, 1, out);
    fwrite(tokens, sizeof *tokens, nt, out);
    uint32_t first = n_ctx / 2;
    for (int32_t k = 0; k < n_chunk; k++) {
        int *chunk = tokens + (size_t)k * n_ctx;
        int saved = chunk[0];
        chunk[0] = (int)c->bos_id;
        if (infer_forward(m, s, chunk, n_ctx, 0, logits, INFER_LOGITS_ALL, &err) < 0) {
            fprintf(stderr, "llama_kld_base: %s\n", err.msg);
            return 1;
        }
        chunk[0] = saved;
        for (uint32_t j = first; j + 1 < n_ctx; j++) {
            memset(lp, 0, (size_t)nv * sizeof *lp);
            pack(V, logits + (size_t)j * V, lp);
            fwrite(lp, sizeof *lp, (size_t)nv, out);
        }
    }
    if (fclose(out) != 0) {
        fprintf(stderr, "llama_kld_base: writing %s failed\n", argv[3]);
        return 1;
    }
    infer_state_destroy(s);
    infer_model_destroy(m);
    free(tokens);
    free(logits);
    free(lp);
    return 0;
}

/* test_eval.c: `sluice eval` (the built binary, $SLUICE_BIN).
 * Default (ctest test_eval): a synthetic model and a text the test writes:
 * - the numbers match an independent computation through the runtime with
 *   llama.cpp's `llama-perplexity --kl-divergence` convention (one token
 *   stream, chunks of ctx tokens, the first replaced by BOS, the second half
 *   scored: ctx - 1 - ctx/2 tokens a chunk), within 1e-9 relative;
 * - a model against itself: KL exactly 0, top-1 1, equal perplexities;
 * - a 4-bit model: KL > 0, top-1 < 1;
 * - errors: --ctx beyond the context, a text shorter than one chunk, a
 *   missing file, no --ref; `sluice quantize` of a quantized source, bad
 *   --bits: non-zero exit and a message naming the problem.
 * --real (ctest test_eval_real, integration): the real aidreams260K and
 * kjv6L from ../shared: float against itself gives KL 0 and top-1 1; 4-bit
 * EdgeFlow models calibrated on the first half of calib.txt, evaluated on
 * the second: 0 < KL < 0.25, top-1 > 0.75, perplexity within 15% of the
 * float model's. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "import.h"
#include "infer.h"
#include "testutil.h"

static const char *bin;

struct result {
    double ppl, ppl_ref, kl_mean, kl_p99, top1, tokens, ctx, chunks;
};

/* Runs a command; its stdout (up to 64 KiB) into out, stderr into err_out. */
static int run(const char *cmd, char *out, size_t cap, char *err_out, size_t ecap)
{
    static const char *errf;
    char full[16384];
    if (!errf)
        errf = test_tmp_path("stderr.txt");
    snprintf(full, sizeof full, "%s 2>%s", cmd, errf);
    FILE *f = popen(full, "r");
    assert_non_null(f);
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = 0;
    int st = pclose(f);
    size_t el = 0;
    char *e = test_read_file(errf, &el);
    snprintf(err_out, ecap, "%s", e ? e : "");
    free(e);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static struct result eval_json(const char *model, const char *ref, const char *text,
                               const char *extra)
{
    char cmd[8192], out[65536], err[65536];
    snprintf(cmd, sizeof cmd, "'%s' eval '%s' --ref '%s' --text '%s' --json %s", bin, model, ref,
             text, extra ? extra : "");
    int st = run(cmd, out, sizeof out, err, sizeof err);
    if (st != 0)
        fail_msg("%s: exit %d: %s", cmd, st, err);
    cJSON *j = cJSON_Parse(out);
    if (!j)
        fail_msg("not JSON: %s", out);
    struct result r;
    const char *keys[] = {"ppl",    "ppl_ref", "kl_mean", "kl_p99", "top1_agreement",
                          "tokens", "ctx",     "chunks"};
    double *dst[] = {&r.ppl,  &r.ppl_ref, &r.kl_mean, &r.kl_p99,
                     &r.top1, &r.tokens,  &r.ctx,     &r.chunks};
    for (int k = 0; k < 8; k++) {
        cJSON *v = cJSON_GetObjectItemCaseSensitive(j, keys[k]);
        if (!cJSON_IsNumber(v))
            fail_msg("JSON has no number '%s': %s", keys[k], out);
        *dst[k] = v->valuedouble;
    }
    cJSON_Delete(j);
    assert_true(r.tokens == r.chunks * (r.ctx - 1 - floor(r.ctx / 2)));
    return r;
}

static void expect_failure_of(const char *sub, const char *args, const char *needle)
{
    char cmd[8192], out[65536], err[65536];
    snprintf(cmd, sizeof cmd, "'%s' %s %s", bin, sub, args);
    int st = run(cmd, out, sizeof out, err, sizeof err);
    assert_true(st != 0);
    if (!strstr(err, needle))
        fail_msg("'%s': stderr '%s' does not mention '%s'", cmd, err, needle);
}

static void expect_failure(const char *args, const char *needle)
{
    expect_failure_of("eval", args, needle);
}

/* A text the tiny synthetic model's byte-level vocabulary tokenizes. */
static void write_text(const char *path, int words)
{
    static const char *const w[] = {"the",   "of",    "and",  "light", "water", "stone", "river",
                                    "dream", "night", "over", "under", "quiet", "green"};
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    struct test_rng r;
    test_rng_init(&r, 99);
    for (int i = 0; i < words; i++)
        fprintf(f, "%s%s", w[test_rng_below(&r, 13)], i % 17 == 16 ? ".\n" : " ");
    fclose(f);
}

/* The same measurement through the runtime, written from the convention. */
static struct result reference_eval(const char *model, const char *ref, const char *text,
                                    uint32_t ctx)
{
    struct sl_err err;
    struct infer_model *m[2];
    struct infer_state *s[2];
    const char *paths[2] = {model, ref};
    for (int k = 0; k < 2; k++) {
        assert_int_equal(infer_model_load(paths[k], NULL, &m[k], &err), 0);
        assert_int_equal(infer_state_create(m[k], ctx, &s[k], &err), 0);
    }
    const struct format_config *c = infer_model_config(m[0]);
    struct infer_tokenizer *tk;
    assert_int_equal(
        infer_tokenizer_create(format_reader_tokenizer(infer_model_reader(m[0])), c, &tk, &err), 0);
    size_t len;
    char *txt = test_read_file(text, &len);
    int *ids;
    uint32_t n;
    assert_int_equal(infer_tokenizer_encode_stream(tk, txt, len, &ids, &n), 0);
    uint32_t V = c->vocab_size, chunks = n / ctx;
    float *lg[2] = {malloc(sizeof(float) * ctx * V), malloc(sizeof(float) * ctx * V)};
    double nll[2] = {0, 0}, kl_sum = 0;
    uint64_t scored = 0, agree = 0;
    for (uint32_t k = 0; k < chunks; k++) {
        int *chunk = ids + (size_t)k * ctx;
        chunk[0] = (int)c->bos_id;
        for (int j = 0; j < 2; j++)
            assert_int_equal(
                infer_forward(m[j], s[j], chunk, ctx, 0, lg[j], INFER_LOGITS_ALL, &err), 0);
        for (uint32_t p = ctx / 2; p + 1 < ctx; p++) {
            double lse[2], mx[2];
            uint32_t top[2] = {0, 0};
            for (int j = 0; j < 2; j++) {
                const float *l = lg[j] + (size_t)p * V;
                mx[j] = l[0];
                for (uint32_t v = 0; v < V; v++)
                    if (l[v] > l[top[j]])
                        top[j] = v;
                mx[j] = l[top[j]];
                double sum = 0;
                for (uint32_t v = 0; v < V; v++)
                    sum += exp((double)l[v] - mx[j]);
                lse[j] = mx[j] + log(sum);
                nll[j] -= (double)l[chunk[p + 1]] - lse[j];
            }
            double kl = 0;
            for (uint32_t v = 0; v < V; v++) {
                double lr = (double)lg[1][(size_t)p * V + v] - lse[1];
                double lm = (double)lg[0][(size_t)p * V + v] - lse[0];
                kl += exp(lr) * (lr - lm);
            }
            kl_sum += kl > 0 ? kl : 0;
            agree += top[0] == top[1];
            scored++;
        }
    }
    struct result r = {.ppl = exp(nll[0] / scored),
                       .ppl_ref = exp(nll[1] / scored),
                       .kl_mean = kl_sum / scored,
                       .top1 = (double)agree / scored,
                       .tokens = (double)scored,
                       .ctx = ctx,
                       .chunks = chunks};
    free(lg[0]);
    free(lg[1]);
    free(ids);
    free(txt);
    infer_tokenizer_destroy(tk);
    for (int k = 0; k < 2; k++) {
        infer_state_destroy(s[k]);
        infer_model_destroy(m[k]);
    }
    return r;
}

static int close_rel(double a, double b, double tol)
{
    return fabs(a - b) <= tol * fmax(fabs(a), fabs(b)) + 1e-15;
}

static void test_eval_synth(void **st)
{
    (void)st;
    struct sl_err err;
    const char *model = test_tmp_path("tiny.sluice"), *text = test_tmp_path("text.txt");
    assert_int_equal(import_synth("tiny", 4, model, NULL, NULL, &err), 0);
    write_text(text, 2500);
    /* itself: exactly no divergence */
    struct result r = eval_json(model, model, text, "--ctx 128");
    assert_true(r.kl_mean == 0 && r.kl_p99 == 0 && r.top1 == 1 && r.ppl == r.ppl_ref);
    assert_true(r.ctx == 128 && r.chunks >= 10);
    /* a 4-bit model: the tool against the reference computation */
    char cmd[8192], out[65536], e[65536];
    const char *q4 = test_tmp_path("q4.sluice");
    snprintf(cmd, sizeof cmd, "'%s' quantize '%s' -o '%s' --bits 4 --method uniform --act dynamic",
             bin, model, q4);
    if (run(cmd, out, sizeof out, e, sizeof e) != 0)
        fail_msg("%s: %s", cmd, e);
    const uint32_t ctxs[] = {64, 128, 0};
    for (int k = 0; k < 3; k++) {
        char extra[64] = "";
        if (ctxs[k])
            snprintf(extra, sizeof extra, "--ctx %u", ctxs[k]);
        r = eval_json(q4, model, text, extra);
        struct result w = reference_eval(q4, model, text, (uint32_t)r.ctx);
        fprintf(stderr,
                "ctx %g: tool KL %.6f top-1 %.4f ppl %.3f/%.3f; reference KL %.6f "
                "top-1 %.4f ppl %.3f/%.3f\n",
                r.ctx, r.kl_mean, r.top1, r.ppl, r.ppl_ref, w.kl_mean, w.top1, w.ppl, w.ppl_ref);
        assert_true(ctxs[k] || r.ctx == 512); /* default: min(seq_len 512, 512) */
        assert_true(r.tokens == w.tokens && r.chunks == w.chunks);
        assert_true(close_rel(r.kl_mean, w.kl_mean, 1e-9));
        assert_true(close_rel(r.ppl, w.ppl, 1e-9) && close_rel(r.ppl_ref, w.ppl_ref, 1e-9));
        if (!close_rel(r.top1, w.top1, 1e-12))
            fail_msg("top-1 %.17g vs %.17g", r.top1, w.top1);
        assert_true(r.kl_mean > 0 && r.kl_p99 >= r.kl_mean && r.top1 < 1);
    }
}

static void test_eval_errors(void **st)
{
    (void)st;
    char args[8192];
    const char *model = test_tmp_path("tiny.sluice"), *text = test_tmp_path("text.txt"),
               *small = test_tmp_path("small.txt");
    snprintf(args, sizeof args, "'%s' --ref '%s' --text '%s' --ctx 100000", model, model, text);
    expect_failure(args, "context");
    FILE *f = fopen(small, "w");
    fputs("the river", f);
    fclose(f);
    snprintf(args, sizeof args, "'%s' --ref '%s' --text '%s'", model, model, small);
    expect_failure(args, "fewer than one chunk");
    snprintf(args, sizeof args, "'%s' --ref '%s' --text '%s'", model, model,
             test_tmp_path("missing.txt"));
    expect_failure(args, "missing.txt");
    snprintf(args, sizeof args, "'%s' --text '%s'", model, text);
    expect_failure(args, "--ref");
    snprintf(args, sizeof args, "'%s' --ref '%s' --text '%s'", test_tmp_path("nomodel.sluice"),
             model, text);
    expect_failure(args, "nomodel.sluice");
    /* sluice quantize refuses a quantized source before calibrating it */
    snprintf(args, sizeof args, "'%s' -o '%s' --bits 5", test_tmp_path("q4.sluice"),
             test_tmp_path("qq.sluice"));
    expect_failure_of("quantize", args, "already quantized");
    snprintf(args, sizeof args, "'%s' -o '%s' --bits 4.5 --method uniform", model,
             test_tmp_path("qq.sluice"));
    expect_failure_of("quantize", args, "integer");
    snprintf(args, sizeof args, "'%s' -o '%s' --bits 9", model, test_tmp_path("qq.sluice"));
    expect_failure_of("quantize", args, "--bits");
    /* an empty calibration text: an error naming it, no output file (it
     * used to free the token buffer twice and abort) */
    const char *empty = test_tmp_path("empty.txt"), *qe = test_tmp_path("qe.sluice");
    FILE *fe = fopen(empty, "w");
    assert_non_null(fe);
    fclose(fe);
    snprintf(args, sizeof args, "'%s' -o '%s' --bits 5 --calib '%s'", model, qe, empty);
    expect_failure_of("quantize", args, "empty.txt: no text");
    assert_int_equal(access(qe, F_OK), -1);
    /* an output folder that does not exist: said before calibrating */
    snprintf(args, sizeof args, "'%s' -o '%s' --bits 5", model,
             test_tmp_path("no/such/dir/q.sluice"));
    expect_failure_of("quantize", args, "cannot write into");
}

/* `sluice quantize --budget auto` (the default): both budgets scored on the
 * calibration text exactly as `sluice eval --text CALIB --max-chunks K`
 * scores them, the lower kept under the output name, nothing else left in
 * the directory; too short a text falls back to per-tensor; methods of
 * uniform widths are not scored. */
static double printed_kl(const char *out, const char *label, int *kept)
{
    char key[64];
    snprintf(key, sizeof key, "budget %-10s KL ", label);
    const char *p = strstr(out, key);
    if (!p)
        fail_msg("no '%s' in: %s", key, out);
    double kl = strtod(p + strlen(key), NULL);
    const char *eol = strchr(p, '\n');
    const char *mark = strstr(p, "<- kept");
    *kept = mark && (!eol || mark < eol);
    return kl;
}

static void quantize_ok(const char *args, char *out, size_t cap, char *e, size_t ecap)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s' quantize %s", bin, args);
    if (run(cmd, out, cap, e, ecap) != 0)
        fail_msg("%s: %s", cmd, e);
}

static void test_quantize_auto(void **st)
{
    (void)st;
    struct sl_err err;
    const char *model = test_tmp_path("auto-f32.sluice"), *text = test_tmp_path("auto-text.txt");
    const char *qa = test_tmp_path("auto-q.sluice"), *qt = test_tmp_path("auto-qt.sluice"),
               *qg = test_tmp_path("auto-qg.sluice");
    assert_int_equal(import_synth("tiny", 5, model, NULL, NULL, &err), 0);
    write_text(text, 2500);
    char args[8192], out[65536], e[65536];
    snprintf(args, sizeof args,
             "'%s' -o '%s' --bits 4.5 --calib '%s' --select-tokens 1100 --calib-tokens 1100", model,
             qa, text);
    quantize_ok(args, out, sizeof out, e, sizeof e);
    int kept_t, kept_g;
    double kl_t = printed_kl(out, "per-tensor", &kept_t), kl_g = printed_kl(out, "global", &kept_g);
    fprintf(stderr, "auto: per-tensor KL %.6f%s, global %.6f%s\n", kl_t, kept_t ? " (kept)" : "",
            kl_g, kept_g ? " (kept)" : "");
    assert_true(kept_t + kept_g == 1);
    assert_true(kl_t != kl_g);
    assert_true(kept_g == (kl_g < kl_t));
    assert_non_null(strstr(out, "2 chunks of 512"));
    /* the same numbers as sluice eval on the first two chunks of the text */
    snprintf(args, sizeof args,
             "'%s' -o '%s' --bits 4.5 --calib '%s' --calib-tokens 1100 --budget tensor", model, qt,
             text);
    quantize_ok(args, out, sizeof out, e, sizeof e);
    assert_null(strstr(out, "budget per-tensor KL"));
    snprintf(args, sizeof args,
             "'%s' -o '%s' --bits 4.5 --calib '%s' --calib-tokens 1100 --budget global", model, qg,
             text);
    quantize_ok(args, out, sizeof out, e, sizeof e);
    struct result rt = eval_json(qt, model, text, "--max-chunks 2");
    struct result rg = eval_json(qg, model, text, "--max-chunks 2");
    struct result ra = eval_json(qa, model, text, "--max-chunks 2");
    assert_true(rt.chunks == 2 && rt.ctx == 512);
    if (fabs(rt.kl_mean - kl_t) > 6e-7 || fabs(rg.kl_mean - kl_g) > 6e-7)
        fail_msg("printed %.6f/%.6f, sluice eval %.9f/%.9f", kl_t, kl_g, rt.kl_mean, rg.kl_mean);
    assert_true(ra.kl_mean == (kept_g ? rg.kl_mean : rt.kl_mean));
    /* the kept file says which budget and how it was chosen */
    struct format_reader *r;
    assert_int_equal(format_reader_open(qa, &r, &err), 0);
    const void *v;
    size_t vl;
    assert_int_equal(format_reader_meta_get(r, "quant.budget", &v, &vl), 0);
    const char *want = kept_g ? "global" : "tensor";
    assert_true(vl == strlen(want) && !memcmp(v, want, vl));
    assert_int_equal(format_reader_meta_get(r, "quant.budget_select", &v, &vl), 0);
    assert_true(vl > 5 && !memcmp(v, "auto:", 5));
    format_reader_close(r);
    /* no candidate left next to the output */
    DIR *d = opendir(test_tmpdir());
    assert_non_null(d);
    for (struct dirent *de; (de = readdir(d));)
        if (strstr(de->d_name, ".budget-"))
            fail_msg("left behind: %s", de->d_name);
    closedir(d);
    /* a text shorter than one chunk: the per-tensor budget, said so */
    const char *small = test_tmp_path("auto-small.txt");
    FILE *f = fopen(small, "w");
    fputs("the river under the stone", f);
    fclose(f);
    snprintf(args, sizeof args, "'%s' -o '%s' --bits 4.5 --calib '%s'", model, qa, small);
    quantize_ok(args, out, sizeof out, e, sizeof e);
    assert_non_null(strstr(e, "using the per-tensor budget"));
    assert_non_null(strstr(out, "per-tensor budget"));
    /* uniform widths: nothing to choose */
    snprintf(args, sizeof args,
             "'%s' -o '%s' --bits 4 --method smoothquant --calib '%s' --calib-tokens 1100", model,
             qa, text);
    quantize_ok(args, out, sizeof out, e, sizeof e);
    assert_null(strstr(out, "budget per-tensor KL"));
    snprintf(args, sizeof args, "'%s' -o '%s' --bits 4 --budget some", model, qa);
    expect_failure_of("quantize", args, "--budget");
}

/* ---- real models -------------------------------------------------------------------------------
 */

static void split_text(const char *src, const char *first, const char *second)
{
    size_t len;
    char *t = test_read_file(src, &len);
    assert_non_null(t);
    size_t lines = 0, half = 0, n = 0;
    for (size_t i = 0; i < len; i++)
        lines += t[i] == '\n';
    for (half = 0; half < len && n < lines / 2; half++)
        n += t[half] == '\n';
    FILE *a = fopen(first, "w"), *b = fopen(second, "w");
    fwrite(t, 1, half, a);
    fwrite(t + half, 1, len - half, b);
    fclose(a);
    fclose(b);
    free(t);
}

static void real_model(const char *name, const char *tok, double ctx)
{
    char bin_p[4096], tok_p[4096], txt_p[4096], cmd[16384], out[65536], e[65536];
    snprintf(bin_p, sizeof bin_p, "%s", test_shared_path(name));
    snprintf(tok_p, sizeof tok_p, "%s", test_shared_path(tok));
    char calib[256];
    snprintf(calib, sizeof calib, "%.*s.calib.txt", (int)(strrchr(name, '.') - name), name);
    snprintf(txt_p, sizeof txt_p, "%s", test_shared_path(calib));
    const char *f32 = test_tmp_path("real.sluice"), *q4 = test_tmp_path("real-q4.sluice");
    const char *a = test_tmp_path("calib-a.txt"), *b = test_tmp_path("calib-b.txt");
    split_text(txt_p, a, b);
    snprintf(cmd, sizeof cmd, "'%s' import '%s' --tokenizer '%s' -o '%s'", bin, bin_p, tok_p, f32);
    if (run(cmd, out, sizeof out, e, sizeof e) != 0)
        fail_msg("%s: %s", cmd, e);
    struct result r = eval_json(f32, f32, b, NULL);
    assert_true(r.kl_mean == 0 && r.top1 == 1 && r.ppl == r.ppl_ref && r.ctx == ctx);
    snprintf(cmd, sizeof cmd, "'%s' quantize '%s' -o '%s' --bits 4 --calib '%s'", bin, f32, q4, a);
    if (run(cmd, out, sizeof out, e, sizeof e) != 0)
        fail_msg("%s: %s", cmd, e);
    r = eval_json(q4, f32, b, NULL);
    fprintf(stderr,
            "%s 4-bit edgeflow: KL %.5f (p99 %.4f), top-1 %.4f, ppl %.3f (float %.3f), "
            "%g tokens\n",
            name, r.kl_mean, r.kl_p99, r.top1, r.ppl, r.ppl_ref, r.tokens);
    assert_true(r.kl_mean > 0 && r.kl_mean < 0.25);
    assert_true(r.top1 > 0.75 && r.top1 < 1);
    assert_true(fabs(r.ppl / r.ppl_ref - 1) < 0.15);
    assert_true(r.tokens > 1000);
}

static void test_eval_aidreams(void **st)
{
    (void)st;
    real_model("models/aidreams260K.bin", "models/aidreams260K.tok512.bin", 128);
}

static void test_eval_kjv(void **st)
{
    (void)st;
    real_model("models/kjv6L.bin", "models/kjv6L.tok1024.bin", 256);
}

int main(int argc, char **argv)
{
    bin = test_sluice_bin();
    if (!bin)
        test_skip_all("the sluice binary is not known ($SLUICE_BIN)");
    if (argc > 1 && !strcmp(argv[1], "--real")) {
        if (!test_shared_path("models/kjv6L.bin") || !test_shared_path("models/aidreams260K.bin"))
            test_skip_all("../shared/models not found");
        const struct CMUnitTest real[] = {cmocka_unit_test(test_eval_aidreams),
                                          cmocka_unit_test(test_eval_kjv)};
        return cmocka_run_group_tests(real, NULL, NULL);
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_eval_synth),
                                       cmocka_unit_test(test_eval_errors),
                                       cmocka_unit_test(test_quantize_auto)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}

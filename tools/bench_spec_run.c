/* bench_spec_run.c: one decode of `sluice bench spec`: plain or speculative
 * on a fresh session after the prompt's prefill (timed from the first
 * generated token), or llama.cpp's llama-lookup on the same prompt text. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_spec.h"
#include "tools_util.h"

double bench_spec_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int bench_spec_keep_tok(void *ctx, int tok)
{
    struct bench_spec_keep *k = ctx;
    if (k->n < k->cap)
        k->t[k->n++] = tok;
    return 0;
}

/* One decode of n tokens after the prompt: tokens/s (0 on error). */
double bench_spec_decode_once(struct infer_model *m, const int *ids, uint32_t np, uint32_t n,
                              const struct infer_spec_opts *so, struct bench_spec_keep *out,
                              struct infer_spec_stats *sst, struct sl_err *err)
{
    struct infer_session *s;
    struct infer_session_opts o = {.max_batch = 256, .no_npu = out->no_npu};
    if (infer_session_create(m, &o, &s, err) < 0)
        return 0;
    double tps = 0;
    out->n = 0;
    out->prefill_s = out->wall_s = out->fwd_s = out->setup_s = out->cpu_s = 0;
    /* the prefill with every row's logits for calibration, timed apart (TTFT);
     * n x vocab floats, so bounded (a 4K prompt of a 128K vocabulary is 2 GB) */
    uint32_t V = infer_model_config(m)->vocab_size;
    size_t all_bytes = sizeof(float) * V * np;
    if (so && out->prefill_logits && all_bytes > BENCH_SPEC_LOGITS_MAX) {
        sl_err_set(err, "the prompt's logits for --calibrate-prefill would take %zu MiB "
                   "(over %d MiB): use --calibrate",
                   all_bytes >> 20, BENCH_SPEC_LOGITS_MAX >> 20);
        infer_session_destroy(s);
        return 0;
    }
    float *all = so && out->prefill_logits ? malloc(all_bytes) : NULL;
    struct infer_spec_opts o2;
    if (all) {
        o2 = *so;
        o2.prompt_logits = all;
        so = &o2;
    } else if (so && out->prefill_logits) {
        sl_err_set(err, "out of memory for the prompt's logits");
        infer_session_destroy(s);
        return 0;
    }
    uint64_t tp = sl_now_ns();
    int pre = infer_session_prefill_logits(s, ids, np, all, err);
    out->prefill_s = (double)(sl_now_ns() - tp) / 1e9;
    if (pre == 0) {
        uint64_t t0 = sl_now_ns();
        double c0 = bench_spec_cpu_s();
        int ret;
        uint32_t got;
        struct infer_spec *sp = NULL;
        if (so) {
            ret = infer_spec_create(s, ids, np, so, &sp, err);
            uint64_t t1 = sl_now_ns();
            if (ret == 0)
                ret = infer_spec_generate(sp, n, NULL, 0, bench_spec_keep_tok, out, &got, err);
            uint64_t t2 = sl_now_ns();
            if (sp) {
                infer_spec_stats(sp, sst);
                out->fwd_s = sst->verify_s + sst->plain_s;
            }
            infer_spec_destroy(sp);
            out->setup_s = (double)(t1 - t0 + sl_now_ns() - t2) / 1e9;
        } else {
            ret = infer_session_generate(s, n, NULL, 0, bench_spec_keep_tok, out, &got, err);
            struct infer_session_stats ss;
            infer_session_stats(s, &ss);
            out->fwd_s = ss.decode_s;
        }
        double dt = (double)(sl_now_ns() - t0) / 1e9;
        out->wall_s = dt;
        out->cpu_s = bench_spec_cpu_s() - c0;
        if (ret == 0 && dt > 0)
            tps = got / dt;
    }
    infer_session_destroy(s);
    free(all);
    return tps;
}

/* llama-lookup's decode speed on the prompt, or 0. */
double bench_spec_lookup_once(const char *bin, const char *gguf, const char *prompt, uint32_t n,
                              int plain)
{
    char path[] = "/tmp/sluice-spec-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0)
        return 0;
    FILE *pf = fdopen(fd, "w");
    if (!pf) {
        close(fd);
        unlink(path);
        return 0;
    }
    int werr = fputs(prompt, pf) < 0;
    if (fclose(pf) != 0 || werr) { /* no prompt file, no llama run: 0 tokens/s */
        unlink(path);
        return 0;
    }
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "'%s' -m '%s' -f '%s' -n %u --temp 0 -t 1 -c 1024 --ignore-eos%s 2>&1 >/dev/null", bin,
             gguf, path, n, plain ? " --draft-max 0" : "");
    FILE *p = popen(cmd, "r");
    double tps = 0;
    char line[1024];
    while (p && fgets(line, sizeof line, p)) {
        const char *d = strstr(line, "decoded");
        const char *sp = d ? strstr(d, "speed:") : NULL;
        if (sp)
            tps = atof(sp + 6);
    }
    if (p)
        pclose(p);
    unlink(path);
    return tps;
}

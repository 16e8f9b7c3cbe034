/* bench_decode.c: `sluice bench decode`: decode tokens/s after a cold start
 * with a prompt of C tokens, int8 and packed residency side by side, each
 * run a fresh process (its peak RSS measured), interleaved; and llama.cpp's
 * llama-bench tg on GGUF files of the same shape when given. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "infer.h"
#include "sluice.h"
#include "tools_child.h"
#include "tools_util.h"

#define MAX_LIST 8

static void usage(FILE *f)
{
    fprintf(f,
            "usage: sluice bench decode MODEL.sluice [--contexts LIST] [--tokens N]\n"
            "         [--resident LIST] [--reps R] [--npu-share F]\n"
            "         [--llama-bench PATH --gguf FILE[,FILE...] [--threads T]] [--json]\n\n"
            "Decode speed after a cold start. For each context length C of --contexts\n"
            "(default 128,1000) and each residency of --resident (default int8,packed; see\n"
            "`sluice run --resident`), a fresh process cold-starts MODEL with a synthetic\n"
            "prompt of C tokens (as `sluice run --prompt-tokens C`), takes one greedy step\n"
            "untimed (packed residency frees the int8 copies there), then times N more\n"
            "steps (default 64): decode tokens/s = N / their wall time. The NPU device\n"
            "thread and the calling thread split every matmul (int8: --npu-share, default\n"
            "0.5; packed: in chunks as each thread is free, --npu-share 0 the calling\n"
            "thread alone),\n"
            "so a run uses 2 cores, like llama-bench -t 2. Runs are interleaved\n"
            "(rep 1: every context and residency, then rep 2, ...; default 3 reps); min,\n"
            "median and max are reported, and whether both residencies generated the same\n"
            "tokens. Each process also reports its peak RSS (VmHWM), its RSS after\n"
            "decoding, the weight bytes it holds (int8 NPU layout and packed) and the KV\n"
            "cache bytes of the context (2 x layers x tokens x kv_dim x 4).\n"
            "With --llama-bench PATH --gguf FILE, llama.cpp's own benchmark runs on each\n"
            "GGUF file (comma-separated) in every rep, after that rep's Sluice runs:\n"
            "PATH -m FILE -p 0 -n N -t T -r 1 -o json (T default 2), its tg N tokens/s\n"
            "(avg_ts) one sample per rep, min, median and max reported the same way.\n"
            "llama-bench generates from an empty context (this build has no depth\n"
            "option), so its numbers are the shortest-context case. --json prints one\n"
            "object instead of the table.\n");
}

struct opts {
    const char *model, *llama_bench;
    const char *gguf[MAX_LIST];
    uint32_t n_gguf;
    uint32_t contexts[MAX_LIST], n_ctx;
    int resident[2], n_res;
    uint32_t tokens, reps, threads;
    double npu_share;
    int json;
};

/* What one child measures (its stdout: one JSON object). */
struct child_arg {
    const struct opts *o;
    uint32_t ctx;
    enum infer_resident res;
};

static double rss_now_mb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double mb = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6))
            mb = strtod(line + 6, NULL) / 1024.0;
    if (f)
        fclose(f);
    return mb;
}

static int child_main(void *arg)
{
    const struct child_arg *a = arg;
    const struct opts *o = a->o;
    struct sl_err err = {{0}};
    struct format_reader *r;
    if (format_reader_open(o->model, &r, &err) < 0) {
        fprintf(stderr, "sluice bench decode: %s\n", err.msg);
        return 1;
    }
    struct format_config c = *format_reader_config(r);
    format_reader_close(r);
    uint32_t n = a->ctx < c.seq_len ? a->ctx : c.seq_len;
    int *tok = malloc(sizeof(int) * (n ? n : 1));
    if (!tok)
        return 1;
    tok[0] = (int)c.bos_id; /* the synthetic prompt of sluice run --prompt-tokens */
    for (uint32_t i = 1; i < n; i++)
        tok[i] = 3 + (int)((i * 2654435761u) % (c.vocab_size > 3 ? c.vocab_size - 3 : 1));
    struct infer_pipeline_opts po;
    infer_pipeline_opts_init(&po);
    po.resident = a->res;
    struct infer_session_opts so = {.max_batch = 256, .npu_share = o->npu_share,
                                    .no_npu = o->npu_share == 0};
    struct infer_session *s;
    if (infer_session_cold_start(o->model, tok, n, &so, &po, &s, NULL, &err) < 0) {
        fprintf(stderr, "sluice bench decode: %s\n", err.msg);
        free(tok);
        return 1;
    }
    uint64_t hash = 1469598103934665603ull; /* FNV-1a over the generated tokens */
    uint32_t steps = 0, room = c.seq_len - n;
    uint64_t t0 = 0;
    int t, ret = 0;
    for (uint32_t i = 0; i <= o->tokens && i < room && ret == 0; i++) {
        if (i == 1)
            t0 = sl_now_ns(); /* step 0 (untimed) drops the int8 copies when packed */
        if ((ret = infer_session_sample(s, &t)) == 0)
            ret = infer_session_step(s, t, &err);
        hash = (hash ^ (uint64_t)t) * 1099511628211ull;
        steps += i > 0;
    }
    double secs = (double)(sl_now_ns() - t0) / 1e9;
    size_t i8, pk;
    infer_model_weight_bytes(infer_session_model(s), &i8, &pk);
    uint64_t kv = 2ull * c.n_layers * infer_session_len(s) * c.n_kv_heads * c.head_dim * 4;
    double rss = rss_now_mb();
    infer_session_destroy(s);
    free(tok);
    if (ret < 0 || steps == 0) {
        fprintf(stderr, "sluice bench decode: %s\n", ret < 0 ? err.msg : "no room to decode");
        return 1;
    }
    char buf[512];
    int len = snprintf(buf, sizeof buf,
                       "{\"tps\":%.4f,\"steps\":%u,\"peak_rss_mb\":%.1f,\"rss_mb\":%.1f,"
                       "\"int8_bytes\":%zu,\"packed_bytes\":%zu,\"kv_bytes\":%llu,"
                       "\"hash\":\"%016llx\"}\n",
                       steps / secs, steps, sl_peak_rss_mb(), rss, i8, pk,
                       (unsigned long long)kv, (unsigned long long)hash);
    return write(1, buf, (size_t)len) == len ? 0 : 1;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Parses a comma list of u32 in [1, max]. */
static int parse_list(const char *s, uint32_t *out, uint32_t *n, uint32_t max)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    *n = 0;
    for (char *save, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (*n == MAX_LIST || tools_parse_u32(t, &out[*n]) < 0 || out[*n] < 1 || out[*n] > max)
            return -1;
        (*n)++;
    }
    return *n ? 0 : -1;
}

static int parse(int argc, char **argv, struct opts *o)
{
    *o = (struct opts){.contexts = {128, 1000}, .n_ctx = 2, .resident = {0, 1}, .n_res = 2,
                       .tokens = 64, .reps = 3, .threads = 2, .npu_share = 0.5};
    struct tools_args a = {"sluice bench decode", usage, argc, argv, 0};
    static char gg[4096];
    for (a.i = 1; a.i < argc; a.i++) {
        const char *s = argv[a.i], *v;
        int bad = 0;
        if (tools_args_help(&a)) {
            return 1;
        } else if (!strcmp(s, "--contexts")) {
            bad = tools_args_value(&a, &v);
            if (!bad && (bad = parse_list(v, o->contexts, &o->n_ctx, 1u << 20) < 0))
                fprintf(stderr, "sluice bench decode: --contexts wants up to %d token counts "
                                "1..1048576, comma-separated, not '%s'\n", MAX_LIST, v);
        } else if (!strcmp(s, "--resident")) {
            bad = tools_args_value(&a, &v);
            o->n_res = 0;
            if (!bad) {
                int ok = 1;
                char buf[64];
                snprintf(buf, sizeof buf, "%s", v);
                for (char *sv, *t = strtok_r(buf, ",", &sv); t && ok; t = strtok_r(NULL, ",", &sv)) {
                    enum infer_resident r;
                    ok = o->n_res < 2 && infer_resident_parse(t, &r) == 0 &&
                         r != INFER_RESIDENT_AUTO;
                    if (ok)
                        o->resident[o->n_res++] = (int)r;
                }
                if (!ok || !o->n_res) {
                    fprintf(stderr, "sluice bench decode: --resident wants int8, packed or "
                                    "int8,packed, not '%s'\n", v);
                    bad = 1;
                }
            }
        } else if (!strcmp(s, "--tokens")) {
            bad = tools_args_u32(&a, 1, 1u << 20, &o->tokens);
        } else if (!strcmp(s, "--reps")) {
            bad = tools_args_u32(&a, 1, 1000, &o->reps);
        } else if (!strcmp(s, "--threads")) {
            bad = tools_args_u32(&a, 1, 1024, &o->threads);
        } else if (!strcmp(s, "--npu-share")) {
            bad = tools_args_double(&a, 0, 1, TOOLS_ARGS_BELOW_MAX, &o->npu_share);
        } else if (!strcmp(s, "--llama-bench")) {
            bad = tools_args_value(&a, &o->llama_bench);
        } else if (!strcmp(s, "--gguf")) {
            bad = tools_args_value(&a, &v);
            if (!bad) {
                snprintf(gg, sizeof gg, "%s", v);
                o->n_gguf = 0;
                for (char *sv, *t = strtok_r(gg, ",", &sv); t && o->n_gguf < MAX_LIST;
                     t = strtok_r(NULL, ",", &sv))
                    o->gguf[o->n_gguf++] = t;
            }
        } else if (!strcmp(s, "--json")) {
            o->json = 1;
        } else {
            bad = tools_args_operand(&a, &o->model);
        }
        if (bad)
            return -1;
    }
    if (tools_args_need(&a, o->model, "MODEL") < 0)
        return -1;
    if (!o->llama_bench != !o->n_gguf) {
        fprintf(stderr, "sluice bench decode: --llama-bench and --gguf go together\n");
        return -1;
    }
    return 0;
}

struct point {
    double tps[1000], peak_rss, rss;
    uint32_t n;
    size_t i8, pk;
    uint64_t kv;
    char hash[17];
};

/* llama-bench on one GGUF, one repetition: its tg tokens/s. */
static int run_llama(const struct opts *o, const char *gguf, double *mean, struct sl_err *err)
{
    char n[16], t[16];
    snprintf(n, sizeof n, "%u", o->tokens);
    snprintf(t, sizeof t, "%u", o->threads);
    const char *argv[] = {o->llama_bench, "-m", gguf, "-p", "0", "-n", n, "-t", t,
                          "-r", "1", "-o", "json", NULL};
    struct tools_child_opts co = {.path = o->llama_bench, .argv = argv, .capture = 1,
                                  .null_stderr = 1};
    struct tools_child_result res;
    int ret = tools_child_run(&co, &res, err);
    if (ret < 0)
        return ret;
    cJSON *j = res.exit_code == 0 ? cJSON_Parse(res.out) : NULL;
    cJSON *e = cJSON_IsArray(j) ? cJSON_GetArrayItem(j, 0) : NULL;
    cJSON *m = cJSON_GetObjectItem(e, "avg_ts");
    ret = cJSON_IsNumber(m) ? 0 : -EIO;
    if (ret == 0) {
        *mean = m->valuedouble;
    } else {
        sl_err_set(err, "llama-bench on %s failed (exit %d) or printed no avg_ts", gguf,
                   res.exit_code);
    }
    cJSON_Delete(j);
    tools_child_result_fini(&res);
    return ret;
}

int bench_decode(int argc, char **argv)
{
    struct opts o;
    int ret = parse(argc, argv, &o);
    if (ret)
        return ret > 0 ? 0 : 2;
    struct point *pt = calloc((size_t)o.n_ctx * 2, sizeof *pt);
    if (!pt)
        return 1;
    struct sl_err err = {{0}};
    struct point *lp = calloc(MAX_LIST, sizeof *lp);
    if (!lp) {
        free(pt);
        return 1;
    }
    for (uint32_t rep = 0; rep < o.reps && ret == 0; rep++) {
        for (uint32_t c = 0; c < o.n_ctx && ret == 0; c++)
            for (int k = 0; k < o.n_res && ret == 0; k++) {
                struct child_arg ca = {&o, o.contexts[c], (enum infer_resident)o.resident[k]};
                struct tools_child_opts co = {.fn = child_main, .arg = &ca, .capture = 1};
                struct tools_child_result r;
                fprintf(stderr, "decode: rep %u, context %u, %s resident\n", rep + 1,
                        o.contexts[c], infer_resident_name(ca.res));
                if ((ret = tools_child_run(&co, &r, &err)) < 0)
                    break;
                cJSON *j = r.exit_code == 0 ? cJSON_Parse(r.out) : NULL;
                struct point *p = &pt[c * 2 + (size_t)o.resident[k]];
                cJSON *tps = cJSON_GetObjectItem(j, "tps");
                if (!cJSON_IsNumber(tps)) {
                    sl_err_set(&err, "the decode run (context %u, %s) failed (exit %d)",
                               o.contexts[c], infer_resident_name(ca.res), r.exit_code);
                    ret = -EIO;
                } else {
                    p->tps[p->n++] = tps->valuedouble;
                    double pr = cJSON_GetObjectItem(j, "peak_rss_mb")->valuedouble;
                    p->peak_rss = pr > p->peak_rss ? pr : p->peak_rss;
                    p->rss = cJSON_GetObjectItem(j, "rss_mb")->valuedouble;
                    p->i8 = (size_t)cJSON_GetObjectItem(j, "int8_bytes")->valuedouble;
                    p->pk = (size_t)cJSON_GetObjectItem(j, "packed_bytes")->valuedouble;
                    p->kv = (uint64_t)cJSON_GetObjectItem(j, "kv_bytes")->valuedouble;
                    snprintf(p->hash, sizeof p->hash, "%s",
                             cJSON_GetStringValue(cJSON_GetObjectItem(j, "hash")));
                }
                cJSON_Delete(j);
                tools_child_result_fini(&r);
            }
        for (uint32_t g = 0; ret == 0 && g < o.n_gguf; g++) {
            fprintf(stderr, "decode: rep %u, llama-bench %s\n", rep + 1, o.gguf[g]);
            ret = run_llama(&o, o.gguf[g], &lp[g].tps[lp[g].n], &err);
            lp[g].n += ret == 0;
        }
    }
    if (ret < 0) {
        fprintf(stderr, "sluice bench decode: %s\n", err.msg);
        free(pt);
        free(lp);
        return 1;
    }
    cJSON *root = cJSON_CreateObject(), *res = cJSON_AddArrayToObject(root, "sluice");
    cJSON_AddStringToObject(root, "model", o.model);
    cJSON_AddNumberToObject(root, "tokens", o.tokens);
    cJSON_AddNumberToObject(root, "reps", o.reps);
    if (!o.json)
        printf("%-8s %-7s %9s %9s %9s %10s %9s %9s %9s %9s  %s\n", "context", "weights",
               "tok/s min", "median", "max", "peak MiB", "rss MiB", "int8 MiB", "pack MiB",
               "kv MiB", "tokens");
    for (uint32_t c = 0; c < o.n_ctx; c++)
        for (int k = 0; k < o.n_res; k++) {
            struct point *p = &pt[c * 2 + (size_t)o.resident[k]];
            qsort(p->tps, p->n, sizeof p->tps[0], cmp_double);
            double med = p->n % 2 ? p->tps[p->n / 2] : (p->tps[p->n / 2 - 1] + p->tps[p->n / 2]) / 2;
            struct point *other = &pt[c * 2 + (size_t)!o.resident[k]];
            int same = o.n_res == 2 ? !strcmp(p->hash, other->hash) : 1;
            const char *rn = infer_resident_name((enum infer_resident)o.resident[k]);
            if (!o.json)
                printf("%-8u %-7s %9.2f %9.2f %9.2f %10.1f %9.1f %9.1f %9.1f %9.1f  %s\n",
                       o.contexts[c], rn, p->tps[0], med, p->tps[p->n - 1], p->peak_rss, p->rss,
                       p->i8 / 1048576.0, p->pk / 1048576.0, p->kv / 1048576.0,
                       same ? "same" : "DIFFERENT");
            cJSON *e = cJSON_CreateObject();
            cJSON_AddNumberToObject(e, "context", o.contexts[c]);
            cJSON_AddStringToObject(e, "resident", rn);
            cJSON_AddNumberToObject(e, "tps_min", p->tps[0]);
            cJSON_AddNumberToObject(e, "tps_median", med);
            cJSON_AddNumberToObject(e, "tps_max", p->tps[p->n - 1]);
            cJSON_AddNumberToObject(e, "peak_rss_mb", p->peak_rss);
            cJSON_AddNumberToObject(e, "rss_after_mb", p->rss);
            cJSON_AddNumberToObject(e, "int8_weight_bytes", (double)p->i8);
            cJSON_AddNumberToObject(e, "packed_weight_bytes", (double)p->pk);
            cJSON_AddNumberToObject(e, "kv_bytes", (double)p->kv);
            cJSON_AddBoolToObject(e, "same_tokens", same);
            cJSON_AddItemToArray(res, e);
        }
    cJSON *lj = cJSON_AddArrayToObject(root, "llama_bench");
    for (uint32_t g = 0; g < o.n_gguf; g++) {
        struct point *p = &lp[g];
        qsort(p->tps, p->n, sizeof p->tps[0], cmp_double);
        double med = p->n % 2 ? p->tps[p->n / 2] : (p->tps[p->n / 2 - 1] + p->tps[p->n / 2]) / 2;
        if (!o.json)
            printf("llama-bench tg%u -t %u %s: min %.2f, median %.2f, max %.2f tok/s\n",
                   o.tokens, o.threads, o.gguf[g], p->tps[0], med, p->tps[p->n - 1]);
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "gguf", o.gguf[g]);
        cJSON_AddNumberToObject(e, "threads", o.threads);
        cJSON_AddNumberToObject(e, "tps_min", p->tps[0]);
        cJSON_AddNumberToObject(e, "tps_median", med);
        cJSON_AddNumberToObject(e, "tps_max", p->tps[p->n - 1]);
        cJSON_AddItemToArray(lj, e);
    }
    if (o.json) {
        char *s = cJSON_PrintUnformatted(root);
        if (s)
            printf("%s\n", s);
        free(s);
    }
    cJSON_Delete(root);
    free(pt);
    free(lp);
    return 0;
}

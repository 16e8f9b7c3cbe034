/* bench_spec_cost.c: `sluice bench spec MODEL --verify-cost C`: the time of
 * one verification forward of 4, 8 and 16 rows against a one-row decode
 * step, and what loading the decode graphs costs (sd.npu 3.2); with int8
 * weights (infer_model_load) or packed residency (a cold start). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_spec.h"
#include "npu.h"

/* Progressive graph switching (sd.npu 3.2): what "loading" the decode and
 * verification graphs costs here. The weights' NPU layout is made once per
 * tensor and shared by every graph (chunk-sharing), so a graph is only its
 * build (the kernel's tiling timed on a probe), keyed by (m, k, n): every
 * layer of a shape shares it. Builds, on a fresh device, the graphs of the
 * model's linear shapes for m = 1, 4, 8, 16, against the prefill time of
 * one layer over a chunk of `chunk` rows (the compute that eq. 1 would
 * hide them behind). */
static void graph_cost(struct infer_model *m, uint32_t chunk, cJSON *j, int json)
{
    const struct format_config *c = infer_model_config(m);
    uint32_t Q = c->n_heads * c->head_dim, KV = c->n_kv_heads * c->head_dim;
    const uint32_t shapes[6][2] = {{c->dim, Q},
                                   {c->dim, KV},
                                   {Q, c->dim},
                                   {c->dim, c->hidden_dim},
                                   {c->hidden_dim, c->dim},
                                   {c->dim, c->vocab_size}};
    static const uint32_t ms[4] = {1, 4, 8, 16};
    struct npu_device *dev;
    struct sl_err err = {{0}};
    if (npu_device_create(&dev) < 0)
        return;
    double build_ms = 0;
    uint32_t built = 0;
    for (int sh = 0; sh < 6; sh++)
        for (int k = 0; k < 4; k++) {
            if (npu_graph_find(dev, ms[k], shapes[sh][0], shapes[sh][1]))
                continue;
            const struct npu_graph *g;
            uint64_t t0 = sl_now_ns();
            if (npu_device_graph(dev, ms[k], shapes[sh][0], shapes[sh][1], &g, &err) == 0) {
                build_ms += (double)(sl_now_ns() - t0) / 1e6;
                built++;
            }
        }
    npu_device_destroy(dev);
    /* one layer's prefill compute over a chunk */
    struct infer_session *s;
    struct infer_session_opts so = {.max_batch = chunk};
    double layer_ms = 0;
    if (chunk <= c->seq_len && infer_session_create(m, &so, &s, &err) == 0) {
        int *ids = malloc(sizeof(int) * chunk);
        for (uint32_t i = 0; ids && i < chunk; i++)
            ids[i] = i == 0 ? (int)c->bos_id : 3 + (int)((i * 2654435761u) % (c->vocab_size - 3));
        uint64_t t0 = sl_now_ns();
        if (ids && infer_session_prefill(s, ids, chunk, &err) == 0)
            layer_ms = (double)(sl_now_ns() - t0) / 1e6 / c->n_layers;
        free(ids);
        infer_session_destroy(s);
    }
    if (!json)
        printf("graph switching: %u decode/verification graphs (m = 1, 4, 8, 16 of the model's "
               "%s) build in %.2f ms in all, once per device; one layer's prefill of a "
               "%u-row chunk: %.2f ms\n",
               built, "6 linear shapes", build_ms, chunk, layer_ms);
    cJSON *o = cJSON_AddObjectToObject(j, "graph_switch");
    cJSON_AddNumberToObject(o, "graphs", built);
    cJSON_AddNumberToObject(o, "build_ms_total", build_ms);
    cJSON_AddNumberToObject(o, "layer_prefill_ms", layer_ms);
    cJSON_AddNumberToObject(o, "chunk", chunk);
}

/* --verify-cost: the time of one forward of 1, 4, 8 and 16 rows (a draft
 * tree: a root and a chain below it, then dropped) after a context of ctx
 * tokens, interleaved, `runs` times each; medians and minima in ms. */
int bench_spec_cost(struct infer_model *m, const char *path, uint32_t ctx, uint32_t runs,
                    uint32_t shape, int one_thread, int json)
{
    struct sl_err err = {{0}};
    struct infer_session *s = NULL, *s1 = NULL;
    struct infer_session_opts so = {.max_batch = 256}, so1 = {.max_batch = 256, .no_npu = 1};
    if (one_thread && !m) {
        fprintf(stderr, "sluice bench spec: --one-thread goes with the int8 or float weights\n");
        return 1;
    }
    struct format_config cfg = {0};
    int ret = 0;
    if (m) {
        cfg = *infer_model_config(m);
    } else { /* packed residency: a cold start of path */
        struct format_reader *r;
        if ((ret = format_reader_open(path, &r, &err)) == 0) {
            cfg = *format_reader_config(r);
            format_reader_close(r);
        }
    }
    const struct format_config *c = &cfg;
    if (ret == 0 && ctx + 16 > c->seq_len)
        ctx = c->seq_len - 16;
    int *ids = ret == 0 ? malloc(sizeof(int) * (ctx + 16)) : NULL;
    float *lg = ret == 0 ? malloc(sizeof(float) * c->vocab_size * 16) : NULL;
    /* [2][4][runs]: split, one thread; wall ms, then the process's CPU ms */
    double *t = malloc(sizeof(double) * runs * 16), *tc = t ? t + runs * 8 : NULL;
    if (ret == 0 && (!ids || !lg || !t))
        ret = -ENOMEM;
    for (uint32_t i = 0; ids && i < ctx + 16; i++)
        ids[i] = i == 0 ? (int)c->bos_id : 3 + (int)((i * 2654435761u) % (c->vocab_size - 3));
    if (ret == 0 && m) {
        ret = infer_session_create(m, &so, &s, &err);
        if (ret == 0)
            ret = infer_session_prefill(s, ids, ctx, &err);
        if (ret == 0 && one_thread && (ret = infer_session_create(m, &so1, &s1, &err)) == 0)
            ret = infer_session_prefill(s1, ids, ctx, &err);
    } else if (ret == 0) {
        struct infer_pipeline_opts po;
        infer_pipeline_opts_init(&po);
        po.resident = INFER_RESIDENT_PACKED;
        ret = infer_session_cold_start(path, ids, ctx, &so, &po, &s, NULL, &err);
        if (ret == 0)
            infer_session_drop_int8(s); /* the forwards below read the packed codes */
    }
    static const uint32_t shapes[4] = {1, 4, 8, 16};
    /* one run: every shape on the split session and (one_thread) on the
     * one-thread one, which goes first on odd runs */
    for (uint32_t r = 0; ret == 0 && r < runs; r++)
        for (int k = 0; ret == 0 && k < 4; k++)
            for (int w = 0; ret == 0 && w < 1 + !!s1 && (!shape || shape == shapes[k]); w++) {
                int which = s1 && r % 2 ? 1 - w : w;
                struct infer_session *ss = which ? s1 : s;
                uint32_t n = shapes[k], rows[16], pos[16];
                int32_t par[16];
                for (uint32_t i = 0; i < n; i++) {
                    rows[i] = i;
                    pos[i] = ctx + i;
                    par[i] = (int32_t)i - 1;
                }
                struct infer_batch b = {.n = n,
                                        .tokens = ids + ctx,
                                        .pos = pos,
                                        .parent = par,
                                        .logits_rows = rows,
                                        .n_logits = n};
                struct infer_state *st = infer_session_state(ss);
                double c0 = 1e3 * bench_spec_cpu_s();
                uint64_t t0 = sl_now_ns();
                ret = infer_forward_batch(infer_session_model(ss), st, &b, lg, &err);
                t[(which * 4 + k) * runs + r] = (double)(sl_now_ns() - t0) / 1e6;
                tc[(which * 4 + k) * runs + r] = 1e3 * bench_spec_cpu_s() - c0;
                if (ret == 0)
                    ret = infer_kv_truncate(infer_state_kv(st), ctx);
            }
    if (ret < 0) {
        fprintf(stderr, "sluice bench spec: %s\n", err.msg[0] ? err.msg : strerror(-ret));
    } else {
        cJSON *j = cJSON_CreateObject();
        if (m) /* the graphs and the layer's prefill are the int8 path's */
            graph_cost(infer_session_model(s), c->seq_len < 256 ? c->seq_len : 256, j, json);
        /* a model without int8 linears (an F32 import) runs the float path */
        const char *res = !m ? "packed" : infer_model_is_quantized(m) ? "int8" : "float";
        if (!json)
            printf("context %u, %s weights: one forward, ms (median / min over %u runs)\n", ctx,
                   res, runs);
        cJSON_AddStringToObject(j, "resident", res);
        for (int w = 0; w < 1 + !!s1; w++) {
            double one = shape > 1 ? 0 : bench_spec_stat(t + w * 4 * runs, runs, 1);
            double one_c = shape > 1 ? 0 : bench_spec_stat(tc + w * 4 * runs, runs, 1);
            if (!json && s1)
                printf(" %s:\n", w ? "the calling thread alone (no NPU device thread)"
                                    : "split with the NPU device thread");
            for (int k = 0; k < 4; k++) {
                if (shape && shape != shapes[k])
                    continue; /* not timed */
                const double *tk = t + (w * 4 + k) * runs;
                double md = bench_spec_stat(tk, runs, 1), mn = bench_spec_stat(tk, runs, 0);
                double cmd = bench_spec_stat(tc + (w * 4 + k) * runs, runs, 1);
                char key[48];
                snprintf(key, sizeof key, "%srows_%u", w ? "one_thread_" : "", shapes[k]);
                cJSON *o = cJSON_AddObjectToObject(j, key);
                cJSON_AddNumberToObject(o, "median_ms", md);
                cJSON_AddNumberToObject(o, "min_ms", mn);
                cJSON_AddNumberToObject(o, "over_one_row", one > 0 ? md / one : 0);
                cJSON_AddNumberToObject(o, "cpu_median_ms", cmd);
                cJSON_AddNumberToObject(o, "cpu_over_one_row", one_c > 0 ? cmd / one_c : 0);
                if (!json && one > 0)
                    printf("  %2u rows %9.3f / %9.3f   x%.2f of one row; CPU %8.3f ms x%.2f\n",
                           shapes[k], md, mn, md / one, cmd, one_c > 0 ? cmd / one_c : 0);
                else if (!json)
                    printf("  %2u rows %9.3f / %9.3f; CPU %8.3f ms\n", shapes[k], md, mn, cmd);
            }
        }
        if (json) {
            char *p = cJSON_PrintUnformatted(j);
            if (p)
                printf("%s\n", p);
            free(p);
        }
        cJSON_Delete(j);
    }
    free(ids);
    free(lg);
    free(t);
    infer_session_destroy(s);
    infer_session_destroy(s1);
    return ret < 0 ? 1 : 0;
}

/* bench_attn.c: `sluice bench attn`: attention alone, dense float against
 * sparse with NPU estimation (shadowAttn), on real models' head shapes, at
 * equal cores: both split their heads over the same CPU threads (two by
 * default); sparse also has the emulated NPU's device thread on those
 * cores. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "infer.h"
#include "sluice.h"
#include "tools_util.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: sluice bench attn [--shape S] [--ctx N[,N...]] [--mode M] [--keep R]\n"
            "                         [--reps N] [--threads N] [--select S] [--rows N]\n"
            "                         [--estimate E] [--ablate-plan] [--json]\n\n"
            "Times one layer's attention over a KV cache of N slots: dense float attention\n"
            "(the runtime's blocked kernel) against sparse attention (int8 Q.K estimated on\n"
            "the emulated NPU's thread, top-k and exact softmax.V on the CPU), interleaved,\n"
            "each timed --reps times (min and median reported). Both split their heads over\n"
            "the same --threads CPU threads (the calling thread and a persistent second one);\n"
            "sparse also has the emulated NPU's device thread, which runs on the same cores.\n"
            "Keys and queries are synthetic, with the structure attention has in trained\n"
            "models: a few keys per query align with it (and a recall pass, untimed, measures\n"
            "how many of the float Q.K top-k keys the int8 estimate finds, and the float\n"
            "attention mass the kept keys hold). A second line per case gives each thread's\n"
            "half of a dense and a sparse call (mean ms, wall and the thread's CPU time):\n"
            "a split uneven in CPU time is an imbalance; wall above CPU time is other\n"
            "processes' load; dense CPU / sparse CPU is a speedup load moves little.\n"
            "  --shape S     tinyllama (32 heads, 4 kv heads, head_dim 64), llama3-8b (32, 8,\n"
            "                128), or all (default)\n"
            "  --ctx LIST    cache lengths, comma-separated (default 1024,2048,4096,8192)\n"
            "  --mode M      prefill (the last 256-row chunk of the context), decode (one row\n"
            "                at the end), or both (default)\n"
            "  --keep R      sparse: share of keys kept, in (0, 1] (default 0.2; uniform)\n"
            "  --reps N      timed runs of each, 1..1000 (default 3; decode runs 10 times as\n"
            "                many: a step is short)\n"
            "  --threads N   CPU threads for each contender, 1 or 2 (default 2)\n"
            "  --select S    sparse's key lists: head (one per query head and row; default),\n"
            "                group (one per kv head and row, shared by its query heads), or\n"
            "                both (group timed as a third contender, interleaved; JSON\n"
            "                group_ms, group_ms_min, group_speedup (dense / group medians),\n"
            "                group_recall, group_mass)\n"
            "  --rows N      per-head sparse: blocks of N adjacent query rows share one key\n"
            "                list (1..16; default 1: a list per row); not with --select group\n"
            "                (with both, the group contender keeps a list per row)\n"
            "  --estimate E  where sparse's int8 estimates run: device (the emulated NPU's own\n"
            "                thread, launches pipelined two ahead of the CPU side; default),\n"
            "                inline (on the calling thread, in prefill per head just before\n"
            "                its rows pick their keys: no third thread on the two cores, the\n"
            "                same bits), or both (inline timed as\n"
            "                another contender, interleaved; JSON inline_ms, inline_ms_min,\n"
            "                inline_speedup (dense / inline medians))\n"
            "  --ablate-plan also time sparse attention with its NPU launches in head order\n"
            "                instead of Algorithm 1's plan (interleaved with the others)\n"
            "  --json        one JSON object per line: shape, context, mode, rows, threads,\n"
            "                dense and sparse ms (min, median), speedup (of the medians),\n"
            "                recall (each row's int8 top-k against its float top-k: with\n"
            "                --rows, not the block's shared list), mass (the float attention\n"
            "                the kept keys hold), the sparse stages' CPU ms (summed over threads),\n"
            "                dense_cpu_ms and sparse_cpu_ms (the threads' CPU time per call), with\n"
            "                two threads dense_thread_ms, dense_thread2_ms, sparse_thread_ms,\n"
            "                sparse_thread2_ms (each half's mean wall ms),\n"
            "                and with --ablate-plan noplan_ms, noplan_ms_min, plan_speedup\n");
}

struct shape {
    const char *name;
    uint32_t heads, kv_heads, head_dim;
};

static const struct shape shapes[] = {{"tinyllama", 32, 4, 64}, {"llama3-8b", 32, 8, 128}};

static uint64_t rng(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static float gauss(uint64_t *s)
{
    double u = ((double)(rng(s) >> 11) + 0.5) / 9007199254740992.0;
    double v = ((double)(rng(s) >> 11) + 0.5) / 9007199254740992.0;
    return (float)(sqrt(-2 * log(u)) * cos(6.283185307179586 * v));
}

struct dense_arg {
    const struct infer_attention *at;
    const struct format_config *c;
    const struct infer_kv *kv;
    const struct infer_attn_rows *rows;
    const float *q;
    uint32_t h0, h1;
    float *out, *scratch;
    int ret;
    uint64_t busy_ns, cpu_ns; /* summed over the timed calls: this half's run, wall and
                               * its thread's CPU time (less what other processes took) */
};

static uint64_t thread_cpu_ns(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0)
        return 0;
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* dense over two threads, kv heads split in half: a persistent second
 * thread (as a pool would have), handed each call through a condition */
struct pool {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct dense_arg *arg;
    int go, done, quit;
};

static void *pool_main(void *p)
{
    struct pool *pl = p;
    pthread_mutex_lock(&pl->mu);
    for (;;) {
        while (!pl->go && !pl->quit)
            pthread_cond_wait(&pl->cv, &pl->mu);
        if (pl->quit)
            break;
        pl->go = 0;
        struct dense_arg *a = pl->arg;
        pthread_mutex_unlock(&pl->mu);
        uint64_t t0 = sl_now_ns(), c0 = thread_cpu_ns();
        a->ret = a->at->run(a->at, a->c, a->kv, 0, a->rows, a->q, a->h0, a->h1, a->out,
                            a->scratch);
        a->busy_ns += sl_now_ns() - t0;
        a->cpu_ns += thread_cpu_ns() - c0;
        pthread_mutex_lock(&pl->mu);
        pl->done = 1;
        pthread_cond_broadcast(&pl->cv);
    }
    pthread_mutex_unlock(&pl->mu);
    return NULL;
}

/* one attention call, its heads split over the calling thread and the
 * pool's (threads 2), or all on the calling thread (threads 1) */
static int split_run(struct pool *pl, struct dense_arg a[2], uint32_t threads)
{
    if (threads == 1) {
        struct dense_arg *x = &a[0];
        uint64_t t0 = sl_now_ns(), c0 = thread_cpu_ns();
        int ret = x->at->run(x->at, x->c, x->kv, 0, x->rows, x->q, x->h0, a[1].h1, x->out,
                             x->scratch);
        x->busy_ns += sl_now_ns() - t0;
        x->cpu_ns += thread_cpu_ns() - c0;
        return ret;
    }
    pthread_mutex_lock(&pl->mu);
    pl->arg = &a[1];
    pl->done = 0;
    pl->go = 1;
    pthread_cond_broadcast(&pl->cv);
    pthread_mutex_unlock(&pl->mu);
    uint64_t t0 = sl_now_ns(), c0 = thread_cpu_ns();
    a[0].ret = a[0].at->run(a[0].at, a[0].c, a[0].kv, 0, a[0].rows, a[0].q, a[0].h0, a[0].h1,
                            a[0].out, a[0].scratch);
    a[0].busy_ns += sl_now_ns() - t0;
    a[0].cpu_ns += thread_cpu_ns() - c0;
    pthread_mutex_lock(&pl->mu);
    while (!pl->done)
        pthread_cond_wait(&pl->cv, &pl->mu);
    pthread_mutex_unlock(&pl->mu);
    return a[0].ret < 0 ? a[0].ret : a[1].ret;
}

static int cmp_d(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

/* warm-up (graphs built, int8 keys prepared, memory touched), then reps
 * interleaved runs of each contender (dense, sparse, sparse without the
 * plan when timed: t[2] non-NULL, the shared selection: t[3], the estimates
 * inline: t[4]) */
static int time_all(struct pool *pl, struct dense_arg ca[5][2], uint32_t threads, uint32_t reps,
                    double *t[5])
{
    int ret;
    for (int c = 0; c < 5; c++)
        if (t[c] && (ret = split_run(pl, ca[c], threads)) < 0)
            return ret;
    for (int c = 0; c < 5; c++)
        ca[c][0].busy_ns = ca[c][1].busy_ns = ca[c][0].cpu_ns = ca[c][1].cpu_ns = 0;
    for (uint32_t r = 0; r < reps; r++)
        for (int c = 0; c < 5; c++) {
            if (!t[c])
                continue;
            uint64_t t0 = sl_now_ns();
            if ((ret = split_run(pl, ca[c], threads)) < 0)
                return ret;
            t[c][r] = (double)(sl_now_ns() - t0) / 1e6;
        }
    return 0;
}

struct bench_opts {
    double keep;
    uint32_t reps, threads;
    int json, ablate_plan, select; /* select: 0 head, 1 group, 2 both */
    int estimate;                  /* 0 device, 1 inline, 2 both */
    uint32_t rows;                 /* per-head contenders' row blocks */
};

static int one_case(const struct shape *sh, uint32_t T, int decode, const struct bench_opts *bo,
                    struct sl_err *err)
{
    double keep = bo->keep;
    uint32_t reps = bo->reps;
    int json = bo->json;
    struct format_config c = {.dim = sh->heads * sh->head_dim, .hidden_dim = 4 * sh->heads,
                              .n_layers = 1, .n_heads = sh->heads, .n_kv_heads = sh->kv_heads,
                              .head_dim = sh->head_dim, .vocab_size = 32, .seq_len = T,
                              .rope_theta = 10000, .norm_eps = 1e-5f};
    uint32_t n = decode ? 1 : (T < 256 ? T : 256), base = T - n;
    if (decode)
        reps *= 10;
    uint32_t H = sh->heads, KV = sh->kv_heads, hd = sh->head_dim;
    size_t kv_dim = (size_t)KV * hd, qdim = (size_t)H * hd;
    struct infer_kv *kv = NULL;
    struct infer_sparse *sp = NULL, *spm = NULL, *spn = NULL, *spg = NULL, *spgm = NULL, *spi = NULL;
    float *k = malloc(sizeof(float) * T * kv_dim), *v = malloc(sizeof(float) * T * kv_dim);
    float *q = malloc(sizeof(float) * n * qdim), *od = malloc(sizeof(float) * n * qdim);
    float *os = malloc(sizeof(float) * n * qdim);
    float *on = malloc(sizeof(float) * n * qdim), *og = malloc(sizeof(float) * n * qdim);
    float *scr = malloc(sizeof(float) * 64 * (size_t)T * 11);
    double *td = malloc(sizeof(double) * reps), *ts = malloc(sizeof(double) * reps);
    double *tn = malloc(sizeof(double) * reps), *tg = malloc(sizeof(double) * reps);
    double *ti = malloc(sizeof(double) * reps);
    float *oi = malloc(sizeof(float) * n * qdim);
    int ret = -ENOMEM;
    if (!k || !v || !q || !od || !os || !on || !og || !scr || !td || !ts || !tn || !tg || !ti || !oi) {
        sl_err_set(err, "out of memory");
        goto out;
    }
    /* keys: noise plus, per kv head, one of 16 topic directions; a query
     * leans on its topic, so about 1/16 of the keys stand out, and some
     * keys are strong (attention's heavy hitters) */
    uint64_t s = 0x9e3779b97f4a7c15ull ^ T ^ ((uint64_t)hd << 32);
    enum { TOPICS = 16 };
    float *dir = malloc(sizeof(float) * TOPICS * kv_dim);
    if (!dir)
        goto out;
    for (size_t i = 0; i < TOPICS * kv_dim; i++)
        dir[i] = gauss(&s);
    for (uint32_t t = 0; t < T; t++)
        for (uint32_t g = 0; g < KV; g++) {
            uint32_t topic = (uint32_t)(rng(&s) % TOPICS);
            float w = (rng(&s) % 8 == 0) ? 2.0f : 0.7f;
            for (uint32_t j = 0; j < hd; j++) {
                size_t at = (size_t)t * kv_dim + (size_t)g * hd + j;
                k[at] = 0.6f * gauss(&s) + w * dir[(size_t)topic * kv_dim + (size_t)g * hd + j];
                v[at] = gauss(&s);
            }
        }
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t h = 0; h < H; h++) {
            uint32_t g = h / (H / KV), topic = (uint32_t)(rng(&s) % TOPICS);
            for (uint32_t j = 0; j < hd; j++)
                q[(size_t)i * qdim + (size_t)h * hd + j] =
                    (0.5f * gauss(&s) + dir[(size_t)topic * kv_dim + (size_t)g * hd + j]) /
                    sqrtf((float)hd) * 2.5f;
        }
    free(dir);
    if ((ret = infer_kv_create(&c, T, INFER_KV_K8, &kv, err)) < 0)
        goto out;
    if ((ret = infer_kv_append(kv, k, v, T)) < 0) {
        sl_err_set(err, "cannot fill the KV cache");
        goto out;
    }
    struct infer_sparse_opts so = {.keep = keep, .sinks = 4, .window = 16, .uniform = 1,
                                   .select_group = bo->select == 1,
                                   .row_block = bo->select == 1 ? 0 : bo->rows,
                                   .inline_npu = bo->estimate == 1};
    if ((ret = infer_sparse_create(&c, NULL, &so, &sp, err)) < 0)
        goto out;
    if (bo->estimate == 2) { /* the estimates inline as another contender */
        so.inline_npu = 1;
        if ((ret = infer_sparse_create(&c, NULL, &so, &spi, err)) < 0)
            goto out;
        so.inline_npu = 0;
    }
    if (bo->select == 2) { /* the shared selection as a third contender (row
                              * blocks are the per-head selection's only) */
        so.select_group = 1;
        so.row_block = 0;
        if ((ret = infer_sparse_create(&c, NULL, &so, &spg, err)) < 0)
            goto out;
        so.measure = 1;
        so.inline_npu = 1;
        if ((ret = infer_sparse_create(&c, NULL, &so, &spgm, err)) < 0)
            goto out;
        so = (struct infer_sparse_opts){.keep = keep, .sinks = 4, .window = 16, .uniform = 1,
                                        .row_block = bo->rows, .inline_npu = bo->estimate == 1};
    }
    if (bo->ablate_plan) {
        so.no_plan = 1;
        if ((ret = infer_sparse_create(&c, NULL, &so, &spn, err)) < 0)
            goto out;
        so.no_plan = 0;
    }
    so.measure = 1;
    so.inline_npu = 1;
    if ((ret = infer_sparse_create(&c, NULL, &so, &spm, err)) < 0)
        goto out;
    struct infer_attn_rows rows = {.n = n, .base = base};
    uint32_t half = KV / 2 * (H / KV);
    const struct infer_attention *sa = infer_sparse_attention(sp);
    const struct infer_attention *na = spn ? infer_sparse_attention(spn) : sa;
    const struct infer_attention *ga = spg ? infer_sparse_attention(spg) : sa;
    const struct infer_attention *ia = spi ? infer_sparse_attention(spi) : sa;
    size_t sT = 64 * (size_t)T;
    struct dense_arg ca[5][2] = {
        {{&infer_attention_dense, &c, kv, &rows, q, 0, half, od, scr, 0, 0, 0},
         {&infer_attention_dense, &c, kv, &rows, q, half, H, od, scr + sT, 0, 0, 0}},
        {{sa, &c, kv, &rows, q, 0, half, os, scr + 2 * sT, 0, 0, 0},
         {sa, &c, kv, &rows, q, half, H, os, scr + 3 * sT, 0, 0, 0}},
        {{na, &c, kv, &rows, q, 0, half, on, scr + 4 * sT, 0, 0, 0},
         {na, &c, kv, &rows, q, half, H, on, scr + 5 * sT, 0, 0, 0}},
        {{ga, &c, kv, &rows, q, 0, half, og, scr + 7 * sT, 0, 0, 0},
         {ga, &c, kv, &rows, q, half, H, og, scr + 8 * sT, 0, 0, 0}},
        {{ia, &c, kv, &rows, q, 0, half, oi, scr + 9 * sT, 0, 0, 0},
         {ia, &c, kv, &rows, q, half, H, oi, scr + 10 * sT, 0, 0, 0}}};
    double *tt[5] = {td, ts, spn ? tn : NULL, spg ? tg : NULL, spi ? ti : NULL};
    struct pool pl = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    pthread_t worker;
    if (pthread_create(&worker, NULL, pool_main, &pl) != 0) {
        sl_err_set(err, "cannot start a thread");
        ret = -EAGAIN;
        goto out;
    }
    ret = time_all(&pl, ca, bo->threads, reps, tt);
    pthread_mutex_lock(&pl.mu);
    pl.quit = 1;
    pthread_cond_broadcast(&pl.cv);
    pthread_mutex_unlock(&pl.mu);
    pthread_join(worker, NULL);
    if (ret < 0)
        goto out;
    /* recall and mass, untimed */
    const struct infer_attention *ma = infer_sparse_attention(spm);
    if ((ret = ma->run(ma, &c, kv, 0, &rows, q, 0, H, os, scr + 6 * sT)) < 0)
        goto out;
    struct infer_sparse_stats st, sst, gst = {0};
    infer_sparse_stats(spm, &st);
    if (spgm) {
        if ((ret = infer_sparse_attention(spgm)->run(infer_sparse_attention(spgm), &c, kv, 0,
                                                     &rows, q, 0, H, og, scr + 6 * sT)) < 0)
            goto out;
        infer_sparse_stats(spgm, &gst);
        qsort(tg, reps, sizeof *tg, cmp_d);
    }
    if (spi) {
        qsort(ti, reps, sizeof *ti, cmp_d);
        if (memcmp(oi, os, sizeof(float) * n * qdim)) { /* the same bits, or a bug */
            sl_err_set(err, "the inline estimates gave another output than the device's");
            ret = -EPROTO;
            goto out;
        }
    }
    infer_sparse_stats(sp, &sst);
    double calls = (double)(reps + 1), per = 1e6 * calls;
    double w_ms = (double)sst.wait_ns / per, k_ms = (double)sst.topk_ns / per,
           v_ms = (double)sst.qkv_ns / per;
    qsort(td, reps, sizeof *td, cmp_d);
    qsort(ts, reps, sizeof *ts, cmp_d);
    if (spn)
        qsort(tn, reps, sizeof *tn, cmp_d);
    double dmed = td[reps / 2], smed = ts[reps / 2];
    if (json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "shape", sh->name);
        cJSON_AddNumberToObject(o, "context", T);
        cJSON_AddStringToObject(o, "mode", decode ? "decode" : "prefill");
        cJSON_AddNumberToObject(o, "rows", n);
        cJSON_AddNumberToObject(o, "keep", keep);
        cJSON_AddNumberToObject(o, "dense_ms", dmed);
        cJSON_AddNumberToObject(o, "dense_ms_min", td[0]);
        cJSON_AddNumberToObject(o, "sparse_ms", smed);
        cJSON_AddNumberToObject(o, "sparse_ms_min", ts[0]);
        cJSON_AddNumberToObject(o, "speedup", dmed / smed);
        cJSON_AddNumberToObject(o, "recall", st.recall);
        cJSON_AddNumberToObject(o, "mass", st.mass);
        cJSON_AddNumberToObject(o, "rows_per_list", bo->select != 1 && bo->rows > 1 ? bo->rows : 1);
        cJSON_AddNumberToObject(o, "kept_share", st.keys_visible ? (double)st.keys_kept /
                                                                       (double)st.keys_visible
                                                                 : 0);
        cJSON_AddNumberToObject(o, "reps", reps);
        cJSON_AddNumberToObject(o, "threads", bo->threads);
        if (spn) {
            cJSON_AddNumberToObject(o, "noplan_ms", tn[reps / 2]);
            cJSON_AddNumberToObject(o, "noplan_ms_min", tn[0]);
            cJSON_AddNumberToObject(o, "plan_speedup", tn[reps / 2] / smed);
        }
        if (spi) {
            cJSON_AddNumberToObject(o, "inline_ms", ti[reps / 2]);
            cJSON_AddNumberToObject(o, "inline_ms_min", ti[0]);
            cJSON_AddNumberToObject(o, "inline_speedup", dmed / ti[reps / 2]);
        }
        if (spg) {
            cJSON_AddNumberToObject(o, "group_ms", tg[reps / 2]);
            cJSON_AddNumberToObject(o, "group_ms_min", tg[0]);
            cJSON_AddNumberToObject(o, "group_speedup", dmed / tg[reps / 2]);
            cJSON_AddNumberToObject(o, "group_recall", gst.recall);
            cJSON_AddNumberToObject(o, "group_mass", gst.mass);
        }
        if (bo->threads > 1) { /* per thread, the mean of a call's half */
            cJSON_AddNumberToObject(o, "dense_thread_ms", (double)ca[0][0].busy_ns / 1e6 / reps);
            cJSON_AddNumberToObject(o, "dense_thread2_ms", (double)ca[0][1].busy_ns / 1e6 / reps);
            cJSON_AddNumberToObject(o, "sparse_thread_ms", (double)ca[1][0].busy_ns / 1e6 / reps);
            cJSON_AddNumberToObject(o, "sparse_thread2_ms", (double)ca[1][1].busy_ns / 1e6 / reps);
        }
        cJSON_AddNumberToObject(o, "dense_cpu_ms",
                                (double)(ca[0][0].cpu_ns + ca[0][1].cpu_ns) / 1e6 / reps);
        cJSON_AddNumberToObject(o, "sparse_cpu_ms",
                                (double)(ca[1][0].cpu_ns + ca[1][1].cpu_ns) / 1e6 / reps);
        cJSON_AddNumberToObject(o, "sparse_wait_ms", w_ms);
        cJSON_AddNumberToObject(o, "sparse_topk_ms", k_ms);
        cJSON_AddNumberToObject(o, "sparse_qkv_ms", v_ms);
        char *js = cJSON_PrintUnformatted(o);
        printf("%s\n", js ? js : "{}");
        fflush(stdout);
        free(js);
        cJSON_Delete(o);
    } else {
        printf("%-10s %6u %-8s %4u rows  dense %9.3f ms (min %9.3f)  sparse %9.3f ms (min "
               "%9.3f)  x%.2f  recall %.4f  mass %.4f  (sparse: NPU wait %.2f, top-k %.2f, "
               "softmax.V %.2f ms)\n",
               sh->name, T, decode ? "decode" : "prefill", n, dmed, td[0], smed, ts[0],
               dmed / smed, st.recall, st.mass, w_ms, k_ms, v_ms);
        /* the halves' own time (an imbalance, or both slowed) and their
         * threads' CPU time (less than the wall time: other processes ran) */
        printf("%-10s %6u %-8s %4u rows  per thread, mean ms wall (cpu), calling / second: "
               "dense %.2f (%.2f) / %.2f (%.2f)  sparse %.2f (%.2f) / %.2f (%.2f)\n",
               sh->name, T, decode ? "decode" : "prefill", n,
               (double)ca[0][0].busy_ns / 1e6 / reps, (double)ca[0][0].cpu_ns / 1e6 / reps,
               (double)ca[0][1].busy_ns / 1e6 / reps, (double)ca[0][1].cpu_ns / 1e6 / reps,
               (double)ca[1][0].busy_ns / 1e6 / reps, (double)ca[1][0].cpu_ns / 1e6 / reps,
               (double)ca[1][1].busy_ns / 1e6 / reps, (double)ca[1][1].cpu_ns / 1e6 / reps);
        if (spn)
            printf("%-10s %6u %-8s %4u rows  sparse without the plan %9.3f ms (min %9.3f): the "
                   "plan x%.3f\n",
                   sh->name, T, decode ? "decode" : "prefill", n, tn[reps / 2], tn[0],
                   tn[reps / 2] / smed);
        if (spi)
            printf("%-10s %6u %-8s %4u rows  sparse, estimates inline (--estimate inline) %9.3f "
                   "ms (min %9.3f)  x%.2f\n",
                   sh->name, T, decode ? "decode" : "prefill", n, ti[reps / 2], ti[0],
                   dmed / ti[reps / 2]);
        if (spg)
            printf("%-10s %6u %-8s %4u rows  sparse, shared lists (--select group) %9.3f ms "
                   "(min %9.3f)  x%.2f  recall %.4f  mass %.4f\n",
                   sh->name, T, decode ? "decode" : "prefill", n, tg[reps / 2], tg[0],
                   dmed / tg[reps / 2], gst.recall, gst.mass);
        fflush(stdout);
    }
    ret = 0;
out:
    infer_sparse_destroy(sp);
    infer_sparse_destroy(spm);
    infer_sparse_destroy(spn);
    infer_sparse_destroy(spg);
    infer_sparse_destroy(spgm);
    infer_sparse_destroy(spi);
    infer_kv_destroy(kv);
    free(k);
    free(v);
    free(q);
    free(od);
    free(os);
    free(on);
    free(og);
    free(tn);
    free(tg);
    free(ti);
    free(oi);
    free(scr);
    free(td);
    free(ts);
    return ret;
}

int bench_attn(int argc, char **argv)
{
    const char *shape = "all", *ctxs = "1024,2048,4096,8192", *mode = "both";
    struct bench_opts bo = {.keep = 0.2, .reps = 3, .threads = 2};
    struct tools_args a = {"sluice bench attn", usage, argc, argv, 0};
    for (a.i = 1; a.i < argc; a.i++) {
        const char *s = argv[a.i];
        int bad = 0;
        if (tools_args_help(&a)) {
            return 0;
        } else if (!strcmp(s, "--shape")) {
            bad = tools_args_value(&a, &shape);
        } else if (!strcmp(s, "--ctx")) {
            bad = tools_args_value(&a, &ctxs);
        } else if (!strcmp(s, "--mode")) {
            bad = tools_args_value(&a, &mode);
        } else if (!strcmp(s, "--keep")) {
            bad = tools_args_double(&a, 0, 1, TOOLS_ARGS_ABOVE_MIN, &bo.keep);
        } else if (!strcmp(s, "--reps")) {
            bad = tools_args_u32(&a, 1, 1000, &bo.reps);
        } else if (!strcmp(s, "--threads")) {
            bad = tools_args_u32(&a, 1, 2, &bo.threads);
        } else if (!strcmp(s, "--select")) {
            static const char *const sel[] = {"head", "group", "both"};
            bad = tools_args_choice(&a, sel, 3, &bo.select);
        } else if (!strcmp(s, "--rows")) {
            bad = tools_args_u32(&a, 1, 16, &bo.rows);
        } else if (!strcmp(s, "--estimate")) {
            static const char *const est[] = {"device", "inline", "both"};
            bad = tools_args_choice(&a, est, 3, &bo.estimate);
        } else if (!strcmp(s, "--ablate-plan")) {
            bo.ablate_plan = 1;
        } else if (!strcmp(s, "--json")) {
            bo.json = 1;
        } else {
            bad = tools_args_unexpected(&a);
        }
        if (bad)
            return 2;
    }
    if (bo.select == 1 && bo.rows > 1) {
        fprintf(stderr, "sluice bench attn: --rows applies to the per-head selection "
                        "(--select head or both), not to --select group\n");
        return 2;
    }
    int pick = !strcmp(shape, "all") ? -1 : !strcmp(shape, "tinyllama") ? 0
               : !strcmp(shape, "llama3-8b")                            ? 1
                                                                        : -2;
    int modes = !strcmp(mode, "both") ? 3 : !strcmp(mode, "prefill") ? 1 : !strcmp(mode, "decode") ? 2 : 0;
    if (pick == -2 || !modes) {
        fprintf(stderr, "sluice bench attn: unknown %s '%s' (see --help)\n",
                pick == -2 ? "shape" : "mode", pick == -2 ? shape : mode);
        return 2;
    }
    uint32_t list[32], nl = 0;
    for (const char *p = ctxs; *p && nl < 32;) {
        char buf[32];
        size_t l = strcspn(p, ",");
        if (l == 0 || l >= sizeof buf) {
            fprintf(stderr, "sluice bench attn: --ctx wants numbers separated by commas\n");
            return 2;
        }
        memcpy(buf, p, l);
        buf[l] = 0;
        if (tools_parse_u32(buf, &list[nl]) < 0 || list[nl] < 16 || list[nl] > 65536) {
            fprintf(stderr, "sluice bench attn: --ctx: '%s' is not a length in 16..65536\n", buf);
            return 2;
        }
        nl++;
        p += l + (p[l] == ',');
    }
    if (!bo.json)
        printf("attention alone, one layer, keep %.2f (uniform), heads split over %u thread%s "
               "for dense and for sparse (plus the emulated NPU's thread); medians of %u runs "
               "(decode: %u)\n",
               bo.keep, bo.threads, bo.threads > 1 ? "s" : "", bo.reps, 10 * bo.reps);
    struct sl_err err = {{0}};
    for (int si = 0; si < 2; si++) {
        if (pick >= 0 && pick != si)
            continue;
        for (uint32_t i = 0; i < nl; i++)
            for (int m = 0; m < 2; m++) {
                if (!(modes & (1 << m)))
                    continue;
                int ret = one_case(&shapes[si], list[i], m == 1, &bo, &err);
                if (ret < 0) {
                    fprintf(stderr, "sluice bench attn: %s\n", err.msg[0] ? err.msg : strerror(-ret));
                    return 1;
                }
            }
    }
    return 0;
}

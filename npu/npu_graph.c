/* npu_graph.c: static graphs of the emulated NPU (llm.npu 3.2 chunk-sharing
 * graphs): building one (validation, kernel and register tiling chosen by
 * timing the candidates on the graph's own shape, a self-check against the
 * scalar reference, staging buffers allocated and touched), checking a job
 * against it, and running it on any thread with identical results. */
#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "npu_est.h"
#include "npu_internal.h"

/* Rows per slice when a padded job computes its zero rows: a multiple of
 * every tiling's row count (3, 6, 8, 12), so slices start on tile bounds. */
#define PAD_SLICE 24u
/* Output channels of the probe the tilings are timed on: 1.5, 2 and 3
 * panels of the 64-, 48- and 32-channel tilings. */
#define PROBE_N 96u
/* Graphs of at most SMALL_M rows (decode m = 1, draft verification m = 4,
 * 8, 16) run every tiling on a partial row tile, so the tilings differ only
 * in panel width, and a probe of a panel and a half of the widest tiling
 * favours the others (m = 1: 8x48 picked, 6x64 measured 6% faster on a
 * 2048 x 2048 layer). Their probe is whole panels of every tiling instead
 * (4, 3 and 2 blocks of 16 channels divide 12), cheap at these m, and each
 * tiling's time is the best of up to SMALL_REPS runs, as many as fit in
 * SMALL_MACS multiply-adds: one run of a few microseconds is noise. */
#define SMALL_M 16u
#define PROBE_N_SMALL 192u
#define SMALL_REPS 5
#define SMALL_MACS (8ull << 20)

/* Zero activations, the source of the padded rows (read with stride 0). */
static const int8_t zero_row[NPU_GRAPH_MAX_K];

const char *npu_dtype_name(enum npu_dtype t)
{
    static const char *const names[] = {"int8", "int32", "f16", "bf16", "f32"};
    return (unsigned)t < sizeof names / sizeof names[0] ? names[t] : "unknown";
}

int npu_graph_desc_check(const struct npu_graph_desc *d, struct sl_err *err)
{
    if (d->a_type != NPU_DTYPE_INT8 || d->w_type != NPU_DTYPE_INT8 ||
        d->y_type != NPU_DTYPE_F32) {
        sl_err_set(err,
                   "npu: no graph for a %s x %s -> %s matmul: the NPU runs only int8 x int8 "
                   "matmuls dequantized to f32",
                   npu_dtype_name(d->a_type), npu_dtype_name(d->w_type),
                   npu_dtype_name(d->y_type));
        return -ENOTSUP;
    }
    if (d->m == 0 || d->m > NPU_GRAPH_MAX_M || d->k == 0 || d->k > NPU_GRAPH_MAX_K ||
        d->n == 0 || d->n > NPU_GRAPH_MAX_N) {
        sl_err_set(err,
                   "npu: no graph for shape m=%u k=%u n=%u: each must be at least 1 and at "
                   "most m=%u k=%u n=%u",
                   d->m, d->k, d->n, NPU_GRAPH_MAX_M, NPU_GRAPH_MAX_K, NPU_GRAPH_MAX_N);
        return -EINVAL;
    }
    return 0;
}

int npu_job_check(const struct npu_graph *g, const struct npu_job *job, struct sl_err *err)
{
    if (!job) {
        sl_err_set(err, "npu: no job");
        return -EINVAL;
    }
    if (!g) {
        sl_err_set(err, "npu: the job names no graph (build one for its shape first)");
        return -ENOENT;
    }
    const struct npu_graph_desc *d = &g->desc;
    if (job->a_type != NPU_DTYPE_INT8) {
        sl_err_set(err, "npu: graph %ux%ux%u: activations are %s, the NPU takes int8 only",
                   d->m, d->k, d->n, npu_dtype_name(job->a_type));
        return -ENOTSUP;
    }
    if (!job->w) {
        sl_err_set(err, "npu: graph %ux%ux%u: the job has no prepared weights", d->m, d->k,
                   d->n);
        return -EINVAL;
    }
    if (job->w->rows != d->n || job->w->cols != d->k) {
        sl_err_set(err,
                   "npu: graph %ux%ux%u wants weights of %u x %u (n x k), the job's are "
                   "%u x %u",
                   d->m, d->k, d->n, d->n, d->k, job->w->rows, job->w->cols);
        return -EINVAL;
    }
    if (job->rows == 0 || job->rows > d->m) {
        sl_err_set(err, "npu: graph %ux%ux%u takes 1 to %u rows, the job has %u", d->m, d->k,
                   d->n, d->m, job->rows);
        return -EINVAL;
    }
    uint32_t n1 = npu_job_r1(g, job);
    if ((job->r1 == 0 && job->r0 != 0) || job->r0 >= n1 || n1 > d->n) {
        sl_err_set(err, "npu: graph %ux%ux%u: channel range [%u, %u) is not inside [0, %u)",
                   d->m, d->k, d->n, job->r0, job->r1, d->n);
        return -EINVAL;
    }
    if (job->ldy != 0 && job->ldy < n1) {
        sl_err_set(err, "npu: graph %ux%ux%u: output row stride %zu is below channel %u", d->m,
                   d->k, d->n, job->ldy, n1);
        return -EINVAL;
    }
    if (!job->xq || !job->y) {
        sl_err_set(err, "npu: graph %ux%ux%u: the job has no %s buffer", d->m, d->k, d->n,
                   job->xq ? "output" : "input");
        return -EINVAL;
    }
    if (job->add && job->a_max) {
        sl_err_set(err, "npu: graph %ux%ux%u: a job with a_max cannot add to its output",
                   d->m, d->k, d->n);
        return -EINVAL;
    }
    if (!(job->act_scale > 0) || !isfinite(job->act_scale)) {
        sl_err_set(err, "npu: graph %ux%ux%u: activation scale %g is not positive and finite",
                   d->m, d->k, d->n, (double)job->act_scale);
        return -EINVAL;
    }
    return 0;
}

void npu_graph_exec(const struct npu_graph *g, struct npu_job *job, uint8_t *stage,
                    uint64_t *held)
{
    const struct npu_graph_desc *d = &g->desc;
    const struct npu_weights *w = job->w;
    const uint32_t n0 = job->r0, n1 = npu_job_r1(g, job);
    job->t_start = sl_now_ns();
    struct npu_gemm_args a = {.b = w->b,
                              .a = stage,
                              .m = job->rows,
                              .r0 = n0,
                              .r1 = n1,
                              .y = job->y + n0,
                              .ldy = job->ldy ? job->ldy : d->n,
                              .add = job->add,
                              .act_scale = job->act_scale,
                              .scale = w->scale,
                              .tile = g->tile};
    int P = 0;
#if SLUICE_KERNELS_X86
#if SLUICE_KERNELS_AMX
    /* the attention's estimates (npu_job.a_max) on AMX's int8 tiles
     * (npu_graph.amx_est) */
    if (job->a_max && g->amx_est) {
        if (held)
            *held = 0;
        npu_est_amx_prep(job->xq, job->rows, d->k, g->k4, stage);
        npu_est_gemm_amx(&a);
        P = -1;
    }
#endif
    /* narrow activations (npu_job.a_max) on the AVX2 kernel: its pre-summed steps */
    if (!P && job->a_max && g->ops == &npu_ops_avx2 && (P = npu_est_presum(job->a_max))) {
        /* npu_est_prep writes the staging before it finds a code past the
         * bound: whatever it returns, the staging no longer holds a chunk's
         * usual layout */
        if (held)
            *held = 0;
        if (!npu_est_blocks_ok(w->b, n0, n1) ||
            npu_est_prep(job->xq, job->rows, d->k, g->k4, P, stage) < 0)
            P = 0;
    }
    if (P > 0)
        npu_est_gemm_avx2(&a, P);
#endif
    if (!P && npu_gemm_direct(g->ops, d->k)) {
        /* the whole row tiles read straight from xq (no copy: restaging a
         * chunk's activations for every 512-channel piece cost 10-15% of
         * the AMX kernel's time in a 512-token prefill); a partial last tile staged */
        const uint32_t whole = job->rows / 16 * 16;
        a.xq = job->xq;
        a.lda = d->k;
        if (job->rows > 16 && whole < job->rows) {
            g->ops->prep(job->xq + (size_t)whole * d->k, d->k, job->rows - whole, d->k, g->k4,
                         g->tile, stage);
            if (held)
                *held = 0;
        }
        g->ops->gemm(&a);
        a.xq = NULL;
    } else if (!P) {
        /* a chunk's activations staged once for all its jobs (npu_job.stage_key) */
        if (!job->stage_key || !held || *held != job->stage_key)
            g->ops->prep(job->xq, d->k, job->rows, d->k, g->k4, g->tile, stage);
        if (held)
            *held = job->stage_key;
        g->ops->gemm(&a);
    }
    if (!g->pad_rows || job->rows == d->m) {
        job->t_end = sl_now_ns();
        return;
    }
    /* a static-shape NPU computes the whole chunk: the zero rows too, into a
     * sink after the staging area, PAD_SLICE rows at a time */
    uintptr_t end = (uintptr_t)(stage + npu_gemm_prep_bytes(g->k4, d->m));
    float *sink = (float *)((end + 63) & ~(uintptr_t)63);
    uint32_t pad = d->m - job->rows;
    if (held) /* the zero rows go over the staged ones */
        *held = 0;
    /* every slice is the same zero rows: staged once (any kernel's layout) */
    g->ops->prep(zero_row, 0, pad < PAD_SLICE ? pad : PAD_SLICE, d->k, g->k4, g->tile, stage);
    for (uint32_t i = 0; i < pad; i += PAD_SLICE) {
        a.a = stage;
        a.m = pad - i < PAD_SLICE ? pad - i : PAD_SLICE;
        a.y = sink;
        a.ldy = n1 - n0;
        a.add = 0; /* nothing to add to in the sink */
        g->ops->gemm(&a);
    }
    job->t_end = sl_now_ns();
}

static size_t scratch_bytes(const struct npu_graph_desc *d, uint32_t k4, int pad_rows)
{
    size_t s = npu_gemm_prep_bytes(k4, d->m);
    if (pad_rows) /* the sink, 64-byte aligned inside the buffer */
        s += 64 + sizeof(float) * (size_t)PAD_SLICE * d->n;
    return s;
}

/* xorshift64 bytes in [-127, 127], eight per step (the probe's data; any
 * values would do). */
static void fill_random(int8_t *x, size_t n, uint64_t *st)
{
    for (size_t i = 0; i < n; i += 8) {
        uint64_t v = *st;
        v ^= v << 13, v ^= v >> 7, v ^= v << 17;
        *st = v;
        size_t c = n - i < 8 ? n - i : 8;
        memcpy(x + i, &v, c);
    }
    for (size_t i = 0; i < n; i++)
        x[i] = x[i] == INT8_MIN ? INT8_MAX : x[i];
}

/* Times every tiling of the kernel on the graph's m and k against a probe
 * of PROBE_N (or PROBE_N_SMALL) channels (after one warm-up run) and keeps
 * the fastest; every tiling's output is checked against the scalar
 * definition on the first, middle and last rows. With one candidate (a
 * forced tiling, a kernel with one, a graph of more than the kernel's
 * probe_max_m rows) nothing is timed, only checked. The
 * cost grows with m (the probe is m x k x its channels), so a decode graph
 * costs a small part of a prefill graph of the same k and n. */
static int choose_and_check(struct npu_graph *g, int forced_tile, struct sl_err *err)
{
    const struct npu_graph_desc *d = &g->desc;
    const int small = d->m <= SMALL_M;
    const uint32_t probe_n = small ? PROBE_N_SMALL : PROBE_N;
    const uint32_t pn = d->n < probe_n ? d->n : probe_n;
    /* distinct rows only: m = 1 and 2 have fewer than three */
    uint32_t check_rows[3] = {0, d->m / 2, d->m - 1}, nq = 1;
    for (int q = 1; q < 3; q++)
        if (check_rows[q] != check_rows[nq - 1])
            check_rows[nq++] = check_rows[q];
    const int t0 = forced_tile >= 0 ? forced_tile : 0;
    const int t1 = forced_tile >= 0 ? forced_tile + 1 : g->ops->tiles;
    int reps = t1 - t0 == 1 ? 0 : 1;
    if (reps && small) {
        uint64_t fit = SMALL_MACS / ((uint64_t)d->m * d->k * pn);
        reps = fit >= SMALL_REPS ? SMALL_REPS : fit > 1 ? (int)fit : 1;
    }
    int ret = -ENOMEM;
    int8_t *a = sl_malloc((size_t)d->m * d->k);
    int8_t *bw = sl_malloc((size_t)pn * d->k);
    int32_t *c = sl_malloc(sizeof(int32_t) * (size_t)d->m * pn);
    int32_t *want = sl_malloc(sizeof(int32_t) * 3 * pn);
    struct npu_gemm_b *b = NULL;
    if (!a || !bw || !c || !want)
        goto fail;
    uint64_t st = 0x9e3779b97f4a7c15ull ^ ((uint64_t)d->m << 40 | (uint64_t)d->k << 20 | d->n);
    fill_random(a, (size_t)d->m * d->k, &st);
    fill_random(bw, (size_t)pn * d->k, &st);
    ret = npu_gemm_b_create(bw, pn, d->k, &b);
    if (ret < 0)
        goto fail;
    for (uint32_t q = 0; q < nq; q++)
        for (uint32_t r = 0; r < pn; r++) {
            int32_t acc = 0;
            for (uint32_t j = 0; j < d->k; j++)
                acc += (int32_t)a[(size_t)check_rows[q] * d->k + j] * bw[(size_t)r * d->k + j];
            want[q * pn + r] = acc;
        }
    struct npu_gemm_args ga = {.b = b, .a = g->stage, .m = d->m, .r0 = 0, .r1 = pn, .c = c,
                               .ldc = pn};
    uint64_t best = UINT64_MAX;
    g->tile = t0;
    for (int t = t0; t < t1; t++) {
        g->ops->prep(a, d->k, d->m, d->k, g->k4, t, g->stage);
        ga.tile = t;
        if (t == t0 || reps == 0)
            g->ops->gemm(&ga); /* warm-up: code, probe weights and staging in cache */
        g->tilings_timed += reps > 0;
        for (int rep = 0; rep < reps; rep++) {
            uint64_t ts = sl_now_ns();
            g->ops->gemm(&ga);
            uint64_t dt = sl_now_ns() - ts;
            if (dt < best)
                best = dt, g->tile = t;
        }
        for (uint32_t q = 0; q < nq; q++)
            for (uint32_t r = 0; r < pn; r++) {
                int32_t got = c[(size_t)check_rows[q] * pn + r], exp = want[q * pn + r];
                if (got != exp) {
                    sl_err_set(err,
                               "npu: graph %ux%ux%u: kernel %s (tiling %s) failed its "
                               "self-check at row %u channel %u (%d, expected %d)",
                               d->m, d->k, d->n, npu_kernel_name(g->kernel),
                               g->ops->tile_names[t], check_rows[q], r, got, exp);
                    ret = -EIO;
                    goto fail;
                }
            }
    }
    ret = 0;
fail:
    if (ret == -ENOMEM)
        sl_err_set(err, "npu: graph %ux%ux%u: out of memory for the tiling probe", d->m, d->k,
                   d->n);
    npu_gemm_b_destroy(b);
    free(want);
    free(c);
    free(bw);
    free(a);
    return ret;
}

int npu_graph_create(const struct npu_device *dev, const struct npu_device_config *cfg,
                     const struct npu_graph_desc *desc, struct npu_graph **out,
                     struct sl_err *err)
{
    uint64_t t0 = sl_now_ns();
    *out = NULL;
    int ret = npu_graph_desc_check(desc, err);
    if (ret < 0)
        return ret;
    struct npu_graph *g = sl_calloc(1, sizeof *g);
    if (!g) {
        sl_err_set(err, "npu: out of memory for a graph");
        return -ENOMEM;
    }
    g->dev = dev;
    g->desc = *desc;
    g->kernel = cfg->kernel >= 0 ? (enum npu_kernel)cfg->kernel : npu_kernel_for_rows(desc->m);
    g->ops = npu_kernel_ops(g->kernel);
    g->pad_rows = cfg->pad_rows;
    g->k4 = (desc->k + 3) & ~3u;
#if SLUICE_KERNELS_AMX
    /* where the CPU has AMX (and the compiler built the kernel) and no kernel
     * was forced on the device, for head sizes of whole 64-byte tile rows */
    g->amx_est = cfg->kernel < 0 && g->k4 % 64 == 0 && npu_est_amx_available();
#endif
    g->scratch_bytes = scratch_bytes(desc, g->k4, g->pad_rows);
    /* the device worker's staging, touched now so no job pays the page faults */
    g->stage = sl_alloc_aligned(g->scratch_bytes, 64);
    if (!g->stage) {
        sl_err_set(err, "npu: graph %ux%ux%u: out of memory for %zu bytes of staging",
                   desc->m, desc->k, desc->n, g->scratch_bytes);
        ret = -ENOMEM;
        goto fail;
    }
    memset(g->stage, 0, g->scratch_bytes);
    g->held = sl_calloc(1, sizeof *g->held);
    if (!g->held) {
        sl_err_set(err, "npu: out of memory for a graph");
        ret = -ENOMEM;
        goto fail;
    }
    if (cfg->tile >= g->ops->tiles) { /* the device refuses it first */
        sl_err_set(err, "npu: graph %ux%ux%u: kernel %s has no tiling %d", desc->m, desc->k,
                   desc->n, npu_kernel_name(g->kernel), cfg->tile);
        ret = -EINVAL;
        goto fail;
    }
    /* past the kernel's probe_max_m, tiling 0 untimed (the probe's one timed
     * run per tiling flipped the prefill's AMX graphs between tilings on
     * noise: npu_gemm_amx.c, KCHUNK) */
    const int tile = cfg->tile < 0 && desc->m > g->ops->probe_max_m ? 0 : cfg->tile;
    ret = choose_and_check(g, tile, err);
    if (ret < 0)
        goto fail;
    g->build_ns = sl_now_ns() - t0;
    *out = g;
    return 0;
fail:
    npu_graph_destroy(g);
    return ret;
}

void npu_graph_destroy(struct npu_graph *g)
{
    if (!g)
        return;
    sl_free_aligned(g->stage);
    free(g->held);
    free(g);
}

void npu_graph_info(const struct npu_graph *g, struct npu_graph_info *info)
{
    info->desc = g->desc;
    info->kernel = g->kernel;
    info->tile = g->tile;
    info->tile_name = g->ops->tile_names[g->tile];
    info->build_ns = g->build_ns;
    info->tilings_timed = g->tilings_timed;
    info->scratch_bytes = g->scratch_bytes;
}

int npu_job_validate(const struct npu_job *job, struct sl_err *err)
{
    return npu_job_check(job ? job->graph : NULL, job, err);
}

int npu_job_execute(struct npu_job *job)
{
    if (!job)
        return -EINVAL;
    return npu_graph_run(job->graph, job, NULL, NULL);
}

int npu_graph_run(const struct npu_graph *g, struct npu_job *job, void *scratch,
                  struct sl_err *err)
{
    int ret = npu_job_check(g, job, err);
    if (job)
        job->status = ret;
    if (ret < 0)
        return ret;
    uint8_t *stage = scratch;
    if (!stage) {
        stage = sl_alloc_aligned(g->scratch_bytes, 64);
        if (!stage) {
            sl_err_set(err, "npu: graph %ux%ux%u: out of memory for %zu bytes of staging",
                       g->desc.m, g->desc.k, g->desc.n, g->scratch_bytes);
            job->status = -ENOMEM;
            return -ENOMEM;
        }
    }
    job->stolen = 1;
    npu_graph_exec(g, job, stage, NULL);
    if (stage != scratch)
        sl_free_aligned(stage);
    return 0;
}

uint64_t npu_stage_keys(uint64_t n)
{
    static _Atomic uint64_t next = 1;
    return atomic_fetch_add(&next, n);
}

int npu_graph_run_cached(const struct npu_graph *g, struct npu_job *job, void *scratch,
                         uint64_t *held, struct sl_err *err)
{
    if (!scratch || !held) {
        sl_err_set(err, "npu: a cached run needs its scratch and its key");
        if (job)
            job->status = -EINVAL;
        return -EINVAL;
    }
    int ret = npu_job_check(g, job, err);
    if (job)
        job->status = ret;
    if (ret < 0)
        return ret;
    job->stolen = 1;
    npu_graph_exec(g, job, scratch, held);
    return 0;
}

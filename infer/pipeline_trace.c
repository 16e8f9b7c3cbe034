/* pipeline_trace.c: a run's statistics (busy time, stalls, bubbles) and its
 * Chrome trace (chrome://tracing, Perfetto): one track per executor, the
 * prefault thread's and the loader's. Calls pipeline_graph.c (names). */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "pipeline.h"

uint64_t pl_thread_cpu_ns(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts))
        return 0;
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Writes the trace to path (through path.tmp, renamed when complete). */
int pl_trace_write(struct pl *p, const char *path, const struct infer_pipeline_stats *st)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return -errno;
    fprintf(f, "{\"displayTimeUnit\": \"ms\", \"otherData\": {\"policy\": \"%s\", "
               "\"ttft_s\": %.6f, \"stall_s\": %.6f, \"bubble_npu\": %.4f, "
               "\"bubble_cpu\": %.4f, \"idle_npu\": %.4f, \"idle_cpu\": %.4f, \"stolen\": %u, "
               "\"npu_late\": %u, \"attention\": \"%s\"},\n"
               "\"traceEvents\": [\n",
            infer_policy_name(p->o->policy), st->ttft_s, st->stall_s, st->bubble_npu,
            st->bubble_cpu, st->idle_npu, st->idle_cpu, st->stolen, p->npu_late, p->st->attn->name);
    fprintf(f, "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": 0, "
               "\"args\": {\"name\": \"NPU\"}},\n");
    for (uint32_t w = 1; w <= p->n_workers; w++)
        fprintf(f, "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": %u, "
                   "\"args\": {\"name\": \"CPU %u\"}},\n", w, w);
    if (p->pf_started)
        fprintf(f, "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": %d, "
                   "\"args\": {\"name\": \"prefault\"}},\n", PL_PREFAULT_TID);
    if (p->m->slices_mapped)
        fprintf(f, "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": %d, "
                   "\"args\": {\"name\": \"hash tail\"}},\n", PL_HASH_TID);
    fprintf(f, "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": %d, "
               "\"args\": {\"name\": \"setup\"}},\n", PL_SETUP_TID);
    fprintf(f, "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": 100, "
               "\"args\": {\"name\": \"flash\"}}");
    /* the driver's setup around the stream's first read: open (the model
     * and its reader), the embedding's prefix read and the prompt's rows
     * asked for, the stream's start (mapping or the loader's queue), the
     * task graph and the executors' memory, then the rows read (waiting for
     * any still in flight) and decoded: the executors start next */
    const uint64_t setup[5] = {p->t_start, p->t_opened, p->t_asked,
                               p->t_streaming ? p->t_streaming : p->t_asked, p->t_embedded};
    static const char *const setup_name[4] = {"open", "embedding prefix", "stream start",
                                              "graph, embedding rows"};
    for (int i = 0; i < 4; i++) {
        if (!setup[i + 1] || setup[i + 1] < setup[i])
            continue;
        fprintf(f, ",\n{\"name\": \"%s\", \"cat\": \"setup\", \"ph\": \"B\", \"pid\": 1, "
                   "\"tid\": %d, \"ts\": %.3f},\n{\"name\": \"%s\", \"cat\": \"setup\", "
                   "\"ph\": \"E\", \"pid\": 1, \"tid\": %d, \"ts\": %.3f}",
                setup_name[i], PL_SETUP_TID, (double)(setup[i] - p->t_start) / 1e3,
                setup_name[i], PL_SETUP_TID, (double)(setup[i + 1] - p->t_start) / 1e3);
    }
    /* B/E pairs, in time order per track */
    for (uint32_t i = 0; i < p->n_tasks; i++) {
        const struct task *t = &p->tasks[i];
        if (t->executor < 0 || (t->op == PL_VERIFY && t->slice == UINT32_MAX))
            continue;
        double b = (double)(t->t0 - p->t_start) / 1e3, e = (double)(t->t1 - p->t_start) / 1e3;
        char name[96];
        if (t->op == PL_MM)
            snprintf(name, sizeof name, "%s L%d C%u [%u,%u)%s", format_role_name(t->role),
                     t->layer, t->chunk, t->r0, t->r1, t->job.stolen ? " stolen" : "");
        else if (t->op == PL_UNPACK && t->r1 > t->r0)
            snprintf(name, sizeof name, "unpack %s L%d [%u,%u)", format_role_name(t->role),
                     t->layer, t->r0, t->r1);
        else if (t->op == PL_SHADOW)
            snprintf(name, sizeof name, "shadow %s L%d C%u", format_role_name(t->role), t->layer,
                     t->chunk);
        else if (t->op == PL_VERIFY || t->op == PL_UNPACK)
            snprintf(name, sizeof name, "%s %s L%d", pl_op_name(t->op),
                     t->op == PL_UNPACK ? format_role_name(t->role) : "", t->layer);
        else if (t->op == PL_ATTN && t->q1 > t->q0)
            snprintf(name, sizeof name, "%s L%d C%u [%u,%u) kv heads %s rows [%u,%u)",
                     pl_op_name(t->op), t->layer, t->chunk, t->r1 > t->r0 ? t->r0 : 0,
                     t->r1 > t->r0 ? t->r1 : p->c->n_kv_heads, p->st->attn->name, t->q0, t->q1);
        else if ((t->op == PL_ATTN || t->op == PL_SWIGLU) && t->r1 > t->r0)
            snprintf(name, sizeof name, "%s L%d C%u [%u,%u)%s%s", pl_op_name(t->op), t->layer,
                     t->chunk, t->r0, t->r1, t->op == PL_ATTN ? " kv heads " : "",
                     t->op == PL_ATTN ? p->st->attn->name : "");
        else
            snprintf(name, sizeof name, "%s L%d C%u%s%s", pl_op_name(t->op), t->layer, t->chunk,
                     t->op == PL_ATTN ? " " : "", t->op == PL_ATTN ? p->st->attn->name : "");
        /* args: how long the task waited ready for an executor, and the
         * CPU time its thread spent in it (below the span: preempted) */
        double w = t->t_ready && t->t0 > t->t_ready ? (double)(t->t0 - t->t_ready) / 1e3 : 0;
        fprintf(f,
                ",\n{\"name\": \"%s\", \"cat\": \"%s\", \"ph\": \"B\", \"pid\": 1, \"tid\": %d, "
                "\"ts\": %.3f, \"args\": {\"ready_wait_us\": %.3f, \"cpu_us\": %.3f}},\n"
                "{\"name\": \"%s\", \"cat\": \"%s\", \"ph\": \"E\", \"pid\": 1, \"tid\": %d, "
                "\"ts\": %.3f}",
                name, pl_op_name(t->op), t->executor, b, w, (double)t->cpu_ns / 1e3, name,
                pl_op_name(t->op), t->executor, e);
    }
    for (uint32_t i = 0; i < p->n_pf; i++) {
        const struct prefault *pf = &p->pf[i];
        if (!pf->t1)
            continue;
        double b = (double)(pf->t0 - p->t_start) / 1e3, e = (double)(pf->t1 - p->t_start) / 1e3;
        char name[64];
        if (pf->layer == PL_PF_ACTS)
            snprintf(name, sizeof name, "prefault activations +%zu MiB", pf->off >> 20);
        else
            snprintf(name, sizeof name, "prefault L%d +%zu MiB", pf->layer, pf->off >> 20);
        fprintf(f, ",\n{\"name\": \"%s\", \"cat\": \"prefault\", \"ph\": \"B\", "
                   "\"pid\": 1, \"tid\": %d, \"ts\": %.3f},\n{\"name\": \"%s\", "
                   "\"cat\": \"prefault\", \"ph\": \"E\", \"pid\": 1, \"tid\": %d, \"ts\": %.3f}",
                name, PL_PREFAULT_TID, b, name, PL_PREFAULT_TID, e);
    }
    uint64_t prev = p->t_start;
    for (uint32_t s = 0; s < format_reader_n_slices(p->r) && s < 4096; s++) {
        if (!p->load_events[s] || p->load_events[s] < prev)
            continue;
        fprintf(f, ",\n{\"name\": \"load slice %u\", \"cat\": \"load\", \"ph\": \"B\", \"pid\": 1, "
                   "\"tid\": 100, \"ts\": %.3f},\n{\"name\": \"load slice %u\", \"cat\": \"load\", "
                   "\"ph\": \"E\", \"pid\": 1, \"tid\": 100, \"ts\": %.3f}",
                s, (double)(prev - p->t_start) / 1e3, s,
                (double)(p->load_events[s] - p->t_start) / 1e3);
        prev = p->load_events[s];
    }
    /* mapped slices: from the slice's last page in to its arrival (the hash of
     * its last piece, the checks): on the first token's path for the last */
    for (uint32_t s = 0; s < format_reader_n_slices(p->r) && s < PL_MAX_SLICES; s++) {
        if (!p->read_events[s] || p->load_events[s] < p->read_events[s])
            continue;
        fprintf(f, ",\n{\"name\": \"hash tail slice %u\", \"cat\": \"hash\", \"ph\": \"B\", "
                   "\"pid\": 1, \"tid\": %d, \"ts\": %.3f},\n{\"name\": \"hash tail slice %u\", "
                   "\"cat\": \"hash\", \"ph\": \"E\", \"pid\": 1, \"tid\": %d, \"ts\": %.3f}",
                s, PL_HASH_TID, (double)(p->read_events[s] - p->t_start) / 1e3, s, PL_HASH_TID,
                (double)(p->load_events[s] - p->t_start) / 1e3);
    }
    fprintf(f, "\n]}\n");
    int bad = ferror(f);
    bad |= fflush(f) != 0 || fsync(fileno(f)) != 0;
    fclose(f);
    if (bad || rename(tmp, path) < 0) {
        unlink(tmp);
        return -EIO;
    }
    return 0;
}

/* The run's statistics, up to now (or the first token's logits). */
void pl_stats_fill(struct pl *p, struct infer_pipeline_stats *st)
{
    memset(st, 0, sizeof *st);
    uint64_t end = p->t_logits ? p->t_logits : sl_now_ns();
    double span = (double)(end - p->t_start) / 1e9;
    st->ttft_s = span;
    st->span_s = span;
    st->load_s = p->t_loaded ? (double)(p->t_loaded - p->t_start) / 1e9 : 0;
    st->unpack_s = (double)p->unpack_ns / 1e9;
    st->prefault_s = (double)p->prefault_ns / 1e9;
    st->npu_busy_s = (double)p->busy[0] / 1e9;
    uint64_t cpu = 0;
    for (uint32_t w = 1; w <= p->n_workers; w++)
        cpu += p->busy[w];
    st->cpu_busy_s = (double)cpu / 1e9;
    uint64_t stall = p->stall_ns;
    if (p->stall_t0 && end > p->stall_t0)
        stall += end - p->stall_t0;
    st->stall_s = (double)stall / 1e9;
    if (st->stall_s > span)
        st->stall_s = span;
    double work = span - st->stall_s;
    st->bubble_npu = work > 0 ? 1.0 - st->npu_busy_s / work : 0;
    st->bubble_cpu = work > 0 ? 1.0 - st->cpu_busy_s / (work * p->n_workers) : 0;
    st->idle_npu = span > 0 ? 1.0 - st->npu_busy_s / span : 0;
    st->idle_cpu = span > 0 ? 1.0 - st->cpu_busy_s / (span * p->n_workers) : 0;
    double *clampv[] = {&st->bubble_npu, &st->bubble_cpu, &st->idle_npu, &st->idle_cpu};
    for (int i = 0; i < 4; i++)
        if (*clampv[i] < 0)
            *clampv[i] = 0;
    st->bytes_read = p->bytes_read;
    uint64_t sh = 0;
    for (uint32_t i = 0; i < p->n_tasks; i++)
        if (p->tasks[i].op == PL_SHADOW && p->tasks[i].executor >= 0 && p->tasks[i].t1)
            sh += p->tasks[i].t1 - p->tasks[i].t0;
    st->shadow_s = (double)sh / 1e9;
    st->tasks = p->n_tasks;
    st->stolen = p->stolen;
    st->splits = p->splits;
    st->tails = p->tails;
    st->int8_pool_bytes = p->int8_peak;
    st->int8_pool_fresh = p->int8_fresh;
    st->int8_pool_reused = p->int8_reused;
    st->act_sets = p->n_sets;
    st->act_bytes = p->act_x_len + p->set_len;
    if (p->dev) {
        struct npu_device_stats ds;
        npu_device_stats(p->dev, &ds);
        st->graphs = (uint32_t)ds.graphs_built;
        st->graph_build_s = (double)ds.build_ns / 1e9;
    }
}

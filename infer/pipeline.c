/* pipeline.c: the cold-start prefill as a task graph over loading, unpacking
 * and execution (EdgeFlow 4.3 and Appendix B; llm.npu 3.2 and 3.4); this
 * file is its driver (the other files: pipeline.h).
 *
 * Every (layer, chunk) of the prompt contributes the operators of Appendix B:
 * RMSNorm and quantization, the Q/K/V projections, RoPE and attention, the O
 * projection, the residual and second RMSNorm, gate/up, SwiGLU, down. The
 * int8 matmuls go to the emulated NPU (npu.h), everything else to CPU
 * workers. Each layer's slice arrives from the loader (io_uring, in execution
 * order), is checked against its checksum, and each of its tensors is
 * unpacked straight into the NPU's weight layout by CPU tasks (full and
 * sequential_granular: one per matmul piece, so the NPU starts on a tensor's first
 * channels while the CPU unpacks the next); a matmul task waits for its
 * weights and its input. Two ready queues, NPU and CPU:
 *
 *   full           position-guided priority (earlier chunk first, then
 *                  layer, then operator order; a tensor's unpacking ranks
 *                  just before its first chunk's matmul), the
 *                  NPU's matmuls split by output channels, and CPU task
 *                  stealing: an idle CPU worker takes the last NPU task in
 *                  priority order (the top with steal_top, EdgeFlow's rule)
 *                  when the NPU queue holds more than steal_threshold tasks,
 *                  or (steal_ahead) when the NPU's other work is estimated
 *                  to outlast the task, so the CPU finishes it before the
 *                  NPU would have started it, and cutting the task's
 *                  channels in two when it does not (split stealing); the
 *                  NPU dispatching a matmul with nothing else queued on
 *                  either side leaves its second half queued for the CPU
 *                  to steal (a kept tail: a running job cannot be cut);
 *   sequential     llama.cpp's and MNN's way: nothing is unpacked or
 *                  computed until every slice has been read, then coarse
 *                  tasks first come first served (every tensor is converted
 *                  before the first operator runs, as a model load does);
 *   sequential_granular  load everything, then full's scheduler (a
 *                  stronger baseline: the conversion overlaps computing);
 *   layer_overlap  llm.npu-style static coarse pipeline: one NPU task per
 *                  matmul, first come first served, no stealing (loading of
 *                  later layers still overlaps computing of earlier ones);
 *   llmnpu         llm.npu 3.4's out-of-order heuristic: among ready tasks,
 *                  the one whose completion enables the most NPU work (CPU
 *                  side) or the least (NPU side), estimated from operation
 *                  counts; coarse tasks, no stealing.
 *
 * The arithmetic of every operator is exactly that of infer_forward with
 * max_batch = chunk, so the logits are bit-identical to a sequential run of
 * the same quantized model (tested). */
#include <assert.h>
#include <errno.h>
#include <sched.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "pipeline.h"

/* A slice arrived (lock held): its VERIFY task loses its last dependency.
 * 0, or a negative errno after pl_fail. */
int pl_arrived(struct pl *p, uint32_t s)
{
    p->load_events[s < PL_MAX_SLICES ? s : PL_MAX_SLICES - 1] = sl_now_ns();
    if (!p->slice_needed[s])
        return 0;
    struct task *v = &p->tasks[p->verify_task[s]];
    return --v->deps == 0 ? pl_make_ready(p, p->verify_task[s]) : 0;
}

/* Opens the loader stream: reading starts at once, on the loader's thread,
 * while the caller prepares everything else. */
static int open_stream(struct pl *p, struct sl_err *err)
{
    const struct format_reader *r = p->r;
    uint32_t ns = format_reader_n_slices(r);
    const char *path = format_reader_path(r);
    struct loader_request *reqs = sl_calloc(ns, sizeof *reqs);
    if (!reqs) {
        sl_err_set(err, "out of memory for the loader's requests");
        return -ENOMEM;
    }
    /* packed residency keeps every slice it reads: each is read in place,
     * at its file offset in one buffer the model keeps (the packed linears
     * point into it), so there is neither a ring nor a copy of the packed
     * bytes. Slices start on 4 KiB (format.h), so a slice's last O_DIRECT
     * block ends before the next slice begins. Small pages: the O_DIRECT
     * reads fault the buffer in on the loader's thread as they are
     * submitted, beside the prefill's compute, and on the machine of
     * docs/BENCHMARKS.md (issue 22, fourth session) fresh 2 MiB pages cost
     * that thread 1.2-2.7 s of CPU for the 650 MB of the TinyLlama shape
     * against 0.4 s for 4 KiB pages (the host backs a guest's fresh huge
     * pages slowly); decoding from 4 KiB pages showed no slowdown there
     * (noisy runs: measure again where huge pages fault cheaply). */
    uint64_t file = format_reader_file_size(r);
    int in_place = p->o->resident == INFER_RESIDENT_PACKED;
    for (uint32_t i = 0; in_place && i < ns; i++)
        in_place = format_reader_slice(r, i)->offset % 4096 == 0;
    /* mapped from the page cache where the file and kernel allow it
     * (pipeline_map.c): nothing zeroed, nothing copied, no loader stream */
    if (in_place && !p->o->slices_read && pl_map_open(p) == 0) {
        free(reqs);
        return 0;
    }
    if (in_place) {
        const uint64_t huge = 2u << 20;
        p->m->slices = sl_alloc_aligned(sl_align_up(file, huge), huge);
        if (!p->m->slices) {
            free(reqs);
            sl_err_set(err, "out of memory for the model's %" PRIu64 " bytes", file);
            return -ENOMEM;
        }
        (void)madvise(p->m->slices, sl_align_up(file, huge), MADV_NOHUGEPAGE); /* advice */
    }
    uint32_t k = 0;
    /* the untied embedding last; read in place, it is not asked for until
     * after the first token (pl_embed_finish): nothing holds the stream back
     * from reading it early, into memory the prefill does not need */
    for (int pass = 0; pass < (in_place ? 1 : 2); pass++)
        for (uint32_t i = 0; i < ns; i++) {
            const struct format_slice_info *s = format_reader_slice(r, i);
            if ((s->kind == FORMAT_SLICE_EMBED) != pass)
                continue;
            reqs[k++] = (struct loader_request){
                .path = path, .fd = -1, .offset = s->offset, .length = s->length, .tag = i,
                .dest = in_place ? (uint8_t *)p->m->slices + s->offset : NULL};
        }
    struct loader_opts lo = {.queue_depth = p->o->queue_depth, .ring_bytes = p->o->ring_bytes};
    if (pl_load_first(p->o->policy)) /* everything is held until the end */
        lo.ring_bytes = format_reader_file_size(r) + (64u << 20);
    int ret = loader_stream_open(reqs, k, &lo, &p->ls, err);
    free(reqs);
    return ret;
}

/* Streams the slices in; returns after the last slice the first token needs
 * has arrived (the untied embedding is read later, by pl_embed_finish). */
static int feed(struct pl *p, void **whole, size_t *whole_len, struct sl_err *err)
{
    const struct format_reader *r = p->r;
    uint32_t ns = format_reader_n_slices(r);
    const char *path = format_reader_path(r);
    if (p->o->load == INFER_LOAD_STREAM && p->m->slices_mapped) {
        int ret = pl_map_feed(p, err);
        p->t_loaded = sl_now_ns();
        return ret;
    }
    if (p->o->load == INFER_LOAD_STREAM) {
        int ret;
        uint32_t needed = 0;
        for (uint32_t i = 0; i < ns; i++)
            needed += p->slice_needed[i];
        for (uint32_t got = 0; got < needed;) {
            struct loader_slice sl;
            ret = loader_stream_next(p->ls, &sl, err);
            if (ret <= 0)
                return ret < 0 ? ret : -EIO;
            uint32_t s = (uint32_t)sl.tag;
            pthread_mutex_lock(&p->lock);
            p->slice_sl[s] = sl;
            p->slice_data[s] = sl.data;
            p->bytes_read += sl.length;
            pl_arrived(p, s); /* a failure sets p->stop */
            int stop = p->stop;
            pthread_mutex_unlock(&p->lock);
            if (stop)
                return 0;
            got++;
        }
        p->t_loaded = sl_now_ns();
        return 0;
    }
    /* read everything first (MNN's way) or map it with MAP_POPULATE (llama.cpp's) */
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        sl_err_set(err, "%s: %s", path, strerror(errno));
        return -errno;
    }
    size_t len = (size_t)format_reader_file_size(r);
    uint8_t *base;
    if (p->o->load == INFER_LOAD_MMAP) {
        base = mmap(NULL, len, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
        if (base == MAP_FAILED)
            base = NULL;
    } else {
        base = sl_alloc_aligned(len, 4096);
        if (base && pl_pread_full(fd, base, len, 0) < 0) {
            sl_free_aligned(base);
            base = NULL;
        }
    }
    close(fd);
    if (!base) {
        sl_err_set(err, "%s: cannot read the container whole", path);
        return -EIO;
    }
    *whole = base;
    *whole_len = len;
    p->bytes_read = len;
    p->t_loaded = sl_now_ns();
    pthread_mutex_lock(&p->lock);
    for (uint32_t i = 0; i < ns; i++) {
        p->slice_data[i] = base + format_reader_slice(r, i)->offset;
        if (pl_arrived(p, i) < 0)
            break; /* the run is stopping */
    }
    pthread_mutex_unlock(&p->lock);
    return 0;
}


void infer_pipeline_opts_init(struct infer_pipeline_opts *o)
{
    *o = (struct infer_pipeline_opts){.policy = INFER_POLICY_FULL,
                                      .load = INFER_LOAD_STREAM,
                                      .chunk = 256,
                                      .steal_threshold = 5,
                                      .steal_ahead = 1.0,
                                      .split = 512,
                                      .cpu_workers = 0, /* one per core the process may run on */
                                      .ring_bytes = 64ull << 20,
                                      .queue_depth = 16};
}

/* Ends the reclaim thread (packed residency): this thread frees what is
 * still queued itself, and the reclaim thread leaves idle priority, so that
 * a loaded machine does not keep the join (and the caller) waiting for it. */
static void reclaim_join(struct pl *p)
{
    if (!p->drop_started)
        return;
    struct sched_param sp = {0};
    (void)pthread_setschedparam(p->drop_thread, SCHED_OTHER, &sp);
    pthread_mutex_lock(&p->lock);
    p->drop_end = 1;
    uint32_t n_rel = p->n_rel; /* what is left: this thread, alone (calls contend) */
    p->n_rel = 0;
    pthread_cond_signal(&p->drop_cv);
    while (p->n_drop) {
        struct npu_weights *w = p->drop[--p->n_drop];
        pthread_mutex_unlock(&p->lock);
        npu_weights_destroy(w);
        pthread_mutex_lock(&p->lock);
    }
    pthread_mutex_unlock(&p->lock);
    pthread_join(p->drop_thread, NULL);
    p->drop_started = 0;
    while (n_rel) /* costs what the model's munmap would for these layers */
        pl_map_release(p, (int)p->rel_layer[--n_rel] - 1);
}

int infer_pipeline_prefill(const char *path, const int *tokens, uint32_t n,
                           const struct infer_pipeline_opts *opts, struct infer_model **model,
                           struct infer_state **state, float *logits,
                           struct infer_pipeline_stats *stats, struct sl_err *err)
{
    struct sl_err no_err;
    if (!err) /* the threads' failures pass through it */
        err = &no_err;
    struct infer_pipeline_opts o;
    if (opts)
        o = *opts;
    else
        infer_pipeline_opts_init(&o);
    if (!o.chunk)
        o.chunk = 256;
    if (!o.split)
        o.split = 512;
    if (!o.cpu_workers) {
        /* one worker per core this process may use, the NPU thread's core included: the
         * emulated NPU waits for its inputs part of the time (with AMX about
         * half of a 512-token prefill), and the OS gives its core to a worker
         * meanwhile; with one worker that core idled while the worker's
         * attention and unpacking were the critical path */
        long cores = sl_cpu_count();
        o.cpu_workers = cores < 1 ? 1
                        : cores > PL_MAX_CPU_WORKERS ? PL_MAX_CPU_WORKERS : (uint32_t)cores;
    }
    if (o.cpu_workers > PL_MAX_CPU_WORKERS)
        o.cpu_workers = PL_MAX_CPU_WORKERS;
    if (!o.ring_bytes)
        o.ring_bytes = 64ull << 20;
    struct pl *p = sl_calloc(1, sizeof *p);
    if (!p) {
        sl_err_set(err, "out of memory");
        return -ENOMEM;
    }
    p->npu_running = UINT32_MAX;
    p->o = &o;
    p->t_start = sl_now_ns();
    p->stall_t0 = p->t_start; /* nothing can run before the first slice */
    p->unpack_layer = -1;
    p->tokens = tokens;
    p->logits = logits;
    pthread_mutex_init(&p->lock, NULL);
    /* the workers' timed waits (the NPU's late rule) count on sl_now_ns's clock */
    pthread_condattr_t ca;
    int cv_err = pthread_condattr_init(&ca);
    if (!cv_err) {
        cv_err = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        if (!cv_err)
            cv_err = pthread_cond_init(&p->cv, &ca);
        pthread_condattr_destroy(&ca);
    }
    pthread_cond_init(&p->pf_cv, NULL);
    pthread_cond_init(&p->drop_cv, NULL);
    void *whole = NULL;
    size_t whole_len = 0;
    struct pl_worker_arg wargs[PL_MAX_CPU_WORKERS + 1];
    int dev_started = 0;
    struct infer_load_opts lo = {.lazy = 1, .no_mmap = 1, .reader = o.reader};
    int ret = -cv_err;
    if (cv_err) /* (a calloc'd, never initialized p->cv is destroyed harmlessly at out) */
        sl_err_set(err, "the pipeline's monotonic condition variable: %s", strerror(cv_err));
    else
        ret = infer_model_load(path, &lo, &p->m, err);
    if (ret < 0)
        goto out;
    p->t_opened = sl_now_ns();
    /* shadow outlier execution where the container calibrated it */
    if (!o.no_shadow && (ret = infer_model_shadow_enable(p->m, err)) < 0 && ret != -ENOENT)
        goto out;
    memset(err, 0, sizeof *err);
    p->c = infer_model_config(p->m);
    p->r = infer_model_reader(p->m);
    /* with packed residency the shadow term reads its weight columns from the
     * packed codes (infer_shadow.c), not the int8 copies the pool frees */
    o.resident = infer_resident_resolve(o.resident, p->r, o.no_shadow);
    const struct format_config *c = p->c;
    ret = -EINVAL;
    if (n == 0 || n > c->seq_len) {
        sl_err_set(err, "a prompt of %u tokens does not fit the context of %u", n, c->seq_len);
        goto out;
    }
    if (c->n_layers > 4096 || format_reader_n_slices(p->r) > 4096) {
        sl_err_set(err, "too many layers for the pipeline");
        goto out;
    }
    ret = -ENOMEM;
    uint32_t ns = format_reader_n_slices(p->r);
    p->slice_data = sl_calloc(ns, sizeof *p->slice_data);
    p->slice_sl = sl_calloc(ns, sizeof *p->slice_sl);
    p->slice_left = sl_calloc(ns, sizeof *p->slice_left);
    p->verify_task = sl_calloc(ns, sizeof *p->verify_task);
    p->slice_needed = sl_calloc(ns, sizeof *p->slice_needed);
    if (!p->slice_data || !p->slice_sl || !p->slice_left || !p->verify_task || !p->slice_needed ||
        pl_acts_rows(p, n) < 0) {
        sl_err_set(err, "out of memory for the pipeline's buffers");
        goto out;
    }
    /* the prompt's embedding rows into the chunks' x, asked for before the
     * stream: their small reads would otherwise wait behind the stream's
     * queued ones wherever reads are throttled (flashrun: 0.16-0.74 s
     * instead of a few ms; docs/BENCHMARKS.md, issue 22, fourth session),
     * and no task can start without them. Asked for, not waited for: the
     * stream's reads queue right behind them */
    ret = pl_embed_rows_ask(p, &p->embed_rows, err);
    if (ret < 0)
        goto out;
    p->t_asked = sl_now_ns();
    /* the disk starts now, right behind the rows; everything below overlaps
     * with the first reads */
    if (o.load == INFER_LOAD_STREAM) {
        ret = open_stream(p, err);
        if (ret < 0)
            goto out;
        p->t_streaming = sl_now_ns();
    }
    ret = infer_state_create(p->m, o.chunk, &p->st, err);
    if (ret < 0)
        goto out;
    infer_state_set_attention(p->st, o.attn);
    /* the prompt fills the cache's first n slots, positions 0..n-1 */
    p->positions = sl_malloc(sizeof *p->positions * n);
    if (!p->positions) {
        ret = -ENOMEM;
        sl_err_set(err, "out of memory");
        goto out;
    }
    for (uint32_t i = 0; i < n; i++)
        p->positions[i] = i;
    ret = infer_rope_table_init(&p->rope, p->positions, n, c->head_dim, c->rope_theta);
    if (ret < 0) {
        sl_err_set(err, "out of memory");
        goto out;
    }
    ret = infer_kv_reserve(infer_state_kv(p->st), n, p->positions, 0);
    if (ret < 0) {
        sl_err_set(err, "a prompt of %u tokens does not fit the KV cache", n);
        goto out;
    }
    p->lin_info = sl_calloc(c->n_layers + 1, sizeof *p->lin_info);
    if (!p->lin_info) {
        ret = -ENOMEM;
        sl_err_set(err, "out of memory for the pipeline's buffers");
        goto out;
    }
    for (uint32_t i = 0; i < format_reader_n_tensors(p->r); i++) {
        const struct format_tensor_info *t = format_reader_tensor(p->r, i);
        uint32_t role = t->role == FORMAT_ROLE_TOK_EMBD ? FORMAT_ROLE_CLASSIFIER : t->role;
        if (!format_role_is_linear(role) || (t->role == FORMAT_ROLE_TOK_EMBD && !c->tied_embedding))
            continue;
        p->lin_info[t->layer + 1][role].int8 = format_encoding_traits(t->encoding)->quantized;
        assert(format_act_scale_valid(t->act_scale)); /* format_reader_open refuses others */
        p->lin_info[t->layer + 1][role].act = p->m->force_dynamic_act ? 0.0f : t->act_scale;
        p->lin_info[t->layer + 1][role].term =
            p->lin_info[t->layer + 1][role].int8 && infer_term_wants(p->m, t->layer, role);
    }

    ret = pl_graph_build(p);
    if (ret < 0) {
        if (p->err.msg[0])
            *err = p->err;
        else if (ret == -ENOMEM)
            sl_err_set(err, "out of memory building the task graph");
        else
            sl_err_set(err, "%s: a layer without its slice", path);
        goto out;
    }
    /* slots for split stealing's tasks, reserved now: running tasks are
     * used through pointers, so the array must not move later; the ready
     * queues sized to match, so that no push can fail while running */
    uint32_t reserve = pl_granular(o.policy) && !o.no_steal_split ? p->n_tasks / 4 + 64 : 0;
    ret = pl_graph_reserve(p, reserve);
    if (ret == 0)
        ret = pl_queue_init(p);
    if (ret == 0) {
        ret = pl_pool_init(p, o.int8_budget); /* 0: the default (pipeline_pool.c) */
    }
    if (ret == 0)
        ret = pl_pool_admit(p);
    if (ret == 0)
        ret = pl_acts_init(p, o.act_sets);
    if (ret == 0)
        ret = pl_prefault_early(p);
    if (ret < 0) {
        sl_err_set(err, "out of memory building the task graph");
        goto out;
    }
    p->remaining = p->n_tasks;
    if (o.resident == INFER_RESIDENT_PACKED) {
        p->mm_left = sl_calloc(c->n_layers + 1, sizeof *p->mm_left);
        p->cap_drop = 8 * (c->n_layers + 1);
        p->drop = sl_calloc(p->cap_drop, sizeof *p->drop);
        if (o.no_decode && p->m->slices_mapped)
            p->rel_layer = sl_calloc(c->n_layers + 1, sizeof *p->rel_layer);
        if (!p->mm_left || !p->drop || (o.no_decode && p->m->slices_mapped && !p->rel_layer)) {
            ret = -ENOMEM;
            sl_err_set(err, "out of memory building the task graph");
            goto out;
        }
        for (uint32_t i = 0; i < p->n_tasks; i++)
            if (p->tasks[i].op == PL_MM)
                p->mm_left[p->tasks[i].layer + 1]++;
    }
    /* the NPU's graphs: one per matmul shape, shared by every chunk and layer */
    if (o.device) {
        p->dev = o.device; /* the caller's (a session's): it stays running */
    } else {
        ret = npu_device_create(&p->dev);
        if (ret < 0) {
            sl_err_set(err, "cannot create the NPU device (%s)", strerror(-ret));
            goto out;
        }
    }
    {
        uint32_t D = c->dim, Q = c->n_heads * c->head_dim, KV = c->n_kv_heads * c->head_dim;
        uint32_t F = c->hidden_dim;
        struct {
            uint32_t role, k, nout;
        } shapes[] = {{FORMAT_ROLE_WQ, D, Q},      {FORMAT_ROLE_WV, D, KV},
                      {FORMAT_ROLE_WO, Q, D},      {FORMAT_ROLE_W_GATE, D, F},
                      {FORMAT_ROLE_W_UP, D, F},    {FORMAT_ROLE_W_DOWN, F, D},
                      {FORMAT_ROLE_CLASSIFIER, D, c->vocab_size}};
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
            ret = npu_device_graph(p->dev, o.chunk, shapes[i].k, shapes[i].nout,
                                   &p->graph[shapes[i].role], err);
            if (ret < 0)
                goto out;
        }
    }
    /* executors: the NPU device thread and the CPU workers */
    p->n_workers = o.cpu_workers;
    uint32_t fill_cols = c->dim > c->hidden_dim ? c->dim : c->hidden_dim;
    if (c->n_heads * c->head_dim > fill_cols)
        fill_cols = c->n_heads * c->head_dim;
    p->fill_cols = fill_cols;
    /* stolen jobs' staging: the largest of the graphs', kept per worker so
     * that a chunk's activations are staged once for its pieces */
    size_t steal_bytes = 0;
    for (uint32_t r = 0; r < FORMAT_ROLE_COUNT; r++) {
        struct npu_graph_info gi;
        if (!p->graph[r])
            continue;
        npu_graph_info(p->graph[r], &gi);
        steal_bytes = gi.scratch_bytes > steal_bytes ? gi.scratch_bytes : steal_bytes;
    }
    p->stage_key0 = npu_stage_keys((uint64_t)(c->n_layers + 1) * p->n_chunks * FORMAT_ROLE_COUNT);
    for (uint32_t w = 0; w <= p->n_workers; w++) {
        p->att_scratch[w] = sl_malloc(sizeof(float) * INFER_ATT_ROWS * c->seq_len);
        p->fill_scratch[w] = w ? sl_alloc_aligned((size_t)PL_FILL_ROWS * fill_cols, 64) : NULL;
        p->steal_stage[w] = w ? sl_alloc_aligned(steal_bytes, 64) : NULL;
        if (!p->att_scratch[w] || (w && (!p->fill_scratch[w] || !p->steal_stage[w]))) {
            ret = -ENOMEM;
            sl_err_set(err, "out of memory for the executors' scratch");
            goto out;
        }
    }
    /* the prompt's rows, asked for before the stream: read last before
     * the executors start, so that the graph's setup overlaps their reads */
    ret = pl_embed_rows_read(p, &p->embed_rows, p->act_x, err);
    pl_embed_rows_free(&p->embed_rows);
    if (ret < 0)
        goto out;
    p->t_embedded = sl_now_ns();
    ret = npu_device_start(p->dev, pl_npu_next, pl_npu_done, p);
    if (ret < 0) {
        sl_err_set(err, "cannot start the NPU device thread");
        goto out;
    }
    dev_started = 1;
    uint32_t started = 0;
    for (uint32_t w = 1; w <= p->n_workers; w++) {
        wargs[w] = (struct pl_worker_arg){p, (int)w};
        if (pthread_create(&p->workers[w - 1], NULL, pl_cpu_worker, &wargs[w]) != 0)
            break;
        started++;
    }
    p->n_workers = started;
    if (!started) {
        ret = -EAGAIN;
        sl_err_set(err, "cannot start a CPU worker");
        pthread_mutex_lock(&p->lock);
        p->stop = 1;
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->lock);
        goto join;
    }
    /* without it the int8 copies are freed by the session before decoding */
    if (p->mm_left && pthread_create(&p->drop_thread, NULL, pl_reclaim_worker, p) == 0)
        p->drop_started = 1;
    /* without it the work is the same: the unpacking faults its memory */
    if (p->n_pf && pthread_create(&p->pf_thread, NULL, pl_prefault_worker, p) == 0)
        p->pf_started = 1;
    pthread_mutex_lock(&p->lock);
    /* tasks without dependencies (the sequential barrier waits for the load);
     * a failure sets p->stop, and the threads wind down */
    for (uint32_t i = 0; i < p->n_tasks && !p->stop; i++)
        if (p->tasks[i].deps == 0 && !(p->tasks[i].op == PL_VERIFY &&
                                       p->tasks[i].slice == UINT32_MAX))
            pl_make_ready(p, i);
    int stopped = p->stop;
    pthread_mutex_unlock(&p->lock);
    ret = stopped ? 0 : feed(p, &whole, &whole_len, err);
    pthread_mutex_lock(&p->lock);
    if (ret < 0)
        pl_fail(p, ret, err->msg);
    if (pl_load_first(o.policy) && !p->stop) /* everything is in: compute */
        pl_make_ready(p, 0);
    while (!p->done && !p->stop)
        pthread_cond_wait(&p->cv, &p->lock);
    if (p->error) {
        ret = p->error;
        *err = p->err;
    }
    pthread_cond_broadcast(&p->cv);
    pthread_cond_broadcast(&p->pf_cv);
    pthread_mutex_unlock(&p->lock);
join:
    for (uint32_t w = 0; w < p->n_workers; w++)
        pthread_join(p->workers[w], NULL);
    if (p->pf_started)
        pthread_join(p->pf_thread, NULL);
    if (dev_started)
        npu_device_join(p->dev);
    if (ret < 0)
        goto out;
    struct infer_pipeline_stats st_now; /* before pl_acts_fini: it counts the sets */
    pl_stats_fill(p, &st_now);
    if (stats)
        *stats = st_now;
    if (o.first_logits)
        o.first_logits(o.ctx, logits);
    reclaim_join(p); /* after the first token: what is left to free is not in its way */
    pl_pool_fini(p);
    pl_acts_fini(p); /* before the embedding comes in */
    /* decoding needs the (untied) embedding: read after the first token */
    ret = o.no_decode ? 0 : pl_embed_finish(p, err);
    if (ret < 0)
        goto out;
    p->m->globals_loaded = 1;
    for (uint32_t l = 0; l < c->n_layers; l++)
        p->m->layers[l].loaded = 1;
    if (o.trace_path) {
        if (pl_trace_write(p, o.trace_path, &st_now) < 0) {
            sl_err_set(err, "%s: cannot write the trace", o.trace_path);
            ret = -EIO;
            goto out;
        }
    }
    *model = p->m;
    *state = p->st;
    p->m = NULL;
    p->st = NULL;
out:
    pl_embed_rows_free(&p->embed_rows);
    reclaim_join(p);
    pl_pool_fini(p);
    loader_stream_close(p->ls);
    if (whole) {
        if (o.load == INFER_LOAD_MMAP)
            munmap(whole, whole_len);
        else
            sl_free_aligned(whole);
    }
    if (!o.device)
        npu_device_destroy(p->dev);
    for (uint32_t w = 0; w <= PL_MAX_CPU_WORKERS; w++) {
        free(p->att_scratch[w]);
        sl_free_aligned(p->fill_scratch[w]);
        sl_free_aligned(p->steal_stage[w]);
    }
    pl_acts_fini(p);
    infer_state_destroy(p->st);
    infer_model_destroy(p->m);
    free(p->tasks);
    free(p->pf);
    free(p->edges);
    free(p->edge_from);
    free(p->edge_to);
    free(p->slice_data);
    free(p->slice_sl);
    free(p->slice_ok);
    free(p->slice_left);
    free(p->verify_task);
    free(p->slice_needed);
    free(p->lin_info);
    free(p->positions);
    infer_rope_table_fini(&p->rope);
    for (uint32_t i = 0; i < p->n_drop; i++) /* left by a failed start of the thread */
        npu_weights_destroy(p->drop[i]);
    free(p->drop);
    free(p->mm_left);
    free(p->rel_layer);
    pthread_cond_destroy(&p->drop_cv);
    pl_queue_fini(p);
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->cv);
    pthread_cond_destroy(&p->pf_cv);
    free(p);
    return ret;
}

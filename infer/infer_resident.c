/* infer_resident.c: decoding straight from packed weights (`--resident
 * packed`): the packed linear path (the codes unpacked in registers by
 * unpack_tensor_dot, output channels split between the session's NPU device
 * thread and the calling thread), and dropping the int8 copies a cold start
 * used for its prefill. */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "infer_internal.h"
#include "npu.h"
#include "unpack.h"

static const char *const resident_names[] = {"int8", "packed", "auto"};

const char *infer_resident_name(enum infer_resident r)
{
    return (unsigned)r < 3 ? resident_names[r] : "unknown";
}

int infer_resident_parse(const char *s, enum infer_resident *out)
{
    for (int i = 0; i < 3; i++)
        if (s && !strcmp(s, resident_names[i])) {
            *out = (enum infer_resident)i;
            return 0;
        }
    return -EINVAL;
}

enum infer_resident infer_resident_resolve(enum infer_resident res, const struct format_reader *r,
                                           int no_shadow)
{
    if (res != INFER_RESIDENT_AUTO)
        return res;
    const void *v;
    size_t len;
    if (!no_shadow && format_reader_meta_get(r, FORMAT_SHADOW_META_KEY, &v, &len) == 0)
        return INFER_RESIDENT_INT8;
    long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (llc <= 0)
        llc = sysconf(_SC_LEVEL2_CACHE_SIZE);
    if (llc <= 0)
        llc = 32l << 20;
    uint64_t int8 = 0;
    for (uint32_t i = 0; i < format_reader_n_tensors(r); i++) {
        const struct format_tensor_info *t = format_reader_tensor(r, i);
        if (t->n_dims == 2 && format_encoding_traits(t->encoding)->quantized)
            int8 += t->shape[0] * t->shape[1];
    }
    return int8 > (uint64_t)llc ? INFER_RESIDENT_PACKED : INFER_RESIDENT_INT8;
}

/* Every linear of the model, tied classifier once. */
static int linears(struct infer_model *m, struct infer_linear **out, int cap)
{
    int n = 0;
    if (cap < 2)
        return 0;
    out[n++] = &m->embed;
    out[n++] = &m->cls_own;
    for (uint32_t l = 0; m->layers && l < m->cfg.n_layers && n + 7 <= cap; l++) {
        struct infer_layer *y = &m->layers[l];
        struct infer_linear *ls[7] = {&y->wq, &y->wk, &y->wv, &y->wo,
                                      &y->w_gate, &y->w_up, &y->w_down};
        for (int i = 0; i < 7; i++)
            out[n++] = ls[i];
    }
    return n;
}

#define MAX_LINEARS (2 + 7 * 4096)

size_t infer_model_drop_int8(struct infer_model *m)
{
    struct infer_linear **ls = malloc(sizeof *ls * MAX_LINEARS);
    if (!ls)
        return 0; /* nothing dropped: the int8 copies keep working */
    int n = linears(m, ls, MAX_LINEARS);
    size_t freed = 0;
    for (int i = 0; i < n; i++)
        if (ls[i]->upk && ls[i]->npu) {
            freed += npu_weights_bytes(ls[i]->npu);
            npu_weights_destroy(ls[i]->npu);
            ls[i]->npu = NULL;
        }
    free(ls);
    return freed;
}

void infer_model_weight_bytes(const struct infer_model *m, size_t *int8_bytes,
                              size_t *packed_bytes)
{
    *int8_bytes = *packed_bytes = 0;
    struct infer_linear **ls = malloc(sizeof *ls * MAX_LINEARS);
    if (!ls)
        return;
    int n = linears((struct infer_model *)m, ls, MAX_LINEARS);
    for (int i = 0; i < n; i++) {
        if (ls[i]->npu)
            *int8_bytes += npu_weights_bytes(ls[i]->npu);
        if (ls[i]->upk)
            *packed_bytes += ls[i]->upk->layout.data - (const uint8_t *)ls[i]->packed +
                             ls[i]->upk->layout.data_len;
    }
    free(ls);
}

/* Output channels [r0, r1) of a packed linear for n rows: y[i * ldy + r] =
 * (act * scale[r]) * acc, the int8 path's formula (npu.h), so the floats
 * are the same. acc: [n][rows] scratch (only [r0, r1) of each row used). */
struct packed_part {
    const struct infer_linear *lin;
    const int8_t *xq;
    uint32_t n, r0, r1;
    float act;
    float *y;
    int32_t *acc;
    struct infer_rows_tile **tile; /* this thread's tile scratch (a few rows) */
    const void *stage; /* the activations staged for unpack_tensor_dot_tiles, or NULL */
};

/* From PACKED_ROWS_MIN rows (infer_internal.h), a packed linear unpacks its
 * codes once for all rows rather than once per row: in registers, for up to
 * 8 rows, where unpack_tensor_dot does so (unpack_dot_multirow: AVX-512 VNNI
 * and an adaptive tensor without block multipliers; it also takes 2-3 rows
 * outside the decode's shared split), else a tile at a time into int8 for
 * the NPU's GEMM (infer_resident_rows.c, infer_packed_rows_take decides);
 * on AMX from 6 rows in registers into L1 pieces for the tile unit
 * (unpack_tensor_dot_tiles; p->stage set: infer_packed_tiles_take). With a
 * device thread, rows a dot kernel or the tile kernel takes go through the
 * shared range below instead (infer_packed_shares). */

static int packed_part_run(void *arg)
{
    const struct packed_part *p = arg;
    const struct infer_linear *lin = p->lin;
    if (p->r1 <= p->r0)
        return 0;
    if (!p->stage && infer_packed_rows_take(lin->upk, p->n)) {
        int r = infer_packed_rows(p->tile, lin, p->xq, p->n, p->act, p->y, p->r0, p->r1);
        if (r != -ERANGE) /* -ERANGE: a code the NPU's layout cannot hold */
            return r;
    }
    int ret = p->stage ? unpack_tensor_dot_tiles(lin->upk, p->r0, p->r1, p->stage,
                                                 p->acc + p->r0, lin->rows)
                       : unpack_tensor_dot(lin->upk, unpack_kernel_best(), p->r0, p->r1, p->xq,
                                           p->n, p->acc + p->r0, lin->rows);
    if (ret < 0)
        return ret;
    /* each channel's scale read once; the part's fields in locals, so the
     * stores to y need not reload them */
    const float act = p->act;
    float *const y = p->y;
    const int32_t *const acc = p->acc;
    const uint32_t n = p->n, rows = lin->rows;
    for (uint32_t r = p->r0; r < p->r1; r++) {
        const float s = act * unpack_tensor_scale(lin->upk, r);
        for (uint32_t i = 0; i < n; i++)
            y[(size_t)i * rows + r] = s * (float)acc[(size_t)i * rows + r];
    }
    return 0;
}

/* Decoding, and the few-row forwards a dot kernel or the tile kernel takes
 * (infer_packed_shares): the output channels handed out
 * in chunks from the two ends of one range, the device thread taking them
 * from the front and the calling thread from the back. Each streams its own
 * contiguous stretch of the packed bytes, and neither waits for the other
 * longer than one chunk, whichever thread starts late or streams slower (a
 * fixed split left one of them spinning: 6.5% of a ctx-1000 decode). Every
 * channel's sum is computed alone, so any split gives the same bits.
 *
 * The range may join up to INFER_PACKED_GROUP_MAX linears of one input (a
 * layer's q, k and v; gate and up): their channels one after the other, a
 * chunk never crossing from one linear into the next. The threads meet once
 * per group instead of once per linear, and the back end's last chunks of
 * one linear run while the front end is already in the next. */
struct packed_shared_part {
    const struct infer_linear *lin;
    const int8_t *xq; /* [n][cols] */
    float act;
    float *y;         /* [n][rows] */
    int32_t *acc;     /* [n][rows] */
    uint32_t base;    /* its first channel in the joint range */
    uint32_t chunk;
    /* each activation row's sums and tail, computed once for all chunks
     * (the multi-row dot kernel's rows too: summed again per chunk they
     * cost a fifth of the 8-row kernel's time, zv18) */
    struct unpack_dot_x px[UNPACK_TILES_ROWS_MAX];
    /* from PACKED_ROWS_MIN rows instead (infer_packed_tiles_take): the rows
     * staged once for unpack_tensor_dot_tiles */
    const void *stage;
};

struct packed_shared {
    uint32_t count, n;
    struct packed_shared_part part[INFER_PACKED_GROUP_MAX];
    _Atomic uint64_t range; /* front << 32 | back: the channels not taken yet */
};

/* The part that joint channel c falls in. */
static uint32_t part_of(const struct packed_shared *sh, uint32_t c)
{
    uint32_t j = 0;
    while (j + 1 < sh->count && sh->part[j + 1].base <= c)
        j++;
    return j;
}

/* Takes the next chunk from the front or the back of sh's range: 1, the
 * part *j and its channels [*r0, *r1), or 0 when nothing is left. */
static int shared_take(struct packed_shared *sh, int front, uint32_t *j, uint32_t *r0,
                       uint32_t *r1)
{
    uint64_t cur = atomic_load_explicit(&sh->range, memory_order_relaxed);
    for (;;) {
        uint32_t lo = (uint32_t)(cur >> 32), hi = (uint32_t)cur, a, b;
        if (lo >= hi)
            return 0;
        uint32_t p = part_of(sh, front ? lo : hi - 1);
        const struct packed_shared_part *q = &sh->part[p];
        if (front) {
            uint32_t end = q->base + q->lin->rows;
            a = lo;
            b = end - lo <= q->chunk ? end : lo + q->chunk;
            b = b < hi ? b : hi;
        } else {
            b = hi;
            a = hi - q->base <= q->chunk ? q->base : hi - q->chunk;
            a = a > lo ? a : lo;
        }
        uint64_t next = front ? (uint64_t)b << 32 | hi : (uint64_t)lo << 32 | a;
        if (atomic_compare_exchange_weak_explicit(&sh->range, &cur, next, memory_order_relaxed,
                                                  memory_order_relaxed)) {
            *j = p;
            *r0 = a - q->base;
            *r1 = b - q->base;
            return 1;
        }
    }
}

/* Bytes of a chunk's codes asked for ahead of it: the dot kernel's own
 * prefetch distance (UNPACK_PREFETCH_ADAPTIVE weights, about 5 KiB at 5
 * bits) and some. */
#define SHARED_PF_BYTES (8u << 10)

/* Asks for (into L2) what rows [r0, r1) of u are read through besides the
 * codes: their row offsets and scales (a few lines per chunk, each a miss
 * otherwise, since the codes stream evicts them); with `head`, also the
 * first SHARED_PF_BYTES of their codes. */
static void chunk_prefetch(const struct unpack_tensor *u, uint32_t r0, uint32_t r1, int head)
{
    for (uint32_t r = r0; r < r1; r += 8)
        __builtin_prefetch(&u->row_off[r], 0, 2);
    for (uint32_t r = r0; r < r1; r += 16)
        __builtin_prefetch(u->layout.scales + 4 * (size_t)r, 0, 2);
    if (!head)
        return;
    const uint8_t *p = u->layout.data + u->row_off[r0];
    for (uint32_t o = 0; o < SHARED_PF_BYTES; o += 64)
        __builtin_prefetch(p + o, 0, 2);
}

/* What an end of the range reads next, asked for now: the front's next
 * chunk follows this one (the kernel's prefetch runs into it) unless it is
 * the next linear's first; the back's is the one before, or the previous
 * linear's last (the tile kernel walks the back's chunks downwards,
 * unpack_tensor_dot_tiles_down). Codes are asked for only where the kernel's own prefetch
 * does not reach. */
static void next_prefetch(const struct packed_shared *sh, uint32_t j, uint32_t r0, uint32_t r1,
                          int front)
{
    const struct packed_shared_part *p = &sh->part[j];
    uint32_t rows = p->lin->rows;
    if (front && r1 < rows) {
        chunk_prefetch(p->lin->upk, r1, rows - r1 > p->chunk ? r1 + p->chunk : rows, 0);
    } else if (front && j + 1 < sh->count) {
        const struct packed_shared_part *q = &sh->part[j + 1];
        chunk_prefetch(q->lin->upk, 0, q->lin->rows > q->chunk ? q->chunk : q->lin->rows, 1);
    } else if (!front && r0 > 0) { /* the tile kernel's last pass asks for its codes */
        chunk_prefetch(p->lin->upk, r0 > p->chunk ? r0 - p->chunk : 0, r0, !p->stage);
    } else if (!front && j > 0) {
        const struct packed_shared_part *q = &sh->part[j - 1];
        uint32_t n = q->lin->rows, a = n > q->chunk ? n - q->chunk : 0;
        chunk_prefetch(q->lin->upk, a, n, !q->stage);
        if (q->stage) /* walked downwards: the head of its top pass */
            chunk_prefetch(q->lin->upk, n > 32 ? n - 32 : 0, n, 1);
    }
}

static int shared_drain(struct packed_shared *sh, int front)
{
    uint32_t j, r0, r1;
    while (shared_take(sh, front, &j, &r0, &r1)) {
        const struct packed_shared_part *p = &sh->part[j];
        const struct infer_linear *lin = p->lin;
        chunk_prefetch(lin->upk, r0, r1, 0);
        next_prefetch(sh, j, r0, r1, front);
        /* from PACKED_ROWS_MIN rows, a part without a stage takes the
         * multi-row dot kernel (shared_multirow): all rows of a chunk in
         * one unpack_tensor_dot */
        const int multi = !p->stage && sh->n >= PACKED_ROWS_MIN;
        if (p->stage) { /* the back end's passes downwards, towards its next chunk */
            int ret = (front ? unpack_tensor_dot_tiles : unpack_tensor_dot_tiles_down)(
                lin->upk, r0, r1, p->stage, p->acc + r0, lin->rows);
            if (ret < 0)
                return ret;
        } else if (multi) { /* packed_part_run's call on the chunk */
            int ret = unpack_tensor_dot_xm(lin->upk, unpack_kernel_best(), r0, r1, p->xq, sh->n,
                                           p->px, p->acc + r0, lin->rows);
            if (ret < 0)
                return ret;
        }
        /* the part's fields in locals, so the stores to y need not reload
         * them (GCC -O3 then vectorizes the loop below behind its overlap
         * check) */
        const float act = p->act;
        float *const y = p->y;
        const int32_t *const acc = p->acc;
        const uint8_t *const sc = lin->upk->layout.scales;
        for (uint32_t i = 0; i < sh->n; i++) {
            size_t at = (size_t)i * lin->rows;
            int ret = p->stage || multi
                          ? 0
                          : unpack_tensor_dot_x(lin->upk, unpack_kernel_best(), r0, r1,
                                                p->xq + (size_t)i * lin->cols, &p->px[i],
                                                p->acc + at + r0);
            if (ret < 0)
                return ret;
            /* packed_part_run's formula; the row scales read where they lie
             * (unpack_tensor_scale's little-endian floats) */
            for (uint32_t r = r0; r < r1; r++) {
                float s = act * sl_load_lef32(sc + 4 * (size_t)r);
                y[at + r] = s * (float)acc[at + r];
            }
        }
    }
    return 0;
}

static int shared_run(void *arg)
{
    return shared_drain(arg, 1);
}

/* Channels per chunk: about SHARED_CHUNK_BYTES of packed codes, a multiple
 * of 16, at most an eighth of the rows (so small linears still split). With
 * unpack_tensor_dot_tiles (tiles): four times the bytes, a multiple of its
 * passes of 32 channels (each pass prefetches the next one's bytes, so a
 * chunk of one pass streams unprefetched; 8-row forward x1.60-1.78 -> x1.51-1.58
 * of one row, docs/BENCHMARKS.md, o18). `many`: PACKED_ROWS_MIN rows or more
 * (the tile kernel, or the multi-row dot kernel: 4-row forward of
 * tinyllama 5-bit, CPU median 98 ms before it shared the range, 114 with
 * chunks of 64 KiB, 88 with 256 KiB; f18). */
#define SHARED_CHUNK_BYTES ((uint64_t)64 << 10)
static _Atomic uint32_t chunk_override; /* tests */

void infer_packed_shared_set_chunk(uint32_t channels)
{
    atomic_store(&chunk_override, channels);
}

static uint32_t shared_chunk(const struct infer_linear *lin, int many)
{
    uint32_t o = atomic_load_explicit(&chunk_override, memory_order_relaxed);
    if (o)
        return o;
    uint64_t row = lin->upk->layout.data_len / lin->rows;
    uint64_t c = SHARED_CHUNK_BYTES * (many ? 4 : 1) / (row ? row : 1), most = lin->rows / 8;
    if (c > most)
        c = most;
    /* unpack_tensor_dot_tiles: passes of 32; the multi-row dot kernel has no
     * such unit and takes the same */
    const uint32_t unit = many ? 32 : 16;
    c = c / unit * unit;
    return c < unit ? unit : (uint32_t)c;
}

/* Decoding's packed linears split from this many weights: the k and v
 * projections of a grouped-query model (TinyLlama's 256 x 2048) are under
 * the state's default npu_min_weights of 2^20 and would otherwise run on
 * the calling thread while the device thread spins; a state's lower
 * npu_min_weights wins. */
#define PACKED_SPLIT_MIN (1u << 18)

/* From PACKED_ROWS_MIN rows where neither the tile kernel nor
 * infer_packed_rows takes them (4-5 rows on AMX, up to DOT_ROWS_MAX
 * without): the multi-row dot kernel on each chunk of the shared range.
 * They took a fixed split (infer_linear_packed's), the calling thread
 * waiting for the device thread's share: npu_ticket_wait was 2.7 ms of a
 * 4-row forward's 77 ms of CPU (tinyllama 5-bit, docs/BENCHMARKS.md,
 * seventeenth session, f18). */
static int shared_multirow(const struct unpack_tensor *u, uint32_t n)
{
    return n >= PACKED_ROWS_MIN && !infer_packed_tiles_take(u, n) && !infer_packed_rows_take(u, n);
}

int infer_packed_shares(const struct infer_state *s, const struct infer_linear *lin, uint32_t n)
{
    uint64_t least = s->npu_min_weights < PACKED_SPLIT_MIN ? s->npu_min_weights : PACKED_SPLIT_MIN;
    return s->dev && !lin->npu && lin->upk && n > 0 &&
           (n < PACKED_ROWS_MIN || infer_packed_tiles_take(lin->upk, n) ||
            shared_multirow(lin->upk, n)) &&
           !s->split_work && lin->rows >= 32 && infer_split_work(s, lin, n) >= least;
}

/* s->acc holds at least need sums: 0 or -ENOMEM. */
static int acc_reserve(struct infer_state *s, size_t need, struct sl_err *err)
{
    if (need <= s->acc_cap)
        return 0;
    int32_t *a = sl_realloc(s->acc, need * sizeof *a);
    if (!a) {
        sl_err_set(err, "out of memory for a packed matmul's sums");
        return -ENOMEM;
    }
    s->acc = a;
    s->acc_cap = need;
    return 0;
}

/* s->tiles_stage of at least `need` bytes, 64-byte aligned. */
static int tiles_stage_reserve(struct infer_state *s, size_t need, struct sl_err *err)
{
    if (infer_reserve_aligned(&s->tiles_stage, &s->tiles_stage_cap, need) < 0) {
        sl_err_set(err, "out of memory for a packed matmul's staged rows");
        return -ENOMEM;
    }
    return 0;
}

/* A stage's bytes for n rows of cols, rounded up to 64 (stages lie one
 * after another, each 64-byte aligned). */
static size_t stage_span(uint32_t cols, uint32_t n)
{
    return (unpack_dot_tiles_stage_bytes(cols, n) + 63) / 64 * 64;
}

/* The first part i <= j with part j's activations (the same rows, the same
 * width) that takes the tile kernel, as j does (tiles[]): its stage serves
 * j too. */
static uint32_t stage_of(const int8_t *const *xq, const struct infer_linear *const *lins,
                         const int *tiles, uint32_t j)
{
    uint32_t i = 0;
    while (i < j && !(tiles[i] && xq[i] == xq[j] && lins[i]->cols == lins[j]->cols))
        i++;
    return i;
}

int infer_linear_packed_group(struct infer_state *s, uint32_t count,
                              const struct infer_linear *const *lins, const int8_t *const *xq,
                              const float *act, float *const *y, uint32_t n, struct sl_err *err)
{
    if (count == 0 || count > INFER_PACKED_GROUP_MAX || n == 0 || n > UNPACK_TILES_ROWS_MAX) {
        sl_err_set(err, "a packed group of %u linears for %u rows", count, n);
        return -EINVAL;
    }
    uint32_t total = 0;
    for (uint32_t j = 0; j < count; j++) {
        /* from PACKED_ROWS_MIN rows a part shares only where the tile
         * kernel or the multi-row dot kernel takes it (infer_packed_shares):
         * the px[] path below holds fewer rows */
        if (!infer_packed_shares(s, lins[j], n)) {
            sl_err_set(err, "a %u x %u linear cannot join a packed group", lins[j]->rows,
                       lins[j]->cols);
            return -EINVAL;
        }
        total += lins[j]->rows;
    }
    int ret = acc_reserve(s, (size_t)n * total, err);
    if (ret < 0)
        return ret;
    /* from PACKED_ROWS_MIN rows a part takes unpack_tensor_dot_tiles or
     * the multi-row dot kernel (infer_packed_shares); the tile kernel's
     * parts have their rows staged once, one after another, or a part's
     * stage shared with an earlier part of the same activations (a layer's
     * q, k and v; its gate and up) */
    int tiles[INFER_PACKED_GROUP_MAX];
    size_t sb = 0;
    for (uint32_t j = 0; j < count; j++) {
        tiles[j] = n >= PACKED_ROWS_MIN && infer_packed_tiles_take(lins[j]->upk, n);
        if (tiles[j] && stage_of(xq, lins, tiles, j) == j)
            sb += stage_span(lins[j]->cols, n);
    }
    if (sb > 0 && (ret = tiles_stage_reserve(s, sb, err)) < 0)
        return ret;
    struct packed_shared sh = {.count = count, .n = n};
    uint8_t *stage = s->tiles_stage;
    for (uint32_t j = 0, base = 0; j < count; base += lins[j]->rows, j++) {
        struct packed_shared_part *p = &sh.part[j];
        *p = (struct packed_shared_part){.lin = lins[j], .xq = xq[j], .act = act[j], .y = y[j],
                                         .acc = s->acc + (size_t)n * base, .base = base,
                                         .chunk = shared_chunk(lins[j], n >= PACKED_ROWS_MIN)};
        if (tiles[j]) {
            uint32_t i = stage_of(xq, lins, tiles, j);
            if (i < j) { /* the same rows, staged already */
                p->stage = sh.part[i].stage;
                continue;
            }
            if ((ret = unpack_dot_tiles_stage(lins[j]->cols, xq[j], n, stage)) < 0) {
                sl_err_set(err, "staging a packed matmul's rows failed (%s)", strerror(-ret));
                return ret;
            }
            p->stage = stage;
            stage += stage_span(lins[j]->cols, n);
            continue;
        }
        for (uint32_t i = 0; i < n; i++) /* one row at a time, or multi-row */
            unpack_dot_x_init(lins[j]->upk, xq[j] + (size_t)i * lins[j]->cols, &p->px[i]);
    }
    atomic_init(&sh.range, (uint64_t)total);
    struct npu_ticket *t = NULL;
    ret = npu_device_call(s->dev, shared_run, &sh, &t, err);
    if (ret < 0)
        return ret;
    ret = shared_drain(&sh, 0);
    if (ret < 0) /* what is left of the range is the device thread's; then stop it */
        atomic_store(&sh.range, 0);
    /* every chunk is taken: a call the device thread has not started (a busy
     * machine) is taken back rather than waited for */
    int ret_dev = npu_ticket_revoke(s->dev, t);
    if (ret_dev == -ECANCELED)
        ret_dev = 0;
    else if (ret_dev == 0)
        s->npu_jobs++;
    if (ret == 0)
        ret = ret_dev;
    if (ret < 0)
        sl_err_set(err, "a packed matmul (%u x %u%s) failed (%s)", lins[0]->rows, lins[0]->cols,
                   count > 1 ? " and the rest of its group" : "", strerror(-ret));
    return ret;
}

int infer_linear_packed(struct infer_state *s, const struct infer_linear *lin, const int8_t *xq,
                        uint32_t n, float act, float *y, struct sl_err *err)
{
    if (infer_packed_shares(s, lin, n))
        return infer_linear_packed_group(s, 1, &lin, &xq, &act, &y, n, err);
    int ret = acc_reserve(s, (size_t)n * lin->rows, err);
    if (ret < 0)
        return ret;
    uint32_t rows = lin->rows, r_npu = 0;
    if (s->dev && rows >= 32 && infer_split_work(s, lin, n) >= s->npu_min_weights)
        r_npu = (uint32_t)(rows * s->npu_share) / 16 * 16;
    const void *stage = NULL;
    if (infer_packed_tiles_take(lin->upk, n)) {
        /* staged once here for both threads */
        if ((ret = tiles_stage_reserve(s, unpack_dot_tiles_stage_bytes(lin->cols, n), err)) < 0)
            return ret;
        if ((ret = unpack_dot_tiles_stage(lin->cols, xq, n, s->tiles_stage)) < 0) {
            sl_err_set(err, "staging a packed matmul's rows failed (%s)", strerror(-ret));
            return ret;
        }
        stage = s->tiles_stage;
    }
    struct packed_part dev = {lin, xq, n, 0, r_npu, act, y, s->acc, &s->rows_tile[1], stage};
    struct packed_part own = {lin, xq, n, r_npu, rows, act, y, s->acc, &s->rows_tile[0], stage};
    struct npu_ticket *t = NULL;
    if (r_npu > 0 && (ret = npu_device_call(s->dev, packed_part_run, &dev, &t, err)) < 0)
        return ret;
    ret = packed_part_run(&own);
    int ret_dev = t ? npu_ticket_wait(t) : 0;
    if (ret == 0 && ret_dev < 0)
        ret = ret_dev;
    if (ret < 0) {
        sl_err_set(err, "a packed matmul (%u x %u) failed (%s)", rows, lin->cols, strerror(-ret));
        return ret;
    }
    if (t)
        s->npu_jobs++;
    return 0;
}

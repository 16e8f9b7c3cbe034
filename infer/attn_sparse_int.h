/* attn_sparse_int.h: what the files of sparse attention's implementation
 * share (infer_attn_sparse.c the instance, attn_sparse_run.c one call,
 * attn_sparse_est.c the estimate's side: keys, Q scales, launches;
 * attn_sparse_attend.c the CPU side: top-k and the exact stage per launch):
 * the instance's state, a launch, the scratch of the CPU side and their
 * sizes. Private to those files; attn_sparse.h has the kernels, infer.h the
 * interface. */
#ifndef SLUICE_ATTN_SPARSE_INT_H
#define SLUICE_ATTN_SPARSE_INT_H

#include <pthread.h>
#include <stdint.h>

#include "attn_sparse.h"
#include "infer_internal.h"
#include "npu.h"

#define KEY_BUCKET 256u
/* Estimate rows are L + YPAD floats apart: at L floats (a multiple of 256)
 * the 16 rows a kernel writes at once shared one L1 set; the AMX estimate
 * of 16 rows x 4K keys took 1.7x as long (VNNI 1.7x too). */
#define YPAD 16u
#define AHEAD 2 /* launches in flight on the device */
#define SCRATCH_SLOTS 4

struct kslot {
    struct npu_weights *w; /* [L][head_dim] int8 keys of one layer and kv head */
    uint32_t L, filled;
    int8_t *codes; /* [cap][head_dim]: the host copy of w's codes */
    float *sc;     /* [cap]: their scales */
    uint32_t cap;
};

struct infer_sparse {
    struct infer_attention attn;
    char name[64]; /* "sparse keep 0.20" (traces) */
    struct format_config cfg;
    struct infer_sparse_opts o;
    double *ratio; /* [L * H] */
    float *qmean;  /* [L * H]; 0 until known */
    uint32_t buckets;
    float step;
    double c_est, c_topk, c_qkv;
    struct kslot *ks; /* [L * KV] */
    struct npu_device *dev;
    int own_dev;
    pthread_mutex_t lock;
    pthread_mutex_t slock[SCRATCH_SLOTS]; /* the cached scratch blocks: one per concurrent call */
    void *sbuf[SCRATCH_SLOTS];
    size_t scap[SCRATCH_SLOTS];
    struct infer_sparse_stats st;
    double recall_sum, mass_sum;
    uint64_t recall_n, mass_n;
};

struct launch {
    uint32_t g;        /* kv head */
    uint32_t bucket;
    uint32_t cnt;      /* heads */
    uint32_t i0, nr;   /* its rows of the call: [i0, i0 + nr) */
    uint32_t head[ATTN_PLAN_MAX];
    float scale;
    int8_t *xq;        /* [cnt * n][hd] */
    float *y;          /* [cnt * nr][L] */
    struct npu_job job;
    struct npu_ticket *ticket;
};

static inline uint32_t pow2ceil(uint32_t v)
{
    uint32_t p = 1;
    while (p < v)
        p <<= 1;
    return p;
}

struct call_stats {
    uint64_t row_heads, visible, kept, launches, total_ns, wait_ns, topk_ns, qkv_ns;
    double recall, mass;
    uint64_t recall_n;
};

/* Pairs per block (rows of a launch's heads): their keys and values are
 * walked in blocks of attn_key_tile(hd) slots together (attn_sel_rows). */
#define PAIRS 128u
/* the fewest rows per launch (per head) whose inline estimates run per head */
#define SPLIT_ROWS 8u
/* A block of key (then value) rows walked together is KEY_TILE_BYTES: 32 KB
 * stays in the 48 KB L1 while every pair reads its kept rows of it. 256
 * slots of head size 64 (64 KB) did not, and each pair's reads of the block
 * went to L2 (bench attn, 4K, keep 0.4, speedup over dense in two rounds at
 * load 5-6: tinyllama 64 KB 0.94x / 0.83x, 32 KB 1.01x / 1.09x, 16 KB
 * 1.18x / 1.34x; llama3-8b 64 KB 1.48x / 1.31x, 32 KB 1.62x / 1.40x, 16 KB
 * 1.40x / 1.81x: 16 and 32 KB level within the noise, both ahead of 64). */
#define KEY_TILE_BYTES 32768u
static inline uint32_t attn_key_tile(uint32_t hd)
{
    uint32_t t = KEY_TILE_BYTES / (uint32_t)(sizeof(float) * (hd ? hd : 1));
    return t < 16 ? 16 : t > 256 ? 256 : t;
}
/* the most rows of a row block (infer_sparse_opts.row_block) */
#define ATTN_ROW_BLOCK_MAX 16u
/* inline estimates: the most bytes of one head's estimates run at once
 * (llama3-8b's 32 rows per head at 4K, 557 KB, did not stay in L2 until
 * their rows picked their keys; tinyllama's 16, 278 KB, did) */
#ifndef EST_PIECE_BYTES
#define EST_PIECE_BYTES (320u << 10)
#endif

/* The scratch of attend_launch. */
struct attend_buf {
    uint32_t *sel;  /* [PAIRS][T] */
    float *a;       /* [PAIRS][T] */
    uint32_t *work; /* [2 T] */
    uint32_t *cur;  /* [PAIRS] */
    float *gather, *fs;
    uint32_t *i1, *i2;
    /* inline estimates per head (NULL: per launch): the graph of one head's
     * rows and its output [rows][L] */
    const struct npu_graph *gsub;
    float *ysub;
    uint8_t *stage; /* gsub's staging (npu_graph_info scratch_bytes), the call's */
};

/* K weights of (layer, g) covering slots [0, T), from the cache
 * (attn_sparse_est.c): refilled from the first slot that changed. */
int attn_sparse_prepare_keys(struct infer_sparse *sp, const struct infer_kv *kv, uint32_t layer,
                             uint32_t g, uint32_t base, uint32_t T, struct sl_err *err);
/* A launch's job on graph gr over the keys w (nr rows per head, output rows
 * ldy floats apart): submitted to the device, or (inline estimates) left
 * for attn_sparse_finish_launch to run on the calling thread. */
int attn_sparse_start_launch(struct infer_sparse *sp, struct launch *la, const struct npu_graph *gr,
                             const struct npu_weights *w, uint32_t nr, size_t ldy,
                             struct sl_err *err);
/* Waits for (or runs) the launch's job; 0 or a negative errno (err set). */
int attn_sparse_finish_launch(struct launch *la, struct sl_err *err);
/* Q scale of head h over the call's n rows (rows qdim apart): max|q| / 127
 * (1 when all zero); the largest of heads [a0, a1) (the shared selection's
 * bucket); the centre of kv head g's bucket grid (the geometric mean of its
 * heads' profiled mean Q scales, else of their first call's; takes sp->lock). */
float attn_sparse_head_scale(const float *q, uint32_t n, size_t qdim, uint32_t hd, uint32_t h);
float attn_sparse_group_scale(const float *q, uint32_t n, size_t qdim, uint32_t hd, uint32_t a0,
                              uint32_t a1);
float attn_sparse_group_center(struct infer_sparse *sp, uint32_t layer, uint32_t g, const float *q,
                               uint32_t n);
/* Top-k and softmax.V for every row of every head of a finished launch l
 * (attn_sparse_attend.c; estimates rows ld floats apart, kv head l->g's keys
 * and values at kh, vh, rows kv_dim apart), PAIRS (row, head) pairs at a
 * time; hint[(h - h0) * ATTN_HINT]: each head's threshold guesses, carried across launches. */
int attn_sparse_attend(struct infer_sparse *sp, uint32_t layer, const struct infer_attn_rows *rows,
                       const float *q, const struct launch *l, size_t ld, float *out, uint32_t h0,
                       float *hint, const float *kh, const float *vh, size_t kv_dim,
                       const struct attend_buf *b, struct call_stats *cs, struct sl_err *err);
/* The attention interface's run (attn_sparse_run.c): one call. */
int attn_sparse_run(const struct infer_attention *at, const struct format_config *c,
                    const struct infer_kv *kv, uint32_t layer, const struct infer_attn_rows *rows,
                    const float *q, uint32_t h0, uint32_t h1, float *out, float *scratch);

#endif

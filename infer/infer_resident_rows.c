/* infer_resident_rows.c: a packed linear (packed residency) for a few
 * activation rows at once, a draft tree's verification (4 to 16 rows):
 * where unpack_tensor_dot unpacks a row's codes again for every activation
 * row (all but AVX-512 VNNI: unpack_dot_multirow), n rows cost about n
 * one-row steps of unpacking. Here the codes are
 * unpacked once per call, a tile of output channels at a time, into int8
 * in the NPU's layout (npu_weights_fill), and the tile is multiplied with
 * all n rows by the NPU's GEMM (its few-rows kernel where the codes are
 * small; the activations staged once per call), while the tile is in the
 * core's cache; on AMX the unpacked tile is multiplied as it lies
 * (npu_linear_s8_rowmajor, the same bits), without that packing. The sums are the same
 * exact integers, and y = (act * scale[r]) * acc as on both other paths,
 * so the floats are the same bits (test_spec: packed_rows). On AMX, an
 * adaptive tensor without block multipliers takes neither this tile path
 * nor the dot kernels from TILES_ROWS_MIN rows (infer_packed_tiles_take):
 * unpack_tensor_dot_tiles unpacks in registers straight into L1 pieces that
 * the tile unit multiplies (the caller, infer_resident.c, stages the rows
 * once for both threads). */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "infer_internal.h"
#include "npu.h"
#include "unpack.h"

/* Tile of output channels: about TILE_BYTES of int8 codes (a core's L2
 * holds it beside the prefetched stream), a multiple of 16 channels. */
#define TILE_BYTES ((size_t)192 << 10)

struct infer_rows_tile {
    int8_t *q;             /* [rows][cols] unpacked codes of the tile */
    float *scale;          /* [rows] */
    struct npu_weights *w; /* the tile in the NPU's layout */
    size_t cap_q;          /* bytes of q */
    uint32_t cap_rows;     /* floats of scale */
    void *stage;           /* the call's activations, staged once (npu_stage_act) */
    size_t cap_stage;
};

void infer_rows_tile_free(struct infer_rows_tile *t)
{
    if (!t)
        return;
    sl_free_aligned(t->q);
    free(t->scale);
    npu_weights_destroy(t->w);
    sl_free_aligned(t->stage);
    free(t);
}

static _Atomic uint32_t tile_override; /* tests: channels per tile, 0: by TILE_BYTES */

void infer_packed_rows_set_tile(uint32_t channels)
{
    atomic_store(&tile_override, channels / 16 * 16);
}

/* unpack_tensor_dot's multi-row kernels (unpack_dot_multirow) multiply
 * each stripe of codes with every row (one vpdpbusd per row): for up to this
 * many rows they beat unpacking a tile for AMX; for more (16) the AMX tile
 * path is faster (docs/BENCHMARKS.md, fifteenth session, p18; measured on
 * this AMX machine only: without AMX the 9-16-row tiles' GEMM was not
 * compared with the 16-row kernel). */
#define DOT_ROWS_MAX 8

int infer_packed_rows_take(const struct unpack_tensor *u, uint32_t n)
{
    return n >= PACKED_ROWS_MIN && (n > DOT_ROWS_MAX || atomic_load(&tile_override) ||
                                    !unpack_dot_multirow(u, unpack_kernel_best()));
}

/* From this many rows, unpack_tensor_dot_tiles (AMX: the codes unpacked in
 * registers into a piece in L1 and multiplied there) where it takes the
 * tensor: one thread streaming a 2048 x 131072 5-bit tensor from memory,
 * it costs about the same from 1 to 12 rows (1.24-1.42x one row's
 * unpack_tensor_dot), where the multi-row dot kernels cost 1.1x at 4 rows
 * but 1.5-1.6x at 6-8 and 2.5x at 12 (docs/BENCHMARKS.md, sixteenth
 * session, o18). */
#define TILES_ROWS_MIN 6
_Static_assert(TILES_ROWS_MIN >= PACKED_ROWS_MIN, "the tile kernel's rows are packed rows");

int infer_packed_tiles_take(const struct unpack_tensor *u, uint32_t n)
{
    return n >= TILES_ROWS_MIN && !atomic_load(&tile_override) &&
           unpack_dot_tiles_takes(u, n);
}

static uint32_t tile_rows(uint32_t cols)
{
    uint32_t o = atomic_load(&tile_override);
    if (o)
        return o;
    size_t r = TILE_BYTES / cols / 16 * 16;
    return r < 16 ? 16 : r > 512 ? 512 : (uint32_t)r;
}

/* t's buffers for tiles of `rows` channels of `cols` inputs. */
static int tile_fit(struct infer_rows_tile *t, uint32_t rows, uint32_t cols, int plain)
{
    size_t need = (size_t)rows * cols;
    if (need > t->cap_q) {
        int8_t *q = sl_alloc_aligned(need, 64);
        if (!q)
            return -ENOMEM;
        sl_free_aligned(t->q);
        t->q = q;
        t->cap_q = need;
    }
    if (rows > t->cap_rows) {
        float *s = sl_malloc(sizeof(float) * rows);
        if (!s)
            return -ENOMEM;
        free(t->scale);
        t->scale = s;
        t->cap_rows = rows;
    }
    if (plain || (t->w && npu_weights_reshape(t->w, rows, cols) == 0))
        return 0; /* plain: no NPU copy of the tile */
    /* room for any tile of this many columns or fewer rows (a tile is at
     * most TILE_BYTES but where 16 channels are more), so that linears of
     * other shapes reuse it */
    uint32_t alloc_rows = (uint32_t)((TILE_BYTES + (size_t)16 * cols) / cols + 15) / 16 * 16;
    struct npu_weights *w;
    int ret = npu_weights_alloc(alloc_rows > rows ? alloc_rows : rows, cols, &w);
    if (ret == 0 && (ret = npu_weights_reshape(w, rows, cols)) < 0)
        npu_weights_destroy(w);
    if (ret < 0)
        return ret;
    npu_weights_destroy(t->w);
    t->w = w;
    return 0;
}

int infer_packed_rows(struct infer_rows_tile **tp, const struct infer_linear *lin, const int8_t *xq,
                      uint32_t n, float act, float *y, uint32_t r0, uint32_t r1)
{
    if (r1 <= r0)
        return 0;
    if (!*tp && !(*tp = sl_calloc(1, sizeof **tp)))
        return -ENOMEM;
    struct infer_rows_tile *t = *tp;
    const uint32_t rows = lin->rows, cols = lin->cols, T = tile_rows(cols);
    /* on AMX, the unpacked tile is multiplied as it lies, row-major
     * (npu_linear_s8_rowmajor): no packing into the GEMM's layout */
    const int plain = T % 16 == 0 && npu_rowmajor_takes(n, r1 - r0, cols); /* every tile then 16 | nr */
    const size_t sb = plain ? npu_rowmajor_stage_bytes(n, cols) : npu_stage_bytes(n, cols);
    if (sb > t->cap_stage) {
        void *p = sl_alloc_aligned(sb, 64);
        if (!p)
            return -ENOMEM;
        sl_free_aligned(t->stage);
        t->stage = p;
        t->cap_stage = sb;
    }
    if (plain)
        npu_rowmajor_stage(xq, n, cols, t->stage);
    else
        npu_stage_act(xq, n, cols, t->stage);
    for (uint32_t r = r0; r < r1; r += T) {
        uint32_t nr = r1 - r < T ? r1 - r : T;
        int ret = tile_fit(t, nr, cols, plain);
        if (ret == 0)
            ret = unpack_tensor_rows_store(lin->upk, unpack_kernel_best(), r, r + nr, t->q, NULL,
                                           UNPACK_STORE_CACHED);
        for (uint32_t i = 0; ret == 0 && i < nr; i++)
            t->scale[i] = unpack_tensor_scale(lin->upk, r + i);
        if (ret == 0 && plain) {
            ret = npu_linear_s8_rowmajor(t->q, t->scale, nr, cols, t->stage, n, act, y + r, rows);
            if (ret < 0)
                return ret;
            continue;
        }
        if (ret == 0)
            ret = npu_weights_fill(t->w, 0, nr, t->q, t->scale);
        if (ret < 0)
            return ret; /* -ERANGE: a code of -128 (the caller takes the row path) */
        npu_linear_s8_staged(t->w, t->stage, n, act, y + r, rows, 0, nr);
    }
    return 0;
}

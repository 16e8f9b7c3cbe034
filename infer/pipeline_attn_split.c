/* pipeline_attn_split.c: where a chunk's prefill attention is cut into
 * pieces of query rows (pl_attn_split). Pure arithmetic on the chunk's shape,
 * so that tests can check the boundaries without a model: pieces start at
 * multiples of INFER_ATT_ROWS (the dense attention's own row blocks, so every
 * row is computed exactly as unsplit), and either hold about `want` rows
 * each or, with want 0, about PL_ATTN_PIECE_FLOP of work each, where a causal
 * row's work grows with its position (later pieces hold fewer rows). */
#include "pipeline.h"

double pl_attn_rows_work(double pos0, double r)
{
    return r * pos0 + r * (r + 1) / 2;
}

static double rows_work(double per_key, double pos0, double r)
{
    return per_key * pl_attn_rows_work(pos0, r);
}

uint32_t pl_attn_split(uint32_t n, uint32_t pos0, double per_key, uint32_t want,
                       uint32_t starts[PL_ATTN_MAX_PIECES + 1])
{
    uint32_t np = 1;
    starts[0] = 0;
    starts[1] = n;
    if (n <= INFER_ATT_ROWS || want >= n || !(per_key > 0))
        return 1;
    double total = rows_work(per_key, pos0, n);
    uint32_t blocks = (n + INFER_ATT_ROWS - 1) / INFER_ATT_ROWS, parts;
    if (want) {
        uint32_t step = want / INFER_ATT_ROWS + (want % INFER_ATT_ROWS != 0);
        parts = (blocks + step - 1) / step;
    } else {
        double d = total / PL_ATTN_PIECE_FLOP + 0.5;
        parts = d >= (double)PL_ATTN_MAX_PIECES ? PL_ATTN_MAX_PIECES : (uint32_t)d;
    }
    parts = parts > blocks ? blocks : parts > PL_ATTN_MAX_PIECES ? PL_ATTN_MAX_PIECES : parts;
    if (parts <= 1)
        return 1;
    for (uint32_t k = 1, blk = 1; k < parts && blk < blocks; k++) {
        uint32_t i;
        if (want) { /* equal rows */
            i = (uint32_t)(((uint64_t)blocks * k + parts - 1) / parts) * INFER_ATT_ROWS;
        } else { /* the first block boundary with at least k / parts of the work before it */
            double goal = total * k / parts;
            for (; blk < blocks; blk++)
                if (rows_work(per_key, pos0, (double)blk * INFER_ATT_ROWS) >= goal)
                    break;
            i = blk * INFER_ATT_ROWS;
        }
        if (i > starts[np - 1] && i < n)
            starts[np++] = i;
    }
    starts[np] = n;
    return np;
}

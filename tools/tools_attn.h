/* tools_attn.h: the attention options run, eval and bench share
 * (--attn dense|sparse, --keep R, --keep-uniform, --sinks N, --window N,
 * --select head|group, --estimate device|inline)
 * and the sparse attention they make from a container's profile. */
#ifndef SLUICE_TOOLS_ATTN_H
#define SLUICE_TOOLS_ATTN_H

#include "format.h"
#include "infer.h"
#include "tools_util.h"

struct tools_attn {
    int sparse;      /* --attn: 0 dense, 1 sparse, 2 auto */
    double keep;     /* --keep (0: 0.2 with sparse, TOOLS_ATTN_AUTO_KEEP with auto) */
    int uniform;     /* --keep-uniform */
    double floor;    /* --keep-floor */
    uint32_t sinks;  /* --sinks (default 4) */
    uint32_t window; /* --window (default 16) */
    int group;       /* --select group */
    uint32_t rows;   /* --rows N: row blocks (infer_sparse_opts.row_block) */
    int inline_est;  /* --estimate inline */
};

#define TOOLS_ATTN_DEFAULTS                                                                  \
    {.sparse = 2, .keep = 0, .floor = 1.0, .sinks = 4, .window = 16, .inline_est = 1}
/* auto: sparse where it measured a win (docs/BENCHMARKS.md, issue 17, sixth
 * session): decode steps over at least this many keys, in models with at
 * least this many query columns (n_heads x head_dim: llama3-8b's shape at 8K
 * keys won, 1.13-1.19x attention alone; tinyllama's 2048 columns lost at 4K
 * and 8K, attention alone and end to end, and so did llama3-8b's at 4K), at
 * keep 0.45 (the smallest keep that met the accuracy targets on kjv6L-1k's
 * first 3 chunks with the estimate's 7-bit Q, eighth session: KL 0.00217,
 * top-1 97.24%, recall 0.9915; on the full eval, twelfth session, 0.4 meets
 * them at the edge, KL 0.00296, top-1 97.15%: 0.45 keeps a margin) */
#define TOOLS_ATTN_AUTO_MIN_KEYS 8192
/* The same where the dense kernel is the AVX-512 one: none (auto stays
 * dense). On the Xeon with AVX-512 and AMX, llama3-8b's decode at keep 0.45
 * was 0.60-0.65x dense at 8K keys and 0.99-1.06x at 16K (tenth session,
 * medians), and in the eleventh (docs/BENCHMARKS.md, "Eleventh session,
 * y17"; attention alone, 3 alternated rounds) 0.80-0.98x at 16K and
 * 0.93-1.02x at 32K, dense the faster by minimum in every round, and
 * 0.95-1.02x at 64K: at keep 0.45 the exact stage alone costs about what
 * dense decode does. */
#define TOOLS_ATTN_AUTO_MIN_KEYS_AVX512 UINT32_MAX
#define TOOLS_ATTN_AUTO_MIN_QDIM 4096

/* auto's decode threshold on this CPU (one of the two above). */
uint32_t tools_attn_auto_min_keys(void);
#define TOOLS_ATTN_AUTO_KEEP 0.45

/* The options' lines of a --help. */
#define TOOLS_ATTN_HELP                                                                      \
    "  --attn A         attention: dense, sparse (shadowAttn: int8 Q.K estimated on the\n"    \
    "                   emulated NPU, top-k keys per head and row on the CPU, exact\n"         \
    "                   softmax.V over them; docs/ARCHITECTURE.md) or auto (default:\n"       \
    "                   sparse for decode steps over 8192 keys or more (never on\n"      \
    "                   AVX-512 CPUs), in models of 4096 query columns or more, where\n"  \
    "                   it measured faster, at keep 0.45 unless --keep; else dense)\n"     \
    "  --keep R         sparse: the global share of keys kept, in (0, 1] (default 0.2,\n"     \
    "                   the paper's; on kjv6L-1k at a 1,024-token context the accuracy\n"      \
    "                   targets need 0.4 per head, 0.55 with --select group (full\n"          \
    "                   eval): docs/BENCHMARKS.md, issue 17); per head by\n"                  \
    "                   the container's profile (`sluice profile-attn`), uniform\n"            \
    "                   without one\n"                                                         \
    "  --keep-uniform   sparse: every head keeps R (ignore the profile's importances)\n"       \
    "  --keep-floor F   sparse: every head keeps at least F x R, the rest of the budget\n"    \
    "                   goes by the profile's eq. 3 (0..1; default 1: uniform,\n"    \
    "                   measured best on kjv6L-1k; 0: eq. 3 alone)\n"  \
    "  --sinks N        sparse: first slots always kept (default 4)\n"                         \
    "  --window N       sparse: most recent slots always kept (default 16)\n"                \
    "  --select S       sparse: head (default: a key list per query head and row) or\n"      \
    "                   group (one list per kv head and row, shared by its query heads\n"   \
    "                   (GQA): the top of max over the heads of the estimated log-\n"      \
    "                   probability (estimate less the row's log-sum-exp);\n"               \
    "                   keys and values gathered once for the heads; faster, less\n"        \
    "                   accurate at equal keep: docs/BENCHMARKS.md)\n"                  \
    "  --rows N         sparse, per head: blocks of N adjacent query rows share one\n"     \
    "                   key list (1..16; default 1: a list per row)\n"                      \
    "  --estimate E     sparse: where the int8 estimates run: inline (default: the\n"       \
    "                   graphs on the attention's own thread; measured faster on this\n"   \
    "                   2-core machine, attention alone and end to end:\n"                 \
    "                   docs/BENCHMARKS.md) or device (the emulated NPU's own thread,\n"    \
    "                   pipelined ahead of the CPU side; the same results)\n"

/* "dense", "sparse" or "auto", and the keep ratio sparse calls use. */
const char *tools_attn_name(const struct tools_attn *t);
double tools_attn_keep(const struct tools_attn *t);

/* If argv[a->i] is one of the options, takes it (and its value): returns 1,
 * or -1 on a bad value (printed); 0 when it is not one of them. */
int tools_attn_arg(struct tools_args *a, struct tools_attn *t);

/* The sparse attention t asks for, with r's profile when it has one (else
 * uniform ratios; *profiled says which). NULL *out when t is dense. */
int tools_attn_create(const struct tools_attn *t, const struct format_reader *r, int measure,
                      struct infer_sparse **out, int *profiled, struct sl_err *err);

#endif

/* tools_attn.c: see tools_attn.h. */
#include "tools_attn.h"

#include <errno.h>
#include <string.h>

#include "common.h"

const char *tools_attn_name(const struct tools_attn *t)
{
    return t->sparse == 1 ? "sparse" : t->sparse == 2 ? "auto" : "dense";
}

double tools_attn_keep(const struct tools_attn *t)
{
    return t->keep > 0 ? t->keep : t->sparse == 2 ? TOOLS_ATTN_AUTO_KEEP : 0.2;
}

uint32_t tools_attn_auto_min_keys(void)
{
    return sl_cpu_features()->avx512 ? TOOLS_ATTN_AUTO_MIN_KEYS_AVX512 : TOOLS_ATTN_AUTO_MIN_KEYS;
}

int tools_attn_arg(struct tools_args *a, struct tools_attn *t)
{
    const char *s = a->argv[a->i];
    if (!strcmp(s, "--attn")) {
        static const char *const names[] = {"dense", "sparse", "auto"};
        int v;
        if (tools_args_choice(a, names, 3, &v) < 0)
            return -1;
        t->sparse = v;
        return 1;
    }
    if (!strcmp(s, "--keep"))
        return tools_args_double(a, 0, 1, TOOLS_ARGS_ABOVE_MIN, &t->keep) < 0 ? -1 : 1;
    if (!strcmp(s, "--keep-uniform")) {
        t->uniform = 1;
        return 1;
    }
    if (!strcmp(s, "--keep-floor"))
        return tools_args_double(a, 0, 1, 0, &t->floor) < 0 ? -1 : 1;
    if (!strcmp(s, "--sinks"))
        return tools_args_u32(a, 0, UINT32_MAX - 1, &t->sinks) < 0 ? -1 : 1;
    if (!strcmp(s, "--select")) {
        static const char *const names[] = {"head", "group"};
        return tools_args_choice(a, names, 2, &t->group) < 0 ? -1 : 1;
    }
    if (!strcmp(s, "--rows"))
        return tools_args_u32(a, 1, 16, &t->rows) < 0 ? -1 : 1;
    if (!strcmp(s, "--estimate")) {
        static const char *const names[] = {"device", "inline"};
        return tools_args_choice(a, names, 2, &t->inline_est) < 0 ? -1 : 1;
    }
    if (!strcmp(s, "--window"))
        return tools_args_u32(a, 0, UINT32_MAX - 1, &t->window) < 0 ? -1 : 1;
    return 0;
}

int tools_attn_create(const struct tools_attn *t, const struct format_reader *r, int measure,
                      struct infer_sparse **out, int *profiled, struct sl_err *err)
{
    *out = NULL;
    *profiled = 0;
    const struct format_config *c = format_reader_config(r);
    if (!t->sparse || (t->sparse == 2 && (c->seq_len < tools_attn_auto_min_keys() ||
                                          c->n_heads * c->head_dim < TOOLS_ATTN_AUTO_MIN_QDIM)))
        return 0;
    struct infer_attn_profile *p = NULL;
    if (r) {
        int ret = infer_attn_profile_read(r, &p, err);
        if (ret < 0 && ret != -ENOENT)
            return ret;
        err->msg[0] = 0;
    }
    struct infer_sparse_opts o = {.keep = tools_attn_keep(t), .sinks = t->sinks, .window = t->window,
                                  .uniform = t->uniform, .floor_share = t->floor,
                                  .measure = measure, .select_group = t->group, .row_block = t->rows,
                                  .inline_npu = t->inline_est};
    if (t->sparse == 2) {
        o.min_keys = tools_attn_auto_min_keys();
        o.max_rows = 1;
    }
    int ret = infer_sparse_create(format_reader_config(r), p, &o, out, err);
    *profiled = p != NULL && !t->uniform && t->floor < 1;
    infer_attn_profile_destroy(p);
    return ret;
}

/* fs_tree.c: the mount's files, built once from the container index: the
 * generated config.json, tokenizer.bin and manifest.json, stats.json, one
 * directory per slice with its tensors, the whole slice, and the computed
 * int8/scales views. Inode numbers are table indices + 1, so they depend on
 * the container only. Directories list their children in creation order. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "fs_internal.h"

void fs_slice_dirname(const struct format_slice_info *si, char *buf, size_t n)
{
    if (si->kind == FORMAT_SLICE_LAYER)
        snprintf(buf, n, "layer.%03d", si->layer);
    else
        snprintf(buf, n, "%s", si->kind == FORMAT_SLICE_EMBED ? "embed" : "head");
}

static struct fs_node *add(struct fs_state *s, uint32_t parent, const char *name,
                           enum fs_kind kind)
{
    if (s->n_nodes == s->cap_nodes) {
        uint32_t cap = s->cap_nodes ? 2 * s->cap_nodes : 256;
        struct fs_node *n = realloc(s->nodes, sizeof *n * cap);
        if (!n)
            return NULL;
        s->nodes = n;
        s->cap_nodes = cap;
    }
    uint32_t idx = s->n_nodes++;
    struct fs_node *nd = &s->nodes[idx];
    memset(nd, 0, sizeof *nd);
    nd->ino = idx + 1;
    nd->parent = parent;
    snprintf(nd->name, sizeof nd->name, "%s", name);
    nd->kind = kind;
    nd->tensor = -1;
    atomic_init(&nd->bytes_served, 0);
    atomic_init(&nd->reads_served, 0);
    if (idx > 0) { /* link into the parent's children, in creation order */
        struct fs_node *p = &s->nodes[parent];
        p->n_children++;
        if (!p->first_child) {
            p->first_child = idx + 1;
        } else {
            uint32_t c = p->first_child;
            while (s->nodes[c - 1].next_sibling)
                c = s->nodes[c - 1].next_sibling;
            s->nodes[c - 1].next_sibling = idx + 1;
        }
    }
    return nd;
}

static int add_gen(struct fs_state *s, const char *name, char *data, size_t len)
{
    if (!data)
        return -ENOMEM;
    struct fs_node *n = add(s, 0, name, FS_GEN);
    if (!n) {
        free(data);
        return -ENOMEM;
    }
    n->data = data;
    n->size = len;
    return 0;
}

static char *print_json(cJSON *o, size_t *len)
{
    char *t = o ? cJSON_Print(o) : NULL;
    cJSON_Delete(o);
    if (!t)
        return NULL;
    size_t l = strlen(t);
    char *r = realloc(t, l + 2);
    if (!r) {
        free(t);
        return NULL;
    }
    r[l] = '\n';
    r[l + 1] = 0;
    *len = l + 1;
    return r;
}

int fs_config_json(const struct format_config *c, cJSON *o)
{
    /* names of enum format_arch and enum format_rope, by value */
    const char *arch = c->arch == FORMAT_ARCH_LLAMA ? "llama" : NULL;
    const char *rope = c->rope_layout == FORMAT_ROPE_INTERLEAVED ? "interleaved" : NULL;
    if (!arch || !rope)
        return -EINVAL;
    const struct {
        const char *key;
        double v;
    } nums[] = {
        {"dim", c->dim},
        {"hidden_dim", c->hidden_dim},
        {"n_layers", c->n_layers},
        {"n_heads", c->n_heads},
        {"n_kv_heads", c->n_kv_heads},
        {"head_dim", c->head_dim},
        {"vocab_size", c->vocab_size},
        {"seq_len", c->seq_len},
    };
    if (!cJSON_AddStringToObject(o, "architecture", arch))
        return -ENOMEM;
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++)
        if (!cJSON_AddNumberToObject(o, nums[i].key, nums[i].v))
            return -ENOMEM;
    if (!cJSON_AddBoolToObject(o, "tied_embedding", c->tied_embedding) ||
        !cJSON_AddStringToObject(o, "rope_layout", rope) ||
        !cJSON_AddNumberToObject(o, "rope_theta", c->rope_theta) ||
        !cJSON_AddNumberToObject(o, "norm_eps", c->norm_eps) ||
        !cJSON_AddNumberToObject(o, "bos_id", c->bos_id) ||
        !cJSON_AddNumberToObject(o, "eos_id", c->eos_id))
        return -ENOMEM;
    return 0;
}

static char *config_json(const struct format_config *c, size_t *len)
{
    cJSON *o = cJSON_CreateObject();
    if (o && fs_config_json(c, o) < 0) {
        cJSON_Delete(o);
        return NULL;
    }
    return print_json(o, len);
}

/* llama2.c tokenizer file: i32 max_token_length, then f32 score, i32 len, bytes. */
static char *tokenizer_bin(const struct format_tokenizer *t, size_t *len)
{
    size_t n = 4;
    for (uint32_t i = 0; i < t->n_tokens; i++)
        n += 8 + t->lens[i];
    uint8_t *b = malloc(n ? n : 1);
    if (!b)
        return NULL;
    sl_store_le32(b, t->max_token_len);
    uint8_t *p = b + 4;
    for (uint32_t i = 0; i < t->n_tokens; i++) {
        sl_store_lef32(p, t->scores[i]);
        sl_store_le32(p + 4, t->lens[i]);
        memcpy(p + 8, t->tokens[i], t->lens[i]);
        p += 8 + t->lens[i];
    }
    *len = n;
    return (char *)b;
}

static const char *tensor_file(const struct format_tensor_info *t)
{
    return format_role_name(t->role);
}

static char *manifest_json(struct fs_state *s, size_t *len)
{
    const struct format_reader *r = s->r;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "container", s->container);
    cJSON *ta = cJSON_AddArrayToObject(o, "tensors");
    for (uint32_t i = 0; i < format_reader_n_tensors(r); i++) {
        const struct format_tensor_info *t = format_reader_tensor(r, i);
        const struct format_slice_info *si = format_reader_slice(r, t->slice);
        char dir[32], path[128], sum[17];
        fs_slice_dirname(si, dir, sizeof dir);
        snprintf(path, sizeof path, "%s/%s.bin", dir, tensor_file(t));
        snprintf(sum, sizeof sum, "%016" PRIx64, t->checksum);
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "name", t->name);
        cJSON_AddNumberToObject(e, "layer", t->layer);
        cJSON_AddStringToObject(e, "role", format_role_name(t->role));
        cJSON *sh = cJSON_AddArrayToObject(e, "shape");
        for (uint32_t d = 0; d < t->n_dims; d++)
            cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t->shape[d]));
        cJSON_AddStringToObject(e, "encoding", format_encoding_traits(t->encoding)->name);
        cJSON_AddNumberToObject(e, "offset", (double)t->offset);
        cJSON_AddNumberToObject(e, "length", (double)t->length);
        cJSON_AddStringToObject(e, "checksum", sum);
        cJSON *h = cJSON_AddArrayToObject(e, "bits_hist");
        for (int b = 1; b <= FORMAT_MAX_BITS; b++)
            cJSON_AddItemToArray(h, cJSON_CreateNumber(t->bits_hist[b]));
        cJSON_AddStringToObject(e, "path", path);
        if (format_encoding_traits(t->encoding)->quantized) {
            snprintf(path, sizeof path, "%s/%s.int8", dir, tensor_file(t));
            cJSON_AddStringToObject(e, "int8_path", path);
            snprintf(path, sizeof path, "%s/%s.scales", dir, tensor_file(t));
            cJSON_AddStringToObject(e, "scales_path", path);
        }
        cJSON_AddItemToArray(ta, e);
    }
    cJSON *sa = cJSON_AddArrayToObject(o, "slices");
    for (uint32_t i = 0; i < format_reader_n_slices(r); i++) {
        const struct format_slice_info *si = format_reader_slice(r, i);
        char dir[32], path[64], sum[17];
        fs_slice_dirname(si, dir, sizeof dir);
        snprintf(path, sizeof path, "%s/slice.bin", dir);
        snprintf(sum, sizeof sum, "%016" PRIx64, si->checksum);
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "kind", si->kind == FORMAT_SLICE_LAYER   ? "layer"
                                           : si->kind == FORMAT_SLICE_EMBED ? "embed"
                                                                            : "head");
        cJSON_AddNumberToObject(e, "layer", si->layer);
        cJSON_AddNumberToObject(e, "offset", (double)si->offset);
        cJSON_AddNumberToObject(e, "length", (double)si->length);
        cJSON_AddStringToObject(e, "checksum", sum);
        cJSON_AddStringToObject(e, "path", path);
        cJSON_AddItemToArray(sa, e);
    }
    return print_json(o, len);
}

int fs_tree_build(struct fs_state *s, struct sl_err *err)
{
    const struct format_reader *r = s->r;
    size_t len;
    int ret;
    if (!add(s, 0, "", FS_DIR))
        goto nomem;
    char *d = config_json(format_reader_config(r), &len);
    if ((ret = add_gen(s, "config.json", d, len)) < 0)
        goto nomem;
    d = tokenizer_bin(format_reader_tokenizer(r), &len);
    if ((ret = add_gen(s, "tokenizer.bin", d, len)) < 0)
        goto nomem;
    d = manifest_json(s, &len);
    if ((ret = add_gen(s, "manifest.json", d, len)) < 0)
        goto nomem;
    struct fs_node *st = add(s, 0, "stats.json", FS_STATS);
    if (!st)
        goto nomem;
    uint32_t stats_idx = (uint32_t)(st->ino - 1); /* the table moves as it grows */
    if (s->gguf) {
        struct fs_node *gg = add(s, 0, "model.gguf", FS_GGUF);
        if (!gg)
            goto nomem;
        gg->size = gguf_view_size(s->gguf);
    }
    for (uint32_t i = 0; i < format_reader_n_slices(r); i++) {
        const struct format_slice_info *si = format_reader_slice(r, i);
        char dir[32];
        fs_slice_dirname(si, dir, sizeof dir);
        struct fs_node *dn = add(s, 0, dir, FS_DIR);
        if (!dn)
            goto nomem;
        uint32_t di = (uint32_t)(dn->ino - 1);
        for (uint32_t t = si->first_tensor; t < si->first_tensor + si->n_tensors; t++) {
            const struct format_tensor_info *ti = format_reader_tensor(r, t);
            char name[48];
            snprintf(name, sizeof name, "%s.bin", tensor_file(ti));
            struct fs_node *n = add(s, di, name, FS_RANGE);
            if (!n)
                goto nomem;
            n->off = ti->offset - si->offset;
            n->size = ti->length;
            n->slice = i;
            n->tensor = (int32_t)t;
            if (format_encoding_traits(ti->encoding)->quantized && ti->n_dims == 2) {
                snprintf(name, sizeof name, "%s.int8", tensor_file(ti));
                n = add(s, di, name, FS_INT8);
                if (!n)
                    goto nomem;
                n->size = ti->shape[0] * ti->shape[1];
                n->slice = i;
                n->tensor = (int32_t)t;
                snprintf(name, sizeof name, "%s.scales", tensor_file(ti));
                n = add(s, di, name, FS_SCALES);
                if (!n)
                    goto nomem;
                n->size = ti->shape[0] * 4;
                n->slice = i;
                n->tensor = (int32_t)t;
            }
        }
        struct fs_node *n = add(s, di, "slice.bin", FS_RANGE);
        if (!n)
            goto nomem;
        n->off = 0;
        n->size = si->length;
        n->slice = i;
    }
    s->nodes[stats_idx].size = fs_stats_size(s); /* sized by the whole tree */
    return 0;
nomem:
    sl_err_set(err, "out of memory building the file tree");
    return -ENOMEM;
}

void fs_tree_free(struct fs_state *s)
{
    for (uint32_t i = 0; i < s->n_nodes; i++)
        free(s->nodes[i].data);
    free(s->nodes);
    s->nodes = NULL;
    s->n_nodes = s->cap_nodes = 0;
}

struct fs_node *fs_tree_lookup(struct fs_state *s, uint32_t parent, const char *name)
{
    if (parent >= s->n_nodes || s->nodes[parent].kind != FS_DIR)
        return NULL;
    for (uint32_t c = s->nodes[parent].first_child; c; c = s->nodes[c - 1].next_sibling)
        if (!strcmp(s->nodes[c - 1].name, name))
            return &s->nodes[c - 1];
    return NULL;
}

/* import_safetensors_check.c: a safetensors checkpoint checked whole before
 * anything is imported: every header entry a tensor of this model with a
 * readable dtype and shape, the data sections tiled exactly, the index
 * naming only this model's tensors. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "import_safetensors_internal.h"

/* 1 when `name` is a tensor of an L-layer Llama model (qst_hf_name's names). */
static int st_known_name(const char *name, uint32_t L)
{
    static const char *const top[] = {"model.embed_tokens.weight", "model.norm.weight",
                                      "lm_head.weight"};
    for (size_t i = 0; i < sizeof top / sizeof top[0]; i++)
        if (!strcmp(name, top[i]))
            return 1;
    const char *p = name;
    if (strncmp(p, "model.layers.", 13))
        return 0;
    p += 13;
    if (*p < '0' || *p > '9' || (*p == '0' && p[1] >= '0' && p[1] <= '9'))
        return 0; /* a plain decimal, no sign, no leading zero */
    uint64_t layer = 0;
    while (*p >= '0' && *p <= '9' && layer < L)
        layer = layer * 10 + (uint64_t)(*p++ - '0');
    if (layer >= L || *p != '.')
        return 0;
    p++;
    for (uint32_t role = 0; role < FORMAT_ROLE_COUNT; role++) {
        char full[256];
        if (role == FORMAT_ROLE_TOK_EMBD || role == FORMAT_ROLE_OUT_NORM ||
            role == FORMAT_ROLE_CLASSIFIER)
            continue;
        qst_hf_name(0, role, full, sizeof full);
        if (!strcmp(p, full + 15)) /* after "model.layers.0." */
            return 1;
    }
    return 0;
}

struct st_range {
    const char *name;
    uint64_t a, b;
};

static int by_start(const void *x, const void *y)
{
    const struct st_range *p = x, *q = y;
    return p->a < q->a ? -1 : p->a > q->a ? 1 : (p->b > q->b) - (p->b < q->b);
}

/* Every entry of a shard's header: a tensor of this model (extra tensors are
 * refused, not dropped; when sharded, the one the index puts in this shard),
 * a dtype Sluice reads, a shape of non-negative
 * integers whose size times the dtype's is exactly its byte range; and the
 * ranges tile the data section exactly (no gap, no overlap, nothing past the
 * end or left over), as the safetensors format requires. A header length
 * that is off by even one byte shifts every range and fails here. */
static int st_check_shard(const struct st_shard *sh, uint32_t L, const cJSON *weight_map,
                          struct sl_err *err)
{
    int n = cJSON_GetArraySize(sh->header);
    struct st_range *rg = calloc((size_t)n + 1, sizeof *rg);
    if (!rg) {
        sl_err_set(err, "%s: out of memory", sh->path);
        return -ENOMEM;
    }
    int k = 0, ret = -EINVAL;
    cJSON *e;
    cJSON_ArrayForEach(e, sh->header)
    {
        const char *name = e->string;
        if (!strcmp(name, "__metadata__"))
            continue;
        if (!st_known_name(name, L)) {
            sl_err_set(err,
                       "%s: tensor '%s' is not part of a %u-layer Llama model (biases, "
                       "rotary_emb.inv_freq and other extras are not supported)",
                       sh->path, name, L);
            goto out;
        }
        if (cJSON_GetObjectItemCaseSensitive(sh->header, name) != e) {
            sl_err_set(err, "%s: tensor '%s' appears twice", sh->path, name);
            goto out;
        }
        if (weight_map) {
            const cJSON *f = cJSON_GetObjectItemCaseSensitive(weight_map, name);
            const char *base = strrchr(sh->path, '/');
            base = base ? base + 1 : sh->path;
            if (!cJSON_IsString(f) || strcmp(f->valuestring, base)) {
                sl_err_set(err,
                           "%s: tensor '%s' is here but model.safetensors.index.json puts it "
                           "in %s",
                           sh->path, name, cJSON_IsString(f) ? f->valuestring : "no shard");
                goto out;
            }
        }
        cJSON *dtype = cJSON_GetObjectItemCaseSensitive(e, "dtype");
        cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
        cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
        if (!cJSON_IsString(dtype) || !cJSON_IsArray(shape) || !cJSON_IsArray(offs) ||
            cJSON_GetArraySize(offs) != 2 || cJSON_GetArraySize(shape) > 8) {
            sl_err_set(err, "%s: tensor '%s' has a malformed header entry", sh->path, name);
            goto out;
        }
        const char *dt = dtype->valuestring;
        uint64_t esize = !strcmp(dt, "F32") ? 4 : !strcmp(dt, "F16") || !strcmp(dt, "BF16") ? 2 : 0;
        if (!esize) {
            sl_err_set(err, "%s: tensor '%s' has dtype %s; supported: F32, F16, BF16", sh->path,
                       name, dtype->valuestring);
            goto out;
        }
        uint64_t bytes = esize;
        cJSON *d;
        cJSON_ArrayForEach(d, shape)
        {
            /* range-checked before the conversion; the product overflow-checked */
            if (!cJSON_IsNumber(d) || !(d->valuedouble >= 0) || d->valuedouble >= 9.0e15 ||
                d->valuedouble != (double)(uint64_t)d->valuedouble) {
                sl_err_set(err, "%s: tensor '%s' has a shape that is not a list of sizes",
                           sh->path, name);
                goto out;
            }
            uint64_t v = (uint64_t)d->valuedouble;
            if (v && bytes > UINT64_MAX / v) {
                sl_err_set(err, "%s: tensor '%s' has an impossibly large shape", sh->path, name);
                goto out;
            }
            bytes *= v;
        }
        cJSON *oa = cJSON_GetArrayItem(offs, 0), *ob = cJSON_GetArrayItem(offs, 1);
        double a = cJSON_IsNumber(oa) ? oa->valuedouble : -1;
        double b = cJSON_IsNumber(ob) ? ob->valuedouble : -1;
        if (!(a >= 0) || !(b >= a) || b > 9.0e15 || a != (double)(uint64_t)a ||
            b != (double)(uint64_t)b) {
            sl_err_set(err, "%s: tensor '%s' has data_offsets that are not a range of bytes",
                       sh->path, name);
            goto out;
        }
        if ((uint64_t)b - (uint64_t)a != bytes) {
            sl_err_set(err,
                       "%s: tensor '%s' is %s of %" PRIu64 " bytes but its data_offsets "
                       "[%.0f, %.0f) hold %" PRIu64,
                       sh->path, name, dtype->valuestring, bytes, a, b, (uint64_t)b - (uint64_t)a);
            goto out;
        }
        rg[k++] = (struct st_range){name, (uint64_t)a, (uint64_t)b};
    }
    qsort(rg, (size_t)k, sizeof *rg, by_start);
    uint64_t end = 0;
    for (int i = 0; i < k; i++) {
        if (rg[i].a != end) {
            if (i == 0)
                sl_err_set(err,
                           "%s: the data section does not start with a tensor ('%s' starts at "
                           "byte %" PRIu64 "): a wrong header length?",
                           sh->path, rg[i].name, rg[i].a);
            else
                sl_err_set(err,
                           "%s: tensors '%s' and '%s' %s (bytes %" PRIu64 " and %" PRIu64
                           "): the tensors must tile the data section exactly",
                           sh->path, rg[i - 1].name, rg[i].name,
                           rg[i].a > end ? "leave a gap" : "overlap", end, rg[i].a);
            goto out;
        }
        end = rg[i].b;
    }
    if (end != sh->body_len) {
        sl_err_set(err,
                   "%s: the tensors end at byte %" PRIu64 " of a %" PRIu64 "-byte data "
                   "section: a wrong header length, or a truncated or extended file",
                   sh->path, end, sh->body_len);
        goto out;
    }
    ret = 0;
out:
    free(rg);
    return ret;
}

/* Checks every shard the model has, and (when sharded) that weight_map names
 * only tensors of this model. */
int qst_check_all(struct st *m, uint32_t L, struct sl_err *err)
{
    if (m->weight_map) {
        cJSON *f;
        cJSON_ArrayForEach(f, m->weight_map)
        {
            if (!st_known_name(f->string, L)) {
                sl_err_set(err,
                           "%s/model.safetensors.index.json: tensor '%s' is not part of a "
                           "%u-layer Llama model",
                           m->dir, f->string, L);
                return -EINVAL;
            }
            struct st_shard *sh;
            cJSON *e;
            int ret = qst_find(m, f->string, &sh, &e, err);
            if (ret == 1) {
                sl_err_set(err, "%s: tensor '%s' is in the index but not in its shard", sh->path,
                           f->string);
                return -EINVAL;
            }
            if (ret < 0)
                return ret;
        }
    }
    for (int i = 0; i < m->n_shards; i++) {
        int ret = st_check_shard(&m->shards[i], L, m->weight_map, err);
        if (ret < 0)
            return ret;
    }
    return 0;
}

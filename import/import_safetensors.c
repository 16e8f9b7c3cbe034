/* import_safetensors.c: Hugging Face Llama checkpoints: config.json
 * plus model.safetensors, or shards listed in model.safetensors.index.json.
 * A safetensors file is a u64 header length, a JSON header mapping tensor
 * names to {dtype, shape, data_offsets}, then the data. q_proj/k_proj rows
 * are in the rotate-half RoPE order of HF conversions and are permuted back
 * to the interleaved layout on import. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "import_safetensors_internal.h"

static char *read_text(const char *path, struct sl_err *err)
{
    const uint8_t *data;
    uint64_t size;
    if (qi_map_file(path, &data, &size, err) < 0)
        return NULL;
    if (size > (64u << 20)) {
        sl_err_set(err, "%s: %" PRIu64 " bytes is too large for a JSON file", path, size);
        qi_unmap(data, size);
        return NULL;
    }
    char *s = malloc(size + 1);
    if (s) {
        if (size)
            memcpy(s, data, size);
        s[size] = 0;
    } else {
        sl_err_set(err, "%s: out of memory", path);
    }
    qi_unmap(data, size);
    return s;
}

static cJSON *read_json(const char *path, struct sl_err *err)
{
    char *text = read_text(path, err);
    if (!text)
        return NULL;
    cJSON *j = cJSON_Parse(text);
    free(text);
    if (!j)
        sl_err_set(err, "%s: not valid JSON", path);
    return j;
}

static int open_shard(struct st *m, const char *file, struct st_shard **out, struct sl_err *err)
{
    char path[PATH_MAX];
    if (file[0] == '/')
        snprintf(path, sizeof path, "%s", file);
    else
        snprintf(path, sizeof path, "%s/%s", m->dir, file);
    for (int i = 0; i < m->n_shards; i++) {
        if (!strcmp(m->shards[i].path, path)) {
            *out = &m->shards[i];
            return 0;
        }
    }
    if (m->n_shards == ST_MAX_SHARDS) {
        sl_err_set(err, "%s: more than %d shards", m->dir, ST_MAX_SHARDS);
        return -EINVAL;
    }
    struct st_shard *sh = &m->shards[m->n_shards];
    memset(sh, 0, sizeof *sh);
    snprintf(sh->path, sizeof sh->path, "%s", path);
    int ret = qi_map_file(path, &sh->data, &sh->size, err);
    if (ret < 0)
        return ret;
    m->n_shards++;
    if (sh->size < 8) {
        sl_err_set(err, "%s: truncated safetensors file", path);
        return -EINVAL;
    }
    uint64_t hlen = sl_load_le64(sh->data);
    if (hlen > sh->size - 8 || hlen > (100u << 20)) {
        sl_err_set(err, "%s: header length %" PRIu64 " exceeds the file (%" PRIu64 " bytes)", path,
                   hlen, sh->size);
        return -EINVAL;
    }
    char *text = malloc(hlen + 1);
    if (!text) {
        sl_err_set(err, "%s: out of memory", path);
        return -ENOMEM;
    }
    memcpy(text, sh->data + 8, hlen);
    text[hlen] = 0;
    sh->header = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(sh->header)) {
        sl_err_set(err, "%s: the safetensors header is not a JSON object", path);
        return -EINVAL;
    }
    sh->body = sh->data + 8 + hlen;
    sh->body_len = sh->size - 8 - hlen;
    *out = sh;
    return 0;
}

void qst_hf_name(int layer, uint32_t role, char *buf, size_t n)
{
    static const char *const names[FORMAT_ROLE_COUNT] = {
        [FORMAT_ROLE_TOK_EMBD] = "model.embed_tokens.weight",
        [FORMAT_ROLE_ATTN_NORM] = "input_layernorm.weight",
        [FORMAT_ROLE_WQ] = "self_attn.q_proj.weight",
        [FORMAT_ROLE_WK] = "self_attn.k_proj.weight",
        [FORMAT_ROLE_WV] = "self_attn.v_proj.weight",
        [FORMAT_ROLE_WO] = "self_attn.o_proj.weight",
        [FORMAT_ROLE_FFN_NORM] = "post_attention_layernorm.weight",
        [FORMAT_ROLE_W_GATE] = "mlp.gate_proj.weight",
        [FORMAT_ROLE_W_UP] = "mlp.up_proj.weight",
        [FORMAT_ROLE_W_DOWN] = "mlp.down_proj.weight",
        [FORMAT_ROLE_OUT_NORM] = "model.norm.weight",
        [FORMAT_ROLE_CLASSIFIER] = "lm_head.weight",
    };
    if (layer >= 0)
        snprintf(buf, n, "model.layers.%d.%s", layer, names[role]);
    else
        snprintf(buf, n, "%s", names[role]);
}

/* Finds a tensor's header entry, opening its shard if needed: 0 found, 1
 * absent, or a negative errno (with a message) when its shard cannot be read. */
int qst_find(struct st *m, const char *name, struct st_shard **sh, cJSON **entry,
             struct sl_err *err)
{
    if (m->weight_map) {
        cJSON *f = cJSON_GetObjectItemCaseSensitive(m->weight_map, name);
        if (!cJSON_IsString(f))
            return 1;
        /* shards lie beside the index: a plain file name */
        if (!f->valuestring[0] || strchr(f->valuestring, '/') || !strcmp(f->valuestring, "..") ||
            !strcmp(f->valuestring, ".")) {
            sl_err_set(err, "%s/model.safetensors.index.json: shard '%s' of '%s' is not a file name",
                       m->dir, f->valuestring, name);
            return -EINVAL;
        }
        int ret = open_shard(m, f->valuestring, sh, err);
        if (ret < 0)
            return ret;
    } else {
        *sh = &m->shards[0];
    }
    *entry = cJSON_GetObjectItemCaseSensitive((*sh)->header, name);
    return *entry ? 0 : 1;
}

static int st_tensor(struct qi_source *s, int layer, uint32_t role, struct qi_tensor *t,
                     struct sl_err *err)
{
    struct st *m = s->priv;
    char name[256];
    qst_hf_name(layer, role, name, sizeof name);
    struct st_shard *sh;
    cJSON *e;
    int ret = qst_find(m, name, &sh, &e, err);
    if (ret == 1) {
        sl_err_set(err, "%s: tensor '%s' is missing", m->weight_map ? m->dir : sh->path, name);
        return -EINVAL;
    }
    if (ret < 0)
        return ret;
    cJSON *dtype = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
    cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dtype) || !cJSON_IsArray(shape) || !cJSON_IsArray(offs) ||
        cJSON_GetArraySize(offs) != 2) {
        sl_err_set(err, "%s: tensor '%s' has a malformed header entry", sh->path, name);
        return -EINVAL;
    }
    if (!strcmp(dtype->valuestring, "F32"))
        t->type = QI_F32;
    else if (!strcmp(dtype->valuestring, "F16"))
        t->type = QI_F16;
    else if (!strcmp(dtype->valuestring, "BF16"))
        t->type = QI_BF16;
    else {
        sl_err_set(err, "%s: tensor '%s' has dtype %s; supported: F32, F16, BF16", sh->path, name,
                   dtype->valuestring);
        return -EINVAL;
    }
    uint32_t nd;
    uint64_t want[2];
    if (format_role_shape(&s->cfg, role == FORMAT_ROLE_CLASSIFIER ? FORMAT_ROLE_TOK_EMBD : role,
                          &nd, want) < 0)
        return -EINVAL;
    int n = cJSON_GetArraySize(shape);
    uint64_t got[2] = {0, 0};
    for (int i = 0; i < n && i < 2; i++) {
        cJSON *d = cJSON_GetArrayItem(shape, i);
        /* range-checked before the conversion (an out-of-range double to integer is UB) */
        got[i] = cJSON_IsNumber(d) && d->valuedouble >= 0 && d->valuedouble < 9.0e15
                     ? (uint64_t)d->valuedouble
                     : UINT64_MAX;
    }
    if ((uint32_t)n != nd || got[0] != want[0] || (nd == 2 && got[1] != want[1])) {
        sl_err_set(err,
                   "%s: tensor '%s' has shape [%" PRIu64 ", %" PRIu64 "], config.json "
                   "implies [%" PRIu64 ", %" PRIu64 "]",
                   sh->path, name, got[0], got[1], want[0], nd == 2 ? want[1] : 0);
        return -EINVAL;
    }
    cJSON *oa = cJSON_GetArrayItem(offs, 0), *ob = cJSON_GetArrayItem(offs, 1);
    double a = cJSON_IsNumber(oa) ? oa->valuedouble : -1;
    double b = cJSON_IsNumber(ob) ? ob->valuedouble : -1;
    uint64_t rows = want[0], cols = nd == 2 ? want[1] : 1;
    uint64_t bytes = qi_type_bytes(t->type, rows * cols);
    /* doubles compared before any conversion; offsets are exact integers below 2^53 */
    if (!(a >= 0) || !(b >= a) || b > (double)sh->body_len || a != (double)(uint64_t)a ||
        b != (double)(uint64_t)b || (uint64_t)b > sh->body_len ||
        (uint64_t)b - (uint64_t)a != bytes) {
        sl_err_set(err,
                   "%s: tensor '%s' data [%.0f, %.0f) does not fit the file or its shape "
                   "(%" PRIu64 " bytes of data)",
                   sh->path, name, a, b, sh->body_len);
        return -EINVAL;
    }
    t->data = sh->body + (uint64_t)a;
    t->len = bytes;
    t->rows = rows;
    t->cols = cols;
    t->hf_rope_heads = role == FORMAT_ROLE_WQ   ? s->cfg.n_heads
                       : role == FORMAT_ROLE_WK ? s->cfg.n_kv_heads
                                                : 0;
    return 0;
}

static void st_destroy(struct qi_source *s)
{
    struct st *m = s->priv;
    for (int i = 0; i < m->n_shards; i++) {
        qi_unmap(m->shards[i].data, m->shards[i].size);
        cJSON_Delete(m->shards[i].header);
    }
    cJSON_Delete(m->index_json);
    import_vocab_free(&s->vocab);
    free(m);
}

static int cfg_u32(cJSON *cfg, const char *key, uint32_t *out, int required, const char *path,
                   struct sl_err *err)
{
    cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsArray(v) && cJSON_GetArraySize(v) > 0) /* eos_token_id: [a, b]: the first */
        v = cJSON_GetArrayItem(v, 0);
    if (!v || cJSON_IsNull(v)) {
        if (required) {
            sl_err_set(err, "%s: config.json lacks '%s'", path, key);
            return -EINVAL;
        }
        return 0;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 4294967295.0 ||
        v->valuedouble != (double)(uint32_t)v->valuedouble) {
        sl_err_set(err, "%s: config.json '%s' is not a non-negative integer", path, key);
        return -EINVAL;
    }
    *out = (uint32_t)v->valuedouble;
    return 0;
}

int qi_open_safetensors(const char *path, const struct import_opts *o, struct qi_source **out,
                        struct sl_err *err)
{
    struct st *m = qi_source_new(sizeof *m, path, "safetensors", st_tensor, st_destroy, err);
    if (!m)
        return -ENOMEM;
    struct qi_source *s = &m->src;
    int ret = -EINVAL;
    struct stat st;
    char single[PATH_MAX] = "";
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(m->dir, sizeof m->dir, "%s", path);
    } else {
        char tmp[PATH_MAX];
        snprintf(tmp, sizeof tmp, "%s", path);
        snprintf(m->dir, sizeof m->dir, "%s", dirname(tmp));
        snprintf(tmp, sizeof tmp, "%s", path);
        snprintf(single, sizeof single, "%s", basename(tmp)); /* opened beside config.json */
    }
    char cpath[PATH_MAX + 16];
    snprintf(cpath, sizeof cpath, "%s/config.json", m->dir);
    cJSON *cfg = read_json(cpath, err);
    if (!cfg)
        goto fail;
    cJSON *mt = cJSON_GetObjectItemCaseSensitive(cfg, "model_type");
    if (!cJSON_IsString(mt) || strcmp(mt->valuestring, "llama") != 0) {
        sl_err_set(err, "%s: model_type '%s' is not supported (only llama)", cpath,
                   cJSON_IsString(mt) ? mt->valuestring : "(missing)");
        cJSON_Delete(cfg);
        goto fail;
    }
    cJSON *archs = cJSON_GetObjectItemCaseSensitive(cfg, "architectures");
    if (archs && !cJSON_IsNull(archs)) {
        int causal = 0;
        cJSON *a;
        cJSON_ArrayForEach(a, archs) causal |=
            cJSON_IsString(a) && !strcmp(a->valuestring, "LlamaForCausalLM");
        if (!causal) {
            cJSON *a0 = cJSON_IsArray(archs) ? cJSON_GetArrayItem(archs, 0) : NULL;
            sl_err_set(err, "%s: architectures '%s' is not supported (only LlamaForCausalLM)",
                       cpath, cJSON_IsString(a0) ? a0->valuestring : "(not a list of names)");
            cJSON_Delete(cfg);
            goto fail;
        }
    }
    struct format_config *c = &s->cfg;
    *c = (struct format_config){.arch = FORMAT_ARCH_LLAMA,
                                .rope_layout = FORMAT_ROPE_INTERLEAVED,
                                .bos_id = 1,
                                .eos_id = 2,
                                .rope_theta = 10000.0f,
                                .norm_eps = 1e-5f,
                                .seq_len = 2048};
    if (cfg_u32(cfg, "hidden_size", &c->dim, 1, cpath, err) ||
        cfg_u32(cfg, "intermediate_size", &c->hidden_dim, 1, cpath, err) ||
        cfg_u32(cfg, "num_hidden_layers", &c->n_layers, 1, cpath, err) ||
        cfg_u32(cfg, "num_attention_heads", &c->n_heads, 1, cpath, err) ||
        cfg_u32(cfg, "vocab_size", &c->vocab_size, 1, cpath, err) ||
        cfg_u32(cfg, "max_position_embeddings", &c->seq_len, 0, cpath, err) ||
        cfg_u32(cfg, "bos_token_id", &c->bos_id, 0, cpath, err) ||
        cfg_u32(cfg, "eos_token_id", &c->eos_id, 0, cpath, err)) {
        cJSON_Delete(cfg);
        goto fail;
    }
    c->n_kv_heads = c->n_heads;
    if (cfg_u32(cfg, "num_key_value_heads", &c->n_kv_heads, 0, cpath, err)) {
        cJSON_Delete(cfg);
        goto fail;
    }
    c->head_dim = c->n_heads ? c->dim / c->n_heads : 0;
    uint32_t hd = c->head_dim;
    if (cfg_u32(cfg, "head_dim", &hd, 0, cpath, err)) {
        cJSON_Delete(cfg);
        goto fail;
    }
    if (hd != c->head_dim) {
        sl_err_set(err,
                   "%s: head_dim %u differs from hidden_size / num_attention_heads = %u "
                   "(not supported)",
                   cpath, hd, c->head_dim);
        cJSON_Delete(cfg);
        goto fail;
    }
    cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, "rope_theta");
    if (cJSON_IsNumber(v))
        c->rope_theta = (float)v->valuedouble;
    v = cJSON_GetObjectItemCaseSensitive(cfg, "rms_norm_eps");
    if (cJSON_IsNumber(v))
        c->norm_eps = (float)v->valuedouble;
    v = cJSON_GetObjectItemCaseSensitive(cfg, "rope_scaling");
    if (v && !cJSON_IsNull(v)) {
        sl_err_set(err, "%s: rope_scaling is not supported", cpath);
        cJSON_Delete(cfg);
        goto fail;
    }
    v = cJSON_GetObjectItemCaseSensitive(cfg, "hidden_act");
    if (cJSON_IsString(v) && strcmp(v->valuestring, "silu") != 0) {
        sl_err_set(err, "%s: hidden_act '%s' is not supported (only silu)", cpath, v->valuestring);
        cJSON_Delete(cfg);
        goto fail;
    }
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cfg, "attention_bias")) ||
        cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cfg, "mlp_bias"))) {
        sl_err_set(err, "%s: attention or MLP biases are not supported", cpath);
        cJSON_Delete(cfg);
        goto fail;
    }
    cJSON *tie = cJSON_GetObjectItemCaseSensitive(cfg, "tie_word_embeddings");
    int tie_flag = cJSON_IsBool(tie) ? cJSON_IsTrue(tie) : -1;
    cJSON_Delete(cfg);

    /* shards */
    char ipath[PATH_MAX + 40];
    snprintf(ipath, sizeof ipath, "%s/model.safetensors.index.json", m->dir);
    struct st_shard *sh;
    if (single[0]) {
        ret = open_shard(m, single, &sh, err);
    } else if (access(ipath, R_OK) == 0) {
        m->index_json = read_json(ipath, err);
        if (!m->index_json)
            goto fail;
        m->weight_map = cJSON_GetObjectItemCaseSensitive(m->index_json, "weight_map");
        if (!cJSON_IsObject(m->weight_map)) {
            sl_err_set(err, "%s: no weight_map object", ipath);
            goto fail;
        }
        ret = 0;
    } else {
        ret = open_shard(m, "model.safetensors", &sh, err);
    }
    if (ret < 0)
        goto fail;
    ret = -EINVAL;
    cJSON *e;
    int has_head = qst_find(m, "lm_head.weight", &sh, &e, err);
    if (has_head < 0) {
        ret = has_head;
        goto fail;
    }
    c->tied_embedding = has_head == 1;
    if (tie_flag == 0 && c->tied_embedding) {
        sl_err_set(err, "%s: tie_word_embeddings is false but there is no lm_head.weight", m->dir);
        goto fail;
    }
    ret = format_config_validate(c, cpath, err);
    if (ret < 0)
        goto fail;
    ret = qst_check_all(m, c->n_layers, err);
    if (ret < 0)
        goto fail;
    if (!o->tokenizer) {
        sl_err_set(err, "%s: a Hugging Face model needs a llama2.c tokenizer file (--tokenizer)",
                   path);
        ret = -EINVAL;
        goto fail;
    }
    ret = import_vocab_load_llama2c(o->tokenizer, c->vocab_size, &s->vocab, err);
    if (ret < 0)
        goto fail;
    *out = s;
    return 0;
fail:
    st_destroy(s);
    return ret;
}

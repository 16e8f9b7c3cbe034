/* gen_safetensors.c: the safetensors + config.json writer of the test
 * models (gen_models.h), from the safetensors README. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "gen_internal.h"

/* ---- safetensors --------------------------------------------------------------------------- */

static void hf_tensor_name(const struct gen_model *m, size_t i, char *buf, size_t n)
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
    if (m->layer[i] >= 0)
        snprintf(buf, n, "model.layers.%d.%s", m->layer[i], names[m->role[i]]);
    else
        snprintf(buf, n, "%s", names[m->role[i]]);
}

/* HF conversion of q/k (convert_llama_weights_to_hf.py's permute): HF row
 * h*hd + p*hd/2 + i holds interleaved row h*hd + 2i + p. */
static void to_rotate_half(const float *in, float *out, uint64_t rows, uint64_t cols,
                           uint32_t heads)
{
    uint64_t hd = rows / heads;
    for (uint64_t r = 0; r < rows; r++) {
        uint64_t h = r / hd, w = r % hd, p = w / (hd / 2), i = w % (hd / 2);
        memcpy(out + r * cols, in + (h * hd + 2 * i + p) * cols, sizeof(float) * cols);
    }
}

int gen_write_safetensors(const struct gen_model *m, const char *dir, const struct gen_st_opts *o)
{
    const struct format_config *c = &m->cfg;
    static const char *const dt[] = {[GEN_F32] = "F32", [GEN_F16] = "F16", [GEN_BF16] = "BF16"};
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char eos[32];
    snprintf(eos, sizeof eos, o->eos_list ? "[%u, 7]" : "%u", c->eos_id);
    char cfg[2048];
    int n =
        snprintf(cfg, sizeof cfg,
                 "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"model_type\": \"llama\",\n"
                 "  \"hidden_size\": %u,\n  \"intermediate_size\": %u,\n"
                 "  \"num_hidden_layers\": %u,\n  \"num_attention_heads\": %u,\n"
                 "  \"num_key_value_heads\": %u,\n  \"vocab_size\": %u,\n"
                 "  \"max_position_embeddings\": %u,\n  \"rms_norm_eps\": %.9g,\n"
                 "  \"rope_theta\": %.9g,\n  \"rope_scaling\": null,\n"
                 "  \"hidden_act\": \"silu\",\n  \"tie_word_embeddings\": %s,\n"
                 "  \"bos_token_id\": %u,\n  \"eos_token_id\": %s,\n"
                 "  \"torch_dtype\": \"float32\"\n}\n",
                 c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads, c->vocab_size,
                 c->seq_len, (double)c->norm_eps, (double)c->rope_theta,
                 c->tied_embedding ? "true" : "false", c->bos_id, eos);
    if (gen_write_file(path, cfg, (size_t)n))
        return -1;
    int shards = o->n_shards > 1 ? o->n_shards : 1;
    struct buf idx = {0};
    const char *head = "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {";
    bput(&idx, head, strlen(head));
    int first_idx = 1;
    for (int s = 0; s < shards; s++) {
        struct buf hdr = {0}, body = {0};
        bput(&hdr, "{\"__metadata__\": {\"format\": \"pt\"}", 33);
        char fname[128];
        if (shards == 1)
            snprintf(fname, sizeof fname, "model.safetensors");
        else
            snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", s + 1, shards);
        /* shard s holds tensors s, s + shards, ... in reverse order within the file */
        for (size_t k = m->n; k-- > 0;) {
            if ((int)(k % (size_t)shards) != s)
                continue;
            char name[128], ent[512];
            hf_tensor_name(m, k, name, sizeof name);
            uint64_t rows = m->rows[k], cols = m->cols[k], ne = rows * cols;
            float *src = m->data[k], *perm = NULL;
            if (m->role[k] == FORMAT_ROLE_WQ || m->role[k] == FORMAT_ROLE_WK) {
                perm = malloc(sizeof(float) * ne);
                if (!perm)
                    return -1;
                to_rotate_half(src, perm, rows, cols,
                               m->role[k] == FORMAT_ROLE_WQ ? c->n_heads : c->n_kv_heads);
                src = perm;
            }
            uint64_t a = body.len, bytes = gen_type_bytes(o->dtype, ne);
            uint8_t *d = bgrow(&body, bytes);
            if (d)
                gen_store(o->dtype, src, ne, d);
            free(perm);
            int len = cols == 1 ? snprintf(ent, sizeof ent,
                                           ", \"%s\": {\"dtype\": \"%s\", \"shape\": [%llu], "
                                           "\"data_offsets\": [%llu, %llu]}",
                                           name, dt[o->dtype], (unsigned long long)rows,
                                           (unsigned long long)a, (unsigned long long)(a + bytes))
                                : snprintf(ent, sizeof ent,
                                           ", \"%s\": {\"dtype\": \"%s\", \"shape\": [%llu, %llu], "
                                           "\"data_offsets\": [%llu, %llu]}",
                                           name, dt[o->dtype], (unsigned long long)rows,
                                           (unsigned long long)cols, (unsigned long long)a,
                                           (unsigned long long)(a + bytes));
            bput(&hdr, ent, (size_t)len);
            len = snprintf(ent, sizeof ent, "%s\"%s\": \"%s\"", first_idx ? "" : ", ", name, fname);
            bput(&idx, ent, (size_t)len);
            first_idx = 0;
        }
        bput(&hdr, "}", 1);
        while (hdr.len % 8 && !hdr.oom) /* the header is padded with spaces to 8 bytes */
            bput(&hdr, " ", 1);
        struct buf file = {0};
        bu64(&file, hdr.len);
        bput(&file, hdr.p, hdr.len);
        bput(&file, body.p, body.len);
        int bad = hdr.oom || body.oom;
        free(hdr.p);
        free(body.p);
        snprintf(path, sizeof path, "%s/%s", dir, fname);
        if (bflush(&file, path) || bad) {
            free(idx.p);
            return -1;
        }
    }
    bput(&idx, "}}\n", 3);
    if (shards == 1) {
        free(idx.p);
        return 0;
    }
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    return bflush(&idx, path);
}

/* sluice_inspect.c: `sluice inspect MODEL.sluice [--json]`: config, slices,
 * tensors with shapes, encodings, sizes and bits per weight. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format.h"
#include "fs.h"
#include "sluice.h"
#include "tools_util.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: sluice inspect MODEL.sluice [--json] [--no-verify]\n\n"
               "Validates a container (header, metadata and index checksums, bounds) and prints\n"
               "its config, slices and tensors: shape, encoding, bytes, bits per weight and, for\n"
               "adaptive tensors, the histogram of per-channel bit widths. --json prints one JSON\n"
               "object instead. Tensor data is verified too, with the checks run and mount make\n"
               "(checksums, then each tensor's encoding: packed headers, widths, q8 codes);\n"
               "--no-verify skips that.\n");
}

static const char *slice_kind_name(uint32_t k)
{
    return k == FORMAT_SLICE_EMBED ? "embed" : k == FORMAT_SLICE_LAYER ? "layer" : "head";
}

static double bits_per_weight(const struct format_tensor_info *t)
{
    uint64_t n = format_tensor_numel(t);
    return n ? (double)t->length * 8.0 / (double)n : 0;
}

/* Metadata values are bytes; print them when they are short printable text. */
static int printable(const char *v, size_t len)
{
    if (len > 200)
        return 0;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)v[i] < 0x20 || (unsigned char)v[i] > 0x7e)
            return 0;
    return 1;
}

static int verify_all(const struct format_reader *r, struct sl_err *err)
{
    uint64_t maxlen = 0;
    for (uint32_t i = 0; i < format_reader_n_slices(r); i++)
        if (format_reader_slice(r, i)->length > maxlen)
            maxlen = format_reader_slice(r, i)->length;
    void *buf = malloc(maxlen);
    if (!buf) {
        sl_err_set(err, "%s: out of memory", format_reader_path(r));
        return -ENOMEM;
    }
    int ret = 0;
    for (uint32_t i = 0; ret == 0 && i < format_reader_n_slices(r); i++)
        ret = format_reader_read_slice(r, i, buf, maxlen, err);
    free(buf);
    return ret;
}

int cmd_inspect(int argc, char **argv)
{
    const char *path = NULL;
    int json = 0, verify = 1;
    struct tools_args args = {"sluice inspect", usage, argc, argv, 0};
    for (args.i = 1; args.i < argc; args.i++) {
        const char *a = argv[args.i];
        if (tools_args_help(&args)) {
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--no-verify")) {
            verify = 0;
        } else if (tools_args_operand(&args, &path) < 0) {
            return 2;
        }
    }
    if (tools_args_need(&args, path, "MODEL.sluice") < 0)
        return 2;
    struct sl_err err = {{0}};
    struct format_reader *r;
    if (format_reader_open(path, &r, &err) < 0) {
        fprintf(stderr, "sluice inspect: %s\n", err.msg);
        return 1;
    }
    int status = 0;
    if (verify && verify_all(r, &err) < 0) {
        fprintf(stderr, "sluice inspect: %s\n", err.msg);
        status = 1;
    }
    const struct format_config *c = format_reader_config(r);
    uint32_t nt = format_reader_n_tensors(r), ns = format_reader_n_slices(r);
    uint64_t total_bytes = 0, total_weights = 0, lin_bytes = 0, lin_weights = 0;
    for (uint32_t i = 0; i < nt; i++) {
        const struct format_tensor_info *t = format_reader_tensor(r, i);
        total_bytes += t->length;
        total_weights += format_tensor_numel(t);
        if (format_role_is_linear(t->role) ||
            (t->role == FORMAT_ROLE_TOK_EMBD && c->tied_embedding)) {
            lin_bytes += t->length;
            lin_weights += format_tensor_numel(t);
        }
    }

    if (json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "path", path);
        cJSON_AddNumberToObject(o, "file_size", (double)format_reader_file_size(r));
        /* the mount's config.json, the same writer and keys */
        cJSON *co = cJSON_AddObjectToObject(o, "config");
        if (!co || fs_config_json(c, co) < 0) {
            fprintf(stderr, "sluice inspect: out of memory\n");
            cJSON_Delete(o);
            format_reader_close(r);
            return 1;
        }
        cJSON_AddBoolToObject(o, "checksums_ok", verify && status == 0);
        cJSON *meta = cJSON_AddObjectToObject(o, "metadata");
        for (uint32_t i = 0; i < format_reader_meta_count(r); i++) {
            const char *k = format_reader_meta_key(r, i);
            const void *v;
            size_t vl;
            format_reader_meta_get(r, k, &v, &vl);
            if (printable(v, vl)) {
                char *s = strndup(v, vl);
                cJSON_AddStringToObject(meta, k, s ? s : "");
                free(s);
            } else {
                char desc[64];
                snprintf(desc, sizeof desc, "<%zu bytes>", vl);
                cJSON_AddStringToObject(meta, k, desc);
            }
        }
        cJSON *sl = cJSON_AddArrayToObject(o, "slices");
        for (uint32_t i = 0; i < ns; i++) {
            const struct format_slice_info *s = format_reader_slice(r, i);
            cJSON *e = cJSON_CreateObject();
            char sum[17];
            snprintf(sum, sizeof sum, "%016" PRIx64, s->checksum);
            cJSON_AddStringToObject(e, "kind", slice_kind_name(s->kind));
            cJSON_AddNumberToObject(e, "layer", s->layer);
            cJSON_AddNumberToObject(e, "offset", (double)s->offset);
            cJSON_AddNumberToObject(e, "length", (double)s->length);
            cJSON_AddStringToObject(e, "checksum", sum);
            cJSON_AddItemToArray(sl, e);
        }
        cJSON *ta = cJSON_AddArrayToObject(o, "tensors");
        for (uint32_t i = 0; i < nt; i++) {
            const struct format_tensor_info *t = format_reader_tensor(r, i);
            cJSON *e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "name", t->name);
            cJSON_AddNumberToObject(e, "layer", t->layer);
            cJSON_AddStringToObject(e, "role", format_role_name(t->role));
            cJSON *shape = cJSON_AddArrayToObject(e, "shape");
            for (uint32_t d = 0; d < t->n_dims; d++)
                cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[d]));
            cJSON_AddStringToObject(e, "encoding", format_encoding_traits(t->encoding)->name);
            cJSON_AddNumberToObject(e, "offset", (double)t->offset);
            cJSON_AddNumberToObject(e, "length", (double)t->length);
            cJSON_AddNumberToObject(e, "bits_per_weight", bits_per_weight(t));
            if (t->act_scale != 0)
                cJSON_AddNumberToObject(e, "act_scale", t->act_scale);
            cJSON *h = cJSON_AddArrayToObject(e, "bits_hist");
            for (int b = 1; b <= FORMAT_MAX_BITS; b++)
                cJSON_AddItemToArray(h, cJSON_CreateNumber(t->bits_hist[b]));
            cJSON_AddItemToArray(ta, e);
        }
        cJSON *tot = cJSON_AddObjectToObject(o, "totals");
        cJSON_AddNumberToObject(tot, "tensor_bytes", (double)total_bytes);
        cJSON_AddNumberToObject(tot, "weights", (double)total_weights);
        cJSON_AddNumberToObject(tot, "bits_per_weight",
                                total_weights ? total_bytes * 8.0 / total_weights : 0);
        cJSON_AddNumberToObject(tot, "linear_bits_per_weight",
                                lin_weights ? lin_bytes * 8.0 / lin_weights : 0);
        char *s = cJSON_Print(o);
        printf("%s\n", s);
        free(s);
        cJSON_Delete(o);
    } else {
        printf("%s: sluice container v%u, %" PRIu64 " bytes%s\n", path, format_reader_version(r),
               format_reader_file_size(r),
               verify ? (status == 0 ? ", all checksums and tensors verified" : ", DATA ERRORS")
                      : "");
        printf("config: llama dim=%u hidden=%u layers=%u heads=%u kv_heads=%u head_dim=%u "
               "vocab=%u seq_len=%u rope_theta=%g norm_eps=%g %s bos=%u eos=%u\n",
               c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads, c->head_dim,
               c->vocab_size, c->seq_len, (double)c->rope_theta, (double)c->norm_eps,
               c->tied_embedding ? "tied" : "untied", c->bos_id, c->eos_id);
        for (uint32_t i = 0; i < format_reader_meta_count(r); i++) {
            const char *k = format_reader_meta_key(r, i);
            const void *v;
            size_t vl;
            format_reader_meta_get(r, k, &v, &vl);
            if (printable(v, vl))
                printf("meta: %s = %.*s\n", k, (int)vl, (const char *)v);
            else
                printf("meta: %s = <%zu bytes>\n", k, vl);
        }
        printf("\n%-5s %-6s %12s %12s\n", "slice", "kind", "offset", "bytes");
        for (uint32_t i = 0; i < ns; i++) {
            const struct format_slice_info *s = format_reader_slice(r, i);
            char kind[16];
            snprintf(kind, sizeof kind, "%s", slice_kind_name(s->kind));
            if (s->kind == FORMAT_SLICE_LAYER)
                snprintf(kind, sizeof kind, "L%d", s->layer);
            printf("%-5u %-6s %12" PRIu64 " %12" PRIu64 "\n", i, kind, s->offset, s->length);
        }
        printf("\n%-28s %-10s %-14s %-9s %12s %6s  %s\n", "tensor", "role", "shape", "encoding",
               "bytes", "bpw", "channels per width 1..8");
        for (uint32_t i = 0; i < nt; i++) {
            const struct format_tensor_info *t = format_reader_tensor(r, i);
            char shape[32];
            if (t->n_dims == 2)
                snprintf(shape, sizeof shape, "%" PRIu64 "x%" PRIu64, t->shape[0], t->shape[1]);
            else
                snprintf(shape, sizeof shape, "%" PRIu64, t->shape[0]);
            printf("%-28s %-10s %-14s %-9s %12" PRIu64 " %6.2f", t->name,
                   format_role_name(t->role), shape, format_encoding_traits(t->encoding)->name,
                   t->length, bits_per_weight(t));
            int any = 0;
            for (int b = 1; b <= FORMAT_MAX_BITS; b++)
                any |= t->bits_hist[b] != 0;
            if (any) {
                printf(" ");
                for (int b = 1; b <= FORMAT_MAX_BITS; b++)
                    printf(" %u", t->bits_hist[b]);
            }
            printf("\n");
        }
        printf("\ntotal: %" PRIu64 " weights in %" PRIu64 " bytes, %.3f bits per weight; linear "
               "weights %.3f bits per weight\n",
               total_weights, total_bytes, total_weights ? total_bytes * 8.0 / total_weights : 0,
               lin_weights ? lin_bytes * 8.0 / lin_weights : 0);
    }
    format_reader_close(r);
    return status;
}

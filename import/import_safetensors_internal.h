/* import_safetensors_internal.h: the open checkpoint (struct st) as
 * import_safetensors.c reads it and import_safetensors_check.c checks it. */
#ifndef SLUICE_IMPORT_SAFETENSORS_INTERNAL_H
#define SLUICE_IMPORT_SAFETENSORS_INTERNAL_H

#include <cjson/cJSON.h>
#include <limits.h>
#include <stdint.h>

#include "import_internal.h"

#define ST_MAX_SHARDS 256

struct st_shard {
    char path[PATH_MAX];
    const uint8_t *data;
    uint64_t size;
    const uint8_t *body; /* after the header */
    uint64_t body_len;
    cJSON *header;
};

struct st {
    struct qi_source src;
    char dir[PATH_MAX];
    struct st_shard shards[ST_MAX_SHARDS];
    int n_shards;
    cJSON *weight_map; /* name -> shard file, when sharded */
    cJSON *index_json;
};

/* The Hugging Face name of (layer, role); layer -1: the model-level tensors. */
void qst_hf_name(int layer, uint32_t role, char *buf, size_t n);
/* Finds a tensor's header entry, opening its shard if needed: 0 found, 1
 * absent, or a negative errno (with a message) when its shard cannot be read. */
int qst_find(struct st *m, const char *name, struct st_shard **sh, cJSON **entry,
             struct sl_err *err);
/* Checks every shard the model has, and (when sharded) that weight_map names
 * only tensors of this model. */
int qst_check_all(struct st *m, uint32_t L, struct sl_err *err);

#endif

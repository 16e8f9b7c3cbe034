/* serve_model.h: MODEL for `sluice serve` and `sluice chat`: a .sluice
 * container, or a directory where `sluice mount` serves one (its
 * manifest.json names the container, which is then read directly). */
#ifndef SLUICE_SERVE_MODEL_H
#define SLUICE_SERVE_MODEL_H

#include <stddef.h>

#include "common.h"

/* path[0..path_len) receives the container's path, id[0..id_len) the model
 * id (the file name without .sluice). Returns 0 or -errno with err filled. */
int serve_model_resolve(const char *model, char *path, size_t path_len, char *id, size_t id_len,
                        struct sl_err *err);

#endif

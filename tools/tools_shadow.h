/* tools_shadow.h: shadow outlier execution in the commands: switching it on
 * or off for a loaded model, and its statistics in their reports. */
#ifndef SLUICE_TOOLS_SHADOW_H
#define SLUICE_TOOLS_SHADOW_H

#include <cjson/cJSON.h>
#include <stdio.h>

#include "infer.h"

/* mode -1 (auto): on where the container has shadow metadata; 1: on, an
 * error without; 0: off (the container's bulk scales then clip). */
int tools_shadow_setup(struct infer_model *m, int mode, struct sl_err *err);
/* "auto", "on" or "off" into *mode; -1 for anything else. */
int tools_shadow_parse(const char *s, int *mode);
/* The model's shadow statistics as JSON members (shadow: false when off),
 * or as text lines on f. */
void tools_shadow_json(const struct infer_model *m, cJSON *o);
/* The same statistics taken at one moment (e.g. after the prefill, before
 * decoding adds to them), for tools_shadow_snap_json later. */
struct tools_shadow_snap {
    int on;
    struct infer_shadow_stats st;
    uint32_t linears, enabled;
    size_t bytes;
};
void tools_shadow_snap(const struct infer_model *m, struct tools_shadow_snap *s);
void tools_shadow_snap_json(const struct tools_shadow_snap *s, cJSON *o);
void tools_shadow_print(const struct infer_model *m, FILE *f);

#endif

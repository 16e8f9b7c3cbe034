/* tools_util.h: small helpers shared by the subcommands: number parsing and a
 * progress line on stderr (shown only on a terminal or when long). */
#ifndef SLUICE_TOOLS_UTIL_H
#define SLUICE_TOOLS_UTIL_H

#include <stdint.h>

int tools_parse_u32(const char *s, uint32_t *out);   /* 0 ok, -1 bad */
int tools_parse_u64(const char *s, uint64_t *out);
int tools_parse_double(const char *s, double *out);

struct tools_progress {
    const char *what;
    uint64_t start_ns;
    uint64_t last_ns;
    int shown;
};

void tools_progress_init(struct tools_progress *p, const char *what);
/* import_progress_fn- and quantizer_progress_fn-compatible callback; ctx is a
 * struct tools_progress. */
void tools_progress_cb(void *ctx, const char *item, uint64_t done, uint64_t total);
void tools_progress_end(struct tools_progress *p);

#endif

/* tools_util.c: see tools_util.h. */
#include "tools_util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "common.h"

int tools_parse_u64(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    if (!s || !*s || *s == '-')
        return -1;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || *end)
        return -1;
    *out = v;
    return 0;
}

int tools_parse_u32(const char *s, uint32_t *out)
{
    uint64_t v;
    if (tools_parse_u64(s, &v) || v > UINT32_MAX)
        return -1;
    *out = (uint32_t)v;
    return 0;
}

int tools_parse_double(const char *s, double *out)
{
    char *end;
    errno = 0;
    if (!s || !*s)
        return -1;
    double v = strtod(s, &end);
    if (errno || *end)
        return -1;
    *out = v;
    return 0;
}

void tools_progress_init(struct tools_progress *p, const char *what)
{
    p->what = what;
    p->start_ns = p->last_ns = sl_now_ns();
    p->shown = 0;
}

void tools_progress_cb(void *ctx, const char *item, uint64_t done, uint64_t total)
{
    struct tools_progress *p = ctx;
    uint64_t now = sl_now_ns();
    /* at most 4 updates a second, and only once the work has run for 1 s */
    if (now - p->start_ns < 1000000000ull)
        return;
    if (now - p->last_ns < 250000000ull && done < total)
        return;
    p->last_ns = now;
    double pct = total ? 100.0 * (double)done / (double)total : 100.0;
    fprintf(stderr, "\r%s: %5.1f%% %-40.40s", p->what, pct, item ? item : "");
    p->shown = 1;
}

void tools_progress_end(struct tools_progress *p)
{
    if (p->shown)
        fprintf(stderr, "\n");
    p->shown = 0;
}

/* tools_util.c: see tools_util.h. */
#include "tools_util.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"

int tools_parse_u64(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    /* strtoull skips blanks and negates a '-' after them: " -1" would be 2^64-1 */
    if (!s || *s < '0' || *s > '9')
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

int tools_args_value(struct tools_args *a, const char **out)
{
    if (a->i + 1 >= a->argc) {
        fprintf(stderr, "%s: %s needs a value\n", a->cmd, a->argv[a->i]);
        return -1;
    }
    *out = a->argv[++a->i];
    return 0;
}

int tools_args_u64(struct tools_args *a, uint64_t min, uint64_t max, uint64_t *out)
{
    const char *s;
    uint64_t v;
    if (tools_args_value(a, &s) < 0)
        return -1;
    if (tools_parse_u64(s, &v) || v < min || v > max) {
        fprintf(stderr, "%s: %s wants a whole number in %llu..%llu, not '%s'\n", a->cmd,
                a->argv[a->i - 1], (unsigned long long)min, (unsigned long long)max, s);
        return -1;
    }
    *out = v;
    return 0;
}

int tools_args_u32(struct tools_args *a, uint32_t min, uint32_t max, uint32_t *out)
{
    uint64_t v;
    if (tools_args_u64(a, min, max, &v) < 0)
        return -1;
    *out = (uint32_t)v;
    return 0;
}

int tools_args_double(struct tools_args *a, double min, double max, int flags, double *out)
{
    const char *s;
    double v;
    if (tools_args_value(a, &s) < 0)
        return -1;
    int min_in = !(flags & TOOLS_ARGS_ABOVE_MIN), max_in = !(flags & TOOLS_ARGS_BELOW_MAX);
    if (tools_parse_double(s, &v) || !isfinite(v) || v < min || v > max || (!min_in && v == min) ||
        (!max_in && v == max)) {
        if (isinf(max))
            fprintf(stderr, "%s: %s wants a finite number %s %g, not '%s'\n", a->cmd,
                    a->argv[a->i - 1], min_in ? ">=" : ">", min, s);
        else
            fprintf(stderr, "%s: %s wants a number in %c%g, %g%c, not '%s'\n", a->cmd,
                    a->argv[a->i - 1], min_in ? '[' : '(', min, max, max_in ? ']' : ')', s);
        return -1;
    }
    *out = v;
    return 0;
}

int tools_args_choice(struct tools_args *a, const char *const *names, int n, int *out)
{
    const char *s;
    if (tools_args_value(a, &s) < 0)
        return -1;
    for (int k = 0; k < n; k++)
        if (!strcmp(s, names[k])) {
            *out = k;
            return 0;
        }
    fprintf(stderr, "%s: %s wants one of ", a->cmd, a->argv[a->i - 1]);
    for (int k = 0; k < n; k++)
        fprintf(stderr, "%s%s", names[k], k + 2 < n ? ", " : k + 1 < n ? " or " : "");
    fprintf(stderr, ", not '%s'\n", s);
    return -1;
}

int tools_args_unexpected(const struct tools_args *a)
{
    const char *s = a->argv[a->i];
    if (s[0] == '-' && s[1])
        fprintf(stderr, "%s: unknown option '%s'\n", a->cmd, s);
    else
        fprintf(stderr, "%s: unexpected argument '%s'\n", a->cmd, s);
    if (a->usage) {
        fprintf(stderr, "\n");
        a->usage(stderr);
    }
    return -1;
}

int tools_args_help(const struct tools_args *a)
{
    const char *s = a->argv[a->i];
    if (strcmp(s, "-h") && strcmp(s, "--help"))
        return 0;
    if (a->usage)
        a->usage(stdout);
    return 1;
}

int tools_args_operand(const struct tools_args *a, const char **slot)
{
    const char *s = a->argv[a->i];
    if (s[0] == '-' || *slot)
        return tools_args_unexpected(a);
    *slot = s;
    return 0;
}

int tools_args_need(const struct tools_args *a, const char *operand, const char *what)
{
    if (operand)
        return 0;
    fprintf(stderr, "%s: no %s given\n\n", a->cmd, what);
    if (a->usage)
        a->usage(stderr);
    return -1;
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

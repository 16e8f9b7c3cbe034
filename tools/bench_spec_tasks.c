/* bench_spec_tasks.c: `sluice bench spec`'s task set: prompts made from a
 * text of one verse a line (a passage, then words to restart, extract or
 * continue from; or free generation), and how verbatim an output is. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "bench_spec.h"

const char *const bench_spec_kinds[BENCH_SPEC_KINDS] = {"restart", "middle", "continue", "free"};

/* The share of out[0..n)'s tokens that end a BENCH_SPEC_COPY_GRAM-gram (over the
 * prompt's tail and the output) found in the prompt. */
double bench_spec_copy_share(const int *prompt, uint32_t np, const int *out, uint32_t n)
{
    uint32_t copied = 0;
    for (uint32_t i = 0; i < n; i++) {
        int g[BENCH_SPEC_COPY_GRAM];
        int ok = 1;
        for (int j = 0; j < BENCH_SPEC_COPY_GRAM && ok; j++) { /* the gram ending at out[i] */
            int64_t at = (int64_t)i - (BENCH_SPEC_COPY_GRAM - 1) + j;
            if (at >= 0)
                g[j] = out[at];
            else if ((int64_t)np + at >= 0)
                g[j] = prompt[np + at];
            else
                ok = 0;
        }
        for (uint32_t e = BENCH_SPEC_COPY_GRAM - 1; ok && e < np; e++)
            if (!memcmp(prompt + e - (BENCH_SPEC_COPY_GRAM - 1), g, sizeof g)) {
                copied++;
                break;
            }
    }
    return n ? (double)copied / n : 0;
}

char **bench_spec_read_lines(const char *path, uint32_t *n, int *err)
{
    size_t len;
    *n = 0;
    *err = 0;
    FILE *f = fopen(path, "rb");
    if (!f) {
        *err = -errno;
        return NULL;
    }
    char **v = NULL, *line = NULL;
    size_t cap = 0;
    ssize_t r;
    while ((r = getline(&line, &cap, f)) > 0) {
        len = (size_t)r;
        while (len && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = 0;
        if (!len)
            continue;
        char **nv = realloc(v, sizeof *v * (*n + 1));
        char *dup = nv ? strdup(line) : NULL;
        if (!dup) {
            *err = -ENOMEM;
            if (nv)
                v = nv;
            break;
        }
        v = nv;
        v[(*n)++] = dup;
    }
    if (!*err && ferror(f))
        *err = -EIO;
    free(line);
    fclose(f);
    if (*err) {
        bench_spec_free_lines(v, *n);
        *n = 0;
        return NULL;
    }
    return v;
}

void bench_spec_free_lines(char **lines, uint32_t n)
{
    for (uint32_t i = 0; lines && i < n; i++)
        free(lines[i]);
    free(lines);
}

/* The first `words` words of s. */
static void opening(char *out, size_t cap, const char *s, int words)
{
    size_t i = 0;
    int w = 0;
    while (s[i] && i + 1 < cap) {
        if (s[i] == ' ' && ++w == words)
            break;
        i++;
    }
    memcpy(out, s, i);
    out[i] = 0;
}

int bench_spec_make_tasks(char **lines, uint32_t n, struct bench_spec_task *t, uint32_t *nt)
{
    *nt = 0;
    if (n < (BENCH_SPEC_TASKS_PER_KIND + 1) * (BENCH_SPEC_PASSAGE_VERSES + 2))
        return -EINVAL;
    for (int k = 0; k < BENCH_SPEC_TASKS_PER_KIND; k++) {
        uint32_t a = (uint32_t)k * (n / (BENCH_SPEC_TASKS_PER_KIND + 1));
        size_t cap = 16;
        for (uint32_t i = 0; i < BENCH_SPEC_PASSAGE_VERSES; i++)
            cap += strlen(lines[a + i]) + 1;
        for (int kind = 0; kind < BENCH_SPEC_KINDS; kind++) {
            char *p = malloc(cap + 256);
            if (!p)
                return -ENOMEM;
            p[0] = 0;
            char open[256];
            if (kind < 3) {
                for (uint32_t i = 0; i < BENCH_SPEC_PASSAGE_VERSES; i++) {
                    strcat(p, lines[a + i]);
                    strcat(p, " ");
                }
                opening(open, sizeof open,
                        lines[a + (kind == 0   ? 0
                                   : kind == 1 ? 4
                                               : BENCH_SPEC_PASSAGE_VERSES)],
                        6);
            } else {
                opening(open, sizeof open, lines[a + BENCH_SPEC_PASSAGE_VERSES + 1], 6);
            }
            strcat(p, open);
            t[*nt] = (struct bench_spec_task){bench_spec_kinds[kind], kind, k, p};
            (*nt)++;
        }
    }
    return 0;
}

const char *const bench_spec_hist_names[4] = {"none", "kind", "shared", "shared_all"};

static int hist_takes(const struct bench_spec_task *t, uint32_t ti, uint32_t j,
                      enum bench_spec_hist mode)
{
    switch (mode) {
    case BENCH_SPEC_HIST_KIND:
        return t[j].k == t[ti].k;
    case BENCH_SPEC_HIST_SHARED:
        return t[j].passage != t[ti].passage;
    case BENCH_SPEC_HIST_SHARED_ALL:
        return 1;
    default:
        return 0;
    }
}

int bench_spec_history(const struct bench_spec_task *t, int *const *outs, const uint32_t *n_outs,
                       uint32_t ti, enum bench_spec_hist mode, int **h, uint32_t *nh)
{
    size_t len = 0;
    *h = NULL;
    *nh = 0;
    for (uint32_t j = 0; j < ti; j++)
        if (hist_takes(t, ti, j, mode) && n_outs[j])
            len += (size_t)n_outs[j] + 1;
    if (len == 0)
        return 0;
    if (len > UINT32_MAX || !(*h = malloc(sizeof(int) * len)))
        return -ENOMEM;
    for (uint32_t j = 0; j < ti; j++) {
        if (!hist_takes(t, ti, j, mode) || !n_outs[j])
            continue;
        memcpy(*h + *nh, outs[j], sizeof(int) * n_outs[j]);
        *nh += n_outs[j];
        (*h)[(*nh)++] = -1;
    }
    return 0;
}

/* tools_child.h: one child process of a benchmark, the way every contender
 * of `sluice bench coldstart` and `sluice bench load` is run: optionally drop
 * the page cache, fork, move the child into a read-limited cgroup before it
 * runs a single instruction of the contender, exec a program or call a
 * function, capture its standard output through a pipe, reap it, time it.
 *
 *   const char *argv[] = {"sluice", "run", model, "--json", NULL};
 *   struct tools_child_opts o = {.path = "/proc/self/exe", .argv = argv, .cg = &cg,
 *                                .drop_caches = 1, .capture = 1, .null_stderr = 1};
 *   struct tools_child_result r;
 *   if (tools_child_run(&o, &r, &err) < 0)      // could not run it: err says why
 *       ...
 *   else if (r.exit_code != 0)                   // it ran and failed
 *       ...
 *   parse(r.out);
 *   tools_child_result_fini(&r);
 *
 * The parent does the fallible setup (cgroup files, pipes, fork) and checks
 * every step; the child only redirects descriptors and execs or calls, and
 * reports a failure of those through a close-on-exec pipe. Not thread-safe
 * with respect to other threads forking or writing stdout; call from the
 * benchmark's main thread. */
#ifndef SLUICE_TOOLS_CHILD_H
#define SLUICE_TOOLS_CHILD_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "tools_cold.h"

struct tools_child_opts {
    /* what the child runs: exec path with argv (NULL-terminated), or, when
     * path is NULL, fn(arg) whose return value is the exit status. fn runs
     * in the forked copy of this process; what it writes to standard output
     * must go through write(2) (or be flushed), since the child ends with
     * _exit() */
    const char *path;
    const char *const *argv;
    int (*fn)(void *arg);
    void *arg;
    const struct tools_cgroup *cg; /* joined before the child runs; NULL: none */
    int drop_caches;               /* 1: drop the page cache first */
    int capture;                   /* 1: standard output into tools_child_result.out */
    int null_stdout;               /* 1: standard output to /dev/null (not with capture) */
    int null_stderr;               /* 1: standard error to /dev/null */
};

struct tools_child_result {
    int exit_code;      /* 0..255, or -1 when killed by a signal */
    int term_signal;    /* the signal that killed it, else 0 */
    uint64_t wall_ns;   /* from the child's release to its reaping */
    double peak_rss_mb; /* the child's peak resident set (MiB) */
    char *out;          /* captured stdout, NUL-terminated (also with capture 0: "") */
    size_t out_len;     /* bytes in out, not counting the NUL */
};

/* Runs the child to its end. Returns 0 when it ran and was reaped, whatever
 * its exit status (in *r; the caller decides what a non-zero one means), or
 * a negative errno with a sentence in err when it could not be run: dropping
 * the page cache, a pipe, fork, the cgroup join, redirecting its output, the
 * exec (e.g. -ENOENT), reading its output or waiting for it failed; *r is
 * then empty (out NULL). A child already started is killed and reaped before
 * an error returns. The caller owns r->out: tools_child_result_fini. */
int tools_child_run(const struct tools_child_opts *o, struct tools_child_result *r,
                    struct sl_err *err);
void tools_child_result_fini(struct tools_child_result *r);

#endif

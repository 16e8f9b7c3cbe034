/* tools_util.h: small helpers shared by the subcommands: number parsing, option
 * parsing with the messages every subcommand gives alike, and a progress line
 * on stderr (shown only on a terminal or when long). */
#ifndef SLUICE_TOOLS_UTIL_H
#define SLUICE_TOOLS_UTIL_H

#include <stdint.h>
#include <stdio.h>

int tools_parse_u32(const char *s, uint32_t *out);   /* 0 ok, -1 bad */
int tools_parse_u64(const char *s, uint64_t *out);
int tools_parse_double(const char *s, double *out);

/* Option parsing: a cursor over a subcommand's argv. A parser loops with
 * a.i over 1..argc-1, compares argv[a.i] with its options and takes their
 * values with the functions below, which advance a.i past the value.
 *
 *     struct tools_args a = {"sluice run", usage, argc, argv, 0};
 *     for (a.i = 1; a.i < argc; a.i++) {
 *         const char *s = argv[a.i];
 *         int bad = 0;
 *         if (tools_args_help(&a))
 *             return 0;
 *         else if (!strcmp(s, "-n"))
 *             bad = tools_args_u32(&a, 0, UINT32_MAX, &n);
 *         else
 *             bad = tools_args_operand(&a, &model);
 *         if (bad)
 *             return 2;
 *     }
 *     if (tools_args_need(&a, model, "MODEL") < 0)
 *         return 2;
 *
 * Each function returns 0, or -1 having printed on stderr one line that
 * names the subcommand, the option, the value and what is allowed:
 *     sluice run: -p needs a value
 *     sluice run: --cpu-workers wants a whole number in 1..8, not '100000'
 *     sluice run: --temp wants a finite number >= 0, not 'inf'
 * after which the caller exits with status 2 (a usage error). */
struct tools_args {
    const char *cmd;        /* "sluice run": the start of every message */
    void (*usage)(FILE *f); /* printed on stderr after an unexpected argument; or NULL */
    int argc;
    char **argv;
    int i; /* the option being parsed */
};

/* The option's value (the next argument) in *out. */
int tools_args_value(struct tools_args *a, const char **out);
/* A whole number in min..max (decimal, or 0x hexadecimal). */
int tools_args_u32(struct tools_args *a, uint32_t min, uint32_t max, uint32_t *out);
int tools_args_u64(struct tools_args *a, uint64_t min, uint64_t max, uint64_t *out);
/* A finite number between min and max; max may be INFINITY (no upper bound).
 * flags: TOOLS_ARGS_ABOVE_MIN excludes min, TOOLS_ARGS_BELOW_MAX excludes max. */
#define TOOLS_ARGS_ABOVE_MIN 1
#define TOOLS_ARGS_BELOW_MAX 2
int tools_args_double(struct tools_args *a, double min, double max, int flags, double *out);
/* One of names[0..n) in *out (its index). */
int tools_args_choice(struct tools_args *a, const char *const *names, int n, int *out);
/* argv[a->i] is not accepted: "unknown option 'X'" when it starts with '-',
 * else "unexpected argument 'X'", then the usage. Returns -1. */
int tools_args_unexpected(const struct tools_args *a);
/* argv[a->i] is -h or --help: prints the usage on stdout and returns 1; else 0. */
int tools_args_help(const struct tools_args *a);
/* argv[a->i] is the subcommand's operand (MODEL, SRC): into *slot when it does
 * not start with '-' and *slot is still NULL, else tools_args_unexpected. */
int tools_args_operand(const struct tools_args *a, const char **slot);
/* After the loop: -1 having printed "<cmd>: no WHAT given" and the usage on
 * stderr when operand is NULL, else 0. */
int tools_args_need(const struct tools_args *a, const char *operand, const char *what);

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

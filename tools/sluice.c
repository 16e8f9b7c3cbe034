/* sluice.c: the `sluice` command line; dispatches to the subcommands. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "sluice.h"

/* Written once, first thing in main(), before any other thread exists. The
 * start is read here rather than from /proc/self/stat's starttime: that one
 * counts from the fork (for a benchmark's child, the parent's cgroup setup
 * after the fork would count as time to first token), in 10 ms ticks of
 * CLOCK_BOOTTIME, a clock sl_now_ns() does not use. What main() misses is
 * the exec and the dynamic loader; a benchmark's child (tools_child.c) gets
 * SLUICE_EXEC_NS, the clock just before its execve, and counts from there. */
static uint64_t start_ns;

/* SLUICE_EXEC_NS when it is a plausible earlier reading of the same clock
 * (at most 10 s before main), else `now`; removed from the environment so
 * that no process started from here inherits it. */
static uint64_t exec_start(uint64_t now)
{
    const char *e = getenv("SLUICE_EXEC_NS");
    if (!e)
        return now;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(e, &end, 10);
    unsetenv("SLUICE_EXEC_NS");
    if (errno || end == e || *end || v > now || now - v > 10000000000ull)
        return now;
    return (uint64_t)v;
}

uint64_t sluice_start_ns(void)
{
    return start_ns;
}

struct command {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *summary;
};

static const struct command commands[] = {
    {"import", cmd_import, "convert a llama2.c, GGUF or safetensors model to a .sluice container"},
    {"inspect", cmd_inspect, "show a container's config, tensors, encodings and sizes"},
    {"synth", cmd_synth, "write a deterministic random model of a real architecture's shape"},
    {"quantize", cmd_quantize, "quantize a model (EdgeFlow adaptive or a baseline method)"},
    {"run", cmd_run, "generate text from a model"},
    {"eval", cmd_eval, "perplexity and KL divergence of a model against a reference"},
    {"profile-attn", cmd_profile_attn, "profile a model for sparse attention (attn.* keys)"},
    {"mount", cmd_mount, "serve a container as a read-only FUSE filesystem of layer slices"},
    {"umount", cmd_umount, "unmount a sluice filesystem"},
    {"export", cmd_export, "write a container as a GGUF file llama.cpp loads"},
    {"serve", cmd_serve, "an OpenAI-compatible HTTP server (completions, chat, SSE)"},
    {"chat", cmd_chat, "an interactive chat in the terminal (streaming, Ctrl-C stops a reply)"},
    {"bench", cmd_bench, "benchmarks: unpack, load, gemm, coldstart, serve, spec, decode, attn"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: sluice COMMAND [ARGS...]\n"
               "       sluice --version\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-9s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\n'sluice COMMAND --help' describes each command.\n");
}

int main(int argc, char **argv)
{
    start_ns = exec_start(sl_now_ns());
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("sluice " SLUICE_VERSION "\n");
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name))
            return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "sluice: %s '%s'\n\n", argv[1][0] == '-' ? "unknown option" : "unknown command",
            argv[1]);
    usage(stderr);
    return 2;
}

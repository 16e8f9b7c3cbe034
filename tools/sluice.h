/* sluice.h: the subcommands of the `sluice` command line. Each lives in its own
 * file tools/sluice_<name>.c (benchmarks in tools/bench_<name>.c), takes the
 * arguments after its name (argv[0] is the subcommand name) and returns the
 * process exit status: 0 success, 1 failure, 2 usage error. Subcommands print
 * their own errors as "sluice <cmd>: <message>" on stderr. */
#ifndef SLUICE_TOOLS_H
#define SLUICE_TOOLS_H

#include <stdint.h>

/* The process's start on sl_now_ns()'s clock (CLOCK_MONOTONIC), taken by
 * main() before it does anything else: time to first token is measured from
 * it. Any thread may call it once main() has started. */
uint64_t sluice_start_ns(void);

int cmd_import(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_profile_attn(int argc, char **argv);
int cmd_mount(int argc, char **argv);
int cmd_umount(int argc, char **argv);
int cmd_export(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_chat(int argc, char **argv);

/* bench subcommands (tools/bench_<name>.c), dispatched by cmd_bench */
int bench_unpack(int argc, char **argv);
int bench_load(int argc, char **argv);
int bench_gemm(int argc, char **argv);
int bench_coldstart(int argc, char **argv);
int bench_serve(int argc, char **argv);
int bench_spec(int argc, char **argv);
int bench_decode(int argc, char **argv);
int bench_attn(int argc, char **argv);

#endif

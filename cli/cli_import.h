/*  cli_import.h - benchmark importers: KernelBench and TritonBench (G and T) to prompt JSONL.

    Each importer walks a benchmark's files in a stable order (KernelBench by level and problem
    number, TritonBench in the order of its json) and writes one Anvil JSONL line per problem:
    a `custom_id` naming the benchmark and problem, one user message holding the prompt the
    benchmark is run with (the engine's chat template frames it), and a `task` carrying the
    reference for scoring:
      kernelbench    reference_code = the problem's source (Model, get_inputs, get_init_inputs);
                     prompt = KernelBench's one-shot "write custom Triton kernels ... name the
                     optimised class ModelNew" prompt with a worked example.
      tritonbench-g  reference_code = the operator's Triton code, test_code = its test_*()
                     function (the file split at its line of '#'); prompt = TritonBench-G's
                     instruction (comp_instru, or simp_instru with simple_instruction).
      tritonbench-t  reference_code = the PyTorch reference, test_code = its test; prompt =
                     TritonBench-T's instruction built from description, wrapper entry
                     (func_inputs), and for the complex variant math and other notes.
    Missing files are errors naming the path; nothing partial is written for a missing
    benchmark (the directory is checked before the first line). Not thread-safe.
*/
#ifndef CLI_IMPORT_H
#define CLI_IMPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

typedef enum {
    CLI_BENCH_KERNELBENCH = 0,
    CLI_BENCH_TRITONBENCH_G = 1,
    CLI_BENCH_TRITONBENCH_T = 2,
} cli_bench_t;

typedef struct {
    int level;               /* kernelbench: only this level (0 = every level found) */
    size_t limit;            /* at most this many problems (0 = all) */
    bool simple_instruction; /* tritonbench: the simple instead of the complex instruction */
    const char *match;       /* only problems whose name contains this (NULL = all) */
} cli_import_opts_t;

/* Parses "kernelbench", "tritonbench-g", "tritonbench-t". Returns 0 or ANV_ECONFIG. */
int cli_import_bench_parse(const char *name, cli_bench_t *bench);

/* Writes the benchmark found under `dir` to `out` as Anvil JSONL. Returns 0 with the number of
   lines written in *count, or a negative code with the reason in err (ANV_ENOTFOUND when `dir`
   does not hold the benchmark, ANV_EFORMAT for a file that is not what the benchmark ships,
   -errno for I/O). */
int cli_import_run(cli_bench_t bench,
                   const char *dir,
                   const cli_import_opts_t *opts,
                   FILE *out,
                   size_t *count,
                   char *err,
                   size_t errlen);

/* The KernelBench Triton prompt for one problem's source. Returns a new string (caller frees)
   or NULL when out of memory. */
char *cli_import_kernelbench_prompt(const char *ref_src);

#endif

/*  main.c - the `anvil` command: picks the subcommand and hands it the rest of the line.

    Every subcommand parses its own options (cli_util.h) and returns its exit code; this file
    only dispatches and prints the overview.
*/
#include "anv_log.h"
#include "cli_cmd.h"
#include "cli_util.h"

#include <stdio.h>
#include <string.h>

typedef struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *what;
} s_cmd_t;

static const s_cmd_t s_cmds[] = {
    {"submit", cli_cmd_submit, "queue a prompt file (Anvil or OpenAI Batch JSONL) as a job"},
    {"status", cli_cmd_status, "show jobs and their progress"},
    {"watch", cli_cmd_watch, "follow a job until it is done"},
    {"results", cli_cmd_results, "write a job's samples and scores as JSONL"},
    {"cancel", cli_cmd_cancel, "cancel a job"},
    {"retry", cli_cmd_retry, "re-queue a job's failed samples"},
    {"workers", cli_cmd_workers, "list the registered workers"},
    {"import", cli_cmd_import, "turn KernelBench / TritonBench into a prompt file"},
    {"up", cli_cmd_up, "start a local cluster (redis, broker, workers)"},
    {"down", cli_cmd_down, "stop the local cluster"},
    {"demo", cli_cmd_demo, "up + KernelBench level 1 + submit + watch + summary"},
    {"keys", cli_cmd_keys, "make CURVE key pairs (anvil keys gen --out DIR --all)"},
};

static void s_usage(FILE *out)
{
    fprintf(out, "usage: anvil COMMAND [options]   (anvil COMMAND --help for its options)\n\n"
                 "Anvil turns prompts into scored GPU kernels: a broker spreads prompts over "
                 "generation workers and their kernels over sandboxed execution workers.\n\n"
                 "commands:\n");
    for (size_t i = 0; i < sizeof s_cmds / sizeof s_cmds[0]; i++)
        fprintf(out, "  %-8s %s\n", s_cmds[i].name, s_cmds[i].what);
    fprintf(out, "\nThe broker is --broker ENDPOINT or ANVIL_BROKER, else the local cluster's "
                 "(anvil up), else " CLI_DEFAULT_BROKER ".\n");
}

int main(int argc, char **argv)
{
    anv_log_init("anvil");
    anv_log_set_level(ANV_LOG_WARN);
    cli_signals_install();
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
        !strcmp(argv[1], "help")) {
        s_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? CLI_EXIT_USAGE : CLI_EXIT_OK;
    }
    for (size_t i = 0; i < sizeof s_cmds / sizeof s_cmds[0]; i++)
        if (!strcmp(argv[1], s_cmds[i].name))
            return s_cmds[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "anvil: unknown command '%s'\n\n", argv[1]);
    s_usage(stderr);
    return CLI_EXIT_USAGE;
}

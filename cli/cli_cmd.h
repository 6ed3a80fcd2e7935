/*  cli_cmd.h - the `anvil` subcommands.

    Each takes the arguments after `anvil` (argv[0] is the subcommand's name), prints what it
    has to say and returns the process exit code (CLI_EXIT_* in cli_util.h).
*/
#ifndef CLI_CMD_H
#define CLI_CMD_H

int cli_cmd_submit(int argc, char **argv);  /* cli_submit.c */
int cli_cmd_watch(int argc, char **argv);   /* cli_watch.c */
int cli_cmd_results(int argc, char **argv); /* cli_results.c */
int cli_cmd_status(int argc, char **argv);  /* cli_query.c */
int cli_cmd_cancel(int argc, char **argv);
int cli_cmd_retry(int argc, char **argv);
int cli_cmd_workers(int argc, char **argv);
int cli_cmd_import(int argc, char **argv);
int cli_cmd_up(int argc, char **argv);      /* cli_cluster.c */
int cli_cmd_down(int argc, char **argv);
int cli_cmd_demo(int argc, char **argv);    /* cli_demo.c */
int cli_cmd_keys(int argc, char **argv);    /* cli_keys.c */

#endif

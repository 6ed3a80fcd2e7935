#include "cli_cmd.h"
int cli_cmd_demo(int argc, char **argv) { (void)argc; (void)argv; return 1; }

/*  anv_supervisor.h - one child process per GPU under one supervisor.

    `anvil-gen-worker --gpus all` (and the exec worker's) re-executes its own binary once per
    GPU with `--gpu N` appended and CUDA_VISIBLE_DEVICES=N set, so each child sees exactly one
    device and the supervisor itself never touches CUDA. A child that dies is restarted with a
    back-off (1 s doubling to 32 s, reset after a minute of uptime); SIGTERM/SIGINT is forwarded
    to every child, which drains, and the supervisor waits for them up to a grace period before
    SIGKILL. GPUs are counted from /proc/driver/nvidia/gpus (no CUDA call).
*/
#ifndef ANV_SUPERVISOR_H
#define ANV_SUPERVISOR_H

/* Number of NVIDIA GPUs visible on this host (0 when none), honouring CUDA_VISIBLE_DEVICES
   when it is set to a comma-separated list of indices. */
int anv_gpu_count(void);

/* Parses "all", "none", "0,2,3" into gpus[] (at most max); returns the count, or -1 when the
   list is malformed. "all" expands to anv_gpu_count() GPUs. */
int anv_gpu_list_parse(const char *spec, int *gpus, int max);

/* Runs argv[0] (resolved through /proc/self/exe) with argv[1..] plus "--gpu" "N" for each GPU
   and supervises the children until a termination signal; then forwards it and waits up to
   grace_ms. Returns 0 when every child exited cleanly, 1 otherwise. argv is the worker's own
   argument vector with the --gpus option already removed by the caller. */
int anv_supervisor_run(char **argv, const int *gpus, int n_gpus, int grace_ms);

#endif

#!/bin/bash
# memcheck.sh - the whole-model test (few steps) under compute-sanitizer memcheck.
# Usage: memcheck.sh [--tool memcheck|racecheck] PATH/BIN [ARGS...]
# ARGS default to "--steps 4" (test_cuda_model's); racecheck checks shared-memory hazards
# (gpu_session runs it on test_cuda_ops --only decodes and --only prefill). Exit 77 when the
# sanitizer or a GPU is missing.
set -u
tool=memcheck
if [ "${1:-}" = --tool ]; then
    tool=$2
    shift 2
fi
case $tool in
memcheck) opts=(--tool memcheck --leak-check full) ;;
racecheck) opts=(--tool racecheck) ;;
*) echo "memcheck.sh: unknown tool '$tool' (memcheck or racecheck)" >&2; exit 2 ;;
esac
bin=${1:?usage: memcheck.sh [--tool memcheck|racecheck] BIN [ARGS...]}
shift
[ $# -eq 0 ] && set -- --steps 4
cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
if [ -z "$cs" ]; then
    echo "SKIP: compute-sanitizer not found"
    exit 77
fi
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "SKIP: no GPU visible"
    exit 77
fi
"$cs" "${opts[@]}" --error-exitcode 9 "$bin" "$@"

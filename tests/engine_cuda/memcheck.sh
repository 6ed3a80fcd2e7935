#!/bin/bash
# memcheck.sh - the whole-model test (few steps) under compute-sanitizer memcheck.
# Usage: memcheck.sh PATH/test_cuda_model. Exit 77 when the sanitizer or a GPU is missing.
set -u
bin=$1
cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
if [ -z "$cs" ]; then
    echo "SKIP: compute-sanitizer not found"
    exit 77
fi
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "SKIP: no GPU visible"
    exit 77
fi
"$cs" --tool memcheck --leak-check full --error-exitcode 9 "$bin" --steps 4

#!/usr/bin/env bash
# demo.sh - the README's main job: install what is missing, build, and run `anvil demo` (a local
# cluster: its own redis-server, the broker, a gen worker and an exec worker, and a sample
# KernelBench job through them). Arguments are passed to `anvil demo` (e.g. --model DIR).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="${ANVIL_BUILD_DIR:-$repo/build}"
"$repo/deploy/install-deps.sh"
export PATH="/usr/local/cuda/bin:$PATH"
mkdir -p "$build"
cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$build/cmake.log" 2>&1 ||
    { cat "$build/cmake.log"; exit 1; }
cmake --build "$build" -j"$(nproc)" >"$build/build.log" 2>&1 ||
    { grep -E "error|Error" "$build/build.log" | head -50; exit 1; }
if [ ! -x "$build/cli/anvil" ]; then
    echo "demo.sh: the anvil CLI is not built yet (issue 6 has not landed): there is no demo to run" >&2
    exit 1
fi
export ANVIL_PYTHON="$repo/.venv/bin/python"
exec "$build/cli/anvil" demo "$@"

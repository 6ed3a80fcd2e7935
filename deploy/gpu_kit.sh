#!/usr/bin/env bash
# gpu_kit.sh - one compressed folder for a session on a lent GPU machine, and the run there.
#
#   deploy/gpu_kit.sh make [--build-dir DIR] [--out .device]   (here: builds .device/kit.tar.xz)
#   deploy/gpu_kit.sh run [LOGDIR]                              (there, from the repo root)
#
# The device tool carries at most 64 MiB, and the CUDA test binaries alone are ~90 MB (12 to 15
# MB each, sm_90 code and compute_90 PTX); xz makes the whole kit ~34 MB (~40 MB with KIT_KEEP's
# two). The kit holds:
# build-gpu/ (deploy/bundle.sh --gpu-tests, without anvil-generate and eng_cuda_hfcheck unless
# KIT_KEEP names them: load_8b / vs_hf need them), anvil/ (deploy/bundle.sh with only the exec
# worker, its launcher and bwrap), build/exec_worker/anvil-exec-worker (a wrapper, as gpu_bench.sh expects
# of a build dir), datasets/ (the two KernelBench tasks gpu_bench.sh scores) and bench_compare.
#
# `run` unpacks the kit to /tmp/kit and runs, each under its own timeout: the exec worker's
# figures (tests/exec_worker/gpu_bench.sh), bench_compare, the engine session
# (gpu_session.sh: tests, bench, the op-by-op bench (the fused linear op's A/B), fp8 bench,
# memcheck, ncu at batch 1 and at batch 256 x 2k),
# then tars LOGDIR (default /tmp/out) into $OUT/out.tgz and prints the figures: about 460 s
# on the H200. Carry `.device`: `bash deploy/gpu_kit.sh run` as the device command.
# Environment for `run`: KIT_EXEC=0 skips the exec worker's figures and bench_compare;
# KIT_STEPS replaces the engine session's step list (gpu_session.sh --only), KIT_BUDGET its
# budget in seconds (default 330: with the exec figures, about 170 s, a run fits the device
# tool's 600 s a command).
# The whole system end to end: `KIT_BUNDLE=1 gpu_kit.sh make` also writes .device/bundle.tar.xz
# (deploy/bundle.sh, ~26 MB: with the kit ~60 MB of the 64 MiB; leave KIT_KEEP empty), and
# `run` then unpacks it to /tmp/anvil, gives the session its anvil-generate (gen_graphs,
# gen_groups) and, with KIT_WORKER="ARGS", runs tests/gen_worker/gpu_worker_bench.py --bin
# /tmp/anvil/bin --out LOGDIR/wb --write /tmp/ckpt8b ARGS (split on spaces) after the session,
# e.g. KIT_WORKER="--prompts 64 --n 8 --new 256 --skip bench" (the checkpoint takes ~65 s).
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mode=${1:-}
shift || true

if [ "$mode" = make ]; then
    build="$repo/build"
    out="$repo/.device"
    while [ $# -gt 0 ]; do
        case "$1" in
        --build-dir) build=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        *) echo "usage: gpu_kit.sh make [--build-dir DIR] [--out DIR]" >&2; exit 2 ;;
        esac
    done
    kit=$(mktemp -d)/kit
    "$repo/deploy/bundle.sh" --build-dir "$build" --gpu-tests "$kit/build-gpu" || exit 1
    for n in anvil-generate eng_cuda_hfcheck; do # KIT_KEEP="eng_cuda_hfcheck ..." keeps them
        [[ " ${KIT_KEEP:-} " == *" $n "* ]] || rm -f "$kit/build-gpu/$n"
    done
    "$repo/deploy/bundle.sh" --build-dir "$build" --dir "$kit/anvil" --out "$kit.bundle.tgz" ||
        exit 1
    rm -f "$kit.bundle.tgz"
    for n in anvil anvil-broker anvil-gen-worker anvil-generate anvil-bench-engine redis-server \
        redis-cli; do
        rm -f "$kit/anvil/bin/$n" "$kit/anvil/libexec/$n"
    done
    mkdir -p "$kit/build/exec_worker" "$kit/datasets/kernelbench/level1"
    printf '#!/bin/sh\nexec "$(dirname "$0")/../../anvil/bin/anvil-exec-worker" "$@"\n' \
        >"$kit/build/exec_worker/anvil-exec-worker"
    chmod +x "$kit/build/exec_worker/anvil-exec-worker"
    kb="$repo/../shared/datasets/kernelbench/level1"
    cp "$kb/88_MinGPTNewGelu.py" "$kb/1_Square_matrix_multiplication_.py" \
        "$kit/datasets/kernelbench/level1/" || exit 1
    cp "$build/tests/exec_worker/bench_compare" "$kit/" || exit 1
    mkdir -p "$out"
    tar cf - -C "$(dirname "$kit")" kit | xz -T0 -6 >"$out/kit.tar.xz" || exit 1
    rm -f "$out/bundle.tar.xz"
    if [ "${KIT_BUNDLE:-0}" = 1 ]; then
        "$repo/deploy/bundle.sh" --build-dir "$build" --dir "$(dirname "$kit")/anvil" \
            --out "$(dirname "$kit")/anvil.tgz" || exit 1
        tar cf - -C "$(dirname "$kit")" anvil | xz -T0 -6 >"$out/bundle.tar.xz" || exit 1
        echo "bundle: $out/bundle.tar.xz ($(du -h "$out/bundle.tar.xz" | cut -f1))"
    fi
    rm -rf "$(dirname "$kit")"
    echo "gpu kit: $out/kit.tar.xz ($(du -h "$out/kit.tar.xz" | cut -f1)); carry '$(basename "$out")'"
    exit 0
fi

[ "$mode" = run ] || { echo "usage: gpu_kit.sh make|run" >&2; exit 2; }
log=${1:-/tmp/out}
K=/tmp/kit
mkdir -p "$log" && rm -rf "$K" && tar xJf "$repo/.device/kit.tar.xz" -C /tmp || exit 1
if [ -f "$repo/.device/bundle.tar.xz" ]; then
    rm -rf /tmp/anvil && tar xJf "$repo/.device/bundle.tar.xz" -C /tmp || exit 1
    # the bundle's binaries find their libraries from their own folder: a wrapper, not a link
    [ -e "$K/build-gpu/anvil-generate" ] ||
        printf '#!/bin/sh\nexec /tmp/anvil/bin/anvil-generate "$@"\n' >"$K/build-gpu/anvil-generate"
    chmod +x "$K/build-gpu/anvil-generate"
fi
cd "$repo" || exit 1
t0=$(date +%s)
py=$(command -v python3)
if [ "${KIT_EXEC:-1}" != 0 ]; then
    ( export PATH=$K/anvil/bin:$PATH ANVIL_HARNESS_DIR=$repo/exec_worker/harness \
          ANVIL_BWRAP=$K/anvil/bin/bwrap ANVIL_PYTHON=$py ANVIL_BUILD_DIR=$K/build \
          ANVIL_SHARED_DIR=$K
      timeout 260 bash tests/exec_worker/gpu_bench.sh "$log/eb" ) >"$log/exec_bench.log" 2>&1
    echo "exec gpu_bench rc=$? at $(( $(date +%s) - t0 ))s"
    for _ in 1 2 3; do "$K/bench_compare" 256 2>&1 | tail -1; done >"$log/compare.log"
fi
gen_worker/engine/cuda/bench/gpu_session.sh "$K/build-gpu" "$log/gpu" --budget "${KIT_BUDGET:-330}" \
    --only "${KIT_STEPS:-graphs_test,ops_test,model_test,bench,bench_oneop,bench_fp8,memcheck,kernels,kernels_b256}" \
    >"$log/session.log" 2>&1
echo "engine session done at $(( $(date +%s) - t0 ))s"
if [ -n "${KIT_WORKER:-}" ] && [ -x /tmp/anvil/bin/anvil-gen-worker ]; then
    # shellcheck disable=SC2086  # KIT_WORKER is a list of flags
    timeout "${KIT_WORKER_TIMEOUT:-300}" python3 tests/gen_worker/gpu_worker_bench.py \
        --bin /tmp/anvil/bin --out "$log/wb" --write /tmp/ckpt8b $KIT_WORKER >"$log/wb.log" 2>&1
    echo "worker bench rc=$? at $(( $(date +%s) - t0 ))s"
    rm -rf /tmp/ckpt8b "$log"/wb/*.jsonl "$log"/wb/prompts*
fi
rm -f "$log"/gpu/*.csv
[ -n "${OUT:-}" ] && tar czf "$OUT/out.tgz" -C "$(dirname "$log")" "$(basename "$log")"
cat "$log/eb/figures.txt" "$log/compare.log" "$log/gpu/summary.txt" 2>/dev/null
grep -hE "checks, " "$log"/gpu/*_test.log 2>/dev/null
grep -vE "^== (the same|hf peer)" "$log/gpu/figures.txt" 2>/dev/null
grep -h '^{' "$log/wb.log" 2>/dev/null
exit 0

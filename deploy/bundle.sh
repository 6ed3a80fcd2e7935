#!/usr/bin/env bash
# bundle.sh - a relocatable tarball of Anvil that runs on another Linux without installing
# packages.
#
#   deploy/bundle.sh [--build-dir DIR] [--out FILE.tar.gz] [--dir DIR]
#   deploy/bundle.sh [--build-dir DIR] --gpu-tests DIR
#
# --gpu-tests makes, instead of the bundle, a flat folder of the CUDA test and bench binaries
# (test_cuda_ops, test_cuda_model, test_cuda_graphs, eng_cuda_hfcheck, anvil-bench-engine,
# anvil-generate, eng_engine_check) with lib/ holding the libraries the GPU host lacks, as
# gen_worker/engine/cuda/bench/gpu_session.sh expects (it puts BUILD_DIR/lib on
# LD_LIBRARY_PATH). The full bundle plus these would pass the device tool's 64 MiB carry limit.
#
# Layout: bin/ (wrappers that set LD_LIBRARY_PATH, then exec the real binary in libexec/),
# libexec/ (the binaries; their DT_RPATH is $ORIGIN/../lib too), lib/ (every shared library
# `ldd` lists except the ones the host must provide: libc, libm, libdl, librt, libpthread, the
# dynamic loader, and the CUDA driver, runtime and cuBLAS, which must match the host's driver),
# exec_worker/harness/ (the sandbox's Python package), share/anvil/ (redis.conf, deploy files).
# redis-server and redis-cli from this machine are bundled so a GPU node needs no Redis package.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="$repo/build"
out=""
dir=""
gpu_tests=""
while [ $# -gt 0 ]; do
    case "$1" in
    --build-dir) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --gpu-tests) gpu_tests=$2; shift 2 ;;
    *) echo "usage: deploy/bundle.sh [--build-dir DIR] [--out FILE.tar.gz] [--dir DIR] | [--gpu-tests DIR]" >&2; exit 2 ;;
    esac
done
# libraries the host provides: glibc's own, the loader, and the CUDA driver and runtime
host_lib='^(libc|libm|libdl|librt|libpthread|libresolv|libutil|ld-linux.*|linux-vdso|libcuda|libcudart|libcublas|libcublasLt|libnvidia.*)\.so'
# copy_libs BINARY LIBDIR [SKIP_RE]: the shared libraries BINARY needs that the host does not
# provide (nor match SKIP_RE)
copy_libs() {
    local skip=${3:-'^$'}
    { ldd "$1" 2>/dev/null || true; } | awk '/=> \// {print $1, $3}' | while read -r soname path; do
        if ! [[ "$soname" =~ $host_lib ]] && ! [[ "$soname" =~ $skip ]] && [ ! -e "$2/$soname" ]; then
            cp -L "$path" "$2/$soname"
        fi
    done
}

if [ -n "$gpu_tests" ]; then
    rm -rf "$gpu_tests"
    mkdir -p "$gpu_tests/lib"
    n=0
    for name in test_cuda_ops test_cuda_model test_cuda_graphs eng_cuda_hfcheck anvil-bench-engine \
        anvil-generate eng_engine_check; do
        f=$(find "$build" -path "$build/bundle" -prune -o -type f -name "$name" -perm -u+x -print | head -1)
        if [ -z "$f" ]; then
            echo "bundle.sh: $name is not built under $build (ANVIL_CUDA=ON?)" >&2
            exit 1
        fi
        cp "$f" "$gpu_tests/$name"
        # the C++ runtime stays the host's: lib/ goes on LD_LIBRARY_PATH for a whole session,
        # Python and torch included, and they need the host's (newer) libstdc++
        copy_libs "$f" "$gpu_tests/lib" '^(libstdc\+\+|libgcc_s)\.so'

        n=$((n + 1))
    done
    echo "gpu tests: $gpu_tests ($(du -sh "$gpu_tests" | cut -f1); $n binaries, $(ls "$gpu_tests/lib" | wc -l) libraries)"
    exit 0
fi

[ -n "$dir" ] || dir="$build/bundle/anvil"
[ -n "$out" ] || out="$build/bundle/anvil-$(uname -m).tar.gz"

rm -rf "$dir"
mkdir -p "$dir/bin" "$dir/libexec" "$dir/lib" "$dir/share/anvil"

bins=()
for name in anvil anvil-broker anvil-gen-worker anvil-exec-worker anvil-exec-launch anvil-generate \
    anvil-bench-engine; do
    f=$(find "$build" -path "$build/bundle" -prune -o -type f -name "$name" -perm -u+x -print | head -1)
    [ -n "$f" ] && bins+=("$name=$f")
done
# redis-server is a link to redis-check-rdb on Debian: it picks its role from argv[0], so
# it keeps its own name here
# bwrap too: the exec worker's sandbox, which a GPU node may not have installed
for tool in redis-server redis-cli bwrap; do
    p=$(command -v "$tool" || true)
    [ -n "$p" ] && bins+=("$tool=$(readlink -f "$p")")
done
[ ${#bins[@]} -gt 0 ] || { echo "bundle.sh: no binaries found under $build" >&2; exit 1; }

for entry in "${bins[@]}"; do
    name=${entry%%=*}
    b=${entry#*=}
    cp "$b" "$dir/libexec/$name"
    copy_libs "$b" "$dir/lib"
    cat >"$dir/bin/$name" <<WRAP
#!/bin/sh
# wrapper: the bundle's libraries first, then the real binary
here=\$(cd "\$(dirname "\$0")/.." && pwd)
export LD_LIBRARY_PATH="\$here/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export ANVIL_HOME="\${ANVIL_HOME:-\$here}"
exec "\$here/libexec/$name" "\$@"
WRAP
    chmod +x "$dir/bin/$name"
done

[ -d "$repo/exec_worker/harness" ] && mkdir -p "$dir/exec_worker" &&
    cp -r "$repo/exec_worker/harness" "$dir/exec_worker/" &&
    find "$dir/exec_worker" -name __pycache__ -prune -exec rm -rf {} +
# the random-model tool for GPU-less clusters and demos
mkdir -p "$dir/share/anvil/tools"
cp "$repo/gen_worker/engine/tools/tiny_model.py" "$dir/share/anvil/tools/"
[ -f "$repo/broker/redis.conf" ] && cp "$repo/broker/redis.conf" "$dir/share/anvil/"
# the Slurm recipe runs from the bundle on every node (share/anvil/slurm/anvil-node.sh)
mkdir -p "$dir/share/anvil/slurm"
cp "$repo/deploy/slurm/anvil-node.sh" "$repo/deploy/slurm/anvil.sbatch" "$dir/share/anvil/slurm/"
cp "$repo/README.md" "$dir/share/anvil/"
git -C "$repo" rev-parse HEAD >"$dir/share/anvil/VERSION" 2>/dev/null || echo unknown >"$dir/share/anvil/VERSION"

mkdir -p "$(dirname "$out")"
tar -C "$(dirname "$dir")" -czf "$out" "$(basename "$dir")"
echo "bundle: $out ($(du -sh "$out" | cut -f1); $(ls "$dir/libexec" | wc -l) binaries, $(ls "$dir/lib" | wc -l) libraries)"

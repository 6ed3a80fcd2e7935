#!/usr/bin/env bash
# bundle.sh - a relocatable tarball of Anvil that runs on another Linux without installing
# packages.
#
#   deploy/bundle.sh [--build-dir DIR] [--out FILE.tar.gz] [--dir DIR]
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
while [ $# -gt 0 ]; do
    case "$1" in
    --build-dir) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    *) echo "usage: deploy/bundle.sh [--build-dir DIR] [--out FILE.tar.gz] [--dir DIR]" >&2; exit 2 ;;
    esac
done
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

# libraries the host provides: glibc's own, the loader, and the CUDA driver and runtime
host_lib='^(libc|libm|libdl|librt|libpthread|libresolv|libutil|ld-linux.*|linux-vdso|libcuda|libcudart|libcublas|libcublasLt|libnvidia.*)\.so'
for entry in "${bins[@]}"; do
    name=${entry%%=*}
    b=${entry#*=}
    cp "$b" "$dir/libexec/$name"
    { ldd "$b" 2>/dev/null || true; } | awk '/=> \// {print $1, $3}' | while read -r soname path; do
        if ! [[ "$soname" =~ $host_lib ]] && [ ! -e "$dir/lib/$soname" ]; then
            cp -L "$path" "$dir/lib/$soname"
        fi
    done
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

#!/usr/bin/env bash
# run.sh - the test command: install what is missing, build everything (CUDA objects included
# when nvcc is there), run ctest and pytest, and end with one count line
# "N passed, N failed, N skipped" over both.
#
#   tests/run.sh [--build-dir DIR] [--sanitize address,undefined] [--labels REGEX]
#
# ctest runs every label except bench (benchmarks print figures, run them on purpose) and gpu
# tests skip themselves (exit 77) where there is no GPU. Exit status: 0 when nothing failed.
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="$repo/build"
sanitize=""
exclude="bench"
labels=""
while [ $# -gt 0 ]; do
    case "$1" in
    --build-dir) build=$2; shift 2 ;;
    --sanitize) sanitize=$2; shift 2 ;;
    --labels) labels=$2; shift 2 ;;
    *) echo "usage: tests/run.sh [--build-dir DIR] [--sanitize LIST] [--labels REGEX]" >&2; exit 2 ;;
    esac
done

"$repo/deploy/install-deps.sh" || { echo "0 passed, 1 failed"; exit 1; }
export PATH="/usr/local/cuda/bin:$PATH"
mkdir -p "$build"

cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DANVIL_SANITIZE="$sanitize" \
    >"$build/cmake.log" 2>&1 || { cat "$build/cmake.log"; echo "0 passed, 1 failed"; exit 1; }
if ! cmake --build "$build" -j"$(nproc)" >"$build/build.log" 2>&1; then
    grep -E "error|Error" "$build/build.log" | head -50
    echo "0 passed, 1 failed"
    exit 1
fi
echo "build: ok ($(grep -c 'Built target' "$build/build.log") targets)"

results="$build/test-results"
rm -rf "$results" && mkdir -p "$results"
ctest_args=(--test-dir "$build" --output-on-failure --output-junit "$results/ctest.xml" -LE "$exclude")
[ -n "$labels" ] && ctest_args+=(-L "$labels")
ctest "${ctest_args[@]}"
ctest_rc=$?

py_rc=0
if [ -d "$repo/tests" ] && find "$repo/tests" -name 'test_*.py' | grep -q .; then
    ANVIL_BUILD_DIR="$build" ANVIL_SOURCE_DIR="$repo" ANVIL_SHARED_DIR="$repo/../shared" \
        "$repo/.venv/bin/python" -m pytest -q -rs "$repo/tests" --junitxml="$results/pytest.xml" \
        -p no:cacheprovider
    py_rc=$?
    [ $py_rc -eq 5 ] && py_rc=0 # no tests collected is not a failure
fi

python3 - "$results" <<'PY'
import glob, sys, xml.etree.ElementTree as ET
p = f = s = 0
for path in glob.glob(sys.argv[1] + "/*.xml"):
    root = ET.parse(path).getroot()
    for tc in root.iter("testcase"):
        st = tc.get("status", "")
        if tc.find("failure") is not None or tc.find("error") is not None or st == "fail":
            f += 1
        elif tc.find("skipped") is not None or st in ("notrun", "disabled"):
            s += 1
        else:
            p += 1
print(f"{p} passed, {f} failed, {s} skipped")
PY
[ $ctest_rc -eq 0 ] && [ $py_rc -eq 0 ]

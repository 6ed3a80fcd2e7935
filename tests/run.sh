#!/usr/bin/env bash
# run.sh - the test command: install what is missing, build everything (CUDA objects included
# when nvcc is there), run ctest and pytest, and end with one count line
# "N passed, N failed, N skipped" over every stage.
#
#   tests/run.sh [--build-dir DIR] [--sanitize address,undefined] [--labels REGEX]
#
# Stages (each one's time is printed; all of them count in the final line):
#   1. main: the build in DIR (default build/), ctest (every label but bench: benchmarks print
#      figures, run them on purpose; gpu tests skip themselves, exit 77, without a GPU) and
#      pytest tests/.
#   2. fuzz: DIR-fuzz configured with clang, -DANVIL_SANITIZE=fuzzer-no-link,address,undefined,
#      builds only the fuzz targets and runs `ctest -L fuzz`: each libFuzzer target for
#      ANVIL_FUZZ_SECONDS (default 20) with leak detection; any crash or report fails.
#   3. asan: DIR-asan configured with gcc and -DANVIL_SANITIZE=address,undefined, the whole
#      build, `ctest -L 'unit|integration'` and the pytest suites that start our binaries
#      (ANVIL_ASAN_PYTEST, default: all of tests/), with halt_on_error so that any sanitizer
#      report fails the test that caused it.
# ANVIL_TEST_QUICK=1 skips stages 2 and 3 (local runs); CI runs them all; --labels
# only narrows stage 1's ctest. Exit status: 0 when nothing failed.
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
t_main=$SECONDS

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

# a stage that cannot even build counts as one failed test, named after the stage
s_stage_failed() {
    printf '<testsuite name="%s"><testcase name="%s"><failure message="%s"/></testcase></testsuite>\n' \
        "$1" "$1" "$2" >"$results/$1-setup.xml"
    echo "$1: $2"
}
echo "stage main: $((SECONDS - t_main))s"

fuzz_rc=0
asan_rc=0
if [ "${ANVIL_TEST_QUICK:-0}" != "1" ]; then
    t0=$SECONDS
    fb="$build-fuzz"
    mkdir -p "$fb"
    if ! command -v clang >/dev/null; then
        s_stage_failed fuzz "clang is not installed (deploy/install-deps.sh installs it)"
        fuzz_rc=1
    elif ! CC=clang cmake -S "$repo" -B "$fb" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DANVIL_CUDA=OFF \
            -DANVIL_SANITIZE=fuzzer-no-link,address,undefined >"$fb/cmake.log" 2>&1; then
        tail -30 "$fb/cmake.log"
        s_stage_failed fuzz "cmake with clang failed"
        fuzz_rc=1
    elif ! cmake --build "$fb" -j"$(nproc)" --target anvil_fuzz_targets >"$fb/build.log" 2>&1; then
        grep -E "error|Error" "$fb/build.log" | head -50
        s_stage_failed fuzz "building the fuzz targets failed"
        fuzz_rc=1
    else
        ctest --test-dir "$fb" --output-on-failure --output-junit "$results/fuzz.xml" -L fuzz
        fuzz_rc=$?
    fi
    echo "stage fuzz: $((SECONDS - t0))s"

    t0=$SECONDS
    ab="$build-asan"
    mkdir -p "$ab"
    export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:abort_on_error=1"
    export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
    if ! cmake -S "$repo" -B "$ab" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DANVIL_CUDA=OFF \
            -DANVIL_SANITIZE=address,undefined >"$ab/cmake.log" 2>&1; then
        tail -30 "$ab/cmake.log"
        s_stage_failed asan "cmake with -DANVIL_SANITIZE=address,undefined failed"
        asan_rc=1
    elif ! cmake --build "$ab" -j"$(nproc)" >"$ab/build.log" 2>&1; then
        grep -E "error|Error" "$ab/build.log" | head -50
        s_stage_failed asan "the sanitizer build failed"
        asan_rc=1
    else
        ctest --test-dir "$ab" --output-on-failure --output-junit "$results/asan-ctest.xml" \
            -L 'unit|integration' -LE bench
        asan_rc=$?
        echo "stage asan ctest: $((SECONDS - t0))s"
        # python itself is not instrumented: the suites only spawn the ASan-built binaries
        read -r -a asan_py <<<"${ANVIL_ASAN_PYTEST:-$repo/tests}"
        ANVIL_BUILD_DIR="$ab" ANVIL_SOURCE_DIR="$repo" ANVIL_SHARED_DIR="$repo/../shared" \
            "$repo/.venv/bin/python" -m pytest -q -rs "${asan_py[@]}" \
            --junitxml="$results/asan-pytest.xml" -p no:cacheprovider
        rc=$?
        [ $rc -eq 5 ] && rc=0
        [ $rc -ne 0 ] && asan_rc=$rc
    fi
    unset ASAN_OPTIONS UBSAN_OPTIONS
    echo "stage asan: $((SECONDS - t0))s"
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
[ $ctest_rc -eq 0 ] && [ $py_rc -eq 0 ] && [ $fuzz_rc -eq 0 ] && [ $asan_rc -eq 0 ]

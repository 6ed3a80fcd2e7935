#!/usr/bin/env bash
# run-fuzzer.sh TARGET CORPUS SECONDS - runs a libFuzzer target for a bounded time over a
# scratch copy of its corpus (the committed corpus is only read); any crash, leak, timeout,
# out-of-memory or sanitizer report fails the test and leaves the reproducer in the scratch
# dir, named in the output (copy it into CORPUS as a regression input).
set -uo pipefail
target=$(readlink -f "$1") corpus=$(readlink -f "$2") seconds=$3
work=$(mktemp -d "${TMPDIR:-/tmp}/anvil-fuzz.XXXXXX")
mkdir -p "$work/corpus"
cp -r "$corpus"/. "$work/corpus/" 2>/dev/null || true
cd "$work"
export ASAN_OPTIONS="${ASAN_OPTIONS:-halt_on_error=1:detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"
"$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -error_exitcode=1 -timeout_exitcode=1 -artifact_prefix="$work/" "$work/corpus" >"$work/log" 2>&1
rc=$?
if [ $rc -ne 0 ]; then
    grep -v '^#[0-9]' "$work/log" | tail -80
    echo "fuzz: $(basename "$target") FAILED (rc $rc); reproducer and log in $work"
    exit 1
fi
grep -E '^(stat::|Done|INFO: -max_total_time)' "$work/log" | tail -8
echo "fuzz: $(basename "$target") no crash in ${seconds}s, corpus $(ls "$work/corpus" | wc -l) inputs"
rm -rf "$work"

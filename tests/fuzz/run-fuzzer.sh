#!/usr/bin/env bash
# run-fuzzer.sh TARGET CORPUS SECONDS - runs a libFuzzer target for a bounded time over a
# scratch copy of its corpus (the committed corpus is only read); any crash, leak or sanitizer
# report fails the test and leaves the reproducer in the scratch dir, named in the output.
set -euo pipefail
target=$1 corpus=$2 seconds=$3
work=$(mktemp -d /tmp/anvil-fuzz.XXXXXX)
mkdir -p "$work/corpus"
cp -r "$corpus"/. "$work/corpus/" 2>/dev/null || true
cd "$work"
"$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 -error_exitcode=1 \
    -artifact_prefix="$work/" "$work/corpus" 2>&1 | tail -20
echo "fuzz: no crash in ${seconds}s (scratch $work)"
rm -rf "$work"

#!/usr/bin/env bash
# cli_offline.sh - what the anvil binary does with no broker at all: help and exit codes for
# every subcommand, malformed files refused before any connection, unreachable broker reported
# with exit 4 within --timeout, importers writing nothing on error.
. "$(dirname "$0")/lib.sh"
trap 'rm -rf "$T"' EXIT
export ANVIL_DATA=$T/data   # no local cluster here
unset ANVIL_BROKER

for cmd in submit status watch results cancel retry workers import up down demo; do
    expect_rc 0 "$cmd --help" "$ANVIL" "$cmd" --help
    contains "usage: anvil $cmd"
    contains "exit codes:"
done
expect_rc 2 "no command" "$ANVIL"
expect_rc 2 "unknown command" "$ANVIL" frobnicate
contains "unknown command 'frobnicate'"
expect_rc 2 "unknown flag" "$ANVIL" status --frobnicate
contains "unknown option '--frobnicate'"
expect_rc 2 "bad number" "$ANVIL" submit x.jsonl --samples 0

# a malformed line N stops the submit before it even connects (the broker port is closed)
printf '{"custom_id": "a", "prompt": "x"}\n{"custom_id": "b", "prompt": "y", "n": "two"}\n' >"$T/bad.jsonl"
expect_rc 3 "malformed Anvil line" "$ANVIL" submit "$T/bad.jsonl" --broker tcp://127.0.0.1:1
contains "line 2: 'n' must be an integer"
contains "nothing was queued"
printf '{"custom_id": "a", "body": {"messages": [{"role": "user", "content": "x"}]}}\n{"custom_id": "a", "body": {"messages": [{"role": "user", "content": "y"}]}}\n' >"$T/dup.jsonl"
expect_rc 3 "duplicate ids in an OpenAI file" "$ANVIL" submit "$T/dup.jsonl" --broker tcp://127.0.0.1:1
contains "line 2: duplicate custom_id 'a' (first on line 1)"
: >"$T/empty.jsonl"
expect_rc 3 "empty file" "$ANVIL" submit "$T/empty.jsonl"
contains "holds no prompts"
expect_rc 3 "missing file" "$ANVIL" submit "$T/nope.jsonl"
contains "cannot open"

# unreachable broker: exit 4 with the endpoint named
printf '{"prompt": "x"}\n' >"$T/ok.jsonl"
expect_rc 4 "submit, no broker" "$ANVIL" submit "$T/ok.jsonl" --broker tcp://127.0.0.1:1 --timeout 0.3
contains "no reply from the broker at tcp://127.0.0.1:1"
expect_rc 4 "status, no broker" "$ANVIL" status --broker tcp://127.0.0.1:1 --timeout 0.3
expect_rc 4 "workers via ANVIL_BROKER" env ANVIL_BROKER=tcp://127.0.0.1:1 "$ANVIL" workers --timeout 0.3
contains "tcp://127.0.0.1:1"
expect_rc 4 "watch, no broker" "$ANVIL" watch 01ABC --broker tcp://127.0.0.1:1 --timeout 0.5
expect_rc 2 "retry needs --failed" "$ANVIL" retry 01ABC
expect_rc 2 "bad endpoint" "$ANVIL" status --broker nonsense
contains "cannot use broker endpoint 'nonsense'"

# importers: real datasets in, nothing written on error
if [ -d "$S/datasets/kernelbench/level1" ]; then
    expect_rc 0 "import kernelbench" "$ANVIL" import kernelbench "$S/datasets/kernelbench" --level 1 --limit 3 --out "$T/kb.jsonl"
    check "3 lines" test "$(wc -l <"$T/kb.jsonl")" = 3
    check "imported file is valid input" python3 -c '
import json, sys
for line in open(sys.argv[1]):
    d = json.loads(line)
    assert d["task"]["kind"] == "kernelbench" and "ModelNew" in d["messages"][0]["content"]
' "$T/kb.jsonl"
fi
expect_rc 3 "import from nowhere" "$ANVIL" import tritonbench-t "$T" --out "$T/tb.jsonl"
contains "does not hold TritonBench_T_v1"
check "no partial output" test ! -e "$T/tb.jsonl"
check "no temporary left" sh -c "! ls '$T' | grep -q partial"
expect_rc 2 "unknown benchmark" "$ANVIL" import humaneval "$T"
expect_rc 0 "down with nothing up" "$ANVIL" down
contains "no local cluster"
done_checks

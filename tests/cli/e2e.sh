#!/usr/bin/env bash
# e2e.sh - the CLI against a whole local cluster: `anvil up --gpus none` in a temp dir (Redis,
# broker, a CPU gen worker, a CPU exec worker in Triton's interpreter), then: workers register;
# a plain job (--no-score) runs to the end and its results hold every (custom_id, sample) once;
# an OpenAI Batch file; a scored KernelBench job (every sample carries a score status); cancel;
# resume across `anvil down` + `anvil up` in the middle of a job (nothing lost or doubled);
# results unchanged across a restart; retry --failed; `down` leaves nothing running.
# Skipped (77) when a binary is missing or there is no model (ANVIL_TEST_MODEL=DIR, or the
# engine's anvil-make-model tool, or gen_worker/engine/tools/tiny_model.py with the repo venv).
. "$(dirname "$0")/lib.sh"
skip() { echo "skipped: $*"; rm -rf "$T"; exit 77; }
for bin in broker/anvil-broker gen_worker/anvil-gen-worker exec_worker/anvil-exec-worker; do
    [ -x "$B/$bin" ] || skip "$B/$bin is not built"
done
command -v redis-server >/dev/null || skip "no redis-server"
[ -d "$S/datasets/kernelbench" ] || skip "$S/datasets/kernelbench not found (set ANVIL_SHARED_DIR)"
SRC=${ANVIL_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
MODEL=()
if [ -n "${ANVIL_TEST_MODEL:-}" ]; then
    MODEL=(--model "$ANVIL_TEST_MODEL")
elif [ -x "$SRC/.venv/bin/python" ] && [ -f "$SRC/gen_worker/engine/tools/tiny_model.py" ]; then
    "$SRC/.venv/bin/python" "$SRC/gen_worker/engine/tools/tiny_model.py" "$T/model" >"$T/model.log" 2>&1 ||
        skip "gen_worker/engine/tools/tiny_model.py could not make a model (see its output)"
    MODEL=(--model "$T/model")
elif [ ! -x "$B/gen_worker/anvil-make-model" ]; then
    skip "no model: set ANVIL_TEST_MODEL=DIR or build gen_worker/anvil-make-model"
fi
export ANVIL_DATA=$T/data
unset ANVIL_BROKER
trap '"$ANVIL" down --grace 20 >/dev/null 2>&1; rm -rf "$T"' EXIT
P1=$(free_port)
P2=$(free_port)
UP=("$ANVIL" up --gpus none "${MODEL[@]}" --client-endpoint "tcp://127.0.0.1:$P1"
    --worker-endpoint "tcp://127.0.0.1:$P2" --wait 600)
# unique (custom_id, sample) pairs in a results file, and the line count
pairs() { python3 -c 'import json, sys; r = [json.loads(l) for l in open(sys.argv[1])]; print(len(r), len({(x["custom_id"], x["sample"]) for x in r}))' "$1"; }

expect_rc 0 "anvil up" "${UP[@]}"
expect_rc 0 "workers" "$ANVIL" workers --json
check "a gen and an exec worker" test "$(json_eval 'sorted(w["kind"] for w in d if w.get("state") != "dead")' <"$T/last.out")" = "['exec', 'gen']"

# a plain job to the end
for i in $(seq 1 6); do printf '{"custom_id": "q%d", "prompt": "def add_%d(a, b):"}\n' "$i" "$i"; done >"$T/plain.jsonl"
expect_rc 0 "submit plain" "$ANVIL" submit "$T/plain.jsonl" --samples 2 --max-tokens 8 --no-score --name plain --seed 7 --json
PJOB=$(json_eval 'd["job_id"]' <"$T/last.out")
expect_rc 0 "watch to the end" timeout 900 "$ANVIL" watch "$PJOB" --interval 1
contains "done"
expect_rc 0 "results" "$ANVIL" results "$PJOB" --out "$T/plain.out.jsonl"
check "12 results, each once" test "$(pairs "$T/plain.out.jsonl")" = "12 12"
check "fields of a result" python3 -c '
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    assert r["custom_id"].startswith("q") and r["sample"] in (0, 1), r
    assert "text" in r and r["finish_reason"] in ("eos", "stop", "length"), r
    assert r.get("completion_tokens", 0) <= 8, r
' "$T/plain.out.jsonl"
expect_rc 0 "re-submit queues nothing" "$ANVIL" submit "$T/plain.jsonl" --samples 2 --name plain --json
check "same job, 0 accepted" test "$(json_eval 'd["job_id"], d["accepted"]' <"$T/last.out")" = "('$PJOB', 0)"

# OpenAI Batch format
printf '{"custom_id": "o1", "body": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}}\n{"custom_id": "o2", "body": {"messages": [{"role": "user", "content": "yo"}], "max_tokens": 4, "n": 2}}\n' >"$T/openai.jsonl"
expect_rc 0 "submit OpenAI --wait" timeout 900 "$ANVIL" submit "$T/openai.jsonl" --no-score --wait --json
OJOB=$(head -1 "$T/last.out" | json_eval 'd["job_id"]')
expect_rc 0 "OpenAI results" "$ANVIL" results "$OJOB" --out "$T/openai.out.jsonl"
check "3 samples for o1, o2" test "$(python3 -c 'import json,sys; print(sorted(json.loads(l)["custom_id"] for l in open(sys.argv[1])))' "$T/openai.out.jsonl")" = "['o1', 'o2', 'o2']"

# a scored KernelBench job
expect_rc 0 "import" "$ANVIL" import kernelbench "$S/datasets/kernelbench" --level 1 --limit 2 --out "$T/kb.jsonl"
expect_rc 0 "submit scored --wait" timeout 1800 "$ANVIL" submit "$T/kb.jsonl" --samples 2 --max-tokens 32 --wait --json
KJOB=$(head -1 "$T/last.out" | json_eval 'd["job_id"]')
expect_rc 0 "scored results" "$ANVIL" results "$KJOB" --out "$T/kb.out.jsonl"
check "every scored sample has a status" python3 -c '
import json, sys
rs = [json.loads(l) for l in open(sys.argv[1])]
assert len(rs) + sum(1 for _ in open(sys.argv[2])) == 4, len(rs)
for r in rs:
    assert r["score"]["status"] in ("format_error", "rejected_static", "compile_error", "runtime_error", "timeout", "crashed", "incorrect", "correct"), r
' "$T/kb.out.jsonl" "$T/kb.out.errors.jsonl"
expect_rc 0 "retry --failed" "$ANVIL" retry "$KJOB" --failed

# cancel
for i in $(seq 1 40); do printf '{"custom_id": "c%d", "prompt": "long %d"}\n' "$i" "$i"; done >"$T/cancel.jsonl"
expect_rc 0 "submit to cancel" "$ANVIL" submit "$T/cancel.jsonl" --samples 4 --max-tokens 256 --no-score --json
CJOB=$(json_eval 'd["job_id"]' <"$T/last.out")
expect_rc 0 "cancel" "$ANVIL" cancel "$CJOB"
expect_rc 1 "watch a cancelled job" timeout 60 "$ANVIL" watch "$CJOB"
expect_rc 0 "status" "$ANVIL" status "$CJOB" --json
check "cancelled" test "$(json_eval 'd["state"]' <"$T/last.out")" = cancelled

# resume: down + up in the middle of a job; nothing lost or doubled
for i in $(seq 1 10); do printf '{"custom_id": "r%d", "prompt": "resume %d"}\n' "$i" "$i"; done >"$T/resume.jsonl"
expect_rc 0 "submit to resume" "$ANVIL" submit "$T/resume.jsonl" --samples 2 --max-tokens 32 --no-score --json
RJOB=$(json_eval 'd["job_id"]' <"$T/last.out")
sleep 2
expect_rc 0 "down mid-job" "$ANVIL" down
expect_rc 0 "up again" "${UP[@]}"
expect_rc 0 "the job finishes" timeout 900 "$ANVIL" watch "$RJOB" --interval 1
expect_rc 0 "results after resume" "$ANVIL" results "$RJOB" --out "$T/resume.out.jsonl"
check "20 results, each once" test "$(pairs "$T/resume.out.jsonl")" = "20 20"

# results unchanged across a restart
expect_rc 0 "results of the first job again" "$ANVIL" results "$PJOB" --out "$T/plain.again.jsonl"
check "same results after down + up" sh -c "sort '$T/plain.out.jsonl' >'$T/a'; sort '$T/plain.again.jsonl' >'$T/b'; cmp '$T/a' '$T/b'"

PIDS=$(json_eval '" ".join(str(p["pid"]) for p in d["processes"])' <"$ANVIL_DATA/run/cluster.json")
expect_rc 0 "down" "$ANVIL" down
for p in $PIDS; do check "pid $p stopped" gone "$p"; done
done_checks

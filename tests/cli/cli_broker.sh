#!/usr/bin/env bash
# cli_broker.sh - the CLI against the real broker and a real redis-server, no workers:
# `anvil up --no-workers` in a temp dir, then submit (Anvil and OpenAI formats), idempotent
# re-submit by --name, malformed files queuing nothing, status, results of a queued job,
# cancel, watch of a cancelled job, unknown jobs, `anvil down` + `anvil up` keeping the jobs
# (and the idempotency key), and `down` leaving no process behind. Skipped (77) when
# anvil-broker is not built ($ANVIL_BUILD_DIR/broker/anvil-broker, or ANVIL_BROKER_BIN).
. "$(dirname "$0")/lib.sh"
BROKER=${ANVIL_BROKER_BIN:-$B/broker/anvil-broker}
[ -x "$BROKER" ] || { echo "skipped: anvil-broker is not built ($BROKER)"; rm -rf "$T"; exit 77; }
command -v redis-server >/dev/null || { echo "skipped: no redis-server"; rm -rf "$T"; exit 77; }
export ANVIL_DATA=$T/data
unset ANVIL_BROKER
trap '"$ANVIL" down --grace 10 >/dev/null 2>&1; rm -rf "$T"' EXIT
P1=$(free_port)
P2=$(free_port)
UP=("$ANVIL" up --no-workers --broker-bin "$BROKER" --client-endpoint "tcp://127.0.0.1:$P1"
    --worker-endpoint "tcp://127.0.0.1:$P2" --wait 30)

expect_rc 0 "anvil up --no-workers" "${UP[@]}"
contains "local cluster up"
expect_rc 0 "up again is a no-op" "${UP[@]}"
contains "already running"
expect_rc 0 "workers" "$ANVIL" workers
contains "no workers registered"

# malformed files queue nothing
printf '{"custom_id": "a", "prompt": "x"}\n{"custom_id": "b", "prompt": "y"}\n{"custom_id": "c", "messages": "nope"}\n' >"$T/bad.jsonl"
expect_rc 3 "malformed line 3" "$ANVIL" submit "$T/bad.jsonl" --name bad
contains "line 3: 'messages' must be a non-empty list"
"$ANVIL" status --json >"$T/st.json"
check "no job was created" test "$(json_eval 'len(d)' <"$T/st.json")" = 0

# an Anvil job, then the same file and name again: the same job, nothing queued twice
for i in $(seq 1 25); do
    printf '{"custom_id": "p%d", "prompt": "write kernel %d", "n": %d}\n' "$i" "$i" $((i % 3 + 1))
done >"$T/prompts.jsonl"
expect_rc 0 "submit" "$ANVIL" submit "$T/prompts.jsonl" --samples 2 --max-tokens 16 --name run1 --chunk 10 --json
cp "$T/last.out" "$T/sub1.json"
JOB=$(json_eval 'd["job_id"]' <"$T/sub1.json")
check "25 accepted" test "$(json_eval 'd["accepted"]' <"$T/sub1.json")" = 25
check "samples from per-line n" test "$(json_eval 'd["samples"]' <"$T/sub1.json")" = 50
expect_rc 0 "re-submit" "$ANVIL" submit "$T/prompts.jsonl" --samples 2 --name run1 --json
check "same job" test "$(json_eval 'd["job_id"]' <"$T/last.out")" = "$JOB"
check "nothing queued twice" test "$(json_eval 'd["accepted"], d["skipped"], d["existing"]' <"$T/last.out")" = "(0, 25, True)"
# plain output: the job id alone on stdout
JOB_PLAIN=$("$ANVIL" submit "$T/prompts.jsonl" --name run1 2>/dev/null)
check "plain submit prints the job id" test "$JOB_PLAIN" = "$JOB"
expect_rc 0 "status JOB" "$ANVIL" status "$JOB" --json
check "25 tasks queued" test "$(json_eval 'd["tasks"], d["state"], d["name"]' <"$T/last.out")" = "(25, 'queued', 'run1')"
check "50 samples" test "$(json_eval 'd["samples_total"]' <"$T/last.out")" = 50

# OpenAI Batch format
cat >"$T/openai.jsonl" <<'JSONL'
{"custom_id": "req-1", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "x", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}}
{"custom_id": "req-2", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "x", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}], "n": 3}}
JSONL
expect_rc 0 "submit OpenAI format" "$ANVIL" submit "$T/openai.jsonl" --json
OJOB=$(json_eval 'd["job_id"]' <"$T/last.out")
check "detected as openai" test "$(json_eval 'd["format"]' <"$T/last.out")" = openai
expect_rc 0 "status of the OpenAI job" "$ANVIL" status "$OJOB" --json
check "2 tasks, 4 samples" test "$(json_eval 'd["tasks"], d["samples_total"]' <"$T/last.out")" = "(2, 4)"

# results of a job nobody works on: none yet, and no error
expect_rc 0 "results of a queued job" "$ANVIL" results "$JOB" --out "$T/r.jsonl"
check "empty results file" test -e "$T/r.jsonl" -a ! -s "$T/r.jsonl"
check "errors file beside it" test -e "$T/r.errors.jsonl"

# cancel; watching a cancelled job ends at once with exit 1
expect_rc 0 "cancel" "$ANVIL" cancel "$OJOB"
contains "cancelled"
expect_rc 1 "watch a cancelled job" timeout 20 "$ANVIL" watch "$OJOB"
contains "cancelled"
expect_rc 0 "status after cancel" "$ANVIL" status "$OJOB" --json
check "state cancelled" test "$(json_eval 'd["state"]' <"$T/last.out")" = cancelled

# unknown jobs
expect_rc 6 "status of an unknown job" "$ANVIL" status 01ARZ3NDEKTSV4RRFFQ69G5FAV
expect_rc 6 "watch an unknown job" "$ANVIL" watch 01ARZ3NDEKTSV4RRFFQ69G5FAV
expect_rc 6 "results of an unknown job" "$ANVIL" results 01ARZ3NDEKTSV4RRFFQ69G5FAV --out "$T/x.jsonl"
check "no results file for it" test ! -e "$T/x.jsonl"
expect_rc 6 "cancel an unknown job" "$ANVIL" cancel 01ARZ3NDEKTSV4RRFFQ69G5FAV

# down, then up: the jobs are still there, and so is the idempotency key
PIDS=$(json_eval '" ".join(str(p["pid"]) for p in d["processes"])' <"$ANVIL_DATA/run/cluster.json")
expect_rc 0 "down" "$ANVIL" down
check "state file gone" test ! -e "$ANVIL_DATA/run/cluster.json"
for p in $PIDS; do check "pid $p stopped" gone "$p"; done
expect_rc 4 "nothing answers after down" "$ANVIL" status --broker "tcp://127.0.0.1:$P1" --timeout 0.5
expect_rc 0 "up again" "${UP[@]}"
expect_rc 0 "status after restart" "$ANVIL" status --json
check "both jobs survived" test "$(json_eval 'sorted(j["job_id"] for j in d) == sorted(["'$JOB'", "'$OJOB'"])' <"$T/last.out")" = True
expect_rc 0 "status of the first job" "$ANVIL" status "$JOB" --json
check "still 25 tasks, queued" test "$(json_eval 'd["tasks"], d["state"]' <"$T/last.out")" = "(25, 'queued')"
expect_rc 0 "re-submit after restart" "$ANVIL" submit "$T/prompts.jsonl" --name run1 --json
check "same job, nothing queued" test "$(json_eval 'd["job_id"], d["accepted"]' <"$T/last.out")" = "('$JOB', 0)"
expect_rc 0 "down at the end" "$ANVIL" down
done_checks

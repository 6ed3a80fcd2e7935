#!/usr/bin/env bash
# broker_bench.sh - durable end-to-end throughput of anvil-broker with no-op workers on
# loopback, printed beside `redis-benchmark -t set -P 16` on the same machine in the same run.
#
# Redis runs with broker/redis.conf (AOF on, appendfsync everysec) on a private port; two
# no-op gen workers with 1000 slots each. Figures: submit rate (tasks accepted durably),
# end-to-end tasks/s (submit -> every result persisted), idle round trip p50/p99 (submit of a
# one-task job -> status done, the client polling every 2 ms), broker unit round trip p50/p99
# (lease sent -> result received, from the broker's histogram, power-of-two buckets), and
# Redis commands per task (INFO commandstats, commands run inside scripts included).
# Prints figures; asserts nothing about speed. BENCH_TASKS overrides the task count.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=${ANVIL_SOURCE_DIR:-$(cd "$here/../.." && pwd)}
build=${ANVIL_BUILD_DIR:-$src/build}
BROKER=$build/broker/anvil-broker
WORKER=$build/tests/broker/broker_test_worker
CLIENT=$build/tests/broker/broker_test_client
command -v redis-benchmark >/dev/null || { echo "SKIP: no redis-benchmark"; exit 77; }
[ -x "$BROKER" ] || { echo "SKIP: broker not built"; exit 77; }
TASKS=${BENCH_TASKS:-200000}
D=$(mktemp -d /tmp/anvil-broker-bench.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do { kill -9 "$p" && wait "$p"; } 2>/dev/null || true; done
    [ -f "$D/redis.pid" ] && kill -9 "$(cat "$D/redis.pid")" 2>/dev/null || true
    rm -rf "$D"
}
trap cleanup EXIT
port() { echo $(( 20000 + (RANDOM * 32768 + RANDOM) % 40000 )); }
RP=$(port); CP=$(port); WP=$(port)
redis-server "$src/broker/redis.conf" --port "$RP" --dir "$D" --daemonize yes \
    --pidfile "$D/redis.pid" --logfile "$D/redis.log" >/dev/null
for _ in $(seq 1 100); do redis-cli -p "$RP" ping 2>/dev/null | grep -q PONG && break; sleep 0.05; done

echo "== redis-benchmark -t set -P 16 (same machine, same run)"
redis-benchmark -p "$RP" -t set -P 16 -n 1000000 -q | tr '\r' '\n' | grep -E "^SET" | tail -1
redis-cli -p "$RP" flushall >/dev/null
redis-cli -p "$RP" config resetstat >/dev/null

"$BROKER" --redis-url "redis://127.0.0.1:$RP" --client-endpoint "tcp://127.0.0.1:$CP" \
    --worker-endpoint "tcp://127.0.0.1:$WP" --log-level warn >"$D/broker.log" 2>&1 &
pids+=($!)
for w in 1 2; do
    "$WORKER" --endpoint "tcp://127.0.0.1:$WP" --id "bench-$w" --slots 1000 --tokens 4 \
        --log-level warn >"$D/w$w.log" 2>&1 &
    pids+=($!)
done
sleep 1
echo "== anvil broker: $TASKS tasks, 1 sample each, 2 no-op gen workers, AOF everysec"
"$CLIENT" bench --endpoint "tcp://127.0.0.1:$CP" --tasks "$TASKS" --chunk 5000 --latency 500
sleep 1.5 # one metrics publication
stats=$(redis-cli -p "$RP" info commandstats)
calls=$(awk -F'[=,]' '/^cmdstat_/ && !/config|info|hgetall|zrevrange|xrange/{s+=$2} END{print s}' <<<"$stats")
top=$(awk -F'[=,:]' '/^cmdstat_(evalsha|eval)/{s+=$3} END{print s}' <<<"$stats")
total=$((TASKS + 500))
echo "redis commands per task: $(awk -v c="$calls" -v t="$total" 'BEGIN{printf "%.2f", c/t}') (incl. commands inside scripts; $(awk -v c="$top" -v t="$total" 'BEGIN{printf "%.4f", c/t}') EVALSHA round trips per task)"
m() { redis-cli -p "$RP" hget anv:broker:metrics "$1"; }
echo "broker unit round trip (lease sent -> result in): p50 <= $(m unit_rtt_p50_us) us, p99 <= $(m unit_rtt_p99_us) us"
echo "broker counters: dispatched $(m units_dispatched) recorded $(m results_recorded) duplicates $(m results_duplicate) undeliverable $(m units_undeliverable)"

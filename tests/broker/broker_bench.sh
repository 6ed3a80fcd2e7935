#!/usr/bin/env bash
# broker_bench.sh - durable end-to-end throughput of anvil-broker with no-op workers on
# loopback, printed beside `redis-benchmark -t set -P 16` on the same machine in the same run;
# idle dispatch latency; time from a worker's SIGKILL to its units being re-dispatched.
#
# Redis runs with broker/redis.conf (AOF on, appendfsync everysec) on a private port. Phases:
#  1. BENCH_RUNS times (default 3): redis-benchmark -t set -P 16 (on a second redis-server
#     with the same config, so the queue's state is not touched), then one job of BENCH_TASKS
#     (default 200000) one-sample tasks through two no-op gen workers with 1000 slots each:
#     submit rate (accepted durably), end-to-end tasks/s (submit -> every result persisted),
#     the ratio to redis-benchmark's SET/s of that run, and CPU microseconds per task of
#     redis-server, the broker and the workers. A summary gives the spread over the runs.
#  2. Idle dispatch latency: 500 one-task jobs one at a time to one worker; latency = the
#     worker's arrival time of the unit minus the client's time just before sending the
#     submit (same host, CLOCK_MONOTONIC). Also submit -> status done as the client sees it.
#  3. Dead worker: a worker holds 4 units and gets SIGKILL (its connection closes) or SIGSTOP
#     (frozen: only the missing heartbeats tell); time until each unit is dispatched again to
#     a second worker (heartbeat 1 s, dead after 3 misses).
# Redis commands per task (INFO commandstats, commands run inside scripts included) and the
# broker's unit round trip histogram are printed too. Machine load (uptime) before and after.
# Prints figures; asserts nothing about speed (exit 1 only when a phase does not complete).
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
RUNS=${BENCH_RUNS:-3}
LAT_N=${BENCH_LATENCY:-500}
D=$(mktemp -d /tmp/anvil-broker-bench.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do { kill -9 "$p" && wait "$p"; } 2>/dev/null || true; done
    for f in "$D"/redis*.pid; do [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null || true; done
    rm -rf "$D"
}
trap cleanup EXIT
lo=$(awk '{print $1}' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
port() { echo $(( 10000 + (RANDOM * 32768 + RANDOM) % (lo - 10000) )); } # below ephemeral ports
RP=$(port); RP2=$(port); CP=$(port); WP=$(port)
start_redis() { # port name
    mkdir -p "$D/$2"
    redis-server "$src/broker/redis.conf" --port "$1" --dir "$D/$2" --daemonize yes \
        --pidfile "$D/$2.pid" --logfile "$D/$2/redis.log" >/dev/null
    for _ in $(seq 1 100); do redis-cli -p "$1" ping 2>/dev/null | grep -q PONG && return; sleep 0.05; done
    echo "redis on port $1 did not start"; exit 1
}
start_redis "$RP" redis
start_redis "$RP2" redis-peer
cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; } # user+system ticks
tck=$(getconf CLK_TCK)
echo "== machine: $(nproc) cores, load before: $(uptime | sed 's/.*load average: //')"

"$BROKER" --redis-url "redis://127.0.0.1:$RP" --client-endpoint "tcp://127.0.0.1:$CP" \
    --worker-endpoint "tcp://127.0.0.1:$WP" --log-level warn >"$D/broker.log" 2>&1 &
BPID=$!
pids+=($BPID)
WPIDS=()
for w in 1 2; do
    "$WORKER" --endpoint "tcp://127.0.0.1:$WP" --id "bench-$w" --slots 1000 --tokens 4 \
        --log-level warn >"$D/w$w.log" 2>&1 &
    WPIDS+=($!)
    pids+=($!)
done
sleep 1
RPID=$(cat "$D/redis.pid")
redis-cli -p "$RP" config resetstat >/dev/null
echo "== throughput: $RUNS runs of $TASKS tasks, 1 sample each, 2 no-op gen workers, AOF everysec"
rates=() ratios=()
for run in $(seq 1 "$RUNS"); do
    set_rate=$(redis-benchmark -p "$RP2" -t set -P 16 -n 1000000 -q | tr '\r' '\n' |
               awk '/^SET/{r=$2} END{print r}')
    r0=$(cpu "$RPID"); b0=$(cpu "$BPID"); w0=$(( $(cpu "${WPIDS[0]}") + $(cpu "${WPIDS[1]}") ))
    out=$("$CLIENT" bench --endpoint "tcp://127.0.0.1:$CP" --tasks "$TASKS" --chunk 5000) ||
        { echo "$out"; echo "run $run did not complete"; exit 1; }
    r1=$(cpu "$RPID"); b1=$(cpu "$BPID"); w1=$(( $(cpu "${WPIDS[0]}") + $(cpu "${WPIDS[1]}") ))
    sub=$(awk '/^bench submit/{print $5}' <<<"$out" | tr -d '(')
    e2e=$(awk '/^bench end_to_end/{print $6}' <<<"$out")
    us() { awk -v t="$1" -v n="$TASKS" -v k="$tck" 'BEGIN{printf "%.1f", t / k * 1e6 / n}'; }
    ratio=$(awk -v a="$e2e" -v b="$set_rate" 'BEGIN{printf "%.3f", a / b}')
    echo "run $run: redis-benchmark SET -P 16 ${set_rate}/s | anvil end-to-end ${e2e} tasks/s" \
         "(ratio $ratio), submit ${sub} tasks/s | cpu us/task: redis $(us $((r1 - r0)))" \
         "broker $(us $((b1 - b0))) workers $(us $((w1 - w0))) | load $(cut -d' ' -f1 /proc/loadavg)"
    rates+=("$e2e"); ratios+=("$ratio")
done
stats() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END{printf "min %s median %s max %s", v[1], v[int((NR+1)/2)], v[NR]}'; }
echo "summary end-to-end tasks/s: $(stats "${rates[@]}"); ratio to redis-benchmark SET: $(stats "${ratios[@]}")"
sleep 1.5 # one metrics publication
stats_out=$(redis-cli -p "$RP" info commandstats)
calls=$(awk -F'[=,]' '/^cmdstat_/ && !/config|info|hgetall|zrevrange|xrange/{s+=$2} END{print s}' <<<"$stats_out")
top=$(awk -F'[=,:]' '/^cmdstat_(evalsha|eval)/{s+=$3} END{print s}' <<<"$stats_out")
total=$((TASKS * RUNS))
echo "redis commands per task: $(awk -v c="$calls" -v t="$total" 'BEGIN{printf "%.2f", c/t}') (incl. commands inside scripts; $(awk -v c="$top" -v t="$total" 'BEGIN{printf "%.4f", c/t}') EVALSHA round trips per task)"
m() { redis-cli -p "$RP" hget anv:broker:metrics "$1"; }
echo "broker unit round trip (lease sent -> result in): p50 <= $(m unit_rtt_p50_us) us, p99 <= $(m unit_rtt_p99_us) us"
echo "broker counters: dispatched $(m units_dispatched) recorded $(m results_recorded) duplicates $(m results_duplicate) undeliverable $(m units_undeliverable)"

# ---- idle dispatch latency
for p in "${WPIDS[@]}"; do kill -TERM "$p" 2>/dev/null; wait "$p" 2>/dev/null || true; done
"$WORKER" --endpoint "tcp://127.0.0.1:$WP" --id lat --slots 8 --log "$D/lat.units" \
    --log-level warn >"$D/lat.log" 2>&1 &
LPID=$!
pids+=($LPID)
sleep 1
echo "== idle dispatch latency: $LAT_N one-task jobs, one at a time, 1 worker"
"$CLIENT" bench --endpoint "tcp://127.0.0.1:$CP" --tasks 1 --chunk 1 --latency "$LAT_N" \
    --latency-log "$D/lat.submits" | grep idle_roundtrip
awk 'FNR == NR {if ($1 == "submit") t[$2] = $3; next}
     $1 == "unit" && ($3 in t) {d = ($5 - t[$3]) / 1000; if (d >= 0) print d}' \
    "$D/lat.submits" "$D/lat.units" | sort -g >"$D/lat.us"
n=$(wc -l <"$D/lat.us")
[ "$n" -gt 0 ] || { echo "no latency samples"; exit 1; }
pick() { sed -n "$(awk -v n="$n" -v q="$1" 'BEGIN{k=int(n*q); if (k < 1) k = 1; print k}')p" "$D/lat.us"; }
echo "dispatch latency (submit sent -> unit at the worker) n=$n: p50 $(pick 0.5) us, p99 $(pick 0.99) us, max $(tail -1 "$D/lat.us") us"

# ---- dead worker: SIGKILL (the kernel closes its connection) and SIGSTOP (a frozen or
# partitioned host: the connection stays open, only the missing heartbeats tell) -> units
# dispatched again to another worker
dead_worker() { # signal
    local sig=$1 hp job t0
    "$WORKER" --endpoint "tcp://127.0.0.1:$WP" --id "holder-$sig" --slots 4 --sleep-ms 600000 \
        --log "$D/holder-$sig.units" --log-level warn >"$D/holder-$sig.log" 2>&1 &
    hp=$!
    pids+=($hp)
    sleep 1
    job=$("$CLIENT" submit --endpoint "tcp://127.0.0.1:$CP" --tasks 4 | awk '/^job/{print $2}')
    for _ in $(seq 1 200); do
        [ "$(grep -c "^unit" "$D/holder-$sig.units" 2>/dev/null || echo 0)" -ge 4 ] && break
        sleep 0.05
    done
    "$WORKER" --endpoint "tcp://127.0.0.1:$WP" --id "rescuer-$sig" --slots 8 \
        --log "$D/rescuer-$sig.units" --log-level warn >"$D/rescuer-$sig.log" 2>&1 &
    RESCUER=$!
    pids+=($RESCUER)
    sleep 1.5 # registered, idle
    t0=$(date +%s%3N)
    kill -"$sig" "$hp"
    "$CLIENT" wait "$job" --endpoint "tcp://127.0.0.1:$CP" --timeout-s 60 >/dev/null ||
        { echo "job of the $sig worker did not finish"; exit 1; }
    awk -v t0="$t0" -v sig="$sig" '$1 == "unit" {d = $6 - t0; if (!n || d < lo) lo = d; if (d > hi) hi = d; n++}
         END {printf "SIG%s: re-dispatched %d units: first %.2f s, last %.2f s after the signal\n", sig, n, lo / 1000, hi / 1000}' \
        "$D/rescuer-$sig.units"
    kill -9 "$hp" "$RESCUER" 2>/dev/null || true
    wait "$hp" "$RESCUER" 2>/dev/null || true
}
kill -TERM "$LPID" 2>/dev/null || true # the latency worker leaves: only the holder gets work
wait "$LPID" 2>/dev/null || true
echo "== dead worker holding 4 units (heartbeat 1 s, dead after 3 misses)"
dead_worker KILL
dead_worker STOP
echo "== load after: $(uptime | sed 's/.*load average: //')"

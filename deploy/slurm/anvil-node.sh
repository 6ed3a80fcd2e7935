#!/usr/bin/env bash
# anvil-node.sh - one role of an Anvil cluster on one node: what anvil.sbatch starts with srun.
#
#   anvil-node.sh head             redis-server (AOF in $ANVIL_CLUSTER_DIR/redis) + anvil-broker;
#                                  writes $ANVIL_CLUSTER_DIR/cluster.env once the broker answers
#   anvil-node.sh gen | exec       one worker per GPU of this node (or one CPU worker), started
#                                  once cluster.env of this generation is there
#   anvil-node.sh wait-head        waits for cluster.env of this generation
#   anvil-node.sh client ARGS...   runs `anvil ARGS...` against the cluster in cluster.env
#   anvil-node.sh env              prints `export ...` lines for a shell that runs `anvil`
#
# Nothing here needs Slurm: the roles read only the environment below, so the same script runs
# (and is tested, tests/deploy/test_slurm.py) on one machine. Under Slurm anvil.sbatch sets
# ANVIL_GENERATION and ANVIL_HEAD_HOST.
#
# Settings (environment; none of these names is an option of an Anvil binary):
#   ANVIL_HOME          the unpacked bundle (deploy/bundle.sh); default: the bundle holding this
#                       script (share/anvil/slurm/), else /opt/anvil
#   ANVIL_CLUSTER_DIR   a directory every node sees (required): redis/, keys/, logs/, cluster.env
#   ANVIL_GENERATION    this run's token, e.g. JOBID.RESTARTCOUNT: workers only trust a
#                       cluster.env of their own generation (a requeued run may have a new head)
#   ANVIL_HEAD_HOST     the name workers and clients dial (default: hostname)
#   ANVIL_BIND_HOST     the broker's bind address (default 0.0.0.0)
#   ANVIL_HEAD_CLIENT_PORT / _WORKER_PORT / _REDIS_PORT / _METRICS_PORT   5555 / 5556 / 6379 / 9090
#                       (metrics: empty = off); Redis listens on 127.0.0.1 only
#   ANVIL_CURVE         on (default): CURVE keys in $ANVIL_CLUSTER_DIR/keys, made once by the
#                       head with `anvil keys gen`; off: no keys (a non-loopback bind then runs
#                       the broker with --insecure: trusted networks only)
#   ANVIL_MODEL         checkpoint directory for gen workers
#   ANVIL_DEVICE        cuda (default) or cpu
#   ANVIL_NODE_GPUS     GPU indices of this node (default: CUDA_VISIBLE_DEVICES, else nvidia-smi)
#   ANVIL_CPU_WORKERS   workers per node with ANVIL_DEVICE=cpu (default 1)
#   ANVIL_GRACE_S       drain grace of a gen worker on SIGTERM (default 60); keep it below the
#                       warning time of sbatch --signal (120 s in anvil.sbatch)
#   ANVIL_WAIT_S        how long workers wait for the head (default 900)
#   ANVIL_PYTHON        exec workers: an interpreter with torch and triton (default python3)
#   ANVIL_BROKER_ARGS / ANVIL_GEN_ARGS / ANVIL_EXEC_ARGS   extra flags (split on spaces)
#
# Signals: SIGTERM/SIGINT drain. A worker role forwards the signal to its workers (they finish
# or hand back their leases, then DISCONNECT) and exits with the worst of their exit statuses.
# The head waits until no worker is registered (at most ANVIL_GRACE_S + 30 s), then stops the
# broker and shuts Redis down (SHUTDOWN writes the AOF out), and exits 0. A requeued run
# starts the head on the same redis/ directory: the broker rebuilds its state from Redis and
# re-dispatches the leases that expired.
set -uo pipefail

die() { echo "anvil-node.sh: $*" >&2; exit 1; }
log() { echo "$(date -u +%FT%TZ) anvil-node.sh[$role]: $*" >&2; }

role=${1:-}
[ -n "$role" ] || die "usage: anvil-node.sh head|gen|exec|wait-head|client ARGS|env"
shift

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ -z "${ANVIL_HOME:-}" ]; then
    if [ -x "$here/../../../bin/anvil" ]; then
        ANVIL_HOME=$(cd "$here/../../.." && pwd)
    else
        ANVIL_HOME=/opt/anvil
    fi
fi
bin=$ANVIL_HOME/bin
[ -x "$bin/anvil" ] || die "no bundle at ANVIL_HOME=$ANVIL_HOME ($bin/anvil is missing)"
dir=${ANVIL_CLUSTER_DIR:?set ANVIL_CLUSTER_DIR to a directory every node sees}
gen=${ANVIL_GENERATION:-${SLURM_JOB_ID:-local}.${SLURM_RESTART_COUNT:-0}}
host=${ANVIL_HEAD_HOST:-$(hostname)}
bind=${ANVIL_BIND_HOST:-0.0.0.0}
cport=${ANVIL_HEAD_CLIENT_PORT:-5555}
wport=${ANVIL_HEAD_WORKER_PORT:-5556}
rport=${ANVIL_HEAD_REDIS_PORT:-6379}
mport=${ANVIL_HEAD_METRICS_PORT-9090}
curve=${ANVIL_CURVE:-on}
grace_s=${ANVIL_GRACE_S:-60}
wait_s=${ANVIL_WAIT_S:-900}
env_file=$dir/cluster.env
keys=$dir/keys
logs=$dir/logs/$gen
case "$curve" in on | off) ;; *) die "ANVIL_CURVE must be on or off, not '$curve'" ;; esac

# -- the shared file -------------------------------------------------------------------------
# KEY=VALUE lines, values quoted for the shell (printf %q): `. cluster.env` works, and so does
# any parser that undoes shell quoting (tests/deploy/test_slurm.py uses shlex).
read_env() {
    [ -f "$env_file" ] || return 1
    # shellcheck disable=SC1090
    . "$env_file" || return 1
    [ "${ANVIL_CLUSTER_GENERATION:-}" = "$gen" ]
}

wait_head() {
    local deadline=$((SECONDS + wait_s))
    until read_env; do
        [ $SECONDS -lt "$deadline" ] || die "no cluster.env of generation $gen in $dir after ${wait_s}s"
        sleep 1
    done
}

# CLI flags that reach the broker's client socket
client_flags() {
    printf '%s\n' --broker "$ANVIL_CLUSTER_CLIENT_ENDPOINT"
    if [ -n "$ANVIL_CLUSTER_SERVER_KEY" ]; then
        printf '%s\n' --curve-secret "$keys/client/client.key_secret" \
            --curve-server "$ANVIL_CLUSTER_SERVER_KEY"
    fi
}

# The public key's text from a CZMQ certificate file (public-key = "...")
public_key() { sed -n 's/^[[:space:]]*public-key[[:space:]]*=[[:space:]]*"\(.*\)"[[:space:]]*$/\1/p' "$1"; }

# -- head -----------------------------------------------------------------------------------
make_keys() {
    # once per cluster directory: a requeued run reuses them, so do the workers' and clients'
    # copies. broker/ holds the server's secret; allow/ the public keys it accepts.
    [ -f "$keys/broker/broker.key_secret" ] && return 0
    umask 077
    mkdir -p "$keys/broker" "$keys/worker" "$keys/client" "$keys/allow" || return 1
    local k
    for k in broker worker client; do
        if ! "$bin/anvil" keys gen --out "$keys/$k" --name "$k"; then
            rm -rf "$keys/broker"
            die "anvil keys gen failed: CURVE keys are needed (ANVIL_CURVE=off runs without them)"
        fi
    done
    cp "$keys/worker/worker.key" "$keys/client/client.key" "$keys/allow/"
    log "CURVE keys made in $keys"
}

start_redis() {
    "$bin/redis-server" "$ANVIL_HOME/share/anvil/redis.conf" --dir "$dir/redis" \
        --bind 127.0.0.1 --port "$rport" --daemonize no --logfile "$logs/redis.log" &
    redis_pid=$!
    local deadline=$((SECONDS + ${ANVIL_REDIS_LOAD_S:-600})) # loading a large AOF takes a while
    until [ "$("$bin/redis-cli" -p "$rport" ping 2>/dev/null)" = PONG ]; do
        kill -0 "$redis_pid" 2>/dev/null || { log "redis-server exited (see $logs/redis.log)"; return 1; }
        [ $SECONDS -lt "$deadline" ] || { log "redis-server not ready"; return 1; }
        sleep 0.2
    done
    # the PONG must be ours: another server on the port (a head left behind) is refused
    local pid
    pid=$("$bin/redis-cli" -p "$rport" info server 2>/dev/null | tr -d '\r' | sed -n 's/^process_id://p')
    if [ "$pid" != "$redis_pid" ]; then
        log "port $rport is served by another redis-server (pid ${pid:-?}): is another head running?"
        kill -TERM "$redis_pid" 2>/dev/null
        return 1
    fi
}

start_broker() {
    local args=(--redis-url "redis://127.0.0.1:$rport"
        --client-endpoint "tcp://$bind:$cport" --worker-endpoint "tcp://$bind:$wport")
    [ -n "$mport" ] && args+=(--metrics-endpoint "$bind:$mport")
    if [ "$curve" = on ]; then
        args+=(--curve-secret "$keys/broker/broker.key_secret" --curve-allow "$keys/allow")
    else
        case "$bind" in 127.* | localhost) ;; *) args+=(--insecure) ;; esac
    fi
    # shellcheck disable=SC2206
    args+=(${ANVIL_BROKER_ARGS:-})
    "$bin/anvil-broker" "${args[@]}" 2>>"$logs/broker.log" &
    broker_pid=$!
}

# Waits until the broker answers a client request (anvil workers).
broker_answers() {
    local deadline=$((SECONDS + 60))
    local flags
    mapfile -t flags < <(client_flags)
    until "$bin/anvil" workers "${flags[@]}" --timeout 2 >/dev/null 2>&1; do
        kill -0 "$broker_pid" 2>/dev/null || { log "the broker exited (see $logs/broker.log)"; return 1; }
        [ $SECONDS -lt "$deadline" ] || { log "the broker does not answer"; return 1; }
        sleep 0.5
    done
}

write_env() {
    local server_key="" server_public=""
    if [ "$curve" = on ]; then
        server_key=$keys/broker/broker.key
        server_public=$(public_key "$server_key")
    fi
    {
        printf 'ANVIL_CLUSTER_GENERATION=%q\n' "$gen"
        printf 'ANVIL_CLUSTER_HEAD=%q\n' "$host"
        printf 'ANVIL_CLUSTER_CLIENT_ENDPOINT=%q\n' "tcp://$host:$cport"
        printf 'ANVIL_CLUSTER_WORKER_ENDPOINT=%q\n' "tcp://$host:$wport"
        printf 'ANVIL_CLUSTER_METRICS=%q\n' "${mport:+http://$host:$mport/}"
        printf 'ANVIL_CLUSTER_SERVER_KEY=%q\n' "$server_key"
        printf 'ANVIL_CLUSTER_SERVER_PUBLIC=%q\n' "$server_public"
    } >"$env_file.tmp.$$" && mv -f "$env_file.tmp.$$" "$env_file"
}

# Number of workers still registered (not dead), or empty when the broker does not answer.
live_workers() {
    local flags out
    mapfile -t flags < <(client_flags)
    out=$("$bin/anvil" workers "${flags[@]}" --json --timeout 5 2>/dev/null) || return 0
    grep -o '"state": *"[a-z]*"' <<<"$out" | grep -vc '"dead"'
}

head_role() {
    mkdir -p "$dir/redis" "$logs" || die "cannot create $dir/redis and $logs"
    [ "$curve" = on ] && make_keys
    stop=0
    trap 'stop=1' TERM INT
    start_redis || exit 1
    start_broker
    ANVIL_CLUSTER_CLIENT_ENDPOINT="tcp://127.0.0.1:$cport"
    ANVIL_CLUSTER_SERVER_KEY=""
    [ "$curve" = on ] && ANVIL_CLUSTER_SERVER_KEY=$keys/broker/broker.key
    broker_answers || { kill -TERM "$broker_pid" "$redis_pid" 2>/dev/null; exit 1; }
    write_env
    log "head up: clients tcp://$host:$cport, workers tcp://$host:$wport, generation $gen (CURVE $curve)"
    local restarts=0
    while [ $stop -eq 0 ]; do
        sleep 1 &
        wait $! 2>/dev/null
        [ $stop -eq 0 ] || break
        if ! kill -0 "$redis_pid" 2>/dev/null; then
            restarts=$((restarts + 1))
            log "redis-server exited: restarting it (restart $restarts)"
            start_redis || exit 1
        fi
        if ! kill -0 "$broker_pid" 2>/dev/null; then
            wait "$broker_pid"
            local brc=$?
            restarts=$((restarts + 1))
            log "the broker exited ($brc): restarting it from Redis (restart $restarts)"
            start_broker
        fi
        [ $restarts -le 10 ] || { log "too many restarts"; stop=1; }
    done
    log "draining: waiting up to $((grace_s + 30))s for the workers to leave"
    local deadline=$((SECONDS + grace_s + 30)) n
    while [ $SECONDS -lt $deadline ]; do
        # preemption signals every process at once: the broker may be gone already
        kill -0 "$broker_pid" 2>/dev/null || { n="broker gone"; break; }
        n=$(live_workers)
        [ "$n" = 0 ] && break
        sleep 1
    done
    log "stopping the broker (workers still registered: ${n:-unknown})"
    kill -TERM "$broker_pid" 2>/dev/null
    wait "$broker_pid"
    local brc=$?
    "$bin/redis-cli" -p "$rport" shutdown >/dev/null 2>&1
    wait "$redis_pid"
    log "drained: broker exited $brc, redis-server stopped (AOF in $dir/redis)"
    exit 0
}

# -- workers --------------------------------------------------------------------------------
gpu_list() {
    local list=${ANVIL_NODE_GPUS:-${CUDA_VISIBLE_DEVICES:-}} g
    if [ -z "$list" ]; then
        command -v nvidia-smi >/dev/null || return 0
        list=$(nvidia-smi --query-gpu=index --format=csv,noheader | paste -sd, -)
    fi
    for g in ${list//,/ }; do
        case "$g" in
        *[!0-9]*) # a UUID (some Slurm setups): its index on this host
            nvidia-smi --query-gpu=index,uuid --format=csv,noheader | awk -F', ' -v u="$g" '$2 == u {print $1}' ;;
        *) echo "$g" ;;
        esac
    done
}

worker_role() {
    local kind=$1
    mkdir -p "$logs" "$dir/run" || die "cannot create $logs"
    wait_head
    local node task
    node=$(hostname)
    task=${SLURM_PROCID:-0}
    local common=(--broker "$ANVIL_CLUSTER_WORKER_ENDPOINT")
    if [ -n "$ANVIL_CLUSTER_SERVER_KEY" ]; then
        common+=(--curve-secret "$keys/worker/worker.key_secret" --curve-server "$ANVIL_CLUSTER_SERVER_KEY")
    fi
    local slots=()
    if [ "${ANVIL_DEVICE:-cuda}" = cpu ]; then
        for ((i = 0; i < ${ANVIL_CPU_WORKERS:-1}; i++)); do slots+=("cpu$i"); done
    else
        mapfile -t slots < <(gpu_list)
        [ ${#slots[@]} -gt 0 ] || die "no GPU on $node (ANVIL_DEVICE=cpu runs CPU workers)"
    fi
    # CUDA_VISIBLE_DEVICES is per worker from here on (and never seen by the exec worker: its
    # sandbox binds /dev/nvidiaN and sets it for the candidate itself)
    unset CUDA_VISIBLE_DEVICES
    local pids=() names=() s id args
    for s in "${slots[@]}"; do
        id=$node-$kind-$s
        args=("${common[@]}" --worker-id "$id" --ready-file "$dir/run/$gen.$id.ready")
        if [ "$kind" = gen ]; then
            [ -n "${ANVIL_MODEL:-}" ] || die "set ANVIL_MODEL to the checkpoint directory"
            args+=(--model "$ANVIL_MODEL" --grace-ms $((grace_s * 1000)))
            # shellcheck disable=SC2206
            args+=(${ANVIL_GEN_ARGS:-})
            if [ "${s#cpu}" != "$s" ]; then
                "$bin/anvil-gen-worker" "${args[@]}" --backend cpu --gpu -1 2>>"$logs/$id.log" &
            else
                CUDA_VISIBLE_DEVICES=$s "$bin/anvil-gen-worker" "${args[@]}" --backend cuda --gpu 0 \
                    2>>"$logs/$id.log" &
            fi
        else
            local bwrap=/usr/bin/bwrap
            [ -x "$bwrap" ] || bwrap=$bin/bwrap
            export ANVIL_PYTHON=${ANVIL_PYTHON:-$(command -v python3)}
            args+=(--harness-dir "$ANVIL_HOME/exec_worker/harness" --bwrap "$bwrap")
            if [ "${s#cpu}" != "$s" ]; then
                args+=(--device cpu)
            else
                args+=(--device cuda --gpu "$s")
            fi
            # shellcheck disable=SC2206
            args+=(${ANVIL_EXEC_ARGS:-})
            "$bin/anvil-exec-worker" "${args[@]}" 2>>"$logs/$id.log" &
        fi
        pids+=($!)
        names+=("$id")
    done
    log "task $task on $node: ${#pids[@]} $kind workers (${names[*]}), logs in $logs"
    local stopping=0
    trap 'stopping=1; log "signal: draining ${#pids[@]} workers"; kill -TERM "${pids[@]}" 2>/dev/null' TERM INT
    local worst=0 rc i
    for i in "${!pids[@]}"; do
        # wait returns early when a trapped signal arrives: wait again until the worker is gone
        while :; do
            wait "${pids[$i]}"
            rc=$?
            kill -0 "${pids[$i]}" 2>/dev/null || break
        done
        log "${names[$i]} exited $rc"
        [ $rc -gt $worst ] && worst=$rc
    done
    [ $stopping -eq 1 ] && log "drained"
    exit $worst
}

case "$role" in
head) head_role ;;
gen | exec) worker_role "$role" ;;
wait-head) wait_head ;;
client)
    wait_head
    mapfile -t flags < <(client_flags)
    exec "$bin/anvil" "$@" "${flags[@]}"
    ;;
env)
    wait_head
    printf 'export ANVIL_BROKER=%q\n' "$ANVIL_CLUSTER_CLIENT_ENDPOINT"
    if [ -n "$ANVIL_CLUSTER_SERVER_KEY" ]; then
        printf 'export ANVIL_CURVE_SECRET=%q ANVIL_CURVE_SERVER=%q\n' \
            "$keys/client/client.key_secret" "$ANVIL_CLUSTER_SERVER_KEY"
    fi
    ;;
*) die "unknown role '$role' (head|gen|exec|wait-head|client|env)" ;;
esac

#!/usr/bin/env bash
# redis-server.sh - start or stop a private redis-server for tests.
#
#   redis-server.sh start DIR [PORT]  starts redis-server on a free loopback port (or on PORT:
#                               a restart after a crash, so clients find it again) with its data
#                               (AOF on) in DIR, waits until it answers PING (and has loaded its
#                               AOF), writes DIR/url ("redis://127.0.0.1:PORT"), DIR/port and
#                               DIR/redis.pid
#   redis-server.sh stop DIR    stops the server started in DIR (SHUTDOWN NOSAVE, then SIGKILL)
#
# ANVIL_REDIS_APPENDFSYNC sets appendfsync (default everysec; `always` for tests that SIGKILL
# Redis and need every acknowledged write to survive, see broker/README.md "Durability").
#
# Used by the CTest fixture "redis" (tests/CMakeLists.txt) and by any test that needs a server
# of its own (restart tests, chaos tests, pytest fixtures).
set -euo pipefail
cmd=${1:?usage: redis-server.sh start|stop DIR}
dir=${2:?usage: redis-server.sh start|stop DIR}
fixed_port=${3:-}
fsync=${ANVIL_REDIS_APPENDFSYNC:-everysec}
server=${REDIS_SERVER:-$(command -v redis-server || echo /usr/bin/redis-server)}

case "$cmd" in
start)
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    for attempt in $(seq 1 20); do
        port=${fixed_port:-$(( 20000 + (RANDOM * 32768 + RANDOM) % 40000 ))}
        "$server" --port "$port" --bind 127.0.0.1 --dir "$dir" --appendonly yes \
            --appendfsync "$fsync" --save '' --daemonize yes --pidfile "$dir/redis.pid" \
            --logfile "$dir/redis.log" --protected-mode yes >/dev/null 2>&1 || continue
        for _ in $(seq 1 100); do
            if redis-cli -p "$port" ping 2>/dev/null | grep -q PONG &&
                redis-cli -p "$port" info persistence 2>/dev/null | grep -q '^loading:0'; then
                echo "$port" >"$dir/port"
                echo "redis://127.0.0.1:$port" >"$dir/url"
                echo "redis://127.0.0.1:$port"
                exit 0
            fi
            [ -s "$dir/redis.pid" ] && ! kill -0 "$(cat "$dir/redis.pid")" 2>/dev/null && break
            sleep 0.05
        done
        [ -s "$dir/redis.pid" ] && kill -9 "$(cat "$dir/redis.pid")" 2>/dev/null || true
        rm -f "$dir/redis.pid"
        [ -n "$fixed_port" ] && sleep 0.2 # the same port again: give a dying server time to go
    done
    echo "redis-server.sh: could not start $server in $dir (see $dir/redis.log)" >&2
    exit 1
    ;;
stop)
    [ -f "$dir/port" ] && redis-cli -p "$(cat "$dir/port")" shutdown nosave >/dev/null 2>&1 || true
    if [ -f "$dir/redis.pid" ]; then
        pid=$(cat "$dir/redis.pid")
        for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
        kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$dir/redis.pid" "$dir/port" "$dir/url"
    ;;
*)
    echo "usage: redis-server.sh start|stop DIR" >&2
    exit 2
    ;;
esac

#!/usr/bin/env bash
# cli_up_failure.sh - `anvil up` refusing or failing cleanly, with a real redis-server:
# missing binaries start nothing; a broker that dies during start-up makes `up` stop the Redis
# it had started, remove its state file and say which process died, with its log; `down` of a
# directory with no cluster is a no-op. (A crashing broker is played by /bin/false.)
. "$(dirname "$0")/lib.sh"
trap 'rm -rf "$T"' EXIT
REDIS=$(command -v redis-server || true)
[ -n "$REDIS" ] || { echo "skipped: redis-server is not installed"; exit 77; }
FALSE=$(type -P false)

# 1. binaries missing: nothing starts
expect_rc 7 "up without a broker binary" "$ANVIL" up --data "$T/d1" --gpus none \
    --broker-bin "$T/no-such-broker" --gen-worker-bin "$FALSE" --exec-worker-bin "$FALSE"
contains "anvil-broker not found"
contains "nothing was started"
check "no state file" test ! -e "$T/d1/run/cluster.json"
check "no redis was started" test ! -e "$T/d1/logs/redis.log"

# 2. no model and no random-model tool: says what is missing, starts nothing
expect_rc 7 "up without a model" "$ANVIL" up --data "$T/d2" --gpus none --broker-bin "$FALSE" \
    --gen-worker-bin "$FALSE" --exec-worker-bin "$FALSE" --make-model "$T/no-tool"
contains "no model to run"
contains "anvil-make-model"
check "still no redis" test ! -e "$T/d2/logs/redis.log"

# 3. a broker that dies at start-up: what was started is stopped again
mkdir -p "$T/model" && echo '{}' >"$T/model/config.json"
P=$(free_port)
expect_rc 7 "up with a dying broker" "$ANVIL" up --data "$T/d3" --gpus none --model "$T/model" \
    --broker-bin "$FALSE" --gen-worker-bin "$FALSE" --exec-worker-bin "$FALSE" \
    --client-endpoint "tcp://127.0.0.1:$P" --wait 20 --grace 5
contains "exited during start-up"
contains "stopping what was started"
check "redis had started (AOF on)" grep -q "Ready to accept connections" "$T/d3/logs/redis.log"
check "state file removed" test ! -e "$T/d3/run/cluster.json"
RPID=$(sed -n 's/^\([0-9]*\):M .*Ready to accept connections.*/\1/p' "$T/d3/logs/redis.log" | tail -1)
check "redis pid in its log" test -n "$RPID"
check "redis stopped again" gone "$RPID"
check "redis shut down cleanly" grep -q "ready to exit, bye bye" "$T/d3/logs/redis.log"

# 4. down of nothing; the lock is released after each command
expect_rc 0 "down with no cluster" "$ANVIL" down --data "$T/d3"
contains "no local cluster"
done_checks

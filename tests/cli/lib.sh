# lib.sh - helpers for the shell tests of the anvil CLI (sourced, not run).
#
# Sets B (build dir), S (shared dir), ANVIL (the binary), T (a private temp dir removed at exit)
# and counts checks: `check DESCRIPTION COMMAND...` runs COMMAND and fails the test (exit 1,
# printing DESCRIPTION and the command's output) when it fails; `done_checks` prints the count.
set -uo pipefail
B=${ANVIL_BUILD_DIR:-$(cd "$(dirname "$0")/../.." && pwd)/build}
S=${ANVIL_SHARED_DIR:-$(cd "$(dirname "$0")/../../.." && pwd)/shared}
ANVIL=$B/cli/anvil
T=$(mktemp -d "${TMPDIR:-/tmp}/anvil-cli-test.XXXXXX")
CHECKS=0
[ -x "$ANVIL" ] || { echo "skipped: $ANVIL is not built"; exit 77; }

fail() {
    echo "FAIL: $*"
    exit 1
}

# check DESCRIPTION CMD...: CMD must succeed
check() {
    local what=$1
    shift
    if ! "$@" >"$T/check.out" 2>&1; then
        echo "FAIL: $what"
        echo "  command: $*"
        sed 's/^/  | /' "$T/check.out" | tail -40
        exit 1
    fi
    CHECKS=$((CHECKS + 1))
}

# expect_rc CODE DESCRIPTION CMD...: CMD must exit with CODE; its stdout in $T/last.out, its
# stderr in $T/last.err
expect_rc() {
    local want=$1 what=$2
    shift 2
    "$@" >"$T/last.out" 2>"$T/last.err"
    local rc=$?
    if [ "$rc" != "$want" ]; then
        echo "FAIL: $what: exit $rc, expected $want"
        echo "  command: $*"
        cat "$T/last.out" "$T/last.err" | sed 's/^/  | /' | tail -40
        exit 1
    fi
    CHECKS=$((CHECKS + 1))
}

# contains TEXT: the last expect_rc output (stdout or stderr) must contain TEXT
contains() {
    grep -qF -- "$1" "$T/last.out" "$T/last.err" || {
        echo "FAIL: output does not contain '$1':"
        cat "$T/last.out" "$T/last.err" | sed 's/^/  | /' | tail -40
        exit 1
    }
    CHECKS=$((CHECKS + 1))
}

# free_port: a free loopback port not handed out before in this test ($T/ports lists those
# given: two binds in a row can get the same ephemeral port once the first is closed)
free_port() {
    python3 - "$T/ports" <<'PY'
import os, socket, sys
given = set(open(sys.argv[1]).read().split()) if os.path.exists(sys.argv[1]) else set()
while True:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    if port not in given:
        break
with open(sys.argv[1], "a") as f:
    f.write(port + "\n")
print(port)
PY
}

# jq-like: json_eval EXPR < file (d is the parsed document)
json_eval() {
    python3 -c 'import json, sys; d = json.load(sys.stdin); print(eval(sys.argv[1]))' "$1"
}

done_checks() {
    echo "$(basename "$0"): $CHECKS checks passed"
}

# gone PID: the process has exited (a zombie waiting for its reaper counts as exited)
gone() {
    ! kill -0 "$1" 2>/dev/null && return 0
    case "$(ps -o stat= -p "$1" 2>/dev/null)" in Z*) return 0 ;; esac
    return 1
}

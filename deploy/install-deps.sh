#!/usr/bin/env bash
# install-deps.sh - install every build and run dependency of Anvil on Debian or Ubuntu.
#
# Idempotent and quiet when everything is there: Debian packages are checked with dpkg-query
# and only the missing ones are installed; the Python venv (<repo>/.venv) is rebuilt only when
# deploy/requirements.txt changed since the last successful install (a hash stamp in the venv).
# Needs root (or sudo) for apt-get. Options: --no-python skips the venv.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
want_python=1
[ "${1:-}" = "--no-python" ] && want_python=0

pkgs=(build-essential cmake pkg-config git ca-certificates
      libzmq3-dev libczmq-dev libsodium-dev libprotobuf-c-dev protobuf-c-compiler libhiredis-dev
      redis-server redis-tools libcjson-dev libpcre2-dev libseccomp-dev bubblewrap
      libmicrohttpd-dev libcmocka-dev clang libclang-rt-dev chromium curl shellcheck
      python3 python3-venv python3-dev procps psmisc)

missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "install-deps: installing ${missing[*]}"
    sudo=""
    [ "$(id -u)" -ne 0 ] && sudo=sudo
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The Debian redis-server package starts a system server on 6379; Anvil never uses it (every
# cluster and test starts its own on its own port), so it is left as the distribution set it.

if [ $want_python -eq 1 ]; then
    venv="$repo/.venv"
    stamp="$venv/.anvil-requirements.sha256"
    sum=$(sha256sum "$here/requirements.txt" | cut -d' ' -f1)
    if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$sum" ]; then
        echo "install-deps: setting up the Python venv in $venv"
        [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
        "$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
        "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$here/requirements.txt"
        echo "$sum" >"$stamp"
    fi
fi

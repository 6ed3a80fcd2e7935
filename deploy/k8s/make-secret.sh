#!/usr/bin/env bash
# make-secret.sh - the CURVE keys of a Kubernetes Anvil cluster, and the Secret anvil-curve.
#
#   deploy/k8s/make-secret.sh OUT_DIR [ANVIL_BINARY]
#
# Makes broker, worker and client key pairs with `anvil keys gen` in OUT_DIR (mode 0700) and
# writes OUT_DIR/anvil-curve.secret.yaml: the broker's pair, the workers' pair and the client's
# public key (the broker's allow-list holds the worker and client public keys). The client's
# secret key stays in OUT_DIR, with you:
#   kubectl apply -f OUT_DIR/anvil-curve.secret.yaml
#   anvil status --broker tcp://BROKER:5555 --curve-secret OUT_DIR/client.key_secret \
#       --curve-server OUT_DIR/broker.key
set -euo pipefail
out=${1:?usage: make-secret.sh OUT_DIR [ANVIL_BINARY]}
anvil=${2:-anvil}
umask 077
mkdir -p "$out"
for name in broker worker client; do
    [ -f "$out/$name.key_secret" ] || "$anvil" keys gen --out "$out" --name "$name"
done
{
    printf 'apiVersion: v1\nkind: Secret\nmetadata:\n  name: anvil-curve\n'
    printf '  labels: {app.kubernetes.io/name: anvil}\ntype: Opaque\ndata:\n'
    for f in broker.key broker.key_secret worker.key worker.key_secret client.key; do
        printf '  %s: %s\n' "$f" "$(base64 -w0 <"$out/$f")"
    done
} >"$out/anvil-curve.secret.yaml"
echo "make-secret.sh: $out/anvil-curve.secret.yaml (apply it; keep $out/client.key_secret)"

# gen_common.sh - sourced by generate_graphs.sh and generate_groups.sh (anvil-generate on a
# small random checkpoint): gen_setup TINY_MODEL_ARGS... sets backend (BACKEND, default cuda),
# src and py (the repo's venv python, else python3; ANVIL_PYTHON overrides), exits 77 without a
# GPU (backend cuda) or without torch / transformers / tokenizers, and makes $tmp/model with
# tiny_model.py in a temporary folder tmp, removed on exit.
gen_setup() {
    backend=${BACKEND:-cuda}
    src=${ANVIL_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
    py=${ANVIL_PYTHON:-}
    [ -n "$py" ] || py=$( [ -x "$src/.venv/bin/python" ] && echo "$src/.venv/bin/python" || command -v python3)
    if [ "$backend" = cuda ] && { ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; }; then
        echo "SKIP: no GPU visible"; exit 77
    fi
    if ! "$py" -c "import torch, transformers, tokenizers" 2>/dev/null; then
        echo "SKIP: no torch/transformers/tokenizers for $py"; exit 77
    fi
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    "$py" "$src/gen_worker/engine/tools/tiny_model.py" "$tmp/model" "$@" >/dev/null ||
        { echo "FAIL: cannot make the model"; exit 1; }
}

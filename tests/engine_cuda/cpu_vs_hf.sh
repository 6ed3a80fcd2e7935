#!/bin/bash
# cpu_vs_hf.sh - hf_compare.py on the CPU reference backend with a small config (no GPU).
# Usage: cpu_vs_hf.sh PATH/eng_cuda_hfcheck. Uses the repository's .venv python when present.
py=${ANVIL_SOURCE_DIR:-.}/.venv/bin/python
[ -x "$py" ] || py=python3
ECU_BACKEND=cpu HF_COMPARE_DEVICE=cpu HF_COMPARE_SMALL=1 exec "$py" \
    "$(dirname "$0")/hf_compare.py" "$1" 16

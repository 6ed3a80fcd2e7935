#!/bin/bash
# generate_graphs.sh - anvil-generate on the cuda backend with --cuda-graphs (the default) and
# with --no-cuda-graphs.
#
# Usage: generate_graphs.sh PATH/anvil-generate. Makes a small random Llama checkpoint
# (tiny_model.py, head_dim 64 as the CUDA attention wants), then for 1, 3 and 16 prompts
# generates 64 greedy tokens each (ignore-eos) twice and requires identical token ids.
# Exit 77 without a GPU or without torch. BACKEND=cpu runs the same script on the CPU (the flags
# are then ignored): how the script itself is checked without a GPU.
set -u
gen=$1
. "$(dirname "$0")/gen_common.sh"
gen_setup --layers 2 --hidden 256 --heads 4 --kv-heads 2 --ffn 512
fail=0
for n in 1 3 16; do
    : > "$tmp/p$n.jsonl"
    for i in $(seq 1 $n); do
        printf '{"id": "p%d", "prompt": "def kernel_%d(x):\\n    return x * %d"}\n' $i $i $i \
            >> "$tmp/p$n.jsonl"
    done
    for g in off on; do
        flag=--no-cuda-graphs; [ $g = on ] && flag=--cuda-graphs
        "$gen" --model "$tmp/model" --backend "$backend" --prompts "$tmp/p$n.jsonl" --max-tokens 64 \
            --temperature 0 --ignore-eos --json $flag > "$tmp/out_${n}_${g}.jsonl" 2> "$tmp/err_${n}_${g}" \
            || { echo "FAIL: batch $n graphs $g: anvil-generate failed"; cat "$tmp/err_${n}_${g}"; fail=1; }
        "$py" -c "import json,sys; [print(d['id'], d['token_ids']) for d in sorted((json.loads(l) for l in open(sys.argv[1])), key=lambda d: d['id'])]" \
            "$tmp/out_${n}_${g}.jsonl" > "$tmp/tok_${n}_$g" || fail=1
    done
    lines=$(wc -l < "$tmp/tok_${n}_off")
    if [ "$lines" -eq "$n" ] && cmp -s "$tmp/tok_${n}_off" "$tmp/tok_${n}_on"; then
        echo "ok   batch $n: 64 greedy tokens identical with and without graphs"
    else
        echo "FAIL batch $n: tokens differ with graphs (or missing samples: $lines of $n)"
        diff "$tmp/tok_${n}_off" "$tmp/tok_${n}_on" | head -5
        fail=1
    fi
done
exit $fail

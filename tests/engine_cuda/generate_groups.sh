#!/bin/bash
# generate_groups.sh - the engine's n samples of a prompt with the attention's group tiles and
# without (ANVIL_CUDA_ATTN_GROUP=0): the same tokens and logprobs, bit for bit.
#
# Usage: generate_groups.sh PATH/anvil-generate. Makes a small random Llama checkpoint
# (tiny_model.py: 8 query heads on 2 KV heads, head_dim 64, so the tensor-core decode and its
# group tiles apply), then samples 8 completions of 48 tokens (temperature 1, seeded) for each
# of 3 prompts of about 400 tokens, whose samples share their prompt's cache blocks; with and
# without --cuda-graphs, each with the group tiles on and off. The JSON lines (token ids and
# logprobs of every sample) must be identical, and the runs with them on must log plans that
# had group tiles. Exit 77 without a GPU or without torch. BACKEND=cpu runs the same script on
# the CPU (no group tiles there: only the outputs are compared), how the script itself is
# checked without a GPU.
set -u
gen=$1
. "$(dirname "$0")/gen_common.sh"
gen_setup --layers 2 --hidden 512 --heads 8 --kv-heads 2 --ffn 1024
"$py" - "$tmp/prompts.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(3):
        body = "".join(f"    y{j} = x * {j + i} + {j * j}\n" for j in range(40))
        f.write(json.dumps({"id": f"p{i}", "prompt": f"def kernel_{i}(x):\n{body}    return y"}) + "\n")
PY
fail=0
for g in off on; do
    flag=--no-cuda-graphs; [ $g = on ] && flag=--cuda-graphs
    for grp in 1 0; do
        out="$tmp/out_${g}_$grp"
        ANVIL_CUDA_ATTN_GROUP=$grp "$gen" --model "$tmp/model" --backend "$backend" \
            --prompts "$tmp/prompts.jsonl" --n 8 --max-tokens 48 --temperature 1 --seed 7 \
            --ignore-eos --json $flag > "$out.jsonl" 2> "$out.err" \
            || { echo "FAIL: graphs $g, group tiles $grp: anvil-generate failed"; cat "$out.err"; fail=1; }
        "$py" -c "import json,sys; [print(d['id'], d['index'], d['token_ids'], d['logprobs']) for d in sorted((json.loads(l) for l in open(sys.argv[1])), key=lambda d: (d['id'], d['index']))]" \
            "$out.jsonl" > "$out.tok" || fail=1
    done
    n=$(wc -l < "$tmp/out_${g}_0.tok")
    if [ "$n" -eq 24 ] && cmp -s "$tmp/out_${g}_0.tok" "$tmp/out_${g}_1.tok"; then
        echo "ok   graphs $g: 3 prompts x 8 samples, the same tokens and logprobs with the group tiles and without"
    else
        echo "FAIL graphs $g: the samples differ with the group tiles (or missing: $n of 24)"
        diff "$tmp/out_${g}_0.tok" "$tmp/out_${g}_1.tok" | head -4 | cut -c1-200
        fail=1
    fi
    if [ "$backend" = cuda ]; then
        if grep -q "attention plans had group tiles" "$tmp/out_${g}_1.err" &&
            ! grep -q "attention plans had group tiles" "$tmp/out_${g}_0.err"; then
            echo "ok   graphs $g: $(grep -o "[0-9]* attention plans had group tiles, [0-9]* in all" "$tmp/out_${g}_1.err" | head -1) (none with ANVIL_CUDA_ATTN_GROUP=0)"
        else
            echo "FAIL graphs $g: no plan had group tiles with them on (or one had with them off)"
            fail=1
        fi
    fi
done
exit $fail

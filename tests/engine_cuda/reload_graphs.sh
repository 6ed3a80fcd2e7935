#!/bin/bash
# reload_graphs.sh - a weight reload on the CUDA backend with decode graphs on: a checkpoint of
# the same shapes and dtypes is checked, then written into the loaded buffers (the graphs stay,
# eng_model_reload), one of other dtypes is swapped in (the graphs are dropped); either way the
# tokens are those of an engine that loaded the new weights from the start. A truncated copy of
# A, loaded after B, is refused before anything is written: the next samples are still B's.
#
# Usage: reload_graphs.sh PATH/eng_engine_check. Makes three small random Llama checkpoints
# (tiny_model.py, head_dim 64): A and B in bf16 (other seeds), C in fp32. Runs `eng_engine_check
# reload X Y` (greedy on X, Y loaded as version 7, greedy again; tests/engine/eng_engine_check.c)
# for A -> B, B -> B, A -> C and C -> C with ENG_CHECK_BACKEND=cuda, and requires the samples of
# request "b" (after the reload) to equal those of the run that had the new weights throughout,
# the log to say "reloaded in place" for A -> B and not for A -> C, and the samples of "a"
# (before the reload) to differ between A and B (the reload changed something).
# Exit 77 without a GPU or without torch.
set -u
chk=$1
. "$(dirname "$0")/gen_common.sh"
gen_setup --layers 2 --hidden 256 --heads 4 --kv-heads 2 --ffn 512 --seed 0
"$py" "$src/gen_worker/engine/tools/tiny_model.py" "$tmp/b" --layers 2 --hidden 256 --heads 4 \
    --kv-heads 2 --ffn 512 --seed 1 > /dev/null || { echo "FAIL: cannot make model B"; exit 1; }
"$py" "$src/gen_worker/engine/tools/tiny_model.py" "$tmp/c" --layers 2 --hidden 256 --heads 4 \
    --kv-heads 2 --ffn 512 --seed 2 --dtype fp32 > /dev/null ||
    { echo "FAIL: cannot make model C"; exit 1; }
fail=0
cp -r "$tmp/model" "$tmp/bad" && truncate -s -64 "$tmp/bad/model.safetensors" ||
    { echo "FAIL: cannot make the truncated copy of A"; exit 1; }
run() { # run NAME X Y [BAD]: eng_engine_check reload X Y [BAD] on the GPU, samples by (id, index)
    ENG_CHECK_BACKEND=cuda "$chk" reload "$2" "$3" ${4:+"$4"} > "$tmp/$1.out" 2> "$tmp/$1.err" ||
        { echo "FAIL: reload $1: eng_engine_check failed"; tail -5 "$tmp/$1.err"; fail=1; }
    "$py" -c "
import json, sys
for l in open(sys.argv[1]):
    if l.startswith('{'):
        d = json.loads(l); print(d['id'], d['index'], d['tokens'])" "$tmp/$1.out" | sort > "$tmp/$1.tok"
}
run ab "$tmp/model" "$tmp/b" "$tmp/bad"
run bb "$tmp/b" "$tmp/b"
run ac "$tmp/model" "$tmp/c"
run cc "$tmp/c" "$tmp/c"
check() { # check WHAT CONDITION...
    local what=$1; shift
    if "$@"; then echo "ok   $what"; else echo "FAIL $what"; fail=1; fi
}
check "A -> B: copied in place" grep -q "reloaded in place" "$tmp/ab.err"
check "A -> C (bf16 -> fp32): swapped, not in place" bash -c "! grep -q 'reloaded in place' '$tmp/ac.err'"
check "A -> B: the samples after the reload are B's" \
    cmp -s <(grep '^b ' "$tmp/ab.tok") <(grep '^b ' "$tmp/bb.tok")
check "A -> C: the samples after the reload are C's" \
    cmp -s <(grep '^b ' "$tmp/ac.tok") <(grep '^b ' "$tmp/cc.tok")
check "the samples before the reload differ between A and B" \
    bash -c "! cmp -s <(grep '^a ' '$tmp/ab.tok') <(grep '^a ' '$tmp/bb.tok')"
check "A -> B, then the truncated A: refused" grep -q "broken checkpoint refused" "$tmp/ab.err"
if cmp -s <(grep '^c ' "$tmp/ab.tok" | sed 's/^c /b /') <(grep '^b ' "$tmp/ab.tok"); then
    echo "info: \"c\" alone and \"b\" beside \"mid\" drew the same greedy tokens"
else
    echo "info: \"c\" alone and \"b\" beside \"mid\" drew different greedy tokens:"
    grep '^[bc] ' "$tmp/ab.tok"
fi
# "c" runs alone after the refusals, in the B -> B run too (which has no broken load): its
# samples must be the same in both ("b" ran beside the recomputed "mid", another batch)
check "after the refused reload of a truncated A the samples are B's" \
    cmp -s <(grep '^c ' "$tmp/ab.tok") <(grep '^c ' "$tmp/bb.tok")
check "4 runs printed samples" test -s "$tmp/ab.tok" -a -s "$tmp/bb.tok" -a -s "$tmp/ac.tok" -a -s "$tmp/cc.tok"
exit $fail

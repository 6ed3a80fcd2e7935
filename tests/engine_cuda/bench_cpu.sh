#!/bin/bash
# bench_cpu.sh - anvil-bench-engine's workload logic on the CPU backend at a tiny shape.
#
# Usage: bench_cpu.sh PATH/anvil-bench-engine. Runs every configuration (decode lines, the
# long-context decode line, a GRPO-shaped job) and checks the output format (one line per
# configuration, then a summary; --json one object per line) and the GRPO bookkeeping: one
# prefill per prompt (prefix sharing), every sample finished at its drawn length, and the
# same tokens (hash) as the run that prefills every sample on its own, and the decode steps'
# host / sampler times. The KV is limited so
# that admission has to wait for finished samples. The linear workload (--linear): one line a
# product and batch, a layer line that sums the layer's four products, and the sweep's
# refusal on the CPU.
set -u
bin=$1
fail=0
check() { # check NAME CONDITION-STATUS
    if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fail=1; fi
}
field() { # field LINE KEY
    echo "$1" | tr ' ' '\n' | sed -n "s/^$2=//p" | head -1
}
common=(--backend cpu --shape tiny --threads 2 --prompt 8 --new 4
        --ctx-batch 2 --ctx-len 40 --ctx-new 4
        --grpo-prompts 6 --grpo-samples 4 --grpo-prompt 21 --grpo-min-new 1
        --grpo-max-new 40 --grpo-chunk 40 --kv-blocks 40)
out=$("$bin" "${common[@]}" --batches 1,3)
rc=$?
echo "$out"
check "bench exits 0" $rc
[ "$(echo "$out" | grep -c '^decode batch=')" -eq 2 ]; check "two decode lines" $?
[ "$(echo "$out" | grep -c '^decode_ctx batch=2 ')" -eq 1 ]; check "one decode_ctx line" $?
[ "$(echo "$out" | tail -1 | cut -d' ' -f1)" = summary ]; check "summary line last" $?
d=$(echo "$out" | grep '^device=')
[ "$(field "$d" linear)" = fused ] && [ "$(field "$d" attention)" = cpu ]
check "device line names the linear path and the attention kernel" $?
# a step reads every weight but the embedding table, of which it gathers one row a token:
# the tiny shape's table is 512 x 256 bf16
awk -v w="$(field "$d" weights_gb)" -v s="$(field "$d" step_weights_gb)" \
    'BEGIN { d = w - s - 511 * 256 * 2 / 1e9; exit !(s > 0 && d < 1e-7 && d > -1e-7) }'
check "step weights = weights - the embedding table + one row" $?
g=$(echo "$out" | grep '^grpo ')
[ -n "$g" ]; check "grpo line" $?
[ "$(field "$g" prefills)" = 6 ]; check "prefills = prompts (prefix sharing)" $?
[ "$(field "$g" finished)" = 24 ]; check "every sample finished" $?
[ -n "$(field "$g" generated)" ] && [ "$(field "$g" generated)" = "$(field "$g" expected)" ]
check "generated = sum of drawn lengths" $?
cap=$(field "$g" kv_capacity_tokens); peak=$(field "$g" kv_peak_tokens)
[ -n "$peak" ] && [ "$peak" -gt 0 ] && [ "$peak" -le "$cap" ]; check "kv peak within capacity" $?
[ "$(field "$g" peak_running)" -lt 24 ]; check "admission limited by the KV" $?
# the host / sampler split of a decode step: the CPU's forward is host work (fwd within host),
# no graphs on the CPU
h=$(field "$g" decode_host_ms); f=$(field "$g" decode_fwd_ms); w=$(field "$g" decode_wait_ms)
awk -v h="$h" -v f="$f" -v w="$w" 'BEGIN { exit !(h != "" && f != "" && w != "" && f > 0 &&
    h >= f && w >= 0) }'
check "grpo decode_host_ms >= decode_fwd_ms > 0, decode_wait_ms >= 0 ($h, $f, $w)" $?
[ "$(field "$g" graph_captures)" = 0 ] && [ "$(field "$g" graph_eager)" = 0 ]
check "grpo: no graphs on the CPU" $?
for tok in tok_s ms_step frac_copy; do
    v=$(field "$(echo "$out" | grep '^decode batch=1 ')" $tok)
    awk -v v="$v" 'BEGIN { exit !(v + 0 > 0) }'; check "decode batch=1 $tok > 0" $?
done

ns=$("$bin" "${common[@]}" --batches none --ctx-batch 0 --grpo-no-sharing | grep '^grpo ')
[ "$(field "$ns" prefills)" = 24 ]; check "without sharing: one prefill per sample" $?
[ -n "$(field "$g" tokens_hash)" ] && [ "$(field "$g" tokens_hash)" = "$(field "$ns" tokens_hash)" ]
check "same tokens with and without prefix sharing" $?

js=$("$bin" "${common[@]}" --batches 2 --json)
check "json run exits 0" $?
[ "$(echo "$js" | grep -c '^{"bench":')" -eq "$(echo "$js" | wc -l)" ]; check "json: objects only" $?
echo "$js" | grep -q '"bench":"grpo".*"prefills":6,'; check "json grpo prefills" $?
echo "$js" | tail -1 | grep -q '"bench":"summary"'; check "json summary last" $?
echo "$js" | tail -1 | grep -q '"kv_dtype":"F32","linear":"fused","attention":"cpu"'
check "json summary: kv dtype, linear path, attention kernel" $?

"$bin" --backend cpu --shape tiny --batches 0 >/dev/null 2>&1
[ $? -eq 2 ]; check "bad --batches refused (exit 2)" $?
"$bin" --backend cpu --shape tiny --batches none --ctx-batch 0 --grpo-prompts 2 \
    --grpo-prompt 16 --grpo-min-new 200 --grpo-max-new 300 --kv-blocks 8 >/dev/null 2>&1
[ $? -eq 1 ]; check "a group larger than the KV is an error (exit 1)" $?
lin=$("$bin" --backend cpu --shape tiny --threads 2 --batches none --ctx-batch 0 \
    --grpo-prompts 0 --linear 1,3 --linear-reps 2 2>&1)
check "linear run exits 0" $?
echo "$lin" | grep '^linear '
for b in 1 3; do
    for p in qkv o gate_up down lm_head layer; do
        l=$(echo "$lin" | grep "^linear batch=$b segs=0 product=$p ")
        [ "$(echo "$l" | grep -c .)" -eq 1 ] &&
            awk -v u="$(field "$l" us)" -v g="$(field "$l" gbps)" \
                'BEGIN { exit !(u + 0 > 0 && g != "") }'
        check "linear batch=$b $p: one line, us > 0" $?
    done
    sum=$(echo "$lin" | grep "^linear batch=$b " | grep -v "product=lm_head\|product=layer" |
          tr ' ' '\n' | sed -n 's/^us=//p' | awk '{ s += $1 } END { print s }')
    lay=$(field "$(echo "$lin" | grep "^linear batch=$b .*product=layer")" us)
    awk -v s="$sum" -v l="$lay" 'BEGIN { d = s - l; exit !(d < 0.05 && d > -0.05) }'
    check "linear batch=$b: the layer line sums its four products ($sum, $lay)" $?
done
sw=$("$bin" --backend cpu --shape tiny --threads 2 --batches none --ctx-batch 0 \
     --grpo-prompts 0 --linear 1 --linear-reps 1 --linear-sweep 2>&1)
echo "$sw" | grep -q "needs the CUDA backend" &&
    [ "$(echo "$sw" | grep -c '^linear batch=1 ')" -eq 6 ]
check "linear sweep on the CPU: said, and the default only" $?
"$bin" --backend cpu --shape tiny --batches none --linear 0 >/dev/null 2>&1
[ $? -eq 2 ]; check "bad --linear refused (exit 2)" $?
exit $fail

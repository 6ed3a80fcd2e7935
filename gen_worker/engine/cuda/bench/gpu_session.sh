#!/bin/bash
# gpu_session.sh - everything the CUDA engine needs measured on the GPU machine, in one run.
#
#   gpu_session.sh BUILD_DIR OUT [--dry] [--budget SECONDS] [--only STEP,STEP...]
#
# BUILD_DIR holds the prebuilt binaries (anvil-bench-engine, anvil-generate, test_cuda_ops,
# test_cuda_model, test_cuda_graphs, eng_cuda_hfcheck; found by name anywhere below it, so a
# carried folder of just those files works too: `deploy/bundle.sh --gpu-tests DIR` makes one,
# with DIR/lib holding the libraries the GPU host lacks, e.g. libcjson for anvil-generate;
# BUILD_DIR/lib goes on LD_LIBRARY_PATH). OUT receives one log per step plus
# summary.txt (step, exit status, seconds). Steps, in priority order, each under its own
# `timeout` and never past the overall budget (default 530 s, to fit a 9-minute command):
#
#   ckpt_write   (background, CPU only, from the start) an 8B-shaped random bf16 checkpoint
#                (tiny_model.py --shape seed-coder-8b) on local disk
#   graphs_test  test_cuda_graphs: greedy tokens with graphs == without, batch 1, 3, 16
#   ops_test     test_cuda_ops: every op against the CPU reference
#   model_test   test_cuda_model: the whole model against the CPU backend
#   bench        anvil-bench-engine --cuda-graphs: decode at batch 1/16/64/256 (prompt 512,
#                256 new) graphs off and on, decode_ctx batch 256 at 2k, grpo 64 x 8 with
#                1k prompts and lengths 128..640 (scaled down from 4k to fit)
#   bench_nopdl  the same decode batches (no decode_ctx, no grpo) with ANVIL_CUDA_PDL=0: the A/B
#                of programmatic dependent launch in one session
#   bench_oneop  the same decode batches and batch 256 at 2k with ANVIL_ENGINE_LINEAR=0 (the
#                matmuls op by op, norms / rope / SwiGLU / residual adds as their own kernels):
#                the A/B of the fused linear op in one session
#   bench_samp8  the same decode batches with ANVIL_CUDA_SAMPLE_BLOCKS=8 (the clustered
#                sampler: 8 blocks a row): its A/B against bench in one session
#   load_8b      anvil-generate --backend cuda on the 8B checkpoint, 1 token: the engine's
#                "weights: ... GB/s" line (page cache warm: written just before), twice
#   gen_graphs   generate_graphs.sh: the engine with and without --cuda-graphs
#   reload_graphs reload_graphs.sh: a weight reload on the engine with decode graphs (in place
#                for the same dtypes, the graphs kept; swapped for others): the new weights' tokens
#   gen_groups   generate_groups.sh: the engine's 8 samples a prompt with the attention's group
#                tiles and without (ANVIL_CUDA_ATTN_GROUP=0): the same tokens and logprobs
#   hf_peer      hf_peer_bench.py: HF transformers generate at the same decode batches
#   vs_hf        hf_compare.py: the engine against HF on a 2-layer Seed-Coder shape
#   vs_hf_fp8    the same with the KV cache in fp8 (ANVIL_CUDA_KV=fp8): its accuracy cost
#   model_fma    test_cuda_model with ANVIL_CUDA_ATTN_MMA=0 (the FMA decode attention; by default
#                both model tests, GQA 8/2 with bf16 KV, run the tensor-core one)
#   graphs_fma   test_cuda_graphs with ANVIL_CUDA_ATTN_MMA=0
#   bench_kvs    bf16 then fp8 KV, batch 1 and 256 and batch 256 at 2k, the defaults: the base
#                of the A/B steps below; then batch 1 at ANVIL_CUDA_GEMV_WAVES 1, 5 and 10 (the
#                waves the GEMV's column segments aim for; 2.5 by default)
#   linear       anvil-bench-engine --linear 1,4 --linear-sweep: each product of a layer (QKV,
#                O, gate|up, down, lm_head) on its own at batch 1 and 4, GB/s against the copy,
#                by the default segments rule and with 1, 2, 4, 8 column segments a row
#                (ANVIL_CUDA_GEMV_SEGS): where the small-batch GEMVs lose bandwidth, in seconds
#   kernels_gemv ncu's detail sections (speed of light, memory, occupancy, warp states,
#                launch) for one decode layer's kernels at batch 1 (QKV, attention, combine, O,
#                gate|up, down): why QKV and O stream slower than gate|up
#   ops_vlate    test_cuda_ops with ANVIL_CUDA_ATTN_VLATE=0 (the tensor-core decode loads V
#                with K, the default's A/B; by default V is loaded after q.k)
#   bench_vlate  bench_kvs's first runs (bf16 then fp8 KV) with ANVIL_CUDA_ATTN_VLATE=0: the
#                A/B against bench_kvs's
#   ops_rope0    test_cuda_ops with ANVIL_CUDA_GEMV_ROPE=0 (the small-batch QKV GEMV writes q|k|v
#                and rope_kv_store rotates and stores them, instead of its rope epilogue)
#   model_rope0  test_cuda_model with ANVIL_CUDA_GEMV_ROPE=0
#   ops_kvi      test_cuda_ops with ANVIL_CUDA_ATTN_KV_INNER=1 (the decode grid runs a tile's
#                KV heads next to each other)
#   model_kvi    test_cuda_model with ANVIL_CUDA_ATTN_KV_INNER=1
#   bench_kvi    bench_kvs's first runs (bf16 then fp8 KV) with ANVIL_CUDA_ATTN_KV_INNER=1: the
#                A/B against bench_kvs's
#   bench_ab     every A/B switch (the GEMV's rope apart, segments, every slot and cuBLASLt
#                at batch 1, the GEMV up to 8 rows at batch 4, no rounded twins at 4 to 256 and
#                2k, the sampler's whole-row passes, KV heads inner, V with K) against the
#                default, in short runs: batch 1, 4, 16, 64, 256, batch 256 x 2k bf16 and fp8
#                (the default first and last in each group); ~6 minutes; ANVIL_AB_RUNS
#                replaces the list
#   bench_fp8    anvil-bench-engine --kv-dtype fp8: batch 1 and 256, and batch 256 at 2k
#   bench_fma    bench_fp8's runs, and the same with bf16 KV, with ANVIL_CUDA_ATTN_MMA=0: the
#                FMA decode's side of the A/B against bench_fp8 and bench in one session
#   memcheck     memcheck.sh: compute-sanitizer memcheck on a short whole-model run
#   memcheck_fma the same with ANVIL_CUDA_ATTN_MMA=0
#   memcheck_dec memcheck on test_cuda_ops --only decodes: 64 decodes on the default and the
#                KV-heads-inner decode grids and with V loaded with K
#   racecheck_dec the same under racecheck
#   memcheck_pf  memcheck on test_cuda_ops --only prefill: the tensor-core prefill attention
#                (a 300-token prompt, a 200-token chunk after 500; bf16 / fp8 KV, G 4 / 8)
#   racecheck_pf the same under racecheck (its K / V chunks and q in shared memory)
#   bench_prefill prefill of 1k-token prompts at batch 16 and 64 with the prefill attention on
#                the tensor cores (the default), with its longest-first order, cp.async stages
#                and early loads off (ANVIL_CUDA_ATTN_PF_LPT / _ASYNC / _EARLY=0) and with
#                ANVIL_CUDA_ATTN_PREFILL_MMA=0 (the FMA kernel): prefill_tok_s, the A/B in one
#                session
#   bench_part   the GRPO workload with the decode partials in fp32 (ANVIL_CUDA_ATTN_PART=f32),
#                fp16 (the default) and bf16: f32, f16, f32, f16, bf16; tok/s,
#                prefill_s and the tokens' hash
#   model_part   test_cuda_model with ANVIL_CUDA_ATTN_PART=f32 and =bf16: the whole model's
#                |dlogprob| against the CPU with each kind (the default's is model_test's)
#   kernels_part ncu: a GRPO step's decode attention and combine (16 prompts x 8 samples at a
#                1k prompt, 4 layers) with fp16 and fp32 partials: time, DRAM and L2 bytes
#   kernels_prefill ncu's detail sections (speed of light, compute, memory, occupancy, warp
#                states, scheduler) for two launches of the prefill attention (two 1k prompts)
#   memcheck_grp memcheck on test_cuda_ops --only groups: the group tiles (decode splits held
#                in shared blocks; bf16 G 4 at head_dim 128, fp8 G 8 at 64)
#   racecheck_grp the same under racecheck (q and p fragments, the warps' results in shared
#                memory)
#   bench_group  the GRPO workload (64 prompts x 8 samples, 1k prompts, 128 to 640 new, graphs)
#                with the group tiles (the default) and without (ANVIL_CUDA_ATTN_GROUP=0), on,
#                off, on: tok/s and the tokens' hash (the same bits: the same hash)
#   bench_prefetch decode at batch 1, 4, 8, 16 with the O product's weights prefetched into L2
#                during the attention (ANVIL_CUDA_PREFETCH_ROWS=8) and without (0, the default),
#                on, off, on, off: the A/B that decides its default
#   kernels_group ncu: the decode attention of a GRPO step (16 prompts x 8 samples at a 1k
#                prompt, 4 layers) with the group tiles and without: time, DRAM and L2 bytes
#   sass_group   ncu --set full on one group-kernel launch at batch 512 (64 prompts x 8 samples,
#                1k prompts), its source page summarised by ncu_sass.py: the stalls by reason,
#                by region between barriers, and the hottest instructions
#   kernels      ncu_step.py: every kernel of one batch-1 decode step under Nsight Compute
#                (time, DRAM bytes, GB/s) and the time between kernels
#   kernels_b256 the same for one batch-256 step at 2k context (ncu_step.py --ctx-len 2048):
#                where the "10k tok/s at batch 256 x 2k" goal's time goes
#   kernels_fma  the batch-256 x 2k step with fp8 KV, by the mma decode (OUT/fp8) and by the FMA
#                decode (OUT/fma, ANVIL_CUDA_ATTN_MMA=0)
#
# The device tool brings back only a few files from $OUT: give OUT outside it and tar it,
#   gpu_session.sh build-gpu /tmp/gpu; tar czf $OUT/gpu.tgz -C /tmp gpu
#
# --only runs just the named steps (the others are listed as "not run: --only"), for a session
# that needs only a few figures; ckpt_write and load_8b run only when load_8b is named.
#
# --dry runs the same plan where it can without a GPU: the bench on the CPU backend at the
# tiny shape, a small checkpoint through the fast writer and its load on the CPU, the GPU
# binaries (which exit 77, reported as skipped); used to check this script off the GPU.
set -u
if [ $# -lt 2 ]; then
    echo "usage: gpu_session.sh BUILD_DIR OUT [--dry] [--budget SECONDS] [--only STEP,...]" >&2
    exit 2
fi
BUILD=$(cd "$1" && pwd) || exit 2
OUT=$2
shift 2
DRY=0
BUDGET=530
ONLY=
while [ $# -gt 0 ]; do
    case "$1" in
    --dry) DRY=1; shift ;;
    --budget) BUDGET=$2; shift 2 ;;
    --only) ONLY=",$2,"; shift 2 ;;
    *) echo "gpu_session.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
done
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
SRC=$(cd "$(dirname "$0")/../../../.." && pwd)
PY=${ANVIL_PYTHON:-$(command -v python3)}
[ -d "$BUILD/lib" ] && export LD_LIBRARY_PATH="$BUILD/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export ANVIL_PYTHON=$PY ANVIL_SOURCE_DIR=$SRC
START=$(date +%s)
DEADLINE=$((START + BUDGET))
SUMMARY=$OUT/summary.txt
: > "$SUMMARY"

log() { echo "[$(( $(date +%s) - START ))s] $*" | tee -a "$OUT/session.log"; }

# bin NAME: the executable NAME under BUILD_DIR (first match), or nothing
bin() { find "$BUILD" -name "$1" -type f -perm -u+x 2>/dev/null | head -1; }

# step NAME TIMEOUT CMD...: runs CMD with its output in OUT/NAME.log, at most TIMEOUT seconds
# and never past the deadline; records rc (77 = skipped, 124 = timed out) in summary.txt
step() {
    local name=$1 limit=$2
    shift 2
    if ! wanted "$name"; then
        printf '%-12s rc=%-4s %5ss  %s\n' "$name" "-" 0 "not run: --only" >> "$SUMMARY"
        return 0
    fi
    local left=$((DEADLINE - $(date +%s) - 5))
    if [ "$left" -lt 15 ]; then
        log "$name: SKIPPED (budget spent)"
        printf '%-12s rc=%-4s %5ss  %s\n' "$name" "-" 0 "not run: budget spent" >> "$SUMMARY"
        return 0
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    log "$name: start (timeout ${limit}s): $*"
    local t0 rc
    t0=$(date +%s)
    timeout --kill-after=10 "$limit" "$@" > "$OUT/$name.log" 2>&1
    rc=$?
    local dt=$(( $(date +%s) - t0 ))
    local what=passed
    case $rc in
    0) what=passed ;;
    77) what=skipped ;;
    124|137) what="TIMED OUT" ;;
    *) what=FAILED ;;
    esac
    log "$name: $what (rc $rc, ${dt}s)"
    printf '%-12s rc=%-4s %5ss  %s\n' "$name" "$rc" "$dt" "$what" >> "$SUMMARY"
    return 0
}

wanted() { [ -z "$ONLY" ] || [[ $ONLY == *",$1,"* ]]; }

need() { # need NAME: path of a binary or a failing placeholder
    local p
    p=$(bin "$1")
    if [ -z "$p" ]; then
        log "missing binary $1 under $BUILD"
        echo "false"
    else
        echo "$p"
    fi
}

BENCH=$(need anvil-bench-engine)
GEN=$(need anvil-generate)
T_OPS=$(need test_cuda_ops)
T_MODEL=$(need test_cuda_model)
T_GRAPHS=$(need test_cuda_graphs)
HFCHECK=$(need eng_cuda_hfcheck)
CHECK=$(need eng_engine_check)
TESTS=$SRC/tests/engine_cuda
TOOLS=$SRC/gen_worker/engine/tools
BENCHDIR=$SRC/gen_worker/engine/cuda/bench

{
    echo "date: $(date -u)"
    echo "dry: $DRY budget: $BUDGET s"
    echo "source: $SRC build: $BUILD"
    echo "python: $PY $("$PY" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' 2>&1)"
    echo "cores: $(nproc)"
    nvidia-smi 2>&1 | head -15
    for b in "$BENCH" "$GEN" "$T_OPS"; do ldd "$b" 2>&1 | grep -i "not found"; done
    df -h "$OUT" 2>&1 | tail -1
} > "$OUT/env.txt" 2>&1
log "env written to $OUT/env.txt"

# The checkpoint directory: local disk with room for 16 GB (OUT comes back to the caller, so
# the checkpoint must not live under it).
CKPT=${CKPT_DIR:-/tmp/anvil-ckpt-8b}
rm -rf "$CKPT"
if [ $DRY = 1 ]; then
    CKPT_ARGS=(--shape seed-coder-8b --layers 2 --hidden 256 --heads 4 --kv-heads 2 --ffn 512
               --vocab 8192 --shard-gb 0.003)
else
    CKPT_ARGS=(--shape seed-coder-8b --shard-gb 5)
fi
CKPT_PID=
if wanted load_8b; then
    log "ckpt_write: background: $PY $TOOLS/tiny_model.py $CKPT ${CKPT_ARGS[*]}"
    ( t0=$(date +%s)
      timeout 400 "$PY" "$TOOLS/tiny_model.py" "$CKPT" "${CKPT_ARGS[@]}" > "$OUT/ckpt_write.log" 2>&1
      echo "rc=$? seconds=$(( $(date +%s) - t0 ))" >> "$OUT/ckpt_write.log" ) &
    CKPT_PID=$!
fi

if [ $DRY = 1 ]; then
    BENCH_ARGS=(--backend cpu --shape tiny --threads 4 --batches 1,16 --prompt 16 --new 8
                --ctx-batch 4 --ctx-len 64 --ctx-new 8 --grpo-prompts 8 --grpo-samples 8
                --grpo-prompt 32 --grpo-min-new 4 --grpo-max-new 24 --cuda-graphs)
else
    BENCH_ARGS=(--cuda-graphs --batches 1,16,64,256 --prompt 512 --new 256
                --ctx-batch 256 --ctx-len 2048 --ctx-new 256
                --grpo-prompts 64 --grpo-samples 8 --grpo-prompt 1024
                --grpo-min-new 128 --grpo-max-new 640)
fi

step graphs_test 90 "$T_GRAPHS"
step ops_test 90 "$T_OPS"
step model_test 90 "$T_MODEL"
step model_fma 90 env ANVIL_CUDA_ATTN_MMA=0 "$T_MODEL"
step graphs_fma 90 env ANVIL_CUDA_ATTN_MMA=0 "$T_GRAPHS"
if [ $DRY = 1 ]; then
    KV_ARGS=(--backend cpu --shape tiny --threads 4 --batches 1 --prompt 16 --new 8
               --ctx-batch 4 --ctx-len 64 --ctx-new 8 --grpo-prompts 0)
    B1_ARGS=(--backend cpu --shape tiny --threads 4 --batches 1 --prompt 16 --new 8
             --ctx-batch 0 --grpo-prompts 0)
    KV_LIST=f32
else
    # shellcheck disable=SC2054
    KV_ARGS=(--cuda-graphs --batches 1,256 --prompt 512 --new 128 --ctx-batch 256
               --ctx-len 2048 --ctx-new 256 --grpo-prompts 0)
    B1_ARGS=(--cuda-graphs --batches 1 --prompt 512 --new 128 --ctx-batch 0 --grpo-prompts 0)
    KV_LIST="bf16 fp8"
fi
step bench_kvs 240 env KV_LIST="$KV_LIST" bash -c 'b=$0; n=$1; shift
        a=("${@:1:$n}"); b1=("${@:$((n + 1))}")
        for kv in $KV_LIST; do
            echo "== kv $kv"
            "$b" --kv-dtype $kv "${a[@]}" || exit 1
        done
        for wv in 1 5 10; do
            echo "== kv default ANVIL_CUDA_GEMV_WAVES=$wv"
            ANVIL_CUDA_GEMV_WAVES=$wv "$b" "${b1[@]}" || exit 1
        done' "$BENCH" "${#KV_ARGS[@]}" "${KV_ARGS[@]}" "${B1_ARGS[@]}"
if [ $DRY = 1 ]; then
    # shellcheck disable=SC2054
    LIN_ARGS=(--backend cpu --shape tiny --threads 4 --linear 1,4 --linear-reps 2)
else
    # shellcheck disable=SC2054
    LIN_ARGS=(--linear 1,4 --linear-reps 20)
fi
step linear 120 "$BENCH" --batches none --ctx-batch 0 --grpo-prompts 0 --linear-sweep \
    "${LIN_ARGS[@]}"
step ops_vlate 90 env ANVIL_CUDA_ATTN_VLATE=0 "$T_OPS"
step ops_rope0 90 env ANVIL_CUDA_GEMV_ROPE=0 "$T_OPS"
step model_rope0 90 env ANVIL_CUDA_GEMV_ROPE=0 "$T_MODEL"
# bench_kvs's first runs for each KV dtype with one switch set ($1, NAME=VALUE)
KV_AB='b=$0; sw=$1; shift
        for kv in $KV_LIST; do
            echo "== kv $kv $sw"
            env "$sw" "$b" --kv-dtype $kv "$@" || exit 1
        done'
step bench_vlate 150 env KV_LIST="$KV_LIST" bash -c "$KV_AB" "$BENCH" ANVIL_CUDA_ATTN_VLATE=0 \
    "${KV_ARGS[@]}"
step ops_kvi 90 env ANVIL_CUDA_ATTN_KV_INNER=1 "$T_OPS"
step model_kvi 90 env ANVIL_CUDA_ATTN_KV_INNER=1 "$T_MODEL"
step bench_kvi 150 env KV_LIST="$KV_LIST" bash -c "$KV_AB" "$BENCH" ANVIL_CUDA_ATTN_KV_INNER=1 \
    "${KV_ARGS[@]}"
# bench_ab: every A/B switch against the default in one step, in short runs (batch 1 and 4
# 128 new tokens; batch 256 64 new; batch 256 x 2k via decode_ctx, no prefill, 128 new), the
# default first and last in each group to show the drift between runs
if [ $DRY = 1 ]; then
    AB_B1="--backend cpu --shape tiny --threads 4 --batches 1 --prompt 16 --new 8 --ctx-batch 0"
    AB_B4="--backend cpu --shape tiny --threads 4 --batches 2 --prompt 16 --new 8 --ctx-batch 0"
    AB_B16="--backend cpu --shape tiny --threads 4 --batches 3 --prompt 16 --new 8 --ctx-batch 0"
    AB_B64="$AB_B16"
    AB_B256="--backend cpu --shape tiny --threads 4 --batches 4 --prompt 16 --new 8 --ctx-batch 0"
    AB_CTX="--backend cpu --shape tiny --threads 4 --batches none --ctx-batch 4 --ctx-len 64"
    AB_CTX="$AB_CTX --ctx-new 8 --kv-dtype f32"
    AB_KVS="f32 f32"
else
    AB_B1="--cuda-graphs --batches 1 --prompt 512 --new 128 --ctx-batch 0"
    AB_B4="--cuda-graphs --batches 4 --prompt 512 --new 128 --ctx-batch 0"
    AB_B16="--cuda-graphs --batches 16 --prompt 512 --new 128 --ctx-batch 0"
    AB_B64="--cuda-graphs --batches 64 --prompt 512 --new 128 --ctx-batch 0"
    AB_B256="--cuda-graphs --batches 256 --prompt 512 --new 64 --ctx-batch 0"
    AB_CTX="--cuda-graphs --batches none --ctx-batch 256 --ctx-len 2048 --ctx-new 128"
    AB_KVS="bf16 fp8"
fi
# ANVIL_AB_RUNS (lines "SET SWITCH|-") replaces the list for a session that needs a few rows
AB_RUNS="b1 -
b1 ANVIL_CUDA_GEMV_ROPE=0
b1 ANVIL_CUDA_GEMV_SEGS=1
b1 ANVIL_CUDA_GEMV_SEGS=2
b1 ANVIL_CUDA_GEMV_BALANCE=0
b1 ANVIL_CUDA_GEMV_MAX=0
b1 ANVIL_CUDA_ATTN_KV_INNER=1
b1 ANVIL_CUDA_ATTN_VLATE=0
b1 ANVIL_CUDA_PREFETCH_ROWS=8
b1 -
b4 -
b4 ANVIL_CUDA_GEMV_MAX=8
b4 ANVIL_CUDA_PREFETCH_ROWS=8
b4 ANVIL_CUDA_TWIN=0
b4 ANVIL_CUDA_NORM_VEC=0
b4 -
b16 -
b16 ANVIL_CUDA_TWIN=0
b16 ANVIL_CUDA_NORM_VEC=0
b16 -
b64 -
b64 ANVIL_CUDA_TWIN=0
b64 ANVIL_CUDA_NORM_VEC=0
b64 ANVIL_CUDA_GU_LOW=0
b64 ANVIL_CUDA_ATTN_PART=f32
b64 -
b256 -
b256 ANVIL_CUDA_TWIN=0
b256 ANVIL_CUDA_NORM_VEC=0
b256 ANVIL_CUDA_ROPE_VEC=0
b256 ANVIL_CUDA_TWIN_ONLY=0
b256 ANVIL_CUDA_GU_LOW=0
b256 ANVIL_CUDA_SAMPLE_LIST=0
b256 ANVIL_CUDA_ATTN_KV_INNER=1
b256 ANVIL_CUDA_ATTN_VLATE=0
b256 ANVIL_CUDA_ATTN_PART=f32
b256 ANVIL_CUDA_ATTN_PART=bf16
b256 -
ctx16 -
ctx16 ANVIL_CUDA_TWIN=0
ctx16 ANVIL_CUDA_ATTN_KV_INNER=1
ctx16 ANVIL_CUDA_ATTN_VLATE=0
ctx16 ANVIL_CUDA_ATTN_PART=f32
ctx16 -
ctx8 -
ctx8 ANVIL_CUDA_NORM_VEC=0
ctx8 ANVIL_CUDA_ATTN_KV_INNER=1
ctx8 ANVIL_CUDA_ATTN_VLATE=0
ctx8 ANVIL_CUDA_ATTN_PART=f32
ctx8 -"
AB_RUNS=${ANVIL_AB_RUNS:-$AB_RUNS}
step bench_ab 480 env AB_RUNS="$AB_RUNS" AB_B1="$AB_B1" AB_B4="$AB_B4" AB_B16="$AB_B16" \
    AB_B64="$AB_B64" AB_B256="$AB_B256" AB_CTX="$AB_CTX" \
    AB_KVS="$AB_KVS" bash -c 'b=$0; read -r kv16 kv8 <<< "$AB_KVS"; fails=0
        while read -r set sw; do
            case $set in
                b1) a="$AB_B1" ;;
                b4) a="$AB_B4" ;;
                b16) a="$AB_B16" ;;
                b64) a="$AB_B64" ;;
                b256) a="$AB_B256" ;;
                ctx16) a="$AB_CTX --kv-dtype $kv16" ;;
                ctx8) a="$AB_CTX --kv-dtype $kv8" ;;
                *) continue ;;
            esac
            [ "$sw" = - ] && sw=
            echo "== $set ${sw:-default}"
            # shellcheck disable=SC2086  # both lists are words without spaces
            env $sw "$b" $a --grpo-prompts 0 || { echo "== failed: rc $?"; fails=$((fails + 1)); }
        done <<< "$AB_RUNS"
        exit $fails' "$BENCH"
step bench 200 "$BENCH" "${BENCH_ARGS[@]}"
if [ $DRY = 1 ]; then
    step bench_nopdl 60 env ANVIL_CUDA_PDL=0 "$BENCH" "${BENCH_ARGS[@]}"
else
    step bench_nopdl 120 env ANVIL_CUDA_PDL=0 "$BENCH" --cuda-graphs --batches 1,16,64,256 \
        --prompt 512 --new 256 --ctx-batch 0 --grpo-prompts 0
fi
if [ $DRY = 1 ]; then
    step bench_oneop 60 env ANVIL_ENGINE_LINEAR=0 "$BENCH" "${BENCH_ARGS[@]}"
else
    step bench_oneop 150 env ANVIL_ENGINE_LINEAR=0 "$BENCH" --cuda-graphs --batches 1,16,64,256 \
        --prompt 512 --new 256 --ctx-batch 256 --ctx-len 2048 --ctx-new 256 --grpo-prompts 0
fi
if [ $DRY = 1 ]; then
    step bench_samp8 60 env ANVIL_CUDA_SAMPLE_BLOCKS=8 "$BENCH" "${BENCH_ARGS[@]}"
else
    step bench_samp8 120 env ANVIL_CUDA_SAMPLE_BLOCKS=8 "$BENCH" --cuda-graphs --batches 1,16,64,256 \
        --prompt 512 --new 256 --ctx-batch 0 --grpo-prompts 0
fi

if [ -n "$CKPT_PID" ]; then
    # the 8B load: wait for the writer (it has been running since the start)
    left=$((DEADLINE - $(date +%s) - 60))
    [ $left -lt 1 ] && left=1
    for _ in $(seq 1 "$left"); do kill -0 $CKPT_PID 2>/dev/null || break; sleep 1; done
    if kill -0 $CKPT_PID 2>/dev/null; then
        log "ckpt_write: still running, stopped"
        kill $CKPT_PID 2>/dev/null
    fi
    wait $CKPT_PID 2>/dev/null
    log "ckpt_write: $(tail -1 "$OUT/ckpt_write.log")"
    printf '%-12s %s  %s\n' ckpt_write "$(tail -1 "$OUT/ckpt_write.log")" \
        "$(grep -o 'bytes=[0-9]* seconds=[0-9.]* gb_s=[0-9.]*' "$OUT/ckpt_write.log")" >> "$SUMMARY"
    if [ -f "$CKPT/model.safetensors.index.json" ]; then
        be=cuda
        [ $DRY = 1 ] && be=cpu
        # two loads, the second with the file pages surely cached
        step load_8b 150 bash -c 'set -o pipefail; for i in 1 2; do
                "$0" --model "$1" --backend "$2" --prompt "def f(x):" --max-tokens 1 \
                    --temperature 0 --kv-blocks 64 2>&1 | grep -E "weights:|error" || exit 1
            done' "$GEN" "$CKPT" "$be"
        grep -h "weights:" "$OUT/load_8b.log" | sed 's/^.*weights:/load_8b weights:/' >> "$SUMMARY"
    else
        log "load_8b: no checkpoint (see ckpt_write.log)"
        printf '%-12s rc=%-4s %5ss  %s\n' load_8b "-" 0 "not run: no checkpoint" >> "$SUMMARY"
    fi
else
    printf '%-12s rc=%-4s %5ss  %s\n' load_8b "-" 0 "not run: --only" >> "$SUMMARY"
fi
rm -rf "$CKPT"

if [ $DRY = 1 ]; then
    step gen_graphs 120 env BACKEND=cpu "$TESTS/generate_graphs.sh" "$GEN"
    step gen_groups 120 env BACKEND=cpu "$TESTS/generate_groups.sh" "$GEN"
    log "hf_peer: needs the GPU, not run in --dry"
else
    step gen_graphs 120 "$TESTS/generate_graphs.sh" "$GEN"
    step gen_groups 120 "$TESTS/generate_groups.sh" "$GEN"
    step reload_graphs 120 "$TESTS/reload_graphs.sh" "$CHECK"
    step hf_peer 150 "$PY" "$BENCHDIR/hf_peer_bench.py" --batches 1,16,64,256 --prompt 512 \
        --new 256
fi
step vs_hf 120 "$PY" "$TESTS/hf_compare.py" "$HFCHECK"
if [ $DRY = 0 ]; then
    # fp8 KV: its accuracy against HF, and its speed where KV dominates (batch 256 at 2k)
    step vs_hf_fp8 120 env ANVIL_CUDA_KV=fp8 "$PY" "$TESTS/hf_compare.py" "$HFCHECK"
    step bench_fp8 120 "$BENCH" --kv-dtype fp8 --cuda-graphs --batches 1,256 --prompt 512 \
        --new 128 --ctx-batch 256 --ctx-len 2048 --ctx-new 256 --grpo-prompts 0
    step bench_fma 200 env ANVIL_CUDA_ATTN_MMA=0 bash -c 'for kv in fp8 bf16; do
            "$0" --kv-dtype $kv --cuda-graphs --batches 1,256 --prompt 512 --new 128 \
                --ctx-batch 256 --ctx-len 2048 --ctx-new 256 --grpo-prompts 0 || exit 1
        done' "$BENCH"
fi
step memcheck 120 "$TESTS/memcheck.sh" "$T_MODEL"
step memcheck_fma 120 env ANVIL_CUDA_ATTN_MMA=0 "$TESTS/memcheck.sh" "$T_MODEL"
step memcheck_dec 180 "$TESTS/memcheck.sh" "$T_OPS" --only decodes
step racecheck_dec 240 "$TESTS/memcheck.sh" --tool racecheck "$T_OPS" --only decodes
step memcheck_pf 180 "$TESTS/memcheck.sh" "$T_OPS" --only prefill
step racecheck_pf 240 "$TESTS/memcheck.sh" --tool racecheck "$T_OPS" --only prefill
step memcheck_grp 180 "$TESTS/memcheck.sh" "$T_OPS" --only groups
step racecheck_grp 240 "$TESTS/memcheck.sh" --tool racecheck "$T_OPS" --only groups
if [ $DRY = 1 ]; then
    GR_ARGS=(--backend cpu --shape tiny --threads 4 --grpo-prompts 2 --grpo-samples 4
        --grpo-prompt 300 --grpo-min-new 2 --grpo-max-new 6)
else
    GR_ARGS=(--cuda-graphs --grpo-prompts 64 --grpo-samples 8 --grpo-prompt 1024
        --grpo-min-new 128 --grpo-max-new 640)
fi
step bench_group 200 bash -c 'b=$0; for v in 1 0 1; do
        echo "== ANVIL_CUDA_ATTN_GROUP=$v"
        ANVIL_CUDA_ATTN_GROUP=$v "$b" "$@" --batches none --ctx-batch 0 || exit 1
    done' "$BENCH" "${GR_ARGS[@]}"
if [ $DRY = 1 ]; then
    PF_ARGS=(--backend cpu --shape tiny --threads 4 --batches 2 --prompt 16 --new 2)
else
    PF_ARGS=(--batches 16,64 --prompt 1024 --new 8)
fi
step bench_prefill 180 bash -c 'b=$0; o="ANVIL_CUDA_ATTN_PF_LPT=0 ANVIL_CUDA_ATTN_PF_ASYNC=0"
    for v in X=1 "$o ANVIL_CUDA_ATTN_PF_EARLY=0" ANVIL_CUDA_ATTN_PREFILL_MMA=0; do
        echo "== ${v/X=1/default}"
        env $v "$b" "$@" --ctx-batch 0 --grpo-prompts 0 || exit 1
    done' "$BENCH" "${PF_ARGS[@]}"
if [ $DRY = 1 ]; then
    PFX_ARGS=(--backend cpu --shape tiny --threads 4 --batches 1,4 --prompt 16 --new 8)
else
    PFX_ARGS=(--cuda-graphs --batches 1,4,8,16 --prompt 512 --new 128)
fi
step bench_prefetch 150 bash -c 'b=$0; for v in 8 0 8 0; do
        echo "== ANVIL_CUDA_PREFETCH_ROWS=$v"
        ANVIL_CUDA_PREFETCH_ROWS=$v "$b" "$@" --ctx-batch 0 --grpo-prompts 0 || exit 1
    done' "$BENCH" "${PFX_ARGS[@]}"
step bench_part 300 bash -c 'b=$0; for v in f32 f16 f32 f16 bf16; do
        echo "== ANVIL_CUDA_ATTN_PART=$v"
        ANVIL_CUDA_ATTN_PART=$v "$b" "$@" --batches none --ctx-batch 0 || exit 1
    done' "$BENCH" "${GR_ARGS[@]}"
step model_part 120 bash -c 'for v in f32 bf16; do
        echo "== ANVIL_CUDA_ATTN_PART=$v"
        ANVIL_CUDA_ATTN_PART=$v "$0" || exit $?
    done' "$T_MODEL"
if [ $DRY = 0 ] && command -v ncu > /dev/null; then
    # as kernels_group, with the combine: 12 launches (4 layers) some 20 decode steps in
    step kernels_part 200 bash -c 'for v in f32 f16; do
            echo "== ANVIL_CUDA_ATTN_PART=$v"
            ANVIL_CUDA_ATTN_PART=$v ncu --csv --clock-control none \
                --kernel-name regex:"s_attn_decode|s_attn_group|s_attn_combine" \
                --launch-skip 2000 --launch-count 12 --metrics \
                gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum \
                "$0" --batches none --ctx-batch 0 --grpo-prompts 16 --grpo-samples 8 \
                --grpo-prompt 1024 --grpo-min-new 48 --grpo-max-new 64 || exit 1
        done' "$BENCH"
    step kernels 240 "$PY" "$BENCHDIR/ncu_step.py" --bench "$BENCH" --out "$OUT" --batch 1
    step kernels_b256 120 "$PY" "$BENCHDIR/ncu_step.py" --bench "$BENCH" --out "$OUT" --batch 256 \
        --ctx-len 2048
    # the prefill's 65 kernels named *attn* or *gemv* (32 x attention + combine, the lm_head
    # row) and two decode steps' 193 each, then layer 0 of the third decode step (no graphs)
    step kernels_gemv 240 ncu --clock-control none --kernel-name regex:"gemv|attn" \
        --launch-skip 451 --launch-count 6 --section SpeedOfLight \
        --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats \
        --section LaunchStats --section SchedulerStats "$BENCH" --batches 1 --prompt 512 \
        --new 8 --ctx-batch 0 --grpo-prompts 0
    step kernels_prefill 120 ncu --clock-control none --kernel-name regex:"s_attn_prefill" \
        --launch-count 2 --section SpeedOfLight --section ComputeWorkloadAnalysis \
        --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats \
        --section SchedulerStats "$BENCH" --batches 2 --prompt 1024 --new 2 --ctx-batch 0 \
        --grpo-prompts 0
    # 8 prefill steps (2 prompts each), then decodes: layers 0..3 of the 11th step
    step kernels_group 200 bash -c 'for v in 1 0; do
            echo "== ANVIL_CUDA_ATTN_GROUP=$v"
            ANVIL_CUDA_ATTN_GROUP=$v ncu --csv --clock-control none \
                --kernel-name regex:"s_attn_decode|s_attn_group" --launch-skip 320 \
                --launch-count 8 --metrics \
                gpu__time_duration.sum,dram__bytes_read.sum,lts__t_bytes.sum "$0" \
                --batches none --ctx-batch 0 --grpo-prompts 16 --grpo-samples 8 \
                --grpo-prompt 1024 --grpo-min-new 48 --grpo-max-new 64 || exit 1
        done' "$BENCH"
    # 10 decode steps of 32 layers in, all 512 samples running
    step sass_group 200 bash -c '"$0" --set full --import-source no --clock-control none \
            --kernel-name regex:"s_attn_group" --launch-skip 320 --launch-count 1 -f \
            -o "$2/sass_group" "$1" --batches none --ctx-batch 0 --grpo-prompts 64 \
            --grpo-samples 8 --grpo-prompt 1024 --grpo-min-new 48 --grpo-max-new 64 \
            > /dev/null || exit 1
        "$0" -i "$2/sass_group.ncu-rep" --page source --csv --print-source sass \
            > "$2/sass_group.csv" || exit 1
        "$3" "$4/ncu_sass.py" "$2/sass_group.csv"' ncu "$BENCH" "$OUT" "$PY" "$BENCHDIR"
    step kernels_fma 240 env ANVIL_CUDA_KV=fp8 bash -c '
            "$0" "$1" --bench "$2" --out "$3/fp8" --batch 256 --ctx-len 2048 || exit 1
            ANVIL_CUDA_ATTN_MMA=0 "$0" "$1" --bench "$2" --out "$3/fma" --batch 256 \
                --ctx-len 2048' "$PY" "$BENCHDIR/ncu_step.py" "$BENCH" "$OUT"
else
    log "kernels: needs ncu and the GPU, not run"
fi

# ncu_rows REGEX LOG: a `ncu --csv` log's rows of the kernels matching REGEX, one metric a line
# (launch, kernel, metric, value), and its "== " headers
ncu_rows() {
    grep -E "^==|$1" "$2" 2>/dev/null |
        awk -F'","' '/^==/ {print; next} {n=$5; sub(/<.*/, "", n); print $1" "n" "$(NF-2)" "$NF}'
}

# figures: the bench's lines and the peer's next to each other
{
    echo "== bench"
    grep -E "^(device|decode|decode_ctx|grpo|summary)" "$OUT/bench.log" 2>/dev/null
    echo "== the same decode batches without PDL (ANVIL_CUDA_PDL=0)"
    grep -E "^(device|decode|summary)" "$OUT/bench_nopdl.log" 2>/dev/null
    echo "== the same decode batches with the matmuls op by op (ANVIL_ENGINE_LINEAR=0)"
    grep -E "^(device|decode|decode_ctx|summary)" "$OUT/bench_oneop.log" 2>/dev/null
    echo "== the same decode batches with the clustered sampler (ANVIL_CUDA_SAMPLE_BLOCKS=8)"
    grep -E "^(device|decode|summary)" "$OUT/bench_samp8.log" 2>/dev/null
    echo "== sample call timings (test_cuda_ops)"
    grep -E "sample timing" "$OUT/ops_test.log" 2>/dev/null
    echo "== hf peer"
    grep -E "^hf_" "$OUT/hf_peer.log" 2>/dev/null
    echo "== fp8 KV: accuracy (vs HF) and speed"
    grep -E "^(engine vs|HF bf16|ok|FAIL)" "$OUT/vs_hf_fp8.log" 2>/dev/null
    grep -E "^(device|decode|decode_ctx)" "$OUT/bench_fp8.log" 2>/dev/null
    echo "== the FMA decode attention (ANVIL_CUDA_ATTN_MMA=0): fp8 KV, then bf16"
    grep -E "^(device|decode|decode_ctx)" "$OUT/bench_fma.log" 2>/dev/null
    echo "== one batch-1 decode step, kernel by kernel (ncu)"
    grep -E "^(kernel|step) " "$OUT/kernels.log" 2>/dev/null
    echo "== the A/B base: bf16 then fp8 KV, the defaults; batch 1 at 1 / 5 / 10 GEMV waves"
    grep -E "^(==|device|decode|decode_ctx)" "$OUT/bench_kvs.log" 2>/dev/null
    echo "== each product of a layer on its own, by the default rule and per segment count (linear)"
    grep -E "^linear " "$OUT/linear.log" 2>/dev/null
    echo "== the tensor-core decode with V loaded with K (ANVIL_CUDA_ATTN_VLATE=0)"
    grep -E "^(==|device|decode|decode_ctx)" "$OUT/bench_vlate.log" 2>/dev/null
    echo "== the decode grid with a tile's KV heads next to each other (ANVIL_CUDA_ATTN_KV_INNER=1)"
    grep -E "^(==|device|decode|decode_ctx)" "$OUT/bench_kvi.log" 2>/dev/null
    echo "== every switch against the default (bench_ab; graphs tok/s, ratio to the group's default)"
    [ -f "$OUT/bench_ab.log" ] && "$PY" "$BENCHDIR/bench_ab_table.py" "$OUT/bench_ab.log" 2>&1
    grep -E "^(==|device|decode|decode_ctx)" "$OUT/bench_ab.log" 2>/dev/null
    echo "== one batch-1 decode layer's kernels in detail (ncu sections)"
    metrics="Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per"
    metrics="$metrics|Theoretical Occupancy|Warp Cycles Per Issued|Block Limit|Waves Per SM"
    grep -E "^  [a-z_]|^    ($metrics|Grid Size)" "$OUT/kernels_gemv.log" 2>/dev/null
    echo "== one batch-256 decode step at 2k context, kernel by kernel (ncu)"
    grep -E "^(kernel|step) " "$OUT/kernels_b256.log" 2>/dev/null
    echo "== the same step with fp8 KV: mma decode, then FMA decode (ncu)"
    grep -E "^(kernel|step) " "$OUT/kernels_fma.log" 2>/dev/null
    echo "== prefill of 1k-token prompts: prefill attention on tensor cores, then FMA"
    grep -E "^(==|decode )" "$OUT/bench_prefill.log" 2>/dev/null
    echo "== GRPO with the group tiles, without, with (ANVIL_CUDA_ATTN_GROUP=1 / 0 / 1)"
    grep -E "^(==|grpo )" "$OUT/bench_group.log" 2>/dev/null
    echo "== a GRPO step's decode attention, with the group tiles and without (ncu, a layer a line)"
    ncu_rows "s_attn_(decode|group)" "$OUT/kernels_group.log"
    echo "== GRPO with the decode partials in fp32 (the default), fp16, fp32, fp16, bf16"
    grep -E "^(==|grpo )" "$OUT/bench_part.log" 2>/dev/null
    echo "== the whole model against the CPU with fp32 and bf16 decode partials"
    grep -E "^(==|ok|FAIL)|checks" "$OUT/model_part.log" 2>/dev/null
    echo "== a GRPO step's decode attention and combine, fp32 / fp16 partials (ncu)"
    ncu_rows "s_attn_(decode|group|combine)" "$OUT/kernels_part.log"
    echo "== the group kernel's stalls by region and instruction (ncu source page, ncu_sass.py)"
    grep -E "^(samples|stalls|region|hot) " "$OUT/sass_group.log" 2>/dev/null
    echo "== the tensor-core prefill attention in detail (ncu sections)"
    pm="Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers Per"
    pm="$pm|Warp Cycles Per Issued|Issue Slots Busy|Executed Ipc Active|Block Limit"
    grep -E "^  [a-z_]|^    ($pm)" "$OUT/kernels_prefill.log" 2>/dev/null
} > "$OUT/figures.txt"
log "done in $(( $(date +%s) - START ))s; summary:"
cat "$SUMMARY" | tee -a "$OUT/session.log"
exit 0

#!/usr/bin/env bash
# gpu_bench.sh LOGDIR - exec_worker figures on a GPU machine (label gpu/bench; exits 77 without
# a CUDA GPU). Prints the figures and writes every result line and worker log under LOGDIR.
#
#   1. calibration: KernelBench level-1 references submitted as their own candidates
#      (88_MinGPTNewGelu full size, 1_Square_matrix_multiplication_ full size), 3 times each:
#      correct, speedup should be 1.00 +- 0.05 (static checks and the Triton-launch rule are
#      off for these runs only, since a pure-torch candidate is the point);
#   2. a known-faster Triton kernel (bench/gelu_fused.py, one fused pass instead of the
#      reference's chain of elementwise kernels) must measure faster; the same kernel is
#      scored 5 times in one warm worker and the spread of its time is printed (goal <= 3 %);
#   3. throughput: evaluations per minute per GPU with the warm pool (5 more evaluations in the
#      same worker) and the per-candidate overhead beyond the timed work, against a
#      fresh-process-per-candidate baseline (anvil-exec-worker --score-once, 3 times) measured
#      in the same run. Goal: overhead <= 1 s per candidate.
#
# Environment: ANVIL_BUILD_DIR (default <repo>/build), ANVIL_SHARED_DIR (default
# <repo>/../shared), ANVIL_PYTHON (default python3 on PATH), ANVIL_GPU (default 0).
# ANVIL_BENCH_DRY=1 runs the same steps on the CPU at toy sizes (checks the script, no figures).
# Sizes of the run (for short device leases): ANVIL_BENCH_CALIB (calibration rounds, default 3),
# ANVIL_BENCH_MM (0 leaves out the matmul calibration, default 1), ANVIL_BENCH_WARM (warm
# evaluations of the fused kernel, default 10, at least 6), ANVIL_BENCH_FRESH (fresh-process
# runs, default 3).
set -uo pipefail
logdir=${1:?usage: gpu_bench.sh LOGDIR}
mkdir -p "$logdir"
logdir=$(cd "$logdir" && pwd)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
build=${ANVIL_BUILD_DIR:-$repo/build}
shared=${ANVIL_SHARED_DIR:-$repo/../shared}
python=${ANVIL_PYTHON:-$(command -v python3)}
worker=$build/exec_worker/anvil-exec-worker
kb=$shared/datasets/kernelbench/level1
gelu=$kb/88_MinGPTNewGelu.py
mm=$kb/1_Square_matrix_multiplication_.py

[ -x "$worker" ] || { echo "gpu_bench: $worker not built"; exit 1; }
device=cuda
globals=()
if [ "${ANVIL_BENCH_DRY:-0}" = 1 ]; then
    device=cpu
    globals=(--task-globals '{"batch_size": 4, "dim": 512, "N": 32}')
elif ! "$python" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "gpu_bench: skipped: no CUDA GPU visible to $python"
    exit 77
fi
[ "$device" = cuda ] && "$python" -c "import torch, triton; print('gpu', torch.cuda.get_device_name(0), 'torch', torch.__version__, 'triton', triton.__version__)" | tee "$logdir/env.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv >>"$logdir/env.txt" 2>&1 || true

common=("${globals[@]}" --device "$device" --gpu "${ANVIL_GPU:-0}" --python "$python" --pool-size 2 --min-iters 20
        --max-iters 300 --batch 10 --target-rel-err 0.005 --log-level info)

refcand() { # TASK OUT: the reference as a candidate (ModelNew = Model)
    { echo '```python'; cat "$1"; echo; echo 'ModelNew = Model'; echo '```'; } >"$2"
}
refcand "$gelu" "$logdir/ref_gelu.py"
refcand "$mm" "$logdir/ref_mm.py"

: >"$logdir/calib.in.jsonl"
calib_tasks=(gelu)
[ "${ANVIL_BENCH_MM:-1}" = 1 ] && calib_tasks+=(mm)
for i in $(seq 1 "${ANVIL_BENCH_CALIB:-3}"); do
    echo "{\"task\": \"$gelu\", \"candidate\": \"$logdir/ref_gelu.py\"}" >>"$logdir/calib.in.jsonl"
    [ "${ANVIL_BENCH_MM:-1}" = 1 ] &&
        echo "{\"task\": \"$mm\", \"candidate\": \"$logdir/ref_mm.py\"}" >>"$logdir/calib.in.jsonl"
done
echo "== calibration (reference as its own candidate)"
"$worker" --score-batch "$logdir/calib.in.jsonl" "${common[@]}" --static-checks=false \
    --require-triton=false --allow-ops '*' >"$logdir/calib.jsonl" 2>"$logdir/calib.log"
echo "worker exit $?"

: >"$logdir/warm.in.jsonl"
nwarm=${ANVIL_BENCH_WARM:-10}
[ "$nwarm" -lt 6 ] && nwarm=6
for i in $(seq 1 "$nwarm"); do
    echo "{\"task\": \"$gelu\", \"candidate\": \"$here/bench/gelu_fused.py\"}" >>"$logdir/warm.in.jsonl"
done
echo "== fused kernel, $nwarm evaluations in one warm worker"
t0=$(date +%s.%N)
"$worker" --score-batch "$logdir/warm.in.jsonl" "${common[@]}" >"$logdir/warm.jsonl" 2>"$logdir/warm.log"
echo "worker exit $?"
t1=$(date +%s.%N)
echo "$t0 $t1" >"$logdir/warm.wall"

echo "== baseline: a fresh worker process per candidate, ${ANVIL_BENCH_FRESH:-3} times"
: >"$logdir/fresh.jsonl"
: >"$logdir/fresh.wall"
for i in $(seq 1 "${ANVIL_BENCH_FRESH:-3}"); do
    s=$(date +%s.%N)
    "$worker" --score-once --json --task "$gelu" --candidate "$here/bench/gelu_fused.py" \
        "${common[@]}" >>"$logdir/fresh.jsonl" 2>>"$logdir/fresh.log"
    e=$(date +%s.%N)
    echo "$s $e" >>"$logdir/fresh.wall"
done

"$python" - "$logdir" "${ANVIL_BENCH_MM:-1}" <<'PY' | tee "$logdir/figures.txt"
import json, statistics as st, sys, pathlib
d = pathlib.Path(sys.argv[1])
load = lambda n: [json.loads(l) for l in (d / n).read_text().splitlines() if l.startswith("{")]
def work_ms(r):  # the timed work itself: every timed call of both sides
    return (r["timing"]["ref_iters"] or 0) * (r["timing"]["ref_host_ms"] or 0) + \
           (r["timing"]["cand_iters"] or 0) * (r["timing"]["cand_host_ms"] or 0)
calib = load("calib.jsonl")
print(f"sandbox mode: {calib[0]['env']['sandbox'] if calib else '?'}; gpu {calib[0]['env']['gpu'] if calib else '?'}")
step = 2 if sys.argv[2] == "1" else 1
names = ("88_MinGPTNewGelu", "1_Square_matrix_multiplication_")[:step]
for k, name in enumerate(names):
    rows = calib[k::step]
    sp = [r["speedup"] for r in rows if r["status"] == "correct"]
    bad = [r["status"] + ": " + (r["error"] or "") for r in rows if r["status"] != "correct"]
    ok = sp and all(abs(s - 1) <= 0.05 for s in sp)
    print(f"reference as candidate {name}: speedups {['%.3f' % s for s in sp]} "
          f"ref_ms {['%.4f' % r['ref_ms'] for r in rows if r['ref_ms']]} -> "
          f"{'within' if ok else 'OUTSIDE'} 1.00 +- 0.05 {bad if bad else ''}")
warm = load("warm.jsonl")
good = [r for r in warm if r["status"] == "correct"]
if not good:
    print("fused kernel: no correct result:", [(r["status"], r["error"]) for r in warm][:3])
    sys.exit(0)
sp = [r["speedup"] for r in good]
print(f"fused Triton GELU vs reference: speedup mean {st.mean(sp):.3f} (min {min(sp):.3f}, "
      f"max {max(sp):.3f}); cand_ms {st.mean(r['cand_ms'] for r in good):.4f} "
      f"ref_ms {st.mean(r['ref_ms'] for r in good):.4f}; launches {good[0]['launches']}, "
      f"gpu_share {good[0]['gpu_share']}, compile_ms {good[0]['compile_ms']:.0f}")
five = [r["cand_ms"] for r in good[:5]]
spread = (max(five) - min(five)) / st.mean(five) * 100
print(f"same kernel timed 5 times: cand_ms {['%.4f' % v for v in five]} spread "
      f"{spread:.2f} % (goal <= 3 %)")
q = [[r["timing"].get(f"cand_p{p}_ms") for p in (10, 50, 90)] for r in good[:5]]
if all(None not in x for x in q):
    p50 = [x[1] for x in q]
    print(f"  per-call p10/p50/p90 ms {['%.4f/%.4f/%.4f' % tuple(x) for x in q]}; spread of "
          f"the medians {(max(p50) - min(p50)) / st.mean(p50) * 100:.2f} %")
lp = [(r["timing"].get("ref_launch_p90_ms"), r["timing"].get("cand_launch_p90_ms")) for r in good[:5]]
if all(None not in x for x in lp):
    print(f"  host launch p90 ms (ref/cand) {['%.4f/%.4f' % x for x in lp]} against a spin of "
          f"{good[0]['timing'].get('spin_us')} us")
t0, t1 = map(float, (d / "warm.wall").read_text().split())
print(f"warm worker: {len(warm)} evaluations in {t1 - t0:.1f} s (start-up included) = "
      f"{len(warm) / (t1 - t0) * 60:.1f} evaluations/min/GPU; steady state "
      f"{60000 / st.mean(r['timing']['eval_ms'] for r in good[1:] or good):.1f} evaluations/min")
ov = [r["timing"]["eval_ms"] - work_ms(r) for r in good[1:] or good]
print(f"warm per-candidate overhead beyond timed work: mean {st.mean(ov):.0f} ms "
      f"(eval {st.mean(r['timing']['eval_ms'] for r in good[1:] or good):.0f} ms, timed work "
      f"{st.mean(work_ms(r) for r in good[1:] or good):.0f} ms, waiting for a warm interpreter "
      f"{st.mean(r['timing']['wait_ms'] for r in good[1:] or good):.0f} ms)")
ph = {}
for r in good[1:] or good:
    for k, v in r["timing"].get("phases", {}).items():
        if v is not None:
            ph.setdefault(k, []).append(v)
print("warm phases, mean ms: " + ", ".join(f"{k} {st.mean(v):.0f}" for k, v in ph.items()))
fresh = load("fresh.jsonl")
walls = [b - a for a, b in (map(float, l.split()) for l in (d / "fresh.wall").read_text().splitlines())]
fov = [w * 1000 - work_ms(r) for w, r in zip(walls, fresh)]
print(f"fresh process per candidate: wall {st.mean(walls):.1f} s per candidate = "
      f"{60 / st.mean(walls):.1f} evaluations/min; overhead beyond timed work {st.mean(fov):.0f} ms "
      f"-> the warm pool saves {st.mean(fov) - st.mean(ov):.0f} ms per candidate")
PY

#!/usr/bin/env python3
"""ncu_step.py - where one decode step's time goes: every kernel of the last full step of
anvil-bench-engine at one batch size, profiled by Nsight Compute, with its duration and DRAM
bytes, so the gap to the memory-bandwidth limit can be assigned to kernels (slow ones) or to
the time between them (launches, host work).

    ncu_step.py --bench anvil-bench-engine --out DIR [--batch 1] [--ctx-len 0] [--ncu ncu]
    ncu_step.py --csv FILE            (summarise an existing `ncu --csv` file)

The bench runs with graphs off (the kernels are the same), prompt 512, 6 new tokens; with
--ctx-len L it runs the bench's decode_ctx instead (--batch sequences whose KV already holds L
positions, 3 new tokens): the batch-256 at 2k step, without a 2k-token prefill under the
profiler. A step
ends with the lm_head product, the kernel with the widest grid of the step (vocab rows); the
summary covers the kernels after the second-to-last such kernel up to the last one (the
sampling kernel delimits steps instead wherever it shows, see last_step). It prints
one line per kernel, grid and size class (name, count, us, MB read+written, GB/s) and a total: the sum of kernel
times, the bytes, their rate, and the bench's own ms/step with graphs off for the same batch
(from a second, unprofiled run) so that the difference is the time between kernels.
"""
import argparse
import csv
import io
import math
import os
import re
import subprocess
import sys

METRICS = "gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum"


def parse(text):
    """Kernels in launch order: dicts with name, grid, ns, bytes."""
    lines = text.splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        raise ValueError("no ncu CSV header in the output")
    kernels = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        try:
            kid = int(row["ID"])
        except (KeyError, ValueError):
            continue
        k = kernels.setdefault(kid, {"name": row.get("Kernel Name", "?"),
                                     "grid": row.get("Grid Size", "?"), "ns": 0.0, "bytes": 0.0})
        unit = row.get("Metric Unit", "")
        try:
            v = float(row.get("Metric Value", "0").replace(",", ""))
        except ValueError:
            continue
        scale = {"nsecond": 1, "usecond": 1e3, "msecond": 1e6, "second": 1e9,
                 "byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}.get(unit, 1)
        if row.get("Metric Name") == "gpu__time_duration.sum":
            k["ns"] = v * scale
        elif row.get("Metric Name", "").startswith("dram__bytes"):
            k["bytes"] += v * scale
    return [kernels[i] for i in sorted(kernels)]


def grid_blocks(g):
    n = 1
    for x in re.findall(r"\d+", g):
        n *= int(x)
    return n


def last_step(kernels):
    """The kernels of the last full step: after the second-to-last sampling kernel (one per
    step, its last kernel) up to the last one; without sampling kernels, between the last two
    widest-grid kernels (at batch 256 the widest is attention, once a layer, so the sampler
    is the delimiter wherever it shows)."""
    if not kernels:
        return []
    ends = [i for i, k in enumerate(kernels) if "s_sample_kernel" in k["name"]]
    if len(ends) < 2:
        widest = max(grid_blocks(k["grid"]) for k in kernels)
        ends = [i for i, k in enumerate(kernels) if grid_blocks(k["grid"]) == widest]
    if len(ends) < 2:
        return kernels[ends[-1]:] if ends else kernels
    return kernels[ends[-2] + 1:ends[-1] + 1]


def short(name):
    name = re.sub(r"\(.*", "", name)
    return name[:60]


def summarise(kernels, ms_step=None, out=sys.stdout):
    step = last_step(kernels)
    if not step:
        print("ncu_step: no kernels", file=out)
        return 1
    by = {}
    for k in step:
        # one line per kernel, grid and size class of its DRAM traffic (powers of two): the
        # GEMV of O and of down share kernel and grid at batch 1 and differ 3.5x in bytes
        cls = int(round(math.log2(k["bytes"]))) if k["bytes"] > 0 else 0
        key = (short(k["name"]), k["grid"], cls)
        e = by.setdefault(key, {"n": 0, "ns": 0.0, "bytes": 0.0, "grid": k["grid"]})
        e["n"] += 1
        e["ns"] += k["ns"]
        e["bytes"] += k["bytes"]
    for key, e in sorted(by.items(), key=lambda kv: -kv[1]["ns"]):
        gbs = e["bytes"] / e["ns"] if e["ns"] else 0
        print("kernel %-60s n=%-4d us=%9.1f mb=%9.1f gbps=%6.0f grid=%s"
              % (key[0], e["n"], e["ns"] / 1e3, e["bytes"] / 1e6, gbs, e["grid"]), file=out)
    ns = sum(k["ns"] for k in step)
    b = sum(k["bytes"] for k in step)
    line = "step kernels=%d kernel_us=%.1f mb=%.1f kernel_gbps=%.0f" % (
        len(step), ns / 1e3, b / 1e6, b / ns if ns else 0)
    if ms_step:
        line += " bench_ms_step=%.3f between_kernels_us=%.1f" % (ms_step, ms_step * 1e3 - ns / 1e3)
    print(line, file=out)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench")
    ap.add_argument("--out")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--ctx-len", type=int, default=0)
    ap.add_argument("--ncu", default="ncu")
    ap.add_argument("--csv", help="summarise this ncu --csv output instead of running")
    a = ap.parse_args()
    if a.csv:
        with open(a.csv) as f:
            return summarise(parse(f.read()))
    if not a.bench or not a.out:
        ap.error("--bench and --out are needed (or --csv)")
    os.makedirs(a.out, exist_ok=True)
    if a.ctx_len > 0:
        args = [a.bench, "--batches", "none", "--ctx-batch",
                str(a.batch), "--ctx-len", str(a.ctx_len), "--ctx-new", "3", "--grpo-prompts", "0"]
        line = r"decode_ctx batch=%d\s.*?ms_step=([\d.]+)" % a.batch
        tag = "batch%d_ctx%d" % (a.batch, a.ctx_len)
    else:
        args = [a.bench, "--batches", str(a.batch), "--prompt", "512", "--new", "6",
                "--ctx-batch", "0", "--grpo-prompts", "0"]
        line = r"decode batch=%d\s.*?ms_step=([\d.]+)" % a.batch
        tag = "batch%d" % a.batch
    # the unprofiled run times 32 steps, not the profiled run's 3 or 6: over 3 steps batch 256
    # x 1k read 50 ms a step on the H100 against 21.8 ms of kernels (the first step pays the
    # decode shapes' first use, cuBLASLt's heuristics and buffers, most likely; not profiled)
    timed = [("32" if i > 0 and args[i - 1] in ("--ctx-new", "--new") else v)
             for i, v in enumerate(args)]
    plain = subprocess.run(timed, capture_output=True, text=True, timeout=300)
    m = re.search(line, plain.stdout)
    ms_step = float(m.group(1)) if m else None
    # the GPU's own clocks (ncu locks them to base by default, which makes the small,
    # latency-bound kernels read far slower than they run); caches are still flushed before
    # each kernel, as a decode step's next layer finds its weights out of L2 anyway
    p = subprocess.run([a.ncu, "--csv", "--clock-control", "none", "--metrics", METRICS] + args,
                       capture_output=True,
                       text=True, timeout=900)
    with open(os.path.join(a.out, "ncu_%s.csv" % tag), "w") as f:
        f.write(p.stdout)
    if p.returncode != 0:
        print("ncu_step: ncu exited %d: %s" % (p.returncode, p.stderr[-1500:]))
        return 1
    with open(os.path.join(a.out, "ncu_%s.txt" % tag), "w") as f:
        rc = summarise(parse(p.stdout), ms_step, f)
    with open(os.path.join(a.out, "ncu_%s.txt" % tag)) as f:
        sys.stdout.write(f.read())
    return rc


if __name__ == "__main__":
    sys.exit(main())

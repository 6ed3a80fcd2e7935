#!/usr/bin/env python3
"""test_bench_ab_table.py - bench_ab_table.py's reading of a bench_ab log: a group's reference
is the mean of its default runs and their drift is reported, graphs_tok_s is preferred over
tok_s, a failed or cut-off run is listed as missing, a group without a finished default has
no ratios, and a log without runs is an error. A log written here; no GPU needed."""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "..", "..", "gen_worker", "engine", "cuda", "bench")
sys.path.insert(0, BENCH)
import bench_ab_table  # noqa: E402

LOG = """== b1 default
device=H200 copy_gbps=4246
decode batch=1    prompt=512 new=128 tok_s=180.0 ms_step=5.5 graphs_tok_s=200.0 graphs_ms_step=5.0
== b1 ANVIL_CUDA_GEMV_RING=1
decode batch=1    prompt=512 new=128 tok_s=190.0 ms_step=5.2 graphs_tok_s=212.0 graphs_ms_step=4.7
== b1 ANVIL_CUDA_GEMV_FOLD=1
== failed: rc 1
== b1 default
decode batch=1    prompt=512 new=128 tok_s=181.0 ms_step=5.5 graphs_tok_s=204.0 graphs_ms_step=4.9
== ctx8 default
== failed: rc 1
== ctx8 ANVIL_CUDA_ATTN_PERSIST=1
decode_ctx batch=256  ctx=2048 new=128 tok_s=9000.0 ms_step=28.4 prefill_tok_s=0
"""

FAILS = 0


def check(ok, what):
    global FAILS
    print(("ok   " if ok else "FAIL ") + what)
    FAILS += 0 if ok else 1


def main():
    runs = bench_ab_table.parse(LOG)
    check(len(runs) == 6, "six runs read (the 'failed' lines are not runs): %d" % len(runs))
    check(runs[0] == ("b1", "default", 200.0), "graphs_tok_s preferred: %r" % (runs[0],))
    check(runs[2] == ("b1", "ANVIL_CUDA_GEMV_FOLD=1", None), "a failed run has no figure")
    check(runs[5][2] == 9000.0, "tok_s when there is no graphs figure")
    out = bench_ab_table.table(runs)
    print(out)
    check("b1: default 202.0 tok/s (2 runs, drift 2.0 %)" in out, "reference and drift")
    ring = [l for l in out.splitlines() if "GEMV_RING" in l]
    check(len(ring) == 1 and ring[0].rstrip().endswith("x1.050"), "ratio to the reference")
    fold = [l for l in out.splitlines() if "GEMV_FOLD" in l]
    check(len(fold) == 1 and fold[0].rstrip().endswith("missing"), "failed run missing")
    check("ctx8: no default run finished" in out, "a group without a default")
    pers = [l for l in out.splitlines() if "PERSIST" in l]
    check(len(pers) == 1 and "x" not in pers[0].split("tok/s")[1], "no ratio without a default")
    with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as f:
        f.write("nothing here\n")
    r = subprocess.run([sys.executable, os.path.join(BENCH, "bench_ab_table.py"), f.name],
                       capture_output=True, text=True)
    os.unlink(f.name)
    check(r.returncode == 1 and "no runs" in r.stderr, "a log without runs is an error")
    r = subprocess.run([sys.executable, os.path.join(BENCH, "bench_ab_table.py"), "/nonexistent"],
                       capture_output=True, text=True)
    check(r.returncode == 1 and "nonexistent" in r.stderr, "a missing log is an error")
    print("%d failed" % FAILS)
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())

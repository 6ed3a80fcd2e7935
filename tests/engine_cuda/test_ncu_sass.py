#!/usr/bin/env python3
"""test_ncu_sass.py - ncu_sass.py's reading of Nsight Compute's source page: stall shares,
the regions between barriers and what they hold, the hottest instructions, two kernels in
one file, thousands separators, and a clear error (exit 2) for a file that is not a source
page. A CSV written here in ncu's `--page source --csv --print-source sass` layout; no GPU."""
import contextlib
import io
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "gen_worker", "engine", "cuda", "bench"))
import ncu_sass  # noqa: E402

HEAD = ('"Address","Source","Warp Stall Sampling (All Samples)",'
        '"Warp Stall Sampling (Not-issued Samples)","# Samples","stall_barrier","stall_long_sb",'
        '"stall_wait","stall_long_sb (Not Issued)"')

fails = 0


def check(cond, what):
    global fails
    print("%s %s" % ("ok  " if cond else "FAIL", what))
    fails += 0 if cond else 1


def inst(addr, src, barrier, long_sb, wait):
    n = barrier + long_sb + wait
    return '"0x%x","%s","%s","%d","%d","%d","%d","%d","0"' % (
        addr, src, "{:,}".format(n), n, n, barrier, long_sb, wait)


def kernel(name, body):
    return ['"Kernel Name","%s",' % name, HEAD] + body


def main():
    # a load phase (LDG, a long-scoreboard wait), a barrier, a q.k phase (LDS, HMMA), a
    # barrier, a merge (LDS, STG) holding most samples
    k1 = kernel("void k1<128>(float *)", [
        inst(0, "LDG.E.128 R4, desc[UR4][R2.64]", 0, 0, 1),
        inst(16, "FMUL R8, R4, UR6", 0, 600, 0),
        inst(32, "BAR.SYNC.DEFER_BLOCKING 0x0", 100, 0, 0),
        inst(48, "LDS.128 R12, [R3]", 0, 0, 10),
        inst(64, "HMMA.16816.F32.BF16 R20, R12, R4, RZ", 0, 0, 89),
        inst(80, "@!P0 BAR.SYNC.DEFER_BLOCKING 0x0", 0, 0, 0),
        inst(96, "LDS R9, [R3+0x10]", 0, 0, 200),
        inst(112, "@P1 STG.E desc[UR4][R6.64], R9", 0, 1000, 0),
        inst(128, "EXIT", 0, 0, 0),
    ])
    k2 = kernel("void k2(int)", [inst(0, "EXIT", 0, 0, 7)])
    tmp = tempfile.TemporaryDirectory()
    path = os.path.join(tmp.name, "k.csv")
    with open(path, "w") as f:
        f.write("\n".join(k1 + k2) + "\n")
    with open(path, newline="") as f:
        ks = ncu_sass.parse(f)
    check(len(ks) == 2 and ks[0][0] == "void k1<128>(float *)" and ks[1][0] == "void k2(int)",
          "two kernels read, with their names")
    lines, s = ncu_sass.summarise(*ks[0], top=3)
    check(s["total"] == 2000, "samples summed, 1,000 read as 1000 (%d)" % s["total"])
    check(s["stalls"]["long_sb"] == 1600 and s["stalls"]["barrier"] == 100,
          "stalls by reason, the not-issued columns left out")
    r = s["regions"]
    check(len(r) == 3, "three regions: the barriers end the first two (%d)" % len(r))
    check(r[0]["first"] == 0 and r[0]["last"] == 2 and r[0]["samples"] == 701 and
          r[0]["main"] == "long_sb" and r[0]["holds"] == ["LDG 1"],
          "the load region: its samples, main reason, its one LDG")
    check(r[1]["samples"] == 99 and r[1]["main"] == "wait" and r[1]["holds"] == ["LDS 1", "HMMA 1"],
          "the q.k region: a predicated barrier ends it too, LDS and HMMA counted")
    check(r[2]["samples"] == 1200 and r[2]["holds"] == ["LDS 1", "STG 1"],
          "the merge region: a predicated STG counted by its opcode")
    hot = [l for l in lines if l.startswith("hot")]
    check(len(hot) == 3 and "STG.E" in hot[0] and "50.0%" in hot[0] and "FMUL" in hot[1],
          "the hottest instructions first, with their shares")
    check(any(l.startswith("region") and "60.0%" in l for l in lines), "a region's share printed")

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = ncu_sass.main([path, "--top", "2"])
    check(rc == 0 and out.getvalue().count("kernel ") == 2, "main prints both kernels")

    bad = os.path.join(tmp.name, "metrics.csv")
    with open(bad, "w") as f:
        f.write('"ID","Kernel Name","Metric Name","Metric Value"\n"0","k","gpu__time","1"\n')
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = ncu_sass.main([bad])
    check(rc == 2 and "--page source" in err.getvalue(),
          "another ncu CSV: exit 2, and how to export the source page")
    with contextlib.redirect_stderr(io.StringIO()):
        rc = ncu_sass.main([bad + ".missing"])
    check(rc == 2, "a missing file: exit 2")
    tmp.cleanup()
    print("test_ncu_sass: %d failed" % fails)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())

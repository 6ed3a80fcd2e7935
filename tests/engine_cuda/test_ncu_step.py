#!/usr/bin/env python3
"""test_ncu_step.py - ncu_step.py's reading of Nsight Compute CSV: the last full decode step
(between the last two widest-grid kernels) is the one summed, metric units are scaled, and
thousands separators parse. A CSV written here in ncu's --csv layout; no GPU needed."""
import io
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "gen_worker", "engine", "cuda", "bench"))
import ncu_step  # noqa: E402

HEAD = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
        '"Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit",'
        '"Metric Value"')


def rows(kid, name, grid, us, mb_read, mb_write):
    base = '"%d","1","b","h","%s","1","7","(256, 1, 1)","%s","0","9.0","m",' % (kid, name, grid)
    return [base + '"gpu__time_duration.sum","usecond","%s"' % us,
            base + '"dram__bytes_read.sum","Mbyte","%s"' % mb_read,
            base + '"dram__bytes_write.sum","Kbyte","%s"' % mb_write]


def main():
    lines = ["==PROF== Connected to process 1", HEAD]
    kid = 0
    # a fill kernel, then three steps of (norm, gemv, gemv, lm_head)
    for r in rows(kid, "fill(float*)", "(64, 1, 1)", "5", "1", "0"):
        lines.append(r)
    kid += 1
    for step in range(3):
        for name, grid, us, mb in (("void norm<float>(float*, int)", "(1, 1, 1)", "2", "0.1"),
                                   ("void s_gemv_kernel<1, bf16>(float*)", "(768, 1, 1)",
                                    "10" if step < 2 else "20", "50"),
                                   ("void s_gemv_kernel<1, bf16>(float*)", "(768, 1, 1)", "10",
                                    "50"),
                                   ("void s_gemv_kernel<1, bf16>(float*)", "(19392, 1, 1)",
                                    "1,000", "1,270")):
            lines += rows(kid, name, grid, us, mb, "8")
            kid += 1
    ks = ncu_step.parse("\n".join(lines))
    fails = 0

    def check(cond, what):
        nonlocal fails
        print(("ok   " if cond else "FAIL ") + what)
        fails += 0 if cond else 1

    check(len(ks) == 13, "13 kernels parsed (got %d)" % len(ks))
    check(abs(ks[4]["ns"] - 1e6) < 1, "1,000 usecond = 1e6 ns (got %s)" % ks[4]["ns"])
    check(abs(ks[1]["bytes"] - (0.1e6 + 8e3)) < 1, "Mbyte + Kbyte scaled and summed")
    step = ncu_step.last_step(ks)
    check(len(step) == 4, "the last step has 4 kernels (got %d)" % len(step))
    check(abs(sum(k["ns"] for k in step) - (2 + 20 + 10 + 1000) * 1e3) < 1,
          "the last step is the third (its first gemv took 20 us)")
    out = io.StringIO()
    rc = ncu_step.summarise(ks, ms_step=1.5, out=out)
    text = out.getvalue()
    print(text, end="")
    check(rc == 0, "summarise returns 0")
    check("step kernels=4 kernel_us=1032.0" in text, "total line sums the step")
    check(len([l for l in text.splitlines() if l.startswith("kernel ")]) == 3,
          "one line per kernel and grid (the lm_head apart from the other products)")
    check("between_kernels_us=468.0" in text, "time between kernels = ms_step - kernel time")
    # O and down at batch 1: the same kernel and grid, 33.6 and 117.4 MB a call
    g = "void s_gemv_kernel<1, bf16, 0, false>(float*)"
    od = [{"name": g, "grid": "(2048, 1, 1)", "ns": 12e3, "bytes": 33.6e6},
          {"name": g, "grid": "(2048, 1, 1)", "ns": 38e3, "bytes": 117.4e6}] * 2
    od.append({"name": "void s_sample_kernel<1>(float*)", "grid": "(1, 1, 1)", "ns": 3e3,
               "bytes": 1e3})
    out = io.StringIO()
    ncu_step.summarise(od[-1:] + od, out=out)
    text = out.getvalue()
    print(text, end="")
    check(len([l for l in text.splitlines() if l.startswith("kernel ")]) == 3,
          "a kernel and grid with calls 3.5x apart in bytes: a line for each size")
    check("n=2    us=     76.0 mb=    234.8" in text, "the down-sized calls summed apart")
    check(ncu_step.summarise([], out=io.StringIO()) == 1, "no kernels is an error")
    try:
        ncu_step.parse("no header here")
        check(False, "a file without the CSV header is refused")
    except ValueError:
        check(True, "a file without the CSV header is refused")
    # a batch-256 step: attention (twice a step here) has the widest grid; the sampler, once
    # a step and last, delimits the steps instead
    b = [HEAD]
    kid = 0
    for step in range(3):
        for name, grid, us in (("void s_attn_decode_kernel<128, 4>(float*)", "(4608, 8, 1)", "300"),
                               ("void s_attn_decode_kernel<128, 4>(float*)", "(4608, 8, 1)", "300"),
                               ("sm90_gemm(float*)", "(132, 1, 1)", "900" if step == 2 else "800"),
                               ("void s_sample_kernel<1>(float*)", "(256, 1, 1)", "40")):
            b += rows(kid, name, grid, us, "1", "0")
            kid += 1
    step = ncu_step.last_step(ncu_step.parse("\n".join(b)))
    check([k["name"][:8] for k in step] == ["void s_a", "void s_a", "sm90_gem", "void s_s"],
          "with sampling kernels, a step runs from after one sampler to the next")
    check(abs(sum(k["ns"] for k in step) - 1540e3) < 1, "the last step is the third (by the sampler)")
    print("%d failed" % fails)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""ncu_sass.py - where a kernel's warps wait, instruction by instruction: a summary of Nsight
Compute's source page (the warp-state samples of each SASS instruction) that names the phase
of the kernel the stalls are in, not just their reasons.

    ncu --set full --import-source no -o REP --kernel-name regex:NAME --launch-count 1 BIN ...
    ncu -i REP.ncu-rep --page source --csv --print-source sass > FILE.csv
    ncu_sass.py FILE.csv [--top 15]

For each kernel in the file it prints the sampled stalls by reason (share of all samples),
then the kernel cut into regions at its barriers (BAR.SYNC: a region is the code between
two, so the phases of a block's work fall apart: loads, q.k, p.v, a merge), each with its
samples, share, main stall reason and what it holds (global loads LDG / LDGSTS, shared loads
LDS, tensor-core HMMA, global stores STG), and the hottest instructions with their main
reason. This is how the group attention kernel's q loads and merge were found to hold 64 %
of its stalls (attention.cu). Exit 2 with a message on a file that is not such an export.
"""
import argparse
import csv
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
KINDS = (("LDG", ("LDG",)), ("LDGSTS", ("LDGSTS",)), ("LDS", ("LDS", "LDSM")),
         ("HMMA", ("HMMA",)), ("STG", ("STG",)))


def parse(lines):
    """Kernels in the export: a list of (name, header, rows), rows as lists of strings."""
    kernels, name, header, rows = [], None, None, []
    for rec in csv.reader(lines):
        if not rec:
            continue
        if rec[0] == "Kernel Name":
            if header is not None:
                kernels.append((name, header, rows))
            name, header, rows = (rec[1] if len(rec) > 1 else "?"), None, []
        elif header is None and "Source" in rec and SAMPLES in rec:
            header = rec
        elif header is not None and len(rec) == len(header):
            rows.append(rec)
    if header is not None:
        kernels.append((name, header, rows))
    if not kernels:
        raise ValueError("no ncu source page (a \"Kernel Name\" line, then a header with "
                         "\"Source\" and \"%s\"): export it with --page source --csv "
                         "--print-source sass" % SAMPLES)
    return kernels


def num(s):
    try:
        return int(float(s.replace(",", ""))) if s not in ("", "-") else 0
    except ValueError:
        return 0


def opcode(src):
    """The instruction's opcode: `@!P0 LDG.E.128 R4, ...` -> LDG.E.128"""
    parts = src.split()
    if parts and parts[0].startswith("@"):
        parts = parts[1:]
    return parts[0] if parts else ""


def summarise(name, header, rows, top):
    ix = {h: i for i, h in enumerate(header)}
    stalls = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    insts = []
    for r in rows:
        src = r[ix["Source"]].strip()
        insts.append({"src": src, "op": opcode(src), "n": num(r[ix[SAMPLES]]),
                      "by": {s[6:]: num(r[ix[s]]) for s in stalls}})
    total = sum(i["n"] for i in insts)
    out = ["kernel %s" % name, "samples %d, instructions %d" % (total, len(insts))]
    if total == 0:
        out.append("no samples (profile with --set full, or a section with SourceCounters)")
        return out, {"total": 0, "regions": []}
    by = {}
    for i in insts:
        for s, v in i["by"].items():
            by[s] = by.get(s, 0) + v
    out.append("stalls: " + ", ".join("%s %.1f%%" % (s, 100.0 * v / total)
                                       for s, v in sorted(by.items(), key=lambda x: -x[1])
                                       if v > 0)[:400])
    # regions between barriers (the barrier ends its region)
    regions, start = [], 0
    for k, i in enumerate(insts):
        if i["op"].startswith("BAR.SYNC") or k == len(insts) - 1:
            regions.append((start, k))
            start = k + 1
    res = []
    for a, b in regions:
        part = insts[a:b + 1]
        n = sum(i["n"] for i in part)
        rb = {}
        for i in part:
            for s, v in i["by"].items():
                rb[s] = rb.get(s, 0) + v
        main = max(rb.items(), key=lambda x: x[1])[0] if rb and n else "-"
        held = []
        for kind, prefixes in KINDS:
            c = sum(1 for i in part if i["op"].split(".")[0] in prefixes)
            if c:
                held.append("%s %d" % (kind, c))
        res.append({"first": a, "last": b, "samples": n, "main": main, "holds": held})
        out.append("region %4d-%-4d samples %6d %5.1f%%  main %-14s %s"
                   % (a, b, n, 100.0 * n / total, main, " ".join(held)))
    hot = sorted(range(len(insts)), key=lambda k: -insts[k]["n"])[:top]
    for k in hot:
        i = insts[k]
        if i["n"] == 0:
            break
        main = max(i["by"].items(), key=lambda x: x[1])[0] if i["by"] else "-"
        out.append("hot %4d %6d %5.1f%%  %-14s %s" % (k, i["n"], 100.0 * i["n"] / total, main,
                                                     i["src"][:70]))
    return out, {"total": total, "regions": res, "stalls": by}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", help="ncu -i REP --page source --csv --print-source sass output")
    ap.add_argument("--top", type=int, default=15, help="the hottest instructions shown")
    a = ap.parse_args(argv)
    try:
        with open(a.csv, newline="") as f:
            kernels = parse(f)
    except (OSError, ValueError, csv.Error) as e:
        print("ncu_sass.py: %s: %s" % (a.csv, e), file=sys.stderr)
        return 2
    for name, header, rows in kernels:
        lines, _ = summarise(name, header, rows, a.top)
        print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""bench_ab_table.py - gpu_session.sh's bench_ab log as a table: each switch's tok/s against
its group's default, so an A/B reads at a glance.

    bench_ab_table.py OUT/bench_ab.log

The log is a list of runs, each a line "== GROUP SWITCHES" (SWITCHES "default" for none)
followed by the bench's result lines ("decode ..." or "decode_ctx ...", with graphs_tok_s
when graphs were on). A group's reference is the mean of its default runs (gpu_session runs
the default first and last in each group); the drift between those runs is printed with the
group, since a switch's gain smaller than the drift is not a gain. A run that printed no
result line (it failed, or the step's time ran out) is listed as missing.
"""
import re
import sys


def parse(text):
    """[(group, switches, tok_s or None)] in log order."""
    runs = []
    for line in text.splitlines():
        m = re.match(r"^== (\S+) (.+)$", line)
        if m and m.group(1) != "failed:":
            runs.append([m.group(1), m.group(2).strip(), None])
            continue
        if runs and re.match(r"^decode(_ctx)? ", line):
            vals = dict(re.findall(r"(\w+)=([-\d.]+)", line))
            tok = vals.get("graphs_tok_s", vals.get("tok_s"))
            if tok is not None and runs[-1][2] is None:
                runs[-1][2] = float(tok)
    return [tuple(r) for r in runs]


def table(runs):
    out = []
    groups = []
    for g, _, _ in runs:
        if g not in groups:
            groups.append(g)
    for g in groups:
        rows = [(sw, t) for gg, sw, t in runs if gg == g]
        base = [t for sw, t in rows if sw == "default" and t is not None]
        if not base:
            out.append("%s: no default run finished" % g)
            ref = None
        else:
            ref = sum(base) / len(base)
            drift = (max(base) - min(base)) / ref if len(base) > 1 else 0.0
            out.append("%s: default %.1f tok/s (%d runs, drift %.1f %%)"
                       % (g, ref, len(base), 100 * drift))
        for sw, t in rows:
            if sw == "default":
                continue
            if t is None:
                out.append("  %-72s missing" % sw)
            elif ref:
                out.append("  %-72s %9.1f tok/s  x%.3f" % (sw, t, t / ref))
            else:
                out.append("  %-72s %9.1f tok/s" % (sw, t))
    return "\n".join(out)


def main(argv):
    if len(argv) != 2:
        sys.stderr.write(__doc__)
        return 2
    try:
        with open(argv[1], errors="replace") as f:
            runs = parse(f.read())
    except OSError as e:
        sys.stderr.write("bench_ab_table.py: %s\n" % e)
        return 1
    if not runs:
        sys.stderr.write("bench_ab_table.py: no runs in %s\n" % argv[1])
        return 1
    print(table(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

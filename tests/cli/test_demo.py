"""test_demo.py - `anvil demo`, the README's main command, end to end on this machine.

The demo runs `anvil up` (its own redis-server, broker, a gen worker on a small random model,
a CPU exec worker), imports KernelBench level-1 problems from ../shared/datasets, submits them,
watches, fetches the results and prints a summary; --down stops the cluster at the end. Checked
here: every step ran; the results file holds one scored line per sample, per problem as asked;
the summary's counts are the results file's; the processes `anvil down` names are gone; with
--curve the broker ran with keys and the demo's own commands still got through. Without the
dataset it refuses before starting anything.
"""
import collections
import json
import os
import re
import subprocess

import pytest

import anvil_cluster

STATUSES = {"format_error", "rejected_static", "compile_error", "runtime_error", "timeout",
            "crashed", "incorrect", "correct"}


def demo(data, *extra, timeout=600):
    path = anvil_cluster.binary("anvil")
    if path is None:
        pytest.skip("anvil is not built")
    args = [path, "demo", "--data", str(data), "--problems", "2", "--samples", "2",
            "--max-tokens", "32", "--down",
            "--client-endpoint", "tcp://127.0.0.1:%d" % anvil_cluster.free_port(),
            "--worker-endpoint", "tcp://127.0.0.1:%d" % anvil_cluster.free_port()] + list(extra)
    env = dict(os.environ)
    for k in ("ANVIL_BROKER", "ANVIL_CURVE_SECRET", "ANVIL_CURVE_SERVER"):
        env.pop(k, None)
    env.setdefault("ANVIL_SHARED_DIR", anvil_cluster.SHARED)
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env)


def gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open("/proc/%d/stat" % pid) as f:  # a zombie waiting for its reaper has exited
        return f.read().rsplit(")", 1)[1].split()[0] == "Z"


@pytest.mark.parametrize("curve", [False, True], ids=["plain", "curve"])
def test_demo_runs_the_whole_path(tmp_path, curve):
    kb = os.path.join(anvil_cluster.SHARED, "datasets", "kernelbench")
    if not os.path.isdir(kb):
        pytest.skip("datasets not found in %s" % anvil_cluster.SHARED)
    data = tmp_path / "data"
    r = demo(data, *(["--curve"] if curve else []))
    out = r.stdout
    assert r.returncode == 0, (r.returncode, out[-3000:], r.stderr[-3000:])
    for step in ("== anvil up", "== anvil import kernelbench", "== anvil submit",
                 "== anvil watch", "== anvil results"):
        assert step in out, (step, out[-3000:])
    path = re.search(r"^results: (\S+)$", out, re.M).group(1)
    rows = [json.loads(line) for line in open(path) if line.strip()]
    assert len(rows) == 4, rows
    per_problem = collections.Counter(row["custom_id"] for row in rows)
    assert sorted(per_problem.values()) == [2, 2], per_problem
    assert all(k.startswith("kernelbench/level1/") for k in per_problem)
    assert sorted(row["sample"] for row in rows) == [0, 0, 1, 1]
    statuses = collections.Counter(row["score"]["status"] for row in rows)
    assert set(statuses) <= STATUSES, statuses
    assert "samples 4 (scored 4, not scored 0, failed to generate 0)" in out, out[-2000:]
    for status, count in statuses.items():
        assert re.search(r"^\s+%s\s+%d$" % (status, count), out, re.M), (status, out[-2000:])
    correct = statuses.get("correct", 0)
    assert "pass rate %.1f%% (%d of 4 scored)" % (100.0 * correct / 4, correct) in out
    # --down: every process `anvil down` stopped has exited
    stopped = [int(p) for p in re.findall(r"^anvil down: stopped \S+ \(pid (\d+)\)$",
                                          r.stderr, re.M)]
    assert len(stopped) == 4, r.stderr[-2000:]
    assert all(gone(p) for p in stopped), stopped
    broker_log = (data / "logs" / "broker.log").read_text()
    if curve:
        assert "curve on: broker public key" in broker_log
        assert (data / "keys" / "client.key_secret").exists()
    else:
        assert "curve on" not in broker_log


def test_demo_without_dataset_starts_nothing(tmp_path):
    data = tmp_path / "data"
    r = demo(data, "--dataset", str(tmp_path / "no-such-kernelbench"), timeout=60)
    assert r.returncode != 0
    assert "nothing was started" in r.stderr, r.stderr
    assert not (data / "logs").exists()

"""test_exec_worker.py - anvil-exec-worker end to end: known-good, wrong and hostile candidates.

One worker process scores the whole suite (--score-batch), so every hostile candidate is also a
test that the worker keeps serving: a good candidate scored last must still come out correct.
Runs on CPU: torch on the CPU and Triton in its interpreter (TRITON_INTERPRET=1, set by the
worker inside the sandbox). Hostile candidates run twice: with the static checks (the policy
must reject them) and, where the static checks would stop them, with the checks off, so the
sandbox itself has to stop them at run time.
"""
import json
import os
import pathlib
import subprocess
import sys
import threading
import time

import pytest

HERE = pathlib.Path(__file__).resolve().parent
SRC = pathlib.Path(os.environ.get("ANVIL_SOURCE_DIR", HERE.parents[1]))
BUILD = pathlib.Path(os.environ.get("ANVIL_BUILD_DIR", SRC / "build"))
SHARED = pathlib.Path(os.environ.get("ANVIL_SHARED_DIR", SRC.parent / "shared"))
KB = SHARED / "datasets" / "kernelbench" / "level1"
TB = SHARED / "datasets" / "tritonbench"
WORKER = BUILD / "exec_worker" / "anvil-exec-worker"
PYTHON = os.environ.get("ANVIL_PYTHON", sys.executable)
CAND = HERE / "candidates"

RELU = (KB / "19_ReLU.py", {"batch_size": 4, "dim": 1000})
SOFTMAX = (KB / "23_Softmax.py", {"batch_size": 4, "dim": 256})
MATMUL = (KB / "1_Square_matrix_multiplication_.py", {"N": 64})
TBG_ADD = TB / "TritonBench_G_v1" / "add_example.py"
TBT_ABS = TB / "TritonBench_T_v1" / "abs.py"
SLEEPY = HERE / "tasks" / "sleepy_double.py"  # a reference as slow as its globals say

FAST = ["--python", PYTHON, "--min-iters", "3", "--max-iters", "6", "--batch", "3",
        "--compile-timeout", "20", "--run-timeout", "40", "--pool-size", "1",
        "--log-level", "warn"]

# (candidate, task, expected statuses, static checks on, extra check)
SUITE = [
    ("good_relu", RELU, {"correct"}, True),
    ("good_matmul", MATMUL, {"correct"}, True),
    ("good_softmax", SOFTMAX, {"correct"}, True),
    ("good_tbg_add_gold", ("tritonbench-g", TBG_ADD), {"correct"}, True),
    ("good_tbt_abs", ("tritonbench-t", TBT_ABS), {"correct"}, True),
    ("wrong_relu", RELU, {"incorrect"}, True),
    ("wrong_tbg_add", ("tritonbench-g", TBG_ADD), {"incorrect"}, True),
    ("format_no_block", RELU, {"format_error"}, True),
    ("format_unfinished_think", RELU, {"format_error"}, True),
    ("compile_syntax_error", RELU, {"compile_error"}, True),
    ("compile_import_error", RELU, {"compile_error"}, True),
    ("hostile_infinite_loop", RELU, {"timeout"}, True),
    ("hostile_huge_alloc", RELU, {"runtime_error"}, True),
    ("hostile_fake_verdict", RELU, {"incorrect"}, True),
    ("hostile_exit_early", RELU, {"runtime_error"}, True),
    ("hostile_zero_output", SOFTMAX, {"incorrect"}, True),
    ("hostile_reuse_freed", RELU, {"incorrect"}, True),
    ("hostile_mutate_inputs", RELU, {"incorrect"}, True),
    # the static checks stop these ...
    ("hostile_fork_bomb", RELU, {"rejected_static"}, True),
    ("hostile_read_host_file", RELU, {"rejected_static"}, True),
    ("hostile_socket", RELU, {"rejected_static"}, True),
    ("hostile_write_outside_tmp", RELU, {"rejected_static"}, True),
    ("hostile_kill_parent", RELU, {"rejected_static"}, True),
    ("hostile_os_exit", RELU, {"rejected_static"}, True),
    ("hostile_side_stream", RELU, {"rejected_static"}, True),
    ("hostile_patch_timer", RELU, {"rejected_static"}, True),
    ("hostile_patch_torch_cuda", RELU, {"rejected_static"}, True),
    ("hostile_try_fallback", RELU, {"rejected_static"}, True),
    ("hostile_decoy_kernel", RELU, {"rejected_static"}, True),
    ("hostile_pointer_cache", RELU, {"rejected_static"}, True),
    # ... and the sandbox and the worker's own checks stop them when the static checks are off
    ("hostile_fork_bomb", RELU, {"runtime_error", "crashed", "timeout"}, False),
    ("hostile_read_host_file", RELU, {"runtime_error"}, False),
    ("hostile_socket", RELU, {"runtime_error"}, False),
    ("hostile_write_outside_tmp", RELU, {"runtime_error"}, False),
    ("hostile_kill_parent", RELU, {"runtime_error", "crashed"}, False),
    ("hostile_os_exit", RELU, {"crashed"}, False),
    ("hostile_side_stream", RELU, {"runtime_error"}, False),
    ("hostile_patch_timer", RELU, {"incorrect"}, False),
    ("hostile_patch_torch_cuda", RELU, {"incorrect"}, False),
    ("hostile_decoy_kernel", RELU, {"incorrect"}, False),
    ("hostile_pointer_cache", RELU, {"incorrect"}, False),
    ("good_relu", RELU, {"correct"}, True),  # still serving
]


def _need():
    if not WORKER.exists():
        pytest.skip(f"{WORKER} not built")
    if not KB.exists() or not TB.exists():
        pytest.skip(f"datasets not found in {SHARED}")


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    _need()
    tmp = tmp_path_factory.mktemp("exec_suite")
    secret = tmp / "secret.txt"
    secret.write_text("anvil-host-secret\n")
    outside = tmp / "pwned.txt"
    lines = []
    for name, task, _, static in SUITE:
        text = (CAND / f"{name}.py").read_text()
        text = text.replace("SECRET_PATH", str(secret)).replace("OUTSIDE_PATH", str(outside))
        cpath = tmp / f"{name}.{'s' if static else 'd'}.py"
        cpath.write_text(text)
        if isinstance(task[0], str):
            kind, tpath, glob = task[0], task[1], None
        else:
            kind, tpath, glob = "kernelbench", task[0], task[1]
        line = {"kind": kind, "task": str(tpath), "candidate": str(cpath), "static_checks": static}
        if glob:
            line["globals"] = glob
        lines.append(json.dumps(line))
    batch = tmp / "suite.jsonl"
    batch.write_text("\n".join(lines) + "\n")
    proc = subprocess.run([str(WORKER), "--score-batch", str(batch), *FAST], capture_output=True,
                          text=True, timeout=900)
    results = [json.loads(l) for l in proc.stdout.splitlines() if l.startswith("{")]
    return {"proc": proc, "results": results, "outside": outside, "secret": secret}


def test_suite_ran_to_the_end(suite):
    proc = suite["proc"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(suite["results"]) == len(SUITE), proc.stderr[-3000:]


@pytest.mark.parametrize("i", range(len(SUITE)),
                         ids=[f"{n}-{'static' if s else 'dynamic'}" for n, _, _, s in SUITE])
def test_verdict(suite, i):
    name, _, want, _ = SUITE[i]
    if i >= len(suite["results"]):
        pytest.fail("no result (worker stopped early): " + suite["proc"].stderr[-2000:])
    r = suite["results"][i]
    assert r["status"] in want, f"{name}: {r['status']}: {r['error']}\n{r.get('traceback_tail')}"
    if r["status"] == "correct":
        assert r["reward"] >= 1.0 and r["launches"] >= 1 and r["speedup"] > 0
        assert r["ref_ms"] > 0 and r["cand_ms"] > 0
        assert r["env"]["torch"] and r["env"]["triton"] and r["env"]["device"] == "cpu"
    else:
        assert r["reward"] == 0


def test_flags_and_reasons(suite):
    by = {}
    for (name, _, _, static), r in zip(SUITE, suite["results"]):
        by[(name, static)] = r
    assert "zero_output_would_pass" in by[("good_softmax", True)]["flags"]
    zero = by[("hostile_zero_output", True)]
    assert "constant" in zero["error"] or "differs" in zero["error"]
    assert "modified its inputs" in by[("hostile_mutate_inputs", True)]["error"]
    assert "tampered" in by[("hostile_patch_timer", False)]["flags"]
    assert "no Triton kernel" in by[("hostile_decoy_kernel", False)]["error"]
    assert any("try/except" in e for e in by[("hostile_try_fallback", True)]["static_errors"])
    assert "budget" in by[("hostile_infinite_loop", True)]["error"]
    assert by[("hostile_fake_verdict", True)]["status"] == "incorrect"


def test_phases_account_for_the_evaluation(suite):
    """timing.phases says where an evaluation's wall time went: every phase a correct CPU
    evaluation passes through is there, none is negative, and together they stay within the
    evaluation's wall time; a rejected candidate stops after the static phase."""
    by = {(name, static): r for (name, _, _, static), r in zip(SUITE, suite["results"])}
    r = by[("good_relu", True)]
    ph = r["timing"]["phases"]
    for name in ("ref_start", "static", "ref", "cand_load", "cand_trials", "ref_wait", "compare",
                 "timing", "check"):
        assert ph[name] is not None and ph[name] >= 0, (name, ph)
    assert ph["profile"] is None  # CPU: no profiler pass
    parts = ("timing_dump", "timing_compare")  # within timing, not after it
    assert sum(v for k, v in ph.items() if v and k not in parts) <= r["timing"]["eval_ms"] + 1
    assert ph["timing"] > 0 and ph["cand_trials"] > 0
    rej = by[("hostile_try_fallback", True)]["timing"]["phases"]
    assert rej["static"] is not None and rej["ref"] is None and rej["timing"] is None
    assert rej["ref_wait"] is None
    assert rej["timing_dump"] is None and rej["timing_compare"] is None


def test_phases_split_timing(suite):
    """timing.phases also says what the timing phase's rounds spent on writing each side's
    compared output (timing_dump) and on comparing the two (timing_compare): every round does
    both, so each is above 0, and together they are part of timing."""
    for (name, _, _, _), r in zip(SUITE, suite["results"]):
        if r["status"] != "correct":
            continue
        ph = r["timing"]["phases"]
        dump, cmp = ph["timing_dump"], ph["timing_compare"]
        assert dump is not None and cmp is not None, (name, ph)
        assert dump > 0 and cmp > 0 and dump + cmp <= ph["timing"], (name, ph)


def test_no_host_side_effects(suite):
    assert not suite["outside"].exists(), "a sandboxed candidate wrote outside its sandbox"
    for r in suite["results"]:
        assert "anvil-host-secret" not in json.dumps(r)


def _once(tmp_path, cand_text, *extra):
    c = tmp_path / "c.py"
    c.write_text(cand_text)
    return subprocess.run([str(WORKER), "--score-once", "--kind", "kernelbench", "--task",
                           str(RELU[0]), "--task-globals", json.dumps(RELU[1]), "--candidate",
                           str(c), "--json", *FAST, *extra], capture_output=True, text=True,
                          timeout=300)


def test_score_once_exit_status(tmp_path):
    _need()
    p = _once(tmp_path, "no code at all")
    assert p.returncode == 0, p.stderr[-2000:]
    r = json.loads(p.stdout)
    assert r["status"] == "format_error" and r["reward"] == 0
    # a task that cannot be scored (no such file) is the only non-zero exit
    q = subprocess.run([str(WORKER), "--score-once", "--task", str(tmp_path / "nope.py"),
                        "--candidate", str(tmp_path / "c.py"), "--json", *FAST],
                       capture_output=True, text=True, timeout=300)
    assert q.returncode != 0


def test_reward_formula_is_configurable(tmp_path):
    _need()
    good = (CAND / "good_relu.py").read_text()
    p = _once(tmp_path, good, "--reward-formula", "correct * 7")
    r = json.loads(p.stdout)
    assert r["status"] == "correct" and r["reward"] == 7
    bad = subprocess.run([str(WORKER), "--score-once", "--task", "x", "--candidate", "y",
                          "--reward-formula", "correct *", *FAST], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and "reward formula" in bad.stderr


def test_output_wrong_only_in_timed_calls(tmp_path):
    """A candidate right in every trial and in the check after timing but wrong in the first
    round's timed calls is incorrect, caught by that round's compared output (which the
    harness keeps from a secretly chosen timed call and writes only on the dump command)."""
    _need()
    text = (CAND / "hostile_wrong_when_timed.py").read_text()
    # whole outputs, and 64 sampled elements of each (RELU's 4000-element output is below the
    # default sample, so the second run is the one that goes through the sampled check)
    for sample in ("0", "64"):
        p = _once(tmp_path, text, "--trials", "5", "--warmup", "0", "--batch", "3",
                  "--check-sample", sample)
        assert p.returncode == 0, p.stderr[-2000:]
        r = json.loads(p.stdout)
        assert r["status"] == "incorrect", (sample, r)
        assert "output during timing differs" in r["error"], (sample, r["error"])


def test_spin_option(tmp_path):
    """--spin-us is the worker's option for the GPU spin before each timed call (0 turns it
    off; on the CPU it changes nothing) and is bounded."""
    _need()
    good = (CAND / "good_relu.py").read_text()
    p = _once(tmp_path, good, "--spin-us", "0")
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout)["status"] == "correct"
    bad = _once(tmp_path, good, "--spin-us", "100001")
    assert bad.returncode == 2 and "spin-us" in bad.stderr, bad.stderr[-2000:]


def test_stale_work_dirs_are_cleared(tmp_path):
    """What a killed worker leaves in /dev/shm (its anvil-exec-<pid> directory with sandbox
    directories in it) is removed by the next worker, so a later worker that gets the same pid
    does not fail on 'File exists' (CI saw exactly that); a directory whose owner still holds
    its lock (a live worker in another PID namespace) is left alone."""
    import fcntl
    _need()
    base = pathlib.Path("/dev/shm" if os.access("/dev/shm", os.W_OK) else "/tmp")
    dead = [subprocess.Popen(["true"]) for _ in range(2)]
    for p in dead:
        p.wait()
    stale = base / f"anvil-exec-{dead[0].pid}"
    (stale / f"sbx-{dead[0].pid}-0" / "nested").mkdir(parents=True, exist_ok=True)
    (stale / f"sbx-{dead[0].pid}-0" / "nested" / "out.bin").write_bytes(b"x" * 100)
    held = base / f"anvil-exec-{dead[1].pid}-1"
    held.mkdir(exist_ok=True)
    fd = os.open(held, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        p = _once(tmp_path, "no code at all", "--log-level", "info")
        assert p.returncode == 0, p.stderr[-2000:]
        assert not stale.exists(), p.stderr[-2000:]
        assert "left by a worker that is gone" in p.stderr
        assert held.exists()
    finally:
        os.close(fd)
        subprocess.run(["rm", "-rf", str(held), str(stale)])


def test_stale_sandbox_dir_in_given_work_dir(tmp_path):
    """With a --work-dir shared across runs, a sandbox directory that a dead worker with the
    same pid left is replaced, not an error. A shell plants it under its own pid and then
    execs the worker, which keeps that pid."""
    _need()
    work = tmp_path / "work"
    work.mkdir()
    c = tmp_path / "c.py"
    c.write_text("no code at all")
    cmd = [str(WORKER), "--score-once", "--kind", "kernelbench", "--task", str(RELU[0]),
           "--task-globals", json.dumps(RELU[1]), "--candidate", str(c), "--json", *FAST,
           "--work-dir", str(work), "--log-level", "info"]
    p = subprocess.run(["sh", "-c", 'mkdir -p "$0/sbx-$$-0/deep" && echo old > "$0/sbx-$$-0/deep/f"'
                        ' && exec "$@"', str(work), *cmd],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "removing stale sandbox directory" in p.stderr
    assert json.loads(p.stdout)["status"] == "format_error"


def test_rounds_grow_when_checks_dominate(tmp_path):
    """Timing rounds compare one output per side; when that check costs more than the round's
    calls (a large output from a cheap forward: a 64 KiB input repeated into 16 MiB, the
    reference as its own candidate, pure torch; each check is two 16 MiB file writes over the
    pipes and a compare, with --check-sample 0: whole outputs), later rounds time more calls
    each, but at least 8 rounds run over max-iters. --batch 2 and 40 iterations: 20 rounds if
    rounds never grew."""
    _need()
    task = tmp_path / "repeat_task.py"
    task.write_text("import torch\n\n\nclass Model(torch.nn.Module):\n"
                    "    def forward(self, x):\n        return x.repeat(256, 1)\n\n\n"
                    "def get_inputs():\n    return [torch.randn(1, 16384)]\n\n\n"
                    "def get_init_inputs():\n    return []\n")
    c = tmp_path / "c.py"
    c.write_text("```python\n" + task.read_text() + "\nModelNew = Model\n```\n")
    p = subprocess.run([str(WORKER), "--score-once", "--kind", "kernelbench", "--task", str(task),
                        "--candidate", str(c), "--json", *FAST, "--static-checks=false",
                        "--require-triton=false", "--allow-ops", "*", "--min-iters", "40",
                        "--max-iters", "40", "--batch", "2", "--check-sample", "0"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    r = json.loads(p.stdout)
    assert r["status"] == "correct", r
    t = r["timing"]
    assert t["cand_iters"] == 40 and t["ref_iters"] == 40, t
    assert 8 <= t["rounds"] < 20, t


def test_interpreter_under_tmp(tmp_path):
    """An interpreter whose prefix lies under /tmp (a checkout there, with its venv) is bound
    into the sandbox after the sandbox's private /tmp, not hidden by it: the worker used to
    fail with "cannot exec" for every candidate. The venv made here (under pytest's tmp, so
    under /tmp) finds torch and triton through a .pth file naming the test interpreter's own
    site-packages, which the worker binds with --ro-binds."""
    _need()
    if not str(tmp_path.resolve()).startswith("/tmp/"):
        pytest.skip("pytest's tmp_path is not under /tmp here")
    site = subprocess.run([PYTHON, "-c", "import site, sys; print(site.getsitepackages()[0]); "
                           "print(sys.prefix)"], capture_output=True, text=True, check=True)
    site_dir, prefix = site.stdout.split()
    venv = tmp_path / "venv"
    subprocess.run([PYTHON, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    new_site = subprocess.run([str(venv / "bin" / "python"), "-c",
                               "import site; print(site.getsitepackages()[0])"],
                              capture_output=True, text=True, check=True).stdout.strip()
    pathlib.Path(new_site, "anvil_test_parent.pth").write_text(site_dir + "\n")
    c = tmp_path / "c.py"
    c.write_text((CAND / "good_relu.py").read_text())
    args = [str(WORKER), "--score-once", "--kind", "kernelbench", "--task", str(RELU[0]),
            "--task-globals", json.dumps(RELU[1]), "--candidate", str(c), "--json", *FAST,
            "--python", str(venv / "bin" / "python"), "--ro-binds", prefix]
    p = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    r = json.loads(p.stdout)
    assert r["status"] == "correct", r


def test_timing_percentiles(suite):
    """timing carries the 10th, 50th and 90th percentile of each side's per-call times (the
    spread behind the means): present, positive and ordered for every correct result."""
    for (name, _, _, _), r in zip(SUITE, suite["results"]):
        if r["status"] != "correct":
            continue
        t = r["timing"]
        for side in ("ref", "cand"):
            q = [t[f"{side}_p{p}_ms"] for p in (10, 50, 90)]
            assert all(v is not None and v > 0 for v in q), (name, t)
            assert q[0] <= q[1] <= q[2], (name, side, q)


# a pure-torch candidate (slow_load_double.py) against tasks/sleepy_double.py
PURE = ["--static-checks=false", "--require-triton=false", "--allow-ops", "*"]


def _batch(tmp_path, items, *extra, watch=None):
    """Scores items (candidate file, globals of SLEEPY, whether the static checks are on) in
    one worker with --score-batch and a --work-dir in tmp_path; returns (exit status, stderr,
    results). With watch, it also lists the reference outputs (ref*.anvt) in the work dir every
    20 ms while the worker runs and calls watch(number of results read, names found) for each
    listing during which no result came."""
    work = tmp_path / "work"
    work.mkdir()
    batch = tmp_path / "batch.jsonl"
    batch.write_text("".join(json.dumps({"kind": "kernelbench", "task": str(SLEEPY),
                                         "candidate": str(CAND / c), "globals": g,
                                         "static_checks": st}) + "\n" for c, g, st in items))
    proc = subprocess.Popen([str(WORKER), "--score-batch", str(batch), "--work-dir", str(work),
                             *FAST, "--require-triton=false", "--allow-ops", "*", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines, err = [], []

    def read_results():
        for line in proc.stdout:
            lines.append(line)

    readers = [threading.Thread(target=read_results),
               threading.Thread(target=lambda: err.append(proc.stderr.read()))]
    for t in readers:
        t.start()
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        done = len(lines)
        names = _ref_outputs(work) if watch else []
        if watch and names is not None and len(lines) == done:
            watch(done, names)
        time.sleep(0.02)
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    for t in readers:
        t.join()
    return proc.returncode, "".join(err), [json.loads(l) for l in lines if l.startswith("{")]


def _ref_outputs(work):
    """The reference output files under work, or None when a sandbox directory vanished
    during the scan (the worker removes them at the end of an evaluation): that scan saw a
    moment it cannot describe, and the next one looks again."""
    try:
        return sorted(f.name for f in work.rglob("ref*.anvt"))
    except FileNotFoundError:
        return None


def test_reference_trials_overlap_candidate_load(tmp_path):
    """The reference's trials run while the candidate loads. Here the reference sleeps 0.5 s
    in each of its 6 trial calls (3 s) and the candidate 3 s at import. Run one after the other,
    the phases from the reference's load to its trials' reply (ref, cand_load less the wait for
    a warm interpreter, cand_trials, ref_wait) hold both sleeps: at least 6 s, whatever the
    machine's load, since a sleep never ends early. Overlapped they take about 3 s; the bound
    of 5.5 s leaves 2.5 s for a busy machine, and sequential phases still cannot meet it."""
    _need()
    p = subprocess.run([str(WORKER), "--score-once", "--kind", "kernelbench", "--task",
                        str(SLEEPY), "--task-globals",
                        json.dumps({"SLEEP_S": 0.5, "SLEEP_CALLS": 6}), "--candidate",
                        str(CAND / "slow_load_double.py"), "--json", *FAST, *PURE,
                        "--trials", "5"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    r = json.loads(p.stdout)
    assert r["status"] == "correct", r
    t = r["timing"]
    ph = t["phases"]
    ref_wait = ph.get("ref_wait") or 0  # a worker without this phase fails on the bound below
    span = ph["ref"] + ph["cand_load"] - t["wait_ms"] + ph["cand_trials"] + ref_wait
    assert span < 5500, (span, ph, t["wait_ms"])


def test_candidate_failing_while_reference_runs(tmp_path):
    """A candidate that fails at load (an import error) while the reference's trials (3 s)
    still run is a compile_error, and the worker takes the reference's reply before the
    evaluation ends: no output of those trials appears after it (the worker removes them at
    the end of each evaluation), which the next evaluation (static checks only, rejected: it
    writes no reference output) would show, and that evaluation and the one after (the slow
    loader, correct) get the reference's answers to their own commands."""
    _need()
    slow = {"SLEEP_S": 0.5, "SLEEP_CALLS": 6}
    leaked = []

    def watch(done, names):
        # from the first result to the second, no reference output may exist; the third
        # evaluation's first one comes at least 0.5 s (a sleep) after the second result
        if done == 1 and names:
            leaked.append(names)

    rc, err, res = _batch(tmp_path, [("compile_import_error.py", slow, True),
                                     ("slow_load_double.py", slow, True),
                                     ("slow_load_double.py", slow, False)], watch=watch)
    assert rc == 0, err[-3000:]
    assert [r["status"] for r in res] == ["compile_error", "rejected_static", "correct"], res
    assert "not_a_module_anvil" in res[0]["error"]
    assert not leaked, leaked[:3]
    assert res[0]["timing"]["phases"]["ref_wait"] is not None  # the reply was waited for


def test_reference_failure_wins_and_ends_before_the_next(tmp_path):
    """The reference's trials failing while the candidate fails too make the task unscorable
    (status none, a failure of the batch), whatever the candidate did: a verdict against a
    failed reference means nothing. Trials that outlive --run-timeout (one call sleeps 30 s
    against 3 s, counted from their sending) are not waited for past it: once the candidate's
    trials are done (after its 3 s load) the reference is killed, and the next evaluation
    starts another one and is scored correctly."""
    _need()
    rc, err, res = _batch(tmp_path, [
        ("compile_import_error.py", {"SLEEP_S": 0.5, "SLEEP_CALLS": 2, "FAIL_AT": 2}, True),
        ("slow_load_double.py", {"SLEEP_S": 30, "SLEEP_CALLS": 1}, False),
        ("slow_load_double.py", {}, False)], "--run-timeout", "3")
    assert rc == 1, err[-3000:]  # the first two cannot be scored
    assert [r["status"] for r in res] == ["none", "none", "correct"], res
    assert "the reference failed" in res[0]["error"] and "on purpose" in res[0]["error"], res[0]
    assert "reference interpreter failed" in res[1]["error"], res[1]


def _descendants(root):
    """pid -> (state, cmdline) of every process under root, read from /proc."""
    procs = {}
    for d in pathlib.Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        state, ppid = stat[stat.rindex(")") + 2:].split()[:2]
        procs[int(d.name)] = (int(ppid), state, cmd)
    out, todo = {}, [root]
    while todo:
        p = todo.pop()
        for pid, (ppid, state, cmd) in procs.items():
            if ppid == p and pid not in out:
                out[pid] = (state, cmd)
                todo.append(pid)
    return out


def test_pool_paused_while_timing(tmp_path):
    """While a candidate is timed, the warm interpreters still importing torch and triton for
    the next candidates are stopped (SIGSTOP), and continued after. Three evaluations with
    --pool-size 2: the first take starts a replacement, which imports (seconds) while the
    first candidate's timing runs (the reference sleeps 0.5 s in its first 9 timed calls, so
    timing lasts over 4 s, and not in its trials, so timing starts within a second of the
    take, while the import takes seconds); an interpreter of this worker must be seen stopped
    meanwhile. The
    third evaluation takes that replacement, so it must have been continued (else the take
    would wait for an interpreter that never gets ready and the evaluation fails)."""
    _need()
    g = {"SLEEP_S": 0.5, "SLEEP_FROM": 6, "SLEEP_CALLS": 6 + 9}  # not in the 6 trial calls
    cand = tmp_path / "double.py"  # loads at once: the timing starts while the import runs
    cand.write_text("```python\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n"
                    "    def forward(self, x):\n        return x * 2\n```\n")
    batch = tmp_path / "batch.jsonl"
    batch.write_text("".join(json.dumps({"kind": "kernelbench", "task": str(SLEEPY),
                                         "candidate": str(cand), "globals": g,
                                         "static_checks": False}) + "\n" for _ in range(3)))
    args = [str(WORKER), "--score-batch", str(batch), *FAST, *PURE, "--trials", "5"]
    args[args.index("--pool-size") + 1] = "2"
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = []
    reader = threading.Thread(target=lambda: out.append(proc.communicate(timeout=600)))
    reader.start()
    stopped = set()
    while proc.poll() is None:
        for pid, (state, cmd) in _descendants(proc.pid).items():
            if state == "T" and "anvil_harness" in cmd:
                stopped.add(pid)
        time.sleep(0.02)
    reader.join()
    stdout, stderr = out[0]
    results = [json.loads(l) for l in stdout.splitlines() if l.startswith("{")]
    assert [r["status"] for r in results] == ["correct"] * 3, (results, stderr[-2000:])
    assert stopped, "no warm interpreter was stopped during a timing phase"


def test_first_wrong_trial_ends_the_trials(tmp_path):
    """The candidate's trials are compared one by one as their replies come, and the first
    mismatch ends the evaluation: here the candidate is wrong (x * 3 for x * 2) and sleeps 2 s
    in every call after its first, so running its 5 trials to the end takes at least 8 s
    whatever the machine (a sleep never ends early), while stopping after trial 0 leaves the
    trial phases well under 3 s. The environment still comes back (from the reference)."""
    _need()
    cand = tmp_path / "wrong_then_slow.py"
    cand.write_text("```python\nimport time\n\nimport torch.nn as nn\n\n\n"
                    "class ModelNew(nn.Module):\n    def __init__(self):\n"
                    "        super().__init__()\n        self.calls = 0\n\n"
                    "    def forward(self, x):\n        self.calls += 1\n"
                    "        if self.calls > 1:\n            time.sleep(2.0)\n"
                    "        return x * 3\n```\n")
    p = subprocess.run([str(WORKER), "--score-once", "--kind", "kernelbench", "--task",
                        str(SLEEPY), "--candidate", str(cand), "--json", *FAST, *PURE,
                        "--trials", "5"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    r = json.loads(p.stdout)
    assert r["status"] == "incorrect" and "(trial 0)" in r["error"], r
    ph = r["timing"]["phases"]
    span = ph["cand_trials"] + (ph.get("ref_wait") or 0) + (ph.get("compare") or 0)
    assert span < 3000, (span, ph)
    assert r["env"]["torch"] and r["env"]["gpu"], r["env"]

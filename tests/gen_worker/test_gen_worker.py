"""test_gen_worker.py - anvil-gen-worker through the real broker, CLI and Redis (CPU engine,
tiny random model).

Covers: prompts x n samples complete exactly once with token ids, fp32 logprobs and distinct
seeds; a seeded job reproduces; a prompt longer than the context becomes an error sample; cancel
stops the job and the worker keeps serving; credit follows the worker's free KV; SIGTERM drains (exit 0, nothing lost or doubled once
a second worker finishes the job); SIGKILL loses nothing either.
"""
import collections
import json
import math
import os
import signal
import time

import anvil_cluster
import pytest


def write_prompts(path, n, prefix="def kernel_%d(x):", **extra):
    with open(path, "w") as f:
        for i in range(n):
            line = {"custom_id": "p%d" % i, "prompt": prefix % i}
            line.update(extra)
            f.write(json.dumps(line) + "\n")
    return path


def check_exactly_once(results, n_prompts, n_samples):
    keys = collections.Counter((r["custom_id"], r["sample"]) for r in results)
    assert len(keys) == n_prompts * n_samples, keys
    assert max(keys.values()) == 1, [k for k, v in keys.items() if v > 1]


def test_job_completes_once_per_sample(cluster, tiny_model, tmp_path):
    cluster.start_gen_worker("gen0", tiny_model, "--threads", "1")
    cluster.wait_workers(1, "gen")
    prompts = write_prompts(str(tmp_path / "p.jsonl"), 5)
    job = cluster.submit(prompts, "--samples", "4", "--max-tokens", "12", "--no-score",
                         "--temperature", "1.0", "--seed", "7")
    st = cluster.wait_state(job)
    assert st["generated"] == 20 and st["failed"] == 0
    res = cluster.results(job, "--logprobs")
    check_exactly_once(res, 5, 4)
    for r in res:
        assert r["finish_reason"] in ("length", "eos", "stop")
        assert len(r["token_ids"]) == len(r["logprobs"]) == r["completion_tokens"]
        assert 1 <= r["completion_tokens"] <= 12
        assert all(lp <= 0.0 and math.isfinite(lp) for lp in r["logprobs"])
        assert r["weight_version"] == 0
        assert r["prompt_tokens"] > 0
        assert isinstance(r["seed"], int) and 0 <= r["seed"] < 2**64  # exact, not a double
    # without --logprobs the ids stay at the broker but the counts come along
    plain = {(r["custom_id"], r["sample"]): r for r in cluster.results(job)}
    assert len(plain) == 20
    for r in res:
        p = plain[(r["custom_id"], r["sample"])]
        assert "token_ids" not in p and "logprobs" not in p
        assert p["completion_tokens"] == r["completion_tokens"]
        assert p["prompt_tokens"] == r["prompt_tokens"]
    # the n samples of a group never share a seed
    by_prompt = collections.defaultdict(set)
    for r in res:
        by_prompt[r["custom_id"]].add(str(r["seed"]))
    assert all(len(s) == 4 for s in by_prompt.values()), by_prompt
    # the same seed reproduces the same tokens
    job2 = cluster.submit(prompts, "--samples", "4", "--max-tokens", "12", "--no-score",
                          "--temperature", "1.0", "--seed", "7")
    cluster.wait_state(job2)
    a = {(r["custom_id"], r["sample"]): r["token_ids"] for r in res}
    b = {(r["custom_id"], r["sample"]): r["token_ids"]
         for r in cluster.results(job2, "--logprobs")}
    assert a == b


def _workers(cluster):
    doc = json.loads(cluster.cli("workers", "--json").stdout)
    return doc["workers"] if isinstance(doc, dict) else doc


def _max_in_flight_during(cluster, job, worker_id, timeout=120):
    """Polls `anvil workers` until the job is done: the most units the worker held at once."""
    deadline, most = time.time() + timeout, 0
    while time.time() < deadline:
        for w in _workers(cluster):
            if w.get("worker_id") == worker_id:
                most = max(most, w.get("in_flight", 0))
        if cluster.status(job).get("state") == "done":
            return most
        time.sleep(0.05)
    raise AssertionError("job %s not done after %ss" % (job, timeout))


def _wait_free_kv(cluster, worker_id, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline:
        for w in _workers(cluster):
            if w.get("worker_id") == worker_id and "free_kv_tokens" in w:
                return w
        time.sleep(0.1)
    raise AssertionError("no heartbeat with free_kv_tokens from %s" % worker_id)


def test_credit_follows_the_engine_queue(tmp_path, tiny_model):
    """The broker sends a gen worker units while its engine's queue (samples without KV, in
    its heartbeats) is shorter than --gen-backlog: with a 1 MiB KV cache (2048 tokens) and
    prompts of ~300 tokens, a few units fit; the rest wait in the broker's queue, not
    in the worker (once the engine's queue holds samples it cannot admit the worker gets
    nothing). The same job on a worker with the default cache takes the units as they come
    (its engine admits each at once, the queue runs empty, the worker asks for more)."""
    c = anvil_cluster.Cluster(str(tmp_path / "c"), broker_args=["--gen-backlog", "4"])
    try:
        c.start_redis()
        c.start_broker()
        prompts = str(tmp_path / "p.jsonl")
        body = " ".join("w%d" % k for k in range(150))
        write_prompts(prompts, 12, prefix="def kernel_%d(x): " + body)
        args = ("--samples", "2", "--max-tokens", "64", "--no-score", "--temperature", "0")
        c.start_gen_worker("small", tiny_model, "--threads", "1", "--slots", "16",
                           "--kv-mb", "1")
        c.wait_workers(1, "gen")
        w = _wait_free_kv(c, "small")
        assert 0 < w["free_kv_tokens"] <= 2048, w
        assert w["queued_samples"] == 0, w
        assert w["credit"] == 1, w  # nothing held: one unit until a unit's size is known
        job = c.submit(prompts, *args)
        small = _max_in_flight_during(c, job, "small")
        print("max in flight: small kv", small)
        assert 2 <= small <= 8, small
        check_exactly_once(c.results(job), 12, 2)
        c.stop("small")

        c.start_gen_worker("big", tiny_model, "--threads", "1", "--slots", "16")
        c.wait_workers(1, "gen")
        w = _wait_free_kv(c, "big")
        assert w["free_kv_tokens"] > 100000, w
        job2 = c.submit(prompts, *args)
        big = _max_in_flight_during(c, job2, "big")
        print("max in flight: default kv", big)
        assert big >= 9, big
        check_exactly_once(c.results(job2), 12, 2)
    finally:
        c.close()


def test_chat_messages_and_too_long_prompt(cluster, tiny_model, tmp_path):
    cluster.start_gen_worker("gen0", tiny_model, "--threads", "1")
    cluster.wait_workers(1, "gen")
    cfg = json.load(open(os.path.join(tiny_model, "config.json")))
    too_long = "x = 1 + 2 " * (cfg["max_position_embeddings"] + 10)
    path = str(tmp_path / "p.jsonl")
    with open(path, "w") as f:
        f.write(json.dumps({"custom_id": "chat", "messages": [
            {"role": "user", "content": "write a triton relu kernel"}]}) + "\n")
        f.write(json.dumps({"custom_id": "long", "prompt": too_long}) + "\n")
    job = cluster.submit(path, "--samples", "2", "--max-tokens", "8", "--no-score")
    cluster.wait_state(job, ("done", "failed"))
    res = cluster.results(job)
    by = collections.defaultdict(list)
    for r in res:
        by[r["custom_id"]].append(r)
    assert len(by["chat"]) == 2 and all(r["finish_reason"] != "error" for r in by["chat"])
    assert len(by["long"]) == 2
    for r in by["long"]:
        assert r["finish_reason"] in ("context", "error"), r
    assert cluster.procs["gen0"].poll() is None  # the worker is still serving


def test_cancel_and_keep_serving(cluster, tiny_model, tmp_path):
    cluster.start_gen_worker("gen0", tiny_model, "--threads", "1", "--slots", "2")
    cluster.wait_workers(1, "gen")
    big = write_prompts(str(tmp_path / "big.jsonl"), 200)
    job = cluster.submit(big, "--samples", "4", "--max-tokens", "200", "--no-score")
    time.sleep(1.0)
    cluster.cli("cancel", job)
    st = cluster.wait_state(job, ("cancelled",), timeout=30)
    before = st["generated"]
    assert before < 800
    time.sleep(1.0)
    assert cluster.status(job)["generated"] <= before + 8  # at most the units in flight
    small = write_prompts(str(tmp_path / "small.jsonl"), 2)
    job2 = cluster.submit(small, "--samples", "2", "--max-tokens", "8", "--no-score")
    assert cluster.wait_state(job2, timeout=60)["generated"] == 4


def test_ready_file(cluster, tiny_model, tmp_path):
    """--ready-file (readiness probes, the Slurm recipe) appears with the worker id once the
    broker answers, and is gone after a drain; the default id is <host>-gen-<pid>."""
    ready = tmp_path / "ready"
    cluster.spawn("gen-noid", "anvil-gen-worker",
                  ["--broker", cluster.worker_ep, "--model", tiny_model, "--threads", "1",
                   "--ready-file", str(ready)] + cluster.worker_curve_args())
    deadline = time.time() + 60
    while not ready.exists() and time.time() < deadline:
        time.sleep(0.1)
    assert ready.exists(), cluster.log("gen-noid")
    wid = ready.read_text().strip()
    pid = cluster.procs["gen-noid"].pid
    assert wid == "%s-gen-%d" % (os.uname().nodename, pid)
    assert wid in cluster.cli("workers").stdout
    assert cluster.stop("gen-noid", signal.SIGTERM) == 0
    assert not ready.exists()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_worker_stop_loses_nothing(cluster, tiny_model, tmp_path, sig):
    cluster.start_gen_worker("gen0", tiny_model, "--threads", "1", "--slots", "4",
                             "--grace-ms", "1500")
    cluster.wait_workers(1, "gen")
    prompts = write_prompts(str(tmp_path / "p.jsonl"), 40)
    job = cluster.submit(prompts, "--samples", "3", "--max-tokens", "64", "--no-score")
    deadline = time.time() + 30
    while cluster.status(job)["generated"] < 6 and time.time() < deadline:
        time.sleep(0.1)
    t0 = time.time()
    rc = cluster.stop("gen0", sig)
    if sig == signal.SIGTERM:
        assert rc == 0, cluster.log("gen0")
        assert time.time() - t0 < 10
        # the grace period ran (a SIGTERM mid-pass once skipped it: "grace period over" at once)
        assert "draining:" in cluster.log("gen0"), cluster.log("gen0")
        # ... and the broker sent it nothing new meanwhile, so its hand-backs (no attempt
        # charged) cannot bounce until units are dead-lettered
        assert "worker 'gen0' is draining" in cluster.log("broker")
    cluster.start_gen_worker("gen1", tiny_model, "--threads", "1", "--slots", "4")
    st = cluster.wait_state(job, timeout=180)
    assert st["generated"] == 120 and st["failed"] == 0, (json.dumps(st)[80:900], cluster.log("gen0")[-3000:])
    check_exactly_once(cluster.results(job), 40, 3)


def _worker_bench_dry(tmp_path, *args):
    """Runs gpu_worker_bench.py --dry (6 prompts x 3 samples, 64-token prompts) on a folder of
    links to this build's binaries and redis-server; returns its result lines by run name and
    its --out folder. Skips when a binary is missing."""
    import shutil
    import subprocess
    import sys

    bins = tmp_path / "bin"
    bins.mkdir()
    rels = dict(anvil_cluster.BINARIES, **{
        "anvil-bench-engine": "gen_worker/engine/cuda/bench/anvil-bench-engine"})
    for name in ("anvil", "anvil-broker", "anvil-gen-worker", "anvil-generate",
                 "anvil-bench-engine"):
        path = os.path.join(anvil_cluster.BUILD, rels[name])
        if not os.access(path, os.X_OK):
            pytest.skip("%s is not built" % name)
        os.symlink(path, bins / name)
    redis = shutil.which("redis-server")
    if not redis:
        pytest.skip("no redis-server")
    os.symlink(redis, bins / "redis-server")
    out = tmp_path / "out"
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_worker_bench.py")
    p = subprocess.run([sys.executable, script, "--bin", str(bins), "--out", str(out),
                        "--write", str(tmp_path / "model"), "--dry", "--prompts", "6", "--n",
                        "3", "--prompt-tokens", "64", *args],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    lines = {d["run"]: d for d in (json.loads(l) for l in p.stdout.splitlines()
                                   if l.startswith("{"))}
    return lines, out


def test_gpu_worker_bench_dry(tmp_path):
    """gpu_worker_bench.py (issue 8's worker-vs-engine-vs-bench figures on the GPU machine)
    runs its whole plan here with --dry on the CPU backend: the worker run through the real
    cluster and CLI, anvil-generate and anvil-bench-engine each generate exactly prompts x n
    x new tokens, and the ratio line is computed. Its figures mean nothing here."""
    lines, _ = _worker_bench_dry(tmp_path, "--new", "10",
                                 "--worker", "", "--worker", "--slots 2 --max-seqs 4",
                                 "--engine", "", "--engine", "--max-seqs 2")
    runs = ("worker", "worker --slots 2 --max-seqs 4", "engine", "engine --max-seqs 2", "bench")
    for run in runs:
        assert lines[run]["ok"] and lines[run]["generated"] == 6 * 3 * 10, lines[run]
        assert lines[run]["tok_s"] > 0
    assert lines["worker"]["finish"] == {"length": 18}
    # the variants' flags reached the worker and the engine
    assert "6 slots, 256 sequences at once" in lines["worker"]["ready_line"], lines["worker"]
    assert "2 slots, 4 sequences at once" in lines["worker --slots 2 --max-seqs 4"]["ready_line"]
    assert "(max-seqs 256)" in lines["engine"]["figures_line"], lines["engine"]
    assert "(max-seqs 2)" in lines["engine --max-seqs 2"]["figures_line"]
    assert lines["ratio"]["worker_over_engine"] > 0


def test_gpu_worker_bench_dry_stop_ids(tmp_path):
    """gpu_worker_bench.py --stop-ids K (varied stopping, the issue's GRPO shape): the K ids
    reach the worker (as the job's stop_token_ids) and anvil-generate (--stop-ids), so both
    end samples early with finish eos; every engine sample that ended so ends on one of the
    ids, and no sample holds one before its end. The bench draws lengths from [1, --new]."""
    lines, out = _worker_bench_dry(tmp_path, "--new", "40", "--stop-ids", "64")
    assert "up to 40 (64 stop ids)" in (out / "session.log").read_text()
    vocab = json.load(open(tmp_path / "model" / "config.json"))["vocab_size"]
    stops = {(i * vocab) // 64 + vocab // 128 for i in range(64)}
    for run in ("worker", "engine"):
        r = lines[run]
        assert r["ok"] and r["samples"] == 18, r
        assert r["finish"].get("eos", 0) > 0 and r["generated"] < 18 * 40, r
        assert set(r["finish"]) <= {"eos", "length"}, r
    engine = [json.loads(l) for l in open(out / "engine.jsonl") if l.startswith("{")]
    assert len(engine) == 18
    for d in engine:
        t = d["token_ids"]
        assert not stops.intersection(t[:-1]), d
        assert (t[-1] in stops) == (d["finish_reason"] == "eos"), d
    worker = [json.loads(l) for l in open(out / "worker.jsonl")]
    assert sum(r["completion_tokens"] for r in worker) == lines["worker"]["generated"]
    b = lines["bench"]
    assert b["ok"] and 18 <= b["generated"] < 18 * 40, b

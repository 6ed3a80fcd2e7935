"""test_rl_rescore.py - the broker-side RL features on a real local cluster: re-scoring existing
completions (score-only jobs, via the CLI and via AnvilClient.score), resumed samples scored on
their whole text, the staleness bound enforced by the broker across a mid-job weights update,
and cancel with keep_partial.

Scoring runs anvil-exec-worker on the CPU (torch on the CPU, Triton in its interpreter), against
KernelBench's ReLU with small sizes (the dataset's 4096 x 393216 input does not fit a CPU run);
its verdicts are compared with `anvil-exec-worker --score-once` on the same task and candidate.
The reward formula "correct * (1 + (launches > 0))" is deterministic (the default one includes a
timed speedup), so rewards must match exactly.
"""
import asyncio
import json
import os
import subprocess
import time

import pytest

import anvil_cluster
from conftest import REPO, reference

CAND = os.path.join(REPO, "tests", "exec_worker", "candidates")
FORMULA = "correct * (1 + (launches > 0))"
FAST = ["--min-iters", "3", "--max-iters", "6", "--batch", "3", "--compile-timeout", "60",
        "--run-timeout", "120", "--pool-size", "1", "--reward-formula", FORMULA]
CANDIDATES = ["good_relu", "wrong_relu", "format_no_block", "compile_syntax_error"]


def run(coro):
    return asyncio.run(coro)


def relu_source():
    path = os.path.join(anvil_cluster.SHARED, "datasets", "kernelbench", "level1", "19_ReLU.py")
    if not os.path.exists(path):
        pytest.skip("KernelBench is not in %s" % anvil_cluster.SHARED)
    src = open(path).read()
    assert "batch_size = 4096" in src and "dim = 393216" in src
    return src.replace("batch_size = 4096", "batch_size = 4").replace("dim = 393216",
                                                                        "dim = 1000")


def candidate(name):
    return open(os.path.join(CAND, name + ".py")).read()


def exec_args():
    venv = os.path.realpath(os.path.join(REPO, ".venv"))
    args = ["--device", "cpu", "--python", os.path.join(venv, "bin", "python")] + FAST
    if venv != os.path.join(REPO, ".venv"):
        args += ["--ro-binds", venv]  # a worktree whose .venv is a link
    return args


def start_exec(cluster):
    if anvil_cluster.binary("anvil-exec-worker") is None:
        pytest.skip("anvil-exec-worker is not built")
    cluster.spawn("exec0", "anvil-exec-worker",
                  ["--broker", cluster.worker_ep, "--worker-id", "exec0"] + exec_args())
    cluster.wait_workers(1, "exec")


def score_once(tmp_path, task_src, text, tag):
    """The exec worker's own verdict on one completion: (status, reward)."""
    task = tmp_path / ("task-%s.py" % tag)
    task.write_text(task_src)
    cand = tmp_path / ("cand-%s.txt" % tag)
    cand.write_text(text)
    r = subprocess.run([anvil_cluster.binary("anvil-exec-worker"), "--score-once", "--kind",
                        "kernelbench", "--task", str(task), "--candidate", str(cand), "--json"]
                       + exec_args(), capture_output=True, text=True, timeout=600)
    doc = json.loads(r.stdout)
    return doc["status"], doc["reward"]


def ref_of(src):
    return {"kind": "kernelbench", "name": "level1/19_ReLU.py", "reference_code": src}


def test_rescore_via_cli_and_client(cluster, anvil_client, tmp_path):
    src = relu_source()
    start_exec(cluster)
    want = {c: score_once(tmp_path, src, candidate(c), c) for c in CANDIDATES}
    assert want["good_relu"] == ("correct", 2.0), want
    assert want["wrong_relu"] == ("incorrect", 0.0), want
    task = {"kind": "kernelbench", "name": "level1/19_ReLU.py", "reference_code": src}
    lines = [{"custom_id": "relu", "task": task,
              "completions": [candidate("good_relu"), candidate("wrong_relu")]},
             {"custom_id": "fmt", "task": task, "completion": candidate("format_no_block")},
             {"custom_id": "cmp", "task": task, "completion": candidate("compile_syntax_error")}]
    path = tmp_path / "rescore.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    by_key = {("relu", 0): "good_relu", ("relu", 1): "wrong_relu", ("fmt", 0): "format_no_block",
              ("cmp", 0): "compile_syntax_error"}

    # CLI: lines with completions need --score-only; a score-only line needs a task
    r = cluster.cli("submit", str(path), check=False)
    assert r.returncode != 0 and "--score-only" in r.stderr and "nothing was queued" in r.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"custom_id": "x", "completion": "```python\n```"}) + "\n")
    r = cluster.cli("submit", str(bad), "--score-only", check=False)
    assert r.returncode != 0 and "needs a 'task'" in r.stderr, r.stderr
    r = cluster.cli("submit", str(path), "--score-only", "--name", "rescore", "--json")
    sub = json.loads(r.stdout)
    job = sub["job_id"]
    assert sub["tasks"] == 3 and sub["samples"] == 4 and sub["accepted"] == 3
    st = cluster.wait_state(job, timeout=600)
    assert st["generated"] == 4 and st["scored"] == 4 and st["tokens"] == 0, st
    res = cluster.results(job)
    assert len(res) == 4
    for x in res:
        name = by_key[(x["custom_id"], x["sample"])]
        assert (x["score"]["status"], x["score"]["reward"]) == want[name], (name, x)
    assert st["correct"] == 1
    # the same command again resumes the job and queues nothing twice
    again = json.loads(cluster.cli("submit", str(path), "--score-only", "--name", "rescore",
                                   "--json").stdout)
    assert again["job_id"] == job and again["accepted"] == 0 and again["skipped"] == 3
    assert cluster.status(job)["scored"] == 4

    # the Python client: score() yields one group per item, sample k = completion k
    items = [{"custom_id": x["custom_id"], "ref": ref_of(src),
              **({"completions": x["completions"]} if "completions" in x
                 else {"completion": x["completion"]})} for x in lines]

    async def go():
        async with anvil_client.AnvilClient(cluster.client_ep) as c:
            groups = await c.score(items).collect()
            pb = anvil_client.pb
            # the broker refuses a score-only task without completions, and completions on a
            # job that generates
            with pytest.raises(anvil_client.AnvilError) as e:
                await c.submit(pb.JobSpec(score_only=True), [pb.Task(custom_id="a",
                                                                     prompt="x")])
            assert "completions" in str(e.value)
            with pytest.raises(anvil_client.AnvilError) as e:
                await c.submit(pb.JobSpec(n=1), [pb.Task(custom_id="a", prompt="x",
                                                         completions=["y"])])
            assert "score-only" in str(e.value)
            return groups

    groups = run(go())
    assert sorted(g.index for g in groups) == [0, 1, 2]
    for g in groups:
        assert len(g.samples) == (2 if g.custom_id == "relu" else 1)
        for s in g.samples:
            name = by_key[(g.custom_id, s.sample_index)]
            assert (s.exec_status, s.reward) == want[name], (name, s.exec_status, s.reward)
            assert s.text == candidate(name) and s.response_token_ids == []
            assert s.exec.worker_id == "exec0"
        assert g.delivery_latency_ms is not None
    lat = [g.delivery_latency_ms for g in groups]
    print("\nscore-only groups delivered %s ms after their last verdict" % lat)


def test_resumed_sample_is_scored_on_its_whole_text(cluster, anvil_client, weights, tmp_path):
    """A resume task's continuation is scored after its resume_text: a good kernel as the
    partial text plus a few tokens of the tiny model is correct, the continuation alone could
    not be (it holds no code)."""
    src = relu_source()
    cluster.start_gen_worker("gen0", weights[0], "--threads", "1")
    start_exec(cluster)
    cluster.wait_workers(1, "gen")
    good = candidate("good_relu") + "\n\n"
    pb = anvil_client.pb

    async def go():
        async with anvil_client.AnvilClient(cluster.client_ep) as c:
            t = anvil_client.make_task({"prompt": "def relu(x):", "ref": ref_of(src), "n": 1,
                                        "resume_token_ids": [11, 12, 13, 14],
                                        "resume_text": good}, "resume0")
            spec = pb.JobSpec(n=1, score=True, chat=False)
            spec.sampling.max_tokens = 12
            spec.sampling.temperature = 0.0
            job = await c.submit(spec, [t])
            deadline = time.time() + 300
            while time.time() < deadline:
                st = await c.status(job)
                if st.state == pb.JOB_DONE:
                    break
                await asyncio.sleep(0.2)
            rep = await c.results_page(job)
            return rep.results

    res = run(go())
    assert len(res) == 1
    s, e = res[0].sample, res[0].exec
    assert len(s.token_ids) == 12 - 4  # the remaining budget
    assert "```" not in s.text, "the tiny model wrote a fence: the check below means nothing"
    want = score_once(tmp_path, src, good + s.text, "whole")
    assert (pb.ExecStatus.Name(e.status)[5:].lower(), e.reward) == want
    assert want[0] == "correct"
    assert score_once(tmp_path, src, s.text, "cont")[0] == "format_error"


def metric(cluster, name):
    time.sleep(1.5)  # the broker writes its counters once per heartbeat interval
    out = cluster.redis("HGET", "anv:broker:metrics", name).strip().strip('"')
    return int(out or 0)


def test_staleness_enforced_by_the_broker(cluster, anvil_client, weights):
    """max_weight_lag=0 and a PAUSE update mid-job: samples still running at the update
    (their first tokens are on the old version) come back stale and are generated again on the
    new one; no old-version sample is recorded once the broker has the new version. The client
    keeps whatever it gets (on_stale="keep"), so what is checked is the broker's doing.

    Whether a sample straddles the update is timing: the client sees `generated` move when
    results land, which is when the worker starts its next units, so the update can reach it
    before those units have a token (they are then rightly all new-version, and nothing was
    checked: seen about 1 run in 10). Each attempt waits a little longer after the threshold,
    and the test updates again (next version, another checkpoint) until an update straddled
    a sample; every attempt's invariants are checked."""
    cluster.start_gen_worker("gen0", weights[0], "--threads", "1", "--slots", "2")
    cluster.wait_workers(1, "gen")
    prompts = ["def kernel_%d(x):" % i for i in range(16)]

    async def go(version, delay):
        async with anvil_client.AnvilClient(cluster.client_ep) as c:
            assert await c.refresh_weight_version() == version - 1
            ro = c.generate(prompts, 2, {"temperature": 1.0, "max_tokens": 64}, score=False,
                            max_weight_lag=0, on_stale="keep")
            await ro.start()
            deadline = time.time() + 60
            while (await c.status(ro.jobs[0].id)).generated < 4 and time.time() < deadline:
                await asyncio.sleep(0.02)
            await asyncio.sleep(delay)
            await c.update_weights(weights[1 + (version - 1) % 2], version, policy="pause")
            t1 = int(time.time() * 1000)
            return ro, await ro.collect(), t1

    seen = 0
    for version in range(1, 6):
        ro, groups, t1 = run(go(version, 0.004 * (version - 1)))
        assert sorted(g.index for g in groups) == list(range(16))
        assert len(ro.jobs) == 1 and ro.regenerations == 0  # nothing done by the client
        samples = [s for g in groups for s in g.samples]
        assert {s.weight_version for s in samples} == {version - 1, version}
        for s in samples:
            assert len(s.response_token_ids) == len(s.logprobs) > 0
            if s.weight_version == version - 1:
                assert s.generated_ms <= t1, "an old-version sample was recorded after the update"
            if s.generated_ms > t1 + 5:
                assert s.weight_version == version
        assert int(cluster.redis("HGET", "anv:weights", "version").strip().strip('"')) == version
        stale = metric(cluster, "results_stale") - seen
        seen += stale
        print("\nupdate to v%d: %d stale samples generated again; %d of %d samples on v%d"
              % (version, stale, sum(s.weight_version == version for s in samples), len(samples),
                 version))
        if stale >= 1:
            break
    assert seen >= 1, "no sample was in flight across any of 5 updates: nothing was checked"


def test_cancel_keep_partial(cluster, anvil_client, weights):
    cluster.start_gen_worker("gen0", weights[0], "--threads", "1", "--slots", "2")
    cluster.wait_workers(1, "gen")
    prompts = ["def kernel_%d(x):" % i for i in range(12)]
    max_tokens = 1000

    async def go():
        async with anvil_client.AnvilClient(cluster.client_ep) as c:
            ro = c.generate(prompts, 2, {"temperature": 0.0, "max_tokens": max_tokens},
                            score=False, chat=False)
            await ro.start()
            deadline = time.time() + 60
            while (await c.status(ro.jobs[0].id)).tokens == 0 and time.time() < deadline:
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.3)  # units are mid-way
            partial = await ro.abort()
            st = await c.status(ro.jobs[0].id)
            # continue each partial sample where it stopped
            cont = []
            for g in partial:
                for s in g.samples:
                    if s.finish_reason == "cancelled":
                        cont.append({"prompt": prompts[g.index], "n": 1,
                                     "resume_token_ids": s.response_token_ids,
                                     "resume_text": s.text,
                                     "custom_id": "c%d.%d" % (g.index, s.sample_index)})
            more = await c.generate(cont, 1, {"temperature": 0.0, "max_tokens": max_tokens},
                                    score=False, chat=False).collect()
            return ro, partial, st, cont, more

    ro, partial, st, cont, more = run(go())
    assert st.state == anvil_client.pb.JOB_CANCELLED
    assert partial, "no unit was in flight at the cancel"
    cut = [(g, s) for g in partial for s in g.samples if s.finish_reason == "cancelled"]
    assert cut and len(cut) == len(cont)
    for g, s in cut:
        assert 0 < len(s.response_token_ids) < max_tokens
        assert len(s.response_token_ids) == len(s.logprobs)
        # what was cut off is what v0 produces greedily, token for token
        full = reference(weights[0], s.prompt_token_ids, 1, max_tokens, 0.0)[0]
        assert full["token_ids"][:len(s.response_token_ids)] == s.response_token_ids
    by_id = {g.custom_id: g.samples[0] for g in more}
    for g, s in cut[:3]:
        c = by_id["c%d.%d" % (g.index, s.sample_index)]
        full = reference(weights[0], s.prompt_token_ids, 1, max_tokens, 0.0)[0]
        # the continuation spends the remaining budget and completes the greedy sequence
        assert s.response_token_ids + c.response_token_ids == full["token_ids"]
    print("\nkeep_partial cancel: %d partial groups, %d samples cut short (%s tokens)"
          % (len(partial), len(cut), [len(s.response_token_ids) for _, s in cut]))

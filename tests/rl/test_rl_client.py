"""test_rl_client.py - anvil_client against a real local cluster (redis-server, anvil-broker,
anvil-gen-worker on the CPU engine, tiny random Llama checkpoints).

Covers: a 3-step RL loop with new weights written to disk between steps (every sample carries
the version it was generated with, groups arrive complete, outputs match anvil-generate on
that version's weights, the update reaches every gen worker); rewards per group (when the exec
worker is built); the staleness bound (stale groups generated again, or accepted within the
lag); over-provisioning with cancel of the rest; abort by a WEIGHTS_ABORT update and resume on
the new weights with the remaining token budget. Figures are printed (pytest -s), not asserted.
"""
import asyncio
import collections
import json
import math
import os
import statistics
import time

import pytest

from conftest import base_seed, reference, start_exec_worker

PROMPTS = ["def relu(x):", "import triton\n", "class ModelNew(nn.Module):",
           "# softmax over rows"]


def run(coro):
    return asyncio.run(coro)


def check_group(g, n, version=None):
    assert [s.sample_index for s in g.samples] == list(range(n))
    for s in g.samples:
        assert s.task_index == g.samples[0].task_index
        assert s.prompt_token_ids == g.samples[0].prompt_token_ids and s.prompt_token_ids
        assert len(s.response_token_ids) == len(s.logprobs) == len(s.response_mask) > 0
        assert all(m == 1 for m in s.response_mask)
        assert all(math.isfinite(lp) and lp <= 0.0 for lp in s.logprobs)
        assert s.finish_reason in ("eos", "length", "stop"), (s.finish_reason, s.error)
        if version is not None:
            assert s.weight_version == version


def start_gen(cluster, model, name="gen0", *extra):
    cluster.start_gen_worker(name, model, "--threads", "1", *extra)


def test_three_step_loop(cluster, anvil_client, weights):
    start_gen(cluster, weights[0], "gen0")
    start_gen(cluster, weights[0], "gen1")
    cluster.wait_workers(2, "gen")
    n, max_tokens, seed = 3, 16, 1234
    sampling = {"temperature": 1.0, "max_tokens": max_tokens, "seed": seed}
    figures = []

    async def loop():
        async with anvil_client.AnvilClient(cluster.client_ep) as c:
            assert await c.refresh_weight_version() == 0
            outputs = []
            for step in range(3):
                groups = await c.generate(PROMPTS, n, sampling, score=False, chat=False,
                                          max_weight_lag=0).collect()
                assert sorted(g.index for g in groups) == list(range(len(PROMPTS)))
                for g in groups:
                    check_group(g, n, version=step)
                    assert len({tuple(s.response_token_ids) for s in g.samples}) > 1
                outputs.append(groups)
                if step < 2:
                    u = await c.update_weights(weights[step + 1], step + 1)
                    assert u.version == step + 1 and u.workers == 2
                    figures.append(u)
                    ws = [w for w in await c.workers() if w.kind == anvil_client.pb.WORKER_GEN]
                    assert [w.weight_version for w in ws] == [step + 1] * 2
            return outputs

    outputs = run(loop())
    for step, groups in enumerate(outputs):
        for g in groups:
            t = g.samples[0].task_index
            ref = reference(weights[step], g.samples[0].prompt_token_ids, n, max_tokens, 1.0,
                            seed=base_seed(seed, t))
            for s, r in zip(g.samples, ref):
                assert str(s.seed) == str(r["seed"])
                assert s.response_token_ids == r["token_ids"], (step, g.index, s.sample_index)
                assert max(abs(a - b) for a, b in zip(s.logprobs, r["logprobs"])) < 1e-4
    # the versions really differ: same prompts and seeds, other tokens
    firsts = [{g.index: g.samples[0].response_token_ids for g in gs} for gs in outputs]
    assert firsts[0] != firsts[1] != firsts[2]
    lat = [g.delivery_latency_ms for gs in outputs for g in gs]
    print("\nper-step delivery latencies (ms):", [[g.delivery_latency_ms for g in gs] for gs in outputs])
    for u in figures:
        print("\nweights v%d on %d gen workers: load %.1f ms, broker control-plane %.2f ms, "
              "client round trip beyond the load %.2f ms" % (u.version, u.workers,
                                                             u.load_s * 1e3, u.control_ms,
                                                             u.client_control_ms))
    print("group delivery after its last sample: median %d ms, max %d ms over %d groups"
          % (statistics.median(lat), max(lat), len(lat)))


def test_rewards_per_group(cluster, anvil_client, weights):
    start_gen(cluster, weights[0])
    start_exec_worker(cluster)
    import anvil_cluster
    anvil_cluster.need_datasets("kernelbench", "level1")
    ref = open(os.path.join(anvil_client_shared(), "datasets", "kernelbench", "level1",
                            "19_ReLU.py")).read()
    prompts = [{"custom_id": "relu%d" % i, "prompt": "Write ModelNew with triton.\n" + ref,
                "ref": {"kind": "kernelbench", "name": "level1/19_ReLU.py",
                        "reference_code": ref}} for i in range(2)]

    async def go():
        async with anvil_client.AnvilClient(cluster.client_ep) as c:
            return await c.generate(prompts, 2, {"max_tokens": 32, "temperature": 1.0},
                                    score=True).collect()

    groups = run(go())
    assert len(groups) == 2
    for g in groups:
        assert len(g.samples) == 2
        for s in g.samples:
            assert s.exec_status is not None and s.reward is not None, s
        assert g.delivery_latency_ms is not None
        print("\nscored group %s: rewards %s, delivered %d ms after its last score, %d ms "
              "after its last sample was generated" % (g.custom_id, g.rewards,
                                                       g.delivery_latency_ms,
                                                       g.delivered_ms - g.last_generated_ms))


def anvil_client_shared():
    import anvil_cluster
    return anvil_cluster.SHARED


def test_staleness_bound(cluster, anvil_client, weights):
    start_gen(cluster, weights[0], "gen0", "--slots", "2")
    cluster.wait_workers(1, "gen")
    prompts = ["def kernel_%d(x):" % i for i in range(32)]
    sampling = {"temperature": 1.0, "max_tokens": 64}

    async def go(lag):
        async with anvil_client.AnvilClient(cluster.client_ep) as c:
            await c.refresh_weight_version()
            ro = c.generate(prompts, 2, sampling, score=False, max_weight_lag=lag)
            await ro.start()
            # let some groups finish on the current weights, then move the trainer on
            deadline = time.time() + 60
            while (await c.status(ro.jobs[0].id)).generated < 4 and time.time() < deadline:
                await asyncio.sleep(0.05)
            v = c.weight_version + 1
            await c.update_weights(weights[v % 3], v)
            groups = await ro.collect()
            return v, ro, groups

    v, ro, groups = run(go(0))
    assert sorted(g.index for g in groups) == list(range(32))
    assert all(g.oldest_version >= v for g in groups), [g.weight_versions for g in groups]
    assert ro.regenerations >= 2 and len(ro.jobs) >= 2  # those done before the update
    assert any(g.regenerated for g in groups)
    v2, ro2, groups2 = run(go(1))
    assert v2 == v + 1
    assert sorted(g.index for g in groups2) == list(range(32))
    assert ro2.regenerations == 0 and len(ro2.jobs) == 1
    assert {g.oldest_version for g in groups2} == {v, v2}  # within the lag: kept


def test_over_provision_cancels_the_rest(cluster, anvil_client, weights):
    start_gen(cluster, weights[0], "gen0", "--slots", "2")
    cluster.wait_workers(1, "gen")
    prompts = ["def kernel_%d(x):" % i for i in range(40)]

    async def go():
        async with anvil_client.AnvilClient(cluster.client_ep) as c:
            ro = c.generate(prompts, 2, {"max_tokens": 64, "temperature": 1.0}, score=False,
                            want=4)
            got = await ro.collect()
            st = await c.status(ro.jobs[0].id)
            more = await c.generate(prompts[:2], 2, {"max_tokens": 8}, score=False).collect()
            return ro, got, st, more

    ro, got, st, more = run(go())
    assert len(got) == 4
    for g in got:
        check_group(g, 2)
    assert ro.cancelled_units > 0
    assert st.state == anvil_client.pb.JOB_CANCELLED
    assert st.generated < 80
    assert len(more) == 2  # the worker keeps serving


def test_abort_and_resume(cluster, anvil_client, weights):
    start_gen(cluster, weights[0], "gen0", "--slots", "4")
    cluster.wait_workers(1, "gen")
    prompts = ["def kernel_%d(x):" % i for i in range(24)]
    max_tokens = 1000

    async def go():
        async with anvil_client.AnvilClient(cluster.client_ep) as c:
            await c.refresh_weight_version()
            ro = c.generate(prompts, 2, {"temperature": 0.0, "max_tokens": max_tokens},
                            score=False, chat=False, keep_aborted=True)
            await ro.start()
            deadline = time.time() + 60
            while (await c.status(ro.jobs[0].id)).tokens == 0 and time.time() < deadline:
                await asyncio.sleep(0.02)
            # the first samples are done: others are in flight
            u = await c.update_weights(weights[1], 1, policy="abort")
            return u, ro, await ro.collect()

    u, ro, groups = run(go())
    assert u.workers == 1
    assert sorted(g.index for g in groups) == list(range(24))
    assert ro.resumed_samples > 0, ("no sample came back aborted: nothing was in flight, or "
                                    "the broker re-ran the aborted units (keep_aborted unsupported)")
    resumed = [s for g in groups for s in g.samples if len(s.segments) > 1]
    assert len(resumed) == ro.resumed_samples
    for g in groups:
        for s in g.samples:
            assert s.finish_reason in ("eos", "length", "stop")
            assert len(s.response_token_ids) == len(s.logprobs) <= max_tokens
    for s in resumed:
        (a0, a1, va), (b0, b1, vb) = [(x.start, x.end, x.weight_version) for x in s.segments]
        assert (a0, va, vb) == (0, 0, 1) and a1 == b0 and b1 == len(s.response_token_ids)
        assert s.weight_version == 0  # as old as its oldest token
        partial, cont = s.response_token_ids[:a1], s.response_token_ids[a1:]
        # the partial is what v0 would have produced uninterrupted, token for token
        full = reference(weights[0], s.prompt_token_ids, 1, max_tokens, 0.0)[0]
        assert full["token_ids"][:a1] == partial
        # the continuation is v1 from prompt + partial, spending only the remaining budget
        ref = reference(weights[1], s.prompt_token_ids + partial, 1, max_tokens - a1, 0.0)[0]
        assert cont == ref["token_ids"]
        assert max(abs(x - y) for x, y in zip(s.logprobs[a1:], ref["logprobs"])) < 1e-4


def test_errors_are_clear_and_lose_nothing(cluster, anvil_client, weights, tmp_path):
    start_gen(cluster, weights[0])
    cluster.wait_workers(1, "gen")
    AnvilError = anvil_client.AnvilError

    async def go():
        async with anvil_client.AnvilClient(cluster.client_ep) as c:
            assert await c.refresh_weight_version() == 0
            with pytest.raises(AnvilError) as e:
                await c.status("01ARZ3NDEKTSV4RRFFQ69G5FAV")
            assert e.value.code == -10007  # ANV_ENOTFOUND
            # a checkpoint that does not load: an error naming the worker, version unchanged
            broken = tmp_path / "broken"
            broken.mkdir()
            (broken / "config.json").write_text("{ not json")
            with pytest.raises(AnvilError) as e:
                await c.update_weights(str(broken), 5)
            assert "gen0" in str(e.value) and "v5" in str(e.value)
            assert c.weight_version == 0
            ws = await c.workers()
            assert [w.weight_version for w in ws] == [0]
            with pytest.raises(ValueError):
                c.generate(["x"], 1, on_stale="sometimes")
            with pytest.raises(TypeError):
                await c.generate([42], 1, score=False).collect()
            groups = await c.generate(["def f(x):"], 2, {"max_tokens": 4}, score=False).collect()
            assert len(groups) == 1 and {s.weight_version for s in groups[0].samples} == {0}
        async with anvil_client.AnvilClient("tcp://127.0.0.1:%d" % free_port(),
                                            timeout_s=0.5) as c:
            with pytest.raises(AnvilError) as e:
                await c.workers()
            assert "no reply from the broker" in str(e.value)

    run(go())


def free_port():
    import anvil_cluster
    return anvil_cluster.free_port()

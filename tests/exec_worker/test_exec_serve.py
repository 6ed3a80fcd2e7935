"""test_exec_serve.py - anvil-exec-worker serving the real broker: every generated sample of a
scored job is scored exactly once, the verdict lands in the results, and SIGTERM drains.

The gen worker runs the tiny random model, so its completions hold no code: the verdicts are
format_error with reward 0. Correct and hostile candidates are covered through --score-once in
test_exec_worker.py; this test is about the worker protocol.
"""
import collections
import os
import signal
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import anvil_cluster  # noqa: E402


def test_scored_job_through_the_broker(cluster, tiny_model, tmp_path):
    if anvil_cluster.binary("anvil-exec-worker") is None:
        pytest.skip("anvil-exec-worker is not built")
    prompts = str(tmp_path / "kb.jsonl")
    cluster.cli("import", "kernelbench", anvil_cluster.need_datasets("kernelbench"),
                "--level", "1", "--limit", "3", "--out", prompts)
    cluster.start_gen_worker("gen0", tiny_model, "--threads", "1")
    cluster.spawn("exec0", "anvil-exec-worker",
                  ["--broker", cluster.worker_ep, "--device", "cpu", "--worker-id", "exec0"])
    cluster.wait_workers(2)
    job = cluster.submit(prompts, "--samples", "2", "--max-tokens", "24", "--score")
    st = cluster.wait_state(job, timeout=240)
    assert st["generated"] == 6 and st["scored"] == 6, st
    res = cluster.results(job)
    keys = collections.Counter((r["custom_id"], r["sample"]) for r in res)
    assert len(keys) == 6 and max(keys.values()) == 1
    for r in res:
        score = r.get("score") or {}
        assert score.get("status") == "format_error", r
        assert score.get("reward") == 0
    assert cluster.stop("exec0", signal.SIGTERM) == 0, cluster.log("exec0")

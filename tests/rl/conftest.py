"""conftest.py - fixtures of the RL client tests (tests/rl).

`anvil_client`: the client package as pip installs it: `pip install --no-deps
--no-build-isolation --target TMP cli/python` (its build generates anvil_pb2 from
proto/anvil.proto with grpcio-tools), imported from TMP; skipped, saying why, when the build
cannot run. `weights`: three checkpoints of the same shape and tokenizer (tiny_model.py with
seeds 0, 1, 2) standing for three weight versions. `reference()`: what anvil-generate outputs
for given prompt ids, seed and weights: the oracle for "outputs match the weights".
`start_exec_worker()`: the exec worker on the cluster, or a skip until it is built.
"""
import importlib
import json
import os
import subprocess
import sys

import pytest

import anvil_cluster

REPO = anvil_cluster.REPO
PYTHON = os.path.join(REPO, ".venv", "bin", "python")
GOLDEN = 0x9E3779B97F4A7C15


@pytest.fixture(scope="session")
def anvil_client(tmp_path_factory):
    try:
        import grpc_tools  # noqa: F401  (the build's protoc)
    except ImportError:
        pytest.skip("grpcio-tools is not installed in the venv: cannot build anvil_client")
    target = str(tmp_path_factory.mktemp("site"))
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                        "--no-build-isolation", "--target", target,
                        os.path.join(REPO, "cli", "python")], capture_output=True, text=True)
    assert r.returncode == 0, "pip install ./cli/python failed:\n" + r.stdout + r.stderr
    assert os.path.isfile(os.path.join(target, "anvil_client", "anvil_pb2.py"))
    sys.path.insert(0, target)
    for m in [m for m in sys.modules if m == "anvil_client" or m.startswith("anvil_client.")]:
        del sys.modules[m]
    mod = importlib.import_module("anvil_client")
    assert mod.pb.__file__.startswith(target), mod.pb.__file__
    return mod


@pytest.fixture(scope="session")
def weights(tiny_model, tmp_path_factory):
    out = {0: tiny_model}
    for v in (1, 2):
        out[v] = anvil_cluster.make_tiny_model(str(tmp_path_factory.mktemp("w%d" % v)),
                                               seed=v)
    return out


def base_seed(seed, task_index):
    """The broker's base seed of a task when the job's sampling has `seed`."""
    return (seed + task_index * GOLDEN) % (1 << 64)


def reference(model, prompt_ids, n, max_tokens, temperature, seed=None):
    """anvil-generate's samples (dicts) for exact prompt token ids."""
    gen = anvil_cluster.binary("anvil-generate")
    if gen is None:
        pytest.skip("anvil-generate is not built")
    args = [gen, "--model", model, "--prompts", "-", "--json", "--n", str(n), "--max-tokens",
            str(max_tokens), "--temperature", str(temperature), "--threads", "1",
            "--log-level", "error"]
    if seed is not None:
        args += ["--seed", str(seed)]
    r = subprocess.run(args, input=json.dumps({"prompt_ids": list(prompt_ids)}) + "\n",
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = [json.loads(line) for line in r.stdout.split("\n") if line.strip()]
    return sorted(out, key=lambda s: s["index"])


def start_exec_worker(cluster, name="exec0"):
    """Starts anvil-exec-worker on the cluster (CPU, triton interpreter) or skips."""
    path = anvil_cluster.binary("anvil-exec-worker")
    if path is None:
        pytest.skip("anvil-exec-worker is not built yet (scoring part of this test)")
    h = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=30)
    if "--broker" not in h.stdout + h.stderr:
        pytest.skip("anvil-exec-worker has no --broker option: it does not serve a broker yet")
    extra = os.environ.get("ANVIL_TEST_EXEC_ARGS", "--device cpu").split()
    venv = os.path.realpath(os.path.join(REPO, ".venv"))
    if "ANVIL_TEST_EXEC_ARGS" not in os.environ and venv != os.path.join(REPO, ".venv"):
        # a worktree whose .venv is a link: the sandbox sees only the real directory
        extra += ["--python", os.path.join(venv, "bin", "python"), "--ro-binds", venv]
    p = cluster.spawn(name, "anvil-exec-worker",
                      ["--broker", cluster.worker_ep, "--worker-id", name] + extra)
    cluster.wait_workers(1, "exec")
    return p

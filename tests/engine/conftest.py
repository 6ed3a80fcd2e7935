"""Fixtures of the engine tests: the built binaries and tiny checkpoints made once per session.

Models are generated into a temporary directory (never committed): one trained tokenizer is
shared by all of them so the session pays for training once.
"""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import tiny_model  # noqa: E402

REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
BUILD = os.environ.get("ANVIL_BUILD_DIR", os.path.join(REPO, "build"))
SHARED = os.environ.get("ANVIL_SHARED_DIR", os.path.join(REPO, "..", "shared"))


def _binary(name, sub):
    path = os.path.join(BUILD, sub, name)
    if not os.access(path, os.X_OK):
        pytest.skip(f"{path} is not built (cmake --build first)")
    return path


@pytest.fixture(scope="session")
def generate_bin():
    return _binary("anvil-generate", "gen_worker/engine")


@pytest.fixture(scope="session")
def dump_bin():
    return _binary("eng_logits_dump", "tests/engine")


@pytest.fixture(scope="session")
def trained_tokenizer():
    return tiny_model.train_tokenizer(SHARED)


@pytest.fixture(scope="session")
def models(tmp_path_factory, trained_tokenizer):
    """name -> directory, made on first use."""
    root = tmp_path_factory.mktemp("engine-models")
    specs = {
        "llama": dict(arch="llama", dtype="bf16"),
        "llama_fp32": dict(arch="llama", dtype="fp32", seed=1),
        "llama_fp16_sharded": dict(arch="llama", dtype="fp16", shard=True, seed=2),
        "llama_bos": dict(arch="llama", dtype="bf16", add_bos=True),
        "qwen2": dict(arch="qwen2", dtype="bf16", seed=3),
        "qwen2_untied": dict(arch="qwen2", dtype="fp32", seed=4, tie=False),
    }
    made = {}

    class Models:
        def __getitem__(self, name):
            if name not in made:
                made[name] = tiny_model.make_model(str(root / name), tokenizer=trained_tokenizer,
                                                   shared=SHARED, **specs[name])
            return made[name]

    return Models()


def run_generate(binary, *args, check=True, input=None):
    p = subprocess.run([binary, *map(str, args)], capture_output=True, text=True, input=input,
                       timeout=600)
    if check and p.returncode != 0:
        raise AssertionError(f"anvil-generate {args} failed ({p.returncode}): {p.stderr}")
    return p


def samples(binary, *args):
    """Runs anvil-generate --json and returns its sample lines keyed by (id, index)."""
    p = run_generate(binary, *args, "--json")
    out = {}
    for line in p.stdout.rstrip("\n").split("\n") if p.stdout.strip() else []:
        s = json.loads(line)
        out[(s["id"], s["index"])] = s
    return out

"""Fixtures of the engine tests: the built binaries and tiny checkpoints made once per session.

Models are generated into a temporary directory (never committed): one trained tokenizer is
shared by all of them so the session pays for training once.
"""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "gen_worker", "engine", "tools"))

import tiny_model  # noqa: E402
from eng_testlib import BUILD, SHARED  # noqa: E402


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

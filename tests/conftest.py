"""conftest.py - pytest fixtures shared by every Python test under tests/.

`tiny_model`: one small random Llama checkpoint (real trained BPE tokenizer) per session.
`cluster`: a fresh real cluster (redis-server + anvil-broker) per test, closed afterwards;
tests start the workers they need on it. Both skip, saying why, when what they need is not
built or installed.
"""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import anvil_cluster  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("models") / "tiny-llama")
    try:
        return anvil_cluster.make_tiny_model(out)
    except Exception as e:  # the venv lacks torch/transformers/tokenizers
        pytest.skip("cannot make the tiny model: %s" % e)


@pytest.fixture
def cluster(tmp_path):
    for b in ("anvil", "anvil-broker"):
        if anvil_cluster.binary(b) is None:
            pytest.skip("%s is not built under %s" % (b, anvil_cluster.BUILD))
    c = anvil_cluster.Cluster(str(tmp_path / "cluster"))
    c.start_redis()
    c.start_broker()
    yield c
    c.close()

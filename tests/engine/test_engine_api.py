"""Engine API paths used by the gen worker: weight reload with versions (in-flight requests
recomputed under the new weights), cancel by request id, explicit per-sample seeds."""
import json
import os
import subprocess

import pytest

from eng_testlib import BUILD


@pytest.fixture(scope="module")
def check_bin():
    path = os.path.join(BUILD, "tests", "engine", "eng_engine_check")
    if not os.access(path, os.X_OK):
        pytest.skip(f"{path} is not built")
    return path


def _run(check_bin, *args):
    p = subprocess.run([check_bin, *map(str, args)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.strip().split("\n")
    assert lines[-1] == "ok"
    return [json.loads(x) for x in lines[:-1]], p.stderr


def _truncated_copy(src, dst):
    """src with its safetensors file cut short (a checkpoint still being written)."""
    import shutil
    shutil.copytree(src, dst)
    st = os.path.join(dst, "model.safetensors")
    os.truncate(st, os.path.getsize(st) - 64)
    return dst


def test_reload_weights(check_bin, models, tmp_path):
    a, b = models["llama"], models["llama_fp32"]  # same shapes, other weights
    bad = _truncated_copy(a, str(tmp_path / "bad"))  # A's values: a write would show in "c"
    out, err = _run(check_bin, "reload", a, b, bad)
    got = {(s["id"], s["index"]): s for s in out}
    only_b, _ = _run(check_bin, "reload", b, b)
    ref = {(s["id"], s["index"]): s for s in only_b}
    assert got[("a", 0)]["version"] == 3
    assert got[("b", 0)]["version"] == 7 and got[("b", 0)]["first_version"] == 7
    assert got[("b", 0)]["tokens"] == ref[("b", 0)]["tokens"]
    assert got[("a", 0)]["tokens"] != got[("b", 0)]["tokens"]
    # 'mid' had its first tokens under version 3, the rest recomputed and decoded under 7
    assert got[("mid", 0)]["first_version"] == 3 and got[("mid", 0)]["version"] == 7
    assert "refused as expected" in err
    # the truncated copy of A was refused and "c" ran on B's weights, as in the run that
    # had B throughout and no broken load
    assert "broken checkpoint refused as expected" in err and "truncated" in err, err
    assert got[("c", 0)]["version"] == 7
    assert got[("c", 0)]["tokens"] == ref[("c", 0)]["tokens"] == ref[("b", 0)]["tokens"]


def test_cancel(check_bin, models):
    out, _ = _run(check_bin, "cancel", models["llama"])
    fin = {(s["id"], s["index"]): s["finish"] for s in out}
    assert fin[("keep", 0)] == "length" and fin[("keep", 1)] == "length"
    assert [f for (i, _), f in fin.items() if i == "drop"] == ["cancelled"] * 2
    assert sum(1 for s in out if s["id"] == "drop") == 4


def test_cancel_after_a_sample_finished(check_bin, models):
    """Regression: eng_engine_cancel read the group that its last live sample had freed when
    another sample of the group had already finished (ASan in the gen worker found it)."""
    out, err = _run(check_bin, "cancel_late", models["llama"])
    assert "sample 0 stops at token" in err
    fin = {(s["id"], s["index"]): s["finish"] for s in out}
    assert fin == {("late", 0): "eos", ("late", 1): "cancelled"}


def test_explicit_seeds(check_bin, models):
    out, err = _run(check_bin, "seeds", models["llama"])
    assert len(out) == 3 and "share the seed" in err

"""test_exec_harness.py - the harness command loop (anvil_harness.server) driven directly over
its two pipes, without the C worker or a sandbox: the protocol's edges that the worker never
produces itself but a candidate's process could be left in (a dump with nothing kept).

The process is started as the worker starts it (python -m anvil_harness CMD_FD REPLY_FD), with
the reference role (no candidate code), on the CPU; the spin test needs a CUDA GPU and skips,
saying so, without one.
"""
import json
import os
import pathlib
import struct
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
SRC = pathlib.Path(os.environ.get("ANVIL_SOURCE_DIR", HERE.parents[1]))
SHARED = pathlib.Path(os.environ.get("ANVIL_SHARED_DIR", SRC.parent / "shared"))
RELU = SHARED / "datasets" / "kernelbench" / "level1" / "19_ReLU.py"
PYTHON = os.environ.get("ANVIL_PYTHON", sys.executable)


class Harness:
    def __init__(self):
        cmd_r, self.cmd_w = os.pipe()
        self.rep_r, rep_w = os.pipe()
        env = dict(os.environ, PYTHONPATH=str(SRC / "exec_worker" / "harness"))
        self.proc = subprocess.Popen([PYTHON, "-m", "anvil_harness", str(cmd_r), str(rep_w)],
                                     pass_fds=(cmd_r, rep_w), env=env,
                                     stderr=subprocess.PIPE)
        os.close(cmd_r)
        os.close(rep_w)
        self.rep = os.fdopen(self.rep_r, "rb")
        self.n = 0

    def read(self):
        line = self.rep.readline()
        if not line:
            tail = self.proc.stderr.read().decode()[-2000:]
            pytest.fail("the harness closed its reply pipe: " + tail)
        return json.loads(line)

    def call(self, cmd, **fields):
        self.n += 1
        os.write(self.cmd_w, (json.dumps({"cmd": cmd, "id": self.n, **fields}) + "\n").encode())
        rep = self.read()
        assert rep["id"] == self.n, rep
        return rep

    def close(self):
        os.close(self.cmd_w)
        self.proc.wait(timeout=30)
        self.rep.close()


@pytest.fixture
def harness():
    if not RELU.exists():
        pytest.skip(f"{RELU} not found (datasets under {SHARED})")
    h = Harness()
    assert h.read()["event"] == "ready"
    yield h
    h.close()


def _records(path):
    """(dtype, shape) of each record of a tensorio file."""
    data, out, off = path.read_bytes(), [], 0
    while off < len(data):
        magic, dt, ndim, keylen, nbytes = struct.unpack_from("<IIIIQ", data, off)
        assert magic == 0x54564E41
        shape = struct.unpack_from(f"<{ndim}q", data, off + 24)
        head = 24 + 8 * ndim + keylen
        off += head + (-head % 8) + nbytes + (-nbytes % 8)
        out.append((dt, shape))
    return out


def test_dump_writes_the_kept_output_once(harness, tmp_path):
    """`time` writes no file; the `dump` after it writes the output it kept (the task's shape);
    a dump with nothing kept (before any time, and a second one after it) is an error reply,
    and the loop keeps serving."""
    h = harness
    early = h.call("dump", path=str(tmp_path / "early.anvt"))
    assert early["ok"] is False and "no output kept" in early["error"], early
    assert not (tmp_path / "early.anvt").exists()
    load = h.call("load", kind="kernelbench", task=RELU.read_text(), device="cpu", init_seed=1,
                  globals={"batch_size": 3, "dim": 17})
    assert load["ok"], load
    t = h.call("time", seeds=[11, 12, 13], warmup=1, flush_l2=True, dump_at=1, spin_us=200,
               dump=str(tmp_path / "old.anvt"))
    assert t["ok"] and len(t["host_ms"]) == 3 and t["dev_ms"] is None, t
    assert list(tmp_path.iterdir()) == [], "the time command wrote a file"
    d = h.call("dump", path=str(tmp_path / "t.anvt"))
    assert d["ok"] and d["leaves"] == 1, d
    assert _records(tmp_path / "t.anvt") == [(1, (3, 17))]  # float32 (batch_size, dim)
    again = h.call("dump", path=str(tmp_path / "again.anvt"))
    assert again["ok"] is False and "no output kept" in again["error"], again
    # dump_at outside the batch keeps nothing
    h.call("time", seeds=[14], warmup=0, flush_l2=True, dump_at=-1)
    assert h.call("dump", path=str(tmp_path / "none.anvt"))["ok"] is False
    assert h.call("env", device="cpu")["ok"]  # still serving


def test_dump_is_the_chosen_call_and_survives_buffer_reuse(harness, tmp_path):
    """The dumped output is the one of iteration dump_at (the same values as a trial with that
    seed), even when later calls of the batch overwrite the tensor the call returned: the
    harness keeps its own copy. A reference that returns one buffer for every call stands in
    for a candidate that reuses its output buffer."""
    h = harness
    task = RELU.read_text() + (
        "\n\n_buf = []\n"
        "class _Reuse(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        y = torch.relu(x)\n"
        "        if not _buf:\n"
        "            _buf.append(torch.empty_like(y))\n"
        "        _buf[0].copy_(y)\n"
        "        return _buf[0]\n"
        "Model = _Reuse\n")
    assert h.call("load", kind="kernelbench", task=task, device="cpu", init_seed=1,
                  globals={"batch_size": 2, "dim": 9})["ok"]
    assert h.call("time", seeds=[21, 22, 23], warmup=0, flush_l2=True, dump_at=0)["ok"]
    assert h.call("dump", path=str(tmp_path / "t.anvt"))["ok"]
    assert h.call("trials", seeds=[21, 23], modes=[0, 0],
                  dump=[str(tmp_path / "s21.anvt"), str(tmp_path / "s23.anvt")])["ok"]
    assert (tmp_path / "t.anvt").read_bytes() == (tmp_path / "s21.anvt").read_bytes()
    assert (tmp_path / "t.anvt").read_bytes() != (tmp_path / "s23.anvt").read_bytes()


def test_spin_is_host_time_not_event_time(harness):
    """On CUDA the spin before the start event shows in host_ms and not in dev_ms: with a
    2 ms spin the host mean grows by about 2 ms while the events still bracket only the call
    (far below the host time); the spin rate measured at load is in env's clocks, and using
    the spin is no tampering."""
    import torch
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU: the spin exists only on the CUDA path")
    h = harness
    assert h.call("load", kind="kernelbench", task=RELU.read_text(), device="cuda", init_seed=1,
                  globals={"batch_size": 64, "dim": 4096})["ok"]
    clocks = h.call("env", device="cuda")["clocks"]
    rate = float(clocks.split("spin_cycles_per_us=")[1].split()[0])
    assert rate > 0, clocks
    seeds = list(range(30, 50))
    mean = lambda v: sum(v) / len(v)
    plain = h.call("time", seeds=seeds, warmup=3, flush_l2=True, dump_at=0, spin_us=0)
    spun = h.call("time", seeds=seeds, warmup=0, flush_l2=True, dump_at=0, spin_us=2000)
    assert plain["ok"] and spun["ok"] and not spun["tampered"], spun
    assert mean(spun["host_ms"]) >= mean(plain["host_ms"]) + 1.5, (plain, spun)
    assert mean(spun["dev_ms"]) <= mean(spun["host_ms"]) - 1.5, spun


def test_dump_sample(harness, tmp_path):
    """`dump` with a sample writes each leaf larger than the sample as its shape (int64) and
    count values at indices drawn from the seed: the same seed gives the same file for the
    same output, another seed other indices, and the values are the output's own."""
    h = harness
    assert h.call("load", kind="kernelbench", task=RELU.read_text(), device="cpu", init_seed=1,
                  globals={"batch_size": 4, "dim": 1000})["ok"]
    files = {}
    for name, seed in (("a", 5), ("b", 5), ("c", 6)):
        assert h.call("time", seeds=[31], warmup=0, flush_l2=True, dump_at=0)["ok"]
        d = h.call("dump", path=str(tmp_path / f"{name}.anvt"), sample={"count": 100, "seed": seed})
        assert d["ok"] and d["leaves"] == 2, d
        files[name] = (tmp_path / f"{name}.anvt").read_bytes()
    assert _records(tmp_path / "a.anvt") == [(8, (2,)), (1, (100,))]  # int64 shape, f32 sample
    assert files["a"] == files["b"] and files["a"] != files["c"]
    # the sampled values are elements of the output (ReLU of the seed-31 input)
    assert h.call("trials", seeds=[31], modes=[0], dump=[str(tmp_path / "full.anvt")])["ok"]
    full = _values(tmp_path / "full.anvt")[0]
    shape, sample = _values(tmp_path / "a.anvt")
    assert shape == [4, 1000] and len(sample) == 100
    assert set(sample) <= set(full) and len(set(sample)) > 50
    # a leaf no larger than the sample stays whole
    assert h.call("time", seeds=[31], warmup=0, flush_l2=True, dump_at=0)["ok"]
    assert h.call("dump", path=str(tmp_path / "w.anvt"), sample={"count": 4000, "seed": 1})["ok"]
    assert _records(tmp_path / "w.anvt") == [(1, (4, 1000))]


def _values(path):
    """The values of each int64 / float32 record of a tensorio file, as lists."""
    data, out, off = path.read_bytes(), [], 0
    while off < len(data):
        magic, dt, ndim, keylen, nbytes = struct.unpack_from("<IIIIQ", data, off)
        head = 24 + 8 * ndim + keylen
        start = off + head + (-head % 8)
        fmt = {8: "q", 1: "f"}[dt]
        out.append(list(struct.unpack_from(f"<{nbytes // struct.calcsize(fmt)}{fmt}", data, start)))
        off = start + nbytes + (-nbytes % 8)
    return out

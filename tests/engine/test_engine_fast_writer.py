"""tiny_model.py's fast writer (--shape seed-coder-8b / --fast: tensors drawn in bf16 and
written shard by shard, no transformers model) at a small shape: HF transformers loads the
checkpoint with every key in place, the engine's greedy tokens match HF's, the shards and the
index agree, and the engine reports the load (bytes, seconds, GB/s)."""
import json
import os
import re
import subprocess
import sys

import numpy as np

from eng_testlib import REPO, samples

TOOL = os.path.join(REPO, "gen_worker", "engine", "tools", "tiny_model.py")
SMALL = ["--shape", "seed-coder-8b", "--layers", "2", "--hidden", "256", "--heads", "4",
         "--kv-heads", "2", "--ffn", "512", "--vocab", "8192", "--shard-gb", "0.003"]


def _write(out, *extra):
    p = subprocess.run([sys.executable, TOOL, str(out), *SMALL, *extra], capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    m = re.search(r"bytes=(\d+) seconds=([\d.]+)", p.stdout)
    assert m, p.stdout
    return int(m.group(1))


def test_fast_writer_checkpoint(tmp_path, generate_bin):
    import torch
    import transformers

    d = tmp_path / "m"
    total = _write(d)
    cfg = json.load(open(d / "config.json"))
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]) == (256, 2, 8192)
    idx = json.load(open(d / "model.safetensors.index.json"))
    shards = sorted(set(idx["weight_map"].values()))
    assert len(shards) >= 3  # the shard limit was honoured
    assert idx["metadata"]["total_size"] == total
    # 2 layers x 9 tensors + embed + norm + lm_head
    assert len(idx["weight_map"]) == 2 * 9 + 3
    hf, info = transformers.AutoModelForCausalLM.from_pretrained(
        d, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    hf.eval()
    # the engine: greedy 16 tokens equal HF's on the same checkpoint
    prompt = np.random.default_rng(5).integers(3, 8192, size=11).tolist()
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"id": "p", "prompt_ids": prompt}) + "\n")
    got = samples(generate_bin, "--model", d, "--prompts", path, "--temperature", 0,
                  "--max-tokens", 16, "--ignore-eos", "--seed", 1)
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(16):
            ids.append(int(torch.argmax(hf(torch.tensor([ids])).logits[0, -1])))
    assert got[("p", 0)]["token_ids"] == ids[len(prompt):]
    # seeded: the same seed writes the same bytes, another seed other bytes
    d2, d3 = tmp_path / "m2", tmp_path / "m3"
    _write(d2)
    _write(d3, "--seed", "7")
    first = idx["weight_map"]["lm_head.weight"]
    assert open(d / first, "rb").read() == open(d2 / first, "rb").read()
    assert open(d / first, "rb").read() != open(d3 / first, "rb").read()


def test_engine_reports_the_load(tmp_path, generate_bin):
    d = tmp_path / "m"
    total = _write(d)
    p = subprocess.run([generate_bin, "--model", str(d), "--prompt", "x", "--max-tokens", "1"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    m = re.search(r"weights: (\d+) tensors from (\d+) file\(s\), ([\d.]+) GB in ([\d.]+) s "
                  r"\(([\d.]+) GB/s\) on cpu", p.stderr)
    assert m, p.stderr
    assert int(m.group(1)) == 21 and int(m.group(2)) >= 3
    assert abs(float(m.group(3)) - total / 1e9) < 0.01

"""Broken checkpoints get a clear error from anvil-generate (exit 1, the reason on stderr),
never a crash."""
import json
import os
import shutil
import struct

import pytest

from eng_testlib import run_generate


def _copy(models, tmp_path, name="llama"):
    d = tmp_path / "m"
    shutil.copytree(models[name], d)
    return d


def _rewrite_header(path, edit):
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    edit(header)
    h = json.dumps(header).encode()
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + data[8 + n:])


def _edit_config(d, **changes):
    p = d / "config.json"
    cfg = json.load(open(p))
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    json.dump(cfg, open(p, "w"))


def _fails(generate_bin, d, *needles):
    p = run_generate(generate_bin, "--model", d, "--prompt", "hello", "--max-tokens", 2,
                     check=False)
    assert p.returncode == 1, (p.returncode, p.stderr)
    for n in needles:
        assert n in p.stderr, (n, p.stderr)
    return p


def test_truncated_safetensors(models, generate_bin, tmp_path):
    d = _copy(models, tmp_path)
    st = d / "model.safetensors"
    size = os.path.getsize(st)
    with open(st, "r+b") as f:
        f.truncate(size - 1000)
    _fails(generate_bin, d, "truncated", "model.safetensors")
    with open(st, "r+b") as f:
        f.truncate(100)  # inside the header
    _fails(generate_bin, d, "does not fit")
    with open(st, "r+b") as f:
        f.truncate(0)
    _fails(generate_bin, d, "model.safetensors")


def test_unknown_dtype(models, generate_bin, tmp_path):
    d = _copy(models, tmp_path)

    def edit(h):
        name = sorted(k for k in h if k != "__metadata__")[0]
        h[name]["dtype"] = "I16"

    _rewrite_header(d / "model.safetensors", edit)
    _fails(generate_bin, d, "unsupported dtype 'I16'")


def test_shape_mismatch(models, generate_bin, tmp_path):
    d = _copy(models, tmp_path)
    _edit_config(d, intermediate_size=96)
    _fails(generate_bin, d, "mlp.gate_proj.weight", "has shape [160, 64]", "[96, 64]")
    d2 = tmp_path / "m2"
    shutil.copytree(models["llama"], d2)

    def drop(h):
        del h["model.norm.weight"]

    _rewrite_header(d2 / "model.safetensors", drop)
    _fails(generate_bin, d2, "'model.norm.weight' is missing")


def test_unknown_architecture_and_features(models, generate_bin, tmp_path):
    d = _copy(models, tmp_path)
    _edit_config(d, architectures=["MistralForCausalLM"])
    _fails(generate_bin, d, "unsupported architecture 'MistralForCausalLM'")
    _edit_config(d, architectures=["LlamaForCausalLM"], rope_scaling={"rope_type": "llama3"})
    _fails(generate_bin, d, "rope_scaling 'llama3'")
    _edit_config(d, rope_scaling=None, hidden_act="gelu")
    _fails(generate_bin, d, "hidden_act 'gelu'")
    _edit_config(d, hidden_act="silu", num_key_value_heads=3)
    _fails(generate_bin, d, "not a multiple")
    _edit_config(d, num_key_value_heads=2, hidden_size=None)
    _fails(generate_bin, d, "'hidden_size' is missing")
    (d / "config.json").write_text("{not json")
    _fails(generate_bin, d, "config.json", "not a JSON object")


def test_token_ids_and_hints_out_of_range(models, generate_bin, tmp_path):
    """eos/bos ids and sampling hints that no cast can hold are refused by name (the fuzzer
    found an eos_token_id of 2.4e66 reaching an int cast: undefined behaviour)."""
    d = _copy(models, tmp_path)
    _edit_config(d, eos_token_id=2.4e66)
    _fails(generate_bin, d, "config.json: eos_token_id 2.4e+66 is not a token id")
    _edit_config(d, eos_token_id=[2, -1])
    _fails(generate_bin, d, "eos_token_id -1 is not a token id")
    _edit_config(d, eos_token_id=2)
    g = d / "generation_config.json"
    for hint, v in (("top_k", 1e40), ("top_p", 7), ("temperature", -1)):
        json.dump({hint: v}, open(g, "w"))
        _fails(generate_bin, d, "generation_config.json: '%s' is out of range" % hint)
    json.dump({"top_k": 20, "top_p": 0.9, "temperature": 0.6}, open(g, "w"))
    p = run_generate(generate_bin, "--model", d, "--prompt", "hello", "--max-tokens", 2)
    assert p.returncode == 0, p.stderr


def test_missing_or_bad_tokenizer(models, generate_bin, tmp_path):
    d = _copy(models, tmp_path)
    tj = json.load(open(d / "tokenizer.json"))
    os.remove(d / "tokenizer.json")
    _fails(generate_bin, d, "tokenizer.json")
    bad = dict(tj)
    bad["model"] = dict(tj["model"], type="WordPiece")
    json.dump(bad, open(d / "tokenizer.json", "w"))
    _fails(generate_bin, d, "model type 'WordPiece'")
    bad = dict(tj)
    bad["model"] = dict(tj["model"], merges=tj["model"]["merges"] + [["zzqq", "xxyy"]])
    json.dump(bad, open(d / "tokenizer.json", "w"))
    _fails(generate_bin, d, "missing from the vocab")
    bad = dict(tj, normalizer={"type": "Lowercase"})
    json.dump(bad, open(d / "tokenizer.json", "w"))
    _fails(generate_bin, d, "normalizer 'Lowercase'")


def test_missing_weights_and_bad_index(models, generate_bin, tmp_path):
    d = _copy(models, tmp_path)
    os.remove(d / "model.safetensors")
    _fails(generate_bin, d, "neither model.safetensors nor")
    d2 = tmp_path / "sh"
    shutil.copytree(models["llama_fp16_sharded"], d2)
    shards = sorted(p for p in os.listdir(d2) if p.endswith(".safetensors"))
    assert len(shards) > 1
    os.remove(d2 / shards[-1])
    _fails(generate_bin, d2, "cannot open", shards[-1])


def test_cuda_backend_refused_when_not_built(models, generate_bin):
    p = run_generate(generate_bin, "--model", models["llama"], "--prompt", "x", "--backend",
                     "cuda", check=False)
    if p.returncode == 0:
        pytest.skip("this build has the CUDA backend")
    assert p.returncode == 1 and "cuda" in p.stderr


def test_bad_prompts_file(models, generate_bin, tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "ok"}\n{"prompt": 5}\n')
    p = run_generate(generate_bin, "--model", models["llama"], "--prompts", path, check=False)
    assert p.returncode == 2 and "line 2" in p.stderr
    path.write_text('{"prompt_ids": [1, 999999]}\n')
    p = run_generate(generate_bin, "--model", models["llama"], "--prompts", path, check=False)
    assert p.returncode == 2 and "outside the vocabulary" in p.stderr

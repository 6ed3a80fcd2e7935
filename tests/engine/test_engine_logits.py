"""The CPU backend against HF transformers on tiny random Llama and Qwen2 checkpoints: logits
of every position (max relative error <= 1e-3, several prompt lengths, whole and chunked
prefill over non-contiguous paged blocks), greedy continuations of 64 tokens, and batched /
paged / preempted runs equal to one-at-a-time runs."""
import json
import os
import re
import subprocess

import numpy as np
import pytest

from eng_testlib import run_generate, samples

MODELS = ["llama", "llama_fp32", "llama_fp16_sharded", "qwen2", "qwen2_untied"]
LENGTHS = [1, 7, 33, 100]


def _hf(d):
    import torch
    import transformers

    torch.set_num_threads(2)
    m = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32,
                                                          attn_implementation="eager")
    return m.eval()


def _prompt(n, vocab, seed):
    return np.random.default_rng(seed).integers(0, vocab, size=n).tolist()


def _dump(dump_bin, d, ids, block, chunk, tmp_path, vocab):
    out = tmp_path / f"logits_{len(ids)}_{block}_{chunk}.bin"
    subprocess.run([dump_bin, d, str(out), str(block), str(chunk), *map(str, ids)], check=True,
                   timeout=300)
    return np.fromfile(out, dtype=np.float32).reshape(len(ids), vocab)


def _rel_err(got, want):
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


@pytest.mark.parametrize("name", MODELS)
def test_logits_match_hf(name, models, dump_bin, tmp_path):
    import torch

    d = models[name]
    if "sharded" in name:
        assert os.path.exists(os.path.join(d, "model.safetensors.index.json"))
    hf = _hf(d)
    vocab = hf.config.vocab_size
    worst = 0.0
    for n in LENGTHS:
        ids = _prompt(n, vocab, n)
        with torch.no_grad():
            want = hf(torch.tensor([ids])).logits[0].float().numpy()
        for block, chunk in [(16, 0), (4, 5), (1, 1)]:
            got = _dump(dump_bin, d, ids, block, chunk, tmp_path, vocab)
            err = _rel_err(got, want)
            worst = max(worst, err)
            assert err <= 1e-3, (name, n, block, chunk, err)
    print(f"{name}: max relative logit error {worst:.2e} over prompt lengths {LENGTHS}")


@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_greedy_64_tokens_match_hf(name, models, generate_bin, tmp_path):
    import torch

    d = models[name]
    hf = _hf(d)
    vocab = hf.config.vocab_size
    prompts = [_prompt(n, vocab, 100 + n) for n in (3, 20)]
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"id": f"p{i}", "prompt_ids": p}) + "\n"
                            for i, p in enumerate(prompts)))
    got = samples(generate_bin, "--model", d, "--prompts", path, "--temperature", 0,
                  "--max-tokens", 64, "--ignore-eos", "--seed", 1)
    for i, p in enumerate(prompts):
        ids = list(p)
        lps = []
        with torch.no_grad():
            for _ in range(64):
                logits = hf(torch.tensor([ids])).logits[0, -1].float()
                lp = torch.log_softmax(logits, -1)
                ids.append(int(torch.argmax(logits)))
                lps.append(float(lp[ids[-1]]))
        s = got[(f"p{i}", 0)]
        assert s["token_ids"] == ids[len(p):]
        assert s["finish_reason"] == "length"
        assert np.allclose(s["logprobs"], lps, atol=1e-4)


def _batch_file(tmp_path, vocab, name="b.jsonl"):
    lines = []
    for i, n in enumerate([5, 40, 17, 70]):
        lines.append({"id": f"r{i}", "prompt_ids": _prompt(n, vocab, 200 + i), "n": 1 + i % 3,
                      "seed": 10 + i})
    path = tmp_path / name
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path, lines


def test_batched_paged_equal_one_at_a_time(models, generate_bin, tmp_path):
    d = models["llama"]
    vocab = json.load(open(os.path.join(d, "config.json")))["vocab_size"]
    path, lines = _batch_file(tmp_path, vocab)
    common = ["--model", d, "--temperature", 0.8, "--top-k", 50, "--max-tokens", 24,
              "--ignore-eos"]
    batched = samples(generate_bin, *common, "--prompts", path)
    assert len(batched) == sum(x["n"] for x in lines)
    alone = {}
    for x in lines:
        one = tmp_path / f"{x['id']}.jsonl"
        one.write_text(json.dumps(x) + "\n")
        alone.update(samples(generate_bin, *common, "--prompts", one, "--block-size", 16))
    variants = {
        "block size 1": ["--block-size", 1],
        "block size 64": ["--block-size", 64],
        "chunked prefill": ["--max-batch-tokens", 7],
        "no prefix sharing": ["--no-prefix-sharing"],
    }
    for label, extra in variants.items():
        v = samples(generate_bin, *common, "--prompts", path, *extra)
        for k, s in alone.items():
            assert v[k]["token_ids"] == s["token_ids"], (label, k)
            assert v[k]["logprobs"] == s["logprobs"], (label, k)
    for k, s in alone.items():
        assert batched[k]["token_ids"] == s["token_ids"], k
        assert batched[k]["logprobs"] == s["logprobs"], k


def test_preemption_reshares_the_prompt(models, generate_bin, tmp_path):
    """A preempted sample of a group takes its prompt's full KV blocks from a running sibling
    again and recomputes only the rest: the summary counts those prompt tokens, and every
    sample's tokens and logprobs are those of a run with room for all (and of a tight run
    without prefix sharing, which takes nothing from a sibling)."""
    d = models["llama"]
    vocab = json.load(open(os.path.join(d, "config.json")))["vocab_size"]
    lines = [{"id": f"g{i}", "prompt_ids": _prompt(n, vocab, 300 + i), "n": 4, "seed": 20 + i}
             for i, n in enumerate([41, 66, 29])]
    path = tmp_path / "g.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    common = ["--model", d, "--temperature", 1.0, "--max-tokens", 40, "--ignore-eos",
              "--prompts", path, "--block-size", 4, "--json"]

    def run(*extra):
        p = run_generate(generate_bin, *common, *extra)
        out = {(x["id"], x["index"]): x for x in map(json.loads, p.stdout.split("\n")[:-1])}
        m = re.search(r"(\d+) preemptions \((\d+) prompt tokens taken from a sibling\)",
                      p.stderr)
        assert m, p.stderr
        return out, int(m.group(1)), int(m.group(2))

    roomy, n0, r0 = run()
    assert (n0, r0) == (0, 0)
    tight, n1, r1 = run("--kv-blocks", 70)
    assert n1 > 0 and r1 > 0, (n1, r1)
    assert r1 % 4 == 0  # whole blocks
    alone, n2, r2 = run("--kv-blocks", 70, "--no-prefix-sharing")
    assert n2 > 0 and r2 == 0, (n2, r2)
    assert set(tight) == set(roomy) == set(alone) and len(roomy) == 12
    for k in roomy:
        assert tight[k]["token_ids"] == roomy[k]["token_ids"], k
        assert tight[k]["logprobs"] == roomy[k]["logprobs"], k
        assert alone[k]["token_ids"] == roomy[k]["token_ids"], k


def test_preemption_recomputes_exactly(models, generate_bin, tmp_path):
    d = models["llama"]
    vocab = json.load(open(os.path.join(d, "config.json")))["vocab_size"]
    path, lines = _batch_file(tmp_path, vocab)
    common = ["--model", d, "--temperature", 1.0, "--max-tokens", 40, "--ignore-eos",
              "--prompts", path, "--block-size", 4]
    roomy = samples(generate_bin, *common)
    p = run_generate(generate_bin, *common, "--kv-blocks", 40, "--json")
    tight = {}
    for line in p.stdout.strip().split("\n"):
        s = json.loads(line)
        tight[(s["id"], s["index"])] = s
    preempted = int(p.stderr.split(" preemptions")[0].rsplit(" ", 1)[1])
    assert preempted > 0, p.stderr
    assert set(tight) == set(roomy)
    for k in roomy:
        assert tight[k]["token_ids"] == roomy[k]["token_ids"], k

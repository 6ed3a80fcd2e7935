"""bench_cpu.py - CPU backend tokens/s on a small random Llama, against HF transformers on the
same machine and threads, plus the KV blocks prefix sharing saves for 8 samples of a
1k-token prompt. Prints figures; asserts nothing about speed.

    ANVIL_BUILD_DIR=build python tests/engine/bench_cpu.py [--threads 2]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "gen_worker", "engine", "tools"))
import tiny_model  # noqa: E402

REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
BUILD = os.environ.get("ANVIL_BUILD_DIR", os.path.join(REPO, "build"))
SHARED = os.environ.get("ANVIL_SHARED_DIR", os.path.join(REPO, "..", "shared"))


def run(binary, *args):
    p = subprocess.run([binary, *map(str, args)], capture_output=True, text=True, check=True)
    return p


def stat(stderr, key):
    line = [x for x in stderr.splitlines() if "generated" in x][-1]
    return line.split(key)[0].rsplit(" ", 1)[1].strip("(")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128)
    a = ap.parse_args()
    gen = os.path.join(BUILD, "gen_worker", "engine", "anvil-generate")
    with tempfile.TemporaryDirectory() as tmp:
        d = tiny_model.make_model(os.path.join(tmp, "small"), "llama", "bf16", layers=8,
                                  hidden=512, heads=8, kv_heads=4, ffn=1408, shared=SHARED)
        cfg = json.load(open(os.path.join(d, "config.json")))
        params = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d)
                     if f.endswith(".safetensors")) // 2
        print(f"model: llama {cfg['num_hidden_layers']} layers, hidden {cfg['hidden_size']}, "
              f"vocab {cfg['vocab_size']}, {params / 1e6:.1f} M params bf16, "
              f"{a.threads} threads")
        prompt = "def softmax_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):"
        for n in (1, 8):
            p = run(gen, "--model", d, "--prompt", prompt, "--n", n, "--max-tokens", a.tokens,
                    "--ignore-eos", "--temperature", 0.8, "--seed", 1, "--threads", a.threads,
                    "--json")
            print(f"anvil-generate cpu, n={n}: {stat(p.stderr, ' tok/s')} tok/s")

        import torch
        import transformers

        torch.set_num_threads(a.threads)
        m = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
        tok = transformers.AutoTokenizer.from_pretrained(d)
        ids = torch.tensor([tok.encode(prompt)])
        with torch.no_grad():  # warm-up, not timed
            m.generate(ids, max_new_tokens=8, do_sample=True, pad_token_id=1)
        for n in (1, 8):
            x = ids.repeat(n, 1)
            with torch.no_grad():
                t0 = time.time()
                m.generate(x, max_new_tokens=a.tokens, min_new_tokens=a.tokens, do_sample=True,
                           temperature=0.8, top_k=0, pad_token_id=1)
                dt = time.time() - t0
            print(f"HF transformers {transformers.__version__} generate fp32, n={n}: "
                  f"{n * a.tokens / dt:.1f} tok/s")

        # KV saved by prefix sharing: 8 samples of a 1000-token prompt
        path = os.path.join(tmp, "long.jsonl")
        with open(path, "w") as f:
            f.write(json.dumps({"id": "long", "prompt_ids": list(range(3, 1003)), "n": 8,
                                "seed": 1}) + "\n")
        for extra in ([], ["--no-prefix-sharing"]):
            p = run(gen, "--model", d, "--prompts", path, "--max-tokens", 16, "--ignore-eos",
                    "--json", "--threads", a.threads, *extra)
            line = [x for x in p.stderr.splitlines() if "kv peak" in x][-1]
            print(f"prefix sharing {'off' if extra else 'on '}: {line.split('steps, ')[1]}")


if __name__ == "__main__":
    main()

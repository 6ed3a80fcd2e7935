#!/usr/bin/env python3
"""hf_peer_bench.py - the HF transformers peer of anvil-bench-engine (bf16, eager generate).

Same shape (Seed-Coder-8B unless --layers), random bf16 weights made on the GPU, prompt of
random tokens, greedy generate of exactly --new tokens per sequence; prints one line per batch
size in anvil-bench-engine's format (tok/s counts generated tokens over the whole generate
call, prefill included, as a user of generate sees it), then a summary. --json for machines.
"""
import argparse
import json
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

ap = argparse.ArgumentParser()
ap.add_argument("--batches", default="1,16,64,256")
ap.add_argument("--prompt", type=int, default=512)
ap.add_argument("--new", type=int, default=256)
ap.add_argument("--layers", type=int, default=32)
ap.add_argument("--json", action="store_true")
a = ap.parse_args()

cfg = LlamaConfig(vocab_size=155136, hidden_size=4096, intermediate_size=14336,
                  num_hidden_layers=a.layers, num_attention_heads=32, num_key_value_heads=8,
                  head_dim=128, rope_theta=500000.0, rms_norm_eps=1e-6,
                  max_position_embeddings=8192, tie_word_embeddings=False,
                  bos_token_id=0, eos_token_id=2, attn_implementation="eager")
torch.set_default_dtype(torch.bfloat16)
with torch.device("cuda"):
    model = LlamaForCausalLM(cfg).eval()
res = {}
for b in [int(x) for x in a.batches.split(",")]:
    ids = torch.randint(3, cfg.vocab_size, (b, a.prompt), device="cuda")
    mask = torch.ones_like(ids)
    with torch.no_grad():
        model.generate(ids[:, :8], attention_mask=mask[:, :8], max_new_tokens=2,
                       do_sample=False)  # warm-up
        torch.cuda.synchronize()
        t0 = time.time()
        out = model.generate(ids, attention_mask=mask, max_new_tokens=a.new,
                             min_new_tokens=a.new, do_sample=False)
        torch.cuda.synchronize()
        dt = time.time() - t0
    n = (out.shape[1] - a.prompt) * b
    res[b] = n / dt
    if a.json:
        print(json.dumps({"bench": "hf_generate", "batch": b, "prompt": a.prompt, "new": a.new,
                          "tok_s": round(n / dt, 1), "ms_step": round(dt * 1e3 / a.new, 3)}))
    else:
        print(f"hf_generate batch={b:<4d} prompt={a.prompt} new={a.new} tok_s={n / dt:.1f} "
              f"ms_step={dt * 1e3 / a.new:.3f}", flush=True)
    del out
    torch.cuda.empty_cache()
print(("hf_summary " + " ".join(f"b{b}_tok_s={v:.1f}" for b, v in res.items())) if not a.json
      else json.dumps({"bench": "hf_summary", **{f"b{b}_tok_s": round(v, 1) for b, v in res.items()}}))

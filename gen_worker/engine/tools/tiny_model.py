"""tiny_model.py - small random Llama / Qwen2 checkpoints with a real trained BPE tokenizer.

The tokenizer is a byte-level BPE trained with the `tokenizers` library on code (the Triton
and PyTorch sources of ../shared/datasets plus this repository's C sources) and some Unicode
text, with a pre-tokenizer in the style of Seed-Coder: a Split regex whose digits are split
one by one, then ByteLevel without its own regex. The special tokens are laid out as
Seed-Coder's (<bos> 0, <pad> 1, <eos> 2) plus ChatML's markers. Weights are random (seeded)
with a spread large enough that logits differ clearly, saved by transformers'
save_pretrained as bf16, fp16 or fp32 safetensors, optionally sharded.

Used by the engine tests (models are made at test time in a temporary directory, never
committed) and runnable by hand:
    python gen_worker/engine/tools/tiny_model.py OUT_DIR [--arch llama|qwen2] [--dtype bf16] [--shard]

--shape seed-coder-8b writes a Seed-Coder-8B-shaped Llama (hidden 4096, 32 layers, 32/8
heads, MLP 14336, vocab 155136; any of --layers/--hidden/--heads/--kv-heads/--ffn/--vocab
given explicitly overrides its value) with the fast writer: no transformers model is built,
every tensor is drawn straight in bf16 by torch (seeded, uniform with the same spread as the
small models) and written with safetensors into shards of --shard-gb GB plus
model.safetensors.index.json, the config.json and generation_config.json transformers would
write, and the same trained tokenizer. --fast selects that writer for any shape. It prints
the bytes written and the seconds taken.
"""
import argparse
import glob
import json
import os
import random

# Seed-Coder-style split: like the Llama 3 pattern, but \p{N} one digit at a time.
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIALS = ["<bos>", "<pad>", "<eos>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]

SEED_REASONING_TEMPLATE = (
    "{% for message in messages %}"
    "{{ bos_token + message['role'] + '\\n' + message['content'] + eos_token }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ bos_token + 'assistant\\n' }}{% endif %}"
)
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

UNICODE_TEXT = [
    "Größe, façade, naïve café — déjà vu. Ελληνικά κείμενα. Русский текст для проверки.",
    "中文文本用于训练分词器。日本語のテキストです。한국어 텍스트입니다.",
    "emoji 🚀🔥✨ 👩‍💻 🇫🇷 and math ∑ ∫ √ ≤ ≥ ≠ ∞ π",
    "tabs\tand  double  spaces\n\n\nnew lines   trailing   \r\n windows line",
]


def corpus_files(shared):
    pats = ["datasets/tritonbench/TritonBench_G_v1/*.py", "datasets/tritonbench/TritonBench_T_v1/*.py",
            "datasets/kernelbench/level1/*.py", "datasets/kernelbench/level2/*.py"]
    files = []
    for p in pats:
        files += sorted(glob.glob(os.path.join(shared, p)))
    return files


def train_tokenizer(shared, vocab_size=3000):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    texts = []
    for f in corpus_files(shared)[::2]:  # half the files: the rest stays unseen for tests
        with open(f, encoding="utf-8", errors="replace") as fh:
            texts.append(fh.read())
    texts += UNICODE_TEXT * 20
    if len(texts) < 30:  # datasets missing: still a usable (smaller) tokenizer
        here = os.path.dirname(os.path.abspath(__file__))
        for f in glob.glob(os.path.join(here, "..", "..", "gen_worker", "engine", "*.c")):
            with open(f, encoding="utf-8") as fh:
                texts.append(fh.read())
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def make_model(out, arch="llama", dtype="bf16", shard=False, seed=0, add_bos=False, layers=2,
               hidden=64, heads=4, kv_heads=2, ffn=160, max_pos=4096, tokenizer=None,
               shared=None, tie=None):
    import torch
    import transformers

    os.makedirs(out, exist_ok=True)
    shared = shared or os.environ.get("ANVIL_SHARED_DIR") or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "shared")
    tok = tokenizer or train_tokenizer(shared)
    tok.save(os.path.join(out, "tokenizer.json"))
    vocab = tok.get_vocab_size()
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn,
                  num_hidden_layers=layers, num_attention_heads=heads,
                  num_key_value_heads=kv_heads, max_position_embeddings=max_pos,
                  rms_norm_eps=1e-6, bos_token_id=0, eos_token_id=2, rope_theta=500000.0)
    if arch == "llama":
        cfg = transformers.LlamaConfig(head_dim=hidden // heads, attention_bias=False,
                                       tie_word_embeddings=bool(tie), **common)
        cls = transformers.LlamaForCausalLM
        template, bos_tok, eos_tok = SEED_REASONING_TEMPLATE, "<bos>", "<eos>"
    elif arch == "qwen2":
        cfg = transformers.Qwen2Config(tie_word_embeddings=True if tie is None else tie,
                                       use_sliding_window=False, **common)
        cls = transformers.Qwen2ForCausalLM
        template, bos_tok, eos_tok = CHATML_TEMPLATE, None, "<|im_end|>"
    else:
        raise ValueError(arch)
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.5 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * (1.0 / p.shape[-1] ** 0.5) * 2.0)
    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    model = model.to(tdt)
    model.generation_config.eos_token_id = 2 if arch == "llama" else [2, tok.token_to_id("<|im_end|>")]
    model.save_pretrained(out, safe_serialization=True, max_shard_size="100KB" if shard else "10GB")
    tcfg = {"bos_token": bos_tok, "eos_token": eos_tok, "pad_token": "<pad>",
            "add_bos_token": bool(add_bos), "chat_template": template,
            "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_pos}
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(tcfg, f, indent=1)
    return out


SHAPES = {"seed-coder-8b": dict(layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336,
                                vocab=155136, max_pos=32768)}


def write_fast(out, dtype="bf16", seed=0, layers=2, hidden=64, heads=4, kv_heads=2, ffn=160,
               vocab=None, max_pos=4096, shard_gb=5.0, tokenizer=None, shared=None):
    """A random Llama checkpoint written tensor by tensor (no nn.Module): fast at 8B."""
    import time

    import torch
    from safetensors.torch import save_file

    t0 = time.time()
    os.makedirs(out, exist_ok=True)
    shared = shared or os.environ.get("ANVIL_SHARED_DIR") or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "shared")
    tok = tokenizer or train_tokenizer(shared)
    tok.save(os.path.join(out, "tokenizer.json"))
    vocab = vocab or tok.get_vocab_size()
    if vocab < tok.get_vocab_size():
        raise ValueError(f"vocab {vocab} is smaller than the tokenizer's {tok.get_vocab_size()}")
    head_dim = hidden // heads
    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
           "vocab_size": vocab, "hidden_size": hidden, "intermediate_size": ffn,
           "num_hidden_layers": layers, "num_attention_heads": heads,
           "num_key_value_heads": kv_heads, "head_dim": head_dim, "hidden_act": "silu",
           "max_position_embeddings": max_pos, "rms_norm_eps": 1e-6, "rope_theta": 500000.0,
           "rope_scaling": None, "attention_bias": False, "attention_dropout": 0.0,
           "mlp_bias": False, "tie_word_embeddings": False, "bos_token_id": 0,
           "eos_token_id": 2, "torch_dtype": {"bf16": "bfloat16", "fp16": "float16",
                                              "fp32": "float32"}[dtype],
           "initializer_range": 0.02, "pretraining_tp": 1, "use_cache": True}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 0, "eos_token_id": 2}, f, indent=1)
    tcfg = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>",
            "add_bos_token": False, "chat_template": SEED_REASONING_TEMPLATE,
            "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_pos}
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(tcfg, f, indent=1)

    q, kv = heads * head_dim, kv_heads * head_dim
    shapes = [("model.embed_tokens.weight", (vocab, hidden))]
    for l in range(layers):
        p = f"model.layers.{l}."
        shapes += [(p + "input_layernorm.weight", (hidden,)),
                   (p + "self_attn.q_proj.weight", (q, hidden)),
                   (p + "self_attn.k_proj.weight", (kv, hidden)),
                   (p + "self_attn.v_proj.weight", (kv, hidden)),
                   (p + "self_attn.o_proj.weight", (hidden, q)),
                   (p + "post_attention_layernorm.weight", (hidden,)),
                   (p + "mlp.gate_proj.weight", (ffn, hidden)),
                   (p + "mlp.up_proj.weight", (ffn, hidden)),
                   (p + "mlp.down_proj.weight", (hidden, ffn))]
    shapes += [("model.norm.weight", (hidden,)), ("lm_head.weight", (vocab, hidden))]
    g = torch.Generator().manual_seed(seed)
    esize = torch.tensor([], dtype=tdt).element_size()
    limit = max(1, int(shard_gb * 1e9))
    shards, cur, cur_bytes = [], {}, 0
    for name, shape in shapes:
        n = 1
        for d in shape:
            n *= d
        if cur and cur_bytes + n * esize > limit:
            shards.append(cur)
            cur, cur_bytes = {}, 0
        t = torch.empty(shape, dtype=tdt)
        if len(shape) == 1:
            t.uniform_(0.8, 1.2, generator=g)  # norms near 1, like the small models
        else:
            a = 2.0 * 3 ** 0.5 / shape[-1] ** 0.5  # uniform with std 2 / sqrt(fan_in)
            t.uniform_(-a, a, generator=g)
        cur[name] = t
        cur_bytes += n * esize
    shards.append(cur)
    weight_map, total = {}, 0
    for i, sh in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(sh, os.path.join(out, fname), metadata={"format": "pt"})
        for k, v in sh.items():
            weight_map[k] = fname
            total += v.numel() * v.element_size()
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    return total, time.time() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--arch", default="llama", choices=["llama", "qwen2"])
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--shard", action="store_true")
    ap.add_argument("--add-bos", action="store_true")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--hidden", type=int, default=None)
    ap.add_argument("--heads", type=int, default=None)
    ap.add_argument("--kv-heads", type=int, default=None)
    ap.add_argument("--ffn", type=int, default=None)
    ap.add_argument("--vocab", type=int, default=None, help="fast writer: vocab_size")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shape", choices=sorted(SHAPES), default=None)
    ap.add_argument("--fast", action="store_true", help="the tensor-by-tensor writer")
    ap.add_argument("--shard-gb", type=float, default=5.0, help="fast writer: shard size")
    a = ap.parse_args()
    dims = dict(layers=2, hidden=64, heads=4, kv_heads=2, ffn=160, vocab=None, max_pos=4096)
    if a.shape:
        dims.update(SHAPES[a.shape])
    for k in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab"):
        if getattr(a, k) is not None:
            dims[k] = getattr(a, k)
    if a.shape or a.fast:
        if a.arch != "llama":
            ap.error("the fast writer writes Llama checkpoints only")
        total, secs = write_fast(a.out, a.dtype, a.seed, dims["layers"], dims["hidden"],
                                 dims["heads"], dims["kv_heads"], dims["ffn"], dims["vocab"],
                                 dims["max_pos"], a.shard_gb)
        print(f"{a.out} bytes={total} seconds={secs:.1f} gb_s={total / 1e9 / max(secs, 1e-9):.2f}")
        return
    a.layers, a.hidden, a.heads = dims["layers"], dims["hidden"], dims["heads"]
    a.kv_heads, a.ffn = dims["kv_heads"], dims["ffn"]
    make_model(a.out, a.arch, a.dtype, a.shard, a.seed, a.add_bos, a.layers, a.hidden, a.heads,
               a.kv_heads, a.ffn)
    print(a.out)


if __name__ == "__main__":
    random.seed(0)
    main()

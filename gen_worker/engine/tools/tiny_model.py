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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--arch", default="llama", choices=["llama", "qwen2"])
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--shard", action="store_true")
    ap.add_argument("--add-bos", action="store_true")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--ffn", type=int, default=160)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    make_model(a.out, a.arch, a.dtype, a.shard, a.seed, a.add_bos, a.layers, a.hidden, a.heads,
               a.kv_heads, a.ffn)
    print(a.out)


if __name__ == "__main__":
    random.seed(0)
    main()

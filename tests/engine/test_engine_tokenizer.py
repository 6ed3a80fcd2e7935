"""The engine's tokenizer against HF `tokenizers` on >= 10,000 strings, exact decode, chat
templates against transformers' apply_chat_template, and the no-double-BOS rule."""
import glob
import json
import os
import random
import shutil

import pytest

from anvil_cluster import need_datasets  # tests/lib, on the path from tests/conftest.py
from eng_testlib import SHARED, run_generate

SPECIAL_IN_TEXT = ["<bos>", "<eos>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<pad>"]
PIECES = [
    "def ", "return ", "tl.load(", "tl.program_id(0)", "BLOCK_SIZE: tl.constexpr", "@triton.jit",
    "x_ptr + offsets", "mask=mask", "  ", "\t", "\n", "\n\n", "\r\n", "    ", "(", ")", "[:, None]",
    "==", "!=", "<=", "->", "**", "'s", "'T", "'ll", "DON'T", "it's", "0x1F", "1e-6", "3.14159",
    "héllo", "naïve", "Straße", "ﬁ", "İstanbul", "ǅ", "Ω", "日本語", "中文", "한국어", "русский",
    "العربية", "עברית", "हिन्दी", "ไทย", "🚀", "👩‍💻", "🇫🇷", "👍🏽", "❤️", "🧑‍🤝‍🧑", "∑∫√",
    "٣٤٥", "３４５", "¼", "Ⅻ", "\u00a0", "\u3000", "\u2028", "\u200b", "\u0301", "e\u0301",
    "\u00ad", "\ufeff", "\U0001d400", "~~~", "###", "```python\n", "</s>", "<eo", "<<eos>>",
    "\x1b[0m", "\x7f", "\x0c", "\\n", "\"quoted\"",
]


def _code_strings(rng):
    files = []
    for pat in ["tritonbench/TritonBench_G_v1/*.py", "tritonbench/TritonBench_T_v1/*.py",
                "kernelbench/level1/*.py", "kernelbench/level2/*.py"]:
        files += sorted(glob.glob(os.path.join(SHARED, "datasets", pat)))
    out = []
    for f in files:
        with open(f, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        lines = text.split("\n")
        out.append(text)  # whole files, Triton kernels and all
        for _ in range(12):
            a = rng.randrange(len(lines))
            out.append("\n".join(lines[a:a + rng.randint(1, 8)]))
    return out


def _random_strings(rng, n):
    out = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.25:  # whitespace runs
            s = "".join(rng.choice([" ", "\t", "\n", "\r", "\u00a0", "\u3000"]) * rng.randint(1, 70)
                        + rng.choice(["", "x", "if", "1", "("]) for _ in range(rng.randint(1, 4)))
        elif kind < 0.45:  # digits
            s = "".join(rng.choice(["", " ", "x", ".", ",", "-", "e"]) +
                        str(rng.randint(0, 10 ** rng.randint(1, 25))) for _ in range(rng.randint(1, 5)))
        elif kind < 0.6:  # random code points of many scripts
            s = "".join(chr(rng.choice([rng.randint(0x20, 0x7e), rng.randint(0xa0, 0x2fff),
                                        rng.randint(0x3000, 0x9fff), rng.randint(0xac00, 0xd7a3),
                                        rng.randint(0x1f300, 0x1faff), rng.randint(0xe000, 0xf8ff)]))
                        for _ in range(rng.randint(1, 40)))
        else:  # mixtures, with special tokens inside the text
            parts = [rng.choice(PIECES) for _ in range(rng.randint(1, 12))]
            if rng.random() < 0.5:
                parts.insert(rng.randrange(len(parts) + 1), rng.choice(SPECIAL_IN_TEXT))
            s = "".join(parts)
        out.append(s)
    return out


VARIANTS = {
    "seed-coder": None,  # as trained: Split(digits one by one) + ByteLevel(use_regex false)
    "ignore-merges": lambda tj: tj["model"].update(ignore_merges=True),
    "gpt2": lambda tj: tj.update(pre_tokenizer={
        "type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}),
    "digits": lambda tj: tj.update(pre_tokenizer={"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
         "use_regex": True}]}),
}


def _variant(models, name, tmp_path):
    d = models["llama"]
    if VARIANTS[name] is None:
        return d
    v = tmp_path / name
    shutil.copytree(d, v)
    tj = json.load(open(v / "tokenizer.json"))
    VARIANTS[name](tj)
    json.dump(tj, open(v / "tokenizer.json", "w"))
    return str(v)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_tokenizer_matches_hf(variant, generate_bin, models, tmp_path):
    from tokenizers import Tokenizer

    need_datasets()  # the code strings are the datasets' files (skips without them)
    d = _variant(models, variant, tmp_path)
    hf = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    rng = random.Random(1234)
    strings = _code_strings(rng) + _random_strings(rng, 7000)
    strings += ["", " ", "  x", "\n\n\n", " " * 300, "a" * 500, "1" * 64, "<eos>" * 3,
                "<bos>user\nhi<eos>", "x<|im_start|>y", "é" * 100, "🚀" * 50]
    assert len(strings) >= 10000
    path = tmp_path / "strings.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for s in strings:
            f.write(json.dumps(s) + "\n")
    p = run_generate(generate_bin, "--model", d, "--tokenize-jsonl", path)
    lines = p.stdout.rstrip("\n").split("\n")  # not splitlines: U+2028 is in the text
    assert len(lines) == len(strings)
    mismatched, undecoded = [], []
    for s, line in zip(strings, lines):
        got = json.loads(line)
        want = hf.encode(s, add_special_tokens=False).ids
        if got["ids"] != want:
            mismatched.append((s, got["ids"], want))
        # add_prefix_space (gpt2 variant) adds a space by design: there decode == HF's decode
        want_text = hf.decode(want, skip_special_tokens=False) if variant == "gpt2" else s
        if got["decoded"] != want_text or hf.decode(got["ids"], skip_special_tokens=False) != want_text:
            undecoded.append(s)
    print(f"{variant}: {len(strings)} strings: {len(mismatched)} id mismatches, {len(undecoded)} decode "
          f"mismatches")
    assert not mismatched, f"first mismatches: {mismatched[:3]}"
    assert not undecoded, f"first: {undecoded[:3]!r}"


def test_nul_in_jsonl_refused(generate_bin, models, tmp_path):
    path = tmp_path / "nul.jsonl"
    path.write_text('"ok"\n"a\\u0000b"\n')
    p = run_generate(generate_bin, "--model", models["llama"], "--tokenize-jsonl", path,
                     check=False)
    assert p.returncode == 2 and "line 2" in p.stderr and "NUL" in p.stderr


def test_tokenize_cli_json(generate_bin, models):
    from tokenizers import Tokenizer

    d = models["llama"]
    hf = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    text = "def f(x):\n    return x * 12345  # 🚀 <eos>"
    p = run_generate(generate_bin, "--model", d, "--tokenize", text, "--json")
    assert json.loads(p.stdout) == hf.encode(text, add_special_tokens=False).ids


def test_invalid_utf8_is_an_error(generate_bin, models, tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'"ok"\n"bad \xff\xfe bytes"\n')
    p = run_generate(generate_bin, "--model", models["llama"], "--tokenize-jsonl", path,
                     check=False)
    assert p.returncode == 2, p.stderr
    assert "line 2: cannot tokenize" in p.stderr
    assert len(p.stdout.splitlines()) == 1


def _hf_chat_ids(d, messages):
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(d)
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return list(ids)


def test_chat_templates_match_transformers(generate_bin, models):
    for name, family in [("llama", "seed-coder-reasoning"), ("qwen2", "chatml")]:
        d = models[name]
        for content in ["Write a Triton kernel for softmax.", "x  y\n\n  z 123 🚀", "é"]:
            p = run_generate(generate_bin, "--model", d, "--tokenize", content, "--chat", "--json")
            got = json.loads(p.stdout)
            want = _hf_chat_ids(d, [{"role": "user", "content": content}])
            assert got == want, (name, content, got, want)
            assert family in p.stderr


SEED_INSTRUCT_TEMPLATE = (
    "{% if messages[0]['role'] != 'system' %}"
    "{{ bos_token + 'system\\nYou are an AI programming assistant. Answer briefly.' + eos_token }}"
    "{% endif %}"
    "{% for message in messages %}"
    "{{ bos_token + message['role'] + '\\n' + message['content'] + eos_token }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ bos_token + 'assistant\\n' }}{% endif %}"
)


def test_seed_coder_instruct_default_system(generate_bin, models, tmp_path):
    d = tmp_path / "instruct"
    shutil.copytree(models["llama"], d)
    cfg = json.load(open(d / "tokenizer_config.json"))
    cfg["chat_template"] = SEED_INSTRUCT_TEMPLATE
    json.dump(cfg, open(d / "tokenizer_config.json", "w"))
    p = run_generate(generate_bin, "--model", d, "--tokenize", "sort a list", "--chat", "--json")
    assert "seed-coder-instruct" in p.stderr
    got = json.loads(p.stdout)
    assert got == _hf_chat_ids(str(d), [{"role": "user", "content": "sort a list"}])


def test_no_double_bos(generate_bin, models):
    d = models["llama_bos"]  # tokenizer_config.json: add_bos_token true, <bos> = 0
    raw = json.loads(run_generate(generate_bin, "--model", d, "--tokenize", "hello", "--json").stdout)
    assert raw[0] == 0 and raw.count(0) == 1
    again = json.loads(run_generate(generate_bin, "--model", d, "--tokenize", "<bos>hello",
                                    "--json").stdout)
    assert again == raw
    chat = json.loads(run_generate(generate_bin, "--model", d, "--tokenize", "hello", "--chat",
                                   "--json").stdout)
    assert chat[0] == 0 and chat[1] != 0  # the template's own BOS only
    assert chat == _hf_chat_ids(d, [{"role": "user", "content": "hello"}])

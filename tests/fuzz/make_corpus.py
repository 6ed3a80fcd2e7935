"""make_corpus.py - writes the seed inputs of the fuzz targets into tests/fuzz/corpus/<target>/.

Seeds are small valid inputs (and a few near-misses) built with the real formats: envelopes
with the protobuf classes of proto/anvil.proto (cli/python/anvil_client), prompt lines in both
JSONL formats, tensor records as harness/tensorio.py writes them, the tokenizer fixture
(tests/fuzz/tokenizer, from tiny_model.py's trainer), and the config.json and safetensors
header of a tiny checkpoint. Files named crash-* are regression inputs of bugs found by
fuzzing; this script never touches them. Run it from anywhere with the repo venv:
    .venv/bin/python tests/fuzz/make_corpus.py [--model DIR]
(--model: a tiny_model.py checkpoint to take config.json and model.safetensors from; without
it they are built here, which needs torch and transformers.)
"""
import argparse
import json
import os
import struct
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "cli", "python"))
from anvil_client._proto import PROTOCOL_VERSION, pb  # noqa: E402

JOB = "01JZZZZZZZZZZZZZZZZZZZZZZZ"


def put(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def env(**body):
    e = pb.Envelope(version=PROTOCOL_VERSION, request_id=7)
    for k, v in body.items():
        getattr(e, k).CopyFrom(v)
    return e.SerializeToString()


def frames(*items):
    out = b""
    for frm, payload in items:
        out += struct.pack("<BH", frm, len(payload)) + payload
    return out


def broker():
    ready = env(ready=pb.Ready(kind=pb.WORKER_GEN, worker_id="gen-1", model="tiny", slots=4,
                               kv_tokens=4096, incarnation=1))
    eready = env(ready=pb.Ready(kind=pb.WORKER_EXEC, worker_id="exec-1", slots=2,
                                capabilities=["kernelbench"], incarnation=2))
    glease, elease = "g.%s.3.0.1" % JOB, "e.%s.3.1.1.0" % JOB
    hb = env(heartbeat=pb.Heartbeat(worker_id="gen-1", in_flight=1, lease_ids=[glease]))
    sample = pb.Sample(sample_index=0, token_ids=[5, 6, 7], logprobs=[-0.1, -0.2, -0.3],
                       text="```python\nx\n```", finish_reason=pb.FINISH_STOP)
    gres = env(gen_result=pb.GenResult(lease_id=glease, sample=sample, last=True))
    edone = env(exec_done=pb.ExecDone(lease_id=elease, result=pb.ExecResult(
        status=pb.EXEC_CORRECT, speedup=1.5, reward=2.5)))
    failed = env(unit_failed=pb.UnitFailed(lease_id=glease, error="oom", retryable=True))
    credit = env(credit=pb.Credit(credits=3))
    bye = env(disconnect=pb.Disconnect(reason="bye"))
    task = pb.Task(custom_id="a", prompt="write a kernel",
                   ref=pb.TaskRef(kind=pb.TASK_KIND_KERNELBENCH, name="1_relu"))
    submit = env(submit=pb.SubmitRequest(spec=pb.JobSpec(name="j", n=2), tasks=[task],
                                         final=True))
    more = env(submit=pb.SubmitRequest(job_id=JOB, tasks=[task], chunk_index=1))
    status = env(status=pb.StatusRequest(job_id=JOB))
    watch = env(watch=pb.WatchRequest(job_id=JOB, from_offset="0", block_ms=100))
    cancel = env(cancel=pb.CancelRequest(job_id=JOB))
    put("broker", "gen_worker", frames((0, ready), (0, hb), (0, gres), (0, credit), (0, failed)))
    put("broker", "exec_worker", frames((2, eready), (2, edone), (2, bye)))
    put("broker", "unknown_worker", frames((4, gres), (4, hb)))
    put("broker", "client", frames((1, submit), (1, more), (1, status), (1, watch), (1, cancel)))
    put("broker", "mixed", frames((0, ready), (1, submit), (0, gres), (3, status)))
    return [submit, gres, edone, hb, ready]


def jsonl():
    anvil = [{"custom_id": "a", "prompt": "write a relu", "n": 2, "temperature": 0.7,
              "max_tokens": 64, "stop": ["```"], "seed": 1},
             {"custom_id": "b", "messages": [{"role": "user", "content": "hi"}],
              "task": {"kind": "kernelbench", "name": "1_relu", "reference_code": "x=1"}}]
    openai = [{"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions",
               "body": {"model": "m", "messages": [{"role": "user", "content": "hello"}],
                        "max_tokens": 16, "temperature": 0.2}}]
    line = lambda o: json.dumps(o, ensure_ascii=False)
    put("jsonl", "line_anvil", b"\x00" + line(anvil[0]).encode())
    put("jsonl", "line_openai", b"\x02" + line(openai[0]).encode())
    put("jsonl", "file_anvil", b"\x01" + "\n".join(map(line, anvil)).encode() + b"\n\n")
    put("jsonl", "file_openai", b"\x01" + "\n".join(map(line, openai)).encode() + b"\n")
    put("jsonl", "file_mixed_bad", b"\x01" + (line(anvil[0]) + "\n{bad\n" + line(openai[0]) +
                                              "\n" + line(anvil[0])).encode())


def score_batch():
    put("score_batch", "full", json.dumps({"kind": "kernelbench", "task": "t/1_relu.py",
                                           "candidate": "c/a.txt", "globals": {"n": 4},
                                           "static_checks": False}) + "\n")
    put("score_batch", "abs", '{"task": "/abs/t.py", "candidate": "/abs/c.txt"}')
    put("score_batch", "blank", " \t\r\n")
    put("score_batch", "missing", '{"task": 5}')


def extract():
    put("extract", "plain", "Here:\n```python\nimport triton\n@triton.jit\ndef k(x):\n    pass\n```\n")
    put("extract", "think", "<think>```python\nno\n```</think>\n~~~py\nyes = 1\n~~~\n")
    put("extract", "unterminated", "<think>x</think>```python\nopen")
    put("extract", "nested", "````python\n```\ninner\n```\n````\n```python3\nlast\n```")


def tensors():
    def rec(dtype, shape, key, data):
        kb = key.encode()
        r = struct.pack("<IIIIQ", 0x54564E41, dtype, len(shape), len(kb), len(data))
        r += struct.pack("<%dq" % len(shape), *shape) + kb
        r += b"\0" * (-len(r) % 8) + data
        return r + b"\0" * (-len(r) % 8)
    f32 = struct.pack("<4f", 1.0, -2.0, float("nan"), float("inf"))
    put("exec_tensors", "f32", rec(1, [2, 2], "0", f32))
    put("exec_tensors", "mixed", rec(1, [4], "0", f32) + rec(7, [2], "1/a", struct.pack("<2i", 1, 2))
        + rec(11, [], "s", b"hello") + rec(12, [], "none", b"") + rec(13, [1, 2], "c",
                                                                     struct.pack("<2f", 1, 2))
        + rec(4, [2], "bf", b"\x80\x3f\x00\x40") + rec(10, [3], "b", b"\x01\x00\x01"))
    put("exec_tensors", "empty", b"")
    put("exec_tensors", "truncated", rec(1, [2, 2], "0", f32)[:30])


def tokenizer():
    put("tokenizer", "text", b"\x00def f(x):\n    return x * 2  # 123 caf\xc3\xa9 \xf0\x9f\x9a\x80\n")
    put("tokenizer", "special", b"\x01<bos>user\nhi<eos><|im_start|>x<|im_end|>")
    put("tokenizer", "invalid_utf8", b"\x00ok \xc3\x28 \xed\xa0\x80 \xf8")
    put("tokenizer", "ids", b"\x02" + struct.pack("<8i", 0, 2, 100, 399, -1, 1 << 30, 260, 3))
    put("tokenizer", "chat", b"\x03system: be brief\x00write a relu\x00ok\x00now <eos> more")
    tj = open(os.path.join(HERE, "tokenizer", "tokenizer.json"), "rb").read()
    tc = open(os.path.join(HERE, "tokenizer", "tokenizer_config.json"), "rb").read()
    put("tokenizer_load", "real", tj + b"\0" + tc)
    # a minimal byte-level BPE: every byte character, two merges, one special token
    byte_chars = [chr(c) for c in list(range(33, 127)) + list(range(161, 173)) +
                  list(range(174, 256))]
    byte_chars += [chr(256 + i) for i in range(256 - len(byte_chars))]
    vocab = {c: i for i, c in enumerate(byte_chars)}
    vocab.update({"ab": 256, "abc": 257})
    mini = {"model": {"type": "BPE", "vocab": vocab, "merges": ["a b", ["ab", "c"]]},
            "added_tokens": [{"id": 258, "content": "<s>", "special": True}],
            "normalizer": None, "decoder": {"type": "ByteLevel"},
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Digits", "individual_digits": True},
                {"type": "Split", "pattern": {"String": " "}, "behavior": "Removed"},
                {"type": "ByteLevel", "add_prefix_space": True, "use_regex": True}]}}
    cfg = {"bos_token": "<s>", "eos_token": {"content": "<s>"}, "add_bos_token": True,
           "chat_template": [{"name": "default", "template": "<|im_start|>system\nhi"}]}
    put("tokenizer_load", "mini", json.dumps(mini).encode() + b"\0" + json.dumps(cfg).encode())
    put("tokenizer_load", "unsupported", b'{"model": {"type": "WordPiece"}}')


def model(dirname):
    cfg = open(os.path.join(dirname, "config.json"), "rb").read()
    gen = open(os.path.join(dirname, "generation_config.json"), "rb").read()
    put("config", "llama", cfg + b"\0" + gen)
    c = json.loads(cfg)
    c.update(architectures=["Qwen2ForCausalLM"], model_type="qwen2", tie_word_embeddings=True)
    put("config", "qwen2", json.dumps(c))
    c.update(rope_scaling={"type": "linear", "factor": 2.0})
    put("config", "rope_scaling", json.dumps(c))
    put("config", "eos_list", cfg + b'\0{"eos_token_id": [2, 4, 5], "temperature": 0.6}')
    # safetensors: the checkpoint's small tensors only (norms), re-packed, plus edge cases
    raw = open(os.path.join(dirname, "model.safetensors"), "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    keep, data = {"__metadata__": {"format": "pt"}}, b""
    for name, t in sorted(hdr.items()):
        if name == "__metadata__" or "norm" not in name:
            continue
        b, e = t["data_offsets"]
        keep[name] = dict(t, data_offsets=[len(data), len(data) + e - b])
        data += raw[8 + n + b:8 + n + e]
    h = json.dumps(keep).encode()
    put("safetensors", "norms", struct.pack("<Q", len(h)) + h + data)
    one = json.dumps({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                      "b": {"dtype": "F16", "shape": [0, 3], "data_offsets": [8, 8]}}).encode()
    put("safetensors", "tiny", struct.pack("<Q", len(one)) + one + b"\0" * 8)
    put("safetensors", "short_header", struct.pack("<Q", 1 << 40) + b"{}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", help="tiny_model.py checkpoint dir")
    a = ap.parse_args()
    envs = broker()
    for i, e in enumerate(envs):
        put("envelope", "seed-%d" % i, e)
    jsonl()
    score_batch()
    extract()
    tensors()
    tokenizer()
    if a.model:
        model(a.model)
    else:
        sys.path.insert(0, os.path.join(REPO, "gen_worker", "engine", "tools"))
        import tiny_model
        with tempfile.TemporaryDirectory() as d:
            tiny_model.make_model(d, layers=1, hidden=8, heads=2, kv_heads=1, ffn=16, max_pos=64,
                                  tokenizer=None)
            model(d)


if __name__ == "__main__":
    main()

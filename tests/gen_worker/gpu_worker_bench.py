#!/usr/bin/env python3
"""gpu_worker_bench.py - the gen worker's end-to-end tok/s on the 8B shape, beside the engine
alone and anvil-bench-engine on the same workload, in one run (issue 8's worker-overhead ratio).

    gpu_worker_bench.py --bin DIR --out DIR [--model CKPT | --write CKPT] [--prompts 64]
                        [--n 8] [--prompt-tokens 1024] [--new 256] [--stop-ids K]
                        [--no-cuda-graphs] [--worker ARGS]... [--engine ARGS]... [--skip RUNS]
                        [--dry]

DIR holds anvil, anvil-broker, anvil-gen-worker, anvil-generate, anvil-bench-engine and
redis-server (a relocatable bundle's bin/, or a build tree: found by name under DIR). One
workload, three runs, each printed as one line, then a `ratio` line:
  worker   a real local cluster (redis-server, anvil-broker, one anvil-gen-worker on GPU 0
           holding every prompt at once), the prompts submitted with the real CLI: tok/s =
           generated tokens / (submit sent -> job done as `anvil status` sees it), so it
           counts the broker, Redis and the CLI's polling (every 0.2 s) too;
  engine   anvil-generate on the same prompts file and model (its own tokens/s figure, load
           excluded): the engine without the worker;
  bench    anvil-bench-engine --shape 8b, grpo mode with the same prompt count, samples,
           prompt length and a fixed number of new tokens: the engine's peak on random
           weights of the same shape (its own fused model).
Sampling: temperature 1, no truncation, so random weights almost never draw EOS and every
sample runs to --new tokens; the lines say how many tokens each run generated.
--stop-ids K (at most 64) gives varied stopping, the issue's GRPO shape: K token ids spread
evenly over the model's vocabulary end a sample like EOS (the job's stop_token_ids for the
worker, anvil-generate --stop-ids for the engine), so at T = 1 a sample's length is about
geometric with mean vocab / K, cut at --new (64 ids on the 8B vocabulary: ~2000 of 4096); the
bench, which cannot stop on tokens, then draws its lengths uniformly from [1, --new].
The worker and engine runs use the binaries' defaults (CUDA graphs on, the engine's max-seqs,
the worker's slots); --no-cuda-graphs turns graphs off in all three. Each --worker ARGS (or
--engine ARGS) adds a run with those extra flags (split on spaces), named "worker ARGS": e.g.
--worker "" --worker "--slots 16 --no-cuda-graphs --max-seqs 256" compares the worker at its
defaults with the defaults it had before 2026-12-07. The ratio line uses the first of each.
--write CKPT first writes the 8B-shaped random checkpoint (tiny_model.py --shape
seed-coder-8b) and reports the time. --dry runs everything on the CPU backend at a tiny shape
(a check of this script; its figures mean nothing). Logs go to --out, with each run's samples
(worker*.jsonl: `anvil results`; engine*.jsonl: anvil-generate --json). Prints figures and
asserts nothing about speed; exits 1 only when a run does not complete.
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
NAMES = {"anvil": "cli/anvil", "anvil-broker": "broker/anvil-broker",
         "anvil-gen-worker": "gen_worker/anvil-gen-worker",
         "anvil-generate": "gen_worker/engine/anvil-generate",
         "anvil-exec-worker": "exec_worker/anvil-exec-worker"}


def find(bindir, name):
    for root, _, files in os.walk(bindir):
        if name in files and os.access(os.path.join(root, name), os.X_OK):
            return os.path.join(root, name)
    return None


def layout(bindir, work):
    """A build-tree layout of wrappers around DIR's binaries, for tests/lib/anvil_cluster.py."""
    root = os.path.join(work, "layout")
    for name, rel in NAMES.items():
        src = find(bindir, name)
        if not src:
            continue
        dst = os.path.join(root, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        with open(dst, "w") as f:
            f.write('#!/bin/sh\nexec "%s" "$@"\n' % src)
        os.chmod(dst, 0o755)
    return root


def log(out, msg):
    line = "[%s] %s" % (time.strftime("%H:%M:%S"), msg)
    print(line, flush=True)
    with open(os.path.join(out, "session.log"), "a") as f:
        f.write(line + "\n")


def token_count(gen, model, text):
    p = subprocess.run([gen, "--model", model, "--tokenize", text, "--json"],
                       capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise RuntimeError("anvil-generate --tokenize failed: " + p.stderr[-500:])
    ids = json.loads(p.stdout)
    return len(ids["ids"] if isinstance(ids, dict) else ids)


def stop_ids(model, k):
    """k token ids spread evenly over the model's vocabulary (none when k is 0)."""
    if k <= 0:
        return []
    with open(os.path.join(model, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    return [(i * vocab) // k + vocab // (2 * k) for i in range(k)]


def write_prompts(path, gen, model, n_prompts, want_tokens, stops):
    """n_prompts distinct prompts of about want_tokens tokens each (no shared prefix beyond
    the first word, so the engine's prefix sharing works only within a prompt's n samples)."""
    unit = " ".join("w%d" % i for i in range(16))
    per = max(1, token_count(gen, model, unit))
    reps = max(1, want_tokens // per)
    lines, lengths = [], []
    for i in range(n_prompts):
        text = "p%d %s" % (i, " ".join("%s%d" % (unit, (i * 7919 + k) % 997)
                                        for k in range(reps)))
        lines.append({"prompt": text})
        if stops:
            lines[-1]["stop_token_ids"] = stops
        if i < 2:
            lengths.append(token_count(gen, model, text))
    # the same prompts twice: Anvil JSONL for the CLI, anvil-generate's JSONL for the engine
    with open(path, "w") as f:
        f.write("".join(json.dumps(dict(l, custom_id="p%d" % i)) + "\n"
                        for i, l in enumerate(lines)))
    with open(path + ".generate", "w") as f:
        f.write("".join(json.dumps({"prompt": l["prompt"], "id": "p%d" % i}) + "\n"
                        for i, l in enumerate(lines)))
    return lengths[0]


def run_worker(a, out, work, bindir, model, prompts, backend, args, k):
    os.environ["ANVIL_BUILD_DIR"] = layout(bindir, work)
    os.environ["PATH"] = os.path.dirname(find(bindir, "redis-server")) + ":" + os.environ["PATH"]
    sys.path.insert(0, os.path.join(REPO, "tests", "lib"))
    import anvil_cluster

    c = anvil_cluster.Cluster(os.path.join(work, "cluster%d" % k))
    try:
        c.start_redis()
        c.start_broker()
        extra = ["--backend", backend, "--max-tokens", str(a.new)]
        if backend == "cuda":
            extra += ["--gpu", "0"]
        else:
            extra += ["--threads", str(os.cpu_count() or 2), "--slots", str(a.prompts)]
        if a.no_cuda_graphs:
            extra.append("--no-cuda-graphs")
        extra += args
        t_start = time.time()
        c.start_gen_worker("gen0", model, *extra)
        c.wait_workers(1, "gen", timeout=600)
        t_ready = time.time()
        log(out, "worker ready after %.1f s (model load included)" % (t_ready - t_start))
        t0 = time.time()
        job = c.submit(prompts, "--samples", a.n, "--max-tokens", a.new, "--no-score",
                       "--temperature", "1.0", "--seed", "1", "--raw")
        # polled here rather than with wait_state so that a slow or stuck run leaves its
        # progress in session.log (the job's counters every 10 s)
        deadline, last, st = t0 + a.worker_timeout, 0.0, {}
        while True:
            st = c.status(job)
            if st.get("state") in ("done", "failed", "cancelled"):
                break
            if time.time() - last >= 10:
                last = time.time()
                log(out, "worker job after %.0f s: %s" % (last - t0, json.dumps(st)[:600]))
            if time.time() > deadline:
                raise RuntimeError("worker job not done after %d s: %s"
                                   % (a.worker_timeout, json.dumps(st)[:600]))
            time.sleep(0.2)
        t1 = time.time()
        res = c.results(job)
        with open(os.path.join(out, "worker%s.jsonl" % (k or "")), "w") as f:
            f.write("".join(json.dumps(r) + "\n" for r in res))
        gen = sum(r.get("completion_tokens", 0) for r in res)
        finish = {}
        for r in res:
            finish[r.get("finish_reason")] = finish.get(r.get("finish_reason"), 0) + 1
        ok = st.get("state") == "done" and len(res) == a.prompts * a.n
        r = {"run": " ".join(["worker"] + args), "ok": ok, "state": st.get("state"), "samples": len(res),
             "generated": gen, "wall_s": round(t1 - t0, 3),
             "tok_s": round(gen / (t1 - t0), 1) if t1 > t0 else 0,
             "ready_s": round(t_ready - t_start, 1), "finish": finish}
        for key, tag in (("weights_line", "weights:"), ("ready_line", "engine ready in")):
            lines = [l for l in c.log("gen0").splitlines() if tag in l]
            if lines:
                r[key] = lines[-1][-240:]
        return r
    finally:
        for name in ("gen0", "broker"):
            try:
                shutil.copy(os.path.join(c.dir, name + ".log"),
                            os.path.join(out, "%s%s.log" % (name, k or "")))
            except OSError:
                pass
        c.close()


def run_engine(a, out, gen, model, prompts, backend, stops, extra, k):
    args = [gen, "--model", model, "--prompts", prompts + ".generate", "--n", str(a.n),
            "--max-tokens", str(a.new), "--temperature", "1.0", "--seed", "1", "--backend",
            backend, "--json"]
    if stops:
        args += ["--stop-ids", ",".join(map(str, stops))]
    if a.no_cuda_graphs:
        args.append("--no-cuda-graphs")
    args += extra
    t0 = time.time()
    name = os.path.join(out, "engine%s" % (k or ""))
    with open(name + ".jsonl", "w") as so, open(name + ".log", "w") as se:
        p = subprocess.run(args, stdout=so, stderr=se, timeout=1200)
    wall = time.time() - t0
    err = open(name + ".log").read()
    n = gen_tok = 0
    finish = {}
    with open(name + ".jsonl") as f:
        for line in f:
            if line.startswith("{"):
                d = json.loads(line)
                n += 1
                gen_tok += len(d["token_ids"])
                finish[d["finish_reason"]] = finish.get(d["finish_reason"], 0) + 1
    m = re.search(r"([0-9.]+) tok(?:ens)?/s", err)
    return {"run": " ".join(["engine"] + extra), "ok": p.returncode == 0 and n == a.prompts * a.n,
            "samples": n,
            "generated": gen_tok, "wall_s": round(wall, 3),
            "tok_s": float(m.group(1)) if m else None, "finish": finish,
            "figures_line": next((l[-300:] for l in err.splitlines() if "tok" in l and "/s" in l),
                                 None)}


def run_bench(a, out, bench, prompt_len, dry):
    args = [bench, "--json", "--batches", "none", "--ctx-batch", "0",
            "--grpo-prompts", str(a.prompts), "--grpo-samples", str(a.n),
            "--grpo-prompt", str(prompt_len), "--grpo-min-new", str(1 if a.stop_ids else a.new),
            "--grpo-max-new", str(a.new), "--grpo-max-batch", str(a.prompts * a.n)]
    args += ["--backend", "cpu", "--shape", "tiny"] if dry else ["--shape", "8b"]
    if not a.no_cuda_graphs:
        args.append("--cuda-graphs")
    with open(os.path.join(out, "bench.log"), "w") as se:
        p = subprocess.run(args, stdout=subprocess.PIPE, stderr=se, text=True, timeout=1200)
    with open(os.path.join(out, "bench.jsonl"), "w") as f:
        f.write(p.stdout)
    g = [json.loads(l) for l in p.stdout.splitlines() if l.startswith('{"bench":"grpo"')]
    if p.returncode != 0 or not g:
        return {"run": "bench", "ok": False, "rc": p.returncode}
    g = g[-1]
    return {"run": "bench", "ok": g["generated"] == g["expected"], "generated": g["generated"],
            "wall_s": g["wall_s"], "tok_s": g["tok_s"], "prefills": g["prefills"],
            "mean_batch": g["mean_batch"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--model")
    ap.add_argument("--write")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=1024)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--stop-ids", type=int, default=0,
                    help="this many stop token ids spread over the vocabulary (at most 64)")
    ap.add_argument("--no-cuda-graphs", action="store_true")
    ap.add_argument("--worker", action="append", default=None,
                    help="a worker run with these extra flags (repeatable)")
    ap.add_argument("--engine", action="append", default=None,
                    help="an engine (anvil-generate) run with these extra flags (repeatable)")
    ap.add_argument("--dry", action="store_true")
    ap.add_argument("--skip", default="", help="comma-separated runs to leave out")
    ap.add_argument("--worker-timeout", type=int, default=1200,
                    help="seconds the worker run may take before it is abandoned (logs kept)")
    a = ap.parse_args()
    if not 0 <= a.stop_ids <= 64:
        ap.error("--stop-ids takes 0 to 64")
    # an outer `timeout` sends SIGTERM: unwind, so that the cluster's logs are still copied
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    os.makedirs(a.out, exist_ok=True)
    out = os.path.abspath(a.out)
    bindir = os.path.abspath(a.bin)
    need = ["anvil", "anvil-broker", "anvil-gen-worker", "anvil-generate", "anvil-bench-engine",
            "redis-server"]
    missing = [n for n in need if not find(bindir, n)]
    if missing:
        print("gpu_worker_bench: not found under %s: %s" % (bindir, ", ".join(missing)))
        return 2
    gen, bench = find(bindir, "anvil-generate"), find(bindir, "anvil-bench-engine")
    backend = "cpu" if a.dry else "cuda"
    work = tempfile.mkdtemp(prefix="anvil-wb-")
    model = a.model
    if a.write:
        model = a.write
        shape = ["--shape", "seed-coder-8b", "--shard-gb", "5"]
        if a.dry:
            shape = ["--shape", "seed-coder-8b", "--layers", "2", "--hidden", "256", "--heads",
                     "4", "--kv-heads", "1", "--ffn", "688", "--vocab", "8192",
                     "--shard-gb", "0.003"]
        t0 = time.time()
        p = subprocess.run([sys.executable, os.path.join(REPO, "gen_worker", "engine", "tools",
                                                         "tiny_model.py"), model] + shape,
                           capture_output=True, text=True, timeout=900)
        log(out, "checkpoint written in %.1f s (rc %d): %s" % (time.time() - t0, p.returncode,
                                                               p.stdout.strip()[-200:]))
        if p.returncode != 0:
            print(p.stderr[-2000:])
            return 1
    if not model:
        ap.error("--model or --write is needed")
    prompts = os.path.join(out, "prompts.jsonl")
    stops = stop_ids(model, a.stop_ids)
    plen = write_prompts(prompts, gen, model, a.prompts, a.prompt_tokens, stops)
    log(out, "workload: %d prompts x %d samples, prompt %d tokens, %s new tokens, graphs %s"
        % (a.prompts, a.n, plen, "up to %d (%d stop ids)" % (a.new, len(stops)) if stops
           else "%d" % a.new, "off" if a.no_cuda_graphs else "on"))
    results = []
    skip = set(a.skip.split(","))
    plan = []
    for k, w in enumerate(a.worker if a.worker is not None else [""]):
        plan.append(("worker", w.split(), lambda w=w.split(), k=k: run_worker(
            a, out, work, bindir, model, prompts, backend, w, k)))
    for k, e in enumerate(a.engine if a.engine is not None else [""]):
        plan.append(("engine", e.split(), lambda e=e.split(), k=k: run_engine(
            a, out, gen, model, prompts, backend, stops, e, k)))
    plan.append(("bench", [], lambda: run_bench(a, out, bench, plen, a.dry)))
    first = {}
    for name, args, fn in plan:
        if name in skip:
            continue
        t0 = time.time()
        try:
            r = fn()
        except Exception as e:  # a run that breaks is reported, the others still run
            r = {"run": " ".join([name] + args), "ok": False, "error": repr(e)[-500:]}
        if r.get("generated") is not None:
            r["mean_new"] = round(r["generated"] / (a.prompts * a.n), 1)
        first.setdefault(name, r)
        r["run_s"] = round(time.time() - t0, 1)
        results.append(r)
        print(json.dumps(r), flush=True)
        log(out, json.dumps(r))
    by = first

    def ratio(x, y):
        tx, ty = by.get(x, {}).get("tok_s"), by.get(y, {}).get("tok_s")
        return round(tx / ty, 3) if tx and ty else None

    line = {"run": "ratio", "worker_over_engine": ratio("worker", "engine"),
            "worker_over_bench": ratio("worker", "bench"),
            "engine_over_bench": ratio("engine", "bench")}
    print(json.dumps(line))
    log(out, json.dumps(line))
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results + [line], f, indent=1)
    shutil.rmtree(work, ignore_errors=True)
    return 0 if all(r.get("ok") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

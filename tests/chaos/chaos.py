"""chaos.py - a job of 10,000 tasks through real processes while the broker, the workers and
Redis are killed with SIGKILL at random moments and restarted; then a checker proves that every
accepted task completed exactly once.

The cluster is real: a private redis-server (tests/lib/redis-server.sh, AOF on, restarted on
the same port and data directory so it recovers from its AOF), `anvil-broker`, and
`anvil-gen-worker`s running the CPU engine on a tiny random Llama (tools/tiny_model.py) with a
few tokens per sample. The job is submitted with the real CLI (`anvil submit --name`, re-run
with the same name until it succeeds, so a submit cut by a fault resumes) while the faults have
already started. A seeded schedule (the seed is printed; `--seed S` replays it) picks, every
0.4-2.5 s (the first one 0.05-0.6 s into the first submit), one or two targets (the broker, Redis, one worker), kills them with SIGKILL, keeps
them down 0.1-1.5 s and starts them again (a worker comes back under its old id - a new
incarnation - or under a new id). It runs until the job is done, then everything is brought up
and the checker reads:

- Redis directly: the job's tasks and custom ids (every accepted task stored once), the
  per-job counters (generated = terminal = samples, failed = dead = 0, state done), the result
  hash (exactly the (task, sample) keys expected), the whole events stream (one `sample` event
  per (task, sample), terminal, one `done`, no `dead`), no lease, retry unit or dead letter left;
- the CLI: `anvil results` (one JSON line per (custom_id, sample), no error line, every
  completion 1..max_tokens tokens, distinct seeds) and `anvil status --json`;
and requires all of them to agree. It prints the faults injected by kind and how many were
survived (component back and the final check passed), and exits 1 on any loss or duplicate.

Durability: the broker acknowledges a submit once Redis has it. Redis writes a command's
effects to the AOF before replying under `appendfsync always`; under `everysec` it may reply
first while a background fsync is still running (flushAppendOnlyFile postpones the write for up
to 2 s), so an acknowledged write can be lost to a SIGKILL of redis-server. The test therefore
runs Redis with `appendfsync always` by default (--fsync everysec runs the shipped setting).

  chaos.py [--tasks 10000] [--samples 4] [--max-tokens 8] [--workers 2] [--seed S]
           [--deadline-s 400] [--fsync always|everysec] [--keep]
Exit: 0 all checks passed, 1 a check failed, 77 skipped (what is missing is printed).
"""
import argparse
import collections
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
import anvil_cluster  # noqa: E402
from anvil_redis import Redis, free_low_port  # noqa: E402


def skip(why):
    print("SKIP: " + why)
    sys.exit(77)


class Chaos:
    def __init__(self, a, workdir, model):
        self.a, self.dir, self.model = a, workdir, model
        taken = set()
        self.rport = free_low_port(taken)
        self.c = anvil_cluster.Cluster(
            os.path.join(workdir, "cluster"),
            ["--lease-ms", "3000", "--max-attempts", "100", "--log-level", "warn"])
        self.c.client_ep = "tcp://127.0.0.1:%d" % free_low_port(taken)
        self.c.worker_ep = "tcp://127.0.0.1:%d" % free_low_port(taken)
        self.redis_dir = self.c.redis_dir
        self.rnd = random.Random(a.seed)
        self.workers = ["g%d" % i for i in range(a.workers)]  # current name of each slot
        self.faults = collections.Counter()
        self.recovered = 0
        self.unexpected = []  # processes that died without being killed
        self.log_lines = []
        self.stop = threading.Event()
        self.submitting = threading.Event()
        self.lock = threading.Lock()
        self.t0 = time.time()
        self.r = Redis(self.rport)

    def note(self, msg):
        line = "[%7.2f s] %s" % (time.time() - self.t0, msg)
        self.log_lines.append(line)
        if self.a.verbose:
            print(line, flush=True)

    # -- components -------------------------------------------------------------------------
    def redis_pid(self):
        try:
            return int(open(os.path.join(self.redis_dir, "redis.pid")).read())
        except (OSError, ValueError):
            return None

    def start_redis(self):
        env = dict(os.environ, ANVIL_REDIS_APPENDFSYNC=self.a.fsync)
        out = subprocess.run([os.path.join(anvil_cluster.REPO, "tests", "lib", "redis-server.sh"),
                              "start", self.redis_dir, str(self.rport)],
                             capture_output=True, text=True, env=env)
        if out.returncode != 0:
            raise RuntimeError("redis did not start: %s" % out.stderr.strip())
        self.c.redis_url = out.stdout.strip().splitlines()[-1]

    def kill_redis(self):
        pid = self.redis_pid()
        if pid:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            for _ in range(200):  # gone (not a zombie we cannot reap: it daemonized)
                if not os.path.exists("/proc/%d" % pid):
                    break
                time.sleep(0.01)

    def redis_up(self):
        try:
            return Redis(self.rport, 1.0)("PING") == "PONG"
        except (OSError, RuntimeError, ConnectionError):
            return False

    def start_broker(self):
        self.c.start_broker()

    def broker_up(self, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            p = self.c.procs.get("broker")
            if p is None or p.poll() is not None:
                return False
            r = self.c.cli("workers", "--timeout", "1", check=False, timeout=30)
            if r.returncode == 0:
                return True
            time.sleep(0.1)
        return False

    def start_worker(self, slot):
        name = self.workers[slot]
        self.c.start_gen_worker(name, self.model, "--threads", "1", "--slots",
                                str(self.a.slots), "--log-level", "warn")

    def kill(self, name):
        p = self.c.procs.get(name)
        if p is not None and p.poll() is None:
            p.kill()
            p.wait()

    def check_alive(self):
        """Processes that died on their own (never killed by the schedule) are findings."""
        for name, p in list(self.c.procs.items()):
            if p.poll() is not None and name not in self.killed:
                self.unexpected.append("%s exited %s" % (name, p.returncode))
                self.note("UNEXPECTED: %s exited with %s" % (name, p.returncode))
                self.killed.add(name)
                if name == "broker":
                    self.start_broker()
                elif name in self.workers:
                    self.start_worker(self.workers.index(name))

    def start_all(self):
        self.killed = set()
        self.start_redis()
        self.start_broker()
        for i in range(len(self.workers)):
            self.start_worker(i)
        if not self.broker_up(40):
            raise RuntimeError("the broker does not answer:\n" + self.c.log("broker")[-2000:])
        self.c.wait_workers(len(self.workers), "gen", timeout=60)

    # -- the fault schedule -----------------------------------------------------------------
    def one_fault(self):
        rnd = self.rnd
        targets = ["broker", "redis"] + ["w%d" % i for i in range(len(self.workers))]
        weights = [3, 2] + [4.0 / len(self.workers)] * len(self.workers)
        pick = [rnd.choices(targets, weights)[0]]
        if rnd.random() < 0.2:  # sometimes two at once (e.g. Redis and the broker together)
            other = rnd.choices(targets, weights)[0]
            if other != pick[0]:
                pick.append(other)
        down = rnd.uniform(0.1, 1.5)
        new_ids = {t: rnd.random() < 0.3 for t in pick}
        with self.lock:
            for t in pick:
                if t == "broker":
                    self.killed.add("broker")
                    self.kill("broker")
                    self.faults["broker"] += 1
                elif t == "redis":
                    self.kill_redis()
                    self.faults["redis"] += 1
                else:
                    name = self.workers[int(t[1:])]
                    self.killed.add(name)
                    self.kill(name)
                    self.faults["workers"] += 1
            self.note("SIGKILL %s, down %.2f s" % ("+".join(pick), down))
        time.sleep(down)
        with self.lock:
            ok = True
            for t in pick:  # Redis first: the broker waits for it at start
                if t == "redis":
                    self.start_redis()
                    ok = ok and self.redis_up()
            for t in pick:
                if t == "broker":
                    self.killed.discard("broker")
                    self.start_broker()
                elif t != "redis":
                    slot = int(t[1:])
                    self.killed.discard(self.workers[slot])
                    if new_ids[t]:  # the old id is never heard of again: its units are
                        self.c.procs.pop(self.workers[slot], None)  # freed by its death
                        self.workers[slot] = "g%d-%d" % (slot, sum(self.faults.values()))
                    self.start_worker(slot)
        if "broker" in pick:
            ok = self.broker_up(40) and ok
        for t in pick:
            if t not in ("broker", "redis"):
                p = self.c.procs.get(self.workers[int(t[1:])])
                ok = ok and p is not None and p.poll() is None
        self.recovered += len(pick) if ok else 0
        self.note("restarted %s%s" % ("+".join(pick), "" if ok else " (NOT healthy)"))

    def schedule(self):
        first = True
        while not self.stop.is_set():
            if first:  # the first fault lands while the CLI is sending its chunks
                self.submitting.wait()
                gap = self.rnd.uniform(0.05, 0.6)
                first = False
            else:
                gap = self.rnd.uniform(0.4, 2.5)
            if self.stop.wait(gap):
                break
            try:
                with self.lock:
                    self.check_alive()
                self.one_fault()
            except Exception as e:  # noqa: BLE001 - a restart that fails is a finding
                self.note("fault handling error: %r" % e)
                self.unexpected.append("fault handling: %r" % e)

    @property
    def n_faults(self):
        return sum(self.faults.values())


def submit(ch, prompts, name):
    """`anvil submit --name` until it exits 0; returns (job id, attempts, CLI JSON)."""
    a = ch.a
    for attempt in range(1, 200):
        r = ch.c.cli("submit", prompts, "--json", "--name", name, "--samples", a.samples,
                     "--max-tokens", a.max_tokens, "--no-score", "--seed", a.seed & 0xffffff,
                     "--temperature", "1.0", "--chunk", "50", "--timeout", "2",
                     check=False, timeout=120)
        if r.returncode == 0:
            return json.loads(r.stdout), attempt
        ch.note("submit attempt %d exited %d: %s" % (attempt, r.returncode,
                                                     r.stderr.strip().splitlines()[-1:]))
        time.sleep(0.3)
    raise RuntimeError("submit never succeeded")


def wait_done(ch, job, deadline):
    while time.time() < deadline:
        try:
            st = Redis(ch.rport, 2.0)("HGET", "anv:job:" + job, "state")
        except (OSError, RuntimeError, ConnectionError):
            st = None
        if st == "done":
            return True
        time.sleep(0.2)
    return False


def cli_retry(ch, *args, attempts=5):
    for _ in range(attempts):
        r = ch.c.cli(*args, check=False, timeout=300)
        if r.returncode == 0:
            return r
        time.sleep(1)
    raise AssertionError("anvil %s failed: %s" % (" ".join(args), r.stderr))


def check(ch, job, n_tasks, n_samples, max_tokens):
    """Every check; returns the list of failures (empty = exactly once everywhere)."""
    r = Redis(ch.rport, 30.0)
    bad = []
    total = n_tasks * n_samples
    want_keys = {"%d:%d" % (t, s) for t in range(n_tasks) for s in range(n_samples)}

    def expect(what, got, want):
        if got != want:
            bad.append("%s: got %r, want %r" % (what, got, want))

    # tasks accepted once
    expect("HLEN tasks", r("HLEN", "anv:job:%s:tasks" % job), n_tasks)
    cids = r("HGETALL", "anv:job:%s:cid" % job)
    cid_map = dict(zip(cids[::2], cids[1::2]))
    expect("custom ids", len(cid_map), n_tasks)
    expect("custom id -> task", all(cid_map.get("c%d" % i) == str(i) for i in range(n_tasks)),
           True)
    # counters
    h = r("HGETALL", "anv:job:" + job)
    h = dict(zip(h[::2], h[1::2]))
    for k, v in (("state", "done"), ("tasks", str(n_tasks)), ("samples_total", str(total)),
                 ("generated", str(total)), ("terminal", str(total)), ("final", "1")):
        expect("job." + k, h.get(k), v)
    for k in ("failed", "dead"):
        expect("job." + k, h.get(k, "0"), "0")
    # the result records
    keys = set(r("HKEYS", "anv:job:%s:res" % job))
    expect("HLEN res", r("HLEN", "anv:job:%s:res" % job), total)
    if keys != want_keys:
        bad.append("result keys: %d missing (e.g. %s), %d unexpected (e.g. %s)"
                   % (len(want_keys - keys), sorted(want_keys - keys)[:3], len(keys - want_keys),
                      sorted(keys - want_keys)[:3]))
    # the whole events stream
    per_sample = collections.Counter()
    types = collections.Counter()
    start = "-"
    n_entries = 0
    while True:
        page = r("XRANGE", "anv:job:%s:events" % job, start, "+", "COUNT", 2000)
        if not page:
            break
        for eid, fields in page:
            n_entries += 1
            f = dict(zip(fields[::2], fields[1::2]))
            types[f.get("type")] += 1
            if f.get("type") != "sample":
                continue
            if f.get("term") != "1":
                bad.append("event %s: sample not terminal %r" % (eid, f))
            items = f["ts"].split(",") if "ts" in f else ["%s:%s" % (f.get("t"), f.get("s"))]
            per_sample.update(items)
        ms, seq = page[-1][0].split("-")
        start = "%s-%d" % (ms, int(seq) + 1)
    expect("sample events", sum(per_sample.values()), total)
    dup_ev = [k for k, v in per_sample.items() if v > 1]
    if dup_ev:
        bad.append("%d samples with more than one event, e.g. %s" % (len(dup_ev), dup_ev[:3]))
    if set(per_sample) != want_keys:
        bad.append("events: %d samples without an event" % len(want_keys - set(per_sample)))
    expect("done events", types.get("done", 0), 1)
    expect("dead events", types.get("dead", 0), 0)
    # nothing left behind
    leases = [x for x in r("ZRANGE", "anv:leases", 0, -1) if ".%s." % job in x]
    expect("leases left", leases, [])
    expect("retry list", r("LLEN", "anv:job:%s:retry" % job), 0)
    expect("active", r("SISMEMBER", "anv:active", job), 0)
    dl = [x for x in r("ZRANGE", "anv:deadletter", 0, -1) if x.startswith(job + "/")]
    expect("dead letters", dl, [])
    att = r("HVALS", "anv:job:%s:att" % job) or []
    # the CLI: anvil results / anvil status
    out = cli_retry(ch, "results", job, "--logprobs")
    lines = [json.loads(x) for x in out.stdout.split("\n") if x.strip()]
    seen = collections.Counter((x.get("custom_id"), x.get("sample")) for x in lines)
    expect("CLI results lines", len(lines), total)
    dup = [k for k, v in seen.items() if v > 1]
    if dup:
        bad.append("CLI results: %d samples listed twice, e.g. %s" % (len(dup), dup[:3]))
    want_cli = {("c%d" % t, s) for t in range(n_tasks) for s in range(n_samples)}
    if set(seen) != want_cli:
        bad.append("CLI results: %d samples missing" % len(want_cli - set(seen)))
    errs = [x for x in lines if x.get("finish_reason") == "error" or x.get("error")]
    expect("CLI error lines", len(errs), 0)
    expect("CLI task_index matches custom_id",
           sum(1 for x in lines if "c%s" % x.get("task_index") != x.get("custom_id")), 0)
    off = [x for x in lines if not (1 <= x.get("completion_tokens", 0) <= max_tokens and
                                    len(x.get("token_ids", [])) == x["completion_tokens"] and
                                    len(x.get("logprobs", [])) == x["completion_tokens"] and
                                    all(lp <= 0 for lp in x["logprobs"]))]
    expect("samples whose tokens/logprobs are not 1..max_tokens long", len(off), 0)
    groups = collections.defaultdict(set)  # the n samples of a prompt never share a seed
    for x in lines:
        groups[x.get("custom_id")].add(str(x.get("seed")))
    expect("prompts whose samples share a seed",
           sum(1 for v in groups.values() if len(v) != n_samples), 0)
    st = ch.c.status(job)
    expect("CLI status state", st.get("state"), "done")
    expect("CLI status generated", st.get("generated"), total)
    expect("CLI status failed+dead", (st.get("failed"), st.get("dead")), (0, 0))
    return bad, {"events": n_entries, "records": len(keys), "event_types": dict(types), "cli_lines": len(lines),
                 "max_failed_attempts": max([int(x) for x in att] or [0]),
                 "units_with_failed_attempts": len(att)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", type=int, default=10000)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--deadline-s", type=float, default=400)
    ap.add_argument("--min-faults", type=int, default=20,
                    help="keep injecting faults while the job runs; if it finishes sooner, "
                         "the run is repeated on a new job until this many were injected")
    ap.add_argument("--fsync", default="always", choices=["always", "everysec"])
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--verbose", action="store_true", help="print each fault as it happens")
    a = ap.parse_args()
    if a.seed is None:
        a.seed = int.from_bytes(os.urandom(4), "little")
    for b in ("anvil", "anvil-broker", "anvil-gen-worker"):
        if anvil_cluster.binary(b) is None:
            skip("%s is not built under %s" % (b, anvil_cluster.BUILD))
    if not shutil.which("redis-server"):
        skip("no redis-server")
    print("chaos: seed %d (replay: %s --seed %d), %d tasks x %d samples, %d tokens, %d gen "
          "workers, appendfsync %s" % (a.seed, sys.argv[0], a.seed, a.tasks, a.samples,
                                       a.max_tokens, a.workers, a.fsync), flush=True)
    work = tempfile.mkdtemp(prefix="anvil-chaos.")
    model = os.environ.get("ANVIL_TINY_MODEL")
    if not model:
        try:
            model = anvil_cluster.make_tiny_model(os.path.join(work, "tiny-llama"))
        except Exception as e:  # noqa: BLE001
            skip("cannot make the tiny model (venv with torch/transformers/tokenizers): %s" % e)
    ch = Chaos(a, work, model)
    rc = 1
    try:
        ch.start_all()
        prompts = os.path.join(work, "prompts.jsonl")
        with open(prompts, "w") as f:
            for i in range(a.tasks):
                f.write(json.dumps({"custom_id": "c%d" % i, "prompt": "def kernel_%d(x):" % i})
                        + "\n")
        deadline = ch.t0 + a.deadline_s
        jobs, bad, info = [], [], {}
        sched = threading.Thread(target=ch.schedule, daemon=True)
        sched.start()
        round_ = 0
        while True:
            round_ += 1
            t_sub = time.time()
            ch.submitting.set()
            doc, attempts = submit(ch, prompts, "chaos-%d-%d" % (a.seed, round_))
            job = doc["job_id"]
            print("job %s: submitted in %.1f s, %d CLI attempt(s), accepted %d + already "
                  "there %d = %d tasks" % (job, time.time() - t_sub, attempts, doc["accepted"],
                                          doc["skipped"], doc["accepted"] + doc["skipped"]),
                  flush=True)
            if doc["accepted"] + doc["skipped"] != a.tasks:
                bad.append("the CLI accepted %d tasks, want %d"
                           % (doc["accepted"] + doc["skipped"], a.tasks))
            done = wait_done(ch, job, deadline)
            jobs.append(job)
            print("job %s: %s after %.1f s, %d faults so far" % (
                job, "done" if done else "NOT done", time.time() - t_sub, ch.n_faults),
                flush=True)
            if not done:
                bad.append("job %s not done within the deadline" % job)
                break
            if ch.n_faults >= a.min_faults or time.time() > deadline - 60:
                break
        ch.stop.set()
        sched.join(60)
        # everything up again, a few heartbeats for stray late results to land (and be
        # recognised as duplicates), then the checks
        with ch.lock:
            if not ch.redis_up():
                ch.start_redis()
            ch.check_alive()
        if not ch.broker_up(40):
            bad.append("the broker is not up at the end")
        time.sleep(4)
        m = Redis(ch.rport)("HGETALL", "anv:broker:metrics") or []
        m = dict(zip(m[::2], m[1::2]))
        for job in jobs:
            if any(b.startswith("job %s not done" % job) for b in bad):
                continue
            b, info = check(ch, job, a.tasks, a.samples, a.max_tokens)
            bad += ["job %s: %s" % (job, x) for x in b]
            print("check job %s: %d result records, %d CLI result lines, %d stream entries "
                  "%s, units retried after a failed attempt %d (at most %d failed attempts)"
                  % (job, info["records"], info["cli_lines"],
                     info["events"], info["event_types"], info["units_with_failed_attempts"],
                     info["max_failed_attempts"]), flush=True)
        bad += ["unexpected: " + u for u in ch.unexpected]
        print("broker (last incarnation) counters: results_recorded %s results_duplicate %s "
              "leases_adopted %s leases_expired %s units_redispatched %s redis_errors %s"
              % tuple(m.get(k, "?") for k in ("results_recorded", "results_duplicate",
                                              "leases_adopted", "leases_expired",
                                              "units_redispatched", "redis_errors")))
        survived = ch.recovered if not bad else 0
        print("faults injected: %d (broker %d, workers %d, redis %d), survived: %d"
              % (ch.n_faults, ch.faults["broker"], ch.faults["workers"], ch.faults["redis"],
                 survived), flush=True)
        print("elapsed %.1f s, %d job(s) of %d tasks x %d samples" % (
            time.time() - ch.t0, len(jobs), a.tasks, a.samples))
        if bad:
            print("FAIL:\n  " + "\n  ".join(bad[:40]))
            print("fault log:\n  " + "\n  ".join(ch.log_lines[-60:]))
            print("broker log tail:\n" + ch.c.log("broker")[-3000:])
        else:
            print("PASS: every accepted task completed exactly once (Redis records, counters, "
                  "events stream and CLI output agree), nothing lost, nothing doubled")
            rc = 0
    finally:
        ch.stop.set()
        try:
            ch.c.close()
        finally:
            ch.kill_redis()
        if a.keep or rc != 0:
            print("work directory kept: %s" % work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())

"""load.py - the load figures of issue 9: a 1,000,000-task job through no-op workers.

Real processes on loopback: redis-server with the shipped broker/redis.conf (AOF on,
appendfsync everysec) on a private port, `anvil-broker`, and no-op workers
(tests/broker/broker_test_worker: a real process on the worker client library
anvil_broker_client that answers every unit at once with a minimal valid Sample).

1. Queue: a JSONL of --tasks prompts is submitted with the real CLI (`anvil submit`, chunks of
   --chunk) while no worker is connected, so the whole job sits in the queue: submit time and
   rate, Redis used_memory before/after divided by the tasks (bytes per queued task), AOF
   bytes per task, broker RSS.
2. Drain, with the queue at its high-water mark (every task queued, none leased): two no-op
   workers (--slots 1000 each) and one slow worker (--slow-slots units held, --slow-ms per
   unit) start together with a slow consumer of the job's event stream (a separate process on
   the Python client library, cli/python: WATCH pages of --watch-page events with a
   --watch-sleep-ms pause between pages, so it falls far behind the job). Every --every
   seconds: results recorded, throughput of the interval, broker RSS, Redis used_memory, the
   consumer's position. Time to drain = workers started -> job done.
3. Nothing lost: the slow consumer reads on until the `done` event and must have seen every
   (task, sample) exactly once; the job's counters, the result hash (HLEN), `anvil results`
   (JSON lines, each (task_index, sample) once) and every unit the slow worker was given (its unit log:
   each has its record) must agree with --tasks. The broker's undeliverable / send-failure
   counters are printed: credit-based dispatch keeps each worker's pipe at most its slots
   deep, below the ROUTER's send high-water mark (200000), so they stay 0.

Prints figures, asserts no speed; exit 1 only when something is lost or doubled or a phase
does not complete, 77 when a binary is missing.

  python3 tests/load/load.py [--tasks 1000000] [--every 5] ...
  (or: ctest --test-dir build -L bench -R load_1m; label bench, not run by tests/run.sh)
"""
import argparse
import asyncio
import collections
import json
import os
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

REPO = anvil_cluster.REPO
BUILD = anvil_cluster.BUILD
WORKER = os.path.join(BUILD, "tests", "broker", "broker_test_worker")


def rss_kb(pid, key="VmRSS"):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def info(r, section):
    out = {}
    for line in r("INFO", section).splitlines():
        if ":" in line:
            k, v = line.split(":", 1)
            out[k] = v.strip()
    return out


def mib(b):
    return "%.1f MiB" % (b / 1048576.0)


# ---- the slow consumer (run as its own process: `load.py --watch JOB ...`) ------------------
def watch_main(a):
    sys.path.insert(0, os.path.join(REPO, "cli", "python"))
    from anvil_client import AnvilClient

    async def run():
        seen = collections.Counter()
        types = collections.Counter()
        offset, pages, t0, last_print = "0", 0, time.time(), 0
        async with AnvilClient(a.endpoint, timeout_s=60) as c:
            done = False
            while not done:
                rep = await c.watch(a.watch, offset, block_ms=1000, max_events=a.watch_page)
                pages += 1
                for e in rep.events:
                    types[e.type] += 1
                    if e.type == "sample":
                        seen[(e.task_index, e.sample_index)] += 1
                    elif e.type == "done":
                        done = True
                if rep.last_offset:
                    offset = rep.last_offset
                if time.time() - last_print >= 1:
                    last_print = time.time()
                    with open(a.progress, "w") as f:
                        f.write("%d\n" % sum(seen.values()))
                if not done:
                    await asyncio.sleep(a.watch_sleep_ms / 1000.0)
        dups = sum(1 for v in seen.values() if v > 1)
        print(json.dumps({"sample_events": sum(seen.values()), "unique": len(seen),
                          "duplicates": dups, "types": dict(types), "pages": pages,
                          "seconds": round(time.time() - t0, 1),
                          "max_task": max((k[0] for k in seen), default=-1)}))
    asyncio.run(run())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", type=int, default=1000000)
    ap.add_argument("--chunk", type=int, default=5000)
    ap.add_argument("--every", type=float, default=5.0, help="seconds between progress lines")
    ap.add_argument("--slow-slots", type=int, default=1000)
    ap.add_argument("--slow-ms", type=int, default=2)
    ap.add_argument("--watch-page", type=int, default=2000)
    ap.add_argument("--watch-sleep-ms", type=int, default=100)
    ap.add_argument("--deadline-s", type=float, default=3000)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--watch", help=argparse.SUPPRESS)
    ap.add_argument("--endpoint", help=argparse.SUPPRESS)
    ap.add_argument("--progress", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.watch:
        return watch_main(a)
    for p in (anvil_cluster.binary("anvil"), anvil_cluster.binary("anvil-broker")):
        if p is None:
            print("SKIP: anvil / anvil-broker not built under %s" % BUILD)
            return 77
    if not os.access(WORKER, os.X_OK) or not shutil.which("redis-server"):
        print("SKIP: %s not built or no redis-server" % WORKER)
        return 77
    venv_py = os.path.join(REPO, ".venv", "bin", "python")
    py = venv_py if os.access(venv_py, os.X_OK) else sys.executable

    work = tempfile.mkdtemp(prefix="anvil-load.")
    taken = set()
    rport, cport, wport = (free_low_port(taken) for _ in range(3))
    cep, wep = "tcp://127.0.0.1:%d" % cport, "tcp://127.0.0.1:%d" % wport
    procs = []
    ok = False

    def spawn(args, log, **kw):
        p = subprocess.Popen(args, stdout=open(os.path.join(work, log), "ab"),
                             stderr=subprocess.STDOUT, start_new_session=True, **kw)
        procs.append(p)
        return p

    def cli(*args, **kw):
        return subprocess.run([anvil_cluster.binary("anvil")] + [str(x) for x in args],
                              env=dict(os.environ, ANVIL_BROKER=cep), **kw)

    print("== load: %d tasks, machine %d cores, load %s, %s free" % (
        a.tasks, os.cpu_count(), open("/proc/loadavg").read().split()[0],
        mib(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))), flush=True)
    try:
        rdir = os.path.join(work, "redis")
        os.makedirs(rdir)
        subprocess.run(["redis-server", os.path.join(REPO, "broker", "redis.conf"), "--port",
                        str(rport), "--dir", rdir, "--daemonize", "yes", "--pidfile",
                        os.path.join(rdir, "redis.pid"), "--logfile",
                        os.path.join(rdir, "redis.log")], check=True, stdout=subprocess.DEVNULL)
        r = Redis(rport, 60.0)
        for _ in range(100):
            try:
                if r("PING") == "PONG":
                    break
            except (OSError, RuntimeError, ConnectionError):
                time.sleep(0.05)
        rpid = int(open(os.path.join(rdir, "redis.pid")).read())
        broker = spawn([anvil_cluster.binary("anvil-broker"), "--redis-url",
                        "redis://127.0.0.1:%d" % rport, "--client-endpoint", cep,
                        "--worker-endpoint", wep, "--log-level", "warn"], "broker.log")
        for _ in range(200):
            if cli("workers", "--timeout", "1", stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL).returncode == 0:
                break
            time.sleep(0.1)
        peak = {"rss": 0}
        stop = threading.Event()

        def sample_rss():
            while not stop.wait(0.2):
                peak["rss"] = max(peak["rss"], rss_kb(broker.pid))
        threading.Thread(target=sample_rss, daemon=True).start()

        # ---- 1. queue
        prompts = os.path.join(work, "prompts.jsonl")
        t = time.time()
        with open(prompts, "w") as f:
            for i in range(a.tasks):
                f.write('{"custom_id":"t%d","prompt":"def kernel_%d(x): return x"}\n' % (i, i))
        print("prompt file: %s, %d lines, written in %.1f s" % (
            mib(os.path.getsize(prompts)), a.tasks, time.time() - t), flush=True)
        mem0 = int(info(r, "memory")["used_memory"])
        aof0 = int(info(r, "persistence").get("aof_current_size", 0))
        rss0 = rss_kb(broker.pid)
        t = time.time()
        out = cli("submit", prompts, "--json", "--name", "load-1m", "--no-score", "--chunk",
                  a.chunk, "--max-tokens", 4, "--timeout", 120, capture_output=True, text=True)
        t_submit = time.time() - t
        if out.returncode != 0:
            print("FAIL: submit exited %d: %s" % (out.returncode, out.stderr))
            return 1
        doc = json.loads(out.stdout)
        job = doc["job_id"]
        time.sleep(1.5)  # the broker's metrics write lands; allocator settles
        mem1 = int(info(r, "memory")["used_memory"])
        aof1 = int(info(r, "persistence").get("aof_current_size", 0))
        rss1 = rss_kb(broker.pid)
        queued = int(r("HLEN", "anv:job:%s:tasks" % job))
        print("submit (anvil submit, chunks of %d): %d tasks accepted in %.2f s = %.0f tasks/s "
              "(CLI validates the whole file first, then sends)"
              % (a.chunk, doc["accepted"], t_submit, doc["accepted"] / t_submit))
        print("queued: %d tasks; redis used_memory %s -> %s: %.1f bytes per queued task; "
              "AOF %.1f bytes per task; redis RSS %s"
              % (queued, mib(mem0), mib(mem1), (mem1 - mem0) / max(queued, 1),
                 (aof1 - aof0) / max(queued, 1), mib(rss_kb(rpid) * 1024)))
        print("broker RSS idle %s -> %s with the job queued" % (mib(rss0 * 1024),
                                                              mib(rss1 * 1024)), flush=True)
        if queued != a.tasks or doc["accepted"] != a.tasks:
            print("FAIL: %d queued, %d accepted, want %d" % (queued, doc["accepted"], a.tasks))
            return 1

        # ---- 2. drain from the high-water mark, with a slow worker and a slow watcher
        progress = os.path.join(work, "watch.progress")
        watcher = spawn([py, os.path.abspath(__file__), "--watch", job, "--endpoint", cep,
                         "--progress", progress, "--watch-page", str(a.watch_page),
                         "--watch-sleep-ms", str(a.watch_sleep_ms)], "watch.log")
        watcher_out = os.path.join(work, "watch.log")
        t_drain = time.time()
        for i in (1, 2):
            spawn([WORKER, "--endpoint", wep, "--id", "noop-%d" % i, "--slots", "1000",
                   "--tokens", "4", "--log-level", "warn"], "noop-%d.log" % i)
        slow_units = os.path.join(work, "slow.units")
        spawn([WORKER, "--endpoint", wep, "--id", "slow", "--slots", str(a.slow_slots),
               "--sleep-ms", str(a.slow_ms), "--tokens", "4", "--log", slow_units,
               "--log-level", "warn"], "slow.log")
        print("== drain: 2 no-op workers (1000 slots), 1 slow worker (%d slots, %d ms/unit), "
              "1 slow event consumer (%d events/page, %d ms between pages)"
              % (a.slow_slots, a.slow_ms, a.watch_page, a.watch_sleep_ms))
        print("%8s %10s %10s %12s %12s %12s %10s" % ("t (s)", "recorded", "tasks/s",
                                                     "broker RSS", "redis mem", "consumer",
                                                     "behind"), flush=True)
        last_n, last_t, rates, done_at = 0, t_drain, [], None
        while time.time() - t_drain < a.deadline_s:
            time.sleep(a.every)
            h = r("HMGET", "anv:job:" + job, "generated", "state")
            n = int(h[0] or 0)
            now = time.time()
            try:
                seen = int(open(progress).read())
            except (OSError, ValueError):
                seen = 0
            rate = (n - last_n) / (now - last_t)
            rates.append(rate)
            print("%8.1f %10d %10.0f %12s %12s %12d %10d" % (
                now - t_drain, n, rate, mib(rss_kb(broker.pid) * 1024),
                mib(int(info(r, "memory")["used_memory"])), seen, n - seen), flush=True)
            last_n, last_t = n, now
            if h[1] == "done":
                done_at = now
                break
        if done_at is None:
            print("FAIL: the job did not drain within %.0f s" % a.deadline_s)
            return 1
        # the exact end: finished_ms - started_ms from the job record
        j = r("HGETALL", "anv:job:" + job)
        j = dict(zip(j[::2], j[1::2]))
        drain_s = (int(j["finished_ms"]) - t_drain * 1000) / 1000.0
        print("time to drain: %.1f s (workers started -> job done) = %.0f tasks/s on average; "
              "best interval %.0f tasks/s" % (drain_s, a.tasks / drain_s, max(rates)))
        mem2 = int(info(r, "memory")["used_memory"])
        print("after the drain: redis used_memory %s (%.1f bytes per task with its result and "
              "events); broker RSS peak %s (sampled every 0.2 s; VmHWM %s)"
              % (mib(mem2), (mem2 - mem0) / a.tasks, mib(peak["rss"] * 1024),
                 mib(rss_kb(broker.pid, "VmHWM") * 1024)), flush=True)

        # ---- 3. nothing lost
        bad = []
        try:
            watcher.wait(timeout=a.deadline_s)
        except subprocess.TimeoutExpired:
            bad.append("the slow consumer did not reach the done event")
        w = {}
        try:
            w = json.loads(open(watcher_out).read().strip().splitlines()[-1])
        except (OSError, ValueError, IndexError):
            bad.append("slow consumer output: %s" % open(watcher_out).read()[-500:])
        print("slow consumer: read %s sample events (%s unique, %s duplicates) in %s pages "
              "over %s s, finishing %.1f s after the job was done"
              % (w.get("sample_events"), w.get("unique"), w.get("duplicates"), w.get("pages"),
                 w.get("seconds"), time.time() - done_at))
        if (w.get("sample_events"), w.get("unique"), w.get("duplicates")) != (a.tasks, a.tasks,
                                                                              0):
            bad.append("slow consumer counts %s" % w)
        for k, v in (("generated", a.tasks), ("terminal", a.tasks), ("failed", 0),
                     ("dead", 0)):
            if int(j.get(k, 0)) != v:
                bad.append("job.%s = %s, want %d" % (k, j.get(k), v))
        hl = int(r("HLEN", "anv:job:%s:res" % job))
        if hl != a.tasks:
            bad.append("HLEN res = %d" % hl)
        # every unit the slow worker was given has its record
        tasks_slow = set()
        with open(slow_units) as f:
            for line in f:
                p = line.split()
                if p and p[0] == "unit" and p[2] == job:
                    tasks_slow.add(p[3])
        missing = 0
        ts = sorted(tasks_slow)
        for i in range(0, len(ts), 5000):
            got = r("HMGET", "anv:job:%s:res" % job, *["%s:0" % x for x in ts[i:i + 5000]])
            missing += sum(1 for x in got if x is None)
        print("slow worker: held %d units (at most %d at a time), all recorded: %s"
              % (len(tasks_slow), a.slow_slots, "yes" if not missing else "NO (%d missing)"
                 % missing))
        if missing:
            bad.append("%d units of the slow worker have no record" % missing)
        t = time.time()
        res = subprocess.Popen([anvil_cluster.binary("anvil"), "results", job, "--page-size",
                                "5000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env=dict(os.environ, ANVIL_BROKER=cep), text=True)
        ids = set()
        lines = 0
        for line in res.stdout:
            lines += 1
            x = json.loads(line)
            ids.add((x.get("task_index"), x.get("sample")))
        res.wait()
        print("anvil results: %d lines, %d distinct (task, sample), in %.1f s (exit %d)"
              % (lines, len(ids), time.time() - t, res.returncode))
        if (lines, len(ids), res.returncode) != (a.tasks, a.tasks, 0):
            bad.append("anvil results gave %d lines / %d ids" % (lines, len(ids)))
        time.sleep(1.5)
        m = r("HGETALL", "anv:broker:metrics")
        m = dict(zip(m[::2], m[1::2]))
        print("broker counters: units_dispatched %s results_recorded %s results_duplicate %s "
              "units_undeliverable %s send failures (worker socket) %s redis_calls %s "
              "(%.3f per task)" % (
                  m.get("units_dispatched"), m.get("results_recorded"),
                  m.get("results_duplicate"), m.get("units_undeliverable"),
                  "again %s unroutable %s failed %s" % (m.get("worker_send_again"),
                                                        m.get("worker_send_unroutable"),
                                                        m.get("worker_send_failed")),
                  m.get("redis_calls"), int(m.get("redis_calls", 0)) / a.tasks))
        if bad:
            print("FAIL:\n  " + "\n  ".join(bad))
            return 1
        print("PASS: %d tasks queued, drained and recorded once; the slow consumer and the "
              "slow worker lost nothing" % a.tasks)
        ok = True
        return 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()
        try:
            pid = int(open(os.path.join(work, "redis", "redis.pid")).read())
            os.kill(pid, signal.SIGKILL)
        except (OSError, ValueError):
            pass
        if a.keep or not ok:
            print("work directory kept: %s" % work)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

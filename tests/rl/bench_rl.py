#!/usr/bin/env python3
"""bench_rl.py - figures of the RL client on a real local cluster (CPU engine, tiny models).

1. Control-plane time of a weight update beyond the load itself: UPDATE_WEIGHTS round trips
   with 1, 2 and 4 gen workers, idle and while a job runs (policy pause), each update loading
   a real checkpoint (two tiny checkpoints alternate). Printed: the broker's control_ms (its
   total minus the slowest worker's load), the client's round trip minus that load, the load.
2. Time from a group's last sample to its delivery by the rollout iterator (broker stream time
   of the sample's final event -> the iterator returning the group; ms resolution).
No assertions: it prints figures (`ctest -L bench -R rl_bench`, or run it by hand).
"""
import asyncio
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "cli", "python"))
import anvil_cluster  # noqa: E402
from anvil_client import AnvilClient  # noqa: E402


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))]


def line(name, xs, unit="ms"):
    print("%-52s median %7.2f  p90 %7.2f  max %7.2f %s  (n=%d)"
          % (name, statistics.median(xs), pct(xs, 90), max(xs), unit, len(xs)))


async def updates(c, models, k, version, policy):
    rows = []
    for i in range(k):
        version += 1
        u = await c.update_weights(models[version % 2], version, policy=policy)
        rows.append(u)
    return version, rows


async def bench(cl, models, n_workers):
    async with AnvilClient(cl.client_ep, timeout_s=60) as c:
        v = await c.refresh_weight_version()
        v, idle = await updates(c, models, 20, v, "finish")
        tag = "%d gen worker%s" % (n_workers, "s" if n_workers > 1 else "")
        line("update idle, %s: broker control-plane" % tag, [u.control_ms for u in idle])
        line("update idle, %s: client beyond load" % tag, [u.client_control_ms for u in idle])
        line("update idle, %s: slowest load" % tag, [u.load_s * 1e3 for u in idle])
        ro = c.generate(["def kernel_%d(x):" % i for i in range(400)], 4,
                        {"max_tokens": 64, "temperature": 1.0}, score=False)
        await ro.start()
        v, busy = await updates(c, models, 10, v, "pause")
        line("update under load (pause), %s: broker control" % tag,
             [u.control_ms for u in busy])
        await ro.cancel()
        groups = await c.generate(["def kernel_%d(x):" % i for i in range(48)], 4,
                                  {"max_tokens": 32, "temperature": 1.0},
                                  score=False).collect()
        line("group delivery after its last sample, %s" % tag,
             [g.delivery_latency_ms for g in groups])


def main():
    for b in ("anvil-broker", "anvil-gen-worker"):
        if anvil_cluster.binary(b) is None:
            print("skipped: %s is not built" % b)
            return 77
    with tempfile.TemporaryDirectory() as tmp:
        models = [anvil_cluster.make_tiny_model(os.path.join(tmp, "m%d" % s), seed=s)
                  for s in (0, 1)]
        for n in (1, 2, 4):
            cl = anvil_cluster.Cluster(os.path.join(tmp, "cluster%d" % n))
            try:
                cl.start_redis()
                cl.start_broker()
                for i in range(n):
                    cl.start_gen_worker("gen%d" % i, models[0], "--threads", "1")
                cl.wait_workers(n, "gen")
                asyncio.run(bench(cl, models, n))
            finally:
                cl.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

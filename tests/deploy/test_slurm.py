"""test_slurm.py - the Slurm recipe's roles (deploy/slurm/anvil-node.sh) run for real on this
machine, from the bundle (deploy/bundle.sh, unpacked elsewhere), without Slurm.

The head role (real redis-server with AOF in the cluster directory, the real broker) writes
cluster.env; a CPU gen worker role reads it and registers; a job goes in through the real CLI at
the endpoint the file names. Then SIGTERM arrives as it would from Slurm: either in the order
anvil.sbatch uses at the time limit (worker steps first, then the head) or all at once, to every
process of every role (preemption). The worker must drain (exit 0, "draining" in its log), the
head must stop Redis cleanly, and a restarted head of the next generation (a requeued run) must
resume the job from Redis to exactly one result per sample.

Also: every shell script under deploy/ parses (bash -n) and passes shellcheck where installed.
"""
import glob
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import anvil_cluster  # noqa: E402

REPO = anvil_cluster.REPO
SCRIPTS = sorted(glob.glob(os.path.join(REPO, "deploy", "**", "*.sh"), recursive=True)
                 + glob.glob(os.path.join(REPO, "deploy", "slurm", "*.sbatch")))
PROMPTS = 64
SAMPLES = 2
STALL_S = 90  # the resumed job made no new sample for this long: it is stuck
TOTAL_S = 1200  # the resumed job's whole run, at any speed


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: os.path.relpath(p, REPO))
def test_script_parses(script):
    r = subprocess.run(["bash", "-n", script], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: os.path.relpath(p, REPO))
def test_shellcheck(script):
    sc = shutil.which("shellcheck")
    if sc is None:
        pytest.skip("shellcheck is not installed (apt-get install shellcheck)")
    r = subprocess.run([sc, "-x", "-s", "bash", "-S", "warning", script], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def curve_available(home):
    """True when the bundled CLI has `anvil keys` (the CURVE work): the roles then use keys."""
    r = subprocess.run([os.path.join(home, "bin", "anvil"), "--help"], capture_output=True,
                       text=True, timeout=30)
    return any(line.split()[:1] == ["keys"] for line in r.stdout.splitlines())


class Node:
    """The roles of one test cluster: processes of anvil-node.sh, logs in the cluster dir."""

    def __init__(self, home, cdir, model, **env):
        self.home = home
        self.dir = cdir
        self.script = os.path.join(home, "share", "anvil", "slurm", "anvil-node.sh")
        self.curve = curve_available(home)
        self.ports = {k: anvil_cluster.free_port() for k in ("client", "worker", "redis", "metrics")}
        self.env = dict(os.environ)
        self.env.update({
            "ANVIL_HOME": home, "ANVIL_CLUSTER_DIR": cdir, "ANVIL_HEAD_HOST": "127.0.0.1",
            "ANVIL_BIND_HOST": "127.0.0.1", "ANVIL_CURVE": "on" if self.curve else "off",
            "ANVIL_HEAD_CLIENT_PORT": str(self.ports["client"]),
            "ANVIL_HEAD_WORKER_PORT": str(self.ports["worker"]),
            "ANVIL_HEAD_REDIS_PORT": str(self.ports["redis"]),
            "ANVIL_HEAD_METRICS_PORT": str(self.ports["metrics"]),
            "ANVIL_DEVICE": "cpu", "ANVIL_MODEL": model, "ANVIL_GRACE_S": "3",
            "ANVIL_GEN_ARGS": "--threads 1 --slots 2", "ANVIL_WAIT_S": "60",
            # lease expiry re-dispatches what a worker could not hand back (preemption)
            "ANVIL_BROKER_ARGS": "--lease-ms 3000",
        })
        self.env.update(env)
        self.procs = {}

    def start(self, name, role, generation):
        log = open(os.path.join(self.dir, name + ".out"), "ab")
        env = dict(self.env, ANVIL_GENERATION=generation)
        p = subprocess.Popen([self.script, role], stdout=log, stderr=log, env=env,
                             start_new_session=True)
        self.procs[name] = p
        return p

    def out(self, name):
        with open(os.path.join(self.dir, name + ".out"), errors="replace") as f:
            return f.read()

    def cluster_env(self, generation, timeout=60):
        """cluster.env as a dict once it is of `generation` (shell quoting undone by shlex)."""
        path = os.path.join(self.dir, "cluster.env")
        deadline = time.time() + timeout
        while time.time() < deadline:
            if os.path.exists(path):
                doc = dict(tok.split("=", 1) for tok in shlex.split(open(path).read()))
                if doc.get("ANVIL_CLUSTER_GENERATION") == generation:
                    return doc
            head = self.procs.get("head")
            if head is not None and head.poll() is not None:
                raise AssertionError("head exited %s:\n%s" % (head.returncode, self.out("head")))
            time.sleep(0.2)
        raise AssertionError("no cluster.env of %s:\n%s" % (generation, self.out("head")))

    def cli(self, env_doc, *args, check=True, timeout=60):
        """The bundle's `anvil` at the endpoint and with the key that cluster.env names."""
        flags = ["--broker", env_doc["ANVIL_CLUSTER_CLIENT_ENDPOINT"]]
        if env_doc["ANVIL_CLUSTER_SERVER_KEY"]:
            flags += ["--curve-secret", os.path.join(self.dir, "keys", "client", "client.key_secret"),
                      "--curve-server", env_doc["ANVIL_CLUSTER_SERVER_KEY"]]
        r = subprocess.run([os.path.join(self.home, "bin", "anvil")] + [str(a) for a in args] + flags,
                           capture_output=True, text=True, timeout=timeout, env=self.env)
        if check and r.returncode != 0:
            raise AssertionError("anvil %s exited %d: %s%s" % (args, r.returncode, r.stdout, r.stderr))
        return r

    def status(self, env_doc, job):
        doc = json.loads(self.cli(env_doc, "status", job, "--json").stdout)
        if isinstance(doc, dict) and "jobs" in doc:
            doc = doc["jobs"]
        return doc[0] if isinstance(doc, list) else doc

    def workers(self, env_doc):
        doc = json.loads(self.cli(env_doc, "workers", "--json").stdout)
        return doc["workers"] if isinstance(doc, dict) else doc

    def wait_workers(self, env_doc, n, timeout=60):
        deadline = time.time() + timeout
        ws = []
        while time.time() < deadline:
            ws = [w for w in self.workers(env_doc) if w.get("state") != "dead"]
            if len(ws) >= n:
                return ws
            time.sleep(0.3)
        raise AssertionError("%d workers registered, wanted %d: %s" % (len(ws), n, ws))

    def wait_exit(self, name, timeout=60):
        p = self.procs[name]
        try:
            return p.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            raise AssertionError("%s did not stop within %ss:\n%s" % (name, timeout, self.out(name)))

    def close(self):
        for p in self.procs.values():
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
        # a redis-server left by a killed head
        port = str(self.ports["redis"])
        subprocess.run([os.path.join(self.home, "bin", "redis-cli"), "-p", port, "shutdown",
                        "nosave"], capture_output=True)


@pytest.fixture(scope="module")
def slow_model(tmp_path_factory):
    """Bigger than tiny_model, so the job below is still running when the signal comes."""
    out = str(tmp_path_factory.mktemp("models") / "small-llama")
    try:
        return anvil_cluster.make_tiny_model(out, hidden=256, layers=4, heads=4, kv_heads=2, ffn=512)
    except Exception as e:  # the venv lacks torch/transformers/tokenizers
        pytest.skip("cannot make the model: %s" % e)


def worker_logs(cdir, generation):
    return "".join(open(p, errors="replace").read()
                   for p in glob.glob(os.path.join(cdir, "logs", generation, "*-gen-*.log")))


@pytest.mark.parametrize("mode", ["time-limit", "preemption"])
def test_drain_and_resume(bundle, slow_model, tmp_path, mode):
    cdir = str(tmp_path / "cluster")
    os.makedirs(cdir)
    node = Node(bundle, cdir, slow_model)
    try:
        node.start("head", "head", "run.0")
        env0 = node.cluster_env("run.0")
        assert env0["ANVIL_CLUSTER_CLIENT_ENDPOINT"] == "tcp://127.0.0.1:%d" % node.ports["client"]
        assert env0["ANVIL_CLUSTER_WORKER_ENDPOINT"] == "tcp://127.0.0.1:%d" % node.ports["worker"]
        if node.curve:
            key = env0["ANVIL_CLUSTER_SERVER_KEY"]
            assert key == os.path.join(cdir, "keys", "broker", "broker.key"), env0
            assert env0["ANVIL_CLUSTER_SERVER_PUBLIC"] and env0["ANVIL_CLUSTER_SERVER_PUBLIC"] in open(key).read()
        else:
            assert env0["ANVIL_CLUSTER_SERVER_KEY"] == ""
        with urllib.request.urlopen(env0["ANVIL_CLUSTER_METRICS"] + "metrics", timeout=10) as r:
            assert b"anvil_" in r.read()

        node.start("gen", "gen", "run.0")
        ws = node.wait_workers(env0, 1)
        assert ws[0]["kind"] == "gen" and ws[0]["worker_id"].endswith("-gen-cpu0"), ws
        assert glob.glob(os.path.join(cdir, "run", "run.0.*-gen-cpu0.ready")), os.listdir(cdir)

        prompts = str(tmp_path / "prompts.jsonl")
        with open(prompts, "w") as f:
            for i in range(PROMPTS):
                f.write(json.dumps({"custom_id": "p%03d" % i,
                                    "prompt": "Write a Triton kernel for operation %d." % i}) + "\n")
        sub_args = ("submit", prompts, "--name", "slurm-" + mode, "--samples", SAMPLES,
                    "--max-tokens", 128, "--json")
        sub = json.loads(node.cli(env0, *sub_args).stdout)
        job = sub["job_id"]
        deadline = time.time() + 60
        while node.status(env0, job).get("generated", 0) < 2:
            assert time.time() < deadline, node.status(env0, job)
            time.sleep(0.1)

        head, gen = node.procs["head"], node.procs["gen"]
        if mode == "time-limit":
            # anvil.sbatch's shutdown: SIGTERM to the worker step (srun forwards it), then the head
            gen.send_signal(signal.SIGTERM)
            assert node.wait_exit("gen") == 0, node.out("gen") + worker_logs(cdir, "run.0")
            head.send_signal(signal.SIGTERM)
        else:
            # preemption: Slurm signals every process of every step at once
            os.killpg(gen.pid, signal.SIGTERM)
            os.killpg(head.pid, signal.SIGTERM)
            assert node.wait_exit("gen") == 0, node.out("gen") + worker_logs(cdir, "run.0")
        assert node.wait_exit("head") == 0, node.out("head")
        wlog = worker_logs(cdir, "run.0")
        # drained: the worker finished its units within the grace ("draining: N units in
        # flight") or handed them back ("grace period over: handing back N units"), then left
        assert "gen worker stopped" in wlog, wlog
        assert "draining" in wlog or "handing back" in wlog, wlog
        assert "drained" in node.out("gen"), node.out("gen")
        assert "drained: broker exited" in node.out("head"), node.out("head")
        assert os.path.isdir(os.path.join(cdir, "redis", "appendonlydir")), os.listdir(cdir + "/redis")
        assert not glob.glob(os.path.join(cdir, "run", "run.0.*.ready"))  # removed by the drain

        # the requeued run: a new generation, the same cluster directory
        node.start("head", "head", "run.1")
        env1 = node.cluster_env("run.1")
        st = node.status(env1, job)
        assert st["state"] != "done" and 2 <= st["generated"] < PROMPTS * SAMPLES, st
        again = json.loads(node.cli(env1, *sub_args).stdout)
        assert again["job_id"] == job and again["existing"] is True, again
        node.start("gen", "gen", "run.1")
        # the resumed job must keep moving, not be fast: under ASan this CPU worker made ~41
        # tok/s on this 2-core machine (the rest of the job took ~320 s, past the 240 s this
        # wait once had). A job that stops making samples for STALL_S fails at once; TOTAL_S
        # bounds the whole wait.
        start = last_move = time.time()
        last = -1
        while True:
            st = node.status(env1, job)
            if st["state"] == "done":
                break
            if st.get("generated", 0) != last:
                last, last_move = st.get("generated", 0), time.time()
            now = time.time()
            assert now - last_move < STALL_S and now - start < TOTAL_S, (
                "no new sample for %.0f s, %.0f s in all" % (now - last_move, now - start),
                st, worker_logs(cdir, "run.1"))
            time.sleep(0.5)
        assert st["generated"] == PROMPTS * SAMPLES and st.get("failed", 0) == 0, st
        res = [json.loads(line) for line in node.cli(env1, "results", job).stdout.split("\n")
               if line.strip()]
        keys = sorted((r["custom_id"], r["sample"]) for r in res)
        assert keys == sorted(("p%03d" % i, s) for i in range(PROMPTS) for s in range(SAMPLES))

        node.procs["gen"].send_signal(signal.SIGTERM)
        assert node.wait_exit("gen") == 0, node.out("gen")
        node.procs["head"].send_signal(signal.SIGTERM)
        assert node.wait_exit("head") == 0, node.out("head")
    finally:
        node.close()


def test_exec_role_registers_and_drains(bundle, tmp_path):
    if not os.path.exists(os.path.join(bundle, "bin", "anvil-exec-worker")):
        pytest.skip("anvil-exec-worker is not built")
    venv = os.path.realpath(os.path.join(REPO, ".venv"))
    if not os.access(os.path.join(venv, "bin", "python"), os.X_OK):
        pytest.skip("no Python venv with torch in %s" % venv)
    cdir = str(tmp_path / "cluster")
    os.makedirs(cdir)
    # the sandbox sees the venv's real directory only when it is bound in
    node = Node(bundle, cdir, "", ANVIL_PYTHON=os.path.join(venv, "bin", "python"),
                ANVIL_EXEC_ARGS="--ro-binds " + venv)
    try:
        node.start("head", "head", "x.0")
        env0 = node.cluster_env("x.0")
        node.start("exec", "exec", "x.0")
        ws = node.wait_workers(env0, 1, timeout=120)
        assert ws[0]["kind"] == "exec", ws
        node.procs["exec"].send_signal(signal.SIGTERM)
        assert node.wait_exit("exec") == 0, node.out("exec")
        log = "".join(open(p).read() for p in glob.glob(os.path.join(cdir, "logs", "x.0", "*-exec-*.log")))
        assert "exec worker stopped" in log, log
        node.procs["head"].send_signal(signal.SIGTERM)
        assert node.wait_exit("head") == 0, node.out("head")
    finally:
        node.close()


# -- anvil.sbatch itself, with stand-ins for srun and scontrol ---------------------------------
# Slurm is not installed here: `srun` runs its command on this machine (exec, so a signal to
# the srun process reaches the role as srun would forward it) and `scontrol` lists three node
# names and records requeue requests. Everything else is the real recipe, bundle and cluster.
SRUN = """#!/bin/sh
while [ $# -gt 0 ]; do case "$1" in --*) shift ;; *) break ;; esac; done
exec "$@"
"""
SCONTROL = """#!/bin/sh
case "$1" in
show) printf '127.0.0.1\\nexecnode\\ngennode\\n' ;;
requeue) echo "$2" >>"$ANVIL_TEST_REQUEUES" ;;
*) exit 1 ;;
esac
"""


def test_sbatch_time_limit_requeue_resume(bundle, slow_model, tmp_path):
    shims = tmp_path / "shims"
    shims.mkdir()
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL)):
        (shims / name).write_text(text)
        (shims / name).chmod(0o755)
    cdir = str(tmp_path / "cluster")
    os.makedirs(cdir)
    node = Node(bundle, cdir, slow_model)
    requeues = tmp_path / "requeues"
    venv = os.path.realpath(os.path.join(REPO, ".venv"))
    env = dict(node.env, PATH=str(shims) + os.pathsep + os.environ["PATH"], SLURM_JOB_ID="42",
               SLURM_JOB_NODELIST="test[0-2]", ANVIL_TEST_REQUEUES=str(requeues),
               ANVIL_PYTHON=os.path.join(venv, "bin", "python"),
               ANVIL_EXEC_ARGS="--ro-binds " + venv, ANVIL_JOB_NAME="sbatch-test")
    prompts = str(tmp_path / "prompts.jsonl")
    with open(prompts, "w") as f:
        for i in range(PROMPTS):
            f.write(json.dumps({"custom_id": "p%03d" % i,
                                "prompt": "Write a Triton kernel for operation %d." % i}) + "\n")
    sbatch = os.path.join(bundle, "share", "anvil", "slurm", "anvil.sbatch")
    args = ["bash", sbatch, prompts, "--samples", str(SAMPLES), "--max-tokens", "128", "--no-score"]
    outs = []

    def run(restart):
        out = open(str(tmp_path / ("sbatch.%d.out" % restart)), "wb")
        outs.append(out.name)
        return subprocess.Popen(args, stdout=out, stderr=out, start_new_session=True,
                                env=dict(env, SLURM_RESTART_COUNT=str(restart)))

    def text(i):
        return open(outs[i], errors="replace").read()

    procs = []
    try:
        procs.append(run(0))
        env0 = node.cluster_env("42.0")
        deadline = time.time() + 120
        job = None
        while True:
            assert time.time() < deadline and procs[0].poll() is None, text(0)
            m = [line for line in text(0).splitlines() if line.startswith("anvil.sbatch: job ")]
            if m:
                job = m[0].split()[2]
                if node.status(env0, job).get("generated", 0) >= 2:
                    break
            time.sleep(0.2)
        node.wait_workers(env0, 2)  # the gen and the exec worker
        procs[0].send_signal(signal.SIGTERM)  # --signal=B:TERM@120: the batch shell only
        assert procs[0].wait(120) == 0, text(0)
        out0 = text(0)
        assert out0.index("draining the workers") < out0.index("stopping the head") \
            < out0.index("requeueing"), out0
        assert requeues.read_text().split() == ["42"]
        assert not os.path.exists(os.path.join(cdir, "results", "sbatch-test.jsonl"))

        procs.append(run(1))  # the requeued run
        assert procs[1].wait(300) == 0, text(1)
        out1 = text(1)
        assert "anvil.sbatch: job %s" % job in out1 and '"existing":true' in out1, out1
        assert "requeueing" not in out1 and requeues.read_text().split() == ["42"]
        with open(os.path.join(cdir, "results", "sbatch-test.jsonl")) as f:
            res = [json.loads(line) for line in f if line.strip()]
        keys = sorted((r["custom_id"], r["sample"]) for r in res)
        assert keys == sorted(("p%03d" % i, s) for i in range(PROMPTS) for s in range(SAMPLES))
        logs = glob.glob(os.path.join(cdir, "logs", "42.1", "*.log"))
        assert any("-exec-cpu0" in p for p in logs) and any("-gen-cpu0" in p for p in logs), logs
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        node.close()

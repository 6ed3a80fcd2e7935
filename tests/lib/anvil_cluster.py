"""anvil_cluster.py - real local clusters for the Python integration tests.

A Cluster starts a private redis-server (tests/lib/redis-server.sh: free loopback port, AOF on)
and the real `anvil-broker` on free ports, then any number of real workers
(`anvil-gen-worker`, `anvil-exec-worker`), each a process whose stderr goes to a log file in
the cluster's directory. `cli()` runs the real `anvil` binary against it. Nothing is faked:
tests assert on what the CLI prints and on what lands in Redis.

Binaries are found under $ANVIL_BUILD_DIR (default <repo>/build); a test that needs one that
is not built is skipped, saying which.

With curve=True the cluster runs CURVE: `anvil keys gen --all` makes DIR/keys (broker, client,
worker, allow/), the broker gets --curve-secret/--curve-allow, workers started here get the
worker key and the CLI the client key (ANVIL_CURVE_SECRET / ANVIL_CURVE_SERVER).
"""
import json
import os
import signal
import socket
import subprocess
import time

REPO = os.environ.get("ANVIL_SOURCE_DIR") or os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
BUILD = os.environ.get("ANVIL_BUILD_DIR") or os.path.join(REPO, "build")
SHARED = os.environ.get("ANVIL_SHARED_DIR") or os.path.join(os.path.dirname(REPO), "shared")
BINARIES = {
    "anvil": "cli/anvil",
    "anvil-broker": "broker/anvil-broker",
    "anvil-gen-worker": "gen_worker/anvil-gen-worker",
    "anvil-exec-worker": "exec_worker/anvil-exec-worker",
    "anvil-generate": "gen_worker/engine/anvil-generate",
}


def need_datasets(*parts):
    """The path SHARED/datasets/PARTS...; skips the calling test, saying where it looked,
    when it is not there (a checkout without ../shared beside it)."""
    path = os.path.join(SHARED, "datasets", *parts)
    if not os.path.exists(path):
        import pytest
        pytest.skip("%s not found (the datasets are read from ../shared/datasets beside the "
                    "checkout; set ANVIL_SHARED_DIR)" % path)
    return path


def binary(name):
    """Path of a built binary, or None."""
    p = os.path.join(BUILD, BINARIES[name])
    return p if os.access(p, os.X_OK) else None


_PORTS_GIVEN = set()


def free_port():
    """A free loopback port never handed out before in this process. The kernel can give the
    same ephemeral port to two binds in a row once the first is closed (a cluster whose client
    and worker endpoints were one port failed CI: its broker could not bind the second)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _PORTS_GIVEN:
            _PORTS_GIVEN.add(port)
            return port


def make_tiny_model(out_dir, **kw):
    """A small random Llama checkpoint with a real trained BPE tokenizer (tests/engine)."""
    args = [os.path.join(REPO, ".venv", "bin", "python"),
            os.path.join(REPO, "gen_worker", "engine", "tools", "tiny_model.py"), out_dir]
    for k, v in kw.items():
        args += ["--" + k.replace("_", "-"), str(v)]
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return out_dir


class Cluster:
    def __init__(self, workdir, broker_args=(), curve=False):
        self.dir = workdir
        os.makedirs(workdir, exist_ok=True)
        self.procs = {}
        self.redis_dir = os.path.join(workdir, "redis")
        self.client_ep = "tcp://127.0.0.1:%d" % free_port()
        self.worker_ep = "tcp://127.0.0.1:%d" % free_port()
        self.broker_args = list(broker_args)
        self.redis_url = None
        self.keys = None
        if curve:
            self.keys = os.path.join(workdir, "keys")
            self.cli("keys", "gen", "--out", self.keys, "--all")
            self.broker_args += ["--curve-secret", self.key("broker.key_secret"),
                                 "--curve-allow", self.key("allow")]

    def key(self, name):
        """Path of a file in the cluster's key directory (curve=True)."""
        return os.path.join(self.keys, name)

    def worker_curve_args(self, name="worker"):
        """The flags that give a worker key NAME (default: the allowed worker key)."""
        if not self.keys:
            return []
        return ["--curve-secret", self.key(name + ".key_secret"),
                "--curve-server", self.key("broker.key")]

    # -- services -------------------------------------------------------------------------
    def start_redis(self):
        out = subprocess.run([os.path.join(REPO, "tests", "lib", "redis-server.sh"), "start",
                              self.redis_dir], check=True, capture_output=True, text=True)
        self.redis_url = out.stdout.strip().splitlines()[-1]
        return self.redis_url

    def stop_redis(self):
        subprocess.run([os.path.join(REPO, "tests", "lib", "redis-server.sh"), "stop",
                        self.redis_dir], check=False, capture_output=True)

    def redis(self, *args):
        """Runs redis-cli against the cluster's server and returns its output."""
        port = open(os.path.join(self.redis_dir, "port")).read().strip()
        out = subprocess.run(["redis-cli", "-p", port, "--no-raw"] + [str(a) for a in args],
                             check=True, capture_output=True, text=True)
        return out.stdout

    def spawn(self, name, binary_name, args, env=None):
        path = binary(binary_name)
        if path is None:
            raise RuntimeError("%s is not built" % binary_name)
        log = open(os.path.join(self.dir, name + ".log"), "ab")
        e = dict(os.environ)
        e.update(env or {})
        p = subprocess.Popen([path] + list(args), stdout=log, stderr=log, env=e,
                             start_new_session=True)
        self.procs[name] = p
        return p

    def start_broker(self):
        return self.spawn("broker", "anvil-broker",
                          ["--redis-url", self.redis_url, "--client-endpoint", self.client_ep,
                           "--worker-endpoint", self.worker_ep] + self.broker_args)

    def start_gen_worker(self, name, model, *extra, broker=None):
        return self.spawn(name, "anvil-gen-worker",
                          ["--broker", broker or self.worker_ep, "--model", model,
                           "--worker-id", name] + self.worker_curve_args() + list(extra))

    def stop(self, name, sig=signal.SIGTERM, timeout=30):
        p = self.procs.get(name)
        if p is None or p.poll() is not None:
            return p.returncode if p else None
        p.send_signal(sig)
        try:
            return p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            return p.wait()

    def log(self, name):
        with open(os.path.join(self.dir, name + ".log"), errors="replace") as f:
            return f.read()

    def close(self):
        for name in list(self.procs):
            self.stop(name, signal.SIGKILL if name != "broker" else signal.SIGTERM, timeout=10)
        self.stop_redis()

    # -- the CLI ---------------------------------------------------------------------------
    def cli(self, *args, check=True, timeout=120, input=None, env=None):
        path = binary("anvil")
        if path is None:
            raise RuntimeError("anvil is not built")
        extra = env or {}
        env = dict(os.environ, ANVIL_BROKER=self.client_ep)
        if self.keys:
            env.update(ANVIL_CURVE_SECRET=self.key("client.key_secret"),
                       ANVIL_CURVE_SERVER=self.key("broker.key"))
        env.update(extra)
        r = subprocess.run([path] + [str(a) for a in args], capture_output=True, text=True,
                           timeout=timeout, env=env, input=input)
        if check and r.returncode != 0:
            raise AssertionError("anvil %s exited %d\nstdout: %s\nstderr: %s%s"
                                 % (" ".join(map(str, args)), r.returncode, r.stdout, r.stderr,
                                    self.exited()))
        return r

    def exited(self):
        """A line per service that has exited, with the end of its log ('' when all run): a
        failed command's message says so when the broker it talked to is gone."""
        out = ""
        for name, p in self.procs.items():
            if p.poll() is not None:
                tail = self.log(name).splitlines()[-3:]
                out += "\n%s exited %s; its log ends:\n  %s" % (name, p.returncode,
                                                                 "\n  ".join(tail))
        return out

    def submit(self, path, *args):
        r = self.cli("submit", path, "--json", *args)
        return json.loads(r.stdout)["job_id"]

    def status(self, job):
        """The job's status object (`anvil status JOB --json`)."""
        doc = json.loads(self.cli("status", job, "--json").stdout)
        if isinstance(doc, dict) and "jobs" in doc:
            doc = doc["jobs"]
        return doc[0] if isinstance(doc, list) else doc

    def wait_state(self, job, states=("done",), timeout=120):
        deadline = time.time() + timeout
        st = None
        while time.time() < deadline:
            st = self.status(job)
            if st.get("state") in states:
                return st
            time.sleep(0.2)
        raise AssertionError("job %s not in %s after %ss: %s" % (job, states, timeout, st))

    def results(self, job, *args):
        r = self.cli("results", job, *args)
        # split on "\n" only: a JSON string may hold U+2028, U+2029 or U+0085 raw (JSON
        # escapes only what is below 0x20), and str.splitlines() breaks lines on those
        return [json.loads(line) for line in r.stdout.split("\n") if line.strip()]

    def wait_workers(self, n, kind=None, timeout=30):
        deadline = time.time() + timeout
        ws = []
        while time.time() < deadline:
            r = self.cli("workers", "--json", check=False)
            if r.returncode == 0:
                doc = json.loads(r.stdout)
                ws = doc["workers"] if isinstance(doc, dict) else doc
                alive = [w for w in ws if w.get("state") != "dead"
                         and (kind is None or w.get("kind") == kind)]
                if len(alive) >= n:
                    return alive
            time.sleep(0.2)
        raise AssertionError("fewer than %d workers registered: %s" % (n, ws))

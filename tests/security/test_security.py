"""test_security.py - CURVE between real processes: anvil-broker with keys and a ZAP allow-list,
real gen and exec workers, the real `anvil` CLI and the Python client.

Covers: known keys work end to end (a submitted job completes through real workers, scored
by an exec worker); an unknown key is refused, by the broker (a log line naming socket,
address and key) and visibly to the client and worker that hold it; a client without keys gets
nothing; the bytes on the wire carry no prompt text with CURVE, and do carry it in plaintext
(the control that proves the check can fail); a non-loopback bind without keys refuses to
start, with --insecure it starts; `anvil keys gen` output loads with zcert (pyzmq's reader);
`anvil up --curve` runs its cluster with keys that `anvil` commands pick up.
"""
import asyncio
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request

import pytest
import zmq
import zmq.auth

import anvil_cluster

MARKER = "def secret_marker_kernel_7f3a9c(x):"


def need(*names):
    for n in names:
        if anvil_cluster.binary(n) is None:
            pytest.skip("%s is not built under %s" % (n, anvil_cluster.BUILD))


@pytest.fixture
def curve_cluster(tmp_path):
    need("anvil", "anvil-broker")
    c = anvil_cluster.Cluster(str(tmp_path / "cluster"), curve=True)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    c.metrics_port = s.getsockname()[1]
    s.close()
    c.broker_args += ["--metrics-endpoint", "127.0.0.1:%d" % c.metrics_port]
    c.start_redis()
    c.start_broker()
    yield c
    c.close()


def write_prompts(path, n):
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"custom_id": "p%d" % i, "prompt": MARKER + " # %d" % i}) + "\n")
    return path


def wait_log(cluster, name, text, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if text in cluster.log(name):
            return
        time.sleep(0.1)
    raise AssertionError("%r not in the %s log:\n%s" % (text, name, cluster.log(name)[-3000:]))


def public_key(path):
    return zmq.auth.load_certificate(path)[0].decode()


# -- keys -------------------------------------------------------------------------------------

def test_keys_gen_loads_with_zcert(tmp_path):
    need("anvil")
    c = anvil_cluster.Cluster(str(tmp_path / "c"), curve=True)
    r = c.cli("keys", "gen", "--out", str(tmp_path / "one"), "--name", "node-7", "--json")
    doc = json.loads(r.stdout)[0]
    pub, sec = zmq.auth.load_certificate(doc["secret_file"])
    assert pub.decode() == doc["public_key"] and len(sec) == 40
    assert zmq.curve_public(sec) == pub
    assert zmq.auth.load_certificate(doc["public_file"]) == (pub, None)
    assert os.stat(doc["secret_file"]).st_mode & 0o777 == 0o600
    for name in ("broker", "client", "worker"):
        p, s = zmq.auth.load_certificate(c.key(name + ".key_secret"))
        assert zmq.curve_public(s) == p
    assert sorted(os.listdir(c.key("allow"))) == ["client.key", "worker.key"]
    assert public_key(c.key("allow/worker.key")) == public_key(c.key("worker.key"))
    # an existing key is never replaced without --force
    again = c.cli("keys", "gen", "--out", str(tmp_path / "one"), "--name", "node-7", check=False)
    assert again.returncode != 0 and "already exists" in again.stderr
    assert public_key(doc["public_file"]) == doc["public_key"]


# -- known keys work; the wire carries no plaintext ------------------------------------------

@pytest.mark.parametrize("mode", ["curve", "plain"])
def test_wire_is_not_plaintext(tmp_path, tiny_model, relay, mode):
    need("anvil", "anvil-broker", "anvil-gen-worker")
    c = anvil_cluster.Cluster(str(tmp_path / "c"), curve=(mode == "curve"))
    try:
        c.start_redis()
        c.start_broker()
        to_clients, to_workers = relay(c.client_ep), relay(c.worker_ep)
        c.start_gen_worker("gen0", tiny_model, "--threads", "1", broker=to_workers.endpoint)
        env = {"ANVIL_BROKER": to_clients.endpoint}
        prompts = write_prompts(str(tmp_path / "p.jsonl"), 3)
        r = c.cli("submit", prompts, "--json", "--samples", "2", "--max-tokens", "8",
                  "--no-score", env=env)
        job = json.loads(r.stdout)["job_id"]
        c.wait_state(job)
        res = [json.loads(x) for x in c.cli("results", job, env=env).stdout.split("\n") if x]
        assert len(res) == 6
        for wire in (to_clients, to_workers):
            data = wire.captured()
            assert wire.connections >= 1 and len(data) > 1000, (mode, len(data))
            # ZMTP's greeting names the mechanism in clear: proof this is the real traffic
            assert (b"CURVE" if mode == "curve" else b"NULL") in data[:4096]
            if mode == "curve":
                assert MARKER.encode() not in data
                assert b"secret_marker" not in data and b"kernel_7f3a9c" not in data
                assert job.encode() not in data
            else:
                assert MARKER.encode() in data
    finally:
        c.close()


def test_known_keys_run_a_scored_job(curve_cluster, tiny_model, tmp_path):
    need("anvil-gen-worker", "anvil-exec-worker")
    c = curve_cluster
    prompts = str(tmp_path / "kb.jsonl")
    c.cli("import", "kernelbench", anvil_cluster.need_datasets("kernelbench"),
          "--level", "1", "--limit", "2", "--out", prompts)
    c.start_gen_worker("gen0", tiny_model, "--threads", "1")
    c.spawn("exec0", "anvil-exec-worker", ["--broker", c.worker_ep, "--device", "cpu",
                                           "--worker-id", "exec0"] + c.worker_curve_args())
    names = sorted(w["worker_id"] for w in c.wait_workers(2))
    assert names == ["exec0", "gen0"], names
    job = c.submit(prompts, "--samples", "2", "--max-tokens", "16", "--score")
    st = c.wait_state(job, timeout=240)
    assert st["generated"] == 4 and st["scored"] == 4, st
    assert all((r.get("score") or {}).get("status") for r in c.results(job))
    assert "curve: refused" not in c.log("broker")
    assert "curve on: broker public key '%s'" % public_key(c.key("broker.key")) in c.log("broker")


# -- unknown keys and no keys are refused ----------------------------------------------------

def test_unknown_key_is_refused_and_logged(curve_cluster, tiny_model):
    need("anvil-gen-worker")
    c = curve_cluster
    c.cli("keys", "gen", "--out", c.keys, "--name", "rogue")
    rogue = public_key(c.key("rogue.key"))
    # a client
    r = c.cli("workers", "--timeout", "5", check=False,
              env={"ANVIL_CURVE_SECRET": c.key("rogue.key_secret")})
    assert r.returncode == 5, (r.returncode, r.stderr)
    assert "refused this client's CURVE key '%s'" % rogue in r.stderr
    wait_log(c, "broker", "curve: refused client connection from 127.0.0.1: public key '%s' is "
             "not in the allow-list '%s'" % (rogue, c.key("allow")))
    # a worker: refused, says so, never registered; the allowed one is
    c.spawn("bad0", "anvil-gen-worker", ["--broker", c.worker_ep, "--model", tiny_model,
                                         "--worker-id", "bad0", "--threads", "1"]
            + c.worker_curve_args("rogue"))
    c.start_gen_worker("gen0", tiny_model, "--threads", "1")
    wait_log(c, "broker", "curve: refused worker connection from 127.0.0.1: public key '%s'"
             % rogue)
    wait_log(c, "bad0", "refused this worker's CURVE key '%s'" % rogue)
    c.wait_workers(1)
    time.sleep(2)
    ws = json.loads(c.cli("workers", "--json").stdout)
    ws = ws["workers"] if isinstance(ws, dict) else ws
    assert [w["worker_id"] for w in ws] == ["gen0"], ws
    assert c.procs["bad0"].poll() is None  # it keeps trying; nothing crashed
    assert c.procs["broker"].poll() is None
    # /metrics counts the verdicts: refusals of the rogue client and worker, the allowed
    # connections of the real ones, and the allow-list's size
    m = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % c.metrics_port, timeout=10)
    m = dict(line.rsplit(" ", 1) for line in m.read().decode().splitlines()
             if line and not line.startswith("#"))
    assert m["anvil_curve_enabled"] == "1"
    assert float(m['anvil_curve_handshakes_total{verdict="refused"}']) >= 2
    assert float(m['anvil_curve_handshakes_total{verdict="allowed"}']) >= 2
    assert float(m["anvil_curve_allowed_keys"]) == len(
        [f for f in os.listdir(c.key("allow")) if not f.startswith(".")])


def test_client_without_keys_gets_nothing(curve_cluster, anvil_client):
    c = curve_cluster
    r = c.cli("workers", "--timeout", "2", check=False,
              env={"ANVIL_CURVE_SECRET": "", "ANVIL_CURVE_SERVER": ""})
    assert r.returncode == 4, (r.returncode, r.stderr)
    assert "no reply from the broker" in r.stderr
    # a raw plaintext DEALER: a valid WORKERS request is never answered; the same request from
    # a socket with the client key is (the control)
    pb = anvil_client.pb
    env = pb.Envelope(version=anvil_client._proto.PROTOCOL_VERSION, request_id=7)
    env.workers.CopyFrom(pb.WorkersRequest())
    ctx = zmq.Context()
    try:
        plain = ctx.socket(zmq.DEALER)
        plain.linger = 0
        plain.connect(c.client_ep)
        plain.send(env.SerializeToString())
        assert plain.poll(2000) == 0
        keyed = ctx.socket(zmq.DEALER)
        keyed.linger = 0
        pub, sec = zmq.auth.load_certificate(c.key("client.key_secret"))
        keyed.curve_publickey, keyed.curve_secretkey = pub, sec
        keyed.curve_serverkey = zmq.auth.load_certificate(c.key("broker.key"))[0]
        keyed.connect(c.client_ep)
        keyed.send(env.SerializeToString())
        assert keyed.poll(5000) != 0
        rep = pb.Envelope.FromString(keyed.recv())
        assert rep.request_id == 7 and rep.WhichOneof("body") == "workers_reply"
    finally:
        ctx.destroy(0)


def test_python_client_with_and_without_keys(curve_cluster, anvil_client):
    c = curve_cluster

    async def workers(**kw):
        async with anvil_client.AnvilClient(c.client_ep, timeout_s=3, **kw) as cl:
            return await cl.workers()

    assert asyncio.run(workers(curve_secret=c.key("client.key_secret"),
                               curve_server=c.key("broker.key"))) == []
    with pytest.raises(anvil_client.AnvilError):
        asyncio.run(workers())
    c.cli("keys", "gen", "--out", c.keys, "--name", "py-rogue")
    with pytest.raises(anvil_client.AnvilError):
        asyncio.run(workers(curve_secret=c.key("py-rogue.key_secret"),
                            curve_server=c.key("broker.key")))
    wait_log(c, "broker", "public key '%s' is not in" % public_key(c.key("py-rogue.key")))
    with pytest.raises(anvil_client.AnvilError, match="holds no secret key"):
        asyncio.run(workers(curve_secret=c.key("allow/client.key"),
                            curve_server=c.key("broker.key")))


# -- binding beyond loopback -----------------------------------------------------------------

def test_non_loopback_bind_needs_keys_or_insecure(tmp_path):
    need("anvil", "anvil-broker")
    c = anvil_cluster.Cluster(str(tmp_path / "c"))
    try:
        c.start_redis()
        port = anvil_cluster.free_port()
        c.client_ep = "tcp://0.0.0.0:%d" % port
        p = c.start_broker()
        assert p.wait(15) != 0
        assert ("refusing to bind 'tcp://0.0.0.0:%d' without CURVE keys" % port) in c.log("broker")
        # --insecure: it starts, warns, and serves
        c.broker_args = ["--insecure"]
        c.start_broker()
        wait_log(c, "broker", "broker running")
        assert "--insecure: 'tcp://0.0.0.0:%d' serves plaintext" % port in c.log("broker")
        r = c.cli("workers", env={"ANVIL_BROKER": "tcp://127.0.0.1:%d" % port})
        assert "no workers" in r.stdout
        c.stop("broker")
        # keys: no --insecure needed; half a key configuration is refused
        c.keys = str(tmp_path / "keys")
        c.cli("keys", "gen", "--out", c.keys, "--all")
        c.broker_args = ["--curve-secret", c.key("broker.key_secret")]
        assert c.start_broker().wait(15) != 0
        assert "--curve-secret needs --curve-allow" in c.log("broker")
        c.broker_args += ["--curve-allow", c.key("allow")]
        c.start_broker()
        wait_log(c, "broker", "client socket bound to 'tcp://0.0.0.0:%d' (curve)" % port)
        r = c.cli("workers", env={"ANVIL_BROKER": "tcp://127.0.0.1:%d" % port})
        assert "no workers" in r.stdout
    finally:
        c.close()


# -- anvil up --curve ------------------------------------------------------------------------

def test_up_curve_cluster(tmp_path, tiny_model):
    need("anvil", "anvil-broker", "anvil-gen-worker")
    data = str(tmp_path / "data")
    anvil = anvil_cluster.binary("anvil")
    env = dict(os.environ)
    for k in ("ANVIL_BROKER", "ANVIL_CURVE_SECRET", "ANVIL_CURVE_SERVER"):
        env.pop(k, None)

    def run(*args, **kw):
        return subprocess.run([anvil] + list(args), capture_output=True, text=True, env=env,
                              timeout=120, **kw)

    cep = "tcp://127.0.0.1:%d" % anvil_cluster.free_port()
    wep = "tcp://127.0.0.1:%d" % anvil_cluster.free_port()
    r = run("up", "--curve", "--no-workers", "--data", data, "--client-endpoint", cep,
            "--worker-endpoint", wep, "--json")
    assert r.returncode == 0, r.stderr
    try:
        keys = os.path.join(data, "keys")
        state = json.load(open(os.path.join(data, "run", "cluster.json")))
        assert state["curve_secret"] == os.path.join(keys, "client.key_secret")
        # commands find the cluster's keys themselves
        r = run("workers", "--data", data)
        assert r.returncode == 0 and "no workers" in r.stdout, r.stderr
        # plaintext to it gets nothing
        r = run("workers", "--broker", cep, "--timeout", "2")
        assert r.returncode == 4, r.stderr
        # a worker with the cluster's worker key joins
        log = open(str(tmp_path / "gen.log"), "wb")
        w = subprocess.Popen([anvil_cluster.binary("anvil-gen-worker"), "--broker", wep,
                              "--model", tiny_model, "--threads", "1", "--worker-id", "g1",
                              "--curve-secret", os.path.join(keys, "worker.key_secret"),
                              "--curve-server", os.path.join(keys, "broker.key")],
                             stdout=log, stderr=log, env=env)
        try:
            deadline = time.time() + 60
            while time.time() < deadline:
                r = run("workers", "--data", data, "--json")
                if r.returncode == 0 and "g1" in r.stdout:
                    break
                time.sleep(0.3)
            assert "g1" in r.stdout, r.stdout + r.stderr
        finally:
            w.send_signal(signal.SIGKILL)
            w.wait()
        # a second up reuses the keys
        before = public_key(os.path.join(keys, "broker.key"))
    finally:
        r = run("down", "--data", data)
        assert r.returncode == 0, r.stderr
    r = run("up", "--curve", "--no-workers", "--data", data, "--client-endpoint", cep,
            "--worker-endpoint", wep)
    try:
        assert r.returncode == 0, r.stderr
        assert public_key(os.path.join(keys, "broker.key")) == before
    finally:
        run("down", "--data", data)

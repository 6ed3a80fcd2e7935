"""test_k8s.py - the Kubernetes manifests (deploy/k8s/*.yaml).

- Every resource validates (strict: unknown fields are errors) against the Kubernetes schemas of
  kubernetes-validate, for the oldest version the manifests target (1.33: user namespaces on by
  default, needed by the exec worker) and the newest the validator knows.
- Every flag a container passes to an Anvil binary exists in that binary's --help (the real
  binaries under $ANVIL_BUILD_DIR), so a renamed or misspelt flag fails here, not in a pod.
  The CURVE flags are checked as soon as the binaries have CURVE support; until then that check
  skips, naming them.
- What the pods rely on holds: terminationGracePeriodSeconds covers the worker's drain, the
  readiness probe tests the --ready-file the worker writes, GPUs are requested, Redis keeps its
  AOF on the claimed volume.
"""
import copy
import glob
import os
import re
import subprocess
import sys

import pytest
import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import anvil_cluster  # noqa: E402

K8S = os.path.join(anvil_cluster.REPO, "deploy", "k8s")
FILES = sorted(glob.glob(os.path.join(K8S, "*.yaml")))
VERSIONS = ["1.33.0", "latest"]
CURVE_FLAGS = {"curve-secret", "curve-server", "curve-allow", "insecure"}
BIN_PREFIX = "/opt/anvil/bin/"


def resources(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def all_resources():
    return [(os.path.basename(p), r) for p in FILES for r in resources(p)]


def by_kind_name(kind, name):
    for _, r in all_resources():
        if r["kind"] == kind and r["metadata"]["name"] == name:
            return r
    raise AssertionError("no %s %s in deploy/k8s" % (kind, name))


def pod_spec(r):
    return r["spec"]["template"]["spec"]


def containers(r):
    if r["kind"] not in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
        return []
    spec = pod_spec(r)
    return spec.get("initContainers", []) + spec["containers"]


def invocation(c):
    """(binary name, [flag names]) of a container that runs an Anvil binary, else None.
    Handles `command: [/opt/anvil/bin/X]` and `command: [/bin/sh, -c, "... exec /opt/anvil/bin/X
    --flag ... \"$@\"", NAME]` (flags in the script and in args)."""
    cmd = list(c.get("command", []))
    args = [str(a) for a in c.get("args", [])]
    words = []
    if cmd and cmd[0].startswith(BIN_PREFIX):
        name = cmd[0][len(BIN_PREFIX):]
        words = cmd[1:] + args
    elif len(cmd) >= 3 and cmd[1] == "-c":
        m = re.search(re.escape(BIN_PREFIX) + r"([\w-]+)((?:\s+\S+)*)", cmd[2])
        if not m:
            return None
        name = m.group(1)
        words = m.group(2).split() + args
    else:
        return None
    if name not in anvil_cluster.BINARIES:  # redis-server: configured by its file
        return None
    flags = [w[2:].split("=", 1)[0] for w in words if w.startswith("--")]
    return name, flags


_HELP = {}


def help_flags(name):
    """Flag names in the real binary's --help, or None when it is not built."""
    if name not in _HELP:
        path = anvil_cluster.binary(name) if name in anvil_cluster.BINARIES else None
        if path is None:
            _HELP[name] = None
        else:
            r = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=30)
            _HELP[name] = set(re.findall(r"^\s+--([a-z0-9][a-z0-9-]*)", r.stdout + r.stderr, re.M))
    return _HELP[name]


def flag_problems(docs):
    """[(file, container, binary, flag)] for every flag that the binary's --help does not list.
    Boolean flags may be negated (--no-NAME)."""
    problems = []
    for fname, r in docs:
        for c in containers(r):
            inv = invocation(c)
            if inv is None:
                continue
            name, flags = inv
            known = help_flags(name)
            if known is None:
                pytest.skip("%s is not built under %s" % (name, anvil_cluster.BUILD))
            for f in flags:
                if f not in known and not (f.startswith("no-") and f[3:] in known):
                    problems.append((fname, c["name"], name, f))
    return problems


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", FILES, ids=os.path.basename)
def test_manifest_validates(path, version):
    kv = pytest.importorskip("kubernetes_validate",
                             reason="kubernetes-validate is not installed (deploy/requirements.txt)")
    if version == "latest":
        version = kv.latest_version()
    docs = resources(path)
    assert docs, path
    for r in docs:
        kv.validate(r, version, strict=True)


def test_validator_rejects_a_bad_manifest():
    kv = pytest.importorskip("kubernetes_validate",
                             reason="kubernetes-validate is not installed (deploy/requirements.txt)")
    r = copy.deepcopy(by_kind_name("Deployment", "anvil-gen-worker"))
    pod_spec(r)["terminationGracePeriod"] = 135  # misspelt field
    with pytest.raises(kv.ValidationError):
        kv.validate(r, VERSIONS[0], strict=True)
    r = copy.deepcopy(by_kind_name("Deployment", "anvil-gen-worker"))
    pod_spec(r)["containers"][0]["resources"]["limits"] = "one gpu"  # wrong type
    with pytest.raises(kv.ValidationError):
        kv.validate(r, VERSIONS[0], strict=True)


def test_every_container_runs_an_anvil_binary():
    seen = set()
    for _, r in all_resources():
        for c in containers(r):
            cmd = c.get("command", [])
            inv = invocation(c)
            if inv is None:
                assert cmd and cmd[0] == BIN_PREFIX + "redis-server", c
            else:
                seen.add(inv[0])
    assert seen == {"anvil-broker", "anvil-gen-worker", "anvil-exec-worker"}, seen


def test_manifest_flags_exist():
    problems = [p for p in flag_problems(all_resources()) if p[3] not in CURVE_FLAGS]
    assert not problems, "flags the binaries do not have: %s" % problems


def test_manifest_curve_flags_exist():
    problems = flag_problems(all_resources())
    pending = [p for p in problems if p[3] in CURVE_FLAGS]
    for _, _, name, _ in pending:
        if not any(f.startswith("curve-") for f in help_flags(name)):
            pytest.skip("%s has no CURVE flags yet; the manifests use %s"
                        % (name, sorted({p[3] for p in pending if p[2] == name})))
    assert not pending, "CURVE flags the binaries do not have: %s" % pending


def test_flag_check_catches_a_bad_flag():
    r = copy.deepcopy(by_kind_name("Deployment", "anvil-gen-worker"))
    pod_spec(r)["containers"][0]["args"].append("--grace-seconds=120")
    r2 = copy.deepcopy(by_kind_name("Deployment", "anvil-exec-worker"))
    c = pod_spec(r2)["containers"][0]
    c["command"][2] = c["command"][2].replace("--gpu=", "--gpu-index=")
    problems = flag_problems([("gen", r), ("exec", r2)])
    assert ("gen", "worker", "anvil-gen-worker", "grace-seconds") in problems, problems
    assert ("exec", "worker", "anvil-exec-worker", "gpu-index") in problems, problems


def arg(c, name):
    for a in c.get("args", []):
        if a.startswith("--" + name + "="):
            return a.split("=", 1)[1]
    raise AssertionError("no --%s in %s" % (name, c["name"]))


@pytest.mark.parametrize("name", ["anvil-gen-worker", "anvil-exec-worker"])
def test_worker_pods_drain_and_report_ready(name):
    r = by_kind_name("Deployment", name)
    spec = pod_spec(r)
    c = spec["containers"][0]
    if name == "anvil-gen-worker":
        drain_s = int(arg(c, "grace-ms")) / 1000.0
    else:  # the unit in progress finishes: load + first call, then trials and timing
        drain_s = int(arg(c, "compile-timeout")) + int(arg(c, "run-timeout"))
    grace = spec["terminationGracePeriodSeconds"]
    assert drain_s + 10 <= grace <= drain_s + 60, (drain_s, grace)
    pre = " ".join(c["lifecycle"]["preStop"]["exec"]["command"])
    assert "kill -TERM 1" in pre, pre
    ready = arg(c, "ready-file")
    probe = " ".join(c["readinessProbe"]["exec"]["command"])
    assert ready in probe, (ready, probe)
    assert any(ready.startswith(m["mountPath"] + "/") for m in c["volumeMounts"]), ready
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert arg(c, "broker") == "tcp://anvil-broker:5556"
    keys = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    for flag in ("curve-secret", "curve-server"):
        assert os.path.dirname(arg(c, flag)) in keys, flag


def test_broker_and_redis_wiring():
    broker = by_kind_name("Deployment", "anvil-broker")
    c = pod_spec(broker)["containers"][0]
    svc = by_kind_name("Service", "anvil-broker")
    ports = {p["name"]: p["port"] for p in svc["spec"]["ports"]}
    assert arg(c, "client-endpoint").endswith(":%d" % ports["clients"])
    assert arg(c, "worker-endpoint").endswith(":%d" % ports["workers"])
    assert arg(c, "metrics-endpoint").endswith(":%d" % ports["metrics"])
    assert arg(c, "redis-url") == "redis://anvil-redis-0.anvil-redis:6379"
    assert broker["spec"]["replicas"] == 1 and broker["spec"]["strategy"]["type"] == "Recreate"
    # the secret key in one mount, the allow-list of public keys in another
    vols = {v["name"]: v for v in pod_spec(broker)["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    secret_items = vols[mounts[os.path.dirname(arg(c, "curve-secret"))]]["secret"]["items"]
    assert [i["key"] for i in secret_items] == ["broker.key_secret"]
    allow = vols[mounts[arg(c, "curve-allow")]]["secret"]["items"]
    assert all(not i["key"].endswith("_secret") for i in allow), allow

    sts = by_kind_name("StatefulSet", "anvil-redis")
    conf = by_kind_name("ConfigMap", "anvil-redis-config")["data"]["redis.conf"]
    settings = dict(line.split(None, 1) for line in conf.splitlines() if line.strip())
    assert settings["appendonly"] == "yes" and settings["maxmemory-policy"] == "noeviction"
    rc = pod_spec(sts)["containers"][0]
    claims = {t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]}
    data_mount = [m for m in rc["volumeMounts"] if m["mountPath"] == settings["dir"]]
    assert data_mount and data_mount[0]["name"] in claims, (settings["dir"], rc["volumeMounts"])


def test_make_secret(tmp_path):
    anvil = anvil_cluster.binary("anvil")
    if anvil is None:
        pytest.skip("anvil is not built")
    r = subprocess.run([anvil, "keys", "gen", "--help"], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip("anvil has no `keys gen` yet (CURVE)")
    out = tmp_path / "keys"
    r = subprocess.run([os.path.join(K8S, "make-secret.sh"), str(out), anvil],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    secret = resources(str(out / "anvil-curve.secret.yaml"))[0]
    needed = set()
    for _, res in all_resources():
        for v in pod_spec(res).get("volumes", []) if res["kind"] == "Deployment" else []:
            if "secret" in v and v["secret"]["secretName"] == "anvil-curve":
                needed |= {i["key"] for i in v["secret"]["items"]}
    assert needed == set(secret["data"]), (needed, sorted(secret["data"]))
    assert "client.key_secret" not in secret["data"]
    kv = pytest.importorskip("kubernetes_validate")
    kv.validate(secret, VERSIONS[0], strict=True)

"""conftest.py - fixtures for the deploy tests.

`bundle`: deploy/bundle.sh run once per session on the build tree, its tarball unpacked into
another directory (the bundle must be relocatable); the path of the unpacked bundle. Skips when
the binaries are not built.
"""
import os
import subprocess
import sys
import tarfile

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import anvil_cluster  # noqa: E402


@pytest.fixture(scope="session")
def bundle(tmp_path_factory):
    for b in ("anvil", "anvil-broker", "anvil-gen-worker"):
        if anvil_cluster.binary(b) is None:
            pytest.skip("%s is not built under %s" % (b, anvil_cluster.BUILD))
    work = tmp_path_factory.mktemp("bundle")
    tgz = str(work / "anvil.tar.gz")
    r = subprocess.run([os.path.join(anvil_cluster.REPO, "deploy", "bundle.sh"), "--build-dir",
                        anvil_cluster.BUILD, "--dir", str(work / "staging" / "anvil"),
                        "--out", tgz], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    dest = work / "installed"
    with tarfile.open(tgz) as t:
        t.extractall(dest)
    subprocess.run(["rm", "-rf", str(work / "staging")], check=True)
    return str(dest / "anvil")

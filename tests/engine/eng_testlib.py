"""Helpers of the engine tests: where the build is, and running anvil-generate."""
import json
import os
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
BUILD = os.environ.get("ANVIL_BUILD_DIR", os.path.join(REPO, "build"))
SHARED = os.environ.get("ANVIL_SHARED_DIR", os.path.join(REPO, "..", "shared"))



def run_generate(binary, *args, check=True, input=None):
    p = subprocess.run([binary, *map(str, args)], capture_output=True, text=True, input=input,
                       timeout=600)
    if check and p.returncode != 0:
        raise AssertionError(f"anvil-generate {args} failed ({p.returncode}): {p.stderr}")
    return p


def samples(binary, *args):
    """Runs anvil-generate --json and returns its sample lines keyed by (id, index)."""
    p = run_generate(binary, *args, "--json")
    out = {}
    for line in p.stdout.rstrip("\n").split("\n") if p.stdout.strip() else []:
        s = json.loads(line)
        out[(s["id"], s["index"])] = s
    return out

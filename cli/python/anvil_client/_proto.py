"""_proto.py - the protobuf classes of proto/anvil.proto for the client.

An installed package carries `anvil_pb2.py`, generated from proto/anvil.proto when the package
is built (setup.py runs the protoc of grpcio-tools); nothing generated is committed. Run from
a source checkout instead (tests, examples), the module is generated on first import into a
cache directory keyed by the proto's content hash, with the same protoc. Either way the proto
of the checkout is the one contract: a stale copy cannot be picked up.
"""
import hashlib
import importlib.util
import os
import shutil
import sys

PROTOCOL_VERSION = 1  # ANVIL_PROTOCOL_VERSION (common/anv_msg.h)


def _source_proto():
    here = os.path.dirname(os.path.abspath(__file__))
    for p in (os.environ.get("ANVIL_PROTO"),
              os.path.join(here, "..", "..", "..", "proto", "anvil.proto")):
        if p and os.path.isfile(p):
            return os.path.abspath(p)
    return None


def generate(proto, out_dir):
    """Runs grpcio-tools' protoc on `proto`, writing anvil_pb2.py into out_dir."""
    try:
        from grpc_tools import protoc
    except ImportError as e:
        raise ImportError("anvil_client needs its generated anvil_pb2 module: install the "
                          "package (pip install ./cli/python) or install grpcio-tools to "
                          "generate it from %s" % proto) from e
    os.makedirs(out_dir, exist_ok=True)
    inc = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    rc = protoc.main(["protoc", "-I" + os.path.dirname(proto), "-I" + inc,
                      "--python_out=" + out_dir, proto])
    if rc != 0:
        raise RuntimeError("protoc failed (%d) on %s" % (rc, proto))
    return os.path.join(out_dir, "anvil_pb2.py")


def _load():
    try:
        from . import anvil_pb2  # built into an installed package
        return anvil_pb2
    except ImportError:
        pass
    proto = _source_proto()
    if proto is None:
        raise ImportError("anvil_client: neither a generated anvil_pb2 nor proto/anvil.proto "
                          "was found (set ANVIL_PROTO to the proto's path)")
    digest = hashlib.sha256(open(proto, "rb").read()).hexdigest()[:16]
    cache = os.path.join(os.environ.get("XDG_CACHE_HOME") or
                         os.path.join(os.path.expanduser("~"), ".cache"),
                         "anvil_client", digest)
    path = os.path.join(cache, "anvil_pb2.py")
    if not os.path.isfile(path):
        tmp = cache + ".%d" % os.getpid()
        generate(proto, tmp)
        try:
            os.replace(tmp, cache)
        except OSError:  # another process generated it first
            shutil.rmtree(tmp, ignore_errors=True)
    spec = importlib.util.spec_from_file_location("anvil_client.anvil_pb2", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["anvil_client.anvil_pb2"] = mod
    spec.loader.exec_module(mod)
    return mod


pb = _load()

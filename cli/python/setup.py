"""setup.py - builds anvil-client, generating anvil_pb2.py from the repository's proto.

The wire contract is proto/anvil.proto at the repository's top level (two levels up from
here), or the file $ANVIL_PROTO names. build_py runs grpcio-tools' protoc on it and writes the
module into the build tree, so every install carries code generated from the proto it was
built against and nothing generated is committed. Build from the repository
(`pip install ./cli/python`), where the proto is.
"""
import os

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


def find_proto():
    for p in (os.environ.get("ANVIL_PROTO"),
              os.path.join(HERE, "..", "..", "proto", "anvil.proto")):
        if p and os.path.isfile(p):
            return os.path.abspath(p)
    raise SystemExit("anvil-client: proto/anvil.proto not found (build from the Anvil "
                     "repository, or set ANVIL_PROTO)")


class BuildWithProto(build_py):
    def run(self):
        super().run()
        from grpc_tools import protoc
        proto = find_proto()
        out = os.path.join(self.build_lib, "anvil_client")
        os.makedirs(out, exist_ok=True)
        inc = os.path.join(os.path.dirname(protoc.__file__), "_proto")
        rc = protoc.main(["protoc", "-I" + os.path.dirname(proto), "-I" + inc,
                          "--python_out=" + out, proto])
        if rc != 0:
            raise SystemExit("protoc failed (%d) on %s" % (rc, proto))


setup(cmdclass={"build_py": BuildWithProto})

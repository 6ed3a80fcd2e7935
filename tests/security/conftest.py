"""conftest.py - fixtures of the security tests (tests/security).

`anvil_client` is tests/rl's fixture (the client package as pip installs it), loaded from
there rather than written twice. `relay()` makes a TCP relay that records every byte it
forwards, so a test can look at what a real process put on the wire.
"""
import importlib.util
import os
import socket
import threading

import pytest

_rl = importlib.util.spec_from_file_location(
    "anvil_rl_conftest", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                      "rl", "conftest.py"))
_rl_mod = importlib.util.module_from_spec(_rl)
_rl.loader.exec_module(_rl_mod)
anvil_client = _rl_mod.anvil_client


class Relay:
    """Listens on a free loopback port and forwards each connection to `target` (host, port),
    recording both directions. `endpoint` is the tcp:// address to give the peer."""

    def __init__(self, target):
        self.target = target
        self.lock = threading.Lock()
        self.data = bytearray()
        self.connections = 0
        self.srv = socket.socket()
        self.srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(16)
        self.endpoint = "tcp://127.0.0.1:%d" % self.srv.getsockname()[1]
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.closed:
            try:
                a, _ = self.srv.accept()
            except OSError:
                return
            try:
                b = socket.create_connection(self.target)
            except OSError:
                a.close()
                continue
            with self.lock:
                self.connections += 1
            for src, dst in ((a, b), (b, a)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src, dst):
        try:
            while True:
                buf = src.recv(65536)
                if not buf:
                    break
                with self.lock:
                    self.data += buf
                dst.sendall(buf)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def captured(self):
        with self.lock:
            return bytes(self.data)

    def close(self):
        self.closed = True
        self.srv.close()


@pytest.fixture
def relay():
    made = []

    def make(endpoint):
        host, port = endpoint.rsplit("//", 1)[1].rsplit(":", 1)
        r = Relay((host, int(port)))
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()

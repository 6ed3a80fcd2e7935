"""anvil_redis.py - what the Python tests need to read Redis themselves, beside the broker.

`Redis(port)` is a minimal RESP2 client (one connection, one command at a time, replies as
str / int / list / None, an error reply raised as RuntimeError), enough for checkers that read
the broker's keys (HGETALL, XRANGE, INFO ...) without a Python redis package.
`free_low_port(taken)` gives a free loopback port below the kernel's ephemeral range, so that
no outgoing connection can take it while the server that listens on it is down (tests that
restart Redis or the broker on the same port).
"""
import random
import socket


class Redis:
    def __init__(self, port, timeout=10.0):
        self.port, self.timeout, self.sock, self.buf = port, timeout, None, b""

    def close(self):
        if self.sock:
            self.sock.close()
        self.sock, self.buf = None, b""

    def _line(self):
        while b"\r\n" not in self.buf:
            d = self.sock.recv(1 << 16)
            if not d:
                raise ConnectionError("redis closed the connection")
            self.buf += d
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _exact(self, n):
        while len(self.buf) < n + 2:
            d = self.sock.recv(1 << 16)
            if not d:
                raise ConnectionError("redis closed the connection")
            self.buf += d
        out, self.buf = self.buf[:n], self.buf[n + 2:]
        return out

    def _reply(self):
        line = self._line()
        t, rest = line[:1], line[1:]
        if t == b"+":
            return rest.decode()
        if t == b"-":
            raise RuntimeError("redis: " + rest.decode())
        if t == b":":
            return int(rest)
        if t == b"$":
            n = int(rest)
            return None if n < 0 else self._exact(n).decode("utf-8", "replace")
        if t == b"*":
            n = int(rest)
            return None if n < 0 else [self._reply() for _ in range(n)]
        raise RuntimeError("redis: bad reply %r" % line[:40])

    def __call__(self, *args):
        if self.sock is None:
            self.sock = socket.create_connection(("127.0.0.1", self.port), self.timeout)
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            b = a if isinstance(a, bytes) else str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(b), b))
        try:
            self.sock.sendall(b"".join(out))
            return self._reply()
        except (OSError, ConnectionError):
            self.close()
            raise


def free_low_port(taken):
    """A free loopback port below the kernel's ephemeral range: no outgoing connection can take
    it while the process that listens on it is down (the broker and Redis restart on theirs)."""
    try:
        lo = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    except (OSError, ValueError):
        lo = 32768
    while True:
        p = random.SystemRandom().randrange(10000, lo)
        if p in taken:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p))
            except OSError:
                continue
        taken.add(p)
        return p

"""connection.py - one asyncio conversation with the broker's client ROUTER.

A DEALER socket (pyzmq's asyncio flavour) carries one Envelope per frame. Every request gets a
fresh request_id and a future; one receiver task hands each reply to the future whose id it
echoes, so long polls (WATCH with block_ms) and other requests run side by side on one socket.
A reply with an unknown id (its request timed out) is counted and dropped. ZeroMQ connects in
the background, so an unreachable broker shows only as a timeout, and the error says so.
ErrorReply becomes AnvilError carrying the broker's ANV_E* code.
With CURVE keys (zcert files from `anvil keys gen`: the own NAME.key_secret and the broker's
NAME.key, or ANVIL_CURVE_SECRET / ANVIL_CURVE_SERVER) the DEALER is a CURVE client, as the
`anvil` CLI's is.
"""
import asyncio
import os
import random

import zmq
import zmq.asyncio
import zmq.auth

from ._proto import PROTOCOL_VERSION, pb

# ANV_E* codes (common/anv_error.h) the client reacts to
ANV_ENOTFOUND = -10007
ANV_ESTATE = -10011


class AnvilError(Exception):
    """The broker answered with an ErrorReply, or the conversation failed."""

    def __init__(self, message, code=None):
        super().__init__(message if code is None else "%s (code %d)" % (message, code))
        self.code = code


def load_curve_keys(secret_file, server_file):
    """(own public, own secret, server public) Z85 keys from zcert files, checked as the C side
    checks them (common/anv_curve.c): 40-character keys, a pair that belongs together."""
    if secret_file.endswith(".key") and os.path.exists(secret_file + "_secret"):
        secret_file += "_secret"
    try:
        public, secret = zmq.auth.load_certificate(secret_file)
        server, _ = zmq.auth.load_certificate(server_file)
    except (OSError, ValueError) as e:
        raise AnvilError("cannot load CURVE keys: %s" % e) from None
    if not secret or len(secret) != 40:
        raise AnvilError("key file '%s' holds no secret key (give the NAME.key_secret file "
                         "made by `anvil keys gen`)" % secret_file)
    if len(public) != 40 or len(server) != 40 or zmq.curve_public(secret) != public:
        raise AnvilError("key files '%s' / '%s' are not valid zcert keys"
                         % (secret_file, server_file))
    return public, secret, server


class Connection:
    """A DEALER on the broker's client endpoint. Use from one event loop."""

    def __init__(self, endpoint, timeout_s=30.0, curve_secret=None, curve_server=None):
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        curve_secret = curve_secret or os.environ.get("ANVIL_CURVE_SECRET") or None
        curve_server = curve_server or os.environ.get("ANVIL_CURVE_SERVER") or None
        if bool(curve_secret) != bool(curve_server):
            raise AnvilError("CURVE needs both curve_secret (own key) and curve_server (the "
                             "broker's public key)")
        keys = load_curve_keys(curve_secret, curve_server) if curve_secret else None
        self._ctx = zmq.asyncio.Context.instance()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.RCVHWM, 0)
        if keys:
            s = self._sock
            s.curve_publickey, s.curve_secretkey, s.curve_serverkey = keys
        self._sock.connect(endpoint)
        # distinct per process and run, as the CLI does
        self._next_id = (random.getrandbits(40) ^ (os.getpid() << 40)) & ((1 << 63) - 1)
        self._pending = {}
        self._reader = None
        self.stray_replies = 0
        self.dropped = 0

    async def close(self):
        if self._reader:
            self._reader.cancel()
            try:
                await self._reader
            except (asyncio.CancelledError, Exception):
                pass
            self._reader = None
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(AnvilError("connection closed"))
        self._pending.clear()
        self._sock.close(0)

    async def _read(self):
        while True:
            frames = await self._sock.recv_multipart()
            if len(frames) != 1:
                self.dropped += 1
                continue
            env = pb.Envelope()
            try:
                env.ParseFromString(frames[0])
            except Exception:
                self.dropped += 1
                continue
            if env.version != PROTOCOL_VERSION:
                self.dropped += 1
                continue
            fut = self._pending.pop(env.request_id, None)
            if fut is None or fut.done():
                self.stray_replies += 1
                continue
            fut.set_result(env)

    async def request(self, field, msg, reply_field, timeout_s=None):
        """Sends `msg` as Envelope body `field`; returns the reply's `reply_field` message.
        Raises AnvilError on an ErrorReply, a wrong reply type or a timeout."""
        if self._reader is None or self._reader.done():
            self._reader = asyncio.ensure_future(self._read())
        self._next_id = (self._next_id + 1) & ((1 << 63) - 1)
        rid = self._next_id
        env = pb.Envelope(version=PROTOCOL_VERSION, request_id=rid)
        getattr(env, field).CopyFrom(msg)
        fut = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        await self._sock.send(env.SerializeToString())
        t = self.timeout_s if timeout_s is None else timeout_s
        try:
            rep = await asyncio.wait_for(fut, t)
        except asyncio.TimeoutError:
            self._pending.pop(rid, None)
            raise AnvilError("no reply from the broker at %s to '%s' within %.1f s (is it "
                             "running?)" % (self.endpoint, field, t)) from None
        body = rep.WhichOneof("body")
        if body == "error":
            raise AnvilError(rep.error.message, rep.error.code)
        if body != reply_field:
            raise AnvilError("broker answered '%s' with '%s'" % (field, body))
        return getattr(rep, body)

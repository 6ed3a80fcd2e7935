"""connection.py - one asyncio conversation with the broker's client ROUTER.

A DEALER socket (pyzmq's asyncio flavour) carries one Envelope per frame. Every request gets a
fresh request_id and a future; one receiver task hands each reply to the future whose id it
echoes, so long polls (WATCH with block_ms) and other requests run side by side on one socket.
A reply with an unknown id (its request timed out) is counted and dropped. ZeroMQ connects in
the background, so an unreachable broker shows only as a timeout, and the error says so.
ErrorReply becomes AnvilError carrying the broker's ANV_E* code.
"""
import asyncio
import os
import random

import zmq
import zmq.asyncio

from ._proto import PROTOCOL_VERSION, pb

# ANV_E* codes (common/anv_error.h) the client reacts to
ANV_ENOTFOUND = -10007
ANV_ESTATE = -10011


class AnvilError(Exception):
    """The broker answered with an ErrorReply, or the conversation failed."""

    def __init__(self, message, code=None):
        super().__init__(message if code is None else "%s (code %d)" % (message, code))
        self.code = code


class Connection:
    """A DEALER on the broker's client endpoint. Use from one event loop."""

    def __init__(self, endpoint, timeout_s=30.0):
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self._ctx = zmq.asyncio.Context.instance()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.RCVHWM, 0)
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

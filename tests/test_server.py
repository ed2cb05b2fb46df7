"""The worker's server (actorgraph/worker/_server.py) among strangers and departed
clients: what a connection that has not proved the token can make the worker hold, a
flood of idle and half-open connections at a low file limit, the memory a client that
left gives back, and a stop that is quiet. Real worker subprocesses on loopback.
"""

from __future__ import annotations

import trio
from _workers import GUARD
from actorgraph.devices.remote.frames import HEADER, FrameStream
from actorgraph.devices.remote.wire import HANDSHAKE_LIMITS, VERSION, Limits

from actorgraph.testing import Worker


async def _raw(port: int) -> FrameStream:
    sock = trio.socket.socket()
    await sock.connect(("127.0.0.1", port))
    return FrameStream(sock, Limits())


async def test_a_handshake_frame_over_its_small_limit_is_refused_unread(
    workers: tuple[Worker, Worker],
) -> None:
    # Before the token is proved a frame is a few hundred bytes: one that says it is
    # larger is refused at its header, so a stranger cannot make the worker hold it.
    worker, _ = workers
    with trio.fail_after(GUARD):
        for size in (HANDSHAKE_LIMITS.max_meta + 1, 64 << 10, Limits().max_meta):
            stream = await _raw(worker.port)
            meta, _ = await stream.receive()
            assert meta[0] == "challenge"
            await stream.send([HEADER.pack(b"AG", VERSION, size, 0)])
            with trio.fail_after(5):  # refused at once, not after the handshake's timeout
                meta, _ = await stream.receive()
            assert meta[0] == "error" and meta[1] == "frame", meta
            assert meta[-1] == (
                f"frame meta of {size} bytes is outside 1..{HANDSHAKE_LIMITS.max_meta}: "
                f"before it proves the token, a connection's frames are at most "
                f"{HANDSHAKE_LIMITS.max_meta} bytes (a handshake message); is this an "
                f"actorgraph client of this version?"
            )
            assert await stream.sock.recv(1) == b""  # and that connection is closed

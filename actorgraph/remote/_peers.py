"""Worker-to-worker links: the connections a worker opens to pull a copy's bytes.

A copy between two workers runs on the destination's worker, which reads the source
buffer over a "peer" connection with a read ticket the client put in the program
(see actorgraph/remote/__init__.py, "How order crosses hosts").
"""

from __future__ import annotations

import itertools
from typing import Any

import attrs
import trio

from actorgraph.devices import Job

from ._wire import (
    CHUNK,
    ConnectionLostError,
    FrameStream,
    Limits,
    WireError,
    encode,
)


class _PeerLink:
    """One connection from this worker to another, for worker-to-worker reads."""

    def __init__(self, stream: FrameStream) -> None:
        self.stream = stream
        self.lock = trio.Lock()
        self.ids = itertools.count(1)


class Peers:
    """This worker's links to other workers, for the copies it pulls."""

    def __init__(self, limits: Limits) -> None:
        # Data on a link we opened is what we asked for, checked against its destination
        # before it is read: accept the sender's chunks even where our --max-frame is lower.
        self.limits = attrs.evolve(limits, max_tail=max(CHUNK, limits.max_tail))
        self.links: dict[tuple[str, int], _PeerLink] = {}

    async def _link(self, host: str, port: int) -> _PeerLink:
        link = self.links.get((host, port))
        if link is None:
            family = trio.socket.AF_INET6 if ":" in host else trio.socket.AF_INET
            sock = trio.socket.socket(family, trio.socket.SOCK_STREAM)
            await sock.connect((host, port))
            sock.setsockopt(trio.socket.IPPROTO_TCP, trio.socket.TCP_NODELAY, 1)
            stream = FrameStream(sock, self.limits)
            meta, _ = await stream.receive()
            if meta[0] != "challenge":
                raise ConnectionLostError(f"peer {host}:{port} did not send a challenge")
            await stream.send([encode(["auth", "peer", b"", []])])
            link = self.links[(host, port)] = _PeerLink(stream)
        return link

    async def pull(
        self,
        job: Job,
        host: str,
        port: int,
        sid: int,
        ref: list[Any],
        ticket: bytes,
        dst: memoryview,
    ) -> None:
        if job.submission.error is not None:
            return
        try:
            link = await self._link(host, port)
            async with link.lock:
                req = next(link.ids)
                await link.stream.send([encode(["pread", req, sid, ref, ticket])])
                got = 0
                while got < len(dst) or got == 0:
                    meta, tail = await link.stream.receive()
                    if meta[0] == "error":
                        raise RuntimeError(f"peer {host}:{port} refused the read: {meta[-1]}")
                    if meta[0] != "data" or meta[1] != req or meta[2] + tail > len(dst):
                        raise WireError(f"peer {host}:{port} answered {meta[0]!r} out of turn")
                    await link.stream.receive_into(dst[meta[2] : meta[2] + tail])
                    got += tail
                    if len(dst) == 0:
                        break
        except (OSError, ConnectionLostError, WireError, trio.ClosedResourceError) as exc:
            self.links.pop((host, port), None)
            raise ConnectionError(
                f"worker-to-worker read from {host}:{port} failed: {exc}"
            ) from None

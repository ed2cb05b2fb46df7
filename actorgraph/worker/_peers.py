"""Worker-to-worker links: the connections a worker opens to read a copy's bytes.

A copy between two workers runs on the destination's worker, which reads the source
buffer over a "peer" connection with a read ticket the client put in the program (see
actorgraph/devices/remote/__init__.py, "How order crosses hosts"). A link to a worker is opened
once and kept; many reads share it, each answered under its own request id. A batch's
requests to one worker leave together, in one send, from the task that takes the batch.
A link is authenticated as a client is: the worker answers its peer's challenge with its
own token, and checks the peer's proof that it holds it too (`PeerRefusedError` names
the fix when they differ), and each read carries the ticket. A worker that speaks TLS
opens its links over TLS, checking the peer's certificate (`tls`).

Two kinds of read:
- "pread": the bytes now (the copy runs once its waits say the source is ready);
- "pwhen": the bytes as soon as the source's queue reaches a value, asked for when the
  batch arrives. The source worker sends them the moment its queue gets there, so the
  copy's dependency costs one message from worker to worker and none through the client.
  The bytes land in staging memory (the destination may still be in use) and the
  destination's mirror of the source queue rises as they arrive.
And "pwatch": be told (a "data" frame of no bytes) once the source's queue reaches a value.

A link that fails (refused, reset, closed) while a "pwhen" or "pwatch" waits says nothing
of the source's queue: the read's `lost` asks the client to relay the wait (it asks the
source's worker itself, over its own connection), and a copy whose bytes did not come
reads them when it runs, over a new link, or fails naming that link.
"""

from __future__ import annotations

import functools
import itertools
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

import attrs
import trio

from actorgraph.devices.remote.frames import ConnectionLostError, FrameStream, encode
from actorgraph.devices.remote.handshake import (
    HandshakeRefused,
    TokenRequired,
    WorkerUnproven,
    greet,
)
from actorgraph.devices.remote.tls import connect_tls, handshake_failure
from actorgraph.devices.remote.wire import (
    CHUNK,
    Data,
    Error,
    Limits,
    PRead,
    PWatch,
    PWhen,
    Ref,
    WireError,
    decode,
)

KEEPALIVE = (30, 10, 3)
LINK_TIMEOUT_S = 30  # to connect a link to another worker and pass its handshake

# What ends a link: its peer went away, broke the protocol, or its TLS broke.
_LINK_LOST = (
    OSError,
    ConnectionLostError,
    WireError,
    trio.ClosedResourceError,
    trio.BrokenResourceError,
)

# A read request, made once its id on the link is known.
Request = Callable[[int], PRead | PWhen | PWatch]  # idle seconds, seconds between probes, probes


def keep_alive(sock: Any) -> None:
    """Have the kernel probe a link that carries nothing: a peer whose host went away
    without a word (no reset) would leave a wait on it silent for ever. Unanswered
    probes fail the link about a minute later, and its waits are relayed."""
    sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_KEEPALIVE, 1)
    if hasattr(trio.socket, "TCP_KEEPIDLE"):  # Linux; elsewhere the system's defaults
        idle, interval, count = KEEPALIVE
        sock.setsockopt(trio.socket.IPPROTO_TCP, trio.socket.TCP_KEEPIDLE, idle)
        sock.setsockopt(trio.socket.IPPROTO_TCP, trio.socket.TCP_KEEPINTVL, interval)
        sock.setsockopt(trio.socket.IPPROTO_TCP, trio.socket.TCP_KEEPCNT, count)


class PeerRefusedError(ConnectionError):
    """A worker refused a link from this one (its token is not this one's), or a read."""


class PeerRead:
    """One read over a link: where its bytes land, and when they all have."""

    __slots__ = ("arrived", "done", "error", "left", "lost", "view")

    def __init__(
        self,
        view: memoryview,
        arrived: Callable[[], None] | None = None,
        lost: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.view = view
        self.left = len(view)
        self.done = trio.Event()
        self.error: BaseException | None = None
        self.arrived = arrived  # called once every byte is in, before `done` is set
        self.lost = lost  # called if it fails without saying the source got there

    def landed(self, nbytes: int) -> bool:
        """`nbytes` more of its bytes are in: whether that is all of them (it is then done,
        and `arrived` called)."""
        self.left -= nbytes
        if self.left > 0:
            return False
        # Done first: what `arrived` lets run may take the bytes at once.
        self.done.set()
        if self.arrived is not None:
            self.arrived()
        return True

    def fail(self, error: BaseException) -> None:
        if not self.done.is_set():
            self.error = error
            self.done.set()  # first: what the calls below let run may look at it
            # A refusal of a copy's bytes (of the link's token, or of the read) is for
            # good: what waits for them goes on to the copy, which fails with it. Any
            # other failure (a link refused, reset or closed; a watch refused) says
            # nothing of the source's queue, so nothing here may rise: `lost` has the
            # client relay the wait instead, asking the source's worker itself.
            if self.arrived is not None and isinstance(error, PeerRefusedError) and self.left:
                self.arrived()
            elif self.lost is not None:
                self.lost(error)


class _PeerLink:
    """One kept connection from this worker to another. Requests go out from the task
    that makes them, at once when the socket takes them (those a batch makes together in
    one send), the rest by a writer task; a reader task hands each answer to its read.

    Invariants: `pending` holds requests not yet sent, in order; it is empty unless the
    link is held by a batch or `writing` (a writer task will send it)."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.stream: FrameStream | None = None
        self.opened = trio.Event()
        self.error: BaseException | None = None
        self.ids = itertools.count(1)
        self.reads: dict[int, PeerRead] = {}
        self.pending: list[bytes | memoryview] = []
        self.writing = False

    def connected(self, stream: FrameStream) -> None:
        """Its connection is made: requests and answers go over `stream`."""
        self.stream = stream

    def ask(self, read: PeerRead, request: Request) -> bool:
        """Register `read` and queue its request (made with the read's id); whether it is
        the first request waiting to go."""
        req = next(self.ids)
        self.reads[req] = read
        self.pending.append(encode(request(req)))
        return len(self.pending) == 1

    def send_now(self) -> bool:
        """Send the requests waiting from this task, as far as the socket takes them now
        (over TLS, none); whether some are left for a writer task (`write`), which the
        caller starts. Raises OSError where the socket fails."""
        if self.writing or not self.pending:
            return False
        stream = self.stream
        assert stream is not None  # an open link
        data = self.pending[0] if len(self.pending) == 1 else b"".join(self.pending)
        self.pending.clear()
        sent = 0 if stream.raw is None else stream.send_nowait(data)  # TLS: the writer's
        if sent < len(data) or stream.backlog:
            self.pending.append(memoryview(data)[sent:])
            self.writing = True
            return True
        return False

    async def write(self) -> None:
        """Send what `send_now` left, and what is queued meanwhile, in a task of its own.
        Raises what the sends raise."""
        stream = self.stream
        assert stream is not None
        try:
            while self.pending:
                parts, self.pending = self.pending, []
                await stream.send(parts)
        finally:
            self.writing = False

    def refused(self, read_id: int, why: str) -> None:
        """The peer refused the read `read_id` (if it is still waiting): it fails."""
        read = self.reads.pop(read_id, None)
        if read is not None:
            read.fail(PeerRefusedError(f"peer {self.address} refused the read: {why}"))

    def expects(self, read_id: int) -> bool:
        """Whether the read `read_id` waits for bytes."""
        return read_id in self.reads

    async def land(self, data: Data, tail: int) -> None:
        """A read's bytes (the tail), where the read wants them. Raises WireError for
        bytes outside it."""
        read = self.reads[data.read]
        if data.offset + tail > len(read.view):
            raise WireError(f"peer {self.address} sent bytes outside the read")
        assert self.stream is not None
        await self.stream.receive_into(read.view[data.offset : data.offset + tail])
        if tail >= read.left:
            del self.reads[data.read]
        read.landed(tail)

    def fail(self, error: BaseException) -> None:
        """The link is lost (or was never made): every read on it fails with `error`."""
        if self.error is None:
            self.error = error
        self.opened.set()
        self.pending.clear()
        for read in self.reads.values():
            read.fail(self.error)
        self.reads.clear()
        if self.stream is not None:
            self.stream.close()


class Peers:
    """This worker's links to other workers, for the copies it reads."""

    def __init__(
        self,
        limits: Limits,
        token: bytes | None = None,
        tls: ssl.SSLContext | None = None,
        timeout: float = LINK_TIMEOUT_S,
    ) -> None:
        # Data on a link we opened is what we asked for, checked against its destination
        # before it is read: accept the sender's chunks even where our --max-frame is lower.
        self.limits = attrs.evolve(limits, max_tail=max(CHUNK, limits.max_tail))
        self.token = token  # this worker's: it answers its peers' challenges with it
        self.tls = tls  # links go over TLS, peers' certificates checked with it
        self.timeout = timeout  # seconds to connect a link and pass its handshake
        self.links: dict[tuple[str, int], _PeerLink] = {}
        self._nursery: trio.Nursery | None = None
        self._held = 0
        self._touched: list[_PeerLink] = []  # links with requests held back by `hold`

    def start(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery

    async def _link(self, host: str, port: int) -> _PeerLink:
        link = self.links.get((host, port))
        if link is None:
            link = self.links[(host, port)] = _PeerLink(f"{host}:{port}")
            try:
                await self._open(link, host, port)
                assert self._nursery is not None  # started with the worker
                self._nursery.start_soon(self._read_loop, (host, port), link)
            except _LINK_LOST as exc:
                self.links.pop((host, port), None)
                link.fail(exc)
            link.opened.set()
        else:
            await link.opened.wait()
        if link.error is not None:
            raise link.error
        return link

    async def _open(self, link: _PeerLink, host: str, port: int) -> None:
        """Connect `link` and pass the handshake, within `timeout` seconds."""
        family = trio.socket.AF_INET6 if ":" in host else trio.socket.AF_INET
        sock = trio.socket.socket(family, trio.socket.SOCK_STREAM)
        doing = "accept a connection"
        try:
            with trio.move_on_after(self.timeout) as timer:
                await sock.connect((host, port))
                doing = "answer the handshake"
                stream = await self._stream(sock, host, port)
                link.connected(stream)
                await self._authenticate(stream, host, port)
        except BaseException:
            sock.close()
            raise
        if timer.cancelled_caught:
            sock.close()
            raise ConnectionLostError(
                f"{host}:{port} did not {doing} within {self.timeout:g} s; check that a "
                f"worker of this actorgraph version listens there and is not stopped or "
                f"overloaded"
            )

    async def _stream(self, sock: trio.socket.SocketType, host: str, port: int) -> FrameStream:
        """The link's stream on its connected socket: the plain socket, which the stream
        reads and writes itself (an answer already there costs no trip through trio's
        scheduler), or TLS over it."""
        sock.setsockopt(trio.socket.IPPROTO_TCP, trio.socket.TCP_NODELAY, 1)
        keep_alive(sock)
        raw = socket.socket(fileno=sock.detach())
        raw.setblocking(False)
        if self.tls is None:
            return FrameStream(raw, self.limits)
        try:
            tls = await connect_tls(raw, self.tls, host)
        except (ssl.SSLError, OSError) as exc:
            trio.socket.from_stdlib_socket(raw).close()
            why = handshake_failure(exc, "this worker's --tls-ca")
            raise PeerRefusedError(
                f"worker-to-worker link to {host}:{port} refused: {why}"
            ) from None
        return FrameStream(tls, self.limits)

    async def _authenticate(self, stream: FrameStream, host: str, port: int) -> None:
        """Answer the peer's challenge as a client does, with this worker's token."""
        where = f"worker-to-worker link to {host}:{port}"
        try:
            await greet(stream, self.token, "peer", [])
        except TokenRequired:
            raise PeerRefusedError(
                f"{where} refused: that worker requires a token and this one was started "
                f"without --token-file; start every worker of a runtime with the same "
                f"--token-file"
            ) from None
        except WorkerUnproven as exc:
            raise PeerRefusedError(
                f"{where} refused: what answers there could not prove it holds this worker's "
                f"token ({exc}); start every worker of a runtime with the same --token-file"
            ) from None
        except HandshakeRefused as exc:
            raise PeerRefusedError(f"{where} refused: {exc}") from None
        except WireError as exc:
            raise WireError(f"{where}: {exc}") from None

    async def _read_loop(self, key: tuple[str, int], link: _PeerLink) -> None:
        stream = link.stream
        assert stream is not None
        try:
            while True:
                meta, tail = await stream.receive()
                answer = decode(meta)
                handler = self._answers.get(type(answer))
                if handler is None:
                    raise WireError(f"peer {link.address} answered {meta[0]!r} out of turn")
                await handler(link, answer, tail)
        except _LINK_LOST as exc:
            if self.links.get(key) is link:
                del self.links[key]
            link.fail(ConnectionError(f"worker-to-worker link to {link.address} failed: {exc}"))

    @staticmethod
    async def _land(link: _PeerLink, data: Data, tail: int) -> None:
        """A read's bytes (the tail), where the read wants them."""
        if not link.expects(data.read):
            raise WireError(f"peer {link.address} answered 'data' out of turn")
        await link.land(data, tail)

    @staticmethod
    async def _refused(link: _PeerLink, error: Error, tail: int) -> None:
        """A read the peer refused: it fails, saying why."""
        link.refused(error.id, error.why)

    # What handles each answer on a link: the link, the answer and the bytes of its tail.
    _answers: ClassVar[dict[type, Callable[[_PeerLink, Any, int], Awaitable[None]]]] = {
        Data: _land,
        Error: _refused,
    }

    def hold(self) -> None:
        """Keep requests made from now until `release` back, to leave in one send per link
        (a batch asks for all of its reads and watches at once)."""
        self._held += 1

    def release(self) -> None:
        self._held -= 1
        if not self._held:
            touched, self._touched = self._touched, []
            for link in touched:
                self._flush(link)

    def _request(self, link: _PeerLink, read: PeerRead, request: Request) -> None:
        """Register `read` on the open `link` and send its request (made with its id)."""
        first = link.ask(read, request)
        if self._held:
            if first:
                self._touched.append(link)
            return
        self._flush(link)

    def _flush(self, link: _PeerLink) -> None:
        """Send `link`'s pending requests from this task if the socket takes them now;
        the rest goes by a writer task."""
        try:
            left = link.send_now()
        except OSError as exc:
            self._lost(link, exc)
            return
        if left:
            assert self._nursery is not None  # started with the worker
            self._nursery.start_soon(self._write, link)

    async def _write(self, link: _PeerLink) -> None:
        try:
            await link.write()
        except _LINK_LOST as exc:
            self._lost(link, exc)

    def _lost(self, link: _PeerLink, exc: BaseException) -> None:
        """A send on `link` failed: its reads fail (their `lost` relays them), and the next
        read opens a new link."""
        for key, kept in list(self.links.items()):
            if kept is link:
                del self.links[key]
        link.fail(ConnectionError(f"worker-to-worker link to {link.address} failed: {exc}"))

    def _ask_soon(self, host: str, port: int, read: PeerRead, request: Request) -> None:
        """Send one read request now if the link to host:port is open, else from a task
        that opens it first."""
        link = self.links.get((host, port))
        if link is not None and link.opened.is_set() and link.error is None:
            self._request(link, read, request)
            return
        assert self._nursery is not None  # started with the worker
        self._nursery.start_soon(self._ask, host, port, read, request)

    async def _ask(self, host: str, port: int, read: PeerRead, request: Request) -> None:
        """Send one read request and register where it lands."""
        try:
            link = await self._link(host, port)
            self._request(link, read, request)
        except PeerRefusedError as exc:
            read.fail(exc)
        except _LINK_LOST as exc:
            read.fail(ConnectionError(f"worker-to-worker read from {host}:{port} failed: {exc}"))

    async def pull(
        self,
        host: str,
        port: int,
        sid: int,
        ref: Ref,
        ticket: bytes,
        dst: memoryview,
        after: int = 0,
    ) -> None:
        """Read the source buffer into `dst`, now, or once the source has taken `after`
        bytes of its client's frames (PRead.after)."""
        read = PeerRead(dst)
        request = functools.partial(PRead, session=sid, src=ref, ticket=ticket, after=after)
        await self._ask(host, port, read, request)
        await read.done.wait()
        if isinstance(read.error, PeerRefusedError):
            raise read.error
        if read.error is not None:
            raise ConnectionError(str(read.error)) from None

    def watch(
        self,
        host: str,
        port: int,
        sid: int,
        queue: str,
        ticket: bytes,
        value: int,
        arrived: Callable[[], None],
        lost: Callable[[BaseException], None],
    ) -> PeerRead:
        """Ask to be told once the source session's queue `queue` reaches `value` (a read
        of no bytes: its answer is the signal); `arrived` is called then, or `lost` if
        the answer cannot come (the link failed, or the watch was refused)."""
        read = PeerRead(memoryview(bytearray(0)), arrived, lost)
        request = functools.partial(PWatch, session=sid, queue=queue, value=value, ticket=ticket)
        self._ask_soon(host, port, read, request)
        return read

    def pull_when(
        self,
        host: str,
        port: int,
        sid: int,
        ref: Ref,
        ticket: bytes,
        queue: str,
        value: int,
        nbytes: int,
        arrived: Callable[[], None],
        lost: Callable[[BaseException], None],
        after: int = 0,
    ) -> tuple[PeerRead, bytearray]:
        """Ask for the source buffer's bytes once the source's queue `queue` reaches
        `value`; they land in the staging returned with the read. `lost` is called if the
        link fails before they all came."""
        staging = bytearray(nbytes)
        read = PeerRead(memoryview(staging), arrived, lost)
        request = functools.partial(
            PWhen, session=sid, src=ref, ticket=ticket, queue=queue, value=value, after=after
        )
        self._ask_soon(host, port, read, request)
        return read, staging

"""The socket under a REMOTE connection: one TCP connection to one worker.

A `Transport` is what a connection (`Connection`, _connection.py) sends and reads with:
it connects (the handshake is handshake.py's), sends frames in the order they were
queued, from the task that queues them when the socket takes them whole, else from its
writer task, and reads the worker's frames in its reader task, except while a caller
reads its own replay's end itself (`wait_done`): the reader task lends it the socket
and parks, and is left parked after a replay that leaves nothing in flight. The bytes a
read asked for land here. What the other frames mean (batches, reports, mirrors) is its
owner's (`TransportOwner`); the design is described in actorgraph/devices/remote/__init__.py.
"""

from __future__ import annotations

import collections
import itertools
import os
import ssl
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

import trio

from .._device import DeviceError
from .._ops import Job, Submission
from .._signal import Doorbell
from .frames import ConnectionLostError, Frame, FrameStream, encode, no_delay, plain_socket
from .handshake import HandshakeRefused, TokenRequired, WorkerUnproven, greet
from .machine import WorkerCPU
from .tls import TLSSetupError, client_context, connect_tls, handshake_failure
from .wire import (
    CHUNK,
    Data,
    Ext,
    Limits,
    WireError,
    decode,
    read_ticket,
    watch_ticket,
)

_SEND_NOW = 1 << 16  # frames up to this many bytes may be sent by the task that makes them

# Who reads the worker's frames (_read_loop, wait_done): the reader task is
# reading or handling a frame; waiting for bytes, in a wait a caller may cancel to read
# them itself; or has lent the socket to such a caller (or is about to run and see it).
_BUSY, _WAITING, _LENT = range(3)

# What ends a connection when reading from it: the worker went away or broke the protocol.
_LOST = (
    OSError,
    ConnectionLostError,
    WireError,
    trio.ClosedResourceError,
    trio.BrokenResourceError,
    KeyError,
    IndexError,
    TypeError,
)


class RemoteError(DeviceError):
    """A worker refused a request or reported that an item failed there."""


class RemoteConnectionError(DeviceError, ConnectionError):
    """The connection to a worker could not be made, or broke."""


class _Mirrored:
    """Mirrored signals' values queued to go out together, as one Ext."""

    __slots__ = ("values",)

    def __init__(self) -> None:
        self.values: dict[int, int] = {}


# A job posted to the connection, with the queue it is for: queued as it is, encoded
# (with the others of its submission) when it is sent.
Posted = tuple[Job, Any]


# What handles one type of message from the worker: the message, and the bytes of its
# frame's tail (only a read's bytes have any, and its handler reads them).
Handler = Callable[[Any, int], Awaitable[None]]


class TransportOwner(Protocol):
    """What a Transport's owner (a Connection) does with what goes through it."""

    def encode_batch(self, group: list[Posted], parts: list[bytes | memoryview]) -> None:
        """Encode one submission's posted jobs for this worker as one batch."""

    def handlers(self) -> Mapping[type, Handler]:
        """Its handler of each type of message it takes from the worker: every one but a
        read's bytes (`Data`), which land here."""

    def lost(self, error: RemoteConnectionError, unsent: list[Posted]) -> None:
        """The connection is lost: fail what is in flight, and the jobs never sent."""

    def in_flight(self) -> bool:
        """Whether something sent is still to be answered (a batch)."""

    def fence(self) -> bytes | None:
        """A `Fence` frame to send ahead of what is taken now (how far the client has
        written to the workers this one reads from, where that moved), or None."""


def _token_from(options: dict[str, Any]) -> bytes | None:
    token = options.get("remote_token")
    path = options.get("remote_token_file")
    if token is None and path is not None:
        with open(os.fspath(path), "rb") as f:
            token = f.read().strip()
    if isinstance(token, str):
        token = token.encode()
    if token is not None and not isinstance(token, bytes):
        raise DeviceError(f"remote_token must be str or bytes, got {type(token).__name__}")
    return token


def _tls_from(options: dict[str, Any]) -> ssl.SSLContext | None:
    """The TLS context of `remote_tls_ca` (None: connections without TLS)."""
    ca_file = options.get("remote_tls_ca")
    if ca_file is None:
        return None
    try:
        return client_context(ca_file, "remote_tls_ca")
    except TLSSetupError as exc:
        raise DeviceError(str(exc)) from None


class Read:
    """Bytes asked of the worker, landing in `view`: done once all are in, or failed."""

    __slots__ = ("done", "error", "left", "staged", "view")

    def __init__(self, view: memoryview, staged: bool) -> None:
        self.view = view
        self.staged = staged  # a fresh host array: land the bytes in warm memory first
        self.left = len(view)
        self.done = trio.Event()
        self.error: BaseException | None = None

    def landed(self, nbytes: int) -> bool:
        """`nbytes` more of its bytes are in: whether that is all of them (it is done)."""
        self.left -= nbytes
        if self.left > 0:
            return False
        self.done.set()
        return True

    def fail(self, error: BaseException) -> None:
        """It fails with `error`: done now, its bytes never all in."""
        self.error = error
        self.done.set()


class Transport:
    """One TCP connection to a worker, its writer task and its reader task.

    Invariants: frames go out in the order they were queued; the worker's frames are read
    by one task at a time (the reader task, or a caller it lent the socket to).
    """

    def __init__(
        self, host: str, port: int, options: dict[str, Any], owner: TransportOwner
    ) -> None:
        self.owner = owner
        # What each type of message from the worker goes to: one lookup per frame.
        self._handlers: dict[type, Handler] = {**owner.handlers(), Data: self._land}
        self.host = host
        self.port = port
        self.address = f"{host}:{port}"
        self._token = _token_from(options)
        self._tls = _tls_from(options)
        self._timeout = float(options.get("remote_timeout", 10.0))
        self._stage = "connect"  # how far connecting got: "connect", "TLS handshake", "handshake"
        self.limits = Limits()
        self.cpu = WorkerCPU("")  # what the worker said at connect it runs on
        self.session_id = 0
        self._key = b""
        self._stream: FrameStream | None = None
        self._socket: trio.socket.SocketType | None = None  # before its TLS stream is made
        self.error: RemoteConnectionError | None = None
        self._pending: collections.deque[Any] = collections.deque()
        self._doorbell = Doorbell()
        self._reads: dict[int, Read] = {}
        self._read_ids = itertools.count(1)
        self.watchers: set[trio.Event] = set()  # set when this connection is lost
        self.bytes_received = 0  # buffer data that came to the client
        self._staging = bytearray()
        self._writing = False  # the writer task is sending
        # A caller reading the worker's frames itself (wait_done), and the reader task's
        # state and the scope a caller cancels to take the socket: see _read_loop.
        self._driver: trio.lowlevel.Task | None = None
        self._loop_state = _BUSY
        self._loop_scope: trio.CancelScope | None = None
        self._handback: trio.Event | None = None
        # The reader task left lent, not woken, after a caller read its replay's end
        # with nothing else in flight (woken by the next send: `_wake_reader`); and a
        # caller about to read its replay's end itself (its send need not wake it).
        self._lent_idle = False
        self._coming = False
        self.ends_read_by_callers = 0  # submissions whose caller read their end itself
        self.frames_received = 0
        self.sends = 0  # sends on the socket: the messages this client sent the worker
        # Waits for the worker's bytes, by whoever read them: each let other tasks run.
        self.read_waits = 0
        # Bytes of the frames taken to send since the handshake, in order (the worker
        # counts the same of what it has taken), and where the last frame that writes
        # (Frame.writes) ends in them: what a Fence for this worker names.
        self.taken = 0
        self.written = 0
        self._held = 0  # hold_sends() not yet released: frames wait for release_sends()
        self.names = ""  # the devices it serves, for errors (given to `connect`)
        # What flush() could not send whole: the writer sends it before anything else.
        self._unsent: tuple[list[bytes | memoryview], list[Frame]] | None = None

    # -- the socket --

    def close(self, error: RemoteConnectionError | None = None) -> None:
        """Close the connection: later uses fail with `error` (by default, that it was
        closed); its reader fails what is in flight with it."""
        if self.error is None:
            self.error = error or RemoteConnectionError(
                f"the connection to {self.address} was closed"
            )
        self._close_socket()

    def _close_socket(self) -> None:
        if self._stream is not None:
            self._stream.close()
        elif self._socket is not None:
            self._socket.close()  # a TLS handshake under way

    @property
    def chunk(self) -> int:
        """Bulk data goes in frames no larger than this side or the worker accepts."""
        return max(1, min(CHUNK, self.limits.max_tail))

    def watch(self, event: trio.Event) -> None:
        """Set `event` when this connection is lost (until `unwatch`)."""
        self.watchers.add(event)

    def unwatch(self, event: trio.Event) -> None:
        self.watchers.discard(event)

    def ticket(self, handle: int) -> bytes:
        return read_ticket(self._key, handle)

    def watch_ticket(self, queue: str) -> bytes:
        return watch_ticket(self._key, queue)

    # -- connecting --

    async def connect(self, devices: list[str], names: str = "") -> None:
        """Open the connection and answer the worker's handshake for `devices` (its names
        of them; `names`: the client's, which errors name); a RemoteConnectionError says
        why it could not be done."""
        self.names = names
        try:
            with trio.fail_after(self._timeout):
                await self._handshake(devices)
        except RemoteError as exc:
            # The worker answered, so it is running: the hint is about this client.
            self._close_socket()
            raise RemoteConnectionError(
                f"cannot connect to the worker at {self.address}: {exc}"
            ) from None
        except (WireError, ConnectionLostError, trio.BrokenResourceError) as exc:
            self._close_socket()
            raise RemoteConnectionError(
                f"cannot connect to the worker at {self.address}: {type(exc).__name__}: {exc}; "
                f"what answers there does not speak this version's worker protocol: check "
                f"the address, and that the worker runs the same actorgraph version"
            ) from None
        except trio.TooSlowError:
            self._close_socket()
            raise RemoteConnectionError(
                f"cannot connect to the worker at {self.address}: {self._too_slow()}"
            ) from None
        except OSError as exc:
            self._close_socket()
            raise RemoteConnectionError(
                f"cannot connect to the worker at {self.address}: {type(exc).__name__}: "
                f"{exc}; start one with `actorgraph worker --host {self.host} --port "
                f"{self.port} --devices ...`"
            ) from None

    def _too_slow(self) -> str:
        """Why connecting took longer than `remote_timeout`, by how far it got."""
        if self._stage == "connect":
            return (
                f"nothing accepted a connection there within {self._timeout:g} s; check the "
                f"host and port, and that no firewall drops the connection; start a worker "
                f"with `actorgraph worker --host {self.host} --port {self.port} --devices ...`"
            )
        return (
            f"something accepted the connection there but did not answer the {self._stage} "
            f"within {self._timeout:g} s; check that an actorgraph worker of this version "
            f"listens at {self.address} (not another service), that it is not stopped or "
            f"overloaded, or give it longer with open_runtime(..., remote_timeout=SECONDS)"
        )

    async def _handshake(self, devices: list[str]) -> None:
        stream = await self._open()
        self._stage = "handshake"
        try:
            welcome = await greet(stream, self._token, "client", devices)
        except TokenRequired:
            raise RemoteError(
                "the worker is running and requires a token; pass "
                "open_runtime(..., remote_token_file=PATH) naming its --token-file, or set "
                "ACTORGRAPH_TOKEN_FILE=PATH (the actorgraph command: --token-file PATH)"
            ) from None
        except WorkerUnproven as exc:
            raise RemoteError(
                f"what answers there could not prove it holds this client's token ({exc}), "
                f"so it may not be the worker meant; check the address, and that the worker "
                f"was started with --token-file holding the token given as remote_token= or "
                f"remote_token_file="
            ) from None
        except HandshakeRefused as exc:
            reason = str(exc)
            if "authentication failed" in reason:
                raise RemoteError(
                    f"the worker is running but refused this client's token ({reason}); "
                    f"check that remote_token= or remote_token_file= holds the token in the "
                    f"worker's --token-file (a file's surrounding whitespace is ignored)"
                ) from None
            raise RemoteError(f"the worker is running but refused this client: {reason}") from None
        self.session_id = welcome.session
        self._key = welcome.key
        self.limits = Limits.from_wire(welcome.limits)
        machine, features = welcome.cpu
        self.cpu = WorkerCPU(machine, frozenset(features), welcome.programs)

    async def _open(self) -> FrameStream:
        """Connect: a plain socket the stream reads itself, or TLS (`remote_tls_ca`)."""
        family = trio.socket.AF_INET6 if ":" in self.host else trio.socket.AF_INET
        self._stage = "connect"
        if self._tls is None:
            stream = self._stream = FrameStream(plain_socket(family), self.limits)
            await stream.sock.connect((self.host, self.port))
            no_delay(stream.sock)
            return stream
        raw = plain_socket(family)
        sock = self._socket = trio.socket.from_stdlib_socket(raw)
        await sock.connect((self.host, self.port))
        no_delay(sock)
        self._stage = "TLS handshake"
        try:
            tls = await connect_tls(raw, self._tls, self.host)
        except ssl.SSLError as exc:
            raise RemoteError(handshake_failure(exc)) from None
        self._stream = FrameStream(tls, self.limits)
        return self._stream

    async def start(self, nursery: trio.Nursery) -> None:
        """Start the writer and the reader task (once connected)."""
        await nursery.start(self._serve)
        nursery.start_soon(self._read_loop)

    @property
    def connected(self) -> bool:
        return self._stream is not None and self.error is None

    @property
    def tls(self) -> bool:
        """Whether the connection speaks TLS."""
        return self._stream is not None and self._stream.tls

    @property
    def read_by_a_caller(self) -> bool:
        """Whether a caller reads the worker's frames now (`wait_done`)."""
        return self._driver is not None

    # -- sending --

    def queue(self, entry: Frame) -> None:
        """Queue a frame after everything queued before it, for the writer to send."""
        self._pending.append(entry)
        self._doorbell.ring()

    def hold(self, posted: Posted) -> None:
        """Queue a posted job without waking the writer: the `flush` that follows its
        submission's last post sends it with the rest of its submission."""
        self._pending.append(posted)

    def queue_now(self, entry: Frame) -> None:
        """Queue `entry` and send it (with what is ahead of it) from this task if it can."""
        self._pending.append(entry)
        self.flush()

    def send_ext(self, ext_id: int, value: int) -> None:
        """Raise the worker's mirror `ext_id` to `value`, with what is queued (in the Ext
        queued last, if nothing was queued after it)."""
        last = self._pending[-1] if self._pending else None
        if type(last) is _Mirrored:
            last.values[ext_id] = value
            return
        mirrored = _Mirrored()
        mirrored.values[ext_id] = value
        self._pending.append(mirrored)
        self.flush()

    def expect_read(self, view: memoryview, staged: bool = False) -> tuple[int, Read]:
        """A read whose bytes land in `view` (`staged`: a fresh host array, so large bytes
        land in warm memory first): its id, to name in the request, and the Read."""
        read_id = next(self._read_ids)
        read = self._reads[read_id] = Read(view, staged)
        return read_id, read

    def refused_read(self, read_id: int, why: str) -> None:
        """The worker refused the read `read_id` (a GetWhen or a Watch): it fails."""
        read = self._reads.pop(read_id, None)
        if read is not None:
            read.fail(RemoteError(f"worker {self.address} refused a read: {why}"))

    def check(self) -> None:
        self.probe()
        if self.error is not None:
            raise self.error
        if self._stream is None:
            raise RemoteConnectionError(f"the connection to {self.address} is not started")

    def hold_sends(self) -> None:
        """Keep what is queued from here on until `release_sends`: the submissions made
        in between go to the worker in one message."""
        self._held += 1

    def release_sends(self) -> None:
        self._held -= 1
        if not self._held:
            self.flush()

    def flush(self) -> None:
        """Send what is queued now, from this task, when the writer is idle and it is
        small; else leave it to the writer. A submission's last post is followed by this."""
        if self._held:
            return  # release_sends sends it
        stream = self._stream
        if (
            not self._pending
            or self._writing
            or self.error is not None
            or stream is None
            or stream.raw is None
        ):
            self._doorbell.ring()
            return
        before = self.taken
        parts, frames = self._take_pending()
        if self.taken - before > _SEND_NOW:
            self._unsent = (parts, frames)
            self._doorbell.ring()
            return
        data = b"".join(parts)
        self.sends += 1
        try:
            sent = stream.send_nowait(data)
        except OSError as exc:
            self.lose(exc)
            sent = len(data)
        if sent < len(data) or stream.backlog:
            self._unsent = ([memoryview(data)[sent:]], frames)
            self._doorbell.ring()
            return
        self._frames_sent(frames)

    def _frames_sent(self, frames: list[Frame]) -> None:
        for frame in frames:
            frame.went(self.error)

    def _take_pending(self) -> tuple[list[bytes | memoryview], list[Frame]]:
        """Encode what is queued, in order: each submission's jobs as one batch."""
        if self._lent_idle and not self._coming:
            self._wake_reader()  # what goes out may be answered: someone must read
        pending = self._pending
        parts: list[bytes | memoryview] = []
        frames: list[Frame] = []
        # First, how far the client has written to the workers this one reads from: a
        # copy this take lets go on reads them only once they have taken that much.
        fence = self.owner.fence() if pending else None
        if fence is not None:
            parts.append(fence)
        writes = False
        while pending:
            entry = pending.popleft()
            if type(entry) is tuple:
                group = [entry]
                sub = entry[0].submission
                while pending and type(pending[0]) is tuple and pending[0][0].submission is sub:
                    group.append(pending.popleft())
                self.owner.encode_batch(group, parts)
            elif type(entry) is _Mirrored:
                parts.append(encode(Ext(list(entry.values.items()))))
            else:
                parts += entry.parts
                frames.append(entry)
                writes = writes or entry.writes
        self.taken += sum(map(len, parts))
        if writes:
            self.written = self.taken
        return parts, frames

    async def _serve(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        task_status.started()
        pending = self._pending
        while self.error is None:
            if (not pending and self._unsent is None) or self._held:
                await self._doorbell.wait()
                continue
            await self._send_pending()

    async def _send_pending(self) -> None:
        """Send what is queued, by the writer task. What it sent is let go of once it has
        left (a copyin's data is the caller's array), not kept until the next send."""
        parts: list[bytes | memoryview] = []
        frames: list[Frame] = []
        if self._unsent is not None:
            (parts, frames), self._unsent = self._unsent, None
        more, more_frames = self._take_pending()
        parts += more
        frames += more_frames
        self._writing = True
        self.sends += 1
        try:
            await self._stream.send(parts)  # type: ignore[union-attr]
        except (OSError, trio.ClosedResourceError, trio.BrokenResourceError) as exc:
            self.lose(exc)
        finally:
            self._writing = False
        self._frames_sent(frames)

    # -- reading --

    async def _read_loop(self) -> None:
        """Read the worker's frames, except while a caller reads them itself (wait_done):
        then lend it the socket and park until it hands it back."""
        stream = self._stream
        assert stream is not None
        try:
            while True:
                while self._driver is not None:
                    self._loop_state = _LENT
                    handback = self._handback = trio.Event()
                    await handback.wait()
                # This task reads from here on: nothing to hand back, nobody to wake. (A
                # caller that read its end before this task even parked left it "lent
                # idle"; that no longer holds once this task runs.)
                self._handback = None
                self._lent_idle = False
                # One scope for as long as this task reads (made again only after it lent
                # the socket): a caller takes the socket by cancelling it, and only while
                # this task waits for bytes, which loses nothing (see wait_done).
                with trio.CancelScope() as self._loop_scope:
                    while True:
                        frame = stream.next_frame()
                        if frame is not None:
                            self._loop_state = _BUSY
                            await self._received(*frame)
                        else:
                            self._loop_state = _WAITING
                            self.read_waits += 1
                            await stream.wait_more()
                self._loop_scope = None
        except _LOST as exc:
            self.lose(exc)

    async def wait_done(self, sub: Submission) -> None:
        """Wait for `sub`, every job of which went to this connection, to end: reading
        the worker's frames in this task while nobody else reads them, so the report
        that ends it wakes this task itself (no reader task to wake it, a trip through
        the scheduler less per replay). Frames that carry bytes are left to the reader
        task, which gets the socket back when this returns (or is cancelled)."""
        done = sub.done
        self._coming = False
        if done.is_set() or not self._may_read_here():
            self._wake_reader()
            await done.wait()
            return
        if self._loop_state == _WAITING:
            # The reader task waits on the socket: its wait ends at once (cancelled, it
            # has taken nothing), and it parks once it runs, seeing this task reads.
            assert self._loop_scope is not None
            self._loop_scope.cancel()
            self._loop_state = _LENT
        self._driver = trio.lowlevel.current_task()
        sub.read_by(self._interrupt)
        self._lent_idle = False
        idle = False
        try:
            idle = await self._read_until(done)
        finally:
            sub.read_by(None)
            self._driver = None
            if idle:
                # Nothing else in flight: the reader task stays lent, not woken (a trip
                # through the scheduler per replay), until something goes out or a call
                # looks at the connection (`probe`: a worker lost meanwhile is found).
                self._lent_idle = True
            elif self._handback is not None:
                self._handback.set()  # the reader task reads again
        if not done.is_set():
            await done.wait()

    def _may_read_here(self) -> bool:
        """Whether a caller may read the worker's frames itself now: nobody else does or
        is handling one, and the connection is up."""
        stream = self._stream
        return (
            self._driver is None
            and self._loop_state != _BUSY
            and self.error is None
            and stream is not None
            and stream.raw is not None
        )

    async def _read_until(self, done: trio.Event) -> bool:
        """Read frames in this task until `done` is set, or until bytes for a read come
        (the reader task takes those) or the connection is lost. Return whether the
        connection is idle once it is done (nothing else for the reader task to read)."""
        stream = self._stream
        assert stream is not None  # _may_read_here said so
        try:
            while not done.is_set():
                frame = stream.next_frame(tails=False)
                if frame is not None:
                    await self._received(*frame)  # no tail: nothing to wait for
                elif stream.has_tail:
                    break  # bytes for a read: the reader task takes them
                else:
                    self.read_waits += 1
                    await stream.wait_more()
        except _LOST as exc:
            self.lose(exc)
            return False
        if done.is_set():
            self.ends_read_by_callers += 1
            return self._idle()
        return False

    def coming(self) -> None:
        """A caller is about to submit a replay and read its end itself (wait_done):
        sending its batch need not wake the reader task."""
        self._coming = True

    def not_coming(self) -> None:
        """The caller that said `coming` will not read after all (its submit failed)."""
        self._coming = False
        self._wake_reader()

    def _idle(self) -> bool:
        """Whether nothing is in flight or received that the reader task must read."""
        stream = self._stream
        return (
            self.error is None
            and not self.owner.in_flight()
            and not self._reads
            and not self._pending
            and self._unsent is None
            and not self._writing
            and not self.watchers
            and stream is not None
            and not stream.buffered
        )

    def _wake_reader(self) -> None:
        """Wake the reader task if it was left lent (see wait_done)."""
        if self._lent_idle:
            self._lent_idle = False
            if self._handback is not None:  # None: it has not parked, and will not
                self._handback.set()

    def probe(self) -> None:
        """While no task is reading the connection (the reader task left lent, or waiting
        for bytes), look without waiting whether the worker closed it or sent something:
        a call that checks the connection then finds a worker lost while idle at once, as
        the reader task would at its next turn."""
        if not self._lent_idle and (self._loop_state != _WAITING or self._driver is not None):
            return
        stream = self._stream
        if stream is None or stream.raw is None:
            return
        try:
            data = stream.peek()
        except BlockingIOError:
            return
        except OSError as exc:
            self.lose(exc)
            return
        if data:
            self._wake_reader()
        else:
            self.lose(ConnectionLostError("the connection was closed by the other side"))

    def _interrupt(self, error: BaseException) -> None:
        """The runtime failed a submission whose end a caller waits to read (it broke):
        the worker may never report that job, so end the connection, which wakes it."""
        self.lose(error)

    async def _received(self, meta: list[Any], tail: int) -> None:
        """One frame from the worker: a read's bytes land here, the rest is the owner's."""
        self.frames_received += 1
        message = decode(meta)
        handler = self._handlers.get(type(message))
        if handler is None:
            raise WireError(f"unexpected message {meta[0]!r} from the worker")
        await handler(message, tail)

    async def _land(self, data: Data, tail: int) -> None:
        read = self._reads.get(data.read)
        stream = self._stream
        assert stream is not None
        if read is None:
            await stream.skip(tail)
            return
        offset = data.offset
        if data.error is not None:
            del self._reads[data.read]
            read.fail(RemoteError(f"worker {self.address} could not read: {data.error}"))
            return
        if offset + tail > len(read.view):
            raise WireError(
                f"worker sent {tail} bytes at {offset} for a {len(read.view)}-byte read"
            )
        elif read.staged and tail >= (1 << 20):
            # `out` of copyout is fresh memory: the kernel faults its pages in slowly while
            # it copies, so receive into warm memory and copy from there.
            if len(self._staging) < tail:
                self._staging = bytearray(tail)
            await stream.receive_into(memoryview(self._staging)[:tail])
            read.view[offset : offset + tail] = memoryview(self._staging)[:tail]
        else:
            await stream.receive_into(read.view[offset : offset + tail])
        self.bytes_received += tail
        if read.landed(tail):
            del self._reads[data.read]

    # -- the end --

    def lose(self, exc: BaseException) -> None:
        """The connection is lost (or ended): everything in flight fails with one error,
        what waits on it wakes, and so does every later use of it."""
        first = self.error is None
        if first:
            self.error = RemoteConnectionError(
                f"connection to worker {self.address} lost ({type(exc).__name__}: {exc}); "
                f"work on {self.names} did not complete. Restart the worker and open a new "
                f"runtime"
            )
        self._close_socket()
        self._wake_reader()
        error = self.error
        assert error is not None
        unsent: list[Posted] = []
        while self._pending:
            entry = self._pending.popleft()
            if type(entry) is tuple:
                unsent.append(entry)
            elif type(entry) is Frame:
                entry.went(error)
        if self._unsent is not None:
            self._frames_sent(self._unsent[1])
            self._unsent = None
        self.owner.lost(error, unsent)
        for event in self.watchers:
            event.set()
        for read in self._reads.values():
            read.fail(error)
        self._reads.clear()
        self._doorbell.ring()

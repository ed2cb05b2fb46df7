"""The socket under a REMOTE connection: one TCP connection to one worker, as the
connection actor (`Connection`, _connection.py) uses it.

`Transport` owns sending and reading. Frames go out in the order they were queued, from
the task that queues them when the socket takes them whole, else from the writer task.
The worker's frames are read by the reader task, except while a caller reads its own
replay's end itself (`wait_done`): the reader task lends it the socket and parks, and is
left parked after a replay that leaves nothing in flight. The bytes a read asked for land
here too. What the frames mean (batches, reports, mirrors) is the connection's; the
design is described in actorgraph/remote/__init__.py.
"""

from __future__ import annotations

import collections
import os
import socket
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import trio

from .._device import DeviceError
from .._ops import Submission
from .._signal import Doorbell
from .wire import (
    CHUNK,
    ConnectionLostError,
    Frame,
    FrameStream,
    Limits,
    WireError,
    encode,
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


class Ext:
    __slots__ = ("values",)

    def __init__(self) -> None:
        self.values: dict[int, int] = {}


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


class Read:
    __slots__ = ("done", "error", "left", "staged", "view")

    def __init__(self, view: memoryview, staged: bool) -> None:
        self.view = view
        self.staged = staged  # a fresh host array: land the bytes in warm memory first
        self.left = len(view)
        self.done = trio.Event()
        self.error: BaseException | None = None


class Transport:
    """The sending and reading half of a worker's connection actor (`Connection`): one
    TCP connection, a writer task and a reader task.

    Invariants: frames go out in the order they were queued; the worker's frames are read
    by one task at a time (the reader task, or a caller it lent the socket to).
    """

    # What the connection actor built on this provides (Connection): the batches it has
    # in flight, the encoding of a submission's jobs for this worker as one batch, the
    # handling of one frame from the worker, and the end of the connection.
    _batches: Mapping[int, object]
    _encode_batch: Callable[[list[Any], list[Any]], None]
    _frame: Callable[[list[Any], int], Awaitable[None]]
    _lose: Callable[[BaseException], None]

    def __init__(self, host: str, port: int, options: dict[str, Any]) -> None:
        self.host = host
        self.port = port
        self.address = f"{host}:{port}"
        self._token = _token_from(options)
        self._timeout = float(options.get("remote_timeout", 10.0))
        self.limits = Limits()
        self.session_id = 0
        self._key = b""
        self._stream: FrameStream | None = None
        self.error: RemoteConnectionError | None = None
        self._pending: collections.deque[Any] = collections.deque()
        self._doorbell = Doorbell()
        self._reads: dict[int, Read] = {}
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
        # What flush() could not send whole: the writer sends it before anything else.
        self._unsent: tuple[list[bytes | memoryview], list[Frame]] | None = None

    # -- the socket --

    def close(self) -> None:
        if self.error is None:
            self.error = RemoteConnectionError(f"the connection to {self.address} was closed")
        self._close_socket()

    def _close_socket(self) -> None:
        if self._stream is not None:
            self._stream.sock.close()

    @property
    def chunk(self) -> int:
        """Bulk data goes in frames no larger than this side or the worker accepts."""
        return max(1, min(CHUNK, self.limits.max_tail))

    def ticket(self, handle: int) -> bytes:
        return read_ticket(self._key, handle)

    def watch_ticket(self, queue: str) -> bytes:
        return watch_ticket(self._key, queue)

    # -- sending --

    def _queue(self, entry: Any) -> None:
        self._pending.append(entry)
        self._doorbell.ring()

    def _queue_now(self, entry: Any) -> None:
        """Queue `entry` and send it (with what is ahead of it) from this task if it can."""
        self._pending.append(entry)
        self.flush()

    def _check(self) -> None:
        self.probe()
        if self.error is not None:
            raise self.error
        if self._stream is None:
            raise RemoteConnectionError(f"the connection to {self.address} is not started")

    def flush(self) -> None:
        """Send what is queued now, from this task, when the writer is idle and it is
        small; else leave it to the writer. A submission's last post is followed by this."""
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
        parts, frames = self._take_pending()
        if sum(map(len, parts)) > _SEND_NOW:
            self._unsent = (parts, frames)
            self._doorbell.ring()
            return
        data = b"".join(parts)
        try:
            sent = stream.send_nowait(data)
        except OSError as exc:
            self._lose(exc)
            sent = len(data)
        if sent < len(data):
            self._unsent = ([memoryview(data)[sent:]], frames)
            self._doorbell.ring()
            return
        self._frames_sent(frames)

    def _frames_sent(self, frames: list[Frame]) -> None:
        for frame in frames:
            frame.error = self.error
            if frame.sent is not None:
                frame.sent.set()

    def _take_pending(self) -> tuple[list[bytes | memoryview], list[Frame]]:
        """Encode what is queued, in order: each submission's jobs as one batch."""
        if self._lent_idle and not self._coming:
            self._wake_reader()  # what goes out may be answered: someone must read
        pending = self._pending
        parts: list[bytes | memoryview] = []
        frames: list[Frame] = []
        while pending:
            entry = pending.popleft()
            if type(entry) is tuple:
                group = [entry]
                sub = entry[0].submission
                while pending and type(pending[0]) is tuple and pending[0][0].submission is sub:
                    group.append(pending.popleft())
                self._encode_batch(group, parts)
            elif type(entry) is Ext:
                parts.append(encode(["ext", [[k, v] for k, v in entry.values.items()]]))
            else:
                parts += entry.parts
                frames.append(entry)
        return parts, frames

    async def _serve(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        task_status.started()
        pending = self._pending
        while self.error is None:
            if not pending and self._unsent is None:
                await self._doorbell.wait()
                continue
            parts: list[bytes | memoryview] = []
            frames: list[Frame] = []
            if self._unsent is not None:
                (parts, frames), self._unsent = self._unsent, None
            more, more_frames = self._take_pending()
            parts += more
            frames += more_frames
            self._writing = True
            try:
                await self._stream.send(parts)  # type: ignore[union-attr]
            except (OSError, trio.ClosedResourceError, trio.BrokenResourceError) as exc:
                self._lose(exc)
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
                            await self._frame(*frame)
                        else:
                            self._loop_state = _WAITING
                            await stream.wait_more()
                self._loop_scope = None
        except _LOST as exc:
            self._lose(exc)

    async def wait_done(self, sub: Submission) -> None:
        """Wait for `sub`, every job of which went to this connection, to end: reading
        the worker's frames in this task while nobody else reads them, so the report
        that ends it wakes this task itself (no reader task to wake it, a trip through
        the scheduler less per replay). Frames that carry bytes are left to the reader
        task, which gets the socket back when this returns (or is cancelled)."""
        done = sub.done
        stream = self._stream
        self._coming = False
        if (
            done.is_set()
            or self._driver is not None
            or self._loop_state == _BUSY
            or self.error is not None
            or stream is None
            or stream.raw is None
        ):
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
        sub.interrupt = self._interrupt
        self._lent_idle = False
        idle = False
        try:
            while not done.is_set():
                frame = stream.next_frame(tails=False)
                if frame is not None:
                    await self._frame(*frame)  # no tail: nothing to wait for
                elif stream.has_tail:
                    break  # bytes for a read: the reader task takes them
                else:
                    await stream.wait_more()
        except _LOST as exc:
            self._lose(exc)
        else:
            if done.is_set():
                self.ends_read_by_callers += 1
                idle = self._idle()
        finally:
            sub.interrupt = None
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
            and not self._batches
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
        raw = stream.raw if stream is not None else None
        if raw is None:
            return
        try:
            data = raw.recv(1, socket.MSG_PEEK)
        except BlockingIOError:
            return
        except OSError as exc:
            self._lose(exc)
            return
        if data:
            self._wake_reader()
        else:
            self._lose(ConnectionLostError("the connection was closed by the other side"))

    def _interrupt(self, error: BaseException) -> None:
        """The runtime failed a submission whose end a caller waits to read (it broke):
        the worker may never report that job, so end the connection, which wakes it."""
        self._lose(error)

    async def _data(self, meta: list[Any], tail: int) -> None:
        read = self._reads.get(meta[1])
        stream = self._stream
        assert stream is not None
        if read is None:
            await stream.skip(tail)
            return
        offset, error = meta[2], meta[3]
        if error is not None:
            read.error = RemoteError(f"worker {self.address} could not read: {error}")
        elif offset + tail > len(read.view):
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
        if error is None:
            read.left -= tail
            self.bytes_received += tail
        if read.left <= 0 or read.error is not None:
            del self._reads[meta[1]]
            read.done.set()

"""The frames a worker sends on one connection, in order: `Outbox`.

A session's reports and data, and a peer link's answers, go through one. Small frames
leave from the task that sends them when nothing is ahead of them; bulk data and what a
full socket did not take go by the outbox's writer task. The worker's design is
described in actorgraph/worker/_server.py.
"""

from __future__ import annotations

from typing import Any, Protocol

import trio

from actorgraph.devices.remote.frames import FrameStream, encode
from actorgraph.devices.remote.wire import CHUNK, Data

COPIED_BELOW = 1 << 16  # a tail smaller than this is copied as it is sent


class Outbox:
    """Frames a session sends, in order.

    A frame goes out at once, from the task that sends it, when nothing is ahead of it
    and the socket takes it whole; the rest (bulk data, a full socket) goes by one
    writer task. While the connection's reader handles a frame it `hold`s the outbox:
    what that frame makes (a batch's reports) leaves in one syscall at `release`.

    Invariants: `parts` is empty unless the writer has been woken or the outbox is held;
    frames leave in the order `send` was called.
    """

    def __init__(self, stream: FrameStream) -> None:
        self.stream = stream
        self.parts: list[bytes | memoryview] = []
        self.waiters: list[trio.Event] = []
        self.wake = trio.Event()
        self.closed = False
        self.held = 0
        self._writing = False
        self._big = False  # a part in `parts` is too big to join: the writer sends them
        self._sent = trio.Event()  # returned for frames that left at once
        self._sent.set()

    def send(self, message: Any, tail: memoryview | None = None) -> trio.Event:
        """Send a message (of wire.py), with `tail` as its data; the event is set once
        it has left."""
        head = encode(message, len(tail) if tail is not None else 0)
        if tail is None:
            self.parts.append(head)
        elif len(tail) < COPIED_BELOW:  # and may go out at once, with nothing big ahead
            self.parts.append(head + bytes(tail))  # small: copied, so sent as it is now
        else:
            self.parts += [head, tail]
            self._big = True
            self.wake.set()
            done = trio.Event()
            self.waiters.append(done)
            return done
        if self.held or self._flush_now():
            return self._sent
        done = trio.Event()
        self.waiters.append(done)
        return done

    def hold(self) -> None:
        self.held += 1

    def release(self) -> None:
        self.held -= 1
        if not self.held and self.parts:
            self._flush_now()

    def _flush_now(self) -> bool:
        """Send `parts` from this task if the writer is idle and all are small: whether
        they left. Otherwise wake the writer for them."""
        if self._writing or self._big or self.closed or self.stream.raw is None:
            self.wake.set()
            return False
        parts = self.parts
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        try:
            sent = self.stream.send_nowait(data)
        except OSError:
            sent = 0  # the writer meets the error and closes the connection
        if sent == len(data) and not self.stream.backlog:
            parts.clear()
            return True
        self.parts = [memoryview(data)[sent:]]
        self.wake.set()
        return False

    async def run(self) -> None:
        try:
            while True:
                await self.wake.wait()
                self.wake = trio.Event()
                if self.parts:
                    await self._send_parts()
        finally:
            self.closed = True
            for w in self.waiters:
                w.set()

    async def _send_parts(self) -> None:
        """Send `parts` by this writer task. What it sent is let go of once it has left
        (a tail is a client's buffer itself), not kept until the next send."""
        parts, self.parts = self.parts, []
        waiters, self.waiters = self.waiters, []
        self._big = False
        self._writing = True
        try:
            await self.stream.send(parts)
        finally:
            self._writing = False
        for w in waiters:
            w.set()


class Sender(Protocol):
    """What sends a session's messages (an Outbox)."""

    def send(self, message: Any, tail: memoryview | None = None) -> trio.Event: ...


def send_data(out: Sender, read: int, data: memoryview, error: str | None = None) -> trio.Event:
    """A read's answer: its bytes, in frames of at most CHUNK (or none, with the reason it
    cannot be read). The event is set once the last has left: until then the tail is the
    buffer itself, which must not change."""
    if error is not None or not len(data):
        return out.send(Data(read, 0, error))
    done = None
    for off in range(0, len(data), CHUNK):
        done = out.send(Data(read, off, None), data[off : off + CHUNK])
    assert done is not None
    return done

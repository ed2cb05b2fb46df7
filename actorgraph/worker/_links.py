"""What a worker answers on a link another worker opened to it: reads of its clients'
buffers and watches of their queues, each checked against a ticket (an HMAC under the
owning session's key, which only that client knows).

- `PRead`: the buffer's bytes now (the reading copy runs once its waits say they are
  ready);
- `PWhen`: the bytes once the session's queue reaches a value, sent from the task that
  moves it there, at once: a copy between workers costs one message worker to worker;
- `PWatch`: a Data of no bytes once the session's queue reaches a value.

The links this worker opens to others are `Peers` (_peers.py).
"""

from __future__ import annotations

import functools
import hmac
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, ClassVar

from actorgraph.devices.remote.frames import FrameStream
from actorgraph.devices.remote.wire import (
    Error,
    PRead,
    PWatch,
    PWhen,
    Ref,
    WireError,
    decode,
    watch_ticket,
)

from ._lowered import Refused
from ._outbox import Outbox, send_data
from ._staging import bytes_of

if TYPE_CHECKING:
    from ._host import Host
    from ._session import Session


class UnknownBuffer(Refused):
    """A peer's read names, with a good ticket, a buffer its session does not hold now."""

    def __init__(self, session: Session, message: str) -> None:
        super().__init__(message)
        self.session = session


class Link:
    """One link another worker opened to this one: its requests, answered in order."""

    def __init__(
        self, worker: Host, sessions: dict[int, Session], stream: FrameStream, out: Outbox
    ) -> None:
        self.worker = worker
        self.sessions = sessions  # the worker's clients' sessions, by id
        self.stream = stream
        self.out = out
        self.waiting = 0  # PWhen and PWatch requests waiting for their value

    async def serve(self) -> None:
        stream = self.stream
        while True:
            meta, tail = await stream.receive()
            req = meta[1] if len(meta) > 1 and isinstance(meta[1], int) else 0
            try:
                request = decode(meta)
                handler = self._handlers.get(type(request))
                if handler is None or tail:
                    raise Refused(
                        f"{meta[0]!r} on a worker-to-worker link: a peer connection can only "
                        f"read ('pread', 'pwhen', 'pwatch'); other requests come from the client"
                    )
                sending = handler(self, request)
                if sending is not None:
                    await sending
            except (Refused, WireError) as exc:
                if tail:
                    await stream.skip(tail)  # the stream stays in step: only this is refused
                self.out.send(Error(meta[0], req, str(exc)))

    def _send_read(self, request: PRead) -> Awaitable[None]:
        """A PRead's bytes, now (once the source's client's frames are taken as far as
        the read says); what it returns is waited for before the next request. They are
        the buffer itself until they have left, and no longer: a link waiting for its
        next request holds none of a client's memory (a client may leave meanwhile)."""
        session = self._fenced(request.session, request.src, request.ticket, request.after)
        if session is not None:
            return self._send_read_after(request, session)
        _, data = self._read(request.session, request.src, request.ticket)
        return send_data(self.out, request.request, data).wait()

    def _fenced(self, sid: int, ref: Ref, ticket: bytes, after: int) -> Session | None:
        """The session a read must wait for first (its client's frames not yet taken up
        to `after`: a write it sent ahead of what let the read go on), else None."""
        session = self.sessions.get(sid)
        if session is None or session.taken >= after or not _ticket_good(session, ref, ticket):
            return None  # nothing to wait for, or refused by _read (as any bad ticket)
        return session

    async def _send_read_after(self, request: PRead, session: Session) -> None:
        await session.client_took(request.after)
        _, data = self._read(request.session, request.src, request.ticket)
        await send_data(self.out, request.request, data).wait()

    def _count_waiting(self) -> None:
        limit = self.worker.limits.max_signals
        if self.waiting >= limit:
            raise Refused(f"too many waiting reads (limit {limit})")
        self.waiting += 1

    def _read_when(self, request: PWhen) -> Awaitable[None] | None:
        """Send the bytes once the source's queue gets there, from the task that moves it
        (asked once the source's client's frames are taken as far as the read says)."""
        session = self._fenced(request.session, request.src, request.ticket, request.after)
        if session is not None:
            return self._read_when_after(request, session)
        self._read_when_now(request)
        return None

    async def _read_when_after(self, request: PWhen, session: Session) -> None:
        await session.client_took(request.after)
        self._read_when_now(request)

    def _read_when_now(self, request: PWhen) -> None:
        data: memoryview | None  # None: looked up when they go
        try:
            session, data = self._read(request.session, request.src, request.ticket)
        except UnknownBuffer as exc:
            # The read can come before the source's client's "alloc" has been taken
            # here (it travels on the other connection): the ticket is good, so the
            # buffer is looked up again once the queue gets there, which is after
            # every frame the client sent before the batch that gets it there.
            session, data = exc.session, None
        progress = session.progress(request.queue)
        self._count_waiting()
        progress.when(request.value, functools.partial(self._due, request, session, data))

    def _watch(self, request: PWatch) -> None:
        """Answer (a Data of no bytes) once that session's queue reaches the value, in its
        client's values, from the task that moves it there: a wait between two workers
        costs one message."""
        session = self.sessions.get(request.session)
        if session is None or not hmac.compare_digest(
            request.ticket, watch_ticket(session.key, request.queue)
        ):
            raise Refused(
                f"watch of queue {request.queue!r} of session {request.session} refused: no "
                f"such session or a bad watch ticket (a watch needs the ticket the queue's "
                f"own client made for it)"
            )
        progress = session.progress(request.queue)
        self._count_waiting()

        def due() -> None:
            self.waiting -= 1
            if self.sessions.get(session.sid) is not session:
                self.out.send(Error("pwatch", request.request, "the source's client went away"))
            else:
                send_data(self.out, request.request, memoryview(b""))

        progress.when(request.value, due)

    # What answers each request a link takes: it answers at once, or returns what the
    # link waits for (a read's bytes leaving) before it takes the next.
    _handlers: ClassVar[dict[type, Callable[[Link, Any], Awaitable[None] | None]]] = {
        PRead: _send_read,
        PWhen: _read_when,
        PWatch: _watch,
    }

    def _read(self, sid: int, ref: Ref, ticket: bytes) -> tuple[Session, memoryview]:
        """The session and bytes a peer's read names, checked against its ticket.
        UnknownBuffer if the ticket is good but the session holds no such buffer now."""
        session = self.sessions.get(sid)
        handle = ref.handle
        if session is None or not _ticket_good(session, ref, ticket):
            # The same answer either way: a peer learns nothing of other sessions.
            raise Refused(
                f"read of buffer {handle} of session {sid} refused: no such session or a bad "
                f"read ticket (a read needs the ticket the buffer's own client made for it, "
                f"which it puts in the copy it plans)"
            )
        if not session.holds(handle):
            raise UnknownBuffer(
                session, f"pread src: unknown buffer id {handle} (not allocated by this client)"
            )
        return session, session.peer_bytes(ref)

    def _due(self, request: PWhen, session: Session, data: memoryview | None) -> None:
        """A PWhen's value is reached (or its session ended): send the bytes."""
        self.waiting -= 1
        req = request.request
        try:
            if self.sessions.get(session.sid) is not session:
                self.out.send(Error("pwhen", req, "the source's client went away"))
                return
            if data is None:
                data = bytes_of(session.buffer(request.src, "pread src"))
            elif request.src.handle not in session.buffers:
                why = f"the source's buffer {request.src.handle} was freed"
                self.out.send(Error("pwhen", req, why))
                return
        except (Refused, WireError) as exc:
            self.out.send(Error("pwhen", req, str(exc)))
            return
        send_data(self.out, req, data)


def _ticket_good(session: Session, ref: Ref, ticket: bytes) -> bool:
    """Whether `ticket` is the one `session`'s client made for reading `ref`'s buffer."""
    return hmac.compare_digest(ticket, session.read_ticket(ref.handle))


async def serve_link(
    worker: Host, sessions: dict[int, Session], stream: FrameStream, out: Outbox
) -> None:
    """Answer the requests of a link another worker opened to this one, until it closes."""
    await Link(worker, sessions, stream, out).serve()

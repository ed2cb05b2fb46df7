"""`actorgraph worker`: a trio TCP server that hosts devices for REMOTE clients.

The worker opens its own runtime with its devices and serves any number of clients, one
session each. A client's programs (one per plan queue, see actorgraph/remote/__init__.py) are
lowered here onto the worker's own queue actors; its batches post one job per queue.

Kernels are never shipped: a launch names a kernel, resolved in the registry built from
the modules given with `--kernels` (each defines `KERNELS`, an iterable of `ag.Kernel`
or a mapping name -> `ag.Kernel`).

Safety: a client must answer an HMAC challenge with the worker's token (when it has one);
every frame and allocation is checked against `Limits`; every id is looked up in the
client's own session, so another client's buffer ids are simply unknown; a bad request
gets an ["error", what, id, message] reply and the session goes on; a frame that breaks
the framing (bad magic or version, oversized, not msgpack) gets an error reply and its
connection is closed, since the stream cannot be trusted after it. Other sessions never
notice. Worker-to-worker reads come in over "peer" connections, which answer the same
challenge with the same token (the workers of a runtime share it; a worker without one
serves loopback only, as for clients) and can then only read allocations named by a
ticket (an HMAC under the owning session's key, which only that client knows).

This module accepts connections, runs the handshake and routes frames; one client's state
and requests are a `Session` (_session.py), and the links this worker opens to other
workers are `Peers` (_peers.py).
"""

from __future__ import annotations

import functools
import hmac
import importlib
import itertools
import os
import secrets
import socket
import sys
import traceback
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import trio

from actorgraph.devices import Resumer
from actorgraph.devices.remote.wire import (
    CHUNK,
    ConnectionLostError,
    FrameStream,
    Limits,
    WireError,
    auth_mac,
    no_delay,
    want_bytes,
    want_fields,
    want_int,
    want_list,
    want_str,
    watch_ticket,
)

from .._errors import ActorGraphError, UsageError
from .._groups import sole_exception
from .._kernel import Kernel
from .._runtime import Runtime, open_runtime
from ._lowered import Refused
from ._outbox import Outbox
from ._peers import Peers
from ._placement import KernelTimes
from ._session import Session
from ._staging import StagingPool, bytes_of


def _import_kernel_module(name: str) -> Any:
    """Import `name`, or raise a UsageError that says in one line why it cannot be."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (name == exc.name or name.startswith(exc.name + ".")):
            path = name.replace(".", os.sep)
            raise UsageError(
                f"kernel module {name!r} not found: no {path}.py (or package {path}) in the "
                f"current folder ({os.getcwd()}) or on the Python path; start the worker in "
                f"the module's folder, or install it"
            ) from None
        raise UsageError(f"kernel module {name!r} failed to import: {_where(exc)}") from exc
    except Exception as exc:  # the module's own code raised: name it and where
        raise UsageError(f"kernel module {name!r} failed to import: {_where(exc)}") from exc


def _where(exc: BaseException) -> str:
    """`Type: message (file:line)` of the innermost frame that raised `exc`."""
    frames = traceback.extract_tb(exc.__traceback__)
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{type(exc).__name__}: {exc.msg} ({exc.filename}:{exc.lineno})"
    if frames:
        place = f" ({frames[-1].filename}:{frames[-1].lineno})"
    else:
        place = ""
    return f"{type(exc).__name__}: {exc}{place}"


def load_kernels(modules: Iterable[str]) -> dict[str, Kernel]:
    """The kernel registry: name -> Kernel, from the demo's and each module's KERNELS.

    The demo's kernels are always there, so `actorgraph demo` runs on any worker.
    """
    from .._demo import KERNELS as DEMO_KERNELS

    registry: dict[str, Kernel] = {kernel.name: kernel for kernel in DEMO_KERNELS}
    for name in modules:
        module = _import_kernel_module(name)
        found = getattr(module, "KERNELS", None)
        if found is None:
            raise UsageError(
                f"kernel module {name!r} has no KERNELS; define KERNELS = [ag.Kernel(...), ...]"
            )
        kernels = list(found.values()) if isinstance(found, Mapping) else list(found)
        for kernel in kernels:
            if not isinstance(kernel, Kernel):
                raise UsageError(f"{name}.KERNELS holds {kernel!r}, which is not an ag.Kernel")
            other = registry.get(kernel.name)
            if other is not None and other is not kernel:
                raise UsageError(f"kernel {kernel.name!r} is defined twice (in {name} and before)")
            registry[kernel.name] = kernel
    return registry


class UnknownBuffer(Refused):
    """A peer's read names, with a good ticket, a buffer its session does not hold now."""

    def __init__(self, session: Session, message: str) -> None:
        super().__init__(message)
        self.session = session


_DISCONNECTS = (OSError, ConnectionLostError, trio.BrokenResourceError, trio.ClosedResourceError)


def _is_disconnect(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return all(_is_disconnect(e) for e in exc.exceptions)
    return isinstance(exc, _DISCONNECTS)


class Worker:
    def __init__(
        self, runtime: Runtime, kernels: dict[str, Kernel], token: bytes | None, limits: Limits
    ) -> None:
        self.runtime = runtime
        self.kernels = kernels
        self.token = token
        self.limits = limits
        self.sessions: dict[int, Session] = {}
        self.peers = Peers(limits, token)
        self.staging = StagingPool()
        self.times = KernelTimes()
        self.resumer = Resumer()  # held jobs run on where their waits are met
        self._sids = itertools.count(1)

    async def serve(self, listener: trio.socket.SocketType) -> None:
        async with trio.open_nursery() as nursery:
            self.peers.start(nursery)
            while True:
                accepted, _ = await listener.accept()
                no_delay(accepted)
                # The stream reads and writes the plain socket itself (see FrameStream).
                sock = socket.socket(fileno=accepted.detach())
                sock.setblocking(False)
                nursery.start_soon(self._connection, sock)

    async def _connection(self, sock: socket.socket) -> None:
        stream = FrameStream(sock, self.limits)
        session: Session | None = None
        try:
            async with trio.open_nursery() as nursery:
                out = Outbox(stream)
                nursery.start_soon(out.run)
                try:
                    role = await self._handshake(stream, out)
                    if role == "client":
                        session = Session(self, next(self._sids), out, nursery)
                        self.sessions[session.sid] = session
                        out.send(["welcome", session.sid, session.key, self.limits.as_wire()])
                        await self._client_loop(stream, session)
                    else:
                        await self._peer_loop(stream, out, nursery)
                except WireError as exc:
                    # The framing itself is broken: answer, then drop this connection only.
                    await out.send(["error", "frame", 0, str(exc)]).wait()
                nursery.cancel_scope.cancel()
        except Exception as exc:  # one connection's trouble must never stop the worker
            if not _is_disconnect(exc):
                print(f"actorgraph worker: dropped a connection: {exc!r}", file=sys.stderr)
        finally:
            if session is not None:
                self.sessions.pop(session.sid, None)
                session.abandon()
                for buf in session.buffers.values():
                    self.runtime.free(buf)
                session.buffers.clear()
            stream.sock.close()

    async def _handshake(self, stream: FrameStream, out: Outbox) -> str:
        nonce = secrets.token_bytes(32)
        out.send(["challenge", nonce, self.token is not None])
        with trio.fail_after(30):
            meta, tail = await stream.receive()
        if meta[0] != "auth" or len(meta) != 4 or tail:
            raise WireError("the first message must be ['auth', role, mac, devices]")
        role = meta[1]
        if role not in ("client", "peer"):
            raise WireError(f"unknown role {role!r}: a connection is a 'client' or a 'peer'")
        if self.token is not None:
            # Workers answer like clients: a link from another worker is trusted only if
            # that worker holds this one's token (the workers of a runtime share it).
            mac = meta[2] if isinstance(meta[2], bytes) else b""
            if not hmac.compare_digest(mac, auth_mac(self.token, nonce)):
                if role == "peer":
                    raise WireError(
                        "authentication failed: a worker-to-worker link needs this worker's "
                        "token; start every worker of a runtime with the same --token-file"
                    )
                raise WireError("authentication failed: wrong or missing token")
        if role == "peer":
            if meta[3] != []:
                raise WireError(
                    "a peer names no devices: its first message is ['auth', 'peer', mac, []]"
                )
            out.send(["welcome", 0, b"", self.limits.as_wire()])
            return "peer"
        for name in want_list(meta[3], "devices", 1024):
            if name not in self.runtime.devices:
                raise WireError(
                    f"this worker has no device {name!r} (it has {list(self.runtime.devices)})"
                )
        return "client"

    async def _client_loop(self, stream: FrameStream, session: Session) -> None:
        while True:
            meta, tail = await stream.receive()
            try:
                if meta[0] == "blob":
                    blob_id = want_int(want_fields(meta, 2)[1], "blob id")
                    # A blob sent again under its id replaces the pending one: its bytes
                    # stop counting (the limit is on what is pending at once).
                    replaced = session.blobs.pop(blob_id, None)
                    if replaced is not None:
                        session.blob_bytes -= replaced[1]
                        self.staging.give(replaced[0])
                    if session.blob_bytes + tail > self.limits.max_pending_blob_bytes:
                        raise Refused("too many bytes of pending host writes")
                    data = self.staging.take(tail)
                    await stream.receive_into(memoryview(data)[:tail])
                    session.blobs[blob_id] = (data, tail)
                    session.blob_bytes += tail
                    tail = 0
                elif meta[0] == "put":
                    _, ref, offset = want_fields(meta, 3)
                    view = bytes_of(session.buffer(ref, "put dst"))
                    offset = want_int(offset, "put offset")
                    if offset + tail > len(view):
                        raise Refused(f"put of {tail} bytes at {offset} into {len(view)}")
                    await stream.receive_into(view[offset : offset + tail])
                    tail = 0
                elif meta[0] == "get":
                    _, read_id, ref = want_fields(meta, 3)
                    read_id = want_int(read_id, "read id")
                    src = bytes_of(session.buffer(ref, "get src"))
                    for off in range(0, len(src), CHUNK):
                        session.out.send(["data", read_id, off, None], src[off : off + CHUNK])
                    if not len(src):
                        session.out.send(["data", read_id, 0, None])
                else:
                    if tail:
                        raise Refused(f"request {meta[0]!r} carries no data")
                    # What the request makes (a batch run inline: its reports) leaves in
                    # one send, after it is handled.
                    session.out.hold()
                    try:
                        session.handle(meta)
                    finally:
                        session.out.release()
            except (Refused, WireError, ValueError, TypeError, KeyError, IndexError) as exc:
                if tail:
                    await stream.skip(tail)
                ref_id = meta[1] if len(meta) > 1 and isinstance(meta[1], int) else 0
                session.out.send(["error", meta[0], ref_id, str(exc)])

    async def _peer_loop(self, stream: FrameStream, out: Outbox, nursery: trio.Nursery) -> None:
        waiting = [0]  # "pwhen" reads this connection holds, waiting for their value
        data: memoryview | None  # a "pwhen" read's bytes, or None: looked up when they go
        while True:
            meta, tail = await stream.receive()
            req = meta[1] if len(meta) > 1 and isinstance(meta[1], int) else 0
            try:
                if meta[0] not in ("pread", "pwhen", "pwatch") or tail:
                    if tail:
                        await stream.skip(tail)  # the stream stays in step: only this is refused
                    raise Refused(
                        f"{meta[0]!r} on a worker-to-worker link: a peer connection can only "
                        f"read ('pread', 'pwhen', 'pwatch'); other requests come from the client"
                    )
                if meta[0] == "pwatch":
                    self._peer_watch(out, meta, waiting)
                    continue
                if meta[0] == "pread":
                    _, req, sid, ref, ticket = want_fields(meta, 5)
                    session, now = self._peer_read(req, sid, ref, ticket)
                    await self._send_peer_data(out, req, now)
                    continue
                _, req, sid, ref, ticket, device, value = want_fields(meta, 7)
                try:
                    session, data = self._peer_read(req, sid, ref, ticket)
                except UnknownBuffer as exc:
                    # The read can come before the source's client's "alloc" has been taken
                    # here (it travels on the other connection): the ticket is good, so the
                    # buffer is looked up again once the queue gets there, which is after
                    # every frame the client sent before the batch that gets it there.
                    session, data = exc.session, None
                value = want_int(value, "queue value", 0, 1 << 63)
                progress = session.progress(want_str(device, "device"))
                if waiting[0] >= self.limits.max_signals:
                    raise Refused(f"too many waiting reads (limit {self.limits.max_signals})")
                waiting[0] += 1
                # Sent from the task that moves the source's queue there, at once.
                due = functools.partial(self._peer_due, out, req, session, ref, data, waiting)
                progress.when(value, due)
            except (Refused, WireError) as exc:
                out.send(["error", meta[0], req, str(exc)])

    def _peer_watch(self, out: Outbox, meta: list[Any], waiting: list[int]) -> None:
        """["pwatch", req, session, queue, value, ticket]: answer (a "data" frame of no
        bytes) once that session's queue reaches `value`, in its client's values, from
        the task that moves it there: a wait between two workers costs one message."""
        _, req, sid, queue, value, ticket = want_fields(meta, 6)
        want_int(req, "request id")
        queue = want_str(queue, "queue")
        session = self.sessions.get(want_int(sid, "session id"))
        ticket = want_bytes(ticket, "ticket", 32)
        if session is None or not hmac.compare_digest(ticket, watch_ticket(session.key, queue)):
            raise Refused(
                f"watch of queue {queue!r} of session {sid} refused: no such session or a bad "
                f"watch ticket (a watch needs the ticket the queue's own client made for it)"
            )
        value = want_int(value, "queue value", 0, 1 << 63)
        progress = session.progress(queue)
        if waiting[0] >= self.limits.max_signals:
            raise Refused(f"too many waiting reads (limit {self.limits.max_signals})")
        waiting[0] += 1

        def due() -> None:
            waiting[0] -= 1
            if self.sessions.get(session.sid) is not session:
                out.send(["error", "pwatch", req, "the source's client went away"])
            else:
                out.send(["data", req, 0, None])

        progress.when(value, due)

    def _peer_read(
        self, req: object, sid: object, ref: object, ticket: object
    ) -> tuple[Session, memoryview]:
        """The session and bytes a peer's read names, checked against its ticket.
        UnknownBuffer if the ticket is good but the session holds no such buffer now."""
        want_int(req, "request id")
        session = self.sessions.get(want_int(sid, "session id"))
        ref = want_list(ref, "buffer", 3, size=3)
        ticket = want_bytes(ticket, "ticket", 32)
        handle = want_int(ref[0], "handle")
        if session is None or not hmac.compare_digest(ticket, session.read_ticket(handle)):
            # The same answer either way: a peer learns nothing of other sessions.
            raise Refused(
                f"read of buffer {handle} of session {sid} refused: no such session or a bad "
                f"read ticket (a read needs the ticket the buffer's own client made for it, "
                f"which it puts in the copy it plans)"
            )
        if handle not in session.buffers and handle not in session.refused:
            raise UnknownBuffer(
                session, f"pread src: unknown buffer id {handle} (not allocated by this client)"
            )
        return session, session.peer_bytes(ref)

    @staticmethod
    def _queue_peer_data(out: Outbox, req: int, data: memoryview) -> trio.Event:
        # The tail is the buffer itself (when large): the reader's copy, which waits for
        # it, is what later writes to the buffer wait for, so it cannot change meanwhile.
        done = None
        for off in range(0, len(data), CHUNK):
            done = out.send(["data", req, off, None], data[off : off + CHUNK])
        if done is None:
            done = out.send(["data", req, 0, None])
        return done

    async def _send_peer_data(self, out: Outbox, req: int, data: memoryview) -> None:
        await self._queue_peer_data(out, req, data).wait()

    def _peer_due(
        self,
        out: Outbox,
        req: int,
        session: Session,
        ref: list[Any],
        data: memoryview | None,
        waiting: list[int],
    ) -> None:
        """A "pwhen" read's value is reached (or its session ended): send the bytes."""
        waiting[0] -= 1
        try:
            if self.sessions.get(session.sid) is not session:
                out.send(["error", "pwhen", req, "the source's client went away"])
                return
            if data is None:
                data = bytes_of(session.buffer(ref, "pread src"))
            elif ref[0] not in session.buffers:
                out.send(["error", "pwhen", req, f"the source's buffer {ref[0]} was freed"])
                return
        except (Refused, WireError) as exc:
            out.send(["error", "pwhen", req, str(exc)])
            return
        self._queue_peer_data(out, req, data)


async def run_worker(
    devices: Sequence[str],
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    token: bytes | None = None,
    kernel_modules: Sequence[str] = (),
    limits: Limits | None = None,
    thread_bytes: int | None = None,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `devices` on host:port until cancelled; reports the bound (host, port).

    `thread_bytes`: CPU kernels touching at least this many bytes run on their client's
    actor thread (the runtime's cpu_thread_bytes); a smaller one runs on the worker's
    event loop only while every run of it seen so far took under 100 us (_placement.py),
    so one client's slow kernel delays the others at most once. 0 puts every kernel on
    a thread, at a thread hop per run of kernels.
    """
    kernels = load_kernels(kernel_modules)
    options = {} if thread_bytes is None else {"cpu_thread_bytes": thread_bytes}
    async with open_runtime(list(devices), **options) as runtime:
        family = trio.socket.AF_INET6 if ":" in host else trio.socket.AF_INET
        listener = trio.socket.socket(family, trio.socket.SOCK_STREAM)
        listener.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_REUSEADDR, 1)
        await listener.bind((host, port))
        listener.listen(128)
        bound = listener.getsockname()
        worker = Worker(runtime, kernels, token, limits or Limits())
        task_status.started((bound[0], bound[1]))
        try:
            await worker.serve(listener)
        finally:
            listener.close()


_LOOPBACK = ("127.0.0.1", "::1", "localhost")


def worker_main(
    devices: Sequence[str],
    host: str,
    port: int,
    token_file: str | None,
    kernels: Sequence[str],
    limits: Limits,
    thread_bytes: int | None = None,
) -> int:
    token = None
    if token_file is not None:
        with open(token_file, "rb") as f:
            token = f.read().strip()
        if not token:
            print(f"actorgraph worker: token file {token_file} is empty", file=sys.stderr)
            return 2
    elif host not in _LOOPBACK:
        print(
            f"actorgraph worker: refusing to serve {host} without a token; pass --token-file F",
            file=sys.stderr,
        )
        return 2

    # Like `python -m`: modules in the folder the worker starts in can be named.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    load_kernels(kernels)  # before serving: a bad module is one clear line, not a traceback

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            bound = await nursery.start(
                lambda task_status: run_worker(
                    devices,
                    host,
                    port,
                    token=token,
                    kernel_modules=kernels,
                    limits=limits,
                    thread_bytes=thread_bytes,
                    task_status=task_status,
                )
            )
            print(
                f"actorgraph worker listening on {bound[0]}:{bound[1]} "
                f"(devices {','.join(devices)}, pid {os.getpid()})",
                flush=True,
            )

    try:
        trio.run(main)
    except KeyboardInterrupt:
        return 0
    except BaseExceptionGroup as group:
        single = sole_exception(group)
        if single is None:
            raise
        if isinstance(single, KeyboardInterrupt):
            return 0
        if isinstance(single, OSError) and not isinstance(single, ActorGraphError):
            print(
                f"actorgraph worker: cannot listen on {host}:{port}: {single.strerror or single}",
                file=sys.stderr,
            )
            return 2
        raise single from single.__cause__  # as itself: the command line prints one line
    return 0

"""`actorgraph worker`: a trio TCP server that hosts devices for REMOTE clients.

The worker opens its own runtime with its devices and serves any number of clients, one
session each. A client's programs (one per plan queue, see actorgraph/devices/remote/__init__.py) are
lowered here onto the worker's own queue actors; its batches post one job per queue.

Kernels are named: a launch names a kernel, resolved in the registry built from the
modules given with `--kernels` (each defines `KERNELS`, an iterable of `ag.Kernel` or a
mapping name -> `ag.Kernel`). Only a worker started with `--allow-programs` also runs
compiled CPU programs its clients ship (_machine_code.py), each checked against this
worker's CPU first.

Safety: a client must answer an HMAC challenge with the worker's token (when it has one),
and the worker proves it holds the token too (_handshake.py; both bound to the role and
both sides' nonces); with a certificate (`--tls-cert`, `--tls-key`) every connection,
links to other workers included, speaks TLS (actorgraph/devices/remote/tls.py);
every frame and allocation is checked against `Limits`; every id is looked up in the
client's own session, so another client's buffer ids are simply unknown; a bad request
gets an ["error", what, id, message] reply and the session goes on; a frame that breaks
the framing (bad magic or version, oversized, not msgpack) gets an error reply and its
connection is closed, since the stream cannot be trusted after it. Other sessions never
notice. Worker-to-worker reads come in over "peer" connections, which answer the same
challenge with the same token (the workers of a runtime share it; a worker without one
serves loopback only, as for clients) and can then only read allocations named by a
ticket (an HMAC under the owning session's key, which only that client knows).

This module accepts connections, holds those not yet authenticated within the bounds of
`Admission` (_admission.py: the oldest shed, accept backing off where files run out), has
them answer the handshake (_handshake.py) and routes their frames: one client's state and requests are a `Session` (_session.py), what this
worker answers another on a link it opened is a `Link` (_links.py), and the links this
worker opens to other workers are `Peers` (_peers.py). Every message is one of
actorgraph/devices/remote/wire.py, decoded and checked there.
"""

from __future__ import annotations

import errno
import itertools
import os
import signal
import socket
import ssl
import sys
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ClassVar

import attrs
import trio

from actorgraph.devices.remote.frames import ConnectionLostError, FrameStream, encode, no_delay
from actorgraph.devices.remote.machine import WorkerCPU
from actorgraph.devices.remote.tls import (
    PLAIN_REFUSED,
    TLS_HANDSHAKE_TIMEOUT_S,
    TLSSetupError,
    accept_tls,
    client_context,
    server_context,
    speaks_plain,
)
from actorgraph.devices.remote.wire import (
    Blob,
    Code,
    Error,
    Get,
    Limits,
    Put,
    Welcome,
    WireError,
    decode,
)

from .._errors import ActorGraphError
from .._groups import sole_exception
from .._kernel import Kernel
from .._runtime import Runtime, open_runtime
from ._admission import BACKOFF_S, SHORT_OF_FILES, Admission, RareLog, Stranger
from ._handshake import HANDSHAKE_TIMEOUT_S, Greeted, challenge
from ._kernels import load_kernels
from ._links import serve_link
from ._listen import plaintext_problem, token_problem
from ._lowered import Refused
from ._machine_code import loader_problem
from ._outbox import Outbox, send_data
from ._peers import Peers
from ._placement import KernelTimes
from ._session import Session
from ._staging import StagingPool, bytes_of

_DISCONNECTS = (OSError, ConnectionLostError, trio.BrokenResourceError, trio.ClosedResourceError)
# What a refused request raises (answered with an Error; the session goes on).
_REFUSALS = (Refused, WireError, ValueError, TypeError, KeyError, IndexError)

# What handles a type of request with data: the worker, the client's session, the
# request, its stream and the bytes of its tail (which the handler reads).
DataHandler = Callable[["Worker", Session, Any, FrameStream, int], Awaitable[None]]


# What accept raises for a connection that failed while it waited to be taken in.
_GONE_BEFORE_ACCEPTED = frozenset(
    getattr(errno, name)
    for name in (
        "ECONNABORTED",
        "EPROTO",
        "EPERM",
        "ENETDOWN",
        "ENOPROTOOPT",
        "EHOSTDOWN",
        "ENONET",
        "EHOSTUNREACH",
        "EOPNOTSUPP",
        "ENETUNREACH",
        "EINTR",
        "EAGAIN",
    )
    if hasattr(errno, name)
)


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions in `exc`, nested groups opened."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


class Worker:
    """The server: its runtime, its kernels, its clients' sessions, its links."""

    def __init__(
        self,
        runtime: Runtime,
        kernels: dict[str, Kernel],
        token: bytes | None,
        limits: Limits,
        tls: WorkerTLS | None = None,
        allow_programs: bool = False,
        handshakes: Handshakes | None = None,
        verbose: bool = False,
    ) -> None:
        self.runtime = runtime
        self.kernels = kernels
        self.token = token
        self.limits = limits
        self.tls = tls
        self.sessions: dict[int, Session] = {}
        self.peers = Peers(limits, token, tls.links if tls is not None else None)
        self.staging = StagingPool()
        self.times = KernelTimes()
        self.resumer = runtime.resumer  # held jobs run on where their waits are met
        self.cpu = WorkerCPU.of_this_host(allow_programs)
        self._sids = itertools.count(1)
        self.log = RareLog(verbose=verbose)
        bound = handshakes or Handshakes()
        self.admission = Admission(bound.most_here(), bound.per_address, self.log)

    async def serve(self, listener: trio.socket.SocketType) -> None:
        try:
            await self._serve(listener)
        finally:
            self.log.flush()

    async def _serve(self, listener: trio.socket.SocketType) -> None:
        async with trio.open_nursery() as nursery:
            self.peers.start(nursery)
            self.log.start(nursery)
            pause = BACKOFF_S[0]
            while True:
                try:
                    accepted, address = await listener.accept()
                except OSError as exc:
                    if exc.errno in _GONE_BEFORE_ACCEPTED:
                        continue  # that connection failed in the listen queue: the next
                    if exc.errno not in SHORT_OF_FILES:
                        raise  # the listener itself is broken
                    if not self.admission.shed_oldest("accept found no file left"):
                        self._short_of_files(exc, pause)
                        await trio.sleep(pause)
                        pause = min(2 * pause, BACKOFF_S[1])
                    continue
                pause = BACKOFF_S[0]
                self._take(accepted, address[0], nursery)

    def _short_of_files(self, exc: OSError, pause: float) -> None:
        self.log.note(
            "files",
            f"cannot accept connections: {exc.strerror} ({{count}} time(s)), and every file "
            f"is held by an authenticated session or link; retrying in {pause:g} s (raise the "
            f"process's file limit, `ulimit -n`, for more clients at once)",
        )

    def _take(self, accepted: trio.socket.SocketType, host: str, nursery: trio.Nursery) -> None:
        """Start serving a connection just accepted, as a stranger until it proves the
        token (the oldest stranger is shed if this one passes a bound)."""
        try:
            no_delay(accepted)
        except OSError:
            accepted.close()  # reset already: nothing to serve
            return
        # The stream reads and writes the plain socket itself (see FrameStream), under
        # TLS too.
        sock = socket.socket(fileno=accepted.detach())
        sock.setblocking(False)
        if self.tls is not None:
            wrapped = trio.socket.from_stdlib_socket(sock)
            stranger = self.admission.arrive(host, wrapped.close)
            nursery.start_soon(self._tls_connection, sock, wrapped, self.tls.accept, stranger)
            return
        stream = FrameStream(sock, self.limits)
        stranger = self.admission.arrive(host, stream.close)
        nursery.start_soon(self._connection, stream, stranger)

    async def _tls_connection(
        self,
        raw: socket.socket,
        sock: trio.socket.SocketType,
        context: ssl.SSLContext,
        stranger: Stranger,
    ) -> None:
        """A connection to a TLS worker (`raw`, and `sock`, trio's view of it, which
        closes it): its TLS handshake, then as any other. What sends a plain frame first
        (a client without TLS) is refused in a plain frame."""
        tls = None
        with stranger.guard():
            try:
                with trio.fail_after(TLS_HANDSHAKE_TIMEOUT_S):
                    if await speaks_plain(sock):
                        refusal = encode(Error("hello", 0, PLAIN_REFUSED))
                        await trio.SocketStream(sock).send_all(refusal)
                        self._refused(stranger, "it does not speak TLS")
                    else:
                        tls = await accept_tls(raw, context)
            except (OSError, ssl.SSLError, trio.TooSlowError, trio.BrokenResourceError) as exc:
                self._refused(stranger, f"its TLS handshake failed ({exc!r})")
        if tls is None:  # not a TLS client of ours (or shed): nothing to answer it in
            self.admission.leave(stranger)
            sock.close()
            return
        await self._connection(FrameStream(tls, self.limits), stranger)

    def _refused(self, stranger: Stranger, why: str) -> None:
        self.log.note(
            "refused",
            f"refused {{count}} connection(s) that did not authenticate (latest from "
            f"{stranger.address}: {why})",
            stranger.address,
        )

    def _dropped(self, stranger: Stranger, why: str) -> None:
        self.log.note(
            "dropped",
            f"closed {{count}} authenticated connection(s) whose framing broke (latest "
            f"from {stranger.address}: {why})",
            stranger.address,
        )

    async def _connection(self, stream: FrameStream, stranger: Stranger) -> None:
        session: Session | None = None
        try:
            async with trio.open_nursery() as nursery:
                out = Outbox(stream)
                nursery.start_soon(out.run)
                greeted: Greeted | None = None
                try:
                    greeted = await self._handshake(stream, out, stranger)
                    if greeted is None:
                        pass  # shed, timed out or refused: said in the log
                    elif greeted.role == "client":
                        session = Session(self, next(self._sids), out, nursery)
                        self.sessions[session.sid] = session
                        limits = self.limits.as_wire()
                        cpu = (self.cpu.machine, sorted(self.cpu.features))
                        welcome = Welcome(
                            session.sid, session.key, limits, greeted.proof, cpu, self.cpu.programs
                        )
                        out.send(welcome)
                        await self._client_loop(stream, session)
                    else:
                        await serve_link(self, self.sessions, stream, out)
                except WireError as exc:
                    # The framing itself is broken: answer, then drop this connection only.
                    if greeted is not None:
                        self._dropped(stranger, str(exc))  # a stranger's is said already
                    await out.send(Error("frame", 0, str(exc))).wait()
                nursery.cancel_scope.cancel()
        # One connection's trouble must never stop the worker, nor join what stops it: a
        # disconnect met while the worker is cancelled comes grouped with the Cancelled,
        # and only the Cancelled (or a KeyboardInterrupt) goes on.
        except* _DISCONNECTS:
            pass  # the other side went away: a connection's end like any other
        except* Exception as group:
            for failure in _leaves(group):
                print(f"actorgraph worker: dropped a connection: {failure!r}", file=sys.stderr)
        finally:
            self.admission.leave(stranger)
            if session is not None:
                self.sessions.pop(session.sid, None)
                session.close()
                if not self.sessions:
                    self.staging.clear()  # no client left to land host writes in it
            stream.close()

    async def _handshake(
        self, stream: FrameStream, out: Outbox, stranger: Stranger
    ) -> Greeted | None:
        """The connection's handshake (_handshake.py): Greeted once it proved the token,
        then no stranger any more; None if it was shed or timed out. A refusal (a
        WireError) is answered by the caller."""
        with stranger.guard():
            try:
                greeted = await challenge(
                    stream, out, self.token, self.limits, self.runtime.devices
                )
            except trio.TooSlowError:
                self._refused(stranger, f"no answer to the challenge in {HANDSHAKE_TIMEOUT_S} s")
                return None
            except WireError as exc:
                self._refused(stranger, str(exc))
                raise
            self.admission.leave(stranger)
            return greeted
        return None  # shed: Admission said so

    async def _client_loop(self, stream: FrameStream, session: Session) -> None:
        start = stream.taken  # the handshake's frames: the client counts from after them
        out = session.out
        held = False
        try:
            while True:
                session.took(stream.taken - start)
                if held and not stream.whole_next:
                    held = False
                    out.release()
                meta, tail = await stream.receive()
                try:
                    request = decode(meta)
                    with_data = self._data_handlers.get(type(request))
                    if with_data is not None:
                        await with_data(self, session, request, stream, tail)
                        tail = 0
                    else:
                        if tail:
                            raise Refused(f"request {meta[0]!r} carries no data")
                        # What the request makes (a batch run inline: its reports) leaves
                        # in one send, after it is handled, with what the requests already
                        # here after it make (a client's submission: its batches).
                        if not held:
                            held = True
                            out.hold()
                        session.handle(request)
                except _REFUSALS as exc:
                    if tail:
                        await stream.skip(tail)
                    ref_id = meta[1] if len(meta) > 1 and isinstance(meta[1], int) else 0
                    out.send(Error(meta[0], ref_id, str(exc)))
        finally:
            if held:
                out.release()

    # A request whose data is its frame's tail (Code, Blob, Put), or that is answered with
    # data (Get): each raises, having read none of the tail, if it is refused before it is
    # read (a Code is refused after, too, for what its bytes are). The session handles
    # the others (Session.handle).

    async def _code(self, session: Session, request: Code, stream: FrameStream, tail: int) -> None:
        session.codes.check(request, tail)
        image = bytearray(tail)
        await stream.receive_into(memoryview(image))
        try:
            session.codes.add(request, bytes(image))
        except Refused as exc:
            session.out.send(Error("code", request.code, str(exc)))

    async def _blob(self, session: Session, request: Blob, stream: FrameStream, tail: int) -> None:
        # A blob sent again under its id replaces the pending one: its bytes stop counting
        # (the limit is on what is pending at once).
        session.drop_blob(request.blob)
        if session.blob_bytes + tail > self.limits.max_pending_blob_bytes:
            raise Refused("too many bytes of pending host writes")
        data = self.staging.take(tail)
        await stream.receive_into(memoryview(data)[:tail])
        session.keep_blob(request.blob, data, tail)

    async def _put(self, session: Session, request: Put, stream: FrameStream, tail: int) -> None:
        view = bytes_of(session.buffer(request.dst, "put dst"))
        if request.offset + tail > len(view):
            raise Refused(f"put of {tail} bytes at {request.offset} into {len(view)}")
        await stream.receive_into(view[request.offset : request.offset + tail])

    async def _get(self, session: Session, request: Get, stream: FrameStream, tail: int) -> None:
        if tail:
            raise Refused("request 'get' carries no data")
        send_data(session.out, request.read, bytes_of(session.buffer(request.src, "get src")))

    _data_handlers: ClassVar[dict[type, DataHandler]] = {
        Code: _code,
        Blob: _blob,
        Put: _put,
        Get: _get,
    }


@attrs.frozen
class Handshakes:
    """How many connections that have not authenticated a worker holds at once: `most`
    in all (and at most a quarter of the process's file limit, so sessions and links
    always find files), `per_address` from one address. The oldest is shed to make
    room for a new one. Raises ValueError, naming the flag, for a bound below 1."""

    most: int = 128
    per_address: int = 32

    def __attrs_post_init__(self) -> None:
        for flag, value, what in (
            ("--max-handshakes", self.most, ""),
            ("--max-handshakes-per-address", self.per_address, " from one address"),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"{flag} must be >= 1 (connections not yet authenticated held at "
                    f"once{what}), got {value!r}"
                )

    def most_here(self) -> int:
        """`most`, bounded by a quarter of this process's file limit."""
        try:
            import resource
        except ImportError:  # not a Unix: no limit to read
            return self.most
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return self.most
        return max(1, min(self.most, soft // 4))


class WorkerTLS:
    """A worker's TLS: the context it accepts connections with (its certificate and
    key), and the one its links to other workers check their certificates with (its
    `tls_ca`, by default its own certificate: workers that share one)."""

    def __init__(self, cert: Any, key: Any, ca: Any = None) -> None:
        self.accept = server_context(cert, key)
        self.links = client_context(cert if ca is None else ca, "--tls-ca")


async def run_worker(
    devices: Sequence[str],
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    token: bytes | None = None,
    kernel_modules: Sequence[str] = (),
    limits: Limits | None = None,
    thread_bytes: int | None = None,
    tls_cert: Any = None,
    tls_key: Any = None,
    tls_ca: Any = None,
    allow_programs: bool = False,
    handshakes: Handshakes | None = None,
    insecure_plaintext: bool = False,
    verbose: bool = False,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `devices` on host:port until cancelled; reports the bound (host, port).

    `allow_programs`: run the compiled CPU programs clients ship (_machine_code.py):
    any client holding the token may then run any machine code here. Raises
    ActorGraphError if this worker cannot load them (not Linux, no tinygrad 0.14).

    `tls_cert`, `tls_key`: PEM files of the worker's certificate and key: every
    connection speaks TLS, links to other workers too, whose certificates are checked
    against `tls_ca` (default: `tls_cert` itself). Raises TLSSetupError if one cannot be
    loaded.

    `thread_bytes`: CPU kernels touching at least this many bytes run on their client's
    actor thread (the runtime's cpu_thread_bytes); a smaller one runs on the worker's
    event loop only while every run of it seen so far took under 100 us (_placement.py),
    so one client's slow kernel delays the others at most once. 0 puts every kernel on
    a thread, at a thread hop per run of kernels.

    `handshakes`: how many connections not yet authenticated it holds (`Handshakes`);
    where accept finds no file left it sheds the oldest of them, or waits, and goes on.

    `insecure_plaintext`: serve a host other than loopback without TLS (else refused,
    as without a token: ActorGraphError says why). `verbose`: say each address's
    refused connections apart (still at most a line per address every 10 s).
    """
    problem = token_problem(host, token is not None) or plaintext_problem(
        host, tls_cert is not None, insecure_plaintext, "insecure_plaintext=True"
    )
    if problem is not None:
        raise ActorGraphError(problem)
    kernels = load_kernels(kernel_modules)
    tls = _worker_tls(tls_cert, tls_key, tls_ca)
    if allow_programs:
        problem = loader_problem()
        if problem is not None:
            raise ActorGraphError(problem)
    options = {} if thread_bytes is None else {"cpu_thread_bytes": thread_bytes}
    async with open_runtime(list(devices), **options) as runtime:
        family = trio.socket.AF_INET6 if ":" in host else trio.socket.AF_INET
        listener = trio.socket.socket(family, trio.socket.SOCK_STREAM)
        listener.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_REUSEADDR, 1)
        await listener.bind((host, port))
        listener.listen(128)
        bound = listener.getsockname()
        worker = Worker(
            runtime, kernels, token, limits or Limits(), tls, allow_programs, handshakes, verbose
        )
        task_status.started((bound[0], bound[1]))
        try:
            await worker.serve(listener)
        finally:
            listener.close()


def _worker_tls(cert: Any, key: Any, ca: Any) -> WorkerTLS | None:
    if cert is None and key is None:
        if ca is not None:
            raise TLSSetupError(
                "--tls-ca is for a worker that speaks TLS: add --tls-cert and --tls-key"
            )
        return None
    if cert is None or key is None:
        raise TLSSetupError(
            "a worker speaks TLS with both --tls-cert and --tls-key (its certificate and "
            "its private key); give both"
        )
    return WorkerTLS(cert, key, ca)


def _startup(
    host: str,
    token_file: str | None,
    tls: tuple[str | None, str | None, str | None],
    allow_programs: bool,
    insecure_plaintext: bool = False,
) -> tuple[bytes | None, str | None]:
    """(the token, None), or (None, why this worker must not start): checked before
    serving, so a bad file or flag is one clear line."""
    try:
        _worker_tls(*tls)
    except TLSSetupError as exc:
        return None, str(exc)
    problem = loader_problem() if allow_programs else None
    if problem is not None:
        return None, problem
    token = None
    if token_file is not None:
        with open(token_file, "rb") as f:
            token = f.read().strip()
        if not token:
            return None, f"token file {token_file} is empty"
    problem = token_problem(host, token is not None)
    problem = problem or plaintext_problem(host, tls[0] is not None, insecure_plaintext)
    return (None, problem) if problem is not None else (token, None)


def _stopped(group: BaseExceptionGroup[BaseException]) -> int:
    """The worker was stopped (Ctrl-C) while other things ended: a stop is quiet, and
    connections that broke meanwhile are part of it; anything else is said in a line."""
    for exc in _leaves(group):
        if not isinstance(exc, (KeyboardInterrupt, *_DISCONNECTS)):
            print(f"actorgraph worker: stopped; meanwhile this failed: {exc!r}", file=sys.stderr)
    return 0


def worker_main(
    devices: Sequence[str],
    host: str,
    port: int,
    token_file: str | None,
    kernels: Sequence[str],
    limits: Limits,
    thread_bytes: int | None = None,
    tls: tuple[str | None, str | None, str | None] = (None, None, None),
    allow_programs: bool = False,
    handshakes: Handshakes | None = None,
    insecure_plaintext: bool = False,
    verbose: bool = False,
) -> int:
    token, problem = _startup(host, token_file, tls, allow_programs, insecure_plaintext)
    if problem is not None:
        print(f"actorgraph worker: {problem}", file=sys.stderr)
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
                    tls_cert=tls[0],
                    tls_key=tls[1],
                    tls_ca=tls[2],
                    allow_programs=allow_programs,
                    handshakes=handshakes,
                    insecure_plaintext=insecure_plaintext,
                    verbose=verbose,
                    task_status=task_status,
                )
            )
            programs = ", runs shipped programs" if allow_programs else ""
            print(
                f"actorgraph worker listening on {bound[0]}:{bound[1]}{' (TLS)' if tls[0] else ''} "
                f"(devices {','.join(devices)}, pid {os.getpid()}{programs})",
                flush=True,
            )

    # SIGINT stops the worker quietly, also where it was started with SIGINT ignored (a
    # shell's background job inherits that), as a server's stop signal should.
    if threading.current_thread() is threading.main_thread():  # where signals are handled
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        trio.run(main)
    except KeyboardInterrupt:
        return 0
    except BaseExceptionGroup as group:
        if group.subgroup(KeyboardInterrupt) is not None:
            return _stopped(group)
        single = sole_exception(group)
        if single is None:
            raise
        if isinstance(single, OSError) and not isinstance(single, ActorGraphError):
            print(
                f"actorgraph worker: cannot listen on {host}:{port}: {single.strerror or single}",
                file=sys.stderr,
            )
            return 2
        raise single from single.__cause__  # as itself: the command line prints one line
    return 0

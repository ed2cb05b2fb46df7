"""The connection actor of REMOTE devices: one TCP connection to one worker.

`Connection` batches the jobs its worker's queues get in one submission into one frame,
keeps the programs the worker holds, forwards the client signals the worker waits on and
turns the worker's reports into signals and finished jobs; its socket (sending in order,
the reader task, a caller reading its own replay's end) is a `Transport` (_transport.py).
The design (batches, programs, local and mirror waits, lost connections) is described in
actorgraph/remote/__init__.py.
"""

from __future__ import annotations

import collections
import functools
import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np
import trio

from actorgraph.devices import (
    AWAIT,
    DeviceError,
    Job,
    Op,
    Signal,
    SignalOp,
    own_signal,
)

from ._oplists import QUEUES_BY_SIGNAL, KeptProgram, arm, consumed, program_of
from ._transport import Ext, Read, RemoteConnectionError, RemoteError, Transport
from ._wire import (
    DTYPES,
    ConnectionLostError,
    Frame,
    FrameStream,
    Limits,
    WireError,
    auth_mac,
    encode,
    no_delay,
    plain_socket,
    want_bytes,
    want_int,
)

if TYPE_CHECKING:
    from ._device import RemoteDevice, RemoteQueue

_EAGER_MAX = 64  # transfers done without waiting, in a row, before a checkpoint


class RemoteMemory:
    """A client-side handle on an allocation that lives on a worker."""

    __slots__ = ("connection", "handle", "nbytes")

    def __init__(self, handle: int, nbytes: int, connection: Connection) -> None:
        self.handle = handle
        self.nbytes = nbytes
        self.connection = connection

    def __repr__(self) -> str:
        return f"<RemoteMemory #{self.handle} {self.nbytes}B on {self.connection.address}>"


def flat_bytes(array: np.ndarray[Any, Any]) -> memoryview:
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8).data


class _Batch:
    __slots__ = ("bases", "jobs", "relayed", "submission", "watchers")

    def __init__(self, submission: Any, bases: Sequence[int]) -> None:
        self.submission = submission
        self.bases = bases
        self.jobs: dict[int, tuple[Job, KeptProgram]] = {}
        # Set when the batch's jobs have all ended, or when the worker asks to relay.
        self.watchers: list[trio.Event] = []
        # (host, port) of the workers whose waits the client relays for this batch: the
        # link from this batch's worker to them failed before they told it.
        self.relayed: set[tuple[str, int]] = set()

    def end(self) -> None:
        for event in self.watchers:
            event.set()

    def relay(self, address: tuple[str, int]) -> None:
        self.relayed.add(address)
        watchers, self.watchers = self.watchers, []
        for event in watchers:
            event.set()


@attrs.frozen
class ConnectionStatistics:
    address: str
    connected: bool
    batches_sent: int
    batches_in_flight: int
    frames_received: int
    bytes_received: int
    programs_kept: int
    allocated_bytes: int
    # Replays living on this worker whose end their caller read itself (wait_done), and
    # whether a caller reads the worker's frames now.
    ends_read_by_callers: int = 0
    read_by_a_caller: bool = False


class Connection(Transport):
    """The connection actor of one worker: one TCP connection, a writer task (the actor:
    it batches the jobs of the worker's queues) and a reader task (reports from the worker).

    Invariants: frames go out in the order they were queued; every job handed to `post`
    ends with `job_done` exactly once (by a "done" report, or failed when the connection
    is lost).
    """

    PROGRAM_CACHE = 256

    def __init__(self, host: str, port: int, options: dict[str, Any]) -> None:
        super().__init__(host, port, options)
        self.devices: list[RemoteDevice] = []
        self._nursery: trio.Nursery | None = None
        self._started = False
        self._ids = itertools.count(1)
        self._batches: dict[int, _Batch] = {}
        self._programs: collections.OrderedDict[int, KeptProgram] = collections.OrderedDict()
        self._seen: collections.OrderedDict[int, Sequence[Op]] = collections.OrderedDict()
        self._signal_ids: dict[int, tuple[Signal, int]] = {}
        self._ext_sent: dict[int, int] = {}
        # op list id -> (op list, {id of a push's buffer ref: the SIGNAL right after it})
        self._signals_after: collections.OrderedDict[
            int, tuple[Sequence[Op], dict[int, SignalOp]]
        ] = collections.OrderedDict()
        self.allocated = 0
        self.batches_sent = 0
        self.frames_received = 0
        self._eager = 0  # transfers in a row that needed no wait: see push
        # Copies from the worker asked for ahead (arm): op list id -> (ops, the copies);
        # (id(job), id(ref)) -> (read, staging); id(job) -> [job, copies not yet run].
        self._pulls: collections.OrderedDict[int, tuple[Sequence[Op], list[Any]]] = (
            collections.OrderedDict()
        )
        self._early: dict[tuple[int, int], tuple[Job, Read, bytearray]] = {}
        self._armed: dict[int, list[Any]] = {}
        self._early_bytes = 0

    def __repr__(self) -> str:
        return f"<Connection {self.address}>"

    def statistics(self) -> ConnectionStatistics:
        self.probe()
        return ConnectionStatistics(
            address=self.address,
            connected=self._stream is not None and self.error is None,
            batches_sent=self.batches_sent,
            batches_in_flight=len(self._batches),
            frames_received=self.frames_received,
            bytes_received=self.bytes_received,
            programs_kept=len(self._programs),
            allocated_bytes=self.allocated,
            ends_read_by_callers=self.ends_read_by_callers,
            read_by_a_caller=self._driver is not None,
        )

    # -- lifecycle --

    async def start(self, nursery: trio.Nursery) -> None:
        if self._started:
            return
        self._started = True
        self._nursery = nursery
        try:
            with trio.fail_after(self._timeout):
                await self._connect()
        except RemoteError as exc:
            # The worker answered, so it is running: the hint is about this client.
            self._close_socket()
            raise RemoteConnectionError(
                f"cannot connect to the worker at {self.address}: {exc}"
            ) from None
        except (WireError, ConnectionLostError) as exc:
            self._close_socket()
            raise RemoteConnectionError(
                f"cannot connect to the worker at {self.address}: {type(exc).__name__}: {exc}; "
                f"what answers there does not speak this version's worker protocol: check "
                f"the address, and that the worker runs the same actorgraph version"
            ) from None
        except (OSError, trio.TooSlowError) as exc:
            self._close_socket()
            raise RemoteConnectionError(
                f"cannot connect to the worker at {self.address}: {type(exc).__name__}: "
                f"{exc}; start one with `actorgraph worker --host {self.host} --port "
                f"{self.port} --devices ...`"
            ) from None
        await nursery.start(self._serve)
        nursery.start_soon(self._read_loop)

    async def _connect(self) -> None:
        family = trio.socket.AF_INET6 if ":" in self.host else trio.socket.AF_INET
        stream = self._stream = FrameStream(plain_socket(family), self.limits)
        await stream.sock.connect((self.host, self.port))
        no_delay(stream.sock)
        meta, _ = await stream.receive()
        if meta[0] == "error":
            raise RemoteError(f"the worker is running but refused the connection: {meta[-1]}")
        if meta[0] != "challenge" or len(meta) != 3:
            raise WireError(f"expected a challenge from the worker, got {meta[0]!r}")
        nonce = want_bytes(meta[1], "challenge nonce", 64)
        needs_token = meta[2] is True
        if needs_token and self._token is None:
            raise RemoteError(
                "the worker is running and requires a token; pass "
                "open_runtime(..., remote_token_file=PATH) naming its --token-file, or set "
                "ACTORGRAPH_TOKEN_FILE=PATH (the actorgraph command: --token-file PATH)"
            )
        mac = auth_mac(self._token, nonce) if self._token is not None and needs_token else b""
        await stream.send([encode(["auth", "client", mac, [d.inner for d in self.devices]])])
        meta, _ = await stream.receive()
        if meta[0] == "error":
            reason = str(meta[-1])
            if "authentication failed" in reason:
                raise RemoteError(
                    f"the worker is running but refused this client's token ({reason}); "
                    f"check that remote_token= or remote_token_file= holds the token in the "
                    f"worker's --token-file (a file's surrounding whitespace is ignored)"
                )
            raise RemoteError(f"the worker is running but refused this client: {reason}")
        if meta[0] != "welcome" or len(meta) != 4:
            raise WireError(f"expected a welcome from the worker, got {meta[0]!r}")
        self.session_id = want_int(meta[1], "session id")
        self._key = want_bytes(meta[2], "session key", 64)
        self.limits = Limits.from_wire(meta[3])

    # -- requests that need no answer (queued in order with the batches) --

    def allocate(self, device: RemoteDevice, nelems: int, dtype: np.dtype[Any]) -> RemoteMemory:
        self._check()
        if dtype.name not in DTYPES:
            raise DeviceError(
                f"{device.name}: dtype {dtype} cannot live on a worker; use one of {sorted(DTYPES)}"
            )
        nbytes = nelems * dtype.itemsize
        limits = self.limits
        if nbytes > limits.max_alloc_bytes or self.allocated + nbytes > limits.max_session_bytes:
            raise DeviceError(
                f"{device.name}: allocating {nbytes} bytes would pass the worker's limits "
                f"(one allocation <= {limits.max_alloc_bytes}, a client's total <= "
                f"{limits.max_session_bytes}, {self.allocated} in use); free buffers first"
            )
        handle = next(self._ids)
        self.allocated += nbytes
        self._queue(Frame([encode(["alloc", handle, device.inner, nelems, dtype.name])]))
        return RemoteMemory(handle, nbytes, self)

    def free(self, memory: RemoteMemory) -> None:
        self.allocated -= memory.nbytes
        if self.error is None:
            self._queue(Frame([encode(["free", memory.handle])]))

    def next_blob(self) -> int:
        return next(self._ids)

    def expect_read(self, view: memoryview, staged: bool = False) -> int:
        read_id = next(self._ids)
        self._reads[read_id] = Read(view, staged)
        return read_id

    # -- AWAIT ops of client-local queues: transfers between the client and the worker --

    async def push(self, job: Job, src: np.ndarray[Any, Any], ref: list[Any]) -> None:
        arm(self, job)
        if job.submission.error is not None:
            return
        self._check()
        data = flat_bytes(src)
        sent = trio.Event()
        parts: list[bytes | memoryview] = []
        for off in range(0, len(data), self.chunk):
            chunk = data[off : off + self.chunk]
            parts += [encode(["put", ref, off], len(chunk)), chunk]
        if not parts:
            parts = [encode(["put", ref, 0])]
        self._announce_signal_after(job, ref, parts)
        frame = Frame(parts, sent)
        self._queue_now(frame)
        if sent.is_set():
            # Sent from this task at once: no trip through the scheduler (a wake-up per
            # step of a chain between the client and a worker), but a checkpoint now and
            # then, so a long run of pushes lets other tasks in.
            self._eager += 1
            if self._eager >= _EAGER_MAX:
                self._eager = 0
                await trio.lowlevel.checkpoint()
        else:
            await sent.wait()
        if frame.error is not None:
            raise frame.error

    def _announce_signal_after(self, job: Job, ref: list[Any], parts: list[Any]) -> None:
        """A push followed at once by its queue's signal: send that signal's new value to
        the worker's mirror with the bytes, instead of after them once the signal is set
        here. The worker takes frames in order, so its mirror rises only once the bytes
        have landed: what waits on it there runs in the same wake-up as the put."""
        follow = self._signals_after.get(id(job.ops))
        if follow is None or follow[0] is not job.ops:
            found: dict[int, SignalOp] = {}
            ops = job.ops
            for i in range(len(ops) - 1):
                op, after = ops[i], ops[i + 1]
                if isinstance(after, SignalOp) and op[0] == AWAIT and op[1] == self.push:
                    found[id(op[2][1])] = after
            follow = self._signals_after[id(ops)] = (ops, found)
            if len(self._signals_after) > self.PROGRAM_CACHE:
                self._signals_after.popitem(last=False)
        signal_op = follow[1].get(id(ref))
        if signal_op is None:
            return
        known = self._signal_ids.get(id(signal_op.signal))
        if known is None or known[0] is not signal_op.signal:
            return  # this worker does not wait on that signal
        ext_id = known[1]
        value = job.bases[signal_op.slot] + signal_op.rel
        if self._ext_sent.get(ext_id, -1) < value:
            self._ext_sent[ext_id] = value
            parts.append(encode(["ext", [[ext_id, value]]]))

    async def pull(self, job: Job, dst: np.ndarray[Any, Any], ref: list[Any]) -> None:
        arm(self, job)
        early = self._early.pop((id(job), id(ref)), None)
        if early is not None:
            self._early_bytes -= len(early[2])
            if early[0] is not job:  # left by a job that never got here (its actor closed)
                early = None
            else:
                consumed(self, job)
        if job.submission.error is not None:
            return
        self._check()
        if early is not None:
            # Asked for when the job began: sent by the worker with the signal this copy
            # waited for, into staging (the destination may have been in use till now).
            _, read, staging = early
            if not read.done.is_set():
                await read.done.wait()
            else:
                # The bytes came with the signal this copy waited for (the usual case):
                # no trip through the scheduler, as for a push sent at once.
                self._eager += 1
                if self._eager >= _EAGER_MAX:
                    self._eager = 0
                    await trio.lowlevel.checkpoint()
            if read.error is not None:
                raise read.error
            flat_bytes(dst)[:] = staging
            return
        read_id = self.expect_read(flat_bytes(dst))
        read = self._reads[read_id]
        self._queue_now(Frame([encode(["get", read_id, ref])]))
        await read.done.wait()
        if read.error is not None:
            raise read.error

    async def told_when(self, queue: str, value: int) -> None:
        """Return once this worker's queue `queue` (DEVICE or DEVICE/copy) reaches
        `value`, as the worker says itself (a "watch", answered by no bytes)."""
        self._check()
        read_id = self.expect_read(memoryview(bytearray(0)))
        read = self._reads[read_id]
        self._queue_now(Frame([encode(["watch", read_id, queue, value])]))
        await read.done.wait()
        if read.error is not None:
            raise read.error

    # -- the actor --

    def post(self, job: Job, queue: RemoteQueue) -> None:
        if self.error is not None:
            self._fail_job(job, queue, self.error)
            return
        # Held until the submission is whole (flush): its jobs for this worker go as one
        # batch, from the submitter's task.
        self._pending.append((job, queue))

    def _encode_batch(self, group: list[tuple[Job, RemoteQueue]], parts: list[Any]) -> None:
        bases = group[0][0].bases
        batch_id = next(self._ids)
        batch = _Batch(group[0][0].submission, bases)
        prog_ids = []
        ext: list[list[int]] = []
        direct: list[tuple[Signal, int, int]] = []  # waits the source's worker tells of
        nursery = self._nursery
        assert nursery is not None  # started before any job can arrive
        for job, queue in group:
            program = program_of(self, job, queue, parts)
            batch.jobs[program.slot] = (job, program)
            prog_ids.append(program.prog_id)
            for signal, slot, rel, ext_id in program.mirrors:
                value = signal.value
                if self._ext_sent.get(ext_id, -1) < value:
                    self._ext_sent[ext_id] = value
                    ext.append([ext_id, value])
                target = bases[slot] + rel
                if value < target:
                    if (slot, rel, ext_id) in program.direct:
                        source = QUEUES_BY_SIGNAL.get(id(signal))
                        if source is not None and id(source.signal) == id(signal):
                            direct.append((signal, target, ext_id))
                        else:
                            nursery.start_soon(self._forward, signal, target, ext_id, batch)
                    else:
                        # Forwarded from the task that sets the signal, as it sets it
                        # (often already sent with a push's bytes: then nothing to do).
                        signal.when(target, functools.partial(self._forwarded, signal, ext_id))
        if direct:
            nursery.start_soon(self._forward_direct, batch, direct)
        self._batches[batch_id] = batch
        parts.append(encode(["batch", batch_id, list(bases), prog_ids, ext]))
        self.batches_sent += 1

    def _forwarded(self, signal: Signal, ext_id: int) -> None:
        self._send_ext(ext_id, signal.value)

    async def _forward_direct(self, batch: _Batch, waits: list[tuple[Signal, int, int]]) -> None:
        """Watch `batch`'s waits that their source's worker tells this one of itself (a
        chain between workers has one per step): one task for them all, which forwards
        none if the batch ends with every source connected and nothing relayed (as it
        mostly does), and otherwise hands each wait to `_forward`, which sees to it."""
        sources = {QUEUES_BY_SIGNAL[id(signal)].device.connection for signal, _, _ in waits}
        while (
            self.error is None
            and batch.jobs
            and not batch.relayed
            and all(source.error is None for source in sources)
        ):
            event = trio.Event()
            batch.watchers.append(event)
            for source in sources:
                source.watchers.add(event)
            try:
                await event.wait()
            finally:
                for source in sources:
                    source.watchers.discard(event)
        if self.error is None and not batch.jobs and not batch.relayed:
            if all(source.error is None for source in sources):
                return
        nursery = self._nursery
        assert nursery is not None
        for signal, target, ext_id in waits:
            nursery.start_soon(self._forward, signal, target, ext_id, batch)

    async def _forward(
        self, signal: Signal, target: int, ext_id: int, direct: _Batch | None
    ) -> None:
        queue = QUEUES_BY_SIGNAL.get(id(signal))
        if direct is not None and queue is not None and id(queue.signal) == id(signal):
            # The source's worker tells this one itself, with the bytes. Forward only if
            # the source's worker is lost before this batch ends: it may have died before
            # it could, and what waits here must go on (its copy then fails); or if this
            # worker's link to it failed first ("relay"). Nothing here wakes as the
            # source's queue moves.
            source = queue.device.connection
            where = (source.host, source.port)
            while self.error is None and source.error is None and direct.jobs:
                if where in direct.relayed:
                    break
                event = trio.Event()
                direct.watchers.append(event)
                source.watchers.add(event)
                try:
                    await event.wait()
                finally:
                    source.watchers.discard(event)
            if source.error is None:
                if where not in direct.relayed:
                    return
                # Ask the source's worker, over this client's own connection to it: the
                # client may never hear of that value otherwise (a signal only another
                # worker waits on is not reported), or only once a job ends that may
                # itself wait on this one.
                try:
                    await source.told_when(queue.key, target)
                except DeviceError:
                    pass  # lost: its signal is where its jobs would have left it
                else:
                    self._send_ext(ext_id, target)
                    return
        await signal.wait_value(target)
        self._send_ext(ext_id, signal.value)

    def _send_ext(self, ext_id: int, value: int) -> None:
        """Raise the worker's mirror `ext_id` to `value`, with what is queued."""
        if self.error is not None or self._ext_sent.get(ext_id, -1) >= value:
            return
        self._ext_sent[ext_id] = value
        last = self._pending[-1] if self._pending else None
        if type(last) is Ext:
            last.values[ext_id] = value
        else:
            ext = Ext()
            ext.values[ext_id] = value
            self._queue_now(ext)

    # -- reports from the worker --

    async def _frame(self, meta: list[Any], tail: int) -> None:
        """Handle one message from the worker (reading its tail, if it has one)."""
        self.frames_received += 1
        kind = meta[0]
        if kind == "sig":
            batch = self._batches.get(meta[1])
            if batch is not None and meta[2] in batch.jobs:
                program = batch.jobs[meta[2]][1]
                program.queue.signal.set(batch.bases[meta[2]] + meta[3])
        elif kind == "done":
            self._job_reported(meta)
        elif kind == "data":
            await self._data(meta, tail)
        elif kind == "relay":
            # ["relay", batch id, host, port, why]: this worker's link to the
            # worker at host:port failed while a job of the batch waited on it.
            batch = self._batches.get(meta[1])
            if batch is not None:
                batch.relay((meta[2], meta[3]))
        elif kind == "error":
            # Refusals of requests without an answer show up where they are used;
            # a refused read ahead fails the copy waiting for it.
            read = self._reads.pop(meta[2], None) if meta[1] in ("getwhen", "watch") else None
            if read is not None:
                read.error = RemoteError(f"worker {self.address} refused a read: {meta[3]}")
                read.done.set()
        else:
            raise WireError(f"unexpected message {kind!r} from the worker")

    def _job_reported(self, meta: list[Any]) -> None:
        batch = self._batches.get(meta[1])
        if batch is None or meta[2] not in batch.jobs:
            raise WireError(f"worker reported a job it was not given: {meta[1:3]}")
        job, program = batch.jobs.pop(meta[2])
        if not batch.jobs:
            del self._batches[meta[1]]
            batch.end()
        error = meta[3]
        sub = job.submission
        if error is not None:
            item, actor, message = error
            sub.fail(
                item,
                program.queue.name,
                RemoteError(f"on worker {self.address} ({actor}): {message}"),
            )
        queue = program.queue
        queue.ended(job)
        queue.signal.set(batch.bases[meta[2]] + program.final)
        queue.jobs_done += 1
        queue.items_run += program.final
        sub.job_done(job.slot)

    # -- failure --

    def _lose(self, exc: BaseException) -> None:
        if self.error is None:
            names = ", ".join(d.name for d in self.devices)
            self.error = RemoteConnectionError(
                f"connection to worker {self.address} lost ({type(exc).__name__}: {exc}); "
                f"work on {names} did not complete. Restart the worker and open a new runtime"
            )
        self._close_socket()
        self._wake_reader()
        error = self.error
        for batch in list(self._batches.values()):
            for job, program in batch.jobs.values():
                self._fail_job(job, program.queue, error)
        for batch in self._batches.values():
            batch.end()
        self._batches.clear()
        for event in self.watchers:
            event.set()
        for read in self._reads.values():
            read.error = error
            read.done.set()
        self._reads.clear()
        self._early.clear()
        self._armed.clear()
        self._early_bytes = 0
        while self._pending:
            entry = self._pending.popleft()
            if type(entry) is tuple:
                job, queue = entry
                self._fail_job(job, queue, error)
            elif type(entry) is Frame:
                entry.error = error
                if entry.sent is not None:
                    entry.sent.set()
        if self._unsent is not None:
            self._frames_sent(self._unsent[1])
            self._unsent = None
        self._doorbell.ring()

    @staticmethod
    def _fail_job(job: Job, queue: RemoteQueue, error: BaseException) -> None:
        """End a job the worker will never report: its queue's signal moves to where the
        job would have left it (so what waits on it goes on), and the submission fails."""
        queue.ended(job)
        own = own_signal(job.ops)
        if own is not None:
            queue.signal.set(job.bases[own.slot] + own.rel)
        job.fail(queue.name, error, item=-1)

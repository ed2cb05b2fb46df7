"""The connection actor of REMOTE devices: one TCP connection to one worker.

`Connection` batches the jobs its worker's queues get in one submission into one Batch,
keeps the programs the worker holds (`Programs`), forwards the client signals the worker
waits on (`Mirrors`) and turns the worker's reports into signals and finished jobs; its
socket (sending in order, the reader task, a caller reading its own replay's end) is its
`Transport` (_transport.py). The design (batches, programs, local and mirror waits, lost
connections) is described in actorgraph/devices/remote/__init__.py.
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np
import trio

from .._device import DeviceError
from .._ops import Job, Quick, WireOp
from .._signal import Signal
from ._clock import PINGS, ClockSample, PeerClock
from ._programs import KeptProgram, Mirrors, Programs, PullsAhead, queue_of
from ._transport import Handler, Posted, Read, RemoteConnectionError, RemoteError, Transport
from .frames import Frame, encode
from .machine import MachineCode, WorkerCPU, refusal
from .wire import (
    DTYPES,
    DTYPES_TEXT,
    Alloc,
    Batch,
    Blob,
    Code,
    Done,
    Error,
    Ext,
    Fence,
    Free,
    Get,
    JobTimes,
    Ping,
    Pong,
    Put,
    Ref,
    Relay,
    Sig,
    Watch,
    WireError,
)

if TYPE_CHECKING:
    from ._device import RemoteDevice, RemoteQueue

_EAGER_MAX = 64  # transfers done without waiting, in a row, before a checkpoint


class RemoteMemory:
    """A client-side handle on an allocation that lives on a worker."""

    __slots__ = ("connection", "dtype", "handle", "nbytes")

    def __init__(
        self, handle: int, nbytes: int, connection: Connection, dtype: np.dtype[Any]
    ) -> None:
        self.handle = handle
        self.nbytes = nbytes
        self.connection = connection
        self.dtype = dtype  # the allocation's (a view of it may have its own)

    def __repr__(self) -> str:
        return f"<RemoteMemory #{self.handle} {self.nbytes}B on {self.connection.address}>"


def flat_bytes(array: np.ndarray[Any, Any]) -> memoryview:
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8).data


class _Batch:
    __slots__ = ("bases", "jobs", "relayed", "sent", "submission", "watchers")

    def __init__(self, submission: Any, bases: Sequence[int], sent: float | None) -> None:
        self.submission = submission
        self.bases = bases
        # A profiled batch: when it left (before it was sent), on this host's clock.
        self.sent = sent
        self.jobs: dict[int, tuple[Job, KeptProgram]] = {}
        # Set when the batch's jobs have all ended, or when the worker asks to relay.
        self.watchers: list[trio.Event] = []
        # (host, port) of the workers whose waits the client relays for this batch: the
        # link from this batch's worker to them failed before they told it.
        self.relayed: set[tuple[str, int]] = set()

    def watch(self, event: trio.Event) -> None:
        """Set `event` when the batch ends or is relayed."""
        self.watchers.append(event)

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
    tls: bool = False  # the connection speaks TLS (remote_tls_ca)
    # The worker's clock minus this host's (seconds), and how far off that can be, as
    # measured for profiles (None before a profiled replay measured it).
    clock_offset: float | None = None
    clock_error: float | None = None
    # Compiled programs shipped to the worker (each once), and what it runs on.
    programs_shipped: int = 0
    worker_cpu: WorkerCPU | None = None
    # Sends on the socket (frames sent together count once): the messages to the worker.
    messages_sent: int = 0
    # Programs defined (each a Prog): a kept one is named by its id after that.
    programs_sent: int = 0


class Connection:
    """The connection actor of one worker: its Transport (one TCP connection, a writer
    task and a reader task), the batches it sent, the programs and mirrors its worker
    keeps.

    Invariants: frames go out in the order they were queued; every job handed to `post`
    ends with `job_done` exactly once (by a Done report, or failed when the connection
    is lost).
    """

    def __init__(self, host: str, port: int, options: dict[str, Any]) -> None:
        self.transport = Transport(host, port, options, self)
        self.host = host
        self.port = port
        self.address = self.transport.address
        self.devices: list[RemoteDevice] = []
        self._nursery: trio.Nursery | None = None
        self._started = False
        self._ids = itertools.count(1)
        self._batches: dict[int, _Batch] = {}
        self.programs = Programs(self)
        self.mirrors = Mirrors(self._ids)
        self.ahead = PullsAhead(self)
        self.allocated = 0
        self.batches_sent = 0
        # The connections whose workers this one's copies read from, each with the point
        # of its stream (Transport.taken) last told this worker (`fence`).
        self._sources: dict[Connection, int] = {}
        # The worker's clock against this host's (for profiles), and the pings out:
        # ping id -> (when it left, set when its Pong came or the connection was lost).
        self.clock = PeerClock()
        self._pings: dict[int, tuple[float, trio.Event]] = {}
        self._eager = 0  # transfers in a row that needed no wait: see `_in_a_row`
        self._eager_waits = 0  # the reader's waits when that run began
        # The AWAIT ops of transfers between a client-local queue and this worker, and
        # what they left to their later form, by job (one transfer of a job at a time).
        self.push = Quick(self._push_now, self._push_later)
        self.pull = Quick(self._pull_now, self._pull_later)
        self._pushing: dict[Job, Frame] = {}
        self._pulling: dict[Job, tuple[Read, bytearray]] = {}
        # Programs shipped to the worker on this connection: content hash -> code id.
        self._codes: dict[bytes, int] = {}
        self.code_bytes = 0  # their bytes
        self._timelines: set[Signal] | None = None  # of its devices (see _advances)
        # A caller that reads its replay's end itself (the connection is its queues'
        # `end_reader`) does so through the transport: its own methods, bound here.
        self.coming = self.transport.coming
        self.not_coming = self.transport.not_coming
        self.wait_done = self.transport.wait_done

    def __repr__(self) -> str:
        return f"<Connection {self.address}>"

    # -- what the connection's users read of its transport --

    @property
    def error(self) -> RemoteConnectionError | None:
        return self.transport.error

    @property
    def session_id(self) -> int:
        return self.transport.session_id

    @property
    def chunk(self) -> int:
        return self.transport.chunk

    @property
    def frames_received(self) -> int:
        return self.transport.frames_received

    @property
    def bytes_received(self) -> int:
        """Buffer data that came to the client."""
        return self.transport.bytes_received

    def watch(self, event: trio.Event) -> None:
        """Set `event` when this connection is lost (until `unwatch`)."""
        self.transport.watch(event)

    def unwatch(self, event: trio.Event) -> None:
        self.transport.unwatch(event)

    def add_device(self, device: RemoteDevice) -> None:
        """`device`, a device of this connection's worker, is served by it."""
        self.devices.append(device)

    def ticket(self, handle: int) -> bytes:
        return self.transport.ticket(handle)

    def watch_ticket(self, queue: str) -> bytes:
        return self.transport.watch_ticket(queue)

    def new_id(self) -> int:
        """An id of this client's, for a handle, a program, a batch or a blob."""
        return next(self._ids)

    def statistics(self) -> ConnectionStatistics:
        transport = self.transport
        transport.probe()
        clock = self.clock.estimate(time.perf_counter())
        return ConnectionStatistics(
            address=self.address,
            connected=transport.connected,
            batches_sent=self.batches_sent,
            batches_in_flight=len(self._batches),
            frames_received=transport.frames_received,
            bytes_received=transport.bytes_received,
            programs_kept=len(self.programs),
            allocated_bytes=self.allocated,
            ends_read_by_callers=transport.ends_read_by_callers,
            read_by_a_caller=transport.read_by_a_caller,
            tls=transport.tls,
            clock_offset=None if clock is None else clock.offset,
            clock_error=None if clock is None else clock.error,
            programs_shipped=len(self._codes),
            worker_cpu=self.cpu,
            messages_sent=transport.sends,
            programs_sent=self.programs.sent,
        )

    # -- lifecycle --

    async def start(self, nursery: trio.Nursery) -> None:
        if self._started:
            return
        self._started = True
        self._nursery = nursery
        await self.transport.connect(
            [d.inner for d in self.devices], ", ".join(d.name for d in self.devices)
        )
        await self.transport.start(nursery)

    def close(self, error: RemoteConnectionError | None = None) -> None:
        """Close the connection: later uses fail with `error` (by default, that it was
        closed), and so does what is in flight."""
        self.transport.close(error)

    def probe(self) -> None:
        self.transport.probe()

    # -- requests that need no answer (queued in order with the batches) --

    def allocate(self, device: RemoteDevice, nelems: int, dtype: np.dtype[Any]) -> RemoteMemory:
        self.transport.check()
        if dtype.str not in DTYPES:
            raise DeviceError(
                f"{device.name}: dtype {dtype} ({dtype.str}) cannot live on a worker, whose "
                f"buffers hold {DTYPES_TEXT}: store the data as one of those"
            )
        nbytes = nelems * dtype.itemsize
        limits = self.transport.limits
        if nbytes > limits.max_alloc_bytes or self.allocated + nbytes > limits.max_session_bytes:
            raise DeviceError(
                f"{device.name}: allocating {nbytes} bytes would pass the worker's limits "
                f"(one allocation <= {limits.max_alloc_bytes}, a client's total <= "
                f"{limits.max_session_bytes}, {self.allocated} in use); free buffers first"
            )
        handle = self.new_id()
        self.allocated += nbytes
        alloc = encode(Alloc(handle, device.inner, nelems, dtype.str))
        self.transport.queue(Frame([alloc], writes=True))
        return RemoteMemory(handle, nbytes, self, dtype)

    def free(self, memory: RemoteMemory) -> None:
        self.allocated -= memory.nbytes
        if self.error is None:
            self.transport.queue(Frame([encode(Free(memory.handle))]))

    def next_blob(self) -> int:
        return self.new_id()

    def hold_sends(self) -> None:
        """Hold what goes to the worker from here on (batches, their programs and data)
        until `release_sends`: submissions made in between go as one message. Calls
        nest; the caller releases what it holds, even when it fails."""
        self.transport.hold_sends()

    def release_sends(self) -> None:
        self.transport.release_sends()

    @property
    def cpu(self) -> WorkerCPU:
        """What the worker said at connect it runs on (and whether it runs programs)."""
        return self.transport.cpu

    def code_id(self, code: MachineCode, device: str) -> int:
        """The id the worker knows `code` by, shipped now (once per content hash) if it
        was not yet. Raises DeviceError, sending nothing, if the worker would refuse it:
        it runs no shipped programs, or its CPU cannot run this one."""
        found = self._codes.get(code.digest)
        if found is not None:
            return found
        self.transport.check()
        where = f"worker {self.address} (of {device})"
        why = refusal(code.name, code.image, code.machine, code.features, self.cpu, where)
        if why is None:
            limits = self.transport.limits
            if len(self._codes) >= limits.max_code_count:
                why = (
                    f"{where} keeps at most {limits.max_code_count} programs per client, "
                    f"and this one ({code.name!r}) would be one more; raise its --max-programs"
                )
            elif self.code_bytes + len(code.image) > limits.max_code_bytes:
                why = (
                    f"{where} keeps at most {limits.max_code_bytes} bytes of programs per "
                    f"client, and program {code.name!r} ({len(code.image)} bytes) would pass "
                    f"that; raise its --max-program-bytes"
                )
        if why is not None:
            raise DeviceError(why)
        code_id = self.new_id()
        message = Code(
            code_id,
            code.digest,
            code.name,
            code.machine,
            sorted(code.features),
            code.buffers,
            code.values,
            code.core_id,
        )
        self.transport.queue(Frame([encode(message, len(code.image)), code.image]))
        self._codes[code.digest] = code_id
        self.code_bytes += len(code.image)
        return code_id

    # -- AWAIT ops of client-local queues: transfers between the client and the worker --
    #
    # Each is a `Quick` op: tried at once wherever its job runs (its actor's task, the
    # task that submitted it, or the one that met the wait it was held on), so a step
    # of a chain between this host and a worker needs no task of its own here; what
    # cannot finish at once is awaited by the job's actor (`_push_later`, `_pull_later`).

    def _push_now(self, job: Job, src: np.ndarray[Any, Any], ref: Ref) -> bool:
        """Send the bytes (with the signal right after the push, if the worker waits on
        it): done (True) once they left from this task; else (False) the frame is queued
        and `_push_later` waits for it to leave (a driver that tries it again before
        that, as a job's actor does when it takes the job over, finds it queued).

        Never done before its bytes left, even where they are copied: the queue's signal
        may move once it is done, and a batch still queued behind it (sends held, or a
        busy socket) carries that signal's value as it is when encoded, which must not
        let the worker's jobs that wait on it run before the bytes have landed."""
        if job in self._pushing:
            return False
        self.ahead.arm(job)
        if job.submission.error is not None:
            return True
        transport = self.transport
        transport.check()
        data = flat_bytes(src)
        parts: list[bytes | memoryview] = []
        for off in range(0, len(data), self.chunk):
            chunk = data[off : off + self.chunk]
            parts += [encode(Put(ref, off), len(chunk)), chunk]
        if not parts:
            parts = [encode(Put(ref, 0))]
        self._announce_signal_after(job, parts)
        sent = trio.Event()
        frame = Frame(parts, sent, writes=True)
        transport.queue_now(frame)
        if sent.is_set():
            if frame.error is not None:
                raise frame.error
            if self._in_a_row():
                return True
        self._pushing[job] = frame
        return False

    async def _push_later(self, job: Job, src: np.ndarray[Any, Any], ref: Ref) -> None:
        frame = self._pushing.pop(job)
        sent = frame.sent
        assert sent is not None
        if not sent.is_set():
            await sent.wait()
        else:
            await trio.lowlevel.checkpoint()  # one of a long run done at once
        if frame.error is not None:
            raise frame.error

    def _in_a_row(self) -> bool:
        """A transfer was done at once: whether the job may go on without a checkpoint
        (a long run of them lets other tasks in now and then). A run ends where the
        connection's reader waited for the worker (other tasks ran then): a chain's
        steps, each run on as its report lands, never need one."""
        waits = self.transport.read_waits
        if waits != self._eager_waits:
            self._eager_waits = waits
            self._eager = 0
        self._eager += 1
        if self._eager < _EAGER_MAX:
            return True
        self._eager = 0
        return False

    def _announce_signal_after(self, job: Job, parts: list[Any]) -> None:
        """A push followed at once by its queue's signal: send that signal's new value to
        the worker's mirror with the bytes, instead of after them once the signal is set
        here. The worker takes frames in order, so its mirror rises only once the bytes
        have landed: what waits on it there runs in the same wake-up as the put.

        Not in a profiled replay: there the push is timed until it returns, and what
        waits on it on the worker must start after that, as its profile will say (the
        signal then goes once it is set here, one message later)."""
        if job.observer is not None:
            return
        signal_op = self.ahead.plan(job.script).signal_after.get(job.at)
        if signal_op is None:
            return
        ext_id = self.mirrors.known(signal_op.signal)
        if ext_id is None:
            return  # this worker does not wait on that signal
        value = signal_op.value(job.bases)
        if self.mirrors.due(ext_id, value):
            parts.append(encode(Ext([(ext_id, value)])))

    def _pull_now(self, job: Job, dst: np.ndarray[Any, Any], ref: Ref) -> bool:
        """Take bytes asked for ahead that have landed (True); else (False) leave the
        copy to `_pull_later`, which waits for them or asks for them now."""
        if job in self._pulling:
            return False  # tried before: its bytes are on their way
        self.ahead.arm(job)
        early = self.ahead.take(job, job.at)
        if job.submission.error is not None:
            return True
        self.transport.check()
        if early is None:
            return False
        # Asked for when the job began: sent by the worker with the signal this copy
        # waited for, into staging (the destination may have been in use till now).
        read, staging = early
        if read.done.is_set() and self._in_a_row():
            if read.error is not None:
                raise read.error
            flat_bytes(dst)[:] = staging
            return True
        self._pulling[job] = early
        return False

    async def _pull_later(self, job: Job, dst: np.ndarray[Any, Any], ref: Ref) -> None:
        early = self._pulling.pop(job, None)
        if early is None:
            if job.submission.error is not None:
                return  # failed since it was tried: nothing to read
            self.transport.check()  # lost since it was tried: a read now would never end
            read_id, read = self.transport.expect_read(flat_bytes(dst))
            self.transport.queue_now(Frame([encode(Get(read_id, ref))]))
            await read.done.wait()
        else:
            read, staging = early
            if read.done.is_set():
                await trio.lowlevel.checkpoint()  # one of a long run done at once
            else:
                await read.done.wait()
        if read.error is not None:
            raise read.error
        if early is not None:
            flat_bytes(dst)[:] = early[1]

    async def told_when(self, queue: str, value: int) -> None:
        """Return once this worker's queue `queue` (DEVICE or DEVICE/copy) reaches
        `value`, as the worker says itself (a Watch, answered by no bytes)."""
        transport = self.transport
        transport.check()
        read_id, read = transport.expect_read(memoryview(bytearray(0)))
        transport.queue_now(Frame([encode(Watch(read_id, queue, value))]))
        await read.done.wait()
        if read.error is not None:
            raise read.error

    # -- the actor --

    def post(self, job: Job, queue: RemoteQueue) -> None:
        error = self.transport.error
        if error is not None:
            self._fail_job(job, queue, error)
            return
        # Held until the submission is whole (flush): its jobs for this worker go as one
        # batch, from the submitter's task.
        self.transport.hold((job, queue))

    def reads_from(self, source: Connection) -> None:
        """This worker's programs copy from `source`'s worker: what the client has written
        there is fenced ahead of what lets such a copy go on (`fence`)."""
        if source is not self:
            self._sources.setdefault(source, 0)

    def fence(self) -> bytes | None:
        moved = []
        sources = self._sources
        for source, told in sources.items():
            written = source.transport.written
            if written > told:
                sources[source] = written
                moved.append((source.host, source.port, source.session_id, written))
        return encode(Fence(moved)) if moved else None

    def encode_batch(self, group: list[Posted], parts: list[bytes | memoryview]) -> None:
        """One submission's jobs for this worker, as one Batch (and the Progs it needs)."""
        first: Job = group[0][0]
        bases = first.bases
        batch_id = next(self._ids)
        # A profiled submission's jobs all carry observers: the worker times its jobs.
        profiled = first.observer is not None
        batch = _Batch(first.submission, bases, time.perf_counter() if profiled else None)
        prog_ids = []
        ext: list[tuple[int, int]] = []
        direct: list[tuple[Signal, int, int]] = []  # waits the source's worker tells of
        reads: list[list[int]] = []
        blobs: list[list[int]] = []
        values: list[list[int]] = []
        for job, queue in group:
            program = self.programs.program_of(job, queue, parts)
            batch.jobs[program.slot] = (job, program)
            prog_ids.append(program.prog_id)
            reads.append(self._reads(job, program))
            blobs.append(self._blobs(job, program, parts))
            values.append(_values(job, program))
            self.mirrors.due_of(program.mirrors, ext)
            for wait, ext_id in program.mirrors:
                signal = wait.signal
                target = wait.target(bases)
                if signal.value >= target:
                    continue
                if (wait.slot, wait.rel, ext_id) in program.direct and queue_of(signal) is not None:
                    direct.append((signal, target, ext_id))
                else:
                    # Forwarded from the task that sets the signal, as it sets it (often
                    # already sent with a push's bytes: then nothing to do).
                    signal.when(target, functools.partial(self._forwarded, signal, ext_id))
        if direct:
            nursery = self._nursery
            assert nursery is not None  # started before any job can arrive
            nursery.start_soon(self._forward_direct, batch, direct)
        self._batches[batch_id] = batch
        advances = self._advances(first.submission, group)
        reads = reads if any(reads) else []
        blobs = blobs if any(blobs) else []
        values = values if any(values) else []
        message = Batch(
            batch_id, list(bases), prog_ids, ext, profiled, advances, reads, blobs, values
        )
        parts.append(encode(message))
        self.batches_sent += 1
        if profiled:
            self._measure_clock_if_due()

    def _blobs(self, job: Job, program: KeptProgram, parts: list[bytes | memoryview]) -> list[int]:
        """The blob ids of this job's host writes' bytes (Batch.blobs), each blob sent
        ahead of the batch in `parts`."""
        if not program.writes:
            return []
        ops = job.ops
        ids = []
        for index in program.writes:
            op = ops[index]
            assert type(op) is WireOp and op.chunks is not None
            for chunk in op.chunks:
                blob_id = self.next_blob()
                parts += [encode(Blob(blob_id), len(chunk)), chunk]
                ids.append(blob_id)
        return ids

    def _reads(self, job: Job, program: KeptProgram) -> list[int]:
        """The read ids of this job's host reads (Batch.reads): each lands where its op
        says (a fresh array: large bytes land in warm memory first)."""
        if not program.reads:
            return []
        ops = job.ops
        expect = self.transport.expect_read
        ids = []
        for index in program.reads:
            op = ops[index]
            assert type(op) is WireOp and op.into is not None
            ids.append(expect(op.into, staged=True)[0])
        return ids

    def _advances(self, sub: Any, group: list[Posted]) -> list[tuple[int, int, list[int]]]:
        """The timelines of this worker's devices that only the jobs of `group` (one
        submission's, for this worker) move: the worker moves their mirrors itself as
        those jobs end, so this worker's next submissions on those devices need no word
        from the client first (the client's own move of them then sends nothing; a
        lower value it moves them to first, which the worker needs, it still sends)."""
        timelines = sub.timelines
        if not timelines:
            return []
        if self._timelines is None:
            self._timelines = {device.timeline for device in self.devices}
        place = {job.slot: k for k, (job, _) in enumerate(group)}
        out = []
        for d, timeline in enumerate(timelines):
            if timeline not in self._timelines:
                continue
            jobs = [place.get(q, -1) for q, devs in enumerate(sub.queue_devices) if d in devs]
            if not jobs or -1 in jobs:
                continue  # moved by a queue off this worker too: the client forwards it
            ext_id = self.mirrors.id_of(timeline)
            value = sub.tickets[d]
            # The client's own timeline gets there only once these jobs' ends are
            # reported: by then the worker has moved its mirror there itself.
            self.mirrors.moved_by_worker(ext_id, value)
            out.append((ext_id, value, jobs))
        return out

    def in_flight(self) -> bool:
        return bool(self._batches) or bool(self._pings)

    def _forwarded(self, signal: Signal, ext_id: int) -> None:
        self._send_ext(ext_id, signal.value)

    async def _forward_direct(self, batch: _Batch, waits: list[tuple[Signal, int, int]]) -> None:
        """Watch `batch`'s waits that their source's worker tells this one of itself (a
        chain between workers has one per step): one task for them all, which forwards
        none if the batch ends with every source connected and nothing relayed (as it
        mostly does), and otherwise hands each wait to `_forward`, which sees to it."""
        sources = {_source(signal) for signal, _, _ in waits}
        while (
            self.error is None
            and batch.jobs
            and not batch.relayed
            and all(source.error is None for source in sources)
        ):
            await _until_either(batch, sources)
        if self.error is None and not batch.jobs and not batch.relayed:
            if all(source.error is None for source in sources):
                return
        nursery = self._nursery
        assert nursery is not None
        for signal, target, ext_id in waits:
            nursery.start_soon(self._forward, signal, target, ext_id, batch)

    async def _forward(self, signal: Signal, target: int, ext_id: int, batch: _Batch) -> None:
        """Forward a wait the source's worker tells this one of itself, only if the source's
        worker is lost before this batch ends (it may have died before it could, and what
        waits here must go on: its copy then fails), or if this worker's link to it
        failed first (a Relay). Nothing here wakes as the source's queue moves."""
        queue = queue_of(signal)
        assert queue is not None
        source = queue.device.connection
        where = (source.host, source.port)
        while self.error is None and source.error is None and batch.jobs:
            if where in batch.relayed:
                break
            await _until_either(batch, {source})
        if source.error is None and where in batch.relayed:
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
        elif source.error is None:
            return
        await signal.wait_value(target)
        self._send_ext(ext_id, signal.value)

    def _send_ext(self, ext_id: int, value: int) -> None:
        """Raise the worker's mirror `ext_id` to `value`, with what is queued."""
        if self.error is None and self.mirrors.due(ext_id, value):
            self.transport.send_ext(ext_id, value)

    # -- the worker's clock, for profiles (see _clock.py) --

    def _measure_clock_if_due(self) -> None:
        """A profiled batch goes out: measure the worker's clock with a burst of pings, the
        first time and once the last burst is old."""
        if self._nursery is not None and self.clock.due(time.perf_counter()):
            self._nursery.start_soon(self._measure_clock)

    async def _measure_clock(self) -> None:
        """`PINGS` round trips, one after another, each a sample of the worker's clock."""
        for _ in range(PINGS):
            if self.error is not None:
                return
            ping_id = self.new_id()
            answered = trio.Event()
            self._pings[ping_id] = (time.perf_counter(), answered)
            self.transport.queue_now(Frame([encode(Ping(ping_id))]))
            await answered.wait()

    async def round_trip(self) -> float:
        """Seconds for a Ping to the worker and its Pong back, measured now: what one
        message each way costs between this process and the worker's, with nothing
        else in the way (benchmarks set what they measure beside it)."""
        self.transport.check()
        ping_id = self.new_id()
        answered = trio.Event()
        start = time.perf_counter()
        self._pings[ping_id] = (start, answered)
        self.transport.queue_now(Frame([encode(Ping(ping_id))]))
        await answered.wait()
        if self.error is not None:
            raise self.error
        return time.perf_counter() - start

    async def _ponged(self, pong: Pong, tail: int) -> None:
        back = time.perf_counter()
        ping = self._pings.pop(pong.ping, None)
        if ping is None:
            raise WireError(f"worker answered a ping it was not sent: {pong.ping}")
        sent, answered = ping
        self.clock.add(ClockSample(sent, pong.received, pong.sent, back))
        answered.set()

    async def _timed(self, times: JobTimes, tail: int) -> None:
        """A profiled batch's job as it ran on the worker: its times go on this host's
        clock, into the job's observer, before its Done ends it."""
        back = time.perf_counter()
        batch = self._batches.get(times.batch)
        if batch is None or times.slot not in batch.jobs or batch.sent is None:
            raise WireError(
                f"worker sent times of a job of no profiled batch: {[times.batch, times.slot]}"
            )
        job = batch.jobs[times.slot][0]
        observer = job.observer
        assert observer is not None  # a profiled batch's jobs all carry one
        # The batch and this report are a round trip too, the work between them left out.
        sample = ClockSample(batch.sent, times.received, times.sent, back)
        self.clock.add(sample)
        # Placed with the best offset for the moment of this batch, as known when the
        # profile is read (the pings that follow the first profiled batch refine it).
        observer.ran_elsewhere(
            times.spans, times.start, times.end, functools.partial(self.clock.offset_at, sample.at)
        )

    # -- reports from the worker --

    def handlers(self) -> dict[type, Handler]:
        """Its handler of each type of report from the worker (the transport's table
        holds these and its own, for a read's bytes)."""
        return {
            Sig: self._signalled,
            Done: self._job_reported,
            JobTimes: self._timed,
            Pong: self._ponged,
            Relay: self._relay_asked,
            Error: self._refused,
        }

    async def _signalled(self, sig: Sig, tail: int) -> None:
        batch = self._batches.get(sig.batch)
        if batch is not None and sig.slot in batch.jobs:
            program = batch.jobs[sig.slot][1]
            program.queue.signal.set(batch.bases[sig.slot] + sig.rel)

    async def _relay_asked(self, relay: Relay, tail: int) -> None:
        """This worker's link to the worker at host:port failed while a job of the batch
        waited on it."""
        batch = self._batches.get(relay.batch)
        if batch is not None:
            batch.relay((relay.host, relay.port))

    async def _refused(self, error: Error, tail: int) -> None:
        """Refusals of requests without an answer show up where they are used; a refused
        read ahead fails the copy waiting for it."""
        if error.request in ("getwhen", "watch"):
            self.transport.refused_read(error.id, error.why)

    async def _job_reported(self, done: Done, tail: int) -> None:
        batch = self._batches.get(done.batch)
        if batch is None or done.slot not in batch.jobs:
            raise WireError(f"worker reported a job it was not given: {[done.batch, done.slot]}")
        job, program = batch.jobs.pop(done.slot)
        if not batch.jobs:
            del self._batches[done.batch]
            batch.end()
        sub = job.submission
        if done.error is not None:
            item, actor, message = done.error
            error = RemoteError(f"on worker {self.address} ({actor}): {message}")
            sub.fail(item, program.queue.name, error)
        queue = program.queue
        queue.ended(job)
        queue.signal.set(program.own.value(batch.bases))
        queue.finish(job)

    # -- failure --

    def lost(self, error: RemoteConnectionError, unsent: list[Posted]) -> None:
        """The connection is lost: every job in flight or never sent ends, failed."""
        for batch in list(self._batches.values()):
            for job, program in batch.jobs.values():
                self._fail_job(job, program.queue, error)
        for batch in self._batches.values():
            batch.end()
        self._batches.clear()
        self.ahead.clear()
        for _, answered in self._pings.values():
            answered.set()  # never answered: the burst ends
        self._pings.clear()
        for job, queue in unsent:
            self._fail_job(job, queue, error)

    @staticmethod
    def _fail_job(job: Job, queue: RemoteQueue, error: BaseException) -> None:
        """End a job the worker will never report: its queue's signal moves to where the
        job would have left it (so what waits on it goes on), and the submission fails."""
        queue.lost_job(job, error)


def _source(signal: Signal) -> Connection:
    """The connection of the worker whose queue `signal` is the signal of."""
    queue = queue_of(signal)
    assert queue is not None
    return queue.device.connection


async def _until_either(batch: _Batch, sources: set[Connection]) -> None:
    """Wait until `batch` ends or is relayed, or one of `sources` is lost."""
    event = trio.Event()
    batch.watch(event)
    for source in sources:
        source.watch(event)
    try:
        await event.wait()
    finally:
        for source in sources:
            source.unwatch(event)


def _values(job: Job, program: KeptProgram) -> list[int]:
    """The var values of this job's calls of shipped code (Batch.values), in order."""
    if not program.values:
        return []
    ops = job.ops
    values: list[int] = []
    for index in program.values:
        op = ops[index]
        assert type(op) is WireOp and op.values is not None
        values += op.values
    return values

"""One client's session on a worker: its buffers, programs, blobs and signal mirrors.

A `Session` checks each request against the worker's `Limits` and the client's own ids
(every field of a message is checked when it is decoded, devices/remote/wire.py), lowers
the client's programs onto the worker's queue actors (_lowering.py) and hands batches to
its `Batches` (_batches.py). What it sends goes through an `Outbox` (_outbox.py); how far
its queues have got, and what other workers asked for when they get further, is its
`Progress` (_progress.py). The worker's design and its safety rules are described in
actorgraph/worker/_server.py.
"""

from __future__ import annotations

import functools
import secrets
import sys
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import trio

from actorgraph.devices import HoldingSignal, Job, QueueActor, Quick, Signal
from actorgraph.devices.remote.wire import (
    DTYPES,
    DTYPES_TEXT,
    REL_MAX,
    VALUE_MAX,
    Alloc,
    Batch,
    Ext,
    Fence,
    Forget,
    Free,
    GetWhen,
    Ping,
    Pong,
    Prog,
    Ref,
    Watch,
    WireError,
    kind_of,
    read_ticket,
)
from actorgraph.scheduler import QueueKind

from .._buffer import Buffer
from .._errors import ActorGraphError, UsageError
from ._batches import Batches, blobs_of, read_of, values_of
from ._lowered import Program, Refused, signal_slot
from ._lowered import queue_key as _queue_key
from ._lowered import queue_kind as _queue_kind
from ._lowering import lower
from ._machine_code import CodeStore
from ._outbox import COPIED_BELOW, Outbox, send_data
from ._progress import Progress, TrackedSignal
from ._staging import Taken, bytes_of

if TYPE_CHECKING:
    from ._host import Host


_MAX_FENCED = 1 << 12  # other workers' sessions a client may fence reads of


_VIEWS = 256  # views of one buffer a session keeps made (a KV cache's, one per position)


class Session:
    """One client's state on the worker: its buffers, programs, blobs and mirrors."""

    def __init__(
        self, worker: Host, sid: int, out: Outbox, nursery: trio.Nursery | None = None
    ) -> None:
        self.worker = worker
        # This client's own queue actor per device, made on first use (CPU, SIM, and CUDA
        # with a stream of its own): a job waiting on this client's mirrors never holds
        # another client's work. The actors live in the connection's nursery and go with
        # it; `abandon` gives back their streams.
        self._nursery = nursery
        self.queues: dict[tuple[str, QueueKind], QueueActor] = {}
        self.sid = sid
        self.key = secrets.token_bytes(32)
        self.out = out
        self.buffers: dict[int, Buffer] = {}
        # This client's shipped programs (--allow-programs): its ids, its alone.
        self.codes = CodeStore(worker.cpu, worker.limits, "this worker")
        # What other workers' reads of this client's buffers look up, kept while a buffer
        # lives: its read ticket, and its bytes by (offset, shape).
        self._tickets: dict[int, bytes] = {}
        self._peer_views: dict[int, dict[tuple[int | str, ...], memoryview]] = {}
        # The views of a buffer its programs name, by (offset, dtype, shape), kept while
        # it lives (at most _VIEWS a buffer): a program lowered again finds them made.
        self._views: dict[int, dict[tuple[int | str, ...], Buffer]] = {}
        self.refused: dict[int, str] = {}
        self.programs: dict[int, Program] = {}
        self._blobs: dict[int, tuple[bytearray, int]] = {}  # id -> (landing space, size)
        self.blob_bytes = 0
        self.mirrors: dict[int, Signal] = {}
        self.bytes_used = 0
        self._progress: dict[str, Progress] = {}
        self.reads_waiting = 0  # GetWhen and Watch requests not yet due
        self.batches = Batches(self)
        # AWAIT ops a job run inline runs at once where it can (devices/_inline.py).
        self.report_op = Quick(self._report_now)
        # The AWAIT op of a host read: done at once unless its bytes are sent as they are.
        self.read_op = Quick(self._read_now, self._read_later)
        # The AWAIT op that takes a host write's blobs for its batch: always at once.
        self.take_op = Quick(self._take_now)
        # The AWAIT op that puts a job's var values where its calls of shipped code read
        # them, as it starts: always at once.
        self.values_op = Quick(_values_now)
        # Bytes of this client's frames taken (each handled) since the handshake, what
        # reads by other workers wait for (`client_took`), and the reads waiting.
        self.taken = 0
        self._fenced: list[tuple[int, trio.Event]] = []
        # How far this client had written to each other worker's session this one reads
        # from, by (host, port, session id), as its Fences said: what such a read waits
        # for there (PRead.after).
        self.fences: dict[tuple[str, int, int], int] = {}
        self.closed = False

    def queue(self, device_name: str, kind: QueueKind = QueueKind.COMPUTE) -> QueueActor:
        """The queue of `kind` this client's programs on `device_name` run on."""
        actor = self.queues.get((device_name, kind))
        if actor is None:
            device = self.worker.runtime.device(device_name)
            shared = device.queues.get(kind)
            if shared is None:
                raise Refused(
                    f"device {device_name} of this worker has no {kind.value} queue (it has "
                    f"{', '.join(k.value for k in device.queues)}); send its programs there"
                )
            own = None
            if self._nursery is not None:
                # Its signal tells this client's progress as it moves, where the kind
                # takes a signal of ours, so a worker waiting on this queue hears of it at
                # any signal, reported or not.
                progress = self.progress(_queue_key(device_name, kind))
                own = device.new_queue(
                    kind,
                    f"{shared.name}#{self.sid}",
                    lambda name, start: TrackedSignal(name, start, progress, self.worker.resumer),
                )
            if own is not None:
                self._nursery.start_soon(own.serve)  # type: ignore[union-attr]
            actor = self.queues[(device_name, kind)] = own or shared
        return actor

    def broke(self, error: BaseException) -> None:
        """Running one of this client's jobs raised where its actor's task would have died
        of it: this client's connection ends (its replays fail, as when its worker is
        lost), never the task that ran the job nor anyone else's work."""
        print(
            f"actorgraph worker: dropped a connection: a job of it raised {error!r}",
            file=sys.stderr,
        )
        if self._nursery is None:
            raise error
        self._nursery.cancel_scope.cancel()

    def abandon(self) -> None:
        """The client is gone. Its jobs still queued (on its own actors, which end with its
        connection, or on a device's shared actors) must not block anyone: fail them
        (their items are skipped) and release every wait on a signal only this client
        could have advanced."""
        self.batches.abandon()
        for mirror in self.mirrors.values():
            mirror.set(VALUE_MAX + REL_MAX)
        for progress in self._progress.values():
            progress.set(VALUE_MAX + REL_MAX)  # reads waiting on them get an error
        busy: dict[str, bool] = {}  # device -> whether a dropped queue of it may still wait
        for (name, kind), actor in self.queues.items():
            device = self.worker.runtime.device(name)
            dropped = actor is not device.queues[kind] and device.drop_queue(actor)
            busy[name] = busy.get(name, False) or bool(dropped)
        for name, stuck in busy.items():
            # The mirrors' words on a GPU, for reuse unless one of this client's streams
            # there was dropped while it may still wait on one of them. Once per device:
            # its first call takes them.
            self.worker.runtime.device(name).forget_signals(self.mirrors.values(), idle=not stuck)
        self.queues.clear()

    def close(self) -> None:
        """The connection ended: after `abandon`, free every buffer of this client through
        the runtime (its memory goes back at once), give back its pending host writes,
        and let go of its programs, shipped code, mirrors and reads, so that nothing of this client
        holds memory, whatever still refers to this session (a job or a frame that a
        reference cycle keeps until the cycle collector runs)."""
        self.abandon()
        runtime = self.worker.runtime
        for buf in self.buffers.values():
            runtime.free(buf)
        self.buffers.clear()
        self.refused.clear()
        self._tickets.clear()
        self._peer_views.clear()
        self._views.clear()
        for program in self.programs.values():
            program.release()
        self.programs.clear()
        self.codes.clear()
        for blob_id in list(self._blobs):
            self.drop_blob(blob_id)
        self.batches.release()
        self.mirrors.clear()
        self._progress.clear()
        self.bytes_used = 0
        self.closed = True
        fenced, self._fenced = self._fenced, []
        for _, event in fenced:
            event.set()  # the reads find no session, and say so

    # -- how far this client's frames are taken: what another worker's read waits for --

    def took(self, taken: int) -> None:
        """This client's frames are taken and handled up to byte `taken` of its stream."""
        self.taken = taken
        if self._fenced:
            due = [event for after, event in self._fenced if after <= taken]
            self._fenced = [(after, event) for after, event in self._fenced if after > taken]
            for event in due:
                event.set()

    async def client_took(self, after: int) -> None:
        """Return once this client's frames are taken up to byte `after` of its stream
        (or the session ended): a read of its buffers by another worker follows every
        write its client had sent here before it let that read go on."""
        if self.taken >= after or self.closed:
            return
        event = trio.Event()
        self._fenced.append((after, event))
        await event.wait()

    def fence_of(self, host: str, port: int, sid: int) -> int:
        """How far this client had written to that worker's session when it last said."""
        return self.fences.get((host, port, sid), 0)

    # -- lookups, each with a refusal that names the id --

    def holds(self, handle: int) -> bool:
        """Whether `handle` is one of this client's allocations (or one it was refused)."""
        return handle in self.buffers or handle in self.refused

    def buffer(self, ref: Ref, what: str) -> Buffer:
        """The buffer (view) `ref` names."""
        base = self.buffers.get(ref.handle)
        if base is None:
            why = self.refused.get(ref.handle)
            if why is not None:
                raise Refused(f"{what}: buffer {ref.handle} was refused: {why}")
            raise Refused(f"{what}: unknown buffer id {ref.handle} (not allocated by this client)")
        shape = ref.shape
        if not ref.dtype and (not shape or (ref.offset == 0 and shape == base.shape)):
            # The whole buffer: the same object each time, so a kernel given it twice
            # gets one array twice (numpy skips its overlap check for identical arrays).
            return base
        views = self._views.get(ref.handle)
        if views is None:
            views = self._views[ref.handle] = {}
        key: tuple[int | str, ...] = (ref.offset, ref.dtype, *shape)
        view = views.get(key)
        if view is not None:
            return view
        try:
            if ref.dtype:  # a view with a dtype of its own: the offset counts its elements
                dtype = np.dtype(ref.dtype)
                view = base.view(
                    byte_offset=ref.offset * dtype.itemsize, dtype=dtype, shape=shape or None
                )
            else:
                view = base.view(offset=ref.offset, shape=shape)
        except UsageError as exc:
            raise Refused(f"{what}: {exc}") from None
        if len(views) >= _VIEWS:
            views.clear()
        views[key] = view
        return view

    def read_ticket(self, handle: int) -> bytes:
        """The ticket a read of buffer `handle` must carry (the HMAC this client made)."""
        ticket = self._tickets.get(handle)
        if ticket is None:
            ticket = read_ticket(self.key, handle)
            if handle in self.buffers:  # kept only while the buffer lives
                self._tickets[handle] = ticket
        return ticket

    def peer_bytes(self, ref: Ref) -> memoryview:
        """The bytes of the buffer (view) `ref` names, for a read by another worker: looked
        up and checked as `buffer` does the first time, then kept while it lives."""
        views = self._peer_views.get(ref.handle)
        key: tuple[int | str, ...] = (ref.offset, ref.dtype, *ref.shape)
        if views is not None:
            view = views.get(key)
            if view is not None:
                return view
        view = bytes_of(self.buffer(ref, "pread src"))
        self._peer_views.setdefault(ref.handle, {})[key] = view
        return view

    def mirror(self, ext_id: int) -> Signal:
        """The mirror of the client's signal `ext_id` (made on first use)."""
        signal = self.mirrors.get(ext_id)
        if signal is None:
            limit = self.worker.limits.max_signals
            if len(self.mirrors) >= limit:
                raise Refused(f"too many mirrored signals (limit {limit})")
            # Jobs waiting on it are held there and run on in the task that moves it.
            signal = self.mirrors[ext_id] = HoldingSignal(f"mirror{ext_id}", 0, self.worker.resumer)
        return signal

    def set_mirrors(self, values: Iterable[tuple[int, int]]) -> None:
        """Mirrored signals' new values (an Ext, or those a batch carries)."""
        for ext_id, value in values:
            self.mirror(ext_id).set(value)

    def progress(self, queue: str) -> Progress:
        """How far this client's queue `queue` (DEVICE: its compute queue, DEVICE/copy: its
        copy queue) has got, in the client's values (what the worker reports to it): what
        reads from other workers wait on."""
        progress = self._progress.get(queue)
        if progress is None:
            device, _, kind = queue.partition("/")
            if device not in self.worker.runtime.devices or kind not in ("", "copy"):
                raise Refused(
                    f"this worker has no queue {queue!r}: name a device's compute queue as "
                    f"DEVICE and its copy queue as DEVICE/copy ({self.worker.runtime.devices})"
                )
            progress = self._progress[queue] = Progress()
        return progress

    # -- host writes' bytes, received ahead of their programs --

    def drop_blob(self, blob_id: int) -> None:
        """Forget a pending blob (one sent again under its id replaces it): its bytes stop
        counting, and its memory goes back to the worker's pool."""
        replaced = self._blobs.pop(blob_id, None)
        if replaced is not None:
            self.blob_bytes -= replaced[1]
            self.worker.staging.give(replaced[0])

    def keep_blob(self, blob_id: int, data: bytearray, size: int) -> None:
        self._blobs[blob_id] = (data, size)
        self.blob_bytes += size

    def take_blob(self, blob_id: int) -> tuple[bytearray, int]:
        """A pending blob, for the host write that lands it."""
        blob = self._blobs.pop(blob_id, None)
        if blob is None:
            raise Refused(f"unknown blob id {blob_id}")
        self.blob_bytes -= blob[1]
        return blob

    # -- requests --

    def handle(self, request: Any) -> None:
        """A request without data (a message of wire.py, decoded): handled by its type.
        Raises Refused for a message a client does not send, or what its handler raises
        (Refused, WireError) for a request refused."""
        handler = self._handlers.get(type(request))
        if handler is None:
            raise Refused(
                f"unknown request {kind_of(type(request))!r}: a client sends only "
                f"{', '.join(sorted(kind_of(kind) for kind in self._handlers))} without data"
            )
        handler(self, request)

    def _alloc(self, request: Alloc) -> None:
        handle = request.handle
        if handle in self.buffers or handle in self.refused:
            raise Refused(f"buffer id {handle} is already in use")
        try:
            self.buffers[handle] = self._allocate(request)
        except (Refused, WireError) as exc:
            self.refused[handle] = str(exc)
            raise

    def _allocate(self, request: Alloc) -> Buffer:
        devices = self.worker.runtime.devices
        if request.device not in devices:
            raise Refused(f"this worker has no device {request.device!r} ({devices})")
        if request.dtype not in DTYPES:
            raise Refused(f"dtype {request.dtype!r} is not {DTYPES_TEXT}")
        nbytes = request.elements * np.dtype(request.dtype).itemsize
        limits = self.worker.limits
        if nbytes > limits.max_alloc_bytes:
            raise Refused(
                f"{nbytes} bytes is over the limit of {limits.max_alloc_bytes} per allocation"
            )
        if self.bytes_used + nbytes > limits.max_session_bytes:
            raise Refused(
                f"{nbytes} more bytes would pass this client's limit of {limits.max_session_bytes}"
            )
        try:
            buffer = self.worker.runtime.alloc(request.device, request.elements, request.dtype)
        except ActorGraphError as exc:  # its device refused it (its memory, its dtypes)
            raise Refused(str(exc)) from None
        self.bytes_used += nbytes
        return buffer

    def _free(self, request: Free) -> None:
        buf = self.buffers.pop(request.handle, None)
        if buf is None:
            self.refused.pop(request.handle, None)
            return
        self._tickets.pop(request.handle, None)
        self._peer_views.pop(request.handle, None)
        self._views.pop(request.handle, None)
        self.bytes_used -= buf.nbytes
        self.worker.runtime.free(buf)

    def _forget(self, request: Forget) -> None:
        if self.programs.pop(request.program, None) is not None:
            self.batches.forget(request.program)

    def _ext(self, request: Ext) -> None:
        self.set_mirrors(request.values)

    def _fence(self, request: Fence) -> None:
        fences = self.fences
        for host, port, sid, taken in request.sources:
            key = (host, port, sid)
            if key not in fences and len(fences) >= _MAX_FENCED:
                raise Refused(
                    f"fences for more than {_MAX_FENCED} sessions of other workers; a client "
                    f"names only the sessions its copies read from"
                )
            if taken > fences.get(key, 0):
                fences[key] = taken

    def _prog(self, request: Prog) -> None:
        limit = self.worker.limits.max_programs
        if len(self.programs) >= limit:
            raise Refused(f"too many programs (limit {limit}); forget some")
        store = request.store
        try:
            program = lower(self, request.device, request.entries, _queue_kind(request.kind), store)
        except (Refused, WireError) as exc:
            # Its batch reports the refusal on the slot the program signals on.
            why = (exc.item if isinstance(exc, Refused) else -1, str(exc))
            program = Program(store=store, slot=signal_slot(request.entries), error=why)
        except Exception as exc:  # a device refused to lower an item: the same, never a
            # program half lowered that a batch would then post
            why = (-1, f"{type(exc).__name__}: {exc}")
            program = Program(store=store, slot=signal_slot(request.entries), error=why)
        if self.programs.get(request.program) is not None:
            self.batches.forget(request.program)  # its id now names another program
        self.programs[request.program] = program

    def _batch(self, request: Batch) -> None:
        try:
            self.batches.run(request)
        except (Refused, WireError):
            self.batches.drop_blobs(request)  # it never runs: its bytes go back
            raise

    def _count_read(self) -> None:
        limit = self.worker.limits.max_signals
        if self.reads_waiting >= limit:
            raise Refused(f"too many waiting reads (limit {limit})")
        self.reads_waiting += 1

    def _getwhen(self, request: GetWhen) -> None:
        """Send a buffer's bytes once this client's queue reaches a value (in the client's
        values): from the task that gets it there, ahead of that signal's report, so a
        copy to the client that waits for it costs one message."""
        data = bytes_of(self.buffer(request.src, "getwhen src"))
        progress = self.progress(request.queue)
        self._count_read()
        due = functools.partial(self._send_when, request.read, request.src.handle, data)
        progress.when(request.value, due)

    def _send_when(self, read_id: int, handle: int, data: memoryview) -> None:
        self.reads_waiting -= 1
        if handle not in self.buffers:
            send_data(self.out, read_id, data, "the buffer was freed, or its client left")
            return
        # The tail is the buffer itself (when large): the client's copy, which waits for
        # it, is what later writes to the buffer wait for, so it cannot change meanwhile.
        send_data(self.out, read_id, data)

    def _watch(self, request: Watch) -> None:
        """Answer (a Data of no bytes) once this client's queue reaches a value: how the
        client relays a wait between two workers whose link failed."""
        progress = self.progress(request.queue)
        self._count_read()
        progress.when(request.value, functools.partial(self._told, request.read))

    def _told(self, read_id: int) -> None:
        self.reads_waiting -= 1
        send_data(self.out, read_id, memoryview(b""))

    def _ping(self, request: Ping) -> None:
        """Answer at once, saying when on this worker's clock: a round trip of the
        client's measurement of it (devices/remote/_clock.py)."""
        received = time.perf_counter()
        self.out.send(Pong(request.ping, received, time.perf_counter()))

    _handlers: ClassVar[dict[type, Callable[[Session, Any], None]]] = {
        Alloc: _alloc,
        Free: _free,
        Forget: _forget,
        Ext: _ext,
        Fence: _fence,
        Prog: _prog,
        Batch: _batch,
        GetWhen: _getwhen,
        Watch: _watch,
        Ping: _ping,
    }

    # -- AWAIT ops run by the worker's actors --

    def _report_now(self, job: Job, slot: int, rel: int, device: str) -> bool:
        """Report a signal of this client's job (a Sig), with what its new value makes
        due (the bytes the client asked for ahead) in one send."""
        self.out.hold()
        try:
            self.batches.reached(job, slot, rel, device)
            self.batches.report(job, slot, rel)
        finally:
            self.out.release()
        return True

    def _take_now(self, job: Job, first: int, count: int, nbytes: int, taken: Taken) -> bool:
        """A host write's blobs, as its batch names them (Batch.blobs: `count` from
        `first`), for the op that lands them (`taken`); let go of at once if its
        submission failed. Raises Refused for a blob that did not come, or bytes that
        are not `nbytes`."""
        chunks = []
        try:
            for blob_id in blobs_of(job)[first : first + count]:
                chunks.append(self.take_blob(blob_id))
            total = sum(size for _, size in chunks)
            if total != nbytes and job.submission.error is None:
                raise Refused(f"host write of {total} bytes into {nbytes}")
        except Refused:
            self._give_back(chunks)
            raise
        if job.submission.error is not None:
            self._give_back(chunks)
        else:
            taken.chunks = chunks
        return True

    def _give_back(self, chunks: list[tuple[bytearray, int]]) -> None:
        for data, _ in chunks:
            self.worker.staging.give(data)

    def _read_now(self, job: Job, index: int, data: memoryview) -> bool:
        """A host read (an HR entry, its program's host read `index`) once its queue got
        there: its bytes go to the read its batch names for it. Small ones are copied as
        they are sent: done at once (True); a large one is sent as the buffer itself,
        which must not change until it has left (False: `_read_later`)."""
        if job.submission.error is None and len(data) >= COPIED_BELOW:
            return False
        self._send_read(job, index, data)
        return True

    async def _read_later(self, job: Job, index: int, data: memoryview) -> None:
        await self._send_read(job, index, data).wait()

    def _send_read(self, job: Job, index: int, data: memoryview) -> trio.Event:
        read_id = read_of(job, index)
        if job.submission.error is not None:
            return send_data(self.out, read_id, data, "an earlier item of this submission failed")
        return send_data(self.out, read_id, data)


def _values_now(job: Job, cell: list[list[int]]) -> bool:
    """A job of a program whose calls of shipped code take var values starts: theirs are
    those its batch sent (Batch.values)."""
    cell[0] = values_of(job)
    return True

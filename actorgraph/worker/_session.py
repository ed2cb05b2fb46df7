"""One client's session on a worker: its buffers, programs, blobs and signal mirrors.

A `Session` checks each request against the worker's `Limits` and the client's own ids,
lowers the client's programs onto the worker's queue actors and posts a batch's jobs.
What it sends goes through an `Outbox` (_outbox.py); how far its queues have got, and
what other workers asked for when they get further, is its `Progress` (_progress.py).
The worker's design and its safety rules are described in actorgraph/remote/_worker.py.
"""

from __future__ import annotations

import functools
import secrets
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import trio

from actorgraph.devices import (
    BATCH,
    FIRST_QUEUE_SLOT,
    HoldingSignal,
    InlineRun,
    Job,
    QueueActor,
    Quick,
    Signal,
    Submission,
)
from actorgraph.devices.remote.wire import (
    CHUNK,
    DTYPES,
    WireError,
    read_ticket,
    want_fields,
    want_int,
    want_list,
    want_str,
)
from actorgraph.scheduler import QueueKind

from .._buffer import Buffer
from .._errors import UsageError
from ._lowered import REL_MAX, VALUE_MAX, Program, Refused, signal_slot
from ._lowered import queue_key as _queue_key
from ._lowered import queue_kind as _queue_kind
from ._lowering import lower
from ._outbox import Outbox
from ._peers import PeerRefusedError
from ._progress import Progress, TrackedSignal
from ._staging import bytes_of

if TYPE_CHECKING:
    from ._peers import PeerRead
    from ._server import Worker


class _BatchSubmission(Submission):
    """The submission of one batch: each job's end is reported to the client as it ends,
    wherever it ran (inline in the reader's task, or on its actor)."""

    __slots__ = ("batch_id", "programs", "session")

    def __init__(self, session: Session, batch_id: int, programs: list[Program]) -> None:
        super().__init__(len(programs), [], [], [()] * len(programs), [])
        self.session = session
        self.batch_id = batch_id
        self.programs = programs

    def job_done(self, slot: int) -> None:
        self.session._job_done(self.batch_id, self.programs[slot], self)
        super().job_done(slot)


class Session:
    """One client's state on the worker: its buffers, programs, blobs and mirrors."""

    def __init__(
        self, worker: Worker, sid: int, out: Outbox, nursery: trio.Nursery | None = None
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
        # What other workers' reads of this client's buffers look up, kept while a buffer
        # lives: its read ticket, and its bytes by (offset, shape).
        self._tickets: dict[int, bytes] = {}
        self._peer_views: dict[int, dict[tuple[Any, ...], memoryview]] = {}
        self.refused: dict[int, str] = {}
        self.programs: dict[int, Program] = {}
        self.blobs: dict[int, tuple[bytearray, int]] = {}  # id -> (landing space, size)
        self.blob_bytes = 0
        self.mirrors: dict[int, Signal] = {}
        self.bytes_used = 0
        self.running: set[Submission] = set()
        # Program ids of batches that passed every check together -> (their programs,
        # the highest base slot they use): see _seen_batch.
        self._batches_seen: dict[tuple[int, ...], tuple[tuple[Program, ...], int]] = {}
        self._progress: dict[str, Progress] = {}
        self.client_bases: dict[int, list[int]] = {}  # batch id -> the client's bases
        self.early: dict[tuple[int, int], tuple[PeerRead, bytearray]] = {}
        self.early_bytes = 0
        self.reads_waiting = 0  # "getwhen" reads not yet due
        # AWAIT ops a job run inline runs at once where it can (devices/_inline.py).
        self.pull_op = Quick(self._pull_now, self._pull)
        self.report_op = Quick(self._report_now)

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
                own = device.new_queue(kind, f"{shared.name}#{self.sid}")
            if own is not None:
                if type(own) is QueueActor and type(own.signal) is Signal:
                    # Its signal tells this client's progress as it moves, so a worker
                    # waiting on this queue hears of it at any signal, reported or not.
                    own.signal = TrackedSignal(
                        own.signal.name,
                        own.signal.value,
                        self.progress(_queue_key(device_name, kind)),
                        self.worker.resumer,
                    )
                self._nursery.start_soon(own.serve)  # type: ignore[union-attr]
            actor = self.queues[(device_name, kind)] = own or shared
        return actor

    def _broke(self, error: BaseException) -> None:
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
        for sub in list(self.running):
            sub.fail(-1, "worker", ConnectionError("the client went away"))
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

    # -- lookups, each with a refusal that names the id --

    def buffer(self, ref: object, what: str) -> Buffer:
        ref = want_list(ref, what, 3, size=3)
        handle = want_int(ref[0], f"{what} handle")
        base = self.buffers.get(handle)
        if base is None:
            why = self.refused.get(handle)
            if why is not None:
                raise Refused(f"{what}: buffer {handle} was refused: {why}")
            raise Refused(f"{what}: unknown buffer id {handle} (not allocated by this client)")
        offset = want_int(ref[1], f"{what} offset")
        shape = tuple(want_int(d, f"{what} shape") for d in want_list(ref[2], f"{what} shape", 8))
        if not shape or (offset == 0 and shape == base.shape):
            # The whole buffer: the same object each time, so a kernel given it twice
            # gets one array twice (numpy skips its overlap check for identical arrays).
            return base
        try:
            return base.view(offset=offset, shape=shape)
        except UsageError as exc:
            raise Refused(f"{what}: {exc}") from None

    def read_ticket(self, handle: int) -> bytes:
        """The ticket a read of buffer `handle` must carry (the HMAC this client made)."""
        ticket = self._tickets.get(handle)
        if ticket is None:
            ticket = read_ticket(self.key, handle)
            if handle in self.buffers:  # kept only while the buffer lives
                self._tickets[handle] = ticket
        return ticket

    def peer_bytes(self, ref: list[Any]) -> memoryview:
        """The bytes of the buffer (view) `ref` names, for a read by another worker: looked
        up and checked as `buffer` does the first time, then kept while it lives."""
        views = self._peer_views.get(ref[0])
        if views is not None:
            try:
                view = views.get((ref[1], *ref[2]))
            except TypeError:  # not a well formed ref: `buffer` says why
                view = None
            if view is not None:
                return view
        view = bytes_of(self.buffer(ref, "pread src"))
        shape = ref[2]
        self._peer_views.setdefault(ref[0], {})[(ref[1], *shape)] = view
        return view

    def mirror(self, ext_id: object) -> Signal:
        ext = want_int(ext_id, "signal id")
        signal = self.mirrors.get(ext)
        if signal is None:
            if len(self.mirrors) >= self.worker.limits.max_signals:
                raise Refused(f"too many mirrored signals (limit {self.worker.limits.max_signals})")
            # Jobs waiting on it are held there and run on in the task that moves it.
            signal = self.mirrors[ext] = HoldingSignal(f"mirror{ext}", 0, self.worker.resumer)
        return signal

    # -- requests --

    def handle(self, meta: list[Any]) -> None:
        kind = meta[0]
        handler = self._handlers.get(kind)
        if handler is None:
            raise Refused(f"unknown request {kind!r}")
        handler(self, meta)

    def _alloc(self, meta: list[Any]) -> None:
        _, handle, device, nelems, dtype = want_fields(meta, 5)
        handle = want_int(handle, "alloc handle")
        if handle in self.buffers or handle in self.refused:
            raise Refused(f"buffer id {handle} is already in use")
        try:
            device = want_str(device, "alloc device")
            if device not in self.worker.runtime.devices:
                raise Refused(
                    f"this worker has no device {device!r} ({self.worker.runtime.devices})"
                )
            if dtype not in DTYPES:
                raise Refused(f"dtype {dtype!r} is not one of {sorted(DTYPES)}")
            nelems = want_int(nelems, "alloc size")
            nbytes = nelems * np.dtype(dtype).itemsize
            limits = self.worker.limits
            if nbytes > limits.max_alloc_bytes:
                raise Refused(
                    f"{nbytes} bytes is over the limit of {limits.max_alloc_bytes} per allocation"
                )
            if self.bytes_used + nbytes > limits.max_session_bytes:
                raise Refused(
                    f"{nbytes} more bytes would pass this client's limit of "
                    f"{limits.max_session_bytes}"
                )
            self.buffers[handle] = self.worker.runtime.alloc(device, nelems, dtype)
            self.bytes_used += nbytes
        except (Refused, WireError) as exc:
            self.refused[handle] = str(exc)
            raise

    def _free(self, meta: list[Any]) -> None:
        handle = want_int(want_fields(meta, 2)[1], "free handle")
        buf = self.buffers.pop(handle, None)
        if buf is None:
            self.refused.pop(handle, None)
            return
        self._tickets.pop(handle, None)
        self._peer_views.pop(handle, None)
        self.bytes_used -= buf.nbytes
        self.worker.runtime.free(buf)

    def _forget(self, meta: list[Any]) -> None:
        self.programs.pop(want_int(want_fields(meta, 2)[1], "program id"), None)

    def _ext(self, meta: list[Any]) -> None:
        for pair in want_list(want_fields(meta, 2)[1], "ext", 1 << 16):
            pair = want_list(pair, "ext entry", 2, size=2)
            self.mirror(pair[0]).set(want_int(pair[1], "ext value", 0, VALUE_MAX))

    def _prog(self, meta: list[Any]) -> None:
        if len(meta) == 5:  # ["prog", id, device, entries, store(, queue kind)]
            meta = [*meta, "compute"]
        _, prog_id, device, entries, store, kind = want_fields(meta, 6)
        prog_id = want_int(prog_id, "program id")
        if len(self.programs) >= self.worker.limits.max_programs:
            raise Refused(
                f"too many programs (limit {self.worker.limits.max_programs}); forget some"
            )
        program = Program()
        program.store = store is True
        self.programs[prog_id] = program
        try:
            lower(self, program, want_str(device, "program device"), entries, _queue_kind(kind))
        except (Refused, WireError) as exc:
            program.error = (exc.item if isinstance(exc, Refused) else -1, str(exc))
            # Its batch reports the refusal on the slot the program signals on.
            program.slot = signal_slot(entries)
        except Exception as exc:  # a device refused to lower an item: the same, never a
            # program half lowered that a batch would then post
            program.error = (-1, f"{type(exc).__name__}: {exc}")
            program.slot = signal_slot(entries)

    def _seen_batch(self, meta: list[Any]) -> tuple[int, list[int], list[Program]] | None:
        """(batch id, bases, programs) of a batch of kept programs that passed every check
        of `_batch` together before (a replay of a graph: the same programs each time),
        its ids and bases checked as `_batch` checks them; None for anything else, which
        `_batch` then checks in full (and refuses, naming the field, where it must)."""
        if len(meta) != 5:
            return None
        _, batch_id, bases, prog_ids, _ = meta
        if type(batch_id) is not int or not 0 <= batch_id < 1 << 63:
            return None
        if type(bases) is not list or not FIRST_QUEUE_SLOT <= len(bases) <= 1 << 17:
            return None
        for base in bases:
            if type(base) is not int or not 0 <= base <= VALUE_MAX:
                return None
        if type(prog_ids) is not list or not all(type(pid) is int for pid in prog_ids):
            return None
        key = tuple(prog_ids)
        seen = self._batches_seen.get(key)
        if seen is None or seen[1] >= len(bases):
            return None
        programs = self.programs
        for pid, program in zip(key, seen[0]):
            if programs.get(pid) is not program:
                return None  # forgotten since, or its id given to another program
        return batch_id, bases, list(seen[0])

    def _batch(self, meta: list[Any]) -> None:
        seen = self._seen_batch(meta)
        if seen is not None:
            batch_id, bases, programs = seen
            self._ext(["ext", meta[4]])
            error: tuple[int, str] | None = None
        else:
            batch_id, bases, programs, error = self._check_batch(meta)
        client_bases = list(bases)
        if error is None:
            error = self._reserve(programs, bases)
        if error is not None:
            for p in programs:
                self.out.send(["done", batch_id, p.slot, [error[0], "worker", error[1]]])
            return
        self.client_bases[batch_id] = client_bases
        peers = self.worker.peers
        peers.hold()  # the batch's reads and watches leave in one send per link
        try:
            self._ask_peers(batch_id, programs, client_bases)
        finally:
            peers.release()
        for p in programs:
            tracked = p.actor.signal  # type: ignore[union-attr]
            if type(tracked) is TrackedSignal:
                base = bases[p.slot]
                tracked.jobs.append((base, base + p.count, client_bases[p.slot]))
        bases[BATCH] = batch_id  # the id the worker's reports name
        sub = _BatchSubmission(self, batch_id, programs)
        self.running.add(sub)
        sub.on_done = functools.partial(self._batch_done, batch_id, programs)
        times = self.worker.times
        for p in programs:
            if p.template is not None and times.stale(p.version):
                p.ops, p.version = times.code(p.template)  # a kernel changed sides
        actors: list[QueueActor] = [p.actor for p in programs]  # type: ignore[misc]
        jobs = [Job(p.ops, bases, sub, i) for i, p in enumerate(programs)]
        if all(a.idle and a.runs_inline for a in actors) and len(set(actors)) == len(actors):
            # Every queue of the batch is idle: run it here, in the reader's task, as the
            # client runs a replay on idle queues; a job that waits for another worker or
            # the client is held and runs on in the task that moves what it waits on, and
            # one that needs a task (a kernel on the thread, a pull over a new link) goes
            # on to its actor (devices/_inline.py).
            self.worker.resumer.start(InlineRun(actors, jobs, self._broke))
        else:
            for actor, job in zip(actors, jobs):
                actor.post(job)

    def _check_batch(
        self, meta: list[Any]
    ) -> tuple[int, list[int], list[Program], tuple[int, str] | None]:
        """Check a batch in full: (batch id, bases, programs, the error its jobs fail
        with or None). A batch that passes, all of its programs kept, is remembered:
        the same programs come again at each replay (`_seen_batch`)."""
        _, batch_id, bases, prog_ids, ext = want_fields(meta, 5)
        batch_id = want_int(batch_id, "batch id")
        bases = [want_int(b, "base", 0, VALUE_MAX) for b in want_list(bases, "bases", 1 << 17)]
        if len(bases) < FIRST_QUEUE_SLOT:
            raise Refused(f"batch {batch_id}: {len(bases)} bases; a batch has KICK and BATCH first")
        programs: list[Program] = []
        error: tuple[int, str] | None = None
        for pid in want_list(prog_ids, "program ids", 1 << 16):
            pid = want_int(pid, "program id")
            program = self.programs.get(pid)
            if program is None:
                raise Refused(f"batch {batch_id}: unknown program id {pid}")
            if not program.store:
                del self.programs[pid]
            programs.append(program)
            error = error or program.error
        self._ext(["ext", ext])
        slots = {p.slot: p for p in programs}
        if error is None:
            if len(slots) != len(programs):
                error = (-1, "two programs of one batch run on one slot")
            for p in programs:
                if p.max_slot >= len(bases):
                    error = (-1, f"a program uses base slot {p.max_slot} of {len(bases)}")
                for slot, dev, kind in p.local_waits:
                    other = slots.get(slot)
                    if other is None or other.actor is not self.queue(dev, kind):
                        error = (
                            -1,
                            f"a local wait on slot {slot} names no {kind.value} queue of this "
                            f"batch on {dev}",
                        )
        if error is None and programs and all(p.store for p in programs):
            if len(self._batches_seen) >= self.worker.limits.max_programs:
                self._batches_seen.clear()
            self._batches_seen[tuple(prog_ids)] = (
                tuple(programs),
                max(p.max_slot for p in programs),
            )
        return batch_id, bases, programs, error

    def _ask_peers(self, batch_id: int, programs: list[Program], client_bases: list[int]) -> None:
        """Ask other workers for what the batch's jobs wait on: a copy's bytes (read ahead),
        or to be told when a queue gets to a value."""
        for p in programs:
            for item, source, inner, slot, rel, ext_id, nbytes in p.early:
                # Staging held for reads asked ahead counts like pending host writes;
                # past the limit a copy reads its bytes when it runs.
                if self.early_bytes + nbytes <= self.worker.limits.max_pending_blob_bytes:
                    self.early_bytes += nbytes
                    value = client_bases[slot] + rel
                    arrived = functools.partial(self.mirror(ext_id).set, value)
                    lost = functools.partial(self._link_lost, batch_id, source[0], source[1])
                    self.early[(batch_id, item)] = self.worker.peers.pull_when(
                        *source, inner, value, nbytes, arrived, lost
                    )
        for p in programs:
            pulled = {(slot, rel, ext_id) for _, _, _, slot, rel, ext_id, _ in p.early}
            for slot, rel, ext_id, (host, port, sid, queue, ticket) in p.watches:
                value = client_bases[slot] + rel
                mirror = self.mirror(ext_id)
                if mirror.value < value and (slot, rel, ext_id) not in pulled:
                    arrived = functools.partial(mirror.set, value)
                    lost = functools.partial(self._link_lost, batch_id, host, port)
                    self.worker.peers.watch(host, port, sid, queue, ticket, value, arrived, lost)

    @staticmethod
    def _reserve(programs: list[Program], bases: list[int]) -> tuple[int, str] | None:
        """Take each program's timeline values on its actor (its base goes in `bases`), all
        or none: a batch refused because one would pass 2**64-1 leaves every timeline as
        it was, so later batches number their values as if it had never come."""
        taken: list[tuple[QueueActor, int]] = []
        try:
            for p in programs:
                actor = p.actor
                assert actor is not None  # lowered without error: it has its actor
                bases[p.slot] = actor.reserve(p.count)
                taken.append((actor, bases[p.slot]))
        except OverflowError as exc:
            for actor, base in reversed(taken):
                actor.give_back(base)  # nothing was posted
            return (-1, str(exc))
        return None

    def _getwhen(self, meta: list[Any]) -> None:
        """Send a buffer's bytes once this client's queue `queue` reaches `value` (in the
        client's values): from the task that gets it there, ahead of that signal's report,
        so a copy to the client that waits for it costs one message."""
        _, read_id, ref, queue, value = want_fields(meta, 5)
        read_id = want_int(read_id, "read id")
        data = bytes_of(self.buffer(ref, "getwhen src"))
        value = want_int(value, "queue value", 0, VALUE_MAX + REL_MAX)
        progress = self.progress(want_str(queue, "queue"))
        if self.reads_waiting >= self.worker.limits.max_signals:
            raise Refused(f"too many waiting reads (limit {self.worker.limits.max_signals})")
        self.reads_waiting += 1
        progress.when(value, functools.partial(self._send_when, read_id, ref[0], data))

    def _send_when(self, read_id: int, handle: int, data: memoryview) -> None:
        self.reads_waiting -= 1
        if handle not in self.buffers:
            self.out.send(["data", read_id, 0, "the buffer was freed, or its client left"])
            return
        # The tail is the buffer itself (when large): the client's copy, which waits for
        # it, is what later writes to the buffer wait for, so it cannot change meanwhile.
        for off in range(0, len(data), CHUNK):
            self.out.send(["data", read_id, off, None], data[off : off + CHUNK])
        if not len(data):
            self.out.send(["data", read_id, 0, None])

    def _link_lost(self, batch_id: int, host: str, port: int, error: BaseException) -> None:
        """The link to the worker at host:port failed (or refused a watch) before it told
        this one what a job of batch `batch_id` waits for: ask the client to relay those
        waits. It asks that worker itself, over its own connection, and forwards them:
        the job goes on once its source is ready, never before, and never hangs."""
        if batch_id in self.client_bases:  # still running
            self.out.send(["relay", batch_id, host, port, str(error)])

    def _watch(self, meta: list[Any]) -> None:
        """["watch", read id, queue, value]: answer (a "data" frame of no bytes) once this
        client's queue `queue` reaches `value`: how the client relays a wait between two
        workers whose link failed."""
        _, read_id, queue, value = want_fields(meta, 4)
        read_id = want_int(read_id, "read id")
        value = want_int(value, "queue value", 0, VALUE_MAX + REL_MAX)
        progress = self.progress(want_str(queue, "queue"))
        if self.reads_waiting >= self.worker.limits.max_signals:
            raise Refused(f"too many waiting reads (limit {self.worker.limits.max_signals})")
        self.reads_waiting += 1
        progress.when(value, functools.partial(self._told, read_id))

    def _told(self, read_id: int) -> None:
        self.reads_waiting -= 1
        self.out.send(["data", read_id, 0, None])

    _handlers: ClassVar[dict[str, Callable[[Session, list[Any]], None]]] = {
        "alloc": _alloc,
        "free": _free,
        "forget": _forget,
        "ext": _ext,
        "prog": _prog,
        "batch": _batch,
        "getwhen": _getwhen,
        "watch": _watch,
    }

    def _batch_done(self, batch_id: int, programs: list[Program], sub: Submission) -> None:
        self.running.discard(sub)
        self.client_bases.pop(batch_id, None)
        for p in programs:
            for early in p.early:
                if self.early.pop((batch_id, early[0]), None) is not None:
                    self.early_bytes -= early[6]

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

    def _reached(self, job: Job, slot: int, rel: int, device: str) -> None:
        client_bases = self.client_bases.get(job.bases[BATCH])
        if client_bases is not None:
            self.progress(device).set(client_bases[slot] + rel)

    # -- AWAIT ops run by the worker's actors --

    def _report_now(self, job: Job, slot: int, rel: int, device: str) -> bool:
        # What the new value makes due for this client (the bytes of copies it asked for
        # ahead) leaves in one send with the report.
        self.out.hold()
        try:
            self._reached(job, slot, rel, device)
            self.out.send(["sig", job.bases[BATCH], slot, rel])
        finally:
            self.out.release()
        return True

    def _pull_now(self, job: Job, item: int, dst: memoryview, *source: Any) -> bool:
        """A copy from another worker whose bytes came ahead, as asked: take them now
        (True), or leave it to `_pull` (False, having done nothing)."""
        if job.submission.error is not None:
            return True
        key = (job.bases[BATCH], item)
        early = self.early.get(key)
        if early is None:
            return False
        read, staging = early
        if not read.done.is_set() or read.error is not None:
            return False
        del self.early[key]
        self.early_bytes -= len(staging)
        dst[:] = staging
        return True

    async def _pull(
        self,
        job: Job,
        item: int,
        dst: memoryview,
        host: str,
        port: int,
        sid: int,
        ref: list[Any],
        ticket: bytes,
    ) -> None:
        if job.submission.error is not None:
            return
        early = self.early.pop((job.bases[BATCH], item), None)
        if early is None:
            await self.worker.peers.pull(host, port, sid, ref, ticket, dst)
            return
        read, staging = early
        self.early_bytes -= len(staging)
        await read.done.wait()
        if isinstance(read.error, PeerRefusedError):
            raise ConnectionError(str(read.error))
        if read.error is not None:
            # The link failed before the bytes came (the client relayed the wait this
            # copy follows): read them now, over a new link, or fail naming it.
            await self.worker.peers.pull(host, port, sid, ref, ticket, dst)
            return
        dst[:] = staging

    def _job_done(self, batch_id: int, program: Program, sub: Submission) -> None:
        """A job of a batch ended (ran to its end, or skipped its items after a failure):
        tell the client, with the submission's failure if there is one."""
        self.out.hold()  # what the job's end makes due leaves with its report, in one send
        try:
            client_bases = self.client_bases.get(batch_id)
            if client_bases is not None:
                self.progress(program.device).set(client_bases[program.slot] + program.count)
            error = None
            if sub.error is not None:
                error = [
                    sub.failed_item,
                    sub.failed_actor,
                    f"{type(sub.error).__name__}: {sub.error}",
                ]
            self.out.send(["done", batch_id, program.slot, error])
        finally:
            self.out.release()

    async def _send_read(self, job: Job, read_id: int, data: memoryview) -> None:
        if job.submission.error is not None:
            self.out.send(["data", read_id, 0, "an earlier item of this submission failed"])
            return
        await self.send_data(read_id, data)

    async def send_data(self, read_id: int, data: memoryview) -> None:
        done = None
        for off in range(0, len(data), CHUNK):
            done = self.out.send(["data", read_id, off, None], data[off : off + CHUNK])
        if done is None:
            done = self.out.send(["data", read_id, 0, None])
        # The tail is the buffer itself: it must not change until it is sent.
        await done.wait()

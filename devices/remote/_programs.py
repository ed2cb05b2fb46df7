"""What a connection makes of the op lists it is given. A worker's queue's op list is
written as the entries of a "prog" request: a program the worker keeps, whose waits on
another worker's queue that worker tells it of instead of the client. A client-local
job's copies from the worker that follow a wait on one of its queues are asked for ahead
("getwhen"), so their bytes come with that signal's report. The design is described in
actorgraph/remote/__init__.py.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .._device import DeviceError
from .._ops import AWAIT, Job, Op, SignalOp, WaitOp, WireOp, own_signal
from .._signal import Signal
from ._transport import Read
from .wire import Frame, encode

if TYPE_CHECKING:
    from ._connection import Connection
    from ._device import RemoteQueue

# id(signal) -> the RemoteQueue it is the signal of: which worker queue a wait is on
QUEUES_BY_SIGNAL: weakref.WeakValueDictionary[int, RemoteQueue] = weakref.WeakValueDictionary()
EARLY_PULL_BYTES = 1 << 20  # larger copies from a worker are asked for when they run
EARLY_BYTES = 64 << 20  # staging a connection holds at most for copies asked for ahead


class KeptProgram:
    """One queue's op list as the worker holds it."""

    __slots__ = ("direct", "final", "mirrors", "ops", "prog_id", "queue", "slot")

    def __init__(self, prog_id: int, ops: Sequence[Op], queue: RemoteQueue) -> None:
        self.prog_id = prog_id
        self.ops = ops  # held, so that id(ops) stays this program's key
        self.queue = queue
        own = own_signal(ops)
        if own is None:
            raise DeviceError(f"{queue.name}: a queue's op list ends with its own signal")
        self.slot = own.slot
        self.final = own.rel  # where the job leaves its queue's signal
        self.mirrors: list[tuple[Signal, int, int, int]] = []  # signal, base slot, rel, id
        # The waits a copy from another worker follows: that worker tells this one
        # directly, so the client forwards them only if it loses that worker.
        self.direct: set[tuple[int, int, int]] = set()  # base slot, rel, id


def program_of(
    connection: Connection, job: Job, queue: RemoteQueue, parts: list[Any]
) -> KeptProgram:
    key = id(job.ops)
    program = connection._programs.get(key)
    if program is not None and program.ops is job.ops:
        connection._programs.move_to_end(key)
        return program
    # An op list seen for the second time is a graph's: the worker keeps it. One seen
    # once (eager items, host copies) is lowered for its batch and dropped there.
    # Host writes carry their data: never kept, never remembered.
    store = connection._seen.pop(key, None) is job.ops
    one_shot = False
    program = KeptProgram(next(connection._ids), job.ops, queue)
    entries: list[Any] = []
    # The waits of the item about to come (since the previous item or signal):
    # id(signal) -> (base slot, value, mirror id)
    own_waits: dict[int, tuple[int, int, int]] = {}
    for op in job.ops:
        if isinstance(op, WaitOp):
            signal = op.signal
            known = connection._signal_ids.get(id(signal))
            local = _local_queue(signal, connection)
            if local is not None:
                entries.append(["l", local.device.inner, op.slot, op.rel, local.kind.value])
                continue
            if known is None or known[0] is not signal:
                known = (signal, next(connection._ids))
                connection._signal_ids[id(signal)] = known
            source = QUEUES_BY_SIGNAL.get(id(signal))
            if source is not None and source.signal is signal and source.tells_peers:
                # A queue of another worker, which tells this one itself: the client
                # forwards this signal only if it loses that worker.
                conn = source.device.connection
                watch = [conn.host, conn.port, conn.session_id, source.key]
                entries.append(
                    ["w", known[1], op.slot, op.rel, [*watch, conn.watch_ticket(source.key)]]
                )
                program.direct.add((op.slot, op.rel, known[1]))
            else:
                entries.append(["w", known[1], op.slot, op.rel])
            program.mirrors.append((signal, op.slot, op.rel, known[1]))
            own_waits[id(signal)] = (op.slot, op.rel, known[1])
        elif isinstance(op, SignalOp):
            own_waits = {}
            # Reported back only where a queue off this worker waits on it (the job's
            # last signal always is, with its "done").
            entries.append(["s", op.slot, op.rel] if op.host else ["s", op.slot, op.rel, 0])
        elif isinstance(op, WireOp):
            entry = _with_source_wait(op.entry, own_waits)
            own_waits = {}
            if entry is not op.entry:
                program.direct.add(tuple(entry[-3:]))  # type: ignore[arg-type]
            entries.append(entry)
            if op.blobs is not None:  # a host write: its data goes ahead of it
                one_shot = True
                for blob_id, chunk in op.blobs:
                    parts += [encode(["blob", blob_id], len(chunk)), chunk]
        else:
            raise DeviceError(f"{queue.name}: op {op[0]!r} cannot run on a worker")
    store = store and not one_shot
    if not store and not one_shot:
        connection._seen[key] = job.ops
        if len(connection._seen) > connection.PROGRAM_CACHE:
            connection._seen.popitem(last=False)
    device = queue.device.inner
    parts.append(encode(["prog", program.prog_id, device, entries, store, queue.kind.value]))
    if store:
        connection._programs[key] = program
        if len(connection._programs) > connection.PROGRAM_CACHE:
            _, old = connection._programs.popitem(last=False)
            parts.append(encode(["forget", old.prog_id]))
    return program


def _with_source_wait(entry: list[Any], waits: dict[int, tuple[int, int, int]]) -> list[Any]:
    """A copy from another worker ("p") whose own waits (`waits`: those just before it)
    include one on a queue of the source device names that wait, and that queue in place
    of the source device, so the worker can have the bytes sent the moment the source
    gets there.

    Only the copy's own waits say its source is ready: the plan keeps, for a copy from a
    device reached by I/O, its waits on what wrote the source even where they are known
    met through another queue (a wait of an earlier item may be for a lower value). With
    waits on both queues of the source device (both wrote it, or one it must not
    overtake), one alone does not say it: the copy then reads when it runs."""
    if entry[0] != "p":
        return entry
    _, _, _, host, port, sid, _, _, inner = entry
    found: list[tuple[RemoteQueue, tuple[int, int, int]]] = []
    for signal_id, wait in waits.items():
        queue = QUEUES_BY_SIGNAL.get(signal_id)
        if queue is None or id(queue.signal) != signal_id:
            continue
        source = queue.device
        conn = source.connection
        if (conn.host, conn.port, conn.session_id, source.inner) == (host, port, sid, inner):
            found.append((queue, wait))
    if len(found) != 1:
        return entry
    queue, wait = found[0]
    return [*entry[:8], queue.key, *wait]


def _local_queue(signal: Signal, connection: Connection) -> RemoteQueue | None:
    for device in connection.devices:
        for queue in device.queues.values():
            if queue.signal is signal:
                return queue
    return None


def arm(conn: Connection, job: Job) -> None:
    """At a client-local job's first transfer with this worker: ask the worker for the
    bytes of each later copy from it that follows a wait on its queue ("getwhen"),
    so it sends them with the report of that signal instead of when asked after it.
    A copy from a worker then costs one message, not a report and a round trip."""
    pulls = pulls_after_waits(conn, job.ops)
    if not pulls:
        return
    armed = conn._armed.get(id(job))
    if armed is not None and armed[0] is job:
        return
    if conn.error is not None or conn._stream is None:
        return
    parts: list[bytes | memoryview] = []
    count = 0
    for ref, nbytes, slot, rel, queue in pulls:
        if conn._early_bytes + nbytes > EARLY_BYTES:
            break  # the rest are read when they run
        staging = bytearray(nbytes)
        read_id = next(conn._ids)
        read = conn._reads[read_id] = Read(memoryview(staging), False)
        conn._early[(id(job), id(ref))] = (job, read, staging)
        conn._early_bytes += nbytes
        parts.append(encode(["getwhen", read_id, ref, queue, job.bases[slot] + rel]))
        count += 1
    if count:
        conn._armed[id(job)] = [job, count]
        conn._queue_now(Frame(parts))


def consumed(conn: Connection, job: Job) -> None:
    armed = conn._armed.get(id(job))
    if armed is not None and armed[0] is job:
        armed[1] -= 1
        if not armed[1]:
            del conn._armed[id(job)]


def pulls_after_waits(
    conn: Connection, ops: Sequence[Op]
) -> list[tuple[list[Any], int, int, int, str]]:
    """The copies from this worker in `ops` that follow a wait on one of its queues:
    (buffer ref, bytes, the wait's slot and value, the queue's name), kept per op list."""
    hit = conn._pulls.get(id(ops))
    if hit is not None and hit[0] is ops:
        return hit[1]
    found = []
    for i in range(1, len(ops)):
        op = ops[i]
        if op[0] != AWAIT or op[1] != conn.pull:
            continue
        # The copy's own waits (those just before it) on this worker's queues: they
        # are on the source device's, for what wrote the source. With one, its value
        # says the bytes are ready; with two (both of its queues wrote them), neither
        # alone does, and the copy reads when it runs.
        mine: list[tuple[WaitOp, RemoteQueue]] = []
        j = i - 1
        while j >= 0 and isinstance(ops[j], WaitOp):
            wait = ops[j]
            queue = QUEUES_BY_SIGNAL.get(id(wait.signal))
            if queue is not None and queue.signal is wait.signal:
                if queue.device.connection is conn:
                    mine.append((wait, queue))
            j -= 1
        if len(mine) != 1:
            continue
        wait, queue = mine[0]
        dst, ref = op[2]
        nbytes = int(dst.nbytes)
        if nbytes <= EARLY_PULL_BYTES:
            found.append((ref, nbytes, wait.slot, wait.rel, queue.key))
    conn._pulls[id(ops)] = (ops, found)
    if len(conn._pulls) > conn.PROGRAM_CACHE:
        conn._pulls.popitem(last=False)
    return found

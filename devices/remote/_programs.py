"""What a connection makes of the op lists it is given.

A worker's queue's op list is written as the entries of a Prog: a program the worker
keeps (`Programs`, the one owner of the programs a worker keeps; an op list's Script
keeps only the id its ops were last sent under), whose waits on another worker's queue
that worker tells it of instead of the client. The client's signals the worker waits on are mirrored there, each
under an id (`Mirrors`). A client-local job's copies from the worker that follow a wait on
one of its queues are asked for ahead (`PullsAhead`), so their bytes come with that
signal's report. The design is described in actorgraph/devices/remote/__init__.py.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Sequence, Set
from typing import TYPE_CHECKING, Any

from .._device import DeviceError
from .._inline import HoldingSignal, Resumer
from .._ops import (
    AWAIT,
    WIRE,
    Job,
    Op,
    RunOp,
    Script,
    SignalOp,
    WaitOp,
    WireOp,
    WorkOp,
    own_signal,
)
from .._signal import Signal
from .._walk import OpWalker
from ._transport import Read
from .frames import Frame, encode, pack
from .wire import (
    Forget,
    GetWhen,
    HostReadEntry,
    LocalWaitEntry,
    Prog,
    PullEntry,
    SignalEntry,
    WaitEntry,
    as_meta,
)

if TYPE_CHECKING:
    from ._connection import Connection
    from ._device import RemoteQueue

EARLY_PULL_BYTES = 1 << 20  # larger copies from a worker are asked for when they run
EARLY_BYTES = 64 << 20  # staging a connection holds at most for copies asked for ahead
PROGRAM_CACHE = 256  # programs a worker keeps for a connection
# Programs found by what they were derived from (Programs._derived), remembered at most.
DERIVED_KEPT = 4 * PROGRAM_CACHE


class RemoteSignal(HoldingSignal):
    """A RemoteQueue's signal: the worker queue's progress as reported back. It knows its
    queue, so a wait on it says which worker queue it is on. A client-local job run
    where it was submitted may be held on it: the task that takes the worker's report
    runs the job on (devices/_inline.py)."""

    __slots__ = ("queue",)

    def __init__(self, name: str, value: int, queue: RemoteQueue, resumer: Resumer) -> None:
        super().__init__(name, value, resumer)
        self.queue = queue


def queue_of(signal: Signal) -> RemoteQueue | None:
    """The RemoteQueue `signal` is the signal of, if it is one's."""
    return signal.queue if type(signal) is RemoteSignal else None


class Mirrors:
    """The client's signals a connection's worker mirrors: each under an id, with the
    value last sent for it."""

    def __init__(self, ids: itertools.count[int]) -> None:
        self._ids = ids
        self._of: dict[Signal, int] = {}
        self._sent: dict[int, int] = {}
        # Values the worker moves mirrors to itself, not yet passed (see due).
        self._moved: dict[int, set[int]] = {}

    def id_of(self, signal: Signal) -> int:
        """The mirror id of `signal` (given on first use)."""
        ext_id = self._of.get(signal)
        if ext_id is None:
            ext_id = self._of[signal] = next(self._ids)
        return ext_id

    def known(self, signal: Signal) -> int | None:
        """The mirror id of `signal`, if the worker mirrors it."""
        return self._of.get(signal)

    def due(self, ext_id: int, value: int) -> bool:
        """Whether `value` is to be sent for mirror `ext_id` (it was not yet, and the
        worker does not move it there itself): then it is counted as sent."""
        if self._sent.get(ext_id, -1) >= value:
            return False
        self._sent[ext_id] = value
        return not self._moved or not self._by_worker(ext_id, value)

    def moved_by_worker(self, ext_id: int, value: int) -> None:
        """The worker moves mirror `ext_id` to `value` itself (Batch.advances), before
        the client's signal can get there: that value need not be sent."""
        self._moved.setdefault(ext_id, set()).add(value)

    def _by_worker(self, ext_id: int, value: int) -> bool:
        moved = self._moved.get(ext_id)
        if moved is None or value not in moved:
            return False
        moved.difference_update([v for v in moved if v <= value])
        if not moved:
            del self._moved[ext_id]
        return True

    def due_of(self, mirrors: Sequence[tuple[WaitOp, int]], ext: list[tuple[int, int]]) -> None:
        """Append to `ext` the values of `mirrors` (a program's: each wait on a mirrored
        signal, with its mirror id) not yet sent, each as (mirror id, value), and count
        them as sent."""
        sent = self._sent
        for wait, ext_id in mirrors:
            value = wait.signal.value
            if sent.get(ext_id, -1) < value:
                sent[ext_id] = value
                if not self._moved or not self._by_worker(ext_id, value):
                    ext.append((ext_id, value))


class KeptProgram:
    """One queue's op list as the worker holds it (or holds it for one batch)."""

    __slots__ = (
        "content",
        "direct",
        "mirrors",
        "own",
        "prog_id",
        "queue",
        "reads",
        "slot",
        "values",
        "writes",
    )

    def __init__(
        self,
        prog_id: int,
        ops: Sequence[Op],
        queue: RemoteQueue,
        mirrors: Sequence[tuple[WaitOp, int]],
        direct: Set[tuple[int, int, int]],
        reads: Sequence[int],
        writes: Sequence[int],
        values: Sequence[int],
        content: bytes,
    ) -> None:
        """The program `prog_id` of `queue`, written from `ops`: the client's signals it
        waits on, as mirrored (`mirrors`: each wait on one, with its mirror id), and the
        waits among them that another worker tells this one of directly (`direct`: base
        slot, rel, id), which the client forwards only if it loses that worker; the ops
        of its host reads and host writes, in order (`reads`, `writes`: where each
        batch's bytes land, and the bytes it sends, are theirs), and of its calls of
        shipped code that take var values (`values`: each batch sends theirs); its
        entries as written
        (`content`: what another op list written the same finds it by). Raises
        DeviceError for ops that do not end with their queue's own signal."""
        self.prog_id = prog_id
        self.queue = queue
        own = own_signal(ops)
        if own is None:
            raise DeviceError(f"{queue.name}: a queue's op list ends with its own signal")
        self.slot = own.slot
        self.own = own  # its last signal: where a job of it leaves its queue's signal
        self.mirrors = tuple(mirrors)
        self.direct = frozenset(direct)
        self.reads = tuple(reads)
        self.writes = tuple(writes)
        self.values = tuple(values)
        self.content = content


class Programs:
    """The programs a connection's worker keeps, by id, least recently used first, at
    most PROGRAM_CACHE: each defined by a Prog, then named by id, by the op list it was
    written from (a graph's) or by another written as the same entries (a graph bound
    again to inputs it had before, or to any var values, eager work or a copy of the
    same buffers again: a host read's bytes go to the read each batch names, a host
    write's come in the blobs it names, a call's var values come with each batch). Its
    Script keeps the id its ops were last sent under (`keep`), which names a kept
    program as long as this cache holds one under it; a Script made from another by
    changing some ops finds the program through that one's (`_kept_for_origin`), without
    writing its entries."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._kept: collections.OrderedDict[int, KeptProgram] = collections.OrderedDict()
        self._by_content: dict[bytes, int] = {}  # a kept program's entries -> its id
        # (a kept program's id, the entries that replace some of its ops', by index) ->
        # the id of the program written as the result: see _kept_for_origin.
        self._derived: dict[tuple[int, tuple[tuple[int, bytes], ...]], int] = {}
        self.sent = 0  # Progs sent

    def __len__(self) -> int:
        return len(self._kept)

    def program_of(self, job: Job, queue: RemoteQueue, parts: list[Any]) -> KeptProgram:
        """The program for `job`'s ops: kept, or defined now (its Prog appended to
        `parts`, and a Forget for the least recently used one past the bound)."""
        script = job.script
        sent: int | None = script.kept(self)  # the id its ops were last sent under
        kept = None if sent is None else self._kept.get(sent)
        derived: Derived = None
        if kept is None and script.origin is not None:
            kept, derived = self._kept_for_origin(script)
        if kept is not None:
            self._kept.move_to_end(kept.prog_id)
            return kept
        conn = self._connection
        writer = _Writer(conn, queue)
        entries = [as_meta(entry) for entry in writer.entries(job.ops)]  # as Prog's are
        kind = queue.kind.value
        content = pack([queue.device.inner, kind, entries])
        found = self._by_content.get(content)
        if found is not None:
            self._kept.move_to_end(found)
            script.keep(self, found)
            self._derive(derived, found)
            return self._kept[found]
        prog_id = conn.new_id()
        program = KeptProgram(
            prog_id,
            job.ops,
            queue,
            writer.mirrors,
            writer.direct,
            writer.reads,
            writer.writes,
            writer.values,
            content,
        )
        parts.append(encode(Prog(prog_id, queue.device.inner, entries, True, kind)))
        self.sent += 1
        self._kept[prog_id] = program
        self._by_content[content] = prog_id
        if len(self._kept) > PROGRAM_CACHE:
            _, forgotten = self._kept.popitem(last=False)
            del self._by_content[forgotten.content]
            parts.append(encode(Forget(forgotten.prog_id)))
        script.keep(self, prog_id)
        self._derive(derived, prog_id)
        return program

    def _kept_for_origin(self, script: Script) -> tuple[KeptProgram | None, Derived]:
        """The kept program for `script`, found through the ops it was made from: theirs
        where each op that changed is a call of the same entry, taking var values,
        reading or writing host bytes as the one before did (what changed then goes with
        each batch: Batch.values, reads, blobs), so the two write the same program; else
        the one written before for the same entries in the changed places of that one's
        (a graph bound to new inputs: their calls name other buffers), found by them
        (`_derived`). None if there is none, with what to remember the program written
        then as (`_derive`): the key it is found by; or, where the ops it was made from
        have no kept program (a host copy's stand-in ops, never sent themselves; or
        forgotten), those ops' Script, whose program it is too when the changed places
        hold the same entries; None where an op changed its kind."""
        origin = script.take_origin()
        assert origin is not None
        before, changed = origin
        sent = before.kept(self)
        kept = None if sent is None else self._kept.get(sent)
        ops, old_ops = script.ops, before.ops
        same = True
        entries = []
        for index in changed:
            op, old = ops[index], old_ops[index]
            if not (type(op) is WireOp and type(old) is WireOp and _same_kind(op, old)):
                return None, None
            same = same and (op.entry is old.entry or op.entry == old.entry)
            entries.append((index, op.entry))
        if kept is None:
            return None, before if same else None
        if same:
            script.keep(self, kept.prog_id)
            return kept, None
        # A program's entries follow from its ops' alone, each in its place: the program
        # of these ops is that of `kept`'s with these entries in these places.
        key = (kept.prog_id, tuple((index, pack(as_meta(entry))) for index, entry in entries))
        found = self._derived.get(key)
        program = None if found is None else self._kept.get(found)
        if program is None:
            return None, key
        script.keep(self, program.prog_id)
        return program, None

    def _derive(self, key: Derived, prog_id: int) -> None:
        """Remember program `prog_id` as the one derived as `key` says (see
        _kept_for_origin): the program of a Script (kept with it), or found by a key, the
        oldest such going past DERIVED_KEPT. (An id names one program only: a key whose
        program was forgotten finds nothing.)"""
        if key is None:
            return
        if type(key) is Script:
            key.keep(self, prog_id)
            return
        assert type(key) is tuple
        derived = self._derived
        if len(derived) >= DERIVED_KEPT:
            del derived[next(iter(derived))]
        derived[key] = prog_id


# What a program written for a Script made from another is remembered as: the key it is
# found by (a kept program's id, the entries in the changed places), or the Script it
# was made from (whose own program it is too); None: nothing (see _kept_for_origin).
Derived = tuple[int, tuple[tuple[int, bytes], ...]] | Script | None


def _same_kind(op: WireOp, old: WireOp) -> bool:
    """Whether two WIRE ops write the same kind of entry: both take var values, read host
    bytes or write them, or neither does (what each call sends then goes with its
    batch)."""
    return (
        (op.values is None) == (old.values is None)
        and (op.into is None) == (old.into is None)
        and (op.chunks is None) == (old.chunks is None)
    )


class _Writer(OpWalker):
    """One op list of `queue` written as a program's entries (`out`), and what its waits
    are (`mirrors`, `direct`) and where its host reads, host writes and calls that take
    var values are (`reads`, `writes`, `values`): see KeptProgram."""

    taker = "a worker's program"

    def __init__(self, connection: Connection, queue: RemoteQueue) -> None:
        super().__init__(f"{queue.name}'s program for its worker")
        self.connection = connection
        self.queue = queue
        self.out: list[Any] = []
        self.reads: list[int] = []  # the ops of its host reads, in order
        self.writes: list[int] = []  # and of its host writes
        self.values: list[int] = []  # and of its calls that take var values
        self.mirrors: list[tuple[WaitOp, int]] = []
        self.direct: set[tuple[int, int, int]] = set()
        # The waits of the item about to come (since the previous item or signal):
        # signal -> (base slot, value, mirror id)
        self.own_waits: dict[Signal, tuple[int, int, int]] = {}

    def entries(self, ops: Sequence[Op]) -> list[Any]:
        """The entries. Raises OpCodeError for an op a worker's queue does not run (one
        not lowered by a REMOTE device)."""
        self.walk(ops)
        return self.out

    def wait(self, op: WaitOp, index: int) -> bool:
        self.out.append(self._wait(op))
        return True

    def signal(self, op: SignalOp, index: int) -> None:
        self.own_waits = {}
        # Reported back only where a queue off this worker waits on it (the job's last
        # signal always is, with its "done").
        self.out.append(SignalEntry(op.slot, op.rel, 1 if op.host else 0))

    def work(self, op: WorkOp, index: int) -> bool:
        if op.code != WIRE:
            raise self.refuse(op, index, self.queue.op_codes)
        entry = op.entry
        if op.into is not None:  # a host read: its place among them, its read per batch
            assert type(entry) is HostReadEntry
            entry = entry._replace(read=len(self.reads))
            self.reads.append(index)
        elif op.chunks is not None:  # a host write: its bytes go ahead of each batch
            self.writes.append(index)
        elif op.values is not None:  # a call's var values go with each batch
            self.values.append(index)
        self.out.append(self._item(entry))
        return True

    def _wait(self, op: WaitOp) -> Any:
        conn = self.connection
        signal = op.signal
        local = queue_of(signal)
        if local is not None and local.device.connection is conn:
            return LocalWaitEntry(local.device.inner, op.slot, op.rel, local.kind.value)
        ext_id = conn.mirrors.id_of(signal)
        self.mirrors.append((op, ext_id))
        self.own_waits[signal] = (op.slot, op.rel, ext_id)
        if local is not None and local.tells_peers:
            # A queue of another worker, which tells this one itself: the client
            # forwards this signal only if it loses that worker.
            source = local.device.connection
            watch = (source.host, source.port, source.session_id, local.key)
            self.direct.add((op.slot, op.rel, ext_id))
            return WaitEntry(ext_id, op.slot, op.rel, (*watch, source.watch_ticket(local.key)))
        return WaitEntry(ext_id, op.slot, op.rel)

    def _item(self, entry: Any) -> Any:
        waits, self.own_waits = self.own_waits, {}
        if type(entry) is not PullEntry:
            return entry
        entry = _with_source_wait(entry, waits)
        if entry.follows is not None:
            self.direct.add(entry.follows)
        return entry


def _with_source_wait(entry: PullEntry, waits: dict[Signal, tuple[int, int, int]]) -> PullEntry:
    """A copy from another worker whose own waits (`waits`: those just before it) include
    one on a queue of the source device names that queue and that wait (`follows`), so
    the worker can have the bytes sent the moment the source gets there.

    Only the copy's own waits say its source is ready: the plan keeps, for a copy from a
    device reached by I/O, its waits on what wrote the source even where they are known
    met through another queue (a wait of an earlier item may be for a lower value). With
    waits on both queues of the source device (both wrote it, or one it must not
    overtake), one alone does not say it: the copy then reads when it runs. (What the
    client wrote there itself, the read waits for too: see the worker's Fence.)"""
    found: list[tuple[RemoteQueue, tuple[int, int, int]]] = []
    for signal, wait in waits.items():
        queue = queue_of(signal)
        if queue is None:
            continue
        conn = queue.device.connection
        where = (conn.host, conn.port, conn.session_id, queue.device.inner)
        if where == (entry.host, entry.port, entry.session, entry.queue):
            found.append((queue, wait))
    if len(found) != 1:
        return entry
    queue, wait = found[0]
    return entry._replace(queue=queue.key, follows=wait)


class LocalPlan:
    """What a connection makes of a client-local queue's op list: the copies from its
    worker that follow a wait on one of its queues (asked for ahead), the signal right
    after each push (sent with the push's bytes), and the index of its first transfer
    with the worker (where a job asks for those copies' bytes, once)."""

    __slots__ = ("first", "pulls", "signal_after")

    def __init__(self, connection: Connection, ops: Sequence[Op]) -> None:
        reader = _LocalReader(connection).read(ops)
        self.pulls = reader.pulls
        self.signal_after = reader.signal_after  # op index of a push -> the signal after it
        self.first = reader.first


# A copy from the worker asked for ahead: (buffer ref, bytes, the wait it follows, the
# queue's name, the copy's op index)
AheadPull = tuple[Any, int, WaitOp, str, int]


def pulls_after_waits(connection: Connection, ops: Sequence[Op]) -> list[AheadPull]:
    """The copies from this worker in `ops` that follow a wait on one of its queues."""
    return _LocalReader(connection).read(ops).pulls


class _LocalReader(OpWalker):
    """A client-local queue's op list, read for the copies from the connection's worker
    that follow a wait on one of its queues (`pulls`) and the signal right after each
    push to it (`signal_after`)."""

    taker = "a client-local queue"

    def __init__(self, connection: Connection) -> None:
        super().__init__(f"the transfers of {connection.host}:{connection.port}")
        self.connection = connection
        self.pulls: list[AheadPull] = []
        self.signal_after: dict[int, SignalOp] = {}
        self.waits: list[WaitOp] = []  # those right before the op walked now
        self.push = -1  # the index of the op before this one if it is a push, else -1
        self.first = -1  # the index of the first transfer with the worker

    def read(self, ops: Sequence[Op]) -> _LocalReader:
        self.walk(ops)
        return self

    def wait(self, op: WaitOp, index: int) -> bool:
        self.waits.append(op)
        self.push = -1
        return True

    def signal(self, op: SignalOp, index: int) -> None:
        if self.push == index - 1:
            self.signal_after[self.push] = op
        self.waits = []
        self.push = -1

    def work(self, op: WorkOp, index: int) -> bool:
        connection = self.connection
        push = False
        if op.code == AWAIT:
            push = op.fn is connection.push
            if op.fn is connection.pull:
                self._pull(op, index)
            if (push or op.fn is connection.pull) and self.first < 0:
                self.first = index
        self.push = index if push else -1
        self.waits = []
        return True

    def _pull(self, op: RunOp, index: int) -> None:
        # The copy's own waits (those just before it) on this worker's queues: they are
        # on the source device's, for what wrote the source. With one, its value says
        # the bytes are ready; with two (both of its queues wrote them), neither alone
        # does, and the copy reads when it runs.
        mine: list[tuple[WaitOp, RemoteQueue]] = []
        for wait in self.waits:
            queue = queue_of(wait.signal)
            if queue is not None and queue.device.connection is self.connection:
                mine.append((wait, queue))
        if len(mine) != 1:
            return
        wait, queue = mine[0]
        dst, ref = op.args
        nbytes = int(dst.nbytes)
        if nbytes <= EARLY_PULL_BYTES:
            self.pulls.append((ref, nbytes, wait, queue.key, index))


class PullsAhead:
    """A connection's copies from its worker asked for ahead, per client-local job."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        # job -> [op index, read, staging] of each copy asked for and not yet run
        self._early: dict[Job, dict[int, tuple[Read, bytearray]]] = {}
        self.bytes = 0

    def plan(self, script: Script) -> LocalPlan:
        plan = script.kept(self)
        if plan is None:
            plan = LocalPlan(self._connection, script.ops)
            script.keep(self, plan)
        return plan  # type: ignore[no-any-return]

    def arm(self, job: Job) -> None:
        """At a client-local job's first transfer with this worker: ask the worker for
        the bytes of each later copy from it that follows a wait on its queue (GetWhen),
        so it sends them with the report of that signal instead of when asked after it.
        A copy from a worker then costs one message, not a report and a round trip.
        (Asked once per job: at its first transfer, op `first` of its plan, which may be
        tried more than once: see Quick.)"""
        plan = self.plan(job.script)
        if not plan.pulls or job.at != plan.first or job in self._early:
            return
        transport = self._connection.transport
        if not transport.connected:
            return
        parts: list[bytes | memoryview] = []
        early: dict[int, tuple[Read, bytearray]] = {}
        for ref, nbytes, wait, queue, index in plan.pulls:
            if self.bytes + nbytes > EARLY_BYTES:
                break  # the rest are read when they run
            staging = bytearray(nbytes)
            read_id, read = transport.expect_read(memoryview(staging))
            early[index] = (read, staging)
            self.bytes += nbytes
            parts.append(encode(GetWhen(read_id, ref, queue, wait.target(job.bases))))
        if early:
            self._early[job] = early
            transport.queue_now(Frame(parts))

    def take(self, job: Job, index: int) -> tuple[Read, bytearray] | None:
        """The bytes asked for ahead for op `index` of `job`, if they were."""
        early = self._early.get(job)
        if early is None:
            return None
        got = early.pop(index, None)
        if not early:
            del self._early[job]
        if got is not None:
            self.bytes -= len(got[1])
        return got

    @property
    def jobs(self) -> int:
        """How many jobs have copies asked for ahead and not yet run."""
        return len(self._early)

    def clear(self) -> None:
        self._early.clear()
        self.bytes = 0

"""What a worker keeps of a client's program: its lowered ops, and refusals.

A `Session` (_session.py) lowers each program it is sent into a `Program` (with
_lowering.py); a batch posts one job of each. A request that breaks a rule raises
`Refused`, answered with an error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

from actorgraph.devices import Op, OpWalker, QueueActor, Script, SignalOp, WaitOp, WorkOp
from actorgraph.devices.remote.wire import Ref
from actorgraph.scheduler import QueueKind

from ._placement import AdaptiveKernel, KernelTimes
from ._progress import TrackedSignal


class Refused(Exception):
    """A request broke a rule; it is answered with an error and the session goes on.

    `item` is the client's item index when the refusal is about one item of a program.
    """

    def __init__(self, message: str, item: int = -1) -> None:
        super().__init__(message)
        self.item = item


class EarlyPull(NamedTuple):
    """A copy from another worker whose bytes are asked for as its batch arrives: sent by
    the source the moment its queue gets to the wait the copy follows."""

    item: int
    host: str
    port: int
    session: int
    src: Ref
    ticket: bytes
    queue: str  # the source's queue, DEVICE or DEVICE/copy
    slot: int  # the wait's base slot and value, in the client's values
    rel: int
    mirror: int  # the mirror of that queue here, raised as the bytes land
    nbytes: int


# A wait on a queue of another worker, which tells this one when it gets there:
# (slot, value, mirror id, (host, port, session, queue, ticket)).
Watched = tuple[int, int, int, tuple[str, int, int, str, bytes]]


class Program:
    """A client's program as the worker lowered it onto one of its queue actors (made by
    _lowering.py's `lower`), or refused (`error`, with no actor and no ops): made whole,
    and changed after only by its own methods (`recode`, `release`)."""

    __slots__ = (
        "actor",
        "blobs",
        "count",
        "device",
        "early",
        "error",
        "item_entries",
        "kind",
        "local_waits",
        "max_slot",
        "reads",
        "script",
        "slot",
        "store",
        "template",
        "values",
        "version",
        "wait_entries",
        "watches",
        "__weakref__",
    )

    def __init__(
        self,
        *,
        store: bool,
        slot: int,
        error: tuple[int, str] | None = None,
        actor: QueueActor | None = None,
        device: str = "",
        kind: QueueKind = QueueKind.COMPUTE,
        ops: Sequence[Op | AdaptiveKernel] = (),
        times: KernelTimes | None = None,
        count: int = 0,
        max_slot: int = 0,
        local_waits: Sequence[tuple[int, str, QueueKind]] = (),
        early: Sequence[EarlyPull] = (),
        watches: Sequence[Watched] = (),
        wait_entries: Sequence[int] = (),
        item_entries: Mapping[int, int] | None = None,
        reads: int = 0,
        blobs: int = 0,
        values: int = 0,
    ) -> None:
        """A program kept for the batches that name it (`store`), signalling on base
        `slot`: refused with `error` ((client item or -1, why)), or lowered onto `actor`
        (`device`, its name in reports: DEVICE or DEVICE/copy; `kind`, its queue's) as
        `ops`, coded with `times` where kernels are placed by them. `count`: its items;
        `max_slot`: the highest base slot it reads; `local_waits`: (slot, device, kind)
        of its waits on this worker's queues of the same batch; `early`: its copies from
        another worker asked for when a batch arrives; `watches`: its waits on another
        worker's queue, which that worker tells this one of; `wait_entries` and
        `item_entries`: the entry each wait (in order) and each item (by client item)
        came from, for a profiled job's times (`entries_of`); `reads`: its host reads,
        whose read ids each batch names (Batch.reads); `blobs`: the blobs its host writes
        land, which each batch names (Batch.blobs); `values`: the var values its calls of
        shipped code take, which each batch sends (Batch.values)."""
        self.store = store
        self.slot = slot
        self.error = error
        self.actor = actor
        self.device = device
        self.kind = kind
        self.count = count
        self.reads = reads
        self.blobs = blobs
        self.values = values
        self.max_slot = max_slot
        self.local_waits = tuple(local_waits)
        self.early = tuple(early)
        self.watches = tuple(watches)
        self.wait_entries = tuple(wait_entries)
        self.item_entries: Mapping[int, int] = dict(item_entries or {})
        # With kernels placed by their times (_placement.py): the lowered ops they are
        # coded from, and the stamp they were coded at (KernelTimes.code).
        self.template: list[Op | AdaptiveKernel] | None = None
        self.version: tuple[int, int | None] = (0, None)
        self.script = Script(())  # its ops as coded, and what is derived from them
        if ops:
            self._code(list(ops), times)

    @property
    def ops(self) -> tuple[Op, ...]:
        return self.script.ops

    def release(self) -> None:
        """Its client left: let go of its ops (and the views of buffers they hold), so a
        job of it kept somewhere holds no more of them than its own script."""
        self.script = Script(())
        self.template = None
        self.actor = None
        self.early = ()
        self.watches = ()

    def queue(self) -> QueueActor:
        """The queue actor it runs on (a program lowered without error has one)."""
        if self.actor is None:
            raise Refused(f"a program refused when lowered cannot run: {self.error}")
        return self.actor

    def _code(self, ops: list[Op | AdaptiveKernel], times: KernelTimes | None) -> None:
        """Its ops, lowered: kernels whose side (loop or thread) follows their times are
        coded from them now, and again when those move (`recode`)."""
        if any(isinstance(op, AdaptiveKernel) for op in ops):
            if times is None:
                raise ValueError(
                    "a program with kernels placed by their times is coded with those "
                    "times: pass the worker's KernelTimes as `times`"
                )
            self.template = ops
            coded, self.version = times.code(ops)
            self.script = Script(coded)
        else:
            self.script = Script(ops)  # type: ignore[arg-type]

    def recode(self, times: KernelTimes) -> None:
        """Code its ops again if a kernel of it changed sides since they were coded."""
        if self.template is not None and times.stale(self.version):
            coded, self.version = times.code(self.template)
            self.script = Script(coded)

    def entries_of(self, script: Script) -> list[int]:
        """For each op of `script` (its ops as coded, now or at an earlier batch), the
        index of the program entry it runs (what the client's op list has at that index),
        or -1 for an op of the worker's own (a report, a run's bookkeeping, a signal).
        Worked out once per coding, and kept with the script."""
        entries: list[int] | None = script.kept(self)
        if entries is None:
            entries = _Entries(self).of(script.ops)
            script.keep(self, entries)
        return entries

    def track(self, base: int, client_base: int) -> None:
        """A job of it starts at `base` of its actor's values, `client_base` of the
        client's: a queue of the client's own tells how far the client's queue got."""
        signal = self.queue().signal
        if type(signal) is TrackedSignal:
            signal.track(base, base + self.count, client_base)


class _Entries(OpWalker):
    """A program's ops mapped to the entries they came from (`Program.entries_of`)."""

    taker = "a worker's program"

    def __init__(self, program: Program) -> None:
        super().__init__(f"the entries of a program on {program.device}")
        self.waits = iter(program.wait_entries)
        self.items = program.item_entries
        self.entries: list[int] = []

    def of(self, ops: Sequence[Op]) -> list[int]:
        self.walk(ops)
        return self.entries

    def wait(self, op: WaitOp, index: int) -> bool:
        self.entries.append(next(self.waits, -1))
        return True

    def signal(self, op: SignalOp, index: int) -> None:
        self.entries.append(-1)

    def work(self, op: WorkOp, index: int) -> bool:
        self.entries.append(self.items.get(op.item, -1))
        return True


def queue_kind(value: object) -> QueueKind:
    if value == "compute":
        return QueueKind.COMPUTE
    if value == "copy":
        return QueueKind.COPY
    raise Refused(
        f"queue kind {value!r} is not 'compute' or 'copy': a program runs on its device's "
        f"compute or copy queue; name one of the two"
    )


def queue_key(device: str, kind: QueueKind) -> str:
    return device if kind is QueueKind.COMPUTE else f"{device}/{kind.value}"


def signal_slot(entries: object) -> int:
    """The base slot a program's signal entries name (0 if none is well formed)."""
    if isinstance(entries, list):
        for entry in reversed(entries):
            if isinstance(entry, list) and len(entry) in (3, 4) and entry[0] == "s":
                if isinstance(entry[1], int):
                    return entry[1]
    return 0

"""The op format: what a queue actor runs, in one place for everyone who builds or reads it.

A *job* is one queue's part of one submission (a graph replay, an eager item, a host
copy): a tuple of ops plus the per-submission *bases* its waits and signals are
relative to. Ops are immutable typed records (NamedTuples), read by field name; `Op` is
the union of them, and `code` (their first field, typed as the literal codes it may
hold) tells them apart, so a check of `op.code` narrows the type:

    WaitOp(WAIT, signal, slot, rel)      park until signal >= target(bases)
    SignalOp(SIGNAL, signal, slot, rel, host)
                                         set signal to value(bases); `host` False: no
                                         actor waits on it through the trio side (a GPU
                                         queue may then skip telling the host)
    RunOp(EXEC, fn, args, item)          fn(*args) inline, in the actor
    RunOp(EXEC_THREAD, fn, args, item)   fn(*args) on the actor's worker thread; runs of
                                         consecutive EXEC_THREAD ops go over in one hop
    RunOp(AWAIT, fn, args, item)         await fn(job, *args) in the actor, for ops that
                                         do I/O (REMOTE transfers). It runs even after the
                                         submission failed: fn checks job.submission.error
    SimRun(SIM_RUN, fn, args, item, seconds, transfer)
                                         SIM queues: fn(*args) now, `seconds` simulated
                                         (a copy over shared links: `transfer` takes its
                                         share of them instead; `seconds` is its time alone)
    CudaItem(CUDA_ITEM, commands, keep, item)
                                         CUDA queues: stream commands; `keep` holds what
                                         they point into (staging memory) while the op lives
    WireOp(WIRE, entry, chunks, item, into)
                                         REMOTE queues: a wire entry for the worker, with
                                         a host write's bytes to send ahead of its batch
                                         or None, and where a host read's land or None

A wait's value is `WaitOp.target(bases)` and a signal's `SignalOp.value(bases)`: both
are `bases[slot] + rel`, written there alone. Every op other than a wait or a signal (a
`WorkOp`) keeps the index of the item it runs in `item` (-1: a host copy, or work of
the queue's own).

The bases of a job: slot KICK holds the runtime's KICK value for the submission (it
numbers the runtime's submissions, and is reached before any job runs), slot BATCH the
id of the batch a worker got the job in (0 on the client), then one base per queue of
the plan (FIRST_QUEUE_SLOT + queue index) and one ticket per device after them. The
layout travels to workers as is, so both sides read the same slot numbers.

What the ops mean when they run is `step` (devices/_step.py); those who only follow a
job's waits and signals walk it with an `OpWalker` (devices/_walk.py).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final, Literal, NamedTuple, cast

import trio

if TYPE_CHECKING:
    from ._links import Transfer
    from ._signal import Signal
    from .remote.wire import ItemEntry

# -- the op codes: one table for every kind of queue --

WAIT: Final = 0
SIGNAL: Final = 1
EXEC: Final = 2
EXEC_THREAD: Final = 3
AWAIT: Final = 4
SIM_RUN: Final = 16
CUDA_ITEM: Final = 17
WIRE: Final = 18

OP_NAMES: MappingProxyType[int, str] = MappingProxyType(
    {
        WAIT: "WAIT",
        SIGNAL: "SIGNAL",
        EXEC: "EXEC",
        EXEC_THREAD: "EXEC_THREAD",
        AWAIT: "AWAIT",
        SIM_RUN: "SIM_RUN",
        CUDA_ITEM: "CUDA_ITEM",
        WIRE: "WIRE",
    }
)

# The codes every queue actor runs itself; the others belong to one device kind each.
HOST_OPS = frozenset([WAIT, SIGNAL, EXEC, EXEC_THREAD, AWAIT])

# -- base slots --

KICK = 0
BATCH = 1
FIRST_QUEUE_SLOT = 2


def op_name(code: object) -> str:
    """The name of op code `code` (its repr if it is none of the table's)."""
    return OP_NAMES.get(code, repr(code)) if isinstance(code, int) else repr(code)


class OpCodeError(RuntimeError):
    """An op list holds an op its reader cannot take: one of no code of the table above
    (or not of its code's shape), or one of a code that another kind of queue runs."""


def is_op(op: object) -> bool:
    """Whether `op` is an op of this format: a record of a code of the table, in that
    code's shape (`OP_TYPES`)."""
    code = getattr(op, "code", None)
    return type(code) is int and OP_TYPES.get(code) is type(op)


def refuse_op(
    who: str, op: object, index: int, taker: str = "", takes: Collection[int] = ()
) -> OpCodeError:
    """The error (returned, for the caller to raise) for `op`, op `index` of an op list,
    which `who` (what reads it, named first in the message) cannot take: an op that is
    no op of this format (see `is_op`), or else one of a code that `taker` (e.g. "a CUDA
    queue") does not run, as it runs only the codes `takes`."""
    code = getattr(op, "code", None)
    if not is_op(op):
        return OpCodeError(
            f"{who}: op {index} ({type(op).__name__}) has op code {op_name(code)}, which is "
            f"no op of the op format (devices/_ops.py: {', '.join(OP_NAMES.values())}, each "
            f"of its own shape); make ops with the builders there (wait_op, signal_op, "
            f"run_op, sim_run, cuda_item, wire_op)"
        )
    runs = ", ".join(op_name(c) for c in sorted(takes))
    return OpCodeError(
        f"{who}: op {index} has op code {op_name(code)}, which {taker} does not run (it "
        f"runs {runs}); the op list was lowered for another kind of queue"
    )


# -- the ops --


class WaitOp(NamedTuple):
    """WAIT: nothing to do once `signal` has reached `target(bases)`."""

    code: Literal[0]
    signal: Signal
    slot: int
    rel: int

    def target(self, bases: Sequence[int]) -> int:
        """The value `signal` must reach, for a job with these `bases`."""
        return bases[self.slot] + self.rel


class SignalOp(NamedTuple):
    """SIGNAL: set `signal` to `value(bases)`. `host` False: no actor waits on it through
    the trio side (a GPU queue may then skip telling the host)."""

    code: Literal[1]
    signal: Signal
    slot: int
    rel: int
    host: bool = True

    def value(self, bases: Sequence[int]) -> int:
        """The value it sets `signal` to, for a job with these `bases`."""
        return bases[self.slot] + self.rel


class RunOp(NamedTuple):
    """EXEC, EXEC_THREAD or AWAIT: a call (see the table above)."""

    code: Literal[2, 3, 4]
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    item: int


class SimRun(NamedTuple):
    """SIM_RUN: a call now, and `seconds` of simulated time (or `transfer`'s share of
    the links it crosses)."""

    code: Literal[16]
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    item: int
    seconds: float
    transfer: Transfer | None = None


class CudaItem(NamedTuple):
    """CUDA_ITEM: stream commands (devices/cuda/_commands.py), with what they point into."""

    code: Literal[17]
    commands: tuple[tuple[Any, ...], ...]
    keep: object
    item: int


class WireOp(NamedTuple):
    """WIRE: a program entry for a worker, with the bytes a host write sends ahead of its
    batch (`chunks`), where a host read's bytes land (`into`), or the var values a call
    of a shipped program takes (`values`), each batch's own."""

    code: Literal[18]
    entry: ItemEntry
    chunks: list[memoryview] | None
    item: int
    into: memoryview | None
    values: list[int] | None


# The shape of each code's op.
OP_TYPES: MappingProxyType[int, type[Op]] = MappingProxyType(
    {
        WAIT: WaitOp,
        SIGNAL: SignalOp,
        EXEC: RunOp,
        EXEC_THREAD: RunOp,
        AWAIT: RunOp,
        SIM_RUN: SimRun,
        CUDA_ITEM: CudaItem,
        WIRE: WireOp,
    }
)

# An op that runs something: an item (its index in `item`) or work of the queue's own.
WorkOp = RunOp | SimRun | CudaItem | WireOp
# What a job's ops are.
Op = WaitOp | SignalOp | WorkOp

# tuple.__new__ skips the NamedTuple constructor's argument handling: half its cost, and
# several of these run per call for graphs whose inputs are rebound.
_new = tuple.__new__


def wait_op(signal: Signal, slot: int, rel: int) -> WaitOp:
    return _new(WaitOp, (WAIT, signal, slot, rel))


def signal_op(signal: Signal, slot: int, rel: int, host: bool = True) -> SignalOp:
    return _new(SignalOp, (SIGNAL, signal, slot, rel, host))


def run_op(
    code: Literal[2, 3, 4], fn: Callable[..., Any], args: tuple[Any, ...], item: int
) -> RunOp:
    """An EXEC, EXEC_THREAD or AWAIT op."""
    return _new(RunOp, (code, fn, args, item))


def sim_run(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    item: int,
    seconds: float,
    transfer: Transfer | None = None,
) -> SimRun:
    return _new(SimRun, (SIM_RUN, fn, args, item, seconds, transfer))


def cuda_item(commands: tuple[tuple[Any, ...], ...], item: int, keep: object = None) -> CudaItem:
    return _new(CudaItem, (CUDA_ITEM, commands, keep, item))


def wire_op(
    entry: ItemEntry,
    item: int,
    chunks: list[memoryview] | None = None,
    into: memoryview | None = None,
    values: list[int] | None = None,
) -> WireOp:
    return _new(WireOp, (WIRE, entry, chunks, item, into, values))


def without_bytes(op: Op) -> Op | None:
    """`op` as it stands for every op like it: a WIRE op with none of one call's bytes (an
    empty `into`, no `chunks`); None for any other op, whose call holds its bytes.

    A host copy's program keeps one as the op its later copies are made from (their
    Scripts' origin), which holds no caller's array."""
    if type(op) is not WireOp:
        return None
    return op._replace(
        chunks=None if op.chunks is None else [],
        into=None if op.into is None else memoryview(b""),
    )


def item_at(ops: Sequence[Op], index: int) -> int:
    """The item op `index` runs (-1: a wait, a signal, or work of the queue's own)."""
    op = ops[index]
    if op.code == WAIT or op.code == SIGNAL:
        return -1
    return op.item


def first_item(ops: Sequence[Op]) -> int:
    """The index of the first item a job runs, or -1 (for errors that name no item)."""
    for op in ops:
        if op.code != WAIT and op.code != SIGNAL:
            return op.item
    return -1


def own_signal(ops: Sequence[Op]) -> SignalOp | None:
    """A job's last SIGNAL: its queue's own slot and final value (None if it has none)."""
    for i in range(len(ops) - 1, -1, -1):
        op = ops[i]
        if op.code == SIGNAL:
            return op
    return None


# -- jobs and submissions --


class ActorClosedError(RuntimeError):
    """The actor that was to run this work has shut down (its runtime exited)."""


class Submission:
    """Shared state of one submission while its jobs run on several actors.

    Invariants: `remaining` counts jobs not yet finished; `device_left[d]` counts the
    unfinished jobs that touch device d; device d's timeline moves to `tickets[d]` when
    that count reaches zero, so later submissions on d start only after this one.
    """

    __slots__ = (
        "_callbacks",
        "_reader",
        "device_left",
        "done",
        "error",
        "failed_actor",
        "failed_item",
        "queue_devices",
        "remaining",
        "tickets",
        "time_blocked",
        "timelines",
        "waits_parked",
    )

    def __init__(
        self,
        njobs: int,
        timelines: Sequence[Signal],
        tickets: Sequence[int],
        queue_devices: Sequence[Sequence[int]],
        device_jobs: Sequence[int],
    ) -> None:
        self.remaining = njobs
        self.timelines = timelines
        self.tickets = tickets
        self.queue_devices = queue_devices
        self.device_left = list(device_jobs)
        self.error: BaseException | None = None
        self.failed_item = -1
        self.failed_actor = ""
        self.done = trio.Event()
        # Told once it is done, in the order they were given (`when_done`); None: none.
        self._callbacks: list[Callable[[Submission], None]] | None = None
        # Set while a task reads this submission's end itself, where no actor would wake
        # it (a remote connection's wait_done, `read_by`): called with the error when the
        # runtime fails the submission from outside (`break_off`), so that task stops.
        self._reader: Callable[[BaseException], None] | None = None
        # Counted only where an actor really parks (the slow path), never per op.
        self.waits_parked = 0
        self.time_blocked = 0.0
        if njobs == 0:
            self.done.set()

    def when_done(self, callback: Callable[[Submission], None]) -> None:
        """Call `callback(self)` once the submission is done, failed or not (at once if it
        is already), after the callbacks given before it."""
        if self.done.is_set():
            callback(self)
            return
        callbacks = self._callbacks
        if callbacks is None:
            self._callbacks = [callback]
        else:
            callbacks.append(callback)

    def read_by(self, interrupt: Callable[[BaseException], None] | None) -> None:
        """A task reads this submission's end itself (None: no longer), where no actor
        would wake it: `interrupt(error)` stops it if the submission is failed from
        outside (`break_off`)."""
        self._reader = interrupt

    def break_off(self, error: BaseException) -> None:
        """Fail the submission and finish it now from outside (its runtime broke), and
        stop the task that reads its end, if one does: its jobs may never end."""
        self.abandon("", error)
        if self._reader is not None:
            self._reader(error)

    def fail(self, item: int, actor: str, error: BaseException) -> None:
        """Record the first failure; later ops of this submission skip their execs."""
        if self.error is None:
            self.error = error
            self.failed_item = item
            self.failed_actor = actor

    def parked(self) -> None:
        """A job of it parked on a wait not yet satisfied (the slow path)."""
        self.waits_parked += 1

    def blocked(self, seconds: float) -> None:
        """A job of it was blocked (parked) for `seconds`."""
        self.time_blocked += seconds

    def job_done(self, slot: int) -> None:
        device_left = self.device_left
        for d in self.queue_devices[slot]:
            device_left[d] -= 1
            if device_left[d] == 0:
                self.timelines[d].set(self.tickets[d])
        self.remaining -= 1
        if self.remaining == 0:
            self._finish()

    def abandon(self, actor: str, error: BaseException) -> None:
        """Fail the submission and finish it now, whatever of it is still running: its
        jobs will never end (their actor is gone, or the runtime broke)."""
        self.fail(-1, actor, error)
        if not self.done.is_set():
            self._finish()

    def _finish(self) -> None:
        self.done.set()
        callbacks = self._callbacks
        if callbacks is not None:
            self._callbacks = None
            for callback in callbacks:
                callback(self)


class JobProfile:
    """A profiled job's observer: the times of every op of it that runs an item and of
    every WAIT that parked, in whatever task or thread runs them (devices/_step.py).

    `spans` holds (op index, start, end); times come from `clock`, the clock of the actor
    the job went to (`QueueActor._now`), which sets it before the job runs. Appending is
    atomic, so an item timed on an actor's worker thread lands here as it ends.

    A job that ran on another host (a worker's queue) was timed there, on that host's
    clock (`ran_elsewhere`): its times are put on this host's clock with the best offset
    known when they are read (`settle`), off by at most `clock_error` seconds.
    """

    __slots__ = ("_elsewhere", "clock", "clock_error", "end", "spans", "start")

    def __init__(self) -> None:
        self.spans: list[tuple[int, float, float]] = []
        self.start: float | None = None  # None until the job starts / finishes
        self.end: float | None = None
        self.clock: Callable[[], float] = time.perf_counter
        self.clock_error = 0.0
        self._elsewhere: tuple[Any, ...] | None = None

    def ran_elsewhere(
        self,
        spans: Sequence[tuple[int, float, float]],
        start: float | None,
        end: float | None,
        offset: Callable[[], tuple[float, float]],
    ) -> None:
        """The job ran on another host, with these times on its clock: `offset()` says
        what that clock reads minus this one's, and how far off that can be (it may
        know better later, as more round trips are measured)."""
        self._elsewhere = (tuple(spans), start, end, offset)
        self.settle()

    def settle(self) -> None:
        """Put the times of a job that ran on another host on this host's clock, with
        the offset known now (nothing to do for a job timed here)."""
        if self._elsewhere is None:
            return
        spans, start, end, offset = self._elsewhere
        shift, self.clock_error = offset()
        self.spans = [(index, s - shift, e - shift) for index, s, e in spans]
        self.start = None if start is None else start - shift
        self.end = None if end is None else end - shift

    def use_clock(self, clock: Callable[[], float]) -> None:
        """Take times with `clock` from now on (the clock of whoever runs the job)."""
        self.clock = clock

    def began(self, at: float) -> None:
        """The job started at `at`."""
        self.start = at

    def finished(self, at: float) -> None:
        """The job ended at `at`."""
        self.end = at

    def span(self, index: int, start: float, end: float) -> None:
        """Op `index` ran (or was parked on) from `start` to `end`."""
        self.spans.append((index, start, end))

    def call(self, index: int, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        """Run op `index`'s call, timed (a raise is recorded, then passed on)."""
        clock = self.clock
        start = clock()
        try:
            fn(*args)
        finally:
            self.spans.append((index, start, clock()))


class Quick:
    """An AWAIT op's function that can often finish at once: `now(job, *args)` does the op
    and returns True, or returns False, and `later(job, *args)` is then awaited. `now`
    may be tried more than once before `later` (by the driver that ran the job, then by
    the actor that takes it over): what it started the first time (a send, a read it
    asked for), it must not start again, but leave to `later`. Whoever runs the op tries `now` first, in its own task (devices/_step.py):
    a job then goes on without a task of its own (a worker's held jobs, _inline.py).
    Awaited as a plain AWAIT function, it does the same (`__call__`)."""

    __slots__ = ("later", "now")

    def __init__(
        self, now: Callable[..., bool], later: Callable[..., Awaitable[None]] | None = None
    ) -> None:
        self.now = now
        self.later = later

    async def __call__(self, job: Job, *args: Any) -> None:
        if not self.now(job, *args):
            await self.run_later(job, *args)

    async def run_later(self, job: Job, *args: Any) -> None:
        """The op, once `now` said it cannot finish at once."""
        if self.later is None:
            raise RuntimeError(f"{self.now!r} did not finish, and its op has no later form")
        await self.later(job, *args)


# A run of consecutive ops of one code (EXEC, or EXEC_THREAD): the index after it, and
# its (fn, args) calls in order.
CallRun = tuple[int, tuple[tuple[Callable[..., Any], tuple[Any, ...]], ...]]

_NOT_ITEMS = frozenset([WAIT, SIGNAL, AWAIT])
_RUNS = frozenset([EXEC, EXEC_THREAD, SIM_RUN])  # the codes whose ops are (fn, args) calls


class Script:
    """One queue's ops of one binding (a graph's bound inputs and var values, an eager
    item, a host copy), with what is derived from them alone, worked out once and kept
    as long as they are:

    - `runs`: the runs of consecutive ops of one code that call (fn, args): EXEC,
      EXEC_THREAD, SIM_RUN, by first index: (the index after the run, its calls), so a
      run is one plain loop over its calls;
    - `items`: how many items the ops run (what an actor counts as `items_run`);
    - what a queue that runs them made of them for itself (`kept`: a CUDA queue's
      graph, a connection's program on a worker), found again by whoever holds them;
    - `origin`: the Script these ops were made from by changing some of them (a graph
      bound again to new var values or inputs), with the indices of the ops that
      changed, or None: an owner finds its kept form of these ops through that one's
      (`take_origin`): as it is where it does not depend on what changed (a
      connection's program, where only the var values a batch sends did), else the one
      it made before for the same change (a connection's program for an input it had).

    Invariants: `ops` never changes; `runs` has an entry at every index where a run
    starts (index 0 or after an op of another code), which is every index where a job
    can come to such an op (devices/_step.py); an origin has no origin of its own (so
    no Script holds a chain of older ones).
    """

    __slots__ = ("_kept", "items", "ops", "origin", "runs")

    def __init__(
        self, ops: Sequence[Op], origin: tuple[Script, tuple[int, ...]] | None = None
    ) -> None:
        self.ops: tuple[Op, ...] = ops if type(ops) is tuple else tuple(ops)
        self.runs: dict[int, CallRun] = {}
        self.items = 0
        self._kept: dict[object, Any] | None = None
        self.origin: tuple[Script, tuple[int, ...]] | None = None
        if origin is not None and origin[0].origin is None:
            self.origin = origin
        ops = self.ops
        count = len(ops)
        i = 0
        while i < count:
            code = ops[i].code
            if code not in _NOT_ITEMS:
                self.items += 1
            if code not in _RUNS:
                i += 1
                continue
            end = i + 1
            while end < count and ops[end].code == code:
                end += 1
            # Ops of one of the codes in _RUNS: each a RunOp or a SimRun.
            calls = cast("tuple[RunOp | SimRun, ...]", ops[i:end])
            self.runs[i] = (end, tuple([(op.fn, op.args) for op in calls]))
            self.items += end - i - 1
            i = end

    def __len__(self) -> int:
        return len(self.ops)

    def __repr__(self) -> str:
        return f"<Script of {len(self.ops)} ops>"

    def kept(self, owner: object) -> Any:
        """What `owner` (a queue, a connection) keeps with these ops, or None."""
        kept = self._kept
        return None if kept is None else kept.get(owner)

    def take_origin(self) -> tuple[Script, tuple[int, ...]] | None:
        """`origin`, let go of: asked once, by the owner that runs these ops."""
        origin, self.origin = self.origin, None
        return origin

    def keep(self, owner: object, value: Any) -> None:
        """Have these ops hold what `owner` made of them, for as long as they live (None:
        forget it). Only `owner` reads it back: it is its own, derived from these ops."""
        kept = self._kept
        if kept is None:
            kept = self._kept = {}
        if value is None:
            kept.pop(owner, None)
        else:
            kept[owner] = value


class Job:
    """One queue's part of a submission: its ops (a Script), the bases they are relative
    to (see the slots above), the submission, the job's slot in it, and where it has got
    (`at`: the first op not yet done, whoever runs it: see devices/_step.py).

    `observer`: a JobProfile for a profiled job, else None (the plain path: no timestamps).
    """

    __slots__ = ("at", "bases", "copy_bytes", "observer", "ops", "script", "slot", "submission")

    def __init__(
        self,
        script: Script | Sequence[Op],
        bases: Sequence[int],
        submission: Submission,
        slot: int,
        observer: JobProfile | None = None,
        copy_bytes: int = 0,
    ):
        self.script = script if isinstance(script, Script) else Script(script)
        self.ops = self.script.ops
        self.at = 0
        self.bases = bases
        self.submission = submission
        self.slot = slot
        self.observer = observer
        self.copy_bytes = copy_bytes

    def item_at(self, index: int) -> int:
        """The item op `index` runs (-1: a wait, a signal, or work of the queue's own)."""
        return item_at(self.ops, index)

    def reached(self, at: int) -> None:
        """Every op before op `at` is done: whoever runs the job next starts there."""
        self.at = at

    def fail(self, actor: str, error: BaseException, item: int | None = None) -> None:
        """Fail the submission (naming `item`, else the job's first) and end this job."""
        sub = self.submission
        sub.fail(first_item(self.ops) if item is None else item, actor, error)
        sub.job_done(self.slot)

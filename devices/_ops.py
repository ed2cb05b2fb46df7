"""The op format: what a queue actor runs, in one place for everyone who builds or reads it.

A *job* is one queue's part of one submission (a graph replay, an eager item, a host
copy): a tuple of ops plus the per-submission *bases* its waits and signals are
relative to. Ops are tuples (NamedTuples, so a reader may name the fields, and the
replay loops still index them at tuple speed). Field 0 is always the op code:

    WaitOp(WAIT, signal, slot, rel)      park until signal >= bases[slot] + rel
    SignalOp(SIGNAL, signal, slot, rel, host)
                                         set signal to bases[slot] + rel; `host` False:
                                         no actor waits on it through the trio side (a GPU
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
    WireOp(WIRE, entry, blobs, item)     REMOTE queues: a wire entry for the worker, with
                                         (blob id, bytes) to send ahead of it or None

Every op that runs an item keeps the item's index at [ITEM] (-1: a host copy).

The bases of a job: slot KICK holds the runtime's KICK value for the submission (it
numbers the runtime's submissions, and is reached before any job runs), slot BATCH the
id of the batch a worker got the job in (0 on the client), then one base per queue of
the plan (FIRST_QUEUE_SLOT + queue index) and one ticket per device after them. The
layout travels to workers as is, so both sides read the same slot numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple

import trio

if TYPE_CHECKING:
    from ._signal import Signal

# -- the op codes: one table for every kind of queue --

WAIT = 0
SIGNAL = 1
EXEC = 2
EXEC_THREAD = 3
AWAIT = 4
SIM_RUN = 16
CUDA_ITEM = 17
WIRE = 18

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

# The shape of each code's op.
OP_TYPES: MappingProxyType[int, type[tuple[Any, ...]]]  # filled in below the classes

# The codes every queue actor runs itself; the others belong to one device kind each.
HOST_OPS = frozenset([WAIT, SIGNAL, EXEC, EXEC_THREAD, AWAIT])

ITEM = 3  # where an op that runs an item keeps the item's index

# -- base slots --

KICK = 0
BATCH = 1
FIRST_QUEUE_SLOT = 2


def op_name(code: object) -> str:
    return OP_NAMES.get(code, repr(code)) if isinstance(code, int) else repr(code)


# -- the ops --


class WaitOp(NamedTuple):
    code: int
    signal: Signal
    slot: int
    rel: int


class SignalOp(NamedTuple):
    code: int
    signal: Signal
    slot: int
    rel: int
    host: bool = True


class RunOp(NamedTuple):
    """EXEC, EXEC_THREAD or AWAIT."""

    code: int
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    item: int


class SimRun(NamedTuple):
    code: int
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    item: int
    seconds: float
    transfer: Any = None  # devices._links.Transfer, or None


class CudaItem(NamedTuple):
    code: int
    commands: tuple[Any, ...]
    keep: Any
    item: int


class WireOp(NamedTuple):
    code: int
    entry: list[Any]
    blobs: list[tuple[int, memoryview]] | None
    item: int


OP_TYPES = MappingProxyType(
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

# What readers take: any of the above. Plain tuple typing keeps the replay loops'
# indexing (op[1](*op[2])) free of casts; builders return the precise NamedTuple.
Op = tuple[Any, ...]

# tuple.__new__ skips the NamedTuple constructor's argument handling: half its cost, and
# several of these run per call for graphs whose inputs are rebound.
_new = tuple.__new__


def wait_op(signal: Signal, slot: int, rel: int) -> WaitOp:
    return _new(WaitOp, (WAIT, signal, slot, rel))


def signal_op(signal: Signal, slot: int, rel: int, host: bool = True) -> SignalOp:
    return _new(SignalOp, (SIGNAL, signal, slot, rel, host))


def run_op(code: int, fn: Callable[..., Any], args: tuple[Any, ...], item: int) -> RunOp:
    """An EXEC, EXEC_THREAD or AWAIT op."""
    return _new(RunOp, (code, fn, args, item))


def sim_run(
    fn: Callable[..., Any], args: tuple[Any, ...], item: int, seconds: float, transfer: Any = None
) -> SimRun:
    return _new(SimRun, (SIM_RUN, fn, args, item, seconds, transfer))


def cuda_item(commands: tuple[Any, ...], item: int, keep: Any = None) -> CudaItem:
    return _new(CudaItem, (CUDA_ITEM, commands, keep, item))


def wire_op(
    entry: list[Any], item: int, blobs: list[tuple[int, memoryview]] | None = None
) -> WireOp:
    return _new(WireOp, (WIRE, entry, blobs, item))


def first_item(ops: Sequence[Op]) -> int:
    """The index of the first item a job runs, or -1 (for errors that name no item)."""
    return next((op[ITEM] for op in ops if op[0] not in (WAIT, SIGNAL)), -1)


def own_signal(ops: Sequence[Op]) -> SignalOp | None:
    """A job's last SIGNAL: its queue's own slot and final value (None if it has none)."""
    for op in reversed(ops):
        if op[0] == SIGNAL:
            return op  # type: ignore[return-value]
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
        "device_left",
        "done",
        "error",
        "failed_actor",
        "failed_item",
        "interrupt",
        "on_done",
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
        self.on_done: Callable[[Submission], None] | None = None
        # Set while a task reads this submission's end itself, where no actor would wake
        # it (a remote connection's wait_done): called with the error when the runtime
        # fails the submission from outside (`Runtime._break`), so that task stops.
        self.interrupt: Callable[[BaseException], None] | None = None
        # Counted only where an actor really parks (the slow path), never per op.
        self.waits_parked = 0
        self.time_blocked = 0.0
        if njobs == 0:
            self.done.set()

    def fail(self, item: int, actor: str, error: BaseException) -> None:
        """Record the first failure; later ops of this submission skip their execs."""
        if self.error is None:
            self.error = error
            self.failed_item = item
            self.failed_actor = actor

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
        if self.on_done is not None:
            self.on_done(self)


class JobProfile:
    """Timestamps of one profiled job, filled in by the actor that runs it.

    `spans` holds (op index, start, end) for every op that runs an item and for every
    WAIT that parked; times come from the actor's clock (`QueueActor._now`).
    """

    __slots__ = ("end", "spans", "start")

    def __init__(self) -> None:
        self.spans: list[tuple[int, float, float]] = []
        self.start: float | None = None  # None until the actor starts / finishes the job
        self.end: float | None = None


class Job:
    """One queue's part of a submission: its ops, the bases they are relative to (see
    the slots above), the submission and the job's slot in it."""

    __slots__ = ("bases", "copy_bytes", "ops", "profile", "runs", "slot", "submission")

    def __init__(
        self,
        ops: Sequence[Op],
        bases: Sequence[int],
        submission: Submission,
        slot: int,
        profile: JobProfile | None = None,
        copy_bytes: int = 0,
    ):
        self.ops = ops
        self.bases = bases
        self.submission = submission
        self.slot = slot
        self.profile = profile  # None: the plain replay loop, no timestamps at all
        self.copy_bytes = copy_bytes
        # Runs of consecutive EXEC ops, found when the job first runs inline
        # (QueueActor._exec_runs); None until then.
        self.runs: Any = None

    def fail(self, actor: str, error: BaseException, item: int | None = None) -> None:
        """Fail the submission (naming `item`, else the job's first) and end this job."""
        sub = self.submission
        sub.fail(first_item(self.ops) if item is None else item, actor, error)
        sub.job_done(self.slot)

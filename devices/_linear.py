"""A submission run as one plain run of its kernel calls, where it was submitted.

When every item of a bound op list runs inline (EXEC), there is an order in which one
task can run all of them, each queue's waits met by the queues before it (the caller
works it out from the plan once: `Program._linear_order`). On idle queues of devices
done with earlier work, nothing else can run while that task runs them, so nobody can
see the signals in between: the submission is then one run of EXEC calls, in an order
worked out once per plan (a `Schedule`, which every binding's run shares, with the
bookkeeping below), its calls taken from the op lists when they are bound (a
`LinearRun`), and run as `step` (devices/_step.py) runs any run of EXEC calls (`run_calls`, the floor's own loop: the first failure is the submission's, the
calls after it are skipped). The bookkeeping the actors would have done is done once,
after it, by the owners of what it moves: the runtime's KICK (`Signal.set`),
each queue (`QueueActor.complete`: its timeline values, its signal, its counts) and
each device (`Device.advance`: its timeline, its ticket). No Submission, no Job, no
trio object is made per run.

The bookkeeping comes after the calls and in an order where every prefix leaves a
consistent state: a KeyboardInterrupt raised between two statements (trio raises it in
unprotected code; Python in a thread's plain code) can leave a count short, never a
timeline that later work would wait on forever. Each queue's reservation moves before
its signal (a signal never runs ahead of what is reserved, so no later wait is met
early); each device's timeline moves before its ticket counter (a timeline ahead of the
next ticket only means the next submission finds its turn already reached).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import Final

from ._actor import QueueActor
from ._device import Device
from ._ops import EXEC, Op, item_at, own_signal
from ._signal import Signal
from ._step import Calls, run_calls

_VALUE_MAX = (1 << 64) - 1

# What a failed run reports: (item, actor name, error).
Failure = tuple[int, str, BaseException]


class NotRun(enum.Enum):
    """The one value that says a submission did not run where it was made, and nothing
    of it was done (`LinearRun.run`, and the callers that decide where a replay runs):
    it goes to the actors instead. Its one member is `NOT_RUN`."""

    NOT_RUN = "not run"


NOT_RUN: Final = NotRun.NOT_RUN

# What running a submission where it was made gives: its first failure, or None.
Ran = Failure | None


class Schedule:
    """What every LinearRun of one plan shares, worked out once (from its first binding):
    the order of its item ops, the items they run and the actors that run them, the
    owners' bookkeeping of a run, and whether the devices are known to be ready for one.

    Invariant: `_ready_at` >= 0 means `ready()` held when the kick had that value, and
    since no submission has moved the kick, it still holds (see `run`); it is the plan's
    queues and devices that are ready or not, whichever binding runs next.
    """

    __slots__ = (
        "_advances",
        "_completes",
        "_devices",
        "_items",
        "_kick",
        "_kick_limit",
        "_names",
        "_queues",
        "_ready_at",
        "_single",
        "copy_bytes",
        "order",
    )

    def __init__(
        self,
        kick: Signal,
        actors: Sequence[QueueActor],
        devices: Sequence[Device],
        ops: Sequence[Sequence[Op]],
        order: Sequence[tuple[int, int]],
        counts: Sequence[int],
        copy_bytes: Sequence[int],
    ) -> None:
        self.order = tuple(order)
        items = []
        self._names: dict[int, str] = {}  # item -> the actor it belongs to, for failures
        for q, i in order:
            item = item_at(ops[q], i)
            items.append(item)
            self._names[item] = actors[q].name
        self._kick = kick
        self._items = tuple(items)  # the item of each call, in the order's order
        # Per queue: (actor, values it reserves, its job's last signal or -1, bytes copied).
        queues = []
        for q, actor in enumerate(actors):
            last = own_signal(ops[q])
            queues.append((actor, counts[q], -1 if last is None else last.rel, copy_bytes[q]))
        self._queues = tuple(queues)
        self._devices = tuple(devices)
        # The owners' own bookkeeping of a run, bound once: each queue's, then each device's.
        self._completes: tuple[tuple[Callable[[int, int, int], None], int, int, int], ...] = tuple(
            (actor.complete, count, last, copied) for actor, count, last, copied in queues
        )
        self._advances = tuple(device.advance for device in devices)
        # One queue on one device (a small graph's usual case): the same two calls,
        # without the loops.
        self._single = (
            self._completes[0] + (self._advances[0],)
            if len(self._completes) == 1 and len(self._advances) == 1
            else None
        )
        self.copy_bytes = sum(copy_bytes)
        # The kick's value right after a run last ran, while ready() is known to hold
        # (see run), else -1: every submission moves the kick, and only a submission
        # posts jobs, takes tickets or parks a task on a timeline value.
        self._ready_at = -1
        self._kick_limit = -1  # the kick value at which the values near 2**64-1

    def ready(self) -> bool:
        """Whether a run may happen now, in place of posting the jobs: every queue
        idle, every device's timeline at its next ticket (all earlier work on it done),
        and no timeline value it would take past 2**64-1 (the posting path says why)."""
        for actor, count, _, _ in self._queues:
            if not actor.idle or actor.next_value + count > _VALUE_MAX:
                return False
        for device in self._devices:
            ticket = device.next_ticket
            if device.timeline.value < ticket or ticket >= _VALUE_MAX:
                return False
        return True

    def quiet(self) -> bool:
        """Whether no task waits on a signal a run moves: then moving them wakes
        nobody, and the run may happen off the trio thread (a background runtime's
        caller, while its loop is stopped)."""
        if self._kick.waiting:
            return False
        for actor, _, _, _ in self._queues:
            if actor.signal.waiting:
                return False
        return not any(device.timeline.waiting for device in self._devices)

    def _runs_clear(self) -> int:
        """How many runs in a row, from now, keep every value below 2**64-1."""
        left = _VALUE_MAX
        for actor, count, _, _ in self._queues:
            if count:
                left = min(left, (_VALUE_MAX - actor.next_value) // count)
        for device in self._devices:
            left = min(left, _VALUE_MAX - 1 - device.next_ticket)
        return left

    def run(self, calls: Calls) -> Ran | NotRun:
        """If `ready()`, run `calls` (a binding's calls, in the order), then have the
        owners do the actors' bookkeeping, and return the first failure (later calls
        are skipped, as the actors skip the execs after one) or None. If not, do
        nothing and return NOT_RUN."""
        kick = self._kick
        if kick.value != self._ready_at:
            if not self.ready():
                return NOT_RUN
            self._kick_limit = kick.value + self._runs_clear()
        # The schedule is one run of EXEC calls: run as `step` runs a run of them.
        failed = run_calls(calls, 0, None)
        kicked = kick.value + 1  # numbers the submission, as posting it would
        kick.set(kicked)
        single = self._single
        if single is not None:
            complete, count, last, copied, advance = single
            complete(count, last, copied)
            advance()
        else:
            for complete, count, last, copied in self._completes:
                complete(count, last, copied)
            for advance in self._advances:
                advance()
        # What ready() found still holds until the next submission, which moves the
        # kick: until then no job is posted, no ticket taken, no timeline moved. The
        # values stay clear of 2**64-1 for the runs counted when it was checked.
        self._ready_at = kicked if kicked < self._kick_limit else -1
        if failed is None:
            return None
        index, error = failed
        item = self._items[index]
        return (item, self._names.get(item, ""), error)


class LinearRun:
    """One binding of a plan's op lists, every item inline, as one run of calls in its
    Schedule's order.

    Invariant: `_calls` are the calls of the EXEC ops of the queues' op lists in the
    schedule's order; running them in this order meets every wait between the plan's
    queues (the caller's order guarantees it).
    """

    __slots__ = ("_calls", "_schedule")

    def __init__(self, schedule: Schedule, calls: Calls) -> None:
        self._schedule = schedule
        # The submission as one run of EXEC calls.
        self._calls = calls

    @classmethod
    def of(cls, schedule: Schedule, ops: Sequence[Sequence[Op]]) -> LinearRun | None:
        """The bound op lists `ops` (one per queue) in `schedule`'s order, or None when
        an op it names does not run inline (a worker thread, I/O)."""
        calls = []
        for q, i in schedule.order:
            op = ops[q][i]
            if op.code != EXEC:
                return None
            calls.append((op.fn, op.args))
        return cls(schedule, tuple(calls))

    @property
    def copy_bytes(self) -> int:
        return self._schedule.copy_bytes

    def ready(self) -> bool:
        """Whether the run may happen now (Schedule.ready)."""
        return self._schedule.ready()

    def quiet(self) -> bool:
        """Whether the run moves no signal a task waits on (Schedule.quiet)."""
        return self._schedule.quiet()

    def run(self) -> Ran | NotRun:
        """Run the calls if the devices are ready (Schedule.run): the first failure, None,
        or NOT_RUN having done nothing."""
        return self._schedule.run(self._calls)

"""A submission run as one plain loop over its kernel calls, where it was submitted.

When every item of a bound op list runs inline (EXEC), there is an order in which one
task can run all of them, each queue's waits met by the queues before it (the caller
works it out from the plan once: `Program._linear_order`). On idle queues of devices
done with earlier work, nothing else can run while that task runs them, so nobody can
see the signals in between: the submission is then the loop `for fn, args in calls:
fn(*args)`, the floor's own, and the bookkeeping the actors would have done (timeline
values, device tickets, counters) is done once, after it, from figures worked out when
the op list was bound. No Submission, no Job, no trio object is made for it.

The bookkeeping comes after the calls and in an order where every prefix leaves a
consistent state: a KeyboardInterrupt raised between two statements (trio raises it in
unprotected code; Python in a thread's plain code) can leave a count short, never a
timeline that later work would wait on forever. Each queue's reservation moves before
its signal (a signal never runs ahead of what is reserved, so no later wait is met
early); each device's timeline moves before its ticket counter (a timeline ahead of the
next ticket only means the next submission finds its turn already reached).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

from ._actor import QueueActor
from ._device import Device
from ._ops import EXEC, ITEM, Op, own_signal
from ._signal import Signal

_VALUE_MAX = (1 << 64) - 1

# What a failed run reports: (item, actor name, error).
Failure = tuple[int, str, BaseException]

# What LinearRun.run returns when it may not run now (and did nothing).
NOT_RUN: Any = object()


class LinearRun:
    """One bound op list of a plan, every item inline, as one loop in a fixed order.

    Invariants: `calls[k]` runs item `where[k][0]` of queue `where[k][1]`; running the
    calls in this order meets every wait between the plan's queues (the caller's order
    guarantees it). `ready()` true means no other work of the devices is queued,
    running or unfinished, so `run()` may stand for posting the jobs.
    """

    __slots__ = (
        "_actors",
        "_calls",
        "_devices",
        "_kick",
        "_kick_limit",
        "_queues",
        "_ready_at",
        "_single",
        "_where",
        "copy_bytes",
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
        calls = []
        where = []
        for q, i in order:
            op = ops[q][i]
            if op[0] != EXEC:
                raise ValueError(f"op {i} of queue {q} is not inline; no LinearRun for it")
            calls.append((op[1], op[2]))
            where.append((op[ITEM], q))
        self._kick = kick
        self._calls = tuple(calls)
        self._where = tuple(where)
        self._actors = tuple(actors)
        # Per queue: (actor, values it reserves, its job's last signal or -1, bytes copied).
        queues = []
        for q, actor in enumerate(actors):
            last = own_signal(ops[q])
            queues.append((actor, counts[q], -1 if last is None else last[3], copy_bytes[q]))
        self._queues = tuple(queues)
        self._devices = tuple((device, device.timeline) for device in devices)
        # One queue on one device (most graphs): its bookkeeping as straight-line code.
        self._single = (
            (*self._queues[0], *self._devices[0])
            if len(self._queues) == 1 and len(self._devices) == 1
            else None
        )
        self.copy_bytes = sum(copy_bytes)
        # The kick's value right after this run last ran, while ready() is known to hold
        # (see run), else -1: every submission moves the kick, and only a submission
        # posts jobs, takes tickets or parks a task on a timeline value.
        self._ready_at = -1
        self._kick_limit = -1  # the kick value at which the values near 2**64-1

    @staticmethod
    def inline(ops: Sequence[Sequence[Op]], order: Sequence[tuple[int, int]]) -> bool:
        """Whether every op that `order` names runs inline (no worker thread, no I/O)."""
        return all(ops[q][i][0] == EXEC for q, i in order)

    def ready(self) -> bool:
        """Whether the run may happen now, in place of posting the jobs: every queue
        idle, every device's timeline at its next ticket (all earlier work on it done),
        and no timeline value it would take past 2**64-1 (the posting path says why)."""
        for actor, count, _, _ in self._queues:
            if not actor.idle or actor.next_value + count > _VALUE_MAX:
                return False
        for device, timeline in self._devices:
            ticket = device.next_ticket
            if timeline.value < ticket or ticket >= _VALUE_MAX:
                return False
        return True

    def quiet(self) -> bool:
        """Whether no task waits on a signal the run moves: then moving them wakes
        nobody, and the run may happen off the trio thread (a background runtime's
        caller, while its loop is stopped)."""
        if self._kick.waiting:
            return False
        for actor, _, _, _ in self._queues:
            if actor.signal.waiting:
                return False
        return not any(timeline.waiting for _, timeline in self._devices)

    def _runs_clear(self) -> int:
        """How many runs in a row, from now, keep every value below 2**64-1."""
        left = _VALUE_MAX
        for actor, count, _, _ in self._queues:
            if count:
                left = min(left, (_VALUE_MAX - actor.next_value) // count)
        for device, _ in self._devices:
            left = min(left, _VALUE_MAX - 1 - device.next_ticket)
        return left

    def run(self) -> Any:
        """If `ready()`, run every call, then do the actors' bookkeeping, and return
        the first failure (later calls are skipped, as the actors skip the execs after
        one) or None. If not, do nothing and return NOT_RUN."""
        kick = self._kick
        if kick.value != self._ready_at:
            if not self.ready():
                return NOT_RUN
            self._kick_limit = kick.value + self._runs_clear()
        calls = self._calls
        it = iter(calls)
        failure: Failure | None = None
        try:
            for fn, args in it:  # no counter: the loop is the floor's own
                fn(*args)
        except Exception as exc:
            item, q = self._where[len(calls) - operator.length_hint(it) - 1]
            failure = (item, self._actors[q].name, exc)
        # The signals move forward, within 2**64-1 (ready() checked). Signal.set() wakes
        # their waiters; with none (the usual case: the queues were idle) the value is
        # all there is to move.
        kicked = kick.value + 1  # numbers the submission, as posting it would
        if kick._waiters:
            kick.set(kicked)
        else:
            kick.value = kicked
        single = self._single
        if single is not None:
            # The loops below for one queue and one device, in the same order.
            actor, count, last, copied, device, timeline = single
            base = actor.next_value
            actor.next_value = base + count
            if last >= 0:
                signal = actor.signal
                if signal._waiters:
                    signal.set(base + last)
                elif base + last > signal.value:
                    signal.value = base + last
            actor.items_run += count
            actor.jobs_done += 1
            if copied:
                actor.bytes_copied += copied
            ticket = device.next_ticket + 1
            if timeline._waiters:
                timeline.set(ticket)
            elif ticket > timeline.value:
                timeline.value = ticket
            device.next_ticket = ticket
        else:
            for actor, count, last, copied in self._queues:
                base = actor.next_value
                actor.next_value = base + count
                if last >= 0:
                    signal = actor.signal
                    if signal._waiters:
                        signal.set(base + last)
                    elif base + last > signal.value:
                        signal.value = base + last
                actor.items_run += count
                actor.jobs_done += 1
                if copied:
                    actor.bytes_copied += copied
            for device, timeline in self._devices:
                ticket = device.next_ticket + 1
                if timeline._waiters:
                    timeline.set(ticket)
                elif ticket > timeline.value:
                    timeline.value = ticket
                device.next_ticket = ticket
        # What ready() found still holds until the next submission, which moves the
        # kick: until then no job is posted, no ticket taken, no timeline moved. The
        # values stay clear of 2**64-1 for the runs counted when it was checked.
        self._ready_at = kicked if kicked < self._kick_limit else -1
        return failure

"""Deadlock analysis over the actors' pending work.

The planner's plans are deadlock-free on their own and submissions are ordered by
device tickets, so a runtime deadlock means something outside the plans went wrong (a
hand-built plan, a device that lost work). When every actor that has work is parked on
a signal, the monitor runs all pending work abstractly, from the parked positions on:
waits compare simulated signal values, signals set them, a job's end counts down its
submission's device timelines. If the abstract run cannot finish, nothing real can
either: the blocked waits are reported as a wait-for cycle instead of hanging.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from ._actor import QueueActor
from ._ops import SIGNAL, WAIT, Job, Submission
from ._signal import Signal


@attrs.frozen
class BlockedWait:
    actor: str
    signal: str
    value: int
    current: int


def find_deadlock(actors: Sequence[QueueActor]) -> list[BlockedWait] | None:
    """Return the blocked waits if the pending work can never finish, else None."""
    busy = [a for a in actors if a.busy]
    if not busy or any(a.parked_on is None and a.current is not None for a in busy):
        return None  # someone is running (or waiting on a thread/driver): not a deadlock
    run = _AbstractRun({a: a.pending() for a in busy})
    progress = True
    while progress:
        progress = False
        for work in run.queues.values():
            if run.advance(work):
                progress = True
    blocked = []
    for actor, work in run.queues.items():
        if work:
            job, index = work[0]
            op = job.ops[index]
            assert op.code == WAIT  # where an abstract run stops
            target = op.target(job.bases)
            blocked.append(BlockedWait(actor.name, op.signal.name, target, run.value(op.signal)))
    return blocked or None


class _AbstractRun:
    """Pending work run abstractly: waits compare simulated signal values, signals set
    them, a job's end counts down its submission's device timelines."""

    def __init__(self, queues: dict[QueueActor, list[tuple[Job, int]]]) -> None:
        self.queues = queues
        self.values: dict[Signal, int] = {}
        self.left: dict[Submission, list[int]] = {}

    def value(self, signal: Signal) -> int:
        return self.values.get(signal, signal.value)

    def advance(self, work: list[tuple[Job, int]]) -> bool:
        """Run one actor's pending jobs as far as they can go; whether they moved."""
        moved = False
        while work:
            job, start = work[0]
            index = self._run(job, start)
            if index < len(job.ops):
                if index != start:
                    work[0] = (job, index)
                    moved = True
                break
            work.pop(0)
            self._finish(job)
            moved = True
        return moved

    def _run(self, job: Job, index: int) -> int:
        """Where `job`, run from op `index`, stops: at a wait not met, or at its end."""
        ops = job.ops
        while index < len(ops):
            op = ops[index]
            if op.code == WAIT and self.value(op.signal) < op.target(job.bases):
                break
            if op.code == SIGNAL:
                self.values[op.signal] = max(self.value(op.signal), op.value(job.bases))
            index += 1
        return index

    def _finish(self, job: Job) -> None:
        sub = job.submission
        counts = self.left.setdefault(sub, list(sub.device_left))
        for d in sub.queue_devices[job.slot]:
            counts[d] -= 1
            if counts[d] == 0:
                timeline = sub.timelines[d]
                self.values[timeline] = max(self.value(timeline), sub.tickets[d])

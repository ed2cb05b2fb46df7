"""Deadlock analysis over the actors' pending work.

The planner's plans are deadlock-free on their own and submissions are ordered by
device tickets, so a runtime deadlock means something outside the plans went wrong (a
hand-built plan, a device that lost work). When every actor that has work is parked on
a signal, the monitor runs all pending work abstractly, from the parked positions on:
waits compare simulated signal values, signals set them (each job walked by an
`OpWalker`, devices/_walk.py, which refuses an op it does not know), a job's end counts
down its submission's device timelines. If the abstract run cannot finish, nothing real can
either: the blocked waits are reported as a wait-for cycle instead of hanging.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from ._actor import QueueActor
from ._ops import WAIT, Job, SignalOp, Submission, WaitOp
from ._signal import Signal
from ._walk import OpWalker


@attrs.frozen
class BlockedWait:
    actor: str
    signal: str
    value: int
    current: int


def find_deadlock(actors: Sequence[QueueActor]) -> list[BlockedWait] | None:
    """Return the blocked waits if the pending work can never finish, else None.

    Raises OpCodeError where a pending job holds an op that is none of the op format's."""
    busy = [a for a in actors if a.busy]
    if not busy or any(a.parked_on is None and a.current is not None for a in busy):
        return None  # someone is running (or waiting on a thread/driver): not a deadlock
    run = _AbstractRun({a: a.pending() for a in busy})
    progress = True
    while progress:
        progress = False
        for actor, work in run.queues.items():
            if run.advance(actor, work):
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

    def advance(self, actor: QueueActor, work: list[tuple[Job, int]]) -> bool:
        """Run one actor's pending jobs as far as they can go; whether they moved."""
        moved = False
        while work:
            job, start = work[0]
            index = _JobRun(self, actor, job).walk(job.ops, start)
            if index < len(job.ops):
                if index != start:
                    work[0] = (job, index)
                    moved = True
                break
            work.pop(0)
            self._finish(job)
            moved = True
        return moved

    def _finish(self, job: Job) -> None:
        sub = job.submission
        counts = self.left.setdefault(sub, list(sub.device_left))
        for d in sub.queue_devices[job.slot]:
            counts[d] -= 1
            if counts[d] == 0:
                timeline = sub.timelines[d]
                self.values[timeline] = max(self.value(timeline), sub.tickets[d])


class _JobRun(OpWalker):
    """One pending job run abstractly, in its run: it stops at a wait not met."""

    taker = "the deadlock check"

    def __init__(self, run: _AbstractRun, actor: QueueActor, job: Job) -> None:
        super().__init__(f"the deadlock check of {actor.name}'s pending work")
        self.run = run
        self.bases = job.bases

    def wait(self, op: WaitOp, index: int) -> bool:
        return self.run.value(op.signal) >= op.target(self.bases)

    def signal(self, op: SignalOp, index: int) -> None:
        run = self.run
        run.values[op.signal] = max(run.value(op.signal), op.value(self.bases))

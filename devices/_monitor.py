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
    values: dict[Signal, int] = {}
    left: dict[int, list[int]] = {}
    queues: dict[QueueActor, list[tuple[Job, int]]] = {a: a.pending() for a in busy}

    def value(signal: Signal) -> int:
        return values.get(signal, signal.value)

    def finish(job: Job) -> None:
        sub: Submission = job.submission
        counts = left.setdefault(id(sub), list(sub.device_left))
        for d in sub.queue_devices[job.slot]:
            counts[d] -= 1
            if counts[d] == 0:
                timeline = sub.timelines[d]
                values[timeline] = max(value(timeline), sub.tickets[d])

    progress = True
    while progress:
        progress = False
        for work in queues.values():
            while work:
                job, start = work[0]
                ops = job.ops
                index = start
                while index < len(ops):
                    op = ops[index]
                    if op[0] == WAIT and value(op[1]) < job.bases[op[2]] + op[3]:
                        break
                    if op[0] == SIGNAL:
                        target = job.bases[op[2]] + op[3]
                        values[op[1]] = max(value(op[1]), target)
                    index += 1
                if index < len(ops):
                    if index != start:
                        work[0] = (job, index)
                        progress = True
                    break
                work.pop(0)
                finish(job)
                progress = True
    blocked = []
    for actor, work in queues.items():
        if work:
            job, index = work[0]
            op = job.ops[index]
            blocked.append(
                BlockedWait(actor.name, op[1].name, job.bases[op[2]] + op[3], value(op[1]))
            )
    return blocked or None

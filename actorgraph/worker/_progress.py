"""How far a client's queues on a worker have got, in the client's values: `Progress`,
and `TrackedSignal`, the signal of a client's own queue actor that moves it.

Reads and waits that other workers (or the client) asked for run from whichever task
gets a queue there, the moment it does. The worker's design is described in
actorgraph/worker/_server.py.
"""

from __future__ import annotations

import collections
import heapq
import itertools
from collections.abc import Callable

from actorgraph.devices import HoldingSignal, Resumer, Signal


class Progress:
    """How far a client's queue on one device of this worker has got, in the client's
    values (what the worker reports to it), and what is to run when it gets further:
    the bytes or signals other workers asked for, sent from the task that moves it, the
    moment it moves, ahead of the report to the client.

    Invariants: every entry of `_due` waits for a value above `value`.
    """

    __slots__ = ("_due", "_seq", "value")

    def __init__(self) -> None:
        self.value = 0
        self._due: list[tuple[int, int, Callable[[], None]]] = []
        self._seq = itertools.count()

    def set(self, value: int) -> None:
        if value <= self.value:
            return
        self.value = value
        due = self._due
        while due and due[0][0] <= value:
            heapq.heappop(due)[2]()

    def when(self, value: int, fn: Callable[[], None]) -> None:
        """Call `fn()` once the value reaches `value` (now, if it has)."""
        if self.value >= value:
            fn()
        else:
            heapq.heappush(self._due, (value, next(self._seq), fn))


class TrackedSignal(HoldingSignal):
    """The signal of a client's own queue actor on this worker, which also moves the
    client's `Progress` of that queue: `jobs` holds, per job posted and not yet passed,
    (its first worker value, its last, the client's value at its first), so each worker
    value maps to the client's. Reads and waits other workers asked for then go out from
    whichever signal gets there, whether the client hears of that signal or not, and
    before the jobs held on it here run on (devices/_inline.py).

    Invariants: `jobs` is in posting order, which is the order the actor runs them.
    """

    __slots__ = ("jobs", "progress")

    def __init__(self, name: str, value: int, progress: Progress, resumer: Resumer) -> None:
        super().__init__(name, value, resumer)
        self.jobs: collections.deque[tuple[int, int, int]] = collections.deque()
        self.progress = progress

    def track(self, first: int, last: int, client: int) -> None:
        """A job posted to the queue takes its values `first`..`last`, which are the
        client's `client`.. (in posting order, which is the order the actor runs them)."""
        self.jobs.append((first, last, client))

    def set(self, value: int) -> None:
        if value <= self.value:
            return
        Signal.set(self, value)
        jobs = self.jobs
        while jobs:
            first, last, client = jobs[0]
            if value <= first:
                break
            if value < last:
                self.progress.set(client + value - first)
                break
            jobs.popleft()
            self.progress.set(client + last - first)
        self.release_held()

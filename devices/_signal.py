"""Timeline signals: a monotonically increasing 64-bit value that tasks can wait on."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

import attrs
import trio

_Task = trio.lowlevel.Task

_SIGNAL_MAX = (1 << 64) - 1


@attrs.frozen
class SignalStatistics:
    value: int
    waiters: int


class Signal:
    """A timeline value owned by one actor (or device) and read by any.

    `set` only moves the value forward and wakes exactly the waiters whose threshold is
    now reached. `wait_value` returns at once, without a checkpoint, when the threshold
    is already reached: a satisfied wait costs nothing on the replay's hot path.

    Invariants: every live entry in `_waiters` ([threshold, seq, the parked task or the
    callback of `when`, None once woken or aborted]) has threshold > `value`.
    """

    __slots__ = ("_seq", "_waiters", "name", "value")

    def __init__(self, name: str, value: int = 0) -> None:
        if not 0 <= value <= _SIGNAL_MAX:
            raise ValueError(f"signal {name!r}: value {value} is not a 64-bit unsigned int")
        self.name = name
        self.value = value
        self._waiters: list[list[object]] = []
        self._seq = itertools.count()

    def __repr__(self) -> str:
        return f"<Signal {self.name}={self.value}>"

    @property
    def waiting(self) -> bool:
        """Whether a task waits on this signal, or a callback (`when`) is due at a value
        it has not reached: setting it may wake someone or run something."""
        waiters = self._waiters
        return bool(waiters) and any(entry[2] is not None for entry in waiters)

    def set(self, value: int) -> None:
        if value <= self.value:
            return
        if value > _SIGNAL_MAX:
            raise OverflowError(f"signal {self.name!r} would pass 2**64-1 (set to {value})")
        self.value = value
        if self._waiters:
            self._wake(value)

    def _wake(self, value: int) -> None:
        """Wake the waiters `value` satisfies, in the order of their thresholds."""
        waiters = self._waiters
        while waiters and waiters[0][0] <= value:  # type: ignore[operator]
            entry = heapq.heappop(waiters)
            task = entry[2]
            if task is not None:
                entry[2] = None
                if type(task) is _Task:
                    trio.lowlevel.reschedule(task)
                else:
                    task()  # type: ignore[operator]

    def when(self, threshold: int, fn: Callable[[], object]) -> None:
        """Call `fn()` once value >= threshold: now if it is, else from the `set` that
        gets it there, in the task that sets it, before `set` returns. A callback costs
        no task of its own (what a task waiting for one value to forward it costs: a
        spawn and two wake-ups). It must not raise; it may set other signals."""
        if self.value >= threshold:
            fn()
            return
        heapq.heappush(self._waiters, [threshold, next(self._seq), fn])

    async def wait_value(self, threshold: int) -> None:
        """Return once value >= threshold. No checkpoint when it already is."""
        if self.value >= threshold:
            return
        entry: list[object] = [threshold, next(self._seq), trio.lowlevel.current_task()]
        heapq.heappush(self._waiters, entry)

        def abort(_: object) -> trio.lowlevel.Abort:
            entry[2] = None  # left in the heap; skipped when popped
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)

    def statistics(self) -> SignalStatistics:
        return SignalStatistics(
            value=self.value, waiters=sum(1 for e in self._waiters if e[2] is not None)
        )


class Doorbell:
    """Wakes one task parked waiting for work. Ringing when nobody waits does nothing:
    the owner checks its inbox before it parks, so no ring is ever needed twice.

    Invariants: `_task` is set only while its task is parked in `wait`.
    """

    __slots__ = ("_task",)

    def __init__(self) -> None:
        self._task: trio.lowlevel.Task | None = None

    def ring(self) -> None:
        task = self._task
        if task is not None:
            self._task = None
            trio.lowlevel.reschedule(task)

    async def wait(self) -> None:
        """Park until rung (or cancelled)."""
        self._task = trio.lowlevel.current_task()

        def abort(_: object) -> trio.lowlevel.Abort:
            self._task = None
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)

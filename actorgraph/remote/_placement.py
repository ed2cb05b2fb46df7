"""Where a worker runs a small CPU kernel: on its event loop, or on its client's thread.

A kernel run on the worker's event loop (trio's thread) costs nothing extra, but while it
runs no other client's work moves; run on the thread of its client's own queue actor it
delays nobody else, at a thread hop (~100 us) per run of such kernels. A worker places
each kernel call by what it has seen that call take (`KernelTimes`), per kernel *shape*:
kernel name, bytes of each buffer, var values.

- A shape never seen runs on the thread, where its time is measured: a kernel is never
  trusted to be quick before it has been seen to be.
- A shape seen to run in under `INLINE_BOUND_S` runs inline, on the loop.
- A shape seen to take longer goes back to the thread, and comes back to the loop only
  after a streak of quick runs there, 8 times longer after each slow run (see
  `KernelTimes`): a kernel slow from the start never delays another client, and one
  that turns slow (on other data) delays them once, then rarely.

A run of inline kernels expected to take more than `RUN_BUDGET_S` in all is cut in
runs that do not, with a trio checkpoint between them: however many quick kernels a
program has, the event loop is never held for much longer than that.

Inline calls are not timed one by one (two clock reads per call would cost the small
replays this is for); each run of consecutive inline kernels is timed as a whole, and a
run that takes more than the bound longer than its kernels' quick times add up to
counts as a slow run of each of its shapes.

Kernels that touch `--thread-bytes` or more always run on the thread (several devices
then really run in parallel); `--thread-bytes 0` puts every kernel there.

Programs are lowered once and replayed many times, so a program keeps its lowered
`template` and the `KernelTimes.version` it was coded at; a batch recodes it only when
some shape changed sides since (rare: once per new shape, mostly).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import trio

from actorgraph.devices import AWAIT, EXEC, EXEC_THREAD, Op, run_op

INLINE_BOUND_S = 100e-6  # a kernel seen to take longer leaves the event loop
RUN_BUDGET_S = 1e-3  # inline kernels expected to take longer in all yield between them
SHAPES_KEPT = 4096  # shapes a worker remembers; a forgotten one is measured again


async def _yield(job: Any) -> None:
    """Let the worker's other tasks (other clients) run, between long runs of kernels."""
    await trio.lowlevel.checkpoint()


class AdaptiveKernel:
    """A kernel call in a program's template: coded inline or onto the thread at a batch."""

    __slots__ = ("key", "thread_op", "inline_op")

    def __init__(self, times: KernelTimes, key: Hashable, op: Op) -> None:
        self.key = key
        self.inline_op = run_op(EXEC, op[1], op[2], op[3])
        self.thread_op = run_op(EXEC_THREAD, times.timed, (key, op[1], op[2]), op[3])


class KernelTimes:
    """What a worker has seen of each kernel shape's run times, shared by its sessions.

    Per shape: `strikes`, the runs seen slower than the bound; `streak`, the quick runs
    since the last slow one; `quick`, the longest quick run. A shape runs inline while
    its streak is long enough: one quick run while it never was slow, then 8, 64, ...
    times as many after each strike. A run's wall time also counts the moments the OS
    gave the CPU to another process, so one slow run may not be the kernel's doing: it
    comes back after a streak of quick runs, and a kernel that really is slow at times
    delays the others once, then once per 8x longer streak (a handful of times in all).

    Written from the actors' threads (`timed`) and the event loop (`check_run`), under a
    lock; read on the event loop without one (a dict lookup is atomic).
    """

    def __init__(
        self, bound: float = INLINE_BOUND_S, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self.bound = bound
        self.clock = clock
        self.shapes: dict[Hashable, list[Any]] = {}  # key -> [strikes, streak, quick]
        # Moves whenever a shape changes sides: programs coded at an older one recode.
        self.version = 0
        self._lock = threading.Lock()

    @staticmethod
    def _needed(strikes: int) -> int:
        return 1 << (3 * min(strikes, 10))

    def inline(self, key: Hashable) -> bool:
        seen = self.shapes.get(key)
        return seen is not None and seen[1] >= self._needed(seen[0])

    def quick_time(self, key: Hashable) -> float:
        seen = self.shapes.get(key)
        return 0.0 if seen is None else float(seen[2])

    def record(self, key: Hashable, seconds: float) -> None:
        with self._lock:
            seen = self.shapes.get(key)
            if seen is None:
                if len(self.shapes) >= SHAPES_KEPT:
                    del self.shapes[next(iter(self.shapes))]
                seen = self.shapes[key] = [0, 0, 0.0]
            was_inline = seen[1] >= self._needed(seen[0])
            if seconds < self.bound:
                seen[1] += 1
                seen[2] = max(seen[2], seconds)
            else:
                seen[0] += 1
                seen[1] = 0
            if was_inline != (seen[1] >= self._needed(seen[0])):
                self.version += 1

    def timed(self, key: Hashable, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        """Run one kernel call on an actor's thread and record how long it took."""
        start = self.clock()
        try:
            fn(*args)
        finally:
            self.record(key, self.clock() - start)

    # -- runs of inline kernels --

    def start_run(self, cell: list[float]) -> None:
        cell[0] = self.clock()

    def check_run(self, cell: list[float], keys: tuple[Hashable, ...], expected: float) -> None:
        excess = self.clock() - cell[0] - expected
        if excess > self.bound:
            # One of them (which, is not known) ran slow: a strike against each shape.
            for key in set(keys):
                self.record(key, self.quick_time(key) + excess)

    def code(self, template: Sequence[Op | AdaptiveKernel]) -> tuple[Op, ...]:
        """A program's ops from its template, each kernel placed by what is known now."""
        ops: list[Op] = []
        run: list[Hashable] = []
        expected = 0.0
        cell: list[float] = [0.0]

        def close() -> None:
            if run:
                ops.append(run_op(EXEC, self.check_run, (cell, tuple(run), expected), -1))

        for entry in template:
            if isinstance(entry, AdaptiveKernel) and self.inline(entry.key):
                if run and expected + self.quick_time(entry.key) > RUN_BUDGET_S:
                    # Many quick kernels in a row would hold the loop for long: let the
                    # other clients' work in between.
                    close()
                    run = []
                    ops.append(run_op(AWAIT, _yield, (), -1))
                if not run:
                    cell = [0.0]
                    expected = 0.0
                    ops.append(run_op(EXEC, self.start_run, (cell,), -1))
                run.append(entry.key)
                expected += self.quick_time(entry.key)
                ops.append(entry.inline_op)
                continue
            close()
            run = []
            ops.append(entry.thread_op if isinstance(entry, AdaptiveKernel) else entry)
        close()
        return tuple(ops)

"""Where a worker runs a small CPU kernel: on its event loop, or on its client's thread.

A kernel run on the worker's event loop (trio's thread) costs nothing extra, but while it
runs no other client's work moves; run on the thread of its client's own queue actor it
delays nobody else, at a thread hop (~100 us) per run of such kernels. A worker places
each kernel call by what it has seen that call take (`KernelTimes`), per kernel *shape*:
kernel name, bytes of each buffer, launch dims. Var values are a call's data, as its
buffers' contents are: a decoder's kernel at its next position is the shape it was at
the last one, not a shape never seen (run on the thread, a hop per kernel, each step).

- A shape never seen runs on the thread, where its time is measured: a kernel is never
  trusted to be quick before it has been seen to be.
- A shape seen to run in under `INLINE_BOUND_S` runs inline, on the loop.
- A shape seen to take longer (on the wall and on the CPU, or on the wall twice in a
  row: not just preempted) goes back to the thread, and comes back to the loop only
  after a streak of quick runs there, 8 times longer after each slow run (see
  `KernelTimes`): a kernel slow from the start never delays another client, and one
  that turns slow (on other data) delays them once, then rarely.

A run of inline kernels expected, by their typical times, to take more than
`RUN_BUDGET_S` in all is cut in runs that do not, with a trio checkpoint between them:
however many quick kernels a program has, the event loop is never held for much longer
than that.

Inline calls are not timed one by one (two clock reads per call would cost the small
replays this is for); each run of consecutive inline kernels is timed as a whole: its
time moves its shapes' typical times, and a run that takes more than the bound (and a
part of their sum) longer than its kernels' typical times add up to counts as a slow
run of each of its shapes.

Kernels that touch `--thread-bytes` or more always run on the thread (several devices
then really run in parallel); `--thread-bytes 0` puts every kernel there.

Programs are lowered once and replayed many times, so a program keeps its lowered
`template` and the stamp it was coded at; a batch recodes it only when some shape
changed sides since, or (for a program whose runs were cut, or came near the budget)
some typical time moved 2x (rare: a few times per new shape, mostly).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import trio

from actorgraph.devices import AWAIT, EXEC, EXEC_THREAD, Op, RunOp, run_op

INLINE_BOUND_S = 100e-6  # a kernel seen to take longer leaves the event loop
RUN_BUDGET_S = 1e-3  # inline kernels expected to take longer in all yield between them
FORGIVEN_AFTER = 64  # a strike is forgotten after this many times the streak it needed
SUSPECTS_SLOW = 3  # runs in a row slow on the wall only that count as a slow run
SHAPES_KEPT = 4096  # shapes a worker remembers; a forgotten one is measured again


async def _yield(job: Any) -> None:
    """Let the worker's other tasks (other clients) run, between long runs of kernels."""
    await trio.lowlevel.checkpoint()


def _needed(strikes: int) -> int:
    """The streak a shape with `strikes` needs to run inline: 1, 8, 64, ..."""
    return 1 << (3 * min(strikes, 10))


class _Seen:
    """What a worker has seen of one kernel shape (see KernelTimes)."""

    __slots__ = ("strikes", "streak", "typical", "runs", "suspects", "coded")

    def __init__(self) -> None:
        self.strikes = 0  # runs judged slow
        self.streak = 0  # quick runs since the last strike
        self.typical = 0.0  # what a quick run usually takes
        self.runs = 0  # quick runs seen
        self.suspects = 0  # runs in a row slow on the wall, not on the CPU
        self.coded = 0.0  # `typical` when it last moved `KernelTimes.tempo`

    def inline(self) -> bool:
        """Whether its streak is long enough to run it inline."""
        return self.streak >= _needed(self.strikes)

    def quick(self) -> None:
        """A quick run: the streak grows (a strike is forgotten after a long one)."""
        self.streak += 1
        self.suspects = 0
        if self.strikes and self.streak >= FORGIVEN_AFTER * _needed(self.strikes):
            # Quick for that long since: the strike was a fluke (the machine's doing), not
            # the kernel's; forgetting it keeps strikes from piling up over a long life.
            self.strikes -= 1
            self.streak = _needed(self.strikes)  # inline still; the next one waits

    def strike(self) -> None:
        """A run judged slow: a strike, and the streak starts again."""
        self.strikes += 1
        self.streak = 0
        self.suspects = 0

    def suspect(self) -> None:
        """A run slow on the wall only (preempted, or blocked: asleep, on I/O?): judged
        slow once SUSPECTS_SLOW come in a row."""
        self.suspects += 1
        if self.suspects >= SUSPECTS_SLOW:
            self.strike()

    def retimed(self) -> bool:
        """Whether its typical time moved 2x since it last did (it counts from now)."""
        if self.coded / 2 <= self.typical <= self.coded * 2:
            return False
        self.coded = self.typical
        return True

    def follow(self, seconds: float) -> None:
        """A quick run took `seconds`: the first run is replaced by the second, others
        move the typical time by an eighth of the difference (counted as at most twice
        the typical time: a spike barely moves it)."""
        if self.runs < 2:
            self.typical = seconds
        else:
            self.typical += (min(seconds, 2 * self.typical) - self.typical) / 8
        self.runs += 1


class AdaptiveKernel:
    """A kernel call in a program's template: coded inline or onto the thread at a batch."""

    __slots__ = ("key", "thread_op", "inline_op")

    def __init__(self, times: KernelTimes, key: Hashable, op: RunOp) -> None:
        self.key = key
        self.inline_op = run_op(EXEC, op.fn, op.args, op.item)
        self.thread_op = run_op(EXEC_THREAD, times.timed, (key, op.fn, op.args), op.item)


class KernelTimes:
    """What a worker has seen of each kernel shape's run times, shared by its sessions.

    Per shape (a `_Seen`): `strikes`, the runs judged slow; `streak`, the quick runs
    since the last strike; `typical`, what a run usually takes. A shape runs inline
    while its streak is long enough: one quick run while it never was slow, then 8, 64,
    ... times as many after each strike.

    A run is slow when its wall time reaches the bound and so does its CPU time (the
    running thread's `cpu_clock`). Wall time alone also counts the moments the OS gave
    the CPU to another process (or the GIL to another thread): a run slow on the wall
    but quick on the CPU is a *suspect*, judged slow once `SUSPECTS_SLOW` come in a
    row (a kernel that blocks, sleeping or waiting on I/O, is slow on the wall every
    time; preemption seldom hits one shape that often in a row). A kernel that really
    is slow at times delays the others once (a few times if it blocks), then once per
    8x longer streak (a handful in all); a strike is forgotten after FORGIVEN_AFTER
    times the streak it asked for (inline runs count), so flukes do not pile up.

    `typical` ignores the first run (cold caches, first-call costs) and follows others
    by an eighth of the difference (counted as at most twice it: a spike barely moves
    it); inline runs, timed as a whole, move it too. Runs of inline kernels are
    cut by it (`RUN_BUDGET_S`), so a long program of tiny kernels stays on the loop in
    one piece.

    Written from the actors' threads (`timed`) and the event loop (`check_run`), under a
    lock; read on the event loop without one (a dict lookup is atomic).
    """

    def __init__(
        self,
        bound: float = INLINE_BOUND_S,
        clock: Callable[[], float] = time.perf_counter,
        cpu_clock: Callable[[], float] = time.thread_time,
    ) -> None:
        self.bound = bound
        self.clock = clock
        self.cpu_clock = cpu_clock
        self.shapes: dict[Hashable, _Seen] = {}
        # Moves whenever a shape changes sides: programs coded at an older one recode.
        self.version = 0
        # Moves whenever a shape's typical time moved 2x: programs whose runs of inline
        # kernels were cut, or came near the budget, recode (see `stale`).
        self.tempo = 0
        self._lock = threading.Lock()

    def inline(self, key: Hashable) -> bool:
        seen = self.shapes.get(key)
        return seen is not None and seen.inline()

    def quick_time(self, key: Hashable) -> float:
        seen = self.shapes.get(key)
        return 0.0 if seen is None else seen.typical

    def record(self, key: Hashable, seconds: float, cpu_seconds: float | None = None) -> None:
        """One run of `key` took `seconds` on the wall and `cpu_seconds` on its thread's
        CPU (None: as long as on the wall)."""
        with self._lock:
            seen = self.shapes.get(key)
            if seen is None:
                if len(self.shapes) >= SHAPES_KEPT:
                    del self.shapes[next(iter(self.shapes))]
                seen = self.shapes[key] = _Seen()
            was_inline = seen.inline()
            if seconds < self.bound:
                seen.quick()
                seen.follow(seconds)
            elif (cpu_seconds if cpu_seconds is not None else seconds) >= self.bound:
                seen.strike()
            else:
                seen.suspect()
            if was_inline != seen.inline():
                self.version += 1
            if seen.retimed():
                self.tempo += 1

    def timed(self, key: Hashable, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        """Run one kernel call on an actor's thread and record how long it took."""
        start, cpu = self.clock(), self.cpu_clock()
        try:
            fn(*args)
        finally:
            self.record(key, self.clock() - start, self.cpu_clock() - cpu)

    # -- runs of inline kernels --

    def start_run(self, cell: list[float]) -> None:
        cell[0] = self.clock()
        cell[1] = self.cpu_clock()

    def check_run(self, cell: list[float], coded: dict[Hashable, float], expected: float) -> None:
        """A run of inline kernels ends: `coded` holds its shapes' typical times when it
        was coded, `expected` the sum of its kernels' ones."""
        wall = self.clock() - cell[0]
        excess = wall - expected
        # Typical times are estimates: a run of many kernels strays from their sum by a
        # part of it, one slow kernel by the bound more.
        if excess > self.bound + expected / 2:
            # One of them (which, is not known) ran slow: held against each shape.
            cpu_excess = self.cpu_clock() - cell[1] - expected
            for key, typical in coded.items():
                self.record(key, typical + excess, typical + cpu_excess)
        elif wall > 0 and expected > 0:
            # Each shape's typical time follows what the whole run took (kernels only
            # timed cold on the thread come down to their time on the loop); programs
            # recode if one moved 2x, so runs are cut where they really need to be.
            scale = wall / expected
            with self._lock:
                for key, typical in coded.items():
                    seen = self.shapes.get(key)
                    if seen is not None:
                        seen.quick()
                        seen.follow(typical * scale)
                        if seen.retimed():
                            self.tempo += 1

    def stale(self, stamp: tuple[int, int | None]) -> bool:
        """Whether ops coded at `stamp` (from `code`) need coding again."""
        return stamp[0] != self.version or (stamp[1] is not None and stamp[1] != self.tempo)

    def code(
        self, template: Sequence[Op | AdaptiveKernel]
    ) -> tuple[tuple[Op, ...], tuple[int, int | None]]:
        """A program's ops from its template, each kernel placed by what is known now,
        and the stamp they are coded at (see `stale`): the tempo counts only where a run
        of inline kernels was cut or came within 4x of the budget."""
        ops: list[Op] = []
        run: dict[Hashable, float] = {}
        expected = 0.0
        longest = 0.0
        cell: list[float] = [0.0, 0.0]

        def close() -> None:
            if run:
                ops.append(run_op(EXEC, self.check_run, (cell, run, expected), -1))

        for entry in template:
            if isinstance(entry, AdaptiveKernel) and self.inline(entry.key):
                if run and expected + self.quick_time(entry.key) > RUN_BUDGET_S:
                    # Many quick kernels in a row would hold the loop for long: let the
                    # other clients' work in between.
                    close()
                    run = {}
                    ops.append(run_op(AWAIT, _yield, (), -1))
                    longest = RUN_BUDGET_S
                if not run:
                    cell = [0.0, 0.0]
                    expected = 0.0
                    ops.append(run_op(EXEC, self.start_run, (cell,), -1))
                run[entry.key] = typical = self.quick_time(entry.key)
                expected += typical
                longest = max(longest, expected)
                ops.append(entry.inline_op)
                continue
            close()
            run = {}
            ops.append(entry.thread_op if isinstance(entry, AdaptiveKernel) else entry)
        close()
        tempo = self.tempo if longest > RUN_BUDGET_S / 4 else None
        return tuple(ops), (self.version, tempo)

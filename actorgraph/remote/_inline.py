"""A worker's jobs run on in the task that satisfies what they wait on.

A batch whose queues are idle runs in the task that reads it (see `Session._batch`). A
job of it that meets a wait not yet satisfied is not posted to its actor when the wait
is on a `HoldingSignal` (a mirror of another worker's or the client's queue, or a queue
of this client's own on this worker): it is *held* there, parked on its actor (which
starts nothing else meanwhile, see `QueueActor.hold`), and whichever task moves that
signal runs it on at once: the link reader that lands a copy's bytes from another
worker, the client's reader that takes an "ext", or the job that signals the queue. So a
step of a chain between two workers costs the receiving worker no task switch: the
reader lands the bytes, runs the copy, the kernel after it, and sends the next bytes.

A job runs on only as far as ops that need no task of their own: inline kernels (those
the worker has seen to be quick, see _placement.py), signals, satisfied waits and
`Quick` ops that can finish at once. At any other op (a kernel on the thread, a pull
over a new link, a yield between long runs of kernels) its actor's task takes it over,
first in line, so a slow kernel never runs in a link reader, and other clients' work on
the event loop waits for nothing more than it would if the job ran on its actor.

Held jobs run one at a time, never one inside another: a signal moved while jobs run
(by a job's own signal) only queues the jobs it satisfies (`Resumer`).
"""

from __future__ import annotations

import collections
import heapq
import itertools
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from actorgraph.devices import AWAIT, WAIT, Job, QueueActor, Signal


class Quick:
    """An AWAIT op's function that can often finish at once: `now(job, *args)` does the
    op and returns True, or does nothing and returns False, and `later(job, *args)` is
    awaited instead. A held job runs `now` in the task that resumed it; its actor runs
    `now`, then `later` if it must (`__call__`)."""

    __slots__ = ("later", "now")

    def __init__(
        self, now: Callable[..., bool], later: Callable[..., Awaitable[None]] | None = None
    ) -> None:
        self.now = now
        self.later = later

    async def __call__(self, job: Job, *args: Any) -> None:
        if not self.now(job, *args):
            assert self.later is not None  # an op that always finishes at once says True
            await self.later(job, *args)


class Resumer:
    """Runs held jobs whose waits are satisfied, in the task that satisfied them: one
    job at a time, in the order their waits were satisfied, never nested (a worker has
    one, shared by its sessions)."""

    __slots__ = ("_ready", "_running")

    def __init__(self) -> None:
        # (run, job index, whether the job was held): what runs next, in order.
        self._ready: collections.deque[tuple[InlineRun, int, bool]] = collections.deque()
        self._running = False

    def start(self, run: InlineRun) -> None:
        """Run a batch's jobs from their first op, queue 0 first."""
        self._ready.extend((run, q, False) for q in range(len(run.jobs)))
        self.drain()

    def moved(self, signal: HoldingSignal) -> None:
        """`signal` moved: run the jobs held on it that it now satisfies."""
        held = signal.held
        value = signal.value
        ready = self._ready
        while held and held[0][0] <= value:
            _, _, run, q = heapq.heappop(held)
            ready.append((run, q, True))
        self.drain()

    def drain(self) -> None:
        if self._running:
            return  # a job is running in this task: the loop below gets to them
        self._running = True
        try:
            ready = self._ready
            while ready:
                run, q, held = ready.popleft()
                try:
                    run.step(q, held)
                except Exception as exc:  # a fault of the job's own session, not the task's
                    run.broke(exc)
        finally:
            self._running = False


class HoldingSignal(Signal):
    """A signal that jobs can be held on (`InlineRun`): moving it runs those it
    satisfies, in the mover's task."""

    __slots__ = ("held", "resumer")

    def __init__(self, name: str, value: int, resumer: Resumer) -> None:
        super().__init__(name, value)
        # (target, seq, run, job index), a heap: the held jobs waiting for `target`.
        self.held: list[tuple[int, int, InlineRun, int]] = []
        self.resumer = resumer

    def set(self, value: int) -> None:
        if value <= self.value:
            return
        super().set(value)
        held = self.held
        if held and held[0][0] <= value:
            self.resumer.moved(self)


_SEQ = itertools.count()


class InlineRun:
    """One batch's jobs (jobs[q] for actors[q]), run in the tasks that make them ready
    (see the module's docstring). `at[q]`: where job q is held, while it is."""

    __slots__ = ("actors", "at", "broke", "jobs")

    def __init__(
        self,
        actors: Sequence[QueueActor],
        jobs: Sequence[Job],
        broke: Callable[[BaseException], None],
    ) -> None:
        self.actors = actors
        self.jobs = jobs
        self.at = [0] * len(jobs)
        # Called if running a job raises (a fault a job's actor would have died of): the
        # task that ran it (maybe a link other clients' work comes over) goes on.
        self.broke = broke

    def step(self, q: int, held: bool) -> None:
        """Run job q on from where it is (held there, if `held`) until it ends, is held
        again, or needs a task."""
        actor = self.actors[q]
        job = self.jobs[q]
        if actor.closed:
            return  # its actor stopped, and failed the job as it did
        i = self.at[q]
        if held:
            actor.resume()
        ops = job.ops
        count = len(ops)
        while True:
            i = actor.run_ready(job, i)
            if i == count:
                actor.release()
                return
            op = ops[i]
            code = op[0]
            if code == WAIT:
                signal = op[1]
                if isinstance(signal, HoldingSignal):
                    target = job.bases[op[2]] + op[3]
                    self.at[q] = i
                    actor.hold(job, signal, target, i)
                    heapq.heappush(signal.held, (target, next(_SEQ), self, q))
                    return
            elif code == AWAIT and type(op[1]) is Quick:
                try:
                    done = op[1].now(job, *op[2])
                except Exception as exc:  # as the actor does: the submission fails
                    job.submission.fail(op[3], actor.name, exc)  # [3]: its item
                    done = True
                if done:
                    i += 1
                    continue
            actor.hand_over(job, i)
            return

"""Jobs run where they are submitted, and held jobs run on where their waits are met.

A submission whose queues are all idle runs in the submitter's own task (`InlineRun`):
each job is stepped (devices/_step.py) until it is done or stops; a job that stops at a
wait another job of the submission satisfies parks here and runs on when that job gets
there, with no task switch. What cannot run here goes to its actor from where it
stands, so it runs exactly as if posted so: a job that needs a task of its own (a
kernel on the worker thread, I/O), and, once nothing here can move, a job waiting on
work outside the submission.

Such a job may instead be *held* where it waits, when the signal can hold jobs (a
`HoldingSignal`: a CPU device's queue; on a client, a worker's queue as its reports
move it; on a worker, a mirror of another worker's or the client's queue, or a queue
of the client's own): it stays parked on its actor (which starts nothing else
meanwhile, see `QueueActor.hold`), and whichever task moves that signal runs it on at
once (`Resumer`): on a client, the task that takes a worker's report (with the bytes
of a copy from it that came ahead); on a worker, the link reader that lands a copy's
bytes from another worker, the reader that takes the client's "ext"; anywhere, the
job that signals the queue. So a step of a chain between two workers, or between this
host and a worker, costs the receiving side no task switch. A held job runs on only as
far as ops that need no task; at any other, its actor's task takes it over, first in
line, so a slow kernel never runs in a reader. A runtime has one `Resumer` for all its
devices (a worker's, for all its clients' sessions too).

Held jobs run one at a time, never one inside another: a signal moved while jobs run
(by a job's own signal) only queues the jobs it satisfies.
"""

from __future__ import annotations

import collections
import heapq
import itertools
from collections.abc import Callable, Sequence

from ._actor import QueueActor
from ._ops import WAIT, Job
from ._signal import Signal
from ._step import step

_SEQ = itertools.count()


class InlineRun:
    """One submission's jobs (jobs[q] for actors[q], every actor idle and distinct) run
    in the tasks that make them ready (see the module's docstring). Jobs waiting on a
    HoldingSignal are held there (its `Resumer` runs them on); `broke` is told of a fault
    that running a job raised there (one its actor's task would have died of)."""

    __slots__ = ("actors", "broke", "jobs")

    def __init__(
        self,
        actors: Sequence[QueueActor],
        jobs: Sequence[Job],
        broke: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.actors = actors
        self.jobs = jobs
        self.broke = broke

    def start(self) -> None:
        """Run every job from where it stands, queue 0 first: a job runs until it is done
        or stops; a parked job runs on once another job here satisfies its wait, until
        every job is done or none can move. Waits and signals are those the actors
        would meet, in an order they could meet them in."""
        jobs = self.jobs
        ready = list(range(len(jobs) - 1, -1, -1))  # popped from the end: queue 0 first
        # Parked jobs by the signal they wait on. A job's run moves only its own signal
        # and, when it ends, its devices' timelines: only jobs parked on those are
        # looked at again.
        parked: dict[Signal, list[int]] = {}
        while ready:
            q = ready.pop()
            for signal in self._run(q, parked):
                waiting = parked.pop(signal, None)
                if waiting is not None:
                    still = self._wake(signal, waiting, ready)
                    if still:
                        parked[signal] = still
        # What is still parked waits on work outside this submission (or on a signal no
        # job here moves): held there, or run by its actor from there.
        for signal, waiting in parked.items():
            for q in waiting:
                self._leave(q, signal)

    def _run(self, q: int, parked: dict[Signal, list[int]]) -> Sequence[Signal]:
        """Step job q; park it, or pass it on, where it stops. The signals its run moved."""
        job = self.jobs[q]
        actor = self.actors[q]
        at = step(job, job.at, actor.name)
        ops = job.ops
        if at == len(ops):
            actor.finish(job)
            return (actor.signal, *job.submission.timelines)
        job.reached(at)
        op = ops[at]
        if op.code == WAIT:
            parked.setdefault(op.signal, []).append(q)
        else:
            actor.post(job)
        return (actor.signal,)

    def _wake(self, signal: Signal, waiting: list[int], ready: list[int]) -> list[int]:
        """Move the jobs parked on `signal` that it now satisfies to `ready`; the rest."""
        value = signal.value
        still = []
        for q in waiting:
            job = self.jobs[q]
            if value >= _wait_target(job):
                ready.append(q)
            else:
                still.append(q)
        return still

    def _leave(self, q: int, signal: Signal) -> None:
        """Job q waits on `signal` for work outside this run: hold it there if the signal
        holds jobs (on a worker), else its actor runs it from there."""
        job = self.jobs[q]
        if isinstance(signal, HoldingSignal):
            target = _wait_target(job)
            self.actors[q].hold(job, signal, target, job.at)
            signal.hold(target, self, q)
        else:
            self.actors[q].post(job)

    def resume(self, q: int) -> None:
        """Job q, held, has its wait met: run it on in this task until it ends, is held
        again, or needs a task (its actor's task then takes it, first in line)."""
        actor = self.actors[q]
        job = self.jobs[q]
        if actor.closed:
            return  # its actor stopped, and failed the job as it did
        actor.resume()
        at = step(job, job.at, actor.name)
        ops = job.ops
        if at == len(ops):
            actor.finish(job)
            actor.release()
            return
        op = ops[at]
        if op.code == WAIT and isinstance(op.signal, HoldingSignal):
            signal = op.signal
            target = op.target(job.bases)
            actor.hold(job, signal, target, at)
            signal.hold(target, self, q)
            return
        actor.hand_over(job, at)


def _wait_target(job: Job) -> int:
    """The value the wait `job` stands at (a parked job's) waits for."""
    wait = job.ops[job.at]
    if wait.code != WAIT:
        raise AssertionError(f"op {job.at} of a parked job is {wait!r}, not a wait")
    return wait.target(job.bases)


def run_inline(actors: Sequence[QueueActor], jobs: Sequence[Job]) -> None:
    """Run one submission's jobs (jobs[q] for actors[q], every actor idle) in the
    submitter's own task, with no task switch (`InlineRun.start`); what cannot run here
    goes to its actor from where it stands, so it runs exactly as posted."""
    InlineRun(actors, jobs).start()


class Resumer:
    """Runs inline runs and held jobs whose waits are met, in the task that met them: one
    at a time, in the order their waits were met, never nested (a worker has one, shared
    by its sessions)."""

    __slots__ = ("_ready", "_running")

    def __init__(self) -> None:
        # (run, job index or -1 for the run's start): what runs next, in order.
        self._ready: collections.deque[tuple[InlineRun, int]] = collections.deque()
        self._running = False

    def start(self, run: InlineRun) -> None:
        """Run a submission's jobs from where they stand (`InlineRun.start`)."""
        self._ready.append((run, -1))
        self.drain()

    def moved(self, signal: HoldingSignal) -> None:
        """`signal` moved: run the jobs held on it that it now satisfies."""
        ready = self._ready
        for run, q in signal.satisfied():
            ready.append((run, q))
        self.drain()

    def drain(self) -> None:
        if self._running:
            return  # a job is running in this task: the loop below gets to them
        self._running = True
        try:
            ready = self._ready
            while ready:
                run, q = ready.popleft()
                try:
                    if q < 0:
                        run.start()
                    else:
                        run.resume(q)
                except Exception as exc:  # a fault of the run's own, not the task's
                    if run.broke is None:
                        raise
                    run.broke(exc)
        finally:
            self._running = False


class HoldingSignal(Signal):
    """A signal that jobs can be held on (`InlineRun`): moving it runs those it
    satisfies, in the mover's task (through its `Resumer`)."""

    __slots__ = ("_held", "resumer")

    def __init__(self, name: str, value: int, resumer: Resumer) -> None:
        super().__init__(name, value)
        # (target, seq, run, job index), a heap: the held jobs waiting for `target`.
        self._held: list[tuple[int, int, InlineRun, int]] = []
        self.resumer = resumer

    @property
    def waiting(self) -> bool:
        """As Signal's, and also whether a job is held here (setting it may run one)."""
        return bool(self._held) or super().waiting

    def hold(self, target: int, run: InlineRun, q: int) -> None:
        """Job q of `run` is held here until the value reaches `target`."""
        heapq.heappush(self._held, (target, next(_SEQ), run, q))

    def satisfied(self) -> list[tuple[InlineRun, int]]:
        """Take the held jobs the value now satisfies, in the order they were held."""
        held = self._held
        value = self.value
        out = []
        while held and held[0][0] <= value:
            _, _, run, q = heapq.heappop(held)
            out.append((run, q))
        return out

    def set(self, value: int) -> None:
        if value <= self.value:
            return
        super().set(value)
        self.release_held()

    def release_held(self) -> None:
        """Run on the held jobs the value now satisfies (after it moved)."""
        held = self._held
        if held and held[0][0] <= self.value:
            self.resumer.moved(self)

"""Queue actors: a trio task with an inbox that runs jobs, one after another.

What a job's ops mean is `step` (devices/_step.py); an actor's task is one of the drivers
that call it: it steps a job, deals with the op the step stopped at (parks on a WAIT,
hands a run of EXEC_THREAD ops to its worker thread, awaits an AWAIT op, runs an op of
its device kind in `_run_device_op`), and steps on. Device kinds run codes of their own
there and say which codes they run in `op_codes`; a kind whose jobs go elsewhere whole
(a GPU stream, a worker) overrides `_run_job`.

A profiled job carries an observer (a JobProfile): `step` times its items, this loop
times the waits it parks on and the ops it awaits, with the actor's clock (`clock`).
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar

import attrs
import outcome
import trio

from ._ops import (
    AWAIT,
    EXEC_THREAD,
    HOST_OPS,
    WAIT,
    ActorClosedError,
    Job,
    JobProfile,
    Op,
    Quick,
    RunOp,
    Submission,
    refuse_op,
)
from ._signal import Doorbell, Signal
from ._step import Calls, run_calls, step

_VALUE_MAX = (1 << 64) - 1

Failure = tuple[int, BaseException]


@attrs.frozen
class ActorStatistics:
    name: str
    jobs_done: int
    jobs_queued: int
    items_run: int
    signal_value: int
    waits_parked: int = 0
    time_blocked: float = 0.0
    bytes_copied: int = 0


class WorkerThread:
    """One OS thread that runs runs of EXEC_THREAD calls for an actor, so numpy work
    leaves the trio thread (and two devices really run in parallel) at one hop per run."""

    def __init__(self, name: str, token: trio.lowlevel.TrioToken) -> None:
        self._token = token
        self._jobs: queue.SimpleQueue[
            tuple[Calls, int, JobProfile | None, trio.lowlevel.Task] | None
        ] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        while True:
            got = self._jobs.get()
            if got is None:
                return
            calls, first, observer, task = got
            # Nothing of a run outlives it here: the wait for the next one must not keep
            # its calls, and what they hold (a departed client's memory, its code), alive.
            del got
            failure = run_calls(calls, first, observer)
            del calls, observer
            try:
                self._token.run_sync_soon(trio.lowlevel.reschedule, task, outcome.Value(failure))
            except trio.RunFinishedError:
                return
            del task, failure

    async def run(
        self, calls: Calls, first: int, observer: JobProfile | None = None
    ) -> Failure | None:
        """Run a run of calls (the first is op `first`) in the thread, as `run_calls`
        does (timed into `observer`, whose clock must be perf_counter)."""
        self._jobs.put((calls, first, observer, trio.lowlevel.current_task()))
        # The thread cannot be interrupted; a cancelled actor waits for its run.
        result: Failure | None = await trio.lowlevel.wait_task_rescheduled(
            lambda _: trio.lowlevel.Abort.FAILED
        )
        return result

    def close(self) -> None:
        self._jobs.put(None)


class QueueActor:
    """A device queue as a trio task: it owns its timeline signal and runs jobs in order."""

    # The op codes this kind of queue runs (devices/_ops.py).
    op_codes: ClassVar[frozenset[int]] = HOST_OPS
    # Whether a submitter may run this kind's jobs in its own task while the actor is
    # idle (devices/_inline.py): jobs are posted, served and run as QueueActor does.
    runs_inline: ClassVar[bool] = True
    # Whether posted jobs wait for `flush` (a REMOTE queue sends a submission's jobs
    # for its worker as one batch then); a plain actor starts a posted job at once.
    flushes: ClassVar[bool] = False
    # The clock profiles and blocked times are measured with (seconds): a function of
    # no arguments (a device kind with a clock of its own sets another).
    clock: Callable[[], float] = staticmethod(time.perf_counter)
    # What a caller may wait for a submission with when all its jobs went to queues
    # with this same `end_reader`, which then reads their ends in the caller's task (a
    # REMOTE queue's connection): `end_reader.coming()` before submitting (or
    # `not_coming()` if submitting fails), then `await end_reader.wait_done(sub)`.
    # None: the actor's own task ends its jobs, and the caller waits on `sub.done`.
    end_reader: Any = None

    def __init__(self, name: str, timeline_start: int = 0, signal: Signal | None = None) -> None:
        """A queue named `name` whose timeline starts at `timeline_start`: its `signal`
        is the one given (made by the caller at that value, e.g. one that tells others
        as it moves), else a plain Signal."""
        self.name = name
        self.signal = Signal(name, timeline_start) if signal is None else signal
        self.next_value = timeline_start
        self._inbox: collections.deque[Job] = collections.deque()
        self._doorbell = Doorbell()
        self._worker: WorkerThread | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._closed = False
        self._current: Job | None = None
        # Whether `_current` is a job held parked outside this task (see `hold`).
        self._held = False
        self._held_since = 0.0
        # Where the actor is parked on a signal: (signal, target, op index of the WAIT).
        # Set only on the slow path; the deadlock monitor reads it.
        self.parked_on: tuple[Signal, int, int] | None = None
        self.parks = 0
        self.jobs_done = 0
        self.items_run = 0
        self.time_blocked = 0.0
        self.bytes_copied = 0

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"

    # -- submission side (runs in the submitter's task, never blocks) --

    def reserve(self, count: int) -> int:
        """Take `count` timeline values for a job; return the base they are relative to."""
        base = self.next_value
        if base + count > _VALUE_MAX:
            raise OverflowError(
                f"{self.name}: timeline would pass 2**64-1; start the runtime with a lower "
                f"timeline_start"
            )
        self.next_value = base + count
        return base

    def give_back(self, base: int) -> None:
        """Undo the last `reserve`, which returned `base` (nothing was posted with it)."""
        self.next_value = base

    def waits_without_host(self, other: QueueActor) -> bool:
        """Whether this actor waits on `other`'s signal without its trio-side value (GPU
        queues reading each other's words); if every waiter does, `other` need not
        report that value to the host."""
        return False

    def post(self, job: Job) -> None:
        self._inbox.append(job)
        self._doorbell.ring()

    def flush(self) -> None:
        """Called once a submission has posted all its jobs. A plain actor has nothing
        to do here (a posted job starts at once); a REMOTE queue's connection sends the
        jobs it was posted as one batch, from the submitter's task."""

    def pending(self) -> list[tuple[Job, int]]:
        """The work this actor has not finished: (job, first op index not yet done).

        Exact only while the actor is parked on a signal (or idle): the monitor uses it then.
        """
        out: list[tuple[Job, int]] = []
        current = self._current
        if current is not None:
            out.append((current, self.parked_on[2] if self.parked_on is not None else current.at))
        out.extend((job, job.at) for job in self._inbox)
        return out

    @property
    def current(self) -> Job | None:
        """The job the actor is running now (None when idle)."""
        return self._current

    @property
    def busy(self) -> bool:
        return self._current is not None or bool(self._inbox)

    @property
    def idle(self) -> bool:
        """Serving, with no job running or queued: a new job would start at once."""
        return (
            self._current is None
            and not self._inbox
            and self._token is not None
            and not self._closed
        )

    @property
    def closed(self) -> bool:
        """Whether the actor has stopped serving (its jobs were failed as it stopped)."""
        return self._closed

    # -- the counts of a job, wherever it ran --

    def counted(self, job: Job) -> None:
        """Count `job` as run by this queue (its end is its submission's to hear of)."""
        self.jobs_done += 1
        self.items_run += job.script.items
        self.bytes_copied += job.copy_bytes

    def finish(self, job: Job) -> None:
        """`job`'s ops are all done (here or by a task it was run in): count it, and end
        it in its submission."""
        self.counted(job)
        job.submission.job_done(job.slot)

    def complete(self, count: int, last: int, copied: int) -> None:
        """A job of `count` items, posted to nobody, was run to its end where it was
        submitted, on this idle actor (a LinearRun, which made no Job, and checked that
        the values stay below 2**64-1): take its timeline values, leave the signal `last`
        past their base (-1: the job sets none), and count it."""
        base = self.next_value
        self.next_value = base + count
        if last >= 0:
            self.signal.set(base + last)
        self.jobs_done += 1
        self.items_run += count
        if copied:
            self.bytes_copied += copied

    # -- jobs held parked outside the actor's task --
    #
    # A submitter that runs a job in its own task (devices/_inline.py) may, where the
    # job meets a wait not yet satisfied, hold it parked on the actor instead of posting
    # it: the actor counts as busy with it (its own task starts nothing else meanwhile),
    # and whoever satisfies the wait runs it on, then `release`s the actor once it
    # ends, or `hand_over`s the rest to the actor's task.

    def hold(self, job: Job, signal: Signal, target: int, index: int) -> None:
        """`job` (run inline so far, with this actor idle or held for it) is parked at op
        `index`, a wait on `signal` for `target`, outside this actor's task."""
        if not self._held:
            self._current = job
            self._held = True
        job.reached(index)
        self.parked_on = (signal, target, index)
        self.parks += 1
        job.submission.parked()
        self._held_since = time.perf_counter()

    def resume(self) -> None:
        """A held job's wait is satisfied: it runs on in the caller's task."""
        blocked = time.perf_counter() - self._held_since
        self.time_blocked += blocked
        if self._current is not None:
            self._current.submission.blocked(blocked)
        self.parked_on = None

    def release(self) -> None:
        """The held job ended: the actor takes its next job."""
        self._held = False
        self._current = None
        self.parked_on = None
        if self._inbox:
            self._doorbell.ring()

    def hand_over(self, job: Job, index: int) -> None:
        """`job`, run inline up to op `index`, needs a task of its own there: the actor's
        task runs the rest, before any job posted after it."""
        job.reached(index)
        self._held = False
        self._current = None
        self.parked_on = None
        self._inbox.appendleft(job)
        self._doorbell.ring()

    def statistics(self) -> ActorStatistics:
        return ActorStatistics(
            name=self.name,
            jobs_done=self.jobs_done,
            jobs_queued=len(self._inbox),
            items_run=self.items_run,
            signal_value=self.signal.value,
            waits_parked=self.parks,
            time_blocked=self.time_blocked,
            bytes_copied=self.bytes_copied,
        )

    def _now(self) -> float:
        """The actor's clock now (`clock`)."""
        return self.clock()

    # -- the actor's own task --

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self._token = trio.lowlevel.current_trio_token()
        task_status.started()
        try:
            while True:
                if not self._inbox or self._held:
                    await self._doorbell.wait()
                    continue
                job = self._inbox.popleft()
                self._current = job
                await self._run_job(job)
                self._current = None
                # Not kept while this task waits: a cancellation's traceback holds this
                # frame, and the job would hold its ops' memory as long as that does.
                del job
                if self._inbox:
                    # Back-to-back jobs: let other tasks run between them.
                    await trio.lowlevel.checkpoint()
        finally:
            self._closed = True
            if self._worker is not None:
                self._worker.close()
            self._abandon()

    def _abandon(self) -> None:
        """The actor is gone: fail every job it will never finish, so no caller hangs."""
        pending = list(self._inbox)
        self._inbox.clear()
        if self._current is not None:
            pending.insert(0, self._current)
            self._current = None
        for job in pending:
            job.submission.abandon(
                self.name, ActorClosedError(f"{self.name} was shut down before it ran this work")
            )

    def _thread(self) -> WorkerThread:
        if self._worker is None:
            assert self._token is not None
            self._worker = WorkerThread(f"actorgraph {self.name}", self._token)
        return self._worker

    async def _run_job(self, job: Job) -> None:
        """Run `job` in this task from where it stands to its end."""
        name = self.name
        count = len(job.ops)
        observer = job.observer
        if observer is not None:
            observer.use_clock(self.clock)
            observer.began(self.clock())
        at = step(job, job.at, name)
        while at < count:
            at = step(job, await self._stopped(job, at), name)
        if observer is not None:
            observer.finished(self.clock())
        self.finish(job)

    async def _stopped(self, job: Job, at: int) -> int:
        """Run op `at`, where `step` stopped, in this task; return where to step on."""
        job.reached(at)  # (an AWAIT op's function may look where it has got)
        op = job.ops[at]
        if op.code == EXEC_THREAD:
            return await self._run_on_thread(job, at)
        start = self.clock()
        if op.code == WAIT:
            await self._park(op.signal, op.target(job.bases), job.submission, at)
            after = at + 1
        elif op.code == AWAIT:
            await self._await_op(job, op)
            after = at + 1
        else:
            after = await self._run_device_op(op, job, at + 1)
        observer = job.observer
        if observer is not None:
            observer.span(at, start, self.clock())
        return after

    async def _run_on_thread(self, job: Job, at: int) -> int:
        """A run of EXEC_THREAD ops, from op `at`, on the worker thread, in one hop."""
        end, calls = job.script.runs[at]
        sub = job.submission
        if sub.error is None:
            observer = job.observer
            clock = self.clock
            if observer is not None and clock is not time.perf_counter:
                # Times taken on the thread are perf_counter's: another clock (SIM's is
                # trio's) cannot be read there. Such devices keep their items off it.
                observer.use_clock(time.perf_counter)
            try:
                failed = await self._thread().run(calls, at, observer)
            finally:
                if observer is not None:
                    observer.use_clock(clock)
            if failed is not None:
                sub.fail(job.item_at(failed[0]), self.name, failed[1])
        return end

    async def _await_op(self, job: Job, op: RunOp) -> None:
        """An AWAIT op: awaited even after a failure (its function checks)."""
        fn = op.fn
        try:
            if type(fn) is Quick:
                await fn.run_later(job, *op.args)  # `step` tried it at once
            else:
                await fn(job, *op.args)
        except Exception as exc:
            job.submission.fail(op.item, self.name, exc)

    async def _park(self, signal: Signal, target: int, sub: Submission, index: int) -> None:
        """A WAIT that is not yet satisfied (the slow path, so counting here is free):
        park on the signal, say where for the deadlock monitor, time the parking."""
        self.parked_on = (signal, target, index)
        self.parks += 1
        sub.parked()
        start = self.clock()
        try:
            await signal.wait_value(target)
        finally:
            self.parked_on = None
            blocked = self.clock() - start
            self.time_blocked += blocked
            sub.blocked(blocked)

    async def _run_device_op(self, op: Op, job: Job, next_index: int) -> int:
        """Run an op of this device kind's own (op `next_index - 1`); return the index
        of the next op to run. Raises OpCodeError for one it does not run."""
        raise refuse_op(self.name, op, next_index - 1, f"a {type(self).__name__}", self.op_codes)

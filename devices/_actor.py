"""Queue actors: a trio task with an inbox that replays lowered op lists.

What a job and its ops are is written down in devices/_ops.py. `QueueActor` runs the
codes every queue shares (HOST_OPS); device kinds run codes of their own in
`_run_device_op` and say which they run in `op_codes`.

Profiling: a job that carries a JobProfile runs in `_run_job_profiled`, a copy of the
loop that timestamps every item with the actor's clock (`_now`); the choice is made once
per job, so the plain loop never tests for it. The two loops run the same codes: a test
runs every code of every device kind through both.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from collections.abc import Sequence
from typing import Any, ClassVar

import attrs
import outcome
import trio

from ._ops import (
    AWAIT,
    EXEC,
    EXEC_THREAD,
    HOST_OPS,
    ITEM,
    SIGNAL,
    WAIT,
    ActorClosedError,
    Job,
    Op,
    Submission,
    op_name,
)
from ._signal import Doorbell, Signal

_VALUE_MAX = (1 << 64) - 1
_RUNS_KEPT = 8  # op lists whose EXEC runs an actor keeps (QueueActor._exec_runs)


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
    """One OS thread that runs batches of ops for an actor, so numpy work leaves the
    trio thread (and two devices really run in parallel) at one hop per batch."""

    def __init__(self, name: str, token: trio.lowlevel.TrioToken) -> None:
        self._token = token
        self._jobs: queue.SimpleQueue[
            tuple[Sequence[Op], trio.lowlevel.Task, list[tuple[float, float]] | None] | None
        ] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        while True:
            got = self._jobs.get()
            if got is None:
                return
            batch, task, times = got
            failure: tuple[int, BaseException] | None = None
            if times is not None:
                failure = self._run_timed(batch, times)
            else:
                for op in batch:
                    try:
                        op[1](*op[2])
                    except Exception as exc:  # reported to the submission, never lost
                        failure = (op[ITEM], exc)
                        break
            try:
                self._token.run_sync_soon(trio.lowlevel.reschedule, task, outcome.Value(failure))
            except trio.RunFinishedError:
                return

    @staticmethod
    def _run_timed(
        batch: Sequence[Op], times: list[tuple[float, float]]
    ) -> tuple[int, BaseException] | None:
        # Profiling: stamped here, in the thread, so each item of a batch gets its own
        # times. perf_counter is the default actor clock; a device whose `_now` is
        # another clock keeps its items off the worker thread.
        clock = time.perf_counter
        for op in batch:
            start = clock()
            try:
                op[1](*op[2])
            except Exception as exc:
                times.append((start, clock()))
                return (op[ITEM], exc)
            times.append((start, clock()))
        return None

    async def run(
        self, batch: Sequence[Op], times: list[tuple[float, float]] | None = None
    ) -> tuple[int, BaseException] | None:
        """Run `batch` in the thread; with `times`, append (start, end) per op to it."""
        self._jobs.put((batch, trio.lowlevel.current_task(), times))
        # The thread cannot be interrupted; a cancelled actor waits for its batch.
        result: tuple[int, BaseException] | None = await trio.lowlevel.wait_task_rescheduled(
            lambda _: trio.lowlevel.Abort.FAILED
        )
        return result

    def close(self) -> None:
        self._jobs.put(None)


def run_inline(actors: Sequence[QueueActor], jobs: Sequence[Job]) -> None:
    """Run one submission's jobs (jobs[q] for actors[q], every actor idle) in the
    submitter's own task, with no task switch: a job runs until it meets a wait not yet
    satisfied and parks; a parked job runs on once its wait is satisfied, until every job
    is done or none can move. A job that stops at an op needing a task of its own (a
    worker thread, I/O) or at a wait this submission cannot satisfy (work elsewhere in
    flight) goes to its actor from there, so it runs exactly as posted. Waits and
    signals are those the actors would meet, in an order they could meet them in."""
    at = [0] * len(jobs)
    ready = list(range(len(jobs) - 1, -1, -1))  # popped from the end: queue 0 first
    # Parked jobs by the signal they wait on. A job's run moves only its own signal and,
    # when it ends, its devices' timelines: only jobs parked on those are looked at again.
    parked: dict[Signal, list[int]] = {}
    while ready:
        q = ready.pop()
        job = jobs[q]
        ops = job.ops
        stop = actors[q]._run_ready(job, at[q])
        moved: Sequence[Signal] = (actors[q].signal,)
        if stop == len(ops):
            moved = (actors[q].signal, *job.submission.timelines)
        elif ops[stop][0] == WAIT:
            at[q] = stop
            parked.setdefault(ops[stop][1], []).append(q)
        else:
            job.ops, job.runs = ops[stop:], None
            actors[q].post(job)
        for signal in moved:
            waiting = parked.pop(signal, None)
            if waiting is None:
                continue
            value = signal.value
            still = []
            for p in waiting:
                wait = jobs[p].ops[at[p]]
                if value >= jobs[p].bases[wait[2]] + wait[3]:
                    ready.append(p)
                else:
                    still.append(p)
            if still:
                parked[signal] = still
    # What is still parked waits on work outside this submission (or on a signal no
    # job here moves): its actor runs it from there, as if posted so.
    for waiting in parked.values():
        for q in waiting:
            job = jobs[q]
            job.ops, job.runs = job.ops[at[q] :], None
            actors[q].post(job)


class QueueActor:
    """A device queue as a trio task: it owns its timeline signal and runs jobs in order."""

    # The op codes this kind of queue runs (devices/_ops.py).
    op_codes: ClassVar[frozenset[int]] = HOST_OPS
    # What a caller may wait for a submission with when all its jobs went to queues
    # with this same `end_reader`, which then reads their ends in the caller's task (a
    # REMOTE queue's connection): `end_reader.coming()` before submitting (or
    # `not_coming()` if submitting fails), then `await end_reader.wait_done(sub)`.
    # None: the actor's own task ends its jobs, and the caller waits on `sub.done`.
    end_reader: Any = None

    def __init__(self, name: str, timeline_start: int = 0) -> None:
        self.name = name
        self.signal = Signal(name, timeline_start)
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
        # Runs of consecutive EXEC ops of recently run op lists (see `_exec_runs`).
        self._runs: dict[int, tuple[Sequence[Op], dict[int, tuple[int, tuple[Any, ...]]]]] = {}

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
        if self._current is not None:
            start = self.parked_on[2] if self.parked_on is not None else 0
            out.append((self._current, start))
        out.extend((job, 0) for job in self._inbox)
        return out

    @property
    def current(self) -> Job | None:
        """The job the actor is running now (None when idle)."""
        return self._current

    @property
    def busy(self) -> bool:
        return self._current is not None or bool(self._inbox)

    @property
    def runs_inline(self) -> bool:
        """Whether a submitter may run this actor's jobs in its own task while it is idle
        (`run_inline`): only where jobs are posted, served and run as QueueActor does."""
        cls = type(self)
        return (cls.post, cls.serve, cls._run_job) == _PLAIN_LOOP

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

    # -- jobs held parked outside the actor's task --
    #
    # A submitter that runs a job in its own task (as `run_inline` does) may, where the
    # job meets a wait not yet satisfied, hold it parked on the actor instead of posting
    # it: the actor counts as busy with it (its own task starts nothing else meanwhile),
    # and whoever satisfies the wait runs it on (`run_ready` from the wait on), then
    # `release`s the actor once it ends, or `hand_over`s the rest to the actor's task.

    def hold(self, job: Job, signal: Signal, target: int, index: int) -> None:
        """`job` (run inline so far, with this actor idle or held for it) is parked at op
        `index`, a wait on `signal` for `target`, outside this actor's task."""
        if not self._held:
            self._current = job
            self._held = True
        self.parked_on = (signal, target, index)
        self.parks += 1
        job.submission.waits_parked += 1
        self._held_since = time.perf_counter()

    def resume(self) -> None:
        """A held job's wait is satisfied: it runs on in the caller's task."""
        blocked = time.perf_counter() - self._held_since
        self.time_blocked += blocked
        if self._current is not None:
            self._current.submission.time_blocked += blocked
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
        job.ops, job.runs = job.ops[index:], None
        self._held = False
        self._current = None
        self.parked_on = None
        self._inbox.appendleft(job)
        self._doorbell.ring()

    def _exec_runs(self, ops: Sequence[Op]) -> dict[int, tuple[int, tuple[Any, ...]]]:
        """The runs of two or more consecutive EXEC ops in `ops`: first index -> (index
        after the run, its (fn, args) calls). Kept for the few op lists run last, so a
        graph replayed with the same bindings finds them made."""
        key = id(ops)
        hit = self._runs.get(key)
        if hit is not None and hit[0] is ops:
            return hit[1]
        runs: dict[int, tuple[int, tuple[Any, ...]]] = {}
        count = len(ops)
        i = 0
        while i < count:
            if ops[i][0] != EXEC:
                i += 1
                continue
            end = i + 1
            while end < count and ops[end][0] == EXEC:
                end += 1
            if end - i > 1:
                runs[i] = (end, tuple([(op[1], op[2]) for op in ops[i:end]]))
            i = end
        if len(self._runs) >= _RUNS_KEPT:
            self._runs.pop(next(iter(self._runs)))
        self._runs[key] = (ops, runs)
        return runs

    def _run_ready(self, job: Job, start: int) -> int:
        """Run `job`'s ops from `start` in the caller's task for as long as none needs a
        task of its own: inline execs, signals, waits already satisfied (as `_run_job`
        runs them). Return the index it stopped at; at the end the job is done."""
        ops = job.ops
        bases = job.bases
        sub = job.submission
        count = len(ops)
        runs = job.runs
        if runs is None:
            runs = job.runs = self._exec_runs(ops)
        i = start
        ran = 0
        while i < count:
            op = ops[i]
            code = op[0]
            if code == EXEC:
                run = runs.get(i)
                if run is not None:
                    # A run of execs: a plain loop over its calls, as the floor runs them.
                    stop, calls = run
                    if sub.error is None:
                        k = i
                        try:
                            for fn, args in calls:
                                fn(*args)
                                k += 1
                        except Exception as exc:
                            sub.fail(ops[k][ITEM], self.name, exc)
                    ran += stop - i
                    i = stop
                    continue
                if sub.error is None:
                    try:
                        op[1](*op[2])
                    except Exception as exc:
                        sub.fail(op[ITEM], self.name, exc)
                ran += 1
            elif code == WAIT:
                if op[1].value < bases[op[2]] + op[3]:
                    break
            elif code == SIGNAL:
                op[1].set(bases[op[2]] + op[3])
            else:
                break
            i += 1
        self.items_run += ran
        if i == count:
            self.jobs_done += 1
            self.bytes_copied += job.copy_bytes
            sub.job_done(job.slot)
        return i

    # Run `job` from op `start` in the caller's task for as long as no op needs a task of
    # its own; the index it stopped at. For jobs held outside the actor's task.
    run_ready = _run_ready

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
        """The clock profiles and blocked times are measured with (seconds)."""
        return time.perf_counter()

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
                # Chosen once per job, so the plain loop carries no profiling test per op.
                if job.profile is None:
                    await self._run_job(job)
                else:
                    await self._run_job_profiled(job)
                self._current = None
                self.jobs_done += 1
                self.bytes_copied += job.copy_bytes
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
        # Ops are indexed, not named, in both loops: [1] is the signal (WAIT, SIGNAL) or
        # the function, [2] the base slot or the args, [3] the relative value or the item.
        ops = job.ops
        bases = job.bases
        sub = job.submission
        now = time.perf_counter if type(self)._now is QueueActor._now else self._now
        count = len(ops)
        i = 0
        ran = 0
        while i < count:
            op = ops[i]
            i += 1
            code = op[0]
            if code == EXEC:
                if sub.error is None:
                    try:
                        op[1](*op[2])
                    except Exception as exc:
                        sub.fail(op[ITEM], self.name, exc)
                ran += 1
            elif code == WAIT:
                signal = op[1]
                target = bases[op[2]] + op[3]
                if signal.value < target:
                    # The slow path: only here is parking counted and timed (inline: a
                    # helper coroutine's frame would cost every park of every replay).
                    self.parked_on = (signal, target, i - 1)
                    self.parks += 1
                    sub.waits_parked += 1
                    start = now()
                    try:
                        await signal.wait_value(target)
                    finally:
                        self.parked_on = None
                        blocked = now() - start
                        self.time_blocked += blocked
                        sub.time_blocked += blocked
            elif code == SIGNAL:
                op[1].set(bases[op[2]] + op[3])
            elif code == EXEC_THREAD:
                end = i
                while end < count and ops[end][0] == EXEC_THREAD:
                    end += 1
                batch = ops[i - 1 : end]
                i = end
                ran += len(batch)
                if sub.error is None:
                    failure = await self._thread().run(batch)
                    if failure is not None:
                        sub.fail(failure[0], self.name, failure[1])
            elif code == AWAIT:
                try:
                    await op[1](job, *op[2])
                except Exception as exc:
                    sub.fail(op[ITEM], self.name, exc)
            else:
                i = await self._run_device_op(op, job, i)
        self.items_run += ran
        sub.job_done(job.slot)

    async def _park(self, signal: Signal, target: int, sub: Submission, index: int) -> None:
        """A WAIT that is not yet satisfied (the slow path, so counting here is free):
        park on the signal, say where for the deadlock monitor, time the parking."""
        self.parked_on = (signal, target, index)
        self.parks += 1
        sub.waits_parked += 1
        start = self._now()
        try:
            await signal.wait_value(target)
        finally:
            self.parked_on = None
            blocked = self._now() - start
            self.time_blocked += blocked
            sub.time_blocked += blocked

    async def _run_job_profiled(self, job: Job) -> None:
        """`_run_job` with timestamps around every item and every parked wait.

        A separate copy of the loop, so that replays without profiling pay nothing for it.
        """
        ops = job.ops
        bases = job.bases
        sub = job.submission
        record = job.profile
        assert record is not None
        spans = record.spans
        # The default clock is called directly (as in `_run_job`): a bound-method hop per
        # stamp would be most of profiling's cost on tiny items. An override is used as is.
        now = time.perf_counter if type(self)._now is QueueActor._now else self._now
        count = len(ops)
        i = 0
        ran = 0
        record.start = now()
        while i < count:
            op = ops[i]
            i += 1
            code = op[0]
            if code == EXEC:
                start = now()
                if sub.error is None:
                    try:
                        op[1](*op[2])
                    except Exception as exc:
                        sub.fail(op[ITEM], self.name, exc)
                spans.append((i - 1, start, now()))
                ran += 1
            elif code == WAIT:
                signal = op[1]
                target = bases[op[2]] + op[3]
                if signal.value < target:
                    start = now()
                    await self._park(signal, target, sub, i - 1)
                    spans.append((i - 1, start, now()))
            elif code == SIGNAL:
                op[1].set(bases[op[2]] + op[3])
            elif code == EXEC_THREAD:
                first = i - 1
                end = i
                while end < count and ops[end][0] == EXEC_THREAD:
                    end += 1
                batch = ops[first:end]
                i = end
                ran += len(batch)
                if sub.error is None:
                    times: list[tuple[float, float]] = []
                    failure = await self._thread().run(batch, times)
                    spans.extend((first + k, t0, t1) for k, (t0, t1) in enumerate(times))
                    if failure is not None:
                        sub.fail(failure[0], self.name, failure[1])
            elif code == AWAIT:
                start = now()
                try:
                    await op[1](job, *op[2])
                except Exception as exc:
                    sub.fail(op[ITEM], self.name, exc)
                spans.append((i - 1, start, now()))
            else:
                first = i - 1
                start = now()
                i = await self._run_device_op(op, job, i)
                spans.append((first, start, now()))
        record.end = now()
        self.items_run += ran
        sub.job_done(job.slot)

    async def _run_device_op(self, op: Op, job: Job, next_index: int) -> int:
        """Handle a device-specific op; return the index of the next op to run."""
        raise RuntimeError(
            f"{self.name}: op code {op_name(op[0])} is not one a {type(self).__name__} runs "
            f"(it runs {sorted(op_name(c) for c in self.op_codes)}); the op list was lowered "
            f"for another kind of queue"
        )


_PLAIN_LOOP = (QueueActor.post, QueueActor.serve, QueueActor._run_job)

"""What a job's ops mean, in one place: `step` runs them, whoever runs the job.

A job (devices/_ops.py) is run by one of its drivers, each of which calls `step` and
then deals with the op it stopped at:

- a queue actor's own task (`QueueActor.serve`): it parks on a WAIT, sends a run of
  EXEC_THREAD ops to its worker thread, awaits an AWAIT op, runs an op of its device
  kind (a SIM item's simulated time, a CUDA queue's stream work), then steps on;
- a submitter running a submission on idle queues in its own task (`InlineRun`,
  devices/_inline.py), which hands a job to its actor where it stops, or holds it on a
  signal to run on in whichever task moves that signal (a worker's held jobs);
- a CUDA queue's host steps, once its stream has got to them;
- and a `LinearRun` (devices/_linear.py), a submission worked out at bind time as one
  run of EXEC calls in an order the plan allows, runs that run as `step` runs one
  (`run_calls`).

`step(job, at, name)` runs the ops from `at` in the caller's task for as long as none
needs a task of its own, and returns where it stopped: `len(job.ops)` when the job's
ops are all done, else the index of an op it did not run, which says why it stopped:

    WAIT         its signal has not reached the value (everything before it is done)
    EXEC_THREAD  a run of them goes to the actor's worker thread
    AWAIT        to be awaited (a `Quick` one is tried at once, and stops only if it
                 cannot finish now)
    any other    an op of a device kind's own (SIM_RUN, CUDA_ITEM, WIRE); a driver
                 refuses one its kind does not run, or of no code at all (OpCodeError)

What the codes every queue shares mean (devices/_ops.py has the format):

- EXEC: `fn(*args)`. A run of consecutive EXEC ops is one plain loop over its calls
  (`run_calls`). Once an item of the submission has failed, later EXEC and
  EXEC_THREAD ops are skipped; the first failure is the submission's, naming the item
  and the actor (`name`) that ran it.
- WAIT: nothing, once `signal.value >= target(bases)` (a satisfied wait is free).
- SIGNAL: `signal.set(value(bases))`.
- EXEC_THREAD: as EXEC, on the actor's worker thread: a run of them in one hop.
- AWAIT: `await fn(job, *args)`, even after a failure (fn checks the submission).

Those who follow a job's waits and signals without running it (the deadlock monitor, a
program's linear order, ...) walk its ops with an `OpWalker` (devices/_walk.py), in the
meaning this table gives them.

Profiling is an observer, not another loop: a job that carries one (`job.observer`, a
JobProfile) has each call of its runs timed (`run_calls`) and each `Quick` op done at
once, and its drivers time the waits they park on and the ops they await.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import length_hint
from typing import Any

from ._ops import AWAIT, EXEC, SIGNAL, WAIT, Job, JobProfile, Quick, RunOp

Calls = Sequence[tuple[Callable[..., Any], tuple[Any, ...]]]


def run_calls(
    calls: Calls, first: int, observer: JobProfile | None
) -> tuple[int, BaseException] | None:
    """Call each (fn, args) of a run of ops, the first of which is op `first`, in order;
    stop at the first that raises, and return (its op index, the error). With an
    `observer`, each call is timed into it. Runs in any thread (a run of EXEC_THREAD ops
    runs on an actor's worker thread)."""
    it = iter(calls)
    try:
        if observer is None:
            for fn, args in it:  # no counter: the floor's own loop
                fn(*args)
        else:
            call = observer.call
            for index, (fn, args) in enumerate(it, first):
                call(index, fn, args)
    except Exception as exc:  # reported to the submission, never lost
        return first + len(calls) - length_hint(it) - 1, exc
    return None


def step(job: Job, at: int, name: str, end: int = -1) -> int:
    """Run `job`'s ops from op `at` (up to op `end`, if given) in the caller's task for
    as long as none needs a task of its own; return the index it stopped at (see the
    module's docstring). `name` is the actor a failure names."""
    ops = job.ops
    count = len(ops) if end < 0 else end
    while at < count:
        op = ops[at]
        if op.code == EXEC:
            stop, calls = job.script.runs[at]
            if job.submission.error is None:
                failed = run_calls(calls, at, job.observer)
                if failed is not None:
                    job.submission.fail(job.item_at(failed[0]), name, failed[1])
            at = stop
        elif op.code == WAIT:
            if op.signal.value < op.target(job.bases):
                return at
            at += 1
        elif op.code == SIGNAL:
            op.signal.set(op.value(job.bases))
            at += 1
        elif op.code == AWAIT and type(op.fn) is Quick:
            if not _quick_now(job, op, op.fn, at, name):
                return at
            at += 1
        else:
            return at
    return at


def _quick_now(job: Job, op: RunOp, quick: Quick, at: int, name: str) -> bool:
    """Try `op`, op `at`, an AWAIT op whose function is `quick`, at once: whether it is
    done (a raise fails the submission, as if awaited, and the op is done). Timed into
    the job's observer when it is done here (else its driver times it as it awaits it).
    The job is at the op meanwhile (`job.at`), as when its actor awaits one."""
    job.at = at
    observer = job.observer
    start = 0.0 if observer is None else observer.clock()
    try:
        done = bool(quick.now(job, *op.args))
    except Exception as exc:
        job.submission.fail(op.item, name, exc)
        done = True
    if done and observer is not None:
        observer.spans.append((at, start, observer.clock()))
    return done

"""Queue actors (devices/_actor.py): their worker thread, and work they will never run.

(Every op code through both replay loops of every kind: test_ops.py.)
"""

from __future__ import annotations

import numpy as np
import pytest
import trio
import trio.testing
from actorgraph.devices import (
    EXEC,
    FIRST_QUEUE_SLOT,
    ActorClosedError,
    Job,
    QueueActor,
    Submission,
    run_op,
    signal_op,
)

import actorgraph as ag

XOR = ag.Kernel("xor", cpu=lambda out, a, b: np.bitwise_xor(a, b, out=out), outs=(0,), ins=(1, 2))
INC = ag.Kernel("inc", cpu=lambda x: np.add(x, 1, out=x), outs=(0,), ins=(0,))


async def test_fault_in_worker_thread_batch_is_reported() -> None:
    def boom(out: np.ndarray, a: np.ndarray) -> None:
        raise RuntimeError("thread boom")

    async with ag.open_runtime(["CPU:0"], cpu_thread_bytes=0) as rt:
        a, b = rt.alloc("CPU:0", 8, np.int32), rt.alloc("CPU:0", 8, np.int32)
        graph = await rt.compile(
            [
                ag.Launch(XOR, [b, a, a]),
                ag.Launch(ag.Kernel("boom", cpu=boom, outs=(0,), ins=(1,)), [a, b]),
            ]
        )
        with pytest.raises(
            ag.ItemError, match=r"item 1 \(boom\) on CPU:0/compute raised RuntimeError: thread boom"
        ):
            await graph()
        await rt.run([ag.Launch(INC, [a])])
        np.testing.assert_array_equal(await rt.copyout(a), np.ones(8, np.int32))


async def test_an_actor_that_stops_fails_the_work_it_never_ran() -> None:
    actor = QueueActor("q")
    ran: list[int] = []
    done_called: list[Submission] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.serve)
        sub = Submission(1, [], [], [()], [])
        sub.when_done(done_called.append)
        nursery.cancel_scope.cancel()  # the actor stops before it takes the job
        ops = (run_op(EXEC, ran.append, (1,), 7), signal_op(actor.signal, FIRST_QUEUE_SLOT, 1))
        actor.post(Job(ops, [0, 0, actor.reserve(1)], sub, 0))
    assert sub.done.is_set() and done_called == [sub]
    assert isinstance(sub.error, ActorClosedError) and sub.failed_actor == "q"
    assert "q was shut down before it ran this work" in str(sub.error)
    assert ran == []  # its item never ran


def test_a_submission_tells_its_callbacks_once_in_order_and_at_once_when_done() -> None:
    sub = Submission(1, [], [], [()], [])
    told: list[str] = []
    sub.when_done(lambda s: told.append("first"))
    sub.when_done(lambda s: told.append("second"))
    sub.job_done(0)
    assert told == ["first", "second"]
    sub.when_done(lambda s: told.append("late"))  # already done: told at once
    assert told == ["first", "second", "late"]


def test_a_submission_broken_off_fails_finishes_and_stops_its_reader() -> None:
    sub = Submission(2, [], [], [(), ()], [])
    stopped: list[BaseException] = []
    told: list[Submission] = []
    sub.when_done(told.append)
    sub.read_by(stopped.append)
    error = RuntimeError("the runtime broke")
    sub.break_off(error)
    assert sub.done.is_set() and sub.error is error and sub.failed_item == -1
    assert told == [sub] and stopped == [error]
    sub.read_by(None)
    sub.break_off(RuntimeError("again"))  # nothing more: done, and nobody reads it now
    assert told == [sub] and stopped == [error] and sub.error is error

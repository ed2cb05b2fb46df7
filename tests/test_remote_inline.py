"""Jobs a worker holds parked and runs on in the task that satisfies their wait
(devices/_inline.py): in order with their actor's other jobs, handed to the
actor's task where an op needs one, dropped if the actor stopped; and a chain between
workers whose kernel is slow keeps other clients of that worker responsive. A client
holds its local jobs of a replay on a worker's queue the same way.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio
import trio.testing
from _workers import GUARD, TOKEN, chain, replay_chain_rounds, runtime, start
from actorgraph.devices import (
    AWAIT,
    EXEC,
    EXEC_THREAD,
    ActorClosedError,
    HoldingSignal,
    InlineRun,
    Job,
    QueueActor,
    Quick,
    Resumer,
    Submission,
    run_op,
    signal_op,
    wait_op,
)
from actorgraph.scheduler import QueueKind

import actorgraph as ag
from actorgraph.worker import _batches as remote_batches
from actorgraph.worker import _placement as remote_placement
from actorgraph.worker import _server as remote_server
from actorgraph.worker import _session as remote_session
from actorgraph.worker._server import run_worker

sys.path.insert(0, str(Path(__file__).parent))
from remote_kernels import GATED, INC


def _unexpected(error: BaseException) -> None:
    raise AssertionError(f"no job here raises: {error!r}")


def _job(ops: list[Any]) -> tuple[Job, Submission]:
    sub = Submission(1, [], [], [()], [])
    return Job(tuple(ops), [0, 0, 0], sub, 0), sub


async def test_a_held_job_runs_on_in_the_task_that_meets_its_wait_before_later_jobs() -> None:
    ran: list[str] = []
    resumer = Resumer()
    actor = QueueActor("q")
    mirror = HoldingSignal("mirror", 0, resumer)
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.serve)
        first, first_sub = _job(
            [
                run_op(EXEC, ran.append, ("a",), 0),
                wait_op(mirror, 0, 1),
                run_op(EXEC, ran.append, ("b",), 1),
                signal_op(actor.signal, 2, 2),
            ]
        )
        assert not mirror.waiting
        resumer.start(InlineRun([actor], [first], _unexpected))
        assert ran == ["a"]  # ran here, up to its wait, where it is held
        assert not actor.idle and actor.parked_on == (mirror, 1, 1)
        # Setting it runs a job: a run off the runtime's thread must leave it be.
        assert mirror.waiting
        later, later_sub = _job([run_op(EXEC, ran.append, ("later",), 0)])
        actor.post(later)
        with trio.fail_after(GUARD):
            await trio.testing.wait_all_tasks_blocked()
        assert ran == ["a"]  # the actor starts nothing while it holds a job
        mirror.set(1)
        assert ran == ["a", "b"] and first_sub.done.is_set()  # at once, in this task
        assert actor.signal.value == 2 and not mirror.waiting
        with trio.fail_after(GUARD):
            await later_sub.done.wait()
        assert ran == ["a", "b", "later"]
        assert first_sub.error is None and later_sub.error is None
        assert actor.statistics().waits_parked == 1
        nursery.cancel_scope.cancel()


async def test_a_held_job_that_needs_a_task_goes_to_its_actor_first_in_line() -> None:
    # After its wait: a quick op that finishes at once, then one that cannot (its actor
    # awaits it), then a kernel on the thread: both go on in the actor's task, ahead of a
    # job posted while it was held; a job held on a queue's own signal runs on when
    # that queue, in its own task, gets there.
    ran: list[str] = []
    resumer = Resumer()
    copy_queue = QueueActor("copy", signal=HoldingSignal("copy", 0, resumer))
    compute = QueueActor("compute")
    mirror = HoldingSignal("mirror", 0, resumer)
    gate = trio.Event()

    def now(job: Job, name: str, ready: bool) -> bool:
        if ready:
            ran.append(name)
        return ready

    async def later(job: Job, name: str, ready: bool) -> None:
        await gate.wait()
        ran.append(name + " later")

    async with trio.open_nursery() as nursery:
        for actor in (copy_queue, compute):
            await nursery.start(actor.serve)
        copy_job, sub = _job(
            [
                wait_op(mirror, 0, 1),
                run_op(AWAIT, Quick(now, later), ("quick", True), 0),
                run_op(AWAIT, Quick(now, later), ("slow", False), 1),
                run_op(EXEC_THREAD, ran.append, ("thread",), 2),
                signal_op(copy_queue.signal, 2, 3),
            ]
        )
        compute_job = Job(
            (wait_op(copy_queue.signal, 2, 3), run_op(EXEC, ran.append, ("compute",), 3)),
            copy_job.bases,
            sub,
            0,
        )
        sub.remaining = 2
        resumer.start(InlineRun([copy_queue, compute], [copy_job, compute_job], _unexpected))
        posted, posted_sub = _job([run_op(EXEC, ran.append, ("posted",), 0)])
        copy_queue.post(posted)
        assert ran == []
        mirror.set(1)
        assert ran == ["quick"]  # then "slow" needs a task: handed to the actor
        with trio.fail_after(GUARD):
            await trio.testing.wait_all_tasks_blocked()
        assert ran == ["quick"]
        gate.set()
        with trio.fail_after(GUARD):
            await sub.done.wait()
            await posted_sub.done.wait()
        assert ran == ["quick", "slow later", "thread", "compute", "posted"]
        assert sub.error is None
        nursery.cancel_scope.cancel()


async def test_a_job_held_on_an_actor_that_stopped_never_runs() -> None:
    ran: list[str] = []
    resumer = Resumer()
    actor = QueueActor("q")
    mirror = HoldingSignal("mirror", 0, resumer)
    async with trio.open_nursery() as nursery:
        await nursery.start(actor.serve)
        job, sub = _job([wait_op(mirror, 0, 1), run_op(EXEC, ran.append, ("after",), 0)])
        resumer.start(InlineRun([actor], [job], _unexpected))
        nursery.cancel_scope.cancel()
    assert actor.closed
    assert isinstance(sub.error, ActorClosedError) and sub.done.is_set()
    mirror.set(1)
    assert ran == []


async def test_a_held_job_that_raises_is_its_sessions_fault_not_the_tasks() -> None:
    # What a job's actor would have died of, run in another task (a link's reader, say):
    # that run's `broke` hears of it, and the task goes on running other held jobs.
    class Faulty(HoldingSignal):
        def set(self, value: int) -> None:
            raise RuntimeError("a fault on purpose")

    ran: list[str] = []
    broke: list[BaseException] = []
    resumer = Resumer()
    mirror = HoldingSignal("mirror", 0, resumer)
    faulty, fine = QueueActor("faulty"), QueueActor("fine")
    async with trio.open_nursery() as nursery:
        for actor in (faulty, fine):
            await nursery.start(actor.serve)
        bad, _ = _job([wait_op(mirror, 0, 1), signal_op(Faulty("f", 0, resumer), 0, 1)])
        good, good_sub = _job([wait_op(mirror, 0, 1), run_op(EXEC, ran.append, ("good",), 0)])
        resumer.start(InlineRun([faulty], [bad], broke.append))
        resumer.start(InlineRun([fine], [good], _unexpected))
        mirror.set(1)
        assert [str(e) for e in broke] == ["a fault on purpose"]
        assert ran == ["good"] and good_sub.done.is_set()
        nursery.cancel_scope.cancel()


async def test_a_slow_kernel_after_a_copy_between_workers_holds_no_other_client(gate: Path) -> None:
    # Client X: A -> B -> A, with a slow kernel on B after the copy. B's link reader lands
    # the bytes and runs the copy; the slow kernel goes to X's queue's task on B (it was
    # never seen to be quick), so client Y's replays on B go on meanwhile. Then the chain
    # ends, in order, equal to numpy, and again on a second replay.
    a_worker, b_worker = start("CPU:0"), start("CPU:0")
    ra, rb = a_worker.name("CPU:0"), b_worker.name("CPU:0")
    try:
        with trio.fail_after(GUARD):
            async with runtime([ra, rb]) as rt_x, runtime([rb]) as rt_y:
                xa, xb = rt_x.alloc(ra, 16, np.int32), rt_x.alloc(rb, 16, np.int32)
                await rt_x.copyin(xa, np.arange(16, dtype=np.int32))
                chain = await rt_x.compile(
                    [
                        ag.Launch(INC, [xa, xa]),
                        ag.Copy(dst=xb, src=xa),
                        ag.Launch(GATED, [xb, xb]),
                        ag.Launch(INC, [xb, xb]),
                        ag.Copy(dst=xa, src=xb),
                        ag.Launch(INC, [xa, xa]),
                    ]
                )
                y = rt_y.alloc(rb, 16, np.int32)
                other = await rt_y.compile([ag.Launch(INC, [y, y])])
                for replay in range(2):
                    gate.unlink(missing_ok=True)
                    slow = await chain.submit()
                    with trio.fail_after(10):
                        for _ in range(20):
                            await other()
                    assert not slow.done
                    gate.touch()
                    await slow.wait()
                    expected = np.arange(16) + 3 * (replay + 1)
                    np.testing.assert_array_equal(await rt_x.copyout(xa), expected)
                np.testing.assert_array_equal(await rt_y.copyout(y), np.full(16, 40))
    finally:
        a_worker.kill()
        b_worker.kill()


async def test_a_fault_in_a_held_job_ends_only_its_clients_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A worker in this process; client X's jobs end with a fault (their report raises),
    # wherever they run. X's connection ends, and its replay fails as if the worker were
    # lost; the worker and client Y go on.
    faulty: set[int] = set()
    job_done = remote_batches.Batches.job_done

    def report(self: Any, *args: Any) -> None:
        if self.session.sid in faulty:
            raise RuntimeError("a fault on purpose")
        job_done(self, *args)

    monkeypatch.setattr(remote_batches.Batches, "job_done", report)
    broke: list[str] = []
    broke_session = remote_session.Session.broke

    def spy(self: Any, error: BaseException) -> None:
        broke.append(str(error))
        broke_session(self, error)

    monkeypatch.setattr(remote_session.Session, "broke", spy)
    # The worker's kernel runs inline once seen to be quick, on however loaded a machine:
    # one seen slow would need its queue's task, and its fault would end there instead.
    quick_to_us = functools.partial(remote_placement.KernelTimes, bound=60.0)
    monkeypatch.setattr(remote_server, "KernelTimes", quick_to_us)
    with trio.fail_after(GUARD):
        async with trio.open_nursery() as nursery:
            host, port = await nursery.start(
                lambda task_status: run_worker(
                    ["CPU:0"], token=TOKEN, kernel_modules=["remote_kernels"],
                    task_status=task_status,
                )
            )  # fmt: skip
            name = f"CPU:0@{host}:{port}"
            async with runtime(["CPU:0", name]) as rt_x, runtime([name]) as rt_y:
                local, x = rt_x.alloc("CPU:0", 4, np.int32), rt_x.alloc(name, 4, np.int32)
                # The worker's job waits for the local copy: held, then run on as it lands.
                chain = await rt_x.compile([ag.Copy(dst=x, src=local), ag.Launch(INC, [x, x])])
                await chain()
                # The worker's queue takes the next batch inline only once it is idle again:
                # its last report reached this client before the job ended there.
                await trio.testing.wait_all_tasks_blocked()
                faulty.add(rt_x.device(name).connection.session_id)
                with pytest.raises(ag.ClosedError):
                    await chain()
                assert broke == ["a fault on purpose"]  # from a task that runs held jobs
                y = rt_y.alloc(name, 4, np.int32)
                await rt_y.run([ag.Launch(INC, [y, y])])
                np.testing.assert_array_equal(await rt_y.copyout(y), np.ones(4))
            nursery.cancel_scope.cancel()


async def test_a_chain_with_a_worker_runs_its_local_steps_where_the_reports_land(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # local kernel -> copy to the worker -> its kernel -> copy back, eight times: each
    # local step waits on the worker's report, and runs on in the task that takes it
    # (the copy back's bytes came with it), so the local queues' own tasks run none of
    # a replay's jobs; the results equal numpy's every time.
    ran_by_actor: list[str] = []
    run_job = QueueActor._run_job

    async def counted(self: QueueActor, job: Job) -> None:
        ran_by_actor.append(self.name)
        await run_job(self, job)

    monkeypatch.setattr(QueueActor, "_run_job", counted)
    worker = start("CPU:0")
    name = worker.name("CPU:0")
    try:
        with trio.fail_after(GUARD):
            async with runtime(["CPU:0", name], verify_plans=True) as rt:
                xs = [rt.alloc("CPU:0", 64, np.int32), rt.alloc(name, 64, np.int32)]
                graph = await rt.compile(chain(INC, xs, 16))

                def none_ran_by_a_local_actor() -> None:
                    assert [a for a in ran_by_actor if a.startswith("CPU:0/")] == []

                await replay_chain_rounds(
                    rt, graph, xs[0], 16, 4, 3, ran_by_actor.clear, none_ran_by_a_local_actor
                )
    finally:
        worker.kill()


async def test_a_push_held_back_with_its_batch_is_done_only_once_its_bytes_left() -> None:
    # Sends to the worker held (what is submitted meanwhile goes as one message, as a
    # tinygrad flush sends it): the push cannot be done before its bytes leave, even
    # though it could have copied them. Done earlier, its queue's signal would move,
    # and the batch still held, encoded after it with that value, would let the
    # worker's kernel run before the bytes landed (and the copy overwrite its result).
    worker = start("CPU:0")
    name = worker.name("CPU:0")
    try:
        with trio.fail_after(GUARD):
            async with runtime(["CPU:0", name], verify_plans=True) as rt:
                here, there = rt.alloc("CPU:0", 64, np.int32), rt.alloc(name, 64, np.int32)
                graph = await rt.compile(
                    [
                        ag.Launch(INC, [here, here]),
                        ag.Copy(dst=there, src=here),
                        ag.Launch(INC, [there, there]),
                    ]
                )
                await graph()  # its programs are written
                connection = rt.device(name).connection
                copy_queue = rt.device("CPU:0").queues[QueueKind.COPY]
                for k in range(3):
                    await rt.copyin(here, np.full(64, 10 * k, np.int32))
                    connection.hold_sends()
                    try:
                        replay = await graph.submit()
                        assert not copy_queue.idle  # the push waits for its bytes to leave
                    finally:
                        connection.release_sends()
                    await replay.wait()
                    np.testing.assert_array_equal(await rt.copyout(there), np.full(64, 10 * k + 2))
    finally:
        worker.kill()

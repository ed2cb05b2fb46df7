"""The client's connection to a worker (actorgraph/devices/remote/_connection.py) when things go
wrong: a worker killed mid-replay, every later call on its devices, slow kernels that are
progress and not a deadlock, chaos, reconnecting to a restarted worker.

Each test starts its own worker (or uses the module's two). Real sockets cannot run on
trio's mock clock, so every test guards against hangs with a generous trio.fail_after.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import tempfile
import tracemalloc
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest
import trio
import trio.testing
from _model import DTYPE, SALT, ProgramSpec, build_items, check_program, random_programs
from _workers import GUARD, TOKEN, runtime, start
from actorgraph.devices import Job, Submission
from actorgraph.devices.remote import _connection as remote_connection
from actorgraph.devices.remote.wire import Limits, Ref
from actorgraph.scheduler import Run, Wait
from hypothesis import given, settings
from hypothesis import strategies as st

import actorgraph as ag
from actorgraph import _window
from actorgraph._program import Program
from actorgraph.testing import Worker, start_worker
from actorgraph.worker import _server as remote_worker
from actorgraph.worker._peers import PeerRead, PeerRefusedError, Peers
from actorgraph.worker._server import run_worker

sys.path.insert(0, str(Path(__file__).parent))
import remote_kernels
from remote_kernels import GATED, HELD, INC, SLEEPY

LOCAL_INC = ag.Kernel("local_inc", cpu=lambda x: np.add(x, 1, out=x), outs=(0,), ins=(0,))


@pytest.mark.parametrize("killed", ["destination", "source"])
async def test_a_worker_killed_between_hops_fails_the_replay(gate: Path, killed: str) -> None:
    # local -> A (a kernel held at a gate) -> B -> local, while B's job waits for A's:
    # B dies (the replay fails once A's kernel ends), or A dies (B's copy from it fails).
    # Either way the replay raises ClosedError, nothing hangs, and the local device and
    # the living worker go on working.
    a_worker, b_worker = start("CPU:0"), start("CPU:0")
    ra, rb = a_worker.name("CPU:0"), b_worker.name("CPU:0")
    try:
        with trio.fail_after(GUARD):
            async with runtime(["CPU:0", ra, rb]) as rt:
                src, back = rt.alloc("CPU:0", 8, np.int32), rt.alloc("CPU:0", 8, np.int32)
                at_a, at_b = rt.alloc(ra, 8, np.int32), rt.alloc(rb, 8, np.int32)
                graph = await rt.compile(
                    [
                        ag.Copy(dst=at_a, src=src),
                        ag.Launch(GATED, [at_a, at_a]),
                        ag.Copy(dst=at_b, src=at_a),
                        ag.Launch(INC, [at_b, at_b]),
                        ag.Copy(dst=back, src=at_b),
                    ]
                )
                replay = await graph.submit()
                await trio.testing.wait_all_tasks_blocked()  # the batches are on the wire
                (b_worker if killed == "destination" else a_worker).kill()
                gate.touch()
                with pytest.raises(
                    ag.ClosedError, match=r"connection to worker 127.0.0.1:\d+ lost"
                ):
                    await replay.wait()
                living = at_a if killed == "destination" else at_b
                await rt.copyin(src, np.arange(8, dtype=np.int32))
                await rt.run([ag.Copy(dst=living, src=src), ag.Launch(INC, [living, living])])
                np.testing.assert_array_equal(await rt.copyout(living), np.arange(8) + 1)
    finally:
        a_worker.kill()
        b_worker.kill()


async def test_a_reader_woken_by_bytes_and_cancelled_before_it_ran_takes_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The reader task waits on the socket; bytes wake it, and before it runs a caller
    takes the socket to read them itself (Transport.wait_done cancels the reader's
    wait). Woken but cancelled, wait_more takes none of the bytes and never waits on the
    socket again beside that caller (which trio refuses with BusyResourceError)."""
    from actorgraph.devices.remote.frames import FrameStream

    here, there = socket.socketpair()
    with here, there:
        stream = FrameStream(here, Limits())
        scope = trio.CancelScope()
        woken = trio.lowlevel.wait_readable

        async def woken_then_taken(sock: Any) -> None:
            there.send(b"for the caller")
            await woken(sock)  # the bytes woke it...
            scope.cancel()  # ...and the caller took the socket before it ran

        monkeypatch.setattr(trio.lowlevel, "wait_readable", woken_then_taken)
        with trio.fail_after(GUARD), scope:
            await stream.wait_more()
        assert scope.cancelled_caught
        assert not stream.buffered
        assert here.recv(64, socket.MSG_PEEK) == b"for the caller"


async def test_worker_killed_mid_replay() -> None:
    worker = start("CPU:0")
    r0 = worker.name("CPU:0")
    try:
        with trio.fail_after(GUARD):
            async with runtime(["CPU:0", r0]) as rt:
                x = rt.alloc(r0, 8, np.int32)
                y = rt.alloc("CPU:0", 8, np.int32)
                z = rt.alloc("CPU:0", 8, np.int32)
                # The local copy waits for the remote kernel: it must not hang either.
                graph = await rt.compile([ag.Launch(SLEEPY, [x, x]), ag.Copy(dst=y, src=x)])
                errors = []

                async def replay() -> None:
                    try:
                        await graph()
                    except ag.ActorGraphError as exc:
                        errors.append(exc)

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(replay)
                    await trio.testing.wait_all_tasks_blocked()  # the batch is on the wire
                    worker.kill()
                assert len(errors) == 1 and isinstance(errors[0], ag.ClosedError)
                assert re.search(r"connection to worker 127.0.0.1:\d+ lost", str(errors[0]))
                # Local devices go on working; the remote one says what happened.
                await rt.copyin(z, np.arange(8, dtype=np.int32))
                await rt.run([ag.Launch(INC, [z, z]), ag.Copy(dst=y, src=z)])
                np.testing.assert_array_equal(await rt.copyout(y), np.arange(8) + 1)
                with pytest.raises(ag.ActorGraphError, match="connection to worker"):
                    await rt.run([ag.Launch(INC, [x, x])])
                with pytest.raises(
                    ag.ClosedError, match=r"alloc on CPU:0@127.0.0.1:\d+: connection"
                ):
                    rt.alloc(r0, 8, np.int32)
    finally:
        worker.kill()


async def test_every_call_on_a_dead_workers_devices_raises_closed_error() -> None:
    """After its worker dies, every call that touches its devices raises ag.ClosedError
    (copies to and from local devices too, and compiling for them); local devices keep
    working, and leaving the block raises nothing."""
    worker = start("CPU:0,CPU:1")
    r0, r1 = worker.name("CPU:0"), worker.name("CPU:1")
    try:
        with trio.fail_after(GUARD):
            async with runtime(["CPU:0", r0, r1]) as rt:
                x, x1 = rt.alloc(r0, 8, np.int32), rt.alloc(r1, 8, np.int32)
                y = rt.alloc("CPU:0", 8, np.int32)
                pull = await rt.compile([ag.Launch(INC, [x, x]), ag.Copy(dst=y, src=x)])
                between = await rt.compile([ag.Copy(dst=x1, src=x)])
                await pull()
                slow = await rt.compile([ag.Launch(SLEEPY, [x, x]), ag.Copy(dst=y, src=x)])
                in_flight = await slow.submit()
                await trio.testing.wait_all_tasks_blocked()
                worker.kill()
                with pytest.raises(ag.ClosedError, match="connection to worker"):
                    await in_flight.wait()
                calls = {
                    "replay": pull,
                    "replay between workers": between,
                    "submit_nowait": lambda: pull.submit_nowait().wait(),
                    "run": lambda: rt.run([ag.Launch(INC, [x, x])]),
                    "copy to a local device": lambda: rt.run([ag.Copy(dst=y, src=x)]),
                    "copy from a local device": lambda: rt.run([ag.Copy(dst=x, src=y)]),
                    "copyin": lambda: rt.copyin(x, np.zeros(8, np.int32)),
                    "copyout": lambda: rt.copyout(x),
                    "compile": lambda: rt.compile([ag.Launch(INC, [x, x])]),
                    "launch": lambda: rt.launch(INC, [x1, x1]),
                }
                for name, call in calls.items():
                    with pytest.raises(
                        ag.ClosedError, match=r"connection to worker 127.0.0.1:\d+ lost"
                    ):
                        await call()
                        pytest.fail(f"{name} did not raise")
                with pytest.raises(
                    ag.ClosedError, match=r"alloc on CPU:0@127.0.0.1:\d+: connection"
                ):
                    rt.alloc(r0, 8, np.int32)
                rt.free(x1)  # its memory went with the worker: nothing to give back
                await rt.copyin(y, np.arange(8, dtype=np.int32))
                await rt.run([ag.Launch(INC, [y, y])])
                np.testing.assert_array_equal(await rt.copyout(y), np.arange(8) + 1)
    finally:
        worker.kill()


async def test_slow_remote_kernels_are_progress_not_a_deadlock(
    gate: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Work in flight on a worker is progress: while remote kernels run, nothing changes on
    the client for many deadlock checks, and the monitor must not call that a deadlock."""
    checked = trio.Event()
    checks = []
    real = _window.find_deadlock

    def counting(actors: Any) -> Any:
        found = real(actors)
        checks.append(found)
        if len(checks) >= 5 or found:
            checked.set()
        return found

    monkeypatch.setattr(_window, "find_deadlock", counting)
    worker = start("CPU:0")
    r0 = worker.name("CPU:0")
    try:
        with trio.fail_after(GUARD):
            async with runtime(["CPU:0", r0], deadlock_check=0.01) as rt:
                x, y = rt.alloc(r0, 8, np.int32), rt.alloc("CPU:0", 8, np.int32)
                await rt.copyin(x, np.arange(8, dtype=np.int32))
                graph = await rt.compile(
                    [
                        ag.Launch(GATED, [x, x]),
                        ag.Launch(INC, [x, x]),
                        ag.Launch(INC, [x, x]),
                        ag.Copy(dst=y, src=x),
                    ]
                )
                replay = await graph.submit()
                await checked.wait()  # the monitor looked at the stalled replay 5 times
                assert checks == [None] * len(checks)
                gate.touch()
                await replay.wait()
                np.testing.assert_array_equal(await rt.copyout(y), np.arange(8) + 2)
                await graph()
                np.testing.assert_array_equal(await rt.copyout(y), np.arange(8) + 4)
                # A real deadlock through the worker is still found: a hand-edited plan
                # where the remote queue and a local one wait on each other.
                items = [ag.Launch(INC, [x, x]), ag.Launch(LOCAL_INC, [y])]
                plan = (await rt.compile(items)).plan
                queues = plan.queues
                programs = []
                for program, other in zip(plan.programs, (queues[1], queues[0])):
                    out: list[Any] = []
                    for msg in program:
                        if isinstance(msg, Run):
                            out.append(Wait(other, 1))
                        out.append(msg)
                    programs.append(tuple(out))
                bad = attrs.evolve(plan, programs=tuple(programs))
                stuck = ag.Graph(rt, Program(rt, items, [], bad))
                with pytest.raises(
                    ag.DeadlockError,
                    match=r"CPU:0@127.0.0.1:\d+/compute waits for CPU:0/compute >= 1",
                ):
                    await stuck()
    finally:
        worker.kill()


# -- a caller that reads its replay's end itself (Connection.wait_done) --


async def test_a_caller_reads_its_replays_end_and_leaves_others_their_turn(gate: Path) -> None:
    # A replay living on one worker is read by its caller: while one waits on a gated
    # kernel, other replays on that worker end (the reading caller reads their reports
    # too), a copyout's bytes are read by the reader task it hands the socket back to,
    # and later replays are read by their callers again. Results equal numpy.
    worker = start("CPU:0,CPU:1", extra_args=("--thread-bytes", "0"))
    r0, r1 = worker.name("CPU:0"), worker.name("CPU:1")
    try:
        with trio.fail_after(GUARD):
            async with runtime([r0, r1]) as rt:
                x, src, y = (rt.alloc(r, 16, np.int32) for r in (r0, r0, r1))
                await rt.copyin(src, np.arange(16, dtype=np.int32))
                slow = await rt.compile([ag.Launch(GATED, [x, src])])
                quick = await rt.compile([ag.Launch(INC, [y, y])])
                conn = rt.device(r0).connection
                await quick()
                before = conn.statistics().ends_read_by_callers
                await quick()
                assert conn.statistics().ends_read_by_callers == before + 1
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(slow)
                    await trio.testing.wait_all_tasks_blocked()
                    assert conn.statistics().read_by_a_caller
                    for _ in range(5):
                        await quick()  # ends while the slow one's caller reads
                    got = await rt.copyout(y)  # bytes: read by the reader task
                    np.testing.assert_array_equal(got, np.full(16, 7))
                    assert not gate.exists()
                    gate.touch()
                np.testing.assert_array_equal(await rt.copyout(x), np.arange(16))
                before = conn.statistics().ends_read_by_callers
                for _ in range(3):
                    await quick()
                stats = conn.statistics()
                assert stats.ends_read_by_callers == before + 3
                assert not stats.read_by_a_caller and stats.batches_in_flight == 0
                np.testing.assert_array_equal(await rt.copyout(y), np.full(16, 10))
    finally:
        worker.kill()


async def test_a_copy_in_or_a_kernel_run_on_one_worker_is_read_by_its_caller() -> None:
    # rt.copyin into a worker's buffer and rt.run of a kernel there end with a report and
    # no bytes: their caller reads it, as a replay's; a copyout's bytes are the reader
    # task's to land. Every result equals numpy.
    worker = start("CPU:0")
    r0 = worker.name("CPU:0")
    try:
        with trio.fail_after(GUARD):
            async with runtime([r0]) as rt:
                x = rt.alloc(r0, 16, np.int32)
                conn = rt.device(r0).connection
                await rt.copyin(x, np.zeros(16, np.int32))
                for k in range(4):
                    before = conn.statistics().ends_read_by_callers
                    await rt.copyin(x, np.arange(16, dtype=np.int32) * k)
                    await rt.run([ag.Launch(INC, [x, x])])
                    assert conn.statistics().ends_read_by_callers == before + 2
                    np.testing.assert_array_equal(await rt.copyout(x), np.arange(16) * k + 1)
                    assert conn.statistics().ends_read_by_callers == before + 2
    finally:
        worker.kill()


async def test_a_copy_from_a_worker_left_to_its_actor_fails_if_the_worker_was_lost_since() -> None:
    # A copy from a worker tried where its job ran, without bytes asked for ahead, is
    # left to its queue's actor; if the connection is lost before the actor gets to it,
    # the copy fails with the connection's error at once (a read asked for then would
    # never end).
    worker = start("CPU:0")
    r0 = worker.name("CPU:0")
    try:
        with trio.fail_after(GUARD):
            async with runtime(["CPU:0", r0]) as rt:
                x = rt.alloc(r0, 4, np.int32)
                conn = rt.device(r0).connection
                worker.kill()
                with pytest.raises(ag.ClosedError, match="connection to worker"):
                    await rt.copyout(x)
                job = Job((), [0, 0, 0], Submission(1, [], [], [()], []), 0)
                lost = remote_connection.RemoteConnectionError
                with pytest.raises(lost, match="connection to worker"):
                    await conn.pull.run_later(job, np.zeros(4, np.int32), Ref(1, 0, [4]))
    finally:
        worker.kill()


async def test_a_caller_cancelled_while_reading_leaves_the_replay_to_end_in_order(
    gate: Path,
) -> None:
    # Cancelled while it reads the worker's frames, a caller gives the socket back: its
    # replay still ends on the worker, in order, read by the reader task; later replays
    # see its result, and their callers read their own ends again.
    worker = start("CPU:0", extra_args=("--thread-bytes", "0"))
    r0 = worker.name("CPU:0")
    try:
        with trio.fail_after(GUARD):
            async with runtime([r0]) as rt:
                x, src = rt.alloc(r0, 16, np.int32), rt.alloc(r0, 16, np.int32)
                await rt.copyin(src, np.arange(16, dtype=np.int32) * 3)
                slow = await rt.compile([ag.Launch(GATED, [x, src])])
                then = await rt.compile([ag.Launch(INC, [x, x])])
                conn = rt.device(r0).connection
                await then()  # the worker has both programs from here on
                with trio.CancelScope() as scope:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(slow)
                        await trio.testing.wait_all_tasks_blocked()
                        assert conn.statistics().read_by_a_caller
                        scope.cancel()
                assert scope.cancelled_caught
                assert not conn.statistics().read_by_a_caller
                gate.touch()
                before = conn.statistics().ends_read_by_callers
                await then()  # after the cancelled replay, on the same queue
                np.testing.assert_array_equal(await rt.copyout(x), np.arange(16) * 3 + 1)
                await then()
                assert conn.statistics().ends_read_by_callers >= before + 1
                assert conn.statistics().batches_in_flight == 0
    finally:
        worker.kill()


async def test_a_worker_killed_while_a_caller_reads_fails_the_replay() -> None:
    worker = start("CPU:0")
    r0 = worker.name("CPU:0")
    try:
        with trio.fail_after(GUARD):
            async with runtime([r0]) as rt:
                x = rt.alloc(r0, 8, np.int32)
                graph = await rt.compile([ag.Launch(SLEEPY, [x, x])])
                conn = rt.device(r0).connection
                await (await rt.compile([ag.Launch(INC, [x, x])]))()
                errors: list[BaseException] = []

                async def replay() -> None:
                    try:
                        await graph()
                    except ag.ActorGraphError as exc:
                        errors.append(exc)

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(replay)
                    await trio.testing.wait_all_tasks_blocked()
                    assert conn.statistics().read_by_a_caller
                    worker.kill()
                assert len(errors) == 1 and isinstance(errors[0], ag.ClosedError)
                assert re.search(r"connection to worker 127.0.0.1:\d+ lost", str(errors[0]))
                with pytest.raises(ag.ClosedError, match="connection to worker"):
                    await graph()
    finally:
        worker.kill()


async def test_a_worker_lost_while_idle_after_a_replay_its_caller_read_is_found() -> None:
    # After a replay whose caller read its end, nothing is in flight and no task reads the
    # connection: a worker that dies then is still found by every later call, each
    # raising ClosedError, and the statistics say the connection is gone.
    worker = start("CPU:0")
    r0 = worker.name("CPU:0")
    try:
        with trio.fail_after(GUARD):
            async with runtime(["CPU:0", r0]) as rt:
                x, y = rt.alloc(r0, 8, np.int32), rt.alloc("CPU:0", 8, np.int32)
                graph = await rt.compile([ag.Launch(INC, [x, x])])
                conn = rt.device(r0).connection
                for _ in range(3):
                    await graph()
                assert conn.statistics().ends_read_by_callers >= 2
                worker.kill()
                worker.process.wait()  # gone: killed, and reaped
                with pytest.raises(
                    ag.ClosedError, match=r"alloc on CPU:0@127.0.0.1:\d+: connection"
                ):
                    rt.alloc(r0, 8, np.int32)
                assert not conn.statistics().connected
                calls = {
                    "replay": graph,
                    "copyin": lambda: rt.copyin(x, np.zeros(8, np.int32)),
                    "copyout": lambda: rt.copyout(x),
                    "copy to a local device": lambda: rt.run([ag.Copy(dst=y, src=x)]),
                    "compile": lambda: rt.compile([ag.Launch(INC, [x, x])]),
                }
                for name, call in calls.items():
                    with pytest.raises(ag.ClosedError, match=r"connection to worker"):
                        await call()
                        pytest.fail(f"{name} did not raise")
    finally:
        worker.kill()


async def test_a_worker_lost_while_idle_fails_the_next_replay_its_caller_reads() -> None:
    worker = start("CPU:0")
    r0 = worker.name("CPU:0")
    try:
        with trio.fail_after(GUARD):
            async with runtime([r0]) as rt:
                x = rt.alloc(r0, 8, np.int32)
                graph = await rt.compile([ag.Launch(INC, [x, x])])
                for _ in range(3):
                    await graph()
                worker.kill()
                worker.process.wait()  # gone: killed, and reaped
                with pytest.raises(
                    ag.ClosedError, match=r"connection to worker 127.0.0.1:\d+ lost"
                ):
                    await graph()
    finally:
        worker.kill()


async def test_a_deadlock_diagnosed_while_a_caller_reads_ends_its_wait() -> None:
    # Two queues of one worker waiting on each other (a hand-edited plan): the worker
    # never reports them; the runtime's monitor diagnoses the deadlock, and the caller
    # reading the worker's frames for that replay stops and raises it.
    worker = start("CPU:0,CPU:1")
    r0, r1 = worker.name("CPU:0"), worker.name("CPU:1")
    try:
        with trio.fail_after(GUARD):
            async with runtime([r0, r1], deadlock_check=0.05) as rt:
                x, y = rt.alloc(r0, 4, np.int32), rt.alloc(r1, 4, np.int32)
                items = [ag.Launch(INC, [x, x]), ag.Launch(INC, [y, y])]
                graph = await rt.compile(items)
                plan = graph.plan
                q0, q1 = plan.queues
                programs = []
                for program, other in zip(plan.programs, (q1, q0)):
                    out: list[Any] = []
                    for msg in program:
                        if isinstance(msg, Run):
                            out.append(Wait(other, 1))
                        out.append(msg)
                    programs.append(tuple(out))
                bad = attrs.evolve(plan, programs=tuple(programs))
                stuck = ag.Graph(rt, Program(rt, items, [], bad))
                conn = rt.device(r0).connection
                assert stuck._program.end_reader is conn
                await graph()
                errors: list[BaseException] = []

                async def replay() -> None:
                    try:
                        await stuck()
                    except ag.ActorGraphError as exc:
                        errors.append(exc)

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(replay)
                    await trio.testing.wait_all_tasks_blocked()
                    assert conn.statistics().read_by_a_caller
                assert len(errors) == 1 and isinstance(errors[0], ag.DeadlockError)
                assert not conn.statistics().read_by_a_caller
    finally:
        worker.kill()


@settings(max_examples=4)
@given(
    random_programs(max_devices=4, max_items=12),
    random_programs(max_devices=2, max_items=8),
    st.integers(0, 40),
)
def test_chaos_a_worker_killed_mid_replay(
    spec: ProgramSpec, local_spec: ProgramSpec, checkpoints: int
) -> None:
    """Random graphs over two local devices and two of a worker, checked against the host
    model; then the worker is killed after a random number of checkpoints while every
    graph is being replayed. Nothing hangs, every call returns or raises ClosedError, and
    the runtime goes on working on its local devices."""

    async def main() -> None:
        # A gate that never opens: the worker is surely killed while a replay runs there.
        os.environ["ACTORGRAPH_TEST_GATE"] = str(Path(tempfile.mkdtemp()) / "never")
        try:
            worker = start_worker(
                ["CPU:0", "CPU:1"], kernels=["_model", "remote_kernels"], token=TOKEN
            )
        finally:
            del os.environ["ACTORGRAPH_TEST_GATE"]
        names = ["CPU:0", "CPU:1", worker.name("CPU:0"), worker.name("CPU:1")]
        try:
            with trio.fail_after(GUARD):
                async with runtime(names) as rt:
                    await check_program(rt, names, spec, replays=1)
                    buffers = [
                        rt.alloc(names[d], spec.buffer_size, DTYPE) for d in spec.buffer_devices
                    ]
                    items = build_items(spec, buffers)
                    graphs = [await rt.compile(items[lo:hi]) for lo, hi in spec.chunks()]
                    held = rt.alloc(names[2], 4, np.uint32)
                    local = rt.alloc("CPU:0", 4, np.uint32)
                    graphs.insert(
                        0,
                        await rt.compile(
                            [ag.Launch(GATED, [held, held]), ag.Copy(dst=local, src=held)]
                        ),
                    )
                    outcomes: list[BaseException | None] = []

                    async def call(graph: ag.Graph) -> None:
                        try:
                            await call_raising(graph)
                            outcomes.append(None)
                        except ag.ClosedError as error:
                            outcomes.append(error)

                    async def kill() -> None:
                        for _ in range(checkpoints):
                            await trio.lowlevel.checkpoint()
                        worker.kill()

                    async with trio.open_nursery() as nursery:
                        for graph in graphs:
                            nursery.start_soon(call, graph)
                        nursery.start_soon(kill)
                    assert len(outcomes) == len(
                        graphs
                    )  # every call ended: none raised another error
                    assert any(isinstance(o, ag.ClosedError) for o in outcomes)  # the gated one
                    await check_program(rt, ["CPU:0", "CPU:1"], local_spec, replays=1)
                    touches_worker = [
                        g for g in graphs if any("@" in q.device for q in g.plan.queues)
                    ]
                    for graph in touches_worker[:1]:
                        with pytest.raises(ag.ClosedError, match="connection to worker"):
                            await call_raising(graph)
                    assert rt.in_flight == 0
        finally:
            worker.kill()

    trio.run(main)


def _uses_salt(graph: ag.Graph) -> bool:
    return SALT in graph._program.free_vars


async def call_raising(graph: ag.Graph) -> None:
    await graph(var_vals={SALT: 1} if _uses_salt(graph) else None)


async def test_reconnect_to_a_restarted_worker() -> None:
    worker = start("CPU:0")
    port = worker.port
    try:
        with trio.fail_after(GUARD):
            async with runtime([worker.name("CPU:0")]) as rt:
                x = rt.alloc(worker.name("CPU:0"), 4, np.int32)
                await rt.copyin(x, np.ones(4, np.int32))
            worker.kill()
            worker = start("CPU:0", port=port)
            async with runtime([worker.name("CPU:0")]) as rt:
                x = rt.alloc(worker.name("CPU:0"), 4, np.int32)
                await rt.copyin(x, np.full(4, 7, np.int32))
                await rt.run([ag.Launch(INC, [x, x])])
                np.testing.assert_array_equal(await rt.copyout(x), np.full(4, 8))
    finally:
        worker.kill()


async def test_a_runtime_holding_a_token_refuses_a_worker_without_one(
    workers: tuple[Worker, Worker],
) -> None:
    # B serves loopback without a token; the runtime holds A's. B cannot prove it holds
    # the token, so it may be anything listening there (a stranger that would take this
    # client's data): the runtime refuses it, saying why and what to check, before a
    # byte of work goes to it.
    a_worker, _ = workers
    serving = trio.CancelScope()

    async def serve_b(task_status: trio.TaskStatus[tuple[str, int]]) -> None:
        with serving:
            await run_worker(["CPU:0"], kernel_modules=["remote_kernels"], task_status=task_status)

    with trio.fail_after(GUARD):
        async with trio.open_nursery() as nursery:
            host, port = await nursery.start(serve_b)
            rb = f"CPU:0@{host}:{port}"
            with pytest.raises(
                remote_connection.RemoteConnectionError,
                match=rf"cannot connect to the worker at {host}:{port}: what answers there "
                r"could not prove it holds this client's token \(it asks for no token, so it "
                r"cannot prove it holds this side's token\), so it may not be the worker meant",
            ):
                async with runtime([a_worker.name("CPU:0"), rb]):
                    pass
            # Without a token, B serves this client (loopback).
            async with ag.open_runtime([rb]) as rt:
                y = rt.alloc(rb, 8, np.int32)
                await rt.copyin(y, np.arange(8, dtype=np.int32))
                assert (await rt.copyout(y)).shape == (8,)
                # B stops before this client leaves: its tasks end cancelled, not as a
                # disconnect racing the cancellation.
                serving.cancel()


async def test_a_worker_answers_a_peer_with_its_own_token(workers: tuple[Worker, Worker]) -> None:
    # The dialing side of a link: a worker whose token is not its peer's gets the peer's
    # refusal as the read's error, and the next read tries a new link.
    a_worker, _ = workers
    ra = a_worker.name("CPU:0")
    with trio.fail_after(GUARD):
        async with runtime([ra]) as rt, trio.open_nursery() as nursery:
            x = rt.alloc(ra, 4, np.int32)
            await rt.copyin(x, np.arange(4, dtype=np.int32))
            conn = rt.device(ra).connection
            ref = [x.memory.handle, 0, [4]]
            out = bytearray(16)
            refusals = {
                b"wrong-token": r"authentication failed: a worker-to-worker link needs this "
                r"worker's token; start every worker of a runtime with the same --token-file",
                None: r"that worker requires a token and this one was started without "
                r"--token-file; start every worker of a runtime with the same --token-file",
            }
            for token in (b"wrong-token", None, TOKEN):
                peers = Peers(Limits(), token)
                peers.start(nursery)
                args = ("127.0.0.1", a_worker.port, conn.session_id, ref, conn.ticket(ref[0]))
                if token == TOKEN:
                    await peers.pull(*args, memoryview(out))
                    np.testing.assert_array_equal(np.frombuffer(out, np.int32), np.arange(4))
                    continue
                for _ in range(2):
                    with pytest.raises(
                        PeerRefusedError,
                        match=rf"worker-to-worker link to 127.0.0.1:{a_worker.port} refused: "
                        + refusals[token],
                    ):
                        await peers.pull(*args, memoryview(out))
                    assert not peers.links
            nursery.cancel_scope.cancel()


async def _linked_workers(
    nursery: trio.Nursery, scopes: list[trio.CancelScope], monkeypatch: pytest.MonkeyPatch
) -> tuple[Peers, str, str]:
    """Workers A and B in this process (kernels on a thread), until `scopes` (theirs) are
    cancelled: B's links to other workers, and the names of A's and B's CPU:0."""
    made: list[Any] = []
    init = remote_worker.Worker.__init__

    def record(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(remote_worker.Worker, "__init__", record)

    async def serve(task_status: trio.TaskStatus[tuple[str, int]]) -> None:
        with trio.CancelScope() as scope:
            scopes.append(scope)
            await run_worker(
                ["CPU:0"],
                token=TOKEN,
                kernel_modules=["remote_kernels"],
                thread_bytes=0,
                task_status=task_status,
            )

    a_host, a_port = await nursery.start(serve)
    b_host, b_port = await nursery.start(serve)
    return made[1].peers, f"CPU:0@{a_host}:{a_port}", f"CPU:0@{b_host}:{b_port}"


async def _asked(peers: Peers) -> Any:
    """A link of `peers` once it waits for an answer."""
    while True:
        for link in list(peers.links.values()):
            if link.reads:
                return link
        await trio.testing.wait_all_tasks_blocked()


@pytest.mark.parametrize("new_links", ["work", "are refused"])
@pytest.mark.parametrize("n", [(1 << 18) + 2, 16], ids=["watched", "read ahead"])
async def test_a_failed_link_between_workers_is_relayed_by_the_client(
    monkeypatch: pytest.MonkeyPatch, n: int, new_links: str
) -> None:
    # B copies x from A once A's held kernel ends: B's worker asks A's over their link,
    # to be told ("pwatch": a copy over 1 MiB, read when it runs) or sent the bytes
    # ("pwhen": read ahead). The link is cut while A is held, A staying connected to the
    # client: B's worker asks the client to relay the wait, the client asks A itself, and
    # the copy reads over a new link. Where new links are refused, the replay fails
    # naming both workers; later replays work once links are.
    relayed: list[tuple[str, int]] = []
    relay = remote_connection._Batch.relay

    def spy(self: Any, address: tuple[str, int]) -> None:
        relayed.append(address)
        relay(self, address)

    monkeypatch.setattr(remote_connection._Batch, "relay", spy)
    remote_kernels.RELEASE.clear()
    with trio.fail_after(GUARD):
        async with trio.open_nursery() as nursery:
            serving: list[trio.CancelScope] = []
            b_peers, ra, rb = await _linked_workers(nursery, serving, monkeypatch)
            a_address = ra.partition("@")[2]
            async with runtime([ra, rb]) as rt:
                x, y = rt.alloc(ra, n, np.int32), rt.alloc(rb, n, np.int32)
                await rt.copyin(x, np.arange(n, dtype=np.int32))
                graph = await rt.compile(
                    [
                        ag.Launch(INC, [x, x]),
                        ag.Launch(HELD, [x, x]),
                        ag.Copy(dst=y, src=x),
                        ag.Launch(INC, [y, y]),
                    ]
                )
                replay = await graph.submit()
                link = await _asked(b_peers)
                # A link that goes silent is probed by the kernel and fails (then relayed).
                sock = link.stream.sock
                assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE)
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 30
                if new_links == "are refused":

                    async def refused(host: str, port: int) -> Any:
                        raise ConnectionRefusedError(111, "refused on purpose")

                    b_peers._link = refused  # type: ignore[method-assign]
                link.stream.sock.shutdown(socket.SHUT_RDWR)
                remote_kernels.RELEASE.set()
                if new_links == "work":
                    await replay.wait()
                    np.testing.assert_array_equal(await rt.copyout(y), np.arange(n) + 2)
                else:
                    with pytest.raises(
                        ag.ItemError,
                        match=rf"on worker {rb.partition('@')[2]} .*worker-to-worker read "
                        rf"from {a_address} failed: \[Errno 111\] refused on purpose",
                    ):
                        await replay.wait()
                    del b_peers._link  # links work again
                host, port = a_address.split(":")
                assert relayed == [(host, int(port))]
                # Later replays open a new link and need no relay.
                for _ in range(2):
                    await graph()
                assert relayed == [(host, int(port))]
                assert b_peers.links[(host, int(port))] is not link
                np.testing.assert_array_equal(await rt.copyout(y), np.arange(n) + 4)
                # The workers stop before this client leaves: their tasks end cancelled,
                # not as a disconnect racing the cancellation.
                for scope in serving:
                    scope.cancel()


def test_a_watch_that_fails_never_says_its_source_got_there() -> None:
    # A refused copy's bytes end its wait (the copy then fails with the refusal); a watch
    # refused (its session gone, say) or a link lost says nothing of the source's queue:
    # the client is asked to relay, and nothing rises that the source did not reach.
    calls: list[str] = []

    def read(nbytes: int, name: str) -> PeerRead:
        return PeerRead(
            memoryview(bytearray(nbytes)),
            lambda: calls.append(f"{name} arrived"),
            lambda exc: calls.append(f"{name} lost: {exc}"),
        )

    read(0, "watch").fail(PeerRefusedError("no such session"))
    read(8, "copy").fail(PeerRefusedError("bad ticket"))
    read(8, "reset copy").fail(ConnectionError("link reset"))
    read(0, "reset watch").fail(ConnectionError("link reset"))
    assert calls == [
        "watch lost: no such session",
        "copy arrived",
        "reset copy lost: link reset",
        "reset watch lost: link reset",
    ]


async def _fake_peer(
    frames: list[list[Any]], answer: trio.Event, task_status: trio.TaskStatus[int]
) -> None:
    """A worker as a link sees it (no token): it takes the handshake, keeps every request
    it gets in `frames`, and once `answer` is set answers each "pwhen" with 4 bytes."""
    from actorgraph.devices.remote.frames import FrameStream, encode

    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    task_status.started(listener.getsockname()[1])
    conn, _ = await listener.accept()
    stream = FrameStream(conn, Limits())
    await stream.send([encode(["challenge", b"n" * 32, False])])
    meta, _ = await stream.receive()
    assert meta[:2] == ["hello", "peer"]
    meta, _ = await stream.receive()
    assert meta == ["auth", b"", []]
    await stream.send([encode(["welcome", 0, b"", Limits().as_wire(), b""])])
    while True:
        meta, _ = await stream.receive()
        frames.append(meta)
        await answer.wait()
        await stream.send([encode(["data", meta[1], 0, None], 4), bytes([meta[1]] * 4)])


async def test_a_batchs_requests_to_a_worker_leave_in_one_send_and_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A worker asks another for what a batch waits on from the task that takes the batch:
    # on an open link, held together they leave in one send; what the socket does not
    # take at once goes by a writer task, in order; the answers land in their reads.
    from actorgraph.devices.remote.frames import FrameStream

    sends: list[int] = []
    send_nowait = FrameStream.send_nowait

    def counted(self: FrameStream, data: bytes | memoryview) -> int:
        sends.append(len(data))
        return send_nowait(self, data[: take[0]])

    monkeypatch.setattr(FrameStream, "send_nowait", counted)
    take = [1 << 30]
    arrived: list[int] = []
    frames: list[list[Any]] = []
    answer = trio.Event()
    with trio.fail_after(GUARD):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(_fake_peer, frames, answer)
            peers = Peers(Limits())
            peers.start(nursery)

            def ask(n: int) -> PeerRead:
                read, _ = peers.pull_when(
                    "127.0.0.1", port, 1, [n, 0, [1]], b"t" * 16, "CPU:0", n, 4,
                    lambda: arrived.append(n), lambda exc: arrived.append(-n),
                )  # fmt: skip
                return read

            first = ask(1)  # opens the link, from a task
            while len(frames) < 1:
                await trio.testing.wait_all_tasks_blocked()
            sends.clear()
            peers.hold()
            reads = [ask(n) for n in (2, 3, 4)]
            assert sends == []  # held
            peers.release()
            assert len(sends) == 1  # three requests, one send
            take[0] = 5  # the socket takes 5 bytes: the rest goes by the writer task
            reads += [ask(5), ask(6)]
            answer.set()
            for read in [first, *reads]:
                await read.done.wait()
                assert read.error is None
            assert [f[0] for f in frames] == ["pwhen"] * 6
            assert [f[6] for f in frames] == [1, 2, 3, 4, 5, 6]  # asked in order
            assert sorted(arrived) == [1, 2, 3, 4, 5, 6]
            assert [bytes(r.view) for r in [first, *reads]] == [bytes([i] * 4) for i in range(1, 7)]
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
async def test_a_listener_that_never_answers_the_handshake_is_named(
    tls: bool, tmp_path: Path
) -> None:
    # Something accepts the connection and says nothing: the client says that what
    # listens there did not answer the handshake in remote_timeout seconds, and what to
    # check, not that no worker runs there.
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    options: dict[str, Any] = {"remote_timeout": 0.5}
    what = "handshake"
    if tls:
        import trustme

        ca = tmp_path / "ca.pem"
        trustme.CA().cert_pem.write_to_path(str(ca))
        options["remote_tls_ca"] = ca
        what = "TLS handshake"

    async def silent() -> None:
        conn, _ = await listener.accept()
        with conn:
            await trio.sleep_forever()

    with trio.fail_after(GUARD):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(silent)
            with pytest.raises(
                remote_connection.RemoteConnectionError,
                match=re.escape(
                    f"cannot connect to the worker at 127.0.0.1:{port}: something accepted the "
                    f"connection there but did not answer the {what} within 0.5 s; check that "
                    f"an actorgraph worker of this version listens at 127.0.0.1:{port} (not "
                    f"another service), that it is not stopped or overloaded, or give it longer "
                    f"with open_runtime(..., remote_timeout=SECONDS)"
                ),
            ) as info:
                async with runtime([f"CPU:0@127.0.0.1:{port}"], **options):
                    pass
            assert "start one" not in str(info.value)  # something runs there
            # A worker's link to such a listener says the same, within its own timeout.
            peers = Peers(Limits(), TOKEN, timeout=0.5)
            peers.start(nursery)
            nursery.start_soon(silent)
            with pytest.raises(
                ConnectionError,
                match=re.escape(
                    f"worker-to-worker read from 127.0.0.1:{port} failed: 127.0.0.1:{port} did "
                    f"not answer the handshake within 0.5 s; check that a worker of this "
                    f"actorgraph version listens there and is not stopped or overloaded"
                ),
            ):
                await peers.pull(
                    "127.0.0.1", port, 1, Ref(1, 0, [4]), b"t" * 32, memoryview(bytearray(4))
                )
            nursery.cancel_scope.cancel()
    listener.close()


async def test_a_connection_keeps_no_data_it_sent(workers: tuple[Worker, Worker]) -> None:
    # A copyin's data goes by the connection's writer task: once sent it is let go
    # of, not kept until the next send (64 MiB here, then 4 bytes).
    worker, _ = workers
    with trio.fail_after(GUARD):
        async with runtime([worker.name("CPU:0")]) as rt:
            x = rt.alloc(worker.name("CPU:0"), 16 << 20, np.int32)
            tracemalloc.start()
            try:
                before = tracemalloc.get_traced_memory()[0]
                await rt.copyin(x, np.ones(16 << 20, np.int32))
                held = tracemalloc.get_traced_memory()[0] - before
            finally:
                tracemalloc.stop()
            assert held < 8 << 20, f"{held} bytes still held after the copyin"
            assert (await rt.copyout(x)).sum() == 16 << 20

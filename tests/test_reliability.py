"""Faults, cancellation, deadlock diagnosis, back-pressure, 64-bit timelines, soak.

(Aliased inputs are in test_graph.py; a fault on an actor's worker thread in test_actor.py.)
"""

from __future__ import annotations

import gc
import logging
import re
import threading
import tracemalloc

import attrs
import numpy as np
import pytest
import trio
import trio.testing
from actorgraph.scheduler import Run, Wait

import actorgraph as ag
from actorgraph._program import Program

XOR = ag.Kernel("xor", cpu=lambda out, a, b: np.bitwise_xor(a, b, out=out), outs=(0,), ins=(1, 2))
INC = ag.Kernel("inc", cpu=lambda x: np.add(x, 1, out=x), outs=(0,), ins=(0,))


def gated_kernel(gate: threading.Event) -> ag.Kernel:
    """A kernel that blocks its (worker) thread until `gate` is set."""

    def body(out: np.ndarray, a: np.ndarray) -> None:
        if not gate.wait(timeout=30):
            raise TimeoutError("gate never opened")
        np.copyto(out, a)

    return ag.Kernel("gated", cpu=body, outs=(0,), ins=(1,))


async def fill(rt: ag.Runtime, buf: ag.Buffer, value: int) -> None:
    await rt.copyin(buf, np.full(buf.shape, value, buf.dtype))


# -- faults --------------------------------------------------------------------------


async def test_kernel_fault_names_item_and_runtime_stays_usable() -> None:
    fail = {"on": True}

    def flaky(out: np.ndarray, a: np.ndarray) -> None:
        if fail["on"]:
            raise ValueError("bad value in flaky")
        np.copyto(out, a + 1)

    flaky_k = ag.Kernel("flaky", cpu=flaky, outs=(0,), ins=(1,))
    async with ag.open_runtime(["CPU:0", "CPU:1"]) as rt:
        a, b = rt.alloc("CPU:0", 16, np.int32), rt.alloc("CPU:0", 16, np.int32)
        c, d = rt.alloc("CPU:1", 16, np.int32), rt.alloc("CPU:1", 16, np.int32)
        await fill(rt, a, 3)
        items = [
            ag.Launch(XOR, [b, a, a]),
            ag.Copy(dst=c, src=b),
            ag.Launch(flaky_k, [d, c]),  # item 2 fails on CPU:1
            ag.Copy(dst=b, src=d),  # waits for the failed item: must not hang
        ]
        graph = await rt.compile(items, inputs=[a])
        with pytest.raises(
            ag.ItemError, match=r"item 2 \(flaky\) on CPU:1/compute raised ValueError: bad value"
        ) as info:
            await graph([a])
        assert (
            info.value.index == 2 and info.value.label == "flaky" and info.value.device == "CPU:1"
        )
        assert isinstance(info.value.__cause__, ValueError)
        fail["on"] = False
        await graph([a])
        np.testing.assert_array_equal(await rt.copyout(b), np.ones(16, np.int32))
        with pytest.raises(ag.ItemError, match=r"item 0 \(flaky\)"):
            fail["on"] = True
            await rt.run([ag.Launch(flaky_k, [d, c])])


# -- cancellation ------------------------------------------------------------------


async def test_cancel_before_kickoff_submits_nothing() -> None:
    async with ag.open_runtime(["CPU:0"]) as rt:
        a = rt.alloc("CPU:0", 8, np.int32)
        graph = await rt.compile([ag.Launch(INC, [a])])
        before = rt.submissions
        with trio.CancelScope() as scope:
            scope.cancel()
            await graph()
        assert scope.cancelled_caught
        assert rt.submissions == before
        await graph()
        np.testing.assert_array_equal(await rt.copyout(a), np.ones(8, np.int32))


@pytest.mark.parametrize("where", ["kernel", "copy"])
async def test_cancel_mid_replay_keeps_timelines_consistent(
    autojump_clock: object, where: str
) -> None:
    gate = threading.Event()
    gated = gated_kernel(gate)
    async with ag.open_runtime(["CPU:0", "CPU:1"], cpu_thread_bytes=0) as rt:
        a, b = rt.alloc("CPU:0", 32, np.int32), rt.alloc("CPU:0", 32, np.int32)
        c, d = rt.alloc("CPU:1", 32, np.int32), rt.alloc("CPU:1", 32, np.int32)
        await fill(rt, a, 7)
        if where == "kernel":
            items = [
                ag.Launch(gated, [b, a]),
                ag.Copy(dst=c, src=b),
                ag.Launch(XOR, [d, c, c]),
                ag.Launch(INC, [d]),
            ]
        else:
            items = [
                ag.Launch(XOR, [b, a, a]),
                ag.Copy(dst=c, src=a),
                ag.Launch(gated, [d, c]),
                ag.Launch(INC, [d]),
            ]
        graph = await rt.compile(items, inputs=[a])
        with trio.move_on_after(5) as scope:
            await graph([a])
        assert scope.cancelled_caught  # the gate held the replay past the deadline
        gate.set()
        # The cancelled replay still completes in order; the next one sees its effects.
        await fill(rt, a, 9)
        await graph([a])
        expected = np.ones(32, np.int32) if where == "kernel" else np.full(32, 10, np.int32)
        np.testing.assert_array_equal(await rt.copyout(d), expected)
        assert rt.in_flight == 0


async def test_runtime_exit_cancels_actors_and_fails_pending_work(autojump_clock: object) -> None:
    async with ag.open_runtime(["CPU:0", "CPU:1"], deadlock_check=1e9) as rt:
        graph, _ = await deadlocked_graph(rt)
        replay = await graph.submit()
        await trio.testing.wait_all_tasks_blocked()
    with pytest.raises(ag.ClosedError, match="shut down before it ran this work"):
        await replay.wait()
    with pytest.raises(ag.ClosedError, match="has exited its `async with open_runtime"):
        rt.alloc("CPU:0", 4, np.int32)


# -- deadlock diagnosis ---------------------------------------------------------------


async def deadlocked_graph(rt: ag.Runtime, checks: int = 0) -> tuple[ag.Graph, ag.Plan]:
    """A graph whose hand-edited plan has two queues waiting on each other (its first
    `checks` replays checked)."""
    x, y = rt.alloc("CPU:0", 4, np.int32), rt.alloc("CPU:1", 4, np.int32)
    items = [ag.Launch(INC, [x]), ag.Launch(INC, [y])]
    graph = await rt.compile(items)
    plan = graph.plan
    q0, q1 = plan.queues
    programs = []
    for program, other in zip(plan.programs, (q1, q0)):
        out = []
        for msg in program:
            if isinstance(msg, Run):
                out.append(Wait(other, 1))
            out.append(msg)
        programs.append(tuple(out))
    bad = attrs.evolve(plan, programs=tuple(programs))
    return ag.Graph(rt, Program(rt, items, [], bad), checks=checks), bad


async def test_deadlock_is_diagnosed_not_hung(autojump_clock: object) -> None:
    async with ag.open_runtime(["CPU:0", "CPU:1"]) as rt:
        graph, bad = await deadlocked_graph(rt)
        with pytest.raises(ag.PlanDeadlockError, match="CPU:0/compute waits for CPU:1/compute>=1"):
            bad.verify()
        with pytest.raises(
            ag.DeadlockError, match=r"CPU:0/compute waits for CPU:1/compute >= 1 \(now 0\)"
        ) as info:
            await graph()
        assert {b.actor for b in info.value.blocked} == {"CPU:0/compute", "CPU:1/compute"}
        # A sticky fault: later calls fail with the same clear error.
        with pytest.raises(ag.ClosedError, match="broken by an earlier fault: deadlock"):
            await rt.copyout(rt.alloc("CPU:0", 4, np.int32))


async def test_a_replay_failed_by_a_deadlock_still_advances_its_then_timelines(
    autojump_clock: object,
) -> None:
    async with ag.open_runtime(["CPU:0", "CPU:1"]) as rt:
        graph, _ = await deadlocked_graph(rt)
        seen = [0]
        then = ag.ExternalTimeline("then", lambda: seen[0], lambda v: seen.__setitem__(0, v))
        replay = await graph.submit(then=[(then, 3)])
        with trio.fail_after(60), pytest.raises(ag.DeadlockError, match="deadlock"):
            await replay.wait()
        # Advanced when the replay is complete, failed or not: the other side never hangs.
        assert seen == [3]


async def test_a_checked_replay_in_flight_when_the_runtime_breaks_fails_instead_of_hanging(
    autojump_clock: object,
) -> None:
    async with ag.open_runtime(["CPU:0", "CPU:1"]) as rt:
        graph, _ = await deadlocked_graph(rt, checks=1)
        with trio.fail_after(60), pytest.raises(ag.DeadlockError, match="deadlock"):
            await graph()


async def test_watchdog_reports_a_stalled_replay(
    autojump_clock: object, caplog: pytest.LogCaptureFixture
) -> None:
    gate = threading.Event()
    caplog.set_level(logging.WARNING, logger="actorgraph")
    async with ag.open_runtime(["CPU:0"], cpu_thread_bytes=0, watchdog=2.0) as rt:
        a, b = rt.alloc("CPU:0", 8, np.int32), rt.alloc("CPU:0", 8, np.int32)
        graph = await rt.compile([ag.Launch(gated_kernel(gate), [b, a])])

        async def release_when_reported() -> None:
            while not rt.stalls:
                await trio.sleep(0.5)
            gate.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(release_when_reported)
            await graph()
        assert rt.stalls[0].stalled_for >= 2.0 and rt.stalls[0].in_flight == 1
        assert "no progress for" in caplog.text
        assert not rt._broken  # a slow kernel is a stall, not a deadlock


# -- load ---------------------------------------------------------------------------------


async def test_back_pressure_blocks_submit_and_keeps_order(autojump_clock: object) -> None:
    gate = threading.Event()
    async with ag.open_runtime(["CPU:0", "CPU:1"], cpu_thread_bytes=0, max_in_flight=4) as rt:
        # All on CPU:1, so the counting replays queue behind the gated one.
        a, b = rt.alloc("CPU:1", 8, np.int32), rt.alloc("CPU:1", 8, np.int32)
        acc = rt.alloc("CPU:1", 8, np.int32)
        gate_graph = await rt.compile([ag.Launch(gated_kernel(gate), [b, a])])
        count = await rt.compile([ag.Launch(INC, [acc])])
        first = await gate_graph.submit()
        replays = [first]
        for _ in range(3):
            replays.append(await count.submit())
        assert rt.in_flight == 4
        submitted = []

        async def submit_more() -> None:
            for _ in range(6):
                submitted.append(await count.submit())

        done_order: list[int] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(submit_more)
            await trio.testing.wait_all_tasks_blocked()
            assert submitted == [] and rt.in_flight == 4  # the window is full: submit waits
            gate.set()
            for r in replays:
                nursery.start_soon(lambda r=r: wait_and_record(r, done_order))
        for r in submitted:
            await r.wait()
        assert done_order == sorted(done_order)
        np.testing.assert_array_equal(await rt.copyout(acc), np.full(8, 9, np.int32))


async def wait_and_record(replay: ag.Replay, order: list[int]) -> None:
    await replay.wait()
    order.append(replay.number)


async def test_many_graphs_many_tasks_on_shared_devices() -> None:
    async with ag.open_runtime(["CPU:0", "CPU:1", "CPU:2"]) as rt:
        devs = rt.devices
        acc = {d: rt.alloc(d, 16, np.int64) for d in devs}
        graphs = []
        for i, d in enumerate(devs):
            src = rt.alloc(d, 16, np.int64)
            nxt = devs[(i + 1) % len(devs)]
            stage = rt.alloc(nxt, 16, np.int64)
            graphs.append(
                await rt.compile(
                    [
                        ag.Launch(INC, [acc[d]]),
                        ag.Launch(XOR, [src, src, src]),
                        ag.Copy(dst=stage, src=src),
                        ag.Launch(INC, [acc[nxt]]),
                    ]
                )
            )

        async def hammer(graph: ag.Graph, times: int) -> None:
            for _ in range(times):
                await graph()

        async with trio.open_nursery() as nursery:
            for task in range(8):
                nursery.start_soon(hammer, graphs[task % 3], 25)
        # Every graph bumps its own device's and the next device's counter once per replay.
        per_graph = [sum(25 for t in range(8) if t % 3 == g) for g in range(3)]
        for i, d in enumerate(devs):
            expected = per_graph[i] + per_graph[(i - 1) % 3]
            np.testing.assert_array_equal(await rt.copyout(acc[d]), np.full(16, expected))


async def test_timelines_cross_2_63() -> None:
    start = (1 << 63) - 5
    async with ag.open_runtime(["CPU:0", "CPU:1"], timeline_start=start) as rt:
        a, b = rt.alloc("CPU:0", 8, np.int32), rt.alloc("CPU:1", 8, np.int32)
        graph = await rt.compile([ag.Launch(INC, [a]), ag.Copy(dst=b, src=a), ag.Launch(INC, [b])])
        for i in range(1, 11):
            await graph()
            np.testing.assert_array_equal(await rt.copyout(b), np.full(8, i + 1, np.int32))
            await rt.run([ag.Launch(XOR, [b, b, b])])
        assert rt.device("CPU:0").timeline.value > 1 << 63
        assert rt.device("CPU:1").queues[ag_copy_kind()].signal.value > 1 << 63


def ag_copy_kind():  # the copy queue's key, without importing the scheduler enum at module top
    from actorgraph.scheduler import QueueKind

    return QueueKind.COPY


async def test_timeline_overflow_is_refused_before_submitting() -> None:
    async with ag.open_runtime(["CPU:0"], timeline_start=(1 << 64) - 3) as rt:
        a = rt.alloc("CPU:0", 4, np.int32)
        graph = await rt.compile([ag.Launch(INC, [a]), ag.Launch(INC, [a]), ag.Launch(INC, [a])])
        with pytest.raises(OverflowError, match="timeline would pass 2\\*\\*64-1"):
            await graph()


@pytest.mark.parametrize("device", ["CPU:0", "SIM:0"])
async def test_device_timeline_overflow_is_refused_before_submitting(device: str) -> None:
    """Every call advances the device timeline (copyin, run, replays): the one that would
    pass 2**64-1 is refused before anything is posted, and the runtime stays sound."""
    other = device[:-1] + "1"
    async with ag.open_runtime([device, other], timeline_start=(1 << 64) - 5) as rt:
        a = rt.alloc(device, 4, np.int32)
        graph = await rt.compile([ag.Launch(INC, [a])])
        calls = [
            lambda: rt.copyin(a, np.zeros(4, np.int32)),
            lambda: rt.run([ag.Launch(INC, [a])]),
            lambda: graph(),
        ]
        refused = 0
        with trio.fail_after(10):
            for i in range(12):
                try:
                    await calls[i % 3]()
                except OverflowError as error:
                    assert re.search(rf"{device}/timeline would pass 2\*\*64-1", str(error)), error
                    refused += 1
        assert refused == 8  # four submissions fit below the top, every later one is refused
        with pytest.raises(OverflowError, match="timeline would pass"):
            graph.submit_nowait()
        with pytest.raises(OverflowError, match="timeline would pass"):
            await rt.copyout(a)
        assert rt.in_flight == 0
        # The other device has room and keeps working.
        b = rt.alloc(other, 4, np.int32)
        await rt.run([ag.Launch(INC, [b])])
        np.testing.assert_array_equal(await rt.copyout(b), np.ones(4, np.int32))


async def test_soak_2k_replays_memory_is_flat() -> None:
    async with ag.open_runtime(["CPU:0", "CPU:1"]) as rt:
        a, b = rt.alloc("CPU:0", 64, np.int32), rt.alloc("CPU:0", 64, np.int32)
        c = rt.alloc("CPU:1", 64, np.int32)
        graph = await rt.compile(
            [ag.Launch(XOR, [b, a, a]), ag.Copy(dst=c, src=b), ag.Launch(INC, [c])], inputs=[a]
        )
        tracemalloc.start()
        try:
            # Warm up under tracing: trio and CPython fill bounded caches of their own over
            # the first ~1500 replays (about 70 KiB, then flat).
            for _ in range(2000):
                await graph([a])
            gc.collect()  # cyclic garbage awaiting the collector is not growth
            before = tracemalloc.take_snapshot()
            for _ in range(2000):
                await graph([a])
            gc.collect()
            after = tracemalloc.take_snapshot()
        finally:
            tracemalloc.stop()
        grown = sum(s.size_diff for s in after.compare_to(before, "filename"))
        assert grown < 16 * 1024, f"memory grew by {grown} bytes over 2000 replays"

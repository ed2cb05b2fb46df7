"""start_runtime(): a runtime on its own thread, awaited from asyncio, from other trio runs,
or waited on synchronously; the way notebooks keep a runtime across cells."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest
import trio
import trio.testing

import actorgraph as ag

XOR = ag.Kernel("xor", cpu=lambda o, a, b: np.bitwise_xor(a, b, out=o), outs=(0,), ins=(1, 2))


@pytest.fixture
def brt() -> Iterator[ag.BackgroundRuntime]:
    with ag.start_runtime(["CPU:0", "CPU:1"]) as rt:
        yield rt
    assert rt.closed


def _graph(rt: ag.BackgroundRuntime) -> tuple[ag.BackgroundGraph, list[ag.Buffer], ag.Buffer]:
    a, b, c = (rt.alloc("CPU:0", 8, np.int32) for _ in range(3))
    d = rt.alloc("CPU:1", 8, np.int32)
    rt.copyin(a, np.arange(8, dtype=np.int32)).result()
    rt.copyin(b, np.full(8, 3, np.int32)).result()
    graph = rt.compile([ag.Launch(XOR, [c, a, b]), ag.Copy(dst=d, src=c)], inputs=[a, b]).result()
    return graph, [a, b], d


def test_sync_calls_with_result(brt: ag.BackgroundRuntime) -> None:
    graph, inputs, out = _graph(brt)
    assert "CPU:0/compute" in str(graph.plan)
    graph(inputs).result()
    np.testing.assert_array_equal(brt.copyout(out).result(), np.arange(8) ^ 3)
    assert graph.statistics().replays == 1
    assert brt.statistics().devices == ("CPU:0", "CPU:1")


def test_awaited_from_asyncio_like_a_jupyter_cell(brt: ag.BackgroundRuntime) -> None:
    graph, (a, b), out = _graph(brt)

    async def cell() -> np.ndarray:
        await graph([b, a])
        return await brt.copyout(out)

    # Each asyncio.run stands for one cell; the runtime outlives them all.
    for _ in range(2):
        np.testing.assert_array_equal(asyncio.run(cell()), np.arange(8) ^ 3)


def test_awaited_from_separate_trio_runs_like_autoawait_trio_cells(brt: ag.BackgroundRuntime) -> None:
    graph, (a, b), out = _graph(brt)

    async def cell(value: int) -> np.ndarray:
        a2 = brt.alloc("CPU:0", 8, np.int32)
        await brt.copyin(a2, np.full(8, value, np.int32))
        await graph([a2, b])
        return await brt.copyout(out)

    for value in (1, 7):
        np.testing.assert_array_equal(trio.run(cell, value), np.full(8, value ^ 3))


def test_jitted_function_runs_on_the_runtime_thread(brt: ag.BackgroundRuntime) -> None:
    out = brt.alloc("CPU:1", 8, np.int32)
    seen_threads = []

    @ag.jit
    async def step(rt: ag.BackgroundRuntime, x: ag.Buffer, y: ag.Buffer) -> ag.Buffer:
        seen_threads.append(rt.on_runtime_thread())
        tmp = rt.alloc("CPU:0", 8, np.int32)
        await rt.launch(XOR, [tmp, x, y])
        await rt.copy(out, tmp)
        return out

    async def cell(i: int) -> np.ndarray:
        x, y = brt.alloc("CPU:0", 8, np.int32), brt.alloc("CPU:0", 8, np.int32)
        await brt.copyin(x, np.full(8, i, np.int32))
        await brt.copyin(y, np.full(8, 5, np.int32))
        return await brt.copyout(await step(brt, x, y))

    for i in range(4):
        np.testing.assert_array_equal(asyncio.run(cell(i)), np.full(8, i ^ 5))
    assert seen_threads == [True, True]
    assert step.statistics().replays == 2
    # call() runs any async function there too; sync code waits with result().
    assert brt.call(step, brt, *(brt.alloc("CPU:0", 8, np.int32) for _ in range(2))).result() is out


def test_errors_come_back_to_the_caller(brt: ag.BackgroundRuntime) -> None:
    graph, inputs, _ = _graph(brt)
    with pytest.raises(ag.InputError, match=r"graph was compiled with 2 inputs but was called with 1"):
        graph(inputs[:1]).result()
    with pytest.raises(ag.UsageError, match=r"device 'CPU:7' is not open in this runtime"):
        brt.alloc("CPU:7", 4)

    async def on_thread() -> None:
        brt.copyout(inputs[0]).result()

    with pytest.raises(ag.UsageError, match=r"copyout\(\.\.\.\)\.result\(\) on the runtime's own thread would wait for itself"):
        brt.call(on_thread).result()
    with pytest.raises(ag.UsageError, match=r"call\(\) takes an async function, got 3"):
        brt.call(3)  # type: ignore[arg-type]

    async def elsewhere() -> None:
        await brt.copyout(inputs[0])

    with pytest.raises(ag.UsageError, match=r"from synchronous code use \.result\(\)"):
        coro = elsewhere()
        try:
            coro.send(None)
        finally:
            coro.close()


def test_closed_runtime_and_bad_devices_raise() -> None:
    with pytest.raises(ag.DeviceError, match=r"unknown device name 'GPU:0'"):
        ag.start_runtime(["GPU:0"])
    rt = ag.start_runtime(["CPU:0"])
    buf = rt.alloc("CPU:0", 4, np.int32)
    pending = rt.copyout(buf)
    rt.close()
    assert rt.closed and "closed" in repr(rt)
    with pytest.raises(ag.ClosedError, match=r"copyout\(\.\.\.\): this background runtime is closed; start a new one"):
        pending.result()
    with pytest.raises(ag.ClosedError, match=r"alloc: this background runtime is closed"):
        rt.alloc("CPU:0", 4)
    rt.close()  # closing twice is fine


def test_clock_option_and_current_time() -> None:
    clock = trio.testing.MockClock(autojump_threshold=0)
    with ag.start_runtime(["CPU:0", "CPU:1"], clock=clock) as rt:
        start = rt.current_time()

        async def nap() -> float:
            await trio.sleep(5.0)  # autojump: no wall time passes
            return trio.current_time()

        assert rt.call(nap).result(timeout=10) == pytest.approx(start + 5.0)
        assert rt.current_time() == pytest.approx(start + 5.0)
        graph, inputs, out = _graph(rt)
        graph(inputs, var_vals=None).result()
        assert graph.replays == 1  # Graph attributes read through the wrapper

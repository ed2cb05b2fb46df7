"""start_runtime(): a runtime on its own thread, awaited from asyncio, from other trio runs,
or waited on synchronously; the way notebooks keep a runtime across cells."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import inspect
import re
import threading
import time
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


def test_awaited_from_separate_trio_runs_like_autoawait_trio_cells(
    brt: ag.BackgroundRuntime,
) -> None:
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
    with pytest.raises(
        ag.InputError, match=r"graph was compiled with 2 inputs but was called with 1"
    ):
        graph(inputs[:1]).result()
    with pytest.raises(ag.UsageError, match=r"device 'CPU:7' is not open in this runtime"):
        brt.alloc("CPU:7", 4)

    async def on_thread() -> None:
        brt.copyout(inputs[0]).result()

    with pytest.raises(
        ag.UsageError,
        match=r"copyout\(\.\.\.\)\.result\(\) on the runtime's own thread would wait for itself",
    ):
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
    rt.copyin(buf, np.arange(4, dtype=np.int32))
    pending = rt.copyout(buf)
    rt.close()  # finishes the calls made before it
    assert rt.closed and "closed" in repr(rt)
    np.testing.assert_array_equal(pending.result(), np.arange(4))
    with pytest.raises(
        ag.ClosedError,
        match=r"copyout\(\.\.\.\): this background runtime is closed; start a new one",
    ):
        rt.copyout(buf)
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


# -- calls nobody waits for ---------------------------------------------------------------------


@contextlib.contextmanager
def holding(rt: ag.BackgroundRuntime) -> Iterator[None]:
    """Keep the runtime busy (its calls run one at a time) until the block has made its calls."""
    gate = threading.Event()
    held = rt.call(trio.to_thread.run_sync, gate.wait)
    try:
        yield
    finally:
        gate.set()
        held.result(timeout=10)


def test_a_call_runs_whether_or_not_anyone_waits(brt: ag.BackgroundRuntime) -> None:
    a = brt.alloc("CPU:0", 8, np.int32)
    b = brt.alloc("CPU:0", 8, np.int32)
    c = brt.alloc("CPU:0", 8, np.int32)
    # Made from plain code and dropped at once, like a concurrent.futures submission.
    brt.copyin(a, np.arange(8, dtype=np.int32))
    brt.copyin(b, np.full(8, 3, np.int32))
    brt.launch(XOR, [c, a, b])
    brt.copyin(a, np.zeros(8, np.int32))  # in order: after the launch has read a
    np.testing.assert_array_equal(brt.copyout(c).result(timeout=10), np.arange(8) ^ 3)
    np.testing.assert_array_equal(brt.copyout(a).result(timeout=10), np.zeros(8))
    graph = brt.compile([ag.Launch(XOR, [c, a, b])], inputs=[a, b])
    graph.result(timeout=10)([a, b])  # a replay nobody waits for
    np.testing.assert_array_equal(brt.copyout(c).result(timeout=10), np.full(8, 3))


def test_free_waits_for_the_calls_made_before_it(brt: ag.BackgroundRuntime) -> None:
    a = brt.alloc("CPU:0", 8, np.int32)
    b = brt.alloc("CPU:0", 8, np.int32)
    brt.copyin(a, np.full(8, 9, np.int32))
    brt.copy(b, a)
    brt.free(a)  # returns at once; the copy made before it still reads a
    np.testing.assert_array_equal(brt.copyout(b).result(timeout=10), np.full(8, 9))
    with pytest.raises(ag.BufferFreedError, match=r"free: <Buffer CPU:0 8 int32 freed #\d+>"):
        brt.free(a)
    with pytest.raises(ag.UsageError, match=r"free\(\) takes a base buffer; .* is a view"):
        brt.free(b.view(0, 4))


def test_a_failure_nobody_waited_for_is_logged_and_raised_by_the_next_call(
    brt: ag.BackgroundRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    a = brt.alloc("CPU:0", 4, np.int32)
    with caplog.at_level("WARNING", logger="actorgraph"):
        with holding(brt):  # nothing runs until every call below is made
            brt.copyin(a, np.zeros(5, np.int32))  # the wrong size; nobody waits
            brt.copyin(a, np.ones(4, np.int32))  # runs after it, in order
            first = brt.copyout(a)
        np.testing.assert_array_equal(first.result(timeout=10), np.ones(4))
        with pytest.raises(ag.UsageError, match=r"copyin: array has 5 elements") as info:
            brt.copyout(a)  # the next call made raises it, and does not run
    assert (
        "raised by copyout(...): copyin(...) failed earlier while nobody waited for it"
        in "\n".join(info.value.__notes__)
    )
    assert (
        "copyin(...) failed while nobody waited for it (UsageError: copyin: array has 5 elements"
        in caplog.text
    )
    # Raised once; the runtime goes on.
    np.testing.assert_array_equal(brt.copyout(a).result(timeout=10), np.ones(4))


def test_close_raises_a_failure_nobody_waited_for() -> None:
    rt = ag.start_runtime(["CPU:0"])
    rt.copyin(rt.alloc("CPU:0", 4, np.int32), np.zeros(5, np.int32))
    with pytest.raises(ag.UsageError, match=r"copyin: array has 5 elements") as info:
        rt.close()
    assert rt.closed
    assert "raised by close(): copyin(...) failed earlier" in info.value.__notes__[0]


def test_a_failure_someone_waits_for_is_theirs_only(brt: ag.BackgroundRuntime) -> None:
    a = brt.alloc("CPU:0", 4, np.int32)
    failing = brt.copyin(a, np.zeros(5, np.int32))
    with pytest.raises(ag.UsageError, match=r"copyin: array has 5 elements"):
        failing.result(timeout=10)
    np.testing.assert_array_equal(brt.copyout(a).result(timeout=10), np.zeros(4))


def test_close_cancels_what_runs_past_its_timeout() -> None:
    rt = ag.start_runtime(["CPU:0"])
    stuck = rt.call(trio.sleep_forever)
    after = rt.copyout(rt.alloc("CPU:0", 4, np.int32))
    rt.close(timeout=0.01)
    assert rt.closed
    with pytest.raises(
        ag.ClosedError,
        match=r"call\(sleep_forever\): the background runtime closed before it finished",
    ):
        stuck.result()
    with pytest.raises(
        ag.ClosedError, match=r"copyout\(\.\.\.\): the background runtime closed before it ran"
    ):
        after.result()


def test_calls_made_on_the_runtime_thread_run_when_awaited(brt: ag.BackgroundRuntime) -> None:
    a = brt.alloc("CPU:0", 4, np.int32)
    outside = brt.copyout(a)

    async def forgets() -> None:
        brt.copyin(a, np.ones(4, np.int32))  # no await: plain async code, so it never runs

    with pytest.warns(
        RuntimeWarning, match=r"copyin\(\.\.\.\) was made on the runtime's thread and never awaited"
    ):
        brt.call(forgets).result(timeout=10)
        gc.collect()
    np.testing.assert_array_equal(brt.copyout(a).result(timeout=10), np.zeros(4))
    outside.result(timeout=10)

    async def awaits_outside_call() -> None:
        await later

    with holding(brt):
        blocker = brt.call(awaits_outside_call)
        later = brt.copyout(a)
    with pytest.raises(
        ag.UsageError,
        match=r"await copyout\(\.\.\.\) on the runtime's thread: it was made outside and runs after the call now running",
    ):
        blocker.result(timeout=10)
    later.result(timeout=10)


def test_jitted_function_from_synchronous_code(brt: ag.BackgroundRuntime) -> None:
    out = brt.alloc("CPU:1", 8, np.int32)

    @ag.jit
    async def step(rt: ag.BackgroundRuntime, x: ag.Buffer, y: ag.Buffer) -> ag.Buffer:
        tmp = rt.alloc("CPU:0", 8, np.int32)
        await rt.launch(XOR, [tmp, x, y])
        await rt.copy(out, tmp)
        return out

    y = brt.alloc("CPU:0", 8, np.int32)
    brt.copyin(y, np.full(8, 5, np.int32))
    for i in range(4):
        x = brt.alloc("CPU:0", 8, np.int32)
        brt.copyin(x, np.full(8, i, np.int32))
        call = step(brt, x, y)  # a Call: submitted now, in order
        assert isinstance(call, ag.Call) and "step(...)" in repr(call)
        if i % 2:
            assert call.result(timeout=10) is out
        np.testing.assert_array_equal(brt.copyout(out).result(timeout=10), np.full(8, i ^ 5))
    assert step.statistics().replays == 2


def test_a_call_used_as_its_result_says_to_wait(brt: ag.BackgroundRuntime) -> None:
    graph, (a, b), out = _graph(brt)
    pending = brt.copyout(out)
    hint = "on copyout(...) itself, which is a Call, not its result: write `x = await copyout(...)` in async code or `x = copyout(...).result()` in plain code"
    with pytest.raises(ag.UsageError, match=re.escape("reading it as an array " + hint)):
        np.asarray(pending)
    c = brt.alloc("CPU:0", 8, np.int32)
    compiling = brt.compile([ag.Launch(XOR, [c, a, b])], inputs=[a, b])
    with pytest.raises(
        ag.UsageError, match=re.escape(".plan on compile(...) itself, which is a Call")
    ):
        print(compiling.plan)
    with pytest.raises(ag.UsageError, match=re.escape("calling it on compile(...) itself")):
        compiling([a, b])

    async def cell() -> None:
        with pytest.raises(
            ag.UsageError,
            match=re.escape(
                "`async with compile(...)` needs its result, so wait for the call first: write `async with await compile(...) as graph:`"
            ),
        ):
            async with brt.compile([ag.Launch(XOR, [c, a, b])], inputs=[a, b]):  # type: ignore[attr-defined]
                pass  # pragma: no cover
        async with await brt.compile([ag.Launch(XOR, [c, a, b])], inputs=[a, b]) as other:
            await other([a, b])
        with pytest.raises(ag.ClosedError, match=r"was closed with aclose\(\)"):
            await other([a, b])

    asyncio.run(cell())
    with pytest.raises(
        ag.UsageError, match=re.escape("copyout takes a Buffer, got <Call copyout(...)")
    ):
        brt.copyout(pending).result(timeout=10)  # type: ignore[arg-type]
    pending.result(timeout=10)
    compiling.result(timeout=10)


def test_calls_made_from_many_threads_at_once_each_run_once_in_their_order(
    brt: ag.BackgroundRuntime,
) -> None:
    # The runtime's thread sleeps between calls and is woken by whoever queues the next:
    # with threads queueing calls as it falls asleep and as it wakes, none is missed
    # (a missed one would leave its caller waiting: the timeouts fail it) or run twice.
    seen: list[tuple[int, int]] = []
    errors: list[BaseException] = []

    async def record(thread: int, index: int) -> None:
        seen.append((thread, index))

    def caller(thread: int) -> None:
        try:
            for index in range(300):
                call = brt.call(record, thread, index)
                if index % 3 == 0:
                    call.result(timeout=10)  # (so the runtime's thread falls idle between)
        except BaseException as error:  # noqa: BLE001 - failed below
            errors.append(error)

    threads = [threading.Thread(target=caller, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    brt.call(record, -1, -1).result(timeout=10)  # runs after every call made before it
    assert seen[-1] == (-1, -1)
    assert sorted(seen[:-1]) == [(t, i) for t in range(4) for i in range(300)]
    for t in range(4):
        assert [i for u, i in seen if u == t] == list(range(300))


def test_graph_calls_start_on_the_runtime_thread_in_the_order_they_were_made(
    brt: ag.BackgroundRuntime,
) -> None:
    graph, (a, b), out = _graph(brt)
    with holding(brt):  # the graph calls queue behind a running call and wait their turn
        first = graph([a, b])
        brt.copyin(a, np.full(8, 5, np.int32))
        second = graph([a, b])
        middle = brt.copyout(out)
        brt.copyin(b, np.full(8, 6, np.int32))
        third = graph([a, b])
    for call in (first, second, third):
        call.result(timeout=10)
    np.testing.assert_array_equal(middle.result(timeout=10), np.full(8, 5 ^ 3))
    np.testing.assert_array_equal(brt.copyout(out).result(timeout=10), np.full(8, 5 ^ 6))
    assert graph.statistics().replays_done == 3


def test_a_replay_still_running_is_waited_for_before_the_next_call() -> None:
    # Every kernel runs on the device's worker thread: the replay cannot finish at once.
    with ag.start_runtime(["CPU:0"], cpu_thread_bytes=4) as rt:
        a, b, c = (rt.alloc("CPU:0", 1024, np.int32) for _ in range(3))
        rt.copyin(a, np.arange(1024, dtype=np.int32))
        rt.copyin(b, np.full(1024, 3, np.int32))
        graph = rt.compile([ag.Launch(XOR, [c, a, b])], inputs=[a, b]).result(timeout=10)
        replay = graph([a, b])
        rt.copyin(a, np.zeros(1024, np.int32))  # runs once the replay has read a
        np.testing.assert_array_equal(rt.copyout(c).result(timeout=10), np.arange(1024) ^ 3)
        replay.result(timeout=10)


def test_a_kernel_failing_in_a_graph_call_comes_back_to_the_caller(
    brt: ag.BackgroundRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    def boom(out: np.ndarray, a: np.ndarray) -> None:
        raise ValueError("bad block")

    bad = ag.Kernel("boom", cpu=boom, outs=(0,), ins=(1,))
    a, c = brt.alloc("CPU:0", 8, np.int32), brt.alloc("CPU:0", 8, np.int32)
    graph = brt.compile([ag.Launch(bad, [c, a])], inputs=[a]).result(timeout=10)
    with pytest.raises(
        ag.ItemError, match=r"item 0 \(boom\) on CPU:0/compute raised ValueError: bad block"
    ):
        graph([a]).result(timeout=10)
    with caplog.at_level("WARNING", logger="actorgraph"):
        graph([a])  # nobody waits: the next call raises it
        with pytest.raises(ag.ItemError, match=r"raised ValueError: bad block"):
            for _ in range(1000):  # until the runtime's thread has run it
                brt.copyout(a).result(timeout=10)
    assert "graph(...) failed while nobody waited for it" in caplog.text


def _thread_recording_graph(
    rt: ag.BackgroundRuntime, seen: list[int]
) -> tuple[ag.BackgroundGraph, list[ag.Buffer]]:
    def xor(out: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
        seen.append(threading.get_ident())
        np.bitwise_xor(a, b, out=out)

    kernel = ag.Kernel("xor", cpu=xor, outs=(0,), ins=(1, 2))
    a, b, c = (rt.alloc("CPU:0", 8, np.int32) for _ in range(3))
    d = rt.alloc("CPU:1", 8, np.int32)
    items = [ag.Launch(kernel, [c, a, b]), ag.Copy(dst=d, src=c), ag.Launch(kernel, [d, d, d])]
    return rt.compile(items, inputs=[a, b]).result(timeout=10), [a, b, c, d]


def test_a_graph_call_on_idle_cpu_queues_runs_in_the_callers_thread(
    brt: ag.BackgroundRuntime,
) -> None:
    seen: list[int] = []
    graph, (a, b, c, d) = _thread_recording_graph(brt, seen)
    here = threading.get_ident()
    brt.copyin(a, np.full(8, 5, np.int32))
    calls = 0
    for _ in range(1000):  # until a call finds the runtime's loop idle
        seen.clear()
        call = graph([a, b])
        calls += 1
        call.result(timeout=10)
        if seen == [here, here]:
            break
    else:
        raise AssertionError("no graph call ran in the caller's thread")
    # It ran before the call returned, and was counted as the runtime's thread would.
    assert call.done()
    assert graph.statistics().replays_done == calls
    assert brt.statistics().replays_done == calls
    np.testing.assert_array_equal(brt.copyout(c).result(timeout=10), np.full(8, 5))
    np.testing.assert_array_equal(brt.copyout(d).result(timeout=10), np.zeros(8))
    # Later calls, made by the runtime's thread or here, still run in the order made.
    brt.copyin(a, np.full(8, 7, np.int32))
    graph([a, b])
    np.testing.assert_array_equal(brt.copyout(c).result(timeout=10), np.full(8, 7))


def test_graph_calls_behind_a_running_call_go_to_the_runtime_thread_in_order(
    brt: ag.BackgroundRuntime,
) -> None:
    seen: list[int] = []
    graph, (a, b, c, _) = _thread_recording_graph(brt, seen)
    with holding(brt):
        first = graph([a, b])
        brt.copyin(a, np.full(8, 9, np.int32))
        second = graph([a, b])
        middle = brt.copyout(c)
    first.result(timeout=10)
    second.result(timeout=10)
    np.testing.assert_array_equal(middle.result(timeout=10), np.full(8, 9))
    assert seen and threading.get_ident() not in seen


def test_the_loop_lock_is_free_only_while_the_run_waits_for_io() -> None:
    from actorgraph._background import _LoopLock

    loop = _LoopLock()
    entered, go_on, parked = threading.Event(), threading.Event(), threading.Event()
    token: list[trio.lowlevel.TrioToken] = []
    scope = trio.CancelScope()

    async def main() -> None:
        token.append(trio.lowlevel.current_trio_token())
        loop.lock.acquire()
        trio.lowlevel.add_instrument(loop)
        entered.set()
        go_on.wait(10)  # a task step that blocks its thread: the lock stays held
        parked.set()
        with scope:
            await trio.sleep_forever()

    thread = threading.Thread(target=lambda: trio.run(main), daemon=True)
    thread.start()
    assert entered.wait(10)
    assert not loop.lock.acquire(blocking=False)
    go_on.set()
    assert parked.wait(10)
    assert loop.lock.acquire(timeout=10)  # the run parks in its I/O wait and lets go
    try:
        ran = threading.Event()
        token[0].run_sync_soon(ran.set)  # wakes the run: it waits for the lock
        deadline = time.monotonic() + 10
        while not loop.wanted:  # the run wants the lock back: a caller stands back now
            assert time.monotonic() < deadline
        assert not ran.is_set()
    finally:
        loop.lock.release()
    assert ran.wait(10)
    token[0].run_sync_soon(scope.cancel)
    thread.join(10)
    assert not thread.is_alive()


# What of Runtime's public surface a background runtime does not offer, and why. Every
# other public name of Runtime (methods, properties, attributes) has a counterpart.
NOT_MIRRORED = {
    "window": "the in-flight window (room for submissions, the submissions in flight, "
    "replays waiting for external timelines): trio state of the runtime's thread; "
    "`in_flight` and `max_in_flight` answer from others",
    "graphs": "the runtime's part that compiles graphs and counts their replays, on its "
    "thread; `compile`, `replays`, `replays_done` and `graphs_compiled` are the public calls",
    "profiles": "the profiled replays kept on the runtime's thread; `profile()` and "
    "`profiling` read them",
    "epoch": "a count the fast path of a graph call reads on the runtime's thread (a free, a "
    "break or a close moves it)",
    "check_open": "every call checks the runtime on its thread; a closed background runtime "
    "raises ClosedError from any call, and `closed` says so without raising",
    "check_own": "a check the runtime's calls make on its thread; owns() asks the same",
    "device": "returns a Device, whose actors are trio state of the runtime's thread: "
    "rt.runtime.device(name) in a function given to call()",
    "kick": "the KICK signal, trio state of the runtime's thread",
    "resumer": "runs held jobs on in the task that meets their waits: trio state of the "
    "runtime's thread",
    "usable": "a flag the runtime's fast path reads on its thread; `closed` answers from others",
    "submit_copyin": "copyin without waiting, for trio code on the runtime's thread (its "
    "HostCopy is waited for there); a background runtime's copyin returns at once (a Call)",
    "submit_copyout": "copyout without waiting, as submit_copyin; a background runtime's "
    "copyout returns at once (a Call)",
}


def _public_names(runtime: ag.Runtime) -> set[str]:
    names = {n for n in dir(type(runtime)) if not n.startswith("_")}
    return names | {n for n in vars(runtime) if not n.startswith("_")}


def test_a_background_runtime_mirrors_the_whole_public_surface_of_runtime(
    brt: ag.BackgroundRuntime,
) -> None:
    names = _public_names(brt.runtime)
    assert set(NOT_MIRRORED) <= names, "a name listed as not mirrored left Runtime: drop it"
    missing = sorted(n for n in names - set(NOT_MIRRORED) if not hasattr(ag.BackgroundRuntime, n))
    assert not missing, f"Runtime's {missing} have no counterpart on BackgroundRuntime"
    for name in sorted(names - set(NOT_MIRRORED)):
        ours, theirs = getattr(ag.BackgroundRuntime, name), getattr(ag.Runtime, name, None)
        if not callable(theirs) or isinstance(theirs, property):
            continue  # a fact: compared by value below
        # Each of Runtime's parameters is taken by name, or by **options passed through.
        params = inspect.signature(ours).parameters
        passes_through = any(p.kind is p.VAR_KEYWORD for p in params.values())
        for param in list(inspect.signature(theirs).parameters)[1:]:
            assert param in params or passes_through, (name, param)
    for name in sorted(names - set(NOT_MIRRORED)):
        mirrored = getattr(brt, name)
        if not callable(mirrored):
            assert mirrored == getattr(brt.runtime, name), name


def test_the_mirrored_facts_and_calls_work(brt: ag.BackgroundRuntime) -> None:
    memory = np.arange(8, dtype=np.int32)
    wrapped = brt.wrap("CPU:0", memory, dtype=np.int32)
    assert brt.owns(wrapped) and wrapped.runtime is brt.runtime
    out = brt.alloc("CPU:1", 8, np.int32)
    graph = brt.compile([ag.Copy(dst=out, src=wrapped)], inputs=[wrapped]).result()
    assert brt.graphs_compiled == 1 and brt.in_flight == 0
    graph([wrapped], profile=True).result()
    np.testing.assert_array_equal(brt.copyout(out).result(), memory)
    assert brt.replays == brt.replays_done == 1
    assert len(brt.profile().events) == 1
    assert len(brt.profile(clear=True).events) == 1 and not brt.profile().events
    assert brt.frees_pending == 0 and brt.frees == 0
    assert brt.stalls == [] and brt.actor_names() == brt.runtime.actor_names()
    assert brt.caps == brt.runtime.caps and not brt.verify_plans
    brt.free(out)
    brt.copyout(wrapped).result()  # runs after the free
    assert brt.frees == 1
    brt.close()
    # Facts stay readable once it has closed.
    assert brt.submissions == brt.runtime.submissions and brt.in_flight == 0


@pytest.mark.parametrize("name", ["submit", "submit_nowait"])
def test_a_background_graph_says_calling_it_is_the_submission(
    brt: ag.BackgroundRuntime, name: str
) -> None:
    graph, inputs, _ = _graph(brt)
    with pytest.raises(
        ag.UsageError,
        match=re.escape(
            f"graph.{name}(...) on a background runtime's graph: calling the graph is the "
            f"submission here, it returns at once and runs in order: write `call = "
            f"graph(inputs)`, then `await call` or `call.result()` when needed"
        ),
    ):
        getattr(graph, name)(inputs)
    assert graph.replays == 0


def test_call_here_replays_on_the_callers_thread_or_says_it_cannot(
    brt: ag.BackgroundRuntime,
) -> None:
    seen: list[int] = []
    graph, (a, b, c, d) = _thread_recording_graph(brt, seen)
    here = threading.get_ident()
    brt.copyin(a, np.full(8, 6, np.int32)).result(timeout=10)
    for _ in range(1000):  # until a call finds the runtime's loop idle
        seen.clear()
        if graph.call_here([a, b]):
            break
        assert not seen  # it did nothing
    else:
        raise AssertionError("call_here never found the runtime idle")
    assert seen == [here, here]  # ran before it returned, on this thread
    np.testing.assert_array_equal(brt.copyout(c).result(timeout=10), np.full(8, 6))
    with holding(brt):  # a call made before it still runs: it must not pass that call
        seen.clear()
        assert graph.call_here([a, b]) is False and not seen

    # A failing item raises its ItemError at once, to the caller that ran it.
    def boom(out: np.ndarray, x: np.ndarray) -> None:
        raise ValueError("bad block")

    bad = brt.compile(
        [ag.Launch(ag.Kernel("boom", cpu=boom, outs=(0,), ins=(1,)), [c, a])], inputs=[a]
    ).result(timeout=10)
    for _ in range(1000):
        try:
            if bad.call_here([a]):
                raise AssertionError("a failing replay ran without raising")
        except ag.ItemError as error:
            assert "item 0 (boom) on CPU:0/compute raised ValueError: bad block" in str(error)
            break
    else:
        raise AssertionError("call_here never found the runtime idle")
    brt.copyout(c).result(timeout=10)  # nothing left for a later call to raise
